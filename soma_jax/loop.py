"""The one update loop: every place that advances a TrainState (training, the Figure 4
study, the timing of a step) runs its updates through `Loop.run`; `Stop`, the signals that
ask it to stop."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from soma_jax import errors


class Loop:
  """`state` advanced by `step_fn(state, batch, expert_ids) -> (state, metrics)` on the
  batches of `batches` (host arrays; `to_device` places each one).

  At most one update is in flight: update t + 1 is dispatched before update t's metrics are
  waited for, so the host prepares the next batch while the device computes, and a signal
  acts within one update. With a `clock` (`budget.Clock`) the first update (the compiling
  one) is timed apart and every other is counted. Between updates the caller may read or
  replace `state` (the plateau rule changes its schedule).
  """

  def __init__(self, state, step_fn: Callable, batches: Iterator, expert_ids: jax.Array,
               to_device: Callable = jnp.asarray, clock: Any = None,
               stop: Callable[[], bool] | None = None):
    self.state, self.step_fn, self.batches = state, step_fn, batches
    self.expert_ids, self.to_device, self.clock = expert_ids, to_device, clock
    self.stop = stop  # asked to stop (a signal): the first update is not waited for
    self.abandoned = False  # the first update was left running: `state` is not to be read

  def run(self, start: int, end: int) -> Iterator[tuple[int, Any]]:
    """Updates start + 1 .. end: yields (updates done, that update's metrics) after each."""
    pending = None  # the previous update's metrics
    for step in range(start, end):
      batch = self.to_device(next(self.batches))
      if pending is None and self.clock is not None:  # this process's first update compiles
        with self.clock.aside("compile_seconds"):
          self.state, m = self.step_fn(self.state, batch, self.expert_ids)
          self.clock.dispatched()  # compiled: the rest is the update's run
          if not self._wait(m):  # stopped between compile and run, or while it ran
            self.abandoned = True
            errors.left_running(f"the update after step {step}")
            return
      else:
        self.state, m = self.step_fn(self.state, batch, self.expert_ids)
        if self.clock is not None:
          self.clock.count()
        if pending is not None:
          jax.block_until_ready(pending)
      pending = m
      yield step + 1, m

  def _wait(self, m) -> bool:
    """Waits for the first update's metrics `m`; False as soon as `stop()` asks to stop.

    The first update may be long (a huge n_pert, a slow device) and holds nothing that was
    not saved before it (the start, or the checkpoint resumed from), so a signal need not
    wait for it: polling, instead of blocking in XLA, lets the signal's handler run."""
    if self.stop is None:
      jax.block_until_ready(m)
      return True
    leaves, delay = jax.tree.leaves(m), 1e-3
    while not all(x.is_ready() for x in leaves):
      if self.stop():
        return False
      time.sleep(delay)
      delay = min(2 * delay, 0.05)
    return True


class Stop:
  """SIGTERM / SIGINT ask the loop to checkpoint and return after the current update.

  A second signal stops at once (KeyboardInterrupt), unless it comes within DUPLICATE_S of
  the first: the same request delivered twice (a scheduler signals every process of a job,
  and a study's parent forwards it to its workers)."""

  DUPLICATE_S = 1.0

  def __init__(self):
    self.signum = 0
    self._at = 0.0
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: no handlers, Ctrl-C raises as usual
        pass
    return self

  def _handle(self, signum, frame):
    if self.signum:  # a second signal: stop now
      if time.monotonic() - self._at < self.DUPLICATE_S:
        return
      raise KeyboardInterrupt
    self.signum, self._at = signum, time.monotonic()

  def __call__(self) -> bool:
    return bool(self.signum)

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)
