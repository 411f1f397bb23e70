"""Figures 7, 8 and 14's readouts (`fig7.py`), pure functions of the settings' scored curves:
each panel's order (does the end loss fall with the setting), Figure 8's lowest N at equal
aggregate compute, Figure 14's lowest-loss N under a total and a per-expert budget; and their
rows of the paper table, read from the committed results.json (PAPER_ROWS).
"""

from __future__ import annotations

import numpy as np

from soma_jax.studies import paper

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


# ------------------------------------------------------------------ the paper table's rows

def _panel(p: dict, panel: str) -> str:
  r = p["measured"]["panels"][panel]
  ends = ", ".join(f"{v}: {e:.3f}" for v, e in zip(r["values"], r["end_loss"], strict=True))
  verdict = "falls" if r["falls_monotonically"] else "does not fall"
  return (f"{r['axis']} {ends} (end validation; {verdict} monotonically, "
          f"{r['seeds_falling_monotonically']} of {len(p['seeds'])} seeds)")


def ours_figure7(p: dict) -> str:
  return "; ".join(_panel(p, k) for k in ("experts", "n_pert", "batch"))


def ours_figure8(d: dict) -> str:
  p = d["measured"]
  f8, r = p["figure8"], p["panels"]["experts"]
  ends = ", ".join(
      f"N = {v}: {e:.3f} at {p['settings'][n]['per_seed'][0]['curve'][-1]['device_seconds']:.3g} s"
      for n, v, e in zip(r["methods"], r["values"], r["end_loss"], strict=True))
  if not f8["lowest"]:
    return f"end validation at aggregate device-seconds (seed 0): {ends}; the curves share no budget"
  return f"{ends}; lowest N at shared budgets: {', '.join(f8['lowest'])}"


def figure14_n1(f14: dict) -> tuple[list[float], int, bool]:
  """Where Figure 14's map selects N = 1: the total budgets (device-s) of those columns, the
  number of cells, and whether no other N has a checkpoint within those totals."""
  cols = sorted({j for row in f14["lowest_n"] for j, n in enumerate(row) if n == 1})
  totals = [f14["total_device_seconds"][j] for j in cols]
  cells = sum(row[j] == 1 for row in f14["lowest_n"] for j in cols)
  alone = not any(c["n_experts"] != 1 and c["total"] <= t for c in f14["checkpoints"]
                  for t in totals)
  return totals, cells, alone


def ours_figure14(d: dict) -> str:
  f14 = d["measured"]["figure14"]
  chosen = sorted({n for row in f14["lowest_n"] for n in row if n is not None})
  totals, cells, alone = figure14_n1(f14)
  where = ("where no other N has a checkpoint within the total" if alone
           else "where another N also has a checkpoint within the total")
  return (f"N selected somewhere on the {len(f14['lowest_n'])} x {len(f14['lowest_n'][0])} "
          f"budget map: {', '.join(map(str, chosen))} ({len(f14['checkpoints'])} checkpoints); "
          f"N = 1 in {cells} cells, all in the {', '.join(f'{t:.2f}' for t in totals)} device-s "
          f"column{'s' if len(totals) > 1 else ''}, {where}; elsewhere never")


def brief_figure14(d: dict) -> str:
  _, _, alone = figure14_n1(d["measured"]["figure14"])
  return "N = 1 only where nothing else fits" if alone else "N = 1 selected where others fit"


PAPER_ROWS = (
    paper.StudyRow(
        "Figure 7", "sweeps over N, n_pert and B against time", ours_figure7, "loss falls "
        "monotonically with N, n_pert and B", "width-32 experts, 300 updates per setting from "
        "one seed, 2 seeds; N up to 32 (paper 256); x axis: training seconds",
        brief="falls with N, n_pert and B in 2 of 2 seeds", paper_brief="falls with each",
        no_verdict="2 seeds: a count of monotonic falls"),
    paper.StudyRow(
        "Figure 8", "the N sweep against aggregate compute", ours_figure8, "more experts do not "
        "lower loss at every budget", "device-seconds on 2 CPU cores",
        brief="no budget shared by every N", paper_brief="a crossing in N",
        not_comparable="no budget here is shared by every N, so the paper's crossing cannot be "
        "read"),
    paper.StudyRow(
        "Figure 14", "which N wins under a total and a per-expert budget", ours_figure14,
        "N = 1 is never selected; more shards win under a tight per-expert budget", "the fig7 "
        "experts panel's checkpoints (paper: 44 of N = 1, 2, 8, 256); wherever another N fits, "
        "N = 1 is not selected, as in the paper", brief=brief_figure14,
        paper_brief="N = 1 never selected", no_verdict="a map of selections, no interval"),
)
