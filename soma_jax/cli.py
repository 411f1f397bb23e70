"""Entry-point plumbing shared by experiments/ and benchmarks/: flag errors exit 2."""

from __future__ import annotations

import sys
from collections.abc import Callable

from absl import app, flags, logging

from soma_jax.errors import UserError, exit_on_user_error


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag or config override is one line and exit code 2."""
  try:
    argv = flags.FLAGS(argv)
    _check_config_files()
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # library info logs (orbax) only on request
    return argv
  except SystemExit as e:  # absl exits 1 after printing --help; asking for help succeeds
    help_flags = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")
    sys.exit(0 if e.code == 1 and any(a in help_flags for a in argv[1:]) else e.code)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError, UserError) as e:
    msg = str(e).strip()
    if isinstance(e, AttributeError | KeyError):
      msg = msg.strip("\"'")
      msg = f"unknown config field {msg}; fix: check the name against the config file"
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def _check_config_files() -> None:
  """A --config file that failed to load (missing, unreadable) is a UserError now."""
  for name in flags.FLAGS:
    value = flags.FLAGS[name].value
    if type(value).__name__ == "_ErrorConfig":  # ml_collections defers the load error
      error = str(object.__getattribute__(value, "_error")).strip().splitlines()
      raise UserError(f"--{name}={flags.FLAGS[name].config_filename} cannot be loaded "
                      f"({error[-1].strip() if error else 'unknown error'}); fix: pass an "
                      "existing config file, e.g. experiments/configs/soma.py:n=4")


def run(main: Callable[[list[str]], None]) -> None:
  """`app.run(main)` with one-line errors (exit 2) for bad flags and UserError.

  Info-level logs of libraries are hidden unless --verbosity is given; progress and
  results are printed by the entry points themselves.
  """
  app.run(exit_on_user_error(main), flags_parser=_parse_flags)


def positive_ints(name: str, values: list[str]) -> list[int]:
  """A list flag's values as positive integers, or a UserError naming --name."""
  try:
    out = [int(v) for v in values]
  except ValueError:
    out = []
  if not out or min(out) < 1:
    raise UserError(f"--{name}={','.join(values)} must be positive integers, e.g. 1,2,4")
  return out


def emit_json(result: dict, path: str | None) -> None:
  """Prints a result as JSON and, when `path` is given, writes it there (folders made)."""
  import json
  import os

  text = json.dumps(result, indent=1, default=float)
  print(text)
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      f.write(text + "\n")
