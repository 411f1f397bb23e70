"""The paper's Figure 17 (scaled down by SPEC 9.6): averaging two experts helps more when
their errors differ.

The ensembles are Figure 16's (fig16.py: the same config fields): read from a finished fig16
folder (`ensembles_from`, checked to hold the same settings) or else trained here the same
way. For every pair (a, b) of each ensemble's experts, on every ensemble-validation window and
scored target (every expert scores every window: averaging pairs, not top-k routing;
`evaluate.PairStats`):
- error similarity: the correlation of l_a and l_b, the two experts' per-target losses, after
  removing the shared difficulty d (the mean loss of all N experts at that target): their
  partial correlation given d (plain correlation at N = 2, where d = (l_a + l_b) / 2);
- loss reduction: (mean l_a + mean l_b) / 2 minus the mean loss of the averaged prediction
  (p_a + p_b) / 2, >= 0 at every target (the log is concave).
Points: equal-count bins of an ensemble's pairs (all seeds pooled) by error similarity, each
the mean of its pairs (`bins` per ensemble, at most one per pair); results.json says how many
pairs and tokens each point averages. `measured`: the Pearson correlation and least-squares
slope of reduction on similarity across pairs (the paper: negative, larger reductions where
errors differ), pooled and per seed.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax.errors import UserError
from soma_jax.studies import base, driver, fig16, paper, planning, recipes, report, results

PAPER = {
    "item": "Figure 17",
    "caption": "Averaging helps more when experts make different errors. The horizontal axis "
               "measures error similarity after removing shared token difficulty. The vertical "
               "axis measures how much lower the averaged prediction’s ensemble validation "
               "loss is than the mean loss of the two experts alone. For example, 0.10 means a "
               "reduction of 0.10 nats/byte. Each point averages about 1,300 expert pairs with "
               "similar error correlations, using 749,568 ensemble validation tokens. Pairs "
               "share experts. This tests averaging pairs of experts, not top-4 routing.",
    "pairs_per_point": 1300, "tokens": 749_568,
    "claim": "the loss reduction of averaging a pair is larger when its errors differ "
             "(reduction falls as error similarity grows)",
}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=fig17 (the paper's Figure 17): every pair of experts of Figure 16's ensembles
  averaged, loss reduction against error similarity.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig17,size=cpu --out=runs/fig17 \
        --config.ensembles_from=runs/fig16
  """
  c = fig16.config(arg)
  cpu = recipes.args(arg, seeds=0)["size"] == "cpu"
  c.ensembles_from = ""  # a finished study=fig16 --out with these settings; "" = train here
  c.bins = 10 if cpu else 2  # equal-count bins of each ensemble's pairs (the paper: ~25)
  return c


@dataclasses.dataclass(frozen=True)
class PairStudy:
  """The study's own fields (`check`): Figure 16's ensembles, where to read them, the bins."""
  ensembles: fig16.Ensembles
  ensembles_from: str  # a finished fig16 folder ("" = train the ensembles here)
  bins: int


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> PairStudy:
  """Figure 16's fields (`fig16.check`), the bins and the folder to read ensembles from."""
  ens = fig16.check(plan, config)
  planning.check_fields(config, {
      "bins": planning.whole(1),
      "ensembles_from": ("a string (a fig16 --out folder, or empty)",
                         lambda v: isinstance(v, str))})
  where = config.ensembles_from.strip()
  if where and not os.path.isdir(where):
    raise UserError(f"ensembles_from={where!r} is not a folder; fix: the --out of a finished "
                    f"study={fig16.STUDY.name} run, or --config.ensembles_from= (train here)")
  return PairStudy(ens, where, config.bins)


def relation(x: np.ndarray, y: np.ndarray) -> dict:
  """Pearson correlation and least-squares slope of y on x (None below 3 points or without
  spread)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
    return {"pairs": int(x.size), "pearson": None, "slope": None}
  slope = float(np.polyfit(x, y, 1)[0])
  return {"pairs": int(x.size), "pearson": float(np.corrcoef(x, y)[0, 1]), "slope": slope}


def binned(x: np.ndarray, y: np.ndarray, bins: int) -> list[dict]:
  """Equal-count bins of the pairs sorted by similarity x (min(bins, pairs) of them, sizes
  differing by at most one): each bin's mean x and y, its pairs and its x range."""
  order = np.argsort(np.asarray(x), kind="stable")
  out = []
  for g in np.array_split(order, min(bins, len(order))):
    out.append({"error_similarity": float(np.mean(x[g])), "loss_reduction": float(np.mean(y[g])),
                "pairs": int(g.size), "error_similarity_range": [float(x[g].min()),
                                                                 float(x[g].max())]})
  return out


def _xy(pairs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
  """(error similarity, loss reduction) of `pairs` (`PairStats.rows`)."""
  return (np.array([q["error_correlation"] for q in pairs]),
          np.array([q["loss_reduction"] for q in pairs]))


def readout(study: PairStudy, per_seed: dict, tokens: int, windows: int) -> dict:
  """results.json `measured`: per ensemble its pairs per seed, the relation across pairs
  (pooled and per seed) and the binned points, each with the pairs and tokens it averages."""
  out = {}
  for name, n in zip(study.ensembles.names, study.ensembles.ns, strict=True):
    rows = per_seed[name]
    x, y = _xy([q for r in rows for q in r["pairs"]])
    points = binned(x, y, study.bins)
    for b in points:
      b["tokens_per_pair"] = tokens
    rel = relation(x, y)
    out[name] = {
        "n_experts": n, "pairs_per_seed": n * (n - 1) // 2, "windows": windows,
        "tokens_per_pair": tokens, "relation": rel, "bins": points,
        "negative_slope": None if rel["slope"] is None else rel["slope"] < 0,
        "min_loss_reduction": float(y.min()),
        "per_seed": [{**r, "relation": relation(*_xy(r["pairs"]))} for r in rows],
        "how": "pairs of all seeds pooled (each seed's ensemble holds every pair once); every "
               "pair scored on every window's tokens; bins of equal pair counts by error "
               "similarity, each point the mean of its pairs"}
  return {"ensembles": out, "reduction_larger_when_errors_differ": {
      name: r["negative_slope"] for name, r in out.items()}}


def setup(study: PairStudy, plan: planning.StudyPlan, out: str, executor=None) -> base.Setup:
  """Figure 16's ensembles read from `ensembles_from` (nothing trained: data.extra holds
  them), else Figure 16's setup here (its data and seed run, `driver.setup`)."""
  ens = study.ensembles
  if not study.ensembles_from:
    return driver.setup(fig16.STUDY, ens, plan, out, executor)
  trained = fig16.trained_in(ens, study.ensembles_from)
  n = ens.ns[-1]  # every N's sets hold the same windows
  data = base.Data(trained.dirs, trained.scored, n, n, extra=trained)
  return base.Setup(plan, {}, {}, {}, trained.dirs[n], trained.scored[n], trained.seeds, out,
                    data)


def stages(study: PairStudy, ready: base.Setup) -> base.Stages:
  """Figure 16's ensembles (read, or trained here: `fig16.ensembles`), every pair of each
  scored on every window, written to OUT/pairs/NAME_seedS.csv; (the Trained, {ensemble:
  per-seed pairs})."""
  ens, out = study.ensembles, ready.out
  trained = (ready.data.extra if study.ensembles_from
             else (yield from fig16.ensembles(ens, ready)))
  per_seed = {name: [] for name in ens.names}
  os.makedirs(os.path.join(out, "pairs"), exist_ok=True)
  for r in trained.runs:
    sc, step = fig16.scores(r.workdir, trained.scored[r.n_experts][0], pairs=True)
    rows = sc.pairs.rows()
    per_seed[r.name].append({"seed": r.seed, "step": step,
                             "workdir": planning.shown(r.workdir, out), "pairs": rows})
    eval_lib.write_pairs(rows, os.path.join(out, "pairs", f"{r.name}_seed{r.seed}.csv"))
  return trained, per_seed


def measure(study: PairStudy, ready: base.Setup, gathered: tuple) -> dict:
  """Each ensemble's pairs binned by error similarity (`readout`)."""
  trained, per_seed = gathered
  val = ready.scored[0]
  windows = int(val.windows.shape[0])
  return {"budget": {"unit": "updates", "per": "ensemble and seed",
                     "seed_updates": ready.plan.seed_updates},
          "paper": PAPER, "measured": readout(study, per_seed, windows * val.score, windows),
          "ensembles_from": trained.folder if study.ensembles_from else "",
          "ensemble_settings": study.ensembles.settings}


def plot(p: dict, path: str) -> None:
  """fig17.png: per ensemble, every pair's loss reduction against its error similarity and
  the binned means."""
  ens = p["measured"]["ensembles"]
  fig, axes = report.plt.subplots(1, len(ens), figsize=(5 * len(ens), 4), squeeze=False)
  for ax, r in zip(axes[0], ens.values(), strict=True):
    pairs = [q for s in r["per_seed"] for q in s["pairs"]]
    ax.scatter([q["error_correlation"] for q in pairs], [q["loss_reduction"] for q in pairs],
               s=6, alpha=0.35, label="expert pair")
    ax.plot([b["error_similarity"] for b in r["bins"]], [b["loss_reduction"] for b in r["bins"]],
            "k-o", ms=4, label=f"binned mean (~{len(pairs) / len(r['bins']):.0f} pairs each)")
    report.label(ax, "error similarity (shared token difficulty removed)",
                 "loss reduction of the averaged pair (nats/byte)",
                 f"SOMA N = {r['n_experts']}: {r['tokens_per_pair']:,} tokens per pair")
  report.save_figure(fig, path)


def table(p: dict) -> str:
  """Markdown: per ensemble the relation across pairs and the binned points."""
  m, b = p["measured"], p["budget"]
  src = p.get("ensembles_from") or "trained here"
  lines = [f"Figure 17 at this scale: Figure 16's ensembles ({src}), {b['amount']:g} updates "
           f"each from one seed run ({b['seed_updates']} updates), seeds {p['seeds']}; every "
           "pair of experts averaged on every ensemble-validation window.", ""]
  fmt = lambda v, f: "n/a" if v is None else format(v, f)
  for r in m["ensembles"].values():
    rel = r["relation"]
    lines += [f"**SOMA N = {r['n_experts']}**: {rel['pairs']} pairs ({r['pairs_per_seed']} per "
              f"seed), {r['tokens_per_pair']:,} tokens each; correlation of reduction with "
              f"similarity {fmt(rel['pearson'], '+.3f')}, slope {fmt(rel['slope'], '+.4f')} "
              f"(per seed: {', '.join(fmt(s['relation']['pearson'], '+.3f') for s in r['per_seed'])}"
              f"); smallest reduction {r['min_loss_reduction']:.5f}.", "",
              *results.head("| error similarity (range) | loss reduction | pairs | "
                            "tokens per pair |")]
    for q in r["bins"]:
      lo, hi = q["error_similarity_range"]
      lines.append(f"| {q['error_similarity']:+.3f} ({lo:+.3f} to {hi:+.3f}) | "
                   f"{q['loss_reduction']:.5f} | {q['pairs']} | {q['tokens_per_pair']:,} |")
    lines.append("")
  lines.append(f"The paper: {PAPER['claim']}.")
  return "\n".join(lines) + "\n"


def ours_figure17(d: dict) -> str:
  ens = d["measured"]["ensembles"]
  return "; ".join(f"N = {r['n_experts']}: {r['relation']['pairs']} pairs, correlation of "
                   f"reduction with similarity {r['relation']['pearson']:+.2f}, smallest "
                   f"reduction {r['min_loss_reduction']:.4f}" for r in ens.values())


def brief_figure17(d: dict) -> str:
  ens = d["measured"]["ensembles"].values()
  return "correlation " + " and ".join(f"{e['relation']['pearson']:+.2f}" for e in ens)


PAPER_ROWS = (paper.StudyRow(
    "Figure 17", "pairs' error similarity against their averaging gain", ours_figure17,
    "averaging helps more when experts err differently (~1,300 pairs per point, 749,568 tokens)",
    "fig16's ensembles; 98,304 tokens per pair, 10 bins of about 6 (N = 8) and 99 (N = 32) pairs",
    brief=brief_figure17, paper_brief="negative relation",
    no_verdict="a correlation over pooled pairs, no interval",
    flags=f" --config.ensembles_from=runs/{fig16.STUDY.name}_cpu"),)

STUDY = base.Study(name="fig17",
                   spec="paper Figure 17 (pairs of experts averaged), scaled down by SPEC 9.6",
                   config=config, check=check, stages=stages, measure=measure, table=table,
                   plot=report.png(plot, "fig17.png"), setup=setup, paper_rows=PAPER_ROWS)
