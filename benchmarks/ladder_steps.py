r"""Step times of the width ladder's rungs (SPEC 9.7), to size the rungs from measured times.

  python -m benchmarks.ladder_steps \
      --config=experiments/configs/compare.py:study=ladder,size=cpu --reps=7 \
      --data_dir=DATA --json=docs/results/ladder_steps.json

DATA: a prepared data dir with 2 shards (default: the built-in corpus prepared under a
temporary folder, about a minute).

For every rung of the config (`rungs=` picks them), each of SOMA's N = 2 run, the
monolith's, the summed-loss control's and the two seed runs' (N = 1 at SOMA's expert width
and at the monolith's width):
- `update_seconds`: wall seconds per update in training itself (`--train_updates` updates
  from a fresh init through `train.train` on the data dir, its clock's training time: the
  pipelined loop, compilation, evaluation and checkpoints apart). This sizes the rungs.
- `isolated_step_seconds`: the median of `--reps` rounds of the step alone, each waited for
  (`step_timing.benchmark`, in the layout training uses). On these 2 cores it read 38.9 ms
  at width 32 where training ran 19 ms per update (the loop dispatches update t + 1 before
  waiting for update t; docs/results/ladder_steps_isolated.json, table7_cpu_shared_start.json); both are
  kept so the gap is on record.
With `--mechanism`, the wall seconds of `ladder_mechanism.seed_descent`'s measurement
(config.mechanism) of one expert and of the monolith on random windows from a fresh init.
From `update_seconds`, the rung's training time projected at the config's budget, seeds and
grid (`projected_training_minutes`; compilation, evaluation and checkpoints are not in it).
Run it on an idle machine.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags

from benchmarks import step_timing
from soma_jax import cli, descent, host_devices, memory, runs
from soma_jax import plan as plan_lib
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.data import pipeline
from soma_jax.studies import datasets, driver, ladder, ladder_mechanism, planning, scores, training

_CONFIG = config_flags.DEFINE_config_file(
    "config", None,
    f"experiments/configs/compare.py:study={ladder.STUDY.name},size=cpu|tiny[,rungs=...]",
    lock_config=True)
_JSON = cli.output_flag("json", None, "write the results here")
_REPS = flags.DEFINE_integer("reps", 5, "timed rounds per step (the median is reported)")
_MECHANISM = flags.DEFINE_bool("mechanism", True, "also time the rho / r measurement")
_TRAIN_UPDATES = flags.DEFINE_integer(
    "train_updates", 100, "updates of each timed training run (0: skip, isolated steps only)")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", "", "a prepared data dir with 2 shards; default: the built-in corpus, "
    "prepared under a temporary folder")
flags.mark_flag_as_required("config")


def step_seconds(spec: spec_lib.RunSpec, reps: int) -> dict:
  """Median seconds of one isolated update of a run and its layout."""
  r = step_timing.benchmark(spec, reps, loop=False, ideals=False)
  return {"isolated_step_seconds": r["step_seconds"], "layout": r["layout"],
          "d_t": spec.method.model.d_t, "n_experts": spec.n_experts,
          "load_average_1m_at_start": r["load_average_1m_at_start"]}


def update_seconds(spec: spec_lib.RunSpec, scratch: str) -> dict:
  """Wall seconds per update of a budgeted run from a fresh init (`training.budgeted` in
  updates; training's clock: compilation, evaluation and checkpoints apart)."""
  workdir = tempfile.mkdtemp(dir=scratch)
  train_lib.train(plan_lib.place(spec), workdir)
  done = scores.summary(workdir, spec, 0)
  units = host_devices.charged_units(jax.device_count())  # device-seconds per wall second
  return {"update_seconds": done["device_seconds"] / units / done["updates"],
          "train_updates": done["updates"], "compile_seconds": done["compile_seconds"] / units}


def mechanism_seconds(spec: spec_lib.RunSpec, m, count: int) -> float:
  """Wall seconds of the mechanism's measurement of a run's model at a fresh init on
  `count` random batches (compilation included: the study pays it once per model)."""
  body_N, head = runs.initial_params(spec)
  body = jax.tree.map(lambda x: x[0], body_N)
  head_e = head if spec.shared_head else head[0]
  rng = np.random.default_rng(0)
  shape = (spec.accum, spec.batch, spec.seq_len + 1)
  batches = [jnp.asarray(rng.integers(0, 256, shape, dtype=np.uint8)) for _ in range(count)]
  t = time.perf_counter()
  with memory.full_precision():
    descent.measure(ladder_mechanism.batch_loss, body, head_e, batches, spec.eps,
                    spec.method.step_config().spsa, jax.random.key(m.seed),
                    repeats=m.repeats, hutchinson=m.hutchinson, rho_by=m.rho_by)
  return time.perf_counter() - t


def projection(ls: ladder.LadderSpec, steps: dict, ref: str, mono: str) -> dict:
  """Training minutes of one rung from its step times: the seeds, then per optimisation seed
  every configuration of both searches (the fewest and the most `table7.tune` runs), and the
  control once per seed."""
  grid, plan = ls.grid, ls.plan
  fewest = len(grid.lr_factors) + len(grid.eps_factors) - 1
  most = fewest + grid.lr_extend + grid.eps_extend
  seeds = plan.seed_updates * (steps["seed_soma_expert"] + steps["seed_monolith"])
  pair = steps[ref] + steps[mono]

  def minutes(runs_per_search: int) -> float:
    per_seed = plan.budget * (runs_per_search * pair + steps[ls.control])
    return (seeds + len(plan.seeds) * per_seed) / 60

  return {"fewest_runs": minutes(fewest), "most_runs": minutes(most),
          "runs_per_search": [fewest, most], "seeds": len(plan.seeds), "budget": plan.budget,
          "seed_updates": plan.seed_updates}


def rung(ls: ladder.LadderSpec, width: int, reps: int, mechanism: bool, data_dir: str,
         scratch: str) -> dict:
  cfgs = ladder.sized(ls, width)
  ref, mono = ls.reference, ls.other
  pair = ladder.rung_config(ls, width, control=False)
  pair_specs = {name: planning.resolved(c) for name, c in planning.sized(pair).items()}
  seed_cfgs = planning.seed_configs(planning.check_plan(pair), pair_specs)
  every = {**cfgs, **{f"seed_{name}": c for name, c in seed_cfgs.items()}}
  specs = {name: spec_lib.resolve(c) for name, c in every.items()}
  timed = {name: step_seconds(spec, reps) for name, spec in specs.items()}
  key = "isolated_step_seconds"
  if _TRAIN_UPDATES.value > 0:
    for name, c in every.items():
      run = training.budgeted(c, data_dir, 0, None, "updates", _TRAIN_UPDATES.value, 1)
      timed[name].update(update_seconds(run, scratch))
    key = "update_seconds"
  out = {**ladder.sizes(ls, width), "steps": timed, "projected_from": key}
  out["projected_training_minutes"] = projection(
      ls, {k: v[key] for k, v in timed.items()}, ref, mono)
  if mechanism:
    m = ls.mechanism
    out["mechanism_seconds"] = {ref: mechanism_seconds(specs[ref], m, m.batches),
                                mono: mechanism_seconds(specs[mono], m, 2 * m.batches)}
  print(f"[ladder_steps] rung {width} ({key}): " + ", ".join(
      f"{k} {v[key] * 1e3:.1f} ms" for k, v in timed.items()), file=sys.stderr, flush=True)
  return out


def main(argv):
  del argv
  config = _CONFIG.value
  _, ls = driver.checked(ladder.STUDY, config)  # the ladder's fields and every rung, as the study checks them
  load = list(os.getloadavg())
  with tempfile.TemporaryDirectory() as scratch:
    data_dir = _DATA_DIR.value
    if data_dir:
      pipeline.check_data_dir(data_dir, 2)
    elif _TRAIN_UPDATES.value > 0:
      data_dir = datasets.ensure_data(config.data_dir, scratch, 2)  # or the built-in corpus
    rungs = [rung(ls, w, _REPS.value, _MECHANISM.value, data_dir, scratch) for w in ls.widths]
  result = {"benchmark": "ladder_steps", "command": "python -m benchmarks.ladder_steps " +
            " ".join(sys.argv[1:]), "backend": jax.default_backend(),
            "devices": jax.device_count(), "reps": _REPS.value,
            "train_updates": _TRAIN_UPDATES.value,
            "load_average": {"start": load, "end": list(os.getloadavg())},
            "mechanism": ls.mechanism.record(), "rungs": rungs}
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
