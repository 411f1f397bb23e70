"""What every training method's state shares: the TrainState, per-expert Adam, the plateau
schedule, and finishing an update (SPEC 3.3).

SOMA's estimator (`spsa`), BPTT, head-only and EGGROLL all keep their state here; none of
them imports another method's file to hold it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from soma_jax import memory
from soma_jax import model as model_lib

PyTree = Any


def adam(weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
  """Adam with bias correction and coupled weight decay (lambda theta added to g_hat).

  The learning rate is applied outside, per expert, so each expert keeps its own schedule.
  """
  return optax.chain(optax.add_decayed_weights(weight_decay), optax.scale_by_adam(b1, b2, eps))


@struct.dataclass
class Plateau:
  """Per-expert plateau schedule state (SPEC 3.3); all fields have a leading N axis."""

  lr: jax.Array
  eps: jax.Array
  best: jax.Array  # best expert-validation loss so far
  since: jax.Array  # update count at the last improvement (or the last decay)


@dataclasses.dataclass(frozen=True)
class PlateauConfig:
  patience: int = 1000  # updates without improvement before halving lr and eps
  factor: float = 0.5
  min_delta: float = 1e-8
  floor: float = 1e-5


def plateau_init(lr_N: jax.Array, eps_N: jax.Array) -> Plateau:
  n = lr_N.shape[0]
  return Plateau(lr=lr_N, eps=eps_N, best=jnp.full((n,), jnp.inf, lr_N.dtype),
                 since=jnp.zeros((n,), jnp.int32))


def plateau_update(p: Plateau, val_loss_N: jax.Array, step, cfg: PlateauConfig) -> Plateau:
  """After an expert validation at update `step`: halve lr and eps together on a plateau."""
  improved = val_loss_N < p.best - cfg.min_delta
  stale = ~improved & (step - p.since >= cfg.patience)
  decay = lambda x: jnp.where(stale, jnp.maximum(x * cfg.factor, cfg.floor), x)
  return Plateau(
      lr=decay(p.lr), eps=decay(p.eps),
      best=jnp.where(improved, val_loss_N, p.best),
      since=jnp.where(improved | stale, step, p.since).astype(jnp.int32))


@struct.dataclass
class TrainState:
  """Everything an update changes; `step` drives every random draw."""

  step: jax.Array  # int32 scalar: updates taken
  body: PyTree  # leading N
  head: jax.Array  # [V, d_E] shared, or [N, V, d_E]
  opt: PyTree  # Adam state of the bodies, leading N
  head_opt: PyTree  # Adam state of the heads ([N, ...]), or () when the head is frozen
  sched: Plateau
  skipped: jax.Array  # [N] int32: updates skipped for a non-finite loss
  # method=eggroll: each member's GRU state carried to the next update, [N, pop, depth, d]
  # (the streams of soma_jax.data.pipeline.StreamSegments); () for every other method.
  carry: PyTree = ()


def init_state(body_N: PyTree, head: jax.Array, lr: float, eps: float,
               weight_decay: float = 0.0, train_head: bool = False, carry: PyTree = ()
               ) -> TrainState:
  """Step 0 of N experts: fresh Adam state (of the heads too where they train), lr and eps."""
  n = jax.tree.leaves(body_N)[0].shape[0]
  tx = adam(weight_decay)
  head_opt = jax.vmap(tx.init)(head) if train_head else ()
  return TrainState(
      step=jnp.zeros((), jnp.int32), body=body_N, head=head, opt=jax.vmap(tx.init)(body_N),
      head_opt=head_opt,
      sched=plateau_init(jnp.full((n,), lr, jnp.float32), jnp.full((n,), eps, jnp.float32)),
      skipped=jnp.zeros((n,), jnp.int32), carry=carry)


def all_finite(tree: PyTree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def apply_update(tx, params, opt, grad, lr, ok):
  """One expert's Adam step scaled by its own lr; nothing changes where `ok` is False."""
  updates, new_opt = tx.update(grad, opt, params)
  new_params = jax.tree.map(lambda p, u: jnp.where(ok, p - lr * u, p), params, updates)
  new_opt = jax.tree.map(lambda new, old: jnp.where(ok, new, old), new_opt, opt)
  return new_params, new_opt


def apply_updates(tx, params_N, opt_N, grad_N, lr_N, ok_N):
  """`apply_update` for every expert (leading N axis on every argument)."""
  return jax.vmap(functools.partial(apply_update, tx))(params_N, opt_N, grad_N, lr_N, ok_N)


def finish_update(state: TrainState, body, opt, head, head_opt, loss_N: jax.Array,
                  ok_N: jax.Array) -> tuple[TrainState, dict]:
  """The new state (step + 1, skip counters) and the metrics every method's step reports:
  loss, finite, lr, eps, skipped (all [N])."""
  new = state.replace(step=state.step + 1, body=body, head=head, opt=opt, head_opt=head_opt,
                      skipped=state.skipped + (~ok_N).astype(jnp.int32))
  return new, {"loss": loss_N, "finite": ok_N, "lr": state.sched.lr, "eps": state.sched.eps,
               "skipped": new.skipped}


def expert_losses(body_N: PyTree, head: jax.Array, windows_NxBxT1: jax.Array,
                  shared_head: bool = True, loss_fn: Callable = model_lib.streamed_loss
                  ) -> jax.Array:
  """Each expert's mean loss on its own windows, [N] (expert validation).

  `loss_fn(body, head_e, windows)` is the method's validation loss; the LSTM's is streamed
  in time blocks (memory independent of T). Like all evaluation, with full float32
  matmuls whatever the training precision (SPEC 3.3).
  """
  with memory.full_precision():
    return jax.vmap(loss_fn, in_axes=(0, None if shared_head else 0, 0))(
        body_N, head, windows_NxBxT1)
