"""BPTT baseline: exact gradients, isolated experts, and descent on a repetitive corpus."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from soma_jax import bptt, model

_init_experts = jax.jit(model.init_experts, static_argnums=(1, 2))
_init_bptt = jax.jit(bptt.init_bptt, static_argnums=(0, 3))


def _windows(key, n, b, t1):
  return jax.random.randint(key, (n, b, t1), 0, 256)


def test_gradient_matches_central_differences_float64():
  cfg = model.ModelConfig(d_t=6, d_e=4, depth=1, shared_head=False)  # projections + own heads
  with jax.enable_x64(True):
    body_N, head = jax.jit(lambda k: jax.tree.map(lambda x: x.astype(jnp.float64),
                                                  model.init_experts(k, cfg, 2)))(jax.random.key(0))
    batch = _windows(jax.random.key(1), 2, 2, 9)
    loss_N, grads_N = jax.jit(bptt.make_bptt_grad(cfg))(body_N, head, batch)
    params_N = bptt.trainable(body_N, head, cfg)
    assert jax.tree.structure(grads_N) == jax.tree.structure(params_N)

    def loss_of(params_N):
      body, embed = params_N
      return jax.vmap(model.loss)(body, embed, batch)

    @jax.jit
    def fd_and_dot(key, h=1e-6):
      """Central difference along a random direction v, and <grad, v>, per expert."""
      leaves, treedef = jax.tree.flatten(params_N)
      keys = jax.random.split(key, len(leaves))
      v = treedef.unflatten([jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)])
      shift = lambda s: jax.tree.map(lambda p, d: p + s * h * d, params_N, v)
      fd_N = (loss_of(shift(1.0)) - loss_of(shift(-1.0))) / (2 * h)
      dot_N = sum(jnp.sum(g * d, axis=tuple(range(1, g.ndim)))
                  for g, d in zip(jax.tree.leaves(grads_N), jax.tree.leaves(v), strict=True))
      return fd_N, dot_N, loss_of(params_N)

    for i in range(3):
      fd_N, dot_N, loss_check = fd_and_dot(jax.random.key(10 + i))
      np.testing.assert_allclose(loss_check, loss_N, rtol=1e-12)
      np.testing.assert_allclose(dot_N, fd_N, rtol=1e-6, atol=1e-9)


def test_experts_are_isolated_bitwise():
  cfg = model.ModelConfig(d_t=8, d_e=8, depth=1, shared_head=False)
  body_N, head = _init_experts(jax.random.key(0), cfg, 3)
  opt = optax.adam(1e-2)
  step = jax.jit(bptt.make_bptt_step(cfg, opt))
  state = _init_bptt(opt, body_N, head, cfg)
  batch = _windows(jax.random.key(1), 3, 2, 17)
  other = batch.at[2].set(_windows(jax.random.key(2), 1, 2, 17)[0])
  out_a = step(body_N, head, state, batch)
  out_b = step(body_N, head, state, other)
  for a, b in zip(jax.tree.leaves(out_a), jax.tree.leaves(out_b), strict=True):
    if a.ndim == 0:
      continue  # nothing shared across experts should exist, but scalars carry no expert axis
    np.testing.assert_array_equal(a[:2], b[:2], err_msg="expert 2's batch leaked into 0 or 1")
  assert not np.array_equal(out_a[0]["blocks"][0]["lstm"]["w_h"][2],
                            out_b[0]["blocks"][0]["lstm"]["w_h"][2])


def test_loss_decreases_on_repetitive_corpus_with_shared_frozen_head():
  cfg = model.ModelConfig(d_t=16, d_e=16, depth=1, shared_head=True)
  n, b, t1 = 2, 4, 17
  body_N, head = _init_experts(jax.random.key(0), cfg, n)
  text = np.frombuffer(b"the cat sat on the mat. " * 40, np.uint8)
  starts = np.arange(n * b * 30) * 5 % (len(text) - t1)
  windows = jnp.asarray(np.stack([text[s:s + t1] for s in starts]).reshape(30, n, b, t1))
  opt = optax.adam(3e-2)
  step = jax.jit(bptt.make_bptt_step(cfg, opt))
  state = _init_bptt(opt, body_N, head, cfg)
  losses = []
  for i in range(30):
    body_N, head_out, state, loss_N = step(body_N, head, state, windows[i])
    losses.append(np.asarray(loss_N))
  assert head_out is head or np.array_equal(head_out, head), "a shared head stays frozen"
  first, last = losses[0], losses[-1]
  assert np.all(last < first - 1.0), f"BPTT should learn a repeated sentence: {first} -> {last}"
