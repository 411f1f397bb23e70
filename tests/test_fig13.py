"""study=fig13 (the paper's Figure 13 with Tables 10 and 11): allocations at one n_pert x B,
equal operations per update from one shared start, Table 10's interpolation ranges and
Table 11's paired test losses."""

import os

import numpy as np
import pytest

from soma_jax.errors import UserError
from soma_jax.studies import driver, fig13
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config


@pytest.fixture(scope="module")
def allocated(tmp_path_factory, data_textdir):
  config = load_config("compare", "study=fig13,size=tiny")
  config.source = f"textdir:{data_textdir}"
  config.prepare.update(PREPARE)
  config.bootstrap_draws = 50
  out = str(tmp_path_factory.mktemp("fig13") / "out")
  return config, out, driver.run(fig13.STUDY, config, out, "python experiments/compare.py --test")


def test_the_cpu_allocations_hold_the_product():
  config = load_config("compare", "study=fig13,size=cpu")
  alloc = driver.checked(fig13.STUDY, config)[1]
  got = [(config.methods[n].spsa.n_pert, config.methods[n].spsa.batch * config.methods[n].spsa.accum)
         for n in alloc.names]
  assert got == [(4, 64), (16, 16), (64, 4)] and alloc.n_experts == 8


def test_unequal_products_are_refused():
  config = load_config("compare", "study=fig13,size=tiny")
  config.methods[config.allocations[0]].spsa.n_pert = 3
  with pytest.raises(UserError, match="n_pert x B"):
    driver.checked(fig13.STUDY, config)[1]


def test_allocations_run_equal_operations_from_one_start(allocated):
  config, _, p = allocated
  rows = p["measured"]["allocations"]
  assert list(rows) == list(config.allocations)
  assert len({r["ops_per_update"] for r in rows.values()}) == 1
  assert len({r["start_loss"]["test"] for r in rows.values()}) == 1  # the shared checkpoint
  for r in rows.values():
    assert [q["seed"] for q in r["per_seed"]] == p["seeds"]
    for q in r["per_seed"]:
      assert q["curve"][-1]["update"] == int(config.budget)


def test_table10_ranges_hold_both_interpolations(allocated):
  _, _, p = allocated
  t10 = p["measured"]["table10"]
  for name, cells in t10["estimated"].items():
    r = p["measured"]["allocations"][name]
    x = np.mean([[pt["ops"] for pt in q["curve"]] for q in r["per_seed"]], axis=0)
    y = np.mean([[pt["loss"] for pt in q["curve"]] for q in r["per_seed"]], axis=0)
    for ops, (lo, hi) in zip(t10["ops"], cells, strict=True):
      assert lo <= float(np.interp(ops, x, y)) + 1e-12 and lo <= hi
  assert t10["ops"][-1] == pytest.approx(x[-1])
  lo, hi = t10["estimated"][name][-1]  # at a checkpoint both readings agree
  assert hi - lo < 1e-9


def test_table11_pairs_the_seeds(allocated):
  config, out, p = allocated
  t11 = p["measured"]["table11"]
  ref = config.allocations[0]
  assert t11["reference"] == ref and t11["rows"][ref]["minus_ref"]["mean"] == 0.0
  for r in t11["rows"].values():
    ref_per = t11["rows"][ref]["per_seed"]
    want = np.mean([b - a for a, b in zip(ref_per, r["per_seed"], strict=True)])
    assert r["minus_ref"]["mean"] == pytest.approx(want, abs=1e-6)
  assert os.path.getsize(os.path.join(out, "fig13.png")) > 1000
  md = open(os.path.join(out, "table.md")).read()
  assert "Table 10" in md and "Table 11" in md
