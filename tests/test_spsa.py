"""The SPSA estimator against the math of SPEC 3 and 5, and the step's contracts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64

from soma_jax import model as M
from soma_jax import spsa as S
from soma_jax import train_state as TS

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


SMALL = M.ModelConfig(d_t=2, d_e=2, depth=1)  # 70 body parameters: cheap large-K averages


def _relative_error(g_hat, g) -> float:
  """||g_hat - g|| / ||g||: zero only for the right direction AND the right scale."""
  return float(np.linalg.norm(np.asarray(g_hat) - np.asarray(g)) / np.linalg.norm(np.asarray(g)))


def test_probe_moments_match_probe_second_moment():
  """Every leaf's empirical mean and E z^2 match 0 and q (3 standard errors), for each kind."""
  body = M.init_body(jax.random.key(0), M.ModelConfig(d_t=32))
  for kind in S.PROBES:
    z = jax.tree.leaves(S.probe(jax.random.key(5), body, kind))
    q = jax.tree.leaves(S.probe_second_moment(body, kind))
    for zl, ql in zip(z, q, strict=True):
      x, qv = np.asarray(zl, np.float64).ravel(), float(np.asarray(ql).ravel()[0])
      se = np.sqrt((3.0 if kind == "gaussian" else 1.0) / x.size)  # sd of z and z^2 <= 1.5
      assert abs(x.mean()) <= 3 * se, (kind, x.size, x.mean())
      assert abs(np.mean(x**2) - qv) <= 3 * se * max(qv, 0.5), (kind, np.mean(x**2), qv)


@pytest.mark.parametrize("field", range(4))
def test_each_key_component_draws_a_new_direction(field):
  """Changing step, expert, accumulation index or direction changes the probe."""
  body = M.init_body(jax.random.key(0), TINY)
  base = [3, 1, 0, 2]
  other = list(base)
  other[field] += 1
  z = [S.probe(S.probe_key(jax.random.key(9), *f), body, "rademacher") for f in (base, other)]
  again = S.probe(S.probe_key(jax.random.key(9), *base), body, "rademacher")
  assert not all(np.array_equal(a, b) for a, b in zip(*map(jax.tree.leaves, z)))
  assert all(np.array_equal(a, b) for a, b in zip(*map(jax.tree.leaves, (z[0], again))))


def _hand_adam(theta, grads, lrs, wd, b1=0.9, b2=0.999, eps=1e-8):
  """Adam with bias correction and coupled weight decay, one numpy loop per update."""
  m = np.zeros_like(theta)
  v = np.zeros_like(theta)
  for t, (g, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
    g = g + wd * theta  # coupled: the decay enters the moments
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    theta = theta - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
  return theta


def _adam_matches(got, want) -> bool:
  return np.allclose(got, want, rtol=1e-9, atol=1e-12)


def test_adam_matches_hand_written_adam():
  """`apply_updates` with `adam(wd)`: per-expert lr, bias correction, coupled weight decay.

  Gradients of different scales in different updates make every term visible (Adam's
  first step alone is lr * sign(g)). A planted decoupled decay and a missing bias
  correction are rejected by the same comparison; an expert with ok=False stays put.
  """
  rng = np.random.default_rng(0)
  wd, steps = 0.05, 4
  with enable_x64():
    theta_N = {"w": rng.normal(size=(3, 5))}
    grads = [rng.normal(size=(3, 5)) * 10.0 ** rng.integers(-2, 2, (3, 1)) for _ in range(steps)]
    lrs = [np.array([1e-2, 3e-3, 1e-1]) * (0.5 ** t) for t in range(steps)]
    tx = TS.adam(wd)
    params = jax.tree.map(jnp.asarray, theta_N)
    opt = jax.vmap(tx.init)(params)
    ok = jnp.array([True, True, False])
    for g, lr in zip(grads, lrs, strict=True):
      params, opt = TS.apply_updates(tx, params, opt, {"w": jnp.asarray(g)}, jnp.asarray(lr), ok)
    got = np.asarray(params["w"])
  for e in range(2):
    want = _hand_adam(theta_N["w"][e], [g[e] for g in grads], [lr[e] for lr in lrs], wd)
    assert _adam_matches(got[e], want), f"expert {e}: Adam differs from the hand-written one"
  np.testing.assert_array_equal(got[2], theta_N["w"][2])  # ok=False: no update
  # The check rejects decoupled weight decay (AdamW) and Adam without bias correction.
  g0, lr0 = [g[0] for g in grads], [lr[0] for lr in lrs]
  adamw = _hand_adam(theta_N["w"][0], g0, lr0, 0.0)
  adamw -= sum(lr0) * wd * theta_N["w"][0]
  assert not _adam_matches(got[0], adamw)
  no_bias = theta_N["w"][0].copy()
  m = v = 0
  for g, lr in zip(g0, lr0, strict=True):
    g = g + wd * no_bias
    m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    no_bias = no_bias - lr * m / (np.sqrt(v) + 1e-8)
  assert not _adam_matches(got[0], no_bias)


def test_train_step_is_adam_on_the_estimate_and_the_delta_rule():
  """Two train_steps: body = hand Adam on spsa.estimate's g, head = hand Adam on head_grad.

  Each expert uses its own lr and eps from the schedule state and the config's weight decay.
  """
  n, wd = 2, 1e-2
  cfg = dataclasses.replace(_step_cfg(weight_decay=wd), spsa=S.SpsaConfig(n_pert=2, pert_chunk=2))
  with enable_x64():
    body_N, head_N = M.init_experts(jax.random.key(0), cfg.model, n)
    body_N, head_N = jax.tree.map(lambda x: x.astype(jnp.float64), (body_N, head_N))
    state = TS.init_state(body_N, head_N, 1e-3, 1e-3, cfg.weight_decay, cfg.train_head)
    lr_N, eps_N = jnp.array([2e-3, 5e-3]), jnp.array([1e-3, 2e-3])
    state = state.replace(sched=state.sched.replace(lr=lr_N, eps=eps_N))
    batches = jax.random.randint(jax.random.key(1), (2, n, 1, 2, 9), 0, 256).astype(jnp.uint8)
    ids = jnp.arange(n)

    @jax.jit
    def grads_and_step(s, batch):
      g, _ = S.estimate(s.body, s.head, batch, eps_N, s.step, ids, jax.random.key(cfg.seed),
                        cfg.spsa, shared_head=False)
      return _flat(g), jax.vmap(S.head_grad)(s.body, s.head, batch), S.train_step(
          s, batch, ids, cfg)[0]

    body_grads, head_grads, s = [], [], state
    for t in range(2):
      g, gh, s = grads_and_step(s, batches[t])
      body_grads.append(np.asarray(g))
      head_grads.append(np.asarray(gh))
    for e in range(n):
      lrs = [float(lr_N[e])] * 2
      want_body = _hand_adam(np.asarray(_flat(body_N))[e], [g[e] for g in body_grads], lrs, wd)
      assert _adam_matches(np.asarray(_flat(s.body))[e], want_body), f"body of expert {e}"
      want_head = _hand_adam(np.asarray(head_N[e]), [g[e] for g in head_grads], lrs, wd)
      assert _adam_matches(np.asarray(s.head[e]), want_head), f"head of expert {e}"


def test_unbiased_against_jax_grad():
  """Averaged over 16,384 dense-Rademacher directions, ||mean g_hat - g|| / ||g|| <= 0.15.

  E g_hat = g + O(eps^2), so the relative error of the mean is sqrt((d - 1) / K) = 0.065
  here (d = 70). A halved, doubled or sign-flipped estimate is off by >= 0.5; so is one
  that divides by the wrong count. The cosine alone would accept any rescaling, so the
  check is shown to reject a half-scale estimate too.
  """
  with enable_x64():
    body_N, head, batch = _setup(n=1, cfg=SMALL, dtype=jnp.float64)
    cfg = S.SpsaConfig(n_pert=16384, probe="rademacher", pert_chunk=4096)
    g_hat, _ = jax.jit(S.estimate, static_argnames="cfg")(
        body_N, head, batch, jnp.array([1e-4]), 0, jnp.arange(1), jax.random.key(7), cfg=cfg)
    g = np.asarray(_flat(_exact_grad(body_N, head, batch))[0])
    g_hat = np.asarray(_flat(g_hat)[0])
  d = g.shape[0]
  expected = np.sqrt((d - 1) / cfg.n_pert)
  err = _relative_error(g_hat, g)
  assert err <= 0.15, f"||mean g_hat - g|| / ||g|| = {err:.3f} (sampling alone: {expected:.3f})"
  assert _relative_error(0.5 * g_hat, g) > 0.15  # the check rejects a half-scale estimator


def _law_holds(measured, se, predicted, z=3.0) -> bool:
  """|measured - predicted| <= z standard errors."""
  return abs(measured - predicted) <= z * se


def _n_pert_errors(body_N, head, batch, g, n_pert, reps, key):
  """||g_hat - g||^2 / ||g||^2 of `reps` independent estimates (steps 0..reps-1 of `key`)."""
  cfg = S.SpsaConfig(n_pert=n_pert, probe="rademacher", pert_chunk=n_pert)
  est = jax.jit(jax.vmap(lambda step: _flat(S.estimate(
      body_N, head, batch, jnp.array([1e-5]), step, jnp.arange(1), key, cfg)[0])[0]))
  g_hat = est(jnp.arange(reps))
  return np.asarray(jnp.sum((g_hat - g) ** 2, -1) / jnp.sum(g**2))


def test_variance_law_dense_rademacher():
  """E||g_hat - g||^2 / ||g||^2 = (d - 1) / n_pert for dense probes, small eps (SPEC 5).

  Each n_pert (1 and 16) draws its own directions from its own base key, so the points
  and the slope between them are independent measurements; every point must lie within
  3 standard errors of the law, and the log-log slope within 3 standard errors of -1.
  The same check rejects an estimator that reuses one direction n_pert times (its error
  stays at (d - 1) instead of falling as 1 / n_pert).
  """
  reps = {1: 512, 16: 128}
  with enable_x64():
    body_N, head, batch = _setup(n=1, cfg=SMALL, dtype=jnp.float64)
    g = _flat(_exact_grad(body_N, head, batch))[0]
    errs = {k: _n_pert_errors(body_N, head, batch, g, k, r, jax.random.key(100 + k))
            for k, r in reps.items()}
  d = g.shape[0]
  mean = {k: float(e.mean()) for k, e in errs.items()}
  se = {k: float(e.std(ddof=1) / np.sqrt(len(e))) for k, e in errs.items()}
  for k in reps:
    predicted = (d - 1) / k
    assert _law_holds(mean[k], se[k], predicted), (
        f"n_pert={k}: measured {mean[k]:.1f} +- {se[k]:.1f} vs (d-1)/n_pert = {predicted:.1f}")
  # Slope of log(error) on log(n_pert), with its standard error from the points' errors.
  x = np.log(np.array(list(reps), np.float64))
  y = np.log(np.array([mean[k] for k in reps]))
  w = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
  slope = float(w @ y)
  slope_se = float(np.sqrt(np.sum((w * np.array([se[k] / mean[k] for k in reps])) ** 2)))
  assert _law_holds(slope, slope_se, -1.0), f"slope {slope:.3f} +- {slope_se:.3f}, law -1"
  # One direction repeated 16 times has the n_pert = 1 error, not 1/16 of it.
  assert not _law_holds(mean[1], se[1], (d - 1) / 16)


def test_chunking_does_not_change_the_estimate():
  body_N, head, batch = _setup(n=2, a=2)
  args = (body_N, head, batch, jnp.full((2,), 1e-3), 3, jnp.arange(2), jax.random.key(0))
  g1, l1 = S.estimate(*args, S.SpsaConfig(n_pert=8, accum=2, pert_chunk=8))
  g2, l2 = S.estimate(*args, S.SpsaConfig(n_pert=8, accum=2, pert_chunk=2))
  for x, y in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)


def test_signs_apart_equal_signs_together():
  """spsa.signs is speed only: + then - equals both signs in one vmapped pass, to float32
  rounding, and really runs the two signs one after the other (a loop of length 2)."""
  body_N, head, batch = _setup(n=2, a=2)
  args = (body_N, head, batch, jnp.full((2,), 1e-3), 3, jnp.arange(2), jax.random.key(0))
  together = S.SpsaConfig(n_pert=4, accum=2, pert_chunk=2)
  apart = dataclasses.replace(together, signs_together=False)
  g1, l1 = S.estimate(*args, together)
  g2, l2 = S.estimate(*args, apart)
  np.testing.assert_allclose(_flat(g2), _flat(g1), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(l2, l1, rtol=1e-6)

  def scan_lengths(jaxpr) -> list[int]:  # every scan's length, nested ones included
    out = []
    for e in jaxpr.eqns:
      if e.primitive.name == "scan":
        out.append(e.params["length"])
      for p in e.params.values():
        if hasattr(p, "jaxpr"):  # a ClosedJaxpr (scan, pjit) or a Jaxpr
          out += scan_lengths(p.jaxpr if hasattr(p.jaxpr, "eqns") else p)
    return out

  lengths = lambda cfg: scan_lengths(jax.make_jaxpr(lambda *a: S.estimate(*a, cfg))(*args).jaxpr)
  # One more scan of length 2 (+, then -) than evaluating both signs at once.
  assert lengths(apart).count(2) == lengths(together).count(2) + 1


def _step_cfg(**kw):
  return S.StepConfig(model=dataclasses.replace(TINY, shared_head=False),
                      spsa=S.SpsaConfig(n_pert=4, pert_chunk=2), train_head=True, **kw)


def _state(n=3):
  cfg = dataclasses.replace(TINY, shared_head=False)
  body_N, head_N = M.init_experts(jax.random.key(0), cfg, n)
  return TS.init_state(body_N, head_N, 1e-3, 1e-3, train_head=True)


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
  # A function of its own: jit wrappers of S.train_step itself share one cache across
  # tests (other tests' shapes would count here).
  def train_step(state, batch, ids, cfg):
    return S.train_step(state, batch, ids, cfg)

  step = jax.jit(train_step, static_argnames="cfg")
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


@jax.jit
def _plus_minus(body, z, head, window_BxT1, eps):
  """[L(theta + eps z), L(theta - eps z)] with the plain `model.loss`."""
  moved = lambda sign: jax.tree.map(lambda p, d: p + sign * eps * d, body, z)
  return jnp.stack([M.loss(moved(sign), head, window_BxT1) for sign in (1.0, -1.0)])


def _perturbed_losses(body_N, head, batch_NxAxBxT1, eps, step, ids, key, cfg):
  """losses [N, A, K, 2] and directions z[e][a][j] (flat numpy), drawn as SPEC 3.1 says."""
  n, a_count = batch_NxAxBxT1.shape[:2]
  draw = jax.jit(S.probe, static_argnums=2)
  losses = np.zeros((n, a_count, cfg.n_pert, 2))
  z_flat = np.zeros((n, a_count, cfg.n_pert, _flat(body_N).shape[1]))
  for e in range(n):
    body = jax.tree.map(lambda x, e=e: x[e], body_N)
    for a in range(a_count):
      for j in range(cfg.n_pert):
        z = draw(S.probe_key(key, step, int(ids[e]), a, j), body, cfg.probe)
        losses[e, a, j] = _plus_minus(body, z, head, batch_NxAxBxT1[e, a], eps)
        z_flat[e, a, j] = np.concatenate([np.ravel(x) for x in jax.tree.leaves(z)])
  return losses, z_flat


def _hand_estimate(losses_NxAxKx2, z_NxAxKxD, eps, groups=None, reduce=np.sum):
  """SPEC 3.1 written out: g_e = 1/(A K) sum_a sum_j [sum_{f in G(e)} (L_f+ - L_f-)] / (2 eps) z_ej.

  `reduce` combines a group's differences (np.sum is the method; np.mean is a planted bug).
  """
  n, a_count, k = losses_NxAxKx2.shape[:3]
  diff = losses_NxAxKx2[..., 0] - losses_NxAxKx2[..., 1]
  groups = np.arange(n) if groups is None else np.asarray(groups)
  coef = np.stack([reduce(diff[groups == groups[e]], axis=0) for e in range(n)]) / (2 * eps)
  return np.einsum("naj,najd->nd", coef, z_NxAxKxD) / (a_count * k)


def _same_estimate(g_NxD, hand_NxD) -> bool:
  """Every coordinate of every expert agrees to float64 rounding."""
  return np.allclose(g_NxD, hand_NxD, rtol=1e-7, atol=1e-9)


def test_estimate_equals_the_formula_written_out():
  """spsa.estimate (separate and shared losses) is sum (L+ - L-) / (2 eps) z / (A K), exactly.

  Global expert ids (5, 2, 7, 0) and A = 2 batches check that each expert draws its own
  directions for each batch. A planted group mean (instead of the sum) and a half-scale
  estimate are rejected by the same comparison. loss_N is each expert's own mean
  perturbed loss, whatever the grouping.
  """
  eps = 1e-3
  with enable_x64():
    body_N, head, batch = _setup(n=4, a=2, dtype=jnp.float64)
    ids = jnp.array([5, 2, 7, 0])
    cfg = S.SpsaConfig(n_pert=2, accum=2, probe="sparse", pert_chunk=1)
    key, step = jax.random.key(4), 3
    losses, z = _perturbed_losses(body_N, head, batch, eps, step, ids, key, cfg)
    for groups in (None, (0, 0, 1, 1), (0, 0, 0, 0)):
      g_N, loss_N = S.estimate(body_N, head, batch, jnp.full((4,), eps), step, ids, key, cfg,
                               loss_groups=groups)
      g_NxD = np.asarray(_flat(g_N))
      hand = _hand_estimate(losses, z, eps, groups)
      assert _same_estimate(g_NxD, hand), f"groups={groups}: estimate != SPEC 3.1 formula"
      assert not _same_estimate(0.5 * g_NxD, hand)
      if groups is not None and len(set(groups)) < 4:
        assert not _same_estimate(g_NxD, _hand_estimate(losses, z, eps, groups, np.mean))
      np.testing.assert_allclose(loss_N, losses.mean(axis=(1, 2, 3)), rtol=1e-10)


def test_delta_rule_equals_gradient_with_features_fixed():
  h = jax.random.normal(jax.random.key(0), (2, 5, 8))
  e = jax.random.normal(jax.random.key(1), (256, 8))
  y = jax.random.randint(jax.random.key(2), (2, 5), 0, 256)
  ref = jax.grad(lambda e: jnp.mean(M.cross_entropy(h @ e.T, y)))(e)
  np.testing.assert_allclose(S.delta_rule_grad(h, e, y), ref, rtol=1e-5, atol=1e-7)


def test_head_grad_is_the_gradient_with_features_fixed_averaged_over_batches():
  """The head's delta rule on an expert's A batches: the autodiff gradient of its mean
  cross entropy with respect to E, the body's features held fixed (SPEC 3.2)."""
  cfg = M.ModelConfig(d_t=8, d_e=4)
  body, e = M.init_body(jax.random.key(0), cfg), M.init_head(jax.random.key(1), cfg)
  batch = jax.random.randint(jax.random.key(2), (3, 2, 9), 0, 256).astype(jnp.uint8)
  h = [M.features(body, e, w[:, :-1]) for w in batch]  # fixed: computed once, at this E

  def loss(e_):
    return jnp.mean(jnp.stack([jnp.mean(M.cross_entropy(hi @ e_.T, w[:, 1:]))
                               for hi, w in zip(h, batch)]))

  np.testing.assert_allclose(S.head_grad(body, e, batch), jax.grad(loss)(e),
                             rtol=1e-5, atol=1e-7)


def test_plateau_halves_lr_and_eps_together():
  cfg = TS.PlateauConfig(patience=10, floor=1e-5)
  p = TS.plateau_init(jnp.array([1e-3, 1e-3]), jnp.array([1e-3, 1e-3]))
  p = TS.plateau_update(p, jnp.array([2.0, 2.0]), 0, cfg)
  p = TS.plateau_update(p, jnp.array([1.9, 2.0]), 5, cfg)  # expert 0 improves
  p = TS.plateau_update(p, jnp.array([1.9, 2.0]), 10, cfg)  # expert 1: 10 updates stale
  np.testing.assert_allclose(p.lr, [1e-3, 5e-4])
  np.testing.assert_allclose(p.eps, [1e-3, 5e-4])
  p = TS.plateau_update(p, jnp.array([1.9, 2.0]), 15, cfg)  # expert 0 stale for 10
  np.testing.assert_allclose(p.lr, [5e-4, 5e-4])
  for s in range(20, 400, 10):
    p = TS.plateau_update(p, jnp.array([1.9, 2.0]), s, cfg)
  np.testing.assert_allclose(p.lr, [1e-5, 1e-5])  # floor


def _fit_periodic_bytes(probe, updates=40):
  """(loss before, loss after) of `updates` SOMA steps on a periodic byte stream.

  The head is shared and frozen (train_head=False), so every change of the loss comes from
  the SPSA body estimate: a run with the estimator off would end where it started.
  """
  cfg = S.StepConfig(model=dataclasses.replace(TINY, d_t=8, d_e=8, shared_head=True),
                     spsa=S.SpsaConfig(n_pert=8, pert_chunk=8, probe=probe), train_head=False)
  body_N, head = M.init_experts(jax.random.key(0), cfg.model, 1)
  state = TS.init_state(body_N, head, 1e-2, 1e-2, cfg.weight_decay, cfg.train_head)
  text = np.frombuffer(b"abcabcabd" * 8, np.uint8)[:33]
  batch = jnp.asarray(np.broadcast_to(text, (1, 1, 2, 33)))
  # A fresh function: jit caches traces per function, and the control test below swaps
  # `spsa.estimate` for a broken one.
  step = jax.jit(lambda state, batch: S.train_step(state, batch, jnp.arange(1), cfg))
  loss = lambda st: float(TS.expert_losses(st.body, st.head, batch[:, 0])[0])
  before = loss(state)
  for _ in range(updates):
    state, _ = step(state, batch)
  np.testing.assert_array_equal(state.head, head)  # frozen: the fall is the body's
  return before, loss(state)


def _fell(before, after) -> bool:
  return after < before - 1.0


@pytest.mark.parametrize("probe", S.PROBES)
def test_training_lowers_loss_on_repetitive_bytes(probe):
  """40 SPSA updates of the body alone (head frozen) take the loss down by over 1 nat."""
  before, after = _fit_periodic_bytes(probe)
  assert _fell(before, after), f"{probe}: {before:.2f} -> {after:.2f} nats/byte"


def test_training_check_rejects_an_ascending_estimator(monkeypatch):
  """The same check fails when the estimate's sign is flipped (ascent instead of descent)."""
  real = S.estimate

  def ascending(*args, **kwargs):
    g, loss = real(*args, **kwargs)
    return jax.tree.map(jnp.negative, g), loss

  monkeypatch.setattr(S, "estimate", ascending)
  before, after = _fit_periodic_bytes("rademacher")
  assert not _fell(before, after), f"{before:.2f} -> {after:.2f}"
  assert after > before


def test_the_cpu_row_rules_chunk_trains_as_the_old_chunk_to_rounding():
  """Issue 53's CPU chunk (about 8 rows per loop iteration: pert_chunk 2 at the studies'
  B = 4 where 4 perturbed copies ran before) is speed only: the same directions and batches,
  so the same SPSA coefficients and, after two updates with the delta-rule heads, the same
  parameters to float32 rounding (coefficients within 1e-4 relative, the chunks' sums only
  grouped differently)."""
  from soma_jax import memory
  from tests.conftest import equal_to_rounding

  assert memory.cpu_chunk(4, 1, signs_together=False, batch=4) == 2
  assert memory.cpu_chunk(4, 1, signs_together=False, batch=2) == 4  # the cpu preset's B
  body_N, head, batch = _setup(n=2, b=4, t=16, a=1)
  args = (body_N, head, batch, jnp.full((2,), 1e-3), 3, jnp.arange(2), jax.random.key(0))
  coefs = [S.coefficients(*args, S.SpsaConfig(n_pert=4, pert_chunk=c, signs_together=False))
           for c in (4, 2)]
  np.testing.assert_allclose(coefs[1], coefs[0], rtol=1e-4, atol=1e-6)
  step = jax.jit(S.train_step, static_argnames="cfg")
  states = []
  for chunk in (4, 2):
    cfg = dataclasses.replace(_step_cfg(), spsa=S.SpsaConfig(n_pert=4, pert_chunk=chunk,
                                                             signs_together=False))
    state = _state(2)
    for _ in range(2):
      state, _ = step(state, batch, jnp.arange(2), cfg=cfg)
    states.append(state)
  equal_to_rounding((states[1].body, states[1].head), (states[0].body, states[0].head))
