"""Speed and memory of the SOMA step, measured against its ideals in one run.

  python -m benchmarks.spsa_step --config=experiments/configs/soma.py:n=4,size=cpu \
      --json bench_out/spsa_step.json

Measures, after warm-up, the median of --reps rounds, each round timing the step and
both ideals once (interleaved, so their ratios do not drift with the machine):
  * the jitted SOMA step (every expert x direction x sign, Adam, head update) at the
    config's pert_chunk ("auto" resolved as training resolves it), in the device layout
    training uses (`train.layout`; like every entry point, this one starts JAX with one
    CPU host device per usable core, --cpu_devices to change it) -> `step_seconds`, and
    beside it the plain one-device step -> `one_device_step_seconds`,
    `speedup_vs_one_device`, and both layouts' losses after one update from the same state
    (`loss_max_relative_difference`, float32 rounding);
  * the ideal (a one-device program, read against the one-device step): the 2 A n_pert
    plain forward passes of B sequences (unperturbed weights)
    that one update stands for -> `efficiency`; and plain forwards of 2 C B sequences at
    once, a chunk's both signs -> `efficiency_vs_batched` (a stronger ideal: one
    weight matrix shared by all rows, which perturbed copies cannot share);
  * the SPSA estimate alone, without Adam and the head's delta rule -> `estimate_efficiency`
    (the forward ideal over it): where the step's time beyond the ideal goes;
  * a large f32 matmul -> `matmul_peak_gflops`, against which `achieved_gflops` is read;
  * a naive reference: a Python loop over directions calling a jitted one-direction
    estimate, then the same jitted update -> `speedup_vs_loop`.
Peak memory is XLA's buffer plan for the compiled step (arguments + outputs + temporaries),
the same number on every backend; on GPU the allocator's peak over the step and its ideals
is reported as well (`process_peak_bytes_in_use`).
"""


from absl import flags
from ml_collections import config_flags

from benchmarks.step_timing import benchmark
from soma_jax import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config", lock_config=True)
_JSON = flags.DEFINE_string("json", None, "write the results here")
_REPS = flags.DEFINE_integer("reps", 7, "timed rounds (median)")
_LOOP = flags.DEFINE_bool("loop", True, "also time the naive per-direction loop")
flags.mark_flag_as_required("config")


def main(argv):
  del argv
  cli.emit_json(benchmark(_CONFIG.value, _REPS.value, _LOOP.value), _JSON.value)


if __name__ == "__main__":
  cli.run(main)
