"""The decomposition's table.md, effects.csv and curves.png (`decompose.py`): the rows, the
effects and interactions with their intervals, and the rows' validation curves.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from soma_jax.studies import report, results


def _ci(stat: dict, digits: int = 4) -> str:
  return "-" if stat.get("mean") is None else results.ci(stat, digits)


def _both(stat: dict, digits: int = 4) -> str:
  """Mean [seeds-and-documents interval] of a gain difference (its own `seeds_and_documents`)."""
  ci95 = stat.get("seeds_and_documents", {}).get("ci95")
  return results.ci({"mean": stat["mean"], "ci95": ci95}, digits)


def _speed(stat: dict) -> str:
  if stat.get("mean") is None:
    return "- (no common range)"
  lo, hi = stat["speedup_ci95"] or (None, None)
  return f"{stat['speedup']:.2f}x" + ("" if lo is None else f" [{lo:.2f}, {hi:.2f}]")


def table(p: dict) -> str:
  """Markdown: the rows (start, end, gain), the effects with their intervals, the
  interactions."""
  b, ev = p["budget"], p["eval"]
  lines = [
      f"Decomposition ({p['spec']}): every row from its seed run, {b['amount']:.4g} operations "
      f"per row and seed ({b['reference_updates']:g} of {p['reference']}'s updates), lr searched "
      f"per row and seed on validation, test once. {len(p['seeds'])} seeds; evaluation: route "
      f"{ev['route_bytes']} bytes, score {ev['score_bytes']}, {ev['val_windows']} validation "
      f"pieces from {ev['val_documents']} documents, {ev['test_windows']} test pieces from "
      f"{ev['test_documents']} documents. " + results.load_line(p), "",
      "| row | what | N x d_t | optimizer state | updates | test start → end | test gain [95% t] |",
      "|---|---|---|---|---|---|---|"]
  for name, r in p["rows"].items():
    lines.append(f"| {name} | {r['what']} | {r['n_experts']} x {r['d_t']} | "
                 f"{r['optimizer_state']} | {r['updates']['mean']:.0f} | "
                 f"{r['start_loss']['test']:.4f} → {r['end_loss']['test']['mean']:.4f} | "
                 f"{_ci(r['gain']['test'])} |")
  lines += ["", "| effect | a vs b | a's gain − b's (test) | b's end − a's (test) | speed-up of a, "
            "compared phase | speed-up of a, from init |", "|---|---|---|---|---|---|"]
  for name, e in p["effects"].items():
    sp = e["log_speedup"]
    lines.append(f"| {name} | {e['a']} vs {e['b']} | {_both(e['gain_difference'])} | "
                 f"{_ci(e['end_loss_difference'])} | {_speed(sp['compared'])} | "
                 f"{_speed(sp['from_init'])} |")
  for name, x in p["interactions"].items():
    sp = x["log_speedup"]
    lines += ["", f"**{name}** ({x['of'][0]} minus {x['of'][1]}): gain difference "
              f"{_ci(x['gain_difference'])}, end-loss difference "
              f"{_ci(x['end_loss_difference'])}, log speed-up compared "
              f"{_ci(sp['compared'], 3)}, from init {_ci(sp['from_init'], 3)}."]
  lines += ["", "Intervals: seeds and documents (" + p["how"] + ")."]
  return "\n".join(lines) + "\n"


def write_effects_csv(p: dict, path: str) -> None:
  """One line per effect and interaction: each readout's mean and interval."""
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["effect", "a", "b", "readout", "mean", "ci95_lo", "ci95_hi"])
    for kind in ("effects", "interactions"):
      for name, e in p[kind].items():
        a, b = (e["a"], e["b"]) if kind == "effects" else e["of"]
        stats = {"gain_difference": e["gain_difference"],
                 "end_loss_difference": e["end_loss_difference"],
                 **{f"log_speedup_{k}": v for k, v in e["log_speedup"].items()}}
        for readout, s in stats.items():
          ci95 = (s.get("seeds_and_documents", {}).get("ci95") if readout == "gain_difference"
                  and kind == "effects" else s.get("ci95")) or (None, None)
          w.writerow([name, a, b, readout, s.get("mean"), *ci95])


def plot(rows: dict, path: str) -> None:
  """Left: validation loss against operations from initialisation, every row (seed mean).
  Right: the compared phase of the zero-order rows alone, each from its own start (the
  backprop rows fall by ten times as much and would flatten them)."""
  fig, (ax, bx) = report.plt.subplots(1, 2, figsize=(12, 4.5))
  for i, (name, r) in enumerate(rows.items()):
    color = f"C{i % 10}"
    for axis, key in ((ax, "from_init"), (bx, "compared")):
      if axis is bx and r["gradient"] != "zero-order":
        continue
      curves = [x["_curves"][key] for x in r["per_seed"]]
      loss = np.mean([w.mean(axis=1) for _, w in curves], axis=0)
      axis.plot(curves[0][0], loss, marker="o", ms=3, label=name, color=color)
  ax.set_xscale("symlog", linthresh=1e9)
  ax.set_xlabel("training operations from initialisation (seed run included)")
  bx.set_xlabel("training operations in the compared phase")
  bx.set_title("zero-order rows, compared phase", fontsize=9)
  for axis in (ax, bx):
    axis.set_ylabel("ensemble-validation loss (nats/byte)")
    axis.legend(fontsize=8)
  report.save_figure(fig, path)


def figures(p: dict, out: str) -> None:
  """OUT/effects.csv (`write_effects_csv`); curves.png is drawn by `stages`."""
  write_effects_csv(p, os.path.join(out, "effects.csv"))
