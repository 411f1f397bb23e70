"""Table 7's table.md (`table7.py`): the setup, one row per seed (start → end, gains and the
selected lr / eps), then the end and gain differences across seeds (the declared primary
first), the validation view and the flags.
"""

from __future__ import annotations

from soma_jax.studies import results
from soma_jax.studies.verdict import END, GAIN, role


def _setting(q: dict) -> str:
  """'0.00125 / 0.0025', with * after an lr (or eps) selected at its grid's edge."""
  return (f"{q['selected']['lr']:g}{'*' if q['lr_at_edge'] else ''} / "
          f"{q['selected']['eps']:g}{'*' if q['eps_at_edge'] else ''}")


def _row(a: dict, b: dict, g: dict) -> str:
  move = lambda q: (f"{q['start_loss']['test']:.4f} → {q['end_loss']['test']:.4f} "
                    f"({q['gain']['test']:+.4f})")
  lo, hi = g["bootstrap_ci95"]
  return (f"| {a['seed']} | {_setting(a)} | {a['updates']} | {move(a)} | {_setting(b)} | "
          f"{b['updates']} | {move(b)} | {g['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
          f"{b['minus_ref']:+.4f} |")


def _both(g: dict) -> str:
  """The seeds-and-documents interval of a gain difference, '[lo, hi]' (or '-': one seed)."""
  ci95 = g.get("seeds_and_documents", {}).get("ci95")
  return "-" if ci95 is None else f"[{ci95[0]:+.4f}, {ci95[1]:+.4f}]"


def _bold(text: str, said: str) -> str:
  """`text` in bold unless its readout is secondary (`said`: its `role`)."""
  return text if said == "secondary" else f"**{text}**"


def _end_line(p: dict) -> list[str]:
  """The end difference across seeds (absent from payloads measured before it was)."""
  ref, other = p["reference"], p["other"]
  e = p.get(END, {}).get(other)
  if e is None:
    return []
  end = role(p, END)
  return ["", _bold(f"{other}'s test end loss minus {ref}'s: {results.both(e)}", end)
          + f" ({end + ': ' if end else ''}mean and 95% interval over {e['n']} seeds and the test documents; over "
          f"the seeds alone {results.ci(e, 4)}; validation {results.ci(e['validation'], 4)})."]


def table(p: dict) -> str:
  """Markdown: the setup, one row per seed (start → end, gains), then the end and gain
  differences across seeds, the validation view and the flags."""
  ref, other, ev, b = p["reference"], p["other"], p["eval"], p["budget"]
  r, o = p["methods"][ref], p["methods"][other]
  g = p["gain_difference"][other]
  own = p.get("intervals", {}).get("kind") == "seeds_own_starts"  # absent: written before
  runs = p["seed_runs"]
  seeds = ", ".join(f"{k} {s['updates']} updates at seed {s['seed']}"
                    for k, s in (runs[f"seed{p['seeds'][0]}"] if own else runs).items())
  seeds += " for the first seed; every seed its own, at seed_run_seed + s" if own else ""
  lines = [
      f"Table 7 protocol (SPEC 9.2, 9.6) at this scale: {ref} (N={r['n_experts']}, "
      f"d_t={r['d_t']}, {r['params']:,} params, {r['ops_per_update']:,} ops/update, "
      f"{r['layout']['why']}) vs {other} (N={o['n_experts']}, d_t={o['d_t']}, "
      f"{o['params']:,} params, {o['ops_per_update']:,} ops/update, {o['layout']['why']}). "
      f"Budget {b['amount']:g} {b['unit']} per configuration, continuing seed runs ({seeds}) "
      f"with their optimizer state. lr grid {p['tuning']['base_lr']:g} x "
      f"{p['tuning']['lr_factors']} (extended up to {p['tuning']['lr_extend']} times past an "
      f"edge), then eps x {p['tuning']['eps_factors']}; * = selected at the grid's edge. "
      f"Selection on ensemble validation ({ev['val_windows']} windows); test scored once. "
      f"Evaluation: route on {ev['route_bytes']} bytes, score the next {ev['score_bytes']} "
      f"({ev['test_windows']} test windows from {ev['test_documents']} documents). Load "
      f"average {p['load_average']['start'][0]:.2f} at the start, "
      f"{p['load_average']['end'][0]:.2f} at the end.",
      "",
      *results.head(f"| seed | {ref} lr / eps | updates | {ref} test start → end (gain) | "
                    f"{other} lr / eps | updates | {other} test start → end (gain) | {ref} gain "
                    f"minus {other} gain [95% document bootstrap] | end gap ({other} minus "
                    f"{ref}) |"),
  ]
  lines += [_row(a, bb, gg) for a, bb, gg in zip(r["per_seed"], o["per_seed"], g["per_seed"],
                                                 strict=True)]
  n = len(o["per_seed"])
  start_gap = {s: o["start_loss"][s] - r["start_loss"][s] for s in ("validation", "test")}
  gain = role(p, GAIN)
  lines += [
      *_end_line(p),
      "", _bold(f"{ref}'s gain minus {other}'s gain, test: {results.ci(g, 4)}", gain)
      + f" ({gain + ': ' if gain else ''}mean and 95% t interval over {n} seeds, conditional on "
      f"the test documents; with the documents' noise too {_both(g)}; validation "
      f"{results.ci(g['validation'], 4)}). Gains (start − "
      f"end), test: {ref} {results.ci(r['gain']['test'], 4)}, {other} "
      f"{results.ci(o['gain']['test'], 4)}; validation: {ref} "
      f"{results.ci(r['gain']['validation'], 4)}, {other} "
      f"{results.ci(o['gain']['validation'], 4)}.",
      "", f"Start gap ({other} minus {ref}{', the seeds mean' if own else ''}): test {start_gap['test']:+.4f}, validation "
      f"{start_gap['validation']:+.4f}; end gap, test: {results.pm(o['minus_ref'], True, 4)} "
      f"({ref} lower in {o['ref_wins']} of {n} seeds). Byte unigram "
      f"{p['unigram_test_nats_per_byte']:.3f}."]
  edges = sum(q["lr_at_edge"] for q in r["per_seed"] + o["per_seed"])
  if edges:
    lines += ["", f"{edges} of {2 * n} searches selected an lr at the edge of their grid "
              "(after extending it): the optimum may lie outside it."]
  return "\n".join(lines) + "\n"
