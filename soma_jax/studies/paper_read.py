"""Our cells of the paper table (`paper_rows.py`), read from the committed JSON under
docs/results/, never typed in: each item's full cell and its primary intervals (the readouts
SPEC 9.8's verdict reads)."""

from __future__ import annotations

import json
import math
import os
import re

from soma_jax.studies.verdict import Interval, from_stat, t_interval

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")


def load(name: str) -> dict:
  with open(os.path.join(RESULTS, f"{name}.json")) as f:
    return json.load(f)


def ci(stat: dict, digits: int = 3, both: bool = False) -> str:
  """'+0.051 [+0.038, +0.063]' from {mean, ci95}; `both`: the seeds-and-documents interval."""
  lo, hi = stat["seeds_and_documents"]["ci95"] if both else stat["ci95"]
  f = f"+.{digits}f"
  return f"{stat['mean']:{f}} [{lo:{f}}, {hi:{f}}]"


def show(iv: Interval, digits: int = 3) -> str:
  """'+0.051 [+0.038, +0.063]'; a ratio (null 1) with 2 decimals and no sign."""
  if iv.null:
    return f"{iv.mean:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}]"
  f = f"+.{digits}f"
  return f"{iv.mean:{f}} [{iv.lo:{f}}, {iv.hi:{f}}]"


def table4_primary() -> tuple[Interval, ...]:
  g = load("table4_ops_cpu")["gain_difference"]
  return tuple(from_stat(f"{k} dirs", g[f"mono_k{k}"]) for k in (4, 16, 64))


def table4() -> str:
  d = load("table4_ops_cpu")
  g, end = d["gain_difference"], d["equal_ops"]["test_nats_per_byte"]
  ends = ", ".join(f"{end[k]['mean']:.3f}" for k in ("mono_k4", "mono_k16", "mono_k64"))
  return (f"SOMA's test gain minus the monoliths' at {d['budget']['amount']:.2g} ops: 4 "
          f"directions {ci(g['mono_k4'], both=True)}, 16 {ci(g['mono_k16'], both=True)}, 64 "
          f"{ci(g['mono_k64'], both=True)} ({len(d['seeds'])} seeds, seeds and documents); test "
          f"ends SOMA {end['soma_n2']['mean']:.3f}, monoliths {ends} (4 / 16 / 64)")


def figure4_primary() -> tuple[Interval, ...]:
  s = load("independent_vs_summed_cpu")["results"]["summary"]
  mean, lo, hi = t_interval(s["diff_per_seed"])
  return (Interval("summed − independent", mean, lo, hi, how="t over seeds"),)


def figure4() -> str:
  s = load("independent_vs_summed_cpu")["results"]["summary"]
  (iv,) = figure4_primary()
  return (f"summed − independent test loss {show(iv)} (t over {s['num_seeds']} seeds; sd "
          f"{s['diff_std']:.3f}; {s['updates']} updates)")


def figure9_primary() -> tuple[Interval, ...]:
  c = load("fig9_cpu")["measured"]["contrasts"]
  names = {"random_minus_semantic": "random − semantic shards", "cold_minus_warm": "cold − warm",
           "delta_minus_shared": "delta-rule head − frozen seed head",
           "random_head_minus_best": "frozen random head − best"}
  # The paper: semantic shards, warm starts and a frozen head lower loss; a random head is worse.
  return tuple(from_stat(what, c[k]) for k, what in names.items())


def figure9() -> str:
  return "; ".join(f"{iv.name} {show(iv, 4)}" for iv in figure9_primary())


def _ratio(name: str, ratio: float, log_se: float, how: str) -> Interval:
  """A ratio's 95% interval from the standard error of its log (null 1)."""
  return Interval(name, ratio, ratio * math.exp(-1.96 * log_se), ratio * math.exp(1.96 * log_se),
                  null=1.0, how=how)


def figure10_primary() -> tuple[Interval, ...]:
  r = load("variance_experts_trained")["results"]
  first, last = r["variance_by_n"][0], r["variance_by_n"][-1]
  se = math.hypot(first["se"] / first["measured"], last["se"] / last["measured"])
  return (_ratio(f"variance N = {first['n']} / N = {last['n']}", r["first_over_last"], se,
                 "normal on the log, from the two SEs"),)


def figure10() -> str:
  r = load("variance_experts_trained")["results"]
  n = load("variance_trained_n_pert")["results"]
  (iv,) = figure10_primary()
  return (f"N = 8 {r['first_over_last']:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}] lower than N = 1 "
          f"(predicted {r['predicted_first_over_last']:.2f}x); n_pert log-log slope "
          f"{n['slope_loglog']:.3f}")


def figure11_primary() -> tuple[Interval, ...]:
  r = load("variance_trained_shared_vs_separate")["results"]
  x, se = r["ratio_separate_vs_shared"], r["ratio_separate_vs_shared_se"]
  return (Interval("error summed / separate", x, x - 1.96 * se, x + 1.96 * se, null=1.0,
                   how="normal, +-1.96 SE over repeats"),)


def figure11() -> str:
  r = load("variance_trained_shared_vs_separate")["results"]
  return (f"separate losses {r['ratio_separate_vs_shared']:.2f} ± "
          f"{r['ratio_separate_vs_shared_se']:.2f}x (SE) lower error than one summed loss at N = 4 "
          f"(predicted {1 / r['predicted_separate_over_shared']:.2f}x)")


def figure12() -> str:
  runs = load("scaling")["results"]["runs"]
  return (f"FSO: {max(r['devices'] for r in runs)} devices, "
          f"{sum(r['collectives']['total'] for r in runs)} collectives in the compiled steps")


def table2() -> str:
  rows = load("sizing")["results"]
  return "; ".join(f"N = {r['n']}: width {r['d_t']}, {r['ensemble_params'] / 1e6:.2f}M"
                   for r in rows)


def table1() -> str:
  e = load("table7_cpu_seeds1")["eval"]
  return (f"route {e['route_bytes']} / score {e['score_bytes']} bytes of T = 256 pieces; "
          f"{e['val_windows_scored']} validation windows from {e['val_documents']} documents, "
          f"{e['test_windows_scored']} test windows from {e['test_documents']}")


def table5_primary() -> tuple[Interval, ...]:
  cells = load("table5_cpu")["measured"]["cells"]
  return tuple(from_stat(f"N = {n}", cells[n][max(cells[n], key=float)]["bptt_minus_soma"],
                         paper=-1) for n in cells)


def table5() -> str:
  cells = load("table5_cpu")["measured"]["cells"]
  last = lambda n: cells[n][max(cells[n], key=float)]
  return "; ".join(f"N = {n}: SOMA {last(n)['soma']['mean']:.3f}, BPTT {last(n)['bptt']['mean']:.3f}"
                   f", BPTT − SOMA {ci(last(n)['bptt_minus_soma'])}"
                   for n in cells) + " (validation, full budget, t over 3 seeds)"


def _panel(p: dict, panel: str) -> str:
  r = p["measured"]["panels"][panel]
  ends = ", ".join(f"{v}: {e:.3f}" for v, e in zip(r["values"], r["end_loss"], strict=True))
  verdict = "falls" if r["falls_monotonically"] else "does not fall"
  return (f"{r['axis']} {ends} (end validation; {verdict} monotonically, "
          f"{r['seeds_falling_monotonically']} of {len(p['seeds'])} seeds)")


def figure7() -> str:
  p = load("fig7_cpu")
  return "; ".join(_panel(p, k) for k in ("experts", "n_pert", "batch"))


def figure8() -> str:
  p = load("fig7_cpu")["measured"]
  f8, r = p["figure8"], p["panels"]["experts"]
  ends = ", ".join(
      f"N = {v}: {e:.3f} at {p['settings'][n]['per_seed'][0]['curve'][-1]['device_seconds']:.3g} s"
      for n, v, e in zip(r["methods"], r["values"], r["end_loss"], strict=True))
  if not f8["lowest"]:
    return f"end validation at aggregate device-seconds (seed 0): {ends}; the curves share no budget"
  return f"{ends}; lowest N at shared budgets: {', '.join(f8['lowest'])}"


def figure14_n1() -> tuple[list[float], int, bool]:
  """Where Figure 14's map selects N = 1: the total budgets (device-s) of those columns, the
  number of cells, and whether no other N has a checkpoint within those totals."""
  f14 = load("fig7_cpu")["measured"]["figure14"]
  cols = sorted({j for row in f14["lowest_n"] for j, n in enumerate(row) if n == 1})
  totals = [f14["total_device_seconds"][j] for j in cols]
  cells = sum(row[j] == 1 for row in f14["lowest_n"] for j in cols)
  alone = not any(c["n_experts"] != 1 and c["total"] <= t for c in f14["checkpoints"]
                  for t in totals)
  return totals, cells, alone


def figure14() -> str:
  f14 = load("fig7_cpu")["measured"]["figure14"]
  chosen = sorted({n for row in f14["lowest_n"] for n in row if n is not None})
  totals, cells, alone = figure14_n1()
  where = ("where no other N has a checkpoint within the total" if alone
           else "where another N also has a checkpoint within the total")
  return (f"N selected somewhere on the {len(f14['lowest_n'])} x {len(f14['lowest_n'][0])} "
          f"budget map: {', '.join(map(str, chosen))} ({len(f14['checkpoints'])} checkpoints); "
          f"N = 1 in {cells} cells, all in the {', '.join(f'{t:.2f}' for t in totals)} device-s "
          f"column{'s' if len(totals) > 1 else ''}, {where}; elsewhere never")


def figure14_brief() -> str:
  _, _, alone = figure14_n1()
  return "N = 1 only where nothing else fits" if alone else "N = 1 selected where others fit"


def table11_primary() -> tuple[Interval, ...]:
  t = load("fig13_cpu")["measured"]["table11"]
  name = lambda n: "({}, {})".format(*re.fullmatch(r"npert(\d+)_b(\d+)", n).groups())
  return tuple(from_stat(f"{name(n)} − {name(t['reference'])}", r["minus_ref"])
               for n, r in t["rows"].items() if n != t["reference"])


def figure13() -> str:
  t = load("fig13_cpu")["measured"]["table10"]
  return (f"lowest allocation at 1/4, 1/2, 1 of the operations: {', '.join(t['lowest'])}; "
          "Table 11: " + "; ".join(f"{iv.name} {show(iv, 4)}" for iv in table11_primary()))


def table10() -> str:
  d = load("fig13_cpu")["measured"]
  t = d["table10"]
  return "; ".join(f"{n}: " + ", ".join(f"{lo:.4f}-{hi:.4f}" for lo, hi in cells)
                   for n, cells in t["estimated"].items())


def table11() -> str:
  t = load("fig13_cpu")["measured"]["table11"]
  return "; ".join(f"{n} {r['test']['mean']:.4f} ({ci(r['minus_ref'], 4)})"
                   for n, r in t["rows"].items()) + f" (test; minus {t['reference']}, t over 2 seeds)"


def table6_primary() -> tuple[Interval, ...]:
  return (from_stat("N = 1 − N = 2", load("table6_cpu")["measured"]["selected_test_other_minus_ref"]),)


def table6() -> str:
  m = load("table6_cpu")["measured"]
  best = min(m["cells"], key=lambda r: r["validation"]["mono"]["mean"])
  d = m["selected_test_other_minus_ref"]
  return (f"best N = 1 cell lr {best['lr']:g} / eps {best['eps']:g}: "
          f"{best['validation']['mono']['mean']:.4f} vs N = 2 "
          f"{best['validation']['soma_n2']['mean']:.4f}; selected test N=1 − N=2 {ci(d, 4)} "
          "(t over 3 seeds)")


def table7_primary() -> tuple[Interval, ...]:
  return (from_stat("SOMA's gain − the monolith's", load("table7_cpu")["gain_difference"]["mono"]),)


def table7() -> str:
  d = load("table7_cpu")
  g, m = d["gain_difference"]["mono"], d["methods"]["mono"]
  return (f"SOMA's compared-phase test gain minus the monolith's {ci(g, 4, both=True)} (seeds "
          f"and documents); monolith − SOMA test end {m['minus_ref']['mean']:+.4f} ± "
          f"{m['minus_ref']['sd']:.4f} (sd); SOMA's end lower in {m['ref_wins']} of "
          f"{len(d['seeds'])} seeds")


def figure16() -> str:
  ens = load("fig16_cpu")["measured"]["ensembles"]
  def one(r):
    best = r["ks"][min(range(len(r["ks"])), key=lambda i: r["loss"][i])]
    at = lambda k: r["loss"][r["ks"].index(k)]
    return (f"N = {r['n_experts']}: k = 1 {at(1):.4f}, k = 4 {at(4):.4f}, k = N "
            f"{at(r['n_experts']):.4f}, lowest at k = {best}, k = 4 captures "
            f"{r['fraction_captured_at_mark']:.0%} of the k = 1 to N gain")
  return "; ".join(one(r) for r in ens.values()) + " (validation, 2 seeds)"


def figure17() -> str:
  ens = load("fig17_cpu")["measured"]["ensembles"]
  return "; ".join(f"N = {r['n_experts']}: {r['relation']['pairs']} pairs, correlation of "
                   f"reduction with similarity {r['relation']['pearson']:+.2f}, smallest "
                   f"reduction {r['min_loss_reduction']:.4f}" for r in ens.values())


def figure15() -> str:
  m = load("fig15_cpu")["measured"]  # ops per token count the routed experts, as the paper's
  return "; ".join(f"N = {r['n_experts']}: test {r['test']['nats_per_byte']:.4f} at "
                   f"{m['inference']['rows'][n]['ops_per_token'] / 1e6:.2f}M ops per token"
                   for n, r in m["rows"].items()) + " (top-min(4, N), selected experts)"


def table12() -> str:
  t = load("fig15_cpu")["measured"]["inference"]
  names = {"mono": "monolith", "soma_n2": "N = 2", "soma_n8": "N = 8", "soma_n32": "N = 32"}
  return "; ".join(f"{names.get(n, n)}: {r['fastest']['tokens_per_second'] / 1e6:.4f} M tokens/s "
                   f"at batch {r['fastest']['batch']}" for n, r in t["rows"].items())


def table13() -> str:
  return "; ".join(f"N = {r['n_experts']} (width {r['d_t']}): {r['test']['nats_per_byte']:.4f}"
                   f" after {r['updates']['mean']:.0f} updates"
                   for r in load("fig15_cpu")["measured"]["rows"].values()) + " (test, top-min(4, N))"


def table8() -> str:
  st = load("table8_cpu")["measured"]
  d = lambda k: ", ".join(f"{r['cosine_distance']:.3f}" for r in st["states"][k])
  return (f"cosine distance at init {d('init')}, trained {d('trained')} (N = 1, 2, 8, 32); "
          f"largest change of a variance value {st['max_abs_relative_change']['init']:.0%}")


def table9_primary() -> tuple[Interval, ...]:
  rows = load("table9_cpu")["measured"]["rows"]
  return tuple(from_stat(f"{n} − SOMA", r["minus_ref"]["test"]) for n, r in rows.items()
               if "minus_ref" in r)


TABLE9_PAPER_ORDER = ["soma_n2", "mono_k4", "mono_k64", "mono_k16"]  # the paper's, our names


def table9() -> str:
  d = load("table9_cpu")
  r = d["measured"]
  ranks = r["rankings"]
  order = lambda k: (f"{' < '.join(ranks[k])} ("
                     + ("" if ranks[k] == TABLE9_PAPER_ORDER else "not ") + "the paper's")
  ivs = table9_primary()
  clear = [iv.name for iv in ivs if not iv.lo <= iv.null <= iv.hi]
  return ("man pages (section 7) test: " + ", ".join(
      f"{n} {v['test']['mean']:.3f}" for n, v in r["rows"].items())
      + f"; seed means in order {order('external_test')} WikiText-103 order: SOMA, then 64, "
      f"1,024 and 256 directions); in-domain {order('in_domain_test')} Table 4 order: SOMA, then "
      "64 and 1,024 tied, 256 last); monolith − SOMA: " + "; ".join(f"{iv.name} {show(iv)}" for iv in ivs)
      + f" ({len(d['seeds'])} seeds, seeds and documents; {len(clear)} of {len(ivs)} exclude "
      f"zero: {', '.join(clear)})")


def table9_brief() -> str:
  r = load("table9_cpu")["measured"]
  first = r["rankings"]["external_test"][0] == "soma_n2"
  clear = [iv.name for iv in table9_primary() if not iv.lo <= iv.null <= iv.hi]
  return (f"SOMA {'lowest' if first else 'not lowest'} in seed means; resolved: "
          + (", ".join(clear) if clear else "no difference"))


def table3() -> str:
  m = load("table3_cpu")["measured"]
  r, step = m["rows"], m["per_expert_step_seconds"]
  return (f"N = {m['n_experts']}: recorded {r['recorded']['device_seconds']['mean']:.1f} "
          f"device-s; physical {r['physical']['ratio_to_recorded']['mean']:.3f}x, fixed solo "
          f"rate {r['fixed_solo_rate']['ratio_to_recorded']['mean']:.3f}x of it (one expert's "
          f"step inside the N = {m['n_experts']} step "
          f"{step['in_the_ensemble_step']['mean'] / step['alone']['mean']:.2f}x its step alone)")
