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
  from soma_jax.studies import driver, fig16
  from tests.test_fig16 import load_config

  config = load_config("compare", "study=fig16,size=tiny")
  smallest = min(config.methods[n].n_experts for n in config.ensembles)
  config.mark_k = smallest + 1
  with pytest.raises(UserError, match=rf"mark_k={smallest + 1}.*1\.\.{smallest}"):
    driver.checked(fig16.STUDY, config)[1]
  config.mark_k = smallest
  assert driver.checked(fig16.STUDY, config)[1].mark_k == smallest


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
  count is capped (planning.MAX_SEEDS) and the message names the count, not the seeds."""
  from soma_jax.studies import compare, planning
  from tests.test_reliability_studies import tiny

  config = tiny("table7", data_two_shards)
  config.seeds = 1_000_000
  with pytest.raises(UserError) as e:
    compare.run(config, str(tmp_path / "out"))
  assert "seeds=1000000" in str(e.value) and len(str(e.value)) < 500
  # a seed_run_seed among many seeds names their range, not each one
  config.seeds, config.seed_run_seed = planning.MAX_SEEDS, 7
  with pytest.raises(UserError) as e:
    compare.run(config, str(tmp_path / "out2"))
  assert f"0..{planning.MAX_SEEDS - 1}" in str(e.value) and len(str(e.value)) < 500


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
  exact (`planning.exact`) where :g is not, and unchanged where it is (old folders resume)."""
  from soma_jax.studies import planning, table6

  a, b = (1.0, 1.0), (1.0000001, 1.0)
  assert table6.cell_name(a) != table6.cell_name(b)
  assert table6.cell_name(a) == "lr1x_eps1x" and table6.cell_name((0.5, 2.0)) == "lr0.5x_eps2x"
  for x in (1.0000001, 0.1 + 0.2, 1e-7 * 3.0000001, 0.0025, 12345678.9):
    assert float(planning.exact(x)) == x
  names = {planning.exact(1 + k * 1e-12) for k in range(50)}
  assert len(names) == 50


def test_two_runs_of_a_stage_in_one_folder_refused_before_training(tmp_path):
  """Item 13, the class: a stage whose runs would share a folder is refused before any of
  them trains (it failed after training, with a fix that led to the same clash)."""
  from soma_jax.studies import training

  w = str(tmp_path / "runs" / "x")
  with pytest.raises(UserError, match="share the folder"):
    training.train_all([(None, w, "a"), (None, w, "b")])
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
  results.json is written through results.dump_json: non-finite numbers as null."""
  from soma_jax.studies import results

  payload = {"study": "x", "rho": float("nan"), "r": [np.float32("inf"), 1.0],
             "n": np.int64(3), "a": np.array([np.nan, 2.0])}
  results.write(str(tmp_path), payload, lambda p: "table\n")

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


# ----------------------------------------------------------------------------- a trained run


def _another_run(workdir: str, dest: str) -> str:
  """A copy of `workdir` that is another run: its own first start (run_id), no scores."""
  import shutil

  from soma_jax import checkpoint as ckpt_lib

  shutil.copytree(workdir, dest, ignore=shutil.ignore_patterns("checkpoint_scores"))
  path = os.path.join(dest, ckpt_lib.HISTORY_FILE)
  with open(path) as f:
    lines = [json.loads(line) for line in f if line.strip()]
  lines[0]["run_id"] = "another-run"
  with open(path, "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in lines))
  return dest


def test_score_files_copied_from_another_run_are_not_read(scored_run, tmp_path, monkeypatch):
  """Note: score files copied from another run were used unchecked; STEP.json names the run
  that wrote it (checkpoint.run_id), another run's are restored and scored instead. A whole
  run copied or moved keeps its own."""
  import shutil

  from soma_jax import checkpoint_scores as scores_lib
  from soma_jax.studies import scores
  from tests.test_checkpoint_scores import count_restores

  spec, workdir, val = scored_run
  assert scores_lib.read(workdir, 6, val.settings()) is not None
  other = _another_run(workdir, str(tmp_path / "other"))
  shutil.copytree(os.path.join(workdir, scores_lib.FOLDER), os.path.join(other, scores_lib.FOLDER))
  assert scores_lib.read(other, 6, val.settings()) is None
  assert scores_lib.counters(other, 6) is None
  calls = count_restores(monkeypatch)
  scores.final_losses(other, spec, val)
  assert len(calls) == 1  # restored, not read
  whole = shutil.copytree(workdir, str(tmp_path / "moved"))
  assert scores_lib.read(whole, 6, val.settings()) is not None


@pytest.mark.parametrize("value", ["x", None, [1], float("nan")])
def test_a_tampered_counter_falls_back_to_the_checkpoint(scored_run, tmp_path, value):
  """Item 17: a string in a checkpoint-scores counter gave a traceback (float('x')); such a
  file is not read, and the checkpoint's own counters are restored."""
  import shutil

  from soma_jax import checkpoint_scores as scores_lib
  from soma_jax.studies import scores

  spec, workdir, val = scored_run
  w = shutil.copytree(workdir, str(tmp_path / "w"))
  path = os.path.join(w, scores_lib.FOLDER, "6.json")
  with open(path) as f:
    meta = json.load(f)
  meta["counters"]["cpu_seconds"] = value
  with open(path, "w") as f:
    json.dump(meta, f)
  assert scores_lib.counters(w, 6) is None and scores_lib.read(w, 6, val.settings()) is None
  assert scores.summary(w, spec, 0) == scores.summary(workdir, spec, 0)


def test_a_truncated_summary_is_no_traceback(scored_run, tmp_path):
  """Item 17: a truncated summary.json of a run is read as none (results.read_summary)."""
  import shutil

  from soma_jax.studies import results, scores

  spec, workdir, _ = scored_run
  w = shutil.copytree(workdir, str(tmp_path / "w"))
  with open(os.path.join(w, "summary.json"), "r+") as f:
    f.truncate(10)
  assert results.read_summary(w) is None
  assert scores.summary(w, spec, 0)["budget_before_last_update"] is None


def test_table3_runs_from_with_a_truncated_summary_is_one_line(scored_run, tmp_path):
  """Item 17: a truncated summary.json in a runs_from folder gave a traceback; now one
  UserError naming the file, with a fix in compare.py's options."""
  import shutil

  from soma_jax.config import load_config_file
  from soma_jax.studies import driver, table3
  from tests.test_reliability_studies import CONFIG

  config = load_config_file(CONFIG, "study=table3,size=tiny")
  study = driver.checked(table3.STUDY, config)[1]
  folder = tmp_path / "fig7"
  settings = {}
  for name in (study.solo, study.ensemble):
    w = f"runs/{name}"
    shutil.copytree(scored_run[1], folder / w)
    settings[name] = {**study.shapes[name],
                      "per_seed": [{"seed": s, "workdir": w} for s in study.sweep.plan.seeds]}
  results = {"study": "fig7", "budget": {"amount": study.sweep.plan.budget},
             "measured": {"settings": settings}}
  (folder / "results.json").write_text(json.dumps(results))
  assert table3.sweep_in(study, str(folder))["study"] == "fig7"  # whole: accepted
  with open(folder / f"runs/{study.ensemble}" / "summary.json", "r+") as f:
    f.truncate(15)
  with pytest.raises(UserError, match="summary.json is missing, unreadable") as e:
    table3.sweep_in(study, str(folder))
  assert "--config.runs_from=" in str(e.value)


# ----------------------------------------------------------------------------- item 12


def test_cost_counts_only_the_studys_runs(scored_run, tmp_path):
  """Item 12: results.json `cost` summed every summary.json under --out, another study's or
  a user's runs included; now only the runs the study trained or found finished
  (results.own, through train_all)."""
  import shutil

  from soma_jax.studies import results

  _, workdir, _ = scored_run
  out = tmp_path / "out"
  mine = str(shutil.copytree(workdir, out / "runs" / "seed0" / "mine"))
  shutil.copytree(workdir, out / "elsewhere" / "not_mine")  # under --out, not the study's
  outside = results.started()
  results.own(str(tmp_path / "before"))  # an earlier study's run in this process
  begun = results.started()
  results.own(mine)
  results.own(mine)  # a run resumed twice is one run
  cost = results.cost(str(out), begun)
  with open(os.path.join(workdir, "summary.json")) as f:
    done = json.load(f)
  assert cost["runs"] == 1
  assert cost["update_seconds"] == pytest.approx(done["update_seconds"])
  assert results.cost(str(out), outside)["runs"] == 1  # "before" has no summary


# ----------------------------------------------------------------------------- item 3


def test_clock_physical_seconds_count_from_the_call_and_add_to_the_restored():
  """Item 3: physical_seconds is a run counter: this call's wall seconds from its start
  (`called`) times the units charged, plus what earlier calls recorded."""
  import time

  from soma_jax import budget as budget_lib

  clock = budget_lib.Clock(1, 7, {"physical_seconds": 5.0}, called=time.perf_counter() - 2.0)
  got = clock.totals(0)["physical_seconds"]
  assert 5.0 + 2.0 * clock.units <= got < 5.0 + 3.0 * clock.units
  assert "physical_seconds" in budget_lib.TIMERS
  assert "physical_seconds" not in budget_lib.TRAINING_TIMERS


def test_physical_total_is_the_runs_own_and_survives_reruns(data_two_shards, tmp_path):
  """Item 3: Table 3's physical row took the last call's wall time (a rerun of a finished
  study turned 7.53 into 0.81); now the run records what its calls took (summary.json
  physical_seconds, carried in its checkpoints), a resumed run adds its own call to the
  checkpoint's, a rerun of a finished run changes nothing, and the row reads that."""
  import time

  from soma_jax import config as config_lib
  from soma_jax import runs
  from soma_jax import train as train_lib
  from soma_jax.studies import results, table3, training

  c = config_lib.base_config(n=2, size="tiny")
  w = str(tmp_path / "run")
  train_lib.train_to_end(training.budgeted(c, data_two_shards, 0, None, "updates", 4, 2), w,
                         "first call")
  first = float(runs.restore_state(w)[2]["physical_seconds"])
  assert first > 0
  spec = training.budgeted(c, data_two_shards, 0, None, "updates", 6, 2)
  t0 = time.perf_counter()
  train_lib.train_to_end(spec, w, "the resume")  # as after a kill: on from step 4
  second = time.perf_counter() - t0
  done = results.read_summary(w)
  units = done["device_seconds"] / done["update_seconds"]
  assert first < done["physical_seconds"] <= first + second * units + 1e-6
  train_lib.train_to_end(spec, w, "a rerun")  # finished: nothing to do
  assert results.read_summary(w) == done
  rows = table3.account(done, done, 0.001, 2)  # whatever this call's wall was
  assert rows["device_seconds"]["physical"] == done["physical_seconds"]
  old = {k: v for k, v in done.items() if k != "physical_seconds"}  # a run from before
  assert table3.account(old, old, 3.0, 2)["device_seconds"]["physical"] == 3.0 * units


# ----------------------------------------------------------------------------- items 4 and 7


@pytest.fixture(scope="module")
def study_folder(tmp_path_factory, data_two_shards):
  """A study-shaped folder: OUT/data (a copy of the data), OUT/seeds/s (2 updates) and
  OUT/runs/seed0/r continuing it (2 updates), both finished."""
  import shutil

  from soma_jax import config as config_lib
  from soma_jax.studies import jobs, training

  out = tmp_path_factory.mktemp("study") / "out"
  data = str(shutil.copytree(data_two_shards, out / "data"))
  c = config_lib.base_config(n=2, size="tiny")
  seed = str(out / "seeds" / "s")
  jobs.train(training.budgeted(c, data, 5, None, "updates", 2, 1), seed, "seed")
  run = str(out / "runs" / "seed0" / "r")
  jobs.train(training.budgeted(c, data, 0, {"_path": seed}, "updates", 2, 1), run, "row")
  return str(out), c


def _row(out: str, c):
  from soma_jax.studies import training

  data = os.path.join(out, "data")
  return training.budgeted(c, data, 0, {"_path": os.path.join(out, "seeds", "s")}, "updates",
                           2, 1)


def test_a_moved_study_folder_reruns(study_folder, tmp_path):
  """Item 4: a study folder moved whole was refused for a changed init_from (and data.dir),
  with the fix "delete that folder"; paths that moved with the folder are the same run."""
  import shutil

  from soma_jax.studies import jobs, results

  out, c = study_folder
  moved = str(shutil.copytree(out, tmp_path / "elsewhere" / "renamed"))
  spec, run = _row(moved, c), os.path.join(moved, "runs", "seed0", "r")
  jobs.check_existing(run, spec)
  before = results.read_summary(run)
  jobs.train(spec, run, "the moved row")  # finished: read, not retrained
  assert results.read_summary(run) == before


def test_moved_along_without_a_recorded_place():
  """Item 4: runs from before config_history.jsonl recorded their folder are recognised by
  the paths' common tail below a head that holds the workdir now."""
  from soma_jax import checkpoint as ckpt_lib

  w = "/new/study2/runs/seed0/r"
  assert ckpt_lib.moved_along("/old/study/seeds/s", "/new/study2/seeds/s", w)
  assert ckpt_lib.moved_along("/old/study/data", "/new/study2/data", w)
  assert not ckpt_lib.moved_along("/old/study/seeds/s", "/new/study2/seeds/t", w)
  assert not ckpt_lib.moved_along("/old/study/seeds/s", "/other/place/seeds/s", w)


def test_another_seed_is_still_refused_without_delete_advice(study_folder, tmp_path):
  """Item 4: a real change (another seed run) is still refused, and no fix advises deleting
  the finished run."""
  import shutil

  from soma_jax.studies import jobs, training

  out, c = study_folder
  moved = str(shutil.copytree(out, tmp_path / "m"))
  shutil.copytree(os.path.join(moved, "seeds", "s"), os.path.join(moved, "seeds", "other"))
  spec = training.budgeted(c, os.path.join(moved, "data"), 0,
                           {"_path": os.path.join(moved, "seeds", "other")}, "updates", 2, 1)
  with pytest.raises(UserError, match="init_from") as e:
    jobs.check_existing(os.path.join(moved, "runs", "seed0", "r"), spec)
  assert "delete" not in str(e.value) and "--out" in str(e.value)


def test_data_re_prepared_in_place_names_compare_options(study_folder, tmp_path):
  """Item 7: data re-prepared in place: the fix named train.py's --workdir and
  --config.resume_overrides, which compare.py rejects; now compare.py's options."""
  import shutil

  from soma_jax.studies import jobs

  out, c = study_folder
  moved = str(shutil.copytree(out, tmp_path / "m"))
  with open(os.path.join(moved, "data", "manifest.json"), "a") as f:
    f.write(" ")
  with pytest.raises(UserError, match="re-prepared") as e:
    jobs.check_existing(os.path.join(moved, "runs", "seed0", "r"), _row(moved, c))
  message = str(e.value)
  assert "--config.data_dir=" in message and "--out" in message
  for foreign in ("--workdir", "resume_overrides", "delete"):
    assert foreign not in message


def test_study_data_refusals_name_compare_options(data_two_shards, tmp_path):
  """Item 7, the note: a data dir of another N said "re-run prepare_data.py with
  --num_clusters=3 or set n=3", a bad corpus named prepare_data's --source; a study's
  refusal names its own --config fields."""
  from soma_jax.studies import datasets

  with pytest.raises(UserError) as e:
    datasets.ensure_data(data_two_shards, str(tmp_path), 3)
  assert "set n=" not in str(e.value) and "--config.data_dir=" in str(e.value)
  with pytest.raises(UserError) as e:
    datasets.prepared_dirs(f"textdir:{tmp_path / 'none'}", {"min_df": 2}, [2], str(tmp_path))
  assert "--config.source" in str(e.value) and " --source" not in str(e.value)
  with pytest.raises(UserError) as e:
    datasets.prepare_data("pystdlib", 2, str(tmp_path / "d"), {"val_fraction": 2.0})
  assert "--config.prepare.val_fraction=2.0" in str(e.value)


def test_no_study_fix_names_another_entry_points_flags_or_deleting_runs():
  """Item 7 and 4, the class: no message in soma_jax/studies names train.py's --workdir or
  resume_overrides, "set n=", or tells the user to delete a folder."""
  import glob

  for path in glob.glob(os.path.join(ROOT, "soma_jax", "studies", "*.py")):
    with open(path) as f:
      text = f.read()
    for foreign in ("--workdir", "resume_overrides", "set n=", "delete that", "delete the",
                    "or delete"):
      assert foreign not in text, (os.path.basename(path), foreign)


# ----------------------------------------------------------------------------- item 8


@pytest.mark.parametrize("name", ["table4_ops_cpu", "table4_cpu"])
def test_table4_budget_column_is_in_the_studys_unit_for_every_row(name):
  """Item 8: head_only's 1193 updates stood under "ops" (and "cpu_seconds"); every row's
  budget column now holds what it spent in the study's unit, and the committed tables are
  the JSON's."""
  from soma_jax.studies import table4_report

  with open(os.path.join(ROOT, "docs", "results", f"{name}.json")) as f:
    p = json.load(f)
  unit = p["budget"]["unit"]
  text = table4_report.table(p)
  with open(os.path.join(ROOT, "docs", "results", f"{name}.md")) as f:
    assert f.read() == text
  for row, r in p["methods"].items():
    line = next(x for x in text.splitlines() if x.startswith(f"| {row} |"))
    assert line.split(" | ")[8] == f"{r[unit]['mean']:.4g}", (row, line)


def test_an_ops_budget_below_one_update_refused(data_two_shards, tmp_path, monkeypatch):
  """Item 8: an ops budget below one update of the costliest row was accepted (every row ran
  one update: 17x different compute); refused in one line naming the row."""
  from soma_jax.studies import compare, jobs
  from tests.test_reliability_studies import tiny

  monkeypatch.setattr(jobs, "train", lambda *a, **k: pytest.fail("trained"))
  config = tiny("table4", data_two_shards)
  config.budget_unit, config.budget = "ops", 1000.0
  with pytest.raises(UserError, match="less than one update of") as e:
    compare.run(config, str(tmp_path / "out"))
  assert "--config.budget=" in str(e.value)


# ----------------------------------------------------------------------------- notes: table9


def test_table9_refuses_an_external_corpus_drawn_from_the_training_one(data_textdir,
                                                                       data_two_shards,
                                                                       tmp_path):
  """Note: table9 accepted an "external" corpus drawn from the training corpus (a subfolder
  of its textdir: another SOURCE string); the documents themselves are compared now."""
  from soma_jax.studies import external_corpus
  from tests.conftest import data_make_doc

  drawn = external_corpus.Corpus("source", f"textdir:{data_textdir}/cooking", 0, 0)
  splits = external_corpus.source_splits(drawn.where)
  shared, documents = external_corpus.shared_documents(splits, data_two_shards)
  assert documents == 30 and shared == documents  # every one trained on or held out
  with pytest.raises(UserError, match="drawn from the training corpus"):
    external_corpus.check_not_drawn_from(drawn, splits, data_two_shards)
  rng = np.random.default_rng(7)
  for i in range(6):
    (tmp_path / f"new{i}.txt").write_text(data_make_doc("finance", rng, 400))
  fresh = external_corpus.Corpus("source", f"textdir:{tmp_path}", 0, 0)
  got = external_corpus.check_not_drawn_from(fresh, external_corpus.source_splits(fresh.where),
                                             data_two_shards)
  assert got["shared_documents"] == 0 and got["documents"] == 6


def test_a_new_row_on_re_prepared_data_names_compare_options(study_folder, tmp_path):
  """Item 7: a row not trained yet whose seed run trained on data since re-prepared in place
  was refused by training with train.py's --config.init_from_other_data; now before
  training, with compare.py's options."""
  import shutil

  from soma_jax.studies import jobs

  out, c = study_folder
  moved = str(shutil.copytree(out, tmp_path / "m"))
  with open(os.path.join(moved, "data", "manifest.json"), "a") as f:
    f.write(" ")
  with pytest.raises(UserError, match="re-prepared") as e:
    jobs.check_existing(os.path.join(moved, "runs", "seed1", "new"), _row(moved, c))
  assert "--config.data_dir=" in str(e.value) and "init_from_other_data" not in str(e.value)
