"""What a study writes: results.json's shared fields, its cost (the runs it trained), the
JSON and table.md, and the sentences and numbers every table.md shares."""

from __future__ import annotations

import json
import math
import os
import time

import jax
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import metrics as metrics_lib
from soma_jax import records
from soma_jax.errors import UserError
from soma_jax.studies import datasets, planning

# Every run folder a study trained, resumed or found finished in this process (`train_all`,
# `own`), in order: a study's cost counts the ones since it began (`started`), never another
# run that happens to lie under its --out.
_RUNS: list[str] = []


def own(workdir: str) -> None:
  """Counts `workdir` as a run of the study in progress (its cost reads its summary.json)."""
  _RUNS.append(os.path.abspath(workdir))


def started(executor=None) -> dict:
  """When, under what load and with which executor a study began (`results` records them),
  and where its runs begin in this process's list of study runs (`cost`)."""
  return {"t0": time.perf_counter(), "load_average": list(os.getloadavg()),
          "executor": getattr(executor, "name", "inline"), "first_run": len(_RUNS)}


def read_summary(workdir: str) -> dict | None:
  """A run's summary.json, or None where it is missing or unreadable (a truncated file, not
  a JSON object): a run without one has not finished, and is counted as such."""
  try:
    with open(os.path.join(workdir, records.SUMMARY_FILE)) as f:
      done = json.load(f)
  except (OSError, ValueError):
    return None
  return done if isinstance(done, dict) else None


def _number(x: object) -> float:
  """A counter read from a file: its value where it is a finite number, else 0."""
  ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
  return float(x) if ok else 0.0


def cost(out: str, begun: dict) -> dict:
  """What the study's runs spent (those it trained or found finished since `begun`, `own`;
  not any other run under `out`), from each one's summary.json (its own totals, its seed's
  excluded): wall seconds of this call, and summed over runs the wall seconds of training
  updates, compilation, step compiles and evaluation (core- or device-seconds as each run
  counts them, `budget.COUNTERS`), and the executor."""
  del out  # the study's runs are listed, not found by walking its folder
  sums = dict.fromkeys(("update_seconds", "compile_seconds", "step_compiles", "eval_seconds",
                        "device_seconds"), 0.0)
  runs_read = 0
  for folder in dict.fromkeys(_RUNS[begun.get("first_run", 0):]):
    done = read_summary(folder)
    if done is not None:
      runs_read += 1
      for k in sums:
        sums[k] += _number(done.get(k))
  wall = time.perf_counter() - begun["t0"]
  return {"wall_seconds": wall, **sums, "step_compiles": int(sums["step_compiles"]),
          "update_fraction_of_wall": sums["update_seconds"] / wall if wall else None,
          "runs": runs_read, "executor": begun.get("executor", "inline"),
          "how": "sums over the runs' summary.json; update_seconds: wall seconds in training "
                 "updates; compile, eval: core-seconds on a CPU, device-seconds elsewhere"}


def finished_study(folder: str, study: str, field: str, fix: str) -> dict:
  """The results.json of a finished `study` in `folder` (read by a study that reuses its
  runs, named by its config field `field`), else a UserError ending in `fix`."""
  try:
    with open(os.path.join(folder, "results.json")) as f:
      theirs = json.load(f)
  except (OSError, ValueError):
    raise UserError(f"{field}={folder!r} holds no finished {study} (no readable "
                    f"results.json); {fix}") from None
  if not isinstance(theirs, dict) or theirs.get("study") != study:
    raise UserError(f"{field}={folder!r} holds study "
                    f"{theirs.get('study') if isinstance(theirs, dict) else None!r}, not {study}; "
                    f"{fix}")
  return theirs


def results(study: str, spec: str, plan: planning.StudyPlan, command: str,
            begun: dict, budget: dict, scored: tuple[eval_lib.TestSet, eval_lib.TestSet],
            data_dir: str, out: str, seeds: dict[str, dict], **rest) -> dict:
  """The results.json fields every study writes, then the study's own (`rest`).

  `begun` is `started()`; `budget` = {unit, per, ...}: the budget's unit, what one budget is
  for (a row, a configuration), and the study's own fields; `scored` = (validation, test)
  sets; `seeds` the records of `train_seeds`.
  """
  val, test = scored
  return common(
      study, spec, command, begun, out,
      budget={"amount": plan.budget, "counts": planning.COUNTS[budget["unit"]] + "; "
              "compilation, evaluation and checkpoints excluded", **budget},
      eval=datasets.describe_span(val, test),
      unigram_test_nats_per_byte=eval_lib.unigram_nats(data_dir, "test", test.route, test.score),
      data_dir=planning.shown(data_dir, out), seeds=list(plan.seeds),
      bootstrap_draws=plan.bootstrap_draws, reference=plan.reference, seed_runs=public(seeds),
      **rest)


def common(study: str, spec: str, command: str, begun: dict, out: str, **rest) -> dict:
  """The results.json fields of every study (what, the command, its wall seconds, the load
  and the platform), then the study's own (`rest`), then its cost."""
  return {"study": study, "spec": spec, "command": command,
          "wall_seconds": time.perf_counter() - begun["t0"],
          "load_average": {"start": begun["load_average"], "end": list(os.getloadavg())},
          "platform": jax.default_backend(), **rest, "cost": cost(out, begun)}


def public(x):
  """`x` without its private fields (keys starting with _) and with numpy made plain."""
  if isinstance(x, dict):
    return {k: public(v) for k, v in x.items() if not str(k).startswith("_")}
  if isinstance(x, list | tuple):
    return [public(v) for v in x]
  if isinstance(x, np.generic):
    return x.item()
  return x


def dump_json(path: str, payload: dict) -> None:
  """`payload` as JSON at `path`, through a temporary file renamed into place, every
  non-finite number written as null (`metrics.json_safe`; bare NaN is not JSON)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(metrics_lib.json_safe(payload), f, indent=1, allow_nan=False, default=float)
  os.replace(tmp, path)


def write(out: str, payload: dict, table) -> dict:
  """OUT/results.json (the payload, `dump_json`) and OUT/table.md (`table(payload)`); the
  payload."""
  dump_json(os.path.join(out, "results.json"), payload)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table(payload))
  return payload


def load_line(p: dict) -> str:
  """The sentence every table.md carries: the machine's 1-minute load at the start and end."""
  la = p["load_average"]
  return f"Load average {la['start'][0]:.2f} at the start, {la['end'][0]:.2f} at the end."


def head(header: str) -> list[str]:
  """A markdown table's header line ("| a | b |") and its separator, one "---" per cell."""
  return [header, "|" + "---|" * (header.count(" | ") + 1)]


def pm(stat: dict, signed: bool = False, digits: int = 3) -> str:
  f = f"+.{digits}f" if signed else f".{digits}f"
  return f"{stat['mean']:{f}}" + ("" if stat["sd"] is None else f" ± {stat['sd']:.{digits}f}")


def ci(stat: dict, digits: int = 3) -> str:
  """'+0.012 [-0.003, +0.027]' (the mean and its ci95), or the mean alone for one seed."""
  f = f"+.{digits}f"
  if stat.get("ci95") is None:
    return f"{stat['mean']:{f}}"
  lo, hi = stat["ci95"]
  return f"{stat['mean']:{f}} [{lo:{f}}, {hi:{f}}]"


def both(stat: dict, digits: int = 4) -> str:
  """'+0.012 [-0.003, +0.027]': the mean and its seeds-and-documents interval
  (`statistics.seed_difference`), or the mean alone for one seed."""
  ci95 = stat.get("seeds_and_documents", {}).get("ci95")
  return ci({"mean": stat["mean"], "ci95": ci95}, digits)
