"""What a variance study (`variance.py`) is given: its settings (`VarianceSpec`), read once from
its config (experiments/configs/variance.py), and each N's experts: sized to the study's total
(`sized_model`) or one trained run per N (`Trained`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, NamedTuple

import jax
import ml_collections

from soma_jax import model as model_lib
from soma_jax import sizing
from soma_jax.variance_measure import PyTree


@dataclasses.dataclass(frozen=True)
class VarianceSpec:
  """A variance study's settings (experiments/configs/variance.py), read once from its config
  by `variance_spec`; the studies read these, and `config` only goes into the results."""

  study: str  # which study runs, a key of STUDIES
  size: str  # the preset the defaults come from: tiny, cpu or trained
  seed: int  # fresh-init key and window selection
  probe_seed: int  # base key of every direction
  eps: float  # central-difference scale
  probe: str  # probe of the shared_vs_separate, experts and reference studies
  reps: int  # independent repeats; error bars are over these
  rep_chunk: int  # repeats evaluated at once
  dir_chunk: int  # directions evaluated at once
  n_experts: int  # experts of the n_pert and batch studies
  n_pert: int  # the headline n_pert
  n_pert_list: tuple[int, ...]  # n_pert values (shared_vs_separate, n_pert)
  batch: int  # B: windows in the fixed batch; the reference study's base B
  seq_len: int  # T: targets per window
  data_dir: str  # a prepared data dir; "" = stdlib text
  expert_shards: str  # the shard of each expert, "4,5,6,7"; "" = expert e on shard e
  weights: str  # which trained weights are measured; "" = none named
  corpus_bytes: int  # stdlib bytes read when data_dir is ""
  pool: int  # windows per expert behind the batch draws
  ref_batch: int  # reference: windows per expert of the BPTT reference
  budget: int  # batch study: n_pert * B held fixed
  accum_list: tuple[int, ...]  # batch study: A accumulated batches
  accum_batch: int  # batch study: windows per accumulated batch
  accum_n_pert: int  # batch study: directions per accumulated batch
  n_list: tuple[int, ...]  # experts / reference studies: expert counts N
  total_params: int  # each N's ensemble size; 0 = N bodies that hold one model.d_t body
  alloc_mult: tuple[int, ...]  # reference: multiples of the base n_pert and B
  time_steps: int  # reference: timed train steps per allocation
  model: model_lib.ModelConfig  # model.d_t, d_e and depth, one shared head
  windows: str  # reference windows with a data dir: expert_val or ensemble_val
  trained_dir: str | None  # the folder of trained runs per N; None: the study has none
  trained_source: str | None  # the corpus train_sizes prepares for each N
  train_run: ml_collections.ConfigDict | None  # the recipe of every N's training run
  config: ml_collections.ConfigDict  # the config all of this is read from, for the results


def variance_spec(c: ml_collections.ConfigDict) -> VarianceSpec:
  """The `VarianceSpec` of a variance config (experiments/configs/variance.py:STUDY); the
  per-N fields (trained_dir, windows, trained_source, train_run) only where the study has
  them."""
  m = c.model
  return VarianceSpec(
      study=c.study, size=c.size, seed=c.seed, probe_seed=c.probe_seed, eps=c.eps,
      probe=c.probe, reps=c.reps, rep_chunk=c.rep_chunk, dir_chunk=c.dir_chunk,
      n_experts=c.n_experts, n_pert=c.n_pert, n_pert_list=tuple(c.n_pert_list), batch=c.batch,
      seq_len=c.seq_len, data_dir=c.data_dir, expert_shards=c.get("expert_shards", ""),
      weights=c.get("weights", ""), corpus_bytes=c.corpus_bytes, pool=c.pool,
      ref_batch=c.ref_batch, budget=c.budget, accum_list=tuple(c.accum_list),
      accum_batch=c.accum_batch, accum_n_pert=c.accum_n_pert, n_list=tuple(c.n_list),
      total_params=c.total_params, alloc_mult=tuple(c.alloc_mult), time_steps=c.time_steps,
      model=model_lib.ModelConfig(d_t=m.d_t, d_e=m.d_e, depth=m.depth, shared_head=True),
      windows=c.get("windows", "expert_val"), trained_dir=c.get("trained_dir"),
      trained_source=c.get("trained_source"), train_run=c.get("train_run"), config=c)


def with_changes(vs: VarianceSpec, **changes: Any) -> VarianceSpec:
  """`vs` read again from a copy of its config with `changes` made (a dict value updates the
  sub-config of its key), e.g. the model and weights of a trained run it measures."""
  changed = copy.deepcopy(vs.config)
  with changed.unlocked():
    for key, value in changes.items():
      if isinstance(value, dict):
        changed[key].update(value)
      else:
        changed[key] = value
  return variance_spec(changed)


class Trained(NamedTuple):
  """One N's trained run, as the experts and reference studies read it (`trained_sizes`)."""

  body: PyTree  # the N bodies, stacked
  head: jax.Array  # [N, V, d_E] own heads, or one shared [V, d_E]
  model: model_lib.ModelConfig  # the run's model
  data_dir: str  # the run's data dir (expert e trained on shard e)
  weights: str  # which weights: the workdir and its update
  run: dict  # the run's record for the results (its recipe, validation loss, seconds)


def sized_model(vs: VarianceSpec, n: int) -> model_lib.ModelConfig:
  """N experts at the study's size: the width whose ensemble count (SPEC 2) is nearest
  `total_params`, or, when it is 0, N bodies that together hold one width-model.d_t body."""
  d_e, depth = vs.model.d_e, vs.model.depth
  if vs.total_params:
    return sizing.sized_config(vs.total_params, n, d_e, depth)
  m_total = sizing.body_count(vs.model.d_t, d_e, depth)
  d_t = min(range(1, 4097), key=lambda x: abs(n * sizing.body_count(x, d_e, depth) - m_total))
  return model_lib.ModelConfig(d_t=d_t, d_e=d_e, depth=depth, shared_head=True)
