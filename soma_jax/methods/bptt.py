"""BPTT (SPEC 6): the LSTM experts trained by `jax.grad` through the scan, per-expert Adam.

The gradient is `soma_jax.bptt.make_bptt_grad`; the update is the loop's per-expert Adam with
its plateau-scheduled learning rate and non-finite skip, as in every method.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections

from soma_jax import bptt as bptt_lib
from soma_jax import spsa, train_state
from soma_jax.errors import need
from soma_jax.methods import lstm
from soma_jax.methods.base import Method, adam_step


def _train_step(state: train_state.TrainState, batch_NxAxBxT1: jax.Array, expert_ids_N: jax.Array,
                cfg: spsa.StepConfig, key: jax.Array | None = None
                ) -> tuple[train_state.TrainState, dict]:
  """Backprop through the scan: gradients averaged over the A batches, per-expert Adam.

  With per-expert heads (`train_head`) E is trained by its exact gradient too.
  """
  del expert_ids_N, key  # nothing random
  if not cfg.model.shared_head and not cfg.train_head:
    raise ValueError("BPTT with per-expert heads trains them (opt.train_head=True)")
  mcfg = dataclasses.replace(cfg.model, shared_head=not cfg.train_head)
  grad_fn = bptt_lib.make_bptt_grad(mcfg)
  loss_NxA, grads_NxA = jax.vmap(grad_fn, in_axes=(None, None, 1))(
      state.body, state.head, batch_NxAxBxT1)
  loss_N = jnp.mean(loss_NxA, axis=0)
  grads = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads_NxA)
  g_body, g_head = (grads, None) if mcfg.shared_head else grads
  return adam_step(state, g_body, loss_N, cfg.weight_decay, g_head)


train_step = jax.jit(_train_step, static_argnames="cfg", donate_argnames="state")


def make(c: ml_collections.ConfigDict) -> Method:
  need(c.model.shared_head or c.opt.train_head,
       "method=bptt with per-expert heads trains them: set opt.train_head=True")
  s = lstm.settings(c)
  # SPEC 7: 3 A B T F per expert (a forward and a backward pass of about twice its cost).
  return lstm.lstm_method(s, train_step=train_step, ops_per_update=3 * lstm.forward_ops(s))
