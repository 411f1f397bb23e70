"""The seed run of the SOMA recipe (SPEC 3.4 step 1): one expert, SPSA on the body and
the delta rule on its own byte matrix E. Its body and E initialise every SOMA expert.

  python experiments/train.py --config=experiments/configs/seed.py:size=cpu \
      --config.data.dir=data/pystdlib_n1 --workdir=runs/seed

At size=paper: width 32, n_pert = B = 64, lr 0.0025, about 1,000 updates.
"""

from soma_jax.config import base_config, parse_arg


def get_config(arg: str | None = None):
  a = parse_arg(arg, size="cpu")
  c = base_config(n=1, size=a["size"])
  c.model.shared_head = False  # the seed trains its own E with the delta rule
  c.opt.train_head = True
  if a["size"] == "paper":
    c.model.update(d_t=32)
    c.opt.update(lr=0.0025, weight_decay=0.0)
    c.spsa.eps = 0.0025
    c.steps = 1000
  return c
