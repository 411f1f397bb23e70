"""EGGROLL baseline (SPEC 6): evolution strategies with rank-r perturbations applied inside
the matmuls (x W^T + (x B) A^T), antithetic pairs, z-scored fitness, Adam, on the SOMA
LSTM expert. The paper's GRU reproduction model is `soma_jax.gru` (see benchmarks/eggroll.py).

  python experiments/train.py --config=experiments/configs/eggroll.py:n=1,size=cpu \
      --config.data.dir=DATA --workdir=runs/eggroll [--config.eggroll.pop=1024]

`bytes` sets the sequence length per member (the paper: 100 bytes per update, rounded
here to a divisor of 1024).
"""

from soma_jax.config import base_config, parse_arg


def get_config(arg: str | None = None):
  a = parse_arg(arg, n=1, size="cpu")
  c = base_config(n=a["n"], size=a["size"])
  c.method = "eggroll"
  if a["size"] == "cpu":
    c.eggroll.update(pop=128, pop_chunk=32, sigma=1e-2)
    c.spsa.batch = 4  # sequences per member per update
  if a["size"] == "paper":
    c.spsa.batch = 256  # the paper's EGGROLL batch
    c.data.seq_len = 128  # about 100 bytes per update in the paper
  return c
