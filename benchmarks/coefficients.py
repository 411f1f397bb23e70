"""How far each speed setting moves the SPSA coefficients from full float32, direction by direction.

  python -m benchmarks.coefficients --config=experiments/configs/soma.py:n=2,size=paper \
      --json bench_out/coefficients.json [--precision=default,high,highest] \
      [--forward=direct,split,split_recurrence] [--n_pert=8]

For each precision x spsa.forward, the per-direction coefficients (L+ - L-) / (2 eps) of
the config's first update (its initial state, eps and probes; random bytes as the batch,
as the other benchmarks use) against those at precision=highest, forward=direct: the
relative norm ||c - c_ref|| / ||c_ref|| over every expert and direction. The issue's
target for the GPU setting chosen is 2%; on the CPU, split against direct measured 6e-5 to
9e-5 at d_t 16 (tests/test_split.py's setup).
"""

import dataclasses
import sys

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from benchmarks.step_timing import describe, step_inputs
from soma_jax import cli, memory, spsa
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config", lock_config=True)
_PRECISION = flags.DEFINE_list("precision", list(memory.PRECISIONS), "precisions to compare")
_FORWARD = flags.DEFINE_list("forward", list(spsa.FORWARDS), "spsa.forward settings to compare")
_N_PERT = flags.DEFINE_integer("n_pert", 8, "directions per expert (all in one chunk)")
_JSON = cli.output_flag("json", None, "write the result here")
flags.mark_flag_as_required("config")

_COEFFICIENTS = jax.jit(spsa.coefficients, static_argnames=("cfg", "shared_head"))


def check_flags(precisions, forwards, n_pert: int) -> None:
  for name, values, allowed in (("precision", precisions, memory.PRECISIONS),
                                ("forward", forwards, spsa.FORWARDS)):
    if not values or not set(values) <= set(allowed):
      raise UserError(f"--{name}={','.join(values)} must name some of {', '.join(allowed)}")
  if n_pert < 1:
    raise UserError(f"--n_pert={n_pert} must be >= 1")


def compare(spec: spec_lib.RunSpec, precisions, forwards) -> dict:
  """Each precision x forward's coefficients against highest / direct (all of the run's
  directions in one chunk)."""
  inputs = step_inputs(spec)
  base = spec.method.step_config(spec.mesh.n_pert)
  s = inputs.state

  def coefs(precision: str, forward: str) -> np.ndarray:
    cfg = dataclasses.replace(base.spsa, forward=forward)
    with memory.matmul_precision(precision):
      return np.asarray(_COEFFICIENTS(s.body, s.head, inputs.batch, s.sched.eps, s.step,
                                      inputs.ids, jax.random.key(base.seed), cfg=cfg,
                                      shared_head=base.model.shared_head), np.float64)

  ref = coefs("highest", "direct")
  rows = []
  for precision in precisions:
    for forward in forwards:
      got = ref if (precision, forward) == ("highest", "direct") else coefs(precision, forward)
      rows.append({"precision": precision, "forward": forward,
                   "dot_algorithm": memory.dot_algorithm(precision),
                   "relative_norm_vs_highest_direct":
                       float(np.linalg.norm(got - ref) / np.linalg.norm(ref))})
      print(rows[-1], file=sys.stderr, flush=True)
  return describe(spec, forward="all", eps=float(s.sched.eps[0])) | {
      "reference": "precision=highest, forward=direct", "coefficient_rms": float(
          np.sqrt(np.mean(ref ** 2))), "rows": rows}


def main(argv):
  del argv
  check_flags(_PRECISION.value, _FORWARD.value, _N_PERT.value)
  c = _CONFIG.value
  with c.unlocked():  # every direction in one chunk
    c.spsa.n_pert, c.spsa.pert_chunk = _N_PERT.value, _N_PERT.value
  cli.emit_json(compare(spec_lib.resolve(c), _PRECISION.value, _FORWARD.value), _JSON.value)


if __name__ == "__main__":
  cli.run(main)
