"""Every command in docs/commands.md's table and in README's code blocks runs as written (as far
as --help shows), and docs/layout.md's tree lists every module on a line of its own (the studies
by a pattern: `<study>.py`, `<study>_*.py`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from soma_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def table_commands(page: str) -> list[list[str]]:
  """The backticked commands of a two-column command table, split like a shell."""
  out = []
  for line in page.splitlines():
    cols = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cols) != 2 or cols[1] in ("command", "---"):
      continue
    out.extend(shlex.split(span) for span in re.findall(r"`([^`]+)`", cols[1]))
  return out


def _commands() -> list[list[str]]:
  with open(os.path.join(ROOT, "docs", "commands.md"), encoding="utf-8") as f:
    return table_commands(f.read())


def readme_blocks() -> list[list[list[str]]]:
  """README's fenced code blocks of python commands, each a list of commands split like a shell."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    blocks = re.findall(r"```\n(.*?)```", f.read(), re.S)
  return [[shlex.split(line) for line in b.splitlines()] for b in blocks
          if b.startswith("python ")]


def test_readme_blocks_are_the_tiny_run_and_your_own_text():
  blocks = readme_blocks()
  assert len(blocks) == 3, blocks  # the tiny run, your own text, reproducing the paper
  tiny, own = blocks[0], blocks[1]
  assert [_entry_point(c) for c in tiny] == [
      ("experiments/prepare_data.py",), ("experiments/train.py",), ("experiments/train.py",),
      ("experiments/evaluate.py",)]
  assert [_entry_point(c)[0] for c in own][-2:] == [
      "experiments/evaluate.py", "experiments/generate.py"]
  assert _flag(own[0], "source").startswith("textdir:")


def _entry_point(cmd: list[str]) -> tuple[str, ...] | None:
  """('-m', module) or (script,) of a `python ...` command."""
  if cmd[0] != "python":
    return None
  return tuple(cmd[1:3]) if cmd[1] == "-m" else (cmd[1],)


def _flag(cmd: list[str], name: str) -> str | None:
  return next((a.split("=", 1)[1] for a in cmd if a.startswith(f"--{name}=")), None)


def _config_spec(spec: str) -> tuple[str, str]:
  """'experiments/configs/soma.py:n=2' or 'soma.py:n=2' -> (path, argument)."""
  path, _, arg = spec.partition(":")
  if "/" not in path:
    path = os.path.join("experiments", "configs", path)
  return os.path.join(ROOT, path), arg


def test_table_has_the_newcomer_commands():
  scripts = {_entry_point(c) for c in _commands()}
  for script in ("experiments/prepare_data.py", "experiments/train.py", "experiments/evaluate.py",
                 "experiments/report.py", "experiments/generate.py"):
    assert (script,) in scripts, f"{script} is missing from docs/commands.md's table"
  assert any(c[0] == "tensorboard" for c in _commands())


def test_scripts_configs_and_fields_exist():
  base = config_lib.base_config()
  runnable = readme_blocks()[:2]  # the third block's study=NAME is a placeholder
  for cmd in _commands() + [c for block in runnable for c in block]:
    if cmd[0] == "pip":  # pip install -e ".[EXTRA]": the extra is in pyproject.toml
      extra = re.fullmatch(r"\.\[(\w+)\]", cmd[-1]).group(1)
      with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert re.search(rf"^{extra} = \[", f.read(), re.M), f"no extra {extra!r} in pyproject"
      continue
    entry = _entry_point(cmd)
    if entry and entry[0] != "-m":
      assert os.path.isfile(os.path.join(ROOT, entry[0])), entry[0]
    config = base
    specs = [a.split("=", 1)[1] for a in cmd if a.startswith("--config=")]
    if len(cmd) == 1 and re.fullmatch(r"(experiments/configs/)?\w+\.py(:\S*)?", cmd[0]):
      specs.append(cmd[0])  # a config named on its own, e.g. `soma.py:mono=256`
    for spec in specs:
      path, arg = _config_spec(spec)
      config = config_lib.load_config_file(path, arg or None)
    for arg in cmd:
      key = re.match(r"--config\.([\w.]+)=", arg)
      if key:
        node = config
        for part in key.group(1).split("."):
          assert part in node, f"{arg}: no field {key.group(1)!r} in the config"
          node = node[part]


@pytest.mark.parametrize("which", ["table", "tiny run", "your own text"])
def test_the_session_rows_chain(which):
  """Data dirs and workdirs that a command reads are written by an earlier row (of the
  commands table, or of README's block)."""
  commands = {"table": _commands(), "tiny run": readme_blocks()[0],
              "your own text": readme_blocks()[1]}[which]
  written_data, written_runs = set(), set()
  for cmd in commands:
    entry = _entry_point(cmd)
    if entry == ("experiments/prepare_data.py",):
      written_data.add(_flag(cmd, "out"))
    for name in ("config.data.dir", "data_dir"):
      if entry in {("experiments/train.py",), ("experiments/report.py",)} and _flag(cmd, name):
        assert _flag(cmd, name) in written_data, f"{' '.join(cmd)} reads an unprepared data dir"
    if entry == ("experiments/train.py",) and _flag(cmd, "config.data.dir"):
      if _flag(cmd, "config.init_from"):
        assert _flag(cmd, "config.init_from") in written_runs
      written_runs.add(_flag(cmd, "workdir"))
    elif entry in {("experiments/evaluate.py",), ("experiments/generate.py",)}:
      assert _flag(cmd, "workdir") in written_runs, f"{' '.join(cmd)} reads an untrained workdir"
    elif entry == ("experiments/report.py",):
      runs = [a.split("=", 1)[1] for a in cmd[2:] if not a.startswith("-")]
      assert runs and set(runs) <= written_runs, f"{' '.join(cmd)} reads an untrained workdir"
  assert written_data and written_runs


def test_every_entry_point_answers_help():
  commands = _commands() + [c for block in readme_blocks() for c in block]
  entries = sorted({e for e in map(_entry_point, commands) if e})
  assert len(entries) >= 8
  procs = {e: subprocess.Popen([sys.executable, *e, "--help"], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for e in entries}
  failed = {}
  for e, proc in procs.items():
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
      failed[" ".join(e)] = (proc.returncode, out[-500:])
  assert not failed, failed


def test_tensorboard_command_runs_when_the_extra_is_installed():
  exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
  if not os.path.exists(exe):
    pytest.skip('the tensorboard extra is not installed (pip install -e ".[tensorboard]")')
  assert subprocess.run([exe, "--help"], capture_output=True, timeout=300).returncode == 0


LAYOUT_DIRS = ("soma_jax", "experiments", "benchmarks", "scripts")


def layout_paths(page: str) -> list[str]:
  """The paths docs/layout.md's tree names, one per line, folders from the indentation."""
  block = page.split("```\n", 1)[1].split("```", 1)[0]
  stack, out = [], []
  for line in block.splitlines():
    indent = (len(line) - len(line.lstrip(" "))) // 2
    name = line.split()[0]
    stack = stack[:indent] + [name.rstrip("/")]
    out.append("/".join(stack) + ("/" if name.endswith("/") else ""))
  return out


def _modules() -> set[str]:
  """Every module and script of LAYOUT_DIRS (experiments/configs/ aside), and every
  __init__.py that holds more than a docstring."""
  import ast

  out = set()
  for top in LAYOUT_DIRS:
    for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
      dirs[:] = [d for d in dirs if d not in ("configs", "__pycache__")]
      for name in files:
        path = os.path.relpath(os.path.join(folder, name), ROOT)
        if name == "__init__.py":
          with open(os.path.join(ROOT, path)) as f:
            body = ast.parse(f.read()).body
          if len(body) <= 1 and all(isinstance(s, ast.Expr) for s in body):
            continue
        if name.endswith((".py", ".sh")):
          out.add(path.replace(os.sep, "/"))
  return out


STUDY = "<study>"  # a name in the tree standing for each registered study's module name


def study_modules() -> list[str]:
  """The module names of compare.STUDIES' studies, which the tree's `<study>` lines stand for."""
  import inspect

  from soma_jax.studies import compare

  return [inspect.getmodule(s.config).__name__.rsplit(".", 1)[1] for s in compare.STUDIES.values()]


def expand(pattern: str, studies: list[str]) -> set[str]:
  """The files a `<study>` line of the tree stands for: each study's module (`<study>.py`) or
  its companions (`<study>_*.py`)."""
  import glob

  return {os.path.relpath(p, ROOT).replace(os.sep, "/")
          for name in studies for p in glob.glob(os.path.join(ROOT, pattern.replace(STUDY, name)))}


def test_layout_lists_every_module_once():
  """Every module on a line of its own, but a study and its companions: the tree's `<study>.py`
  and `<study>_*.py` lines cover every registered study, so adding one leaves layout.md alone."""
  with open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8") as f:
    listed = layout_paths(f.read())
  files = [p for p in listed if not p.endswith("/") and STUDY not in p]
  assert len(files) == len(set(files)), "a module is listed twice in docs/layout.md"
  studies = study_modules()
  covered = {p: expand(p, studies) for p in listed if STUDY in p}
  assert covered and all(covered.values()), f"a <study> line matches nothing: {covered}"
  both = set(files) & set().union(*covered.values())
  assert not both, f"docs/layout.md lists {sorted(both)} on its own and as <study>"
  missing = sorted(_modules() - set(files) - set().union(*covered.values()))
  gone = sorted(p for p in listed if STUDY not in p and not os.path.exists(os.path.join(ROOT, p)))
  assert not missing, f"docs/layout.md does not list {missing}"
  assert not gone, f"docs/layout.md lists what does not exist: {gone}"
