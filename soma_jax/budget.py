"""What a training run spends, and when it stops: the clock of SPEC 7 and the budget.

`COUNTERS` is the one list of what a run counts (its budget units among them); `Clock` counts
the seconds (and CPU seconds) of training updates only, evaluation, checkpoints and
compilation apart; `Budget` ends a run after the complete update that reaches its budget, in
any budget unit (SPEC 9.6).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import jax

from soma_jax import host_devices


@dataclasses.dataclass(frozen=True)
class Counter:
  """One cumulative counter of a run, kept in its checkpoints, metrics and summary."""

  counts: str  # what it counts (for a budget unit: results.json's budget.counts)
  budget: bool = False  # a budget_unit: a run may stop on it
  training: bool = True  # of training updates only (False: compilation, evaluation, saves)
  merged: str = "sum"  # over expert-slice jobs (merge.py): "sum", or "same" (every job's own)
  short: str = ""  # its name on the progress line


# Every counter, budget units first (config's budget_unit lists them in this order).
COUNTERS = {
    "updates": Counter("this run's updates after its start (every run stops at exactly this "
                       "count)", budget=True, merged="same", short="updates"),
    "ops": Counter("SPEC 7's training operations of this run (updates x ops per update; every "
                   "run stops after the update that reaches it)", budget=True, short="ops"),
    "cpu_seconds": Counter("the process's CPU time (all threads, time.process_time) in training "
                           "updates", budget=True, short="cpu-s"),
    "device_seconds": Counter(f"training device-seconds ({host_devices.CHARGE_RULE})",
                              budget=True, short="device-s"),
    "compile_seconds": Counter("device-seconds compiling (the first update's excess over a "
                               "timed one, and planning)", training=False),
    "eval_seconds": Counter("device-seconds of validation", training=False),
    "ckpt_seconds": Counter("device-seconds saving checkpoints", training=False),
    "update_seconds": Counter("wall seconds of training updates (device-seconds over the "
                              "devices or cores charged)", budget=False),
    "physical_seconds": Counter("device-seconds of the run's training calls, each from its "
                                "start to its last checkpoint (start-up, restores, compilation, "
                                "updates, evaluation, saves: the paper's physical total), "
                                "summed over the calls that resumed it", training=False),
    "step_compiles": Counter("XLA compilations of the step (planning its chunk, and a "
                             "process's first update): 0 where this process or JAX's "
                             "persistent cache had the program",
                             training=False),
}
BUDGET_UNITS = tuple(k for k, v in COUNTERS.items() if v.budget)  # config's budget_unit
COUNTS = {k: COUNTERS[k].counts for k in BUDGET_UNITS}  # what each budget unit counts
# Cumulative seconds each run keeps in its checkpoints (SPEC 7 device-seconds, and apart).
# In the order checkpoints, summaries and results.json have always listed them (device
# first), the wall seconds of updates last.
TIMERS = tuple(sorted((k for k in COUNTERS if k.endswith("_seconds")),
                      key=lambda k: (k != "device_seconds", k == "update_seconds")))
TRAINING_TIMERS = tuple(k for k in TIMERS if COUNTERS[k].training)  # the rest apart


# XLA compilations in this process: JAX's compile events (which fire on a persistent-cache
# hit too) less its persistent-cache hits.
_BACKEND_COMPILES = [0]


def _count_compile(event: str, duration: float, **kwargs) -> None:
  del duration, kwargs
  if event == "/jax/core/compile/backend_compile_duration":
    _BACKEND_COMPILES[0] += 1


def _count_cache_hit(event: str, **kwargs) -> None:
  del kwargs
  if event == "/jax/compilation_cache/cache_hits":
    _BACKEND_COMPILES[0] -= 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)
jax.monitoring.register_event_listener(_count_cache_hit)


def compiles() -> int:
  """XLA compilations so far in this process (a persistent-cache hit is none)."""
  return _BACKEND_COMPILES[0]


class Clock:
  """Device-seconds of training updates only, the rest apart (SPEC 7): wall seconds x
  `host_devices.charged_units`, i.e. core-seconds on a CPU (every core the process may use,
  whatever the layout, so that methods that shard and methods that cannot are charged
  alike) and device-seconds of the step's devices elsewhere.

  `count` each update dispatched, `lap` once they have all finished; time `aside` for
  evaluation, checkpoint saves and the first (compiling) update. Training time is
  reported as updates x mean step seconds, so the compiling update counts at the mean
  and only its excess is compile time. Until another update is timed, the mean is the
  compiling update's own run: from `dispatched` (its call returned: compiled, dispatched) to
  its results, and 0 where that was not marked; its compilation is never training time.
  """

  def __init__(self, n_devices: int, ops_step: int, base: dict, plan_seconds: float = 0.0,
               start: int = 0, plan_compiles: int = 0, called: float | None = None):
    self.units = host_devices.charged_units(n_devices)
    # when this training call began (time.perf_counter; None: now): physical_seconds
    self._called = time.perf_counter() if called is None else called
    self.ops_step, self.base = ops_step, base  # base: the restored cumulative totals
    self.start = start  # the step this process started from
    self.seconds, self.cpu, self.steps, self._pending = 0.0, 0.0, 0, 0
    self.apart = dict.fromkeys((k for k in TIMERS if k not in TRAINING_TIMERS), 0.0)
    self._planned = plan_seconds  # compile time before the loop, added to compile_seconds
    self._t, self._cpu_t = time.perf_counter(), time.process_time()
    self._mark = None  # (wall, cpu) when the compiling update was dispatched
    self.first = (0.0, 0.0)  # the compiling update's run after its dispatch: (wall, cpu)
    # XLA compilations of the step: planning it (`plan_compiles`) and this process's
    # compiling update
    self.compiles = plan_compiles

  def dispatched(self) -> None:
    """In the compiling update's `aside`, once its call returned: the rest is its run."""
    self._mark = (time.perf_counter(), time.process_time())

  def count(self) -> None:
    self._pending += 1

  def lap(self) -> None:
    now, cpu = time.perf_counter(), time.process_time()
    if self._pending:
      self.seconds += now - self._t
      self.cpu += cpu - self._cpu_t
      self.steps += self._pending
    self._t, self._cpu_t, self._pending = now, cpu, 0

  @contextlib.contextmanager
  def aside(self, key: str, sync=None):
    if sync is not None:
      jax.block_until_ready(sync)
    self.lap()
    compiled = compiles()
    yield
    if key == "compile_seconds":
      self.compiles += compiles() - compiled
    now, cpu = time.perf_counter(), time.process_time()
    self.apart[key] += now - self._t
    if self._mark is not None:  # the compiling update: its run after the dispatch
      self.first, self._mark = (now - self._mark[0], cpu - self._mark[1]), None
    self._t, self._cpu_t = now, cpu

  def mean_step(self) -> float:
    """Wall seconds of one training update (the compiling one's run while it is the only)."""
    return self.seconds / self.steps if self.steps else self.first[0]

  def mean_cpu(self) -> float:
    return self.cpu / self.steps if self.steps else self.first[1]

  def at(self, done: int) -> dict:
    """`totals` once the run stands at step `done`."""
    return self.totals(done - self.start)

  def totals(self, updates: int) -> dict:
    """Cumulative ops and seconds after `updates` updates of this process."""
    mean = self.mean_step()
    out = {"ops": int(self.base.get("ops", 0)) + self.ops_step * updates,
           "updates": int(self.base.get("updates", 0)) + updates,
           "device_seconds": mean * updates * self.units,
           "cpu_seconds": self.mean_cpu() * updates, "update_seconds": mean * updates}
    apart = dict(self.apart, compile_seconds=max(self.apart["compile_seconds"] - mean, 0.0)
                 + self._planned, physical_seconds=time.perf_counter() - self._called)
    out.update({k: v * self.units for k, v in apart.items()})
    out["step_compiles"] = self.compiles
    return {k: v + self.base.get(k, 0) if k not in ("ops", "updates") else v
            for k, v in out.items()}


class Budget:
  """The run's budget (`budget`, in `budget_unit`): a checkpoint after each 1/k of it (or
  after each fraction of `marks`, when given), and the stop after the complete update that
  reaches it.

  `unit` is one of BUDGET_UNITS (what each counts: `COUNTERS`). No load can move "updates"
  or "ops"; two busy processes beside a run still moved "cpu_seconds" by -12.8% and
  "device_seconds" (`Clock`'s, core-seconds on a CPU) by -53.5%
  (docs/results/budget_load.json). With a time budget every update is waited for before the next is dispatched, so the seconds are
  known after each one. SPEC 9.2's Table 7 runs also stopped after a complete update; their
  budget was GPU-hours; SPEC 9.6 says which unit a CPU-scale comparison may use.
  """

  def __init__(self, unit: str, amount: float, checkpoints: int, clock: Clock, start: int,
               marks: tuple[float, ...] = ()):
    self.amount, self.unit, k = amount, unit, checkpoints
    self.marks = ([self.amount * f for f in marks] if marks
                  else [self.amount * (i + 1) / k for i in range(k)])
    self.clock, self.start = clock, start
    self.used = float(clock.base.get(self.unit, 0.0))  # restored on a resume
    self.before = None  # the amount counted after the update before the last one
    self._passed = sum(self.used >= mark for mark in self.marks)

  def spent(self) -> bool:
    return self.amount > 0 and self.used >= self.amount

  def after(self, done: int, m) -> tuple[bool, bool]:
    """(checkpoint now, stop now) once update `done` (its metrics `m`) has finished."""
    if self.amount <= 0:
      return False, False
    if self.unit in TRAINING_TIMERS:  # counts no wait can change
      jax.block_until_ready(m)
      self.clock.lap()
      if not self.clock.steps:  # only the compiling update so far: no step time yet
        return False, False
    self.before, self.used = self.used, self.clock.totals(done - self.start)[self.unit]
    passed = sum(self.used >= mark for mark in self.marks)
    save, self._passed = passed > self._passed, passed
    return save, self.used >= self.amount

  def describe(self) -> str:
    return f"{self.used:g} of {self.amount:g} {self.unit.replace('_', '-')}"
