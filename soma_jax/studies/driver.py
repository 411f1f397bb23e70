"""The one driver of the studies (`base.Study`): start, the plan's checks, sizing, the data
sets, the seed runs, each stage's runs through the executor, the study's measure, results.json,
table.md and figures. Only `run` and `checked` take a raw config (the study's `check` reads it
once into its typed grid; everything after holds the plan and the grid)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ml_collections

from soma_jax import evaluate as eval_lib
from soma_jax.studies import base, datasets, planning, results, training


def one_dir(plan: planning.StudyPlan, specs: dict, out: str,
            scorers: tuple[eval_lib.TestSet, eval_lib.TestSet] | None = None) -> base.Data:
  """The study's one data dir (data_dir, or the built-in corpus prepared under OUT) for the
  largest N, and its evaluation sets (`scorers` in their place where given)."""
  n = max(s.n_experts for s in specs.values())
  data_dir = datasets.ensure_data(plan.data_dir, out, n)
  sets = scorers or datasets.eval_sets(plan.eval, data_dir, [s.seq_len for s in specs.values()])
  return base.Data({n: data_dir}, {n: sets}, n, n)


def per_n(main: Callable[[Any], int] = lambda grid: 1) -> Callable[..., base.Data]:
  """The `data` hook of a study whose rows differ in N: each N's data dir prepared from the
  grid's corpus (grid.source, grid.prepare) into N shards under OUT, all scored on the same
  windows (`datasets.per_n_sets`); the seeds train on N = 1's; results.json records the
  dir and sets of N = main(grid)."""
  def data(grid, plan: planning.StudyPlan, specs: dict, out: str) -> base.Data:
    dirs, sets = datasets.per_n_sets(plan.eval, specs, grid.source, grid.prepare, out)
    return base.Data(dirs, sets, main(grid), 1)
  return data


def preparing(study: base.Study, grid, plan: planning.StudyPlan, out: str,
              scorers: tuple[eval_lib.TestSet, eval_lib.TestSet] | None = None,
              checkpoints: int = 1) -> base.Stages:
  """Every method sized and resolved (and their operations per update checked) before the
  data is prepared, the evaluation sets, and the seed runs yielded as one stage (`checkpoints`
  each, `training.seed_stage`); the Setup. A study that sets up one comparison per rung
  yields from it (`setup`: the same, trained by an executor)."""
  methods = planning.sized(plan.config)
  specs = training.check_runs(plan, methods)
  ops = planning.check_equal_ops(specs, study.ops_tolerance(grid, plan), plan.unit)
  data = (one_dir(plan, specs, out, scorers) if study.data is None
          else study.data(grid, plan, specs, out))
  jobs, records = training.seed_stage(plan, specs, data.dirs[data.seeds], out,
                                      data.sets[data.seeds][0], checkpoints)
  seeds = records((yield jobs))
  return base.Setup(plan, methods, specs, ops, data.dirs[data.main], data.sets[data.main],
                    seeds, out, data)


def setup(study: base.Study, grid, plan: planning.StudyPlan, out: str, executor=None,
          scorers: tuple[eval_lib.TestSet, eval_lib.TestSet] | None = None,
          checkpoints: int = 1) -> base.Setup:
  """`preparing`, its seed runs trained by `executor`."""
  return through(preparing(study, grid, plan, out, scorers, checkpoints), executor)


def through(stages: base.Stages, executor=None):
  """Each stage the study yields trained (`training.train_all` by `executor`), its walls sent
  back; what the study gathered once it returns."""
  try:
    jobs = next(stages)
    while True:
      jobs = stages.send(training.train_all(jobs, executor))
  except StopIteration as done:
    return done.value


def checked(study: base.Study, config: ml_collections.ConfigDict):
  """(the plan, the study's typed grid): every study field and run checked, before data."""
  plan = planning.check_plan(config) if study.planned else None
  return plan, study.check(plan, config)


def measured(study: base.Study, plan: planning.StudyPlan | None, grid, out: str, executor=None,
             scorers: tuple[eval_lib.TestSet, eval_lib.TestSet] | None = None
             ) -> tuple[base.Setup, dict]:
  """The checked study's setup and stages into OUT (`plan` and `grid` from `checked`); (setup,
  the study's measured fields with its `budget`)."""
  os.makedirs(out, exist_ok=True)
  ready = (setup(study, grid, plan, out, executor, scorers) if study.setup is None
           else study.setup(grid, plan, out, executor))
  gathered = through(study.stages(grid, ready), executor)
  return ready, study.measure(grid, ready, gathered)


def run(study: base.Study, config: ml_collections.ConfigDict, out: str, command: str = "",
        executor=None, scorers: tuple[eval_lib.TestSet, eval_lib.TestSet] | None = None
        ) -> dict:
  """Runs `study` with `config` into OUT (each stage's runs by `executor`; None: one after
  another here); writes OUT/results.json, OUT/table.md and its figures; the payload.
  `scorers` = (validation, test) replaces the data dir's own (tests)."""
  begun = results.started(executor)
  os.makedirs(out, exist_ok=True)
  plan, grid = checked(study, config)  # every field, and every run resolved, before data
  ready, fields = measured(study, plan, grid, out, executor, scorers)
  if len(ready.data.dirs) > 1:  # a study whose rows differ in N: each N's data dir
    fields["data_dirs"] = {n: planning.shown(d, out) for n, d in ready.data.dirs.items()}
  payload = (results.results(config.study, study.spec, ready.plan, command, begun,
                             fields.pop("budget"), ready.scored, ready.data_dir, out, ready.seeds,
                             **fields) if study.planned
             else results.common(config.study, study.spec, command, begun, out, **fields))
  if study.plot is not None:
    study.plot(payload, out)
  return results.write(out, payload, study.table)
