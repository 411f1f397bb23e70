"""study=decompose (SPEC 9.8): the matched-loss speed-up against hand values, and the study at
size=tiny (rows, effects with intervals, speed-ups, random shards, fresh Adam, the backprop
one-expert row, every seed its own start, the seed runs' curves in results.json and the
from-init speed-ups recomputed from them)."""

import csv
import json
import math
import os

import numpy as np
import pytest

from soma_jax.data import prepare
from soma_jax.errors import UserError
from soma_jax.studies import decompose, decompose_report, driver, statistics, table7
from tests import committed
from tests.test_compare import load_config
from tests.test_narrow import assert_own_starts

# --------------------------------------------------------------------- speed-up math


def test_crossing_interpolates_the_running_minimum():
  ops = np.array([0.0, 10.0, 20.0, 30.0])
  loss = np.array([3.0, 2.0, 2.5, 1.0])  # the rise at 20 does not count: the running min is 2
  assert statistics.crossing(ops, loss, 3.0) == 0.0
  assert statistics.crossing(ops, loss, 2.5) == pytest.approx(5.0)
  assert statistics.crossing(ops, loss, 1.5) == pytest.approx(20.0 + 10.0 * 0.5 / 1.0)
  assert statistics.crossing(ops, loss, 0.9) is None


def test_log_speedup_over_the_common_range():
  """a falls 3 -> 1 linearly over 10 ops, b 2.5 -> 1.5 over 40: the common range is 2.5 down
  to 1.5, which a covers in 5 ops and b in 40, so b needs 8x a's operations."""
  a = (np.array([0.0, 10.0]), np.array([3.0, 1.0]))
  b = (np.array([100.0, 140.0]), np.array([2.5, 1.5]))
  assert statistics.log_speedup(a, b) == pytest.approx(math.log(8.0))
  assert statistics.log_speedup(b, a) == pytest.approx(-math.log(8.0))
  c = (np.array([0.0, 10.0]), np.array([1.4, 1.0]))  # entirely below b: no common range
  assert statistics.log_speedup(b, c) is None


def test_speedup_effect_without_documents_is_the_seed_t_interval():
  """With one document per window and no resamples, the interval is the seeds' t interval."""
  pairs = []
  for k in (2.0, 4.0, 8.0):  # a reaches b's range k times faster
    ops = np.array([0.0, 1.0, 2.0])
    wa = np.array([[3.0], [2.0], [1.0]])
    wb_ops = ops * k
    pairs.append(({"compared": (ops, wa)}, {"compared": (wb_ops, wa)}))
  got = statistics.speedup_effect(pairs, np.arange(1), 0, "compared")
  logs = [math.log(k) for k in (2.0, 4.0, 8.0)]
  assert got["per_seed"] == pytest.approx(logs)
  assert got["mean"] == pytest.approx(np.mean(logs))
  assert got["speedup"] == pytest.approx(4.0)
  want = statistics.t_interval(logs)
  assert got["ci95"] == pytest.approx(want["ci95"])


# --------------------------------------------------------------------- the tiny study


@pytest.fixture(scope="module")
def decomposed(tmp_path_factory, data_textdir, data_two_shards):
  rnd = str(tmp_path_factory.mktemp("dec_random") / "dir")
  prepare.prepare(f"textdir:{data_textdir}", 2, rnd, test_docs=6, ensemble_val_docs=3, min_df=2,
                  svd_dims=16, val_fraction=0.05, assignment="random")
  config = load_config("compare", "study=decompose,size=tiny")
  config.data_dir, config.data_dir_random = data_two_shards, rnd
  config.bootstrap_draws = 100
  out = str(tmp_path_factory.mktemp("decompose") / "out")
  return config, out, driver.run(decompose.STUDY, config, out,
                                 "python experiments/compare.py --test")


def test_rows_run_equal_operations_from_their_seeds(decomposed):
  config, out, p = decomposed
  assert list(p["rows"]) == list(config.order) and set(config.order) == set(config.methods)
  budget = p["budget"]["amount"]
  assert budget == config.budget * p["budget"]["ops_per_update"]["soma"]
  for name, r in p["rows"].items():
    assert len(r["per_seed"]) == config.seeds
    per_update = p["budget"]["ops_per_update"][name]
    for s in r["per_seed"]:  # stopped at the first update that reached the budget
      assert s["ops"] >= budget > s["ops"] - per_update, (name, s["ops"], budget)
      assert s["gain"]["test"] == pytest.approx(s["start_loss"]["test"] - s["end_loss"]["test"])
  rows = p["rows"]
  assert rows["soma_bptt"]["optimizer_state"].startswith("fresh")
  for name, first_step in (("soma_bptt", 0), ("mono_bptt", 0), ("soma", config.seed_updates)):
    for s in rows[name]["per_seed"]:  # fresh Adam counts its updates from 0, not the seed's
      assert s["val_curve"][0]["step"] == first_step, (name, s["val_curve"][0])
  assert rows["soma"]["optimizer_state"].startswith("the seed's")
  assert rows["one_expert"]["n_experts"] == 1 and rows["one_expert"]["d_t"] == rows["soma"]["d_t"]
  assert rows["mono"]["d_t"] > rows["soma"]["d_t"]
  assert rows["soma_random"]["data"] == "random" and rows["soma"]["data"] == "semantic"
  # equal-update seeds: soma and soma_random continue the same seed, so start equal on test
  assert rows["soma_random"]["start_loss"]["test"] == rows["soma"]["start_loss"]["test"]
  assert rows["soma_bptt"]["start_loss"] == rows["soma"]["start_loss"]
  # every row's grid is its own: the bptt rows around their own base
  assert rows["soma_bptt"]["lr_base"] == config.row_base_lr.soma_bptt != rows["soma"]["lr_base"]


def seed_records(seed_runs: dict) -> list[dict]:
  """Every seed run record of a results.json's `seed_runs`: {name: record}, or with own
  starts {"seedS": {name: record}}."""
  nested = all("workdir" not in r for r in seed_runs.values())
  return [r for runs in seed_runs.values() for r in runs.values()] if nested else list(
      seed_runs.values())


def assert_seed_curves(seed_runs: dict, checkpoints: int) -> None:
  """Issue 54: every seed run keeps its validation curve in results.json: its checkpoints, at
  most `checkpoints` (none at its initialisation: nothing is scored again), steps and
  operations counted from initialisation and increasing, the last at the record's end (step,
  operations, validation loss)."""
  records = seed_records(seed_runs)
  assert records
  for r in records:
    curve = r["val_curve"]
    assert 1 <= len(curve) <= min(checkpoints, r["step"]), (r["workdir"], len(curve))
    steps, ops = [q["step"] for q in curve], [q["ops"] for q in curve]
    assert steps[0] > 0 and all(a < b for a, b in zip(steps, steps[1:])), steps
    assert ops == [s * r["ops_per_update"] for s in steps] and ops[0] > 0, ops
    assert [q["update"] for q in curve] == steps
    last = curve[-1]
    assert (last["step"], last["ops"]) == (r["step"], r["ops"])
    assert last["loss"] == r["ensemble_val_nats_per_byte"], (last, r)
    assert all(math.isfinite(q["loss"]) for q in curve)


def from_init(p: dict, row: str, i: int) -> tuple[np.ndarray, np.ndarray]:
  """Row `row`'s i-th seed's validation curve from initialisation, from results.json alone:
  the seed run's initialisation (ops 0) and checkpoints, then the compared phase after its
  start, its operations counted on from the seed run's."""
  r = p["rows"][row]
  x = r["per_seed"][i]
  own = p["intervals"]["kind"] == "seeds_own_starts"
  seed = (p["seed_runs"][f"seed{x['seed']}"] if own else p["seed_runs"])[r["seed_run"]]
  assert x["start"] == f"{seed['workdir']}@{seed['step']}"
  ops = [0.0] + [q["ops"] for q in seed["val_curve"]]
  loss = [x["init_val_nats_per_byte"]] + [q["loss"] for q in seed["val_curve"]]
  ops += [ops[-1] + q["ops"] for q in x["val_curve"][1:]]
  loss += [q["loss"] for q in x["val_curve"][1:]]
  return np.array(ops, np.float64), np.array(loss, np.float64)


def test_seed_runs_keep_their_curves(decomposed):
  """Issue 54: each seed run's validation curve is in results.json (decompose's seed runs
  checkpoint curve_points times), compact, its last point the record's end."""
  config, out, p = decomposed
  assert_seed_curves(p["seed_runs"], config.curve_points)
  assert all(len(r["val_curve"]) > 1 for r in seed_records(p["seed_runs"]))  # a curve, not a point
  with open(os.path.join(out, "results.json")) as f:
    assert_seed_curves(json.load(f)["seed_runs"], config.curve_points)


def test_from_init_speedups_recompute_from_results_json(decomposed):
  """SPEC 9.8: from-init readouts count the seed runs' operations and keep their curves in
  results.json; every effect's per-seed from-init log speed-up is recomputed from it."""
  config, out, p = decomposed
  with open(os.path.join(out, "results.json")) as f:
    p = json.load(f)
  checked = 0
  for e in p["effects"].values():
    got = e["log_speedup"]["from_init"]["per_seed"]
    for i, want in enumerate(got):
      again = statistics.log_speedup(from_init(p, e["a"], i), from_init(p, e["b"], i))
      assert (again is None) == (want is None), (e["a"], e["b"], i)
      if want is not None:
        assert again == pytest.approx(want, rel=1e-9, abs=1e-12), (e["a"], e["b"], i)
        checked += 1
  assert checked > 0


def test_every_seed_its_own_start(decomposed):
  """SPEC 9.8, issue 54: decompose's default gives each optimisation seed its own seed runs,
  and results.json says so; each seed's rows continue that seed's own (the check fails where
  every seed shares one: tests/test_narrow.py)."""
  config, out, p = decomposed
  assert_own_starts(p["seed_runs"], out, p["seeds"], config.seed_run_seed)
  assert p["intervals"]["kind"] == "seeds_own_starts" and config.own_starts is True
  for name, r in p["rows"].items():
    runs = [p["seed_runs"][f"seed{x['seed']}"][r["seed_run"]] for x in r["per_seed"]]
    assert [x["start"] for x in r["per_seed"]] == [
        f"{s['workdir']}@{s['step']}" for s in runs], name
    assert len({x["start_loss"]["test"] for x in r["per_seed"]}) == config.seeds, name
  md = open(os.path.join(out, "table.md")).read()
  assert "each optimisation seed its own" in md and "seeds' mean" in md


def test_decompose_and_table7_default_to_own_starts():
  for size in ("tiny", "cpu"):
    for study in ("decompose", "table7"):
      assert load_config("compare", f"study={study},size={size}").own_starts is True, study
  assert table7.config("study=table7,size=tiny").own_starts is True


def test_one_expert_by_backprop(decomposed):
  """Issue 54: one expert of SOMA's width by backprop, fresh Adam from SOMA's seed run, with
  the contrasts beside the other backprop rows and their interactions with SPSA's."""
  config, out, p = decomposed
  rows = p["rows"]
  one = rows["one_expert_bptt"]
  assert (one["n_experts"], one["d_t"]) == (1, rows["soma"]["d_t"])
  assert one["gradient"] == rows["soma_bptt"]["gradient"] != rows["soma"]["gradient"]
  assert one["optimizer_state"].startswith("fresh") and one["seed_run"] == "soma_expert"
  assert one["lr_base"] == config.row_base_lr.one_expert_bptt
  for s in one["per_seed"]:
    assert s["val_curve"][0]["step"] == 0  # fresh Adam counts its updates from 0
  # the same seed run's parameters as SOMA's experts: the same start, seed by seed
  for x, y in zip(one["per_seed"], rows["one_expert"]["per_seed"], strict=True):
    assert x["start"] == y["start"]
    assert x["start_loss"]["test"] == pytest.approx(y["start_loss"]["test"], abs=1e-9)
  effects, inter = p["effects"], p["interactions"]
  assert (effects["sharding_at_width_bptt"]["a"], effects["sharding_at_width_bptt"]["b"]) == (
      "soma_bptt", "one_expert_bptt")
  assert (effects["narrow_vs_wide_bptt"]["a"], effects["narrow_vs_wide_bptt"]["b"]) == (
      "one_expert_bptt", "mono_bptt")
  for name, (e1, e2) in (("interaction_at_width", ("sharding_at_width", "sharding_at_width_bptt")),
                         ("interaction_narrow_vs_wide", ("narrow_vs_wide", "narrow_vs_wide_bptt"))):
    x = inter[name]
    assert x["of"] == [f"{effects[e]['a']} vs {effects[e]['b']}" for e in (e1, e2)]
    assert x["end_loss_difference"]["mean"] == pytest.approx(
        effects[e1]["end_loss_difference"]["mean"] - effects[e2]["end_loss_difference"]["mean"],
        abs=1e-6)
    lo, hi = x["end_loss_difference"]["ci95"]
    assert lo <= x["end_loss_difference"]["mean"] <= hi
  md = open(os.path.join(out, "table.md")).read()
  assert "| one_expert_bptt |" in md and "**interaction_at_width**" in md
  for e in ("sharding_at_width_bptt", "narrow_vs_wide_bptt"):  # SPEC 9.8's readable rule
    line = next(x for x in md.splitlines() if x.startswith(f"| {e} |"))
    want = (decompose_report.unreadable(p, *config.effects[e])
            or decompose_report._speed(effects[e]["log_speedup"]["compared"]))
    assert line.split(" | ")[4] == want, line


def test_effects_carry_intervals_and_both_speedups(decomposed):
  config, out, p = decomposed
  assert set(p["effects"]) == set(config.effects)
  for name, e in p["effects"].items():
    a, b = config.effects[name]
    assert (e["a"], e["b"]) == (a, b)
    gd = e["gain_difference"]
    want = np.mean([x["gain"]["test"] - y["gain"]["test"]
                    for x, y in zip(p["rows"][a]["per_seed"], p["rows"][b]["per_seed"], strict=True)])
    assert gd["mean"] == pytest.approx(want, abs=1e-6)
    end = e["end_loss_difference"]
    want = np.mean([y["end_loss"]["test"] - x["end_loss"]["test"]
                    for x, y in zip(p["rows"][a]["per_seed"], p["rows"][b]["per_seed"], strict=True)])
    assert end["mean"] == pytest.approx(want, abs=1e-6)
    lo, hi = end["ci95"]
    assert lo <= end["mean"] <= hi
    for key in ("compared", "from_init"):
      sp = e["log_speedup"][key]
      assert len(sp["per_seed"]) == config.seeds
      if sp["mean"] is not None:
        assert sp["speedup"] == pytest.approx(math.exp(sp["mean"]))
        assert sp["ci95"][0] <= sp["mean"] <= sp["ci95"][1]
  x = p["interactions"]["interaction"]
  e1, e2 = (p["effects"][k] for k in config.interactions.interaction)
  assert x["end_loss_difference"]["mean"] == pytest.approx(
      e1["end_loss_difference"]["mean"] - e2["end_loss_difference"]["mean"], abs=1e-6)


def test_outputs_written(decomposed):
  config, out, p = decomposed
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f)["study"] == "decompose"
  with open(os.path.join(out, "effects.csv")) as f:
    lines = list(csv.DictReader(f))
  assert {r["effect"] for r in lines} == set(config.effects) | set(config.interactions)
  assert len(lines) == 4 * (len(config.effects) + len(config.interactions))
  assert os.path.getsize(os.path.join(out, "curves.png")) > 1000
  md = open(os.path.join(out, "table.md")).read()
  for name in config.effects:
    assert f"| {name} |" in md


def test_random_rows_need_random_data(data_two_shards, tmp_path):
  config = load_config("compare", "study=decompose,size=tiny")
  config.data_dir, config.data_dir_random = data_two_shards, data_two_shards
  with pytest.raises(UserError, match="was not prepared with --assignment=random"):
    decompose.random_data(*reversed(driver.checked(decompose.STUDY, config)), str(tmp_path))
  config.data_dir_random = ""
  with pytest.raises(UserError, match="data_dir_random is not"):
    decompose.random_data(*reversed(driver.checked(decompose.STUDY, config)), str(tmp_path))


@pytest.mark.parametrize("key, value, match", [
    ("effects.sharding_spsa", ("soma", "nope"), "must name two methods"),
    ("row_data.soma", "shuffled", "must be one of semantic, random"),
    ("row_base_lr.soma_bptt", -1.0, "finite number > 0")])
def test_bad_fields_are_user_errors(data_two_shards, key, value, match):
  config = load_config("compare", "study=decompose,size=tiny")
  config.data_dir = data_two_shards
  section, field = key.split(".")
  config[section][field] = value
  with pytest.raises(UserError, match=match):
    driver.checked(decompose.STUDY, config)


# --------------------------------------------------------------------- the committed tables


@pytest.mark.parametrize("name", ["decompose_cpu", "decompose_cpu_shared_start",
                                  "decompose_man_cpu"])
def test_committed_table_is_its_json_rendered(name):
  """docs/results/NAME.md is decompose_report.table of NAME.json, not an edited copy."""
  from soma_jax.studies import decompose_report
  p, md = committed.result(name)
  assert md == decompose_report.table(p)


def test_a_speedup_over_a_sliver_of_the_phases_is_not_readable():
  """SPEC 9.8: on the man pages SOMA's and the monolith's compared-phase curves share 0.010 to
  0.017 nats/byte of validation loss, 8-14% of SOMA's phase: not readable; on the built-in
  corpus every effect's two curves share at least half of each row's phase in every seed
  (soma against mono: 53-75% of SOMA's, 5 seeds, each its own start): readable."""
  from soma_jax.studies import decompose_report
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")
  with open(os.path.join(root, "decompose_man_cpu.json")) as f:
    man = json.load(f)
  with open(os.path.join(root, "decompose_cpu.json")) as f:
    builtin = json.load(f)
  got = decompose_report.common_range(man, "soma", "mono")
  assert [round(c, 3) for c, _, _ in got] == [0.016, 0.010, 0.017]
  assert max(fa for _, fa, _ in got) < 0.15
  assert decompose_report.unreadable(man, "soma", "mono").startswith("not readable (common range")
  assert decompose_report.unreadable(man, "soma", "soma_random") == ""
  assert all(decompose_report.unreadable(builtin, e["a"], e["b"]) == ""
             for e in builtin["effects"].values())
