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
"""

import ml_collections

from soma_jax.config import parse_arg
from soma_jax.errors import UserError

STUDIES = ("shared_vs_separate", "n_pert", "experts", "batch", "reference")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  study, _, rest = (arg or "").partition(",")
  if study not in STUDIES:
    raise UserError(f"study {study!r} is unknown; use variance.py:STUDY[,size=tiny|cpu] with "
                    f"STUDY one of {', '.join(STUDIES)}")
  a = parse_arg(rest, size="cpu")
  if a["size"] not in ("tiny", "cpu", "trained"):
    raise UserError(f"size={a['size']!r}; use tiny, cpu or trained")
  if a["size"] == "trained" and study not in ("shared_vs_separate", "n_pert"):
    raise UserError(f"size=trained measures a trained --workdir; the {study} study sizes fresh "
                    "experts for each N; fix: size=cpu")
  c = _fields(study, a["size"])
  _study_settings(c, study)
  if a["size"] == "trained":  # a trained width-32 run, 1,024-byte windows (SPEC 9.5)
    c.update(seq_len=1024, batch=1, probe="sparse")
    if study == "shared_vs_separate":
      c.update(n_pert_list=(4, 16, 64), n_pert=16, reps=24)
    elif study == "n_pert":
      c.update(n_pert_list=(1, 4, 16, 64), reps=16)
  if a["size"] == "tiny":  # unit tests: seconds
    _tiny(c, study)
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
  c.total_params = 2_000_000  # experts study: ensemble size from the count formula
  c.alloc_mult = (1, 2, 4, 8)  # reference: n_pert and B allocations, multiples of the base
  c.time_steps = 3  # reference: timed train steps per allocation (after one compile)

  c.model = ml_collections.ConfigDict()
  c.model.d_t = 32  # body width (ignored by the experts study, which sizes from N)
  c.model.d_e = 32  # byte-embedding width d_E
  c.model.depth = 2  # residual blocks D
  return c


def _study_settings(c: ml_collections.ConfigDict, study: str) -> None:
  """Repeats and sizes each study needs at the cpu size."""
  if study == "n_pert":
    c.reps = 64  # 64 repeats of 64 directions: 4,096 draws behind every point
  if study == "experts":
    c.reps = 8
    c.rep_chunk = 1  # an N = 1 expert at 2M parameters: keep one repeat's directions
  if study == "reference":
    c.n_list = (1, 2, 4, 8)  # N allocation at the base model's body size
    c.n_pert, c.reps = 8, 16
  if study == "batch":
    c.reps = 32
    c.pool = 128


def _tiny(c: ml_collections.ConfigDict, study: str) -> None:
  """Unit tests: seconds."""
  c.model.update(d_t=8, d_e=8)
  c.update(batch=2, seq_len=32, corpus_bytes=1 << 18, pool=32, n_pert=16)
  if study == "shared_vs_separate":
    c.update(n_pert_list=(4, 16), reps=128, rep_chunk=16)
  elif study == "n_pert":
    c.update(n_pert_list=(1, 4, 16, 64), reps=64, rep_chunk=8)
  elif study == "experts":
    c.update(n_list=(1, 2), total_params=12_000, n_pert=8, reps=8, rep_chunk=4)
  elif study == "batch":
    c.update(budget=16, accum_list=(1, 2), accum_batch=4, accum_n_pert=4, reps=8)
  elif study == "reference":
    c.update(n_list=(1, 2), alloc_mult=(1, 2), n_pert=4, reps=8, time_steps=1, ref_batch=64)
