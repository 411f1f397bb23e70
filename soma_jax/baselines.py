"""BPTT and EGGROLL as first-class training methods: steps on the same `TrainState`.

Each step has the signature of `spsa.train_step(state, batch_NxAxBxT1, expert_ids_N, cfg)`
and returns the same metrics, so the training loop, checkpoints, expert validation,
the plateau schedule and evaluation are shared by every method.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from soma_jax import bptt as bptt_lib
from soma_jax import eggroll as eggroll_lib
from soma_jax import model as model_lib
from soma_jax import spsa


def _finish(state: spsa.TrainState, body, opt, head, head_opt, loss_N, ok_N):
  new = state.replace(step=state.step + 1, body=body, opt=opt, head=head, head_opt=head_opt,
                      skipped=state.skipped + (~ok_N).astype(jnp.int32))
  return new, {"loss": loss_N, "finite": ok_N, "lr": state.sched.lr, "eps": state.sched.eps,
               "skipped": new.skipped}


def _update_heads(state, grads_head_N, ok_N, tx):
  if grads_head_N is None:
    return state.head, state.head_opt
  return spsa.apply_updates(
      tx, state.head, state.head_opt, grads_head_N, state.sched.lr, ok_N)


def bptt_train_step(state: spsa.TrainState, batch_NxAxBxT1: jax.Array, expert_ids_N: jax.Array,
                    cfg: spsa.StepConfig) -> tuple[spsa.TrainState, dict]:
  """Backprop through the scan: gradients averaged over the A batches, per-expert Adam.

  With per-expert heads (`train_head`) E is trained by its exact gradient too.
  """
  del expert_ids_N
  if not cfg.model.shared_head and not cfg.train_head:
    raise ValueError("BPTT with per-expert heads trains them (opt.train_head=True)")
  mcfg = dataclasses.replace(cfg.model, shared_head=not cfg.train_head)
  grad_fn = bptt_lib.make_bptt_grad(mcfg)
  loss_NxA, grads_NxA = jax.vmap(grad_fn, in_axes=(None, None, 1))(
      state.body, state.head, batch_NxAxBxT1)
  loss_N = jnp.mean(loss_NxA, axis=0)
  grads = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads_NxA)
  g_body, g_head = (grads, None) if mcfg.shared_head else grads
  tx = spsa.adam(cfg.weight_decay)
  ok_N = jax.vmap(spsa.all_finite)(g_body) & jnp.isfinite(loss_N)
  body, opt = spsa.apply_updates(
      tx, state.body, state.opt, g_body, state.sched.lr, ok_N)
  head, head_opt = _update_heads(state, g_head, ok_N, tx)
  return _finish(state, body, opt, head, head_opt, loss_N, ok_N)


@dataclasses.dataclass(frozen=True)
class EggrollStepConfig:
  step: spsa.StepConfig
  es: eggroll_lib.EggrollConfig


def eggroll_train_step(state: spsa.TrainState, batch_NxAxBxT1: jax.Array,
                       expert_ids_N: jax.Array, cfg: EggrollStepConfig
                       ) -> tuple[spsa.TrainState, dict]:
  """EGGROLL on each expert's body (its own population, key and loss), then Adam.

  The A batches are concatenated into one batch of A*B sequences per member. With
  per-expert heads E follows the delta rule, as in SOMA.
  """
  scfg = cfg.step
  head_axis = None if scfg.model.shared_head else 0
  base_key = jax.random.key(scfg.seed)

  def one(body, head_e, batch_AxBxT1, e):
    windows = batch_AxBxT1.reshape((-1,) + batch_AxBxT1.shape[2:])
    loss_fn = lambda b, w: model_lib.loss(b, head_e, w)
    g, m = eggroll_lib.estimate(body, windows, jax.random.fold_in(base_key, e), state.step,
                                loss_fn, cfg.es)
    return g, m["loss_mean"]

  g_N, loss_N = jax.vmap(one, in_axes=(0, head_axis, 0, 0))(
      state.body, state.head, batch_NxAxBxT1, expert_ids_N)
  tx = spsa.adam(scfg.weight_decay)
  ok_N = jax.vmap(spsa.all_finite)(g_N) & jnp.isfinite(loss_N)
  body, opt = spsa.apply_updates(
      tx, state.body, state.opt, g_N, state.sched.lr, ok_N)
  g_head = jax.vmap(spsa.head_grad)(state.body, state.head, batch_NxAxBxT1) \
      if scfg.train_head else None
  head, head_opt = _update_heads(state, g_head, ok_N, tx)
  return _finish(state, body, opt, head, head_opt, loss_N, ok_N)
