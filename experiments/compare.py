"""The paper's comparisons (SPEC 9.1 and 9.2), scaled down by SPEC 9.6: seeds of equal updates
continued with their optimizer state, budgets in updates or CPU seconds, never wall time.

  python experiments/compare.py --config=experiments/configs/compare.py:study=table4,size=cpu --out=runs/table4
  python experiments/compare.py --config=experiments/configs/compare.py:study=table7,size=cpu --out=runs/table7
  python experiments/compare.py --config=experiments/configs/compare.py:study=ladder,size=cpu --out=runs/ladder
  python experiments/compare.py --config=experiments/configs/compare.py:study=table7,size=cpu --out=runs/table7 \
      --executor=submitit:slurm --slurm_partition=gpu --slurm_time=60 --slurm_gpus=1

Trains the seed runs, then every row (table4) or every grid point (table7) once per seed
(ladder, SPEC 9.7: table7 at each width of rungs=16/32/64/128, rho and r beside it);
writes OUT/table.md and OUT/results.json (with this command, its wall time and the load
average); re-run the same command to resume an interrupted study. --executor says who trains
each stage's independent runs (soma_jax/studies/executor.py): this process one after
another (inline), K worker processes, or one SLURM job per run (BUILD.md, "Studies on a
SLURM cluster"); the results are the same.
"""

import shlex
import sys

from absl import flags
from ml_collections import config_flags

from soma_jax import cli
from soma_jax.errors import UserError
from soma_jax.studies import compare
from soma_jax.studies import executor as executor_lib
from soma_jax.studies import slurm as slurm_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, f"experiments/configs/compare.py:study={'|'.join(compare.STUDIES)},size=cpu|tiny",
    lock_config=True)
_OUT = cli.output_flag("out", None, "output folder: seeds/, runs/, table.md, results.json", kind="folder")
_LIST = flags.DEFINE_bool("list", False, "print the studies (name and what each is) and exit")
_EXECUTOR = flags.DEFINE_string(
    "executor", "inline", "who trains each stage's independent runs: inline (one after another "
    "here), processes:K (K worker processes; each run's output in its folder's train.log), "
    "submitit:slurm (one SLURM job per run, --slurm_*), submitit:local (submitit on this "
    "machine); the results are the same")
_SLURM = {  # executor.make's slurm settings <- their flags (unset: SLURM's or submitit's default)
    "partition": flags.DEFINE_string("slurm_partition", None, "SLURM partition of each job"),
    "time": flags.DEFINE_integer(
        "slurm_time", None, f"minutes per job (default {slurm_lib.SLURM_DEFAULT_TIME}); a run "
        "that needs more checkpoints and requeues itself, and resumes"),
    "gpus_per_node": flags.DEFINE_integer("slurm_gpus", None, "GPUs per job (default 0)"),
    "cpus_per_task": flags.DEFINE_integer("slurm_cpus", None, "CPUs per job"),
    "mem_gb": flags.DEFINE_float("slurm_mem_gb", None, "memory per job, GB"),
}


def main(argv):
  del argv
  if _LIST.value:
    print(compare.listing())
    return
  if _CONFIG.value is None or not _OUT.value:
    study = next(iter(compare.STUDIES))  # any: the registry's first
    raise UserError("--config and --out are required; fix: e.g. --config=experiments/configs/"
                    f"compare.py:study={study},size=tiny --out=runs/{study} (--list: the studies)")
  cli.log_devices()
  command = "python " + shlex.join(sys.argv)
  cli.absolute_paths(_CONFIG.value)
  executor = executor_lib.make(_EXECUTOR.value, {k: f.value for k, f in _SLURM.items()})
  payload = compare.run(_CONFIG.value, cli.workdir_flag(_OUT.value, "--out"), command,
                        executor=executor)
  print(compare.table(payload))


if __name__ == "__main__":
  cli.run(main)
