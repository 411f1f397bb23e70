"""study=table3 (the paper's Table 3): one checkpoint's compute by each accounting convention,
from Figure 7's largest N and one expert alone; read from a finished fig7 folder or trained
here, the same rows either way; the arithmetic checked on made-up summaries."""

import json
import os
import shutil

import pytest

from soma_jax.errors import UserError
from soma_jax.studies import driver, table3
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config


def tiny(data_textdir, seeds=2):
  config = load_config("compare", "study=table3,size=tiny")
  config.source = f"textdir:{data_textdir}"
  config.prepare.update(PREPARE)
  config.seeds = seeds
  return config


@pytest.fixture(scope="module")
def accounted(tmp_path_factory, data_textdir):
  """table3 training its sweep, then table3 reading that sweep's folder."""
  root = tmp_path_factory.mktemp("table3")
  trained, read = str(root / "trained"), str(root / "read")
  p_trained = driver.run(table3.STUDY, tiny(data_textdir), trained, "test")
  config = tiny(data_textdir)
  config.runs_from = os.path.join(trained, "fig7")
  return trained, read, p_trained, driver.run(table3.STUDY, config, read, "test"), config


def test_the_cpu_pair_is_figure7s_largest_n_and_one_expert():
  config = load_config("compare", "study=table3,size=cpu")
  study = driver.checked(table3.STUDY, config)[1]
  assert (study.solo, study.ensemble) == ("n1", "n32")
  assert {n: config.methods[n].n_experts for n in config.methods} == {"n1": 1, "n32": 32}
  assert config.methods.n1.model.d_t == config.methods.n32.model.d_t == 32
  assert study.sweep_config.study == "fig7" and "runs_from" not in study.sweep_config


def test_every_row_is_accounted_from_the_runs(accounted):
  trained, _, p, _, config = accounted
  m = p["measured"]
  assert m["n_experts"] == 4 and [s["seed"] for s in m["per_seed"]] == [0, 1]
  assert p["runs_from"] == "" and p["fig7_folder"] == "fig7"
  for s in m["per_seed"]:
    ens, solo = (json.load(open(os.path.join(trained, "fig7", w, "summary.json")))
                 for w in s["workdirs"])
    assert s["updates"] == ens["updates"] == int(config.budget)
    d = s["device_seconds"]
    assert d["recorded"] == ens["device_seconds"]
    units = ens["device_seconds"] / ens["update_seconds"]
    assert d["fixed_solo_rate"] == pytest.approx(
        4 * ens["updates"] * solo["update_seconds"] / solo["updates"] * units, rel=1e-12)
    # the training call's wall holds every update, so the physical total is never below
    assert d["physical"] >= d["recorded"]
    assert s["ratio_to_recorded"]["recorded"] == 1.0
  assert set(m["rows"]) == {"recorded", "physical", "fixed_solo_rate"}
  assert m["rows"]["physical"]["paper_ratio_to_recorded"] == pytest.approx(49.6 / 41.9)
  text = open(os.path.join(trained, "table.md")).read()
  assert "fixed_normalization" in text and "not reproduced" in text
  assert os.path.isfile(os.path.join(trained, "fig7", "results.json"))


def test_reading_a_finished_sweep_gives_the_rows_training_gives(accounted):
  _, read, p_trained, p_read, _ = accounted
  assert not os.path.isdir(os.path.join(read, "fig7"))  # nothing trained
  assert p_read["measured"] == p_trained["measured"]
  assert p_read["cost"]["runs"] == 0


def test_account_arithmetic():
  ens = {"updates": 10, "device_seconds": 8.0, "update_seconds": 4.0, "ops": 5,
         "compile_seconds": 1.0}
  solo = {"updates": 20, "update_seconds": 1.0}
  r = table3.account(ens, solo, wall=5.0, n_experts=3)
  assert r["devices_charged"] == 2.0
  assert r["device_seconds"] == {"recorded": 8.0, "physical": 10.0,
                                 "fixed_solo_rate": 3 * 10 * 0.05 * 2.0}
  assert r["ratio_to_recorded"]["physical"] == 1.25
  assert r["per_expert_step_seconds"] == {"in_the_ensemble_step": 4.0 / 30, "alone": 0.05}
  assert r["physical_minus_recorded"] == 2.0


def test_bad_fields_and_folders_are_refused(accounted, tmp_path, data_textdir):
  trained, *_ = accounted
  with pytest.raises(UserError, match="study=table3,size=huge"):
    load_config("compare", "study=table3,size=huge")
  config = tiny(data_textdir)
  config.solo, config.ensemble = "n4", "n1"
  with pytest.raises(UserError, match="one expert"):
    driver.checked(table3.STUDY, config)[1]
  config = tiny(data_textdir)
  config.ensemble = "n9"
  with pytest.raises(UserError, match="ensemble="):
    driver.checked(table3.STUDY, config)[1]
  config = tiny(data_textdir)
  config.runs_from = str(tmp_path / "nowhere")
  with pytest.raises(UserError, match="not a folder"):
    driver.run(table3.STUDY, config, str(tmp_path / "a"))
  config.runs_from = trained  # table3's own folder, not a fig7
  with pytest.raises(UserError, match="not fig7"):
    driver.run(table3.STUDY, config, str(tmp_path / "b"))
  other = tiny(data_textdir, seeds=1)  # fig7 ran seeds [0, 1]
  other.runs_from = os.path.join(trained, "fig7")
  with pytest.raises(UserError, match="seeds"):
    driver.run(table3.STUDY, other, str(tmp_path / "c"))
  copy = str(tmp_path / "copy")
  shutil.copytree(os.path.join(trained, "fig7"), copy)
  os.remove(os.path.join(copy, "runs", "seed1", "n4", "summary.json"))
  config.runs_from = copy
  with pytest.raises(UserError, match="runs/seed1/n4/summary.json is missing"):
    driver.run(table3.STUDY, config, str(tmp_path / "d"))
  config = tiny(data_textdir)
  config.methods.n4.spsa.n_pert *= 2
  with pytest.raises(UserError, match="differ in n_pert"):
    driver.checked(table3.STUDY, config)[1]
