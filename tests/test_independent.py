"""Figure 4 (App. J): four experts of a trained SOMA continued with their own Adam moments,
one fixed sample per shard, and the summed loss's difference in float64."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from soma_jax import checkpoint as ckpt_lib
from soma_jax import runs, spsa
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.errors import UserError
from soma_jax.methods import soma as soma_method
from soma_jax.studies import independent, independent_data
from tests.test_compare import load_config


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


def ivs_tiny_config(data_dir: str, num_seeds: int = 1):
  """experiments/configs/independent_vs_summed.py:tiny on a prepared data dir."""
  config = load_config("independent_vs_summed", "tiny")
  config.data_dir = data_dir
  config.num_seeds = num_seeds
  return config


@pytest.fixture(scope="module")
def data_four_shards(tmp_path_factory, data_textdir):
  from soma_jax.data import prepare

  out = str(tmp_path_factory.mktemp("ivs_data") / "dir")
  prepare.prepare(f"textdir:{data_textdir}", 4, out, test_docs=6, ensemble_val_docs=3, min_df=2,
                  svd_dims=16, val_fraction=0.05)
  return out


@pytest.fixture(scope="module")
def tiny_ensemble(tmp_path_factory, data_four_shards):
  """The tiny SOMA recipe trained by the experiment itself: OUT/seed, then N = 4 from it."""
  out = str(tmp_path_factory.mktemp("ivs_ensemble"))
  workdir = independent.ensemble_workdir(independent.check(ivs_tiny_config(data_four_shards)), out)
  assert workdir == os.path.join(out, "ensemble")
  c = ckpt_lib.read_config(workdir)
  assert c.n_experts == 4 and c.init_from == os.path.join(out, "seed") and c.model.shared_head
  return workdir


def _checkpoint(workdir):
  """The newest checkpoint as saved, read straight from the Checkpointer."""
  c = ckpt_lib.read_config(workdir)
  abstract = jax.eval_shape(lambda: runs.initial_state(spec_lib.resolve(c).without_seed()))
  ckpt = ckpt_lib.Checkpointer(workdir)
  try:
    step, state, _ = ckpt.restore_latest(abstract)
  finally:
    ckpt.close()
  return step, state


def _assert_state_is_checkpoint(state, ckpt_state, ids):
  idx = np.asarray(ids)
  for got, want in zip(jax.tree.leaves((state.body, state.opt)),
                       jax.tree.leaves((ckpt_state.body, ckpt_state.opt)), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want)[idx])
  np.testing.assert_array_equal(np.asarray(state.head), np.asarray(ckpt_state.head))


def test_continuation_restores_weights_and_adam_moments(tiny_ensemble):
  """Experts (3, 1, 0, 2), in that order: bodies, mu, nu and Adam's count are the
  checkpoint's, bit for bit; the moments are trained ones (not a fresh Adam); lr, eps fixed."""
  ids = (3, 1, 0, 2)
  step, state, _ = independent.continuation_start(tiny_ensemble, ids, 1e-3, 2e-3)
  ckpt_step, ckpt_state = _checkpoint(tiny_ensemble)
  assert step == ckpt_step > 0
  _assert_state_is_checkpoint(state, ckpt_state, ids)
  adam = next(s for s in jax.tree.leaves(state.opt, is_leaf=lambda x: hasattr(x, "mu"))
              if hasattr(s, "mu"))  # optax's ScaleByAdamState
  assert np.all(np.asarray(adam.count) == ckpt_step)
  assert all(np.any(np.asarray(x) != 0) for x in jax.tree.leaves(adam.nu))
  np.testing.assert_array_equal(np.asarray(state.sched.lr), np.float32(1e-3))
  np.testing.assert_array_equal(np.asarray(state.sched.eps), np.float32(2e-3))
  assert state.head_opt == ()


def test_refuses_a_workdir_with_fewer_than_four_experts(tmp_path, data_prepared):
  c = load_config("soma", "n=3,size=tiny")
  c.data.dir = data_prepared
  c.steps = 1
  workdir = str(tmp_path / "n3")
  train_lib.run(c, workdir)
  config = ivs_tiny_config(data_prepared)
  config.init_from = workdir
  with pytest.raises(UserError, match="has 3 experts"):
    independent.run(independent.check(config), str(tmp_path / "out"))
  for bad in ("0,1,2", "0,1,2,2", "0,1,x,3"):
    with pytest.raises(UserError, match="experts="):
      independent.parse_experts(bad)


def test_fixed_sample_is_shared_by_seeds_and_variants(data_four_shards):
  sample = independent_data.FixedSample(data_four_shards, (2, 0, 1, 3), 8, 32, sample_seed=5)
  again = independent_data.FixedSample(data_four_shards, (2, 0, 1, 3), 8, 32, sample_seed=5)
  np.testing.assert_array_equal(sample.windows_NxSxT1, again.windows_NxSxT1)
  a, b, other = sample.batches(0, 2), again.batches(0, 2), sample.batches(1, 2)
  seen = []
  for _ in range(8):  # two epochs of the 8-window sample at B = 2
    x = next(a)
    np.testing.assert_array_equal(x, next(b))
    seen.append(x)
    assert x.shape == (4, 1, 2, 33)
  first_epoch = np.concatenate(seen[:4], axis=2)[:, 0]  # [N, 8, T + 1]
  for i in range(4):  # each epoch is a permutation of expert i's own sample
    got = sorted(map(bytes, first_epoch[i]))
    assert got == sorted(map(bytes, sample.windows_NxSxT1[i]))
  assert not np.array_equal(np.concatenate([next(other) for _ in range(4)], 2),
                            np.concatenate(seen[:4], 2)), "another seed, another order"


def test_run_continues_the_checkpoint_in_both_arms(tmp_path, tiny_ensemble, data_four_shards,
                                                   monkeypatch):
  """Both arms start from the checkpoint bit for bit (the state the first update receives),
  the summed difference is formed in float64, and the figures are the recorded ones."""
  dtypes, first = [], {}
  group_diff = spsa._group_diff

  def recording(losses, groups):
    out = group_diff(losses, groups)
    if groups is not None:
      dtypes.append(str(out.dtype))
    return out

  monkeypatch.setattr(spsa, "_group_diff", recording)
  variant_of = {name: v for v, name in independent.VARIANT_METHODS.items()}
  train_variant = independent.train_variant

  def recording_variant(start, method, *args):
    def wrapped(state, batch, ids, cfg, _fn=method.train_step, _v=variant_of[method.name]):
      if _v not in first:
        first[_v] = (jax.tree.map(np.array, state), np.asarray(ids))
      return _fn(state, batch, ids, cfg=cfg)
    return train_variant(start, method._replace(train_step=wrapped), *args)

  monkeypatch.setattr(independent, "train_variant", recording_variant)
  soma_method.train_step.clear_cache()  # both variants' jitted step: retrace, so the
  # recorder sees the summed step
  config = ivs_tiny_config(data_four_shards, num_seeds=2)
  config.init_from = tiny_ensemble
  config.experts = "1,2,3,0"
  out = str(tmp_path / "ivs")
  payload = independent.run(independent.check(config), out)
  assert dtypes and set(dtypes) == {"float64"}, dtypes
  _, ckpt_state = _checkpoint(tiny_ensemble)
  for variant in independent.VARIANTS:
    state, ids = first[variant]
    np.testing.assert_array_equal(ids, [1, 2, 3, 0])
    _assert_state_is_checkpoint(state, ckpt_state, (1, 2, 3, 0))
  for name in ("results.json", "curves.csv", "figure4.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f)["summary"] == json.loads(json.dumps(payload["summary"]))
  assert [p["step"] for p in payload["paired"]] == [0, 1, 2, 4]
  s = payload["summary"]
  assert payload["init_step"] > 0 and payload["experts"] == [1, 2, 3, 0]
  for r in payload["runs"].values():
    assert r["independent"][0] == r["summed"][0], "both arms start from the same state"
    assert r["independent"][-1] != r["summed"][-1]
    assert 0 <= r["docs_independent_lower"] <= r["num_docs"] > 0
  last = payload["paired"][-1]
  np.testing.assert_allclose(s["diff_per_seed"], last["per_seed"])
  np.testing.assert_allclose(s["diff_mean"], np.mean(last["per_seed"]), atol=1e-12)
  np.testing.assert_allclose(s["diff_std"], np.std(last["per_seed"], ddof=1), atol=1e-12)
  assert set(payload["variance"]["states"]) == {"start", "seed0/independent", "seed0/summed",
                                                "seed1/independent", "seed1/summed"}
  for v in payload["variance"]["states"].values():
    assert v["probe"] == "sparse" and v["ratio_separate_vs_shared"] > 0
    assert v["replay"]["data"]["shard_of_expert"] == [1, 2, 3, 0]


def test_seed_result_counts_the_documents_where_independent_is_lower():
  """Per document, the mean of summed minus independent over its windows: doc 7 (+0.5, -0.1)
  and doc 3 (+0.1, +0.1) favour independent losses, doc 9 (-0.5) the summed one."""
  final = {"independent": np.array([1.0, 1.0, 2.0, 2.0, 3.0]),
           "summed": np.array([1.5, 0.9, 2.1, 2.1, 2.5])}
  r = independent._seed_result({}, final, np.array([7, 7, 3, 3, 9]), 200, 0)
  assert (r["docs_independent_lower"], r["num_docs"]) == (2, 3)
  assert r["final_diff"] == pytest.approx(0.02)
  assert r["final_diff_ci95"][0] <= r["final_diff"] <= r["final_diff_ci95"][1]
