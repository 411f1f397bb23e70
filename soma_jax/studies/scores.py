"""A study's scores of its runs: the start's losses, each checkpoint's on a set (the curve),
the final losses and a finished run's summary (read where training saved them)."""

from __future__ import annotations

import numpy as np

from soma_jax import budget as budget_lib
from soma_jax import checkpoint as ckpt_lib
from soma_jax import checkpoint_scores as scores_lib
from soma_jax import evaluate as eval_lib
from soma_jax import runs
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.studies import results


def checkpoints(workdir: str) -> list[int]:
  ckpt = ckpt_lib.Checkpointer(workdir)
  try:
    return sorted(ckpt.steps())
  finally:
    ckpt.close()


def _score(scorer: eval_lib.TestSet, spec: spec_lib.RunSpec, body, head) -> np.ndarray:
  return scorer.losses(body, head, spec.n_experts, spec.shared_head, spec.method.logits)


def start_losses(spec: spec_lib.RunSpec, scorers: dict[str, eval_lib.TestSet]
                 ) -> dict[str, np.ndarray]:
  """Per-window losses of the parameters a run starts from, on each scorer
  ({"validation": ..., "test": ...}); the start is the same for every optimisation seed."""
  body, head = runs.initial_params(spec)
  return {split: _score(s, spec, body, head) for split, s in scorers.items()}


def _point(data_state: dict, step: int, start_step: int, ops_update: int, loss: float) -> dict:
  return {"step": step, "update": step - start_step, "ops": (step - start_step) * ops_update,
          **{k: float(data_state.get(k, 0.0)) for k in budget_lib.TRAINING_TIMERS},
          "loss": loss}


def curve(workdir: str, spec: spec_lib.RunSpec, scorer: eval_lib.TestSet,
          start_step: int, start_loss: float, keep: list | None = None
          ) -> tuple[list[dict], np.ndarray]:
  """The start (the seed's state, `start_loss` on `scorer`, at the seed's step), then each of
  the run's checkpoints (`checkpoint_curve`): ([{step, update, ops, device_seconds,
  cpu_seconds, loss}], per-window losses of the last checkpoint). `update` and `ops` are this
  run's, counted from its start."""
  start = _point({}, start_step, start_step, spec.total_ops_per_update, float(start_loss))
  points, last = checkpoint_curve(workdir, spec, scorer, start_step, keep)
  return [start, *points], last


def checkpoint_curve(workdir: str, spec: spec_lib.RunSpec, scorer: eval_lib.TestSet,
                     start_step: int, keep: list | None = None
                     ) -> tuple[list[dict], np.ndarray]:
  """Each of the run's checkpoints after `start_step` scored by `scorer` (read where training
  scored it on this set: `scored_at`): ([{step, update, ops, device_seconds, cpu_seconds,
  loss}], per-window losses of the last). `update` and `ops` are counted from `start_step`.
  `keep`: a list each checkpoint's per-window losses are appended to."""
  opu, points, last = spec.total_ops_per_update, [], None
  for s in (s for s in checkpoints(workdir) if s > start_step):
    last, data_state = scored_at(workdir, s, spec, scorer)
    if keep is not None:
      keep.append(last)
    points.append(_point(data_state, s, start_step, opu, float(last.mean())))
  if last is None:
    raise UserError(f"{workdir!r} has no checkpoint after its start (step {start_step}): it "
                    "made no update; fix: rerun the same command (the run resumes), or "
                    "another --out")
  return points, last


def scored_at(workdir: str, step: int, spec: spec_lib.RunSpec, scorer: eval_lib.TestSet
              ) -> tuple[np.ndarray, dict]:
  """(per-window losses on `scorer`, data state) of the run's checkpoint at `step`: those
  training saved for exactly this set (`checkpoint_scores.read`), else restored and scored."""
  saved = scores_lib.read(workdir, step, _settings(scorer))
  if saved is not None:
    return saved
  _, state, data_state, _ = runs.restore_state(workdir, step=step)
  return _score(scorer, spec, state.body, state.head), data_state


def _settings(scorer) -> dict | None:
  """The set's identity for saved checkpoint scores; None (never read saved scores) for a
  scorer that has none, e.g. a wrapper that scores other numbers from a TestSet's windows."""
  settings = getattr(scorer, "settings", None)
  return settings() if callable(settings) else None


def final_losses(workdir: str, spec: spec_lib.RunSpec, scorer: eval_lib.TestSet
                 ) -> np.ndarray:
  """Per-window losses of a run's newest checkpoint (scored once, or read where training
  scored it on this set: `scored_at`)."""
  steps = checkpoints(workdir)
  saved = scores_lib.read(workdir, steps[-1], _settings(scorer)) if steps else None
  if saved is not None:
    return saved[0]
  body, head, _ = runs.restore_params(workdir)
  return _score(scorer, spec, body, head)


def summary(workdir: str, spec: spec_lib.RunSpec, start_step: int) -> dict:
  """A finished run (its newest checkpoint and summary.json): the step reached, this run's
  updates and operations, its training and apart seconds, and the budget counted one update
  before the stop (below the budget). The counters come from the newest checkpoint's saved
  scores (`checkpoint_scores.counters`), else from restoring it."""
  step = ckpt_lib.newest_step(workdir)
  data_state = scores_lib.counters(workdir, step) if step is not None else None
  if data_state is None:
    step, _, data_state, _ = runs.restore_state(workdir)
  done = results.read_summary(workdir) or {}  # unreadable: rewritten when the run is resumed
  updates = int(step) - start_step
  return {"step": int(step), "updates": updates, "ops": updates * spec.total_ops_per_update,
          **{k: float(data_state.get(k, 0.0)) for k in budget_lib.TIMERS},
          "budget_unit": spec.budget.unit,
          "budget_before_last_update": done.get("budget_before_last_update")}


def budget_used(record: dict) -> float:
  """What a `summary` record spent in its budget unit."""
  return float(record[record["budget_unit"]])
