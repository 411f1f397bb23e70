"""The width ladder's table.md and figure (`ladder.py`): per rung, the predicted ratio beside the
measured gain ratio, and both against width.
"""

from __future__ import annotations

import numpy as np

from soma_jax.studies import report, results


def table(p: dict) -> str:
  """Markdown: one row per rung, predicted beside measured, then the gains."""
  ref, mono, ctl = p["reference"], p["other"], p["control"]
  lines = [
      f"Width ladder ({p['spec']}): SOMA N = 2 ({ref}) against the monolith ({mono}) of equal "
      f"total parameters at each rung; Table 7's protocol per rung ({p['budget']['amount']:g} "
      f"{p['budget']['unit']} per configuration after {p['budget']['seed_updates']}-update seeds, "
      f"seeds {p['seeds']}). rho by {p['mechanism']['rho_by']} at each rung's start "
      f"({p['mechanism']['batches']} batch(es) per expert, {p['mechanism']['repeats']} "
      "estimates each), r by Hessian-vector products. Gains: test, start - end; intervals: "
      "95% t across seeds.",
      "",
      *results.head("| expert width | monolith width | params (SOMA / mono) | ops/update diff | "
                    "rho expert | rho mono | r expert | r mono | predicted ratio | measured "
                    "gain ratio | SOMA gain | mono gain | SOMA - control gain | rho summed | r "
                    "summed | predicted vs summed | measured vs summed | wall s |"),
  ]
  for r in p["rungs"]:
    m = r["mechanism"]
    r_e = np.mean([x["r"] for x in m["experts"]])
    lines.append(
        f"| {r['width']} | {r['d_t'][mono]} | {r['params'][ref]:,} / {r['params'][mono]:,} | "
        f"{r['ops_difference']:+.2%} | {m['rho_expert']:.4g} | {m['monolith']['rho']:.4g} | "
        f"{r_e:.3g} | {m['monolith']['r']:.3g} | {m['predicted_ratio']:.3f} ± "
        f"{m['predicted_ratio_se']:.3f} | {results.ci(r['measured_ratio'])} | "
        f"{results.ci(r['methods'][ref]['gain']['test'], 4)} | "
        f"{results.ci(r['methods'][mono]['gain']['test'], 4)} | "
        f"{results.ci(r['control']['soma_minus_control_gain'], 4)} | "
        f"{m['summed']['rho']:.4g} | {m['summed']['r']:.3g} | {m['predicted_vs_summed']:.3f} ± "
        f"{m['predicted_vs_summed_se']:.3f} | {results.ci(r['measured_vs_summed'])} | "
        f"{r['wall_seconds']:.0f} |")
  se_by = sorted({r["mechanism"]["predicted_ratio_se_by"] for r in p["rungs"]})
  se_summed = sorted({r["mechanism"]["predicted_vs_summed_se_by"] for r in p["rungs"]})
  lines += ["", f"Control: {ctl} at SOMA's selected lr / eps and updates per seed. Predicted "
            f"ratio: mean over experts of rho / the monolith's rho (± SE, {'; '.join(se_by)}). "
            "Predicted vs summed: mean over experts of rho / the summed-loss estimator's rho "
            f"(both experts' bodies, one direction over them; ± SE, {'; '.join(se_summed)}); "
            "measured vs summed: SOMA's test gain / the control's (95% t across seeds). "
            f"Byte unigram {p['unigram_test_nats_per_byte']:.3f}."]
  return "\n".join(lines) + "\n"


def plot(p: dict, path: str) -> None:
  """The measured gain ratio (95% t interval) and the predicted ratio (± 2 SE) vs width."""
  plt = report.plt
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  w = np.array([r["width"] for r in p["rungs"]], float)
  meas = [r["measured_ratio"] for r in p["rungs"]]
  mean = np.array([m["mean"] for m in meas])
  lo = np.array([m["ci95"][0] if m["ci95"] else m["mean"] for m in meas])
  hi = np.array([m["ci95"][1] if m["ci95"] else m["mean"] for m in meas])
  ax.errorbar(w, mean, yerr=[mean - lo, hi - mean], fmt="o-", capsize=3,
              label="measured: SOMA gain / monolith gain (95% t, seeds)")
  pred = np.array([r["mechanism"]["predicted_ratio"] for r in p["rungs"]])
  se = np.array([r["mechanism"]["predicted_ratio_se"] for r in p["rungs"]])
  ax.errorbar(w * 1.04, pred, yerr=2 * se, fmt="s--", capsize=3,
              label="predicted: rho expert / rho monolith (± 2 SE)")
  ax.axhline(1.0, c="gray", lw=1)
  ax.set_xscale("log", base=2)
  ax.set_xlim(w.min() / 1.4, w.max() * 1.4)  # one rung alone: its two markers side by side
  ax.set_xticks(w, [str(int(x)) for x in w])
  ax.set_xlabel("SOMA expert width (monolith of equal parameters)")
  ax.set_ylabel("SOMA / monolith")
  ax.set_title(f"width ladder, {len(p['seeds'])} seeds", fontsize=10)
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  report.save_figure(fig, path)


