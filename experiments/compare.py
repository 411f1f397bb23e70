"""SOMA against monolithic SPSA, EGGROLL and BPTT at equal size and compute (Table 4, Figure 1).

  python experiments/compare.py --config=experiments/configs/compare.py:cpu --out=runs/compare

Trains every method once per seed; writes OUT/table.md, OUT/results.json (with this
command and its wall time), OUT/results.csv and OUT/figure1.png; re-run the same command
to resume an interrupted comparison.
"""

import shlex
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from soma_jax import cli
from soma_jax.studies import compare

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiments/configs/compare.py:cpu|tiny",
                                          lock_config=True)
_OUT = flags.DEFINE_string("out", None, "output folder: runs/, table.md, results.json/.csv, figure1.png")
flags.mark_flags_as_required(["config", "out"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.info("process %d of %d, devices: %s", jax.process_index(), jax.process_count(),
               jax.devices())
  command = "python " + shlex.join(sys.argv)
  payload = compare.run(_CONFIG.value, _OUT.value, command)
  print(compare.table(payload))


if __name__ == "__main__":
  cli.run(main)
