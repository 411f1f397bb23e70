"""The paper's comparisons at any scale (SPEC 9): `run` dispatches on config.study.

Each study is one module of soma_jax/studies/ and one line of STUDIES below; what each is, is
the first paragraph of its module's docstring (`listing`: python experiments/compare.py --list).

Every row continues its architecture's own seed run, optimizer state included (`protocol`,
SPEC 9.6); every study field and run config is checked before anything trains
(`planning.check_plan`, `training.check_runs`). `run(config, out)` writes OUT/results.json
and OUT/table.md; the runs live in OUT/seeds and OUT/runs/seedS/NAME (the ladder's in
OUT/rungW/) and resume like any training run.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os

import ml_collections

from soma_jax import checkpoint as ckpt_lib
from soma_jax.errors import UserError, writable_dir
from soma_jax.studies import (
  base,
  decompose,
  driver,
  fig7,
  fig9,
  fig13,
  fig15,
  fig16,
  fig17,
  ladder,
  narrow,
  spsa15,
  table3,
  table4,
  table5,
  table6,
  table7,
  table8,
  table9,
)

# The one list of compare.py's studies, each named by its Study (`base.Study.name`): config.study
# -> its Study. The config file, the entry point's --help and --list all read it.
STUDIES = {s.name: s for s in (table4.STUDY, table7.STUDY, ladder.STUDY, decompose.STUDY,
                               table5.STUDY, table6.STUDY, fig7.STUDY, fig13.STUDY, fig9.STUDY,
                               fig15.STUDY, fig16.STUDY, fig17.STUDY, table8.STUDY, table9.STUDY,
                               table3.STUDY, narrow.STUDY, spsa15.STUDY)}


def _study(name: object) -> base.Study:
  if name not in STUDIES:
    raise UserError(f"study={name!r}; use one of {', '.join(STUDIES)}")
  return STUDIES[name]


def listing() -> str:
  """One line per study: its name and its module docstring's first paragraph."""
  first = lambda s: " ".join(inspect.getmodule(s.config).__doc__.strip().split("\n\n")[0].split())
  return "\n".join(f"{name:8s} {first(study)}" for name, study in STUDIES.items())


STUDY_FILE = "study.json"  # OUT's study, written first: another study is refused there


def claim_out(study: str, out: str) -> bool:
  """UserError when `out` holds another study's results (its results.json or study.json):
  a second study would overwrite them and nest its runs among the other's; else `out` is
  marked as this study's. Whether this call wrote the mark (`release_out` may take it back)."""
  for name in (STUDY_FILE, "results.json"):
    path = os.path.join(out, name)
    try:
      with open(path) as f:
        theirs = json.load(f).get("study")
    except (OSError, ValueError, AttributeError):
      continue
    if theirs != study:
      raise UserError(f"--out={out!r} holds study {theirs!r} ({name}), not {study!r}; a second "
                      "study there would overwrite its results and mix the runs; fix: pass "
                      f"another --out for {study}, e.g. runs/{study}")
  writable_dir(out, "--out")
  path = os.path.join(out, STUDY_FILE)
  created = not os.path.exists(path)
  with open(path, "w") as f:
    json.dump({"study": study}, f)
  return created


def holds_runs(out: str) -> bool:
  """Whether `out` holds a training run (a folder with a config.json) or a study's results."""
  for folder, _, files in os.walk(out):
    if ckpt_lib.CONFIG_FILE in files or (folder == out and "results.json" in files):
      return True
  return False


def release_out(out: str) -> None:
  """Removes OUT/study.json where the study that wrote it stopped before any run began (a
  refused config), so that another study may use `out`; kept once it holds runs."""
  if not holds_runs(out):
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(out, STUDY_FILE))


def run(config: ml_collections.ConfigDict, out: str, command: str = "", executor=None) -> dict:
  """Runs config.study into `out`, each stage's runs by `executor` (`executor.make`; None:
  one after another in this process); returns its results.json payload. A study refused
  before any run began leaves no study.json of its own behind (`release_out`)."""
  study = _study(config.study)
  created = claim_out(config.study, out)
  try:
    return driver.run(study, config, out, command, executor)
  except BaseException:
    if created:
      release_out(out)
    raise


def table(payload: dict) -> str:
  """The markdown table of a study's results.json payload."""
  return _study(payload.get("study")).table(payload)
