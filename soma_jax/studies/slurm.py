"""The submitit executors: one job per run, `submitit:slurm` on a SLURM cluster and
`submitit:local` on this machine, and the --slurm_* settings they take.

A job's submission, log and result files are in WORKDIR/submitit/; a preempted or timed-out job
checkpoints and requeues itself, and the requeued job resumes from its own folder.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
import time

import submitit

from soma_jax.errors import Interrupted, UserError
from soma_jax.studies.jobs import (
  Host,
  Job,
  error_line,
  parent_host,
  stage_failed,
  start_worker,
  train_job,
)

# The `slurm` settings (compare.py's --slurm_* flags) and what each must be.
SLURM_KEYS = {
    "partition": "a partition name", "time": "minutes per job, an integer >= 1",
    "gpus_per_node": "GPUs per job, an integer >= 0", "cpus_per_task": "an integer >= 1",
    "mem_gb": "GB per job, a number > 0", "account": "an account name", "qos": "a QOS name",
}
# Each setting's compare.py flag (account and QOS: none yet).
SLURM_FLAGS = {"partition": "--slurm_partition", "time": "--slurm_time",
               "gpus_per_node": "--slurm_gpus", "cpus_per_task": "--slurm_cpus",
               "mem_gb": "--slurm_mem_gb", "account": "--slurm_account", "qos": "--slurm_qos"}
SLURM_DEFAULT_TIME = 60  # minutes per job (submitit's own default is 5)
LOCAL_DEFAULT_TIME = 7 * 24 * 60  # submitit:local stops a job at its time (default 2 min)
# How often a job may reach its time limit and be requeued: each requeue resumes from the
# run's checkpoint, so a long run goes on over many short jobs (submitit's default is 3).
MAX_REQUEUES = 100
SUBMITIT_DIR = "submitit"  # submitit: each run's submission, logs and result, in its folder


class _Train(submitit.helpers.Checkpointable):
  """A submitit job: one run trained in its worker with the parent's layout (`Host`).

  On submitit's preemption / time-limit signal (USR2, `signal_delay_s` before the limit) the
  training loop is asked to stop (SIGTERM to itself: it checkpoints after the current update
  and returns), then submitit's own handler calls `checkpoint` (the same job again) and
  requeues it; the requeued job resumes from the run's folder. A signal that comes when no
  training loop listens (compiling, restoring) requeues at once: the newest checkpoint on
  disk is where the next job resumes.
  """

  def __init__(self, host: Host):
    self.host = host

  def __call__(self, job: Job) -> float:
    start_worker(self.host)
    usr = submitit.JobEnvironment._usr_sig()
    requeue = signal.getsignal(usr)  # submitit's checkpoint_and_try_requeue
    idle_term = signal.getsignal(signal.SIGTERM)  # submitit's, while no training loop runs
    asked = []

    def on_usr(signum, frame):
      if asked:  # a second signal: the stop is under way (a second SIGTERM would abort it)
        return
      if signal.getsignal(signal.SIGTERM) == idle_term:  # no loop to stop: requeue now
        requeue(signum, frame)
        return
      asked.append((signum, frame))
      os.kill(os.getpid(), signal.SIGTERM)  # the loop's stop: checkpoint, then return

    if callable(requeue):
      signal.signal(usr, on_usr)
    try:
      return train_job(job)
    except Interrupted:
      if asked:  # stopped for the signal, after a checkpoint: requeue (this job exits)
        requeue(*asked[0])
      raise
    finally:
      if callable(requeue):
        signal.signal(usr, requeue)

  def checkpoint(self, job: Job) -> submitit.helpers.DelayedSubmission:
    """The same job again: the run resumes from its own folder's newest checkpoint."""
    return submitit.helpers.DelayedSubmission(self, job)


def slurm_parameters(settings: dict, cluster: str, gpus: int, job: Job) -> dict:
  """AutoExecutor.update_parameters for one job from the checked `slurm` settings."""
  local = cluster == "local"
  params = {
      "name": re.sub(r"[^\w.=+-]+", "_", job.what)[:120] or "soma_jax",
      "timeout_min": int(settings.get("time", LOCAL_DEFAULT_TIME if local else SLURM_DEFAULT_TIME)),
      "gpus_per_node": int(settings.get("gpus_per_node", gpus if local else 0)),
      "nodes": 1, "tasks_per_node": 1,
  }
  if local:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if all(v.strip().isdigit() for v in visible):  # keep this process's own GPU numbering
      params["local_visible_gpus"] = tuple(int(v) for v in visible)
    return params
  for key, param in (("cpus_per_task", "cpus_per_task"), ("mem_gb", "mem_gb"),
                     ("partition", "slurm_partition"), ("account", "slurm_account"),
                     ("qos", "slurm_qos")):
    if key in settings:
      params[param] = settings[key]
  return params


class Submitit:
  """One submitit job per run, in WORKDIR/submitit/ (`cluster` "slurm" or "local")."""

  def __init__(self, cluster: str, settings: dict):
    self.cluster, self.settings = cluster, settings
    self.name = f"submitit:{cluster}"
    self.poll_s = 0.5 if cluster == "local" else 10.0

  def submit(self, jobs: list[Job]) -> list[submitit.Job]:
    """Every job submitted (none waited for)."""
    import jax

    host = parent_host()
    gpus = jax.local_device_count() if jax.default_backend() == "gpu" else 0
    out = []
    for job in jobs:
      job = dataclasses.replace(job, workdir=os.path.abspath(job.workdir))
      ex = submitit.AutoExecutor(folder=os.path.join(job.workdir, SUBMITIT_DIR),
                                 cluster=self.cluster, slurm_max_num_timeout=MAX_REQUEUES,
                                 local_max_num_timeout=MAX_REQUEUES)
      ex.update_parameters(**slurm_parameters(self.settings, self.cluster, gpus, job))
      try:
        submitted = ex.submit(_Train(host), job)
      except Exception as e:  # noqa: BLE001 - sbatch refused (no controller, partition, ...)
        for earlier in out:  # a stage is submitted whole or not at all
          earlier.cancel(check=False)
        raise self._submit_error(job, e, len(out)) from None
      print(f"[{self.name}] {job.what}: job {submitted.job_id} (log {submitted.paths.stderr})",
            flush=True)
      out.append(submitted)
    return out

  def _submit_error(self, job: Job, e: Exception, cancelled: int) -> UserError:
    """The one line of a submission that failed: sbatch's own words, and what to check."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    said = next((ln for ln in lines if "error" in ln.lower() and "sbatch" in ln.lower()),
                next((ln for ln in reversed(lines) if "error" in ln.lower()),
                     lines[-1] if lines else type(e).__name__))
    undone = f"; the {cancelled} jobs submitted before it were cancelled" if cancelled else ""
    return UserError(f"--executor={self.name} could not submit {job.what} ({said[:300]}){undone}"
                     "; fix: check that SLURM answers here (sinfo) and the --slurm_partition, "
                     "--slurm_account and --slurm_qos values, or use --executor=processes:K or "
                     "inline, then rerun the same command")

  def wait(self, jobs: list[Job], submitted: list[submitit.Job]) -> list[float]:
    """Each job's wall seconds once all ended, or the UserError naming the failed ones."""
    seconds: list[float] = [float("nan")] * len(jobs)
    failures: dict[int, tuple[str, str]] = {}
    left = list(range(len(jobs)))
    try:
      while left:
        for i in [i for i in left if submitted[i].done()]:
          left.remove(i)
          try:
            seconds[i] = float(submitted[i].result())
            print(f"[{self.name}] {jobs[i].what}: done in {seconds[i]:.1f} s", flush=True)
          except Exception as e:  # noqa: BLE001 - the job's own error, reported with the others
            failures[i] = (_job_error(e), str(submitted[i].paths.stderr))
            print(f"[{self.name}] {jobs[i].what}: FAILED ({failures[i][0]})", flush=True)
        if left:
          time.sleep(self.poll_s)
    except BaseException:  # Ctrl-C here: the jobs checkpoint and stop (scancel / SIGINT)
      for i in left:
        submitted[i].cancel(check=False)
      raise
    if failures:
      raise stage_failed(self.name, jobs, failures)
    return seconds

  def run(self, jobs: list[Job]) -> list[float]:
    return self.wait(jobs, self.submit(jobs))


def _job_error(e: BaseException) -> str:
  """A failed submitit job's error in one line: the last line of the worker's traceback
  (a UserError's message alone), else submitit's own first line."""
  text = str(e)
  if "----------------------" in text:  # FailedJobError: the worker's traceback between rules
    trace = text.split("----------------------")[1].strip().splitlines()
    if trace:
      last = trace[-1].strip()
      return last.split("UserError: ", 1)[1] if "errors.UserError: " in last else last
  return error_line(e)


def check_slurm(settings: dict | None) -> dict:
  """The `slurm` settings without unset (None) ones, each checked, else a UserError."""
  out = {k: v for k, v in (settings or {}).items() if v is not None}
  for key, value in out.items():
    if key not in SLURM_KEYS:
      raise UserError(f"slurm setting {key!r} is unknown; use {', '.join(SLURM_KEYS)}")
    if key in ("partition", "account", "qos"):
      ok = isinstance(value, str) and bool(value.strip())
    else:
      ok = (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value >= {"time": 1, "cpus_per_task": 1}.get(key, 0)
            and (value > 0 if key == "mem_gb" else value == int(value)))
    if not ok:
      raise UserError(f"{SLURM_FLAGS[key]}={value!r}: it must be {SLURM_KEYS[key]}")
  return out
