"""User-facing errors: one clear line, exit code 2, no traceback."""

from __future__ import annotations

import functools
import os
import sys
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
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
      print("interrupted", file=sys.stderr)
      sys.exit(130)

  return wrapper


def writable_dir(path: str, what: str, probe: bool = True) -> str:
  """Creates folder `path` (with parents) or raises a UserError saying why not; returns it absolute.

  With `probe`, a file is written and removed there to prove it is writable.
  """
  path = os.path.abspath(os.path.expanduser(path))
  ancestor = path
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise UserError(f"cannot make folder {path!r} for {what}: {ancestor!r} is a file, not a "
                    f"folder; fix: choose a {what} that is not under a file")
  try:
    os.makedirs(path, exist_ok=True)
    if probe:
      test_file = os.path.join(path, f".write_test.{os.getpid()}")
      with open(test_file, "w"):
        pass
      os.remove(test_file)
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
