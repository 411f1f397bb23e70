"""EGGROLL: low-rank forwards, antithetic noise, fitness shaping, chunking, descent.

Everything is jitted once per shape: on 2 CPU cores eager RNG and scans would dominate.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from soma_jax import eggroll, gru, model, runs, train_state
from soma_jax import plan as plan_lib
from soma_jax import spec as spec_lib
from soma_jax.layers import LowRank
from tests.test_compare import gru_flops_per_token, load_config

GCFG = gru.GruConfig(d=8, depth=1)
WHOLE = eggroll.EggrollConfig(pop=16, sigma=0.1, rank=2)
CHUNKED = eggroll.EggrollConfig(pop=16, sigma=0.1, rank=2, pop_chunk=4)
_estimate = jax.jit(eggroll.estimate, static_argnames=("loss_fn", "cfg"))
_population_losses = jax.jit(eggroll.population_losses, static_argnums=(4, 5))


def _np_init(init_fn, seed=0):
  """Random params shaped like `init_fn()` from numpy: no init program to compile."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape) / math.sqrt(s.shape[0]),
                                            s.dtype), jax.eval_shape(init_fn))


def _init_gru(seed, cfg):
  return _np_init(lambda: gru.init_gru(jax.random.key(0), cfg), seed)


def _init_expert(seed, cfg):
  return _np_init(lambda: (model.init_body(jax.random.key(0), cfg),
                           model.init_head(jax.random.key(0), cfg)), seed)


def _explicit(tree):
  """Materialise every LowRank leaf as w + B A^T (w is [in, out], so B A^T is [in, out])."""
  return jax.tree.map(lambda x: x.w + x.b @ x.a.T if isinstance(x, LowRank) else x, tree,
                      is_leaf=lambda x: isinstance(x, LowRank))


@functools.partial(jax.jit, static_argnums=2)
def _dense_population(params, skey, cfg):
  """Every member's weights as dense arrays with a leading [pop] axis (member m = 2n + s)."""
  m = jnp.arange(cfg.pop)
  noise_idx, sign = m // 2, 1.0 - 2.0 * (m % 2)
  return jax.vmap(lambda n, s: _explicit(eggroll.perturb(params, skey, n, s, cfg)))(noise_idx, sign)


def _bytes(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 256, shape), jnp.int32)


def _mse(p, batch):
  x, y = batch
  return jnp.mean(jnp.square(model.linear(x, p["w"]) + p["b"] - y))


def _regression(key, n=64, d_in=6, d_out=3):
  kx, kw = jax.random.split(key)
  x = jax.random.normal(kx, (n, d_in))
  y = x @ jax.random.normal(kw, (d_in, d_out)) + 0.5
  return {"w": jnp.zeros((d_in, d_out)), "b": jnp.zeros((d_out,))}, (x, y)


def test_lowrank_gru_forward_equals_explicit():
  cfg = eggroll.EggrollConfig(pop=4, sigma=0.1, rank=2)
  params = _init_gru(0, GCFG)
  inputs = _bytes(1, (2, 16))

  @jax.jit
  def both(params):
    pert = eggroll.perturb(params, jax.random.key(3), 5, -1.0, cfg)
    assert isinstance(pert["layers"][0]["w_h"], LowRank) and isinstance(pert["embed"], LowRank)
    assert pert["layers"][0]["mlp_up"].a.shape == (4 * GCFG.d, cfg.rank)
    return gru.gru_logits(pert, inputs), gru.gru_logits(_explicit(pert), inputs)

  np.testing.assert_allclose(*both(params), rtol=1e-4, atol=1e-4)


def test_population_on_soma_expert_equals_explicit_forwards():
  """The vmapped, chunked population of LowRank experts matches dense W + B A^T experts."""
  mcfg = model.ModelConfig(d_t=8, d_e=4, depth=1)  # with projections
  body, embed = _init_expert(0, mcfg)
  window = _bytes(2, (2, 9))
  cfg = eggroll.EggrollConfig(pop=4, sigma=0.2, pop_chunk=2)
  key, step = jax.random.key(3), 5
  loss_fn = lambda b, w: model.loss(b, embed, w)
  got = _population_losses(body, window, key, step, loss_fn, cfg)
  dense_P = _dense_population(body, jax.random.fold_in(key, step), cfg)
  want = jax.jit(jax.vmap(loss_fn, in_axes=(0, None)))(dense_P, window)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert float(jnp.std(got)) > 0


def test_perturbation_scale_and_antithetic_symmetry():
  cfg = eggroll.EggrollConfig(pop=4, sigma=0.05, rank=2)
  params = _init_gru(0, GCFG)
  dense = _dense_population(params, jax.random.key(1), cfg)
  for p, d in zip(jax.tree.leaves(params), jax.tree.leaves(dense), strict=True):
    plus, minus, other = d[0] - p, d[1] - p, d[2] - p
    np.testing.assert_allclose(plus, -minus, rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(plus))) > 0
    assert not np.allclose(plus, other), "different noise indices must draw different noise"
  # A matrix perturbation sigma B A^T / sqrt(r) has entries of standard deviation sigma.
  delta = dense["head"][0] - params["head"]
  assert 0.7 * cfg.sigma < float(jnp.std(delta)) < 1.3 * cfg.sigma


def test_antithetic_losses_of_a_linear_loss_are_symmetric():
  cfg = eggroll.EggrollConfig(pop=8, sigma=0.1, pop_chunk=4)
  params = {"w": jax.random.normal(jax.random.key(0), (5, 4)), "g": jnp.ones((4,))}
  x = jax.random.normal(jax.random.key(1), (3, 5))
  loss_fn = lambda p, batch: jnp.sum(model.linear(batch, p["w"])) + jnp.sum(p["g"])
  losses = _population_losses(params, x, jax.random.key(2), 0, loss_fn, cfg)
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
  params, batch = _regression(jax.random.key(0))
  key = jax.random.key(1)
  g1, m1 = _estimate(params, batch, key, 3, loss_fn=_mse, cfg=WHOLE)
  g2, m2 = _estimate(params, batch, key, 3, loss_fn=_mse, cfg=CHUNKED)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m1["loss_mean"], m2["loss_mean"], rtol=1e-6)
  g1_again, _ = _estimate(params, batch, key, 3, loss_fn=_mse, cfg=WHOLE)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g1_again), strict=True):
    np.testing.assert_array_equal(a, b)
  g3, _ = _estimate(params, batch, key, 4, loss_fn=_mse, cfg=WHOLE)
  assert not np.allclose(g1["w"], g3["w"]), "a new step must draw new noise"


def test_estimate_matches_dense_sum():
  """grads = -(1/(pop sigma)) sum_m f_m (theta_m - theta) / sigma, from dense members."""
  params, batch = _regression(jax.random.key(0))
  key, step = jax.random.key(1), 2
  grads, metrics = _estimate(params, batch, key, step, loss_fn=_mse, cfg=CHUNKED)
  dense_P = _dense_population(params, jax.random.fold_in(key, step), CHUNKED)
  losses = jax.vmap(_mse, in_axes=(0, None))(dense_P, batch)
  np.testing.assert_allclose(metrics["loss_mean"], losses.mean(), rtol=1e-5)
  f = -(losses - losses.mean()) / losses.std()
  pop, sigma = CHUNKED.pop, CHUNKED.sigma
  for g, p, d in zip(*map(jax.tree.leaves, (grads, params, dense_P)), strict=True):
    want = -jnp.tensordot(f, (d - p) / sigma, axes=1) / (pop * sigma)
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)


def test_eggroll_descends_on_linear_regression():
  params, batch = _regression(jax.random.key(0))
  cfg = eggroll.EggrollConfig(pop=32, sigma=0.05, rank=1, pop_chunk=16)
  opt = optax.adam(0.05)
  step = jax.jit(eggroll.make_step(_mse, cfg, opt))
  opt_state, key = opt.init(params), jax.random.key(1)
  start = float(_mse(params, batch))
  for i in range(60):
    params, opt_state, metrics = step(params, opt_state, batch, key, i)
  end = float(_mse(params, batch))
  assert np.isfinite(float(metrics["loss_mean"]))
  assert end < 0.2 * start, f"EGGROLL should cut the regression loss: {start:.3f} -> {end:.3f}"


def test_step_on_gru_is_the_optimiser_on_the_estimate():
  """make_step on the GRU: params - lr * estimate(...) and the population's mean loss.

  The estimate itself is checked against dense members in test_estimate_matches_dense_sum;
  the same comparison rejects a step that ascends (params + lr * estimate).
  """
  params = _init_gru(0, GCFG)
  window = _bytes(2, (2, 9))
  cfg = eggroll.EggrollConfig(pop=4, sigma=0.01, pop_chunk=2)
  lr, key = 1e-1, jax.random.key(3)
  opt = optax.sgd(lr)
  step = jax.jit(eggroll.make_step(gru.gru_loss, cfg, opt))
  new, _, metrics = step(params, opt.init(params), window, key, 0)
  grads, _ = _estimate(params, window, key, 0, loss_fn=gru.gru_loss, cfg=cfg)
  assert float(optax.tree.norm(grads)) > 0

  def moved(sign):
    return all(np.allclose(n, p - sign * lr * g, rtol=1e-5, atol=1e-7)
               for n, p, g in zip(*map(jax.tree.leaves, (new, params, grads)), strict=True))

  assert moved(1.0) and not moved(-1.0)
  losses = _population_losses(params, window, key, 0, gru.gru_loss, cfg)
  np.testing.assert_allclose(metrics["loss_mean"], losses.mean(), rtol=1e-6)
  assert abs(float(metrics["loss_mean"]) - math.log(256)) < 0.1


def test_config_validation():
  with pytest.raises(ValueError):
    eggroll.EggrollConfig(pop=5, sigma=0.1)
  with pytest.raises(ValueError):
    eggroll.EggrollConfig(pop=8, sigma=0.1, pop_chunk=3)


def _gru_method_config(data_dir, **over):
  c = load_config("eggroll", "n=1,size=tiny")
  c.data.dir = data_dir
  c.update(over)
  return c


def make_step(c):
  """(the method's step at its step config, its operations per update per expert)."""
  method = spec_lib.resolve(c).method
  return functools.partial(method.train_step, cfg=method.step_config()), method.ops_per_update


def test_method_eggroll_is_the_papers_gru(data_prepared):

  c = _gru_method_config(data_prepared)
  body_N, _ = runs.initial_params(spec_lib.resolve(c))
  assert c.method == "eggroll" and c.model.depth == 6
  assert len(body_N["layers"]) == 6 and "head" in body_N and "embed" in body_N  # untied head
  assert body_N["head"].shape == (1, c.model.d_t, 256)
  _, ops = make_step(c)  # each member forwards its pair's segment
  assert ops == c.eggroll.pop * c.eggroll.segment * gru_flops_per_token(c.model.d_t, 6)


def test_gru_eggroll_loss_falls_by_the_es_update(data_prepared):
  """On fixed segments (the streams' first, which start from a reset) the loss falls under
  the ES update, and not at lr = 0."""
  from soma_jax.data import pipeline

  c = _gru_method_config(data_prepared, steps=25)
  c.opt.lr = 1e-2
  c.eggroll.update(pop=32, pop_chunk=16, sigma=0.05, segment=64)
  segs = next(pipeline.StreamSegments(data_prepared, [0], streams=16, segment=64, seed=0,
                                      pooled=True))
  assert segs["reset"][0, 0]
  segs = jax.tree.map(jnp.asarray, segs)
  step_fn, _ = make_step(c)
  ids = jnp.zeros((1,), jnp.int32)
  h0 = jnp.zeros(gru.state_shape(spec_lib.resolve(c).method.model))
  each = jax.vmap(gru.segment_loss, in_axes=(None, 0, 0, None, None))
  loss = jax.jit(lambda body: jnp.mean(each(jax.tree.map(lambda x: x[0], body), segs["inputs"][0],
                                            segs["targets"][0], segs["reset"][0], h0)[0]))

  def run(lr):
    state = runs.initial_state(spec_lib.resolve(c))
    state = state.replace(sched=state.sched.replace(lr=jnp.full((1,), lr, jnp.float32)))
    start = float(loss(state.body))
    for _ in range(c.steps):
      state, _ = step_fn(state, segs, ids)
    return start, float(loss(state.body))

  start, trained = run(5e-2)
  start0, frozen = run(0.0)
  assert start == start0
  assert frozen == start0, "lr = 0 must leave the GRU unchanged"
  assert trained < start - 0.1, f"ES should cut the fixed-segment loss: {start:.3f} -> {trained:.3f}"


def test_gru_eggroll_trains_checkpoints_and_evaluates(data_prepared, tmp_path):
  """method=eggroll runs the whole loop: train, checkpoint, restore, expert validation."""
  from soma_jax import train

  c = _gru_method_config(data_prepared)
  summary = train.run(c, str(tmp_path / "run"))
  assert summary["status"] == "done" and np.isfinite(summary["val_loss"]).all()
  body_N, head, restored = runs.restore_params(str(tmp_path / "run"))
  assert restored.name == "eggroll" and len(body_N["layers"]) == 6
  windows = jnp.asarray(plan_lib.place(spec_lib.resolve(c)).val_windows)
  val = train_state.expert_losses(body_N, head, windows, shared_head=True,
                           loss_fn=restored.val_loss)
  np.testing.assert_allclose(np.asarray(val), summary["val_loss"], rtol=1e-5)


def test_eggroll_lstm_extra_runs_es_on_the_soma_expert(data_prepared):
  """eggroll.py:model=lstm is ES on the SOMA LSTM body (method=eggroll_lstm), not the GRU.

  One update is Adam's first step, lr * sign(g + wd theta), on eggroll.estimate of
  model.loss with the expert's head (key fold_in(seed, expert id), step 0), and its loss is
  the population's mean loss; a step that ascends would move every weight the other way.
  The own head takes Adam's first step along the delta rule (spsa.head_grad).
  """
  from soma_jax import spsa
  from soma_jax.data import pipeline

  c = load_config("eggroll", "n=1,size=tiny,model=lstm")
  c.data.dir = data_prepared
  assert c.method == "eggroll_lstm"
  state = runs.initial_state(spec_lib.resolve(c))
  assert "blocks" in state.body
  step_fn, ops = make_step(c)
  tokens = c.data.seq_len * c.spsa.batch * c.spsa.accum
  assert ops == c.eggroll.pop * tokens * spec_lib.resolve(c).method.flops_per_token
  batch = next(pipeline.train_iterator(data_prepared, [0], batch=c.spsa.batch, accum=1,
                                       seq_len=c.data.seq_len, seed=0, pooled=True))
  body0 = jax.tree.map(lambda x: np.asarray(x[0]), state.body)  # before the donated step
  head0, lr = np.asarray(state.head[0]), float(state.sched.lr[0])  # own heads: expert 0
  new, metrics = step_fn(state, jnp.asarray(batch), jnp.zeros((1,), jnp.int32))
  assert int(new.step) == 1
  es = eggroll.EggrollConfig(pop=c.eggroll.pop, sigma=c.eggroll.sigma, rank=c.eggroll.rank,
                             pop_chunk=c.eggroll.pop_chunk)
  windows = jnp.asarray(batch[0]).reshape(-1, batch.shape[-1])  # the A*B sequences
  g, m = jax.jit(eggroll.estimate, static_argnums=(4, 5))(
      body0, windows, jax.random.fold_in(jax.random.key(c.seed), 0), 0,
      lambda b, w: model.loss(b, jnp.asarray(head0), w), es)
  np.testing.assert_allclose(np.asarray(metrics["loss"])[0], m["loss_mean"], rtol=1e-6)
  wd = c.opt.weight_decay
  # The own head follows SOMA's delta rule: Adam's first step along spsa.head_grad.
  g_head = jax.jit(spsa.head_grad)(body0, jnp.asarray(head0), jnp.asarray(batch[0]))
  for p0, p1, gi in zip(*map(jax.tree.leaves, ((body0, head0), (new.body, new.head), (g, g_head))),
                        strict=True):
    # Adam's first bias-corrected step: lr g / (|g| + 1e-8), about lr * sign(g).
    gw = np.asarray(gi, np.float64) + wd * p0
    np.testing.assert_allclose(p0 - np.asarray(p1)[0], lr * gw / (np.abs(gw) + 1e-8), atol=1e-6)


# ----------------------------------------------------------------- streams (SPEC 9.4)


def _segment(seed, n, length):
  return _bytes(seed, (n, length)), _bytes(seed + 1, (n, length))


def test_stream_losses_are_each_member_on_its_pairs_segment_from_its_state():
  """Member m = 2n + s runs noise n, sign s, on segment n from carry[m]; chunks change nothing."""
  gcfg = gru.GruConfig(d=8, depth=2)
  params = _init_gru(0, gcfg)
  pop, length = 8, 6
  inputs, targets = _segment(1, pop // 2, length)
  reset = jnp.asarray([False, False, True, False, False, False])
  carry = jax.random.normal(jax.random.key(2), (pop,) + gru.state_shape(gcfg))
  key, step = jax.random.key(3), 4
  loss_fn = lambda p, seg, h: gru.segment_loss(p, seg[0], seg[1], reset, h)
  run = jax.jit(eggroll.stream_losses, static_argnums=(5, 6))
  got = {}
  for chunk in (2, 8):
    cfg = eggroll.EggrollConfig(pop=pop, sigma=0.1, pop_chunk=chunk)
    got[chunk] = run(params, (inputs, targets), carry, key, step, loss_fn, cfg)
  for a, b in zip(jax.tree.leaves(got[2]), jax.tree.leaves(got[8]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  loss_P, carry_P = got[2]
  dense_P = _dense_population(params, jax.random.fold_in(key, step), cfg)
  want = jax.jit(jax.vmap(gru.segment_loss, in_axes=(0, 0, 0, None, 0)))(
      dense_P, jnp.repeat(inputs, 2, 0), jnp.repeat(targets, 2, 0), reset, carry)
  np.testing.assert_allclose(loss_P, want[0], rtol=1e-5)
  np.testing.assert_allclose(carry_P, want[1], rtol=1e-5, atol=1e-6)
  assert len(set(np.round(np.asarray(loss_P), 6))) == pop  # every member its own loss


def test_gru_state_carries_across_segments_and_resets():
  """Two halves with the state carried = the whole; a reset = starting from zero there."""
  gcfg = gru.GruConfig(d=8, depth=2)
  params = _init_gru(0, gcfg)
  x, y = _segment(5, 1, 12)
  x, y = x[0], y[0]
  h0 = jnp.zeros(gru.state_shape(gcfg))
  no_reset = jnp.zeros((6,), bool)
  seg = jax.jit(gru.segment_loss)
  l1, h1 = seg(params, x[:6], y[:6], no_reset, h0)
  l2, h2 = seg(params, x[6:], y[6:], no_reset, h1)
  whole, h12 = seg(params, x, y, jnp.zeros((12,), bool), h0)
  np.testing.assert_allclose((l1 + l2) / 2, whole, rtol=1e-5)
  np.testing.assert_allclose(h2, h12, rtol=1e-5, atol=1e-6)
  lr, _ = seg(params, x[6:], y[6:], no_reset.at[0].set(True), h1)
  l_zero, _ = seg(params, x[6:], y[6:], no_reset, h0)
  np.testing.assert_allclose(lr, l_zero, rtol=1e-6)
  assert abs(float(l2) - float(l_zero)) > 1e-4, "the carried state must change the loss"


def test_cpu_update_stands_to_soma_as_in_the_paper():
  """Perturbed token-forwards per update: EGGROLL at size=cpu against SOMA N = 2 per expert,
  within 20% of the paper's 2^20 x 100 : 2 x 64 x 64 x 1,024 (about 12x)."""

  assert abs(2**20 * 100 / (2 * 64 * 64 * 1024) / 12 - 1) < 0.05
  egg, soma = load_config("eggroll", "n=1,size=cpu"), load_config("soma", "n=2,size=cpu")
  egg_tokens = make_step(egg)[1] // spec_lib.resolve(egg).method.flops_per_token
  soma_tokens = make_step(soma)[1] // spec_lib.resolve(soma).method.flops_per_token
  assert egg_tokens == egg.eggroll.pop * egg.eggroll.segment and egg.eggroll.segment == 100
  assert soma_tokens == 2 * soma.spsa.n_pert * soma.spsa.batch * soma.data.seq_len
  assert abs(egg_tokens / soma_tokens / 12 - 1) < 0.2, egg_tokens / soma_tokens


def test_paper_preset_is_the_papers_run():
  c = load_config("eggroll", "n=1,size=paper")
  assert (c.method, c.model.d_t, c.model.depth) == ("eggroll", 339, 6)
  assert c.opt.lr == 0.01 and c.opt.weight_decay == 0.0
  assert c.eggroll.sigma == eggroll.sigma_from_shift(4) == 0.0625
  assert (c.eggroll.rank, c.eggroll.pop, c.eggroll.segment) == (1, 2**20, 100)
  assert abs(spec_lib.resolve(c).method.body_params / 8.44e6 - 1) < 0.02


def test_gru_eggroll_resume_is_exact_with_carried_states(data_prepared, tmp_path):
  """Stopped at step 3 and resumed, a run ends where the straight run ends: parameters,
  every member's carried state and the metrics, bit for bit."""
  import json
  import os

  from soma_jax import train

  def metrics(w):
    with open(os.path.join(w, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    return [{k: r[k] for k in ("step", "loss", "val_loss") if k in r} for r in rows]

  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  c = _gru_method_config(data_prepared, steps=6, log_every=1, eval_every=3, ckpt_every=3)
  train.run(c, straight)
  train.run(_gru_method_config(data_prepared, steps=3, log_every=1, eval_every=3,
                                 ckpt_every=3), resumed)
  _, mid, data_state, _ = runs.restore_state(resumed)
  assert data_state["iterator"]["position"] == 3 * c.eggroll.segment
  assert float(jnp.max(jnp.abs(mid.carry))) > 0, "the members' states must be carried"
  train.run(c, resumed)
  _, a, _, _ = runs.restore_state(straight)
  _, b, _, _ = runs.restore_state(resumed)
  assert a.carry.shape == (1, c.eggroll.pop, 6, c.model.d_t)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)
  assert metrics(straight) == metrics(resumed)
