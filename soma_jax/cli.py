"""Entry-point plumbing shared by experiments/ and benchmarks/: flag errors exit 2, and one
CPU host device per usable core (`host_devices.start`) before `main` runs."""

from __future__ import annotations

import functools
import math
import os
import re
import sys
from collections.abc import Callable

from absl import app, flags, logging

from soma_jax import host_devices
from soma_jax.errors import (
    UserError,
    check_output,
    exit_on_user_error,
    shortened,
    stop_on_sigterm,
    writable,
)

# Every output flag of the entry points ({flag name: "file" | "folder"}), defined with
# `output_flag`: each one given is checked writable once the flags are parsed, before `main`
# runs, so a result is never computed for a path that cannot take it.
OUTPUT_FLAGS: dict[str, str] = {}


def output_flag(name: str, default: str | None, help: str, kind: str = "file"):
  """flags.DEFINE_string for an output path (`kind` "file" or "folder"), checked up front."""
  if kind not in ("file", "folder"):
    raise ValueError(f"kind must be file or folder, got {kind!r}")
  OUTPUT_FLAGS[name] = kind
  return flags.DEFINE_string(name, default, help)


def check_outputs(paths: dict[str, tuple[str | None, str]]) -> None:
  """{--name: (path or None, "file" | "folder")}: each path given refused unless writable
  (`errors.check_output`); for entry points that parse their own arguments (scripts/)."""
  for name, (path, kind) in paths.items():
    if path:
      check_output(path, name, kind)

_CPU_DEVICES = flags.DEFINE_integer(
    "cpu_devices", 0, "CPU host devices: 0 = one per usable core (CPU affinity and cgroup "
    "quota), unless JAX_NUM_CPU_DEVICES or XLA_FLAGS=--xla_force_host_platform_device_count "
    "sets it; no effect on a GPU run")
_CACHE = flags.DEFINE_string(
    "compilation_cache", None, "JAX's persistent compilation cache: a folder (default "
    "$XDG_CACHE_HOME/soma-jax/jax, else ~/.cache/soma-jax/jax), or 'off'; the same programs "
    "either way, so results are bit-identical; JAX_COMPILATION_CACHE_DIR, when set, wins")


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag or config override is one line and exit code 2."""
  try:
    argv = flags.FLAGS(argv)
    _check_config_files()
    _check_numbers()
    check_outputs({f"--{name}": (flags.FLAGS[name].value, kind)
                   for name, kind in OUTPUT_FLAGS.items() if name in flags.FLAGS})
    host_devices.start(_CPU_DEVICES.value)
    compilation_cache(_CACHE.value)
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # library info logs (orbax) only on request
    return argv
  except SystemExit as e:  # absl exits 1 after printing --help; asking for help succeeds
    help_flags = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")
    sys.exit(0 if e.code == 1 and any(a in help_flags for a in argv[1:]) else e.code)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError, UserError) as e:
    print(f"error: {shortened(_flag_error(e, argv))}", file=sys.stderr)
    sys.exit(2)


def _check_numbers() -> None:
  """A float flag given as nan is refused (no flag means anything by it; every comparison
  with it is false, so range checks let it through)."""
  for name in flags.FLAGS:
    value = flags.FLAGS[name].value
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, float) and math.isnan(v) for v in values):
      raise UserError(f"--{name}=nan is not a number; fix: pass a number (see --helpfull)")


def default_cache_dir() -> str:
  """$XDG_CACHE_HOME/soma-jax/jax, else ~/.cache/soma-jax/jax."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "soma-jax", "jax")


def compilation_cache(where: str | None) -> str | None:
  """Turns JAX's persistent compilation cache on (every program, however quick to compile)
  in `where` (None: JAX_COMPILATION_CACHE_DIR, else `default_cache_dir`); 'off' leaves it
  off. The folder in use, or None."""
  import jax

  if where is None:
    where = os.environ.get("JAX_COMPILATION_CACHE_DIR") or default_cache_dir()
  if where.strip().lower() in ("off", "none", ""):
    return None
  where = os.path.abspath(os.path.expanduser(where))
  try:
    os.makedirs(where, exist_ok=True)
  except OSError as e:
    raise UserError(f"--compilation_cache={where!r} cannot be created ({e.strerror or e}); "
                    "fix: a writable folder, or --compilation_cache=off") from None
  if not writable(where):  # JAX would only warn, once per program, and cache nothing
    raise UserError(f"--compilation_cache={where!r} is not writable; fix: a writable folder, "
                    "or --compilation_cache=off")
  jax.config.update("jax_compilation_cache_dir", where)
  for key, env in (("jax_persistent_cache_min_compile_time_secs",
                    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"),
                   ("jax_persistent_cache_min_entry_size_bytes",
                    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")):
    jax.config.update(key, float(os.environ.get(env, 0)) if "secs" in key
                      else int(os.environ.get(env, 0)))
  return where


def _flag_error(e: Exception, argv: list[str]) -> str:
  """The one line of a flag error. A --config file that failed to load comes first (an
  override of it then fails too, as ml_collections' OSError, before the flags are parsed),
  then a file without get_config, then a misspelt field."""
  try:
    _check_config_files()
  except UserError as load_error:
    return str(load_error)
  except Exception:  # noqa: BLE001 - the flags are unparsed: read the config files from argv
    pass
  text = str(e).strip()
  configs = [a.split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a
             and type(flags.FLAGS._flags().get(a[2:].split("=", 1)[0])).__name__ == "_ConfigFlag"]
  for name, value in configs:
    path = value.split(":", 1)[0]
    if not os.path.isfile(path):
      return (f"{name}={value} cannot be loaded (no such file {path!r}); fix: pass an "
              "existing config file, e.g. experiments/configs/soma.py:n=4")
  if isinstance(e, AttributeError) and "get_config" in text:
    shown = " / ".join(f"{n}={v}" for n, v in configs) or "the config file"
    return (f"{shown} defines no get_config(); fix: pass a config file with "
            "`def get_config(arg=None)` returning a ConfigDict, e.g. "
            "experiments/configs/soma.py:n=4")
  if isinstance(e, OSError) and e.__cause__ is not None:
    text = str(e.__cause__).strip().splitlines()[0]
  if isinstance(e, AttributeError | KeyError):
    return _unknown_field(e)
  return text


def _unknown_field(e: Exception) -> str:
  """ml_collections' error for a misspelt field (the repr of a KeyError, with escaped quotes
  and a literal \\n) as one plain line: the name, its likely spelling, the fix."""
  text = str(e).replace("\\'", "'").replace("\\n", "\n")
  name = re.search(r"""Key ["']?([\w.]+)|^["']?([\w.]+)["']?$""", text.strip())
  hint = re.search(r'Did you mean "([\w.]+)"', text)
  shown = next((g for g in name.groups() if g), None) if name else text.splitlines()[0].strip("\"' ")
  return (f"unknown config field {shown}{f' (did you mean {hint.group(1)}?)' if hint else ''}; "
          "fix: check the name against the config file")


def _check_config_files() -> None:
  """A --config file that failed to load (missing, unreadable) is a UserError now."""
  for name in flags.FLAGS:
    value = flags.FLAGS[name].value
    if type(value).__name__ == "_ErrorConfig":  # ml_collections defers the load error
      error = str(object.__getattribute__(value, "_error")).strip().splitlines()
      raise UserError(f"--{name}={flags.FLAGS[name].config_filename} cannot be loaded "
                      f"({error[-1].strip() if error else 'unknown error'}); fix: pass an "
                      "existing config file, e.g. experiments/configs/soma.py:n=4")


def run(main: Callable[[list[str]], None], positional: bool = False) -> None:
  """`app.run(main)` with one-line errors (exit 2) for bad flags, stray arguments and
  UserError, and a quiet exit when the reader of stdout goes away (`| head`); the CPU
  device count is set (`host_devices.start`, --cpu_devices) before `main` runs.

  Arguments that are not flags are refused unless `positional` (`main` reads argv[1:]:
  merge.py's workdirs, report.py's NAME=WORKDIR). Info-level logs of libraries are hidden
  unless --verbosity is given; progress and results are printed by the entry points.
  """
  stop_on_sigterm()  # SIGTERM stops like Ctrl-C: saved work kept, one line, exit 143
  app.run(exit_on_user_error(functools.partial(_main_checked, main, positional)),
          flags_parser=_parse_flags)


def _main_checked(main: Callable[[list[str]], None], positional: bool, argv: list[str]) -> None:
  if len(argv) > 1 and not positional:  # absl would pass them on, and most mains ignore them
    raise UserError(f"unexpected arguments: {argv[1:]}; fix: pass options as --name=value, and "
                    "quote a value with spaces (--prompt='hello world')")
  try:
    main(argv)
  except (RuntimeError, AssertionError) as e:  # JAX could not start the platform asked for
    if not host_devices.is_backend_failure(e):
      raise
    raise host_devices.backend_error(e) from None
  except BrokenPipeError:  # the reader went away (e.g. `| head -c 100`): no traceback, and
    # the exit status of a process stopped by SIGPIPE, as `yes | head` gives
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail
    sys.exit(128 + 13)


def log_devices() -> None:
  """The entry points' start-up log line: this process, the job's processes, the devices."""
  import jax

  logging.info("process %d of %d, devices: %s", jax.process_index(), jax.process_count(),
               jax.devices())


def workdir_flag(value: str | None, name: str = "--workdir") -> str:
  """A run-folder flag's value, refused when empty (`--workdir=` would train into the
  current folder); returned as given."""
  if value is None or not value.strip():
    raise UserError(f"{name}= is empty; fix: name the folder, e.g. {name}=runs/soma_n4")
  return value


# Config fields holding paths; `absolute_paths` stores them absolute, so a run's config.json
# names the same folders whatever folder a tool is started from later.
PATH_FIELDS = ("data.dir", "init_from", "data_dir", "trained_dir")


def absolute_paths(c) -> None:
  """Every non-empty PATH_FIELDS value of config `c` (where present) made absolute."""
  for dotted in PATH_FIELDS:
    *parents, key = dotted.split(".")
    node = c
    for p in parents:
      node = node.get(p) if hasattr(node, "get") else None
    if node is None or not hasattr(node, "get") or not isinstance(node.get(key), str):
      continue
    if node[key].strip():
      with c.unlocked():
        node[key] = os.path.abspath(os.path.expanduser(node[key]))


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
