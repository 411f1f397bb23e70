"""BPTT baseline: exact gradients, isolated experts, and descent on a repetitive corpus."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from soma_jax import bptt, model

# One compiled step shared by the isolation and descent tests (same config and shapes).
SHARED = model.ModelConfig(d_t=16, d_e=16, depth=1, shared_head=True)
N, B, T1 = 2, 4, 17
OPT = optax.adam(3e-2)
_step = jax.jit(bptt.make_bptt_step(SHARED, OPT))
_init_bptt = jax.jit(bptt.init_bptt, static_argnums=(0, 3))


def _init_experts(seed, cfg, n):
  """Random experts shaped like `model.init_experts` from numpy: no init program to compile."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(lambda: model.init_experts(jax.random.key(0), cfg, n))

  def leaf(path, s):
    if jax.tree_util.keystr(path).endswith(f"['{model.GAIN_KEY}']"):
      return jnp.ones(s.shape, s.dtype)
    return jnp.asarray(rng.standard_normal(s.shape) / math.sqrt(s.shape[-2]), s.dtype)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


def _corpus_windows(steps):
  """[steps, N, B, T+1] windows of a repeated sentence."""
  text = np.frombuffer(b"the cat sat on the mat. " * 40, np.uint8)
  starts = np.arange(steps * N * B) * 5 % (len(text) - T1)
  return jnp.asarray(np.stack([text[s:s + T1] for s in starts]).reshape(steps, N, B, T1))


def test_gradient_matches_central_differences_float64():
  cfg = model.ModelConfig(d_t=6, d_e=4, depth=1, shared_head=False)  # projections + own heads
  with jax.enable_x64(True):
    body_N, head = jax.tree.map(lambda x: x.astype(jnp.float64), _init_experts(0, cfg, 2))
    batch = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 2, 9)), jnp.int32)
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
      v = treedef.unflatten([jax.random.normal(k, x.shape, x.dtype)
                             for k, x in zip(keys, leaves, strict=True)])
      # One vmapped forward over the shifts {+h, -h, 0} keeps the compiled program small.
      shifted = jax.vmap(lambda s: jax.tree.map(lambda p, d: p + s * h * d, params_N, v))(
          jnp.array([1.0, -1.0, 0.0]))
      plus, minus, centre = jax.vmap(loss_of)(shifted)
      dot_N = sum(jnp.sum(g * d, axis=tuple(range(1, g.ndim)))
                  for g, d in zip(jax.tree.leaves(grads_N), jax.tree.leaves(v), strict=True))
      return (plus - minus) / (2 * h), dot_N, centre

    for i in range(3):
      fd_N, dot_N, loss_check = fd_and_dot(jax.random.key(10 + i))
      np.testing.assert_allclose(loss_check, loss_N, rtol=1e-12)
      np.testing.assert_allclose(dot_N, fd_N, rtol=1e-6, atol=1e-9)


def test_experts_are_isolated_bitwise():
  body_N, head = _init_experts(0, SHARED, N)
  state = _init_bptt(OPT, body_N, head, SHARED)
  batch = _corpus_windows(2)
  out_a = _step(body_N, head, state, batch[0])
  out_b = _step(body_N, head, state, batch[0].at[1].set(batch[1, 1]))
  for a, b in zip(jax.tree.leaves(out_a), jax.tree.leaves(out_b), strict=True):
    if a.ndim == 2 and a.shape == head.shape:
      continue  # the shared, frozen head has no expert axis
    np.testing.assert_array_equal(a[0], b[0], err_msg="expert 1's batch leaked into expert 0")
  assert not np.array_equal(out_a[0]["blocks"][0]["lstm"]["w_h"][1],
                            out_b[0]["blocks"][0]["lstm"]["w_h"][1])


def test_loss_decreases_on_repetitive_corpus_with_shared_frozen_head():
  body_N, head = _init_experts(0, SHARED, N)
  state = _init_bptt(OPT, body_N, head, SHARED)
  windows = _corpus_windows(30)
  losses = []
  for i in range(30):
    body_N, head_out, state, loss_N = _step(body_N, head, state, windows[i])
    losses.append(np.asarray(loss_N))
  np.testing.assert_array_equal(head_out, head, err_msg="a shared head stays frozen")
  first, last = losses[0], losses[-1]
  assert np.all(last < first - 1.0), f"BPTT should learn a repeated sentence: {first} -> {last}"


def test_own_heads_train_per_expert():
  """One SGD step with own heads: each expert's body and head move by -lr times the
  gradient of its own loss on its own batch (jax.grad of model.loss, one expert at a time).

  The same comparison rejects a step along the experts' summed gradient.
  """
  cfg = model.ModelConfig(d_t=8, d_e=8, depth=1, shared_head=False)
  body_N, head = _init_experts(0, cfg, 2)
  batch = _corpus_windows(1)[0, :, :, :9]
  opt = optax.sgd(0.1)
  new_body, new_head, _, loss_N = jax.jit(bptt.make_bptt_step(cfg, opt))(
      body_N, head, _init_bptt(opt, body_N, head, cfg), batch)
  assert new_head.shape == head.shape == (2, 256, 8) and loss_N.shape == (2,)
  grad = jax.jit(jax.grad(model.loss, argnums=(0, 1)))
  grads = [grad(jax.tree.map(lambda x, e=e: x[e], body_N), head[e], batch[e]) for e in range(2)]

  def moved_by(step_of):
    """Every leaf of expert e equals its start minus step_of(e) (body, then head)."""
    return all(
        np.allclose(new[e], old[e] - 0.1 * g, rtol=1e-4, atol=1e-6)
        for e in range(2)
        for new, old, g in zip(jax.tree.leaves((new_body, new_head)),
                               jax.tree.leaves((body_N, head)),
                               jax.tree.leaves(step_of(e)), strict=True))

  assert moved_by(lambda e: grads[e]), "BPTT's step is not each expert's own gradient"
  for e in range(2):
    np.testing.assert_allclose(loss_N[e], jax.jit(model.loss)(
        jax.tree.map(lambda x, e=e: x[e], body_N), head[e], batch[e]), rtol=1e-6)
  summed = jax.tree.map(lambda a, b: a + b, grads[0], grads[1])
  assert not moved_by(lambda e: summed)
