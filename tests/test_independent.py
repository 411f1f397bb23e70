"""Figure 4's setup: a trained seed as the start, and the summed loss's difference in float64."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import runs, spsa
from soma_jax.methods import lstm
from soma_jax.studies import independent
from tests.test_compare import ivs_tiny_config


def test_summed_difference_is_not_rounded_away_by_the_float32_sum():
  """Expert 0's loss is ~1 and moves by ~1e-5; experts 1..3 sit at 1000 and do not move.

  The float32 sum of the four losses (~3001, ulp 2.4e-4) rounds expert 0's change away, so a
  difference of summed float32 losses gives a zero or wrong estimate; the shared-loss
  estimate must equal (1/K) sum_j (a . z_j) z_j, expert 0's own SPSA estimate.
  """
  n, d, k, eps = 4, 8, 8, 1e-3
  a = jnp.linspace(-0.02, 0.03, d, dtype=jnp.float32)

  def loss_fn(body, head, batch_BxT1):
    return jnp.where(batch_BxT1[0, 0] > 0, jnp.float32(1000.0), 1.0 + a @ body["w"])

  body_N = {"w": jnp.zeros((n, d), jnp.float32)}
  batch = np.ones((n, 1, 1, 2), np.uint8)
  batch[0] = 0
  key, cfg = jax.random.key(3), spsa.SpsaConfig(n_pert=k, probe="rademacher", pert_chunk=4)
  g_N, _ = spsa.estimate(body_N, jnp.zeros((1,)), jnp.asarray(batch), jnp.full((n,), eps),
                         jnp.int32(0), jnp.arange(n), key, cfg, loss_fn=loss_fn,
                         loss_groups=(0,) * n)
  z_KxD = np.stack([np.asarray(spsa.probe(spsa.probe_key(key, 0, 0, 0, j), {"w": body_N["w"][0]},
                                          "rademacher")["w"]) for j in range(k)])
  want = (z_KxD @ np.asarray(a, np.float64)) @ z_KxD / k
  np.testing.assert_allclose(np.asarray(g_N["w"][0]), want, rtol=2e-2, atol=1e-4)


def test_group_difference_sums_in_float64_under_x64():
  """Differences 1 and 2^-30 sum to 1 in float32; the group difference keeps 1 + 2^-30."""
  losses_NxCx2 = np.array([[[3.0, 2.0]], [[2.0**-20 + 2.0**-30, 2.0**-20]]], np.float32)
  with jax.enable_x64(True):
    diff_NxC = spsa._group_diff(jnp.asarray(losses_NxCx2), (0, 0))
    assert diff_NxC.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(diff_NxC), [[1.0 + 2.0**-30], [1.0 + 2.0**-30]])
  own = spsa._group_diff(jnp.asarray(losses_NxCx2), None)
  np.testing.assert_array_equal(np.asarray(own), [[1.0], [2.0**-30]])


def test_run_trains_the_seed_first_and_starts_both_variants_there(tmp_path, data_prepared,
                                                                  monkeypatch):
  """The tiny run trains OUT/seed, starts every expert from its body and E, and forms the
  summed difference in float64; a second run reuses that seed via train.init_from."""
  dtypes = []
  group_diff = spsa._group_diff

  def recording(losses, groups):
    out = group_diff(losses, groups)
    if groups is not None:
      dtypes.append(str(out.dtype))
    return out

  monkeypatch.setattr(spsa, "_group_diff", recording)
  independent._STEPS["summed"].clear_cache()  # retrace, so the recorder sees the step
  config = ivs_tiny_config(data_prepared, num_seeds=1)
  out = str(tmp_path / "ivs")
  payload = independent.run(config, out)
  seed_dir = os.path.join(out, "seed")
  assert payload["init_from"] == os.path.join("OUT", "seed")
  assert payload["seed_run"]["steps"] == config.seed_run.steps
  assert payload["seed_run"]["lr"] == payload["seed_run"]["eps"] == 0.0025
  assert payload["lr"] == payload["eps"] == 1e-3
  assert payload["summary"]["num_seeds"] == 1 and payload["summary"]["updates"] == config.train.steps
  assert dtypes and set(dtypes) == {"float64"}, dtypes

  c = config.train
  body, head = lstm.seed_expert(runs.restore_params(seed_dir), lstm.model_config(c))
  body_N = jax.tree.map(lambda x: jnp.broadcast_to(x, (c.n_experts,) + x.shape), body)
  test = eval_lib.TestSet(data_prepared, config.test_windows)
  start = float(test.losses(body_N, head, c.n_experts, True).mean())
  for variant in independent.VARIANTS:
    np.testing.assert_allclose(payload["runs"]["0"][variant][0]["test_nats_per_byte"], start,
                               rtol=1e-6, err_msg=f"{variant} must start from the seed")

  config.train.init_from = seed_dir
  config.train.steps = 1
  again = independent.run(config, str(tmp_path / "reuse"))
  assert not os.path.exists(tmp_path / "reuse" / "seed")
  assert again["runs"]["0"]["summed"][0] == payload["runs"]["0"]["summed"][0]
