"""Per-window scores of each checkpoint, written by training from the state in memory.

A run whose config names `checkpoint_eval` scores that evaluation set right after each
checkpoint it saves (`checkpoint_scoring`, a save hook of training) and writes
WORKDIR/checkpoint_scores/STEP.npy (the per-window nats/byte, float64) and STEP.json (the
step, the set's `TestSet.settings` and the checkpoint's counters, as its data state holds
them). A study reads them (`read`) in place of restoring that checkpoint and scoring it, only
where the settings equal its own set's: any other set, a missing or unreadable file, falls
back to restoring. Each file is written to a temporary name and renamed, the .json last, so
a killed run leaves no half file that could be read; the files of a step are removed before
its checkpoint is saved, so a step saved again is never paired with an older attempt's
scores. STEP.json names the run that wrote it (`checkpoint.run_id`): a file copied from
another run, or counters that are not finite numbers (a tampered file), are never read, and
the checkpoint is restored instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import os

import numpy as np

from soma_jax import checkpoint as ckpt_lib

FOLDER = "checkpoint_scores"


def _paths(workdir: str, step: int) -> tuple[str, str]:
  base = os.path.join(workdir, FOLDER, str(int(step)))
  return base + ".npy", base + ".json"


def forget(workdir: str, step: int) -> None:
  """Removes step's files (before its checkpoint is saved again), the .json first."""
  for path in reversed(_paths(workdir, step)):
    with contextlib.suppress(FileNotFoundError):  # none, or another process removed it
      os.remove(path)


def write(workdir: str, step: int, losses_n: np.ndarray, settings: dict,
          counters: dict) -> None:
  """STEP.npy (the per-window losses) then STEP.json (step, settings, counters), each
  through a temporary file renamed into place."""
  npy, meta = _paths(workdir, step)
  os.makedirs(os.path.dirname(npy), exist_ok=True)
  tmp = npy + ".tmp"
  with open(tmp, "wb") as f:
    np.save(f, np.asarray(losses_n, np.float64))
  os.replace(tmp, npy)
  tmp = meta + ".tmp"
  with open(tmp, "w") as f:
    json.dump({"step": int(step), "run": ckpt_lib.run_id(workdir), "settings": settings,
               "counters": counters}, f, indent=1)
  os.replace(tmp, meta)


def _number(x: object) -> bool:
  return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _meta(workdir: str, step: int) -> dict | None:
  """STEP.json as saved for exactly `step` by this run, its counters finite numbers, or None
  (none, unreadable, another step, another run's, tampered counters)."""
  _, meta = _paths(workdir, step)
  try:
    with open(meta) as f:
      saved = json.load(f)
  except (OSError, ValueError):  # none, or unreadable: restored instead
    return None
  if not isinstance(saved, dict) or saved.get("step") != int(step):
    return None
  mine = ckpt_lib.run_id(workdir)
  if mine is None or saved.get("run") != mine:  # written by another run (copied here)
    return None
  found = saved.get("counters")
  if not isinstance(found, dict) or not all(map(_number, found.values())):
    return None
  return saved


def counters(workdir: str, step: int) -> dict | None:
  """The counters training saved beside step's scores (its checkpoint's, whichever set was
  scored), or None where there are none for exactly that step of this run."""
  found = (_meta(workdir, step) or {}).get("counters")
  return dict(found) if isinstance(found, dict) else None


def read(workdir: str, step: int, settings: dict | None) -> tuple[np.ndarray, dict] | None:
  """(per-window losses, the checkpoint's counters) saved for `step` on the set of
  `settings`, or None where there are none for exactly that set and step."""
  npy, _ = _paths(workdir, step)
  saved = _meta(workdir, step) if settings is not None else None
  if saved is None or saved.get("settings") != settings:
    return None
  try:
    losses = np.load(npy, allow_pickle=False)
  except (OSError, ValueError, EOFError):  # none, or unreadable: restored instead
    return None
  if losses.dtype != np.float64 or losses.shape != (settings["windows"],):
    return None
  return losses, dict(saved["counters"])
