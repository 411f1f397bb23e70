"""1.5-SPSA (method=soma15, docs/spsa15.md): the curvature-scaled estimate against an
independent float64 transcription, its reduction to SPSA, its cost, its isolation across
experts, and its config checks. Its resume is test_train's kill -9 test, parametrised."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64
from jax.experimental import io_callback

from soma_jax import model as M
from soma_jax import spec as spec_lib
from soma_jax import spsa as S
from soma_jax import train
from soma_jax import train_state as TS
from soma_jax.config import base_config
from tests import committed
from tests.conftest import default_env, equal_to_rounding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = M.ModelConfig(d_t=4, d_e=4, depth=2)


# --------------------------------------------------------------- the formula, in numpy


@jax.jit
def _three_losses(body, z, head, window_BxT1, eps):
  """[L(theta + eps z), L(theta - eps z), L(theta)] with the plain `model.loss`."""
  moved = lambda s: jax.tree.map(lambda p, d: p + s * eps * d, body, z)
  return jnp.stack([M.loss(moved(1.0), head, window_BxT1), M.loss(moved(-1.0), head, window_BxT1),
                    M.loss(body, head, window_BxT1)])


def _oracle_inputs(body_N, head, batch_NxAxBxT1, eps_N, step, ids, key, n_pert):
  """losses [N, A, K, 3] (L+, L-, L0) and directions z [N, A, K, D], each drawn from its key
  (SPEC 3.1), one forward at a time."""
  n, a_count = batch_NxAxBxT1.shape[:2]
  draw = jax.jit(S.probe, static_argnums=2)
  losses, z_flat = [], []
  for e in range(n):
    body = jax.tree.map(lambda x, e=e: x[e], body_N)
    for a in range(a_count):
      for j in range(n_pert):
        z = draw(S.probe_key(key, step, int(ids[e]), a, j), body, "sparse")
        losses.append(np.asarray(_three_losses(body, z, head, batch_NxAxBxT1[e, a], eps_N[e])))
        z_flat.append(np.concatenate([np.ravel(x) for x in jax.tree.leaves(z)]))
  return (np.reshape(losses, (n, a_count, n_pert, 3)),
          np.reshape(z_flat, (n, a_count, n_pert, -1)))


def _raw_curvature(losses, eps_N, planted=""):
  """[N, A, K] |L+ - 2 L0 + L-| / eps^2 of each expert's own eps (or a planted bug)."""
  plus, minus, clean = losses[..., 0], losses[..., 1], losses[..., 2]
  eps = np.asarray(eps_N, np.float64)[:, None, None]
  if planted == "no clean forward":
    return np.abs(plus + minus) / eps**2
  if planted == "wrong sign":
    return np.abs(plus - 2 * clean - minus) / eps**2
  if planted == "eps not squared":
    return np.abs(plus - 2 * clean + minus) / eps
  if planted == "expert 0's clean loss":
    return np.abs(plus - 2 * clean[:1] + minus) / eps**2
  return np.abs(plus - 2 * clean + minus) / eps**2


def _hand_estimate(losses, z, eps_N, alpha, lam, planted=""):
  """g_e = 1/(A K) sum_a sum_j (L+ - L-) / (2 eps curv_j) z_j, curv_j = max(raw^alpha, lam)."""
  curv = np.maximum(_raw_curvature(losses, eps_N, planted) ** alpha, lam)
  if planted == "one curvature per expert":
    curv = np.broadcast_to(curv.mean(axis=(1, 2), keepdims=True), curv.shape)
  if planted == "plain SPSA":
    curv = np.ones_like(curv)
  eps = np.asarray(eps_N, np.float64)[:, None, None]
  coef = (losses[..., 0] - losses[..., 1]) / (2 * eps * curv)
  a_count, k = losses.shape[1:3]
  return np.einsum("naj,najd->nd", coef, z) / (a_count * k)


def _flat(tree):
  return np.concatenate([np.asarray(x).reshape(x.shape[0], -1) for x in jax.tree.leaves(tree)],
                        axis=1)


def _same(g_NxD, hand_NxD) -> bool:
  """Every coordinate of every expert agrees to float64 rounding."""
  return np.allclose(g_NxD, hand_NxD, rtol=1e-7, atol=1e-9)


PLANTED = ("no clean forward", "wrong sign", "eps not squared", "expert 0's clean loss",
           "one curvature per expert", "plain SPSA")


def test_estimate_equals_the_formula_written_out():
  """spsa.estimate with a Curvature is the 1.5-SPSA formula per expert, per accumulation batch
  (each its own L0) and per direction, in float64, whether the K = 4 directions run in one
  chunk with the signs apart or in two chunks (the clean row rides in the first only).

  Global ids (5, 2, 7), each expert its own eps, and lambda at the median of raw^alpha, so
  some directions are floored and some are not. Each planted bug (no clean forward, the sign
  of L- flipped, eps not squared, every expert reading expert 0's L0, one curvature per expert
  instead of per direction, no scaling at all) is rejected by the same comparison.
  """
  alpha, k = 0.3, 4
  with enable_x64():
    body_N, head = M.init_experts(jax.random.key(0), TINY, 3)
    body_N = jax.tree.map(lambda x: x.astype(jnp.float64), body_N)
    head = head.astype(jnp.float64)
    batch = jax.random.randint(jax.random.key(1), (3, 2, 2, 9), 0, 256).astype(jnp.uint8)
    ids, eps_N = jnp.array([5, 2, 7]), jnp.array([1e-3, 2e-3, 5e-4])
    key, step = jax.random.key(4), 3
    losses, z = _oracle_inputs(body_N, head, batch, eps_N, step, ids, key, k)
    lam = float(np.median(_raw_curvature(losses, eps_N) ** alpha))
    floored = _raw_curvature(losses, eps_N) ** alpha < lam
    assert floored.any() and (~floored).any()
    hand = _hand_estimate(losses, z, eps_N, alpha, lam)
    for chunk, together in ((4, False), (2, True)):
      cfg = S.SpsaConfig(n_pert=k, accum=2, pert_chunk=chunk, signs_together=together,
                         curvature=S.Curvature(alpha, lam))
      g_N, loss_N = S.estimate(body_N, head, batch, eps_N, step, ids, key, cfg)
      g_NxD = _flat(g_N)
      assert _same(g_NxD, hand), f"chunk {chunk}: estimate != the 1.5-SPSA formula"
      np.testing.assert_allclose(loss_N, losses[..., :2].mean(axis=(1, 2, 3)), rtol=1e-10)
    for planted in PLANTED:
      assert not _same(g_NxD, _hand_estimate(losses, z, eps_N, alpha, lam, planted)), planted


def test_curvature_is_checked():
  for alpha, lam in ((-0.1, 1.0), (float("nan"), 1.0), (0.1, 0.0), (0.1, float("inf"))):
    with pytest.raises(ValueError, match="curvature"):
      S.Curvature(alpha, lam)


# ------------------------------------------------------------ alpha = 0, lambda = 1


def _step_cfg(curvature=None, chunk=2, together=True):
  return S.StepConfig(model=dataclasses.replace(TINY, shared_head=False),
                      spsa=S.SpsaConfig(n_pert=4, accum=2, pert_chunk=chunk,
                                        signs_together=together, curvature=curvature),
                      train_head=True)


def _three_steps(cfg, n=3):
  body_N, head_N = M.init_experts(jax.random.key(0), cfg.model, n)
  state = TS.init_state(body_N, head_N, 1e-3, 1e-3, train_head=True)
  step = jax.jit(S.train_step, static_argnames="cfg")
  losses = []
  for s in range(3):
    batch = jax.random.randint(jax.random.key(s), (n, 2, 2, 9), 0, 256).astype(jnp.uint8)
    state, metrics = step(state, batch, jnp.arange(n), cfg=cfg)
    losses.append(np.asarray(metrics["loss"]))
  return jax.tree.leaves((state.body, state.head, state.opt)), losses


@pytest.mark.parametrize("chunk,together", [(2, True), (4, False)])
def test_alpha_0_lambda_1_is_spsa(chunk, together):
  """curv = max(x ** 0, 1) = 1: three updates of every expert are SOMA's. With the signs
  together the clean row joins the signed rows of one vmapped pass and the states and losses
  are SOMA's bit for bit (on the CPU); with them apart the first chunk's 2 C + 1 rows run
  together where SOMA runs C, then C: equal to float32 rounding. alpha = 0.1 moves them (checked
  in one layout: the step hands its config to `estimate` alike in both, and
  test_estimate_equals_the_formula_written_out checks the curvature in both layouts)."""
  spsa_leaves, spsa_losses = _three_steps(_step_cfg(None, chunk, together))
  same_leaves, same_losses = _three_steps(_step_cfg(S.Curvature(0.0, 1.0), chunk, together))
  if together and jax.default_backend() == "cpu":
    for x, y in zip(spsa_leaves, same_leaves, strict=True):
      np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(spsa_losses, same_losses)
  else:
    equal_to_rounding(same_leaves, spsa_leaves)
    np.testing.assert_allclose(same_losses, spsa_losses, rtol=1e-6)
  if together:
    scaled_leaves, _ = _three_steps(_step_cfg(S.Curvature(0.1, 1.0), chunk, together))
    assert any(not np.array_equal(x, y) for x, y in zip(spsa_leaves, scaled_leaves))


def test_the_method_is_soma_with_the_curvature_field():
  """method=soma15 differs from soma in its step config's curvature (from config.spsa15),
  its operations and its gradient column, nothing else."""
  def resolved(method, seed=0, **spsa15):
    c = base_config(2, "tiny")
    c.method, c.seed = method, seed
    c.spsa15.update(spsa15)
    return spec_lib.resolve(c).method

  soma, soma15 = resolved("soma"), resolved("soma15", alpha=0.3, lam=0.5)
  cfg = soma15.step_config()
  assert cfg.spsa.curvature == S.Curvature(0.3, 0.5)
  assert dataclasses.replace(cfg, spsa=dataclasses.replace(cfg.spsa, curvature=None)) == \
      soma.step_config()
  assert soma15.describe == soma.describe | {"gradient": "zero-order (1.5-SPSA)"}
  assert soma15.train_step is soma.train_step  # one jitted step; the config is the difference
  # every seed of a shape runs one compiled program (the seed comes as data)
  assert resolved("soma15", seed=7, alpha=0.3, lam=0.5).step_config(seed_as_data=True) == \
      soma15.step_config(seed_as_data=True)


# ------------------------------------------------------------------------------ cost


@pytest.mark.parametrize("accum", [1, 3])
def test_ops_counter_charges_the_clean_forward(accum):
  """ops_per_update = (2 K + 1) / (2 K) of SOMA's, each accumulation batch its own L0."""
  def ops(method):
    c = base_config(2, "tiny")
    c.method, c.spsa.accum = method, accum
    return spec_lib.resolve(c).method.ops_per_update

  k = base_config(2, "tiny").spsa.n_pert
  assert Fraction(ops("soma15"), ops("soma")) == Fraction(2 * k + 1, 2 * k)


@pytest.mark.parametrize("chunk", [4, 2])
def test_forwards_run_are_the_forwards_counted(chunk):
  """The step runs A (2 K + 1) forwards per expert, as counted (one L0 per accumulation batch,
  not one per chunk), and SPSA 2 A K: every evaluation of the loss is counted by a callback."""
  calls = []

  def counted_loss(body, head, window_BxT1):
    loss = M.loss(body, head, window_BxT1)
    tick = lambda x: (calls.append(1), np.zeros((), np.float32))[1]
    return loss + io_callback(tick, jax.ShapeDtypeStruct((), jnp.float32), loss, ordered=False)

  n, a, k = 2, 3, 4
  body_N, head = M.init_experts(jax.random.key(0), TINY, n)
  batch = jax.random.randint(jax.random.key(1), (n, a, 2, 9), 0, 256).astype(jnp.uint8)
  args = (body_N, head, batch, jnp.full((n,), 1e-3), 0, jnp.arange(n), jax.random.key(0))
  for curvature, forwards in ((None, 2 * k), (S.Curvature(), 2 * k + 1)):
    calls.clear()
    cfg = S.SpsaConfig(n_pert=k, accum=a, pert_chunk=chunk, curvature=curvature)
    jax.block_until_ready(S.estimate(*args, cfg, loss_fn=counted_loss))
    assert len(calls) == n * a * forwards, (curvature, len(calls))


def test_an_ops_budget_stops_where_the_clean_forwards_say(data_prepared, tmp_path):
  """A budget of 3 updates' operations (soma15's count) stops after update 3; counted at
  SPSA's (2 K per batch) the same budget would buy a 4th (3 (2 K + 1) / (2 K) > 3)."""
  c = base_config(3, "tiny")
  c.method, c.data.dir = "soma15", data_prepared
  c.update(steps=10, budget_unit="ops", log_every=1, eval_every=5, ckpt_every=5)
  # SPEC 7 written out: N experts x A (2 K + 1) forwards x B T tokens x F per token
  s, f = c.spsa, spec_lib.resolve(c).method.flops_per_token
  c.budget = float(3 * 3 * s.accum * (2 * s.n_pert + 1) * s.batch * c.data.seq_len * f)
  summary = train.run(c, str(tmp_path / "w"))
  assert summary["step"] == 3, summary


# ------------------------------------------------------------------ across experts

SHARDED = textwrap.dedent("""
    import dataclasses, json
    import jax
    import numpy as np
    from soma_jax import spsa
    from tests import parallel_worker as W

    jax.config.update("jax_enable_x64", True)
    base = W.step_config()
    cfg = dataclasses.replace(base, spsa=dataclasses.replace(
        base.spsa, curvature=spsa.Curvature(0.3, 1.0)))
    fso = W.run_case(4, 4, 1, cfg=cfg, x64=True)
    ddpp = W.run_case(1, 1, 4, cfg=cfg, x64=True)
    ref = {}
    for name, n in (("fso", 4), ("ddpp", 1)):
      state, step = W.initial_state(cfg, n, x64=True), jax.jit(spsa.train_step, static_argnames="cfg")
      for batch in W.batches(n):
        state, _ = step(state, batch, np.arange(n), cfg=cfg)
      ref[name] = max(float(np.max(np.abs(x - y))) for x, y in
                      zip(W.flat_leaves(state), fso["leaves"] if n == 4 else ddpp["leaves"]))
    print(json.dumps({"fso": fso["collectives"], "ddpp": ddpp["collectives"], "diff": ref}))
""")


def test_no_collective_across_experts_and_ddpp_adds_up():
  """The FSO step (4 experts on 4 fake devices) compiles with no collective, and the DDPP
  step (one model's directions over 4 devices, each evaluating its own L0) with only the
  estimate's all-reduce; both equal the one-device step in float64 (`parallel.count_collectives`
  of tests/test_parallel.py)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  proc = subprocess.run([sys.executable, "-c", SHARDED], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["fso"]["total"] == 0, f"FSO 1.5-SPSA step has collectives: {out['fso']}"
  assert out["ddpp"]["all-reduce"] == 1 and out["ddpp"]["total"] == 1, out["ddpp"]
  assert out["diff"]["fso"] < 1e-9 and out["diff"]["ddpp"] < 1e-9, out["diff"]


# ------------------------------------------------------------------------------ CLI


@pytest.mark.parametrize("field,value", [("alpha", "-0.5"), ("alpha", "nan"), ("lam", "0")])
def test_a_bad_alpha_or_lambda_exits_2_with_one_line(field, value, tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
         "--config=" + os.path.join(ROOT, "experiments", "configs", "soma.py") + ":n=2,size=tiny",
         "--config.method=soma15", f"--config.spsa15.{field}={value}",
         f"--workdir={tmp_path / 'w'}"]
  proc = subprocess.run(cmd, env=default_env(JAX_PLATFORMS="cpu"), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and f"spsa15.{field}=" in lines[0], proc.stderr[-2000:]


# ------------------------------------------------------------------ the study at size=tiny


def test_the_study_at_size_tiny(data_two_shards, tmp_path):
  """compare.py:study=spsa15 at size=tiny: the alpha stage
  on seed 0 picks each 1.5-SPSA row's alpha by validation, then every row runs every seed at
  the reference's operations, 1.5-SPSA charged 9/8 of SPSA's per update (K = 4), and the
  declared primary readouts carry computed verdicts."""
  from soma_jax.studies import compare as compare_lib
  from tests.test_compare import load_config

  config = load_config("compare", "study=spsa15,size=tiny")
  config.update(data_dir=data_two_shards, bootstrap_draws=50)
  out = str(tmp_path / "out")
  p = compare_lib.run(config, out)
  assert p["study"] == "spsa15" and set(p["rows"]) == {"soma", "mono", "soma15", "mono15"}
  with open(os.path.join(out, "alpha_stage.json")) as f:
    stage = json.load(f)
  assert stage["seeds"] == [0] and set(stage["rows"]) >= {"soma15_a0p1", "soma15_a0p3"}
  for row, r in p["alpha_stage"]["rows"].items():
    tried = {float(a): v for a, v in r["validation_end_loss"].items()}
    assert set(tried) == {0.1, 0.3} and r["chosen"] == min(tried, key=tried.get), row
  ops = p["budget"]["ops_per_update"]
  assert Fraction(ops["soma15"], ops["soma"]) == Fraction(9, 8)
  assert p["rows"]["soma15"]["gradient"] == "zero-order (1.5-SPSA)"
  for name, r in p["rows"].items():  # every row spent the budget, none a whole update more
    assert len(r["per_seed"]) == 2, name
    for s in r["per_seed"]:
      assert p["budget"]["amount"] <= s["ops"] < p["budget"]["amount"] + ops[name], name
  assert p["intervals"]["kind"] == "seeds_own_starts"  # SPEC 9.8: every seed its own start
  for name, r in p["rows"].items():
    assert [s["start"].split("/")[1] for s in r["per_seed"]] == ["seed0", "seed1"], name
  assert list(p["primary"]) == ["spsa15_on_soma", "helps_mono_more", "sharding_spsa15"]
  assert all(r["verdict"] for r in p["primary"].values())
  assert p["sign_kept"]["effects"] == ["sharding_spsa", "sharding_spsa15"]
  with open(os.path.join(out, "table.md")) as f:
    assert "Primary readout" in f.read()


@pytest.mark.parametrize("lo,hi,words", [(0.01, 0.03, "a lower, by 0.0200"),
                                         (-0.03, -0.01, "b lower, by 0.0200"),
                                         (-0.01, 0.03, "no measurable difference, within +-0.0300")])
def test_verdicts_are_computed_from_the_interval(lo, hi, words):
  from soma_jax.studies import spsa15

  got = spsa15.verdict({"mean": (lo + hi) / 2, "ci95": [lo, hi]}, "a lower", "b lower")
  assert got.startswith(words), got
  side = {"mean": 0.02, "ci95": [lo, hi]}
  kept = spsa15.sign_kept({"mean": 0.02, "ci95": [0.01, 0.03]}, side)
  assert kept == {0.01: "kept", -0.03: "flipped"}.get(lo, "unresolved (an interval holds zero)")


def test_the_committed_table_is_its_json_rendered():
  """docs/results/spsa15_cpu.md is spsa15.table of its JSON (which declared its primary
  readouts before the run, and says so), not an edited copy."""
  from soma_jax.studies import spsa15
  p, text = committed.result("spsa15_cpu")
  assert text == spsa15.table(p)
  assert "declared in the config before the run" in text
