"""One CPU host device per usable core, chosen at an entry point's start-up; the cores a CPU
run is charged for.

XLA runs one CPU device's program on about 1.25 of 2 cores; with one host device per core,
the FSO / DDPP mesh of `parallel.py` keeps every core busy. `start` is called by the entry
points (`cli.run`, the quickstart notebook) before JAX starts its backends, never at import,
so tests and library users keep JAX's single CPU device unless they ask. It only sets the
CPU client's device count (JAX's `jax_num_cpu_devices`): a GPU run is unchanged.

Who decides the count, first match wins: an explicit `--cpu_devices=K`; the user's own
`JAX_NUM_CPU_DEVICES` or `XLA_FLAGS=--xla_force_host_platform_device_count=K`; else one
device per usable core, `usable_cores()`: the CPU affinity mask (`taskset`, `cpuset`)
capped by the cgroup CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), rounded down.
"""

from __future__ import annotations

import math
import os
import re

import jax

from soma_jax.errors import UserError

_XLA_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\d+)")
CGROUP_ROOT = "/sys/fs/cgroup"

# How this process's CPU device count was chosen (for the start-up line); "" = JAX's own
# default (one device), i.e. `start` was not called.
chosen_by = ""


def _cgroup_dirs(root: str, proc_cgroup: str) -> list[tuple[str, str]]:
  """(version, folder) of every cgroup folder holding this process's CPU limits, innermost
  first: its own cgroup and each ancestor up to the (possibly namespaced) root."""
  try:
    with open(proc_cgroup) as f:
      lines = f.read().splitlines()
  except OSError:
    return []
  out = []
  for line in lines:
    _, controllers, path = line.split(":", 2)
    if controllers == "":  # v2: one unified hierarchy
      version, base = "v2", root
    elif "cpu" in controllers.split(","):
      version, base = "v1", os.path.join(root, controllers)
      if not os.path.isdir(base):
        base = os.path.join(root, "cpu")
    else:
      continue
    parts = [p for p in path.split("/") if p]
    out += [(version, os.path.join(base, *parts[:i])) for i in range(len(parts), -1, -1)]
  return out


def cgroup_cpu_limit(root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup"
                     ) -> float | None:
  """The CPUs this process's cgroups allow (quota / period, the tightest of them), or None
  when no cgroup sets a quota."""
  limits = []
  for version, folder in _cgroup_dirs(root, proc_cgroup):
    try:
      if version == "v2":
        with open(os.path.join(folder, "cpu.max")) as f:
          quota, period = f.read().split()[:2]
      else:
        with open(os.path.join(folder, "cpu.cfs_quota_us")) as f:
          quota = f.read().strip()
        with open(os.path.join(folder, "cpu.cfs_period_us")) as f:
          period = f.read().strip()
    except (OSError, ValueError):
      continue
    if quota not in ("max", "-1") and int(period) > 0:
      limits.append(int(quota) / int(period))
  return min(limits) if limits else None


def usable_cores() -> int:
  """Cores this process may run on: its affinity mask, capped by the cgroup quota (>= 1)."""
  if hasattr(os, "sched_getaffinity"):
    cores = len(os.sched_getaffinity(0))
  else:  # macOS, Windows: no affinity call
    cores = os.cpu_count() or 1
  quota = cgroup_cpu_limit()
  if quota is not None:
    cores = min(cores, math.floor(quota))
  return max(1, cores)


def users_count() -> tuple[int, str] | None:
  """(count, where) when the user's environment already sets the CPU device count."""
  if jax.config.jax_num_cpu_devices >= 0:  # JAX_NUM_CPU_DEVICES or a config update
    return jax.config.jax_num_cpu_devices, "JAX_NUM_CPU_DEVICES"
  found = _XLA_COUNT.findall(os.environ.get("XLA_FLAGS", ""))
  if found:
    return int(found[-1]), "XLA_FLAGS"
  return None


def check_environment() -> None:
  """UserError for a CPU device count in the environment that JAX cannot start with: a
  JAX_NUM_CPU_DEVICES that is not a number (set aside by soma_jax/__init__.py, since
  `import jax` itself fails on it) or a count below 1 there or in XLA_FLAGS."""
  import soma_jax

  fix = "fix: unset it (one CPU device per usable core) or set a count >= 1, e.g. 2"
  for name, value in soma_jax.BAD_ENV.items():
    raise UserError(f"{name}={value!r} is not a device count; {fix}")
  theirs = users_count()
  if theirs is not None and theirs[0] < 1:
    shown = ("JAX_NUM_CPU_DEVICES" if theirs[1] == "JAX_NUM_CPU_DEVICES" else
             "XLA_FLAGS=--xla_force_host_platform_device_count")
    raise UserError(f"{shown}={theirs[0]}: JAX cannot run on 0 CPU devices; {fix}")


def is_backend_failure(e: BaseException) -> bool:
  """Whether `e` is JAX failing to start a backend (an unknown or absent JAX_PLATFORMS
  platform): its RuntimeError, or the bare AssertionError of xla_bridge when none started."""
  if isinstance(e, RuntimeError):
    return str(e).startswith("Unable to initialize backend")
  tb = e.__traceback__
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return isinstance(e, AssertionError) and tb is not None and \
      tb.tb_frame.f_code.co_filename.endswith("xla_bridge.py")


def backend_error(e: BaseException) -> UserError:
  """One line for `is_backend_failure`: the platform asked for, why it failed, the fix."""
  platforms = os.environ.get("JAX_PLATFORMS", "") or str(jax.config.jax_platforms or "")
  why = str(e).split(" (set JAX_PLATFORMS")[0].split(" (you may need")[0].strip()
  if any(p in ("gpu", "cuda", "rocm") for p in platforms.lower().split(",")):
    why = ("no GPU backend: the CUDA build of JAX is not installed (.venv/bin/pip install -e "
           "'.[cuda12]', BUILD.md) or it finds no GPU" + (f" ({why})" if why else ""))
  return UserError(f"JAX_PLATFORMS={platforms!r}: JAX cannot start that platform here "
                   f"({why or type(e).__name__}); fix: unset JAX_PLATFORMS to let JAX choose, "
                   "or set JAX_PLATFORMS=cpu")


def start(requested: int = 0) -> str:
  """Before JAX's backends start: the CPU device count (see the module docstring).

  `requested` > 0 is an explicit count (--cpu_devices). Returns, and keeps in `chosen_by`,
  how the count was chosen. Raises UserError for a negative count, or an explicit one that
  comes after JAX has started (nothing can change it then).
  """
  global chosen_by
  from jax._src import xla_bridge

  if requested < 0:
    raise UserError(f"--cpu_devices={requested}; use 0 (one per usable core) or a count >= 1")
  check_environment()
  if xla_bridge.backends_are_initialized():
    if requested:
      raise UserError("--cpu_devices is set after JAX started its devices; fix: call "
                      "host_devices.start before anything touches jax.devices()")
    chosen_by = chosen_by or "JAX had already started"
    return chosen_by
  if requested:
    jax.config.update("jax_num_cpu_devices", requested)
    chosen_by = "--cpu_devices"
  elif (theirs := users_count()) is not None:
    chosen_by = theirs[1]
  else:
    jax.config.update("jax_num_cpu_devices", usable_cores())
    chosen_by = "one per usable core"
  return chosen_by


# What `charged_units` counts, in words: the rule results files quote beside a time budget.
CHARGE_RULE = ("update wall time x host_devices.charged_units: on a CPU the cores the process may "
               "use (core-seconds), elsewhere the devices the step holds")


def charged_units(step_devices: int) -> int:
  """What one second of training costs, in device-seconds (SPEC 7): on a CPU, the cores every
  process may use, whatever the device layout; elsewhere the devices the step holds.

  Host devices on a CPU are one partition of the same cores, so a one-device run on 2 cores
  and a 2-device sharded run both hold 2 cores: both are charged 2 core-seconds a second.
  """
  if jax.default_backend() == "cpu":
    return usable_cores() * jax.process_count()
  return step_devices
