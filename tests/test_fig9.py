"""study=fig9 (the paper's Figure 9: ablations): semantic vs random shards, warm vs cold start
and the tied head (delta rule, the seed's head frozen and shared, a frozen random head), one
tiny study run shared by the module."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from soma_jax import evaluate as eval_lib
from soma_jax import model as model_lib
from soma_jax import runs
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.studies import driver, fig9, statistics
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config

CONDITIONS = ["soma", "random_shards", "cold", "shared_head", "random_head"]


def tiny():
  return load_config("compare", "study=fig9,size=tiny")


@pytest.fixture(scope="module")
def ablated(tmp_path_factory, data_textdir):
  config = tiny()
  config.source = f"textdir:{data_textdir}"
  config.prepare.update(PREPARE)
  out = str(tmp_path_factory.mktemp("fig9") / "out")
  return config, out, driver.run(fig9.STUDY, config, out, "python experiments/compare.py --test")


def test_the_cpu_conditions_are_table7s_soma_n2_at_width_32():
  config = load_config("compare", "study=fig9,size=cpu")
  plan, study = driver.checked(fig9.STUDY, config)
  soma_n2 = load_config("compare", "study=table7,size=cpu").methods.soma_n2
  assert config.methods.soma.to_dict() == soma_n2.to_dict()
  assert study.n_experts == 2 and len(plan.seeds) == 3
  heads = {n: (s.config.model.d_t, s.shared_head, s.train_head) for n, s in study.specs.items()}
  assert heads == {"soma": (32, False, True), "random_shards": (32, False, True),
                   "cold": (32, False, True), "shared_head": (32, True, False),
                   "random_head": (32, True, False)}
  assert plan.start["random_head"] == "random_head" and "cold" not in plan.start
  never = config.seed_runs.random_head
  assert never.model.shared_head and not never.opt.train_head
  assert list(study.panels) == ["shards", "start", "head"]


@pytest.mark.parametrize("field,value,match", [
    ("budget_unit", "ops", "same updates"),
    ("match_params", True, "same updates"),
    ("data_dir", "/somewhere", "data_dir="),
    ("cold", ("nothing",), "cold="),
    ("cold", ("soma",), "cold="),
    ("panels.shards", ("soma", "nothing"), "panels.shards"),
    ("panels.start", ("cold",), "panels.start"),
    ("row_data.random_shards", "shuffled", "row_data.random_shards"),
    ("contrasts.cold_minus_warm", ("cold", "cold"), "contrasts.cold_minus_warm"),
    ("methods.cold.model.d_t", 16, "share N"),
    ("methods.shared_head.opt.train_head", True, "methods.shared_head.opt.train_head"),
])
def test_bad_fields_are_refused(field, value, match):
  config = tiny()
  *path, last = field.split(".")
  node = config
  for part in path:
    node = node[part]
  node[last] = value
  with pytest.raises(UserError, match=match):
    driver.checked(fig9.STUDY, config)


def test_an_unknown_panel_is_refused():
  config = tiny()
  config.panels.heads = ("soma", "cold")
  with pytest.raises(UserError, match="panels.heads"):
    driver.checked(fig9.STUDY, config)


def test_a_semantic_dir_is_refused_as_the_random_shards(data_two_shards, tmp_path):
  study = dataclasses.replace(driver.checked(fig9.STUDY, tiny())[1], data_dir_random=data_two_shards)
  with pytest.raises(UserError, match="--assignment=random"):
    fig9.random_dir(study, str(tmp_path))


def test_results_rows_fields_and_figure(ablated):
  config, out, p = ablated
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f)["study"] == "fig9"
  assert p["paper"]["item"] == "Figure 9"
  assert p["paper"]["decoder_only_minus_default_nats_per_byte"] == 0.029
  assert "0.029" in p["paper"]["caption"] and "shared_head" in p["interpretation"]
  m = p["measured"]
  assert list(m["conditions"]) == CONDITIONS
  assert list(m["panels"]) == ["shards", "start", "head"]
  steps = [0, 2, 4]  # the start and each 1/curve_points of the budget (4 updates)
  for r in m["conditions"].values():
    assert [q["seed"] for q in r["per_seed"]] == p["seeds"] == [0, 1]
    assert [s["update"] for s in r["steps"]] == steps
    for i, s in enumerate(r["steps"]):
      losses = [q["curve"][i]["loss"] for q in r["per_seed"]]
      assert s["mean"] == pytest.approx(np.mean(losses))
      assert s["se"] == pytest.approx(np.std(losses, ddof=1) / np.sqrt(len(losses)))
  assert os.path.getsize(os.path.join(out, "fig9.png")) > 1000
  md = open(os.path.join(out, "table.md")).read()
  assert "+0.029" in md and all(f"| {n} |" in md for n in CONDITIONS)


def test_cold_starts_from_a_fresh_init_and_warm_from_the_seed(ablated, data_textdir):
  config, out, p = ablated
  m = p["measured"]["conditions"]
  val = eval_lib.TestSet(os.path.join(out, "data_n2"), config.eval.val_windows, "ensemble_val",
                         config.eval.route_bytes, config.eval.score_bytes)
  for q in m["cold"]["per_seed"]:
    spec = runs.read_spec(os.path.join(out, q["workdir"]))
    body, head = model_lib.init_experts(jax.random.key(q["seed"]), spec.method.model, 2)
    fresh = val.losses(body, head, 2, spec.shared_head).mean()
    assert q["start_step"] == 0 and q["start_loss"] == pytest.approx(fresh, abs=1e-9)
    assert q["curve"][-1]["step"] == config.budget
  warm = {q["start_loss"] for q in m["soma"]["per_seed"]}
  assert len(warm) == 1  # every seed continues the one seed run
  assert all(q["start_step"] == config.seed_updates for q in m["soma"]["per_seed"])
  # two copies of the seed mixed score as the seed alone, on the same windows
  seed_loss = p["seed_runs"]["soma_expert"]["ensemble_val_nats_per_byte"]
  assert warm.pop() == pytest.approx(seed_loss, abs=1e-6)


def _windows(data_dir, e):
  return np.concatenate([np.load(f"{data_dir}/experts/{e:04d}/{s}.npy") for s in ("train", "val")])


def test_random_shards_keep_the_sizes_not_the_assignment(ablated):
  _, out, p = ablated
  sem_dir, rnd_dir = os.path.join(out, "data_n2"), os.path.join(out, "data_n2_random")
  assert p["data_dirs"] == {"semantic": "data_n2", "random": "data_n2_random"}
  sem, rnd = pipeline.check_data_dir(sem_dir, 2), pipeline.check_data_dir(rnd_dir, 2)
  assert rnd["assignment"]["kind"] == "random"
  assert [s["windows"] for s in rnd["shards"]] == [s["windows"] for s in sem["shards"]]
  rows = lambda a: sorted(r.tobytes() for r in a)
  both = lambda d: rows(np.concatenate([_windows(d, 0), _windows(d, 1)]))
  assert both(sem_dir) == both(rnd_dir)  # the same windows overall ...
  assert rows(_windows(sem_dir, 0)) != rows(_windows(rnd_dir, 0))  # ... in other shards


def test_frozen_heads_stay_bit_identical_and_the_delta_rule_moves_its_own(ablated):
  config, out, p = ablated
  m, seeds = p["measured"]["conditions"], p["seed_runs"]
  head_of = lambda where: np.asarray(runs.restore_params(os.path.join(out, where))[1])
  trained = head_of(seeds["soma_expert"]["workdir"])[0]  # the seed's own E, [1, V, d_E]
  never = head_of(seeds["random_head"]["workdir"])
  spec = runs.read_spec(os.path.join(out, seeds["random_head"]["workdir"]))
  _, init = model_lib.init_experts(jax.random.key(config.seed_run_seed), spec.method.model, 1)
  np.testing.assert_array_equal(never, np.asarray(init))  # the random head was never trained
  own = dataclasses.replace(spec.method.model, shared_head=False)  # the other seed's init
  np.testing.assert_array_equal(never, model_lib.init_experts(
      jax.random.key(config.seed_run_seed), own, 1)[1][0])
  for name, start in (("shared_head", trained), ("random_head", never)):
    for q in m[name]["per_seed"]:
      assert q["head_bit_identical"] and q["head_max_abs_change"] == 0.0
      np.testing.assert_array_equal(head_of(q["workdir"]), start)
  for q in m["soma"]["per_seed"]:
    end = head_of(q["workdir"])
    assert not q["head_bit_identical"] and q["head_max_abs_change"] > 0
    assert end.shape == (2,) + trained.shape and not np.array_equal(end[0], trained)


def test_contrasts_are_per_seed_differences_against_the_better(ablated):
  _, _, p = ablated
  m = p["measured"]
  end = lambda n: [q["end_loss"] for q in m["conditions"][n]["per_seed"]]
  d = m["contrasts"]["delta_minus_shared"]
  assert (d["a"], d["b"]) == ("soma", "shared_head")
  assert d["mean"] == pytest.approx(np.mean(np.subtract(end("soma"), end("shared_head"))))
  assert d["ci95"][0] <= d["mean"] <= d["ci95"][1]
  r = m["contrasts"]["random_head_minus_best"]
  best = min(("soma", "shared_head"), key=lambda n: np.mean(end(n)))
  assert r["b"] == best
  assert r["mean"] == pytest.approx(np.mean(np.subtract(end("random_head"), end(best))))
  c = m["contrasts"]["cold_minus_warm"]
  assert c["mean"] == pytest.approx(np.mean(np.subtract(end("cold"), end("soma"))))


def test_speedups_are_spec_9_8s_on_each_seeds_curves(ablated):
  """Each contrast's per-seed log speed-up is statistics.log_speedup of the two conditions'
  saved validation curves in updates; None where the loss ranges do not meet."""
  _, out, p = ablated
  m = p["measured"]
  curve = lambda n, i: (np.array([q["update"] for q in m["conditions"][n]["per_seed"][i]["curve"]],
                                 np.float64),
                        np.array([q["loss"] for q in m["conditions"][n]["per_seed"][i]["curve"]]))
  for d in m["contrasts"].values():
    s = d["speedup"]
    assert len(s["per_seed"]) == len(p["seeds"])
    for i, got in enumerate(s["per_seed"]):
      want = statistics.log_speedup(curve(d["a"], i), curve(d["b"], i))
      assert (got is None) == (want is None)
      if got is not None:
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    if s["mean"] is not None:
      assert s["speedup"] == pytest.approx(np.exp(np.mean(s["per_seed"])))
      assert "_boot" not in s
  assert all("_windows" not in q for c in m["conditions"].values() for q in c["per_seed"])
  assert "speed-up of a over b" in open(os.path.join(out, "table.md")).read()
