"""User-facing errors: one clear line, exit code 2, no traceback."""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any


class UserError(Exception):
  """A problem with the user's input (config, paths, data); the message names the fix."""


MAX_MESSAGE = 2000  # characters of an error line; a longer one is cut (`shortened`)


def shortened(message: str, limit: int = MAX_MESSAGE) -> str:
  """`message` as one printable line: at most `limit` characters, the cut ones counted."""
  message = str(message)
  if len(message) <= limit:
    return message
  return f"{message[:limit]} ... ({len(message) - limit:,} more characters cut)"


class DiskFull(UserError):
  """A write failed for lack of space (or quota): what was saved before is kept, and nothing
  more can be written, so a study stops rather than start its remaining runs."""


# Exit status of a run stopped by a signal after saving: 128 + the signal's number (130 for
# Ctrl-C, 143 for SIGTERM), as a shell reports a process the signal ended.
def signal_exit_code(signum: int) -> int:
  return 128 + int(signum)


class Interrupted(KeyboardInterrupt):
  """A signal (Ctrl-C, SIGTERM) stopped the work after the run in progress was saved.

  A KeyboardInterrupt, so no `except Exception` on its way up (an executor's "report this
  run's failure and go on with the next") swallows it: the whole study stops. The entry
  point prints its message as one line and exits with `signal_exit_code(signum)`.
  """

  def __init__(self, message: str, signum: int = signal.SIGINT):
    super().__init__(message)
    self.signum = int(signum)


def is_disk_full(e: BaseException) -> bool:
  """Whether `e` is a write that failed for lack of space or quota (OSError ENOSPC / EDQUOT,
  or a DiskFull already)."""
  return isinstance(e, DiskFull) or (isinstance(e, OSError)
                                     and e.errno in (errno.ENOSPC, errno.EDQUOT))


def disk_full_error(e: OSError, what: str = "") -> DiskFull:
  """The one-line DiskFull for a failed write `e` (its file named when known)."""
  where = f" {e.filename!r}" if getattr(e, "filename", None) else ""
  return DiskFull(f"no space left on the disk{' writing' + where if where else ''}"
                  f"{' (' + what + ')' if what else ''}: {e.strerror or e}; everything saved "
                  "before is kept; fix: free disk space, then rerun the same command to resume")


_LEFT_RUNNING: list[str] = []  # device work a signal left running (`left_running`)


def left_running(what: str) -> None:
  """Notes device work left running on a signal (a first update not waited for): `finish`
  then ends the process without waiting for it."""
  _LEFT_RUNNING.append(what)


def finish(code: int):
  """sys.exit(code); once device work was left running (`left_running`), os._exit after the
  output is flushed, since the interpreter's exit frees that work's arrays only when it ends
  (a huge first update: hours)."""
  if _LEFT_RUNNING:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):
        pass
    os._exit(code)
  sys.exit(code)


def _stop_on_sigterm(signum, frame):
  """SIGTERM outside a training loop: stop as Ctrl-C does (cleanups run), with its status."""
  raise Interrupted("stopped by SIGTERM; rerun the same command to resume", signum)


def stop_on_sigterm() -> None:
  """SIGTERM raises `Interrupted` in the main thread (as SIGINT raises KeyboardInterrupt);
  a training loop installs its own handler over it (checkpoint, then stop)."""
  try:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
  except ValueError:  # not the main thread
    pass


def need(cond: bool, msg: str) -> None:
  """A config check: UserError(msg) unless `cond` (msg names the field and the fix)."""
  if not cond:
    raise UserError(msg)


def exit_on_user_error(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps an absl `main`: a UserError prints one line to stderr and exits with code 2."""

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except UserError as e:
      print(f"error: {shortened(e)}", file=sys.stderr)
      sys.exit(2)
    except OSError as e:
      if not is_disk_full(e):
        raise
      print(f"error: {disk_full_error(e)}", file=sys.stderr)
      sys.exit(2)
    except Interrupted as e:  # saved, then stopped: a whole study, not just its run
      print(f"stopped: {e}", file=sys.stderr)
      finish(signal_exit_code(e.signum))
    except KeyboardInterrupt:  # Ctrl-C outside a training loop, or a second one while stopping
      print("interrupted (Ctrl-C); what was saved is kept; rerun the same command to resume",
            file=sys.stderr)
      finish(signal_exit_code(signal.SIGINT))

  return wrapper


def writable_dir(path: str, what: str, probe: bool = True) -> str:
  """Creates folder `path` (with parents) or raises a UserError saying why not; returns it absolute.

  With `probe`, a file is written and removed there to prove it is writable.
  """
  path = os.path.abspath(os.path.expanduser(path))
  _existing_folder_above(path, f"folder {path!r} for {what}", what)
  try:
    os.makedirs(path, exist_ok=True)
    if probe:
      _probe(path)
  except OSError as e:
    raise UserError(f"folder {path!r} for {what} is not writable ({e.strerror}); "
                    f"fix: choose a writable {what}") from None
  return path


def writable_file(path: str, what: str) -> str:
  """Checks that file `path` can be written (its folder is made); returns it absolute."""
  path = os.path.abspath(os.path.expanduser(path))
  if os.path.isdir(path):
    raise UserError(f"{what}={path!r} is a folder; fix: pass a file name")
  writable_dir(os.path.dirname(path), what)
  if os.path.exists(path) and not os.access(path, os.W_OK):
    raise UserError(f"{what}={path!r} is not writable; fix: choose a writable {what}")
  return path


def check_output(path: str, what: str, kind: str = "file") -> str:
  """Refuses, before any work, an output `path` ("file" or "folder") that cannot be written:
  a file that is a folder, a folder that is a file, one under a file, or a place the process
  may not write (a file is created there and removed: the kernel's answer, not the mode
  bits'). Nothing is made; returns the path absolute."""
  path = os.path.abspath(os.path.expanduser(path))
  if kind == "file" and os.path.isdir(path):
    raise UserError(f"{what}={path!r} is a folder; fix: pass a file name")
  if kind == "folder" and os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{what}={path!r} is a file, not a folder; fix: pass a folder name")
  folder = path if kind == "folder" else os.path.dirname(path)
  ancestor = _existing_folder_above(folder, f"{what}={path!r}", what)
  try:
    _probe(ancestor)
    if kind == "file" and os.path.exists(path):
      with open(path, "a"):  # appends nothing: the file is kept as it is
        pass
  except OSError as e:
    if is_disk_full(e):
      raise disk_full_error(e, what) from None
    raise UserError(f"{what}={path!r} is not writable ({e.strerror or e}); fix: choose a "
                    f"writable {what}") from None
  return path


def _existing_folder_above(path: str, named: str, what: str) -> str:
  """The nearest existing path at or above `path`; a UserError when it is a file (nothing can
  be made under it). `named` says what was asked for, `what` which flag to change."""
  ancestor = path
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise UserError(f"{named} cannot be made: {ancestor!r} is a file, not a folder; fix: "
                    f"choose a {what} that is not under a file")
  return ancestor


def _probe(folder: str) -> None:
  """Creates and removes a file in `folder` (OSError if the kernel refuses)."""
  fd, probe = tempfile.mkstemp(prefix=".write_test.", dir=folder)
  os.close(fd)
  os.remove(probe)


def writable(folder: str) -> bool:
  """Whether a file can be created in existing `folder`."""
  try:
    _probe(folder)
  except OSError:
    return False
  return True


def check_output_args(parser, args, **kinds: str) -> None:
  """For a script parsing its own arguments (argparse): each output `dest="file" | "folder"`
  given in `args` checked writable (`check_output`) before any work; a bad one is
  `parser.error` (one line after the usage, exit 2)."""
  for dest, kind in kinds.items():
    if getattr(args, dest, None):
      try:
        check_output(getattr(args, dest), f"--{dest}", kind)
      except UserError as e:
        parser.error(str(e))
