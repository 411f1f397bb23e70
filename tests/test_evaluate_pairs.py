"""`evaluate --pairs`: shared difficulty is the mean loss of ALL experts (paper N.3)."""

import numpy as np
import pytest

from soma_jax import evaluate as ev
from tests.test_evaluate import disagreeing_experts, target_probs

N = 4


@pytest.fixture(scope="module")
def experts():
  return disagreeing_experts(N, 12)


def _target_losses(body_N, head, windows):
  """[N, n, 768] every expert's cross entropy at every scored target, straight from the model."""
  return -np.log(np.stack([target_probs(body_N, head, False, e, windows) for e in range(N)]))


def _residual(y, x):
  """y minus its least-squares fit on [1, x]."""
  design = np.stack([np.ones_like(x), x], axis=1)
  return y - design @ np.linalg.lstsq(design, y, rcond=None)[0]


@pytest.mark.parametrize("k", [2, 3])
def test_pair_correlation_removes_the_all_expert_mean_loss(experts, k):
  """Partial correlation of l_a, l_b given d = mean over all N experts, by regression."""
  body_N, head, windows, routes = experts
  sc = ev.score(body_N, head, windows, routes[:, :k], False, pairs=True)
  loss_Nxnx768 = _target_losses(body_N, head, windows)
  d_nx768 = loss_Nxnx768.mean(axis=0)
  rows = sc.pairs.rows()
  assert rows
  for row in rows:
    a, b = row["expert_a"], row["expert_b"]
    sel = [i for i in range(len(windows)) if {a, b} <= set(routes[i, :k].tolist())]
    assert row["num_windows"] == len(sel)
    la, lb, d = (x[sel].reshape(-1) for x in (loss_Nxnx768[a], loss_Nxnx768[b], d_nx768))
    ra, rb = _residual(la, d), _residual(lb, d)
    want = ra @ rb / np.sqrt((ra @ ra) * (rb @ rb))
    np.testing.assert_allclose(row["error_correlation"], want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(row["loss_a"], la.mean(), rtol=1e-5)
