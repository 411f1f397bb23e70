"""Where the SOMA step's time goes on this device: the profiler's ops, ranked, as JSON.

  python -m benchmarks.profile_step --config=experiments/configs/soma.py:n=2,size=paper \
      --json bench_out/profile.json [--steps=2] [--trace_dir=bench_out/trace] [--top=40]

Compiles the step as training does (in its device layout, `plan.place_step`: on a CPU one
host device per core unless --cpu_devices says otherwise; "auto" chunk resolved, the
config's precision), runs it once to warm up, then records --steps steps with `jax.profiler`. The trace (Perfetto JSON,
kept under --trace_dir when given) is summed by event name for each profiler process, e.g.
the GPU's kernels apart from the host's threads; each op gets its total milliseconds per
step (self time: minus the ops nested in it, so a loop counts only its own overhead), its
calls per step and its share of that process's time. Read it with the step's
shapes in mind: on a GPU, a recurrent matmul called T times per block and layer shows as
one kernel with T x blocks x layers calls. On a CPU, whose recurrence runs tens of
thousands of tiny ops per step, the profiler can drop a few percent of the events (the
N = 4 cpu preset's recurrent matmul showed 15.7k of its 16.4k calls per step at --steps=2,
all of them at --steps=1), so read calls and milliseconds there as close, not exact.
"""

import os
import sys

# XLA's CPU runtime traces the thunks inside loops only when asked (read at backend start).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from benchmarks.profiling import profile  # noqa: E402
from soma_jax import cli  # noqa: E402
from soma_jax import spec as spec_lib  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config", lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 2, "profiled steps (after one warm-up step)")
_TOP = flags.DEFINE_integer("top", 40, "ops kept per profiler process")
_TRACE_DIR = cli.output_flag("trace_dir", None, "keep the raw trace here (else a temp dir)", kind="folder")
_JSON = cli.output_flag("json", None, "write the summary here")
flags.mark_flag_as_required("config")


def main(argv):
  del argv
  result = profile(spec_lib.resolve(_CONFIG.value), _STEPS.value, _TOP.value, _TRACE_DIR.value)
  for proc, p in result["processes"].items():
    print(f"{proc}: {p['total_ms_per_step']:.1f} ms per step in ranked ops", file=sys.stderr)
    print("  " + ", ".join(f"{k} {100 * v['share']:.0f}%" for k, v in p["categories"].items()),
          file=sys.stderr)
    for op in p["ops"][:8]:
      print(f"  {op['ms_per_step']:9.2f} ms {op['calls_per_step']:9.0f} calls  {op['name'][:70]}",
            file=sys.stderr)
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
