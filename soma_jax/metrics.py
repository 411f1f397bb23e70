"""Metrics: one JSONL file (the record), TensorBoard events (tensorboardX), console progress.

No TensorFlow: `clu.metric_writers` imports it, tensorboardX writes the same event files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
from absl import logging

from soma_jax import budget as budget_lib

METRICS_FILE = "metrics.jsonl"


def _plain(x):
  if isinstance(x, np.ndarray | np.generic):
    return x.tolist()
  return x


class MetricWriter:
  """Appends one JSON object per logged step; TensorBoard scalars beside it.

  On resume from step s, records after s (written after the last checkpoint, before an
  interruption) are dropped, so the file reads as if the run had never stopped. The file
  is reopened for every record: if it was deleted or moved during the run, it is written
  again from the records kept in memory, with a warning, instead of going to a lost file.
  """

  def __init__(self, workdir: str, start_step: int = 0, tensorboard: bool = True):
    self.path = os.path.join(workdir, METRICS_FILE)
    self._lines = self._truncate_after(start_step)
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=start_step or None)

  def _truncate_after(self, step: int) -> list[str]:
    keep = []
    if os.path.isfile(self.path):
      with open(self.path) as f:
        keep = [line for line in f if line.strip() and _step_of(line) <= step]
    self._rewrite(keep)
    return keep

  def _rewrite(self, lines: list[str]) -> None:
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(lines)
    os.replace(tmp, self.path)

  def hparams(self, config: dict) -> None:
    if self._tb is not None:
      self._tb.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)

  def write(self, step: int, record: dict) -> None:
    record = {"step": int(step), **{k: _plain(v) for k, v in record.items()}}
    line = json.dumps(record, sort_keys=True) + "\n"
    if not os.path.isfile(self.path):
      logging.warning("%s disappeared during the run; writing it again (%d records kept in "
                      "memory)", self.path, len(self._lines))
      self._rewrite(self._lines)
    self._lines.append(line)
    with open(self.path, "a") as f:
      f.write(line)
    if self._tb is None:
      return
    for key, value in record.items():
      if key == "step":
        continue
      if isinstance(value, list):
        for i, v in enumerate(value):
          if isinstance(v, int | float):
            self._scalar(f"{key}/expert_{i}", v, step)
      elif isinstance(value, int | float):
        self._scalar(key, value, step)

  def _scalar(self, key: str, value: float, step: int) -> None:
    """One TensorBoard scalar, unless tensorboardX's writer thread died (its write failed:
    a full disk): its queue then fills and the next one would block the run for good, so
    TensorBoard stops here and the JSONL record goes on (and reports a full disk itself)."""
    if self._tb is None:
      return
    if not _writing(self._tb):
      logging.warning("TensorBoard events in %s stopped: tensorboardX's writer failed; "
                      "metrics.jsonl goes on", os.path.dirname(self.path))
      tb, self._tb = self._tb, None
      _abandon(tb)
      return
    self._tb.add_scalar(key, value, step)

  def close(self) -> None:
    """Closes the TensorBoard files; a failure there (a full disk) is left to the JSONL
    record and the caller's error, not raised again, here or at exit."""
    if self._tb is not None:
      tb, self._tb = self._tb, None
      if not _writing(tb):  # its thread died: closing would wait on its full queue for good
        _abandon(tb)
        return
      try:
        tb.close()
      except OSError as e:
        logging.info("TensorBoard events in %s not closed (%s)", os.path.dirname(self.path), e)
        _abandon(tb)

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _writing(tb) -> bool:
  """Whether tensorboardX's writer threads are alive (True where it cannot be told)."""
  for file_writer in getattr(tb, "all_writers", {}).values():
    worker = getattr(getattr(file_writer, "event_writer", None), "_worker", None)
    if worker is not None and hasattr(worker, "is_alive") and not worker.is_alive():
      return False
  return True


def _abandon(tb) -> None:
  """After tensorboardX failed to close (a full disk): stops its writer thread and marks its
  files closed, so that neither the thread nor its exit hook retries the write and prints a
  traceback after the run's own error. Best effort over tensorboardX's private fields."""
  for file_writer in getattr(tb, "all_writers", {}).values():
    events = getattr(file_writer, "event_writer", None)
    worker = getattr(events, "_worker", None)
    if worker is not None and worker.is_alive():  # a dead one never empties its queue
      with contextlib.suppress(Exception):
        worker.stop()
    with contextlib.suppress(Exception):
      events._closed = True


def _step_of(line: str) -> int:
  try:
    return int(json.loads(line)["step"])
  except (ValueError, KeyError, TypeError):
    return -1


def read_metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Progress:
  """steps/s, ETA and per-expert loss: a live line on a terminal, log lines otherwise.

  A run that ends at a budget (`track_budget`) shows the training device-seconds (CPU
  seconds, updates) spent of the budget, and its ETA is the budget left at the rate it has been spent
  per wall second so far; a run that ends at a step count shows step / steps and its ETA
  from steps/s.
  """

  def __init__(self, total: int, start: int, stream=None):
    self.total, self.start = total, start
    self.stream = stream or sys.stderr
    self.tty = self.stream.isatty()
    self.t0 = time.perf_counter()
    self.budget = None  # () -> (amount spent, budget), when a budget ends the run
    self.spent0, self.unit = 0.0, "device-s"

  def track_budget(self, spent_and_budget: Callable[[], tuple[float, float]],
                   unit: str = "device_seconds") -> None:
    self.budget, self.spent0 = spent_and_budget, spent_and_budget()[0]
    counter = budget_lib.COUNTERS.get(unit)
    self.unit = counter.short if counter else unit

  def _eta(self, step: int, elapsed: float, steps_per_s: float) -> tuple[float, float, str]:
    """(fraction done, seconds left, the position text)."""
    if self.budget is None:
      left = (self.total - step) / steps_per_s if steps_per_s > 0 else float("nan")
      return step / max(self.total, 1), left, f"step {step}/{self.total}"
    spent, seconds = self.budget()
    rate = (spent - self.spent0) / elapsed if elapsed > 0 else 0.0
    left = max(seconds - spent, 0.0) / rate if rate > 0 else float("nan")
    return (min(spent / seconds, 1.0), left,
            f"step {step} | {spent:.1f}/{seconds:g} {self.unit}")

  def line(self, step: int, loss: Sequence[float], extra: str = "") -> str:
    elapsed = time.perf_counter() - self.t0
    done = step - self.start
    rate = done / elapsed if elapsed > 0 and done > 0 else float("nan")
    frac, eta, where = self._eta(step, elapsed, rate)
    shown = " ".join(f"{x:.3f}" for x in list(loss)[:8]) + (" ..." if len(loss) > 8 else "")
    bar = ""
    if self.tty:
      filled = int(20 * frac)
      bar = "[" + "#" * filled + "." * (20 - filled) + "] "
    return (f"{bar}{where} | {rate:.2f} steps/s | ETA {_duration(eta)} | "
            f"loss [{shown}]{extra}")

  def update(self, step: int, loss: Sequence[float], extra: str = "") -> None:
    text = self.line(step, loss, extra)
    if self.tty:
      self.stream.write("\r" + text + "\033[K")
      if step >= self.total:
        self.stream.write("\n")
    else:
      self.stream.write(text + "\n")
    self.stream.flush()

  def message(self, text: str) -> None:
    if self.tty:
      self.stream.write("\r\033[K")
    self.stream.write(text + "\n")
    self.stream.flush()


def json_safe(obj):
  """`obj` with every non-finite float (NaN, inf; numpy's too) as None, recursively through
  dicts, lists and tuples: `json.dump` would write them as bare NaN / Infinity, which is
  not JSON (summary.json of a run whose every update was skipped held `NaN`)."""
  if isinstance(obj, dict):
    return {k: json_safe(v) for k, v in obj.items()}
  if isinstance(obj, list | tuple):
    return [json_safe(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return json_safe(obj.tolist())
  if isinstance(obj, float | np.floating):
    return float(obj) if math.isfinite(obj) else None
  if isinstance(obj, np.integer):
    return int(obj)
  return obj
