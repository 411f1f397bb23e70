"""study=table5 (the paper's Table 5): SOMA and BPTT per N from one seed each, equal operations,
fresh Adam for BPTT, the curves read at the budget fractions, the paper's table beside ours."""

import os

import numpy as np
import pytest

from soma_jax.errors import UserError
from soma_jax.studies import driver, table5
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config


@pytest.fixture(scope="module")
def tabled(tmp_path_factory, data_textdir):
  config = load_config("compare", "study=table5,size=tiny")
  config.source = f"textdir:{data_textdir}"
  config.prepare.update(PREPARE)
  out = str(tmp_path_factory.mktemp("table5") / "out")
  return config, out, driver.run(table5.STUDY, config, out, "python experiments/compare.py --test")


def test_the_cpu_rows_are_the_papers():
  config = load_config("compare", "study=table5,size=cpu")
  grid = driver.checked(table5.STUDY, config)[1]
  assert sorted(grid.rows.values()) == [(1, "bptt"), (1, "soma"), (2, "bptt"), (2, "soma"),
                                        (8, "bptt"), (8, "soma")]
  assert grid.fractions == (0.5, 0.75, 1.0)


def test_bad_fields_are_refused():
  config = load_config("compare", "study=table5,size=tiny")
  config.budget_fractions = (1.0, 0.5)
  with pytest.raises(UserError, match="budget_fractions"):
    driver.checked(table5.STUDY, config)[1]
  config = load_config("compare", "study=table5,size=tiny")
  config.fresh_optimizer = ()
  with pytest.raises(UserError, match="fresh Adam"):
    driver.checked(table5.STUDY, config)[1]


def test_rows_run_equal_operations_from_their_seeds(tabled):
  config, _, p = tabled
  budget = p["budget"]["amount"]
  rows = p["measured"]["rows"]
  assert set(rows) == set(config.methods)
  params = {r["params"] for r in rows.values()}
  assert max(params) - min(params) <= 0.15 * max(params)  # equal total size (tiny widths)
  for name, r in rows.items():
    seed = p["seed_runs"][config.start[name]]
    for q in r["per_seed"]:
      last = q["curve"][-1]
      assert last["ops"] >= budget > last["ops"] - r["ops_per_update"], (name, last["ops"])
      first = 0 if r["optimizer"] == "bptt" else seed["step"]  # fresh Adam counts from 0
      assert q["curve"][0]["step"] == first, name
    assert r["optimizer_state"].startswith("fresh" if r["optimizer"] == "bptt" else "the seed")
  # each N's two rows share a seed (and so a start); different N start apart
  for n in (1, 2, 3):
    assert rows[f"soma_n{n}"]["start_loss"] == rows[f"bptt_n{n}"]["start_loss"]


def test_cells_interpolate_each_curve_at_the_fractions(tabled):
  config, _, p = tabled
  m, budget = p["measured"], p["budget"]["amount"]
  for n, cells in m["cells"].items():
    for f, cell in cells.items():
      assert cell["ops"] == pytest.approx(float(f) * budget)
      for kind in ("soma", "bptt"):
        per = m["rows"][f"{kind}_n{n}"]["per_seed"]
        want = [np.interp(float(f) * budget, [x["ops"] for x in q["curve"]],
                          [x["loss"] for x in q["curve"]]) for q in per]
        assert cell[kind]["mean"] == pytest.approx(np.mean(want))
      assert cell["bptt_minus_soma"]["mean"] == pytest.approx(
          cell["bptt"]["mean"] - cell["soma"]["mean"])


def test_table_carries_the_papers_values(tabled):
  _, out, p = tabled
  md = open(os.path.join(out, "table.md")).read()
  assert "2.1237 / 1.0198" in md and "| 3 |" in md
  assert p["paper"]["item"] == "Table 5"
