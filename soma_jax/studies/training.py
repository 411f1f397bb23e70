"""A study's runs (SPEC 9.6): each budgeted run's config, every run checked before any
trains, the seed runs, and each stage trained by the executor (`train_all`)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import jax
import ml_collections

from soma_jax import evaluate as eval_lib
from soma_jax import plan as plan_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.studies import jobs as jobs_lib
from soma_jax.studies import planning, results, scores


def check_runs(plan: planning.StudyPlan, cfgs: dict[str, ml_collections.ConfigDict],
               by_updates: Iterable[str] | None = None) -> dict[str, spec_lib.RunSpec]:
  """Every run the study trains resolved before any trains (each method as `budgeted` at the
  first seed, then each seed run at its methods' model), its errors named as the study's
  fields; an ops budget the step cap cuts off, refused (the cheapest row needs the most
  updates). `by_updates`: the methods that run to the reference's updates, not the budget
  (plan.match_updates). The methods' specs, which `seed_stage` builds the seed runs from."""
  by_updates, unit = plan.match_updates if by_updates is None else by_updates, plan.unit
  specs = {}
  for name, c in cfgs.items():
    u, amount = ("updates", 1) if name in by_updates else (unit, plan.budget)
    specs[name] = budgeted(c, plan.data_dir, plan.seeds[0], None, u, amount,
                           plan.curve_points, f"methods.{name}.")
  for name, s in planning.seed_configs(plan, specs).items():  # each seed's: `check_plan`
    budgeted(s, plan.data_dir, plan.seed_run_seed, None, "updates", plan.seed_updates, 1,
             f"seed_runs.{name}.")
  if unit != "ops":
    return specs
  rows = {n: s.total_ops_per_update for n, s in specs.items() if n not in by_updates}
  room, cheapest = planning.MAX_UPDATES - plan.seed_updates, min(rows, key=rows.get)
  costliest = max(rows, key=rows.get)
  if plan.budget < rows[costliest]:  # a run stops after the update that reaches its budget
    raise UserError(f"budget={plan.budget:g} ops per run is less than one update of "
                    f"{costliest} ({rows[costliest]:,} operations): every row would run one "
                    "update and the rows would spend unequal compute; fix: "
                    f"--config.budget={rows[costliest]} or more")
  if plan.budget > room * rows[cheapest]:
    raise UserError(f"budget={plan.budget:g} ops per run: {cheapest} does "
                    f"{rows[cheapest]:,} operations per update, so the step cap "
                    f"({planning.MAX_UPDATES:,} updates, {room:,} after its seed) ends it at "
                    f"{room * rows[cheapest]:.4g}; "
                    f"fix: --config.budget={room * rows[cheapest]} or less")
  return specs


def layout_of(spec: spec_lib.RunSpec) -> dict:
  """How training lays a run out on this machine: FSO / DDPP over how many devices."""
  placed = plan_lib.layout(spec, spec.n_experts)
  return {"expert_devices": placed.expert, "pert_devices": placed.pert,
          "devices": jax.device_count(), "platform": jax.default_backend(), "why": placed.why}


def budgeted(c: ml_collections.ConfigDict, data_dir: str, seed: int, start: dict | None,
             unit: str, amount: float, checkpoints: int, prefix: str = "",
             fresh: bool = False, score: eval_lib.TestSet | None = None,
             marks: tuple[float, ...] = ()) -> spec_lib.RunSpec:
  """Training config `c` at optimisation seed `seed`, continuing the seed run record `start`
  (its whole train state; None: a fresh init; `fresh`: its parameters only, with fresh Adam
  moments, plateau state and step counter) until `amount` of `unit`: resolved (its errors
  named as the study's fields under `prefix`: `planning.resolved`). `score`: the study's set its
  checkpoints are scored on (validation), scored by training itself at each checkpoint
  from the state in memory (config.checkpoint_eval), which `curve` and `final_losses` read
  instead of restoring; None: scored by restoring, as before. `marks`: the checkpoints'
  fractions of the budget (config.budget_marks, e.g. log-spaced) in place of `checkpoints`
  equal parts."""
  c = ml_collections.ConfigDict(c.to_dict())
  c.data.dir, c.seed = data_dir, seed
  c.init_from, c.init_state = (start["_path"], not fresh) if start else ("", False)
  c.budget_unit, c.budget, c.budget_checkpoints = unit, float(amount), checkpoints
  c.steps = planning.MAX_UPDATES
  c.ckpt_every = planning.MAX_UPDATES  # the budget's checkpoints are the curve
  c.ckpt.keep = checkpoints + 1
  if marks:
    c.budget_marks, c.ckpt.keep = tuple(float(f) for f in marks), len(marks) + 1
  c.ensemble_eval_every = -1  # the study scores checkpoints itself, on its own span
  if (score is not None and scores._settings(score) is not None and not c.experts
      and score.route + score.score <= c.data.seq_len):  # else restored, as before
    c.checkpoint_eval = ml_collections.ConfigDict(dict(
        split=score.split, data_dir=score.data_dir, max_windows=int(score.max_windows),
        route=int(score.route), score=int(score.score)))
  return planning.resolved(c, prefix)


def train_all(runs: list[tuple[spec_lib.RunSpec, str, str]], executor=None) -> list[float]:
  """Trains every run of a stage (none reads another) to its end: one after another in this
  process (`executor` None), or by `executor` (`executor.make`: processes, SLURM); each run's
  wall seconds, in order. Every run's folder is checked (`check_existing`) before any trains,
  and no two runs may share one."""
  folders = [os.path.abspath(workdir) for _, workdir, _ in runs]
  shared = sorted({f for f in folders if folders.count(f) > 1})
  if shared:
    raise UserError(f"two runs of this study would share the folder {shared[0]!r} (their "
                    "settings name the same folder); fix: give them settings that differ")
  for folder in folders:
    results.own(folder)
  if executor is None:
    return [jobs_lib.train(spec, workdir, what) for spec, workdir, what in runs]
  for spec, workdir, _ in runs:
    jobs_lib.check_existing(workdir, spec)
  return executor.run([jobs_lib.Job(spec.config.to_dict(), workdir, what)
                       for spec, workdir, what in runs])


def start_step(spec: spec_lib.RunSpec, start: dict) -> int:
  """The step a run starts from: its seed run's (`start`, a `train_seeds` record) where it
  continues the seed's state, else 0 (fresh optimizer state and step counter)."""
  return int(start["step"]) if spec.init_state else 0


def seed_stage(plan: planning.StudyPlan, specs: dict[str, spec_lib.RunSpec],
               data_dir: str, out: str, val: eval_lib.TestSet, checkpoints: int = 1):
  """`train_seeds` as a stage a study yields: (the seed runs' jobs, a function of their wall
  seconds that returns their records); the seed runs of the methods `specs` (`check_runs`),
  each at its methods' model (`planning.seed_configs`). plan.own_starts: each optimisation
  seed s trains seed runs of its own at seed_run_seed + s in OUT/seeds/seedS/NAME (one
  stage), so where a start lands enters every interval (SPEC 9.8), and the records are
  {"seedS": {name: record}}."""
  where = ({s: (plan.seed_run_seed + s, os.path.join(out, "seeds", f"seed{s}"))
            for s in plan.seeds} if plan.own_starts
           else {None: (plan.seed_run_seed, os.path.join(out, "seeds"))})
  jobs, records = _seed_stage(plan, planning.seed_configs(plan, specs), data_dir, val,
                              checkpoints, where, out)
  if plan.own_starts:
    return jobs, lambda walls: {f"seed{s}": r for s, r in records(walls).items()}
  return jobs, lambda walls: records(walls)[None]


def train_seeds(plan: planning.StudyPlan, specs: dict[str, spec_lib.RunSpec],
                data_dir: str, out: str, val: eval_lib.TestSet, executor=None,
                checkpoints: int = 1) -> dict[str, dict]:
  """Trains every seed run for `seed_updates` updates at `seed_run_seed` in OUT/seeds/NAME
  (one stage: `train_all` with `executor`; a checkpoint after each 1/`checkpoints` of it);
  their cost, apart, their final loss on the study's ensemble-validation set `val` and their
  curve on it (`val_curve`: each checkpoint's step, update, ops and loss, counted from
  initialisation, `scores.checkpoint_curve`; a from-init readout is recomputed from it,
  SPEC 9.8) (`_spec`: the seed run's RunSpec). plan.own_starts: each seed's own
  (`seed_stage`)."""
  jobs, records = seed_stage(plan, specs, data_dir, out, val, checkpoints)
  return records(train_all(jobs, executor))


def _seed_stage(plan: planning.StudyPlan, runs_c: dict, data_dir: str, val: eval_lib.TestSet,
                checkpoints: int, where: dict, out: str):
  """Every seed run `runs_c` (name: config) for `seed_updates` updates at each `where[key]` =
  (data and direction seed, folder), as one stage: (its jobs, a function of their wall
  seconds that returns {key: {name: record}})."""
  planned = {(key, name): (budgeted(s, data_dir, run_seed, None, "updates", plan.seed_updates,
                                    checkpoints, score=val), os.path.join(folder, name), s)
             for key, (run_seed, folder) in where.items() for name, s in runs_c.items()}
  for (_, name), (spec, _, s) in planned.items():
    print(f"[compare] seed run {name}: {s.method} d_t={s.model.d_t}, {plan.seed_updates} "
          f"updates at seed {spec.config.seed}", flush=True)
  label = lambda key, name: f"seed run {name}" + ("" if key is None else f" for seed {key}")
  jobs = [(spec, workdir, label(key, name)) for (key, name), (spec, workdir, _) in planned.items()]

  def records(walls: list[float]) -> dict:
    got = {key: {} for key in where}
    for ((key, name), (spec, workdir, s)), wall in zip(planned.items(), walls, strict=True):
      curve, last = scores.checkpoint_curve(workdir, spec, val, 0)
      got[key][name] = {
          "workdir": planning.shown(workdir, out), "method": s.method, "d_t": s.model.d_t,
          "depth": s.model.depth, "lr": s.opt.lr, "eps": s.spsa.eps, "n_pert": s.spsa.n_pert,
          "batch": s.spsa.batch, "seq_len": s.data.seq_len, "seed": spec.config.seed,
          **scores.summary(workdir, spec, 0), "ops_per_update": spec.total_ops_per_update,
          "ensemble_val_nats_per_byte": float(last.mean()), "val_curve": curve,
          "wall_seconds_this_call": wall, "_path": workdir, "_spec": spec}
    return got
  return jobs, records


def seed_of(plan: planning.StudyPlan, records: dict, seed: int, name: str) -> dict:
  """The seed run record (`seed_stage`'s `records`) that method `name` continues at
  optimisation seed `seed`: that seed's own (plan.own_starts), else the one every seed shares."""
  return (records[f"seed{seed}"] if plan.own_starts else records)[plan.start[name]]


def start_of(seed_record: dict) -> str:
  """The `start` field of a run: the seed checkpoint it continues."""
  return f"{seed_record['workdir']}@{seed_record['step']}"
