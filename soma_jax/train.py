"""The training loop: SOMA recipe, metrics, checkpoints with exact resume (SPEC 3, 7).

`train(plan, workdir)` trains (or resumes) a run resolved by `plan.resolve`; `run(c, workdir)`
is both, for a raw config (what `experiments/train.py` does). Resuming is the same call: the
newest checkpoint in the workdir is restored (state and input iterator), and the run
continues bit-identically, because every random draw derives from (seed, step, expert,
accumulation index, direction) and the batches from (seed, expert, step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from soma_jax import budget as budget_lib
from soma_jax import checkpoint as ckpt_lib
from soma_jax import checkpoint_scores as scores_lib
from soma_jax import evaluate as eval_lib
from soma_jax import memory, records, train_state
from soma_jax import metrics as metrics_lib
from soma_jax import plan as plan_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import DiskFull, Interrupted, UserError, is_disk_full
from soma_jax.loop import Loop

_val_losses = jax.jit(train_state.expert_losses, static_argnames=("shared_head", "loss_fn"))
_plateau = jax.jit(train_state.plateau_update, static_argnames="cfg")


def run(c: ml_collections.ConfigDict, workdir: str) -> dict:
  """The config resolved once (`plan.resolve`), then trained in `workdir`: the summary."""
  called = time.perf_counter()
  return train(plan_lib.resolve(c), workdir, called)


def train_to_end(spec: spec_lib.RunSpec, workdir: str, what: str) -> dict:
  """The resolved run placed and trained, for experiments that go on with it: a run stopped
  early (Ctrl-C, SIGTERM) is a UserError naming `what`, never a half-trained input to the
  next stage."""
  called = time.perf_counter()
  summary = train(plan_lib.place(spec), workdir, called)
  if summary["status"] == "interrupted":  # a signal: the whole study stops, not just this run
    signum = summary.get("signal") or signal.SIGINT
    raise Interrupted(f"{what} stopped early (interrupted by {signal.Signals(signum).name}, "
                      f"saved at step {summary.get('step', '?')}); rerun the same command to "
                      "resume", signum)
  if summary["status"] != "done":
    raise UserError(f"{what} stopped early ({summary['status']}); rerun the same command to "
                    "resume")
  return summary


def train(plan: plan_lib.Plan, workdir: str, called: float | None = None) -> dict:
  """Trains (or resumes) the planned run in `workdir` to its steps or budget; the summary.
  `called`: when this call began (time.perf_counter, before placing), from which the run's
  physical_seconds count (None: now).

  Stages: lock the workdir, check a resume against the saved config, restore the newest
  good checkpoint, then the update loop with its periodic actions. config.json and the
  history are written only once all of that passed and there is an update to make: a run
  already at its steps or beyond changes nothing and returns its summary.
  """
  spec = plan.spec
  lock = ckpt_lib.WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()
  with lock:
    changed, overrides = records.open_workdir(workdir, spec.config, plan.data_sha256,
                                              spec.method.shape_keys, spec.method.speed_keys)
    finished = records.finished_summary(workdir, spec.cadence.steps)
    if finished is not None:
      return finished
    ckpt = ckpt_lib.Checkpointer(workdir, keep=spec.cadence.keep)
    try:
      now = _resume(plan, ckpt, overrides, workdir)
      if now.start >= spec.cadence.steps:
        return records.already_trained(workdir, now.start, spec.cadence.steps, now.skipped,
                                       now.totals)
      b = spec.budget  # a run already at its budget, its summary written: nothing to redo
      if b.amount > 0 and float(now.totals.get(b.unit, 0.0)) >= b.amount:
        finished = records.finished_summary(
            workdir, now.start,
            f"{float(now.totals.get(b.unit, 0.0)):g} of {b.amount:g} {b.unit.replace('_', '-')}")
        if finished is not None:
          return finished
      records.record_start(workdir, spec.config, now.start, changed, overrides,
                           plan.data_sha256)
      with _Stop() as stop, memory.matmul_precision(spec.precision):  # the step's precision
        summary = _step_loop(plan, now, ckpt, workdir, stop, called)
    except OSError as e:  # a full disk while writing metrics; checkpoints report their own
      error = DiskFull if is_disk_full(e) else UserError
      raise error(f"could not write to {workdir!r} ({e.strerror or e}); the newest "
                  "checkpoint is kept; fix: free disk space and re-run the same command to "
                  "resume") from None
    finally:
      ckpt.close()
  if summary["status"] == "done" and jax.process_index() == 0:
    records.write_summary(workdir, summary)
  return summary


class _Stop:
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


@dataclasses.dataclass
class _Now:
  """Where the run stands: its state, the step it starts from, the restored totals."""

  state: train_state.TrainState
  start: int = 0
  totals: dict = dataclasses.field(default_factory=dict)  # cumulative counters

  @property
  def skipped(self) -> list:
    return _skipped(self.state)


def _resume(plan: plan_lib.Plan, ckpt: ckpt_lib.Checkpointer, overrides: list[str],
            workdir: str) -> _Now:
  """The newest good checkpoint restored (unreadable ones moved aside), or the plan's start.

  Restoring onto the current layout: a checkpoint written on another device count is
  resharded by orbax to the shardings of this abstract state. Fields named in
  `resume_overrides` that live in the state (opt.lr, spsa.eps) take their new values.
  """
  # onto the state's shapes alone: a resume reads no seed (plan.state is read only here)
  restored = ckpt.restore_latest(plan.abstract_state, heal=True)
  if restored is None:  # a fresh run; one continuing its seed (init_state) counts on from it
    return _Now(plan.state, int(plan.state.step))
  step, state, data_state = restored
  iterator = data_state["iterator"]
  overridden = lambda key: ckpt_lib.under(key, overrides)
  if overridden("seed") or overridden("spsa.batch"):  # same position, new draws
    iterator = {**plan.batches.get_state(),
                **{k: iterator[k] for k in ("step", "position") if k in iterator}}
  plan.batches.set_state(iterator)
  sched = state.sched
  if overridden("opt.lr"):
    sched = sched.replace(lr=jnp.full_like(sched.lr, plan.spec.lr))
  if overridden("spsa.eps"):
    sched = sched.replace(eps=jnp.full_like(sched.eps, plan.spec.eps))
  totals = {k: float(data_state.get(k, 0.0)) for k in budget_lib.TIMERS}
  totals["ops"] = int(data_state.get("ops", plan.spec.ops_step * step))
  totals["updates"] = int(data_state.get("updates", step))  # this run's, warm start aside
  totals["step_compiles"] = int(data_state.get("step_compiles", 0))
  logging.info("resumed from step %d in %s", step, workdir)
  return _Now(state.replace(sched=sched), int(step), totals)


def _step_loop(plan: plan_lib.Plan, now: _Now, ckpt: ckpt_lib.Checkpointer, workdir: str,
               stop: _Stop, called: float | None = None) -> dict:
  """Updates from now.start to the plan's steps (or its budget) with logging, validation and
  checkpoints between."""
  spec = plan.spec
  cad = spec.cadence
  # closed even when an error ends the loop (a full disk must not fail again at exit)
  with metrics_lib.MetricWriter(workdir, start_step=now.start) as writer:
    if not now.totals.get("updates"):  # the run's first update (a continued seed's too)
      writer.hparams(json.loads(spec.config.to_json()))
    progress = metrics_lib.Progress(cad.steps, now.start)
    warm = f" (warm start from {spec.init_from})" if spec.init_from and not now.totals else ""
    progress.message(plan.start_line.replace("START", f"{now.start}{warm}", 1))
    placed = plan.placed
    clock = budget_lib.Clock(placed.n_devices, spec.ops_step, now.totals, placed.plan_seconds,
                             now.start, placed.plan_compiles, called)
    budget = budget_lib.Budget(spec.budget.unit, spec.budget.amount, spec.budget.checkpoints,
                               clock, now.start, spec.budget.marks)
    if budget.amount > 0:  # the budget ends the run, not its steps: progress and ETA by it
      progress.track_budget(lambda: (budget.used, budget.amount), budget.unit)
    log = _Log(plan, clock, progress)
    scorer = _checkpoint_scorer(spec, clock)  # built once per run
    loop = Loop(now.state, plan.step_fn, plan.batches, plan.expert_ids, plan.to_global, clock,
                stop=stop)
    status = "done"
    end = cad.steps
    if budget.spent():  # a resumed run already at its budget: no update, the same line
      end = now.start
      progress.message(f"budget reached: {budget.describe()} at step {now.start}")
    for done, m in loop.run(now.start, end):
      mark, spent = budget.after(done, m)
      record = _periodic_evals(plan, loop, done, m, log, last=done == cad.steps or spent)
      if record:
        writer.write(done, record)
        if "loss" in record:
          progress.update(done, record["loss"])
      if done % cad.ckpt_every == 0 or done == cad.steps or stop.signum or mark or spent:
        _checkpoint(plan, loop, ckpt, scorer, workdir, done, m)
      if spent:
        progress.message(f"budget reached: {budget.describe()} at step {done}")
        break
      if stop.signum:
        status = "interrupted"
        progress.message(f"stopping: checkpoint at step {done} ({signal.Signals(stop.signum).name})"
                         "; run the same command again to resume")
        break
    if loop.abandoned:  # a signal during the first update: nothing new to save
      status = "interrupted"
      progress.message(f"stopping: the update after step {now.start} was left unfinished "
                       f"({signal.Signals(stop.signum).name}); nothing since step {now.start} "
                       "to save; run the same command again to resume")
  done = now.start if loop.abandoned else int(loop.state.step)
  return {"status": status, "step": done, "signal": stop.signum, "val_loss": log.last_val,
          "budget_unit": budget.unit, "budget_before_last_update": budget.before,
          "skipped": None if loop.abandoned else _skipped(loop.state), **clock.at(done)}


def _checkpoint_scorer(spec: spec_lib.RunSpec, clock: budget_lib.Clock
                       ) -> eval_lib.TestSet | None:
  """The set config.checkpoint_eval names (read apart, as eval_seconds), or None: off, or a
  run over several processes (whose state no one process holds; the study restores)."""
  e = spec.checkpoint_eval
  if e is None or jax.process_count() > 1:
    return None
  with clock.aside("eval_seconds"):
    return eval_lib.TestSet(e.data_dir, e.max_windows, e.split, e.route, e.score)


def _checkpoint(plan: plan_lib.Plan, loop: Loop, ckpt: ckpt_lib.Checkpointer,
                scorer: eval_lib.TestSet | None, workdir: str, done: int, m) -> None:
  """Saves the checkpoint of step `done` (ckpt_seconds); with a scorer, then scores it from
  the state in memory (eval_seconds) and writes its per-window losses beside it
  (`checkpoint_scores`), copied first onto the one device a restore puts it on, so they
  are bit for bit what restoring and scoring it gives."""
  spec, clock = plan.spec, loop.clock
  with clock.aside("ckpt_seconds", sync=m):
    counters = clock.at(done)
    scores_lib.forget(workdir, done)  # never beside an older attempt's scores, scored or not
    ckpt.save(done, loop.state, {"iterator": plan.batches.get_state(), **counters})
  if scorer is None:
    return
  with clock.aside("eval_seconds"):
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    body, head = jax.device_put((loop.state.body, loop.state.head), one)
    losses = scorer.losses(body, head, spec.n_experts, spec.shared_head, spec.method.logits)
    scores_lib.write(workdir, done, losses, scorer.settings(), counters)


class _Log:
  """The metrics record of a log step, and what it remembers between log steps."""

  def __init__(self, plan: plan_lib.Plan, clock: budget_lib.Clock,
               progress: metrics_lib.Progress):
    self.experts, self.tokens_step = plan.spec.experts, plan.spec.tokens_step
    self.clock, self.progress = clock, progress
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
                                       self.experts, self.progress)
    return {"loss": m_host["loss"], "lr": m_host["lr"], "eps": m_host["eps"],
            "step_seconds": step_seconds, "tokens_per_second": self.tokens_step / step_seconds,
            "skipped": m_host["skipped"]}


def _periodic_evals(plan: plan_lib.Plan, loop: Loop, done: int, m, log: _Log,
                    last: bool) -> dict:
  """The log record, expert validation (+ plateau rule) and ensemble validation due now
  (all of them after the `last` update)."""
  spec, clock = plan.spec, log.clock
  cad = spec.cadence
  record = {}
  if done % cad.log_every == 0 or last:
    record.update(log.record(done, m))
  if done % cad.eval_every == 0 or last:
    with clock.aside("eval_seconds", sync=m):
      val = _val_losses(loop.state.body, loop.state.head, plan.val_windows,
                        shared_head=spec.shared_head, loss_fn=spec.method.val_loss)
      sched = _plateau(loop.state.sched, val, done, cfg=spec.plateau)
      loop.state = loop.state.replace(sched=sched)
      log.last_val = record["val_loss"] = np.asarray(_to_host(val)).tolist()
  every, ens = cad.ensemble_eval_every, plan.ensemble
  if ens is not None and (last or (every and done % every == 0)):
    with clock.aside("eval_seconds", sync=m):
      record["ensemble_val_loss"] = eval_lib.ensemble_loss(
          loop.state.body, loop.state.head, ens.windows, ens.router, ens.top_k,
          spec.shared_head, logits_fn=spec.method.logits)
  if record:
    record.update(clock.at(done))  # ops and seconds so far, these evals included
  return record


def _skipped(state: train_state.TrainState) -> list:
  return np.asarray(_to_host(state.skipped)).tolist()


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
