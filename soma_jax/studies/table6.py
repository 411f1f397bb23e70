"""The paper's Table 6 (its App. I, scaled down by SPEC 9.6): lr and initial-eps sensitivity of
the monolith (N = 1) and SOMA N = 2 at equal compute.

Table 7's pair (SOMA N = 2 and the monolith of the same total size, each continuing its own
equal-update seed run with its state) trained at each of the paper's five (lr, initial eps)
cells, given as factors of `base_lr` (the paper's base is 0.0025, this project's CPU base
too: 0.5x / 1x / 2x lr at 1x eps, then 0.5x lr at 0.5x and 2x eps). Every cell trains for
`budget` in `budget_unit` (updates at CPU scale, where both do equal operations per update:
equal compute, `protocol.check_equal_ops`), and all cells of a seed see the same batches and
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

from soma_jax import evaluate as eval_lib
from soma_jax.errors import UserError
from soma_jax.studies import protocol

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
  """The run folder of a cell: lr0.5x_eps1x (each factor exact: `protocol.exact`)."""
  return f"lr{protocol.exact(factors[0])}x_eps{protocol.exact(factors[1])}x"


def run(config: ml_collections.ConfigDict, out: str, command: str = "", executor=None) -> dict:
  """Seeds, then every architecture x seed x cell (one stage, by `executor`); writes
  OUT/results.json and OUT/table.md."""
  begun = protocol.started(executor)
  os.makedirs(out, exist_ok=True)
  plan = protocol.check_plan(config)  # every field, and every run resolved, before data
  cells = check_cells(config)
  methods = protocol.sized(config)
  if len(methods) != 2:
    raise UserError(f"study=table6 compares two architectures; config.methods has {len(methods)}")
  specs = protocol.check_runs(plan, methods)
  ops = protocol.check_equal_ops(specs, plan.ops_tolerance, plan.unit)
  ref, other = list(methods)
  data_dir = protocol.ensure_data(plan.data_dir, out, max(s.n_experts for s in specs.values()))
  val, test = protocol.eval_sets(plan.eval, data_dir, [s.seq_len for s in specs.values()])
  seeds = protocol.train_seeds(plan, methods, data_dir, out, val, executor)
  starts, described = {}, {}
  for name, c in methods.items():
    first = protocol.budgeted(c, data_dir, plan.seeds[0], seeds[plan.start[name]], plan.unit,
                              plan.budget, 1)
    starts[name] = protocol.start_losses(first, {"validation": val, "test": test})
    described[name] = {"method": first.method.name, "n_experts": first.n_experts,
                       "d_t": first.config.model.d_t, "params": first.method.ensemble_params,
                       "n_pert": first.config.spsa.n_pert, "batch": first.config.spsa.batch,
                       "ops_per_update": first.total_ops_per_update,
                       "start": protocol.start_of(seeds[plan.start[name]]),
                       "start_loss": {k: float(v.mean()) for k, v in starts[name].items()}}
  planned = {}
  for seed in plan.seeds:
    for name, c in methods.items():
      for factors, (lr, eps) in zip(cells.factors, cells.settings(), strict=True):
        cell = ml_collections.ConfigDict(c.to_dict())
        cell.opt.lr, cell.spsa.eps = lr, eps
        planned[(seed, name, factors)] = protocol.budgeted(
            cell, data_dir, seed, seeds[plan.start[name]], plan.unit, plan.budget, 1,
            f"methods.{name}.", score=val)
  where = lambda seed, name, factors: os.path.join(out, "runs", f"seed{seed}", name,
                                                   cell_name(factors))
  walls = protocol.train_all([(spec, where(*key), f"{key[1]} {cell_name(key[2])} (seed {key[0]})")
                              for key, spec in planned.items()], executor)
  finals = {}
  for (key, spec), wall in zip(planned.items(), walls, strict=True):
    workdir = where(*key)
    first = protocol.start_step(spec, seeds[plan.start[key[1]]])
    finals[key] = {"val": protocol.final_losses(workdir, spec, val), "wall": wall,
                   "workdir": protocol.shown(workdir, out), "_path": workdir,
                   **protocol.summary(workdir, spec, first)}
  measured = measure(cells, plan.seeds, list(methods), finals, planned, test, starts,
                     plan.bootstrap_draws)
  payload = protocol.results(
      "table6", "paper Table 6 (lr and initial eps sensitivity), scaled down by SPEC 9.6",
      plan, command, begun,
      {"unit": plan.unit, "per": "cell, architecture and seed", "seed_updates": plan.seed_updates,
       "ops_per_update": ops},
      (val, test), data_dir, out, seeds, paper=PAPER, other=other,
      architectures=described, measured=measured,
      selection="per seed and architecture, the cell with the lowest unrounded final "
                "ensemble-validation loss; its final checkpoint scored on test once")
  return protocol.write(out, payload, table)


def measure(cells: Cells, seeds: tuple[int, ...], names: list[str], finals: dict, planned: dict,
            test: eval_lib.TestSet, starts: dict, draws: int) -> dict:
  """Per cell: each architecture's per-seed final validation loss, mean +- sd, and the second
  architecture minus the first; per seed and architecture: the selected cell and its test
  loss (scored here, once)."""
  ref, other = names
  rows = []
  for factors, (lr, eps) in zip(cells.factors, cells.settings(), strict=True):
    per = {n: [float(finals[(s, n, factors)]["val"].mean()) for s in seeds] for n in names}
    rows.append({
        "lr": lr, "eps": eps, "lr_factor": factors[0], "eps_factor": factors[1],
        "validation": {n: {**protocol.across_seeds(v), "per_seed": v} for n, v in per.items()},
        "other_minus_ref": protocol.t_interval(
            [b - a for a, b in zip(per[ref], per[other], strict=True)]),
        "updates": {n: [finals[(s, n, factors)]["updates"] for s in seeds] for n in names},
        "workdirs": {n: [finals[(s, n, factors)]["workdir"] for s in seeds] for n in names}})
  selected = {n: [] for n in names}
  tests = {}
  for s in seeds:
    for n in names:
      i = best_cell([r["validation"][n]["per_seed"][seeds.index(s)] for r in rows], n, s)
      key = (s, n, cells.factors[i])
      tests[(s, n)] = protocol.final_losses(finals[key]["_path"], planned[key], test)
      selected[n].append({
          "seed": s, "lr": rows[i]["lr"], "eps": rows[i]["eps"], "cell": i,
          "val_nats_per_byte": rows[i]["validation"][n]["per_seed"][seeds.index(s)],
          "test_nats_per_byte": float(tests[(s, n)].mean()),
          "test_gain": float(starts[n]["test"].mean() - tests[(s, n)].mean())})
  diff = [protocol.paired(tests[(s, ref)], tests[(s, other)], test.doc_ids, draws, s)
          for s in seeds]
  return {"cells": rows, "selected": selected,
          "selected_test": {n: protocol.across_seeds([q["test_nats_per_byte"] for q in v])
                            for n, v in selected.items()},
          "selected_test_other_minus_ref": {
              **protocol.t_interval([d["diff"] for d in diff]),
              "per_seed": diff,
              "how": "per seed, the selected cells' test losses on the same windows, other minus "
                     "ref, with a paired document-bootstrap CI; across seeds a t interval"}}


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
      "an equal GPU budget, its own ensemble validation set. " + protocol.load_line(p), "",
      "| lr | initial eps | N = 1 (ours) | N = 2 (ours) | N=1 − N=2 (ours, 95% t) | "
      "N = 1 (paper) | N = 2 (paper) | paper lr / eps |",
      "|---|---|---|---|---|---|---|---|"]
  paper = {(c["lr"] / PAPER["base_lr"], c["eps"] / PAPER["base_lr"]): c for c in PAPER["cells"]}
  for r in m["cells"]:
    q = paper.get((r["lr_factor"], r["eps_factor"]))
    ours = {n: protocol.pm(r["validation"][n], digits=4) for n in (ref, other)}
    theirs = ("- | - | -" if q is None else
              f"{q['n1'][0]:.4f} ± {q['n1'][1]:.4f} | {q['n2'][0]:.4f} ± {q['n2'][1]:.4f} | "
              f"{q['lr']:g} / {q['eps']:g}")
    lines.append(f"| {r['lr']:g} | {r['eps']:g} | {ours[other]} | {ours[ref]} | "
                 f"{protocol.ci(r['other_minus_ref'], digits=4)} | {theirs} |")
  sel = m["selected"]
  lines += ["", "Selected per seed (lowest unrounded validation), test scored once:", "",
            "| seed | " + f"{other} lr / eps | {other} test | {ref} lr / eps | {ref} test | "
            f"{other} − {ref} test [paired document 95%] |", "|---|---|---|---|---|---|"]
  for a, b, d in zip(sel[other], sel[ref], m["selected_test_other_minus_ref"]["per_seed"],
                     strict=True):
    lines.append(f"| {a['seed']} | {a['lr']:g} / {a['eps']:g} | {a['test_nats_per_byte']:.4f} | "
                 f"{b['lr']:g} / {b['eps']:g} | {b['test_nats_per_byte']:.4f} | "
                 f"{d['diff']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] |")
  lines += ["", f"Across seeds, {other} − {ref} on test at the selected cells: "
            f"{protocol.ci(m['selected_test_other_minus_ref'], digits=4)} (95% t)."]
  return "\n".join(lines) + "\n"
