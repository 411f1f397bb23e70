"""Train SOMA experts (or a baseline) from a config; re-run the same command to resume.

  python experiments/train.py --config=experiments/configs/soma.py:n=2,size=cpu \
      --config.data.dir=DATA --workdir=runs/soma_n2
"""

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from soma_jax import cli, train

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run folder: checkpoints, metrics, config")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.info("process %d of %d, devices: %s", jax.process_index(), jax.process_count(),
               jax.devices())
  summary = train.train(_CONFIG.value, _WORKDIR.value)
  if summary["status"] == "interrupted":
    raise SystemExit(128 + summary["signal"])


if __name__ == "__main__":
  cli.run(main)
