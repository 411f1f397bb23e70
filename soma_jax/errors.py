"""User-facing errors: one clear line, exit code 2, no traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any


class UserError(Exception):
  """A problem with the user's input (config, paths, data); the message names the fix."""


def exit_on_user_error(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps an absl `main`: a UserError prints one line to stderr and exits with code 2."""

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  return wrapper
