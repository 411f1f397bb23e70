"""The paper's Table 4 / Figure 1 at small scale (SPEC 6-8): SOMA N = 2 against monolithic
SPSA at three n_pert, the GRU EGGROLL and BPTT, at about equal total parameters and equal
arithmetic budget, each over several optimisation seeds, all scored on the same test windows.

  python experiments/compare.py --config=experiments/configs/compare.py:cpu --out=runs/compare

Argument: cpu (3 seeds x 6 methods at 2e12 operations each: about 40 minutes on 2 busy
CPU cores) or tiny (tests: under a minute).
Each method is a complete training config from its own config file (soma.py, eggroll.py,
bptt.py), so any field can be changed, e.g. --config.methods.bptt.opt.lr=1e-3.
The monoliths are the paper's App. I.1 controls: one model of SOMA's total size, SOMA's
batch (the same B sequences of T bytes per update) and 1x, 4x and 16x SOMA's directions
per update, all evaluated on that one batch (the paper's 64 / 256 / 1024 against SOMA's 64).
"""

import os

import ml_collections

from soma_jax.config import load_config_file
from soma_jax.errors import UserError


def _method(file: str, arg: str) -> ml_collections.ConfigDict:
  """get_config(arg) of a sibling config file (soma.py, bptt.py, eggroll.py)."""
  return load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), file), arg)


def get_config(arg: str | None = None):
  size = arg or "cpu"
  if size not in ("cpu", "tiny"):
    raise UserError(f"compare.py:{size}: use compare.py:cpu or compare.py:tiny")
  c = ml_collections.ConfigDict()
  c.data_dir = ""  # a prepared data dir with 2 shards; "" = prepare pystdlib under OUT/data
  c.seeds = 3 if size == "cpu" else 2  # optimisation seeds per method (init, data order, noise)
  c.first_seed = 0  # seeds first_seed .. first_seed + seeds - 1; seed s also seeds its bootstrap
  c.budget_ops = 2e12 if size == "cpu" else 1.5e8  # training operations per method and seed
  c.match_params = True  # set every other method's width so its total params match `reference`
  c.reference = "soma_n2"  # the method whose size others match and differences are taken from
  c.curve_points = 4 if size == "cpu" else 1  # checkpoints per run scored for figure 1
  c.test_windows = 0 if size == "cpu" else 16  # 0 = every test window; else the first this many
  c.bootstrap_draws = 10_000 if size == "cpu" else 1000  # paired document bootstrap draws

  # Every method: a full training config. n_experts, n_pert and batch come from the file and
  # its argument; width (unless reference), steps and checkpointing are set by the budget.
  n_pert = 16 if size == "cpu" else 4  # SOMA's directions per update at this size
  c.methods = ml_collections.ConfigDict()
  c.rows = ml_collections.ConfigDict()  # the paper's Table 4 row each method stands for
  c.methods.soma_n2 = _method("soma.py", f"n=2,size={size}")  # SOMA, N = 2, own heads
  c.rows.soma_n2 = "SOMA N = 2 (paper: n_pert 64, B 64 per expert)"
  for mult, paper in ((1, 64), (4, 256), (16, 1024)):  # monolithic SPSA, SOMA's batch
    name = f"mono_k{n_pert * mult}"
    c.methods[name] = _method("soma.py", f"mono={n_pert * mult},size={size}")
    c.rows[name] = f"monolithic SPSA n_pert = {paper} (paper), {mult}x SOMA's directions, B = SOMA's"
  c.methods.eggroll = _method("eggroll.py", f"n=1,size={size}")  # the paper's GRU, rank 1
  c.rows.eggroll = ("EGGROLL: the reference LM's 6-layer GRU, rank-1 ES, each pair on its own "
                    "stream (paper: pop 2^20, 100 bytes per stream update)")
  c.methods.bptt = _method("bptt.py", f"n=1,size={size}")  # backprop, one model
  c.rows.bptt = "BPTT: one LSTM model of the same size, backprop + Adam"
  return c
