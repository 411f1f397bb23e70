"""Layers both expert models share (the SOMA LSTM in `model`, the EGGROLL GRU in `gru`).

A leaf module: it imports no other part of soma_jax, so the two models never import each
other. Every matrix goes through `linear`, which also takes a `LowRank` perturbed weight
(EGGROLL) and a `Split` one (SPSA's split forward).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

VOCAB = 256
GAIN_KEY = "scale"  # LayerNorm gains: dense +-1 under sparse probes (SPEC 3.1).
RECURRENT_KEY = "w_h"  # the recurrent matrix (read at every time step): spsa.forward=split_recurrence
# How a perturbed copy applies theta + s eps z (spsa.forward): "direct" forms each copy's
# weights; "split" applies every matrix as x theta + s eps (x z) (`Split`),
# "split_recurrence" only the recurrent w_h (where each copy's own weights are read at
# every time step).
FORWARDS = ("direct", "split", "split_recurrence")


class LowRank(NamedTuple):
  """A weight w [in, out] plus the rank-r perturbation (B A^T), kept factored.

  In EGGROLL's notation W = w^T is (a x b) = (out x in), A is (out x r), B is (in x r),
  and the forward pass is x W^T + (x B) A^T.
  """

  w: jax.Array
  a: jax.Array  # [out, r], already scaled by sign * sigma / sqrt(r)
  b: jax.Array  # [in, r]


class Split(NamedTuple):
  """A perturbed weight w + scale z applied as x w + scale (x z): SPSA's split forward.

  Under `vmap` over directions and signs, x w is one matmul of every perturbed copy's rows
  against the one unperturbed w, and x z one per direction with both signs' rows stacked,
  so z is read once per +- pair (`probe_product`).
  """

  w: jax.Array  # [in, out], unperturbed
  z: jax.Array  # [in, out], the probe: bfloat16 when ternary (exact), else float32
  scale: jax.Array  # sign * eps, a scalar


def probe_product(x: jax.Array, z: jax.Array) -> jax.Array:
  """x @ z for the split forward's correction, in float32 accuracy.

  A bfloat16 z (a ternary probe, exact) meets x as two bfloat16 parts, hi = bf16(x) and
  lo = bf16(x - hi), with |x - hi - lo| <= 2^-16 |x|, in one bf16 matmul with float32
  accumulation (both parts' rows stacked, so z is read once); a single bf16 x would put a
  relative error of order 2^-9 on each SPSA coefficient, since the difference of the two
  perturbed losses comes from the correction alone. A float32 z (gaussian probes) meets
  float32 x at the step's precision.
  """
  if z.dtype != jnp.bfloat16:
    return x @ z
  hi = x.astype(jnp.bfloat16)
  parts = jnp.stack([hi, (x - hi.astype(x.dtype)).astype(jnp.bfloat16)])
  out = jax.lax.dot_general(parts, z, (((parts.ndim - 1,), (0,)), ((), ())),
                            precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
                            preferred_element_type=x.dtype)
  return out[0] + out[1]


def linear(x: jax.Array, w: jax.Array | LowRank | Split) -> jax.Array:
  """x @ w for a plain weight, x @ w + (x B) A^T for a low-rank perturbed one, and
  x @ w + scale (x @ z) for a split one."""
  if isinstance(w, LowRank):
    return x @ w.w + (x @ w.b) @ w.a.T
  if isinstance(w, Split):
    return x @ w.w + w.scale * probe_product(x, w.z)
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
