"""Independent losses against their sum (the paper's Figure 4): SOMA N = 4 from one start,
same batches and directions, several seeds, routed test loss at checkpoints.

  python experiments/independent_vs_summed.py \
      --config=experiments/configs/independent_vs_summed.py:cpu --out=runs/indep_vs_summed

Argument: cpu (width-32 experts with one frozen shared head, as the paper's width-32
ensembles; about 20-40 minutes on 2 CPU cores) or tiny (tests). `train` is a complete
soma.py config, so e.g. --config.train.steps=1000 or --config.train.init_from=runs/seed.
"""

import os

import ml_collections

from soma_jax.config import load_config_file
from soma_jax.errors import UserError


def _soma(arg: str) -> ml_collections.ConfigDict:
  return load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "soma.py"), arg)


def get_config(arg: str | None = None):
  size = arg or "cpu"
  if size not in ("cpu", "tiny"):
    raise UserError(f"independent_vs_summed.py:{size}: use :cpu or :tiny")
  c = ml_collections.ConfigDict()
  c.data_dir = ""  # a prepared data dir with train.n_experts shards; "" = pystdlib under OUT/data
  c.seed = 0  # first seed: init, batches and directions (both variants share them)
  c.num_seeds = 3  # seeds seed .. seed + num_seeds - 1
  c.eval_every = 50 if size == "cpu" else 2  # updates between routed test evaluations
  c.test_windows = 0 if size == "cpu" else 8  # 0 = every test window; else the first this many
  c.bootstrap_draws = 2000 if size == "cpu" else 200  # per-seed paired document bootstrap draws
  c.train = _soma(f"n=4,size={size}")  # the SOMA training config both variants use
  if size == "cpu":
    # Width-32 experts sharing one frozen head (the paper's N = 4 setting); lr is constant:
    # with patience > steps the plateau rule never fires (and is not run here).
    c.train.model.update(d_t=32, shared_head=True)
    c.train.opt.train_head = False
    c.train.steps = 300  # updates per variant per seed (the paper: 1,000)
  else:
    c.train.model.update(shared_head=True)
    c.train.opt.train_head = False
    c.train.steps = 4
  return c
