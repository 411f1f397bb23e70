"""study=fig15 (the paper's Figure 15 with Tables 12 and 13): rows of about equal total size
from their own seeds at one operations budget, test loss with document-bootstrap intervals,
complete warm inference at the fastest batch, operations of min(4, N) experts per token."""

import json
import os

import numpy as np
import pytest

from soma_jax import evaluate as eval_lib
from soma_jax import inference, runs, sizing
from soma_jax import model as model_lib
from soma_jax.errors import UserError
from soma_jax.studies import driver, fig15
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config


def tiny():
  return load_config("compare", "study=fig15,size=tiny")


@pytest.fixture(scope="module")
def compared(tmp_path_factory, data_textdir):
  config = tiny()
  config.source = f"textdir:{data_textdir}"
  config.prepare.update(PREPARE)
  config.bootstrap_draws = 50
  out = str(tmp_path_factory.mktemp("fig15") / "out")
  return config, out, driver.run(fig15.STUDY, config, out, "python experiments/compare.py --test")


def test_the_cpu_rows_are_the_papers():
  rows = driver.checked(fig15.STUDY, load_config("compare", "study=fig15,size=cpu"))[1]
  assert rows.n_experts == {"mono": 1, "soma_n2": 2, "soma_n8": 8, "soma_n32": 32}
  assert rows.plan.reference == "soma_n32" and rows.methods["soma_n32"].model.shared_head
  assert [rows.methods[n].model.d_t for n in rows.n_experts] == [180, 127, 61, 32]


@pytest.mark.parametrize("field,value,match", [
    ("params_tolerance", -0.1, "params_tolerance"),
    ("params_tolerance", 0.001, "differ from soma_n6"),  # tiny's sizes are 5.2% apart
    ("inference.batches", (8, 2), "inference.batches"),
    ("inference.batches", (), "inference.batches"),
    ("inference.batches", (2, 0), "inference.batches"),
    ("inference.repeats", 0, "inference.repeats"),
    ("match_params", False, "match_params"),
    ("methods.soma_n2.n_experts", 6, "one row per N"),
])
def test_bad_fields_are_refused(field, value, match):
  config = tiny()
  *parents, key = field.split(".")
  where = config
  for p in parents:
    where = where[p]
  where[key] = value
  with pytest.raises(UserError, match=match):
    driver.checked(fig15.STUDY, config)[1]


def test_results_carry_the_papers_items_and_ours(compared):
  config, out, p = compared
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f)["measured"]["paper_rows"] == p["measured"]["paper_rows"]
  assert p["paper"]["item"] == "Figure 15, Tables 12 and 13"
  assert [r["throughput_m_tokens_per_s"] for r in p["paper"]["table12"]["rows"]] == [
      0.555, 0.468, 0.257, 2.36]
  assert [r["gpu_hours"] for r in p["paper"]["table13"]["rows"]] == ["700", "22.0k", "41.9k"]
  assert list(p["measured"]["rows"]) == ["mono", "soma_n2", "soma_n6"]  # growing N
  assert p["measured"]["paper_rows"] == {"mono": 1, "soma_n2": 2, "soma_n6": 256}  # the largest
  machine = p["measured"]["inference"]["machine"]
  assert machine["platform"] and machine["cpu_count"] >= 1
  assert len(p["measured"]["inference"]["load_average"]["start"]) == 3
  md = open(os.path.join(out, "table.md")).read()
  assert "Table 12" in md and "Table 13" in md and "0.555" in md and "41.9k GPU-h" in md
  assert os.path.getsize(os.path.join(out, "fig15.png")) > 1000


def test_rows_are_of_equal_size_and_run_one_operations_budget(compared):
  config, _, p = compared
  rows, budget = p["measured"]["rows"], p["budget"]["amount"]
  ref = rows[config.reference]["params"]
  for name, r in rows.items():
    assert abs(r["params"] - ref) <= config.params_tolerance * ref, name
    seed = p["seed_runs"][config.start[name]]
    assert seed["d_t"] == r["d_t"]  # each row continues its own width's seed
    for q in r["per_seed"]:
      assert q["curve"][0]["step"] == seed["step"]
      assert q["ops"] >= budget > q["ops"] - r["ops_per_update"], name
  assert len({r["d_t"] for r in rows.values()}) == len(rows)


def test_the_fastest_batch_is_the_argmax_of_measured_throughput(compared):
  config, _, p = compared
  for name, t in p["measured"]["inference"]["rows"].items():
    assert [b["batch"] for b in t["batches"]] == list(config.inference.batches)
    speeds = []
    for b in t["batches"]:
      assert len(b["seconds"]) == config.inference.repeats
      median = float(np.median(b["seconds"]))
      assert b["tokens_per_second"] == pytest.approx(
          b["batch"] * t["scored_tokens_per_request"] / median)
      assert b["batch_latency_ms"] == pytest.approx(1e3 * median)
      assert b["planned_peak_bytes"] > b["host_bytes"] > 0
      speeds.append(b["tokens_per_second"])
    assert t["fastest_batch"] == t["batches"][int(np.argmax(speeds))]["batch"], name
    assert t["fastest"] == t["batches"][int(np.argmax(speeds))]
    assert t["includes_routing"] == (p["measured"]["rows"][name]["n_experts"] > 1)


def test_fastest_picks_the_highest_throughput():
  rows = [{"tokens_per_second": 3.0}, {"tokens_per_second": 9.0}, {"tokens_per_second": 5.0}]
  assert inference.fastest(rows) == 1


def test_ops_per_token_count_min_4_n_experts(compared):
  config, _, p = compared
  for name, t in p["measured"]["inference"]["rows"].items():
    r = p["measured"]["rows"][name]
    m = config.methods[name].model
    one = sizing.flops_per_token(model_lib.ModelConfig(d_t=r["d_t"], d_e=m.d_e, depth=m.depth,
                                                       shared_head=r["shared_head"]))
    assert t["top_k"] == min(4, r["n_experts"])
    assert t["ops_per_token"] == min(4, r["n_experts"]) * one, name
  assert p["measured"]["inference"]["rows"]["soma_n6"]["top_k"] == 4  # the cap: 4 of 6


def test_test_loss_is_the_served_mixture_with_a_document_interval(compared):
  config, out, p = compared
  e = config.eval
  for name, r in p["measured"]["rows"].items():
    n = r["n_experts"]
    test = eval_lib.TestSet(os.path.join(out, f"data_n{n}"), e.test_windows, "test",
                            e.route_bytes, e.score_bytes)
    body, head, method = runs.restore_params(os.path.join(out, r["per_seed"][0]["workdir"]))
    model = inference.Ensemble(body, head, n, method.model.shared_head, method.logits,
                               test.router, method.flops_per_token)
    served = inference.serve(model, test.windows, e.route_bytes, 64)
    assert r["test"]["nats_per_byte"] == pytest.approx(served.mean(), abs=1e-6), name
    lo, hi = r["test"]["ci95"]
    assert lo < r["test"]["nats_per_byte"] < hi
    assert r["test"]["num_documents"] == np.unique(test.doc_ids).size
