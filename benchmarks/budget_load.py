r"""Does a run's budget move with the machine's load? (SPEC 9.6) One budgeted run, alone and
beside busy background processes: the updates it reaches in each, with JSON output.

  python -m benchmarks.budget_load \
      --config=experiments/configs/compare.py:study=table4,size=cpu --row=soma_n2 \
      --budget=40 --units=cpu_seconds,device_seconds --busy=2 \
      --json=docs/results/budget_load.json

Trains Table 4's row `--row` from a fresh init (a temporary workdir each time) until
`--budget` of each unit in `--units`, first alone, then beside `--busy` processes that
spin a CPU each (`python -c "while True: pass"`, started `--warmup` seconds before the run
and killed after it), `--repeats` times in that order. Records per run the updates reached,
the budget counters, wall seconds and the load average before and after; per unit the mean
updates alone and beside the load, their relative difference and whether it is within
`--tolerance` (5%: the bar a comparison's budget must meet). Without --data_dir the
built-in pystdlib corpus is prepared in a temporary folder. Run it on an otherwise idle
machine: other jobs count as load in both conditions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from soma_jax import budget as budget_lib
from soma_jax import cli, host_devices
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.config import BUDGET_UNITS
from soma_jax.errors import UserError
from soma_jax.studies import datasets, planning, table4, training

_CONFIG = config_flags.DEFINE_config_file(
    "config", f"experiments/configs/compare.py:study={table4.STUDY.name},size=cpu",
    "a compare.py study config: its methods are the rows", lock_config=True)
_ROW = flags.DEFINE_string("row", "soma_n2", "the row (config.methods.NAME) to train")
_BUDGET = flags.DEFINE_float("budget", 40.0, "budget of each run, in each unit of --units")
_UNITS = flags.DEFINE_list("units", ["cpu_seconds", "device_seconds"], "budget units to test")
_BUSY = flags.DEFINE_integer("busy", 2, "busy background processes beside the loaded runs")
_WARMUP = flags.DEFINE_float("warmup", 5.0, "seconds the busy processes spin before a run")
_REPEATS = flags.DEFINE_integer("repeats", 1, "alone / loaded pairs per unit")
_TOLERANCE = flags.DEFINE_float("tolerance", 0.05, "the largest relative difference allowed")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "prepared data dir (default: pystdlib)")
_JSON = cli.output_flag("json", None, "write the results here")

SPIN = "while True: pass"


def start_busy(n: int) -> list[subprocess.Popen]:
  """`n` processes that each keep one CPU busy until killed."""
  return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
  for p in procs:
    p.kill()
    p.wait()


def one_run(spec: spec_lib.RunSpec, busy: int, warmup: float) -> dict:
  """Trains a budgeted run (`training.budgeted`: a fresh init, to its budget of one unit)
  beside `busy` spinning processes."""
  unit = spec.budget.unit
  procs = start_busy(busy)
  try:
    time.sleep(warmup if busy else 0.0)
    load0 = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as workdir:
      t0 = time.perf_counter()
      summary = train_lib.train_to_end(spec, workdir, f"budget_load {unit} run")
      wall = time.perf_counter() - t0
    load1 = list(os.getloadavg())
  finally:
    stop_busy(procs)
  return {"unit": unit, "busy_processes": busy, "updates": int(summary["updates"]),
          **{k: float(summary[k]) for k in budget_lib.TRAINING_TIMERS},
          "budget_before_last_update": summary["budget_before_last_update"],
          "wall_seconds": wall, "load_average_before": load0, "load_average_after": load1}


def compare_unit(runs: list[dict], tolerance: float) -> dict:
  """Mean updates alone and loaded, their relative difference, within the tolerance?"""
  alone = [r["updates"] for r in runs if not r["busy_processes"]]
  loaded = [r["updates"] for r in runs if r["busy_processes"]]
  a, b = float(np.mean(alone)), float(np.mean(loaded))
  diff = (b - a) / a
  return {"updates_alone": alone, "updates_loaded": loaded, "mean_alone": a, "mean_loaded": b,
          "relative_difference": diff, "within_tolerance": bool(abs(diff) <= tolerance)}


def check_flags(rows: list[str], row: str, units: list[str], budget: float, busy: int,
                repeats: int) -> None:
  """A UserError for a --row not among the config's `rows`, or a bad unit or count."""
  if row not in rows:
    raise UserError(f"--row={row!r} is not a method of this config; have {', '.join(rows)}")
  bad = [u for u in units if u not in BUDGET_UNITS]
  if bad or busy < 1 or repeats < 1 or budget <= 0:
    raise UserError(f"--units={units} (use {', '.join(BUDGET_UNITS)}), --busy={busy} and "
                    f"--repeats={repeats} (>= 1), --budget={budget} (> 0)")


def measure(specs: dict[str, spec_lib.RunSpec], row: str, busy: int, warmup: float,
            repeats: int, tolerance: float) -> dict:
  """Each unit's budgeted run (`specs`: unit -> the row's run at that unit's budget) alone
  and beside `busy` processes, `repeats` times in that order."""
  s = next(iter(specs.values()))
  out = {"row": row, "method": s.method.name, "n_experts": s.n_experts,
         "d_t": s.method.model.d_t, "budget": s.budget.amount, "busy_processes": busy,
         "busy_command": SPIN, "warmup_seconds": warmup, "tolerance": tolerance,
         "platform": jax.default_backend(), "usable_cores": host_devices.usable_cores(),
         "devices": jax.device_count(), "layout": training.layout_of(s),
         "load_average_start": list(os.getloadavg()), "runs": [], "units": {}}
  for unit, spec in specs.items():
    runs = []
    for _ in range(repeats):
      for n in (0, busy):
        runs.append(one_run(spec, n, warmup))
        print(f"[budget_load] {unit}, {n} busy: {runs[-1]['updates']} updates in "
              f"{runs[-1]['wall_seconds']:.1f} s wall", file=sys.stderr, flush=True)
    out["runs"] += runs
    out["units"][unit] = compare_unit(runs, tolerance)
  out["load_average_end"] = list(os.getloadavg())
  return out


def main(argv):
  del argv
  config = _CONFIG.value
  check_flags(list(config.methods.keys()), _ROW.value, _UNITS.value, _BUDGET.value,
              _BUSY.value, _REPEATS.value)
  c = planning.sized(config)[_ROW.value]
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = _DATA_DIR.value or datasets.ensure_data(config.data_dir, tmp, 2)
    specs = {unit: training.budgeted(c, data_dir, 0, None, unit, _BUDGET.value, 1)
             for unit in _UNITS.value}
    result = measure(specs, _ROW.value, _BUSY.value, _WARMUP.value, _REPEATS.value,
                     _TOLERANCE.value)
  result["command"] = "python -m benchmarks.budget_load " + " ".join(sys.argv[1:])
  for unit, u in result["units"].items():
    print(f"{unit}: {u['mean_alone']:.1f} updates alone, {u['mean_loaded']:.1f} beside "
          f"{result['busy_processes']} busy processes ({u['relative_difference']:+.1%}; "
          f"within {result['tolerance']:.0%}: {u['within_tolerance']})", file=sys.stderr)
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
