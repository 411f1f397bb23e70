"""Figure 9's readouts (`fig9.py`), pure statistics over the conditions' scored curves: each
condition's loss per checkpoint across seeds, and each ablation's final-step contrast with its
matched-loss speed-up; and its row of the paper table, read from the committed results.json
(PAPER_ROWS).
"""

from __future__ import annotations

import numpy as np

from soma_jax.errors import UserError
from soma_jax.studies import paper, statistics
from soma_jax.studies.verdict import Interval, from_stat


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


# ------------------------------------------------------------------ the paper table's row

CONTRASTS = {"random_minus_semantic": "random − semantic shards", "cold_minus_warm": "cold − warm",
             "delta_minus_shared": "delta-rule head − frozen seed head",
             "random_head_minus_best": "frozen random head − best"}


def primary_figure9(d: dict) -> tuple[Interval, ...]:
  c = d["measured"]["contrasts"]
  # The paper: semantic shards, warm starts and a frozen head lower loss; a random head is worse.
  return tuple(from_stat(what, c[k]) for k, what in CONTRASTS.items())


def ours_figure9(d: dict) -> str:
  return paper.shown(primary_figure9(d), 4)


PAPER_ROWS = (paper.StudyRow(
    "Figure 9", "ablations: semantic vs random shards, warm vs cold start, the head",
    ours_figure9, "semantic shards and warm starts lower loss; the tied head through the decoder "
    "+0.029; a frozen random head much worse", "N = 2, 1,000 updates, 3 seeds; random shards no "
    "worse here and the delta-rule head lower than the frozen one (the paper: higher)",
    primary_figure9, brief="warm start helps, random head worse; shards: no measurable "
    "difference; delta head beats frozen", paper_brief="semantic shards, warm start, frozen head "
    "help"),)
