"""Gradient-variance studies of SPEC 5 on fixed weights and fixed batches.

  python experiments/variance.py --config=experiments/configs/variance.py:shared_vs_separate \
      --out=runs/variance --x64 [--workdir=runs/soma_n4] [--config.data_dir=data/pystdlib_n4]

The argument is STUDY[,size=tiny|cpu|trained]: shared_vs_separate | n_pert | experts | batch |
reference. Without --workdir the weights are a fresh init from `seed`; without
`data_dir` the windows are real text from this Python's standard library. With --workdir
the weights are that run's newest checkpoint and the windows its own shards' expert-
validation windows (expert e on shard e). size=trained follows SPEC 9.5 at CPU scale, for a
trained --workdir: T = 1024 windows, sparse probes where the study chooses one
(shared_vs_separate; n_pert measures sparse and dense side by side); the windows are each
expert's own shard's expert-validation windows, where the paper uses ensemble-validation
chunks.

The experts and reference studies compare N experts of one total size, so at size=trained
each N of n_list is its own trained run: `trained_dir` holds one SOMA workdir per N,
DIR/N{n}, every one trained by `train_run` (same updates, n_pert, B and T) at the width
`total_params` gives that N. `python -m scripts.train_sizes` trains them:

  python -m scripts.train_sizes --config=experiments/configs/variance.py:experts,size=trained \
      --out=runs/trained_sizes
  python experiments/variance.py --config=experiments/configs/variance.py:experts,size=trained \
      --config.trained_dir=runs/trained_sizes --x64 --out=runs/variance
"""

import os

import ml_collections

from soma_jax.config import load_config_file, parse_arg
from soma_jax.errors import UserError
from soma_jax.studies.variance import STUDIES  # the one list of the variance studies

PER_N = ("experts", "reference")  # the studies that compare N experts of one total size



def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  study, _, rest = (arg or "").partition(",")
  if study not in STUDIES:
    raise UserError(f"study {study!r} is unknown; use variance.py:STUDY[,size=tiny|cpu] with "
                    f"STUDY one of {', '.join(STUDIES)}")
  a = parse_arg(rest, size="cpu")
  if a["size"] not in ("tiny", "cpu", "trained"):
    raise UserError(f"size={a['size']!r}; use tiny, cpu or trained")
  if a["size"] == "trained" and study not in ("shared_vs_separate", "n_pert", *PER_N):
    raise UserError(f"size=trained: the {study} study has no trained preset; fix: size=cpu")
  c = _fields(study, a["size"])
  c.update(STUDY_SETTINGS.get(study, {}))
  if study in PER_N:
    c.update(_per_n_fields(a["size"]))
  if a["size"] == "trained":  # trained runs, 1,024-byte windows (SPEC 9.5)
    c.update(seq_len=1024, batch=1, probe="sparse")
    c.update(TRAINED[study])
  if a["size"] == "tiny":  # unit tests: seconds
    c.update(TINY_ALL, **TINY.get(study, {}))
  return c


def _fields(study: str, size: str) -> ml_collections.ConfigDict:
  """Every field, at the cpu size's values."""
  c = ml_collections.ConfigDict()
  c.study = study  # which study runs; output files are OUT/STUDY.{json,csv,png}
  c.size = size  # preset the defaults below come from
  c.seed = 0  # fresh-init key and window selection
  c.probe_seed = 0  # base key of every direction: probe_key(key(probe_seed), step, e, 0, j)
  c.eps = 1e-3  # central-difference scale (the O(eps^2) bias is negligible at this size)
  # Probe of the shared_vs_separate, experts and reference studies: sparse, as the paper
  # recorded them (rademacher = dense; the n_pert study measures both).
  c.probe = "sparse"
  c.reps = 64  # independent repeats (steps 0..reps-1); error bars are over these
  c.rep_chunk = 4  # repeats evaluated at once (memory ~ rep_chunk * dir_chunk copies)
  c.dir_chunk = 16  # directions evaluated at once (pert_chunk of spsa.estimate)
  c.n_experts = 1  # experts for the n_pert and batch studies (shared_vs_separate uses 4)
  c.n_pert = 16  # headline n_pert: the ratio's n_pert, the experts study, reference base
  c.n_pert_list = (1, 2, 4, 8, 16, 32, 64)  # n_pert values (shared_vs_separate, n_pert)
  c.batch = 4  # B: windows in the fixed batch; the reference study's base B
  c.seq_len = 64  # T: targets per window
  c.data_dir = ""  # a prepared data dir (expert-validation windows); "" = stdlib text
  # (or, with --workdir, the run's own data dir)
  c.expert_shards = ""  # the shard of each expert, e.g. "4,5,6,7"; "" = expert e on shard e
  c.weights = ""  # set by --workdir: which trained weights were measured
  c.corpus_bytes = 1 << 21  # stdlib bytes read when data_dir is ""
  c.pool = 256  # windows per expert behind the batch draws (zero-order batches)
  c.ref_batch = 1024  # reference: windows per expert of the BPTT reference, disjoint from pool
  c.budget = 64  # batch study: n_pert * B held fixed along the trade-off
  c.accum_list = (1, 2, 4)  # batch study: A accumulated batches
  c.accum_batch = 4  # batch study: b windows per accumulated batch
  c.accum_n_pert = 4  # batch study: directions per accumulated batch
  c.n_list = (1, 2, 8, 32)  # experts / reference studies: expert counts N
  # Experts study (and both per-N studies at size=trained): each N's width is the one whose
  # ensemble count (SPEC 2: N heads when wide, one shared at width d_E) is nearest this.
  # 0 = N bodies that together match one body of width model.d_t (the reference study).
  c.total_params = 2_000_000
  c.alloc_mult = (1, 2, 4, 8)  # reference: n_pert and B allocations, multiples of the base
  c.time_steps = 3  # reference: timed train steps per allocation (after one compile)

  c.model = ml_collections.ConfigDict()
  c.model.d_t = 32  # body width (ignored by the experts study, which sizes from N)
  c.model.d_e = 32  # byte-embedding width d_E
  c.model.depth = 2  # residual blocks D
  return c


# Repeats and sizes each study needs at the cpu size (the fields it changes).
STUDY_SETTINGS = {
    "n_pert": dict(reps=64),  # 64 repeats of 64 directions: 4,096 draws behind every point
    # an N = 1 expert at 2M parameters: keep one repeat's directions
    "experts": dict(reps=8, rep_chunk=1),
    "reference": dict(
        n_list=(1, 2, 4, 8),  # N allocation at the base model's body size
        n_pert=8, reps=16,
        total_params=0,  # each N's bodies together hold one width-d_t body
    ),
    "batch": dict(reps=32, pool=128),
}


def _sibling(name: str, arg: str) -> ml_collections.ConfigDict:
  return load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), arg)


def _per_n_fields(size: str) -> dict:
  """The experts and reference studies' trained runs: where they are, how they are trained."""
  # The recipe of every N's run (soma.py; n_experts and the width set per N, each expert its
  # own head trained by the delta rule, as the paper's wide controls): same updates, n_pert,
  # B and T for every N, so each expert reads B T bytes of its own shard per update.
  r = _sibling("soma.py", f"n=1,size={'tiny' if size == 'tiny' else 'cpu'}")
  r.model.shared_head, r.opt.train_head = False, True
  r.ensemble_eval_every = -1  # the study needs the weights only
  if size == "tiny":
    r.update(steps=4, eval_every=2, ckpt_every=2, log_every=2)
  else:
    # The Figure 4 recipe's CPU shape (experiments/configs/independent_vs_summed.py:cpu): n_pert
    # 4, B 4, T 256; lr = eps = 0.0025 and weight decay 1e-4 as the paper's wide controls.
    r.spsa.update(n_pert=4, batch=4, eps=0.0025)
    r.data.seq_len = 256
    r.opt.update(lr=0.0025, weight_decay=1e-4)
    r.update(steps=1000, eval_every=250, ckpt_every=500, log_every=250)
  return dict(
      trained_dir="",  # a folder of trained workdirs N{n}/ (scripts/train_sizes.py); "" = fresh
      # The reference study's windows with a data dir: "expert_val" (expert e's own shard) or
      # "ensemble_val" (the ensemble-validation chunks SPEC 9.5 names, the same for every
      # expert).
      windows="expert_val",
      trained_source="pystdlib",  # the corpus train_sizes prepares into N shards for each N
      train_run=r,
  )


# size=trained: each study's fields beyond T = 1024, B = 1 and sparse probes (batch has none).
TRAINED = {
    "shared_vs_separate": dict(n_pert_list=(4, 16, 64), n_pert=16, reps=24),
    "n_pert": dict(n_pert_list=(1, 4, 16, 64), reps=16),
    # the experts and reference studies: one trained run per N
    "experts": dict(total_params=500_000, n_list=(1, 2, 4, 8), n_pert=16, reps=16, rep_chunk=4),
    # T = 1024 windows of the ensemble-validation split, one window per zero-order batch;
    # rep_chunk 1: the loss keeps [copies, windows, T, 256] float64 logits of a repeat
    "reference": dict(total_params=500_000, n_list=(1, 2, 4, 8), windows="ensemble_val",
                      n_pert=4, alloc_mult=(1, 2, 4), reps=16, rep_chunk=1, pool=32,
                      ref_batch=128, time_steps=2),
}

# size=tiny (unit tests: seconds): every study's fields, then each study's own.
TINY_ALL = dict(model=dict(d_t=8, d_e=8), batch=2, seq_len=32, corpus_bytes=1 << 18, pool=32,
                n_pert=16)
TINY = {
    "shared_vs_separate": dict(n_pert_list=(4, 16), reps=128, rep_chunk=16),
    "n_pert": dict(n_pert_list=(1, 4, 16, 64), reps=64, rep_chunk=8),
    "experts": dict(n_list=(1, 2), total_params=12_000, n_pert=8, reps=8, rep_chunk=4),
    "batch": dict(budget=16, accum_list=(1, 2), accum_batch=4, accum_n_pert=4, reps=8),
    "reference": dict(n_list=(1, 2), alloc_mult=(1, 2), n_pert=4, reps=8, time_steps=1,
                      ref_batch=64),
}
