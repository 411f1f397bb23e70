"""EGGROLL baseline (SPEC 6): the paper's model, a 6-layer byte-level GRU with an untied
head (`soma_jax.gru`), trained by evolution strategies with rank-1 perturbations applied
inside the matmuls (x W^T + (x B) A^T), antithetic pairs, z-scored fitness, Adam.

  python experiments/train.py --config=experiments/configs/eggroll.py:n=1,size=cpu \
      --config.data.dir=DATA --workdir=runs/eggroll [--config.eggroll.pop=1024]

Arguments: n (models, default 1), size (tiny | cpu | paper), model (gru | lstm). The GRU
width is model.d_t and its layers model.depth; every parameter, head included, is in the
ES update. `model=lstm` is an extra that is not the paper's row: the same ES on the SOMA
LSTM expert (method=eggroll_lstm), with SOMA's delta-rule head.
"""

from soma_jax.config import base_config, parse_arg
from soma_jax.errors import UserError


def get_config(arg: str | None = None):
  a = parse_arg(arg, n=1, size="cpu", model="gru")
  if a["model"] not in ("gru", "lstm"):
    raise UserError(f"eggroll.py:model={a['model']}; use model=gru (the paper's) or model=lstm")
  c = base_config(n=a["n"], size=a["size"])
  if a["model"] == "gru":
    c.method = "eggroll"
    c.model.update(depth=6, shared_head=True)  # the head lives in the GRU body
    c.opt.train_head = False
  else:
    c.method = "eggroll_lstm"
  if a["size"] == "cpu":
    c.eggroll.update(pop=128, pop_chunk=32, sigma=1e-2)
    c.spsa.batch = 1  # sequences of 1,024 bytes per member per update
  if a["size"] == "paper":
    c.spsa.batch = 256  # the paper's EGGROLL batch
    c.data.seq_len = 128  # about 100 bytes per update in the paper
  return c
