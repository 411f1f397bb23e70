"""A stage's run as a `Job`, and what training one takes in whichever process runs it: the
run's folder checked against its config (`check_existing`), the parent's layout a worker
takes before JAX starts (`Host`), and the one-line errors every executor reports.

Whoever runs it, a job ends in `train_job` -> `train` in some process: the run's folder checked
against its config, then trained or resumed to its end.
"""

from __future__ import annotations

import dataclasses
import os
import time

import ml_collections

from soma_jax import checkpoint as ckpt_lib
from soma_jax import errors, host_devices
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.errors import DiskFull, UserError


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
    if theirs and now and theirs != now and not spec.init_from_other_data:
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


def error_line(e: BaseException) -> str:
  """A failed run's error in one line: a UserError's message, else the exception's type
  and first line."""
  if isinstance(e, UserError):
    return str(e)
  if errors.is_disk_full(e):
    return str(errors.disk_full_error(e))
  first = (str(e).strip().splitlines() or [""])[0]
  return f"{type(e).__name__}: {first}" if first else type(e).__name__


def stage_failed(name: str, jobs: list[Job], failures: dict[int, tuple[str, str]]) -> UserError:
  """The one UserError of a stage with failed runs ({index: (error, where its log is)})."""
  runs = "; ".join(f"{jobs[i].what}: {error} (log: {log})"
                   for i, (error, log) in sorted(failures.items()))
  return UserError(f"{len(failures)} of {len(jobs)} runs failed under --executor={name}, after "
                   f"the others finished: {runs}; fix: see each run's log, then rerun the same "
                   "command (finished runs are kept, the others resume)")


def stage_disk_full(name: str, jobs: list[Job], i: int, error: str, left: int) -> DiskFull:
  """The DiskFull that stops a stage at its run `i` (`left` runs not started)."""
  error = error.split("; fix:")[0]  # the one fix is this one's
  return DiskFull(f"{jobs[i].what} could not write: {error}"
                  f"{f'; {left} more runs not started' if left else ''} (--executor={name}); "
                  "fix: free disk space, then rerun the same command (finished runs are kept, "
                  "the others resume)")
