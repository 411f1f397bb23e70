"""Speed and memory of the SOMA step, measured against its ideals in one run.

  python -m benchmarks.spsa_step --config=experiments/configs/soma.py:n=4,size=cpu \
      --json bench_out/spsa_step.json

Measures, after warm-up, the median of --reps rounds, each round timing the step and
both ideals once (interleaved, so their ratios do not drift with the machine):
  * the jitted SOMA step (every expert x direction x sign, Adam, head update) at the
    config's pert_chunk ("auto" resolved as training resolves it), in the device layout
    training uses (`plan.layout`; like every entry point, this one starts JAX with one
    CPU host device per usable core, --cpu_devices to change it) -> `step_seconds`, and
    beside it the plain one-device step -> `one_device_step_seconds`,
    `speedup_vs_one_device`, and both layouts' losses after one update from the same state
    (`loss_max_relative_difference`, float32 rounding); and the step once more in a child
    process with one CPU device (`one_device_process_step_seconds`,
    `speedup_vs_one_device_process`: what a `--cpu_devices=1` run gets, since a device of
    a 2-device process may run one-device programs slower than a 1-device process does);
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


import json
import os
import subprocess
import sys

from absl import flags
from ml_collections import config_flags

from benchmarks.step_timing import benchmark, check_reps
from soma_jax import cli
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config", lock_config=True)
_JSON = cli.output_flag("json", None, "write the results here")
_REPS = flags.DEFINE_integer("reps", 7, "timed rounds (median)")
_LOOP = flags.DEFINE_bool("loop", True, "also time the naive per-direction loop")
_STEP_ONLY = flags.DEFINE_bool("step_only", False, "time the step alone (no ideals, no loop)")
_ONE_PROCESS = flags.DEFINE_bool(
    "one_device_process", True, "when the layout has several devices, also time the step in "
    "a child process with one CPU device, as a run with --cpu_devices=1 has it")
flags.mark_flag_as_required("config")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_device_process(reps: int) -> dict:
  """This benchmark's step, rerun in a child process with --cpu_devices=1 (step only).

  Within one process the one-device step shares XLA's CPU runtime with the other host
  devices; a process of its own is what a one-device run gets.
  """
  dropped = ("--json", "--cpu_devices", "--reps", "--one_device_process", "--step_only")
  keep, args = [], iter(sys.argv[1:])
  for a in args:
    if a in ("--json", "--cpu_devices", "--reps"):  # the space form: its value follows
      next(args, None)
    elif not a.startswith(dropped):
      keep.append(a)
  proc = subprocess.run([sys.executable, "-m", "benchmarks.spsa_step", *keep, f"--reps={reps}",
                         "--cpu_devices=1", "--step_only", "--noone_device_process"],
                        capture_output=True, text=True, cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                            filter(None, [ROOT, os.environ.get("PYTHONPATH")]))))
  if proc.returncode:
    raise UserError(f"the one-device child run failed:\n{proc.stderr[-2000:]}")
  return json.loads(proc.stdout)


def main(argv):
  del argv
  check_reps(_REPS.value)
  out = benchmark(spec_lib.resolve(_CONFIG.value), _REPS.value, _LOOP.value and not _STEP_ONLY.value,
                  ideals=not _STEP_ONLY.value)
  if _ONE_PROCESS.value and out["devices"] > 1:
    child = one_device_process(_REPS.value)
    out.update(one_device_process_step_seconds=child["step_seconds"],
               one_device_process_pert_chunk=child["config"]["pert_chunk"],
               speedup_vs_one_device_process=child["step_seconds"] / out["step_seconds"])
  cli.emit_json(out, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
