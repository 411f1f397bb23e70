"""Issue 31: what a new user's probes found silently wrong, or as a traceback, each pinned."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

from soma_jax import checkpoint as ckpt_lib
from soma_jax import cli as cli_lib
from soma_jax import config as config_lib
from soma_jax import metrics, runs, train
from soma_jax.config import load_config_file
from soma_jax.data import prepare
from soma_jax.errors import UserError
from soma_jax.studies import compare, report
from tests.test_robustness import SMALL_PREP, TRAIN_CLI, cli, one_error_line
from tests.test_train import ROOT, tiny_config


@pytest.fixture(scope="module")
def own_data(data_prepared, tmp_path_factory):
  """A copy of the shared data dir (these tests re-prepare and damage it) and a 2-update run."""
  d = str(tmp_path_factory.mktemp("own") / "data")
  shutil.copytree(data_prepared, d)
  w = str(tmp_path_factory.mktemp("own_run") / "w")
  train.run(tiny_config(d, steps=2), w)
  return d, w


def test_tools_refuse_data_changed_since_training(own_data, data_textdir, tmp_path):
  """Re-preparing a run's data dir in place, or overwriting its test.npy, was scored silently."""
  d, w = own_data
  c = ckpt_lib.read_config(w)
  assert ckpt_lib.check_data(w, c.data.dir, None, ("router.npz", "test.npy")) == d
  backup = str(tmp_path / "backup")
  shutil.copytree(d, backup)
  try:
    shutil.rmtree(d)
    prepare.prepare(f"textdir:{data_textdir}", 3, d, seed=1, **SMALL_PREP)  # in place
    with pytest.raises(UserError, match=r"manifest.json' is not the one .* trained on"):
      ckpt_lib.check_data(w, c.data.dir)
    with pytest.raises(UserError, match="is not the one"):
      report.write_report(str(tmp_path / "rep"), {"run": w}, d)
    one_error_line(cli([sys.executable, "experiments/evaluate.py", f"--workdir={w}"]),
                   "is not the one", "fix:")
    one_error_line(cli([sys.executable, "experiments/generate.py", f"--workdir={w}"]),
                   "is not the one")
    assert ckpt_lib.check_data(w, c.data.dir, backup) == backup  # the data it trained on, moved
  finally:
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(backup, d)
  test = os.path.join(d, "test.npy")
  original = open(test, "rb").read()
  try:
    arr = np.load(test)
    np.save(test, arr[::-1].copy())  # same shape, other windows; manifest.json untouched
    with pytest.raises(UserError, match=r"test\.npy' is missing or changed since prepare"):
      ckpt_lib.check_data(w, c.data.dir, None, ("router.npz", "test.npy"))
    ckpt_lib.check_data(w, c.data.dir)  # generate reads the router only: still fine
  finally:
    open(test, "wb").write(original)


def test_a_run_trained_on_relative_data_dir_stores_it_absolute(own_data, tmp_path):
  """A relative data.dir was stored as given, so tools run elsewhere could not find it."""
  d, _ = own_data
  w = str(tmp_path / "w")
  rel = os.path.relpath(d, os.path.dirname(d))
  proc = subprocess.run(TRAIN_CLI + [f"--config.data.dir={rel}", f"--workdir={w}",
                                     "--config.steps=1"],
                        capture_output=True, text=True, cwd=os.path.dirname(d), timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert ckpt_lib.read_config(w).data.dir == d
  c = config_lib.base_config(2, "tiny")
  c.data.dir, c.init_from = "x/y", ""
  cli_lib.absolute_paths(c)
  assert c.data.dir == os.path.abspath("x/y") and c.init_from == ""


def test_empty_workdir_and_out_are_refused(tmp_path):
  """`train.py --workdir=` trained into the current folder."""
  proc = subprocess.run(TRAIN_CLI + ["--workdir=", "--config.data.dir=/nonexistent"],
                        capture_output=True, text=True, cwd=tmp_path, timeout=300)
  one_error_line(proc, "--workdir= is empty")
  assert os.listdir(tmp_path) == []
  one_error_line(cli([sys.executable, "experiments/merge.py", "--out=", "x"]), "--out= is empty")


@pytest.mark.parametrize("field,value", [
    ("opt.lr", float("inf")), ("spsa.eps", float("inf")), ("opt.lr", float("nan")),
    ("opt.lr", 0.0), ("spsa.eps", -1e-3), ("ckpt.keep", 0), ("data.val_windows", 0),
    ("mesh.pert", "0"), ("mesh.expert", "-1"), ("opt.floor", 0.0), ("opt.patience", 0),
    ("opt.weight_decay", float("nan")), ("eggroll.sigma", float("inf")), ("seed", -1),
    ("ensemble_eval_every", -2), ("budget", float("inf")), ("data.seq_len", 100),
])
def test_meaningless_config_values_are_refused(field, value):
  """keep=0 kept no checkpoint and lr=inf skipped every update, both ending "done"."""
  c = config_lib.base_config(2, "tiny")
  *parents, key = field.split(".")
  node = c
  for p in parents:
    node = node[p]
  node[key] = value
  with pytest.raises(UserError, match=rf"{field}=.* is out of range"):
    config_lib.validate(c)


def test_every_config_field_has_a_range():
  for size in config_lib.SIZES:
    c = config_lib.base_config(4, size)
    config_lib.validate(c)
    assert set(config_lib.flatten(c.to_dict())) <= set(config_lib.FIELD_RANGES), size


def test_json_safe_writes_null_for_nan():
  obj = {"val_loss": [float("nan"), 1.5], "x": np.float32("inf"), "n": np.int64(3), "s": "a"}
  text = json.dumps(metrics.json_safe(obj), allow_nan=False)
  assert json.loads(text) == {"val_loss": [None, 1.5], "x": None, "n": 3, "s": "a"}


def test_prepare_never_reads_its_own_output(data_textdir, tmp_path):
  """--out inside a textdir source: the second run read manifest.json and heldout_docs.json."""
  src = tmp_path / "src"
  shutil.copytree(data_textdir, src)
  out = str(src / "data")
  first = prepare.prepare(f"textdir:{src}", 3, out, **SMALL_PREP)
  before = {n: open(os.path.join(out, n), "rb").read() for n in ("test.npy", "router.npz")}
  second = prepare.prepare(f"textdir:{src}", 3, out, **SMALL_PREP)
  assert second["documents"]["nonempty"] == first["documents"]["nonempty"] == 90
  assert {n: open(os.path.join(out, n), "rb").read() for n in before} == before
  assert "inside --out" in prepare.summary(second, out, 1.0)


def test_prepare_leaves_no_staging_folder(data_textdir, tmp_path, monkeypatch):
  """SIGTERM left a hidden staging folder (66 MB) that no later prepare removed."""
  out = str(tmp_path / "d")
  stale = tmp_path / ".d.tmp-999999999-abc"  # a prepare killed with -9: its pid is gone
  (stale / "_work").mkdir(parents=True)
  real = prepare._prepare_into

  def terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)

  monkeypatch.setattr(prepare, "_prepare_into", terminated)
  with pytest.raises(SystemExit) as stopped:
    prepare.prepare(f"textdir:{data_textdir}", 3, out, **SMALL_PREP)
  assert stopped.value.code == 128 + signal.SIGTERM
  assert os.listdir(tmp_path) == []  # this run's staging and the stale one: both gone
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back


def test_min_df_larger_than_the_sample_fails_at_once(data_textdir, tmp_path):
  with pytest.raises(UserError, match=r"--min_df=100000 is more than the \d+ windows"):
    prepare.prepare(f"textdir:{data_textdir}", 3, str(tmp_path / "d"),
                    **{**SMALL_PREP, "min_df": 100_000})


def test_compare_refuses_an_out_holding_another_study(tmp_path):
  """table4 into table7's folder overwrote its results.json and nested its runs."""
  out = tmp_path / "t7"
  out.mkdir()
  (out / "results.json").write_text(json.dumps({"study": "table7"}))
  config = load_config_file(os.path.join(ROOT, "experiments", "configs", "compare.py"),
                            "study=table4,size=tiny")
  with pytest.raises(UserError, match="holds study 'table7'.*not 'table4'"):
    compare.run(config, str(out))
  assert os.listdir(out) == ["results.json"]
  compare.claim_out("table4", str(tmp_path / "t4"))
  with pytest.raises(UserError, match="holds study 'table4'"):
    compare.claim_out("table7", str(tmp_path / "t4"))
  compare.claim_out("table4", str(tmp_path / "t4"))  # its own folder: resumable


def test_a_zip_replaced_at_the_same_path_is_extracted_anew(tmp_path):
  """The notebook extracted a new zip on top of the old files and reused the old data dir."""
  path = tmp_path / "texts.zip"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("a.txt", "old corpus")
  first = prepare.unzip_corpus(str(path), str(tmp_path / "corpus"))
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("b.txt", "new corpus")
  second = prepare.unzip_corpus(str(path), str(tmp_path / "corpus"))
  assert first != second and os.listdir(second) == ["b.txt"] and not os.path.exists(first)
  assert prepare.unzip_corpus(str(path), str(tmp_path / "corpus")) == second
  path.write_bytes(b"PK\x03\x04 not really a zip")
  with pytest.raises(UserError, match="is not a readable zip file"):
    prepare.unzip_corpus(str(path), str(tmp_path / "corpus"))
  assert sorted(os.listdir(tmp_path / "corpus")) == [os.path.basename(second)]


def test_environment_and_config_file_errors_are_one_line(data_prepared, tmp_path):
  prep = [sys.executable, "experiments/prepare_data.py", f"--out={tmp_path / 'd'}"]
  for value, fragment in (("abc", "JAX_NUM_CPU_DEVICES='abc' is not a device count"),
                          ("0", "JAX_NUM_CPU_DEVICES=0: JAX cannot run on 0 CPU devices")):
    one_error_line(cli(prep, env={**os.environ, "JAX_NUM_CPU_DEVICES": value}), fragment)
  one_error_line(cli(prep, env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS":
                                "--xla_force_host_platform_device_count=0"}), "0 CPU devices")
  run = TRAIN_CLI + [f"--config.data.dir={data_prepared}", f"--workdir={tmp_path / 'w'}"]
  one_error_line(cli(run, env={**os.environ, "JAX_PLATFORMS": "cuda"}),
                 "JAX_PLATFORMS='cuda'", "no GPU backend", "fix:")
  missing = str(tmp_path / "missing.py")
  one_error_line(cli(TRAIN_CLI[:2] + [f"--config={missing}", "--config.steps=3",
                                      f"--workdir={tmp_path / 'w'}"]),
                 "missing.py cannot be loaded")
  (tmp_path / "noget.py").write_text("x = 1\n")
  for extra in ([], ["--config.steps=3"]):
    one_error_line(cli(TRAIN_CLI[:2] + [f"--config={tmp_path / 'noget.py'}", *extra,
                                        f"--workdir={tmp_path / 'w'}"]), "defines no get_config()")
  assert not os.path.exists(tmp_path / "w") and not os.path.exists(tmp_path / "d")


def test_every_checkpoint_unreadable_is_one_line(own_data, tmp_path, capfd):
  """With every checkpoint truncated, train restarted at step 0 saying so only in log lines."""
  d, w0 = own_data
  w = str(tmp_path / "w")
  shutil.copytree(w0, w)
  for dirpath, _, files in os.walk(os.path.join(w, "checkpoints")):
    for name in files:
      path = os.path.join(dirpath, name)
      os.truncate(path, os.path.getsize(path) // 2)
  proc = cli([sys.executable, "experiments/generate.py", f"--workdir={w}", "--max_bytes=4"])
  one_error_line(proc, "no readable checkpoint", "all 1 (steps 2)")
  assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr
  capfd.readouterr()
  with pytest.raises(UserError, match=r"all 1 \(steps 2\) failed.*moved aside.*from step 0"):
    train.run(tiny_config(d, steps=4), w)
  assert "unreadable" not in capfd.readouterr().err
  assert os.path.isdir(os.path.join(w, "checkpoints", "corrupt-2"))
  assert train.run(tiny_config(d, steps=2), w)["step"] == 2  # the rerun starts again


def test_variance_of_nan_weights_is_one_line(own_data, tmp_path):
  import jax
  import jax.numpy as jnp

  _, w0 = own_data
  w = str(tmp_path / "nan")
  step, state, data, _ = runs.restore_state(w0)
  shutil.copytree(w0, w, ignore=shutil.ignore_patterns("checkpoints"))
  ckpt = ckpt_lib.Checkpointer(w)
  ckpt.save(step, state.replace(body=jax.tree.map(lambda x: jnp.full_like(x, jnp.nan),
                                                  state.body)), data)
  ckpt.close()
  proc = cli([sys.executable, "experiments/variance.py",
              "--config=experiments/configs/variance.py:batch,size=tiny", f"--workdir={w}",
              f"--out={tmp_path / 'out'}"])
  one_error_line(proc, "non-finite weights", "fix:")


def test_tfds_truncated_records_and_int_features_are_named(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  from soma_jax.data import sources

  class Truncated:
    def __len__(self):
      return 3

    def __getitem__(self, i):
      if i == 1:
        raise ValueError("DATA_LOSS: Unable to read record: truncated array_record")
      return {"text": np.array(b"a document", dtype=object)}

  with tfds.testing.mock_data(num_examples=3, as_data_source_fn=lambda *a, **k: Truncated()):
    with pytest.raises(UserError, match="record 1 cannot be read .*DATA_LOSS"):
      list(sources.iter_documents("tfds:lm1b", tfds_data_dir=str(tmp_path)))
  rows = [{"label": np.array(3), "text": np.array(b"words", dtype=object)}] * 3
  with tfds.testing.mock_data(num_examples=3, as_data_source_fn=lambda *a, **k: rows):
    with pytest.raises(UserError, match="feature 'label' of 'lm1b' holds int values, not "
                                        r"text; fix: .*tfds:lm1b:FEATURE .*\(text\)"):
      list(sources.iter_documents("tfds:lm1b:label", tfds_data_dir=str(tmp_path)))


def test_bench_child_run_drops_the_space_form_json():
  """`make bench` passes `--json bench_out/...`; the one-device child got the file name as a
  stray argument and stopped."""
  # In a child process: benchmarks.spsa_step defines absl flags that another test module in
  # this worker may have defined already.
  child = textwrap.dedent("""
      import json, subprocess, sys
      sys.argv = ["spsa_step", "--config=x.py", "--json", "out.json", "--reps", "3", "--loop"]
      from benchmarks import spsa_step
      seen = {}
      def fake_run(args, **kwargs):
        seen["args"] = args
        return subprocess.CompletedProcess(args, 0, '{"step_seconds": 1, "config": '
                                           '{"pert_chunk": 1}}', "")
      spsa_step.subprocess.run = fake_run
      spsa_step.one_device_process(2)
      print(json.dumps(seen["args"]))
  """)
  proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-2000:]
  seen = {"args": json.loads(proc.stdout.strip().splitlines()[-1])}
  assert "out.json" not in seen["args"] and "3" not in seen["args"]
  assert "--config=x.py" in seen["args"] and "--loop" in seen["args"]
  assert "--json=bench_out/spsa_step.json" in open(os.path.join(ROOT, "Makefile")).read()
