"""Issue 43 (reliability round 5): what a run charges, what a merged run counts, what the
report refuses and prints, each pinned."""

import itertools
import json
import os
import sys
import time

import jax.numpy as jnp
import pytest

from soma_jax import budget as budget_lib
from soma_jax import merge, runs, train
from soma_jax.data import prepare
from soma_jax.errors import UserError
from soma_jax.loop import Loop
from soma_jax.studies import report
from tests.conftest import default_env
from tests.test_robustness import SMALL_PREP, cli, one_error_line
from tests.test_train import tiny_config

COMPILE = 0.4  # seconds the fake step spends before it dispatches (its "compilation")


def _compiling_step(state, batch, expert_ids):
  """A step whose call spends COMPILE seconds of wall and CPU time, as tracing and compiling
  the first call of a jitted step do, and then dispatches a trivial computation."""
  del expert_ids
  end = time.process_time() + COMPILE
  while time.process_time() < end:  # busy: CPU seconds too
    pass
  return state + batch, {"loss": jnp.sum(batch)}


def _clock_after(updates: int) -> dict:
  clock = budget_lib.Clock(1, 7, {})
  loop = Loop(jnp.zeros(()), _compiling_step, itertools.repeat(jnp.ones(())), jnp.arange(1),
              clock=clock)
  for _ in loop.run(0, updates):
    pass
  clock.lap()
  return clock.totals(updates)


def test_the_compiling_update_is_never_charged_as_training():
  """A process that ran one update charged its whole compilation as training: seed.py tiny
  with steps=1 recorded 12.51 device-seconds beside 10.33 compile seconds for a 0.02 s
  update, so a resumed device_seconds budget of 3 was spent before its first update."""
  units = budget_lib.Clock(1, 0, {}).units
  totals = _clock_after(1)
  assert totals["updates"] == 1 and totals["ops"] == 7
  assert totals["device_seconds"] < 0.25 * COMPILE * units, totals
  assert totals["cpu_seconds"] < 0.25 * COMPILE, totals
  assert totals["compile_seconds"] > 0.9 * COMPILE * units, totals


def test_a_run_of_one_update_resumed_under_a_time_budget_trains(data_prepared, tmp_path):
  """The issue's commands: one update (`train.py` picks its own layout, compiling in the
  loop), then a resume under a device_seconds budget: it trained nothing and said done."""
  w = str(tmp_path / "run")
  base = [sys.executable, "experiments/train.py", f"--workdir={w}",
          "--config=experiments/configs/seed.py:size=tiny", f"--config.data.dir={data_prepared}"]
  first = cli(base + ["--config.steps=1"], env=default_env())
  assert first.returncode == 0, first.stderr[-2000:]
  with open(os.path.join(w, "summary.json")) as f:
    one = json.load(f)
  assert one["device_seconds"] < 0.25 * one["compile_seconds"], one
  more = cli(base + ["--config.steps=100000", "--config.budget_unit=device_seconds",
                     "--config.budget=0.5", "--config.log_every=1000",
                     "--config.eval_every=1000", "--config.ckpt_every=100000"],
             env=default_env())
  assert more.returncode == 0, more.stderr[-2000:]
  assert "budget reached" in more.stderr + more.stdout, more.stderr[-2000:]
  with open(os.path.join(w, "summary.json")) as f:
    resumed = json.load(f)
  assert resumed["step"] > 1 and resumed["updates"] == resumed["step"], resumed


def test_a_merged_continued_run_counts_its_updates_not_its_step(data_prepared, tmp_path):
  """merge.TOTALS left `updates` out: a merged run continuing its seed (init_state) resumed
  counting its step (the seed's updates included), so an updates budget stopped at once."""
  seed = str(tmp_path / "seed")
  train.run(tiny_config(data_prepared, n_experts=1, steps=4, seed=11), seed)
  parts = []
  for rng in ("0:1", "1:3"):
    parts.append(str(tmp_path / rng.replace(":", "-")))
    train.run(tiny_config(data_prepared, steps=6, experts=rng, init_from=seed,
                          init_state=True, budget_unit="updates"), parts[-1])
  merged = str(tmp_path / "merged")
  merge.merge(parts, merged)
  step, _, data_state, _ = runs.restore_state(merged)
  assert step == 6 and data_state["updates"] == 2
  last = [json.loads(line) for line in open(os.path.join(merged, "metrics.jsonl"))][-1]
  assert last["updates"] == 2 and last["step"] == 6, last
  c = tiny_config(data_prepared, steps=100_000, init_from=seed, init_state=True,
                  budget_unit="updates", budget=4.0, budget_checkpoints=1, log_every=50,
                  eval_every=50, ckpt_every=100_000)
  summary = train.run(c, merged)
  assert summary["status"] == "done" and summary["step"] == 8 and summary["updates"] == 4


@pytest.fixture(scope="module")
def no_test_windows(data_textdir, tmp_path_factory):
  """Prepared data without a test split, and a run trained on it."""
  d = str(tmp_path_factory.mktemp("no_test") / "data")
  prepare.prepare(f"textdir:{data_textdir}", 3, d, **dict(SMALL_PREP, test_docs=0))
  w = str(tmp_path_factory.mktemp("no_test_run") / "w")
  train.run(tiny_config(d, steps=1), w)
  return d, w


def test_report_refuses_data_without_test_windows(no_test_windows, tmp_path):
  """report.py wrote nan into report.md and bare NaN into report.json, exit 0; evaluate.py
  refuses the same data in one line."""
  d, w = no_test_windows
  out = str(tmp_path / "rep")
  with pytest.raises(UserError, match="no complete 1,025-byte windows"):
    report.write_report(out, {"run": w}, d)
  assert not os.path.exists(os.path.join(out, "report.md"))
  one_error_line(cli([sys.executable, "experiments/report.py", f"--data_dir={d}",
                      f"--out={out}", f"run={w}"]), "'test'", "fix:")
  assert not os.path.exists(os.path.join(out, "report.json"))


def test_report_counts_a_continued_runs_own_updates(data_prepared, tmp_path):
  """A run continuing its seed (init_state) was reported with its step (`updates 8` for 2
  updates) and drawn after the seed's steps again; device-seconds below 1 printed `0`."""
  seed = str(tmp_path / "seed")
  train.run(tiny_config(data_prepared, n_experts=1, steps=6), seed)
  cont = str(tmp_path / "continued")
  train.run(tiny_config(data_prepared, steps=8, init_from=seed, init_state=True), cont)
  payload = report.write_report(str(tmp_path / "rep"), {"seed": seed, "cont": cont},
                                data_prepared)
  r = payload["runs"]["cont"]
  assert r["updates"] == 2 and payload["runs"]["seed"]["updates"] == 6
  assert report.plot_offset(cont) == 0  # its steps already count on from the seed's
  md = open(str(tmp_path / "rep" / "report.md")).read()
  row = next(line for line in md.splitlines() if line.startswith("| cont |"))
  cells = [s.strip() for s in row.strip("|").split("|")]
  assert cells[3] == "2", row
  assert 0 < r["device_seconds"] < 1 and cells[5] == f"{r['device_seconds']:.3g}", row


def test_one_registry_of_budget_counters():
  """Issue 38 item 5: the budget units and counters are listed once (`budget.COUNTERS`), and
  config validation, the progress line and merge read that list."""
  from soma_jax import config as config_lib
  from soma_jax import metrics

  assert config_lib.BUDGET_UNITS == budget_lib.BUDGET_UNITS
  assert budget_lib.BUDGET_UNITS == ("updates", "ops", "cpu_seconds", "device_seconds")
  assert set(budget_lib.COUNTS) == set(budget_lib.BUDGET_UNITS)
  assert all(budget_lib.COUNTS.values())
  assert merge.TOTALS == tuple(budget_lib.COUNTERS)
  assert set(budget_lib.TRAINING_TIMERS) == {"cpu_seconds", "device_seconds", "update_seconds"}
  c = tiny_config("/nonexistent", budget_unit="seconds")
  with pytest.raises(UserError, match="updates, ops, cpu_seconds, device_seconds"):
    config_lib.validate(c)
  progress = metrics.Progress(10, 0)
  for unit in budget_lib.BUDGET_UNITS:
    progress.track_budget(lambda: (0.0, 1.0), unit)
    assert progress.unit == budget_lib.COUNTERS[unit].short
