"""Layers both expert models share (the SOMA LSTM in `model`, the EGGROLL GRU in `gru`).

A leaf module: it imports no other part of soma_jax, so the two models never import each
other. Every matrix goes through `linear`, which also takes a `LowRank` perturbed weight.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

VOCAB = 256
GAIN_KEY = "scale"  # LayerNorm gains: dense +-1 under sparse probes (SPEC 3.1).


class LowRank(NamedTuple):
  """A weight w [in, out] plus the rank-r perturbation (B A^T), kept factored.

  In EGGROLL's notation W = w^T is (a x b) = (out x in), A is (out x r), B is (in x r),
  and the forward pass is x W^T + (x B) A^T.
  """

  w: jax.Array
  a: jax.Array  # [out, r], already scaled by sign * sigma / sqrt(r)
  b: jax.Array  # [in, r]


def linear(x: jax.Array, w: jax.Array | LowRank) -> jax.Array:
  """x @ w for a plain weight, x @ w + (x B) A^T for a low-rank perturbed one."""
  if isinstance(w, LowRank):
    return x @ w.w + (x @ w.b) @ w.a.T
  return x @ w


def layer_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-5) -> jax.Array:
  """Gain-only LayerNorm over the last axis."""
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * scale


def cross_entropy(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
  """Per-position cross entropy in nats [B, T]."""
  logz = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  picked = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None].astype(jnp.int32), -1)
  return logz - picked[..., 0]
