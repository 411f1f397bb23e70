"""The training loop: SOMA recipe, metrics, checkpoints with exact resume (SPEC 3, 7).

`train(plan, workdir)` trains (or resumes) a run resolved by `spec.resolve` and placed by
`plan.place`; `run(c, workdir)` is all three, for a raw config (what `experiments/train.py` does). Resuming is the same call: the
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
from soma_jax import checkpoint_scoring, memory, records, train_state
from soma_jax import evaluate as eval_lib
from soma_jax import metrics as metrics_lib
from soma_jax import plan as plan_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import DiskFull, Interrupted, UserError, is_disk_full
from soma_jax.loop import Loop, Stop

_val_losses = jax.jit(train_state.expert_losses, static_argnames=("shared_head", "loss_fn"))
_plateau = jax.jit(train_state.plateau_update, static_argnames="cfg")
# What runs around each checkpoint save, made once per run by `make(spec, clock, workdir)`:
# `before_save(step)` in the save's time, `after_save(step, state, counters)` after it.
SAVE_HOOKS = (checkpoint_scoring.Scorer,)


def run(c: ml_collections.ConfigDict, workdir: str) -> dict:
  """The config resolved once (`spec.resolve`), placed, then trained in `workdir`: the
  summary."""
  called = time.perf_counter()
  return train(plan_lib.place(spec_lib.resolve(c)), workdir, called)


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
    changed, overrides = records.open_workdir(workdir, spec, plan.data_sha256)
    finished = records.finished_summary(workdir, spec.cadence.steps)
    if finished is not None:
      return finished
    ckpt = ckpt_lib.Checkpointer(workdir, keep=spec.cadence.keep)
    try:
      now = _resume(plan, ckpt, overrides, workdir)
      if now.start >= spec.cadence.steps:
        return records.already_trained(workdir, now.start, spec.cadence.steps, now.skipped,
                                       now.totals)
      budget = _budget(plan, now, called)
      if budget.spent():  # a run already at its budget, its summary written: nothing to redo
        finished = records.finished_summary(workdir, now.start, budget.describe())
        if finished is not None:
          return finished
      records.record_start(workdir, spec, now.start, changed, overrides, plan.data_sha256)
      with Stop() as stop, memory.matmul_precision(spec.precision):  # the step's precision
        summary = _step_loop(plan, now, budget, ckpt, workdir, stop)
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


def _budget(plan: plan_lib.Plan, now: _Now, called: float | None) -> budget_lib.Budget:
  """The run's budget, on the clock of its updates (`budget.clock`) from `now`."""
  spec, placed = plan.spec, plan.placed
  clock = budget_lib.Clock(placed.n_devices, spec.ops_step, now.totals, placed.plan_seconds,
                           now.start, placed.plan_compiles, called)
  return budget_lib.Budget(spec.budget.unit, spec.budget.amount, spec.budget.checkpoints,
                           clock, now.start, spec.budget.marks)


def _step_loop(plan: plan_lib.Plan, now: _Now, budget: budget_lib.Budget,
               ckpt: ckpt_lib.Checkpointer, workdir: str, stop: Stop) -> dict:
  """Updates from now.start to the plan's steps (or its budget) with logging, validation and
  checkpoints between."""
  cad, clock = plan.spec.cadence, budget.clock
  # closed even when an error ends the loop (a full disk must not fail again at exit)
  with metrics_lib.MetricWriter(workdir, start_step=now.start) as writer:
    log = _Log(plan, now, writer, budget)
    progress = log.progress
    hooks = [make(plan.spec, clock, workdir) for make in SAVE_HOOKS]  # made once per run
    loop = Loop(now.state, plan.step_fn, plan.batches, plan.expert_ids, plan.to_global, clock,
                stop=stop)
    status, end = "done", cad.steps
    if budget.spent():  # a resumed run already at its budget: no update, the same line
      end = now.start
      progress.message(f"budget reached: {budget.describe()} at step {now.start}")
    for done, m in loop.run(now.start, end):
      mark, spent = budget.after(done, m)
      log.write(loop, done, m, last=done == cad.steps or spent)
      if done % cad.ckpt_every == 0 or done == cad.steps or stop.signum or mark or spent:
        _checkpoint(plan, loop, ckpt, hooks, done, m)
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


def _checkpoint(plan: plan_lib.Plan, loop: Loop, ckpt: ckpt_lib.Checkpointer, hooks: list,
                done: int, m) -> None:
  """Saves the checkpoint of step `done` (ckpt_seconds) between the hooks' two halves."""
  with loop.clock.aside("ckpt_seconds", sync=m):
    counters = loop.clock.at(done)
    for hook in hooks:
      hook.before_save(done)
    ckpt.save(done, loop.state, {"iterator": plan.batches.get_state(), **counters})
  for hook in hooks:
    hook.after_save(done, loop.state, counters)


class _Log:
  """What a run records: its hparams and start line, then after each update the metrics of
  a log step, expert validation (and the plateau rule) and ensemble validation, each when
  due (all of them after the last update); and what it remembers between them."""

  def __init__(self, plan: plan_lib.Plan, now: _Now, writer: metrics_lib.MetricWriter,
               budget: budget_lib.Budget):
    """Writes the hparams (before the run's first update) and prints the start line."""
    spec = plan.spec
    self.plan, self.writer, self.clock = plan, writer, budget.clock
    if not now.totals.get("updates"):  # the run's first update (a continued seed's too)
      writer.hparams(json.loads(spec.config.to_json()))
    self.progress = metrics_lib.Progress(spec.cadence.steps, now.start)
    warm = f" (warm start from {spec.init_from})" if spec.init_from and not now.totals else ""
    self.progress.message(plan.start_line.replace("START", f"{now.start}{warm}", 1))
    if budget.amount > 0:  # the budget ends the run, not its steps: progress and ETA by it
      self.progress.track_budget(lambda: (budget.used, budget.amount), budget.unit)
    self.last_val = None  # the newest expert validation losses
    self._skipped_seen = None  # per-expert skip counters at the last log, to name new skips
    self._timed = (0.0, 0)  # clock (seconds, steps) at the last log

  def write(self, loop: Loop, done: int, m, last: bool) -> None:
    """Writes the record due after update `done` (its metrics `m`), if any."""
    spec, clock, ens = self.plan.spec, self.clock, self.plan.ensemble
    cad = spec.cadence
    record = {}
    if done % cad.log_every == 0 or last:
      record.update(self._metrics(done, m))
    if done % cad.eval_every == 0 or last:
      with clock.aside("eval_seconds", sync=m):
        val = _val_losses(loop.state.body, loop.state.head, self.plan.val_windows,
                          shared_head=spec.shared_head, loss_fn=spec.method.val_loss)
        sched = _plateau(loop.state.sched, val, done, cfg=spec.plateau)
        loop.state = loop.state.replace(sched=sched)
        self.last_val = record["val_loss"] = np.asarray(_to_host(val)).tolist()
    every = cad.ensemble_eval_every
    if ens is not None and (last or (every and done % every == 0)):
      with clock.aside("eval_seconds", sync=m):
        record["ensemble_val_loss"] = eval_lib.ensemble_loss(
            loop.state.body, loop.state.head, ens.windows, ens.router, ens.top_k,
            spec.shared_head, logits_fn=spec.method.logits)
    if record:
      record.update(clock.at(done))  # ops and seconds so far, these evals included
      self.writer.write(done, record)
      if "loss" in record:
        self.progress.update(done, record["loss"])

  def _metrics(self, done: int, m) -> dict:
    """The log step's loss, schedule, speed and skip counters."""
    m_host = _to_host(m)  # waits for every update so far
    self.clock.lap()
    seconds, steps = self.clock.seconds, self.clock.steps
    if steps > self._timed[1]:
      step_seconds = (seconds - self._timed[0]) / (steps - self._timed[1])
    else:
      step_seconds = self.clock.mean_step()
    self._timed = (seconds, steps)
    self._report_skips(done, np.asarray(m_host["skipped"]))
    return {"loss": m_host["loss"], "lr": m_host["lr"], "eps": m_host["eps"],
            "step_seconds": step_seconds,
            "tokens_per_second": self.plan.spec.tokens_step / step_seconds,
            "skipped": m_host["skipped"]}

  def _report_skips(self, step: int, skipped_N: np.ndarray) -> None:
    """Names the experts that skipped an update (non-finite loss) since the last log: read
    from the cumulative counters at log steps, so the loop never syncs for it."""
    new = skipped_N - (0 if self._skipped_seen is None else self._skipped_seen)
    self._skipped_seen = skipped_N
    if new.any():
      bad = [self.plan.spec.experts[i] for i in np.nonzero(new)[0]]
      self.progress.message(f"up to step {step}: non-finite loss in experts {bad}; they "
                            "skipped those updates, the others continued")


def _skipped(state: train_state.TrainState) -> list:
  return np.asarray(_to_host(state.skipped)).tolist()


def _to_host(tree):
  """Metrics as numpy on this host; gathers across processes in a multi-host run."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils

  return multihost_utils.process_allgather(tree, tiled=True)
