"""The paper's Figure 13 with Tables 10 and 11 (its App. M allocations, scaled down by
SPEC 9.6): SOMA N = 8 with the directions-times-windows product n_pert x B held fixed, split
three ways.

Each allocation (`allocations`: methods of config.methods, all at one N and one n_pert x B,
checked, so every update does the same operations) continues one seed run (N = 1 at the
experts' width on the one-shard data dir, its state continued: the shared checkpoint) on the
corpus prepared into N shards, for `budget` updates at each optimisation seed; B above the base
is accumulated (`spsa.accum`), each accumulated batch with its own directions, as the paper's.
- Figure 13: ensemble-validation loss against operations (and device-seconds) per allocation;
- Table 10: each allocation's seed-mean validation loss at `table10_fractions` of the final
  operations, as the range between linear and log-operations interpolation of its curve;
- Table 11: every allocation's test loss after the same updates (equal operations) from the
  shared start, averaged over the paired seeds (the same seeds for every allocation), with each
  allocation minus the first per seed and its paired document bootstrap.
"""

from __future__ import annotations

import dataclasses
import re

import ml_collections
import numpy as np

from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  driver,
  paper,
  planning,
  recipes,
  report,
  results,
  scores,
  seeded,
  statistics,
)
from soma_jax.studies.verdict import Interval, from_stat

PAPER = {
    "item": "Figure 13, Tables 10 and 11",
    "figure13": "Larger batches reach 1.90 with fewer GPU-hours in these runs: N = 8, a 0.272M "
                "model; n_pert = 64, B = 1024 first at or below 1.90 at 28.7 GPU-hours against "
                "44.5 for n_pert = 1024, B = 64 (1.55x fewer); B = 256 and 1,024 accumulate four "
                "and sixteen batches of 64 with independently sampled directions.",
    "table10": {"allocation": [8, 64, 1024], "budgets_ops": [2e18, 4e18, 8e18],
                "estimated_ensemble_val": [[1.8046, 1.8057], [1.7947, 1.8000],
                                           [1.7848, 1.7887]],
                "note": "the saved curves favour (N, n_pert, B) = (8, 64, 1024); ranges span "
                        "linear- and log-compute interpolation"},
    "table11": {"rows": [{"n_pert": 64, "batch": 1024, "test": 2.376587},
                         {"n_pert": 256, "batch": 256, "test": 2.376575},
                         {"n_pert": 1024, "batch": 64, "test": 2.376625}],
                "note": "nearly equal test loss after 512 further updates at equal arithmetic "
                        "operations from the same N = 8 checkpoint; two paired seeds, all "
                        "4,096 test documents"},
}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=fig13 (the paper's Figure 13 with Tables 10 and 11): SOMA N = 8 of width 32 at
  n_pert x B = 256 split three ways, from one seed run.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig13,size=cpu --out=runs/fig13
  """
  c, a = recipes.paper_study(arg)
  size, cpu = a["size"], a["size"] == "cpu"
  c.seeds = a["seeds"] or 2  # the paper's two paired seeds
  # 256 updates per allocation (the paper: 512 further updates): each does 16x the N = 8
  # base's operations per update, about 1 s here
  c.budget = 256.0 if cpu else 3.0
  c.curve_points = 4
  c.match_params = False
  c.table10_fractions = (0.25, 0.5, 1.0)  # of the final operations (the paper: 2, 4, 8e18)
  c.update(recipes.corpus())
  n = 8 if cpu else 2
  # (n_pert, windows per batch, accumulated batches): the paper's (64, 1024), (256, 256),
  # (1024, 64) over 16, here n_pert x B = 256 (tiny: 8); B above the base by accumulation
  splits = ((4, 4, 16), (16, 4, 4), (64, 4, 1)) if cpu else ((2, 2, 2), (4, 2, 1), (8, 1, 1))
  rows = {}
  for k, b, acc in splits:
    cfg = recipes.recipe("soma.py", f"n={n},size={size}", size, c.base_lr)
    cfg.spsa.update(n_pert=k, batch=b, accum=acc)
    rows[f"npert{k}_b{b * acc}"] = (cfg, f"SOMA N = {n}, n_pert {k}, B {b * acc}" + (
        f" ({acc} accumulated batches of {b})" if acc > 1 else ""), "soma_expert")
  recipes.rows(c, rows)
  c.allocations = tuple(rows)  # n_pert growing
  c.order = c.allocations
  c.reference = c.allocations[0]
  c.seed_runs = ml_collections.ConfigDict({"soma_expert": c.seed_runs.soma_expert})
  return c


@dataclasses.dataclass(frozen=True)
class Allocations:
  """The study's own fields (`check`): the allocations, their N, Table 10's fractions and the
  corpus."""
  names: tuple[str, ...]
  n_experts: int
  fractions: tuple[float, ...]
  source: str
  prepare: dict


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Allocations:
  """Allocations at one N and one n_pert x B (equal operations per update)."""
  if plan.unit != "updates" or config.match_params:
    raise UserError("fig13 runs every allocation for the same updates at its own width; fix: "
                    "--config.budget_unit=updates --config.match_params=False")
  names = tuple(config.allocations)
  missing = [n for n in names if n not in config.methods]
  if missing or len(names) < 2:
    raise UserError(f"allocations={names} must name at least 2 methods of "
                    f"{', '.join(config.methods)}")
  cfgs = [config.methods[n] for n in names]
  ns = {c.n_experts for c in cfgs}
  products = {c.spsa.n_pert * c.spsa.batch * c.spsa.accum for c in cfgs}
  if len(ns) != 1 or len(products) != 1:
    raise UserError(f"allocations {names} must share N and n_pert x B (have N {sorted(ns)}, "
                    f"n_pert x B {sorted(products)}): the figure holds the product fixed")
  fractions = planning.check_fractions(config, "table10_fractions", "(0.25, 0.5, 1.0)")
  planning.check_source(config)
  return Allocations(names, ns.pop(), fractions, config.source,
                     recipes.settings(config.get("prepare")))


def stages(alloc: Allocations, ready: base.Setup) -> base.Stages:
  """Every allocation at every seed (one stage) from the seed run; each one's validation
  curve and final test losses: (rows, ends)."""
  plan, seeds, (val, test) = ready.plan, ready.seeds, ready.scored
  planned = seeded.every_seed(ready, ready.methods, "updates", plan.budget)
  starts = {name: scores.start_losses(planned[(plan.seeds[0], name)],
                                      {"validation": val, "test": test})
            for name in ready.methods}
  rows, ends = {}, {}
  for run in (yield from seeded.trained(planned, ready.out)):
    spec, c, key = run.spec, run.spec.config, (run.seed, run.name)
    rows.setdefault(run.name, {"n_experts": spec.n_experts, "n_pert": c.spsa.n_pert,
                               "batch": c.spsa.batch * c.spsa.accum, "accum": c.spsa.accum,
                               "ops_per_update": spec.total_ops_per_update,
                               "params": spec.method.ensemble_params,
                               "start_loss": {k: float(v.mean())
                                              for k, v in starts[run.name].items()},
                               "per_seed": []})
    points, _ = seeded.curve(run, seeds[plan.start[run.name]], val,
                             starts[run.name]["validation"].mean())
    ends[key] = scores.final_losses(run.workdir, spec, test)
    rows[run.name]["per_seed"].append(seeded.record(
        run, ready.out, curve=points, test_nats_per_byte=float(ends[key].mean())))
  return rows, ends


def measure(alloc: Allocations, ready: base.Setup, gathered: tuple) -> dict:
  """Tables 10 and 11 from the allocations' curves and test losses."""
  rows, ends = gathered
  plan = ready.plan
  measured = {"allocations": rows, "table10": table10(rows, alloc.fractions),
              "table11": table11(rows, ends, alloc.names, plan.seeds, ready.scored[1],
                                 plan.bootstrap_draws)}
  return {"budget": {"unit": "updates", "per": "allocation and seed",
                     "seed_updates": plan.seed_updates},
          "paper": PAPER, "measured": measured}


def table10(rows: dict, fractions: tuple[float, ...]) -> dict:
  """Each allocation's seed-mean validation loss at each fraction of the final operations:
  [lo, hi] over linear and log-operations interpolation between its checkpoints."""
  final = min(report.mean_curve(r["per_seed"], "ops")[0][-1] for r in rows.values())
  out = {"ops": [f * final for f in fractions], "estimated": {}}
  for name, r in rows.items():
    x, y = report.mean_curve(r["per_seed"], "ops")
    lin = [float(np.interp(f * final, x, y)) for f in fractions]
    pos = x > 0  # the log reading starts at the first checkpoint (the start is at 0 ops)
    lx, ly = np.log(x[pos]), y[pos]
    log = [float(np.interp(np.log(f * final), lx, ly)) if f * final >= x[pos][0] else lin[i]
           for i, f in enumerate(fractions)]
    out["estimated"][name] = [[min(a, b), max(a, b)] for a, b in zip(lin, log, strict=True)]
  out["lowest"] = [min(rows, key=lambda n, i=i: sum(out["estimated"][n][i]))
                   for i in range(len(fractions))]
  out["how"] = ("seed-mean validation curves against operations; each cell the range of "
                "linear interpolation in operations and in log operations (before the first "
                "checkpoint, linear only)")
  return out


def table11(rows: dict, ends: dict, names: tuple, seeds: tuple, test, draws: int) -> dict:
  """Test loss after the same updates from the shared start, over the paired seeds; each
  allocation minus the first, per seed with its paired document bootstrap, then across."""
  ref = names[0]
  out = {"reference": ref, "rows": {}}
  for name in names:
    per = [q["test_nats_per_byte"] for q in rows[name]["per_seed"]]
    diffs = [statistics.paired(ends[(s, ref)], ends[(s, name)], test.doc_ids, draws, s)
             for s in seeds]
    out["rows"][name] = {"test": statistics.across_seeds(per), "per_seed": per,
                         "minus_ref": statistics.t_interval([d["diff"] for d in diffs]),
                         "minus_ref_per_seed": diffs}
  return out


def plot(p: dict, path: str) -> None:
  """fig13.png: validation loss against operations (left) and device-seconds (right)."""
  fig, axes = report.plt.subplots(1, 2, figsize=(10, 4))
  for ax, key, label in ((axes[0], "ops", "training operations (SPEC 7)"),
                         (axes[1], "device_seconds", "device-seconds of training updates")):
    for r in p["measured"]["allocations"].values():
      x, y = report.mean_curve(r["per_seed"], key)
      ax.plot(x[1:], y[1:], marker="o", ms=3,
              label=f"n_pert {r['n_pert']}, B {r['batch']} ({r['accum']} x {r['batch'] // r['accum']})")
    report.label(ax, label, log=True)
  report.save_figure(fig, path)


def table(p: dict) -> str:
  m, b = p["measured"], p["budget"]
  rows, t10, t11 = m["allocations"], m["table10"], m["table11"]
  first = next(iter(rows.values()))
  lines = [f"Figure 13 / Tables 10-11 at this scale: N = {first['n_experts']}, n_pert x B = "
           f"{first['n_pert'] * first['batch']}, every allocation {b['amount']:g} updates "
           f"({first['ops_per_update']:.3g} ops each) from one seed run ({b['seed_updates']} "
           f"updates, state continued), seeds {p['seeds']}. " + results.load_line(p), "",
           "Table 10 (estimated ensemble-validation loss, linear to log interpolation):", "",
           *results.head("| allocation | " + " | ".join(f"{x:.3g} ops" for x in t10["ops"]) + " |")]
  for name, cells in t10["estimated"].items():
    r = rows[name]
    lines.append(f"| n_pert {r['n_pert']}, B {r['batch']} | "
                 + " | ".join(f"{lo:.4f}–{hi:.4f}" for lo, hi in cells) + " |")
  lines += ["", f"Table 11 (test after {b['amount']:g} updates at equal operations, mean over "
            f"{len(p['seeds'])} paired seeds; minus {t11['reference']}, 95% t):", "",
            *results.head("| allocation | test | minus first |")]
  for name, r in t11["rows"].items():
    a = rows[name]
    lines.append(f"| n_pert {a['n_pert']}, B {a['batch']} | {results.pm(r['test'], digits=6)} | "
                 f"{results.ci(r['minus_ref'], digits=4)} |")
  return "\n".join(lines) + "\n"


def primary_table11(d: dict) -> tuple[Interval, ...]:
  t = d["measured"]["table11"]
  name = lambda n: "({}, {})".format(*re.fullmatch(r"npert(\d+)_b(\d+)", n).groups())
  return tuple(from_stat(f"{name(n)} − {name(t['reference'])}", r["minus_ref"])
               for n, r in t["rows"].items() if n != t["reference"])


def ours_figure13(d: dict) -> str:
  t = d["measured"]["table10"]
  return (f"lowest allocation at 1/4, 1/2, 1 of the operations: {', '.join(t['lowest'])}; "
          "Table 11: " + paper.shown(primary_table11(d), 4))


def ours_table10(d: dict) -> str:
  t = d["measured"]["table10"]
  return "; ".join(f"{n}: " + ", ".join(f"{lo:.4f}-{hi:.4f}" for lo, hi in cells)
                   for n, cells in t["estimated"].items())


def brief_table10(d: dict) -> str:
  return "lowest: " + ", ".join(d["measured"]["table10"]["lowest"])


def ours_table11(d: dict) -> str:
  t = d["measured"]["table11"]
  return "; ".join(f"{n} {r['test']['mean']:.4f} ({paper.ci(r['minus_ref'], 4)})"
                   for n, r in t["rows"].items()) + f" (test; minus {t['reference']}, t over 2 seeds)"


PAPER_ROWS = (
    paper.StudyRow(
        "Figure 13", "allocations (n_pert, B) at fixed n_pert x B", ours_figure13, "n_pert 64, "
        "B 1,024 reaches 1.90 with 1.55x fewer GPU-hours than n_pert 1,024, B 64", "n_pert x B = "
        "256 (paper 65,536), width-32 N = 8, 256 updates; the allocations are not "
        "distinguishable here (Table 11's intervals about ±0.03)", primary_table11,
        paper_brief="largest batch lowest"),
    paper.StudyRow(
        "Table 10", "estimated loss of the allocations at three budgets", ours_table10,
        "(8, 64, 1,024) lowest at 2e18 / 4e18 / 8e18 operations: 1.8046-1.8057, 1.7947-1.8000, "
        "1.7848-1.7887", "budgets at 1/4, 1/2, 1 of our final operations, which fall on "
        "checkpoints, so the two interpolations agree", brief=brief_table10,
        paper_brief="(8, 64, 1,024) lowest",
        no_verdict="estimates without intervals (Table 11 carries the verdict)"),
    paper.StudyRow(
        "Table 11", "the allocations continued at equal operations", ours_table11, "2.376587 / "
        "2.376575 / 2.376625 for (64, 1,024) / (256, 256) / (1,024, 64)", "256 updates from the "
        "seed (paper: 512 from an N = 8 checkpoint), 2 seeds", primary_table11,
        paper_brief="within 0.0001"),
)

STUDY = base.Study(name="fig13",
                   spec="paper Figure 13 with Tables 10 and 11 (App. M allocations), scaled down "
                        "by SPEC 9.6", config=config, check=check, stages=stages,
                   measure=measure, table=table, plot=report.png(plot, "fig13.png"),
                   data=driver.per_n(lambda alloc: alloc.n_experts), paper_rows=PAPER_ROWS)
