"""The BPTT baseline: SOMA's expert architecture trained with `jax.grad` (SPEC section 6).

N experts train at once with a leading N axis and `vmap`: each expert has its own loss on
its own batch [N, B, T+1], its own gradient and its own optimiser state; nothing is
reduced across experts (an optimiser's global-norm clipping is per expert too). With
`model_cfg.shared_head` the byte matrix E [V, d_E] is shared and frozen and only the
bodies train; otherwise each expert trains its own E ([N, V, d_E]) with its body.

  body_N, head = model.init_experts(key, model_cfg, n)
  opt = optax.adam(1e-3)
  opt_state = init_bptt(opt, body_N, head, model_cfg)
  step = jax.jit(make_bptt_step(model_cfg, opt))
  body_N, head, opt_state, loss_N = step(body_N, head, opt_state, batch_NxBxT1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

from soma_jax import model

PyTree = Any


def trainable(body_N: PyTree, head: jax.Array, model_cfg: model.ModelConfig) -> PyTree:
  """What BPTT updates: the bodies, plus the per-expert heads when they are not shared."""
  return body_N if model_cfg.shared_head else (body_N, head)


def _expert_loss(params: PyTree, head: jax.Array, window_BxT1: jax.Array, shared: bool):
  body, embed = (params, head) if shared else params
  return model.loss(body, embed, window_BxT1)


def make_bptt_grad(model_cfg: model.ModelConfig
                   ) -> Callable[[PyTree, jax.Array, jax.Array], tuple[jax.Array, PyTree]]:
  """`grad_fn(body_N, head, batch_NxBxT1) -> (loss_N, grads_N)`, grads shaped as `trainable`."""
  shared = model_cfg.shared_head
  vg = jax.value_and_grad(lambda p, h, b: _expert_loss(p, h, b, shared))

  def grad_fn(body_N, head, batch_NxBxT1):
    params_N = trainable(body_N, head, model_cfg)
    return jax.vmap(vg, in_axes=(0, None, 0))(params_N, head if shared else None, batch_NxBxT1)

  return grad_fn


def init_bptt(optimizer: optax.GradientTransformation, body_N: PyTree, head: jax.Array,
              model_cfg: model.ModelConfig) -> optax.OptState:
  """One optimiser state per expert (leading N axis)."""
  return jax.vmap(optimizer.init)(trainable(body_N, head, model_cfg))


def make_bptt_step(model_cfg: model.ModelConfig, optimizer: optax.GradientTransformation
                   ) -> Callable[..., tuple[PyTree, jax.Array, optax.OptState, jax.Array]]:
  """A pure, jittable `step(body_N, head, opt_state, batch_NxBxT1)`.

  Returns `(body_N, head, opt_state, loss_N)`; `head` comes back unchanged when shared.
  `loss_N` is each expert's loss before its update.
  """
  grad_fn = make_bptt_grad(model_cfg)

  def update(params, grads, opt_state):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def step(body_N, head, opt_state, batch_NxBxT1):
    loss_N, grads_N = grad_fn(body_N, head, batch_NxBxT1)
    params_N, opt_state = jax.vmap(update)(trainable(body_N, head, model_cfg), grads_N, opt_state)
    if model_cfg.shared_head:
      return params_N, head, opt_state, loss_N
    body_N, head = params_N
    return body_N, head, opt_state, loss_N

  return step
