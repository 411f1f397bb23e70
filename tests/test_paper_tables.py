"""The paper's comparisons (SPEC 9): warm starts, the device-time budget, Table 7's tuning and
selection, Table 4's rows and controls, at size=tiny; the pieces they stand on."""

import json
import os

import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

from soma_jax import evaluate as eval_lib
from soma_jax import runs
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.errors import UserError
from soma_jax.studies import (
  datasets,
  driver,
  planning,
  scores,
  statistics,
  table4,
  table7,
  training,
  verdict,
)
from tests.test_compare import _spec7_ops_per_update, load_config
from tests.test_decompose import assert_seed_curves
from tests.test_narrow import assert_own_starts, assert_runs_at, assert_selected


def expert(tree, e: int):
  return jax.tree.map(lambda x: x[e], tree)


def leaves_equal(a, b) -> bool:
  return all(np.array_equal(x, y) for x, y in
             zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


class Reversed:
  """A 'test set' that ranks every pair of checkpoints opposite to validation: the validation
  windows scored as 10 - loss. It counts how often it is read."""

  def __init__(self, inner: eval_lib.TestSet):
    self.inner, self.calls = inner, 0
    self.windows, self.doc_ids = inner.windows, inner.doc_ids
    self.windows_scored, self.documents_available = inner.windows_scored, inner.documents_available
    self.split, self.route, self.score = "test", inner.route, inner.score

  def losses(self, *args, **kwargs):
    self.calls += 1
    return 10.0 - self.inner.losses(*args, **kwargs)


def tiny(study: str, data_dir: str):
  config = load_config("compare", f"study={study},size=tiny")
  config.data_dir = data_dir
  config.bootstrap_draws = 100
  return config


def assert_budget_met(record: dict, budget: float) -> None:
  """Stopped after the complete update that reached the budget: not before, not later."""
  assert record["device_seconds_before_last_update"] < budget <= record["device_seconds"]


def assert_updates_exactly(record: dict, start_step: int, budget: int) -> None:
  """budget_unit=updates: this run's updates are exactly the budget, counted on from the
  seed's step, and its curve is increasing in both step and update."""
  assert record["budget_unit"] == "updates" and record["updates"] == budget
  assert record["step"] == start_step + budget
  curve = record.get("val_curve", record.get("curve"))
  assert [q["update"] for q in curve] == sorted({q["update"] for q in curve})
  assert curve[0]["step"] == start_step and curve[-1]["update"] == budget


def assert_gains(record: dict) -> None:
  """start_loss, end_loss and gain (start - end) on both splits."""
  for split in ("validation", "test"):
    assert record["gain"][split] == pytest.approx(
        record["start_loss"][split] - record["end_loss"][split], abs=1e-9)


def assert_common_fields(payload: dict, config) -> None:
  """The fields both studies record: budget unit, layout, load, seeds apart from the rows."""
  assert payload["budget"]["unit"] == "updates" and payload["budget"]["amount"] == config.budget
  assert set(payload["load_average"]) == {"start", "end"}
  assert all(len(v) == 3 for v in payload["load_average"].values())
  for name, m in payload["methods"].items():
    lay = payload["layout"][name]
    assert lay == m["layout"] and lay["devices"] >= lay["expert_devices"] * lay["pert_devices"]
    assert "FSO" in lay["why"] or "DDPP" in lay["why"] or "device" in lay["why"], lay
  for opt, s in seed_runs(payload):  # equal updates, at a seed no row uses
    assert s["updates"] == config.seed_updates and s["step"] == config.seed_updates
    assert s["seed"] == config.seed_run_seed + (opt or 0) and s["seed"] not in payload["seeds"]


def seed_runs(payload: dict) -> list[tuple[int | None, dict]]:
  """(the optimisation seed, record) of every seed run: each seed's own (own starts: results.json
  `intervals`), else the one every seed shares (None)."""
  if payload.get("intervals", {}).get("kind") != "seeds_own_starts":
    return [(None, s) for s in payload["seed_runs"].values()]
  return [(opt, s) for opt in payload["seeds"]
          for s in payload["seed_runs"][f"seed{opt}"].values()]


def seed_run(payload: dict, config, name: str, seed: int) -> dict:
  """The seed run record method `name` continues at optimisation seed `seed`."""
  own = payload["intervals"]["kind"] == "seeds_own_starts"
  return (payload["seed_runs"][f"seed{seed}"] if own else payload["seed_runs"])[config.start[name]]


@pytest.fixture(scope="module")
def table7_run(tmp_path_factory, data_two_shards):
  config = tiny("table7", data_two_shards)
  out = str(tmp_path_factory.mktemp("table7") / "out")
  val, _ = datasets.eval_sets(planning.check_plan(config).eval, data_two_shards, [32])
  test = Reversed(val)
  payload = driver.run(table7.STUDY, config, out, "python experiments/compare.py --test",
                       scorers=(val, test))
  return config, out, payload, test


def _replayed(grid: list[float], val: dict, extend: int) -> tuple[float, list[float]]:
  """One stage's selection replayed: (chosen value, grid after its extensions)."""
  best = min(grid, key=val.get)
  for _ in range(extend):
    if best not in (min(grid), max(grid)):
      break
    grid.append(min(grid) / 2 if best == min(grid) else max(grid) * 2)
    best = min(grid, key=val.get)
  return best, grid


def _expected_search(tried: list[dict], config) -> tuple[float, list[float]]:
  """The lr stage-1 selection replayed from the records: grid, extensions, chosen lr."""
  base = config.base_lr
  lrs = [f * base for f in config.lr_factors]
  assert [(r["lr"], r["eps"]) for r in tried[:len(lrs)]] == [(x, base) for x in lrs]
  val = {r["lr"]: r["val_nats_per_byte"] for r in tried if r["eps"] == base}
  return _replayed(lrs, val, config.lr_extend)


def test_table7_selects_on_validation_only(table7_run):
  config, out, payload, test = table7_run
  # The start of each architecture and seed (each seed its own: issue 54) and the selected
  # checkpoint of each architecture and seed; nothing else read the test set.
  assert config.own_starts and test.calls == 2 * config.seeds + 2 * config.seeds
  base = config.base_lr
  for name, m in payload["methods"].items():
    for p in m["per_seed"]:
      seed = seed_run(payload, config, name, p["seed"])
      tried = p["configurations"]
      lr, lrs = _expected_search(tried, config)
      stage2 = [r for r in tried if r["lr"] == lr]
      eps, epss = _replayed([f * base for f in config.eps_factors],
                            {r["eps"]: r["val_nats_per_byte"] for r in stage2}, config.eps_extend)
      assert sorted(lrs) == p["lr_grid"] and len(tried) == len(lrs) + len(epss) - 1, name
      assert p["lr_at_edge"] == (lr in (min(lrs), max(lrs)))
      assert sorted(r["eps"] for r in stage2) == sorted(epss) == p["eps_grid"]
      assert p["eps_at_edge"] == (eps in (min(epss), max(epss)))
      best = min(stage2, key=lambda r: r["val_nats_per_byte"])
      assert best["eps"] == eps
      assert p["selected"] == {"lr": best["lr"], "eps": best["eps"],
                               "val_nats_per_byte": best["val_nats_per_byte"]}
      # The test set read the selected run's final checkpoint (10 - its validation loss);
      # had selection read the test set, it would have chosen the worst validation run.
      assert p["test_nats_per_byte"] == pytest.approx(10.0 - best["val_nats_per_byte"])
      assert p["curve"] == best["val_curve"] and p["curve_split"] == "ensemble_val"
      for r in tried:  # every configuration: exactly the budget's updates, from the seed's step
        assert_updates_exactly(r, seed["step"], config.budget)
      assert p["updates"] == p["budget_used"] == config.budget
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f) == json.loads(json.dumps(payload))
  assert os.path.getsize(os.path.join(out, "table.md")) > 0


def test_table7_rows_report_gains(table7_run):
  config, out, payload, _ = table7_run
  assert_common_fields(payload, config)
  r, o = payload["methods"]["soma_n2"], payload["methods"]["mono"]
  assert r["ops_per_update"] == spec_lib.resolve(planning.sized(config)["soma_n2"]).total_ops_per_update
  for a, b in zip(r["per_seed"], o["per_seed"], strict=True):
    for q in (a, b):
      assert_gains(q)
      assert q["end_loss"]["validation"] == q["selected"]["val_nats_per_byte"]
      assert q["end_loss"]["test"] == q["test_nats_per_byte"]
      assert q["start_loss"]["validation"] == q["curve"][0]["loss"]
      assert q["start_loss"]["test"] == pytest.approx(10.0 - q["curve"][0]["loss"])  # Reversed
  g = payload["gain_difference"]["mono"]
  diffs = [a["gain"]["test"] - b["gain"]["test"] for a, b in zip(r["per_seed"], o["per_seed"])]
  assert g["mean"] == pytest.approx(np.mean(diffs)) and g["n"] == config.seeds
  half = scipy_stats.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / np.sqrt(len(diffs))
  np.testing.assert_allclose(g["ci95"], [np.mean(diffs) - half, np.mean(diffs) + half])
  for d, want in zip(g["per_seed"], diffs, strict=True):  # the bootstrap's per-window mean
    assert d["diff"] == pytest.approx(want, abs=1e-6)
    assert d["bootstrap_ci95"][0] <= d["diff"] <= d["bootstrap_ci95"][1]
  # ... equals end gap minus start gap
  for a, b, d in zip(r["per_seed"], o["per_seed"], g["per_seed"], strict=True):
    start_gap = b["start_loss"]["test"] - a["start_loss"]["test"]
    assert d["diff"] == pytest.approx(b["minus_ref"] - start_gap, abs=1e-6)
  assert_end_difference(payload, "soma_n2", "mono")
  (iv,) = table7.primary_table7(payload)  # the declared readout carries the verdict
  e = payload["end_difference"]["mono"]
  assert (iv.mean, iv.lo, iv.hi) == (e["mean"], *e["seeds_and_documents"]["ci95"])
  (iv,) = table7.primary_table7({**payload, "primary": verdict.declared(verdict.GAIN)})
  assert (iv.mean, iv.lo, iv.hi) == (g["mean"], *g["seeds_and_documents"]["ci95"])
  table = open(os.path.join(out, "table.md")).read()
  assert "**mono's test end loss minus soma_n2's" in table and "(primary: " in table
  assert "soma_n2's gain minus mono's gain" in table and "(secondary: " in table


def assert_end_difference(payload: dict, ref: str, other: str) -> None:
  """results.json's end difference of `other` (SPEC 9.8's primary, declared so): its test end
  loss minus the reference's across seeds, by hand; per seed the paired bootstrap the row's
  minus_ref records; the seeds-and-documents interval around the seeds' one."""
  assert payload["primary"] == verdict.declared(verdict.END)
  assert payload["primary"]["secondary"] == ["gain_difference"]
  a, b = payload["methods"][ref]["per_seed"], payload["methods"][other]["per_seed"]
  e = payload["end_difference"][other]
  diffs = [q["end_loss"]["test"] - p["end_loss"]["test"] for p, q in zip(a, b, strict=True)]
  half = scipy_stats.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / np.sqrt(len(diffs))
  assert e["mean"] == pytest.approx(np.mean(diffs)) and e["n"] == len(diffs)
  np.testing.assert_allclose(e["ci95"], [np.mean(diffs) - half, np.mean(diffs) + half])
  for d, q in zip(e["per_seed"], b, strict=True):
    assert d["seed"] == q["seed"] and d["bootstrap_ci95"] == q["minus_ref_ci95"]
    assert d["diff"] == pytest.approx(q["minus_ref"], abs=1e-12)
  lo, hi = e["seeds_and_documents"]["ci95"]
  assert lo <= e["ci95"][0] and e["ci95"][1] <= hi


def test_table7_continues_the_seeds_state(table7_run):
  """Every compared run starts from its seed's whole train state: parameters, Adam moments
  and count, and the step counter, bit for bit, whatever the optimisation seed; each
  optimisation seed continues its own seed run (issue 54), which results.json records with
  its curve."""
  config, out, payload, _ = table7_run
  methods = planning.sized(config)
  assert payload["intervals"]["kind"] == "seeds_own_starts"
  assert_own_starts(payload["seed_runs"], out, payload["seeds"], config.seed_run_seed)
  assert_seed_curves(payload["seed_runs"], 1)  # table7's seed runs: one checkpoint, the end
  for name, m in payload["methods"].items():
    assert m["start"] == "each seed's own (per_seed start)"
    for p in m["per_seed"]:
      seed = seed_run(payload, config, name, p["seed"])
      assert p["start"] == f"{seed['workdir']}@{seed['step']}"
      assert p["curve"][0]["step"] == seed["step"], name
      # The warm start is used: the start scores what the seed scored at its end.
      assert p["curve"][0]["loss"] == seed["ensemble_val_nats_per_byte"], name
    assert len({p["curve"][0]["loss"] for p in m["per_seed"]}) == config.seeds, name
    seed = seed_run(payload, config, name, payload["seeds"][0])
    seed_dir = os.path.join(out, seed["workdir"])
    record = {**seed, "_path": seed_dir}
    configs = [training.budgeted(methods[name], config.data_dir, s, record, "updates", 1, 1)
               for s in payload["seeds"]]
    first = [runs.initial_state(c) for c in configs]  # what the first compared update reads
    assert leaves_equal(first[0], first[1]), name  # bit for bit, whatever the seed
    step, last, _, _ = runs.restore_state(seed_dir)  # the seed's last state
    assert int(first[0].step) == int(last.step) == step == seed["step"]
    for e in range(methods[name].n_experts):  # every expert: the seed's body, E and moments
      assert leaves_equal(expert((first[0].body, first[0].opt, first[0].head_opt), e),
                          expert((last.body, last.opt, last.head_opt), 0)), name
    assert not leaves_equal(jax.tree.map(np.zeros_like, last.opt), last.opt)  # moments moved
    tuned = runs.initial_state(table7.grid_point(configs[0], 0.00125, 0.005))
    assert leaves_equal(tuned.opt, first[0].opt)  # the seed's moments, this config's lr / eps
    np.testing.assert_array_equal(tuned.sched.lr, np.float32(0.00125))
    np.testing.assert_array_equal(tuned.sched.eps, np.float32(0.005))
    fresh = configs[0].config.copy_and_resolve_references()
    fresh.init_state = False  # parameters only: fresh moments at step 0
    assert int(runs.initial_state(spec_lib.resolve(fresh)).step) == 0


@pytest.fixture(scope="module")
def table4_run(tmp_path_factory, data_two_shards):
  config = tiny("table4", data_two_shards)
  for name in ("mono_k16", "mono_k64", "bptt"):  # kept lean: one monolith, the GRU, controls
    del config.methods[name], config.rows[name], config.start[name]
  config.order = tuple(n for n in config.order if n in config.methods)
  config.fresh_optimizer = tuple(n for n in config.fresh_optimizer if n in config.methods)
  config.eval.val_windows = 2  # not test_windows: the record must tell the two sets apart
  out = str(tmp_path_factory.mktemp("table4") / "out")
  return config, out, driver.run(table4.STUDY, config, out, "python experiments/compare.py --test")


def test_table4_rows_budget_and_starts(table4_run):
  config, out, payload = table4_run
  methods = payload["methods"]
  assert list(methods) == ["soma_n2", "mono_k4", "eggroll", "head_only", "soma_n2_summed"]
  assert_common_fields(payload, config)
  val, test = datasets.eval_sets(planning.check_plan(config).eval, config.data_dir, [32])  # the seeds' and the rows'
  assert (payload["eval"]["val_windows"], payload["eval"]["test_windows"]) == (
      val.windows.shape[0], test.windows.shape[0])
  for name, m in methods.items():
    assert len({p["start"] for p in m["per_seed"]}) == len(payload["seeds"]), name  # own starts
    for p in m["per_seed"]:
      seed = payload["seed_runs"][f"seed{p['seed']}"][config.start[name]]  # its seed's own
      assert p["start"] == f"{seed['workdir']}@{seed['step']}" and len(p["curve"]) >= 2
      assert p["ops"] == p["updates"] * m["ops_per_update"], name
      assert p["curve"][-1]["ops"] == p["ops"], name
      if m["method"] == "soma":  # SPEC 7 written out (the controls: below)
        assert m["ops_per_update"] == _spec7_ops_per_update(m, config.methods[name]), name
      # Budget rows and controls (SOMA's updates) alike: exactly the budget's updates.
      assert_updates_exactly(p, seed["step"], config.budget)
      assert_gains(p)
      assert p["start_loss"]["test"] == p["curve"][0]["loss"]
    assert m["start_loss"]["test"] == pytest.approx(np.mean(
        [p["start_loss"]["test"] for p in m["per_seed"]]))  # the seeds' mean
    if name != "soma_n2":
      g = payload["gain_difference"][name]
      diffs = [a["gain"]["test"] - b["gain"]["test"]
               for a, b in zip(methods["soma_n2"]["per_seed"], m["per_seed"], strict=True)]
      assert g["mean"] == pytest.approx(np.mean(diffs)) and len(g["ci95"]) == 2
      assert_end_difference(payload, "soma_n2", name)
  assert set(payload["gain_difference"]) == set(methods) - {"soma_n2"}
  assert set(payload["end_difference"]) == set(methods) - {"soma_n2"}
  assert methods["soma_n2_summed"]["ops_per_update"] == methods["soma_n2"]["ops_per_update"]
  assert methods["eggroll"]["start"].startswith(os.path.join("seeds", "seed0", "gru"))
  assert set(payload["equal_ops"]["ranking"]) == {"soma_n2", "mono_k4", "eggroll"}
  table = open(os.path.join(out, "table.md")).read()
  assert all(f"| {name} |" in table for name in methods) and "equal operations" in table


def test_table4_head_only_bodies_do_not_change(table4_run):
  config, out, payload = table4_run
  for p in payload["methods"]["head_only"]["per_seed"]:  # each from its own seed's seed run
    seed_body, seed_head, _ = runs.restore_params(
        os.path.join(out, "seeds", f"seed{p['seed']}", "soma_expert"))
    body, head, _ = runs.restore_params(os.path.join(out, p["workdir"]))
    for e in range(2):
      assert leaves_equal(expert(body, e), expert(seed_body, 0))
      assert not np.array_equal(head[e], seed_head[0])  # the delta-rule heads trained
  # SOMA itself moves its bodies from the same start.
  soma = payload["methods"]["soma_n2"]["per_seed"][-1]
  body, _, _ = runs.restore_params(os.path.join(out, soma["workdir"]))
  assert not leaves_equal(jax.tree.map(lambda x: x[0], body),
                          jax.tree.map(lambda x: x[0], seed_body))


def test_table4_each_rows_lr_is_its_grids_validation_argmin_used_by_every_seed(table4_run):
  """Every row (SOMA, the monolith, EGGROLL and the controls alike) on its own grid around
  its config's lr, on seed 0, on validation; every seed at the selected lr; a control's grid
  at the updates of the reference's selected run."""
  config, out, payload = table4_run
  sel, methods = payload["selection"], payload["methods"]
  assert set(sel) == set(methods)
  assert_selected(sel, out, {n: c.opt.lr for n, c in config.methods.items()},
                  config.lr_factors, payload["seeds"][0])
  for name, m in methods.items():
    assert m["lr"] == sel[name]["lr"]
    assert_runs_at(out, [p["workdir"] for p in m["per_seed"]], sel[name]["lr"])
  for control in config.match_updates:
    assert sel[control]["updates"] == sel["soma_n2"]["updates"]
  assert sel["soma_n2"]["updates"] == 1  # select_fraction of the 3-update budget: one update
  assert payload["intervals"]["kind"] == "seeds_own_starts"
  assert_own_starts(payload["seed_runs"], out, payload["seeds"], config.seed_run_seed)
  o = payload["ordering"]
  ends = {n: m["test_nats_per_byte"]["mean"] for n, m in methods.items()}
  assert o["ours"] == sorted(["soma_n2", "mono_k4", "eggroll"], key=ends.get)
  assert o["paper"] == ["soma_n2", "mono_k4", "eggroll"] and o["pairs"] == 3
  assert o["soma_below_monoliths"] == {"mono_k4": ends["soma_n2"] < ends["mono_k4"]}
  table = open(os.path.join(out, "table.md")).read()
  assert "Against the paper's Table 4" in table and "soma_n2 1.76" in table
  assert all(f"| {name} | " in table for name in sel)


def test_table4_lr_fields_refused():
  for key, value in (("select_fraction", 0.0), ("select_fraction", 2.0),
                     ("lr_factors", (2.0, 4.0)), ("eps_factors", (2.0,))):
    config = load_config("compare", "study=table4,size=tiny")
    config[key] = value
    with pytest.raises(UserError, match=f"--config.{key}=") as e:
      driver.checked(table4.STUDY, config)
    assert "\n" not in str(e.value)
  config = load_config("compare", "study=table4,size=cpu")
  assert (config.own_starts, config.lr_factors, config.select_fraction) == (True, (0.5, 1, 2), 0.25)


@pytest.mark.parametrize("study", [table7.STUDY, table4.STUDY])
def test_primary_readout_declared_in_the_config(study):
  """SPEC 9.8: the config declares the primary readout, the end difference by default; a
  readout the study does not record is refused before anything trains."""
  config = load_config("compare", f"study={study.name},size=cpu")
  assert config.primary == verdict.END
  assert driver.checked(study, config)[1].primary == verdict.END
  config.primary = "speedup"
  with pytest.raises(UserError, match="--config.primary="):
    driver.checked(study, config)


def _specs(cfgs: dict) -> dict:
  return {name: spec_lib.resolve(c) for name, c in cfgs.items()}


def test_study_plans_refused(data_two_shards):
  """The seed run's seed may not be an optimisation seed; an update budget needs equal
  operations per update (Table 7's pair); the lr grid must be able to show an edge."""
  config = tiny("table7", data_two_shards)
  assert planning.check_plan(config).unit == "updates"
  config.seed_run_seed = config.first_seed + 1
  with pytest.raises(UserError, match="seed_run_seed"):
    planning.check_plan(config)
  config = tiny("table7", data_two_shards)
  config.budget = 2.5
  with pytest.raises(UserError, match="whole number"):
    planning.check_plan(config)
  config = tiny("table7", data_two_shards)
  config.budget_unit = "seconds"
  with pytest.raises(UserError, match="budget_unit"):
    planning.check_plan(config)
  config = tiny("table7", data_two_shards)
  cfgs = planning.sized(config)
  tol = config.ops_tolerance
  assert planning.check_equal_ops(_specs(cfgs), tol, "updates")  # the equal-size pair passes
  cfgs["mono"].spsa.n_pert *= 2  # twice the directions: twice the operations per update
  with pytest.raises(UserError, match="operations per update"):
    planning.check_equal_ops(_specs(cfgs), tol, "updates")
  planning.check_equal_ops(_specs(cfgs), tol, "cpu_seconds")  # a time budget: printed, not refused
  config.lr_factors = (1.0, 2.0)
  with pytest.raises(UserError, match="lr_factors"):
    table7.check_grid(config)


def test_lr_grid_extends_past_an_edge_and_t_intervals():
  assert table7.extended([1.0, 2.0, 4.0], 1.0) == 0.5
  assert table7.extended([1.0, 2.0, 4.0], 4.0) == 8.0
  assert table7.extended([1.0, 2.0, 4.0], 2.0) is None
  t = statistics.t_interval([1.0, 2.0, 3.0])  # sd 1, t(0.975, 2) = 4.303
  assert t["mean"] == 2.0 and t["sd"] == 1.0
  np.testing.assert_allclose(t["ci95"], [2.0 - 4.302653 / np.sqrt(3), 2.0 + 4.302653 / np.sqrt(3)],
                             rtol=1e-6)
  assert statistics.t_interval([1.5])["ci95"] is None


# ----------------------------------------------------------------------------- pieces


def test_time_budget_stops_after_the_update_that_reaches_it(data_prepared, tmp_path, capsys):
  from tests.test_train import tiny_config

  c = tiny_config(data_prepared, steps=100_000, budget=0.3, budget_checkpoints=3,
                  log_every=50, eval_every=50, ckpt_every=100_000)
  c.ckpt.keep = 5
  w = str(tmp_path / "run")
  summary = train_lib.run(c, w)
  assert summary["status"] == "done" and summary["step"] < 100_000
  assert_budget_met({"device_seconds": summary["device_seconds"], "device_seconds_before_last_update":
                     summary["budget_before_last_update"]}, 0.3)
  marks = []
  for s in scores.checkpoints(w):
    _, _, data_state, _ = runs.restore_state(w, step=s)
    marks.append(data_state["device_seconds"])
  assert 1 <= len(marks) <= 3 and marks[-1] >= 0.3  # one slow update may pass two marks
  progress = [line for line in capsys.readouterr().err.splitlines() if "steps/s" in line]
  assert progress and all("/0.3 device-s" in line and "/100000" not in line for line in progress)
  again = train_lib.run(c, w)  # a finished budget run resumed: nothing more to do
  assert again["step"] == summary["step"]


def test_step_compiles_once_per_run(data_prepared, tmp_path):
  """A warm-started run compiles its step at update 1 only (an uncommitted first state used to
  compile it again at update 2, inside the timed training seconds)."""
  from tests.test_train import tiny_config

  seed = str(tmp_path / "seed")
  train_lib.run(tiny_config(data_prepared, n_experts=1, steps=2, seed=7), seed)
  c = tiny_config(data_prepared, steps=4, init_from=seed, seed=4242)
  c.spsa.batch = 3  # a shape no other test trains: a new program
  before = spec_lib.resolve(c).method.train_step._cache_size()
  train_lib.run(c, str(tmp_path / "run"))
  assert spec_lib.resolve(c).method.train_step._cache_size() == before + 1


def test_head_only_step_leaves_bodies_and_their_adam_state(data_prepared):
  from tests.test_train import tiny_config

  c = tiny_config(data_prepared, method="head_only")
  c.opt.weight_decay = 1e-2  # decay would move a body if it were updated
  method = spec_lib.resolve(c).method
  cfg = method.step_config()
  state = runs.initial_state(spec_lib.resolve(c))
  batch = jax.random.randint(jax.random.key(0), (3, 1, c.spsa.batch, c.data.seq_len + 1), 0,
                             256).astype(np.uint8)
  before = jax.tree.map(np.asarray, state)
  new, m = method.train_step(state, batch, np.arange(3), cfg=cfg)
  assert leaves_equal((new.body, new.opt), (before.body, before.opt))
  assert not np.array_equal(new.head, before.head) and np.all(np.isfinite(m["loss"]))
  # The same loss as SOMA's expert validation at those weights, one forward pass of ops.
  np.testing.assert_allclose(m["loss"], [float(np.mean([np.asarray(
      method.val_loss(expert(before.body, e), before.head[e], batch[e, 0]))])) for e in range(3)],
      rtol=1e-5)
  soma = tiny_config(data_prepared)
  assert 2 * soma.spsa.n_pert * spec_lib.resolve(c).total_ops_per_update == spec_lib.resolve(soma).total_ops_per_update


def test_summed_method_and_refusals(data_prepared):
  from tests.test_train import tiny_config

  c = tiny_config(data_prepared, method="soma_summed")
  spec_lib.resolve(c)
  assert spec_lib.resolve(c).method.step_config().loss_groups == (0, 0, 0)
  assert spec_lib.resolve(tiny_config(data_prepared)).method.step_config().loss_groups is None
  c.experts = "0:2"
  with pytest.raises(UserError, match="one job"):
    spec_lib.resolve(c)
  g = tiny_config(data_prepared, method="head_only")
  g.model.shared_head, g.opt.train_head = True, False
  with pytest.raises(UserError, match="own head"):
    spec_lib.resolve(g)


def test_cut_windows():
  w = np.arange(2 * 1025, dtype=np.int64).reshape(2, 1025).astype(np.uint8)
  pieces, docs = eval_lib.cut_windows(w, np.array([5, 9]), 64, 192)
  assert pieces.shape == (8, 257) and docs.tolist() == [5] * 4 + [9] * 4
  for i in range(4):  # consecutive pieces, neighbours sharing one byte
    np.testing.assert_array_equal(pieces[i], w[0, 256 * i:256 * i + 257])
  same, _ = eval_lib.cut_windows(w, np.array([5, 9]), 256, 768)  # the paper's span
  np.testing.assert_array_equal(same, w)
  with pytest.raises(UserError, match="route"):
    eval_lib.cut_windows(w, np.array([5, 9]), 0, 192)


def test_span_must_lie_inside_the_trained_context(data_two_shards):
  config = tiny("table7", data_two_shards)
  config.eval.score_bytes = 32  # 8 + 32 > T = 32
  with pytest.raises(UserError, match="trained context"):
    planning.check_plan(config)
  span = planning.EvalSpan(route=8, score=32, val_windows=4, test_windows=4)
  with pytest.raises(UserError, match="trained context"):
    datasets.eval_sets(span, data_two_shards, [32])


def test_cpu_scale_rows_and_sizes():
  """The cpu presets: SOMA N = 2 of width 32, the monolith of the same total size, the
  monoliths on SOMA's batch with 1x / 4x / 16x its directions, every row started warm."""
  t4 = planning.sized(load_config("compare", "study=table4,size=cpu"))
  t7 = planning.sized(load_config("compare", "study=table7,size=cpu"))
  soma = t4["soma_n2"]
  assert (soma.n_experts, soma.model.d_t, soma.spsa.n_pert, soma.spsa.batch,
          soma.data.seq_len) == (2, 32, 4, 4, 256)
  assert list(t4) == ["soma_n2", "mono_k4", "mono_k16", "mono_k64", "eggroll", "bptt",
                      "head_only", "soma_n2_summed"]
  total = spec_lib.resolve(soma).method.ensemble_params
  for name, c in list(t4.items()) + list(t7.items()):
    assert abs(spec_lib.resolve(c).method.ensemble_params - total) <= 0.02 * total, name
    assert c.data.seq_len == 256 and c.spsa.batch == 4, name
  for k in (4, 16, 64):
    assert t4[f"mono_k{k}"].spsa.n_pert == k and t4[f"mono_k{k}"].model.d_t == 47
  assert t7["mono"].spsa.n_pert == 4 and t7["mono"].model.d_t == 47
  assert (t4["head_only"].method, t4["soma_n2_summed"].method) == ("head_only", "soma_summed")
  # EGGROLL keeps the lr and sigma of the recorded run (compare_table4_cpu.json), not the
  # eggroll.py cpu preset's (its sweep ran at population 8,192)
  assert (t4["eggroll"].opt.lr, t4["eggroll"].eggroll.sigma) == (0.01, 2**-3)
  # SPEC 9.6: Table 7 in updates (its pair within 2% in operations per update), Table 4 in
  # operations (process CPU time moved by 12.8% under load: docs/results/budget_load.json);
  # 1,000-update seeds at a seed no row uses; 5 seeds; the lr grid 0.25x .. 4x the preset lr.
  c4, c7 = load_config("compare", "study=table4,size=cpu"), load_config("compare", "study=table7,size=cpu")
  assert planning.check_plan(c7).unit == "updates" and c7.budget == 1000
  assert planning.check_equal_ops(_specs(t7), c7.ops_tolerance, "updates")
  assert planning.check_plan(c4).unit == "ops" and c4.budget == 1.6e12
  for c in (c4, c7):
    assert c.seeds == 5 and c.seed_updates == 1000
    assert c.seed_run_seed not in planning.check_plan(c).seeds
  assert [f * c7.base_lr for f in c7.lr_factors] == [0.000625, 0.00125, 0.0025, 0.005, 0.01]


def test_seed_accepts_any_width():
  assert load_config("seed", "size=paper,width=509").model.d_t == 509
  assert load_config("seed", "size=paper").model.d_t == 32
  with pytest.raises(UserError, match="width"):
    load_config("seed", "size=paper,width=-1")


@pytest.mark.slow
@pytest.mark.parametrize("file,arg", [("soma", "n=1"), ("soma", "n=2"), ("soma", "n=8"),
                                      ("soma", "n=256"), ("soma", "mono=256"), ("bptt", "n=1"),
                                      ("eggroll", "n=1")])
def test_init_from_works_for_every_paper_preset(file, arg, data_prepared, tmp_path):
  """Each size=paper preset warm-starts from a seed of its own width (one SPSA or ES update
  on tiny batches at the preset's model size): every expert's body is the seed's."""
  c = load_config(file, f"{arg},size=paper")
  s = load_config("eggroll", "n=1,size=paper") if file == "eggroll" else load_config(
      "seed", f"size=paper,width={c.model.d_t}")
  s.data.dir = data_prepared
  s.spsa.update(n_pert=2, batch=1, pert_chunk=2)
  s.eggroll.update(pop=4, pop_chunk=4)
  s.data.update(seq_len=32, val_windows=1)
  s.update(steps=1, ensemble_eval_every=-1)
  seed = str(tmp_path / "seed")
  train_lib.run(s, seed)
  c.init_from = seed
  body_N, head = runs.initial_params(spec_lib.resolve(c))
  shapes = jax.eval_shape(lambda: runs.initial_params(spec_lib.resolve(c).without_seed()))
  assert jax.tree.map(lambda x: x.shape, (body_N, head)) == jax.tree.map(lambda x: x.shape, shapes)
  seed_body, _, _ = runs.restore_params(seed)
  assert leaves_equal(jax.tree.map(lambda x: x[-1], body_N), jax.tree.map(lambda x: x[0], seed_body))


def test_equal_ops_reads_every_curve_at_the_smallest_final_ops():
  """Each row's curve is interpolated linearly in operations at the smallest final operation
  count of any row and seed (150 here, seed 0 of row b), then averaged over seeds."""
  curve = lambda ops, loss: [{"ops": o, "loss": x} for o, x in zip(ops, loss, strict=True)]
  payload = {"methods": {
      "a": {"per_seed": [{"curve": curve([0, 100, 200], [3.0, 2.0, 1.0])},
                         {"curve": curve([0, 100, 300], [3.0, 2.5, 1.0])}]},
      "b": {"per_seed": [{"curve": curve([0, 50, 150], [3.0, 2.8, 2.6])},
                         {"curve": curve([0, 160], [3.0, 2.0])}]}}}
  eq = table4.equal_ops(payload, ["b", "a"])
  assert eq["ops"] == 150 and eq["ranking"] == ["a", "b"]
  assert eq["test_nats_per_byte"]["a"]["mean"] == pytest.approx((1.5 + 2.125) / 2)
  assert eq["test_nats_per_byte"]["b"]["mean"] == pytest.approx((2.6 + 3.0 - 150 / 160) / 2)


def test_grid_spread_reads_each_stage_of_every_search(table7_run):
  """scripts/grid_spread.py: the lr stage's spread over the lr grid at the base eps, the eps
  stage's over the eps grid at the selected lr, recomputed here from the records."""
  from scripts import grid_spread

  config, _, payload, _ = table7_run
  got = grid_spread.grid_spread(payload)
  base = config.base_lr
  for name, m in payload["methods"].items():
    for p, s in zip(m["per_seed"], got["searches"][name], strict=True):
      lr_vals = {r["lr"]: r["val_nats_per_byte"] for r in p["configurations"] if r["eps"] == base}
      eps_vals = [r["val_nats_per_byte"] for r in p["configurations"]
                  if r["lr"] == p["selected"]["lr"]]
      assert s["lr_stage_points"] == len(p["lr_grid"]) == len(lr_vals)
      assert s["lr_stage_spread"] == max(lr_vals.values()) - min(lr_vals.values())
      assert s["eps_stage_points"] == len(p["eps_grid"])
      assert s["eps_stage_spread"] == max(eps_vals) - min(eps_vals)
  every = [s["eps_stage_spread"] for ss in got["searches"].values() for s in ss]
  assert got["eps_stage_spread"] == {"min": min(every), "max": max(every), "searches": len(every)}
  with pytest.raises(UserError, match="tuning"):
    grid_spread.grid_spread({"study": "table4"})
