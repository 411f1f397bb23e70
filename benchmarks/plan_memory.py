"""XLA's planned memory of the SOMA step, compile only: will a config fit a GPU before you rent one?

  python benchmarks/plan_memory.py --config=experiments/configs/soma.py:n=16,size=paper \
      --pert_chunk=16,32,64 --signs=together,apart --json bench_out/plan.json

For every pert_chunk x spsa.signs, compiles the training step exactly as `train.py` would
(the config's shapes, precision and time block; nothing runs, no data is needed) and
reports XLA's buffer plan: arguments + outputs + temporaries, the number `pert_chunk=auto`
compares with a GPU's limit. Compiled on the CPU the plan is that of XLA's CPU backend,
close to but not the same as a GPU's (fusion differs); run it on the GPU for its own.
"""

import itertools
import os
import sys

import ml_collections
from absl import flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_timing import describe, positive_ints, signs_values  # noqa: E402

from soma_jax import cli, memory, train  # noqa: E402
from soma_jax import config as config_lib  # noqa: E402
from soma_jax.errors import UserError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config", lock_config=True)
_CHUNKS = flags.DEFINE_list("pert_chunk", ["16", "64"], "spsa.pert_chunk values")
_SIGNS = flags.DEFINE_list("signs", ["together", "apart"], "spsa.signs values")
_JSON = flags.DEFINE_string("json", None, "write the results here")
flags.mark_flag_as_required("config")


def plans(c: ml_collections.ConfigDict, chunks: list[int], signs: tuple[str, ...]) -> dict:
  """The table: one row per dividing pert_chunk x signs, with XLA's planned bytes."""
  config_lib.validate(c)
  if c.method != "soma":
    raise UserError(f"method={c.method}: only the SOMA step has a pert_chunk to plan")
  k = c.spsa.n_pert
  skipped = [f"pert_chunk={chunk} does not divide n_pert={k}" for chunk in chunks if k % chunk]
  rows = []
  for chunk, sign in itertools.product([ch for ch in chunks if k % ch == 0], signs):
    ci = c.copy_and_resolve_references()  # the caller's config stays as it was
    ci.spsa.update(pert_chunk=chunk, signs=sign)
    choice = train.choose_chunk(ci, ci.n_experts)
    rows.append({"pert_chunk": chunk, "signs": sign, "planned_bytes": choice.planned_bytes})
  if not rows:
    raise UserError("nothing to plan: " + "; ".join(skipped))
  return describe(c, time_block=c.spsa.time_block) | {
      "device_limit_bytes": memory.device_limit_bytes(), "rows": rows, "skipped": skipped}


def main(argv):
  del argv
  result = plans(_CONFIG.value, positive_ints("pert_chunk", _CHUNKS.value),
                 signs_values(_SIGNS.value))
  for r in result["rows"]:
    print(f"pert_chunk {r['pert_chunk']:>4}  signs {r['signs']:>8}  "
          f"{r['planned_bytes'] / 1e9:.2f} GB planned", file=sys.stderr)
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
