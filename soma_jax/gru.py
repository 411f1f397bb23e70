"""The EGGROLL reproduction model: the EGGROLL reference LM's GRU block, byte level.

SPEC 9.4. Parameters are a plain pytree:

  params = {"embed": [V, d], "layers": [layer] * depth, "ln_f": {"scale": [d]},
            "head": [d, V]}
  layer  = {"ln1": {"scale": [d]}, "w_f": [d, d], "u_f": [d, d], "b_f": [d],
            "w_h": [d, d], "u_h": [d, d], "b_h": [d],
            "ln2": {"scale": [d]}, "mlp_up": [d, 4d], "mlp_down": [4d, d]}

Each layer is two pre-norm residual sublayers, `x = x + Mixer(LN(x))` then
`x = x + MLP(LN(x))`, with a two-gate GRU mixer

  f  = sigmoid(W_f x + U_f h + b_f)
  c  = tanh(W_h x + U_h (f * h) + b_h)
  h' = h + f * (c - h)               (the sublayer's output is h')

and a 4x ReLU MLP without biases: 12 d^2 + 4 d weights per layer, so depth 6 at
d = 339 holds 8,456,355 parameters with the untied embedding and head (Table 4's
8.44M row; `python -m soma_jax.sizing --table` lists it).

Read from the EGGROLL reference LM (ESHyperscale/nano-egg, GPL-3; ideas only, no code):
confirmed there are the layer's order (LN, GRU mixer, residual, LN, MLP d -> 4d -> d
without biases, residual), the two gates above with their biases, the untied head after a
final norm, and each matrix applied as `x W / sqrt(fan_in)` to unit-scale weights
(N(0, 1) entries) while the embedding is a plain lookup. The perturbation scale
sigma = 2^-sigma_shift is in those units (see `soma_jax.eggroll`), so this model keeps them:
every matrix is stored with N(0, 1) entries and scaled by 1 / sqrt(fan_in) in the forward.
What differs: the reference computes in int8 fixed point, where sigmoid, tanh and (since
its commit 2c13d9c) the MLP's ReLU are identities and saturation comes from clipping to
[-127, 127]; here (the paper's FP32 runs) they are the real sigmoid, tanh and ReLU.
Its norm divides by the mean absolute value; here it is `layers.layer_norm` (gain only).
Its head starts at unit scale; here the head starts small (std 1e-2), so the initial loss
is about ln 256 as in the rest of the project.

Every matrix reaches the maths through `layers.linear` (and the embedding through `embed`),
so an EGGROLL `LowRank` leaf works anywhere without forming the full update. The input-side
gate pre-activations are matmuls over all B*T positions before the recurrent scan, which
runs only the U products. The hidden state of every layer can be carried in and out
(`gru_forward`), with per-position resets, for streams that continue from update to update.

  cfg = GruConfig(d=256)
  params = init_gru(key, cfg)
  nats = gru_loss(params, window_BxT1)   # mean next-byte cross entropy, zero initial state
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from soma_jax.layers import GAIN_KEY, VOCAB, LowRank, cross_entropy, layer_norm, linear

PyTree = Any
MLP_MULT = 4  # the MLP's hidden width, in multiples of d
HEAD_INIT_STD = 1e-2  # logits std ~0.01 at init: loss ~ ln V


@dataclasses.dataclass(frozen=True)
class GruConfig:
  """Shape of the GRU LM."""

  d: int  # hidden width
  depth: int = 6  # stacked layers (mixer + MLP each)
  vocab: int = VOCAB


def embed(table_VxD: jax.Array | LowRank, ids_BxT: jax.Array) -> jax.Array:
  """Row lookup; for a LowRank table (w [V, d], a [d, r], b [V, r]) adds b[ids] a^T.

  This is the one-hot form of `linear`: onehot(ids) @ (w + b a^T).
  """
  ids = ids_BxT.astype(jnp.int32)
  if isinstance(table_VxD, LowRank):
    return jnp.take(table_VxD.w, ids, axis=0) + jnp.take(table_VxD.b, ids, axis=0) @ table_VxD.a.T
  return jnp.take(table_VxD, ids, axis=0)


def dense(x: jax.Array, w: jax.Array | LowRank) -> jax.Array:
  """x W / sqrt(fan_in): unit-scale weights, scaled in the forward (as the reference)."""
  fan_in = (w.w if isinstance(w, LowRank) else w).shape[0]
  return linear(x, w) * (fan_in ** -0.5)


def mixer(p: dict, x_BxTxD: jax.Array, h0_BxD: jax.Array, reset_T: jax.Array | None
          ) -> tuple[jax.Array, jax.Array]:
  """The two-gate GRU over [B, T, d] from state h0; (outputs [B, T, d], last state [B, d]).

  `reset_T` (bool [T], or None) zeroes the state before the positions where it is True.
  """
  t = x_BxTxD.shape[1]
  time_major = lambda a: jnp.swapaxes(a, 0, 1)
  xf_TxBxD = time_major(dense(x_BxTxD, p["w_f"]) + p["b_f"])
  xh_TxBxD = time_major(dense(x_BxTxD, p["w_h"]) + p["b_h"])
  reset_T = jnp.zeros((t,), bool) if reset_T is None else reset_T

  def cell(h_BxD, inputs):
    xf, xh, reset = inputs
    h_BxD = jnp.where(reset, jnp.zeros_like(h_BxD), h_BxD)
    f = jax.nn.sigmoid(xf + dense(h_BxD, p["u_f"]))
    c = jnp.tanh(xh + dense(f * h_BxD, p["u_h"]))
    h_BxD = h_BxD + f * (c - h_BxD)
    return h_BxD, h_BxD

  h_BxD, h_TxBxD = jax.lax.scan(cell, h0_BxD, (xf_TxBxD, xh_TxBxD, reset_T))
  return time_major(h_TxBxD), h_BxD


def mlp(p: dict, x: jax.Array) -> jax.Array:
  """d -> 4d -> d with a ReLU, no biases."""
  return dense(jax.nn.relu(dense(x, p["mlp_up"])), p["mlp_down"])


def zero_state(params: PyTree, batch: int) -> jax.Array:
  """The initial hidden state of every layer, [depth, B, d]."""
  d = params["ln_f"][GAIN_KEY].shape[-1]
  return jnp.zeros((len(params["layers"]), batch, d), params["ln_f"][GAIN_KEY].dtype)


def gru_forward(params: PyTree, inputs_BxT: jax.Array, h0_LxBxD: jax.Array,
                reset_T: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(next-byte logits [B, T, V], each layer's last state [depth, B, d]) from state h0."""
  x = embed(params["embed"], inputs_BxT)
  last = []
  for layer, h0 in zip(params["layers"], h0_LxBxD, strict=True):
    y, h = mixer(layer, layer_norm(x, layer["ln1"][GAIN_KEY]), h0, reset_T)
    x = x + y
    x = x + mlp(layer, layer_norm(x, layer["ln2"][GAIN_KEY]))
    last.append(h)
  x = layer_norm(x, params["ln_f"][GAIN_KEY])
  return dense(x, params["head"]), jnp.stack(last)


def gru_logits(params: PyTree, inputs_BxT: jax.Array) -> jax.Array:
  """Next-byte logits [B, T, V] from a zero state."""
  return gru_forward(params, inputs_BxT, zero_state(params, inputs_BxT.shape[0]))[0]


def gru_loss(params: PyTree, window_BxT1: jax.Array) -> jax.Array:
  """Mean next-byte cross entropy (nats/byte) on windows of T + 1 bytes, zero state."""
  out = gru_logits(params, window_BxT1[:, :-1])
  return jnp.mean(cross_entropy(out, window_BxT1[:, 1:]))


def segment_loss(params: PyTree, inputs_T: jax.Array, targets_T: jax.Array,
                 reset_T: jax.Array, h0_LxD: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One stream's segment from its carried state: (mean cross entropy, new state [depth, d])."""
  logits, h = gru_forward(params, inputs_T[None], h0_LxD[:, None], reset_T)
  return jnp.mean(cross_entropy(logits, targets_T[None])), h[:, 0]


def init_gru(key: jax.Array, cfg: GruConfig) -> PyTree:
  """N(0, 1) matrices and embedding, unit gains, zero biases, a small head."""
  d, m = cfg.d, MLP_MULT * cfg.d
  keys = iter(jax.random.split(key, 6 * cfg.depth + 2))
  normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
  gain = lambda: {GAIN_KEY: jnp.ones((d,), jnp.float32)}
  zeros = lambda: jnp.zeros((d,), jnp.float32)
  layers = [{
      "ln1": gain(),
      "w_f": normal(d, d), "u_f": normal(d, d), "b_f": zeros(),
      "w_h": normal(d, d), "u_h": normal(d, d), "b_h": zeros(),
      "ln2": gain(),
      "mlp_up": normal(d, m), "mlp_down": normal(m, d),
  } for _ in range(cfg.depth)]
  return {
      "embed": normal(cfg.vocab, d),
      "layers": layers,
      "ln_f": gain(),
      "head": HEAD_INIT_STD * normal(d, cfg.vocab),
  }


def state_shape(cfg: GruConfig) -> tuple[int, int]:
  """One stream's carried hidden state: [depth, d]."""
  return (cfg.depth, cfg.d)
