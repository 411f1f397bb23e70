"""The paper's Table 5 (scaled down by SPEC 9.6): SOMA against BPTT at N = 1, 2 and 8 experts
of equal total size, ensemble-validation loss at three budgets.

For each N of `n_list`, two rows of the same architecture (N experts whose total parameters
match the reference's, `match_params`): SOMA (SPSA, each expert on its shard) continuing that
architecture's equal-update seed run with its state, and BPTT (backprop + Adam, each expert on
its shard) from the same seed's parameters with fresh Adam moments (`fresh_optimizer`: SPSA's
second moments would damp its first updates). Each N trains on the corpus (`source`) prepared
into N shards under OUT/data_nN (the same held-out documents for every N, checked) and is
scored by its own router. Every row runs the operations of `budget` reference updates (SPEC 7's
count: one budget in operations for all rows), with `curve_points` checkpoints; the
ensemble-validation curve is read at `budget_fractions` of it by linear interpolation in
operations (the paper: 50, 75 and 100 GPU-hours, interpolated between checkpoints).

Protocol (SPEC 9.8): every optimisation seed s continues its own seed runs, trained at
seed_run_seed + s (`own_starts`); every row's lr is selected on a grid of lr_factors around
its config's lr, trained on the first seed at `select_fraction` of the budget, on its N's
validation set, then fixed for every seed (`selection`). Reported per N and budget: SOMA
beside BPTT, mean +- sample sd over the optimisation seeds, and the orderings of the seed
means against the paper's (BPTT below SOMA at each N; SOMA's and BPTT's orders over N);
results.json `paper` carries the paper's table.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  driver,
  paper,
  planning,
  recipes,
  results,
  scores,
  seeded,
  selection,
  statistics,
  table7,
  training,
)
from soma_jax.studies.verdict import Interval, from_stat

PAPER = {
    "item": "Table 5",
    "caption": "BPTT reaches lower ensemble validation loss at these budgets (nats/byte, "
               "ensemble validation, roughly 8.44M models); values interpolate measured losses, "
               "except BPTT N = 1 at 100 GPU-hours, its last checkpoint at 97.3 GPU-hours; "
               "hardware and training recipes differ",
    "budgets_gpu_hours": [50, 75, 100],
    "rows": {"1": {"soma": [2.1237, 2.0590, 2.0343], "bptt": [1.0198, 1.0206, 1.0091]},
             "2": {"soma": [1.9363, 1.8734, 1.8257], "bptt": [1.0711, 1.0653, 1.0535]},
             "8": {"soma": [2.0880, 2.0456, 2.0179], "bptt": [1.1826, 1.1797, 1.1776]}},
}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=table5 (the paper's Table 5): SOMA and BPTT at each N of n_list, equal total size,
  each N's rows from one seed run of its width.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table5,size=cpu --out=runs/table5
  """
  c, a = recipes.paper_study(arg)
  size, cpu = a["size"], a["size"] == "cpu"
  c.seeds = a["seeds"] or (3 if cpu else 2)
  # Every row's total size is the largest N's at the experts' width (SOMA N = 8 of width 32:
  # 329,920 parameters at size=cpu; at the comparisons' 82k, N = 8 would be width 7 and its
  # heads 80% of it), and every row runs the operations of `budget` updates of that SOMA row;
  # the paper's three GPU-hour budgets are read as fractions of it.
  c.budget = 500.0 if cpu else 3.0
  c.budget_fractions = (0.5, 0.75, 1.0)  # the paper's 50 / 75 / 100 GPU-hours
  c.update(recipes.corpus())
  lr = c.base_lr
  seed = c.seed_runs.soma_expert
  c.methods, c.rows, c.start, c.seed_runs = (ml_collections.ConfigDict() for _ in range(4))
  n_list = (1, 2, 8) if cpu else (1, 2)  # the paper's 1, 2, 8 (tiny: two, the tests' speed)
  for n in n_list:
    c.seed_runs[f"seed_n{n}"] = recipes.copy(seed)  # at N's width
    c.methods[f"soma_n{n}"] = recipes.recipe("soma.py", f"n={n},size={size}", size, lr)
    bptt = recipes.recipe("bptt.py", f"n={n},size={size}", size, lr)
    bptt.method, bptt.opt.lr = "bptt", 3e-3  # bptt.py's lr
    c.methods[f"bptt_n{n}"] = bptt
    for kind, what in (("soma", "SOMA (SPSA)"), ("bptt", "BPTT (backprop + Adam, fresh)")):
      c.rows[f"{kind}_n{n}"] = f"{what}, N = {n}, each expert on its shard"
      c.start[f"{kind}_n{n}"] = f"seed_n{n}"
  c.reference = f"soma_n{n_list[-1]}"  # every row's params match it; the budget: its updates
  c.order = tuple(c.methods.keys())
  c.fresh_optimizer = tuple(n for n in c.methods if n.startswith("bptt"))
  c.own_starts = True  # seed s continues its own seed runs, trained at seed_run_seed + s
  # lr: a grid of lr_factors around each row's own lr (SPSA 0.0025, BPTT 0.003) on the first
  # seed at select_fraction of the budget, selected on validation, then fixed for every seed
  # (eps at the centre; `selection`). Tiny: one update per point, the tests' speed.
  c.lr_factors, c.lr_extend = (0.5, 1.0, 2.0), 0
  c.eps_factors, c.eps_extend = (1.0,), 0
  c.select_fraction = 0.25 if cpu else 0.1
  return c


@dataclasses.dataclass(frozen=True)
class Grid:
  """The study's own fields (`check`): which rows are which (N, optimiser), the budget
  fractions read, the corpus."""
  rows: dict  # {method: (N, "soma" | "bptt")}
  fractions: tuple[float, ...]
  source: str
  prepare: dict
  lr: table7.Grid  # each row's lr grid (factors of its own lr: `selection`)
  select_fraction: float  # of the budget, each grid point's on the first seed


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Grid:
  """The plan (every method resolved), one SOMA and one BPTT row per N, the fractions, the lr
  grid and select_fraction."""
  if plan.unit != "updates":
    raise UserError(f"budget_unit={plan.unit!r}: table5's budget is `budget` updates of the "
                    "reference, run as their operations by every row; fix: "
                    "--config.budget_unit=updates")
  fractions = planning.check_fractions(config, "budget_fractions", "(0.5, 0.75, 1.0)")
  planning.check_source(config)
  lr = table7.check_grid(config)
  planning.check_fields(config, selection.FIELDS)
  rows = {}
  for name, c in config.methods.items():
    gradient = planning.resolved(c, f"methods.{name}.").method.describe["gradient"]
    kind = {"zero-order": "soma", "exact (backprop)": "bptt"}.get(gradient)
    if kind is None:
      raise UserError(f"methods.{name}: its gradient is {gradient!r}; table5 compares "
                      "zero-order (SOMA) and backprop (BPTT) rows")
    if (kind == "bptt") != (name in plan.fresh_optimizer):
      raise UserError(f"methods.{name} ({gradient} gradient): the backprop rows and only they "
                      "take fresh Adam moments; fix: --config.fresh_optimizer= the bptt rows")
    rows[name] = (int(c.n_experts), kind)
  pairs = sorted(rows.values())
  if sorted(set(pairs)) != pairs or any(
      sum(1 for n, _ in pairs if n == m) != 2 for m, _ in pairs):
    raise UserError(f"methods must hold one soma and one bptt row per N; have {rows}")
  return Grid(rows, fractions, config.source, recipes.settings(config.get("prepare")), lr,
              float(config.select_fraction))


def stages(grid: Grid, ready: base.Setup) -> base.Stages:
  """Every row's start scored at every seed, its lr grid on the first seed at select_fraction
  of the budget (`selection`), then every row at every seed at its selected lr (one stage),
  each at the operations of `budget` of the reference's updates from that seed's run of its
  N; (the planned runs, their validation curves, the starts, the budget, the searches)."""
  plan, seeds, sets, first = ready.plan, ready.seeds, ready.data.sets, ready.plan.seeds[0]
  ops_budget = plan.budget * ready.specs[plan.reference].total_ops_per_update
  val = lambda name: sets[grid.rows[name][0]][0]  # its N's validation set
  planned = seeded.every_seed(ready, ready.methods, "ops", ops_budget)
  starts = {(seed, name): scores.start_losses(spec, {"validation": val(name)})["validation"]
            .mean() for (seed, name), spec in planned.items()}
  specs = {name: spec for (_, name), spec in seeded.every_seed(
      ready, ready.methods, "ops", ops_budget * grid.select_fraction, seeds=(first,),
      checkpoints=1).items()}
  begins = {name: selection.start(spec, training.seed_of(plan, seeds, first, name),
                                  starts[(first, name)]) for name, spec in specs.items()}
  found = selection.searches(grid.lr, specs, begins, {n: s.lr for n, s in specs.items()},
                             {name: val(name) for name in specs},
                             os.path.join(ready.out, "runs", "select"))
  planned = selection.fixed(planned, (yield from selection.selecting(found)))
  curves = {}
  for run in (yield from seeded.trained(planned, ready.out)):
    seed_run = training.seed_of(plan, seeds, run.seed, run.name)
    points, _ = seeded.curve(run, seed_run, val(run.name), starts[(run.seed, run.name)])
    curves[(run.seed, run.name)] = seeded.record(run, ready.out, seed_run=training.start_of(
        seed_run), start_loss=float(starts[(run.seed, run.name)]), curve=points)
  return planned, curves, starts, ops_budget, found


def measure(grid: Grid, ready: base.Setup, gathered: tuple) -> dict:
  """The rows and cells (`rows_and_cells`), the orderings against the paper's, the lr
  selection, the budget and the data dirs."""
  planned, curves, starts, ops_budget, found = gathered
  plan = ready.plan
  measured = rows_and_cells(grid, plan, ready.methods, ready.specs, planned, curves, starts,
                            ops_budget)
  return {"budget": {"unit": "ops", "amount": ops_budget, "per": "row and seed",
                     "reference_updates": plan.budget, "seed_updates": plan.seed_updates,
                     "fractions": list(grid.fractions)},
          "paper": PAPER, "intervals": planning.interval_kind(plan),
          "tuning": selection.tuning(grid.lr, grid.select_fraction),
          "selection": selection.report(found, ready.out),
          "measured": measured, "orderings": orderings(measured["cells"]),
          "how": "each row's ensemble-validation curve (start and checkpoints) interpolated "
                 "linearly in operations at each fraction of the budget; mean +- sample sd "
                 "over seeds"}


def at_budget(points: list[dict], ops: float) -> float:
  """A curve's loss at `ops` operations, linear between its points."""
  x = np.array([p["ops"] for p in points], np.float64)
  y = np.array([p["loss"] for p in points], np.float64)
  return float(np.interp(ops, x, y))


def rows_and_cells(grid: Grid, plan: planning.StudyPlan, methods: dict, specs: dict, planned: dict,
            curves: dict, starts: dict, ops_budget: float) -> dict:
  """{rows: each row's description (its selected lr, its start loss: the seeds' mean) and
  per-seed curves, cells: {N: {fraction: {soma, bptt, bptt_minus_soma}}}}."""
  rows = {}
  for name in methods:
    spec = planned[(plan.seeds[0], name)]
    per = [curves[(s, name)] for s in plan.seeds]
    rows[name] = {"n_experts": grid.rows[name][0], "optimizer": grid.rows[name][1],
                  "method": spec.method.name, "d_t": spec.config.model.d_t,
                  "params": spec.method.ensemble_params, "lr": spec.lr,
                  "ops_per_update": specs[name].total_ops_per_update,
                  "optimizer_state": ("fresh (the seed's parameters only)"
                                      if name in plan.fresh_optimizer else "the seed's, continued"),
                  "start_loss": float(np.mean([starts[(s, name)] for s in plan.seeds])),
                  "per_seed": per,
                  "at": {f: [at_budget(q["curve"], f * ops_budget) for q in per]
                         for f in grid.fractions}}
  cells = {}
  for n in sorted({n for n, _ in grid.rows.values()}):
    by = {kind: name for name, (m, kind) in grid.rows.items() if m == n}
    cells[n] = {}
    for f in grid.fractions:
      soma, bptt = rows[by["soma"]]["at"][f], rows[by["bptt"]]["at"][f]
      cells[n][f] = {"ops": f * ops_budget, "soma": statistics.across_seeds(soma),
                     "bptt": statistics.across_seeds(bptt),
                     "bptt_minus_soma": statistics.t_interval(
                         [b - a for a, b in zip(soma, bptt, strict=True)])}
  return {"rows": rows, "cells": {str(n): {str(f): v for f, v in c.items()}
                                  for n, c in cells.items()}}


def orderings(cells: dict) -> dict:
  """At the full budget (the paper's 100 GPU-hours; its orders are the same at 50 and 75),
  seed means against the paper's: BPTT below SOMA at each N, and SOMA's and BPTT's orders
  over the N both have (`statistics.ordering`)."""
  last = {n: c[max(c, key=float)] for n, c in cells.items()}
  paper = {n: {k: v[-1] for k, v in r.items()} for n, r in PAPER["rows"].items()}
  below = {n: last[n]["bptt"]["mean"] < last[n]["soma"]["mean"] for n in last}
  resolved = {n: (last[n]["bptt_minus_soma"]["ci95"] or [0.0, 0.0])[1] < 0 for n in last}
  return {"budget_fraction": float(max(next(iter(cells.values())), key=float)),
          "how": "seed means at the full budget; an order of means resolves no pair by itself "
                 "(bptt_minus_soma's t intervals do)",
          "bptt_below_soma": {"ours": below, "interval_below_zero": resolved,
                              "paper": {n: paper[n]["bptt"] < paper[n]["soma"] for n in paper}},
          **{f"{kind}_over_n": statistics.ordering(
              {n: last[n][kind]["mean"] for n in last}, {n: paper[n][kind] for n in paper})
             for kind in ("soma", "bptt")}}


def _order(o: dict) -> str:
  """'N = 2 < 8 < 1 (the paper's: 2 < 8 < 1, 3 of 3 pairs alike)'."""
  left = f"; N = {', '.join(o['left_out'])} not in the paper" if o["left_out"] else ""
  return (f"N = {' < '.join(o['ours'])} (the paper's: {' < '.join(o['paper'])}; "
          f"{o['agreeing']} of {o['pairs']} pairs alike{left})")


def order_lines(p: dict) -> list[str]:
  """table.md: the lr selection and the orderings against the paper's (a payload that has
  them: one measured before lrs were selected has neither)."""
  if "orderings" not in p:
    return []
  o, starts = p["orderings"], p["intervals"]["kind"]
  below = o["bptt_below_soma"]
  n_below, n = sum(below["ours"].values()), len(below["ours"])
  return ["", *selection.lines(p["selection"], p["tuning"]), "",
          f"Orderings at {o['budget_fraction']:g} of the budget (seed means; intervals over "
          f"seeds: {starts}): BPTT below SOMA at {n_below} of {n} N (its interval below zero "
          f"at {sum(below['interval_below_zero'].values())}; the paper: at every N). SOMA over "
          f"N: {_order(o['soma_over_n'])}. BPTT over N: {_order(o['bptt_over_n'])}. "
          + ("The paper's order." if o["soma_over_n"]["same"] and o["bptt_over_n"]["same"]
             and n_below == n else "Not the paper's order.")]


def table(p: dict) -> str:
  """Markdown in the paper's layout: one line per N, SOMA beside BPTT at each budget."""
  m, b = p["measured"], p["budget"]
  fr = b["fractions"]
  own = p.get("intervals", {}).get("kind") == "seeds_own_starts"
  lines = ["Table 5 protocol at this scale: per N, SOMA and BPTT of equal total size from "
           + ("each seed's own seed run" if own else "one seed run")
           + f" ({b['seed_updates']} updates; BPTT with fresh Adam), {b['amount']:.4g} "
           f"operations per row and seed ({b['reference_updates']:g} updates of "
           f"{p['reference']}), {len(p['seeds'])} seeds; ensemble validation "
           f"({p['eval']['val_windows_scored']} windows from {p['eval']['val_documents']} "
           f"documents), mean ± sample sd. " + results.load_line(p), "",
           *results.head("| N | " + " | ".join(f"SOMA {f:g} | BPTT {f:g}" for f in fr)
           + " | paper SOMA / BPTT at 50 / 75 / 100 GPU-hours |")]
  for n, cells in m["cells"].items():
    paper = PAPER["rows"].get(n)
    theirs = ("-" if paper is None else " ; ".join(
        f"{a:.4f} / {z:.4f}" for a, z in zip(paper["soma"], paper["bptt"], strict=True)))
    lines.append(f"| {n} | " + " | ".join(
        f"{results.pm(cells[str(f)]['soma'], digits=4)} | "
        f"{results.pm(cells[str(f)]['bptt'], digits=4)}" for f in fr) + f" | {theirs} |")
  lines += ["", "Budgets are fractions of the operations budget (columns); rows"
            + (" (lr: selected, below; start: the seeds' mean)" if own else "") + ":", "",
            *results.head("| row | N | optimiser | width | params | lr | ops / update | start |")]
  for name, r in m["rows"].items():
    lines.append(f"| {name} | {r['n_experts']} | {r['optimizer']} | {r['d_t']} | "
                 f"{r['params']:,} | {r['lr']:g} | {r['ops_per_update']:.3g} | "
                 f"{r['start_loss']:.4f} |")
  return "\n".join(lines + order_lines(p)) + "\n"


def _at_full_budget(cells: dict, n: str) -> dict:
  return cells[n][max(cells[n], key=float)]


def primary_table5(d: dict) -> tuple[Interval, ...]:
  cells = d["measured"]["cells"]
  return tuple(from_stat(f"N = {n}", _at_full_budget(cells, n)["bptt_minus_soma"], paper=-1)
               for n in cells)


def ours_table5(d: dict) -> str:
  cells = d["measured"]["cells"]
  last = lambda n: _at_full_budget(cells, n)
  out = "; ".join(f"N = {n}: SOMA {last(n)['soma']['mean']:.3f}, BPTT {last(n)['bptt']['mean']:.3f}"
                  f", BPTT − SOMA {paper.ci(last(n)['bptt_minus_soma'])}"
                  for n in cells) + f" (validation, full budget, t over {len(d['seeds'])} seeds)"
  if "orderings" not in d:  # measured before each row's lr was selected
    return out
  o = d["orderings"]
  order = lambda k: (f"{' < '.join(o[k]['ours'])} (the paper's {' < '.join(o[k]['paper'])})")
  return (f"{out}; {selection.edges(d['selection'])}; orders of the means over N, untested: "
          f"SOMA {order('soma_over_n')}, BPTT {order('bptt_over_n')}")


PAPER_ROWS = (paper.StudyRow(
    "Table 5", "SOMA against BPTT at N = 1, 2, 8", ours_table5, "BPTT lower at every N; at 100 "
    "GPU-hours SOMA 2.0343 / 1.8257 / 2.0179, BPTT 1.0091 / 1.0535 / 1.1776", "329k params "
    "(N = 8 at width 32), one operations budget, 3 seeds, each its own start; each row's lr "
    "from its own 3-point grid on seed 0, not extended past an edge; no pair of N tested", primary_table5,
    paper_brief="BPTT below SOMA by ~1"),)

STUDY = base.Study(name="table5",
                   spec="paper Table 5 (SOMA against BPTT at N = 1, 2, 8), scaled down by SPEC 9.6",
                   config=config, check=check, stages=stages, measure=measure, table=table,
                   ops_tolerance=base.any_ops, data=driver.per_n(), paper_rows=PAPER_ROWS)
