"""Figure 9's readouts (`fig9.py`), pure statistics over the conditions' scored curves: each
condition's loss per checkpoint across seeds, and each ablation's final-step contrast with its
matched-loss speed-up.
"""

from __future__ import annotations

import numpy as np

from soma_jax.errors import UserError
from soma_jax.studies import statistics


def step_stats(per_seed: list[dict]) -> list[dict]:
  """Per checkpoint (the start included): update, mean loss over seeds, sample sd and
  standard error sd / sqrt(S) (None for one seed)."""
  updates = [p["update"] for p in per_seed[0]["curve"]]
  if any([p["update"] for p in q["curve"]] != updates for q in per_seed):
    raise UserError("the seeds of a condition saved checkpoints at different updates (their "
                    "runs were trained with other settings; they are kept); fix: rerun with "
                    "the settings that trained them, or another --out")
  out = []
  for i, u in enumerate(updates):
    s = statistics.across_seeds([q["curve"][i]["loss"] for q in per_seed])
    se = None if s["sd"] is None else s["sd"] / np.sqrt(len(per_seed))
    out.append({"update": u, **s, "se": se, "n": len(per_seed)})
  return out


def contrast(conditions: dict, names: tuple, doc_ids: np.ndarray, draws: int) -> dict:
  """names[0]'s final loss minus the lowest-mean final loss of names[1:], per seed (the
  seeds each ran), with its 95% t interval across seeds; beside it SPEC 9.8's matched-loss
  speed-up of a over that b in updates (`statistics.speedup_effect`: over their common loss
  range, seeds and the validation documents' noise; None where the ranges do not meet)."""
  a, others = names[0], names[1:]
  best = min(others, key=lambda n: conditions[n]["steps"][-1]["mean"])
  ends = {n: {q["seed"]: q["end_loss"] for q in conditions[n]["per_seed"]} for n in (a, best)}
  seeds = [s for s in ends[a] if s in ends[best]]
  diffs = [ends[a][s] - ends[best][s] for s in seeds]
  curves = {n: {q["seed"]: {"compared": q["_windows"]} for q in conditions[n]["per_seed"]}
            for n in (a, best)}
  speed = statistics.speedup_effect([(curves[a][s], curves[best][s]) for s in seeds], doc_ids,
                                   draws, "compared")
  speed.pop("_boot", None)
  return {"a": a, "b": best, "among": list(others), "update": conditions[a]["steps"][-1]["update"],
          "speedup": speed,
          **statistics.t_interval(diffs), "per_seed": [{"seed": s, "diff": d}
                                                     for s, d in zip(seeds, diffs, strict=True)]}
