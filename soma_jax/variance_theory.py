"""What SPEC 5 predicts for the SPSA gradient error, as closed forms the studies draw dashed.

Relative errors are E||g_hat - g||^2 / ||g||^2 (centred: around the estimator's mean q * g).
`soma_jax.variance_measure` measures them; `soma_jax.studies.variance` sets the two side by side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def dense_prediction(d: int, n_pert: int) -> float:
  """E||g_hat - g||^2 / ||g||^2 = (d - 1) / n_pert for dense Rademacher probes."""
  return (d - 1) / n_pert


def sparse_prediction(g_NxD: np.ndarray, q_NxD: np.ndarray, n_pert: int) -> float:
  """R_g = sum_{e,j} q (1 + s_e - 2 q) g^2 / (n_pert sum_e ||g_e||^2), s_e = sum_j q_ej."""
  g2, q = np.asarray(g_NxD, np.float64) ** 2, np.asarray(q_NxD, np.float64)
  s_N1 = q.sum(axis=1, keepdims=True)
  return float(np.sum(q * (1 + s_N1 - 2 * q) * g2) / (n_pert * np.sum(g2)))


def shared_prediction(d_N: Sequence[int], norm_sq_N: Sequence[float],
                      loss_groups: Sequence[int], n_pert: int) -> float:
  """Dense probes, one loss per group: sum_G (M_G - 1) ||g_G||^2 / (n_pert sum_e ||g_e||^2).

  With N equal experts in one group this is (M - 1) / n_pert; separate losses give
  (M/N - 1) / n_pert; their ratio (M/N - 1) / (M - 1) tends to 1/N.
  """
  d, g2, ids = np.asarray(d_N), np.asarray(norm_sq_N, np.float64), np.asarray(loss_groups)
  total = sum((d[ids == k].sum() - 1) * g2[ids == k].sum() for k in np.unique(ids))
  return float(total / (n_pert * g2.sum()))


def grouped_sparse_prediction(g_NxD: np.ndarray, q_NxD: np.ndarray,
                              loss_groups: Sequence[int], n_pert: int) -> float:
  """Any probe, one loss per group: each group is SPSA on its experts' joined parameters,
  so `sparse_prediction` holds per group with s_G = sum of q over the group:
  sum_G sum_{e in G, j} q (1 + s_G - 2 q) g^2 / (n_pert sum_e ||g_e||^2).
  Dense probes (q = 1) give `shared_prediction`."""
  g2, q = np.asarray(g_NxD, np.float64) ** 2, np.asarray(q_NxD, np.float64)
  ids = np.asarray(loss_groups)
  total = 0.0
  for k in np.unique(ids):
    qg, g2g = q[ids == k], g2[ids == k]
    total += float(np.sum(qg * (1 + qg.sum() - 2 * qg) * g2g))
  return total / (n_pert * float(g2.sum()))


def batch_error(g_NxD: np.ndarray, var_NxD: np.ndarray, q_NxD: np.ndarray, n_pert: int,
                batch: int) -> float:
  """E||g_hat - q g_b||^2 + E||q g_b - q g||^2 summed over experts, any probe, one batch of B
  windows drawn from a pool with mean gradient g and per-coordinate variance var:
  sum q (1 + s_e - 2 q) (g^2 + var/B) / n_pert + sum q^2 var / B. Dense probes (q = 1) give
  ||g||^2 batch_prediction(d - 1, nu, n_pert, B)."""
  g2, var, q = (np.asarray(x, np.float64) for x in (np.square(g_NxD), var_NxD, q_NxD))
  s_N1 = q.sum(axis=1, keepdims=True)
  return float(np.sum(q * (1 + s_N1 - 2 * q) * (g2 + var / batch)) / n_pert
               + np.sum(q**2 * var) / batch)


def batch_noise(sigma2_N: np.ndarray, norm_sq_N: np.ndarray) -> float:
  """nu = sigma^2 / ||g||^2, pooled over experts."""
  return float(np.sum(sigma2_N) / np.sum(norm_sq_N))


def batch_prediction(a: float, nu: float, n_pert: int, batch: int, accum: int = 1) -> float:
  """v_acc = a/(n_pert A) + nu/(b A) + a nu/(n_pert b A); A = 1 is v for one batch."""
  return (a / n_pert + nu / batch + a * nu / (n_pert * batch)) / accum


def best_batch(budget: int, nu: float, a: float) -> float:
  """B* = min(K, max(1, sqrt(K nu / a))) at fixed K = n_pert * B."""
  return min(budget, max(1.0, math.sqrt(budget * nu / a)))
