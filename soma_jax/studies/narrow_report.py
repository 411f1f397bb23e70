"""study=narrow's results.json sections, table.md and figure (validation loss against
operations with seed bands; D(u) and G(u) on a second panel)."""

from __future__ import annotations

import os

import numpy as np

from soma_jax.studies import planning, report, results

HOW = ("end-loss differences: b minus a per seed on the same test windows, across seeds mean "
       "+- t_{0.975, S-1} * sqrt(sd^2 / S + document_sd^2), document_sd the test-document "
       "bootstrap sd of the seed-mean difference (every seed resampled with the same documents "
       "in a draw); seeds_only_ci95: the t interval without the documents; slopes: t interval "
       "over per-seed least-squares slopes against log2 budget; mechanism and experts alone: "
       "t intervals over seeds on validation")


def intervals(plan: planning.StudyPlan) -> dict:
  """What every interval over seeds holds: the starts (own or shared) and the documents."""
  return {**planning.interval_kind(plan), "documents": HOW}


def declared(study) -> dict:
  """The readouts and budgets the config declared before anything trained."""
  return {"test_fractions": list(study.tests), "curve_fractions": list(study.curve),
          "select_fraction": study.select_fraction, "contrasts": study.contrasts,
          "primary": {"end_loss_difference": list(study.primary),
                      "slope": list(study.primary_slopes)},
          "mechanism": list(study.mechanism),
          "verdict_rule": "SPEC 9.8, primary readouts only: reproduces when the interval "
                          "excludes zero in the paper's direction (b minus a > 0: SOMA lower), "
                          "contradicts when it excludes zero the other way, else unresolved: "
                          "a null written with its bound"}


def count_intervals(x) -> int:
  """How many intervals the readouts print (every non-null ci95)."""
  if isinstance(x, dict):
    return int(x.get("ci95") is not None) + sum(count_intervals(v) for v in x.values())
  if isinstance(x, list):
    return sum(count_intervals(v) for v in x)
  return 0


def _ci(stat: dict | None, digits: int = 4) -> str:
  return "-" if not stat or stat.get("mean") is None else results.ci(stat, digits)


def _rows(p: dict) -> list[str]:
  keys = [f"{f:.6g}" for f in p["declared"]["test_fractions"]]
  lines = [*results.head("| row | what | N x d_t | lr | updates | test at " + " / ".join(keys)
           + " of the budget |")]
  for name, r in p["rows"].items():
    tests = [np.mean([s["test"][k] for s in r["per_seed"]]) if k in r["per_seed"][0]["test"]
             else None for k in keys]
    edge = "*" if p["selection"][name]["lr_at_edge"] else ""
    lines.append(f"| {name} | {r['what']} | {r['n_experts']} x {r['d_t']} | {r['lr']:g}{edge} | "
                 f"{np.mean([s['updates'] for s in r['per_seed']]):.0f} | "
                 + " / ".join("-" if t is None else f"{t:.4f}" for t in tests) + " |")
  return lines


def _primary(p: dict) -> list[str]:
  starts = "own starts" if p["intervals"]["kind"] == "seeds_own_starts" else "one shared start"
  lines = [*results.head(f"| primary readout | budget | b − a (test) [seeds ({starts}) and "
                         "documents] | seeds only | verdict |")]
  for name, r in p["readouts"]["primary"].items():
    for key, c in r.get("end_loss_difference", {}).items():
      lines.append(f"| {name} | {key} | {_ci(c)} | {_ci({**c, 'ci95': c['seeds_only_ci95']})}"
                   f" | {c['verdict']}: {c['why']} |")
    if "slope" in r:
      s = r["slope"]
      lines.append(f"| {name}, slope per doubling | all | {_ci(s)} | (seeds only) | "
                   f"{s['verdict']}: {s['why']} |")
  return lines


def _mechanism(p: dict) -> list[str]:
  m = p["readouts"]["secondary"]["mechanism"]
  lines = [f"Mechanism (secondary, validation): D(u) = {m['b']}(u) − {m['a']}(u), G(u) = "
           f"{m['b']}(u) − {m['b']}(2u); D − G = {m['b']}(2u) − {m['a']}(u), the equal-operations"
           " gap. Crossing: " + ("none in the range" if m["crossing_update"] is None
                                  else f"u = {m['crossing_update']:.0f} updates")
           + (f"; agrees with the primary readout at the full budget: "
              f"{m['agrees_with_primary']}" if "agrees_with_primary" in m else "") + ".", "",
           *results.head("| u (updates) | D(u) | G(u) | D − G |")]
  lines += [f"| {q['update']:.0f} | {_ci(q['D'])} | {_ci(q['G'])} | {_ci(q['D_minus_G'])} |"
            for q in m["points"]]
  alone = p["readouts"]["secondary"].get("experts_alone")
  if alone:
    lines += ["", *results.head("| u | mixture | experts alone (mean) | ensemble gain | "
                                "per-expert edge |")]
    lines += [f"| {q['update']:.0f} | {_ci(q['mixture'])} | {_ci(q['experts_alone_mean'])} | "
              f"{_ci(q['ensemble_gain'])} | {_ci(q['per_expert_edge'])} |" for q in alone]
  return lines


def table(p: dict) -> str:
  """Markdown: the setup, the rows, the primary readouts with verdicts, the secondary ones."""
  b, ev, iv = p["budget"], p["eval"], p["intervals"]
  lines = [
      f"Sharding or a narrower model ({p['spec']}): {b['amount']:.4g} operations per row and "
      f"seed ({b['reference_updates']:g} of {p['reference']}'s updates; backprop rows at their "
      f"row_fraction), {len(p['seeds'])} seeds, intervals: {iv['kind']} ({iv['how']}). Corpus: "
      f"{p['corpus']['what']}. Evaluation: route {ev['route_bytes']} bytes, score "
      f"{ev['score_bytes']}, {ev['val_windows']} validation pieces from {ev['val_documents']} "
      f"documents, {ev['test_windows']} test pieces from {ev['test_documents']} documents. "
      + results.load_line(p), "", *_rows(p),
      "", "lr: selected on the first seed at "
      f"{p['declared']['select_fraction']:g} of each row's budget from a grid around "
      "its centre (results.json selection), then fixed for every seed; * = at the grid's edge.",
      "", *_primary(p), ""]
  sec = p["readouts"]["secondary"]
  for name, c in sec["contrasts"].items():
    lines.append(f"Secondary, {name}: " + "; ".join(
        f"{k} {_ci(v)}" for k, v in c["end_loss_difference"].items()) + ".")
  for name, s in sec["slopes"].items():
    lines.append(f"Secondary, {name} slope per doubling: {_ci(s)} ({s['trend']}).")
  lines += ["", *_mechanism(p), "",
            f"{p['intervals_printed']} intervals in results.json's readouts; only the primary "
            "ones carry a verdict. Intervals: " + iv["documents"] + "."]
  return "\n".join(lines) + "\n"


def plot(p: dict, out: str) -> None:
  """OUT/curves.png. Left: validation loss against operations for the zero-order rows, seed
  mean and the seeds' range. Right: D(u) and G(u) against updates with their t intervals."""
  fig, (ax, bx) = report.plt.subplots(1, 2, figsize=(12, 4.5))
  for i, (name, r) in enumerate(p["rows"].items()):
    if r["gradient"] != "zero-order":
      continue
    ops = np.array([q["ops"] for q in r["per_seed"][0]["val_curve"]][1:], np.float64)
    loss = np.array([[q["loss"] for q in s["val_curve"]][1:] for s in r["per_seed"]])
    ax.plot(ops, loss.mean(axis=0), marker="o", ms=3, label=name, color=f"C{i}")
    ax.fill_between(ops, loss.min(axis=0), loss.max(axis=0), alpha=0.2, color=f"C{i}")
  ax.set_xscale("log")
  ax.set_xlabel("training operations after the seed run")
  ax.set_ylabel("ensemble-validation loss (nats/byte)")
  m = p["readouts"]["secondary"]["mechanism"]
  u = np.array([q["update"] for q in m["points"]], np.float64)
  for key, label in (("D", f"D(u) = {m['b']}(u) − {m['a']}(u)"),
                     ("G", f"G(u) = {m['b']}(u) − {m['b']}(2u)")):
    if u.size:
      mean = np.array([q[key]["mean"] for q in m["points"]])
      ci = [q[key]["ci95"] or (q[key]["mean"],) * 2 for q in m["points"]]
      bx.plot(u, mean, marker="o", ms=3, label=label)
      bx.fill_between(u, [c[0] for c in ci], [c[1] for c in ci], alpha=0.2)
  bx.axhline(0.0, color="gray", lw=0.5)
  bx.set_xscale("log", base=2)
  bx.set_xlabel(f"updates u of {m['a']}")
  bx.set_ylabel("nats/byte (validation)")
  for axis in (ax, bx):
    axis.legend(fontsize=8)
  report.save_figure(fig, os.path.join(out, "curves.png"))
