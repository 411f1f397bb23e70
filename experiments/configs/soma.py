"""SOMA: N independent SPSA experts, each on its own shard (SPEC 3).

  python experiments/train.py --config=experiments/configs/soma.py:n=2,size=cpu \
      --config.data.dir=data/pystdlib_n2 --workdir=runs/soma_n2 \
      [--config.init_from=runs/seed] [--config.spsa.n_pert=64]

Arguments: n (experts, default 4), size (tiny | cpu | paper). `n=1` at the paper size is
the monolithic SPSA control; `mono=K` is the monolith with K directions per update, all
on the same batch as SOMA (spsa.n_pert = K, spsa.accum = 1, SOMA's spsa.batch), the
paper's n_pert = 256 and 1024 controls (App. I.1) at `mono=256` / `mono=1024`.
`--config.method=soma15` trains the same run with 1.5-SPSA's curvature-scaled estimate
(config.spsa15, docs/spsa15.md).
"""

from soma_jax.config import base_config, parse_arg


def get_config(arg: str | None = None):
  a = parse_arg(arg, n=4, size="cpu", mono=0)
  c = base_config(n=1 if a["mono"] else a["n"], size=a["size"])
  if a["mono"]:
    # One model, K directions evaluated on one batch of SOMA's B sequences per update.
    c.spsa.update(n_pert=a["mono"], accum=1)
  return c
