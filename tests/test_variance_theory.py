"""The variance formulas of SPEC 5 against Monte Carlo on linear losses (numpy, seconds).

For a linear loss the central difference is exactly z . g, so an SPSA estimate is
(1/K) sum_j z_j (z_j . g) and its error can be sampled directly. Each prediction of
`soma_jax.variance_measure` must lie within 3 standard errors of the sampled mean, and each check
is shown to reject a plausible wrong formula.
"""

import numpy as np

from soma_jax import variance_theory as VT

REPS = 20000


def _within(samples: np.ndarray, predicted: float, z: float = 3.0) -> bool:
  """|mean - predicted| <= z standard errors of the mean."""
  se = samples.std(ddof=1) / np.sqrt(len(samples))
  return abs(samples.mean() - predicted) <= z * se


def _probes(rng, reps: int, k: int, dense_mask_D: np.ndarray, sparse: bool) -> np.ndarray:
  """[reps, K, D] probes: +-1 where dense, else 0 w.p. 1/2 and +-1 w.p. 1/4 each if sparse."""
  z = rng.choice([-1.0, 1.0], (reps, k, dense_mask_D.size))
  if sparse:
    z *= dense_mask_D | (rng.random(z.shape) < 0.5)
  return z


def _estimates(g_D: np.ndarray, z_RxKxD: np.ndarray) -> np.ndarray:
  return np.einsum("rkd,rk->rd", z_RxKxD, z_RxKxD @ g_D) / z_RxKxD.shape[1]


def test_dense_prediction():
  rng = np.random.default_rng(1)
  g = rng.normal(size=12)
  for k in (1, 4):
    err = np.sum((_estimates(g, _probes(rng, REPS, k, np.ones(12, bool), False)) - g) ** 2, -1)
    rel = err / np.sum(g**2)
    assert _within(rel, VT.dense_prediction(12, k)), (k, rel.mean())
    assert not _within(rel, 12 / k)  # d / n_pert (no -1) is rejected


def test_sparse_prediction_centred_on_q_g():
  """Sparse probes with dense gain coordinates: R_g of SPEC 5, centred on E g_hat = q g."""
  rng = np.random.default_rng(2)
  d, k = 12, 2
  dense = np.zeros(d, bool)
  dense[:3] = True  # three "gain" coordinates
  q = np.where(dense, 1.0, 0.5)
  g = rng.normal(size=d) * np.linspace(0.5, 2, d)
  z = _probes(rng, REPS, k, dense, True)
  rel = np.sum((_estimates(g, z) - q * g) ** 2, -1) / np.sum(g**2)
  assert _within(rel, VT.sparse_prediction(g[None], q[None], k)), rel.mean()
  wrong = float(np.sum(q * (1 + q.sum() - q) * g**2) / (k * np.sum(g**2)))  # -q, not -2q
  assert not _within(rel, wrong)


def test_shared_prediction_for_groupings():
  """Four experts of d coordinates each; estimates from each group's summed loss."""
  rng = np.random.default_rng(3)
  n, d, k = 4, 6, 2
  g_NxD = rng.normal(size=(n, d)) * np.array([[1.0], [0.5], [2.0], [1.0]])
  for groups in ((0, 1, 2, 3), (0, 0, 1, 1), (0, 0, 0, 0)):
    ids = np.asarray(groups)
    z = rng.choice([-1.0, 1.0], (REPS, n, k, d))
    diff_RxNxK = np.einsum("rnkd,nd->rnk", z, g_NxD)
    summed = np.stack([diff_RxNxK[:, ids == ids[e]].sum(1) for e in range(n)], 1)
    g_hat = np.einsum("rnkd,rnk->rnd", z, summed) / k
    rel = np.sum((g_hat - g_NxD) ** 2, (1, 2)) / np.sum(g_NxD**2)
    g2 = np.sum(g_NxD**2, 1)
    assert _within(rel, VT.shared_prediction([d] * n, g2, groups, k)), (groups, rel.mean())
    if len(set(groups)) < n:
      assert not _within(rel, VT.shared_prediction([d] * n, g2, range(n), k))


def test_batch_prediction_and_best_batch():
  """Batches of B sequences (with replacement) from a pool, A accumulated, dense probes."""
  rng = np.random.default_rng(4)
  d, pool = 8, 40
  g_PxD = rng.normal(size=(pool, d)) * 0.8 + rng.normal(size=d)
  g = g_PxD.mean(0)
  nu = VT.batch_noise(np.array([np.mean(np.sum((g_PxD - g) ** 2, 1))]), np.array([g @ g]))
  for k, b, acc in ((2, 1, 1), (2, 4, 1), (4, 2, 2)):
    total = np.zeros((REPS, d))
    for _ in range(acc):
      g_b = g_PxD[rng.integers(0, pool, (REPS, b))].mean(1)  # [R, D]
      z = _probes(rng, REPS, k, np.ones(d, bool), False)
      total += np.einsum("rkd,rk->rd", z, np.einsum("rkd,rd->rk", z, g_b)) / k
    rel = np.sum((total / acc - g) ** 2, -1) / (g @ g)
    assert _within(rel, VT.batch_prediction(d - 1, nu, k, b, acc)), (k, b, acc, rel.mean())
    assert not _within(rel, ((d - 1) / k + nu / b) / acc)  # without the a nu / (K B) term
  # B* minimises the prediction at fixed K = n_pert * B.
  budget, a = 64, d - 1.0
  for nu in (0.3, 5.0, 40.0):
    grid = np.linspace(1, budget, 4000)
    best = grid[np.argmin([VT.batch_prediction(a, nu, budget / b, b) for b in grid])]
    assert abs(VT.best_batch(budget, nu, a) - best) <= 0.02 * best + 0.05, (nu, best)
