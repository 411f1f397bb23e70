"""The EGGROLL reproduction model: a multi-layer byte-level GRU LM with an untied head.

SPEC section 6 ("6-layer GRU, untied head"). Parameters are a plain pytree:

  params = {"embed": [V, d], "layers": [layer] * depth, "ln_f": {"scale": [d]},
            "head": [d, V]}
  layer  = {"ln": {"scale": [d]}, "w_x": [d, 3d], "w_h": [d, 3d], "b": [3d]}

Each layer is pre-norm residual, `x = x + GRU(LN(x))`, gates ordered (r, z, n). Every
matrix is applied through `layers.linear` (and the embedding through `embed`), so an
EGGROLL `LowRank` leaf works anywhere without forming the full update. The input-side
gate pre-activations are one matmul over all B*T positions before the recurrent scan.

  cfg = GruConfig(d=256)
  params = init_gru(key, cfg)
  nats = gru_loss(params, window_BxT1)   # mean next-byte cross entropy
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from soma_jax.layers import GAIN_KEY, VOCAB, LowRank, cross_entropy, layer_norm, linear

PyTree = Any


@dataclasses.dataclass(frozen=True)
class GruConfig:
  """Shape of the GRU LM."""

  d: int  # hidden width
  depth: int = 6  # stacked GRU layers
  vocab: int = VOCAB


def embed(table_VxD: jax.Array | LowRank, ids_BxT: jax.Array) -> jax.Array:
  """Row lookup; for a LowRank table (w [V, d], a [d, r], b [V, r]) adds b[ids] a^T.

  This is the one-hot form of `linear`: onehot(ids) @ (w + b a^T).
  """
  ids = ids_BxT.astype(jnp.int32)
  if isinstance(table_VxD, LowRank):
    return jnp.take(table_VxD.w, ids, axis=0) + jnp.take(table_VxD.b, ids, axis=0) @ table_VxD.a.T
  return jnp.take(table_VxD, ids, axis=0)


def gru(p: dict, x_BxTxD: jax.Array) -> jax.Array:
  """GRU from a zero state over [B, T, d]; only h @ w_h runs inside the scan."""
  d = x_BxTxD.shape[-1]
  gx_TxBx3D = jnp.swapaxes(linear(x_BxTxD, p["w_x"]) + p["b"], 0, 1)
  h0_BxD = jnp.zeros(x_BxTxD.shape[:1] + (d,), x_BxTxD.dtype)

  def cell(h_BxD, gx_Bx3D):
    gh_Bx3D = linear(h_BxD, p["w_h"])
    xr, xz, xn = jnp.split(gx_Bx3D, 3, axis=-1)
    hr, hz, hn = jnp.split(gh_Bx3D, 3, axis=-1)
    r = jax.nn.sigmoid(xr + hr)
    z = jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    h_BxD = (1.0 - z) * n + z * h_BxD
    return h_BxD, h_BxD

  _, h_TxBxD = jax.lax.scan(cell, h0_BxD, gx_TxBx3D)
  return jnp.swapaxes(h_TxBxD, 0, 1)


def gru_logits(params: PyTree, inputs_BxT: jax.Array) -> jax.Array:
  """Next-byte logits [B, T, V]."""
  x = embed(params["embed"], inputs_BxT)
  for layer in params["layers"]:
    x = x + gru(layer, layer_norm(x, layer["ln"][GAIN_KEY]))
  x = layer_norm(x, params["ln_f"][GAIN_KEY])
  return linear(x, params["head"])


def gru_loss(params: PyTree, window_BxT1: jax.Array) -> jax.Array:
  """Mean next-byte cross entropy (nats/byte) on windows of T + 1 bytes."""
  out = gru_logits(params, window_BxT1[:, :-1])
  return jnp.mean(cross_entropy(out, window_BxT1[:, 1:]))


def init_gru(key: jax.Array, cfg: GruConfig) -> PyTree:
  """Scaled-normal matrices, unit gains, zero biases, a small head (loss ~ ln V at init)."""
  d = cfg.d
  keys = iter(jax.random.split(key, 2 * cfg.depth + 2))

  def dense(fan_in: int, fan_out: int, scale: float = 1.0) -> jax.Array:
    init = nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")
    return init(next(keys), (fan_in, fan_out), jnp.float32)

  gain = lambda: {GAIN_KEY: jnp.ones((d,), jnp.float32)}
  layers = [{
      "ln": gain(),
      "w_x": dense(d, 3 * d),
      "w_h": dense(d, 3 * d),
      "b": jnp.zeros((3 * d,), jnp.float32),
  } for _ in range(cfg.depth)]
  return {
      "embed": jax.random.normal(next(keys), (cfg.vocab, d), jnp.float32),
      "layers": layers,
      "ln_f": gain(),
      "head": dense(d, cfg.vocab, scale=1e-4),  # logits std ~0.01
  }
