"""XLA's planned memory of the SOMA step, compile only: will a config fit a GPU before you rent one?

  python -m benchmarks.plan_memory --config=experiments/configs/soma.py:n=16,size=paper \
      --pert_chunk=16,32,64 --signs=together,apart --json bench_out/plan.json

For every pert_chunk x spsa.signs, compiles the training step exactly as `train.py` would
(the config's shapes, precision and time block; nothing runs, no data is needed) and
reports XLA's buffer plan: arguments + outputs + temporaries, the number `pert_chunk=auto`
compares with a GPU's limit. Compiled on the CPU the plan is that of XLA's CPU backend,
close to but not the same as a GPU's (fusion differs); run it on the GPU for its own.
"""

import sys

from absl import flags
from ml_collections import config_flags

from benchmarks.step_timing import plans, signs_values
from soma_jax import cli
from soma_jax import spec as spec_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config", lock_config=True)
_CHUNKS = flags.DEFINE_list("pert_chunk", ["16", "64"], "spsa.pert_chunk values")
_SIGNS = flags.DEFINE_list("signs", ["together", "apart"], "spsa.signs values")
_JSON = cli.output_flag("json", None, "write the results here")
flags.mark_flag_as_required("config")


def main(argv):
  del argv
  chunks = cli.positive_ints("pert_chunk", _CHUNKS.value)
  result = plans(spec_lib.resolve(_CONFIG.value), chunks, signs_values(_SIGNS.value))
  for r in result["rows"]:
    b = r["planned_bytes"]
    size = f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"
    print(f"pert_chunk {r['pert_chunk']:>4}  signs {r['signs']:>8}  {size} planned",
          file=sys.stderr)
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
