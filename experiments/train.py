"""Train SOMA experts (or a baseline) from a config; re-run the same command to resume.

  python experiments/train.py --config=experiments/configs/soma.py:n=2,size=cpu \
      --config.data.dir=DATA --workdir=runs/soma_n2

One run per workdir at a time (a second exits 2 naming the first). A resume may change the
run length, cadences, device layout and speed settings; any other change is refused with the
list of fields, unless named in --config.resume_overrides=opt.lr,... (recorded in the
workdir's config_history.jsonl). SIGTERM / Ctrl-C stop within one update with a checkpoint.
"""

from absl import flags
from ml_collections import config_flags

from soma_jax import cli, errors, train

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = cli.output_flag("workdir", None, "run folder: checkpoints, metrics, config", kind="folder")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "call jax.distributed.initialize() first (auto-detected on SLURM and "
    "Open MPI; otherwise pass --coordinator, --num_processes and --process_id)")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "HOST:PORT of process 0 (--multihost)")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "processes in the job (--multihost)")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "this process's index (--multihost)")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  if _MULTIHOST.value:
    from soma_jax import parallel

    parallel.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  cli.log_devices()
  workdir = cli.workdir_flag(_WORKDIR.value)
  cli.absolute_paths(_CONFIG.value)  # config.json names the data wherever a tool runs later
  summary = train.run(_CONFIG.value, workdir)
  if summary["status"] == "interrupted":
    errors.finish(errors.signal_exit_code(summary["signal"]))


if __name__ == "__main__":
  cli.run(main)
