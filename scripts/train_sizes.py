r"""Trains (or resumes) one SOMA run per N at one total size, the weights the experts and
reference variance studies measure at size=trained:

  python -m scripts.train_sizes --out=runs/trained_sizes \
      [--config=experiments/configs/variance.py:experts,size=trained]

For each N of the config's n_list: OUT/data_n{N} (the built-in corpus in N shards) and
OUT/N{N} (N experts at the width total_params gives that N, each on its own shard, all N
with the config's train_run recipe). A finished run is reused as it is. Then:

  python experiments/variance.py --config=experiments/configs/variance.py:experts,size=trained \
      --config.trained_dir=runs/trained_sizes --x64 --out=runs/variance
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from soma_jax import cli
from soma_jax.studies import trained_sizes, variance_settings

_OUT = cli.output_flag("out", None, "folder for data_n{N}/ and N{N}/", kind="folder")
_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/variance.py:experts,size=trained",
    "the experts or reference variance config whose n_list, total_params and train_run are "
    "trained", lock_config=True)
flags.mark_flag_as_required("out")


def main(argv):
  del argv
  vs = variance_settings.variance_spec(_CONFIG.value)  # the config read once
  for n, workdir in trained_sizes.train_all(vs, _OUT.value).items():
    print(f"N = {n}: {workdir}")


if __name__ == "__main__":
  cli.run(main)
