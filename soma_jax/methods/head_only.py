"""The head-only control of the paper comparison (SPEC 9.1 here): SOMA's experts with their
bodies frozen, only each expert's own head trained by the delta rule (SPEC 3.2).

No SPSA estimate is formed and the bodies and their Adam state are never touched, so what
this method learns from SOMA's start, data and update count is what the heads alone buy.
One forward pass per window gives both the logged loss and the delta rule's features.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from soma_jax import model as model_lib
from soma_jax import spsa, train_state
from soma_jax.errors import need
from soma_jax.layers import cross_entropy
from soma_jax.methods import lstm
from soma_jax.methods.base import Method, update_heads


def _expert(body, head_VxE: jax.Array, batch_AxBxT1: jax.Array):
  """(loss, delta-rule gradient of E) of one expert, averaged over its A batches."""
  def one(batch_BxT1):
    h_BxTxE = model_lib.features(body, head_VxE, batch_BxT1[:, :-1])
    targets = batch_BxT1[:, 1:]
    loss = jnp.mean(cross_entropy(h_BxTxE @ head_VxE.T, targets))
    return loss, spsa.delta_rule_grad(h_BxTxE, head_VxE, targets)

  loss_A, g_AxVxE = jax.vmap(one)(batch_AxBxT1)
  return jnp.mean(loss_A), jnp.mean(g_AxVxE, axis=0)


def _train_step(state: train_state.TrainState, batch_NxAxBxT1: jax.Array, expert_ids_N: jax.Array,
                cfg: spsa.StepConfig, key: jax.Array | None = None
                ) -> tuple[train_state.TrainState, dict]:
  """Delta rule on every expert's head at its frozen body; the bodies stay as they are."""
  del expert_ids_N, key  # nothing random
  loss_N, g_head_N = jax.vmap(_expert)(state.body, state.head, batch_NxAxBxT1)
  ok_N = jnp.isfinite(loss_N) & jax.vmap(train_state.all_finite)(g_head_N)
  head, head_opt = update_heads(state, g_head_N, ok_N, train_state.adam(cfg.weight_decay))
  return train_state.finish_update(state, state.body, state.opt, head, head_opt, loss_N, ok_N)


train_step = jax.jit(_train_step, static_argnames="cfg", donate_argnames="state")


def make(c: ml_collections.ConfigDict) -> Method:
  need(not c.model.shared_head and c.opt.train_head,
       "method=head_only trains each expert's own head: set model.shared_head=False and "
       "opt.train_head=True")
  s = lstm.settings(c)
  # SPEC 7 with one forward pass per window (the features the delta rule holds fixed).
  return lstm.lstm_method(s, train_step=train_step, ops_per_update=lstm.forward_ops(s),
                          describe={**lstm.describe(s), "gradient": "none (frozen bodies)"})
