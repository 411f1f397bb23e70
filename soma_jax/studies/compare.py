"""The paper's comparisons at any scale (SPEC 9): `run` dispatches on config.study.

  table4  SPEC 9.1: how to spend a budget (SPEC 7's operations at size=cpu, on any machine):
          SOMA N = 2, monoliths at 1x / 4x / 16x SOMA's directions, EGGROLL, BPTT, and the
          head-only and summed-loss controls
  table7  SPEC 9.2: SOMA N = 2 against the monolith of the same size at equal updates (equal
          operations) and equal tuning (lr then eps grid, selection on validation, test once)
  ladder  SPEC 9.7: table7 at each width of config.rungs, the descent ratio rho and the
          effective rank r at each rung's start, and the summed-loss control
  decompose SPEC 9.8: where SOMA's lead comes from: sharding under SPSA and backprop, random
          shards, the summed loss, one expert alone, with matched-loss speed-ups
  narrow  SPEC 9.8: sharding or a narrower model: SOMA N = 2 against one expert of its width
          and the monolith as the budget grows to 16x decompose's, every seed its own start
  fig7    the paper's Figures 7, 8 and 14: SOMA's validation loss against time as N
          (fixed-width experts), n_pert and the effective batch B grow; which N is lowest
          under a total and a per-expert budget
  fig13   the paper's Figure 13 with Tables 10 and 11: SOMA N = 8 with n_pert x B fixed,
          split three ways, curves, estimated losses at three budgets, test after equal ops
  fig15   the paper's Figure 15 with Tables 12 and 13: the monolith and SOMA N = 2, 8, 32 of
          equal total size, test loss against inference cost (complete warm inference
          including routing, its fastest batch; operations of the selected experts)
  fig9    the paper's Figure 9 (ablations): semantic vs random shards, warm vs cold start,
          and the head (own delta-rule heads, the seed's frozen shared head, a frozen random
          head), SOMA N = 2 of width 32, means and standard errors over seeds per checkpoint
  fig16   the paper's Figure 16: top-k routing, k = 1 .. N, on saved SOMA ensembles (N = 8
          and 32 at size=cpu), the gain captured at k = 4
  fig17   the paper's Figure 17: every pair of experts of Figure 16's ensembles averaged,
          loss reduction against error similarity (shared token difficulty removed)
  table5  the paper's Table 5: SOMA against BPTT at N = 1, 2, 8 of equal total size, ensemble
          validation at three fractions of one operations budget
  table8  the paper's Table 8: the experts variance study's jax.grad references against an
          independent batch of the same size per N, at init and trained: cosine distance
          and what each variance value changes by
  table9  the paper's Table 9: Table 4's SOMA and monolith rows, each final checkpoint
          chosen first, scored frozen on a corpus nobody trained on (WikiText-103 raw, or
          any SOURCE: the man pages by default), with the in-domain test beside it
  table3  the paper's Table 3: Figure 7's largest N (its checkpoint after the sweep's
          updates) and one expert alone, each seed's training compute by the paper's
          conventions (recorded step times, the physical total, a fixed per-expert rate)
  table6  the paper's Table 6: lr and initial eps sensitivity of the monolith and SOMA N = 2
          at equal compute, the paper's five cells, mean +- sd over seeds
  spsa15  issue 56: SOMA N = 2 and the monolith, each by SPSA and by 1.5-SPSA (method=soma15)
          at equal operations, alpha chosen on one seed; does 1.5-SPSA help SOMA, the
          monolith more, and does SOMA against the monolith keep its sign

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

# The one list of compare.py's studies: config.study -> its Study (`base.Study`). The config
# file, the entry point's --help and --list all read it.
STUDIES = {"table4": table4.STUDY, "table7": table7.STUDY,
           "ladder": ladder.STUDY, "decompose": decompose.STUDY,
           "table5": table5.STUDY, "table6": table6.STUDY,
           "fig7": fig7.STUDY, "fig13": fig13.STUDY, "fig9": fig9.STUDY,
           "fig15": fig15.STUDY, "fig16": fig16.STUDY,
           "fig17": fig17.STUDY, "table8": table8.STUDY,
           "table9": table9.STUDY, "table3": table3.STUDY,
           "narrow": narrow.STUDY, "spsa15": spsa15.STUDY}


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
