"""EGGROLL: low-rank forwards, antithetic noise, fitness shaping, chunking, descent."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from soma_jax import eggroll, gru, model
from soma_jax.model import LowRank

GCFG = gru.GruConfig(d=8, depth=1)
# Jitted once per (loss_fn, cfg): eager scans and RNG would dominate the test time.
_estimate = jax.jit(eggroll.estimate, static_argnames=("loss_fn", "cfg"))
_perturb = jax.jit(eggroll.perturb, static_argnums=4)
_init_gru = jax.jit(gru.init_gru, static_argnums=1)
_init_expert = jax.jit(lambda k, cfg: (model.init_body(k, cfg), model.init_head(k, cfg)),
                       static_argnums=1)


def _explicit(tree):
  """Materialise every LowRank leaf as w + B A^T (w is [in, out], so B A^T is [in, out])."""
  return jax.tree.map(lambda x: x.w + x.b @ x.a.T if isinstance(x, LowRank) else x, tree,
                      is_leaf=lambda x: isinstance(x, LowRank))


def _mse(p, batch):
  x, y = batch
  return jnp.mean(jnp.square(model.linear(x, p["w"]) + p["b"] - y))


def _regression(key, n=64, d_in=6, d_out=3):
  kx, kw = jax.random.split(key)
  x = jax.random.normal(kx, (n, d_in))
  y = x @ jax.random.normal(kw, (d_in, d_out)) + 0.5
  params = {"w": jnp.zeros((d_in, d_out)), "b": jnp.zeros((d_out,))}
  return params, (x, y), _mse


@pytest.mark.parametrize("rank", [1, 3])
def test_lowrank_gru_forward_equals_explicit(rank):
  cfg = eggroll.EggrollConfig(pop=4, sigma=0.1, rank=rank)
  params = _init_gru(jax.random.key(0), GCFG)
  window = jax.random.randint(jax.random.key(1), (2, 17), 0, 256)
  pert = _perturb(params, jax.random.key(3), 5, -1.0, cfg)
  assert isinstance(pert["layers"][0]["w_h"], LowRank) and isinstance(pert["embed"], LowRank)
  assert pert["layers"][0]["w_h"].a.shape == (3 * GCFG.d, rank)
  both = jax.jit(lambda p, x: (gru.gru_logits(p, x), gru.gru_logits(_explicit(p), x)))
  np.testing.assert_allclose(*both(pert, window[:, :-1]), rtol=1e-4, atol=1e-4)


def test_population_on_soma_expert_equals_explicit_forwards():
  """The vmapped, chunked population of LowRank experts matches dense W + B A^T experts."""
  mcfg = model.ModelConfig(d_t=8, d_e=4, depth=1)  # with projections
  body, embed = _init_expert(jax.random.key(0), mcfg)
  window = jax.random.randint(jax.random.key(2), (2, 9), 0, 256)
  cfg = eggroll.EggrollConfig(pop=4, sigma=0.2, pop_chunk=2)
  key, step = jax.random.key(3), 5
  loss_fn = lambda b, w: model.loss(b, embed, w)
  got = jax.jit(eggroll.population_losses, static_argnums=(4, 5))(
      body, window, key, step, loss_fn, cfg)
  skey = jax.random.fold_in(key, step)
  dense = [_explicit(_perturb(body, skey, m // 2, 1.0 - 2 * (m % 2), cfg))
           for m in range(cfg.pop)]
  dense_P = jax.tree.map(lambda *xs: jnp.stack(xs), *dense)
  want = jax.jit(jax.vmap(loss_fn, in_axes=(0, None)))(dense_P, window)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert float(jnp.std(got)) > 0


def test_perturbation_scale_and_antithetic_symmetry():
  cfg = eggroll.EggrollConfig(pop=4, sigma=0.05, rank=2)
  params = _init_gru(jax.random.key(0), GCFG)
  plus = _explicit(_perturb(params, jax.random.key(1), 7, 1.0, cfg))
  minus = _explicit(_perturb(params, jax.random.key(1), 7, -1.0, cfg))
  for p, hi, lo in zip(*map(jax.tree.leaves, (params, plus, minus)), strict=True):
    np.testing.assert_allclose(hi - p, -(lo - p), rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(hi - p))) > 0
  # A matrix perturbation sigma B A^T / sqrt(r) has entries of standard deviation sigma.
  delta = plus["head"] - params["head"]
  assert 0.7 * cfg.sigma < float(jnp.std(delta)) < 1.3 * cfg.sigma
  other = _explicit(_perturb(params, jax.random.key(1), 8, 1.0, cfg))
  assert not np.allclose(other["head"], plus["head"])


def test_antithetic_losses_of_a_linear_loss_are_symmetric():
  cfg = eggroll.EggrollConfig(pop=8, sigma=0.1, pop_chunk=4)
  params = {"w": jax.random.normal(jax.random.key(0), (5, 4)), "g": jnp.ones((4,))}
  x = jax.random.normal(jax.random.key(1), (3, 5))
  loss_fn = lambda p, batch: jnp.sum(model.linear(batch, p["w"])) + jnp.sum(p["g"])
  losses = jax.jit(eggroll.population_losses, static_argnums=(4, 5))(
      params, x, jax.random.key(2), 0, loss_fn, cfg)
  base = loss_fn(params, x)
  np.testing.assert_allclose(losses[0::2] - base, -(losses[1::2] - base), rtol=1e-4, atol=1e-4)


def test_fitness_is_negated_z_score():
  loss = jnp.array([1.0, 3.0, 2.0, 6.0])
  f = eggroll.fitness(loss)
  np.testing.assert_allclose(jnp.mean(f), 0.0, atol=1e-6)
  np.testing.assert_allclose(jnp.std(f), 1.0, rtol=1e-5)
  assert int(jnp.argmax(f)) == 0 and int(jnp.argmin(f)) == 3
  np.testing.assert_array_equal(eggroll.fitness(jnp.full((4,), 2.5)), jnp.zeros(4))


def test_chunked_estimate_equals_unchunked_and_replays():
  params, batch, loss_fn = _regression(jax.random.key(0))
  whole = eggroll.EggrollConfig(pop=16, sigma=0.1, rank=2)
  chunked = eggroll.EggrollConfig(pop=16, sigma=0.1, rank=2, pop_chunk=4)
  g1, m1 = _estimate(params, batch, jax.random.key(1), 3, loss_fn=loss_fn, cfg=whole)
  g2, m2 = _estimate(params, batch, jax.random.key(1), 3, loss_fn=loss_fn, cfg=chunked)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m1["loss_mean"], m2["loss_mean"], rtol=1e-6)
  g3, _ = _estimate(params, batch, jax.random.key(1), 4, loss_fn=loss_fn, cfg=whole)
  assert not np.allclose(g1["w"], g3["w"]), "a new step must draw new noise"


def test_estimate_matches_explicit_sum():
  """g = -(1/(pop sigma)) sum_m f_m sign_m eps_m, with eps = B A^T / sqrt(r), built densely."""
  params, batch, loss_fn = _regression(jax.random.key(0))
  cfg = eggroll.EggrollConfig(pop=6, sigma=0.1, rank=2, pop_chunk=2)
  key, step = jax.random.key(1), 2
  grads, _ = _estimate(params, batch, key, step, loss_fn=loss_fn, cfg=cfg)
  skey = jax.random.fold_in(key, step)
  members = [(m // 2, 1.0 - 2 * (m % 2)) for m in range(cfg.pop)]
  losses = jnp.stack([loss_fn(_explicit(_perturb(params, skey, n, s, cfg)), batch)
                      for n, s in members])
  f = -(losses - losses.mean()) / losses.std()
  want = jax.tree.map(jnp.zeros_like, params)
  for fm, (n, s) in zip(f, members, strict=True):
    unit = _explicit(_perturb(params, skey, n, s, cfg))
    want = jax.tree.map(lambda acc, u, p, fm=fm: acc + fm * (u - p) / cfg.sigma, want, unit, params)
  want = jax.tree.map(lambda x: -x / (cfg.pop * cfg.sigma), want)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_eggroll_descends_on_linear_regression():
  params, batch, loss_fn = _regression(jax.random.key(0))
  cfg = eggroll.EggrollConfig(pop=32, sigma=0.05, rank=1, pop_chunk=16)
  opt = optax.adam(0.05)
  step = jax.jit(eggroll.make_step(loss_fn, cfg, opt))
  opt_state, key = opt.init(params), jax.random.key(1)
  start = float(loss_fn(params, batch))
  for i in range(60):
    params, opt_state, metrics = step(params, opt_state, batch, key, i)
  end = float(loss_fn(params, batch))
  assert np.isfinite(float(metrics["loss_mean"]))
  assert end < 0.2 * start, f"EGGROLL should cut the regression loss: {start:.3f} -> {end:.3f}"


def test_step_on_gru_runs():
  params = _init_gru(jax.random.key(0), GCFG)
  window = jax.random.randint(jax.random.key(2), (2, 9), 0, 256)
  cfg = eggroll.EggrollConfig(pop=4, sigma=0.01, pop_chunk=2)
  opt = optax.sgd(1e-3)
  step = jax.jit(eggroll.make_step(gru.gru_loss, cfg, opt))
  new, _, metrics = step(params, opt.init(params), window, jax.random.key(3), 0)
  assert jax.tree.structure(new) == jax.tree.structure(params)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new))
  assert abs(float(metrics["loss_mean"]) - math.log(256)) < 0.1


def test_config_validation():
  with pytest.raises(ValueError):
    eggroll.EggrollConfig(pop=5, sigma=0.1)
  with pytest.raises(ValueError):
    eggroll.EggrollConfig(pop=8, sigma=0.1, pop_chunk=3)
