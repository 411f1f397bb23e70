"""The descent ratio rho and the effective rank r (soma_jax.descent, SPEC 9.7) on quadratics
with known gradient g and Hessian H, where both have closed forms.

For L(theta) = g.x + x.H.x / 2 (x = theta - theta_0) the central difference is exactly g.z,
so g_hat = (1/n) sum_j (g.z_j) z_j. With independent probe coordinates of E z_i^2 = q_i and
E z_i^4 = m_i (Q = diag q):
  E g.g_hat = g.Q.g,
  E g_hat.H.g_hat = (1 - 1/n) (Qg).H.(Qg) + [g.Q.g tr(QH) + 2 (Qg).H.(Qg)
                    + sum_i g_i^2 H_ii (m_i - 3 q_i^2)] / n,
and rho = (E g.g_hat)^2 g.H.g / (E[g_hat.H.g_hat] ||g||^4): `exact_rho`, an independent
numpy version. Every check is a z-test at 3 of the measurement's own jackknife standard
errors (no hand-set tolerance).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from soma_jax import descent, spsa

Z = 3.0


def _params(d_gain: int, d_w: int, dtype=jnp.float64) -> dict:
  """A body-like tree: LayerNorm gains (dense under sparse probes) and one matrix."""
  return {"ln": {"scale": jnp.zeros((d_gain,), dtype)}, "w": jnp.zeros((d_w // 8, 8), dtype)}


def _flat(tree) -> jnp.ndarray:
  return jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(tree)])


def _quadratic(g: np.ndarray, h: np.ndarray):
  """The loss (body, head, batch) -> g.x + x.H.x / 2 at x = flat(body) (head, batch unused)."""
  g, h = jnp.asarray(g), jnp.asarray(h)

  def loss(body, head, batch):
    del head, batch
    x = _flat(body)
    return g @ x + 0.5 * x @ (h @ x)

  return loss


def _moments(params: dict, kind: str) -> tuple[np.ndarray, np.ndarray]:
  """(q, m) = (E z^2, E z^4) per coordinate under probe `kind`, in flat order."""
  q = np.asarray(_flat(spsa.probe_second_moment(params, kind)))
  return q, {"gaussian": 3.0 * q, "rademacher": q, "sparse": q}[kind]


def exact_rho(g: np.ndarray, h: np.ndarray, n: int, q: np.ndarray, m: np.ndarray) -> float:
  qg = q * g
  fourth = (g @ (q * g)) * np.sum(q * np.diag(h)) + 2 * qg @ h @ qg + np.sum(
      g**2 * np.diag(h) * (m - 3 * q**2))
  e_hhh = (1 - 1 / n) * qg @ h @ qg + fourth / n
  return float((g @ qg) ** 2 * (g @ h @ g) / (e_hhh * (g @ g) ** 2))


def effective_rank(g: np.ndarray, h: np.ndarray) -> float:
  return float(np.trace(h) * (g @ g) / (g @ h @ g))


def _anisotropic(d: int, seed: int = 0, power: float = 0.7) -> tuple[np.ndarray, np.ndarray]:
  """H = U diag(h) U^T with h_i = 1/i (condition number d), U random orthogonal, and g with
  g_i^2 = h_i^power in H's eigenbasis: r = sum h sum h^power / sum h^(1 + power), far below d."""
  rng = np.random.default_rng(seed)
  u, _ = np.linalg.qr(rng.normal(size=(d, d)))
  lam = 1.0 / np.arange(1, d + 1)
  h = (u * lam) @ u.T
  g = u @ (lam ** (power / 2) * rng.choice([-1.0, 1.0], d))
  return g, h


def _measure(g, h, params, n, kind, repeats, hutchinson, rho_by="line_search", seed=0):
  loss = _quadratic(g, h)
  cfg = spsa.SpsaConfig(n_pert=n, probe=kind, pert_chunk=n)
  batch = jnp.zeros((1, 1, 2), jnp.uint8)  # unused by the quadratic
  return descent.measure(loss, params, jnp.zeros(()), [batch], 1e-3, cfg, jax.random.key(seed),
                         repeats=repeats, hutchinson=hutchinson, rho_by=rho_by, loss_fn=loss)


def _within(measured: float, se: float, expected: float) -> bool:
  return abs(measured - expected) <= Z * se


def test_isotropic_quadratic_rho_is_n_over_d_plus_n():
  """H = 2 I: r = d exactly (every Hutchinson sample is tr H for Rademacher v), and rho
  matches both the exact finite-n value and n / (d + n) within 3 jackknife SEs."""
  with jax.enable_x64(True):
    params, n = _params(8, 392), 4
    d = 400
    g = np.random.default_rng(1).normal(size=d)
    h = 2.0 * np.eye(d)
    out = _measure(g, h, params, n, "rademacher", repeats=1500, hutchinson=4)
    exact = exact_rho(g, h, n, *_moments(params, "rademacher"))
  assert abs(out["r"] - d) <= 1e-9 * d, out["r"]
  assert _within(out["rho"], out["rho_se"], exact), (out["rho"], out["rho_se"], exact)
  assert _within(out["rho"], out["rho_se"], n / (d + n)), (out["rho"], out["rho_se"], n / (d + n))
  assert out["rho_se"] < 0.05 * out["rho"], "too few repeats for the test to mean anything"


@pytest.mark.parametrize("kind", ["rademacher", "sparse"])
def test_anisotropic_quadratic_rho_and_rank(kind):
  """r = tr(H) ||g||^2 / g.H.g is about 68 at d = 600: rho follows n / (r + n), 8 times the
  isotropic n / (d + n) that cos^2(g_hat, g) would give. Hutchinson's r and the line
  search's rho each match their closed form within 3 of their own standard errors (the
  exact rho is within 1.1% of n / (r + n) here, below that error)."""
  with jax.enable_x64(True):
    params, n, d = _params(16, 584), 4, 600
    g, h = _anisotropic(d)
    out = _measure(g, h, params, n, kind, repeats=3000, hutchinson=256)
    exact = exact_rho(g, h, n, *_moments(params, kind))
  r = effective_rank(g, h)
  assert 60 < r < 80, r
  assert _within(out["r"], out["r_se"], r), (out["r"], out["r_se"], r)
  assert _within(out["rho"], out["rho_se"], exact), (out["rho"], out["rho_se"], exact)
  assert _within(out["rho"], out["rho_se"], n / (r + n)), (out["rho"], out["rho_se"], n / (r + n))
  assert out["rho"] > 5 * n / (d + n)
  assert out["rho_se"] < 0.05 * out["rho"], "too few repeats for the test to mean anything"


def test_line_search_equals_the_hessian_formula_on_a_quadratic():
  """Same probes, two measurements: the forward-only line search's best mean decrease is
  the quadratic model's (E g.g_hat)^2 / (2 E g_hat.H.g_hat) to float64 rounding."""
  with jax.enable_x64(True):
    params = _params(16, 384)
    g, h = _anisotropic(400, seed=3)
    a = _measure(g, h, params, 8, "sparse", repeats=64, hutchinson=2)
    b = _measure(g, h, params, 8, "sparse", repeats=64, hutchinson=2, rho_by="hvp")
  for x, y in zip(a["per_batch"], b["per_batch"]):
    np.testing.assert_allclose(x["decrease_g"], y["decrease_g"], rtol=1e-9)
    np.testing.assert_allclose(x["decrease_ghat"], y["decrease_ghat"], rtol=1e-9)
  np.testing.assert_allclose(a["rho"], b["rho"], rtol=1e-9)


def test_estimates_are_trainings_own():
  """Repeat k of `spsa_estimates` is bit for bit `spsa.estimate` at update step k."""
  with jax.enable_x64(True):
    params = _params(16, 384)
    g, h = _anisotropic(400)
    loss = _quadratic(g, h)
    cfg = spsa.SpsaConfig(n_pert=4, probe="sparse", pert_chunk=2)
    batch = jnp.zeros((1, 1, 2), jnp.uint8)
    key = jax.random.key(7)
    ghat = descent.spsa_estimates(params, jnp.zeros(()), batch, jnp.asarray(1e-3), key,
                                  jnp.asarray(1), cfg, 3, loss)
    one = jax.tree.map(lambda x: x[None], params)
    ref, _ = spsa.estimate(one, jnp.zeros(()), batch[None], jnp.array([1e-3]), 2,
                           jnp.array([1]), key, cfg, loss_fn=loss)
  for x, y in zip(jax.tree.leaves(ghat), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(x[2], y[0])


def test_several_batches_pool_their_decreases():
  """Over batches, rho is the ratio of the summed best decreases and r of the summed
  tr(H) ||g||^2 and g.H.g; the jackknife is then over batches."""
  fake = lambda dg, dh, tr, g_sq, ghg: descent.BatchDescent(
      dg, dh, np.array([dh, dh]), 1.0, 1.0,
      descent.Curvature(g_sq, ghg, np.zeros(0), np.zeros(0), np.array([tr])))
  per = [fake(1.0, 0.2, 10.0, 1.0, 2.0), fake(3.0, 0.3, 4.0, 2.0, 1.0)]
  out = descent.summarise(per, n=4, params=100, rho_by="line_search")
  assert out["rho"] == pytest.approx(0.5 / 4.0)
  assert out["r"] == pytest.approx((10.0 * 1.0 + 4.0 * 2.0) / 3.0)
  # leave-one-out: 0.3 / 3 and 0.2 / 1; jackknife sqrt((u-1)/u sum (x - mean)^2)
  loo = np.array([0.1, 0.2])
  assert out["rho_se"] == pytest.approx(np.sqrt(0.5 * np.sum((loo - loo.mean()) ** 2)))


def test_one_batch_errors_are_over_repeats_and_hutchinson_vectors():
  """With one batch, r's error is the Hutchinson mean's standard error scaled by
  ||g||^2 / g.H.g (the jackknife of a mean is s / sqrt(M)), and rho's is the jackknife over
  the repeats' leave-one-out decreases."""
  v = np.array([3.0, 5.0, 4.0, 8.0])
  loo = np.array([0.30, 0.26, 0.28, 0.20])
  one = descent.BatchDescent(2.0, 0.25, loo, 1.0, 1.0,
                             descent.Curvature(3.0, 1.5, np.zeros(0), np.zeros(0), v))
  out = descent.summarise([one], n=4, params=100, rho_by="line_search")
  assert out["r"] == pytest.approx(v.mean() * 3.0 / 1.5)
  assert out["r_se"] == pytest.approx(v.std(ddof=1) / np.sqrt(v.size) * 3.0 / 1.5)
  assert out["rho"] == pytest.approx(0.125)
  x = loo / 2.0
  assert out["rho_se"] == pytest.approx(np.sqrt(3 / 4 * np.sum((x - x.mean()) ** 2)))
