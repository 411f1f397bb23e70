"""Figures 7, 8 and 14's readouts (`fig7.py`), pure functions of the settings' scored curves:
each panel's order (does the end loss fall with the setting), Figure 8's lowest N at equal
aggregate compute, Figure 14's lowest-loss N under a total and a per-expert budget.
"""

from __future__ import annotations

import numpy as np

PANEL_KEYS = {"experts": "n_experts", "n_pert": "n_pert", "batch": "batch"}


def panel_readout(panel: str, names: tuple, settings: dict) -> dict:
  """A panel's settings in order with their end losses, and whether the end loss falls
  strictly with the setting (in the seed mean, and in how many seeds)."""
  ends = [settings[n]["end_loss"]["mean"] for n in names]
  per_seed = np.array([[q["end_loss"] for q in settings[n]["per_seed"]] for n in names])
  return {"axis": PANEL_KEYS[panel], "methods": list(names),
          "values": [setting_of(settings[n], panel) for n in names], "end_loss": ends,
          "falls_monotonically": bool(np.all(np.diff(ends) < 0)),
          "seeds_falling_monotonically": int(np.sum(np.all(np.diff(per_seed, axis=0) < 0,
                                                           axis=0)))}


def setting_of(r: dict, panel: str) -> int:
  return int({"experts": r["n_experts"], "n_pert": r["n_pert"],
              "batch": r["effective_batch"]}[panel])


def lowest_at_compute(names: tuple, settings: dict, points: int = 6) -> dict:
  """Figure 8's reading: the seed-mean validation curve of each N interpolated (log-linear)
  at `points` aggregate device-second budgets spaced logarithmically over the range every N
  covers, and which N is lowest at each."""
  curves = {}
  for n in names:
    per = settings[n]["per_seed"]
    x = np.mean([[p["device_seconds"] for p in q["curve"]] for q in per], axis=0)
    y = np.mean([[p["loss"] for p in q["curve"]] for q in per], axis=0)
    curves[n] = (x, y)
  lo = max(x[1] for x, _ in curves.values())  # every curve's first checkpoint
  hi = min(x[-1] for x, _ in curves.values())
  if not hi > lo:
    return {"budgets": [], "lowest": [], "how": "no aggregate budget every N reaches"}
  budgets = np.geomspace(lo, hi, points)
  at = {n: [float(np.interp(np.log(b), np.log(np.maximum(x, 1e-12)), y)) for b in budgets]
        for n, (x, y) in curves.items()}
  lowest = [min(names, key=lambda n, i=i: at[n][i]) for i in range(points)]
  return {"device_seconds": [float(b) for b in budgets], "loss": at, "lowest": lowest,
          "how": "seed-mean validation curves against aggregate device-seconds, interpolated "
                 "linearly in log device-seconds between checkpoints, at budgets spaced "
                 "logarithmically from the latest first checkpoint to the earliest last"}


def budget_map(names: tuple, settings: dict, cells: int = 9) -> dict:
  """Figure 14's map: for each total budget T (aggregate device-seconds) and per-expert budget
  P, the expert count of the lowest-loss saved checkpoint whose total device-seconds are at
  most T and whose per-expert share (total / N: experts train apart, one per device) is at
  most P. Checkpoints are the experts panel's, seed means, after their start (the seed run's
  cost, initialisation, is excluded as the paper's). T and P on log grids spanning the
  checkpoints' totals and shares."""
  points = []
  for n in names:
    r = settings[n]
    per = r["per_seed"]
    for i in range(1, len(per[0]["curve"])):
      total = float(np.mean([q["curve"][i]["device_seconds"] for q in per]))
      loss = float(np.mean([q["curve"][i]["loss"] for q in per]))
      points.append({"n_experts": r["n_experts"], "update": per[0]["curve"][i]["update"],
                     "total": total, "per_expert": total / r["n_experts"], "loss": loss})
  totals = np.geomspace(min(p["total"] for p in points), max(p["total"] for p in points), cells)
  shares = np.geomspace(min(p["per_expert"] for p in points),
                        max(p["per_expert"] for p in points), cells)
  grid, losses = [], []
  for share in shares:
    row_n, row_l = [], []
    for total in totals:
      fits = [p for p in points if p["total"] <= total * (1 + 1e-9)
              and p["per_expert"] <= share * (1 + 1e-9)]
      best = min(fits, key=lambda p: p["loss"]) if fits else None
      row_n.append(best["n_experts"] if best else None)
      row_l.append(best["loss"] if best else None)
    grid.append(row_n)
    losses.append(row_l)
  return {"total_device_seconds": [float(x) for x in totals],
          "per_expert_device_seconds": [float(x) for x in shares],
          "lowest_n": grid, "loss": losses, "checkpoints": points,
          "how": "rows: per-expert budgets P, columns: total budgets T (both aggregate "
                 "device-seconds of training updates, log grids); each cell the N of the "
                 "lowest seed-mean validation loss among the experts panel's checkpoints with "
                 "total <= T and total / N <= P (None: no checkpoint fits)"}
