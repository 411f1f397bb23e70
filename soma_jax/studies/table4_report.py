"""Table 4's table.md (`table4.STUDY`'s table): the budget table (start, end, gains, gain and
end differences, each marked primary or secondary as results.json declares), the ordering
against the paper's and the lr selection where measured, per-seed values, the equal-ops
ranking beside it."""

from __future__ import annotations

from soma_jax.studies import results, selection
from soma_jax.studies.verdict import END, GAIN, role


def fmt(x: float) -> str:
  for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if x >= div:
      return f"{x / div:.3g}{unit}"
  return f"{x:.3g}"


def _line(name: str, r: dict, p: dict) -> str:
  """One row of the main table; its budget column in the study's unit for every row (a
  control that ran to the reference's updates too: what it spent, in that unit)."""
  ref, n_seeds, unit = p["reference"], len(p["seeds"]), p["budget"]["unit"]
  dirs = r["directions_per_update"] if r["directions_per_update"] is not None else "-"
  g, e = p[GAIN].get(name), p.get(END, {}).get(name)
  end = results.pm(r["minus_ref"], True) if e is None else results.both(e, 3)
  return (f"| {name} | {r['budget']} | {r['n_experts']} | {r['d_t']} | {fmt(r['params'])} | "
          f"{dirs} | {fmt(r['ops_per_update'])} | {r['updates']['mean']:.0f} | "
          f"{r[unit]['mean']:.4g} | {r['start_loss']['test']:.4f} | "
          f"{results.pm(r['test_nats_per_byte'], digits=4)} | {results.ci(r['gain']['test'])} | "
          f"{results.ci(r['gain']['validation'])} | " + ("-" if g is None else results.ci(g))
          + " | " + ("-" if name == ref else f"{end} ({r['ref_wins']}/{n_seeds})") + " |")


def _said(p: dict, readout: str) -> str:
  """', primary' or ', secondary' as results.json declares `readout` ('' where it declares
  none: a payload measured before the declaration)."""
  said = role(p, readout)
  return f", {said}" if said else ""


def order_lines(p: dict) -> list[str]:
  """table.md: the ordering against the paper's and the lr selection (a payload measured
  before lrs were selected has neither)."""
  if "ordering" not in p:
    return []
  o, paper = p["ordering"], p["paper"]["test_nats_per_byte"]
  below = o["soma_below_monoliths"]
  return [f"Against the paper's Table 4 ({o['of']}): ours {' < '.join(o['ours'])}; the "
          "paper's " + " < ".join(f"{n} {paper[n]:.2f}" for n in o["paper"])
          + f" ({o['agreeing']} of {o['pairs']} pairs it orders alike: "
          + ("the paper's order" if o["same"] else "not the paper's order") + "). SOMA below "
          f"{sum(below.values())} of {len(below)} monoliths (the paper: below every one, 1.76 "
          "against 2.00-2.11)" + (f"; not in the paper: {', '.join(o['left_out'])}"
                                  if o["left_out"] else "") + ".",
          "", *selection.lines(p["selection"], p["tuning"]), ""]


def table(p: dict) -> str:
  """Markdown: the budget table (start, end, gains, gain differences), per-seed values, the
  equal-ops ranking beside it."""
  ref, ev, b = p["reference"], p["eval"], p["budget"]
  own = p.get("intervals", {}).get("kind") == "seeds_own_starts"
  rank = sorted(p["methods"], key=lambda n: p["methods"][n]["test_nats_per_byte"]["mean"])
  lines = [
      f"Table 4 protocol (SPEC 9.1, 9.6) at this scale. Budget: {b['amount']:g} {b['unit']} per "
      f"row and seed ({b['controls']}). Every row continues its architecture's seed run "
      + ("(at each seed its own, trained at seed_run_seed + s; start: the seeds' mean; "
         if own else "(") +
      f"{b['seed_updates']} updates, optimizer state included). Evaluation: route on "
      f"{ev['route_bytes']} bytes, score the next {ev['score_bytes']} ({ev['test_windows']} "
      f"test windows from {ev['test_documents']} documents); seeds {p['seeds']}; gains are "
      f"start − end, with 95% t intervals over seeds; load average "
      f"{p['load_average']['start'][0]:.2f} at the start, {p['load_average']['end'][0]:.2f} at "
      "the end.",
      "",
      *results.head(f"| row | budget | N | d_t | params | directions / update | ops / update | "
                    f"updates | {b['unit']} spent | start test | end test | gain test | gain "
                    f"validation | {ref} gain minus row gain (test{_said(p, GAIN)}) | end minus "
                    f"{ref}" + (f" (test{_said(p, END)}, seeds and documents)" if END in p else "")
                    + f" ({ref} wins) |"),
  ]
  lines += [_line(name, r, p) for name, r in p["methods"].items()]
  eq = p["equal_ops"]
  lines += ["", f"Ranking by end test loss at this budget: {' < '.join(rank)}.",
            *order_lines(p),
            f"Ranking at equal operations ({fmt(eq['ops'])} ops, {eq['how']}): "
            + " < ".join(f"{n} {eq['test_nats_per_byte'][n]['mean']:.3f}" for n in eq["ranking"])
            + ".", "", f"Per seed: gain (test), and {ref}'s gain minus it [95% paired document "
            "bootstrap: document noise around one start only].", "",
            *results.head("| row | " + " | ".join(f"seed {s}" for s in p["seeds"]) + " |")]
  for name, r in p["methods"].items():
    g = p["gain_difference"].get(name)
    cells = [f"{q['gain']['test']:+.3f}" + ("" if g is None else
             f", {d['diff']:+.3f} [{d['bootstrap_ci95'][0]:+.3f}, {d['bootstrap_ci95'][1]:+.3f}]")
             for q, d in zip(r["per_seed"], g["per_seed"] if g else r["per_seed"], strict=True)]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += ["", f"Byte-unigram baseline on the same targets: {p['unigram_test_nats_per_byte']:.3f} "
            "nats/byte. Seed runs (cost excluded): " + "; ".join(
                f"{k} {s['method']} d_t={s['d_t']}: {s['updates']} updates at seed {s['seed']}, "
                f"ensemble val {s['ensemble_val_nats_per_byte']:.3f}"
                for k, s in seed_runs(p).items()) + "."]
  return "\n".join(lines) + "\n"


def seed_runs(p: dict) -> dict:
  """{name: seed run record}: the one shared set, or each seed's own as "seedS/name"."""
  runs = p["seed_runs"]
  if p.get("intervals", {}).get("kind") != "seeds_own_starts":
    return runs
  return {f"{key}/{name}": s for key, group in runs.items() for name, s in group.items()}
