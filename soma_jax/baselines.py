"""BPTT and EGGROLL as first-class training methods: steps on the same `TrainState`.

Each step has the signature of `spsa.train_step(state, batch_NxAxBxT1, expert_ids_N, cfg)`
and returns the same metrics, so the training loop, checkpoints, expert validation,
the plateau schedule and evaluation are shared by every method.

`method=eggroll` is the paper's EGGROLL (SPEC 6): a `depth`-layer GRU of width `d_t`
with an untied head (`soma_jax.gru`), every parameter in `TrainState.body`; its
`TrainState.head` is an unused zero placeholder (shared, frozen), and `model.logits`
runs the GRU for a GRU body. `method=eggroll_lstm` is the extra: the same ES on the
SOMA LSTM body, with the delta-rule head when per-expert heads are trained.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from soma_jax import bptt as bptt_lib
from soma_jax import eggroll as eggroll_lib
from soma_jax import gru as gru_lib
from soma_jax import model as model_lib
from soma_jax import spsa

GRU_METHOD = "eggroll"  # the method whose model is the GRU


def gru_config(c) -> gru_lib.GruConfig:
  """The GRU of a method=eggroll config: width model.d_t, model.depth layers."""
  return gru_lib.GruConfig(d=c.model.d_t, depth=c.model.depth)


def flops_per_token(c, mcfg: model_lib.ModelConfig) -> int:
  """Forward operations per token of the config's model (GRU or SOMA LSTM expert)."""
  if c.method == GRU_METHOD:
    return gru_lib.gru_flops_per_token(gru_config(c))
  return model_lib.flops_per_token(mcfg)


def body_params(c, mcfg: model_lib.ModelConfig) -> int:
  """Parameters of one expert's body (a GRU's includes its embedding and head)."""
  if c.method == GRU_METHOD:
    return gru_lib.gru_params(gru_config(c))
  return model_lib.body_params(mcfg)


def ensemble_params(c, mcfg: model_lib.ModelConfig) -> int:
  """Total trained parameters of the config's N experts (GRU or LSTM with its heads)."""
  if c.method == GRU_METHOD:  # the body holds the GRU's own head
    return c.n_experts * body_params(c, mcfg)
  return model_lib.ensemble_params(mcfg, c.n_experts)


def init_gru_experts(c) -> tuple[dict, jax.Array]:
  """N GRUs from the run's seed (body_N) and the unused shared-head placeholder [V, d_E]."""
  keys = jax.random.split(jax.random.key(c.seed), c.n_experts)
  body_N = jax.vmap(lambda k: gru_lib.init_gru(k, gru_config(c)))(keys)
  return body_N, jnp.zeros((model_lib.VOCAB, c.model.d_e), jnp.float32)


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

  The A batches are concatenated into one batch of A*B sequences per member. A GRU body
  carries its own head (ES trains it); an LSTM body with per-expert heads has E follow
  the delta rule, as in SOMA.
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
