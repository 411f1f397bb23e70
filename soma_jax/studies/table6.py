"""The paper's Table 6 (its App. I, scaled down by SPEC 9.6): lr and initial-eps sensitivity of
the monolith (N = 1) and SOMA N = 2 at equal compute.

Table 7's pair (SOMA N = 2 and the monolith of the same total size, each continuing its own
equal-update seed run with its state) trained at each of the paper's five (lr, initial eps)
cells, given as factors of `base_lr` (the paper's base is 0.0025, this project's CPU base
too: 0.5x / 1x / 2x lr at 1x eps, then 0.5x lr at 0.5x and 2x eps). Every cell trains for
`budget` in `budget_unit` (updates at CPU scale, where both do equal operations per update:
equal compute, `planning.check_equal_ops`), and all cells of a seed see the same batches and
directions (lr and eps change no random draw). Reported per cell and architecture: the final
ensemble-validation loss, mean +- sample sd over the optimisation seeds (the paper's
entries), the monolith minus SOMA per cell with its t interval across seeds; per seed the
cell with the lowest unrounded validation loss, its test loss scored once, as the paper's
selection. results.json `paper` carries the paper's table beside ours (`measured`).
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  paper,
  planning,
  recipes,
  results,
  scores,
  statistics,
  training,
)
from soma_jax.studies.verdict import Interval, from_stat

# The paper's Table 6 (../shared/paper/figures-and-tables.txt): ensemble-validation loss,
# mean +- sample sd over three optimisation seeds, nats/byte, at an equal aggregate GPU
# budget per configuration.
PAPER = {
    "item": "Table 6",
    "caption": "Learning-rate and initial eps sensitivity at an equal aggregate GPU compute "
               "budget per configuration; mean +- sample sd across three optimisation seeds "
               "(nats/byte, ensemble validation); selection uses each seed's unrounded "
               "validation losses",
    "base_lr": 0.0025,
    "cells": [
        {"lr": 0.00125, "eps": 0.00250, "n1": [2.2768, 0.0040], "n2": [2.2370, 0.0034]},
        {"lr": 0.00250, "eps": 0.00250, "n1": [2.3247, 0.0149], "n2": [2.2708, 0.0025]},
        {"lr": 0.00500, "eps": 0.00250, "n1": [2.4179, 0.0267], "n2": [2.3379, 0.0073]},
        {"lr": 0.00125, "eps": 0.00125, "n1": [2.2764, 0.0040], "n2": [2.2370, 0.0034]},
        {"lr": 0.00125, "eps": 0.00500, "n1": [2.2811, 0.0048], "n2": [2.2404, 0.0033]},
    ],
    "seeds": 3,
}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=table6 (the paper's Table 6): Table 7's pair, seeds, budget and scoring at the
  paper's five (lr, initial eps) cells, no search.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table6,size=cpu --out=runs/table6
  """
  c, a = recipes.paper_study(arg)
  cpu = a["size"] == "cpu"
  c.seeds = a["seeds"] or (3 if cpu else 2)  # the paper's three
  c.curve_points = 1  # each cell's final checkpoint is all the table reads
  # (lr factor, initial eps factor) of base_lr: the paper's cells over its base 0.0025, which
  # is this project's CPU base_lr too (0.00125 / 0.0025, 0.0025 / 0.0025, 0.005 / 0.0025,
  # 0.00125 / 0.00125, 0.00125 / 0.005)
  c.cells = ((0.5, 1.0), (1.0, 1.0), (2.0, 1.0), (0.5, 0.5), (0.5, 2.0))
  return c


@dataclasses.dataclass(frozen=True)
class Cells:
  """The (lr, initial eps) cells, each a pair of factors of `base_lr` (`check_cells`)."""
  base_lr: float
  factors: tuple[tuple[float, float], ...]

  def settings(self) -> list[tuple[float, float]]:
    """Each cell's (lr, eps)."""
    return [(self.base_lr * f, self.base_lr * g) for f, g in self.factors]


def check_cells(config: ml_collections.ConfigDict) -> Cells:
  """config.cells: distinct pairs of positive factors (lr, eps) of base_lr."""
  cells = config.get("cells")
  fix = "fix: --config.cells='((0.5, 1.0), (1.0, 1.0), (2.0, 1.0))' (lr, eps factors of base_lr)"
  try:
    pairs = tuple((float(f), float(g)) for f, g in cells)
  except (TypeError, ValueError):
    raise UserError(f"cells={cells!r} must be (lr factor, eps factor) pairs; {fix}") from None
  if not pairs or any(not (f > 0 and g > 0 and np.isfinite(f) and np.isfinite(g))
                      for f, g in pairs):
    raise UserError(f"cells={cells!r} must be a non-empty tuple of positive finite factor pairs; "
                    f"{fix}")
  if len(set(pairs)) != len(pairs):
    raise UserError(f"cells={cells!r} names a cell twice; {fix}")
  return Cells(float(config.base_lr), pairs)


def cell_name(factors: tuple[float, float]) -> str:
  """The run folder of a cell: lr0.5x_eps1x (each factor exact: `planning.exact`)."""
  return f"lr{planning.exact(factors[0])}x_eps{planning.exact(factors[1])}x"


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Cells:
  """The cells (`check_cells`), and exactly two architectures."""
  del plan
  cells = check_cells(config)
  if len(config.methods) != 2:
    raise UserError(f"study={STUDY.name} compares two architectures; config.methods has "
                    f"{len(config.methods)}")
  return cells


def describe(first: spec_lib.RunSpec, seed: dict, start: dict) -> dict:
  """An architecture's record: its shape, cost and start."""
  return {"method": first.method.name, "n_experts": first.n_experts,
          "d_t": first.config.model.d_t, "params": first.method.ensemble_params,
          "n_pert": first.config.spsa.n_pert, "batch": first.config.spsa.batch,
          "ops_per_update": first.total_ops_per_update, "start": training.start_of(seed),
          "start_loss": {k: float(v.mean()) for k, v in start.items()}}


def planned_cells(cells: Cells, ready: base.Setup) -> dict:
  """{(seed, architecture, factors): the budgeted run of that cell}."""
  plan, planned = ready.plan, {}
  for seed in plan.seeds:
    for name, c in ready.methods.items():
      for factors, (lr, eps) in zip(cells.factors, cells.settings(), strict=True):
        cell = ml_collections.ConfigDict(c.to_dict())
        cell.opt.lr, cell.spsa.eps = lr, eps
        planned[(seed, name, factors)] = training.budgeted(
            cell, ready.data_dir, seed, ready.seeds[plan.start[name]], plan.unit, plan.budget,
            1, f"methods.{name}.", score=ready.scored[0])
  return planned


def stages(cells: Cells, ready: base.Setup) -> base.Stages:
  """Each architecture's start scored, every architecture x seed x cell in one stage, their
  final validation losses, then each seed's selected cell scored on test, once."""
  plan, (val, test), seeds, out = ready.plan, ready.scored, ready.seeds, ready.out
  starts, described = {}, {}
  for name, c in ready.methods.items():
    first = training.budgeted(c, ready.data_dir, plan.seeds[0], seeds[plan.start[name]],
                              plan.unit, plan.budget, 1)
    starts[name] = scores.start_losses(first, {"validation": val, "test": test})
    described[name] = describe(first, seeds[plan.start[name]], starts[name])
  planned = planned_cells(cells, ready)
  where = lambda seed, name, factors: os.path.join(out, "runs", f"seed{seed}", name,
                                                   cell_name(factors))
  walls = yield [(spec, where(*key), f"{key[1]} {cell_name(key[2])} (seed {key[0]})")
                 for key, spec in planned.items()]
  finals = {}
  for (key, spec), wall in zip(planned.items(), walls, strict=True):
    workdir = where(*key)
    first = training.start_step(spec, seeds[plan.start[key[1]]])
    finals[key] = {"val": scores.final_losses(workdir, spec, val), "wall": wall,
                   "workdir": planning.shown(workdir, out), "_path": workdir,
                   **scores.summary(workdir, spec, first)}
  rows = cell_rows(cells, plan.seeds, list(ready.methods), finals)
  picks = picked(cells, plan.seeds, list(ready.methods), rows)
  tests = {sn: scores.final_losses(finals[key]["_path"], planned[key], test)  # once
           for sn, key in picks.items()}
  return described, rows, picks, tests, starts


def cell_rows(cells: Cells, seeds: tuple[int, ...], names: list[str], finals: dict) -> list:
  """Per cell: each architecture's per-seed final validation loss, mean +- sd, and the second
  architecture minus the first."""
  ref, other = names
  rows = []
  for factors, (lr, eps) in zip(cells.factors, cells.settings(), strict=True):
    per = {n: [float(finals[(s, n, factors)]["val"].mean()) for s in seeds] for n in names}
    rows.append({
        "lr": lr, "eps": eps, "lr_factor": factors[0], "eps_factor": factors[1],
        "validation": {n: {**statistics.across_seeds(v), "per_seed": v} for n, v in per.items()},
        "other_minus_ref": statistics.t_interval(
            [b - a for a, b in zip(per[ref], per[other], strict=True)]),
        "updates": {n: [finals[(s, n, factors)]["updates"] for s in seeds] for n in names},
        "workdirs": {n: [finals[(s, n, factors)]["workdir"] for s in seeds] for n in names}})
  return rows


def picked(cells: Cells, seeds: tuple[int, ...], names: list[str], rows: list) -> dict:
  """{(seed, architecture): the key of its selected cell (`best_cell`)}."""
  return {(s, n): (s, n, cells.factors[best_cell(
      [r["validation"][n]["per_seed"][seeds.index(s)] for r in rows], n, s)])
      for s in seeds for n in names}


def measure(cells: Cells, ready: base.Setup, gathered: tuple) -> dict:
  """Per seed and architecture: the selected cell and its test loss; the second
  architecture minus the first on test (paired per seed, t interval across seeds)."""
  described, rows, picks, tests, starts = gathered
  plan, test = ready.plan, ready.scored[1]
  seeds, (ref, other) = plan.seeds, list(ready.methods)
  selected = {n: [] for n in (ref, other)}
  for s in seeds:
    for n in (ref, other):
      i = cells.factors.index(picks[(s, n)][2])
      selected[n].append({
          "seed": s, "lr": rows[i]["lr"], "eps": rows[i]["eps"], "cell": i,
          "val_nats_per_byte": rows[i]["validation"][n]["per_seed"][seeds.index(s)],
          "test_nats_per_byte": float(tests[(s, n)].mean()),
          "test_gain": float(starts[n]["test"].mean() - tests[(s, n)].mean())})
  diff = [statistics.paired(tests[(s, ref)], tests[(s, other)], test.doc_ids,
                            plan.bootstrap_draws, s) for s in seeds]
  measured = {"cells": rows, "selected": selected,
              "selected_test": {n: statistics.across_seeds([q["test_nats_per_byte"] for q in v])
                                for n, v in selected.items()},
              "selected_test_other_minus_ref": {
                  **statistics.t_interval([d["diff"] for d in diff]),
                  "per_seed": diff,
                  "how": "per seed, the selected cells' test losses on the same windows, other "
                         "minus ref, with a paired document-bootstrap CI; across seeds a t "
                         "interval"}}
  return {"budget": {"unit": plan.unit, "per": "cell, architecture and seed",
                     "seed_updates": plan.seed_updates, "ops_per_update": ready.ops},
          "paper": PAPER, "other": other, "architectures": described, "measured": measured,
          "selection": "per seed and architecture, the cell with the lowest unrounded final "
                       "ensemble-validation loss; its final checkpoint scored on test once"}


def best_cell(losses: list[float], name: str, seed: int) -> int:
  """The cell with the lowest validation loss, a non-finite one never chosen (a diverged
  cell's NaN is no minimum); a UserError where no cell has a finite loss."""
  x = np.asarray(losses, np.float64)
  if not np.isfinite(x).any():
    raise UserError(f"every cell of {name} at seed {seed} ended with a non-finite validation "
                    f"loss ({', '.join(map(str, losses))}): no cell can be selected; fix: "
                    "--config.cells= smaller lr and eps factors, or --config.base_lr= lower")
  return int(np.argmin(np.where(np.isfinite(x), x, np.inf)))


def table(p: dict) -> str:
  """Markdown: the paper's layout (lr, eps, N = 1, N = 2) with its values beside ours."""
  ref, other, m = p["reference"], p["other"], p["measured"]
  arch = p["architectures"]
  n_seeds = len(p["seeds"])
  lines = [
      f"Table 6 protocol at this scale: {other} (N = {arch[other]['n_experts']}, width "
      f"{arch[other]['d_t']}) and {ref} (N = {arch[ref]['n_experts']}, width "
      f"{arch[ref]['d_t']}), each cell {p['budget']['amount']:g} {p['budget']['unit']} from its "
      f"seed ({p['budget']['seed_updates']} updates, state continued); final ensemble-"
      f"validation loss, mean ± sample sd over {n_seeds} seeds ({p['eval']['val_windows_scored']} "
      f"windows, {p['eval']['val_windows']} pieces, from {p['eval']['val_documents']} documents; "
      f"starts: {other} {arch[other]['start_loss']['validation']:.4f}, {ref} "
      f"{arch[ref]['start_loss']['validation']:.4f}). Paper: 8.44M-parameter models, "
      "an equal GPU budget, its own ensemble validation set. " + results.load_line(p), "",
      *results.head("| lr | initial eps | N = 1 (ours) | N = 2 (ours) | N=1 − N=2 (ours, 95% t) | "
                    "N = 1 (paper) | N = 2 (paper) | paper lr / eps |")]
  paper = {(c["lr"] / PAPER["base_lr"], c["eps"] / PAPER["base_lr"]): c for c in PAPER["cells"]}
  for r in m["cells"]:
    q = paper.get((r["lr_factor"], r["eps_factor"]))
    ours = {n: results.pm(r["validation"][n], digits=4) for n in (ref, other)}
    theirs = ("- | - | -" if q is None else
              f"{q['n1'][0]:.4f} ± {q['n1'][1]:.4f} | {q['n2'][0]:.4f} ± {q['n2'][1]:.4f} | "
              f"{q['lr']:g} / {q['eps']:g}")
    lines.append(f"| {r['lr']:g} | {r['eps']:g} | {ours[other]} | {ours[ref]} | "
                 f"{results.ci(r['other_minus_ref'], digits=4)} | {theirs} |")
  sel = m["selected"]
  lines += ["", "Selected per seed (lowest unrounded validation), test scored once:", "",
            *results.head(f"| seed | {other} lr / eps | {other} test | {ref} lr / eps | "
                          f"{ref} test | {other} − {ref} test [paired document 95%] |")]
  for a, b, d in zip(sel[other], sel[ref], m["selected_test_other_minus_ref"]["per_seed"],
                     strict=True):
    lines.append(f"| {a['seed']} | {a['lr']:g} / {a['eps']:g} | {a['test_nats_per_byte']:.4f} | "
                 f"{b['lr']:g} / {b['eps']:g} | {b['test_nats_per_byte']:.4f} | "
                 f"{d['diff']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] |")
  lines += ["", f"Across seeds, {other} − {ref} on test at the selected cells: "
            f"{results.ci(m['selected_test_other_minus_ref'], digits=4)} (95% t)."]
  return "\n".join(lines) + "\n"


def primary_table6(d: dict) -> tuple[Interval, ...]:
  return (from_stat("N = 1 − N = 2", d["measured"]["selected_test_other_minus_ref"]),)


def ours_table6(d: dict) -> str:
  m = d["measured"]
  best = min(m["cells"], key=lambda r: r["validation"]["mono"]["mean"])
  return (f"best N = 1 cell lr {best['lr']:g} / eps {best['eps']:g}: "
          f"{best['validation']['mono']['mean']:.4f} vs N = 2 "
          f"{best['validation']['soma_n2']['mean']:.4f}; selected test N=1 − N=2 "
          f"{paper.ci(m['selected_test_other_minus_ref'], 4)} (t over 3 seeds)")


PAPER_ROWS = (paper.StudyRow(
    "Table 6", "lr and initial eps sensitivity, N = 1 and 2", ours_table6, "N = 1 2.2768, N = 2 "
    "2.2370 at lr 0.00125 / eps 0.0025; N = 2 lower in every cell", "82k params; 1,000 updates "
    "per cell", primary_table6, paper_brief="N = 2 lower in every cell"),)

STUDY = base.Study(name="table6",
                   spec="paper Table 6 (lr and initial eps sensitivity), scaled down by SPEC 9.6",
                   config=config, check=check, stages=stages, measure=measure, table=table,
                   paper_rows=PAPER_ROWS)
