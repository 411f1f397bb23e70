r"""Step times of the width ladder's rungs (SPEC 9.7), to size the rungs from measured times.

  python -m benchmarks.ladder_steps \
      --config=experiments/configs/compare.py:study=ladder,size=cpu --reps=7 \
      --json=docs/results/ladder_steps.json

For every rung of the config (`rungs=` picks them): the median step seconds (`--reps`
rounds after a warm-up, `step_timing.benchmark`, in the layout training uses) of SOMA's
N = 2 step, the monolith's, the summed-loss control's and of the two seed runs (N = 1 at
SOMA's expert width and at the monolith's width); with `--mechanism`, the wall seconds of
`ladder.seed_descent`'s measurement (config.mechanism) of one expert and of the monolith on
random windows from a fresh init. From those, the rung's training time projected at the
config's budget, seeds and grid (`projected_training_minutes`: from the measured step times
only; compilation, evaluation and checkpoints are not in it). Run it on an idle machine.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags

from benchmarks import step_timing
from soma_jax import cli, descent, memory, methods, runs
from soma_jax.studies import ladder, protocol

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiments/configs/compare.py:study=ladder,size=cpu|tiny[,rungs=...]",
    lock_config=True)
_JSON = flags.DEFINE_string("json", None, "write the results here")
_REPS = flags.DEFINE_integer("reps", 5, "timed rounds per step (the median is reported)")
_MECHANISM = flags.DEFINE_bool("mechanism", True, "also time the rho / r measurement")
flags.mark_flag_as_required("config")


def step_seconds(c, reps: int) -> dict:
  """Median seconds of one update of training config `c` and the layout it ran in."""
  r = step_timing.benchmark(c, reps, loop=False, ideals=False)
  return {"step_seconds": r["step_seconds"], "layout": r["layout"], "d_t": c.model.d_t,
          "n_experts": c.n_experts, "load_average_1m_at_start": r["load_average_1m_at_start"]}


def mechanism_seconds(c, m, count: int) -> float:
  """Wall seconds of the mechanism's measurement of config `c`'s model at a fresh init on
  `count` random batches (compilation included: the study pays it once per model)."""
  body_N, head = runs.initial_params(c)
  body = jax.tree.map(lambda x: x[0], body_N)
  head_e = head if c.model.shared_head else head[0]
  rng = np.random.default_rng(0)
  shape = (c.spsa.accum, c.spsa.batch, c.data.seq_len + 1)
  batches = [jnp.asarray(rng.integers(0, 256, shape, dtype=np.uint8)) for _ in range(count)]
  t = time.perf_counter()
  with memory.full_precision():
    descent.measure(ladder.batch_loss, body, head_e, batches, c.spsa.eps,
                    methods.get(c).step_config(c).spsa, jax.random.key(m.seed),
                    repeats=m.repeats, hutchinson=m.hutchinson, rho_by=m.rho_by)
  return time.perf_counter() - t


def projection(config, steps: dict, ref: str, mono: str) -> dict:
  """Training minutes of one rung from its step times: the seeds, then per optimisation seed
  every configuration of both searches (the fewest and the most `table7.tune` runs), and the
  control once per seed."""
  fewest = len(config.lr_factors) + len(config.eps_factors) - 1
  most = fewest + config.lr_extend
  seeds = config.seed_updates * (steps["seed_soma_expert"] + steps["seed_monolith"])
  pair = steps[ref] + steps[mono]

  def minutes(runs_per_search: int) -> float:
    per_seed = config.budget * (runs_per_search * pair + steps[config.control])
    return (seeds + config.seeds * per_seed) / 60

  return {"fewest_runs": minutes(fewest), "most_runs": minutes(most),
          "runs_per_search": [fewest, most], "seeds": config.seeds, "budget": config.budget,
          "seed_updates": config.seed_updates}


def rung(config, width: int, reps: int, mechanism: bool) -> dict:
  cfgs = ladder.sized(config, width)
  ref, mono = config.reference, ladder._other(config)
  pair = ladder.rung_config(config, width, control=False)
  seed_cfgs = protocol.seed_configs(pair, protocol.sized(pair))
  timed = {name: step_seconds(c, reps) for name, c in cfgs.items()}
  timed.update({f"seed_{name}": step_seconds(c, reps) for name, c in seed_cfgs.items()})
  out = {**ladder.sizes(config, width), "steps": timed}
  out["projected_training_minutes"] = projection(
      config, {k: v["step_seconds"] for k, v in timed.items()}, ref, mono)
  if mechanism:
    m = config.mechanism
    out["mechanism_seconds"] = {ref: mechanism_seconds(cfgs[ref], m, m.batches),
                                mono: mechanism_seconds(cfgs[mono], m, 2 * m.batches)}
  print(f"[ladder_steps] rung {width}: " + ", ".join(
      f"{k} {v['step_seconds'] * 1e3:.1f} ms" for k, v in timed.items()), file=sys.stderr,
      flush=True)
  return out


def main(argv):
  del argv
  config = _CONFIG.value
  load = list(os.getloadavg())
  rungs = [rung(config, w, _REPS.value, _MECHANISM.value) for w in ladder.widths(config)]
  result = {"benchmark": "ladder_steps", "command": "python -m benchmarks.ladder_steps " +
            " ".join(sys.argv[1:]), "backend": jax.default_backend(),
            "devices": jax.device_count(), "reps": _REPS.value,
            "load_average": {"start": load, "end": list(os.getloadavg())},
            "mechanism": config.mechanism.to_dict(), "rungs": rungs}
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
