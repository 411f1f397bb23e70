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
operations (the paper: 50, 75 and 100 GPU-hours, interpolated between checkpoints). Reported per
N and budget: SOMA beside BPTT, mean +- sample sd over the optimisation seeds; results.json
`paper` carries the paper's table.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax.errors import UserError
from soma_jax.studies import protocol

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


@dataclasses.dataclass(frozen=True)
class Grid:
  """The study's own fields (`check`): the plan, which rows are which (N, optimiser), the
  budget fractions read, the corpus."""
  plan: protocol.StudyPlan
  rows: dict  # {method: (N, "soma" | "bptt")}
  fractions: tuple[float, ...]
  source: str
  prepare: dict


def check(config: ml_collections.ConfigDict) -> Grid:
  """The plan (every method resolved), one SOMA and one BPTT row per N, the fractions."""
  plan = protocol.check_plan(config)
  if plan.unit != "updates":
    raise UserError(f"budget_unit={plan.unit!r}: table5's budget is `budget` updates of the "
                    "reference, run as their operations by every row; fix: "
                    "--config.budget_unit=updates")
  fractions = protocol.check_fractions(config, "budget_fractions", "(0.5, 0.75, 1.0)")
  protocol.check_source(config)
  rows = {}
  for name, c in config.methods.items():
    gradient = protocol.resolved(c, f"methods.{name}.").method.describe["gradient"]
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
  return Grid(plan, rows, fractions, config.source, dict(config.get("prepare", {}).items()))


def run(config: ml_collections.ConfigDict, out: str, command: str = "", executor=None) -> dict:
  """Seeds (on the one-shard data dir), then every row at every optimisation seed (one stage,
  by `executor`); OUT/results.json and OUT/table.md."""
  begun = protocol.started(executor)
  os.makedirs(out, exist_ok=True)
  grid = check(config)
  plan = grid.plan
  methods = protocol.sized(config)
  specs = protocol.check_runs(plan, methods)
  ops_budget = plan.budget * specs[plan.reference].total_ops_per_update
  dirs, scored = protocol.per_n_sets(plan.eval, specs, grid.source, grid.prepare, out)
  seeds = protocol.train_seeds(plan, methods, dirs[1], out, scored[1][0], executor)
  planned, starts = {}, {}
  for name, c in methods.items():
    c = ml_collections.ConfigDict(c.to_dict())
    n = grid.rows[name][0]
    c.init_from_other_data = n != 1  # the seed's windows, cut into N shards
    for seed in plan.seeds:
      planned[(seed, name)] = protocol.budgeted(
          c, dirs[n], seed, seeds[plan.start[name]], "ops", ops_budget, plan.curve_points,
          f"methods.{name}.", fresh=name in plan.fresh_optimizer, score=scored[n][0])
    starts[name] = protocol.start_losses(planned[(plan.seeds[0], name)],
                                         {"validation": scored[n][0]})["validation"].mean()
  where = lambda seed, name: os.path.join(out, "runs", f"seed{seed}", name)
  walls = protocol.train_all([(spec, where(*key), f"{key[1]} (seed {key[0]})")
                              for key, spec in planned.items()], executor)
  curves = {}
  for (key, spec), wall in zip(planned.items(), walls, strict=True):
    seed, name = key
    first = protocol.start_step(spec, seeds[plan.start[name]])
    points, _ = protocol.curve(where(*key), spec, scored[grid.rows[name][0]][0], first,
                               starts[name])
    curves[key] = {"seed": seed, "curve": points, "wall_seconds_this_call": wall,
                   "workdir": protocol.shown(where(*key), out)}
  measured = measure(grid, methods, specs, planned, curves, starts, ops_budget)
  val, test = scored[1]
  payload = protocol.results(
      "table5", "paper Table 5 (SOMA against BPTT at N = 1, 2, 8), scaled down by SPEC 9.6",
      plan, command, begun,
      {"unit": "ops", "amount": ops_budget, "per": "row and seed",
       "reference_updates": plan.budget, "seed_updates": plan.seed_updates,
       "fractions": list(grid.fractions)},
      (val, test), dirs[1], out, seeds, paper=PAPER, measured=measured,
      data_dirs={n: protocol.shown(d, out) for n, d in dirs.items()},
      how="each row's ensemble-validation curve (start and checkpoints) interpolated linearly "
          "in operations at each fraction of the budget; mean +- sample sd over seeds")
  return protocol.write(out, payload, table)


def at_budget(points: list[dict], ops: float) -> float:
  """A curve's loss at `ops` operations, linear between its points."""
  x = np.array([p["ops"] for p in points], np.float64)
  y = np.array([p["loss"] for p in points], np.float64)
  return float(np.interp(ops, x, y))


def measure(grid: Grid, methods: dict, specs: dict, planned: dict, curves: dict, starts: dict,
            ops_budget: float) -> dict:
  """{rows: each row's description and per-seed curves, cells: {N: {fraction: {soma, bptt,
  bptt_minus_soma}}}}."""
  plan, rows = grid.plan, {}
  for name in methods:
    spec = planned[(plan.seeds[0], name)]
    per = [curves[(s, name)] for s in plan.seeds]
    rows[name] = {"n_experts": grid.rows[name][0], "optimizer": grid.rows[name][1],
                  "method": spec.method.name, "d_t": spec.config.model.d_t,
                  "params": spec.method.ensemble_params, "lr": spec.lr,
                  "ops_per_update": specs[name].total_ops_per_update,
                  "optimizer_state": ("fresh (the seed's parameters only)"
                                      if name in plan.fresh_optimizer else "the seed's, continued"),
                  "start_loss": float(starts[name]), "per_seed": per,
                  "at": {f: [at_budget(q["curve"], f * ops_budget) for q in per]
                         for f in grid.fractions}}
  cells = {}
  for n in sorted({n for n, _ in grid.rows.values()}):
    by = {kind: name for name, (m, kind) in grid.rows.items() if m == n}
    cells[n] = {}
    for f in grid.fractions:
      soma, bptt = rows[by["soma"]]["at"][f], rows[by["bptt"]]["at"][f]
      cells[n][f] = {"ops": f * ops_budget, "soma": protocol.across_seeds(soma),
                     "bptt": protocol.across_seeds(bptt),
                     "bptt_minus_soma": protocol.t_interval(
                         [b - a for a, b in zip(soma, bptt, strict=True)])}
  return {"rows": rows, "cells": {str(n): {str(f): v for f, v in c.items()}
                                  for n, c in cells.items()}}


def table(p: dict) -> str:
  """Markdown in the paper's layout: one line per N, SOMA beside BPTT at each budget."""
  m, b = p["measured"], p["budget"]
  fr = b["fractions"]
  lines = [f"Table 5 protocol at this scale: per N, SOMA and BPTT of equal total size from one "
           f"seed run ({b['seed_updates']} updates; BPTT with fresh Adam), {b['amount']:.4g} "
           f"operations per row and seed ({b['reference_updates']:g} updates of "
           f"{p['reference']}), {len(p['seeds'])} seeds; ensemble validation "
           f"({p['eval']['val_windows_scored']} windows from {p['eval']['val_documents']} "
           f"documents), mean ± sample sd. " + protocol.load_line(p), "",
           "| N | " + " | ".join(f"SOMA {f:g} | BPTT {f:g}" for f in fr)
           + " | paper SOMA / BPTT at 50 / 75 / 100 GPU-hours |",
           "|---|" + "---|---|" * len(fr) + "---|"]
  for n, cells in m["cells"].items():
    paper = PAPER["rows"].get(n)
    theirs = ("-" if paper is None else " ; ".join(
        f"{a:.4f} / {z:.4f}" for a, z in zip(paper["soma"], paper["bptt"], strict=True)))
    lines.append(f"| {n} | " + " | ".join(
        f"{protocol.pm(cells[str(f)]['soma'], digits=4)} | "
        f"{protocol.pm(cells[str(f)]['bptt'], digits=4)}" for f in fr) + f" | {theirs} |")
  lines += ["", "Budgets are fractions of the operations budget (columns); rows:", "",
            "| row | N | optimiser | width | params | lr | ops / update | start |",
            "|---|---|---|---|---|---|---|---|"]
  for name, r in m["rows"].items():
    lines.append(f"| {name} | {r['n_experts']} | {r['optimizer']} | {r['d_t']} | "
                 f"{r['params']:,} | {r['lr']:g} | {r['ops_per_update']:.3g} | "
                 f"{r['start_loss']:.4f} |")
  return "\n".join(lines) + "\n"
