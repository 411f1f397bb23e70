"""The SPSA estimator against the math of SPEC 3 and 5, and the step's contracts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64

from soma_jax import model as M
from soma_jax import spsa as S

TINY = M.ModelConfig(d_t=4, d_e=4, depth=2)


def _setup(n=2, cfg=TINY, b=2, t=8, a=1, dtype=jnp.float32):
  body_N, head = M.init_experts(jax.random.key(0), cfg, n)
  body_N = jax.tree.map(lambda x: x.astype(dtype), body_N)
  head = head.astype(dtype)
  batch = jax.random.randint(jax.random.key(1), (n, a, b, t + 1), 0, 256).astype(jnp.uint8)
  return body_N, head, batch


def _exact_grad(body_N, head, batch):
  return jax.vmap(jax.grad(M.loss), in_axes=(0, None, 0))(body_N, head, batch[:, 0])


def _flat(tree):
  return jnp.concatenate([x.reshape(x.shape[0], -1) for x in jax.tree.leaves(tree)], axis=1)


def test_probe_distributions():
  body = M.init_body(jax.random.key(0), M.ModelConfig(d_t=32))
  z = S.probe(jax.random.key(3), body, "sparse")
  w = np.asarray(z["blocks"][0]["lstm"]["w_x"]).ravel()
  assert set(np.unique(w)) <= {-1.0, 0.0, 1.0}
  assert abs(np.mean(w == 0) - 0.5) < 0.02 and abs(np.mean(w == 1) - 0.25) < 0.02
  gains = np.asarray(z["blocks"][0]["ln1"]["scale"])
  assert set(np.unique(gains)) <= {-1.0, 1.0}  # gains are dense under sparse probes
  dense = np.asarray(S.probe(jax.random.key(3), body, "rademacher")["ln_f"]["scale"])
  assert set(np.unique(dense)) <= {-1.0, 1.0}
  # Same key, same direction: probes are recomputed, never stored.
  z2 = S.probe(jax.random.key(3), body, "sparse")
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(z), jax.tree.leaves(z2)))


def test_unbiased_against_jax_grad():
  """Averaged over many dense-Rademacher directions the estimate matches jax.grad."""
  with enable_x64():
    body_N, head, batch = _setup(n=1, dtype=jnp.float64)
    cfg = S.SpsaConfig(n_pert=65536, probe="rademacher", pert_chunk=4096)
    g_hat, _ = S.estimate(body_N, head, batch, jnp.array([1e-4]), 0, jnp.arange(1),
                          jax.random.key(7), cfg)
    g = _flat(_exact_grad(body_N, head, batch))[0]
    g_hat = _flat(g_hat)[0]
    cos = float(g @ g_hat / jnp.linalg.norm(g) / jnp.linalg.norm(g_hat))
  assert cos >= 0.99, f"cosine(SPSA mean, jax.grad) = {cos:.4f}; the estimator is biased"


def test_variance_law_dense_rademacher():
  """E||g_hat - g||^2 / ||g||^2 = (d - 1) / n_pert for dense probes, small eps (SPEC 5)."""
  n_pert, reps = 8, 256
  with enable_x64():
    body_N, head, batch = _setup(n=1, dtype=jnp.float64)
    cfg = S.SpsaConfig(n_pert=n_pert, probe="rademacher", pert_chunk=n_pert)
    g = _flat(_exact_grad(body_N, head, batch))[0]
    est = jax.jit(jax.vmap(lambda step: _flat(S.estimate(
        body_N, head, batch, jnp.array([1e-5]), step, jnp.arange(1), jax.random.key(0),
        cfg)[0])[0]))
    g_hat = est(jnp.arange(reps))
    rel = float(jnp.mean(jnp.sum((g_hat - g) ** 2, -1)) / jnp.sum(g**2))
  d = g.shape[0]
  predicted = (d - 1) / n_pert
  assert abs(rel / predicted - 1) < 0.1, f"measured {rel:.2f} vs (d-1)/n_pert = {predicted:.2f}"


def test_chunking_does_not_change_the_estimate():
  body_N, head, batch = _setup(n=2, a=2)
  args = (body_N, head, batch, jnp.full((2,), 1e-3), 3, jnp.arange(2), jax.random.key(0))
  g1, l1 = S.estimate(*args, S.SpsaConfig(n_pert=8, accum=2, pert_chunk=8))
  g2, l2 = S.estimate(*args, S.SpsaConfig(n_pert=8, accum=2, pert_chunk=2))
  for x, y in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)


def _step_cfg(**kw):
  return S.StepConfig(model=dataclasses.replace(TINY, shared_head=False),
                      spsa=S.SpsaConfig(n_pert=4, pert_chunk=2), train_head=True, **kw)


def _state(n=3):
  cfg = dataclasses.replace(TINY, shared_head=False)
  body_N, head_N = M.init_experts(jax.random.key(0), cfg, n)
  return S.init_state(body_N, head_N, 1e-3, 1e-3, _step_cfg())


def test_experts_are_isolated():
  """Changing expert 2's parameters or batch leaves experts 0 and 1 bit-identical."""
  state = _state()
  batch = jax.random.randint(jax.random.key(1), (3, 1, 2, 9), 0, 256).astype(jnp.uint8)
  step = jax.jit(S.train_step, static_argnames="cfg")
  ids = jnp.arange(3)
  out, _ = step(state, batch, ids, cfg=_step_cfg())
  other = state.replace(body=jax.tree.map(lambda x: x.at[2].multiply(1.5), state.body))
  other_batch = batch.at[2].set(7)
  out2, _ = step(other, other_batch, ids, cfg=_step_cfg())
  for x, y in zip(jax.tree.leaves((out.body, out.head, out.opt)),
                  jax.tree.leaves((out2.body, out2.head, out2.opt))):
    np.testing.assert_array_equal(x[:2], y[:2])
  # ... while expert 2 itself did change (the test would be vacuous otherwise).
  assert any(not np.array_equal(x[2], y[2])
             for x, y in zip(jax.tree.leaves(out.body), jax.tree.leaves(out2.body)))


def test_subset_job_draws_the_same_directions():
  """Expert 2 trained alone (global id 2) gets exactly its update in the full job."""
  state = _state()
  batch = jax.random.randint(jax.random.key(1), (3, 1, 2, 9), 0, 256).astype(jnp.uint8)
  full, _ = S.train_step(state, batch, jnp.arange(3), _step_cfg())
  alone = jax.tree.map(lambda x: x[2:], state.replace(step=None))
  alone = alone.replace(step=state.step)
  part, _ = S.train_step(alone, batch[2:], jnp.array([2]), _step_cfg())
  for x, y in zip(jax.tree.leaves(full.body), jax.tree.leaves(part.body)):
    np.testing.assert_array_equal(x[2:], y)


def test_step_compiles_once():
  state = _state()
  batch = jax.random.randint(jax.random.key(1), (3, 1, 2, 9), 0, 256).astype(jnp.uint8)
  step = jax.jit(S.train_step, static_argnames="cfg")
  for lr in (1e-3, 5e-4, 2e-3):
    state = state.replace(sched=state.sched.replace(lr=jnp.full((3,), lr, jnp.float32),
                                                    eps=jnp.full((3,), lr, jnp.float32)))
    state, _ = step(state, batch, jnp.arange(3), cfg=_step_cfg())
  assert step._cache_size() == 1


def test_nonfinite_expert_skips_update():
  state = _state()
  body = jax.tree.map(lambda x: x.at[1].set(jnp.nan) if x.ndim == 3 else x, state.body)
  state = state.replace(body=body)
  batch = jax.random.randint(jax.random.key(1), (3, 1, 2, 9), 0, 256).astype(jnp.uint8)
  out, metrics = S.train_step(state, batch, jnp.arange(3), _step_cfg())
  assert list(np.asarray(metrics["finite"])) == [True, False, True]
  assert list(np.asarray(out.skipped)) == [0, 1, 0]
  for x, y in zip(jax.tree.leaves(state.opt), jax.tree.leaves(out.opt)):
    np.testing.assert_array_equal(x[1], y[1])  # expert 1's Adam state untouched
  assert not np.array_equal(state.body["ln_f"]["scale"][0], out.body["ln_f"]["scale"][0])


def test_shared_loss_groups_sum_before_the_difference():
  body_N, head, batch = _setup(n=4)
  args = (body_N, head, batch, jnp.full((4,), 1e-3), 0, jnp.arange(4), jax.random.key(0))
  cfg = S.SpsaConfig(n_pert=4, probe="rademacher", pert_chunk=4)
  g_sep, _ = S.estimate(*args, cfg)
  g_one, _ = S.estimate(*args, cfg, loss_groups=[0, 0, 1, 2])
  g_same, _ = S.estimate(*args, cfg, loss_groups=[0, 1, 2, 3])
  for x, y, z in zip(*(jax.tree.leaves(g) for g in (g_sep, g_one, g_same))):
    np.testing.assert_array_equal(x, z)  # singleton groups are the separate estimator
    np.testing.assert_array_equal(x[2:], y[2:])  # untouched groups
    assert not np.allclose(x[:2], y[:2])  # the shared group mixes in the other's noise


def test_delta_rule_equals_gradient_with_features_fixed():
  h = jax.random.normal(jax.random.key(0), (2, 5, 8))
  e = jax.random.normal(jax.random.key(1), (256, 8))
  y = jax.random.randint(jax.random.key(2), (2, 5), 0, 256)
  ref = jax.grad(lambda e: jnp.mean(M.cross_entropy(h @ e.T, y)))(e)
  np.testing.assert_allclose(S.delta_rule_grad(h, e, y), ref, rtol=1e-5, atol=1e-7)


def test_plateau_halves_lr_and_eps_together():
  cfg = S.PlateauConfig(patience=10, floor=1e-5)
  p = S.plateau_init(jnp.array([1e-3, 1e-3]), jnp.array([1e-3, 1e-3]))
  p = S.plateau_update(p, jnp.array([2.0, 2.0]), 0, cfg)
  p = S.plateau_update(p, jnp.array([1.9, 2.0]), 5, cfg)  # expert 0 improves
  p = S.plateau_update(p, jnp.array([1.9, 2.0]), 10, cfg)  # expert 1: 10 updates stale
  np.testing.assert_allclose(p.lr, [1e-3, 5e-4])
  np.testing.assert_allclose(p.eps, [1e-3, 5e-4])
  p = S.plateau_update(p, jnp.array([1.9, 2.0]), 15, cfg)  # expert 0 stale for 10
  np.testing.assert_allclose(p.lr, [5e-4, 5e-4])
  for s in range(20, 400, 10):
    p = S.plateau_update(p, jnp.array([1.9, 2.0]), s, cfg)
  np.testing.assert_allclose(p.lr, [1e-5, 1e-5])  # floor


@pytest.mark.parametrize("probe", S.PROBES)
def test_training_lowers_loss_on_repetitive_bytes(probe):
  """A few dozen updates of SPSA + delta-rule head fit a periodic byte stream."""
  cfg = S.StepConfig(model=dataclasses.replace(TINY, d_t=8, d_e=8, shared_head=False),
                     spsa=S.SpsaConfig(n_pert=8, pert_chunk=8, probe=probe), train_head=True)
  body_N, head_N = M.init_experts(jax.random.key(0), cfg.model, 1)
  state = S.init_state(body_N, head_N, 1e-2, 1e-2, cfg)
  text = np.frombuffer(b"abcabcabd" * 8, np.uint8)[:33]
  batch = jnp.asarray(np.broadcast_to(text, (1, 1, 2, 33)))
  step = jax.jit(S.train_step, static_argnames="cfg")
  first = None
  for _ in range(40):
    state, m = step(state, batch, jnp.arange(1), cfg=cfg)
    first = float(m["loss"][0]) if first is None else first
  assert float(m["loss"][0]) < first - 0.5
