"""Merge independent expert-slice jobs (`--config.experts=a:b`) into one ensemble workdir.

  python experiments/merge.py --out=runs/soma_n4 runs/soma_n4_0-2 runs/soma_n4_2-4

Refuses jobs that are not slices of one run (config, prepared data, step, head).
"""

import json

from absl import flags

from soma_jax import cli, merge

_OUT = cli.output_flag("out", None, "new workdir for the merged ensemble", kind="folder")
flags.mark_flag_as_required("out")


def main(argv):
  print(json.dumps(merge.merge(argv[1:], cli.workdir_flag(_OUT.value, "--out"))))


if __name__ == "__main__":
  cli.run(main, positional=True)
