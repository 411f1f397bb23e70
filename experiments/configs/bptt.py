"""BPTT baseline: the SOMA expert architecture trained with jax.grad through the scan and
Adam (SPEC 6), for N = 1 (pooled shards) or N experts each on its own shard.

  python experiments/train.py --config=experiments/configs/bptt.py:n=1,size=cpu \
      --config.data.dir=DATA --workdir=runs/bptt_n1

Per-expert heads are trained by their exact gradient; a shared head stays frozen.
"""

from soma_jax.config import base_config, parse_arg


def get_config(arg: str | None = None):
  a = parse_arg(arg, n=1, size="cpu")
  c = base_config(n=a["n"], size=a["size"])
  c.method = "bptt"
  c.opt.lr = 3e-3  # backprop tolerates (and needs) a larger step than SPSA at this scale
  return c
