"""Who trains a stage's independent runs: `make("inline" | "processes:K" | "submitit:slurm" |
"submitit:local")`, then `executor.run(jobs)`: each job's wall seconds, in order.

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

Whoever runs it, a job ends in `train_job` -> `train` in some process: the run's folder checked
against its config (`check_existing`), then trained or resumed to its end.

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
import math
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

import ml_collections
import submitit

from soma_jax import checkpoint as ckpt_lib
from soma_jax import errors, host_devices
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.errors import DiskFull, Interrupted, UserError

CHOICES = ("inline", "processes:K", "submitit:slurm", "submitit:local")
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
LOG_FILE = "train.log"  # processes:K: a worker's output, in its run's folder
SUBMITIT_DIR = "submitit"  # submitit: each run's submission, logs and result, in its folder


@dataclasses.dataclass(frozen=True)
class Job:
  """One training run of a stage: everything a worker needs, picklable."""

  config: dict  # the run's training config as a plain dict (ConfigDict.to_dict())
  workdir: str
  what: str  # names the run in messages ("seed 3 soma_n2 lr=0.0025 eps=0.0025")


def check_existing(workdir: str, spec: spec_lib.RunSpec) -> None:
  """A study run found in `workdir` continues only under the same experiment: speed knobs
  and the checkpoints' scoring may differ, and paths that moved with the study's folder (its
  seed run, its data: `checkpoint.moved_along`) or data moved elsewhere whole (the same
  manifest); anything else (budget, size, data re-prepared) is a UserError whose fix names
  compare.py's options and never deleting the run."""
  data_dir = spec.config.data.dir
  now = ckpt_lib.manifest_sha256(data_dir) if data_dir else None
  seed = spec.config.get("init_from") or ""
  if not os.path.isfile(os.path.join(workdir, ckpt_lib.CONFIG_FILE)):
    theirs = ckpt_lib.last_history(seed).get("data_manifest_sha256") if seed else None
    if theirs and now and theirs != now and not spec.config.get("init_from_other_data"):
      raise UserError(f"the seed run {seed!r} trained on data whose manifest.json had SHA-256 "
                      f"{theirs[:12]}; {data_dir!r} now holds {now[:12]} (the data was "
                      "re-prepared in place, or is another corpus); fix: --config.data_dir= "
                      "the data it trained on (a copy of it), or another --out to train the "
                      "seeds and rows on the new data")
    return
  # against the config as training saves it (data.dir absolute): an --out given relative
  # must resume its own runs
  changes = ckpt_lib.config_changes(ckpt_lib.read_config(workdir), spec.config)
  recorded = ckpt_lib.last_history(workdir).get("data_manifest_sha256")
  if recorded and now and recorded != now:
    raise UserError(f"{workdir!r} trained on data whose manifest.json had SHA-256 "
                    f"{recorded[:12]}; {data_dir!r} now holds {now[:12]} (the data "
                    "was re-prepared in place, or is another corpus), so the run cannot go on "
                    "with it; fix: --config.data_dir= the data it trained on (a copy of it), "
                    "or another --out to train these runs on the new data")
  moved = set(ckpt_lib.moved_paths(changes, workdir))
  if "data.dir" in changes and recorded and recorded == now:
    moved.add("data.dir")  # the same prepared data, elsewhere
  refused = [k for k in changes if k not in moved
             and not ckpt_lib.under(k, ckpt_lib.SPEED_KEYS + ckpt_lib.SCORING_KEYS)]
  if refused:
    listed = "; ".join(f"{k}: {changes[k][0]!r} there, {changes[k][1]!r} now" for k in refused)
    raise UserError(f"{workdir!r} holds a run with a different config ({listed}); fix: "
                    "rerun with the study settings that trained it (its config.json), or "
                    "another --out for these settings (the run there is kept)")


def train(spec: spec_lib.RunSpec, workdir: str, what: str) -> float:
  """Trains (or resumes) one run to its end in this process; the wall seconds of this call."""
  check_existing(workdir, spec)
  t0 = time.perf_counter()
  train_lib.train_to_end(spec, workdir, what)
  return time.perf_counter() - t0


def train_job(job: Job) -> float:
  """Trains (or resumes) one run to its end in this process; its wall seconds."""
  return train(spec_lib.resolve(ml_collections.ConfigDict(job.config)), job.workdir, job.what)


class Executor(Protocol):
  name: str  # "inline", "processes:2", "submitit:slurm", ...

  def run(self, jobs: list[Job]) -> list[float]:
    """Wall seconds per job, in order; every job finished, or a UserError naming the failed
    runs (raised after the others finished)."""


# --- what a worker takes from the parent -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Host:
  """What a worker sets before JAX starts, so that it runs the parent's program."""

  cpu_devices: int = 0  # the parent's CPU host devices (0: JAX's default)
  cache: tuple = ()  # (folder, min compile seconds, min entry bytes) of the parent's cache
  cores: tuple[int, ...] = ()  # processes:K: the worker's share of the cores (empty: all)


def parent_host() -> Host:
  """This process's CPU device count and compilation cache (JAX starts here if not yet)."""
  import jax

  try:
    cpu = len(jax.devices("cpu"))
  except RuntimeError:  # JAX_PLATFORMS without cpu: the worker's own default
    cpu = 0
  folder = jax.config.jax_compilation_cache_dir
  cache = (folder, float(jax.config.jax_persistent_cache_min_compile_time_secs),
           int(jax.config.jax_persistent_cache_min_entry_size_bytes)) if folder else ()
  return Host(cpu, cache)


def start_worker(host: Host) -> None:
  """In a fresh worker, before anything starts JAX's backends: the parent's layout."""
  import jax

  if host.cores and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, host.cores)
  if host.cpu_devices:
    host_devices.start(host.cpu_devices)  # wins over XLA_FLAGS' count, as --cpu_devices does
  if host.cache:
    folder, secs, size = host.cache
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", secs)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", size)


def _error_line(e: BaseException) -> str:
  """A failed run's error in one line: a UserError's message, else the exception's type
  and first line."""
  if isinstance(e, UserError):
    return str(e)
  if errors.is_disk_full(e):
    return str(errors.disk_full_error(e))
  first = (str(e).strip().splitlines() or [""])[0]
  return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _failed(name: str, jobs: list[Job], failures: dict[int, tuple[str, str]]) -> UserError:
  """The one UserError of a stage with failed runs ({index: (error, where its log is)})."""
  runs = "; ".join(f"{jobs[i].what}: {error} (log: {log})"
                   for i, (error, log) in sorted(failures.items()))
  return UserError(f"{len(failures)} of {len(jobs)} runs failed under --executor={name}, after "
                   f"the others finished: {runs}; fix: see each run's log, then rerun the same "
                   "command (finished runs are kept, the others resume)")


def _disk_full(name: str, jobs: list[Job], i: int, error: str, left: int) -> DiskFull:
  """The DiskFull that stops a stage at its run `i` (`left` runs not started)."""
  error = error.split("; fix:")[0]  # the one fix is this one's
  return DiskFull(f"{jobs[i].what} could not write: {error}"
                  f"{f'; {left} more runs not started' if left else ''} (--executor={name}); "
                  "fix: free disk space, then rerun the same command (finished runs are kept, "
                  "the others resume)")


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
          raise _disk_full(self.name, jobs, i, _error_line(e), len(jobs) - i - 1) from None
        if not isinstance(e, UserError):
          traceback.print_exc()
        print(f"[inline] {job.what}: FAILED ({_error_line(e)})", flush=True)
        failures[i] = (_error_line(e), "the output above")
        seconds.append(float("nan"))
    if failures:
      raise _failed(self.name, jobs, failures)
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
    print(f"error: {_error_line(e)}", file=sys.stderr, flush=True)
    result = {"error": _error_line(e), "disk_full": errors.is_disk_full(e)}
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
      raise _disk_full(self.name, jobs, i, result["error"], len(pending))
    if failures:
      raise _failed(self.name, jobs, failures)
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


# --- submitit --------------------------------------------------------------------------------


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
      raise _failed(self.name, jobs, failures)
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
  return _error_line(e)


# --- the choice ------------------------------------------------------------------------------


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
