"""The seed run of the SOMA recipe (SPEC 3.4 step 1): one expert, SPSA on the body and
the delta rule on its own byte matrix E. Its body and E initialise every SOMA expert.

  python experiments/train.py --config=experiments/configs/seed.py:size=cpu \
      --config.data.dir=data/pystdlib_n1 --workdir=runs/seed

Arguments: size (tiny | cpu | paper) and width (model.d_t; 0 = the preset's). At
size=paper: width 32, n_pert = B = 64, lr = eps = 0.0025, about 1,000 updates. Any width
seeds a run of that width, e.g. seed.py:size=paper,width=509 for the warm width-509
monolith of the paper's App. I (its run: soma.py:n=1,size=paper --config.init_from=SEED).
"""

from soma_jax.config import base_config, parse_arg
from soma_jax.errors import UserError


def get_config(arg: str | None = None):
  a = parse_arg(arg, size="cpu", width=0)
  if a["width"] < 0:
    raise UserError(f"seed.py:width={a['width']}; use a positive width or 0 for the preset's")
  c = base_config(n=1, size=a["size"])
  c.model.shared_head = False  # the seed trains its own E with the delta rule
  c.opt.train_head = True
  if a["size"] == "paper":
    c.model.update(d_t=32)
    c.opt.update(lr=0.0025, weight_decay=0.0)
    c.spsa.eps = 0.0025
    c.steps = 1000
  if a["width"]:
    c.model.d_t = a["width"]
  return c
