"""The SOMA expert: a byte-level pre-norm LSTM with a tied byte matrix (SPEC section 2).

Parameters are plain pytrees so SPSA can perturb them leaf by leaf and `vmap` over
experts, directions and signs:

  body = {"in_proj": [d_E, d_t]?, "blocks": [block] * D, "ln_f": {"scale": [d_t]},
          "out_proj": [d_t, d_E]?}
  block = {"ln1": {"scale"}, "lstm": {"w_x": [d_t, 4 d_t], "w_h": [d_t, 4 d_t]},
           "ln2": {"scale"}, "mlp": {"w_in": [d_t, 4 d_t], "w_out": [4 d_t, d_t]}}
  head = E, the tied byte matrix [V, d_E] (shared) or [N, V, d_E] (one per expert).

The projections exist only when d_t != d_E. Every matrix goes through `linear`, which
also accepts a `LowRank` perturbed weight (EGGROLL) without forming the full update.

`python -m soma_jax.model --table` prints the paper's parameter table from this code.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any
VOCAB = 256
GAIN_KEY = "scale"  # LayerNorm gains: dense +-1 under sparse probes (SPEC 3.1).


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
  return linear(jax.nn.gelu(linear(x, p["w_in"]), approximate=False), p["w_out"])


def _span(body: PyTree, embed_VxE: jax.Array, inputs_TxB: jax.Array, carry_D: list | None,
          unroll: int = 1) -> tuple[jax.Array, list]:
  """Decoder inputs [T, B, d_E] of a span of time-major byte inputs, from LSTM states
  `carry_D` (one (h, c) per block; None = zero state), and the states after the span."""
  x = jnp.take(embed_VxE, inputs_TxB.astype(jnp.int32), axis=0)
  if "in_proj" in body:
    x = linear(x, body["in_proj"])
  carry_D = carry_D or [None] * len(body["blocks"])
  new_carry_D = []
  for blk, carry in zip(body["blocks"], carry_D):
    h, carry = lstm(blk["lstm"], layer_norm(x, blk["ln1"]["scale"]), carry, unroll)
    x = x + h
    x = x + mlp(blk["mlp"], layer_norm(x, blk["ln2"]["scale"]))
    new_carry_D.append(carry)
  x = layer_norm(x, body["ln_f"]["scale"])
  if "out_proj" in body:
    x = linear(x, body["out_proj"])
  return x, new_carry_D


def features(body: PyTree, embed_VxE: jax.Array, inputs_BxT: jax.Array) -> jax.Array:
  """Decoder inputs h [B, T, d_E] for byte inputs [B, T] (hidden state reset per window).

  Activations are time-major [T, B, d] inside, so the recurrent scan reads contiguous
  memory and no [B, T, 4 d] gate tensor is ever transposed.
  """
  return jnp.swapaxes(_span(body, embed_VxE, inputs_BxT.T, None)[0], 0, 1)


def logits(body: PyTree, embed_VxE: jax.Array, inputs_BxT: jax.Array) -> jax.Array:
  """Next-byte logits [B, T, V] through the tied byte matrix (a GRU body: its own head)."""
  if "layers" in body:  # the EGGROLL GRU (soma_jax.gru); embed_VxE is unused
    from soma_jax import gru

    return gru.gru_logits(body, inputs_BxT)
  return features(body, embed_VxE, inputs_BxT) @ embed_VxE.T


def cross_entropy(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
  """Per-position cross entropy in nats [B, T]."""
  logz = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  picked = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None].astype(jnp.int32), -1)
  return logz - picked[..., 0]


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
  if "layers" in body:  # the EGGROLL GRU (soma_jax.gru): one pass
    return loss(body, embed_VxE, window_BxT1)
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


def num_params(tree: PyTree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def body_params(cfg: ModelConfig) -> int:
  """Perturbed parameters per expert (body and projections), counted from the init code."""
  return num_params(jax.eval_shape(lambda: init_body(jax.random.key(0), cfg)))


def head_params(cfg: ModelConfig) -> int:
  return num_params(jax.eval_shape(lambda: init_head(jax.random.key(0), cfg)))


def ensemble_params(cfg: ModelConfig, n: int) -> int:
  """Bodies plus heads: one head if shared, N otherwise (SPEC section 2)."""
  heads = 1 if cfg.shared_head else n
  return n * body_params(cfg) + heads * head_params(cfg)


def flops_per_token(cfg: ModelConfig) -> int:
  """Operations per token of one expert's forward pass (multiply-add = 2), F_N in SPEC 7."""
  return 2 * (body_params(cfg) - (2 * cfg.depth + 1) * cfg.d_t + head_params(cfg))


PAPER_SIZES = ((1, 509), (2, 361), (8, 181), (256, 32))


def paper_config(n: int, d_t: int) -> ModelConfig:
  """Width-32 ensembles share one frozen head; wide controls own theirs."""
  return ModelConfig(d_t=d_t, shared_head=(d_t == 32))


def size_table(rows=PAPER_SIZES) -> list[dict]:
  out = []
  for n, d_t in rows:
    cfg = paper_config(n, d_t)
    out.append({
        "n": n,
        "d_t": d_t,
        "head": head_params(cfg),
        "shared_head": cfg.shared_head,
        "ensemble_params": ensemble_params(cfg, n),
        "body_params": body_params(cfg),
    })
  return out


def _fmt(x: int) -> str:
  for unit, div in (("M", 1e6), ("k", 1e3)):
    if x >= div:
      return f"{x / div:#.3g}{unit}"
  return str(x)


def main(argv=None) -> None:
  import argparse

  parser = argparse.ArgumentParser(description="SOMA parameter counts from the model code.")
  parser.add_argument("--table", action="store_true", help="print the paper's size table")
  parser.add_argument("--json", action="store_true", help="print the table as JSON")
  parser.add_argument("--n", type=int, nargs="*", help="expert counts (pair with --d_t)")
  parser.add_argument("--d_t", type=int, nargs="*", help="body widths (pair with --n)")
  args = parser.parse_args(argv)
  rows = PAPER_SIZES
  if args.n or args.d_t:
    if not args.n or not args.d_t or len(args.n) != len(args.d_t):
      parser.error("--n and --d_t take the same number of values, e.g. --n 4 --d_t 64")
    if min(args.n) < 1 or min(args.d_t) < 1:
      parser.error("--n and --d_t must be positive")
    rows = tuple(zip(args.n, args.d_t, strict=True))
  table = size_table(rows)
  if args.json:
    print(json.dumps(table, indent=1))
    return
  print(f"{'N':>5} {'d_t':>5} {'head':>18} {'ensemble params':>16} {'body params/expert':>19}")
  for r in table:
    head = f"{_fmt(r['head'])}, " + ("one shared" if r["shared_head"] else "own")
    print(f"{r['n']:>5} {r['d_t']:>5} {head:>18} {_fmt(r['ensemble_params']):>16} "
          f"{_fmt(r['body_params']):>19}")


if __name__ == "__main__":
  main()
