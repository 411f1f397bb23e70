"""The lr selection the sweeps share (narrow, table4, table5; SPEC 9.8): each row's lr from a
grid of `lr_factors` around its own centre, each point trained on the first optimisation seed
from that seed's start for `select_fraction` of the row's budget, the lowest final validation
loss selected (`table7.Search`, the first in grid order on a tie), then fixed for every seed.

A study declares lr_factors (lr_extend, eps_factors, eps_extend: `table7.check_grid`) and
select_fraction (`FIELDS`) in its config and checks them in its `check`; its stages build each
row's run at the first seed (`searches`), yield them (`selecting`), and plan every seed at the
chosen (lr, eps) (`fixed`). results.json `selection` (`report`): per row the seed, the chosen
lr and eps, the lr grid, whether the choice is at the grid's edge, and every candidate's
validation loss; table.md (`lines`).
"""

from __future__ import annotations

import os

from soma_jax import evaluate as eval_lib
from soma_jax import spec as spec_lib
from soma_jax.studies import base, planning, results, table7, training

FIELDS = {"select_fraction": ("a number in (0, 1]", lambda v: isinstance(v, int | float)
                              and not isinstance(v, bool) and 0 < v <= 1)}
RULE = ("each row's lr from lr_factors x its centre (eps at the centre), every point trained "
        "on the first optimisation seed from that seed's start for select_fraction of the "
        "row's budget; the lowest final validation loss selected (the first in grid order on "
        "a tie), then fixed for every seed")


def tuning(grid: table7.Grid, fraction: float) -> dict:
  """results.json `tuning`: the grid's factors, select_fraction and the rule."""
  record = {k: v for k, v in grid.record().items() if k != "base_lr"}
  return {**record, "select_fraction": fraction, "selection": RULE}


def start(spec: spec_lib.RunSpec, seed_run: dict, val: float) -> dict:
  """A search's start: {step: the seed step `spec` continues (`training.start_step`), val:
  its validation loss there}."""
  return {"step": training.start_step(spec, seed_run), "val": val}


def searches(grid: table7.Grid, specs: dict[str, spec_lib.RunSpec], starts: dict[str, dict],
             centres: dict[str, float], scorers: dict[str, eval_lib.TestSet], root: str
             ) -> dict[str, table7.Search]:
  """{row: its search}: `specs[row]` (the row's run at the first seed for its selection
  budget) on the grid around `centres[row]`, continuing `starts[row]` = {step, val} (the
  seed step and its validation loss), scored on `scorers[row]`, into ROOT/ROW/lrX_epsY."""
  return {name: table7.Search(spec, grid, os.path.join(root, name), f"select {name}",
                              starts[name], base=centres[name], scorer=scorers[name])
          for name, spec in specs.items()}


def selecting(found: dict[str, table7.Search]) -> base.Stages:
  """Every search to its end (`table7.searching`, each on its own scorer); {row: (lr, eps)}."""
  yield from table7.searching(list(found.values()), None)
  return chosen(found)


def chosen(found: dict[str, table7.Search]) -> dict[str, tuple[float, float]]:
  """{row: its selected (lr, eps)}."""
  return {name: (s.result()[0]["lr"], s.result()[0]["eps"]) for name, s in found.items()}


def fixed(planned: dict[tuple[int, str], spec_lib.RunSpec], lrs: dict[str, tuple[float, float]]
          ) -> dict[tuple[int, str], spec_lib.RunSpec]:
  """Every (seed, row)'s run at its row's selected (lr, eps)."""
  return {(seed, name): table7.grid_point(spec, *lrs[name])
          for (seed, name), spec in planned.items()}


def report(found: dict[str, table7.Search], out: str) -> dict:
  """results.json `selection`: each row's search (the first seed at select_fraction of its
  budget): the chosen lr and eps, the lr grid, whether the lr is at its edge, every point's
  final validation loss and folder."""
  got = {}
  for name, search in found.items():
    best, tried, grid = search.result()
    got[name] = {"seed": search.spec.config.seed, "lr": best["lr"], "eps": best["eps"],
                 "lr_grid": grid["lr_grid"], "lr_at_edge": grid["lr_at_edge"],
                 "updates": best["updates"],
                 "configurations": [{"lr": r["lr"], "eps": r["eps"],
                                     "val_nats_per_byte": r["val_nats_per_byte"],
                                     "workdir": planning.shown(r["workdir"], out)} for r in tried]}
  return got


def edges(selected: dict) -> str:
  """The rows whose chosen lr sits at its grid's edge, read from results.json `selection`:
  "lr at its grid's edge: a (low), b (high)", or "every lr inside its grid"."""
  at = [f"{name} ({'low' if s['lr'] == min(s['lr_grid']) else 'high'})"
        for name, s in selected.items() if s["lr_at_edge"]]
  return (f"lr at its grid's edge in {len(at)} of {len(selected)} rows: {', '.join(at)}"
          if at else "every lr inside its grid")


def lines(selected: dict, tune: dict) -> list[str]:
  """table.md: how the lrs were selected, then per row its grid's validation losses and the
  choice (* at the grid's edge)."""
  fraction, factors = tune["select_fraction"], ", ".join(f"{f:g}x" for f in tune["lr_factors"])
  seeds = {s["seed"] for s in selected.values()}
  out = [f"lr: each row's own grid ({factors} its centre, eps at the centre) on seed "
         f"{', '.join(map(str, sorted(seeds)))} at {fraction:g} of its budget, selected on "
         "validation, then fixed for every seed; * = selected at the grid's edge.", "",
         *results.head("| row | lr: validation at each candidate | selected lr |")]
  for name, s in selected.items():
    cands = "; ".join(f"{r['lr']:g}: {r['val_nats_per_byte']:.4f}"
                      for r in sorted(s["configurations"], key=lambda r: r["lr"]))
    out.append(f"| {name} | {cands} | {s['lr']:g}{'*' if s['lr_at_edge'] else ''} |")
  return out
