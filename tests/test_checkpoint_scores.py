"""Issue 39 item 4: a budgeted run scores the study's validation set at every checkpoint from
the state in memory (config.checkpoint_eval); the saved losses are bit for bit what restoring
the checkpoint and scoring it gives, `scores.curve` / `final_losses` read them instead of
restoring, and never for another set, a half-written file or a missing one."""

import json
import os
import shutil

import ml_collections
import numpy as np
import pytest

from soma_jax import checkpoint_scores as scores_lib
from soma_jax import config as config_lib
from soma_jax import runs
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.studies import planning, scores
from tests.conftest import CKPT_ROUTE as ROUTE
from tests.conftest import CKPT_SCORE as SCORE
from tests.conftest import ckpt_val_set as val_set  # scored_run: a fixture in tests/conftest.py


def restored_scores(workdir: str, step: int, spec, scorer) -> tuple[np.ndarray, dict]:
  _, state, data_state, _ = runs.restore_state(workdir, step=step)
  return scores._score(scorer, spec, state.body, state.head), data_state


def count_restores(monkeypatch) -> list:
  calls, real = [], runs.restore_state
  monkeypatch.setattr(runs, "restore_state", lambda *a, **k: calls.append(a) or real(*a, **k))
  return calls


def copy_without(workdir: str, dest: str, drop=("checkpoint_scores",)) -> str:
  shutil.copytree(workdir, dest, ignore=shutil.ignore_patterns(*drop))
  return dest


def test_saved_losses_are_the_restored_checkpoints_scores(scored_run):
  spec, workdir, val = scored_run
  steps = scores.checkpoints(workdir)
  assert steps == [2, 4, 6]
  for step in steps:
    saved = scores_lib.read(workdir, step, val.settings())
    assert saved is not None, f"no scores saved at step {step}"
    losses, counters = saved
    expected, data_state = restored_scores(workdir, step, spec, val)
    assert losses.dtype == expected.dtype and np.array_equal(losses, expected)
    assert counters == {k: data_state[k] for k in counters}
    assert set(counters) >= set(planning.budget_lib.TRAINING_TIMERS)


def test_curve_is_the_same_with_and_without_the_files(scored_run, tmp_path, monkeypatch):
  spec, workdir, val = scored_run
  bare = copy_without(workdir, str(tmp_path / "bare"))
  calls = count_restores(monkeypatch)
  points, last = scores.curve(workdir, spec, val, 0, 5.0)
  end = scores.final_losses(workdir, spec, val)
  assert calls == []  # every checkpoint read from its saved scores
  points_bare, last_bare = scores.curve(bare, spec, val, 0, 5.0)
  end_bare = scores.final_losses(bare, spec, val)
  assert len(calls) == 4  # three checkpoints and the newest again, restored and scored
  assert points == points_bare and [p["step"] for p in points] == [0, 2, 4, 6]
  assert np.array_equal(last, last_bare) and np.array_equal(end, end_bare)
  assert np.array_equal(end, last)


def test_summary_reads_the_saved_counters(scored_run, tmp_path, monkeypatch):
  spec, workdir, _ = scored_run
  bare = copy_without(workdir, str(tmp_path / "bare"))
  calls = count_restores(monkeypatch)
  done = scores.summary(workdir, spec, 0)
  assert calls == []  # the newest checkpoint's counters, from its saved scores
  assert scores.summary(bare, spec, 0) == done and len(calls) == 1  # restored instead
  assert done["step"] == done["updates"] == 6 and done["update_seconds"] > 0
  assert scores_lib.counters(workdir, 4) is not None and scores_lib.counters(workdir, 5) is None


@pytest.mark.parametrize("other", [
    {"max_windows": 2}, {"split": "test"}, {"route": 4}])
def test_scores_of_another_set_are_not_used(scored_run, monkeypatch, other):
  spec, workdir, val = scored_run
  scorer = val_set(spec.data_dir, **other)
  assert scores_lib.read(workdir, 6, scorer.settings()) is None
  calls = count_restores(monkeypatch)
  points, last = scores.curve(workdir, spec, scorer, 0, 5.0)
  assert len(calls) == 3
  for point, step in zip(points[1:], (2, 4, 6), strict=True):
    assert point["loss"] == float(restored_scores(workdir, step, spec, scorer)[0].mean())
  assert np.array_equal(scores.final_losses(workdir, spec, scorer), last)


def test_a_file_naming_other_settings_is_not_read(scored_run, tmp_path):
  spec, workdir, val = scored_run
  moved = copy_without(workdir, str(tmp_path / "moved"), drop=())
  meta = os.path.join(moved, scores_lib.FOLDER, "6.json")
  with open(meta) as f:
    saved = json.load(f)
  for key, value in (("max_windows", 3), ("data_dir", "/elsewhere"), ("windows_sha256", "0")):
    with open(meta, "w") as f:
      json.dump({**saved, "settings": {**saved["settings"], key: value}}, f)
    assert scores_lib.read(moved, 6, val.settings()) is None, key
  with open(meta, "w") as f:
    json.dump({**saved, "step": 4}, f)
  assert scores_lib.read(moved, 6, val.settings()) is None
  assert scores_lib.read(moved, 6, None) is None  # a set with no settings (table9's own)


def test_a_half_written_file_is_ignored(scored_run, tmp_path, monkeypatch):
  spec, workdir, val = scored_run
  half = copy_without(workdir, str(tmp_path / "half"), drop=())
  folder = os.path.join(half, scores_lib.FOLDER)
  for name in ("6.npy", "6.json"):  # a run killed while writing step 6: temporary names only
    path = os.path.join(folder, name)
    with open(path, "rb") as f:
      data = f.read()
    os.remove(path)
    with open(path + ".tmp", "wb") as f:
      f.write(data[:len(data) // 2])
  with open(os.path.join(folder, "4.npy"), "r+b") as f:  # step 4's losses cut short on disk
    f.truncate(os.path.getsize(f.name) - 8)
  assert scores_lib.read(half, 6, val.settings()) is None
  assert scores_lib.read(half, 4, val.settings()) is None
  calls = count_restores(monkeypatch)
  points, _ = scores.curve(half, spec, val, 0, 5.0)
  assert len(calls) == 2  # steps 4 and 6 restored, 2 read
  assert points == scores.curve(workdir, spec, val, 0, 5.0)[0]


def test_a_write_cut_short_leaves_nothing_readable(scored_run, tmp_path, monkeypatch):
  _, workdir, val = scored_run
  losses, counters = scores_lib.read(workdir, 6, val.settings())
  folder = os.path.join(str(tmp_path), scores_lib.FOLDER)
  real_dump = json.dump
  # tmp_path stands for the run (its identity: the first start in its history)
  shutil.copy(os.path.join(workdir, "config_history.jsonl"), str(tmp_path))

  def killed(obj, f, **kw):  # the process dies half way through writing the .json
    f.write(json.dumps(obj)[:20])
    raise KeyboardInterrupt

  monkeypatch.setattr(scores_lib.json, "dump", killed)
  with pytest.raises(KeyboardInterrupt):
    scores_lib.write(str(tmp_path), 6, losses, val.settings(), counters)
  monkeypatch.setattr(scores_lib.json, "dump", real_dump)
  assert not os.path.exists(os.path.join(folder, "6.json"))  # only its temporary name
  assert scores_lib.read(str(tmp_path), 6, val.settings()) is None
  scores_lib.write(str(tmp_path), 6, losses, val.settings(), counters)
  assert np.array_equal(scores_lib.read(str(tmp_path), 6, val.settings())[0], losses)
  scores_lib.forget(str(tmp_path), 6)  # before step 6 is saved again
  assert sorted(os.listdir(folder)) == []


def test_the_field_travels_in_the_config_and_is_off_by_default(scored_run):
  spec, _, val = scored_run
  assert spec.checkpoint_eval == spec_lib.CheckpointEval(
      val.data_dir, "ensemble_val", 0, ROUTE, SCORE)
  again = spec_lib.resolve(ml_collections.ConfigDict(spec.config.to_dict()))  # a worker's
  assert again.checkpoint_eval == spec.checkpoint_eval
  plain = config_lib.base_config(n=2, size="tiny")
  assert spec_lib.resolve(plain).checkpoint_eval is None
  del plain.checkpoint_eval  # a config.json written before the field
  assert spec_lib.resolve(plain).checkpoint_eval is None


@pytest.mark.parametrize("field, value, says", [
    ("split", "validation", "checkpoint_eval.split"),
    ("max_windows", -1, "checkpoint_eval.max_windows"),
    ("route", 0, "checkpoint_eval.route"),
    ("score", "24", "checkpoint_eval.score"),
    ("data_dir", 3, "checkpoint_eval.data_dir"),
    ("score", 768, "must divide 1024 and be <= data.seq_len = 32"),
    ("route", 9, "must divide 1024"),
])
def test_bad_values_are_refused(field, value, says):
  c = config_lib.base_config(n=2, size="tiny")
  c.checkpoint_eval.update(split="ensemble_val", route=ROUTE, score=SCORE)
  config_lib.validate(c)  # the good settings pass
  c.checkpoint_eval = ml_collections.ConfigDict({**c.checkpoint_eval.to_dict(), field: value})
  with pytest.raises(UserError, match=says):
    config_lib.validate(c)


def test_a_slice_of_the_experts_is_refused():
  c = config_lib.base_config(n=2, size="tiny")
  c.checkpoint_eval.update(split="test", route=ROUTE, score=SCORE)
  c.experts = "0:1"
  with pytest.raises(UserError, match="checkpoint_eval needs the whole run"):
    config_lib.validate(c)
