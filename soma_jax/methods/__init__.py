"""Training methods: each is a `Method`, a NamedTuple of pure functions, in `METHODS`.

`METHODS` is the only place a method's name (config.method) is read: the training loop,
evaluation, generation, the studies and the benchmarks call `get(c)` and use its fields.

  init_params(c, seed) -> (body_N, head)   this job's experts: fresh from c.seed, or warm
                          from `seed` = (body_N, head, config) of c.init_from's checkpoint
  step_config(c, pert_chunk=None) -> cfg   the static (hashable) step settings, built once
                          per run; `pert_chunk` is the planner's choice for "auto"
  train_step(state, batch_NxAxBxT1, expert_ids_N, cfg) -> (state, metrics)
                          jitted, `cfg` static, `state` donated; metrics hold loss, finite,
                          lr, eps, skipped (all [N])
  val_loss(body, head_e, window_BxT1) -> nats/byte    one expert's expert-validation loss
  logits(body, head_e, inputs_BxT) -> [B, T, V]       for evaluation and the studies
  flops_per_token(c)      forward operations per token of one expert (SPEC 7's F)
  ops_per_update(c)       training operations of one update of one expert (SPEC 7)
  body_params(c), ensemble_params(c)   parameters of one body / of all N experts and heads
  width_for_params(total, c) -> d_t    the width whose N experts come nearest to `total`
  validate(c)             UserError for a setting this method cannot run (after the
                          shared checks of `config.validate`)
  describe(c) -> dict     compare.py's columns: model, n_pert, directions_per_update
  plan_chunk(c, n_local, mesh=None) -> memory.ChunkChoice   the pert_chunk planner, or
                          None where the step has no chunk to plan
  sharded_step(cfg, mesh, donate=True) -> step(state, batch, ids)   the step over a mesh, or None
                          where the method runs on one device only
  generates               its bodies can sample byte by byte (`generate`)
  table_rank              where compare.py's table lists the method (smaller first)
  init_carry(c, n)        the state carried between updates (TrainState.carry); by default
                          none, () (the GRU EGGROLL: each member's GRU state)
  train_data(c, experts, pooled)   its input iterator; by default each expert's batches of
                          `pipeline.train_iterator` (the GRU EGGROLL: each pair's stream)

Adding a method is one module here that builds a `Method` (`lstm.lstm_method(...)` fills
in everything an LSTM method shares) and one line in `METHODS`.
"""

from __future__ import annotations

import ml_collections

from soma_jax import config as config_lib
from soma_jax import memory
from soma_jax.errors import UserError
from soma_jax.methods import bptt, eggroll, eggroll_lstm, head_only, soma, soma_summed
from soma_jax.methods.base import Method, Seed

METHODS: dict[str, Method] = {
    "soma": soma.METHOD,
    "bptt": bptt.METHOD,
    "eggroll": eggroll.METHOD,
    "eggroll_lstm": eggroll_lstm.METHOD,
    "head_only": head_only.METHOD,
    "soma_summed": soma_summed.METHOD,
}

__all__ = ["METHODS", "Method", "Seed", "choose_chunk", "get", "validate"]


def get(c: ml_collections.ConfigDict) -> Method:
  """The Method of config.method."""
  method = METHODS.get(c.method)
  if method is None:
    raise UserError(f"method={c.method!r}; use one of {', '.join(METHODS)}")
  return method


def validate(c: ml_collections.ConfigDict) -> None:
  """Every check of a training config: the shared ones (config.validate), then the method's."""
  method = get(c)
  config_lib.validate(c)
  method.validate(c)


def choose_chunk(c: ml_collections.ConfigDict, n_local: int, mesh=None) -> memory.ChunkChoice:
  """The method's pert_chunk plan for this device, or chunk 1 where it has none."""
  method = get(c)
  if method.plan_chunk is None:
    return memory.ChunkChoice(1, -1, memory.device_limit_bytes(), f"method={c.method}: unused")
  return method.plan_chunk(c, n_local, mesh)
