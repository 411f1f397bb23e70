"""The `Method` interface and the update bookkeeping every method's step shares."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from soma_jax import memory, train_state
from soma_jax.data import pipeline

PyTree = Any
Config = ml_collections.ConfigDict
# The newest checkpoint of a seed workdir: (body_N, head, its config), or None.
Seed = tuple[PyTree, jax.Array, Config] | None


def no_carry(c: Config, n: int) -> tuple:
  """No state carried from update to update: TrainState.carry = ()."""
  del c, n
  return ()


def expert_batches(c: Config, experts: list[int], pooled: bool) -> pipeline.TrainBatches:
  """Each expert's A batches of B windows of its own shard per update (every direction or
  member of an expert reads them): `pipeline.train_iterator`."""
  return pipeline.train_iterator(c.data.dir, experts, batch=c.spsa.batch, accum=c.spsa.accum,
                                 seq_len=c.data.seq_len, seed=c.seed, pooled=pooled)


class Method(NamedTuple):
  """One training method as pure functions (optax style: the tuple is the whole interface).

  Fields are described in the `soma_jax.methods` docstring. A step config is hashable and
  static; `train_step` is jitted with `cfg` static and the state donated.
  """

  init_params: Callable[[Config, Seed], tuple[PyTree, jax.Array]]
  step_config: Callable[[Config, int | None], Hashable]
  train_step: Callable[..., tuple[train_state.TrainState, dict]]
  val_loss: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
  logits: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
  flops_per_token: Callable[[Config], int]
  ops_per_update: Callable[[Config], int]
  body_params: Callable[[Config], int]
  ensemble_params: Callable[[Config], int]
  width_for_params: Callable[[int, Config], int]
  validate: Callable[[Config], None]
  describe: Callable[[Config], dict]
  plan_chunk: Callable[..., memory.ChunkChoice] | None = None
  sharded_step: Callable[[Hashable, Any], Callable] | None = None
  generates: bool = True
  table_rank: int = 3
  # The state carried from update to update (TrainState.carry) for this job's N experts;
  # and the input iterator (c, experts, pooled) -> iterator with get_state / set_state.
  init_carry: Callable[[Config, int], PyTree] = no_carry
  train_data: Callable[[Config, list[int], bool], Any] = expert_batches
  # The model family ("lstm" or "gru"): a seed run seeds only a run of its own family.
  family: str = "lstm"
  # Config fields of the method's own section a resume may never change (they fix the
  # state's shapes), and its speed knobs that it may (checkpoint.check_resume).
  shape_keys: tuple[str, ...] = ()
  speed_keys: tuple[str, ...] = ()


def tokens_per_update(c: Config) -> int:
  """Sequence positions one expert reads per update: T x B x A."""
  return c.data.seq_len * c.spsa.batch * c.spsa.accum


def update_heads(state: train_state.TrainState, grads_head_N, ok_N, tx):
  """Adam on the per-expert heads with their gradient, or the heads unchanged (None)."""
  if grads_head_N is None:
    return state.head, state.head_opt
  return train_state.apply_updates(tx, state.head, state.head_opt, grads_head_N, state.sched.lr, ok_N)


def adam_step(state: train_state.TrainState, g_body_N, loss_N, weight_decay: float, g_head_N=None):
  """Per-expert Adam on the bodies (and heads), skipping experts with a non-finite loss."""
  tx = train_state.adam(weight_decay)
  ok_N = jax.vmap(train_state.all_finite)(g_body_N) & jnp.isfinite(loss_N)
  body, opt = train_state.apply_updates(tx, state.body, state.opt, g_body_N, state.sched.lr, ok_N)
  head, head_opt = update_heads(state, g_head_N, ok_N, tx)
  return train_state.finish_update(state, body, opt, head, head_opt, loss_N, ok_N)
