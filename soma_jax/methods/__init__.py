"""Training methods: each module's `make(c) -> Method` reads its config once and returns a
`Method`, a NamedTuple of pure functions and counts with those settings bound; `MAKERS` is
the registry, and `spec.resolve` the one place a config's method is made.

  name, model, family     config.method; the model's static shape (ModelConfig / GruConfig)
                          and its family ("lstm" | "gru": a seed seeds only its own family)
  init_params(seed) -> (body_N, head)   this job's experts: fresh from the run's seed, or
                          warm from `seed` = (body_N, head, Method) of a seed checkpoint
  step_config(pert_chunk=None) -> cfg   the static (hashable) step settings, built once
                          per run; `pert_chunk` is the planner's choice for "auto"
  train_step(state, batch_NxAxBxT1, expert_ids_N, cfg) -> (state, metrics)
                          jitted, `cfg` static, `state` donated; metrics hold loss, finite,
                          lr, eps, skipped (all [N])
  val_loss(body, head_e, window_BxT1) -> nats/byte    one expert's expert-validation loss
  logits(body, head_e, inputs_BxT) -> [B, T, V]       for evaluation and the studies
  flops_per_token         forward operations per token of one expert (SPEC 7's F)
  ops_per_update          training operations of one update of one expert (SPEC 7)
  body_params, ensemble_params   parameters of one body / of all N experts and heads
  width_for_params(total) -> d_t    the width whose N experts come nearest to `total`
  describe                compare.py's columns: model, n_pert, directions_per_update, and
                          gradient ("zero-order", "exact (backprop)", "none (frozen bodies)")
  plan_chunk(n_local, mesh=None) -> memory.ChunkChoice   the pert_chunk planner, or None
                          where the step has no chunk to plan
  sharded_step(cfg, mesh, donate=True) -> step(state, batch, ids)   the step over a mesh, or
                          None where the method runs on one device only
  generates               its bodies can sample byte by byte (`generate`)
  init_carry(n)           the state carried between updates (TrainState.carry); by default
                          none, () (the GRU EGGROLL: each member's GRU state)
  train_data(experts, pooled)   its input iterator: each expert's batches of
                          `pipeline.train_iterator` (the GRU EGGROLL: each pair's stream)
  shape_keys, speed_keys  its own config fields a resume may never / may change

`make(c)` also refuses what the method cannot run (after the shared `config.validate`).
Adding a method is one module here with a `make` (`lstm.lstm_method(s, ...)` fills in
everything an LSTM method shares) and one line in `MAKERS`.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_collections

from soma_jax.errors import UserError
from soma_jax.methods import bptt, eggroll, eggroll_lstm, head_only, soma, soma15, soma_summed
from soma_jax.methods.base import Method, Seed

MAKERS: dict[str, Callable[[ml_collections.ConfigDict], Method]] = {
    "soma": soma.make,
    "bptt": bptt.make,
    "eggroll": eggroll.make,
    "eggroll_lstm": eggroll_lstm.make,
    "head_only": head_only.make,
    "soma_summed": soma_summed.make,
    "soma15": soma15.make,
}

__all__ = ["MAKERS", "Method", "Seed", "make"]


def make(c: ml_collections.ConfigDict) -> Method:
  """The Method of config.method, its settings read from `c` (already `config.validate`d)."""
  maker = MAKERS.get(c.method)
  if maker is None:
    raise UserError(f"method={c.method!r}; use one of {', '.join(MAKERS)}")
  return maker(c)
