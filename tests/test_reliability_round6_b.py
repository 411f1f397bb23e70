"""Issue 55 (round 6), items 3, 4, 7, 8, 9, 11, 12, 13, 15, 17 and the notes beside them: a
table that changes on rerun, a moved study folder, fixes that name other entry points' flags,
mixed budget units, unchecked numbers and files, folder names that clash."""

import json
import os
import sys

import numpy as np
import pytest

from soma_jax.data import prepare
from soma_jax.errors import UserError
from tests.test_compare import ROOT
from tests.test_robustness import cli, one_error_line

# ----------------------------------------------------------------------------- item 9


@pytest.mark.parametrize("flag,value", [("seed", -1), ("seed", 2**32), ("assignment_seed", -1),
                                        ("assignment_seed", 2**40)])
def test_prepare_seeds_out_of_range_refused(flag, value, data_textdir, tmp_path):
  """Item 9: a negative (or too large) seed is one UserError naming the flag, before any
  reading; numpy's traceback before."""
  with pytest.raises(UserError, match=f"--{flag}={value}"):
    prepare.prepare(f"textdir:{data_textdir}", 2, str(tmp_path / "d"), **{flag: value})
  assert not os.path.exists(tmp_path / "d")


def test_prepare_negative_seed_on_the_command_line(data_textdir, tmp_path):
  """Item 9: `prepare_data.py --seed=-1` is one line, exit 2."""
  proc = cli([sys.executable, "experiments/prepare_data.py", f"--source=textdir:{data_textdir}",
              "--num_clusters=2", f"--out={tmp_path / 'd'}", "--seed=-1"])
  one_error_line(proc, "--seed=-1")


# ----------------------------------------------------------------------------- item 11


def test_fig16_mark_k_beyond_the_smallest_ensemble_refused():
  """Item 11: mark_k = 100 was clamped to N and the sentence still said "k = 4 captures
  most"; now refused, naming the range 1..N of the smallest ensemble."""
  from soma_jax.studies import fig16
  from tests.test_fig16 import load_config

  config = load_config("compare", "study=fig16,size=tiny")
  smallest = min(config.methods[n].n_experts for n in config.ensembles)
  config.mark_k = smallest + 1
  with pytest.raises(UserError, match=rf"mark_k={smallest + 1}.*1\.\.{smallest}"):
    fig16.check(config)
  config.mark_k = smallest
  assert fig16.check(config).mark_k == smallest


def test_fig16_sentence_names_the_mark_it_measured():
  """Item 11: the closing sentence's k is the study's mark, not the paper's 4."""
  from soma_jax.studies import fig16

  path = os.path.join(ROOT, "docs", "results", "fig16_cpu.json")
  with open(path) as f:
    p = json.load(f)
  for r in p["measured"]["ensembles"].values():
    r["mark_k"] = 2
  p["measured"]["mark_k"] = 2
  assert "k = 2 captures most" in fig16.table(p)


# ----------------------------------------------------------------------------- item 15


def test_a_million_seeds_refused_in_a_short_line(data_two_shards, tmp_path):
  """Item 15: seeds=1000000 was refused with a 7.9 MB line listing every seed; now the
  count is capped (protocol.MAX_SEEDS) and the message names the count, not the seeds."""
  from soma_jax.studies import compare, protocol
  from tests.test_reliability_studies import tiny

  config = tiny("table7", data_two_shards)
  config.seeds = 1_000_000
  with pytest.raises(UserError) as e:
    compare.run(config, str(tmp_path / "out"))
  assert "seeds=1000000" in str(e.value) and len(str(e.value)) < 500
  # a seed_run_seed among many seeds names their range, not each one
  config.seeds, config.seed_run_seed = protocol.MAX_SEEDS, 7
  with pytest.raises(UserError) as e:
    compare.run(config, str(tmp_path / "out2"))
  assert f"0..{protocol.MAX_SEEDS - 1}" in str(e.value) and len(str(e.value)) < 500


def test_every_error_line_is_capped(tmp_path):
  """Item 15, the class: whatever a UserError holds, the printed line is at most
  errors.MAX_MESSAGE characters and says how many were cut."""
  from soma_jax import errors

  line = errors.shortened("x" * 10_000_000)
  assert len(line) < errors.MAX_MESSAGE + 100 and "9,998,000 more characters cut" in line
  proc = cli([sys.executable, "experiments/compare.py",
              "--config=experiments/configs/compare.py:study=table7,size=tiny",
              f"--out={tmp_path / 'o'}", "--config.seeds=1000000"])
  one_error_line(proc, "seeds=1000000")
  assert len(proc.stderr) < 5000


# ----------------------------------------------------------------------------- item 13


def test_cells_that_differ_past_six_digits_get_their_own_folders():
  """Item 13: lr factors 1.0 and 1.0000001 shared the folder lr1x_eps1x (:g); names are now
  exact (`protocol.exact`) where :g is not, and unchanged where it is (old folders resume)."""
  from soma_jax.studies import protocol, table6

  a, b = (1.0, 1.0), (1.0000001, 1.0)
  assert table6.cell_name(a) != table6.cell_name(b)
  assert table6.cell_name(a) == "lr1x_eps1x" and table6.cell_name((0.5, 2.0)) == "lr0.5x_eps2x"
  for x in (1.0000001, 0.1 + 0.2, 1e-7 * 3.0000001, 0.0025, 12345678.9):
    assert float(protocol.exact(x)) == x
  names = {protocol.exact(1 + k * 1e-12) for k in range(50)}
  assert len(names) == 50


def test_two_runs_of_a_stage_in_one_folder_refused_before_training(tmp_path):
  """Item 13, the class: a stage whose runs would share a folder is refused before any of
  them trains (it failed after training, with a fix that led to the same clash)."""
  from soma_jax.studies import protocol

  w = str(tmp_path / "runs" / "x")
  with pytest.raises(UserError, match="share the folder"):
    protocol.train_all([(None, w, "a"), (None, w, "b")])
  assert not os.path.exists(w)


# ----------------------------------------------------------------------------- notes: NaN


def test_a_nan_validation_loss_is_never_the_best_cell():
  """Note: np.argmin chose a NaN cell; the best finite cell is chosen, all-NaN refused."""
  from soma_jax.studies import table6

  assert table6.best_cell([float("nan"), 2.5, 2.4, float("inf")], "soma", 0) == 2
  with pytest.raises(UserError, match="non-finite"):
    table6.best_cell([float("nan"), float("nan")], "soma", 0)


def test_results_json_holds_no_bare_nan(tmp_path):
  """Note: the tiny ladder's results.json held bare NaN (not JSON); every study's
  results.json is written through protocol.dump_json: non-finite numbers as null."""
  from soma_jax.studies import protocol

  payload = {"study": "x", "rho": float("nan"), "r": [np.float32("inf"), 1.0],
             "n": np.int64(3), "a": np.array([np.nan, 2.0])}
  protocol.write(str(tmp_path), payload, lambda p: "table\n")

  def refuse(name):
    raise ValueError(f"bare {name} in results.json")

  with open(tmp_path / "results.json") as f:
    got = json.load(f, parse_constant=refuse)
  assert got == {"study": "x", "rho": None, "r": [None, 1.0], "n": 3, "a": [None, 2.0]}
  assert not os.path.exists(tmp_path / "results.json.tmp")


# ----------------------------------------------------------------------------- notes: study.json


def test_a_refused_config_leaves_no_study_json(data_two_shards, tmp_path):
  """Note: a refused config left OUT/study.json, so another study was refused that --out;
  now the mark goes with the refusal, and another study may claim the folder."""
  from soma_jax.studies import compare
  from tests.test_reliability_studies import tiny

  out = str(tmp_path / "out")
  config = tiny("table7", data_two_shards)
  config.budget = -1.0
  with pytest.raises(UserError, match="budget"):
    compare.run(config, out)
  assert not os.path.exists(os.path.join(out, compare.STUDY_FILE))
  compare.claim_out("table4", out)  # no longer "holds study 'table7'"


def test_a_study_with_runs_keeps_its_mark(tmp_path):
  """Note: once a run began under OUT, its study.json stays (it guards those runs)."""
  from soma_jax.studies import compare

  out = str(tmp_path / "out")
  assert compare.claim_out("table7", out)
  os.makedirs(os.path.join(out, "seeds", "soma"))
  with open(os.path.join(out, "seeds", "soma", "config.json"), "w") as f:
    f.write("{}")
  compare.release_out(out)
  with pytest.raises(UserError, match="holds study 'table7'"):
    compare.claim_out("table4", out)
