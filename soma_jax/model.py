"""The SOMA expert: a byte-level pre-norm LSTM with a tied byte matrix (SPEC section 2).

Parameters are plain pytrees so SPSA can perturb them leaf by leaf and `vmap` over
experts, directions and signs:

  body = {"in_proj": [d_E, d_t]?, "blocks": [block] * D, "ln_f": {"scale": [d_t]},
          "out_proj": [d_t, d_E]?}
  block = {"ln1": {"scale"}, "lstm": {"w_x": [d_t, 4 d_t], "w_h": [d_t, 4 d_t]},
           "ln2": {"scale"}, "mlp": {"w_in": [d_t, 4 d_t], "w_out": [4 d_t, d_t]}}
  head = E, the tied byte matrix [V, d_E] (shared) or [N, V, d_E] (one per expert).

The projections exist only when d_t != d_E. Every matrix goes through `linear`, which
also accepts a `LowRank` perturbed weight (EGGROLL) without forming the full update, and
a `Split` one (SPSA's split forward: the unperturbed weight and the probe apart; `layers`).

Parameter counts and the paper's size table are in `soma_jax.sizing`
(`python -m soma_jax.sizing --table`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from soma_jax.layers import GAIN_KEY, VOCAB, LowRank, cross_entropy, layer_norm, linear

PyTree = Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape of one expert."""

  d_t: int = 32  # body width
  d_e: int = 32  # byte-embedding width (32 in every paper config)
  depth: int = 2  # residual blocks D
  shared_head: bool = True  # one frozen E shared by all experts, else one E per expert
  vocab: int = VOCAB

  @property
  def has_proj(self) -> bool:
    return self.d_t != self.d_e


def gate_activations(gates_Bx4D: jax.Array) -> jax.Array:
  """sigmoid(i), sigmoid(f), tanh(g), sigmoid(o) of the LSTM gates, as one tanh.

  sigmoid(x) = (1 + tanh(x / 2)) / 2, so a single elementwise pass over the contiguous
  4 d gates does all four. XLA's CPU backend vectorises that pass where it did not
  vectorise four sliced activations; on a GPU it is one fused kernel either way, with as
  many transcendentals.
  """
  d = gates_Bx4D.shape[-1] // 4
  is_g = jnp.arange(4 * d) // d == 2
  t = jnp.tanh(gates_Bx4D * jnp.where(is_g, 1.0, 0.5).astype(gates_Bx4D.dtype))
  return jnp.where(is_g, t, 0.5 * t + 0.5)


def lstm_cell(w_h: jax.Array | LowRank, gx_Bx4D: jax.Array, h: jax.Array, c: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
  """One bias-free LSTM step (gates i, f, g, o) given the input-side gates gx = x @ w_x."""
  i, f, g, o = jnp.split(gate_activations(gx_Bx4D + linear(h, w_h)), 4, axis=-1)
  c = f * c + i * g
  return o * jnp.tanh(c), c


def lstm(p: dict, x_TxBxD: jax.Array, carry: tuple[jax.Array, jax.Array] | None = None,
         unroll: int = 1) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """Bias-free LSTM over time-major inputs from `carry` (h, c), zero if None.

  Returns (h for every step [T, B, D], the final (h, c)). The input-side gates are
  computed for all T positions first, as one large matmul; only the recurrent matmul
  h @ w_h runs inside the scan, which reads one contiguous [B, 4 d] slice per step.
  """
  gx_TxBx4D = linear(x_TxBxD, p["w_x"])
  if carry is None:
    zeros = jnp.zeros(x_TxBxD.shape[1:], x_TxBxD.dtype)
    carry = (zeros, zeros)

  def step(carry, gx_Bx4D):
    h, c = lstm_cell(p["w_h"], gx_Bx4D, *carry)
    return (h, c), h

  carry, h_TxBxD = jax.lax.scan(step, carry, gx_TxBx4D, unroll=unroll)
  return h_TxBxD, carry


def mlp(p: dict, x: jax.Array) -> jax.Array:
  """d_t -> 4 d_t -> d_t with exact GELU, bias-free."""
  return linear(gelu(linear(x, p["w_in"])), p["w_out"])


def gelu(x: jax.Array) -> jax.Array:
  """Exact GELU, x Phi(x) = x (1/2 + erf(x / sqrt 2) / 2).

  The erf form (PyTorch's) rather than `jax.nn.gelu(approximate=False)`'s erfc one: XLA
  computes erf with one clamped rational polynomial, erfc with two and an exp, and on a
  CPU that was a tenth of the SPSA step. Written as x (1/2 + erf / 2) rather than
  x (1 + erf) / 2, XLA:CPU's plan of the paper-shaped N = 2 step is smaller (the test_memory
  bare step: 14.8 GB against 16.3 GB, 13.3 GB with erfc; the preset's own at 64 directions:
  15.36 GB in docs/results/plan_paper_n2.json), with the step within 2% of the latter's
  speed. The forms agree to float32 rounding in absolute terms (for x below about -4,
  where Phi(x) < 4e-5, the erf form loses relative accuracy).
  """
  return x * (0.5 + 0.5 * jax.lax.erf(x * math.sqrt(0.5)))


def embed_inputs(body: PyTree, embed_VxE: jax.Array, inputs: jax.Array) -> jax.Array:
  """The rows of E for byte inputs of any shape, projected to d_t when d_t != d_E."""
  x = jnp.take(embed_VxE, inputs.astype(jnp.int32), axis=0)
  return linear(x, body["in_proj"]) if "in_proj" in body else x


def residual_block(blk: dict, x: jax.Array, recur) -> tuple[jax.Array, Any]:
  """x + LSTM(LN(x)), then x + MLP(LN(x)); `recur(lstm_params, x_normed) -> (h, carry)`
  runs the LSTM (over a span, or one step when generating)."""
  h, carry = recur(blk["lstm"], layer_norm(x, blk["ln1"]["scale"]))
  x = x + h
  return x + mlp(blk["mlp"], layer_norm(x, blk["ln2"]["scale"])), carry


def decoder_inputs(body: PyTree, x: jax.Array) -> jax.Array:
  """The final LayerNorm, projected back to d_E when d_t != d_E: what E^T decodes."""
  x = layer_norm(x, body["ln_f"]["scale"])
  return linear(x, body["out_proj"]) if "out_proj" in body else x


def _span(body: PyTree, embed_VxE: jax.Array, inputs_TxB: jax.Array, carry_D: list | None,
          unroll: int = 1) -> tuple[jax.Array, list]:
  """Decoder inputs [T, B, d_E] of a span of time-major byte inputs, from LSTM states
  `carry_D` (one (h, c) per block; None = zero state), and the states after the span."""
  x = embed_inputs(body, embed_VxE, inputs_TxB)
  carry_D = carry_D or [None] * len(body["blocks"])
  new_carry_D = []
  for blk, carry in zip(body["blocks"], carry_D):
    x, carry = residual_block(blk, x, lambda p, xn, carry=carry: lstm(p, xn, carry, unroll))
    new_carry_D.append(carry)
  return decoder_inputs(body, x), new_carry_D


def features(body: PyTree, embed_VxE: jax.Array, inputs_BxT: jax.Array) -> jax.Array:
  """Decoder inputs h [B, T, d_E] for byte inputs [B, T] (hidden state reset per window).

  Activations are time-major [T, B, d] inside, so the recurrent scan reads contiguous
  memory and no [B, T, 4 d] gate tensor is ever transposed.
  """
  return jnp.swapaxes(_span(body, embed_VxE, inputs_BxT.T, None)[0], 0, 1)


def logits(body: PyTree, embed_VxE: jax.Array, inputs_BxT: jax.Array) -> jax.Array:
  """Next-byte logits [B, T, V] through the tied byte matrix."""
  return features(body, embed_VxE, inputs_BxT) @ embed_VxE.T


def loss(body: PyTree, embed_VxE: jax.Array, window_BxT1: jax.Array) -> jax.Array:
  """Mean next-byte cross entropy (nats/byte) of one expert on windows of T + 1 bytes."""
  out = logits(body, embed_VxE, window_BxT1[:, :-1])
  return jnp.mean(cross_entropy(out, window_BxT1[:, 1:]))


def streamed_loss(body: PyTree, embed_VxE: jax.Array, window_BxT1: jax.Array,
                  time_block: int = 64, unroll: int = 1) -> jax.Array:
  """`loss` in time blocks: memory independent of T (the SPSA step's forward).

  SPSA needs only each perturbed scalar loss, so nothing of a window is kept beyond one
  block of `time_block` positions: each block computes its input gates, recurrences, MLP,
  logits and summed cross entropy, then passes the LSTM states (h, c) of every layer on
  to the next block. Peak activations are [time_block, B, 4 d_t] rather than
  [T, B, 4 d_t]; the arithmetic is the same as `loss`, equal to float32 rounding.
  A final block of T mod time_block positions covers any remainder. `unroll` time steps
  run per iteration of the recurrence (fewer loop iterations on a GPU; same arithmetic).
  """
  inputs_TxB, targets_TxB = window_BxT1[:, :-1].T, window_BxT1[:, 1:].T
  t, b = inputs_TxB.shape
  tb = min(time_block, t)
  n_full = t // tb

  def block(carry_D, span):
    inputs, targets = span
    x, carry_D = _span(body, embed_VxE, inputs, carry_D, unroll)
    return carry_D, jnp.sum(cross_entropy(x @ embed_VxE.T, targets))

  zeros = jnp.zeros((b, body["ln_f"]["scale"].shape[-1]), embed_VxE.dtype)
  carry_D = [(zeros, zeros) for _ in body["blocks"]]
  split = lambda a: a[:n_full * tb].reshape(n_full, tb, b)
  carry_D, sums = jax.lax.scan(block, carry_D, (split(inputs_TxB), split(targets_TxB)))
  total = jnp.sum(sums)
  if t % tb:
    total += block(carry_D, (inputs_TxB[n_full * tb:], targets_TxB[n_full * tb:]))[1]
  return total / (b * t)


def init_body(key: jax.Array, cfg: ModelConfig) -> PyTree:
  """A fresh expert body: matrices N(0, scale / fan_in), unit gains.

  All matrices come from one normal draw, split and scaled per leaf (one RNG kernel
  instead of one per leaf keeps compilation fast).
  """
  d, de = cfg.d_t, cfg.d_e
  residual_scale = 1.0 / cfg.depth  # keeps the residual stream's variance bounded
  shapes = []  # (path, fan_in, fan_out, scale)
  for i in range(cfg.depth):
    shapes += [(("blocks", i, "lstm", "w_x"), d, 4 * d, 1.0),
               (("blocks", i, "lstm", "w_h"), d, 4 * d, 1.0),
               (("blocks", i, "mlp", "w_in"), d, 4 * d, 1.0),
               (("blocks", i, "mlp", "w_out"), 4 * d, d, residual_scale)]
  if cfg.has_proj:
    shapes += [(("in_proj",), de, d, 1.0), (("out_proj",), d, de, 1.0)]
  flat = jax.random.normal(key, (sum(fi * fo for _, fi, fo, _ in shapes),), jnp.float32)
  gain = lambda: {GAIN_KEY: jnp.ones((d,), jnp.float32)}
  body: dict[str, Any] = {
      "blocks": [{"ln1": gain(), "lstm": {}, "ln2": gain(), "mlp": {}} for _ in range(cfg.depth)],
      "ln_f": gain(),
  }
  offset = 0
  for path, fan_in, fan_out, scale in shapes:
    w = flat[offset:offset + fan_in * fan_out].reshape(fan_in, fan_out)
    offset += fan_in * fan_out
    node = body
    for part in path[:-1]:
      node = node[part]
    node[path[-1]] = w * math.sqrt(scale / fan_in)
  return body


def init_head(key: jax.Array, cfg: ModelConfig) -> jax.Array:
  """The tied byte matrix E [V, d_E]; unit-variance logits for layer-normed features."""
  return jax.random.normal(key, (cfg.vocab, cfg.d_e), jnp.float32) / math.sqrt(cfg.d_e)


def init_experts(key: jax.Array, cfg: ModelConfig, n: int) -> tuple[PyTree, jax.Array]:
  """N experts as one pytree with a leading N axis, and the head (shared or [N, V, d_E])."""
  k_body, k_head = jax.random.split(key)
  body_N = jax.vmap(lambda k: init_body(k, cfg))(jax.random.split(k_body, n))
  head = init_head(k_head, cfg)
  if not cfg.shared_head:
    head = jnp.broadcast_to(head, (n,) + head.shape)
  return body_N, head
