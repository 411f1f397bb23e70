"""Who trains a stage's independent runs: `make("inline" | "processes:K" | "submitit:slurm" |
"submitit:local")`, then `executor.run(jobs)`: each job's wall seconds, in order. A run is a
`jobs.Job`; the submitit executors are in `slurm.py`.

  inline          one after another in this process (the default), output on the terminal
  processes:K     up to K at once, one fresh Python per run (a subprocess, never a fork of
                  this one: JAX does not survive a fork); its output goes to WORKDIR/train.log,
                  and this process prints one line as each run starts and ends
  submitit:slurm  one SLURM job per run (submitit's AutoExecutor, the `slurm` settings:
                  partition, time, GPUs, CPUs, memory, account, QOS); its submission, log and
                  result files in WORKDIR/submitit/; a preempted or timed-out job checkpoints
                  and requeues itself, and the requeued job resumes from its own folder
  submitit:local  submitit's LocalExecutor, the same path on this machine: every run of the
                  stage at once, as submitit starts them (tests, single machines)

Results are the same whichever executor trains: a run is deterministic given its config and
its device layout, a resumed run continues bit for bit (`train.py`), and every worker takes
the parent's layout before JAX starts (`Host`): its CPU host-device count (one per usable
core in an entry point, `host_devices`) and its compilation cache. On a CPU every worker
therefore runs the parent's program; processes:K also pins worker k to its share of the
cores (when there are at least K), which changes speed only, never a number, though a
budget in CPU seconds ends at whatever update reaches it under any executor. On a GPU the
layout follows the share: processes:K gives worker k its own 1/K of the visible GPUs
(CUDA_VISIBLE_DEVICES; GPU k mod G, shared, when K > G), and a SLURM job has the GPUs it
asked for (`gpus_per_node`), so a run sharded over fewer GPUs than inline may differ from
it by rounding. processes:K workers on a GPU do not preallocate its memory
(XLA_PYTHON_CLIENT_PREALLOCATE=false unless set); start the parent so too (the Makefile
does), or the parent's own preallocation leaves its workers a quarter of each GPU.

Every job is tried: a failed run is reported, after the others finished, in one UserError
naming each failed run, its error and its log. Two things stop a stage instead: a signal
(Ctrl-C, SIGTERM: the runs in progress save a checkpoint, no other starts, and `Interrupted`
ends the study, exit 128 + the signal) and a full disk (no run starts after it; `DiskFull`,
exit 2). A processes:K worker is a session of its own (a terminal's Ctrl-C reaches the
parent, which asks each worker once) and stops by itself, after saving, when its parent
dies. A run's folder is its lock and its resume point (`checkpoint.WorkdirLock`): re-running
the same command keeps finished runs and resumes the others.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Protocol

from soma_jax import errors
from soma_jax.errors import Interrupted, UserError
from soma_jax.studies.jobs import (
  Host,
  Job,
  error_line,
  parent_host,
  stage_disk_full,
  stage_failed,
  start_worker,
  train_job,
)
from soma_jax.studies.slurm import SLURM_FLAGS, Submitit, check_slurm

CHOICES = ("inline", "processes:K", "submitit:slurm", "submitit:local")
LOG_FILE = "train.log"  # processes:K: a worker's output, in its run's folder


class Executor(Protocol):
  name: str  # "inline", "processes:2", "submitit:slurm", ...

  def run(self, jobs: list[Job]) -> list[float]:
    """Wall seconds per job, in order; every job finished, or a UserError naming the failed
    runs (raised after the others finished)."""


# --- inline ----------------------------------------------------------------------------------


class Inline:
  """One run after another in this process, with this process's devices."""

  name = "inline"

  def run(self, jobs: list[Job]) -> list[float]:
    seconds, failures = [], {}
    for i, job in enumerate(jobs):  # a signal (Interrupted) is no Exception: it stops all
      try:
        seconds.append(train_job(job))
      except Exception as e:  # noqa: BLE001 - reported with the others once all ran
        if errors.is_disk_full(e):  # every later run would fail alike: stop here
          raise stage_disk_full(self.name, jobs, i, error_line(e), len(jobs) - i - 1) from None
        if not isinstance(e, UserError):
          traceback.print_exc()
        print(f"[inline] {job.what}: FAILED ({error_line(e)})", flush=True)
        failures[i] = (error_line(e), "the output above")
        seconds.append(float("nan"))
    if failures:
      raise stage_failed(self.name, jobs, failures)
    return seconds


# --- processes:K -----------------------------------------------------------------------------

# A worker: `python -c WORKER JOB_FILE RESULT_FILE PARENT_PID`; importing the module by name keeps one
# copy of its classes (as `-m` would not).
WORKER = ("import sys; from soma_jax.studies.executor import worker_main; "
          "from soma_jax.errors import finish; finish(worker_main(*sys.argv[1:]))")
PARENT_POLL_S = 1.0  # how often a worker looks whether its parent is still there


def worker_main(job_file: str, result_file: str, parent: str = "0") -> int:
  """A processes:K worker: the pickled (Job, Host) trained; {"seconds"}, {"error"} or
  {"interrupted": signal} JSON. SIGTERM (the parent's stop, or the parent's death, which the
  worker watches for) checkpoints and stops the run."""
  errors.stop_on_sigterm()  # outside the training loop (start-up, restore): stop at once
  parent_pid = int(parent) or os.getppid()
  threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
  with open(job_file, "rb") as f:
    job, host = pickle.load(f)
  try:
    start_worker(host)
    result = {"seconds": train_job(job)}
  except KeyboardInterrupt as e:  # a signal: saved (Interrupted) or stopped at once
    signum = getattr(e, "signum", signal.SIGINT)
    print(f"stopped: {e or 'interrupted'}", file=sys.stderr, flush=True)
    result = {"interrupted": int(signum), "error": str(e) or "interrupted"}
  except Exception as e:  # noqa: BLE001 - the parent reports it beside the other runs
    if not isinstance(e, UserError) and not errors.is_disk_full(e):
      traceback.print_exc()
    print(f"error: {error_line(e)}", file=sys.stderr, flush=True)
    result = {"error": error_line(e), "disk_full": errors.is_disk_full(e)}
  if os.getppid() != parent_pid:  # orphaned: no one reads the result; leave no temp folder
    shutil.rmtree(os.path.dirname(os.path.abspath(job_file)), ignore_errors=True)
  else:
    with open(result_file, "w") as f:
      json.dump(result, f)
  if "interrupted" in result:
    return errors.signal_exit_code(result["interrupted"])
  return 0 if "seconds" in result else 1


def _watch_parent(parent_pid: int) -> None:
  """A worker's watch: once its parent is gone (kill -9, a crash), SIGTERM to itself, so the
  run checkpoints and stops instead of running on as an orphan."""
  while os.getppid() == parent_pid:
    time.sleep(PARENT_POLL_S)
  os.kill(os.getpid(), signal.SIGTERM)


def _visible_gpus(count: int) -> list[str]:
  """This process's GPUs as CUDA_VISIBLE_DEVICES names them (its own setting, else 0..)."""
  names = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
  return names[:count] if len(names) >= count else [str(i) for i in range(count)]


@dataclasses.dataclass(frozen=True)
class _Share:
  """Worker slot k's part of the machine: its cores (CPU) or its GPUs."""

  cores: tuple[int, ...] = ()
  gpus: tuple[str, ...] | None = None  # None: the parent's CUDA_VISIBLE_DEVICES unchanged


def shares(k: int, backend: str, devices: int, cores: list[int]) -> list[_Share]:
  """Each of `k` worker slots' share: on a GPU, 1/k of the `devices` visible GPUs each (GPU
  slot mod G when k > G); on a CPU, 1/k of `cores` each, when there are at least k."""
  if backend == "gpu":
    names = _visible_gpus(devices)
    if k > len(names):
      return [_Share(gpus=(names[slot % len(names)],)) for slot in range(k)]
    return [_Share(gpus=tuple(names[slot * len(names) // k:(slot + 1) * len(names) // k]))
            for slot in range(k)]
  if backend != "cpu" and k > 1:
    raise UserError(f"--executor=processes:{k} on {backend}: worker processes cannot share its "
                    "devices; fix: --executor=inline (or submitit:slurm, one job per machine)")
  if len(cores) < k:
    return [_Share() for _ in range(k)]
  return [_Share(cores=tuple(cores[slot * len(cores) // k:(slot + 1) * len(cores) // k]))
          for slot in range(k)]


class Processes:
  """Up to `k` runs at once, each in a fresh worker process with its share of the machine."""

  def __init__(self, k: int):
    self.k = k
    self.name = f"processes:{k}"

  def _shares(self) -> list[_Share]:
    import jax

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return shares(self.k, jax.default_backend(), jax.local_device_count(), cores)

  def _start(self, job: Job, host: Host, share: _Share, folder: str, i: int):
    os.makedirs(job.workdir, exist_ok=True)
    job_file = os.path.join(folder, f"job{i}.pkl")
    with open(job_file, "wb") as f:
      pickle.dump((job, dataclasses.replace(host, cores=share.cores)), f)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if share.gpus is not None:
      env["CUDA_VISIBLE_DEVICES"] = ",".join(share.gpus)
      env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    log_path = os.path.join(job.workdir, LOG_FILE)
    log = open(log_path, "a")  # noqa: SIM115 - closed when the worker ends
    log.write(f"== {job.what}: {self.name} worker, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    log.flush()
    # A session of its own: a terminal's Ctrl-C reaches this process only, which asks each
    # worker once (`_stop`); a second signal would stop a worker before its checkpoint.
    proc = subprocess.Popen([sys.executable, "-c", WORKER, job_file,
                             os.path.join(folder, f"result{i}.json"), str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    where = (f"GPUs {','.join(share.gpus)}" if share.gpus is not None else
             f"cores {_ranges(share.cores)}" if share.cores else "all cores")
    print(f"[{self.name}] {job.what}: started ({where}; log {log_path})", flush=True)
    return proc, log, log_path

  def run(self, jobs: list[Job]) -> list[float]:
    host, slots = parent_host(), self._shares()
    seconds: list[float] = [float("nan")] * len(jobs)
    failures: dict[int, tuple[str, str]] = {}
    pending = collections.deque(enumerate(jobs))
    running: dict[int, tuple] = {}  # slot -> (job index, process, log file, log path)
    folder = tempfile.mkdtemp(prefix="soma-executor-")
    stopped = None  # (job index, result) of a worker stopped by a signal or a full disk
    try:
      while pending or running:
        for slot in range(self.k):
          if slot not in running and pending and stopped is None:
            i, job = pending.popleft()
            running[slot] = (i, *self._start(job, host, slots[slot], folder, i))
        time.sleep(0.1)
        for slot, (i, proc, log, log_path) in list(running.items()):
          if proc.poll() is None:
            continue
          log.close()
          del running[slot]
          result = _read_result(os.path.join(folder, f"result{i}.json"), proc.returncode)
          if "seconds" in result:
            seconds[i] = float(result["seconds"])
            print(f"[{self.name}] {jobs[i].what}: done in {seconds[i]:.1f} s", flush=True)
            continue
          failures[i] = (result["error"], log_path)
          print(f"[{self.name}] {jobs[i].what}: "
                f"{'STOPPED' if 'interrupted' in result else 'FAILED'} ({result['error']}; "
                f"log {log_path})", flush=True)
          if stopped is None and ("interrupted" in result or result.get("disk_full")):
            stopped = (i, result)  # no run starts after this one
            if "interrupted" in result:  # the others save and stop too
              _stop(running.values(), self.name)
              running.clear()
        if stopped is not None and not running:
          break
    finally:  # Ctrl-C or an error here: each worker checkpoints and stops (SIGTERM)
      _stop(running.values(), self.name)
      shutil.rmtree(folder, ignore_errors=True)
    if stopped is not None:
      i, result = stopped
      if "interrupted" in result:
        raise Interrupted(f"{jobs[i].what} stopped by "
                          f"{signal.Signals(result['interrupted']).name} (--executor={self.name}"
                          f", {len(pending)} runs not started); the runs in progress saved "
                          "their checkpoints; rerun the same command to resume",
                          result["interrupted"])
      raise stage_disk_full(self.name, jobs, i, result["error"], len(pending))
    if failures:
      raise stage_failed(self.name, jobs, failures)
    return seconds


def _read_result(path: str, returncode: int) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    how = (f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}")
    return {"error": f"the worker ended without a result ({how})"}


def _stop(running, name: str = "processes") -> None:
  """SIGTERM to each running worker (its run checkpoints and stops), then wait."""
  running = list(running)
  if any(proc.poll() is None for _, proc, _, _ in running):
    print(f"[{name}] stopping: each run in progress saves a checkpoint, then stops", flush=True)
  for _, proc, _, _ in running:
    if proc.poll() is None:
      proc.terminate()
  for _, proc, log, _ in running:
    try:
      proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.close()


def _ranges(cores: tuple[int, ...]) -> str:
  """(0, 1, 2, 5) -> "0-2,5"."""
  out, start = [], None
  for a, b in zip(cores, cores[1:] + (None,)):
    start = a if start is None else start
    if b != a + 1:
      out.append(f"{start}-{a}" if a != start else str(a))
      start = None
  return ",".join(out)


# --- the choice ------------------------------------------------------------------------------


def make(spec: str, slurm: dict | None = None) -> Executor:
  """The executor `spec` names ("inline" | "processes:K" | "submitit:slurm" |
  "submitit:local"); `slurm` holds the --slurm_* settings (SLURM_KEYS; None = unset), for
  the submitit executors only (submitit:local uses time and gpus_per_node)."""
  spec = (spec or "").strip()
  settings = check_slurm(slurm)
  if settings and not spec.startswith("submitit:"):
    raise UserError(f"{', '.join(SLURM_FLAGS[k] for k in settings)} apply to --executor="
                    f"submitit:slurm or submitit:local, not {spec!r}; fix: drop them or pass "
                    "--executor=submitit:slurm")
  if spec == "inline":
    return Inline()
  if m := re.fullmatch(r"processes:(\d+)", spec):
    if int(m.group(1)) < 1:
      raise UserError(f"--executor={spec}: K must be >= 1 worker processes, e.g. processes:2")
    return Processes(int(m.group(1)))
  if spec == "submitit:slurm":
    missing = [c for c in ("sbatch", "srun") if shutil.which(c) is None]
    if missing:
      raise UserError(f"--executor=submitit:slurm needs SLURM's {' and '.join(missing)}, and "
                      "PATH has none here; fix: run it on the cluster's login node, or use "
                      "--executor=submitit:local or processes:K on this machine")
    return Submitit("slurm", settings)
  if spec == "submitit:local":
    return Submitit("local", settings)
  raise UserError(f"--executor={spec!r} is not an executor; use one of {', '.join(CHOICES)} "
                  "(K worker processes, e.g. processes:2)")
