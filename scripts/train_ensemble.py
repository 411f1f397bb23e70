r"""Trains (or resumes) the SOMA recipe of `independent_vs_summed.py:cpu` into one folder:

  python -m scripts.train_ensemble --out=runs/trained_n8

OUT/data (the built-in corpus in 8 shards), OUT/seed (one width-32 expert, 1,000 updates),
OUT/ensemble (N = 8 copying the seed's body, its E frozen and shared, 2,000 updates). The
variance figures on trained weights measure OUT/ensemble (scripts/variance_trained.sh); a
finished folder is reused as it is.
"""

from __future__ import annotations

import os

from absl import flags

from soma_jax import cli
from soma_jax.config import load_config_file
from soma_jax.studies import independent

_OUT = cli.output_flag("out", None, "folder for data/, seed/ and ensemble/", kind="folder")
_CONFIG = flags.DEFINE_string("config", "experiments/configs/independent_vs_summed.py:cpu",
                              "the independent_vs_summed config whose seed_run and "
                              "ensemble_run are trained")
flags.mark_flag_as_required("out")


def main(argv):
  del argv
  path, _, arg = _CONFIG.value.partition(":")
  config = load_config_file(os.path.abspath(path), arg or None)
  print(independent.ensemble_workdir(independent.check(config), _OUT.value))


if __name__ == "__main__":
  cli.run(main)
