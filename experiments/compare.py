"""The paper's comparisons (SPEC 9.1 and 9.2), scaled down by SPEC 9.6: seeds of equal updates
continued with their optimizer state, budgets in updates or CPU seconds, never wall time.

  python experiments/compare.py --config=experiments/configs/compare.py:study=table4,size=cpu --out=runs/table4
  python experiments/compare.py --config=experiments/configs/compare.py:study=table7,size=cpu --out=runs/table7
  python experiments/compare.py --config=experiments/configs/compare.py:study=ladder,size=cpu --out=runs/ladder

Trains the seed runs, then every row (table4) or every grid point (table7) once per seed
(ladder, SPEC 9.7: table7 at each width of rungs=16/32/64/128, rho and r beside it);
writes OUT/table.md and OUT/results.json (with this command, its wall time and the load
average); re-run the same command to resume an interrupted study.
"""

import shlex
import sys

from absl import flags
from ml_collections import config_flags

from soma_jax import cli
from soma_jax.errors import UserError
from soma_jax.studies import compare

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, f"experiments/configs/compare.py:study={'|'.join(compare.STUDIES)},size=cpu|tiny",
    lock_config=True)
_OUT = flags.DEFINE_string("out", None, "output folder: seeds/, runs/, table.md, results.json")
_LIST = flags.DEFINE_bool("list", False, "print the studies (name and what each is) and exit")


def main(argv):
  del argv
  if _LIST.value:
    print(compare.listing())
    return
  if _CONFIG.value is None or not _OUT.value:
    raise UserError("--config and --out are required; fix: e.g. --config=experiments/configs/"
                    "compare.py:study=table7,size=tiny --out=runs/table7 (--list: the studies)")
  cli.log_devices()
  command = "python " + shlex.join(sys.argv)
  cli.absolute_paths(_CONFIG.value)
  payload = compare.run(_CONFIG.value, cli.workdir_flag(_OUT.value, "--out"), command)
  print(compare.table(payload))


if __name__ == "__main__":
  cli.run(main)
