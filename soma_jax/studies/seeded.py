"""The stage the sweeps share (fig7, fig9, fig13, fig15, fig16, narrow, table4, table5): every
method at every optimisation seed, each continuing its seed run (`training.budgeted`; with
plan.own_starts, that seed's own: `training.seed_of`), trained as one stage into OUT/runs/seedS/NAME and
read back."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import ml_collections

from soma_jax import evaluate as eval_lib
from soma_jax import spec as spec_lib
from soma_jax.studies import base, planning, scores, training


def workdir(out: str, seed: int, name: str) -> str:
  """OUT/runs/seedS/NAME: method NAME's run at optimisation seed S."""
  return os.path.join(out, "runs", f"seed{seed}", name)


class Run(NamedTuple):
  """One trained run of a stage (`trained`)."""
  seed: int
  name: str
  spec: spec_lib.RunSpec
  workdir: str
  wall: float  # wall seconds of this call's training


def every_seed(ready: base.Setup, names, unit: str, amount: float,
               data: Callable[[str], Any] | None = None, starts: dict | None = None,
               score: bool = True, seeds: tuple[int, ...] | None = None,
               checkpoints: int | None = None) -> dict[tuple[int, str], spec_lib.RunSpec]:
  """{(seed, name): its run}, method by method, each at every optimisation seed (or `seeds`):
  continuing `starts[name]` (default its seed run at that seed, `training.seed_of`; None: a fresh init)
  to `amount` of `unit` with `checkpoints` (default plan.curve_points) on the data dir
  ready.data.dirs[data(name)] (default its N's), with fresh Adam moments where
  plan.fresh_optimizer names it; `score`: its checkpoints scored by training on that dir's
  validation set. A run of N > 1 experts continuing a seed run reads the seed's windows
  (init_from_other_data: the seed trained on the one-shard data)."""
  plan, dirs, sets = ready.plan, ready.data.dirs, ready.data.sets
  data = data or (lambda name: ready.specs[name].n_experts)
  planned = {}
  for name in names:
    c = ml_collections.ConfigDict(ready.methods[name].to_dict())
    for seed in plan.seeds if seeds is None else seeds:
      seed_run = training.seed_of(plan, ready.seeds, seed, name) if starts is None else starts[name]
      c.init_from_other_data = seed_run is not None and ready.specs[name].n_experts != 1
      planned[(seed, name)] = training.budgeted(
          c, dirs[data(name)], seed, seed_run, unit, amount, checkpoints or plan.curve_points,
          f"methods.{name}.", fresh=name in plan.fresh_optimizer,
          score=sets[data(name)][0] if score else None)
  return planned


def trained(planned: dict[tuple[int, str], spec_lib.RunSpec], out: str) -> base.Stages:
  """The planned runs yielded as one stage (each in OUT/runs/seedS/NAME); [Run] in their
  order once trained."""
  walls = yield [(spec, workdir(out, seed, name), f"{name} (seed {seed})")
                 for (seed, name), spec in planned.items()]
  return [Run(seed, name, spec, workdir(out, seed, name), wall)
          for ((seed, name), spec), wall in zip(planned.items(), walls, strict=True)]


def curve(run: Run, start: dict | None, scorer: eval_lib.TestSet, start_loss: float
          ) -> tuple[list[dict], Any]:
  """`scores.curve` of a run continuing the seed run record `start`: its start at the seed's
  step with `start_loss`, then each checkpoint scored by `scorer`."""
  return scores.curve(run.workdir, run.spec, scorer, training.start_step(run.spec, start),
                      start_loss)


def record(run: Run, out: str, **fields) -> dict:
  """A run's per-seed record: its seed, `fields`, this call's wall seconds and its folder."""
  return {"seed": run.seed, **fields, "wall_seconds_this_call": run.wall,
          "workdir": planning.shown(run.workdir, out)}
