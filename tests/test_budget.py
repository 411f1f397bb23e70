"""Budgets in updates, operations and CPU seconds, and a run that continues its seed's whole state
(SPEC 9.6): what a comparison needs so that neither the machine's load nor a head start
decides it."""

import jax
import numpy as np
import pytest

from soma_jax import runs
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.errors import UserError
from soma_jax.studies import jobs as jobs_lib
from soma_jax.studies import planning, scores
from tests.test_train import tiny_config


def test_budget_in_updates_stops_at_exactly_that_count(data_prepared, tmp_path):
  """budget_unit=updates: the run takes exactly `budget` updates, with a checkpoint after each
  1/k of them, whatever the step cap; a resumed finished run does nothing more."""
  c = tiny_config(data_prepared, steps=100_000, budget=6.0, budget_unit="updates",
                  budget_checkpoints=3, log_every=50, eval_every=50, ckpt_every=100_000)
  c.ckpt.keep = 5
  w = str(tmp_path / "run")
  summary = train_lib.run(c, w)
  assert summary["status"] == "done"
  assert summary["step"] == 6 and summary["updates"] == 6
  assert summary["budget_unit"] == "updates" and summary["budget_before_last_update"] == 5
  assert scores.checkpoints(w) == [2, 4, 6]
  assert train_lib.run(c, w)["step"] == 6


def test_budget_marks_place_the_checkpoints(data_prepared, tmp_path):
  """budget_marks: a checkpoint after the update that reaches each fraction of the budget
  (log-spaced for a study's curve) in place of budget_checkpoints' equal parts; the marks
  are refused unless they grow within (0, 1] to 1."""
  c = tiny_config(data_prepared, steps=100_000, budget=8.0, budget_unit="updates",
                  budget_checkpoints=3, log_every=50, eval_every=50, ckpt_every=100_000)
  c.budget_marks, c.ckpt.keep = (0.125, 0.25, 0.5, 1.0), 5
  w = str(tmp_path / "run")
  assert train_lib.run(c, w)["step"] == 8
  assert scores.checkpoints(w) == [1, 2, 4, 8]
  c.budget_marks = (0.5, 0.25)
  with pytest.raises(UserError, match="budget_marks"):
    spec_lib.resolve(c)


def test_budget_in_cpu_seconds_counts_process_time(data_prepared, tmp_path):
  """budget_unit=cpu_seconds: stops after the update whose CPU time reaches the budget."""
  c = tiny_config(data_prepared, steps=100_000, budget=0.2, budget_unit="cpu_seconds",
                  budget_checkpoints=1, log_every=50, eval_every=50, ckpt_every=100_000)
  summary = train_lib.run(c, str(tmp_path / "run"))
  assert summary["status"] == "done" and 1 < summary["step"] < 100_000
  assert summary["budget_before_last_update"] < 0.2 <= summary["cpu_seconds"]
  # CPU time of the updates only: well below the run's charged wall time x cores plus apart
  assert summary["cpu_seconds"] < summary["device_seconds"] + summary["compile_seconds"]


def _leaves_equal(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_continued_run_starts_from_the_seeds_last_state(data_prepared, tmp_path):
  """init_state: every expert starts with the seed's parameters, Adam moments and count,
  plateau counters and step; lr and eps are this config's; numbering goes on from there."""
  seed_dir = str(tmp_path / "seed")
  seed_c = tiny_config(data_prepared, n_experts=1, steps=4, seed=11)
  train_lib.run(seed_c, seed_dir)
  _, seed, _, _ = runs.restore_state(seed_dir)
  c = tiny_config(data_prepared, n_experts=3, steps=4 + 3, seed=3, init_from=seed_dir,
                  init_state=True)
  c.opt.lr = 0.005
  start = runs.initial_state(spec_lib.resolve(c))
  assert int(start.step) == int(seed.step) == 4
  for n in range(3):
    pick = lambda t, n=n: jax.tree.map(lambda x: x[n], t)
    assert _leaves_equal(pick(start.opt), pick(seed.opt))  # moments and Adam's count
    assert _leaves_equal(pick(start.body), pick(seed.body))
    assert int(start.sched.since[n]) == int(seed.sched.since[0])
    assert float(start.sched.best[n]) == float(seed.sched.best[0])
  np.testing.assert_array_equal(np.asarray(start.sched.lr), np.float32(0.005))
  w = str(tmp_path / "continued")
  summary = train_lib.run(c, w)
  assert summary["step"] == 7 and summary["updates"] == 3
  assert scores.checkpoints(w)[0] > 4  # no checkpoint at or before the seed's step


def test_budget_in_ops_stops_after_the_update_that_reaches_it(data_prepared, tmp_path):
  """budget_unit=ops: SPEC 7's operations of this run, so the stop is the first update whose
  cumulative operations reach the budget, whatever the machine's load."""

  c = tiny_config(data_prepared, steps=100_000, budget_unit="ops", budget_checkpoints=1,
                  log_every=50, eval_every=50, ckpt_every=100_000)
  per_update = spec_lib.resolve(c).method.ops_per_update * c.n_experts
  c.budget = 4.5 * per_update
  summary = train_lib.run(c, str(tmp_path / "run"))
  assert summary["updates"] == 5 and summary["ops"] == 5 * per_update
  assert summary["budget_before_last_update"] == 4 * per_update


def test_every_budget_unit_is_described_for_results():
  """results.json says what its budget counted for every unit a run may stop on (a Table 4
  run in ops trained every row, then failed writing its results on a missing description)."""
  from soma_jax import config as config_lib

  assert set(config_lib.BUDGET_UNITS) <= set(planning.COUNTS)
  assert set(planning.UNITS) - set(planning.COUNTS) == {"auto"}


def test_a_study_run_given_a_relative_data_dir_resumes(data_prepared, tmp_path, monkeypatch):
  """config.json holds data.dir absolute; a study called again with the same relative dir
  (compare.py --out=runs/x puts its data in runs/x/data) refused its own finished runs."""
  import os

  monkeypatch.chdir(os.path.dirname(data_prepared))
  c = tiny_config(os.path.basename(data_prepared), steps=2, log_every=2, eval_every=2,
                  ckpt_every=2)
  w = str(tmp_path / "run")
  train_lib.run(c, w)
  jobs_lib.check_existing(w, spec_lib.resolve(c))  # the same experiment: no UserError
