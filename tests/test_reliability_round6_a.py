"""Issue 55, first half (items 1, 2, 5, 6, 10, 14, 16 and the notes on signals and orphans):
a study stops on Ctrl-C / SIGTERM after saving; a huge n_pert is refused and a long first
update can be stopped; a full disk stops a study with one line; a failed SLURM submission is
one line; every output path is checked before the work; an unwritable compilation cache and a
NaN temperature are refused."""

import ast
import errno
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from soma_jax import cli, errors
from soma_jax.errors import UserError
from tests.test_compare import ROOT
from tests.test_robustness import one_error_line

PY = [sys.executable]


def run_cli(args, **kw):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.run(PY + args, capture_output=True, text=True, cwd=ROOT, timeout=300,
                        env=env, **kw)


# ------------------------------------------------------------ item 10: outputs checked first

OUTPUT_NAMES = ("out", "json", "md", "out_dir", "trace_dir", "timings", "docs", "write")


def _entry_points() -> list[str]:
  return sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")) +
                glob.glob(os.path.join(ROOT, "benchmarks", "*.py")) +
                glob.glob(os.path.join(ROOT, "scripts", "*.py")))


def test_every_output_flag_of_every_entry_point_is_checked_before_the_work():
  """The class: an output flag (absl) is defined with cli.output_flag, which `cli.run` checks
  once the flags are parsed; an argparse script checks its outputs right after parsing."""
  unchecked = []
  for path in _entry_points():
    tree = ast.parse(open(path).read())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    checked_args = set()
    for call in calls:
      name = ast.unparse(call.func)
      if name.endswith("check_output_args"):
        checked_args |= {k.arg for k in call.keywords}
    for call in calls:
      name = ast.unparse(call.func)
      first = call.args[0] if call.args else None
      if not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        continue
      flag = first.value.lstrip("-")
      if name == "flags.DEFINE_string" and flag in OUTPUT_NAMES:
        unchecked.append(f"{os.path.relpath(path, ROOT)}: --{flag} (flags.DEFINE_string)")
      if name.endswith("add_argument") and flag in OUTPUT_NAMES and flag not in checked_args:
        unchecked.append(f"{os.path.relpath(path, ROOT)}: --{flag} (argparse, unchecked)")
  assert not unchecked, unchecked


def test_variance_out_that_is_a_file_is_refused_before_measuring(tmp_path):
  """It measured for minutes, then failed writing with a traceback (the result lost)."""
  a_file = tmp_path / "a_file"
  a_file.write_text("keep me")
  t0 = time.time()
  proc = run_cli([os.path.join("experiments", "variance.py"),
                  "--config=experiments/configs/variance.py:shared_vs_separate",
                  f"--out={a_file}"])
  one_error_line(proc, "--out=", "is a file")
  assert time.time() - t0 < 60
  assert a_file.read_text() == "keep me"


def test_benchmark_json_that_is_a_folder_is_refused_before_benchmarking(tmp_path):
  proc = run_cli(["-m", "benchmarks.spsa_step", "--config=experiments/configs/soma.py:n=2,size=tiny",
                  f"--json={tmp_path}"])
  one_error_line(proc, "--json=", "is a folder")
  assert "SPSA" not in proc.stdout and not proc.stdout.strip(), proc.stdout[-500:]


def test_script_json_that_is_a_folder_is_refused_before_the_work(tmp_path):
  proc = run_cli(["-m", "scripts.study_settings", f"--json={tmp_path}"])
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert "is a folder" in proc.stderr.strip().splitlines()[-1]
  assert not proc.stdout.strip()


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_check_output_refuses_what_cannot_be_written_and_makes_nothing(tmp_path, kind,
                                                                       monkeypatch):
  blocker = tmp_path / "blocker"
  blocker.write_text("x")
  with pytest.raises(UserError, match="is a file, not a folder"):
    errors.check_output(str(blocker / "sub" / "out"), "--out", kind)
  target = tmp_path / "new" / "deeper" / "out"
  assert errors.check_output(str(target), "--out", kind) == str(target)
  assert not (tmp_path / "new").exists()  # checked, not made

  real_mkstemp = errors.tempfile.mkstemp

  def refused(*args, dir=None, **kw):  # what the kernel says for a read-only folder
    if dir and str(dir).startswith(str(tmp_path)):
      raise PermissionError(errno.EACCES, "Permission denied", dir)
    return real_mkstemp(*args, dir=dir, **kw)

  monkeypatch.setattr(errors.tempfile, "mkstemp", refused)
  with pytest.raises(UserError, match="is not writable"):
    errors.check_output(str(target), "--out", kind)


# -------------------------------------------------- item 14: a read-only compilation cache


def test_read_only_compilation_cache_is_refused(tmp_path, monkeypatch):
  """An existing folder the process may not write: JAX printed 39 warnings and exit 0."""
  cache = tmp_path / "cache"
  cache.mkdir()
  real_mkstemp = errors.tempfile.mkstemp

  def refused(*args, dir=None, **kw):
    if dir and str(dir).startswith(str(cache)):
      raise PermissionError(errno.EACCES, "Permission denied", dir)
    return real_mkstemp(*args, dir=dir, **kw)

  monkeypatch.setattr(errors.tempfile, "mkstemp", refused)
  with pytest.raises(UserError, match="--compilation_cache=.* is not writable; fix: .*off"):
    cli.compilation_cache(str(cache))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes a read-only folder")
def test_read_only_compilation_cache_is_refused_on_the_command_line(tmp_path):
  cache = tmp_path / "cache"
  cache.mkdir()
  cache.chmod(0o555)
  try:
    proc = run_cli([os.path.join("experiments", "generate.py"), f"--workdir={tmp_path}",
                    f"--compilation_cache={cache}"])
  finally:
    cache.chmod(0o755)
  one_error_line(proc, "--compilation_cache=", "not writable")


# ------------------------------------------------------------ item 16: temperature=nan


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_generate_refuses_a_temperature_that_is_not_a_finite_number(tmp_path, value):
  proc = run_cli([os.path.join("experiments", "generate.py"), f"--workdir={tmp_path}",
                  f"--temperature={value}"])
  one_error_line(proc, "--temperature")


def test_generate_library_refuses_nan_sampling_settings():
  from soma_jax import generate as gen_lib

  for t, p in ((float("nan"), 1.0), (float("inf"), 1.0), (1.0, float("nan")), (-0.5, 1.0)):
    with pytest.raises(UserError):
      gen_lib.check_sampling(t, p)
  gen_lib.check_sampling(0.0, 1.0)


def test_every_float_flag_refuses_nan(tmp_path):
  """The class of item 16: nan passes every comparison-based range check."""
  proc = run_cli(["-m", "benchmarks.scaling", "--seconds=nan", f"--json={tmp_path / 'r.json'}"])
  one_error_line(proc, "--seconds=nan")
