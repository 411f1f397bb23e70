"""study=table6 (the paper's Table 6): cells checked, every cell trained at equal updates from
its seed, the per-seed selection on validation, the paper's values beside ours."""

import json
import os

import ml_collections
import numpy as np
import pytest

from soma_jax.errors import UserError
from soma_jax.studies import driver, table6
from tests.test_compare import load_config

CELLS = ((0.5, 1.0), (1.0, 1.0), (0.5, 2.0))  # three of the paper's five, to stay tiny


@pytest.fixture(scope="module")
def tabled(tmp_path_factory, data_two_shards):
  config = load_config("compare", "study=table6,size=tiny")
  config.data_dir, config.cells, config.bootstrap_draws = data_two_shards, CELLS, 50
  out = str(tmp_path_factory.mktemp("table6") / "out")
  return config, out, driver.run(table6.STUDY, config, out, "python experiments/compare.py --test")


def test_the_cpu_config_holds_the_papers_five_cells():
  config = load_config("compare", "study=table6,size=cpu")
  cells = table6.check_cells(config)
  assert [(round(lr, 6), round(eps, 6)) for lr, eps in cells.settings()] == [
      (c["lr"], c["eps"]) for c in table6.PAPER["cells"]]
  assert config.seeds == table6.PAPER["seeds"] and config.budget_unit == "updates"
  assert "lr_factors" not in config  # no search: the cells are the table


@pytest.mark.parametrize("cells", [(), ((0.5, 1.0), (0.5, 1.0)), ((0.5, -1.0),), ((1.0,),),
                                   "lr"])
def test_bad_cells_are_refused(cells):
  config = ml_collections.ConfigDict({"cells": cells, "base_lr": 0.0025})
  with pytest.raises(UserError, match="cells="):
    table6.check_cells(config)


def test_every_cell_trains_the_budget_from_its_seed(tabled):
  config, _, p = tabled
  m = p["measured"]
  assert [(r["lr_factor"], r["eps_factor"]) for r in m["cells"]] == list(CELLS)
  names = list(config.order)
  assert set(p["architectures"]) == set(names) and p["other"] == "mono"
  for r in m["cells"]:
    assert r["lr"] == pytest.approx(r["lr_factor"] * config.base_lr)
    assert r["eps"] == pytest.approx(r["eps_factor"] * config.base_lr)
    for n in names:
      assert r["updates"][n] == [int(config.budget)] * config.seeds
      v = r["validation"][n]
      assert len(v["per_seed"]) == config.seeds
      assert v["mean"] == pytest.approx(np.mean(v["per_seed"]))
      assert v["sd"] == pytest.approx(np.std(v["per_seed"], ddof=1))
    diffs = [b - a for a, b in zip(r["validation"]["soma_n2"]["per_seed"],
                                   r["validation"]["mono"]["per_seed"], strict=True)]
    assert r["other_minus_ref"]["mean"] == pytest.approx(np.mean(diffs))
  # the cells differ in lr and eps only: not every cell ends at the same loss
  ends = {r["validation"]["mono"]["per_seed"][0] for r in m["cells"]}
  assert len(ends) == len(CELLS)


def test_selection_is_the_lowest_validation_cell_per_seed(tabled):
  config, _, p = tabled
  m = p["measured"]
  for n, chosen in m["selected"].items():
    assert [q["seed"] for q in chosen] == p["seeds"]
    for i, q in enumerate(chosen):
      vals = [r["validation"][n]["per_seed"][i] for r in m["cells"]]
      assert q["cell"] == int(np.argmin(vals)) and q["val_nats_per_byte"] == min(vals)
      assert (q["lr"], q["eps"]) == (m["cells"][q["cell"]]["lr"], m["cells"][q["cell"]]["eps"])
      start = p["architectures"][n]["start_loss"]["test"]
      assert q["test_gain"] == pytest.approx(start - q["test_nats_per_byte"])
  d = m["selected_test_other_minus_ref"]
  want = [b["test_nats_per_byte"] - a["test_nats_per_byte"]
          for a, b in zip(m["selected"]["soma_n2"], m["selected"]["mono"], strict=True)]
  assert [x["diff"] for x in d["per_seed"]] == pytest.approx(want, abs=1e-6)
  assert d["ci95"][0] <= d["mean"] <= d["ci95"][1]


def test_results_carry_the_papers_table_beside_ours(tabled):
  _, out, p = tabled
  assert p["paper"]["item"] == "Table 6" and len(p["paper"]["cells"]) == 5
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f)["study"] == "table6"
  md = open(os.path.join(out, "table.md")).read()
  assert "2.2768 ± 0.0040 | 2.2370 ± 0.0034" in md  # the paper's lr 0.00125 / eps 0.0025 row
  assert md.count("\n| 0.") >= len(CELLS)
  assert p["cost"]["runs"] == 2 + len(p["architectures"]) * len(CELLS) * len(p["seeds"])
