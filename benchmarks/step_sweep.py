"""Which pert_chunk, time_block and spsa.signs run the SOMA step fastest here: one table,
JSON + text.

  python -m benchmarks.step_sweep --config=experiments/configs/soma.py:n=4,size=cpu \
      --pert_chunk=1,2,4 --time_block=128,256 --signs=together,apart \
      --json bench_out/step_sweep.json

Compiles the step once per combination (the config's other settings unchanged), then
times every combination in the same --reps interleaved rounds, so the comparison does not
drift with the machine. Each row: the settings, the median step seconds, perturbed
tokens/s, XLA's planned memory and the time relative to the fastest row. A chunk that does
not divide n_pert is skipped with a note. Settings change speed and memory only; the
estimate is the same up to float summation order.
"""

import sys

from absl import flags
from ml_collections import config_flags

from benchmarks.step_timing import check_reps, signs_values, sweep
from soma_jax import cli
from soma_jax import spec as spec_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config", lock_config=True)
_CHUNKS = flags.DEFINE_list("pert_chunk", ["1", "2", "4"], "spsa.pert_chunk values")
_BLOCKS = flags.DEFINE_list("time_block", ["64", "128"], "spsa.time_block values")
_SIGNS = flags.DEFINE_list("signs", ["together", "apart"], "spsa.signs values")
_REPS = flags.DEFINE_integer("reps", 5, "timed rounds (median)")
_JSON = cli.output_flag("json", None, "write the results here")
flags.mark_flag_as_required("config")


def main(argv):
  del argv
  chunks = cli.positive_ints("pert_chunk", _CHUNKS.value)
  blocks = cli.positive_ints("time_block", _BLOCKS.value)
  signs = signs_values(_SIGNS.value)
  check_reps(_REPS.value)
  result = sweep(spec_lib.resolve(_CONFIG.value), chunks, blocks, _REPS.value, signs)
  for r in result["rows"]:
    print(f"pert_chunk {r['pert_chunk']:>4}  time_block {r['time_block']:>4}  "
          f"signs {r['signs']:>8}  "
          f"{r['step_seconds']:.3f} s  x{r['relative_to_fastest']:.2f}  "
          f"{r['planned_bytes'] / 1e6:.0f} MB planned", file=sys.stderr)
  print(f"auto picks pert_chunk={result['auto_pert_chunk']}, signs {result['auto_signs']} "
        "here", file=sys.stderr)
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
