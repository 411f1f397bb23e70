"""The progress line users watch on long jobs: steps/s, the ETA and the losses."""

import io

from soma_jax import metrics


def _clock(monkeypatch, start: float) -> list[float]:
  now = [start]
  monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
  return now


def test_eta_from_steps_per_second_when_a_step_count_ends_the_run(monkeypatch):
  now = _clock(monkeypatch, 100.0)
  p = metrics.Progress(total=1000, start=200, stream=io.StringIO())
  assert "nan steps/s | ETA ? |" in p.line(200, [2.5])  # no update timed yet: no ETA
  now[0] = 110.0  # 300 steps in 10 s: 30 steps/s, 500 steps left
  line = p.line(500, [2.5, 3.25])
  assert line.startswith("step 500/1000 | 30.00 steps/s | ETA 0m16s | loss [2.500 3.250]"), line


def test_eta_from_the_budget_when_a_time_budget_ends_the_run(monkeypatch):
  """A budgeted run (steps = 10M, say) shows device-seconds spent of its budget and the
  budget left at the rate device-seconds were spent, not 10M steps at steps/s."""
  now = _clock(monkeypatch, 100.0)
  spent = [2.0]  # restored from a checkpoint before this process began
  p = metrics.Progress(total=10_000_000, start=0, stream=io.StringIO())
  p.track_budget(lambda: (spent[0], 32.0))
  now[0], spent[0] = 110.0, 12.0  # 10 device-seconds in 10 s: 20 left, 20 s
  line = p.line(500, [2.5])
  assert line.startswith("step 500 | 12.0/32 device-s | 50.00 steps/s | ETA 0m20s |"), line
  assert "10000000" not in line
  spent[0] = 40.0  # past the budget (the last update overshoots): nothing left
  assert "ETA 0m00s" in p.line(600, [2.5])
