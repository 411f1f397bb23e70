"""benchmarks/ tools: step_sweep times every combination in the same rounds; bad input exits 2."""

import os
import subprocess
import sys

import pytest

from soma_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import step_timing  # noqa: E402


def test_sweep_times_each_dividing_combination_and_ranks_them():
  c = config_lib.base_config(n=2, size="tiny")  # n_pert 4
  out = step_timing.sweep(c, chunks=[1, 3, 4], blocks=[8, 16], reps=2)
  combos = {(r["pert_chunk"], r["time_block"]) for r in out["rows"]}
  assert combos == {(1, 8), (1, 16), (4, 8), (4, 16)}
  assert out["skipped"] == ["pert_chunk=3 does not divide n_pert=4"]
  seconds = [r["step_seconds"] for r in out["rows"]]
  assert seconds == sorted(seconds)
  assert out["rows"][0]["relative_to_fastest"] == 1.0
  assert all(r["relative_to_fastest"] >= 1.0 and r["planned_bytes"] > 0 for r in out["rows"])
  by_chunk = {r["pert_chunk"]: r["planned_bytes"] for r in out["rows"] if r["time_block"] == 8}
  assert by_chunk[4] > by_chunk[1]  # more directions at once plan more memory
  tokens = 2 * 4 * c.spsa.batch * c.data.seq_len * 2
  r = out["rows"][0]
  assert r["perturbed_tokens_per_second"] == pytest.approx(tokens / r["step_seconds"])


@pytest.mark.parametrize("script,flag,says", [
    ("step_sweep.py", "--pert_chunk=a", "positive integers"),
    ("step_sweep.py", "--time_block=0", "positive integers"),
    ("step_sweep.py", "--reps=0", "must be >= 1"),
    ("spsa_step.py", "--reps=0", "must be >= 1"),
    ("paper_shapes.py", "--reps=0", "must be >= 1"),
    ("profile_step.py", "--steps=0", "must be >= 1"),
])
def test_bad_values_exit_2_with_one_line(script, flag, says):
  config = [] if script == "paper_shapes.py" else ["--config=experiments/configs/soma.py:n=2,size=tiny"]
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", script), *config, flag],
      cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().count("\n") == 0 and says in proc.stderr, proc.stderr


def test_sweep_skips_combinations_that_would_not_fit_the_device(monkeypatch):
  c = config_lib.base_config(n=2, size="tiny")
  full = step_timing.sweep(c, chunks=[1, 4], blocks=[8], reps=1)
  plan = {r["pert_chunk"]: r["planned_bytes"] for r in full["rows"]}
  limit = (plan[1] + plan[4]) / 2 / step_timing.memory.MARGIN  # chunk 1 fits, 4 does not
  monkeypatch.setattr(step_timing.memory, "device_limit_bytes", lambda: int(limit))
  out = step_timing.sweep(c, chunks=[1, 4], blocks=[8], reps=1)
  assert [r["pert_chunk"] for r in out["rows"]] == [1]
  assert len(out["skipped"]) == 1 and out["skipped"][0].startswith("pert_chunk=4,time_block=8 plans")
