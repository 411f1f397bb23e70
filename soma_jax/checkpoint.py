"""Checkpoints of the whole training state with orbax, and parameter loading for tools.

One checkpoint is one unit: the `TrainState` (parameters, Adam moments, per-expert lr /
eps / plateau counters, step) and the input iterator's state, written atomically by
orbax (a temporary folder renamed on completion), newest K kept. `config.json` in the
workdir records the run's config; tools rebuild the state's shapes from it.

A run holds `WorkdirLock` for its lifetime; on resume `check_resume` refuses any change
to the experiment before anything is written, and `config_history.jsonl` records every
start (allowed changes, explicit `resume_overrides`, the data manifest's hash). A
checkpoint that fails to restore is moved aside to `checkpoints/corrupt-<step>`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging as pylogging
import os
import re
import time
import uuid
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from soma_jax.config import flatten
from soma_jax.errors import DiskFull, UserError, disk_full_error, is_disk_full, writable_dir

CONFIG_FILE = "config.json"
CKPT_DIR = "checkpoints"
LOCK_FILE = ".lock"
HISTORY_FILE = "config_history.jsonl"
CORRUPT_PREFIX = "corrupt-"  # not a step name to orbax (it parses digits or *_digits)
# Config fields that fix the shapes (and meaning) of the state; never changed on resume.
SHAPE_KEYS = ("method", "n_experts", "experts", "model", "spsa.accum", "data.seq_len",
              "opt.train_head")  # and each method's own (Method.shape_keys)
# Device layout and speed / memory knobs: they leave the math alone up to float rounding.
SPEED_KEYS = ("mesh", "spsa.pert_chunk", "spsa.time_block", "spsa.unroll", "spsa.signs",
              "spsa.forward")  # and each method's own (Method.speed_keys)
# What is scored at each checkpoint (`checkpoint_scores`): never the run's own numbers, so a
# study's run continues whichever set its study scores now (saved scores name their set).
SCORING_KEYS = ("checkpoint_eval",)
# Fields a resume may change freely: run length (steps, time budget), logging and checkpoint
# cadence, precision, the speed knobs and the checkpoints' scoring.
# init_from_other_data too: a resume reads no seed.
RESUMABLE_KEYS = ("steps", "budget", "budget_checkpoints", "budget_marks", "log_every",
                  "eval_every", "ckpt_every", "ensemble_eval_every", "ckpt.keep", "precision",
                  "resume_overrides", "init_from_other_data") + SPEED_KEYS + SCORING_KEYS
MANIFEST_KEY = "data.manifest_sha256"  # the data dir's manifest.json, compared on resume


def read_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise UserError(f"{path!r} not found: {workdir!r} is not a training workdir; "
                    "fix: pass the --workdir given to experiments/train.py")
  try:
    with open(path) as f:
      return ml_collections.ConfigDict(json.load(f))
  except ValueError as e:
    raise UserError(f"{path!r} is corrupt ({e}); fix: restore it or use a new workdir") from None


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes config.json atomically (`resume_overrides` is recorded in the history instead)."""
  path = os.path.join(workdir, CONFIG_FILE)
  new = json.loads(config.to_json())
  if "resume_overrides" in new:
    new["resume_overrides"] = ""
  _write_json(path, new)


def _write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def under(key: str, names) -> bool:
  """Whether dotted config `key` is one of `names` or inside one (opt.lr is under opt)."""
  return any(key == n or key.startswith(n + ".") for n in names)


def config_changes(old: ml_collections.ConfigDict, new: ml_collections.ConfigDict) -> dict:
  """{dotted key: (old value, new value)} for the fields that differ. Fields present on only
  one side (added or removed by a code update) or unset (None) in `old` are not compared."""
  old_flat, new_flat = (flatten(json.loads(c.to_json())) for c in (old, new))
  return {k: (old_flat[k], new_flat[k]) for k in sorted(set(old_flat) & set(new_flat))
          if old_flat[k] != new_flat[k] and old_flat[k] is not None}


def file_sha256(path: str) -> str | None:
  """The file's SHA-256, or None if it does not exist."""
  if not os.path.isfile(path):
    return None
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def manifest_sha256(data_dir: str) -> str | None:
  return file_sha256(os.path.join(data_dir, "manifest.json"))


def check_router(workdir: str, trained_dir: str, data_dir: str | None) -> None:
  """UserError unless `data_dir` (a tool's --data_dir) routes as the run was trained: the
  run's own data dir (`trained_dir`, its config's data.dir), a copy of it (the manifest
  recorded at the run's start), or one holding the same router.npz. Another corpus's router
  sends windows to the wrong experts."""
  if not data_dir or os.path.abspath(data_dir) == os.path.abspath(trained_dir):
    return
  recorded = last_history(workdir).get("data_manifest_sha256")
  if recorded is not None and manifest_sha256(data_dir) == recorded:
    return
  trained = file_sha256(os.path.join(trained_dir, "router.npz"))
  if trained is not None and trained == file_sha256(os.path.join(data_dir, "router.npz")):
    return
  raise UserError(f"--data_dir={data_dir!r} holds another router than the one {workdir!r} was "
                  f"trained with (from {trained_dir!r}), so windows would go to the wrong "
                  "experts; fix: omit --data_dir, or pass the run's data dir or a copy of it")


def check_data(workdir: str, trained_dir: str, data_dir: str | None = None,
               files: tuple[str, ...] = ("router.npz",), required: bool = True) -> str | None:
  """The data dir a tool reads for run `workdir` (its --data_dir, else `trained_dir`, the
  run's config's data.dir), checked to hold the prepared data the run trained on; returns
  it absolute.

  Every tool that reads a run's data calls this (evaluate, report, generate, merge): one
  UserError names the change. The dir's manifest.json must be the one config_history.jsonl
  recorded at the run's last start (not re-prepared in place, not another corpus), and
  each of `files` (relative paths the tool reads) must still have the SHA-256 manifest.json
  records. A run with no recorded hash (older runs) falls back to `check_router`. With
  `required=False` (merge, which reads no data) a data dir that is not there returns None.
  """
  from soma_jax.data import pipeline  # grain, only for tools that read data

  path = os.path.abspath(os.path.expanduser(data_dir or trained_dir))
  if not os.path.isdir(path):
    if not required:
      return None
    given = (f"--data_dir={data_dir!r}" if data_dir else
             f"the data dir {trained_dir!r} that {workdir!r} trained on")
    where = "" if data_dir or os.path.isabs(trained_dir) else (
        f" (a relative path, looked up from {os.getcwd()!r}: run from the folder it was "
        "trained in)")
    raise UserError(f"{given} does not exist{where}; fix: pass --data_dir=PATH, the run's "
                    "prepared data or a copy of it")
  recorded = last_history(workdir).get("data_manifest_sha256")
  if recorded is None:
    check_router(workdir, trained_dir, data_dir)
  elif manifest_sha256(path) != recorded:
    now = manifest_sha256(path)
    raise UserError(
        f"{f'--data_dir={data_dir!r}: ' if data_dir else ''}"
        f"{os.path.join(path, 'manifest.json')!r} is not the one {workdir!r} trained on "
        f"(SHA-256 {recorded[:12]} at its start, {(now or 'none')[:12]} now: the data dir was "
        "re-prepared, replaced or is another corpus), so its router and splits may not be the "
        "run's; fix: " + ("omit --data_dir, or pass the run's data dir or a copy of it" if data_dir
                          else "pass --data_dir= the data the run trained on (or a copy of it)"))
  manifest = pipeline.load_manifest(path)
  for rel in files:
    digest = manifest.get("files", {}).get(rel)
    full = os.path.join(path, rel)
    if digest is None or not os.path.isfile(full) or pipeline.sha256_file(full) != digest:
      raise UserError(f"{full!r} is missing or changed since prepare (its SHA-256 is not the "
                      "one manifest.json records), so it is not what the run was trained "
                      "against; fix: restore the data dir from the one the run trained on")
  return path


def parse_overrides(value: str, known: dict) -> list[str]:
  """'opt.lr, spsa.n_pert' -> ['opt.lr', 'spsa.n_pert']; unknown or shape fields refused."""
  names = [n.strip() for n in str(value or "").split(",") if n.strip()]
  for n in names:
    if not any(under(k, [n]) for k in known):
      raise UserError(f"resume_overrides names {n!r}, which is not a config field; "
                      "fix: use dotted names such as opt.lr,spsa.n_pert")
    if under(n, SHAPE_KEYS) or any(under(k, [n]) for k in SHAPE_KEYS):
      raise UserError(f"resume_overrides cannot change {n!r}: it fixes the shapes of the saved "
                      "state; fix: start a new --workdir")
  return names


def check_resume(workdir: str, new: ml_collections.ConfigDict, data_sha: str | None,
                 shape_keys: tuple[str, ...] = (), speed_keys: tuple[str, ...] = ()
                 ) -> tuple[dict, list[str]]:
  """Compares a resumed run's config with the saved one; returns the changes it allows.

  Returns ({dotted key: (saved, now)}, the fields named in resume_overrides). Raises UserError listing every differing field
  that changes the experiment (anything outside RESUMABLE_KEYS) unless it is named in
  `resume_overrides`. A moved data dir with the same manifest hash is allowed; another
  manifest (other data, or data re-prepared in place) is a change of `data.dir`.
  Fields present on only one side (added or removed by a code update) are not compared.
  """
  changed = config_changes(read_config(workdir), new)
  old_sha = last_history(workdir).get("data_manifest_sha256")
  if old_sha is not None and old_sha != data_sha:
    changed[MANIFEST_KEY] = (old_sha, data_sha)
  overrides = parse_overrides(new.get("resume_overrides", ""), flatten(json.loads(new.to_json())))
  allowed = list(RESUMABLE_KEYS) + list(speed_keys) + overrides  # speed_keys: the method's
  if "data.dir" in changed and MANIFEST_KEY not in changed:
    allowed.append("data.dir")  # the same prepared data, moved
  allowed += moved_paths(changed, workdir)  # e.g. its seed run, moved with it
  if under("data.dir", overrides):
    allowed.append(MANIFEST_KEY)
  shape = [k for k in changed if under(k, SHAPE_KEYS + tuple(shape_keys))]
  refused = [k for k in changed if not under(k, allowed)]
  if shape or refused:
    listed = "; ".join(f"{k}: {changed[k][0]!r} there, {changed[k][1]!r} now"
                       for k in sorted(set(shape) | set(refused)))
    # another manifest is overridden by naming data.dir (MANIFEST_KEY is no config field)
    named = sorted({"data.dir" if k == MANIFEST_KEY else k for k in refused})
    fix = ("use a new --workdir or the original config" if shape else
           "resume with the saved values, use a new --workdir, or name the fields in "
           f"--config.resume_overrides={','.join(named)} to change them on purpose")
    raise UserError(f"workdir {workdir!r} holds another run ({listed}); fix: {fix}")
  return changed, overrides


PATH_KEYS = ("init_from", "data.dir", "checkpoint_eval.data_dir")  # paths a run config holds


def moved_along(old: object, new: object, workdir: str) -> bool:
  """Whether path `new` is `old` moved together with the run's folder `workdir` (a study
  folder moved or renamed whole): the same place relative to the workdir as where the run
  last started (config_history.jsonl `workdir`), or, for runs that did not record it, the
  same tail of folders below a head that now holds the workdir."""
  if not (isinstance(old, str) and isinstance(new, str) and old and new):
    return False
  here = os.path.abspath(workdir)
  was = last_history(workdir).get("workdir")
  if isinstance(was, str) and was:
    return os.path.relpath(old, was) == os.path.relpath(new, here)
  o, n = os.path.abspath(old).split(os.sep), os.path.abspath(new).split(os.sep)
  tail = 0
  while tail < min(len(o), len(n)) - 1 and o[-1 - tail] == n[-1 - tail]:
    tail += 1
  head = os.sep.join(n[:len(n) - tail]) or os.sep
  return 0 < tail and o[:len(o) - tail] != n[:len(n) - tail] and (
      here.startswith(head.rstrip(os.sep) + os.sep))


def moved_paths(changed: dict, workdir: str) -> list[str]:
  """The path fields of `changed` ({key: (saved, now)}) that moved along with the workdir."""
  return [k for k in PATH_KEYS if k in changed and moved_along(*changed[k], workdir)]


def seed_workdir(init_from: str) -> str:
  """`init_from`, a training workdir that is there (a warm start's seed run)."""
  if not os.path.isdir(init_from):
    raise UserError(f"init_from={init_from!r} does not exist; fix: the seed run's workdir")
  if not os.path.isfile(os.path.join(init_from, CONFIG_FILE)):
    raise UserError(f"init_from={init_from!r} is not a training workdir (no {CONFIG_FILE}); "
                    "fix: the seed run's workdir, the --workdir it was trained in")
  return init_from


def check_seed(init_from: str, data_dir: str, data_sha: str | None, other_data: bool) -> None:
  """A new run's seed (config.init_from, if any): there, and trained on this run's data
  (`data_dir`, whose manifest.json hash its config_history.jsonl recorded at its last start
  is `data_sha`), unless `other_data` (config.init_from_other_data). A seed with no recorded
  hash (older runs) passes."""
  if not init_from:
    return
  recorded = last_history(seed_workdir(init_from)).get("data_manifest_sha256")
  if recorded is None or data_sha is None or recorded == data_sha or other_data:
    return
  raise UserError(f"init_from={init_from!r} was trained on other data than {data_dir!r} "
                  f"(manifest.json SHA-256 {recorded[:12]} at the seed's last start, "
                  f"{data_sha[:12]} here: another corpus, or the data re-prepared); fix: a seed "
                  "trained on this data, or --config.init_from_other_data=True to start from "
                  "it anyway")


def record_start(workdir: str, step: int, changed: dict, overrides: list[str],
                 data_sha: str | None) -> None:
  """Appends one line to config_history.jsonl: when, from which step, what changed."""
  record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "step": step,
            "changed": {k: list(v) for k, v in changed.items()}, "resume_overrides": overrides,
            "data_manifest_sha256": data_sha, "workdir": os.path.abspath(workdir)}
  if not first_history(workdir):  # the run's first start: its identity (`run_id`)
    record["run_id"] = uuid.uuid4().hex
  with open(os.path.join(workdir, HISTORY_FILE), "a") as f:
    f.write(json.dumps(record, sort_keys=True, default=str) + "\n")


def first_history(workdir: str) -> str:
  """The first line of the workdir's config_history.jsonl (its first start), or ""."""
  try:
    with open(os.path.join(workdir, HISTORY_FILE)) as f:
      return next((line.strip() for line in f if line.strip()), "")
  except (OSError, UnicodeDecodeError):
    return ""


def run_id(workdir: str) -> str | None:
  """The run's identity: the run_id its first start recorded, else (older runs) the SHA-256
  of that first history line; None before its first start. It moves and is copied with the
  whole workdir, never with a file taken from another run."""
  first = first_history(workdir)
  if not first:
    return None
  try:
    found = json.loads(first).get("run_id")
  except (ValueError, AttributeError):
    found = None
  return found if isinstance(found, str) and found else hashlib.sha256(first.encode()).hexdigest()


def last_history(workdir: str) -> dict:
  path = os.path.join(workdir, HISTORY_FILE)
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  try:
    return json.loads(lines[-1]) if lines else {}
  except ValueError:
    return {}


def has_checkpoint(workdir: str) -> bool:
  """Whether the workdir holds any finished checkpoint step (read without orbax)."""
  d = os.path.join(workdir, CKPT_DIR)
  return os.path.isdir(d) and any(n.isdigit() for n in os.listdir(d))


def newest_step(workdir: str) -> int | None:
  """The newest finished checkpoint step in the workdir (read without orbax), or None."""
  d = os.path.join(workdir, CKPT_DIR)
  steps = [int(n) for n in os.listdir(d) if n.isdigit()] if os.path.isdir(d) else []
  return max(steps, default=None)


class WorkdirLock:
  """An OS lock on WORKDIR/.lock held for a run's lifetime; the kernel drops it on any exit.

  A second holder fails at once with a UserError naming the running process. The lock
  file itself is created when missing, which also proves the workdir is writable.
  """

  def __init__(self, workdir: str, what: str = "--workdir"):
    self.workdir, self.what = workdir, what
    self._fd = None

  def __enter__(self) -> WorkdirLock:
    writable_dir(self.workdir, self.what, probe=False)  # the lock file is the probe
    path = os.path.join(self.workdir, LOCK_FILE)
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise UserError(f"{self.what}={self.workdir!r} is not writable ({e.strerror}); "
                      f"fix: choose a writable {self.what}") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
      os.close(fd)
      if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise UserError(f"cannot lock {path!r} ({e.strerror}); fix: use a local --workdir") \
            from None
      raise UserError(f"workdir {self.workdir!r} is in use by process {holder}; fix: wait for "
                      "it to finish or stop it (Ctrl-C / kill PID), or use another --workdir") \
          from None
    try:  # the holder's pid, for the message a second holder gets
      os.ftruncate(fd, 0)
      os.write(fd, f"{os.getpid()}\n".encode())
    except OSError as e:
      os.close(fd)
      if is_disk_full(e):
        raise disk_full_error(e, f"the lock of {self.what}={self.workdir!r}") from None
      raise UserError(f"cannot write {path!r} ({e.strerror or e}); fix: choose a writable "
                      f"{self.what}") from None
    self._fd = fd
    return self

  def __exit__(self, *exc) -> None:
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


class Checkpointer:
  """Save / restore `TrainState` + iterator state as one orbax checkpoint per step."""

  def __init__(self, workdir: str, keep: int = 3):
    self.directory = os.path.abspath(os.path.join(workdir, CKPT_DIR))
    self._pending = None  # the step of the save still being written in the background
    _quiet_write_failures()
    _quiet_async_leftovers()
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    with _quiet_orbax_reads():  # it reads every step's metadata: a broken one is restore's to say
      self._mngr = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=("state", "data"))

  def steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def save(self, step: int, state: Any, data_state: dict) -> None:
    """Saves (asynchronously); the previous checkpoint survives a failed save.

    A background write that failed surfaces here, at the next save, or in `wait`: the
    error names the step that failed (from the path in the error, else the pending one).
    """
    try:
      self._mngr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=True)
    except Exception as e:  # noqa: BLE001 - OSError, or TensorStore's ValueError(RESOURCE_...)
      raise self._save_error(e, self._pending if self._pending is not None else step) from None
    self._pending = step

  def wait(self) -> None:
    try:
      self._mngr.wait_until_finished()
    except Exception as e:  # noqa: BLE001 - as in `save`
      raise self._save_error(e, self._pending) from None
    self._pending = None

  def _save_error(self, e: Exception, step: int | None) -> Exception:
    """A UserError for a failed write (disk full, quota, I/O), naming its step; others as is."""
    text = str(e)
    if not isinstance(e, OSError) and not any(m in text for m in _WRITE_FAILURES):
      return e
    where = re.search(r"/(\d+)\.orbax-checkpoint-tmp", text)
    step = int(where.group(1)) if where else step
    good = [s for s in self.steps() if step is None or s < step]
    kept = f"checkpoint {good[-1]} is kept" if good else "no checkpoint was saved yet"
    full = any(m in text for m in _FULL) or is_disk_full(e)
    why = "no space left on device" if full else _first_words(e)
    self._pending = None
    return (DiskFull if full else UserError)(f"could not save checkpoint {step if step is not None else '?'} under "
                     f"{self.directory!r} ({why}); {kept}; fix: free disk space and re-run "
                     "the same command to resume")

  def restore_latest(self, abstract_state: Any, max_step: int | None = None,
                     heal: bool = False) -> tuple[int, Any, dict] | None:
    """The newest readable checkpoint as (step, state, data_state); None if there is none.

    An unreadable checkpoint (truncated copy, bad disk, a save cut short) is reported and
    skipped in favour of the one before it. With `heal` (the trainer, which holds the
    workdir lock) it is also moved aside to `corrupt-<step>`, so training can save that
    step again; tools that only read leave it in place. When none is readable the
    UserError is the only line printed (moved aside with `heal`, so a rerun starts at 0).
    """
    failed = []  # (step, why, where) of each unreadable checkpoint, newest first
    with _quiet_orbax_reads():
      for step in reversed(self.steps()):
        if max_step is not None and step > max_step:
          continue
        try:
          restored = (step, *self._restore(step, abstract_state))
        except Exception as e:  # noqa: BLE001 - any failure to read means "try an older one"
          failed.append((step, f"{type(e).__name__}: {_first_words(e)}",
                         f"; moved to {self.quarantine(step)}" if heal else ""))
          continue
        for bad, why, where in failed:
          logging.warning("checkpoint %d in %s is unreadable (%s)%s; using an older one",
                          bad, self.directory, why, where)
        return restored
    if failed:
      listed = ", ".join(str(s) for s, _, _ in failed)
      fix = ("restore them from a copy (they were moved aside to corrupt-*), or re-run the "
             "same command to train again from step 0" if heal else
             "restore the files or use a new workdir")
      raise UserError(f"no readable checkpoint in {self.directory!r}: all {len(failed)} "
                      f"(steps {listed}) failed to restore (the newest: {failed[0][1][:120]}); "
                      f"fix: {fix}")
    return None

  def _restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """(state, data_state) of checkpoint `step`, onto `abstract_state`'s structure, less the
    fields the checkpoint was written without (`_saved_fields`)."""
    target = self._saved_fields(step, abstract_state)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
    state = out["state"] if target is abstract_state else dataclasses.replace(abstract_state,
                                                                              **out["state"])
    return state, out["data"]

  def _saved_fields(self, step: int, abstract_state: Any) -> Any:
    """The restore target of checkpoint `step`: `abstract_state`, or, when it is a dataclass
    whose fields the checkpoint lacks and those fields hold no arrays (a field added since,
    empty for this run: TrainState.carry = () of every method but eggroll), its other fields
    as a dict. Read from the checkpoint's tree metadata, so a checkpoint that fails to read
    fails once, with its own error."""
    if not dataclasses.is_dataclass(abstract_state):
      return abstract_state
    handler = ocp.StandardCheckpointHandler()
    try:
      saved = set(handler.metadata(self._mngr.directory / str(step) / "state").keys())
    finally:
      handler.close()
    fields = {f.name: getattr(abstract_state, f.name) for f in dataclasses.fields(abstract_state)}
    absent = [k for k in fields if k not in saved]
    if not absent or any(jax.tree.leaves(fields[k]) for k in absent):
      return abstract_state  # nothing absent, or arrays absent: the restore reports it
    return {k: v for k, v in fields.items() if k in saved}

  def quarantine(self, step: int) -> str:
    """Moves checkpoint `step` to checkpoints/corrupt-<step>[.n]; returns the new path."""
    src = os.path.join(self.directory, str(step))
    dst = os.path.join(self.directory, f"{CORRUPT_PREFIX}{step}")
    n = 1
    while os.path.exists(dst):
      dst = os.path.join(self.directory, f"{CORRUPT_PREFIX}{step}.{n}")
      n += 1
    os.rename(src, dst)
    self._mngr.reload()
    return dst

  def close(self) -> None:
    try:
      self.wait()
    except BaseException:
      with contextlib.suppress(Exception):  # the wait's error is the one to report
        self._mngr.close()
      raise
    self._mngr.close()


def _first_words(e: Exception) -> str:
  """The start of an orbax / TensorStore error, without its multi-line spec dump."""
  text = str(e).split(" See full TensorStore details")[0]
  return text.splitlines()[0][:200] if text else ""


_FULL = ("No space left", "RESOURCE_EXHAUSTED", "Disk quota exceeded")
_WRITE_FAILURES = _FULL + ("Failed writing", "Error writing", "Input/output error")


class _WriteFailureFilter(pylogging.Filter):
  """Drops orbax's own error logs (each a traceback) of a failed checkpoint write: the
  trainer reports it once, as one line naming the step."""

  def filter(self, record) -> bool:
    if record.levelno < pylogging.ERROR or "orbax" not in (record.pathname or ""):
      return True
    text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
    return not any(m in text for m in _WRITE_FAILURES)


def _quiet_write_failures() -> None:
  absl_logger = logging.get_absl_logger()
  if not any(isinstance(f, _WriteFailureFilter) for f in absl_logger.filters):
    absl_logger.addFilter(_WriteFailureFilter())


class _ReadFailureFilter(pylogging.Filter):
  """Drops orbax's own error logs while checkpoints are tried one by one: each unreadable
  one is reported once by `restore_latest`, or all of them in its one-line error."""

  def filter(self, record) -> bool:
    return record.levelno < pylogging.ERROR or "orbax" not in (record.pathname or "")


@contextlib.contextmanager
def _quiet_orbax_reads():
  absl_logger, quiet = logging.get_absl_logger(), _ReadFailureFilter()
  absl_logger.addFilter(quiet)
  try:
    yield
  finally:
    absl_logger.removeFilter(quiet)


_READ_NOISE = ("_read_array_index_and_device_put", "call_soon_threadsafe")


def _is_read_noise(exc_type, exc, tb) -> bool:
  """An error of a failed restore's leftover reads, reported after the restore has failed:
  TensorStore callbacks into orbax's closed event loop, and its read coroutines collected."""
  if exc_type is RuntimeError and "Event loop is closed" in str(exc):
    return True
  while tb is not None:
    if tb.tb_frame.f_code.co_name in _READ_NOISE:
      return True
    tb = tb.tb_next
  return False


def _quiet_async_leftovers() -> None:
  """Once a checkpoint failed to restore or save, the reads and writes orbax had in flight
  report their own failures one by one (about 100 tracebacks for a tiny model, some before
  the failure reaches the trainer): these hooks drop those, and pass on everything else."""
  import sys
  import threading

  if getattr(sys.excepthook, "_soma_quiet", False):
    return
  old_except, old_unraisable, old_thread = sys.excepthook, sys.unraisablehook, threading.excepthook

  def excepthook(exc_type, exc, tb):
    if not _is_read_noise(exc_type, exc, tb):
      old_except(exc_type, exc, tb)

  def unraisablehook(u):
    if not _is_read_noise(u.exc_type, u.exc_value, u.exc_traceback):
      old_unraisable(u)

  def thread_hook(a):
    if not _is_read_noise(a.exc_type, a.exc_value, a.exc_traceback):
      old_thread(a)

  excepthook._soma_quiet = True
  sys.excepthook, sys.unraisablehook, threading.excepthook = excepthook, unraisablehook, thread_hook


def abstract_like(tree: Any) -> Any:
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
