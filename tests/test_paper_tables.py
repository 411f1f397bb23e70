"""The paper's comparisons (SPEC 9): warm starts, the device-time budget, Table 7's tuning and
selection, Table 4's rows and controls, at size=tiny; the pieces they stand on."""

import json
import os

import jax
import numpy as np
import pytest

from soma_jax import evaluate as eval_lib
from soma_jax import host_devices, methods, runs
from soma_jax import train as train_lib
from soma_jax.errors import UserError
from soma_jax.studies import protocol, table4, table7
from tests.test_compare import _spec7_ops_per_update, load_config


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
    self.split, self.route, self.score = "test", inner.route, inner.score

  def losses(self, *args, **kwargs):
    self.calls += 1
    return 10.0 - self.inner.losses(*args, **kwargs)


def tiny(study: str, data_dir: str):
  config = load_config("compare", f"study={study},size=tiny")
  config.data_dir = data_dir
  config.budget_seconds = config.seed_budget_seconds = 0.25
  config.bootstrap_draws = 100
  return config


def assert_budget_met(record: dict, budget: float) -> None:
  """Stopped after the complete update that reached the budget: not before, not later."""
  assert record["device_seconds_before_last_update"] < budget <= record["device_seconds"]


@pytest.fixture(scope="module")
def table7_run(tmp_path_factory, data_two_shards):
  config = tiny("table7", data_two_shards)
  out = str(tmp_path_factory.mktemp("table7") / "out")
  val, _ = protocol.eval_sets(config, data_two_shards, [32])
  test = Reversed(val)
  payload = table7.run(config, out, "python experiments/compare.py --test", scorers=(val, test))
  return config, out, payload, test


def test_table7_selects_on_validation_only(table7_run):
  config, out, payload, test = table7_run
  assert test.calls == 2 * config.seeds  # the selected checkpoint of each architecture and seed
  base = config.base_lr
  for name, m in payload["methods"].items():
    for p in m["per_seed"]:
      tried = p["configurations"]
      assert len(tried) == 5, name  # 3 lr, then 2 new eps (the middle one reused)
      stage1 = tried[:3]
      assert [(r["lr"], r["eps"]) for r in stage1] == [(f * base, base) for f in config.lr_factors]
      lr = min(stage1, key=lambda r: r["val_nats_per_byte"])["lr"]
      stage2 = [r for r in tried if r["lr"] == lr]
      assert sorted(r["eps"] for r in stage2) == sorted(f * base for f in config.eps_factors)
      best = min(stage2, key=lambda r: r["val_nats_per_byte"])
      assert p["selected"] == {"lr": best["lr"], "eps": best["eps"],
                               "val_nats_per_byte": best["val_nats_per_byte"]}
      # The test set read the selected run's final checkpoint (10 - its validation loss);
      # had selection read the test set, it would have chosen the worst validation run.
      assert p["test_nats_per_byte"] == pytest.approx(10.0 - best["val_nats_per_byte"])
      assert p["curve"] == best["val_curve"] and p["curve_split"] == "ensemble_val"
      for r in tried:  # every configuration got the same device-time budget
        assert_budget_met(r, config.budget_seconds)
        assert [q["device_seconds"] for q in r["val_curve"]] == sorted(
            q["device_seconds"] for q in r["val_curve"])
        # A checkpoint after each quarter (one slow update may pass two marks at once).
        assert 2 <= len(r["val_curve"]) <= config.curve_points + 1
        assert r["val_curve"][-1]["device_seconds"] == r["device_seconds"]
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f) == json.loads(json.dumps(payload))
  assert "seconds" in payload["budget"] and "device-seconds" in payload["budget"]["counts"]
  assert host_devices.CHARGE_RULE in payload["budget"]["counts"]  # the rule train.py charges
  assert os.path.getsize(os.path.join(out, "table.md")) > 0


def test_table7_warm_start_identical_across_seeds(table7_run):
  config, out, payload, _ = table7_run
  methods = protocol.sized(config)
  for name, m in payload["methods"].items():
    seed = payload["seed_runs"][config.start[name]]
    assert m["start"] == f"{seed['workdir']}@{seed['updates']}"
    firsts = [p["curve"][0] for p in m["per_seed"]]
    assert all(f == firsts[0] for f in firsts) and firsts[0]["step"] == 0, name
    # The warm start is used: the start scores what the seed scored at its end.
    assert firsts[0]["loss"] == seed["ensemble_val_nats_per_byte"], name
    seed_dir = os.path.join(out, seed["workdir"])
    configs = [protocol.budgeted(methods[name], config.data_dir, s, seed_dir, 1.0, 4)
               for s in payload["seeds"]]
    starts = [runs.initial_params(c) for c in configs]
    assert leaves_equal(starts[0], starts[1]), name  # bit for bit, whatever the seed
    seed_body, seed_head, _ = runs.restore_params(seed_dir)
    for e in range(methods[name].n_experts):  # every expert copies the seed's body and E
      assert leaves_equal(expert(starts[0][0], e), expert(seed_body, 0)), name
    cold = configs[0].copy_and_resolve_references()
    cold.init_from = ""
    assert not leaves_equal(runs.initial_params(cold)[0], starts[0][0])
  r, o = payload["methods"]["soma_n2"], payload["methods"]["mono"]
  diffs = [p["minus_ref"] for p in o["per_seed"]]
  np.testing.assert_allclose(diffs, [b["test_nats_per_byte"] - a["test_nats_per_byte"]
                                     for a, b in zip(r["per_seed"], o["per_seed"], strict=True)],
                             atol=1e-9)
  assert o["ref_wins"] == sum(d > 0 for d in diffs)
  assert o["minus_ref"]["sd"] == pytest.approx(np.std(diffs, ddof=1))


@pytest.fixture(scope="module")
def table4_run(tmp_path_factory, data_two_shards):
  config = tiny("table4", data_two_shards)
  for name in ("mono_k16", "mono_k64", "bptt"):  # kept lean: one monolith, the GRU, controls
    del config.methods[name], config.rows[name], config.start[name]
  config.order = tuple(n for n in config.order if n in config.methods)
  config.eval.val_windows = 2  # not test_windows: the record must tell the two sets apart
  out = str(tmp_path_factory.mktemp("table4") / "out")
  return config, out, table4.run(config, out, "python experiments/compare.py --test")


def test_table4_rows_budget_and_starts(table4_run):
  config, out, payload = table4_run
  methods = payload["methods"]
  assert list(methods) == ["soma_n2", "mono_k4", "eggroll", "head_only", "soma_n2_summed"]
  assert "device-seconds" in payload["budget"]["counts"]
  assert host_devices.CHARGE_RULE in payload["budget"]["counts"]
  val, test = protocol.eval_sets(config, config.data_dir, [32])  # the seeds' and the rows' sets
  assert (payload["eval"]["val_windows"], payload["eval"]["test_windows"]) == (
      val.windows.shape[0], test.windows.shape[0])
  ref = methods["soma_n2"]["per_seed"]
  for name, m in methods.items():
    firsts = [p["curve"][0] for p in m["per_seed"]]
    assert all(f == firsts[0] for f in firsts), name
    for i, p in enumerate(m["per_seed"]):
      assert p["start"] == m["start"] and p["device_seconds"] > 0 and len(p["curve"]) >= 2
      assert p["ops"] == p["updates"] * m["ops_per_update"], name
      if m["method"] == "soma":  # SPEC 7 written out (the controls: below)
        assert m["ops_per_update"] == _spec7_ops_per_update(m, config.methods[name]), name
      if name in config.match_updates:  # controls: SOMA's updates on the same seed
        assert p["updates"] == ref[i]["updates"], name
      else:
        assert_budget_met(p, config.budget_seconds)
  assert methods["soma_n2_summed"]["ops_per_update"] == methods["soma_n2"]["ops_per_update"]
  assert methods["eggroll"]["start"].startswith(os.path.join("seeds", "gru"))
  assert set(payload["equal_ops"]["ranking"]) == {"soma_n2", "mono_k4", "eggroll"}
  table = open(os.path.join(out, "table.md")).read()
  assert all(f"| {name} |" in table for name in methods) and "equal operations" in table


def test_table4_head_only_bodies_do_not_change(table4_run):
  config, out, payload = table4_run
  seed_body, seed_head, _ = runs.restore_params(os.path.join(out, "seeds", "soma_expert"))
  for p in payload["methods"]["head_only"]["per_seed"]:
    body, head, _ = runs.restore_params(os.path.join(out, p["workdir"]))
    for e in range(2):
      assert leaves_equal(expert(body, e), expert(seed_body, 0))
      assert not np.array_equal(head[e], seed_head[0])  # the delta-rule heads trained
  # SOMA itself moves its bodies from the same start.
  soma = payload["methods"]["soma_n2"]["per_seed"][0]
  body, _, _ = runs.restore_params(os.path.join(out, soma["workdir"]))
  assert not leaves_equal(jax.tree.map(lambda x: x[0], body),
                          jax.tree.map(lambda x: x[0], seed_body))


# ----------------------------------------------------------------------------- pieces


def test_time_budget_stops_after_the_update_that_reaches_it(data_prepared, tmp_path, capsys):
  from tests.test_train import tiny_config

  c = tiny_config(data_prepared, steps=100_000, budget_seconds=0.3, budget_checkpoints=3,
                  log_every=50, eval_every=50, ckpt_every=100_000)
  c.ckpt.keep = 5
  w = str(tmp_path / "run")
  summary = train_lib.train(c, w)
  assert summary["status"] == "done" and summary["step"] < 100_000
  assert_budget_met({"device_seconds": summary["device_seconds"], "device_seconds_before_last_update":
                     summary["budget_seconds_before_last_update"]}, 0.3)
  marks = []
  for s in protocol.checkpoints(w):
    _, _, data_state, _ = runs.restore_state(w, step=s)
    marks.append(data_state["device_seconds"])
  assert 1 <= len(marks) <= 3 and marks[-1] >= 0.3  # one slow update may pass two marks
  progress = [line for line in capsys.readouterr().err.splitlines() if "steps/s" in line]
  assert progress and all("/0.3 device-s" in line and "/100000" not in line for line in progress)
  again = train_lib.train(c, w)  # a finished budget run resumed: nothing more to do
  assert again["step"] == summary["step"]


def test_step_compiles_once_per_run(data_prepared, tmp_path):
  """A warm-started run compiles its step at update 1 only (an uncommitted first state used to
  compile it again at update 2, inside the timed training seconds)."""
  from tests.test_train import tiny_config

  seed = str(tmp_path / "seed")
  train_lib.train(tiny_config(data_prepared, n_experts=1, steps=2, seed=7), seed)
  c = tiny_config(data_prepared, steps=4, init_from=seed, seed=4242)  # a new static config
  before = methods.METHODS['soma'].train_step._cache_size()
  train_lib.train(c, str(tmp_path / "run"))
  assert methods.METHODS['soma'].train_step._cache_size() == before + 1


def test_head_only_step_leaves_bodies_and_their_adam_state(data_prepared):
  from tests.test_train import tiny_config

  c = tiny_config(data_prepared, method="head_only")
  c.opt.weight_decay = 1e-2  # decay would move a body if it were updated
  methods.validate(c)
  method = methods.get(c)
  cfg = method.step_config(c)
  state = runs.initial_state(c, cfg)
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
  assert 2 * soma.spsa.n_pert * protocol.ops_per_update(c) == protocol.ops_per_update(soma)


def test_summed_method_and_refusals(data_prepared):
  from tests.test_train import tiny_config

  c = tiny_config(data_prepared, method="soma_summed")
  methods.validate(c)
  assert methods.get(c).step_config(c).loss_groups == (0, 0, 0)
  assert methods.get(tiny_config(data_prepared)).step_config(c).loss_groups is None
  c.experts = "0:2"
  with pytest.raises(UserError, match="one job"):
    methods.validate(c)
  g = tiny_config(data_prepared, method="head_only")
  g.model.shared_head, g.opt.train_head = True, False
  with pytest.raises(UserError, match="own head"):
    methods.validate(g)


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
    protocol.eval_sets(config, data_two_shards, [32])


def test_cpu_scale_rows_and_sizes():
  """The cpu presets: SOMA N = 2 of width 32, the monolith of the same total size, the
  monoliths on SOMA's batch with 1x / 4x / 16x its directions, every row started warm."""
  t4 = protocol.sized(load_config("compare", "study=table4,size=cpu"))
  t7 = protocol.sized(load_config("compare", "study=table7,size=cpu"))
  soma = t4["soma_n2"]
  assert (soma.n_experts, soma.model.d_t, soma.spsa.n_pert, soma.spsa.batch,
          soma.data.seq_len) == (2, 32, 4, 4, 256)
  assert list(t4) == ["soma_n2", "mono_k4", "mono_k16", "mono_k64", "eggroll", "bptt",
                      "head_only", "soma_n2_summed"]
  total = protocol.total_params(soma)
  for name, c in list(t4.items()) + list(t7.items()):
    assert abs(protocol.total_params(c) - total) <= 0.02 * total, name
    assert c.data.seq_len == 256 and c.spsa.batch == 4, name
  for k in (4, 16, 64):
    assert t4[f"mono_k{k}"].spsa.n_pert == k and t4[f"mono_k{k}"].model.d_t == 47
  assert t7["mono"].spsa.n_pert == 4 and t7["mono"].model.d_t == 47
  assert (t4["head_only"].method, t4["soma_n2_summed"].method) == ("head_only", "soma_summed")
  # EGGROLL keeps the lr and sigma of the recorded run (compare_table4_cpu.json), not the
  # eggroll.py cpu preset's (its sweep ran at population 8,192)
  assert (t4["eggroll"].opt.lr, t4["eggroll"].eggroll.sigma) == (0.01, 2**-3)


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
  train_lib.train(s, seed)
  c.init_from = seed
  body_N, head = runs.initial_params(c)
  shapes = jax.eval_shape(lambda: runs.initial_params(runs.shapes_only(c)))
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
