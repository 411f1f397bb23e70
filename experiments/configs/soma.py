"""SOMA: N independent SPSA experts, each on its own shard (SPEC 3).

  python experiments/train.py --config=experiments/configs/soma.py:n=2,size=cpu \
      --config.data.dir=data/pystdlib_n2 --workdir=runs/soma_n2 \
      [--config.init_from=runs/seed] [--config.spsa.n_pert=64]

Arguments: n (experts, default 4), size (tiny | cpu | paper). `n=1` at the paper size is
the monolithic SPSA control; `mono=256` / `mono=1024` give the larger-n_pert monoliths
(DDPP-style accumulation: 4 and 16 batches of 64, each with 64 fresh directions).
"""

from soma_jax.config import base_config, parse_arg


def get_config(arg: str | None = None):
  a = parse_arg(arg, n=4, size="cpu", mono=0)
  c = base_config(n=1 if a["mono"] else a["n"], size=a["size"])
  if a["mono"]:
    # Monolithic SPSA with n_pert = mono directions per update, as accumulated batches of
    # n_pert / accum, the way the paper ran its n_pert = 256 and 1024 controls.
    c.spsa.accum = max(1, a["mono"] // c.spsa.n_pert)
  return c
