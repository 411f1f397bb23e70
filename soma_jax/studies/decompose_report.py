"""The decomposition's table.md, effects.csv and curves.png (`decompose.py`): the rows, the
effects and interactions with their intervals, and the rows' validation curves.
"""

from __future__ import annotations

import csv
import os
import re

import numpy as np

from soma_jax.studies import report, results


def _ci(stat: dict, digits: int = 4) -> str:
  return "-" if stat.get("mean") is None else results.ci(stat, digits)


def _speed(stat: dict) -> str:
  if stat.get("mean") is None:
    return "- (no common range)"
  lo, hi = stat["speedup_ci95"] or (None, None)
  return f"{stat['speedup']:.2f}x" + ("" if lo is None else f" [{lo:.2f}, {hi:.2f}]")


READABLE = 0.5  # SPEC 9.8: a speed-up is read where the common range is this share of each phase


def common_range(p: dict, a: str, b: str) -> list[tuple[float, float, float]]:
  """Per seed: the validation-loss range that a's and b's compared-phase curves both cover
  (running minima, as `statistics.log_speedup` reads them), and its share of a's and of b's
  own phase (start minus best loss)."""
  def phase(row: str) -> list[tuple[float, float]]:
    curves = ([x["loss"] for x in s["val_curve"]] for s in p["rows"][row]["per_seed"])
    return [(c[0], min(c)) for c in curves]
  out = []
  for (sa, ea), (sb, eb) in zip(phase(a), phase(b), strict=True):
    common = max(0.0, min(sa, sb) - max(ea, eb))
    out.append((common, common / (sa - ea) if sa > ea else 0.0,
                common / (sb - eb) if sb > eb else 0.0))
  return out


def _span(values: list[float], f: str) -> str:
  lo, hi = format(min(values), f), format(max(values), f)
  return lo if lo == hi else f"{lo}-{hi}"


def unreadable(p: dict, a: str, b: str) -> str:
  """SPEC 9.8's "not readable (common range X of Y)" for a compared-phase speed-up of a over b
  whose common loss range is under half of either row's phase in some seed; "" when readable."""
  got = common_range(p, a, b)
  if min(min(fa, fb) for _, fa, fb in got) >= READABLE:
    return ""
  common, fa, fb = ([g[i] for g in got] for i in range(3))
  pct = lambda v: _span([100 * x for x in v], ".0f") + "%"
  return (f"not readable (common range {_span(common, '.3f')} nats/byte: {pct(fa)} of {a}'s "
          f"phase, {pct(fb)} of {b}'s)")


def _seed_costs(p: dict) -> str:
  """From-initialisation readouts count each row's seed run first: a pair of rows on different
  seed runs carries the ratio of the two totals at the budget whatever the compared phase does
  (one sentence; "" when every effect's rows share a seed run)."""
  seed = lambda row: (p["rows"][row].get("seed_run")
                      or p["rows"][row]["start"].split("/")[-1].split("@")[0])
  budget = p["budget"]["amount"]
  ratios: dict[tuple[str, str], list[str]] = {}
  for name, e in p["effects"].items():
    sa, sb = seed(e["a"]), seed(e["b"])
    if sa != sb:
      ratios.setdefault((sa, sb), []).append(name)
  if not ratios:
    return ""
  ops = lambda s: seed_runs(p)[s]["ops"]
  costs = ", ".join(f"{s} {ops(s):.4g}" for s in sorted({s for k in ratios for s in k}))
  pairs = "; ".join(
      f"{', '.join(names)}: ({ops(sb):.4g} + {budget:.4g}) / ({ops(sa):.4g} + {budget:.4g}) = "
      f"{(ops(sb) + budget) / (ops(sa) + budget):.2f}" for (sa, sb), names in ratios.items())
  return (f"From initialisation, each row's seed run counts first (operations: {costs}), then "
          f"{budget:.4g} in the compared phase. Rows on different seed runs stand at a fixed "
          f"ratio of totals at the budget, whatever the compared phase does ({pairs}); a "
          "from-init speed-up near that ratio says little beyond the seed runs' costs.")


def own_starts(p: dict) -> bool:
  """Whether every optimisation seed continued seed runs of its own (results.json
  `intervals`; a results.json written before it has none: one shared start)."""
  return p.get("intervals", {}).get("kind") == "seeds_own_starts"


def seed_runs(p: dict) -> dict:
  """{name: record} of the seed runs (the first seed's, with own starts: every seed's run the
  same updates, so the same operations)."""
  runs = p["seed_runs"]
  return runs[f"seed{p['seeds'][0]}"] if own_starts(p) else runs


def table(p: dict) -> str:
  """Markdown: the rows (start, end, gain), the effects with their intervals, the
  interactions."""
  b, ev = p["budget"], p["eval"]
  lines = [
      f"Decomposition ({p['spec']}): every row from its seed run"
      f"{' (each optimisation seed its own)' if own_starts(p) else ''}, "
      f"{b['amount']:.4g} operations per row and seed ({b['reference_updates']:g} of "
      f"{p['reference']}'s updates), lr searched per row and seed on validation, test once. "
      f"{len(p['seeds'])} seeds; evaluation: route {ev['route_bytes']} bytes, score {ev['score_bytes']}, {ev['val_windows']} validation "
      f"pieces from {ev['val_documents']} documents, {ev['test_windows']} test pieces from "
      f"{ev['test_documents']} documents. " + results.load_line(p), "",
      *results.head("| row | what | N x d_t | optimizer state | updates | test start → end | "
                    "test gain [95% t] |")]
  for name, r in p["rows"].items():
    lines.append(f"| {name} | {r['what']} | {r['n_experts']} x {r['d_t']} | "
                 f"{r['optimizer_state']} | {r['updates']['mean']:.0f} | "
                 f"{r['start_loss']['test']:.4f} → {r['end_loss']['test']['mean']:.4f} | "
                 f"{_ci(r['gain']['test'])} |")
  lines += ["", *results.head("| effect | a vs b | a's gain − b's (test) | b's end − a's (test) "
                              "| speed-up of a, compared phase | speed-up of a, from init |")]
  for name, e in p["effects"].items():
    sp = e["log_speedup"]
    compared = unreadable(p, e["a"], e["b"]) or _speed(sp["compared"])
    lines.append(f"| {name} | {e['a']} vs {e['b']} | {results.both(e['gain_difference'])} | "
                 f"{_ci(e['end_loss_difference'])} | {compared} | "
                 f"{_speed(sp['from_init'])} |")
  for name, x in p["interactions"].items():
    sp = x["log_speedup"]
    closed = [pair for pair in x["of"] if unreadable(p, *pair.split(" vs "))]
    compared = (f"not readable ({' and '.join(closed)}'s is not)" if closed
                else _ci(sp["compared"], 3))
    lines += ["", f"**{name}** ({x['of'][0]} minus {x['of'][1]}): gain difference "
              f"{_ci(x['gain_difference'])}, end-loss difference "
              f"{_ci(x['end_loss_difference'])}, log speed-up compared "
              f"{compared}, from init {_ci(sp['from_init'], 3)}."]
  printed = len(re.findall(r"\[[-+]?[\d.]+, [-+]?[\d.]+\]", "\n".join(lines)))  # intervals
  when = ("declared in the config before the run (`primary`)" if "primary" in p else
          "applied after the run: the study declared no primary readout before it")
  lines += ["", f"How to read it (SPEC 9.8, {when}): the primary readout is each effect's "
            f"test end-loss difference "
            f"(b's end − a's) at the budget; gains, speed-ups and the from-init readouts are "
            f"secondary and descriptive. This table prints {printed} 95% intervals, none corrected "
            f"for multiple comparisons: among intervals whose true effect is zero, about one in "
            f"twenty excludes zero by chance. A compared-phase speed-up is read only where the "
            f"loss range both curves cover is at least half of each row's phase (per seed), "
            f"else it is not readable. " + _seed_costs(p)]
  lines += ["", "Intervals: seeds and documents (" + p["how"] + ")." + (
      " Every optimisation seed continued seed runs of its own (trained at seed_run_seed + s), "
      "so where a start lands is in every interval; a row's start is the seeds' mean."
      if own_starts(p) else "")]
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
