"""study=narrow (SPEC 9.8) at size=tiny: rows, every seed its own start, declared budgets,
primary readouts with intervals and verdicts, D(u) and G(u), the experts alone, the man
pages corpus; and the check that fails when every seed shares one seed run."""

import json
import math
import os

import jax
import numpy as np
import pytest

from soma_jax import runs as runs_lib
from soma_jax.errors import UserError
from soma_jax.studies import (
  datasets,
  driver,
  narrow,
  narrow_readouts,
  planning,
  statistics,
  training,
)
from tests.test_compare import load_config


@pytest.fixture(scope="module")
def narrowed(tmp_path_factory, data_two_shards):
  config = load_config("compare", "study=narrow,size=tiny")
  config.data_dir = data_two_shards
  config.bootstrap_draws = 100
  out = str(tmp_path_factory.mktemp("narrow") / "out")
  return config, out, driver.run(narrow.STUDY, config, out,
                                 "python experiments/compare.py --test")


def assert_own_starts(seed_runs: dict, out: str, seeds: list[int], run_seed: int) -> None:
  """Every optimisation seed continues seed runs of its own: its own folder, trained at
  seed_run_seed + s, with parameters no other seed's run has."""
  folders = {s: {n: r["workdir"] for n, r in seed_runs[f"seed{s}"].items()} for s in seeds}
  for name in folders[seeds[0]]:
    paths = [folders[s][name] for s in seeds]
    assert len(set(paths)) == len(seeds), (name, paths)
    assert [seed_runs[f"seed{s}"][name]["seed"] for s in seeds] == [run_seed + s for s in seeds]
    bodies = [runs_lib.restore_params(os.path.join(out, p))[0] for p in paths]
    first = np.concatenate([np.ravel(x) for x in jax.tree.leaves(bodies[0])])
    for other in bodies[1:]:
      flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(other)])
      assert not np.array_equal(first, flat), f"seed run {name}: two seeds share its parameters"


def assert_selected(selection: dict, out: str, centres: dict, factors, first: int) -> None:
  """Each row's lr is the lowest final validation loss of its grid (`factors` x its centre)
  trained on the first seed: every candidate's loss read back from its folder's last
  checkpoint score, the first in grid order on a tie; the edge flag says whether the choice
  is the grid's smallest or largest lr."""
  for name, sel in selection.items():
    grid = [f * centres[name] for f in factors]
    assert sel["seed"] == first and sel["lr_grid"] == pytest.approx(sorted(grid)), name
    tried = sel["configurations"]
    assert [c["lr"] for c in tried] == pytest.approx(grid), name  # trained in grid order
    for c in tried:
      folder = os.path.join(out, c["workdir"], "checkpoint_scores")
      last = max((f for f in os.listdir(folder) if f.endswith(".npy")), key=lambda f: int(f[:-4]))
      c["_read"] = float(np.load(os.path.join(folder, last)).mean())
      assert c["val_nats_per_byte"] == pytest.approx(c["_read"], abs=1e-12), (name, c["lr"])
    best = min(tried, key=lambda c: c["_read"])  # the first in grid order on a tie
    assert sel["lr"] == best["lr"], (name, [(c["lr"], c["_read"]) for c in tried])
    assert sel["lr_at_edge"] == (sel["lr"] in (min(grid), max(grid))), name


def assert_runs_at(out: str, workdirs: list[str], lr: float) -> None:
  """Every run of `workdirs` (each seed's) was configured with `lr`, and trained at it (its
  first logged lr)."""
  for w in workdirs:
    with open(os.path.join(out, w, "config.json")) as f:
      assert json.load(f)["opt"]["lr"] == lr, w
    with open(os.path.join(out, w, "metrics.jsonl")) as f:
      logged = next(r["lr"] for r in map(json.loads, f) if "lr" in r)
    assert np.asarray(logged) == pytest.approx(lr, rel=1e-6), w


def test_every_seed_its_own_start(narrowed):
  config, out, p = narrowed
  seeds = p["seeds"]
  assert_own_starts(p["seed_runs"], out, seeds, config.seed_run_seed)
  assert p["intervals"]["kind"] == "seeds_own_starts"
  for name, r in p["rows"].items():  # each seed's row continues its own seed's run
    assert len({s["seed_run"] for s in r["per_seed"]}) == len(seeds), name
  starts = [s["start_loss"]["validation"] for s in p["rows"]["soma"]["per_seed"]]
  assert len(set(starts)) == len(seeds)


def test_each_rows_lr_is_its_grids_validation_argmin_used_by_every_seed(narrowed):
  config, out, p = narrowed
  centres = {n: config.row_base_lr.get(n, config.base_lr) for n in config.order}
  assert_selected(p["selection"], out, centres, config.lr_factors, p["seeds"][0])
  for name, r in p["rows"].items():
    assert_runs_at(out, [s["workdir"] for s in r["per_seed"]], p["selection"][name]["lr"])


def test_shared_seed_runs_fail_the_own_start_check(data_two_shards, tmp_path):
  """The check above fails where every seed shares one seed run (own_starts off)."""
  config = load_config("compare", "study=narrow,size=tiny")
  config.data_dir, config.own_starts = data_two_shards, False
  plan, _ = driver.checked(narrow.STUDY, config)
  only = {"soma": planning.resolved(planning.sized(config)["soma"])}
  val, _ = datasets.eval_sets(plan.eval, data_two_shards, [only["soma"].seq_len])
  shared = training.train_seeds(plan, only, data_two_shards, str(tmp_path), val)
  shown = {f"seed{s}": {n: {k: v for k, v in r.items() if not k.startswith("_")}
                        for n, r in shared.items()} for s in plan.seeds}
  assert planning.interval_kind(plan)["kind"] == "seeds_shared_start"
  with pytest.raises(AssertionError):
    assert_own_starts(shown, str(tmp_path), list(plan.seeds), config.seed_run_seed)


def test_rows_budgets_and_declared_test_budgets(narrowed):
  config, out, p = narrowed
  assert list(p["rows"]) == list(config.order)
  ops = p["budget"]["amount"]
  assert ops == config.budget * p["budget"]["ops_per_update"]["soma"]
  assert p["declared"]["test_fractions"] == list(config.test_fractions)
  for name, r in p["rows"].items():
    share = config.row_fraction.get(name, 1.0)
    per_update = p["budget"]["ops_per_update"][name]
    want = [narrow_readouts.fraction_key(f) for f in config.test_fractions if f <= share]
    for s in r["per_seed"]:
      assert s["ops"] >= ops * share > s["ops"] - per_update, (name, s["ops"])
      assert list(s["test"]) == want, name  # test scored at exactly the declared budgets
      assert s["lr"] == p["selection"][name]["lr"]  # fixed for every seed
  assert list(p["rows"]["soma_bptt"]["per_seed"][0]["test"]) == ["0.0625"]
  soma, one = (p["rows"][n]["per_seed"][0]["updates"] for n in ("soma", "one_expert"))
  assert one == 2 * soma  # one expert does half SOMA's operations per update
  rows = p["rows"]
  assert (rows["one_expert"]["n_experts"], rows["one_expert"]["d_t"]) == (1, rows["soma"]["d_t"])
  assert rows["mono"]["d_t"] > rows["soma"]["d_t"]
  assert rows["soma_bptt"]["optimizer_state"].startswith("fresh")
  for name, sel in p["selection"].items():  # a 3-point grid around each row's centre
    assert sel["lr_grid"] == pytest.approx(
        [f * config.row_base_lr[name] for f in config.lr_factors])
  curve = p["rows"]["soma"]["per_seed"][0]["val_curve"]
  assert len(curve) == 1 + len(config.curve_fractions)  # the start and every checkpoint


def test_primary_readouts_have_intervals_and_verdicts(narrowed):
  config, out, p = narrowed
  primary = p["readouts"]["primary"]
  assert set(primary) == set(config.primary)
  for name in config.primary:
    b, a = config.contrasts[name]
    got = primary[name]["end_loss_difference"]
    assert list(got) == [narrow_readouts.fraction_key(f) for f in config.test_fractions]
    for key, c in got.items():
      want = np.mean([y["test"][key] - x["test"][key] for x, y in
                      zip(p["rows"][a]["per_seed"], p["rows"][b]["per_seed"], strict=True)])
      assert c["mean"] == pytest.approx(want, abs=1e-9)
      lo, hi = c["ci95"]
      slo, shi = c["seeds_only_ci95"]
      assert lo <= slo <= c["mean"] <= shi <= hi  # the documents widen the seed interval
      assert c["verdict"] in ("reproduces", "contradicts", "unresolved")
      if c["verdict"] == "unresolved":
        assert c["bound"] == pytest.approx(max(abs(lo), abs(hi)))
  s = primary["one_expert_minus_soma"]["slope"]
  x = np.log2([f * p["budget"]["amount"] for f in config.test_fractions])
  ys = np.array([[c["per_seed"][i] for c in primary["one_expert_minus_soma"][
      "end_loss_difference"].values()] for i in range(config.seeds)])
  assert s["per_seed"] == pytest.approx([np.polyfit(x, y, 1)[0] for y in ys])
  assert s["ci95"][0] <= s["mean"] <= s["ci95"][1] and "verdict" in s
  sec = p["readouts"]["secondary"]
  assert "mono_minus_soma" in sec["slopes"] and "mono_minus_soma" not in p["readouts"][
      "primary"]["one_expert_minus_soma"]
  assert set(sec["contrasts"]) == set(config.contrasts) - set(config.primary)
  assert p["intervals_printed"] > len(config.primary) * len(config.test_fractions)


def _loss_at(record, update):
  return next(q["loss"] for q in record["val_curve"] if q["update"] == update)


def test_mechanism_d_and_g(narrowed):
  config, out, p = narrowed
  m = p["readouts"]["secondary"]["mechanism"]
  assert (m["b"], m["a"]) == tuple(config.mechanism) and m["points"]
  soma, one = p["rows"]["soma"]["per_seed"], p["rows"]["one_expert"]["per_seed"]
  for q in m["points"]:  # log-spaced checkpoints: u and 2u are checkpoints of one_expert
    u = int(q["update"])
    d = [_loss_at(o, u) - _loss_at(s, u) for s, o in zip(soma, one, strict=True)]
    g = [_loss_at(o, u) - _loss_at(o, 2 * u) for o in one]
    assert q["D"]["mean"] == pytest.approx(np.mean(d), abs=1e-9)
    assert q["G"]["mean"] == pytest.approx(np.mean(g), abs=1e-9)
    assert q["D_minus_G"]["mean"] == pytest.approx(np.mean(d) - np.mean(g), abs=1e-9)
  alone = p["readouts"]["secondary"]["experts_alone"]
  assert len(alone) == len(config.curve_fractions)
  for q, point in zip(alone, soma[0]["experts_alone"], strict=True):
    assert len(point["experts"]) == 2 and all(math.isfinite(e) for e in point["experts"])
    assert point["mixture"] == _loss_at(soma[0], point["update"])
    assert q["ensemble_gain"]["mean"] == pytest.approx(np.mean(
        [np.mean(s["experts_alone"][alone.index(q)]["experts"]) - s["experts_alone"][
            alone.index(q)]["mixture"] for s in soma]), abs=1e-9)


def test_crossing_is_log_linear():
  t = lambda u, x: {"update": u, "D_minus_G": {"mean": x}}
  assert narrow_readouts.crossing([t(2, -1.0), t(8, 1.0)]) == pytest.approx(4.0)
  assert narrow_readouts.crossing([t(2, 1.0), t(8, 2.0)]) is None


def test_slope_trend_and_interval():
  """Two seeds whose contrast grows by 0.01 and 0.03 per doubling: the slope interval is the
  t interval over those two slopes, and its trend is read from it."""
  at = [{"budget_fraction": f, "per_seed": [0.01 * k, 0.03 * k]}
        for k, f in enumerate((0.25, 0.5, 1.0))]
  s = narrow_readouts.slope(at, 8.0)
  assert s["per_seed"] == pytest.approx([0.01, 0.03])
  assert s["ci95"] == pytest.approx(statistics.t_interval([0.01, 0.03])["ci95"])
  assert s["trend"].startswith("no measurable trend")
  at = [{"budget_fraction": f, "per_seed": [0.02 * k, 0.021 * k]}
        for k, f in enumerate((0.25, 0.5, 1.0))]
  assert narrow_readouts.slope(at, 8.0)["trend"] == "grows"


def test_verdict_rule():
  assert narrow_readouts.verdict({"ci95": [0.01, 0.03]})["verdict"] == "reproduces"
  assert narrow_readouts.verdict({"ci95": [-0.03, -0.01]})["verdict"] == "contradicts"
  null = narrow_readouts.verdict({"ci95": [-0.02, 0.03]})
  assert null["verdict"] == "unresolved" and null["bound"] == 0.03 and "within" in null["why"]


def test_outputs_written(narrowed):
  config, out, p = narrowed
  with open(os.path.join(out, "results.json")) as f:
    saved = json.load(f)
  assert saved["study"] == "narrow" and saved["corpus"]["what"] == "data_dir as given"
  assert os.path.getsize(os.path.join(out, "curves.png")) > 1000
  md = open(os.path.join(out, "table.md")).read()
  assert "| one_expert_minus_soma | 0.0625 |" in md and "D(u)" in md


def test_man_corpus_links_the_sections(data_textdir, tmp_path):
  root = tmp_path / "man"
  root.mkdir()
  domains = sorted(os.listdir(data_textdir))
  for section, domain in zip((2, 7), domains, strict=False):
    os.symlink(os.path.join(data_textdir, domain), root / f"man{section}")
  config = load_config("compare", "study=narrow,size=tiny,corpus=man")
  config.man_root, config.man_sections = str(root), (2, 7)
  config.prepare = dict(test_docs=6, ensemble_val_docs=3, min_df=2, svd_dims=16,
                        val_fraction=0.05)
  out = str(tmp_path / "out")
  plan, n = driver.checked(narrow.STUDY, config)
  data, corpus = narrow.corpus_dir(n, plan, out)
  assert corpus["corpus"] == "man" and "sections 2, 7" in corpus["what"]
  assert sorted(os.listdir(os.path.join(out, "man"))) == ["man2", "man7"]
  assert os.path.isfile(os.path.join(data, "manifest.json"))
  config.man_sections = (2, 9)
  plan, n = driver.checked(narrow.STUDY, config)
  with pytest.raises(UserError, match="man9"):
    narrow.corpus_dir(n, plan, str(tmp_path / "out2"))


@pytest.mark.parametrize("changes, match", [
    ({"test_fractions": (0.3, 1.0)}, "must be a checkpoint"),
    ({"primary": ("nope",)}, "must name contrasts"),
    ({"first_seed": 1, "seed_run_seed": 0}, "include optimisation seeds")])
def test_bad_fields_are_user_errors(data_two_shards, changes, match):
  config = load_config("compare", "study=narrow,size=tiny")
  config.data_dir = data_two_shards
  config.update(changes)
  with pytest.raises(UserError, match=match):
    driver.checked(narrow.STUDY, config)


def test_config_declares_the_cpu_study():
  """size=cpu: 5 seeds with their own starts, 16x decompose's 1,000 SOMA updates, log-spaced
  checkpoints holding the declared budgets, the lr centres, width= for a narrower rung."""
  c = load_config("compare", "study=narrow,size=cpu")
  assert (c.seeds, c.own_starts, c.budget) == (5, True, 16000.0)
  assert c.test_fractions == (1 / 16, 1 / 4, 1 / 2, 1.0)
  assert set(c.test_fractions) <= set(c.curve_fractions) and c.curve_fractions[0] == 2.0 ** -8
  assert (c.row_base_lr.soma, c.row_base_lr.one_expert, c.row_base_lr.mono) == (
      0.0025, 0.00125, 0.000625)
  sized = planning.sized(c)
  assert [(sized[n].n_experts, sized[n].model.d_t) for n in ("soma", "one_expert", "mono")] == [
      (2, 32), (1, 32), (1, 47)]
  assert (sized["soma"].spsa.n_pert, sized["soma"].spsa.batch, sized["soma"].data.seq_len) == (
      4, 4, 256)
  narrow16 = planning.sized(load_config("compare", "study=narrow,size=cpu,width=16"))
  assert [narrow16[n].model.d_t for n in ("soma", "one_expert", "one_expert_bptt")] == [16] * 3
  assert load_config("compare", "study=narrow,size=cpu,corpus=man").corpus == "man"
