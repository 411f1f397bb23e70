"""Independent losses against their sum (the paper's Figure 4, App. J; SPEC 9.3): four experts
of a trained SOMA ensemble continued with their weights and Adam moments, heads frozen, lr
and eps fixed, on one fixed sample of each shard; same batches and directions in both arms.

  python experiments/independent_vs_summed.py \
      --config=experiments/configs/independent_vs_summed.py:cpu --out=runs/ivs \
      [--config.init_from=runs/soma_n8] [--config.experts=0,1,2,3]

Argument: cpu or tiny (tests). `init_from` names a trained SOMA workdir with >= 4 experts;
when it is "", the SOMA recipe is trained first (SPEC 3.4): `seed_run` into OUT/seed, then
`ensemble_run` (N = 8 at cpu, every expert copying the seed's body and sharing its frozen E)
into OUT/ensemble. The paper: experts 0-3 of a SOMA N = 8 after 2,000 updates, n_pert = B =
64, T = 1024, lr = eps = 1e-3, 1,000 updates, scored at 0, 250, 500, 1,000, 3 seeds.
"""

import os

import ml_collections

from soma_jax.config import load_config_file
from soma_jax.errors import UserError


def _sibling(name: str, arg: str) -> ml_collections.ConfigDict:
  return load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), arg)


# The CPU scale the seed, the ensemble and the continuation share: width 32 (the paper's
# width-32 ensembles), n_pert 4, B 4, T 256. Measured on the built-in corpus: the seed
# reaches expert validation 2.38 nats/byte in 1,000 updates (byte unigram about 3.45).
CPU_SHAPE = {"model.d_t": 32, "data.seq_len": 256, "spsa.n_pert": 4, "spsa.batch": 4}


def get_config(arg: str | None = None):
  size = arg or "cpu"
  if size not in ("cpu", "tiny"):
    raise UserError(f"independent_vs_summed.py:{size}: use :cpu or :tiny")
  cpu = size == "cpu"
  c = ml_collections.ConfigDict()
  c.init_from = ""  # a trained SOMA workdir (>= 4 experts); "" = train the recipe into OUT
  c.experts = "0,1,2,3"  # the four experts of that workdir to continue
  c.data_dir = ""  # "" = the workdir's own data dir (or pystdlib under OUT/data when training)
  c.seed = 0  # first seed: batches and directions (both variants share them)
  c.num_seeds = 3  # seeds seed .. seed + num_seeds - 1
  c.steps = 1000 if cpu else 4  # updates per variant per seed (the paper: 1,000)
  c.lr = c.eps = 1e-3  # fixed for the whole continuation (the paper's SOMA lr = eps)
  c.seq_len = 256 if cpu else 32  # T of the continuation's training windows
  c.spsa = ml_collections.ConfigDict()
  c.spsa.n_pert = 4 if cpu else 4  # directions per update (the paper: 64)
  c.spsa.batch = 4 if cpu else 2  # B (the paper: 64)
  c.spsa.probe = "sparse"  # the paper's recorded sparse probes
  c.spsa.pert_chunk = 1 if cpu else 4  # directions at once (speed only; 1 is fastest on 2 cores)
  c.sample_windows = 1024 if cpu else 16  # the fixed training sample, windows per shard
  c.sample_seed = 0  # draws that sample; the same for every seed and both variants
  c.test_windows = 0 if cpu else 8  # 0 = every test window; else the first this many
  c.bootstrap_draws = 2000 if cpu else 200  # per-seed paired document bootstrap draws

  # The shared-vs-separate variance study at the start and at every end state, on each
  # expert's own shard's expert-validation windows (T = 1024 at cpu), sparse probes.
  c.variance = _sibling("variance.py", f"shared_vs_separate,size={size}")
  if cpu:
    c.variance.update(seq_len=1024, batch=1, n_pert=16, n_pert_list=(4, 16), reps=32,
                      rep_chunk=4, dir_chunk=16)
  else:
    c.variance.update(n_pert=4, n_pert_list=(4,), reps=4, rep_chunk=4)
  c.variance.probe = "sparse"

  # The SOMA recipe, trained into OUT when init_from is "": the seed (one expert on all
  # shards pooled, SPSA on the body, the delta rule on its own E, lr = eps = 0.0025) ...
  c.seed_run = _sibling("seed.py", f"size={size}")
  c.seed_run.opt.lr = c.seed_run.spsa.eps = 0.0025
  c.seed_run.steps = 1000 if cpu else 4  # the paper: about 1,000 at n_pert = B = 64
  # ... then N experts copying its body and sharing its E, frozen (the paper: N = 8, 2,000).
  c.ensemble_run = _sibling("soma.py", f"n={8 if cpu else 4},size={size}")
  c.ensemble_run.model.shared_head = True
  c.ensemble_run.opt.train_head = False
  c.ensemble_run.opt.lr = c.ensemble_run.spsa.eps = 1e-3
  c.ensemble_run.steps = 2000 if cpu else 4
  for run in (c.seed_run, c.ensemble_run):
    run.ensemble_eval_every = 0
    if cpu:
      run.update_from_flattened_dict(CPU_SHAPE)
      run.update(eval_every=250, ckpt_every=500, log_every=250)
  return c
