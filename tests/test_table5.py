"""study=table5 (the paper's Table 5): SOMA and BPTT per N from a seed run of each N's width,
each optimisation seed its own, equal operations, fresh Adam for BPTT, each row's lr selected
on seed 0 and fixed, the curves read at the budget fractions, the paper's table and its
orderings beside ours."""

import os

import numpy as np
import pytest

from soma_jax.errors import UserError
from soma_jax.studies import driver, statistics, table5
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config
from tests.test_narrow import assert_own_starts, assert_runs_at, assert_selected


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
  assert (config.own_starts, grid.lr.lr_factors, grid.select_fraction) == (True, (0.5, 1, 2), 0.25)
  assert (grid.lr.lr_extend, grid.lr.eps_factors, grid.lr.eps_extend) == (0, (1.0,), 0)


def test_bad_fields_are_refused():
  config = load_config("compare", "study=table5,size=tiny")
  config.budget_fractions = (1.0, 0.5)
  with pytest.raises(UserError, match="budget_fractions"):
    driver.checked(table5.STUDY, config)[1]
  config = load_config("compare", "study=table5,size=tiny")
  config.fresh_optimizer = ()
  with pytest.raises(UserError, match="fresh Adam"):
    driver.checked(table5.STUDY, config)[1]
  for key, value in (("select_fraction", 0.0), ("select_fraction", 1.5),
                     ("select_fraction", -0.25), ("lr_factors", (1.0, 2.0)),
                     ("lr_factors", (0.5, -1.0, 2.0))):
    config = load_config("compare", "study=table5,size=tiny")
    config[key] = value
    with pytest.raises(UserError, match=f"{key}=") as e:
      driver.checked(table5.STUDY, config)
    assert "\n" not in str(e.value) and f"--config.{key}=" in str(e.value)


def test_rows_run_equal_operations_from_their_seeds(tabled):
  config, _, p = tabled
  budget = p["budget"]["amount"]
  rows = p["measured"]["rows"]
  assert set(rows) == set(config.methods)
  params = {r["params"] for r in rows.values()}
  assert max(params) - min(params) <= 0.15 * max(params)  # equal total size (tiny widths)
  for name, r in rows.items():
    for q in r["per_seed"]:
      seed = p["seed_runs"][f"seed{q['seed']}"][config.start[name]]  # its own
      last = q["curve"][-1]
      assert last["ops"] >= budget > last["ops"] - r["ops_per_update"], (name, last["ops"])
      first = 0 if r["optimizer"] == "bptt" else seed["step"]  # fresh Adam counts from 0
      assert q["curve"][0]["step"] == first, name
    assert r["optimizer_state"].startswith("fresh" if r["optimizer"] == "bptt" else "the seed")
  # each N's two rows share a seed (and so a start); different N start apart
  for n in (1, 2):
    assert rows[f"soma_n{n}"]["start_loss"] == rows[f"bptt_n{n}"]["start_loss"]


def test_each_rows_lr_is_its_grids_validation_argmin_used_by_every_seed(tabled):
  config, out, p = tabled
  centres = {n: c.opt.lr for n, c in config.methods.items()}  # each row's own lr
  assert_selected(p["selection"], out, centres, config.lr_factors, p["seeds"][0])
  rows = p["measured"]["rows"]
  for name, sel in p["selection"].items():
    assert rows[name]["lr"] == sel["lr"]
    assert_runs_at(out, [q["workdir"] for q in rows[name]["per_seed"]], sel["lr"])
    assert sel["updates"] >= 1 and all(c["workdir"].startswith(os.path.join(
        "runs", "select", name)) for c in sel["configurations"])
  assert p["tuning"]["select_fraction"] == config.select_fraction
  md = open(os.path.join(out, "table.md")).read()
  assert all(f"| {name} | " in md and f"{sel['lr']:g}" in md for name, sel in p["selection"].items())


def test_every_seed_continues_its_own_seed_runs(tabled):
  """Each optimisation seed's seed runs are its own (their folders, seeds and parameters
  differ: `assert_own_starts`, which fails where every seed shares one), and every row at
  seed s continues seed s's run of its N."""
  config, out, p = tabled
  assert p["intervals"]["kind"] == "seeds_own_starts"
  assert_own_starts(p["seed_runs"], out, p["seeds"], config.seed_run_seed)
  for name, r in p["measured"]["rows"].items():
    for q in r["per_seed"]:
      s = p["seed_runs"][f"seed{q['seed']}"][config.start[name]]
      assert q["seed_run"] == f"{s['workdir']}@{s['step']}", name
    assert len({q["seed_run"] for q in r["per_seed"]}) == len(p["seeds"]), name


def test_orderings_against_the_papers(tabled):
  _, out, p = tabled
  o, cells = p["orderings"], p["measured"]["cells"]
  last = {n: c["1.0"] for n, c in cells.items()}
  for kind in ("soma", "bptt"):
    means = {n: v[kind]["mean"] for n, v in last.items()}
    assert o[f"{kind}_over_n"]["ours"] == sorted(["1", "2"], key=means.get)  # the paper's N
    assert o[f"{kind}_over_n"]["left_out"] == []
  assert o["soma_over_n"]["paper"] == ["2", "1"] and o["bptt_over_n"]["paper"] == ["1", "2"]
  assert o["bptt_below_soma"]["ours"] == {n: v["bptt"]["mean"] < v["soma"]["mean"]
                                          for n, v in last.items()}
  md = open(os.path.join(out, "table.md")).read()
  assert "SOMA over N: N = " in md and ("Not the paper's order." in md
                                         or "The paper's order." in md)


def test_ordering_counts_the_pairs_the_paper_orders():
  got = statistics.ordering({"a": 1.0, "b": 3.0, "c": 2.0, "x": 0.0},
                            {"a": 1.76, "b": 2.00, "c": 2.00})
  assert (got["ours"], got["paper"], got["left_out"]) == (["a", "c", "b"], ["a", "b", "c"], ["x"])
  assert (got["pairs"], got["agreeing"], got["same"]) == (2, 2, True)  # b, c tie in the paper
  assert statistics.ordering({"a": 2.0, "b": 1.0}, {"a": 1.0, "b": 2.0})["agreeing"] == 0


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
  assert "2.1237 / 1.0198" in md and "| 2 |" in md
  assert p["paper"]["item"] == "Table 5"


def test_the_paper_row_reads_the_grid_edges_from_the_selection():
  """The rows at a grid's edge are read from results.json `selection` (low: the grid's least
  lr), not written by hand beside the row."""
  from soma_jax.studies import selection

  picked = lambda lr, edge: {"lr": lr, "lr_grid": [0.00125, 0.0025, 0.005], "lr_at_edge": edge}
  selected = {"a": picked(0.00125, True), "b": picked(0.0025, False), "c": picked(0.005, True)}
  assert selection.edges(selected) == "lr at its grid's edge in 2 of 3 rows: a (low), c (high)"
  assert selection.edges({"b": picked(0.0025, False)}) == "every lr inside its grid"
