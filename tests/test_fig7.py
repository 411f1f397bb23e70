"""study=fig7 (the paper's Figures 7 and 8): the panels' settings, one seed run continued by
every setting, each N on its own data dir with the same held-out windows, the readouts."""

import json
import os

import numpy as np
import pytest

from soma_jax.errors import UserError
from soma_jax.studies import datasets, driver, fig7
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config


@pytest.fixture(scope="module")
def swept(tmp_path_factory, data_textdir):
  config = load_config("compare", "study=fig7,size=tiny")
  config.source = f"textdir:{data_textdir}"
  config.prepare.update(PREPARE)
  config.seeds = 1
  out = str(tmp_path_factory.mktemp("fig7") / "out")
  return config, out, driver.run(fig7.STUDY, config, out, "python experiments/compare.py --test")


def test_the_cpu_panels_are_the_papers_at_this_scale():
  config = load_config("compare", "study=fig7,size=cpu")
  sweep = driver.checked(fig7.STUDY, config)[1]
  values = {p: [fig7.check_setting(config.methods[n], p) for n in names]
            for p, names in sweep.panels.items()}
  assert values == {"experts": [1, 2, 8, 32], "n_pert": [1, 4, 16, 64], "batch": [1, 4, 16, 64]}
  for name in sweep.panels["batch"][2:]:  # the two largest by accumulating batches of 4
    assert config.methods[name].spsa.batch == 4 and config.methods[name].spsa.accum in (4, 16)
  widths = {c.model.d_t for c in config.methods.values()}
  assert widths == {32}  # fixed-width experts


def test_bad_panels_are_refused():
  config = load_config("compare", "study=fig7,size=tiny")
  config.panels.experts = ("n2", "n1")  # not growing along the panel
  with pytest.raises(UserError, match="must grow"):
    driver.checked(fig7.STUDY, config)[1]
  config = load_config("compare", "study=fig7,size=tiny")
  config.panels.n_pert = ("n2", "nope")
  with pytest.raises(UserError, match="panels.n_pert"):
    driver.checked(fig7.STUDY, config)[1]
  config = load_config("compare", "study=fig7,size=tiny")
  config.match_params = True
  with pytest.raises(UserError, match="match_params"):
    driver.checked(fig7.STUDY, config)[1]


def test_every_setting_continues_the_seed_on_its_own_shards(swept):
  config, out, p = swept
  m = p["measured"]
  assert set(m["settings"]) == set(config.methods)
  seed_step = p["seed_runs"]["soma_expert"]["step"]
  for name, s in m["settings"].items():
    c = config.methods[name]
    assert s["n_experts"] == c.n_experts and s["effective_batch"] == c.spsa.batch * c.spsa.accum
    for q in s["per_seed"]:
      assert q["curve"][0]["step"] == seed_step  # the seed's state, continued
      assert q["curve"][-1]["update"] == int(config.budget)
      assert len(q["curve"]) == config.curve_points + 1
      times = [pt["update_seconds"] for pt in q["curve"]]
      assert times == sorted(times) and times[-1] > 0
  assert sorted(int(n) for n in p["data_dirs"]) == [1, 2, 4]
  for n, d in p["data_dirs"].items():
    with open(os.path.join(out, d, "manifest.json")) as f:
      assert json.load(f)["num_clusters"] == int(n)
  # more directions cost more per update: the sweep is not at equal cost
  ops = {n: m["settings"][n]["ops_per_update"] for n in config.panels.n_pert}
  assert list(ops.values()) == sorted(ops.values())


def test_panels_read_the_end_losses_in_order(swept):
  config, _, p = swept
  for panel, r in p["measured"]["panels"].items():
    assert r["methods"] == list(config.panels[panel])
    ends = [p["measured"]["settings"][n]["end_loss"]["mean"] for n in r["methods"]]
    assert r["end_loss"] == ends
    assert r["falls_monotonically"] == bool(np.all(np.diff(ends) < 0))
  f8 = p["measured"]["figure8"]
  for i, n in enumerate(f8["lowest"]):
    assert f8["loss"][n][i] == min(v[i] for v in f8["loss"].values())


def test_figures_and_table_written(swept):
  _, out, p = swept
  for name in ("fig7.png", "fig8.png"):
    assert os.path.getsize(os.path.join(out, name)) > 1000
  md = open(os.path.join(out, "table.md")).read()
  assert "**experts** (n_experts)" in md and "**batch**" in md
  assert p["paper"]["item"] == "Figures 7, 8 and 14"
  assert os.path.getsize(os.path.join(out, "fig14.png")) > 1000


def test_figure14_picks_the_lowest_checkpoint_that_fits_both_budgets(swept):
  _, _, p = swept
  f14 = p["measured"]["figure14"]
  pts = f14["checkpoints"]
  assert {q["n_experts"] for q in pts} == {1, 2, 4}
  for q in pts:
    assert q["per_expert"] == pytest.approx(q["total"] / q["n_experts"])
  for i, share in enumerate(f14["per_expert_device_seconds"]):
    for j, total in enumerate(f14["total_device_seconds"]):
      fits = [q for q in pts if q["total"] <= total * (1 + 1e-9)
              and q["per_expert"] <= share * (1 + 1e-9)]
      if not fits:
        assert f14["lowest_n"][i][j] is None
        continue
      best = min(fits, key=lambda q: q["loss"])
      assert (f14["lowest_n"][i][j], f14["loss"][i][j]) == (best["n_experts"], best["loss"])
  assert f14["lowest_n"][-1][-1] is not None  # the largest budgets fit every checkpoint


def test_other_held_out_windows_are_refused():
  class Set:
    def __init__(self, w):
      self.windows = np.asarray(w)
  with pytest.raises(UserError, match="other ensemble-validation windows"):
    datasets.same_windows({1: (Set([[1, 2]]), None), 2: (Set([[1, 3]]), None)})
  datasets.same_windows({1: (Set([[1, 2]]), None), 2: (Set([[1, 2]]), None)})
