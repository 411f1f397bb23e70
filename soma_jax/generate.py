"""Byte-by-byte sampling from the routed ensemble with each expert's LSTM state carried.

`step` is one recurrent step of the expert in `model.py` (same parameters, same
equations), so a prompt is consumed once and every sampled byte costs one step per
selected expert. The next-byte distribution is the uniform mixture of the selected
experts' probabilities, as in evaluation, then tempered and truncated to the top-p
nucleus.

Cold start: the router sees the first 256 bytes of the prompt; a shorter prompt is
routed on the bytes it has, and an empty prompt on the empty string (a fixed point of
the featurizer, so always the same experts). Routes are fixed for the whole sample.
The model has no start-of-text byte: an empty prompt is fed one "\\n" (not printed).
"""

from __future__ import annotations

import codecs
import functools
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import model as model_lib
from soma_jax.errors import UserError

PyTree = Any
EMPTY_PROMPT_SEED = b"\n"  # input byte for an empty prompt
MAX_BYTES = 10_000_000  # --max_bytes limit: a bound on output size (output is streamed)
CHUNK_BYTES = 256  # bytes sampled per compiled scan (and per write to the output)


def init_state(body: PyTree, batch_shape: tuple[int, ...] = ()) -> list[tuple[jax.Array, jax.Array]]:
  """Zero (h, c) per block, [*batch_shape, d_t] each."""
  out = []
  for blk in body["blocks"]:
    d = blk["lstm"]["w_h"].shape[0]
    z = jnp.zeros(batch_shape + (d,), blk["lstm"]["w_h"].dtype)
    out.append((z, z))
  return out


def step(body: PyTree, embed_VxE: jax.Array, state: list, byte: jax.Array) -> tuple[jax.Array, list]:
  """Next-byte logits [..., V] after reading `byte` [...], and the new state."""
  def one_step(h, c):
    def recur(p, x_normed):
      h_new, c_new = model_lib.lstm_cell(p["w_h"], model_lib.linear(x_normed, p["w_x"]), h, c)
      return h_new, (h_new, c_new)
    return recur

  x = model_lib.embed_inputs(body, embed_VxE, byte)
  new_state = []
  for blk, (h, c) in zip(body["blocks"], state, strict=True):
    x, carry = model_lib.residual_block(blk, x, one_step(h, c))
    new_state.append(carry)
  return model_lib.decoder_inputs(body, x) @ embed_VxE.T, new_state


def step_logits(body: PyTree, embed_VxE: jax.Array, inputs_T: jax.Array) -> jax.Array:
  """Logits [T, V] of a byte sequence by repeated `step` (equals `model.logits` on it)."""
  def f(state, b):
    out, state = step(body, embed_VxE, state, b)
    return state, out

  return jax.lax.scan(f, init_state(body), inputs_T)[1]


def mixture_logprobs(logits_KxV: jax.Array) -> jax.Array:
  """log of the uniform mixture of K experts' next-byte distributions, [V]."""
  lp = jax.nn.log_softmax(logits_KxV.astype(jnp.float32), axis=-1)
  return jax.nn.logsumexp(lp, axis=0) - jnp.log(lp.shape[0])


def sample_byte(key: jax.Array, logp_V: jax.Array, temperature: jax.typing.ArrayLike,
                top_p: jax.typing.ArrayLike) -> jax.Array:
  """Samples from p^(1/temperature) restricted to the top-p nucleus; argmax at temperature 0."""
  logits = logp_V / jnp.maximum(temperature, 1e-6)
  order = jnp.argsort(-logits)
  probs = jax.nn.softmax(logits[order])
  # Keep the smallest prefix whose mass reaches top_p (the top byte always stays).
  keep = (jnp.cumsum(probs) - probs) < top_p
  masked = jnp.where(keep, logits[order], -jnp.inf)
  sampled = order[jax.random.categorical(key, masked)]
  return jnp.where(temperature > 0, sampled, jnp.argmax(logp_V)).astype(jnp.int32)


def _ens_step(bodies_K, heads_K, state_K, byte):
  """Every selected expert reads `byte`: ([K, V] logits, new states)."""
  return jax.vmap(step, in_axes=(0, 0, 0, None))(bodies_K, heads_K, state_K, byte)


@jax.jit
def _prefill(bodies_K, heads_K, prompt_T):
  """Reads the prompt with every selected expert: (states, [K, V] logits after it)."""
  def f(state_K, byte):
    logits_KxV, state_K = _ens_step(bodies_K, heads_K, state_K, byte)
    return state_K, logits_KxV

  state_K, logits_TxKxV = jax.lax.scan(f, jax.vmap(init_state)(bodies_K), prompt_T)
  return state_K, logits_TxKxV[-1]


@functools.partial(jax.jit, static_argnames=("n",))
def _sample_chunk(bodies_K, heads_K, state_K, logits_KxV, key, first, temperature, top_p,
                  n: int):
  """Samples bytes first..first+n-1 (byte i keyed by fold_in(key, i)); returns the carry too."""
  def f(carry, i):
    state_K, logits_KxV = carry
    b = sample_byte(jax.random.fold_in(key, i), mixture_logprobs(logits_KxV), temperature, top_p)
    logits_KxV, state_K = _ens_step(bodies_K, heads_K, state_K, b)
    return (state_K, logits_KxV), b

  (state_K, logits_KxV), out = jax.lax.scan(f, (state_K, logits_KxV), first + jnp.arange(n))
  return state_K, logits_KxV, out


def check_sampling(temperature: float, top_p: float) -> None:
  """A UserError unless temperature is a finite number >= 0 and top_p is in (0, 1] (nan
  passes every comparison-based check, and inf samples uniformly)."""
  if not (math.isfinite(temperature) and temperature >= 0):
    raise UserError(f"--temperature={temperature} must be a finite number >= 0 (0 = greedy); "
                    "fix: e.g. --temperature=0.8")
  if not (math.isfinite(top_p) and 0 < top_p <= 1):
    raise UserError(f"--top_p={top_p} must be in (0, 1]; fix: e.g. --top_p=0.95")


def generate_stream(body_N: PyTree, head: jax.Array, shared_head: bool, router, prompt: bytes,
                    max_bytes: int, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                    top_k: int = 4) -> tuple[np.ndarray, Iterator[bytes]]:
  """(routed expert ids, iterator over the continuation in chunks of up to CHUNK_BYTES).

  Memory stays at one chunk whatever `max_bytes` is (at most MAX_BYTES); the bytes are
  those of one long scan: byte i is drawn with fold_in(seed key, i).
  """
  check_sampling(temperature, top_p)
  if not 0 <= max_bytes <= MAX_BYTES:
    raise UserError(f"--max_bytes={max_bytes} is outside 0..{MAX_BYTES:,}; fix: pass a smaller "
                    "count (or generate in several runs with --prompt)")
  routes = router.route_to([prompt], top_k, jax.tree.leaves(body_N)[0].shape[0])[0]
  bodies_K = jax.tree.map(lambda x: x[routes], body_N)
  heads_K = jnp.broadcast_to(head, (len(routes),) + head.shape) if shared_head else head[routes]
  inputs = np.frombuffer(prompt or EMPTY_PROMPT_SEED, np.uint8)

  def chunks() -> Iterator[bytes]:
    if max_bytes < 1:
      return
    state_K, logits_KxV = _prefill(bodies_K, heads_K, jnp.asarray(inputs))
    key, n = jax.random.key(seed), min(CHUNK_BYTES, max_bytes)  # one compiled chunk size
    for first in range(0, max_bytes, n):
      state_K, logits_KxV, out = _sample_chunk(
          bodies_K, heads_K, state_K, logits_KxV, key, first, jnp.float32(temperature),
          jnp.float32(top_p), n=n)
      yield np.asarray(out, np.uint8).tobytes()[:max_bytes - first]

  return routes, chunks()


def generate(body_N: PyTree, head: jax.Array, shared_head: bool, router, prompt: bytes,
             max_bytes: int, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
             top_k: int = 4) -> tuple[bytes, np.ndarray]:
  """(sampled continuation, routed expert ids) for a prompt, from the top-k routed experts."""
  routes, chunks = generate_stream(body_N, head, shared_head, router, prompt, max_bytes,
                                   temperature, top_p, seed, top_k)
  return b"".join(chunks), routes


_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(32), 127) if chr(c) not in "\n\t"}


def printable(data: bytes) -> str:
  """UTF-8 text with each invalid byte (and control byte but newline and tab) as a \\xNN escape."""
  return Printable()(data, final=True)


class Printable:
  """`printable` for a stream: a UTF-8 sequence split across chunks is not escaped."""

  def __init__(self):
    self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

  def __call__(self, chunk: bytes, final: bool = False) -> str:
    return self._decoder.decode(chunk, final).translate(_CONTROLS)
