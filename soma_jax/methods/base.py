"""The `Method` interface and the update bookkeeping every method's step shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from soma_jax import memory, train_state
from soma_jax.data import pipeline

PyTree = Any
# The newest checkpoint of a seed workdir: (body_N, head, its Method), or None.
Seed = tuple[PyTree, jax.Array, Any] | None


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """What a method's input iterator reads per update: B windows of T + 1 bytes, A times."""

  dir: str
  seq_len: int
  batch: int
  accum: int
  seed: int

  @property
  def tokens_per_update(self) -> int:
    """Sequence positions one expert reads per update: T x B x A."""
    return self.seq_len * self.batch * self.accum


def no_carry(n: int) -> tuple:
  """No state carried from update to update: TrainState.carry = ()."""
  del n
  return ()


class Method(NamedTuple):
  """One training method with its settings bound: `make(c)` of its module read the config
  once, and no field takes a config (optax style: the tuple is the whole interface).

  Fields are described in the `soma_jax.methods` docstring. A step config is hashable and
  static; `train_step` is jitted with `cfg` static and the state donated.
  """

  name: str  # config.method
  model: Hashable  # the model's static shape (model.ModelConfig, gru.GruConfig)
  init_params: Callable[[Seed], tuple[PyTree, jax.Array]]
  step_config: Callable[..., Hashable]
  train_step: Callable[..., tuple[train_state.TrainState, dict]]
  val_loss: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
  logits: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
  flops_per_token: int
  ops_per_update: int
  body_params: int
  ensemble_params: int
  width_for_params: Callable[[int], int]
  describe: dict
  plan_chunk: Callable[..., memory.ChunkChoice] | None = None
  sharded_step: Callable[..., Callable] | None = None
  generates: bool = True
  # The state carried from update to update (TrainState.carry) for n experts; and the
  # input iterator (experts, pooled) -> iterator with get_state / set_state.
  init_carry: Callable[[int], PyTree] = no_carry
  train_data: Callable[[list[int], bool], Any] | None = None
  # The model family ("lstm" or "gru"): a seed run seeds only a run of its own family.
  family: str = "lstm"
  # Config fields of the method's own section a resume may never change (they fix the
  # state's shapes), and its speed knobs that it may (checkpoint.check_resume).
  shape_keys: tuple[str, ...] = ()
  speed_keys: tuple[str, ...] = ()


def expert_batches(data: DataSettings, experts: list[int], pooled: bool) -> pipeline.TrainBatches:
  """Each expert's A batches of B windows of its own shard per update (every direction or
  member of an expert reads them): `pipeline.train_iterator`."""
  return pipeline.train_iterator(data.dir, experts, batch=data.batch, accum=data.accum,
                                 seq_len=data.seq_len, seed=data.seed, pooled=pooled)


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
