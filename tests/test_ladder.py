"""The width ladder (SPEC 9.7, soma_jax/studies/ladder.py): rung sizing at size=cpu, and one
rung end to end at size=tiny (seeds, the mechanism at the start, Table 7's pair, the control);
the summed-loss estimator's rank on a block-diagonal quadratic; scripts/ladder_mechanism.py."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scripts import ladder_mechanism
from soma_jax import checkpoint as ckpt_lib
from soma_jax import descent, spsa
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.studies import compare, driver, ladder
from tests import test_descent as quad
from tests.test_compare import ROOT, load_config


def test_every_rung_has_equal_params_and_ops_per_update():
  """SOMA N = 2 at widths 16, 32, 64, 128 and the monolith sized to it: total parameters and
  operations per update within 2% at every rung (SPEC 9.6's condition for equal updates)."""
  _, ls = driver.checked(ladder.STUDY, load_config("compare", "study=ladder,size=cpu"))
  assert ladder.widths(ls.config.rungs) == [16, 32, 64, 128] and ls.widths == (16, 32, 64, 128)
  for w in ls.widths:
    s = ladder.sizes(ls, w)
    assert s["d_t"]["soma_n2"] == w and s["n_experts"] == {"soma_n2": 2, "mono": 1,
                                                           "soma_n2_summed": 2}
    assert s["d_t"]["mono"] > w
    assert abs(s["params_difference"]) <= 0.02, s
    assert abs(s["ops_difference"]) <= 0.02, s
    # recomputed from the configs themselves, not from `sizes`' own arithmetic
    cfgs = ladder.sized(ls, w)
    p = {n: spec_lib.resolve(c).method.ensemble_params for n, c in cfgs.items()}
    o = {n: spec_lib.resolve(c).total_ops_per_update for n, c in cfgs.items()}
    assert abs(p["mono"] - p["soma_n2"]) <= 0.02 * p["soma_n2"]
    assert abs(o["mono"] - o["soma_n2"]) <= 0.02 * o["soma_n2"]
    assert p["soma_n2_summed"] == p["soma_n2"] and o["soma_n2_summed"] == o["soma_n2"]


def test_arguments():
  config = load_config("compare", "study=ladder,size=tiny,rungs=4/8/16,seeds=3")
  assert ladder.widths(config.rungs) == [4, 8, 16] and config.seeds == 3
  assert load_config("compare", "study=ladder,size=cpu").seeds == 3
  assert compare._study("ladder") is ladder.STUDY
  for bad in ("4/x", "8/8", "0/4", ""):
    config.rungs = bad
    with pytest.raises(UserError, match="rungs="):
      ladder.widths(config.rungs)
  with pytest.raises(UserError, match="size=paper"):
    load_config("compare", "study=ladder,size=paper")


TINY = "study=ladder,size=tiny,rungs=8,seeds=1"


@pytest.fixture(scope="module")
def ladder_run(tmp_path_factory, data_two_shards):
  """One rung (width 8), one seed, the shortest grid Table 7 accepts."""
  config = load_config("compare", TINY)
  config.data_dir = data_two_shards
  config.bootstrap_draws = 50
  config.lr_factors, config.lr_extend, config.eps_factors = (0.5, 1.0, 2.0), 0, (1.0,)
  config.eps_extend = 0
  out = str(tmp_path_factory.mktemp("ladder") / "out")
  return config, out, driver.run(ladder.STUDY, config, out,
                                 "python experiments/compare.py --test")


def test_monolith_and_experts_are_measured_on_identical_windows(ladder_run):
  """Expert e is measured on its own shard's batches, the monolith on exactly those of both
  experts (the same windows, not its own pooled split), so batch noise cancels in the ratio."""
  _, _, payload = ladder_run
  mech = payload["rungs"][0]["mechanism"]
  experts = [x["batch_fingerprints"] for x in mech["experts"]]
  assert len(experts) == 2 and not set(experts[0]) & set(experts[1])
  assert mech["monolith"]["batch_fingerprints"] == experts[0] + experts[1]


def test_rung_record(ladder_run):
  """What results.json holds per rung: sizes, updates, start and end losses, gains with
  intervals, rho and r per model, predicted and measured ratios; and the three files."""
  config, out, payload = ladder_run
  for name in ("results.json", "table.md", "ladder.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f)["study"] == "ladder"
  r = payload["rungs"][0]
  assert r["width"] == 8 and r["d_t"]["soma_n2"] == 8
  soma, mono = r["methods"]["soma_n2"], r["methods"]["mono"]
  for m in (soma, mono):
    q = m["per_seed"][0]
    assert q["updates"] == config.budget
    assert q["eps_grid"] == [config.base_lr] and q["eps_at_edge"] is False  # eps not searched
    assert q["gain"]["test"] == pytest.approx(q["start_loss"]["test"] - q["end_loss"]["test"])
    assert "ci95" in m["gain"]["test"]
  gain = lambda m: m["per_seed"][0]["gain"]["test"]
  assert r["measured_ratio"]["mean"] == pytest.approx(gain(soma) / gain(mono))
  mech = r["mechanism"]
  for x in mech["experts"] + [mech["monolith"]]:
    assert {"rho", "rho_se", "r", "r_se", "predicted_rho"} <= set(x)
    assert x["rho_by"] == config.mechanism.rho_by
  rho_e = sum(x["rho"] for x in mech["experts"]) / 2
  assert mech["predicted_ratio"] == pytest.approx(rho_e / mech["monolith"]["rho"])
  assert mech["monolith"]["params"] > mech["experts"][0]["params"]
  table = open(os.path.join(out, "table.md")).read()
  assert f"{mech['predicted_ratio']:.3f}" in table


def test_control_runs_somas_settings_from_somas_start(ladder_run):
  """The summed-loss control continues SOMA's seed at SOMA's selected lr and eps for SOMA's
  number of updates, in every seed."""
  config, out, payload = ladder_run
  r = payload["rungs"][0]
  soma = r["methods"]["soma_n2"]["per_seed"][0]
  ctl = r["control"]["per_seed"][0]
  assert (ctl["lr"], ctl["eps"], ctl["updates"]) == (
      soma["selected"]["lr"], soma["selected"]["eps"], soma["updates"])
  saved = ckpt_lib.read_config(os.path.join(out, r["folder"], ctl["workdir"]))
  assert saved.method == "soma_summed" and saved.init_state and saved.opt.lr == ctl["lr"]
  assert saved.init_from == os.path.join(out, "rung8", "seeds", "soma_expert")
  assert ctl["gain"]["test"] == pytest.approx(soma["start_loss"]["test"] - ctl["end_loss"]["test"])


def test_predicted_ratio_error_cancels_shared_batch_noise():
  """A monolith whose per-batch decreases are an expert's times a constant has exactly the
  ratio of those constants on every subset of the shared batches: the jackknife's error is 0,
  where errors taken as independent would not be."""
  batch = lambda g, h: {"decrease_g": g, "decrease_ghat": h}
  e0 = [batch(1.0, 0.10), batch(2.0, 0.50)]
  e1 = [batch(1.5, 0.30), batch(0.5, 0.05)]
  rho = descent.rho_of
  experts = [{"rho": rho(e), "rho_se": 0.05, "predicted_rho": 0.2, "per_batch": e}
             for e in (e0, e1)]
  mono_b = [batch(3 * b["decrease_g"], 1.5 * b["decrease_ghat"]) for b in e0 + e1]
  mono = {"rho": rho(mono_b), "rho_se": 0.05, "predicted_rho": 0.1, "per_batch": mono_b}
  out = descent.predicted(experts, mono)
  assert out["predicted_ratio"] == pytest.approx((rho(e0) + rho(e1)) / 2 / rho(mono_b))
  assert out["predicted_ratio_se_by"].startswith("jackknife")
  same = [{"rho": rho(e0 + e1), "rho_se": 0.05, "predicted_rho": 0.2, "per_batch": e0 + e1}]
  mono_same = {"rho": rho(e0 + e1) / 2, "rho_se": 0.05, "predicted_rho": 0.1,
               "per_batch": [batch(2 * b["decrease_g"], b["decrease_ghat"]) for b in e0 + e1]}
  one = descent.predicted(same, mono_same)
  assert one["predicted_ratio"] == pytest.approx(2.0)
  assert one["predicted_ratio_se"] == pytest.approx(0.0, abs=1e-12)
  indep = descent.predicted([dict(same[0], per_batch=e0[:1])],
                           dict(mono_same, per_batch=mono_same["per_batch"][:1]))
  assert indep["predicted_ratio_se"] > 0.1 and indep["predicted_ratio_se_by"].startswith("delta")


def test_predicted_vs_summed_error_cancels_shared_batch_noise():
  """Summed batch k holds every expert's batch k: a summed estimator whose decreases along g
  are twice the experts' (identical experts) has exactly half their rho on every subset of
  the batches, so the jackknife over the shared batches gives ratio 2 with error 0; one batch
  each falls back to the delta method."""
  batch = lambda g, h: {"decrease_g": g, "decrease_ghat": h}
  e = [batch(1.0, 0.10), batch(2.0, 0.50), batch(0.5, 0.20)]
  rho = descent.rho_of
  experts = [{"rho": rho(e), "rho_se": 0.05, "predicted_rho": 0.2, "per_batch": e}] * 2
  s_b = [batch(2 * b["decrease_g"], b["decrease_ghat"]) for b in e]
  summed = {"rho": rho(s_b), "rho_se": 0.05, "predicted_rho": 0.1, "per_batch": s_b}
  out = descent.predicted_vs_summed(experts, summed)
  assert out["predicted_vs_summed"] == pytest.approx(2.0)
  assert out["predicted_vs_summed_se"] == pytest.approx(0.0, abs=1e-12)
  assert out["predicted_vs_summed_se_by"].startswith("jackknife")
  assert out["predicted_vs_summed_from_r"] == pytest.approx(2.0)
  one = descent.predicted_vs_summed([dict(x, per_batch=e[:1]) for x in experts],
                                   dict(summed, per_batch=s_b[:1]))
  assert one["predicted_vs_summed_se_by"].startswith("delta") and one["predicted_vs_summed_se"] > 0


@pytest.mark.slow  # make test-all; kept out of make test's 15 minutes
def test_ladder_steps_sizes_rungs_from_training_updates(data_two_shards):
  """benchmarks/ladder_steps.py as a user runs it: every method and seed run of a rung timed
  isolated and inside training, and the projection read from training's per-update time."""
  from tests.test_benchmark_tools import _bench_child

  out = json.loads(_bench_child(
      "ladder_steps", "--config=experiments/configs/compare.py:study=ladder,size=tiny,rungs=4",
      "--reps=1", "--train_updates=3", "--nomechanism", f"--data_dir={data_two_shards}"))
  (rung,) = out["rungs"]
  assert rung["projected_from"] == "update_seconds" and out["train_updates"] == 3
  names = {"soma_n2", "mono", "soma_n2_summed", "seed_soma_expert", "seed_monolith"}
  assert set(rung["steps"]) == names
  for r in rung["steps"].values():
    assert r["train_updates"] == 3 and r["update_seconds"] > 0 and r["isolated_step_seconds"] > 0
  config = load_config("compare", "study=ladder,size=tiny,rungs=4")
  steps = {k: v["update_seconds"] for k, v in rung["steps"].items()}
  fewest = len(config.lr_factors) + len(config.eps_factors) - 1
  seeds = config.seed_updates * (steps["seed_soma_expert"] + steps["seed_monolith"])
  per_seed = config.budget * (fewest * (steps["soma_n2"] + steps["mono"]) + steps["soma_n2_summed"])
  assert rung["projected_training_minutes"]["fewest_runs"] == pytest.approx(
      (seeds + config.seeds * per_seed) / 60)


def test_summed_estimator_is_measured_at_the_controls_start(ladder_run):
  """mechanism.summed: the summed-loss estimator over both experts' bodies (2 x an expert's
  parameters, the experts' n), on every expert's batch k at once; predicted_vs_summed is
  mean_e rho_e / rho_summed (and from r, n / (r + n)); measured_vs_summed is SOMA's test gain
  over the control's in each seed; table.md shows both."""
  _, out, payload = ladder_run
  r = payload["rungs"][0]
  mech = r["mechanism"]
  summed, experts = mech["summed"], mech["experts"]
  for key in ("rho", "r", "rho_se"):
    assert math.isfinite(summed[key]), (key, summed)
  # r's error is over the Hutchinson vectors of the one batch: none from tiny's one vector
  assert math.isfinite(summed["r_se"]) or summed["hutchinson"] == 1
  assert summed["rho"] > 0
  assert summed["params"] == sum(x["params"] for x in experts)
  assert summed["n"] == experts[0]["n"] and summed["rho_by"] == experts[0]["rho_by"]
  assert len(summed["per_batch"]) == min(len(x["per_batch"]) for x in experts)
  rho_e = np.mean([x["rho"] for x in experts])
  assert mech["predicted_vs_summed"] == pytest.approx(rho_e / summed["rho"])
  assert mech["predicted_vs_summed_from_r"] == pytest.approx(
      np.mean([x["predicted_rho"] for x in experts]) / summed["predicted_rho"])
  assert mech["predicted_vs_summed_se"] >= 0
  somas, ctls = r["methods"]["soma_n2"]["per_seed"], r["control"]["per_seed"]
  want = [a["gain"]["test"] / b["gain"]["test"] for a, b in zip(somas, ctls, strict=True)]
  assert r["measured_vs_summed_per_seed"] == pytest.approx(want)
  assert r["measured_vs_summed"]["mean"] == pytest.approx(np.mean(want))
  # the monolith's comparison as before
  assert r["measured_ratio_per_seed"] == pytest.approx(
      [a["gain"]["test"] / b["gain"]["test"] for a, b in zip(
          somas, r["methods"]["mono"]["per_seed"], strict=True)])
  table = open(os.path.join(out, "table.md")).read()
  assert "predicted vs summed" in table and f"{mech['predicted_vs_summed']:.3f}" in table


def _block_quadratic(body, head, batch):
  """One expert's quadratic g_e.x + x.H_e.x / 2 at x = flat(body), (g_e, H_e) as its head."""
  del batch
  x = quad._flat(body)
  return head["g"] @ x + 0.5 * x @ (head["h"] @ x)


def _stacked_positions(body_N) -> list[np.ndarray]:
  """Each expert's flat coordinates (in `_flat(body_e)` order) inside `_flat(body_N)`."""
  sizes = [x.size for x in jax.tree.leaves(body_N)]
  offsets = np.cumsum([0] + sizes)
  index = jax.tree.unflatten(jax.tree.structure(body_N), [
      np.arange(o, o + x.size).reshape(x.shape)
      for o, x in zip(offsets, jax.tree.leaves(body_N))])
  return [np.asarray(quad._flat(jax.tree.map(lambda x, e=e: x[e], index))) for e in range(2)]


def test_summed_estimator_rank_is_the_block_diagonal_quadratics():
  """Two experts with quadratic losses of Hessians H_1, H_2 (r_1, r_2 about 40): the summed
  estimator over both bodies (`descent.summed`, one sparse direction over the stacked
  vector) measures the r of the full quadratic, H = diag(H_1, H_2), tr H ||g||^2 / g.H.g
  (about r_1 + r_2, twice an expert's), and its rho the exact finite-n value for that H,
  each within 3 of its own standard errors."""
  d, n = 200, 4
  blocks = [quad._anisotropic(d, seed=0), quad._anisotropic(d, seed=3)]
  with jax.enable_x64(True):
    body_N = jax.tree.map(lambda x: jnp.stack([x, x]), quad._params(16, d - 16))
    head_N = {"g": jnp.asarray(np.stack([g for g, _ in blocks])),
              "h": jnp.asarray(np.stack([h for _, h in blocks]))}
    cfg = spsa.SpsaConfig(n_pert=n, probe="sparse", pert_chunk=n)
    batch = jnp.zeros((1, 2, 1, 2), jnp.uint8)  # [A, N, B, T + 1], unused by the quadratic
    out = descent.measure(descent.summed(_block_quadratic, 1), body_N, head_N, [batch], 1e-3,
                          cfg, jax.random.key(0), repeats=2000, hutchinson=256,
                          loss_fn=descent.summed(_block_quadratic, 0))
    q, m = quad._moments(body_N, "sparse")
  g_full, h_full = np.zeros(2 * d), np.zeros((2 * d, 2 * d))
  for pos, (g, h) in zip(_stacked_positions(body_N), blocks):
    g_full[pos], h_full[np.ix_(pos, pos)] = g, h
  r = quad.effective_rank(g_full, h_full)
  r_each = [quad.effective_rank(g, h) for g, h in blocks]
  assert r == pytest.approx(sum(r_each), rel=0.1), (r, r_each)
  assert out["params"] == 2 * d and out["n"] == n
  assert quad._within(out["r"], out["r_se"], r), (out["r"], out["r_se"], r, r_each)
  assert out["r"] - 3 * out["r_se"] > max(r_each), "too few Hutchinson vectors to tell"
  exact = quad.exact_rho(g_full, h_full, n, q, m)
  assert quad._within(out["rho"], out["rho_se"], exact), (out["rho"], out["rho_se"], exact)
  assert out["rho_se"] < 0.05 * out["rho"], "too few repeats for the test to mean anything"


def test_ladder_mechanism_script_retrains_the_recorded_starts(ladder_run, data_two_shards,
                                                               tmp_path):
  """scripts/ladder_mechanism.py on the tiny ladder's results.json, its seeds trained afresh
  in another folder: the same starts (the experts' and monolith's rho and r equal the
  recorded, on the same batches), the summed estimator's too, and measured_vs_summed from the
  recorded SOMA and control gains."""
  _, out, payload = ladder_run
  result = ladder_mechanism.main([
      f"--config={os.path.join(ROOT, 'experiments', 'configs', 'compare.py')}:{TINY}",
      f"--out={tmp_path / 'mech'}", f"--results={os.path.join(out, 'results.json')}",
      f"--data_dir={data_two_shards}", f"--json={tmp_path / 'mech.json'}"])
  assert json.loads((tmp_path / "mech.json").read_text())["rungs"][0]["width"] == 8
  (r,), (rec,) = result["rungs"], payload["rungs"]
  assert os.path.isdir(tmp_path / "mech" / "rung8" / "seeds" / "soma_expert")
  check = r["recorded_check"]
  assert check["equal_within_tolerance"] and check["same_batches"], check
  assert check["rho"]["max_abs_difference"] == 0.0 and check["r"]["max_abs_difference"] == 0.0
  assert r["mechanism"]["summed"]["rho"] == rec["mechanism"]["summed"]["rho"]
  assert r["mechanism"]["predicted_vs_summed"] == rec["mechanism"]["predicted_vs_summed"]
  assert r["measured_vs_summed_per_seed"] == pytest.approx(rec["measured_vs_summed_per_seed"])
  assert r["recorded_measured_ratio"] == rec["measured_ratio"]
  assert set(result["load_average"]) == {"start", "end"} and result["wall_seconds"] > 0
