"""The training loop: SOMA recipe, metrics, checkpoints with exact resume (SPEC 3, 7).

`train(config, workdir)` is everything `experiments/train.py` does. Resuming is the same
call: the newest checkpoint in the workdir is restored (state and input iterator), and
the run continues bit-identically, because every random draw derives from (seed, step,
expert, accumulation index, direction) and the batches from (seed, expert, step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import signal
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from soma_jax import checkpoint as ckpt_lib
from soma_jax import config as config_lib
from soma_jax import evaluate as eval_lib
from soma_jax import host_devices, memory, methods, parallel, runs, spsa
from soma_jax import metrics as metrics_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.router import Router

PyTree = Any


def make_step(c: ml_collections.ConfigDict, cfg: Hashable | None = None):
  """(step(state, batch, expert_ids) -> (state, metrics) on one device, ops per update per
  expert): the method's jitted step at the run's step config `cfg` (built if None)."""
  method = methods.get(c)
  cfg = method.step_config(c) if cfg is None else cfg
  return functools.partial(method.train_step, cfg=cfg), method.ops_per_update(c)


def plateau_config(c: ml_collections.ConfigDict) -> spsa.PlateauConfig:
  return spsa.PlateauConfig(patience=c.opt.patience, floor=c.opt.floor)


# ----------------------------------------------------------------------------- loop

_val_losses = jax.jit(spsa.expert_losses, static_argnames=("shared_head", "loss_fn"))
_plateau = jax.jit(spsa.plateau_update, static_argnames="cfg")


class _Stop:
  """SIGTERM / SIGINT ask the loop to checkpoint and return after the current update."""

  def __init__(self):
    self.signum = 0
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
      raise KeyboardInterrupt
    self.signum = signum

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)


def pooled(c: ml_collections.ConfigDict) -> bool:
  """One expert on a clustered data dir reads all shards (seed run, monolithic controls)."""
  return c.n_experts == 1 and pipeline.load_manifest(c.data.dir)["num_clusters"] > 1


def _expert_val_windows(c, experts: range) -> np.ndarray:
  """[N, V, T + 1]: the same first V windows of each expert's 1% split at every eval."""
  per = [pipeline.expert_val_windows(c.data.dir, e, c.data.seq_len, pooled(c)) for e in experts]
  v = min([c.data.val_windows] + [w.shape[0] for w in per])
  return np.stack([w[:v] for w in per])


def _check_inputs(c: ml_collections.ConfigDict) -> None:
  if not c.data.dir:
    raise UserError("config.data.dir is empty; fix: --config.data.dir=DIR from "
                    "experiments/prepare_data.py")
  manifest = pipeline.check_data_dir(c.data.dir, c.n_experts)  # every file's SHA-256
  # The files read only at the end (ensemble validation) are opened now, not after training.
  router = Router.load(os.path.join(c.data.dir, "router.npz"))
  if router.num_clusters != manifest["num_clusters"]:
    raise UserError(f"{c.data.dir!r}: router.npz has {router.num_clusters} clusters, manifest.json "
                    f"{manifest['num_clusters']}; fix: re-run experiments/prepare_data.py")
  pipeline.eval_split(c.data.dir, "ensemble_val")
  if c.init_from and not os.path.isdir(c.init_from):
    raise UserError(f"init_from={c.init_from!r} does not exist; fix: the seed run's workdir")


# Cumulative seconds each run keeps in its checkpoints (SPEC 7 device-seconds, and apart).
TIMERS = ("device_seconds", "cpu_seconds", "compile_seconds", "eval_seconds", "ckpt_seconds")
TRAINING_TIMERS = ("device_seconds", "cpu_seconds")  # of training updates; the rest apart


def train_to_end(c: ml_collections.ConfigDict, workdir: str, what: str) -> dict:
  """`train`, for experiments that go on with the trained run: a run stopped early (Ctrl-C,
  SIGTERM) is a UserError naming `what`, never a half-trained input to the next stage."""
  summary = train(c, workdir)
  if summary["status"] != "done":
    raise UserError(f"{what} stopped early ({summary['status']}); rerun the same command to "
                    "resume")
  return summary


def train(c: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) the run in `workdir` to `c.steps`; returns a summary dict.

  Stages: check the inputs, lock the workdir, check a resume against the saved config,
  build the step and the input pipeline, restore the newest good checkpoint, then the step
  loop with its periodic actions. config.json and the history are written only once all of
  that passed and there is an update to make: a run already at `c.steps` or beyond changes
  nothing and returns its summary.
  """
  methods.validate(c)
  _check_inputs(c)
  lock = ckpt_lib.WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()
  with lock:
    changed, overrides, data_sha = _open_workdir(c, workdir)
    finished = _finished_summary(c, workdir)
    if finished is not None:
      return finished
    run = _build(c, workdir)
    try:
      _resume(run, overrides)
      if run.start >= c.steps:
        return _already_trained(run)
      if jax.process_index() == 0:
        ckpt_lib.write_config(workdir, c)
        ckpt_lib.record_start(workdir, run.start, changed, overrides, data_sha)
      with _Stop() as stop, memory.matmul_precision(c.precision):  # the step's precision
        summary = _step_loop(run, stop)
    except OSError as e:  # a full disk while writing metrics; checkpoints report their own
      raise UserError(f"could not write to {workdir!r} ({e.strerror or e}); the newest "
                      "checkpoint is kept; fix: free disk space and re-run the same command to "
                      "resume") from None
    finally:
      run.ckpt.close()
  if summary["status"] == "done" and jax.process_index() == 0:
    _write_summary(workdir, summary)
  return summary


SUMMARY_FILE = "summary.json"


def _write_summary(workdir: str, summary: dict) -> None:
  tmp = os.path.join(workdir, SUMMARY_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump(summary, f, indent=1)
  os.replace(tmp, os.path.join(workdir, SUMMARY_FILE))


def _done_message(workdir: str, step: int, steps: int) -> None:
  metrics_lib.Progress(steps, step).message(
      f"{workdir} is already trained to step {step} (steps={steps}); nothing changed; raise "
      "--config.steps to continue")


def _finished_summary(c: ml_collections.ConfigDict, workdir: str) -> dict | None:
  """summary.json of a run that finished at its newest checkpoint, at or past `c.steps`."""
  path = os.path.join(workdir, SUMMARY_FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return None  # rewritten by the run below
  step = summary.get("step") if isinstance(summary, dict) else None
  if not isinstance(step, int) or step < c.steps or step != ckpt_lib.newest_step(workdir):
    return None
  _done_message(workdir, step, c.steps)
  return summary


def _already_trained(run: _Run) -> dict:
  """The summary of a resumed run that has nothing to do (its checkpoint at or past steps);
  summary.json is written only when it is missing and the run stands exactly at steps."""
  _done_message(run.workdir, run.start, run.c.steps)
  records = metrics_lib.read_metrics(run.workdir)
  val = [r["val_loss"] for r in records if "val_loss" in r and r["step"] <= run.start]
  summary = {"status": "done", "step": run.start, "signal": 0, "val_loss": val[-1] if val else None,
             "skipped": np.asarray(_to_host(run.state.skipped)).tolist(), **run.totals}
  if run.start == run.c.steps and jax.process_index() == 0:
    _write_summary(run.workdir, summary)
  return summary


def _open_workdir(c: ml_collections.ConfigDict, workdir: str):
  """(allowed changes, resume_overrides, data manifest hash); writes nothing."""
  data_sha = ckpt_lib.manifest_sha256(c.data.dir)
  changed, overrides = {}, []
  if ckpt_lib.has_checkpoint(workdir) and os.path.isfile(
      os.path.join(workdir, ckpt_lib.CONFIG_FILE)):
    changed, overrides = ckpt_lib.check_resume(workdir, c, data_sha)
  return changed, overrides, data_sha


@dataclasses.dataclass
class _Run:
  """What the step loop works on: built by `_build`, restored by `_resume`."""

  c: ml_collections.ConfigDict
  method: methods.Method
  step_cfg: Hashable  # the method's static step settings, built once per run
  workdir: str
  experts: range  # the job's experts (global ids)
  state: spsa.TrainState
  step_fn: Callable
  expert_ids: jax.Array
  to_global: Callable
  data: pipeline.TrainBatches
  ckpt: ckpt_lib.Checkpointer
  n_devices: int  # devices the step runs on
  layout: parallel.Layout
  ops_step: int  # operations of one update of the job's experts (SPEC 7)
  tokens_step: int
  chunk: memory.ChunkChoice
  val_windows: jax.Array  # [N, V, T + 1]: the same expert-validation windows at every eval
  plan_seconds: float = 0.0  # choosing the chunk: compiling the step (compile_seconds)
  start: int = 0
  totals: dict = dataclasses.field(default_factory=dict)  # restored cumulative counters


def _build(c: ml_collections.ConfigDict, workdir: str) -> _Run:
  """The step config (once), the initial state, the jitted step on its devices, the inputs."""
  method = methods.get(c)
  a, b = config_lib.expert_range(c)
  n_local = b - a
  mesh, placed = _mesh(c, method, n_local)
  t0 = time.perf_counter()
  chunk = methods.choose_chunk(c, n_local, mesh)  # compiles the step (reused on one device)
  plan_seconds = time.perf_counter() - t0
  step_cfg = method.step_config(c, chunk.chunk)
  state = runs.initial_state(c, step_cfg)
  step_fn, ops_expert = make_step(c, step_cfg)  # one device's step; a mesh's replaces it
  if mesh is None:
    # Every leaf committed to the device: a warm start's leaves come from a restored seed run
    # (committed), a fresh init's not, and the step's outputs are; a mixture compiled the
    # step once per pattern (3 times for a warm start, its compiles counted as training).
    state = jax.device_put(state, parallel.one_device())
    feed = list(range(a, b))  # this process feeds every expert of the job
    expert_ids = jnp.arange(a, b, dtype=jnp.int32)
    to_global = functools.partial(jax.tree.map, jnp.asarray)  # an array or a dict of them
  else:
    feed = [a + i for i in parallel.local_experts(n_local, mesh)]  # only this host's data
    expert_ids = parallel.expert_ids(n_local, mesh, first=a)
    to_global = functools.partial(parallel.global_batch, mesh=mesh)
    step_fn = method.sharded_step(step_cfg, mesh)
    state = parallel.put_state(state, mesh)
  data = method.train_data(c, feed, pooled(c))
  ops_step = ops_expert * n_local
  return _Run(c=c, method=method, step_cfg=step_cfg, workdir=workdir, experts=range(a, b),
              state=state, step_fn=step_fn, expert_ids=expert_ids, to_global=to_global,
              data=data, ckpt=ckpt_lib.Checkpointer(workdir, keep=c.ckpt.keep),
              n_devices=1 if mesh is None else mesh.size, layout=placed, ops_step=ops_step,
              tokens_step=ops_step // method.flops_per_token(c),
              chunk=chunk, val_windows=to_global(_expert_val_windows(c, feed)),
              plan_seconds=plan_seconds)


def _resume(run: _Run, overrides: list[str]) -> None:
  """Restores the newest good checkpoint (moving unreadable ones aside) into `run`.

  Restoring onto the current layout: a checkpoint written on another device count is
  resharded by orbax to the shardings of this abstract state. Fields named in
  `resume_overrides` that live in the state (opt.lr, spsa.eps) take their new values.
  """
  restored = run.ckpt.restore_latest(ckpt_lib.abstract_like(run.state), heal=True)
  if restored is None:  # a fresh run; one continuing its seed (init_state) counts on from it
    run.start = int(run.state.step)
    return
  step, state, data_state = restored
  iterator = data_state["iterator"]
  overridden = lambda key: ckpt_lib.under(key, overrides)
  if overridden("seed") or overridden("spsa.batch"):  # same position, new draws
    iterator = {**run.data.get_state(),
                **{k: iterator[k] for k in ("step", "position") if k in iterator}}
  run.data.set_state(iterator)
  sched = state.sched
  if overridden("opt.lr"):
    sched = sched.replace(lr=jnp.full_like(sched.lr, run.c.opt.lr))
  if overridden("spsa.eps"):
    sched = sched.replace(eps=jnp.full_like(sched.eps, run.c.spsa.eps))
  run.state = state.replace(sched=sched)
  run.start = int(step)
  run.totals = {k: float(data_state.get(k, 0.0)) for k in TIMERS}
  run.totals["ops"] = int(data_state.get("ops", run.ops_step * step))
  run.totals["updates"] = int(data_state.get("updates", step))  # this run's, warm start aside
  logging.info("resumed from step %d in %s", step, run.workdir)


class _Clock:
  """Device-seconds of training updates only, the rest apart (SPEC 7): wall seconds x
  `host_devices.charged_units`, i.e. core-seconds on a CPU (every core the process may use,
  whatever the layout, so that methods that shard and methods that cannot are charged
  alike) and device-seconds of the step's devices elsewhere.

  `count` each update dispatched, `lap` once they have all finished; time `aside` for
  evaluation, checkpoint saves and the first (compiling) update. Training time is
  reported as updates x mean step seconds, so the compiling update counts at the mean
  and only its excess is compile time.
  """

  def __init__(self, run: _Run):
    self.units = host_devices.charged_units(run.n_devices)
    self.ops_step, self.base = run.ops_step, run.totals
    self.seconds, self.cpu, self.steps, self._pending = 0.0, 0.0, 0, 0
    self.apart = dict.fromkeys((k for k in TIMERS if k not in TRAINING_TIMERS), 0.0)
    self._planned = run.plan_seconds  # compile time before the loop, added to compile_seconds
    self._t, self._cpu_t = time.perf_counter(), time.process_time()

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
    yield
    now = time.perf_counter()
    self.apart[key] += now - self._t
    self._t, self._cpu_t = now, time.process_time()

  def mean_step(self) -> float:
    if self.steps:
      return self.seconds / self.steps
    return self.apart["compile_seconds"]  # only the compiling update so far

  def totals(self, updates: int) -> dict:
    """Cumulative ops and seconds after `updates` updates of this process."""
    mean = self.mean_step()
    cpu_mean = self.cpu / self.steps if self.steps else 0.0
    out = {"ops": int(self.base.get("ops", 0)) + self.ops_step * updates,
           "updates": int(self.base.get("updates", 0)) + updates,
           "device_seconds": mean * updates * self.units, "cpu_seconds": cpu_mean * updates}
    apart = dict(self.apart, compile_seconds=max(self.apart["compile_seconds"] - mean, 0.0)
                 + self._planned)
    out.update({k: v * self.units for k, v in apart.items()})
    return {k: v + self.base.get(k, 0) if k not in ("ops", "updates") else v
            for k, v in out.items()}


class _Budget:
  """The run's budget (`budget`, in `budget_unit`): a checkpoint after each 1/k of it, and
  the stop after the complete update that reaches it.

  "updates" counts this run's updates; "cpu_seconds" the process's CPU time in training
  updates (all threads: a busy machine slows the run but does not move the count much);
  "device_seconds" the charged training seconds of `_Clock` (core-seconds on a CPU). With a
  time budget every update is waited for before the next is dispatched, so the seconds are
  known after each one. SPEC 9.2's Table 7 runs also stopped after a complete update; their
  budget was GPU-hours; SPEC 9.6 says which unit a CPU-scale comparison may use.
  """

  def __init__(self, c: ml_collections.ConfigDict, clock: _Clock, start: int):
    self.amount = float(c.get("budget", 0.0))
    self.unit = c.get("budget_unit", "device_seconds")
    k = int(c.get("budget_checkpoints", 1))
    self.marks = [self.amount * (i + 1) / k for i in range(k)]
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
    if self.unit != "updates":
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


def _step_loop(run: _Run, stop: _Stop) -> dict:
  """Updates from run.start to c.steps (or the time budget) with logging, validation and
  checkpoints between."""
  c = run.c
  # closed even when an error ends the loop (a full disk must not fail again at exit)
  with metrics_lib.MetricWriter(run.workdir, start_step=run.start) as writer:
    if not run.totals.get("updates"):  # the run's first update (a continued seed's too)
      writer.hparams(json.loads(c.to_json()))
    progress = metrics_lib.Progress(c.steps, run.start)
    _start_message(run, progress)
    clock = _Clock(run)
    budget = _Budget(c, clock, run.start)
    if budget.amount > 0:  # the budget ends the run, not c.steps: progress and ETA by it
      progress.track_budget(lambda: (budget.used, budget.amount), budget.unit)
    log = _Log(run, clock, progress)
    pending = None  # the previous update's metrics
    status = "done"
    end = run.start if budget.spent() else c.steps  # a resumed run already at its budget: done
    for step in range(run.start, end):
      batch = run.to_global(next(run.data))
      if pending is None:  # this process's first update compiles the step
        with clock.aside("compile_seconds"):
          run.state, m = run.step_fn(run.state, batch, run.expert_ids)
          jax.block_until_ready(m)
      else:
        run.state, m = run.step_fn(run.state, batch, run.expert_ids)
        clock.count()
        jax.block_until_ready(pending)  # at most one update in flight: signals act within one
      pending = m
      done = step + 1
      mark, spent = budget.after(done, m)
      record = _periodic_evals(run, done, m, clock, log, last=done == c.steps or spent)
      if record:
        writer.write(done, record)
        if "loss" in record:
          progress.update(done, record["loss"])
      if done % c.ckpt_every == 0 or done == c.steps or stop.signum or mark or spent:
        with clock.aside("ckpt_seconds", sync=m):
          run.ckpt.save(done, run.state, {"iterator": run.data.get_state(),
                                          **clock.totals(done - run.start)})
      if spent:
        progress.message(f"budget reached: {budget.describe()} after {done} updates")
        break
      if stop.signum:
        status = "interrupted"
        progress.message(f"stopping: checkpoint at step {done} ({signal.Signals(stop.signum).name})"
                         "; run the same command again to resume")
        break
  done = int(run.state.step)
  return {"status": status, "step": done, "signal": stop.signum, "val_loss": log.last_val,
          "budget_unit": budget.unit, "budget_before_last_update": budget.before,
          "skipped": np.asarray(_to_host(run.state.skipped)).tolist(),
          **clock.totals(done - run.start)}


def _start_message(run: _Run, progress: metrics_lib.Progress) -> None:
  """The start-up line: experts, sizes, steps (and time budget), devices, chunk, precision."""
  c = run.c
  a, b = run.experts.start, run.experts.stop
  # The signs setting of an SPSA step (the methods with a pert_chunk to plan).
  signs = (f"signs {run.step_cfg.spsa.signs}; forward {run.step_cfg.spsa.forward}; "
           if run.method.plan_chunk else "")
  warm = f" (warm start from {c.init_from})" if c.init_from and run.start == 0 else ""
  budget = (f"; until {c.budget:g} training {c.budget_unit.replace('_', '-')}"
            if c.get("budget", 0.0) else "")
  progress.message(
      f"training experts {a}..{b - 1} of {c.n_experts} "
      f"({run.method.body_params(c):,} params each) from step "
      f"{run.start}{warm} to {c.steps}{budget} on {_devices_line(run.layout)}; "
      f"{run.chunk.describe()}; "
      f"{signs}matmul precision {c.precision}")


def _devices_line(placed: parallel.Layout) -> str:
  """'2 cpu devices (one per usable core), experts over 2 devices (FSO)' and the like."""
  d, platform = jax.device_count(), jax.devices()[0].platform
  line = f"{d} {platform} device{'s' if d > 1 else ''}"
  if platform == "cpu":
    how = host_devices.chosen_by or "JAX's default"
    cores = host_devices.usable_cores()
    line += (" (one per usable core)" if how == "one per usable core" and cores == d
             else f" ({how}; {cores} usable core{'s' if cores > 1 else ''})")
  return f"{line}, {placed.why}"


class _Log:
  """The metrics record of a log step, and what it remembers between log steps."""

  def __init__(self, run: _Run, clock: _Clock, progress: metrics_lib.Progress):
    self.run, self.clock, self.progress = run, clock, progress
    self.last_val = None
    self._skipped_seen = None  # per-expert skip counters at the last log, to name new skips
    self._timed = (0.0, 0)  # clock (seconds, steps) at the last log

  def record(self, done: int, m) -> dict:
    m_host = _to_host(m)  # waits for every update so far
    self.clock.lap()
    seconds, steps = self.clock.seconds, self.clock.steps
    if steps > self._timed[1]:
      step_seconds = (seconds - self._timed[0]) / (steps - self._timed[1])
    else:
      step_seconds = self.clock.mean_step()
    self._timed = (seconds, steps)
    self._skipped_seen = _report_skips(done, m_host["skipped"], self._skipped_seen,
                                       self.run.experts, self.progress)
    return {"loss": m_host["loss"], "lr": m_host["lr"], "eps": m_host["eps"],
            "step_seconds": step_seconds, "tokens_per_second": self.run.tokens_step / step_seconds,
            "skipped": m_host["skipped"]}


def _periodic_evals(run: _Run, done: int, m, clock: _Clock, log: _Log, last: bool) -> dict:
  """The log record, expert validation (+ plateau rule) and ensemble validation due now
  (all of them after the `last` update)."""
  c = run.c
  record = {}
  if done % c.log_every == 0 or last:
    record.update(log.record(done, m))
  if done % c.eval_every == 0 or last:
    with clock.aside("eval_seconds", sync=m):
      val = _val_losses(run.state.body, run.state.head, run.val_windows,
                        shared_head=c.model.shared_head, loss_fn=run.method.val_loss)
      sched = _plateau(run.state.sched, val, done, cfg=plateau_config(c))
      run.state = run.state.replace(sched=sched)
      log.last_val = record["val_loss"] = np.asarray(_to_host(val)).tolist()
  every = c.ensemble_eval_every
  ensemble_due = every >= 0 and (last or (every and done % every == 0))
  if ensemble_due and len(run.experts) == c.n_experts and jax.process_count() == 1:
    with clock.aside("eval_seconds", sync=m):
      ens = ensemble_validation(c, run.state)
    if ens is not None:
      record["ensemble_val_loss"] = ens
  if record:
    record.update(clock.totals(done - run.start))  # ops and seconds so far, these evals included
  return record


def layout(c: ml_collections.ConfigDict, n_local: int,
           method: methods.Method | None = None) -> parallel.Layout:
  """mesh.expert x mesh.pert for this job's `n_local` experts on this process's devices."""
  method = method or methods.get(c)
  chunk = config_lib.pert_chunk(c) if method.plan_chunk else "auto"
  return parallel.resolve_layout(
      str(c.mesh.expert), str(c.mesh.pert), n_experts=n_local, n_pert=c.spsa.n_pert,
      n_devices=jax.device_count(), chunk=None if chunk == "auto" else chunk,
      can_shard=method.sharded_step is not None, method=c.method,
      backend=jax.default_backend(), processes=jax.process_count())


def _mesh(c: ml_collections.ConfigDict, method: methods.Method, n_local: int):
  """(the device mesh, or None for a plain one-device run; the layout it realises)."""
  chosen = layout(c, n_local, method)
  if (chosen.expert, chosen.pert) == (1, 1) and jax.process_count() == 1:
    return None, chosen
  return parallel.make_mesh(chosen.expert, chosen.pert, n_experts=n_local), chosen


def _to_host(tree):
  """Metrics as numpy on this host; gathers across processes in a multi-host run."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils

  return multihost_utils.process_allgather(tree, tiled=True)


def _report_skips(step: int, skipped_N, seen, experts: range,
                  progress: metrics_lib.Progress):
  """Names the experts that skipped an update (non-finite loss) since the last log.

  Read from the cumulative counters at log steps, so the loop never syncs for it.
  """
  skipped_N = np.asarray(skipped_N)
  new = skipped_N - (0 if seen is None else seen)
  if new.any():
    bad = [experts[i] for i in np.nonzero(new)[0]]
    progress.message(f"up to step {step}: non-finite loss in experts {bad}; they skipped "
                     "those updates, the others continued")
  return skipped_N


def ensemble_validation(c: ml_collections.ConfigDict, state: spsa.TrainState,
                        max_windows: int = 256) -> float | None:
  """Routed top-k ensemble loss on the data dir's ensemble-validation windows."""
  windows, _ = pipeline.eval_split(c.data.dir, "ensemble_val")
  if windows.shape[0] == 0:
    return None
  router = Router.load(os.path.join(c.data.dir, "router.npz"))
  return eval_lib.ensemble_loss(state.body, state.head, windows[:max_windows], router,
                                min(4, c.n_experts), c.model.shared_head,
                                logits_fn=methods.get(c).logits)
