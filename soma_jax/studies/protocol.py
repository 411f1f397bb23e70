"""What the comparisons here share (SPEC 9.1, 9.2, 9.6): seeds, budgets, scoring, statistics.

- Starts (SPEC 9.6): every architecture starts from a seed run of its own (an N = 1 run at
  the SOMA expert's width for SOMA, one at the monolith's width for the monoliths, one GRU
  for EGGROLL). Every seed gets the same number of updates (`seed_updates`, never seconds:
  a narrower model runs more updates per second and would start ahead) at `seed_run_seed`,
  a data and direction seed outside the optimisation seeds. The compared phase continues it
  (`init_state`): parameters, Adam moments, the plateau schedule's state and the step
  counter, so its first update is the seed's last + 1. Every optimisation seed of a row
  starts from that one state; the optimisation seed changes only the batches and directions.
  A study whose config sets `own_starts` (SPEC 9.8) gives each optimisation seed s seed runs
  of its own instead, trained at seed_run_seed + s (`train_seed_sets`), so where a start lands
  enters every interval over seeds; `interval_kind` names which the intervals hold.
  The seeds' cost is reported apart and counted for no row.
- The budget (`budget`, in `budget_unit`): "updates" where the compared models do equal
  operations per update (Table 7's equal-size pair: `check_equal_ops`), else "cpu_seconds"
  (the process's CPU time of training updates, all threads) on a CPU and "device_seconds"
  (SPEC 7, `host_devices.CHARGE_RULE`) on a GPU; "auto" picks between the last two. Never
  wall time. Compilation, evaluation and checkpoint saves are never counted; a run stops
  after the complete update that reaches its budget, with a checkpoint after each 1/k of it.
- Scoring: the routed top-min(4, N) mixture on an evaluation split cut into pieces of
  route + score + 1 bytes (`evaluate.cut_windows`), so every scored target lies inside
  the trained context; the paper scores whole 1,025-byte windows (route 256, score 768).
  Where a study passes its validation set to `budgeted` (`score`), training scores it at
  every checkpoint from the state in memory (config.checkpoint_eval, `checkpoint_scores`)
  and `curve` / `final_losses` read those losses, the same bit for bit, instead of
  restoring each checkpoint; any other set (test) is restored and scored once, as before.
- What is reported (SPEC 9.6): each row's start, end and gain (start - end) on validation
  and test, and the reference's gain minus each other row's gain with a 95% t interval
  across optimisation seeds (`gain_difference`) and, per seed, a paired document bootstrap
  of the same difference (end gap - start gap: document noise only, around one start);
  `seeds_and_documents` carries both noises (the t interval widened by the documents'
  variance: `widened_t_interval`, SPEC 9.8). The evaluation windows are spread across the
  split's documents (`pipeline.spread_windows`; `describe_span` counts them).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable

import jax
import ml_collections
import numpy as np
from scipy import stats as scipy_stats

from soma_jax import budget as budget_lib
from soma_jax import checkpoint as ckpt_lib
from soma_jax import checkpoint_scores as scores_lib
from soma_jax import evaluate as eval_lib
from soma_jax import metrics as metrics_lib
from soma_jax import plan as plan_lib
from soma_jax import records, runs
from soma_jax import spec as spec_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.studies import executor as executor_lib

MAX_UPDATES = 10_000_000  # the step cap of a budgeted run: its budget ends it first
# A time budget is refused above (MAX_UPDATES - seed_updates) x this: the step cap would end
# it first at any update faster than 1 s (CPU-scale updates take about 0.05 s, the paper
# preset's 2.3 s on an H200), and an update's seconds are known only once it has run.
SLOW_UPDATE_SECONDS = 1.0
UNITS = budget_lib.BUDGET_UNITS + ("auto",)  # a study's budget_unit (each one in COUNTS)
COUNTS = budget_lib.COUNTS  # what each unit counts (results.json's budget.counts)


@dataclasses.dataclass(frozen=True)
class EvalSpan:
  """How a study scores: route on `route` bytes, score the next `score` targets, on the
  first `val_windows` / `test_windows` 1,025-byte windows spread over documents (0 = all)."""
  route: int
  score: int
  val_windows: int
  test_windows: int


@dataclasses.dataclass(frozen=True)
class StudyPlan:
  """A study's own fields, checked and typed once (`check_plan`). `config` stays the config
  space its runs are built from (methods, seed_runs, order: `sized`, `seed_configs`) and
  what results.json records; everything else is read from the fields."""
  config: ml_collections.ConfigDict
  unit: str  # the budget's unit ("auto" resolved)
  budget: float
  seeds: tuple[int, ...]  # the optimisation seeds
  seed_run_seed: int
  seed_updates: int
  curve_points: int
  bootstrap_draws: int
  ops_tolerance: float
  base_lr: float
  data_dir: str
  eval: EvalSpan
  reference: str
  start: dict  # {method: seed run it continues}
  match_updates: dict  # {control: the method whose updates it runs to}
  fresh_optimizer: tuple[str, ...] = ()  # methods that take the seed's parameters only
  own_starts: bool = False  # each optimisation seed s its own seed runs (`train_seed_sets`)


# A study trains every row once per optimisation seed (the paper: 3); more than this many is a
# typo (seeds=1000000), refused in one line before anything is planned.
MAX_SEEDS = 1000


def optimisation_seeds(first: int, count: int) -> list[int]:
  """first, first + 1, ... (count of them)."""
  if count < 1 or count > MAX_SEEDS:
    raise UserError(f"seeds={count} must be in 1..{MAX_SEEDS} (optimisation seeds per method; "
                    f"every row trains once per seed); fix: --config.seeds=3")
  return list(range(first, first + count))


def seed_list(seeds) -> str:
  """Seeds as a message names them: the list when short, else 'first..last (count seeds)'."""
  seeds = list(seeds)
  if len(seeds) <= 8 or seeds != list(range(seeds[0], seeds[0] + len(seeds))):
    return str(seeds) if len(seeds) <= 8 else f"{seeds[:4]} ... ({len(seeds):,} seeds)"
  return f"{seeds[0]}..{seeds[-1]} ({len(seeds):,} seeds)"


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


def budget_unit(unit: str) -> str:
  """A study's budget unit; "auto": cpu_seconds on a CPU, device_seconds elsewhere."""
  if unit not in UNITS:
    raise UserError(f"budget_unit={unit!r} is not a unit; fix: --config.budget_unit= one of "
                    f"{', '.join(UNITS)}")
  if unit == "auto":
    return "cpu_seconds" if jax.default_backend() == "cpu" else "device_seconds"
  return unit


def whole(lo: int, hi: int | None = None) -> tuple[str, Callable[[object], bool]]:
  """A study field's rule: an integer in lo.. (or lo..hi)."""
  text = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"
  return text, lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= lo
                          and (hi is None or v <= hi))


def positive(strict: bool = True) -> tuple[str, Callable[[object], bool]]:
  """A study field's rule: a finite number > 0 (or >= 0)."""
  return f"a finite number {'>' if strict else '>='} 0", lambda v: (
      isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
      and (v > 0 if strict else v >= 0))


def factors() -> tuple[str, Callable[[object], bool]]:
  """A study field's rule: a tuple of finite numbers > 0 (a grid's multiples)."""
  text, ok = positive()
  return f"a tuple of {text[2:]}s", lambda v: isinstance(v, tuple | list) and all(map(ok, v))


def one_of(*choices: object) -> tuple[str, Callable[[object], bool]]:
  return "one of " + ", ".join(map(str, choices)), lambda v: v in choices


def _field(config: ml_collections.ConfigDict, key: str) -> object:
  for part in key.split("."):
    config = config[part]
  return config


def check_fields(config: ml_collections.ConfigDict, rules: dict) -> None:
  """Each study field of `rules` ({dotted key: (what it must be, test)}) in range, else a
  UserError naming it as compare.py's flag (--config.KEY)."""
  for key, (text, ok) in rules.items():
    value = _field(config, key)
    if not ok(value):
      raise UserError(f"{key}={value!r} is out of range: it must be {text}; fix: "
                      f"--config.{key}=VALUE in that range")


PLAN_FIELDS = {  # every study's own fields (a method's and a seed run's: `check_runs`)
    "seeds": whole(1, MAX_SEEDS), "first_seed": whole(0), "seed_run_seed": whole(0),
    "seed_updates": whole(1, MAX_UPDATES - 1), "curve_points": whole(1),
    "bootstrap_draws": whole(1), "ops_tolerance": positive(strict=False),
    "base_lr": positive(), "match_params": one_of(True, False),
    "data_dir": ("a string", lambda v: isinstance(v, str)),
    "eval.route_bytes": whole(1), "eval.score_bytes": whole(1),
    "eval.val_windows": whole(0), "eval.test_windows": whole(0),
}


def check_plan(config: ml_collections.ConfigDict) -> StudyPlan:
  """Every study field, the budget (finite, one the step cap does not cut off), the seeds,
  the evaluation span and each method's own config checked, before anything trains; the
  study's fields, typed."""
  check_fields(config, PLAN_FIELDS)
  unit = budget_unit(config.budget_unit)
  check_budget(config.budget, unit, config.seed_updates)
  seeds = optimisation_seeds(config.first_seed, config.seeds)
  if config.seed_run_seed in seeds:
    raise UserError(f"seed_run_seed={config.seed_run_seed} is one of the optimisation seeds "
                    f"{seed_list(seeds)}: that seed's rows would replay the seed run's batches "
                    f"and directions; fix: --config.seed_run_seed={max(seeds) + 1000} (a seed "
                    "outside them)")
  own = config.get("own_starts", False)
  if not isinstance(own, bool):
    raise UserError(f"own_starts={own!r} must be True or False; fix: --config.own_starts=True")
  clash = sorted(set(seeds) & {config.seed_run_seed + s for s in seeds}) if own else []
  if clash:
    raise UserError(f"own_starts: the seed runs' seeds seed_run_seed + s ({config.seed_run_seed}"
                    f" + {seeds}) include optimisation seeds {clash}; fix: --config.seed_run_seed"
                    f"={max(seeds) + 1000}")
  if config.reference not in config.methods:
    raise UserError(f"reference={config.reference!r} is not a method; fix: --config.reference="
                    f"one of {', '.join(config.methods)}")
  for field in ("fresh_optimizer", "keep_width"):
    for name in config.get(field, ()):
      if name not in config.methods:
        raise UserError(f"{field} names {name!r}, not a method; fix: --config.{field}= a tuple "
                        f"of {', '.join(config.methods)}")
  for name, c in config.seed_runs.items():
    resolved(c, f"seed_runs.{name}.")
  specs = {name: resolved(c, f"methods.{name}.") for name, c in config.methods.items()}
  e = config.eval
  span = EvalSpan(e.route_bytes, e.score_bytes, e.val_windows, e.test_windows)
  check_span(span, [s.seq_len for s in specs.values()])
  return StudyPlan(
      config=config, unit=unit, budget=float(config.budget), seeds=tuple(seeds),
      seed_run_seed=config.seed_run_seed, seed_updates=config.seed_updates,
      curve_points=config.curve_points, bootstrap_draws=config.bootstrap_draws,
      ops_tolerance=config.ops_tolerance, base_lr=config.base_lr, data_dir=config.data_dir,
      eval=span, reference=config.reference, start=dict(config.start.items()),
      match_updates=dict(config.get("match_updates", {}).items()),
      fresh_optimizer=tuple(config.get("fresh_optimizer", ())), own_starts=own)


def resolved(c: ml_collections.ConfigDict, prefix: str = "") -> spec_lib.RunSpec:
  """The study's one door to `spec.resolve`: run config `c` resolved, a UserError about it
  re-worded as the study's fields (`prefix`: "methods.NAME." or "seed_runs.NAME.")."""
  return as_field(prefix, c, lambda: spec_lib.resolve(c))


def check_budget(b: object, unit: str, seed_updates: int) -> None:
  """`budget` finite and > 0, whole in updates, and (in updates or seconds) one the step cap
  does not cut off: a run continues its seed's step counter to at most MAX_UPDATES, so it
  has MAX_UPDATES - seed_updates updates; a time budget is refused above that many updates
  at SLOW_UPDATE_SECONDS each (ops: `check_runs`, which knows each run's cost)."""
  if not (isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b) and b > 0):
    raise UserError(f"budget={b!r} must be a finite number > 0 ({unit} per run); fix: "
                    "--config.budget=AMOUNT, e.g. 1000 updates or 1.6e12 ops")
  if unit == "updates" and b != int(b):
    raise UserError(f"budget={b} updates must be a whole number; fix: --config.budget={int(b)}")
  room = MAX_UPDATES - seed_updates
  if unit == "updates" and b > room:
    raise UserError(f"budget={b:g} updates per run: the step cap ends each run at step "
                    f"{MAX_UPDATES:,}, {room:,} updates after its {seed_updates}-update "
                    f"seed; fix: --config.budget={room} or less")
  slowest = room * SLOW_UPDATE_SECONDS
  if unit in budget_lib.TRAINING_TIMERS and b > slowest:
    raise UserError(f"budget={b:g} {unit} per run: the step cap ({MAX_UPDATES:,} updates, "
                    f"{room:,} after the seed) ends a run first unless its updates take over "
                    f"{b / room:.3g} s; a time budget may be at most {room:,} updates at "
                    f"{SLOW_UPDATE_SECONDS:g} s each (CPU-scale updates take about 0.05 s); "
                    f"fix: --config.budget={slowest:.0f} or less, or --config.budget_unit=ops")


def check_span(span: EvalSpan, seq_lens: list[int]) -> None:
  """The evaluation span (`eval_sets`' rules) against the trained contexts `seq_lens`."""
  route, score, t = span.route, span.score, min(seq_lens)
  if route + score > t or 1024 % (route + score):
    r = route if route < t else max(1, t // 4)  # keep the route where it fits
    fix = (f"--config.eval.route_bytes={r} " if r != route else "") + (
        f"--config.eval.score_bytes={t - r}")
    raise UserError(f"eval.route_bytes + eval.score_bytes = {route} + {score} must divide 1024 "
                    f"and be <= the trained context T = {t} (every scored target inside it); "
                    f"fix: {fix}")


def _leaves(c: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  out = []
  for key, value in c.items():
    out += (_leaves(value, f"{prefix}{key}.") if isinstance(value, ml_collections.ConfigDict)
            else [prefix + key])
  return out


def reworded(message: str, prefix: str, keys: list[str]) -> str:
  """A run config's UserError with its fields named as the study's: `prefix` before each
  field of `keys` (dotted ones wherever they stand, the rest before "=") and after every
  "--config."."""
  message = message.replace("--config.", "--config." + prefix)
  for key in sorted(keys, key=len, reverse=True):
    end = r"(?![\w.])" if "." in key else "(?==)"
    message = re.sub(rf"(?<![\w.]){re.escape(key)}{end}", prefix + key, message)
  return message


def as_field(prefix: str, c: ml_collections.ConfigDict, make: Callable):
  """make(), with a UserError about config `c` re-worded as the study's fields (`prefix`:
  "methods.NAME." or "seed_runs.NAME.")."""
  try:
    return make()
  except UserError as e:
    raise UserError(reworded(str(e), prefix, _leaves(c))) from None


def check_runs(plan: StudyPlan, cfgs: dict[str, ml_collections.ConfigDict],
               by_updates: Iterable[str] | None = None) -> dict[str, spec_lib.RunSpec]:
  """Every run the study trains resolved before any trains (each seed run, each method as
  `budgeted` at the first seed), its errors named as the study's fields; an ops budget the
  step cap cuts off, refused (the cheapest row needs the most updates). `by_updates`: the
  methods that run to the reference's updates, not the budget (plan.match_updates)."""
  by_updates, unit = plan.match_updates if by_updates is None else by_updates, plan.unit
  for name, s in seed_configs(plan.config, cfgs).items():  # each seed run's own: `check_plan`
    budgeted(s, plan.data_dir, plan.seed_run_seed, None, "updates", plan.seed_updates, 1,
             f"seed_runs.{name}.")
  specs = {}
  for name, c in cfgs.items():
    u, amount = ("updates", 1) if name in by_updates else (unit, plan.budget)
    specs[name] = budgeted(c, plan.data_dir, plan.seeds[0], None, u, amount,
                           plan.curve_points, f"methods.{name}.")
  if unit != "ops":
    return specs
  rows = {n: s.total_ops_per_update for n, s in specs.items() if n not in by_updates}
  room, cheapest = MAX_UPDATES - plan.seed_updates, min(rows, key=rows.get)
  costliest = max(rows, key=rows.get)
  if plan.budget < rows[costliest]:  # a run stops after the update that reaches its budget
    raise UserError(f"budget={plan.budget:g} ops per run is less than one update of "
                    f"{costliest} ({rows[costliest]:,} operations): every row would run one "
                    "update and the rows would spend unequal compute; fix: "
                    f"--config.budget={rows[costliest]} or more")
  if plan.budget > room * rows[cheapest]:
    raise UserError(f"budget={plan.budget:g} ops per run: {cheapest} does "
                    f"{rows[cheapest]:,} operations per update, so the step cap ({MAX_UPDATES:,} "
                    f"updates, {room:,} after its seed) ends it at {room * rows[cheapest]:.4g}; "
                    f"fix: --config.budget={room * rows[cheapest]} or less")
  return specs


def check_equal_ops(specs: dict[str, spec_lib.RunSpec], tolerance: float,
                    unit: str) -> dict[str, int]:
  """Each method's operations per update, printed; with an update budget they must agree
  within `tolerance` (SPEC 9.6: equal updates mean equal compute only then)."""
  ops = {name: s.total_ops_per_update for name, s in specs.items()}
  print("[compare] operations per update: " + ", ".join(f"{n} {o:,}" for n, o in ops.items()),
        flush=True)
  lo, hi = min(ops.values()), max(ops.values())
  if unit == "updates" and hi - lo > tolerance * hi:
    raise UserError(f"budget_unit=updates compares equal compute only if the methods do equal "
                    f"operations per update; they differ by {(hi - lo) / hi:.1%} (> "
                    f"{tolerance:.0%}: {', '.join(f'{n} {o:,}' for n, o in ops.items())}); fix: "
                    "budget_unit=cpu_seconds or device_seconds, or methods of equal cost")
  return ops


def check_data(data_dir: str, n_experts: int, field: str | None = "data_dir") -> dict:
  """`pipeline.check_data_dir`, its refusal re-worded for compare.py: the study's config
  `field` that named the folder (None: a folder the study prepared under --out itself); the
  data dir's manifest."""
  try:
    return pipeline.check_data_dir(data_dir, n_experts)
  except UserError as e:
    why = str(e).split("; fix:")[0]
    fix = (f"--config.{field}= a data dir prepared for N = {n_experts} experts "
           f"(prepare_data.py --num_clusters={n_experts}), or --config.{field}= (empty: the "
           "built-in corpus, prepared under --out)" if field else
           "another --out (this folder was prepared there by an earlier study)")
    raise UserError(f"{why}; fix: {fix}") from None


def prepare_data(source: str, n_experts: int, folder: str, settings: dict | None = None,
                 field: str = "source", **more) -> None:
  """`prepare.prepare` for a study: its refusal re-worded for compare.py (prepare_data.py's
  --source as the study's config `field`, its other flags as --config.prepare.NAME)."""
  from soma_jax.data import prepare

  settings = dict(settings or {})
  try:
    prepare.prepare(source, n_experts, folder, **settings, **more)
  except UserError as e:
    message = re.sub(r"--source\b", f"--config.{field}", str(e))
    names = "|".join(k for k in inspect.signature(prepare.prepare).parameters
                     if k not in ("source", "num_clusters", "out"))
    message = re.sub(rf"--({names})\b", r"--config.prepare.\1", message)
    raise UserError(message) from None


def ensure_data(data_dir: str, out: str, n_experts: int) -> str:
  """`data_dir` (a study's data_dir field), or the built-in pystdlib corpus prepared under
  OUT/data when it is ""."""
  if data_dir:
    check_data(data_dir, n_experts)
    return data_dir
  data_dir = os.path.join(out, "data")
  if not os.path.isfile(os.path.join(data_dir, "manifest.json")):
    prepare_data("pystdlib", n_experts, data_dir)
  return data_dir


def prepared_dirs(source: str, settings: dict, ns: list[int], out: str) -> dict[int, str]:
  """{N: OUT/data_nN}, each prepared from corpus `source` into N shards when missing
  (`settings`: prepare.prepare's keyword settings), for studies whose rows differ in N."""
  dirs = {}
  for n in sorted(set(ns)):
    d = os.path.join(out, f"data_n{n}")
    if not os.path.isfile(os.path.join(d, "manifest.json")):
      prepare_data(source, n, d, settings)
    dirs[n] = d
  return dirs


def check_fractions(config: ml_collections.ConfigDict, field: str, example: str
                    ) -> tuple[float, ...]:
  """config.`field`: fractions of a budget, growing strictly within (0, 1]."""
  fractions = tuple(float(f) for f in config[field])
  if not fractions or list(fractions) != sorted(set(fractions)) or not (
      0 < fractions[0] and fractions[-1] <= 1):
    raise UserError(f"{field}={config[field]!r} must grow strictly within (0, 1]; fix: "
                    f"--config.{field}='{example}'")
  return fractions


def check_source(config: ml_collections.ConfigDict) -> str:
  """config.source: the corpus the per-N studies prepare (`prepared_dirs`)."""
  if not isinstance(config.get("source"), str) or not config.source:
    raise UserError(f"source={config.get('source')!r}: a corpus prepare_data.py reads; fix: "
                    "--config.source=pystdlib or textdir:FOLDER")
  return config.source


def per_n_sets(span: EvalSpan, specs: dict[str, spec_lib.RunSpec], source: str,
               settings: dict, out: str) -> tuple[dict[int, str], dict]:
  """For the studies whose rows differ in N: ({N: data dir}, {N: (validation, test)}) for
  every N of `specs` and N = 1 (the seed runs' data), prepared from `source` under OUT, each
  scored on `span`, all holding the same held-out windows (`same_windows`)."""
  dirs = prepared_dirs(source, settings, [s.n_experts for s in specs.values()] + [1], out)
  scored = {n: eval_sets(span, d, [s.seq_len for s in specs.values()]) for n, d in dirs.items()}
  same_windows(scored)
  return dirs, scored


def same_windows(scored: dict) -> None:
  """Every N's data dir ({N: (validation, test)}) holds the same ensemble-validation windows,
  else curves of different N would be scored on different text."""
  ref_n = min(scored)
  ref = scored[ref_n][0].windows
  for n, (val, _) in scored.items():
    if val.windows.shape != ref.shape or not np.array_equal(val.windows, ref):
      raise UserError(f"data_n{n} holds other ensemble-validation windows than data_n{ref_n}: "
                      "the same corpus and prepare settings give the same held-out documents, "
                      "so these were prepared from other ones (the runs trained on them are "
                      "kept); fix: another --out, or --config.source and --config.prepare as "
                      "they were when that folder was prepared")


def eval_sets(span: EvalSpan, data_dir: str, seq_lens: list[int]):
  """(ensemble-validation set, test set) on the study's route / score span."""
  route, score = span.route, span.score
  if route + score > min(seq_lens):
    raise UserError(f"eval.route_bytes + eval.score_bytes = {route + score} exceeds the "
                    f"trained context T = {min(seq_lens)}: scored targets must lie inside it; "
                    f"fix: route + score <= {min(seq_lens)} (e.g. 64 + 192 at T = 256)")
  if 1024 % (route + score):
    raise UserError(f"eval.route_bytes + eval.score_bytes = {route + score} must divide 1024")
  val = eval_lib.TestSet(data_dir, span.val_windows, "ensemble_val", route, score)
  test = eval_lib.TestSet(data_dir, span.test_windows, "test", route, score)
  return val, test


def describe_span(val: eval_lib.TestSet, test: eval_lib.TestSet) -> dict:
  """The evaluation span and sets: *_windows count the scored pieces, *_windows_scored the
  1,025-byte windows they are cut from, *_documents the documents those come from of the
  split's *_documents_available (`pipeline.spread_windows` spreads them)."""
  return {"route_bytes": test.route, "score_bytes": test.score,
          "window_bytes": test.route + test.score + 1,
          "windows_per_1025_byte_window": 1024 // (test.route + test.score),
          "val_windows": int(val.windows.shape[0]), "test_windows": int(test.windows.shape[0]),
          "test_documents": int(np.unique(test.doc_ids).size),
          "val_documents": int(np.unique(val.doc_ids).size),
          "val_documents_available": val.documents_available,
          "val_windows_scored": val.windows_scored,
          "test_documents_available": test.documents_available,
          "test_windows_scored": test.windows_scored}


def layout_of(spec: spec_lib.RunSpec) -> dict:
  """How training lays a run out on this machine: FSO / DDPP over how many devices."""
  placed = plan_lib.layout(spec, spec.n_experts)
  return {"expert_devices": placed.expert, "pert_devices": placed.pert,
          "devices": jax.device_count(), "platform": jax.default_backend(), "why": placed.why}


# ----------------------------------------------------------------------------- runs


def budgeted(c: ml_collections.ConfigDict, data_dir: str, seed: int, start: dict | None,
             unit: str, amount: float, checkpoints: int, prefix: str = "",
             fresh: bool = False, score: eval_lib.TestSet | None = None,
             marks: tuple[float, ...] = ()) -> spec_lib.RunSpec:
  """Training config `c` at optimisation seed `seed`, continuing the seed run record `start`
  (its whole train state; None: a fresh init; `fresh`: its parameters only, with fresh Adam
  moments, plateau state and step counter) until `amount` of `unit`: resolved (its errors
  named as the study's fields under `prefix`, `resolved`). `score`: the study's set its
  checkpoints are scored on (validation), scored by training itself at each checkpoint
  from the state in memory (config.checkpoint_eval), which `curve` and `final_losses` read
  instead of restoring; None: scored by restoring, as before. `marks`: the checkpoints'
  fractions of the budget (config.budget_marks, e.g. log-spaced) in place of `checkpoints`
  equal parts."""
  raw = c
  c = ml_collections.ConfigDict(c.to_dict())
  c.data.dir, c.seed = data_dir, seed
  c.init_from, c.init_state = (start["_path"], not fresh) if start else ("", False)
  c.budget_unit, c.budget, c.budget_checkpoints = unit, float(amount), checkpoints
  c.steps = MAX_UPDATES
  c.ckpt_every = MAX_UPDATES  # the budget's checkpoints are the curve
  c.ckpt.keep = checkpoints + 1
  if marks:
    c.budget_marks, c.ckpt.keep = tuple(float(f) for f in marks), len(marks) + 1
  c.ensemble_eval_every = -1  # the study scores checkpoints itself, on its own span
  if (score is not None and _settings(score) is not None and not c.experts
      and score.route + score.score <= c.data.seq_len):  # else restored, as before
    c.checkpoint_eval = ml_collections.ConfigDict(dict(
        split=score.split, data_dir=score.data_dir, max_windows=int(score.max_windows),
        route=int(score.route), score=int(score.score)))
  return as_field(prefix, raw, lambda: spec_lib.resolve(c))


def train_all(runs: list[tuple[spec_lib.RunSpec, str, str]], executor=None) -> list[float]:
  """Trains every run of a stage (none reads another) to its end: one after another in this
  process (`executor` None), or by `executor` (`executor.make`: processes, SLURM); each run's
  wall seconds, in order. Every run's folder is checked (`check_existing`) before any trains,
  and no two runs may share one."""
  folders = [os.path.abspath(workdir) for _, workdir, _ in runs]
  shared = sorted({f for f in folders if folders.count(f) > 1})
  if shared:
    raise UserError(f"two runs of this study would share the folder {shared[0]!r} (their "
                    "settings name the same folder); fix: give them settings that differ")
  for folder in folders:
    own(folder)
  if executor is None:
    return [executor_lib.train(spec, workdir, what) for spec, workdir, what in runs]
  for spec, workdir, _ in runs:
    executor_lib.check_existing(workdir, spec)
  return executor.run([executor_lib.Job(spec.config.to_dict(), workdir, what)
                       for spec, workdir, what in runs])


def start_step(spec: spec_lib.RunSpec, start: dict) -> int:
  """The step a run starts from: its seed run's (`start`, a `train_seeds` record) where it
  continues the seed's state, else 0 (fresh optimizer state and step counter)."""
  return int(start["step"]) if spec.init_state else 0


def checkpoints(workdir: str) -> list[int]:
  ckpt = ckpt_lib.Checkpointer(workdir)
  try:
    return sorted(ckpt.steps())
  finally:
    ckpt.close()


def _score(scorer: eval_lib.TestSet, spec: spec_lib.RunSpec, body, head) -> np.ndarray:
  return scorer.losses(body, head, spec.n_experts, spec.shared_head, spec.method.logits)


def start_losses(spec: spec_lib.RunSpec, scorers: dict[str, eval_lib.TestSet]
                 ) -> dict[str, np.ndarray]:
  """Per-window losses of the parameters a run starts from, on each scorer
  ({"validation": ..., "test": ...}); the start is the same for every optimisation seed."""
  body, head = runs.initial_params(spec)
  return {split: _score(s, spec, body, head) for split, s in scorers.items()}


def _point(data_state: dict, step: int, start_step: int, ops_update: int, loss: float) -> dict:
  return {"step": step, "update": step - start_step, "ops": (step - start_step) * ops_update,
          **{k: float(data_state.get(k, 0.0)) for k in budget_lib.TRAINING_TIMERS},
          "loss": loss}


def curve(workdir: str, spec: spec_lib.RunSpec, scorer: eval_lib.TestSet,
          start_step: int, start_loss: float, keep: list | None = None
          ) -> tuple[list[dict], np.ndarray]:
  """The start (the seed's state, `start_loss` on `scorer`, at the seed's step) and each of
  the run's checkpoints scored by `scorer`: ([{step, update, ops, device_seconds,
  cpu_seconds, loss}], per-window losses of the last checkpoint). `update` and `ops` are
  this run's, counted from its start. `keep`: a list each checkpoint's per-window losses are
  appended to."""
  opu = spec.total_ops_per_update
  points, last = [_point({}, start_step, start_step, opu, float(start_loss))], None
  for s in (s for s in checkpoints(workdir) if s > start_step):
    last, data_state = scored_at(workdir, s, spec, scorer)
    if keep is not None:
      keep.append(last)
    points.append(_point(data_state, s, start_step, opu, float(last.mean())))
  if last is None:
    raise UserError(f"{workdir!r} has no checkpoint after its start (step {start_step}): it "
                    "made no update; fix: rerun the same command (the run resumes), or "
                    "another --out")
  return points, last


def scored_at(workdir: str, step: int, spec: spec_lib.RunSpec, scorer: eval_lib.TestSet
              ) -> tuple[np.ndarray, dict]:
  """(per-window losses on `scorer`, data state) of the run's checkpoint at `step`: those
  training saved for exactly this set (`checkpoint_scores.read`), else restored and scored."""
  saved = scores_lib.read(workdir, step, _settings(scorer))
  if saved is not None:
    return saved
  _, state, data_state, _ = runs.restore_state(workdir, step=step)
  return _score(scorer, spec, state.body, state.head), data_state


def _settings(scorer) -> dict | None:
  """The set's identity for saved checkpoint scores; None (never read saved scores) for a
  scorer that has none, e.g. a wrapper that scores other numbers from a TestSet's windows."""
  settings = getattr(scorer, "settings", None)
  return settings() if callable(settings) else None


def final_losses(workdir: str, spec: spec_lib.RunSpec, scorer: eval_lib.TestSet
                 ) -> np.ndarray:
  """Per-window losses of a run's newest checkpoint (scored once, or read where training
  scored it on this set: `scored_at`)."""
  steps = checkpoints(workdir)
  saved = scores_lib.read(workdir, steps[-1], _settings(scorer)) if steps else None
  if saved is not None:
    return saved[0]
  body, head, _ = runs.restore_params(workdir)
  return _score(scorer, spec, body, head)


def summary(workdir: str, spec: spec_lib.RunSpec, start_step: int) -> dict:
  """A finished run (its newest checkpoint and summary.json): the step reached, this run's
  updates and operations, its training and apart seconds, and the budget counted one update
  before the stop (below the budget). The counters come from the newest checkpoint's saved
  scores (`checkpoint_scores.counters`), else from restoring it."""
  step = ckpt_lib.newest_step(workdir)
  data_state = scores_lib.counters(workdir, step) if step is not None else None
  if data_state is None:
    step, _, data_state, _ = runs.restore_state(workdir)
  done = read_summary(workdir) or {}  # unreadable: rewritten when the run is resumed
  updates = int(step) - start_step
  return {"step": int(step), "updates": updates, "ops": updates * spec.total_ops_per_update,
          **{k: float(data_state.get(k, 0.0)) for k in budget_lib.TIMERS},
          "budget_unit": spec.budget.unit,
          "budget_before_last_update": done.get("budget_before_last_update")}


def budget_used(record: dict) -> float:
  """What a `summary` record spent in its budget unit."""
  return float(record[record["budget_unit"]])


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


def exact(x: float) -> str:
  """A number as a run folder names it: `:g` where that reads back as exactly `x` (the names
  studies have always used, 0.5, 1, 0.0025), else its shortest exact form (repr), so two
  different numbers never share a folder."""
  short = f"{x:g}"
  return short if float(short) == float(x) else repr(float(x))


def shown(path: str, out: str) -> str:
  """A path as results.json shows it: relative to the output folder when inside it."""
  rel = os.path.relpath(path, out)
  return path if rel.startswith("..") else rel


# ----------------------------------------------------------------------------- seeds


def seed_configs(config: ml_collections.ConfigDict, cfgs: dict[str, ml_collections.ConfigDict]
                 ) -> dict[str, ml_collections.ConfigDict]:
  """Each seed run's config: its recipe (config.seed_runs) at the model of the methods
  that start from it (config.start); those methods must share one model."""
  out = {}
  for name, seed_c in config.seed_runs.items():
    users = [m for m in cfgs if config.start[m] == name]
    if not users:
      continue
    models = {(cfgs[m].model.d_t, cfgs[m].model.d_e, cfgs[m].model.depth,
               resolved(cfgs[m]).method.family) for m in users}
    if len(models) > 1:
      raise UserError(f"methods {', '.join(users)} start from seed {name!r} but differ in "
                      "model size; fix: give each size its own seed run in config.start")
    s = ml_collections.ConfigDict(seed_c.to_dict())
    ref = cfgs[users[0]]
    s.model.update(d_t=ref.model.d_t, d_e=ref.model.d_e, depth=ref.model.depth)
    if resolved(s).method.family != resolved(ref).method.family:
      raise UserError(f"seed {name!r} is method={s.method} but {users[0]} is method="
                      f"{ref.method}: a GRU seeds a GRU, an LSTM an LSTM")
    if s.n_experts != 1:
      raise UserError(f"seed_runs.{name}.n_experts={s.n_experts}; a seed is one model (SPEC 3.4)")
    out[name] = s
  for m in cfgs:
    if config.start.get(m) not in out:
      raise UserError(f"start.{m}={config.start.get(m)!r} is not a seed run; have "
                      f"{', '.join(config.seed_runs.keys())}")
  return out


def train_seeds(plan: StudyPlan, cfgs: dict[str, ml_collections.ConfigDict],
                data_dir: str, out: str, val: eval_lib.TestSet, executor=None,
                checkpoints: int = 1) -> dict[str, dict]:
  """Trains every seed run for `seed_updates` updates at `seed_run_seed` in OUT/seeds/NAME
  (one stage: `train_all` with `executor`; a checkpoint after each 1/`checkpoints` of it);
  their cost, apart, and their final loss on the study's ensemble-validation set `val`
  (`_spec`: the seed run's RunSpec)."""
  got = _train_seed_runs(plan, seed_configs(plan.config, cfgs), data_dir, val, executor,
                         checkpoints, {None: (plan.seed_run_seed, os.path.join(out, "seeds"))},
                         out)
  return got[None]


def train_seed_sets(plan: StudyPlan, cfgs: dict[str, ml_collections.ConfigDict],
                    data_dir: str, out: str, val: eval_lib.TestSet, executor=None,
                    checkpoints: int = 1) -> dict[int, dict[str, dict]]:
  """{optimisation seed: {seed run: its record}}. plan.own_starts: seed s trains its own seed
  runs at seed_run_seed + s in OUT/seeds/seedS/NAME (all in one stage), so where a start
  lands enters every interval (SPEC 9.8); else every seed gets `train_seeds`' shared runs."""
  if not plan.own_starts:
    shared = train_seeds(plan, cfgs, data_dir, out, val, executor, checkpoints)
    return {seed: shared for seed in plan.seeds}
  where = {seed: (plan.seed_run_seed + seed, os.path.join(out, "seeds", f"seed{seed}"))
           for seed in plan.seeds}
  return _train_seed_runs(plan, seed_configs(plan.config, cfgs), data_dir, val, executor,
                          checkpoints, where, out)


def interval_kind(plan: StudyPlan) -> dict:
  """What a study's intervals over optimisation seeds hold (results.json `intervals`)."""
  if plan.own_starts:
    return {"kind": "seeds_own_starts",
            "how": "each optimisation seed s continues its own seed runs (trained at "
                   "seed_run_seed + s): the starts' noise is in every interval over seeds"}
  return {"kind": "seeds_shared_start",
          "how": f"every optimisation seed continues the same seed runs (seed_run_seed "
                 f"{plan.seed_run_seed}): intervals over seeds are conditional on that one "
                 "start"}


def _train_seed_runs(plan: StudyPlan, runs_c: dict, data_dir: str, val: eval_lib.TestSet,
                     executor, checkpoints: int, where: dict, out: str) -> dict:
  """{key: {name: record}} of every seed run `runs_c` (name: config) trained for
  `seed_updates` updates at each `where[key]` = (data and direction seed, folder), in one
  stage (`train_all`)."""
  planned = {(key, name): (budgeted(s, data_dir, run_seed, None, "updates", plan.seed_updates,
                                    checkpoints, score=val), os.path.join(folder, name), s)
             for key, (run_seed, folder) in where.items() for name, s in runs_c.items()}
  for (_, name), (spec, _, s) in planned.items():
    print(f"[compare] seed run {name}: {s.method} d_t={s.model.d_t}, {plan.seed_updates} "
          f"updates at seed {spec.config.seed}", flush=True)
  label = lambda key, name: f"seed run {name}" + ("" if key is None else f" for seed {key}")
  walls = train_all([(spec, workdir, label(key, name))
                     for (key, name), (spec, workdir, _) in planned.items()], executor)
  records = {key: {} for key in where}
  for ((key, name), (spec, workdir, s)), wall in zip(planned.items(), walls, strict=True):
    records[key][name] = {
        "workdir": shown(workdir, out), "method": s.method, "d_t": s.model.d_t,
        "depth": s.model.depth, "lr": s.opt.lr, "eps": s.spsa.eps, "n_pert": s.spsa.n_pert,
        "batch": s.spsa.batch, "seq_len": s.data.seq_len, "seed": spec.config.seed,
        **summary(workdir, spec, 0), "ops_per_update": spec.total_ops_per_update,
        "ensemble_val_nats_per_byte": float(final_losses(workdir, spec, val).mean()),
        "wall_seconds_this_call": wall, "_path": workdir, "_spec": spec}
  return records


def start_of(seed_record: dict) -> str:
  """The `start` field of a run: the seed checkpoint it continues."""
  return f"{seed_record['workdir']}@{seed_record['step']}"


# ----------------------------------------------------------------------------- results


def results(study: str, spec: str, plan: StudyPlan, command: str,
            begun: dict, budget: dict, scored: tuple[eval_lib.TestSet, eval_lib.TestSet],
            data_dir: str, out: str, seeds: dict[str, dict], **rest) -> dict:
  """The results.json fields every study writes, then the study's own (`rest`).

  `begun` is `started()`; `budget` = {unit, per, ...}: the budget's unit, what one budget is
  for (a row, a configuration), and the study's own fields; `scored` = (validation, test)
  sets; `seeds` the records of `train_seeds`.
  """
  val, test = scored
  return {
      "study": study, "spec": spec, "command": command,
      "wall_seconds": time.perf_counter() - begun["t0"],
      "load_average": {"start": begun["load_average"], "end": list(os.getloadavg())},
      "platform": jax.default_backend(),
      "budget": {"amount": plan.budget, "counts": COUNTS[budget["unit"]] + "; "
                 "compilation, evaluation and checkpoints excluded", **budget},
      "eval": describe_span(val, test),
      "unigram_test_nats_per_byte": eval_lib.unigram_nats(data_dir, "test", test.route, test.score),
      "data_dir": shown(data_dir, out), "seeds": list(plan.seeds),
      "bootstrap_draws": plan.bootstrap_draws, "reference": plan.reference,
      "seed_runs": public(seeds), **rest, "cost": cost(out, begun),
  }


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


# ----------------------------------------------------------------------------- statistics


def paired(ref_n: np.ndarray, other_n: np.ndarray, doc_ids: np.ndarray, draws: int,
           seed: int) -> dict:
  """other minus ref: mean per-window difference and its paired document-bootstrap 95% CI."""
  diff = np.asarray(other_n, np.float64) - np.asarray(ref_n, np.float64)
  lo, hi = eval_lib.bootstrap_ci(diff[:, None], doc_ids, draws, seed)
  return {"diff": float(diff.mean()), "ci95": [float(lo[0]), float(hi[0])]}


def across_seeds(values: list[float]) -> dict:
  """Mean and sample sd (None for one seed)."""
  x = np.asarray(values, np.float64)
  return {"mean": float(x.mean()), "sd": float(x.std(ddof=1)) if x.size > 1 else None}


def t_interval(values: list[float]) -> dict:
  """Mean, sample sd and the 95% Student-t interval of the mean over seeds (None for one)."""
  x = np.asarray(values, np.float64)
  out = {**across_seeds(values), "n": int(x.size), "ci95": None}
  if x.size > 1:
    half = float(scipy_stats.t.ppf(0.975, x.size - 1) * out["sd"] / np.sqrt(x.size))
    out["ci95"] = [out["mean"] - half, out["mean"] + half]
  return out


def document_variance(values_SxN: np.ndarray, doc_ids_n: np.ndarray, draws: int,
                      seed: int) -> float:
  """Document-bootstrap variance of the seed-averaged window mean of `values` [S, n] (each
  seed's per-window values on the same n windows): Var_b[(1/S) sum_s mean_b(values_s)],
  ddof 1 over the draws b, each draw resampling documents once for every seed (the seeds
  are scored on the same test documents)."""
  means_BxS = eval_lib.bootstrap_means(np.asarray(values_SxN, np.float64).T, doc_ids_n, draws,
                                       seed)
  return float(means_BxS.mean(axis=1).var(ddof=1)) if draws > 1 else 0.0


def widened_t_interval(values: list[float], doc_var: float, level: float = 0.95) -> dict:
  """The t interval across seeds widened by the documents' variance (SPEC 9.8):

    mean +- t_{(1 + level) / 2, S - 1} * sqrt(sd^2 / S + doc_var)

  with S seeds, `values` their results (sd: sample sd, ddof 1) and `doc_var` the document
  bootstrap variance of their mean (`document_variance`). sd^2 / S is the seed noise
  conditional on the documents, doc_var the noise of drawing the test documents; the t
  quantile at S - 1 degrees of freedom keeps it conservative. At least as wide as
  `t_interval` (doc_var >= 0); ci95 None for one seed (no seed noise to estimate).
  """
  x = np.asarray(values, np.float64)
  out = {"mean": float(x.mean()), "n": int(x.size), "document_sd": float(np.sqrt(doc_var)),
         "sd": None, "ci95": None}
  if x.size > 1:
    out["sd"] = float(x.std(ddof=1))
    half = float(scipy_stats.t.ppf((1 + level) / 2, x.size - 1)
                 * np.sqrt(out["sd"] ** 2 / x.size + doc_var))
    out["ci95"] = [out["mean"] - half, out["mean"] + half]
  return out


def row_losses(start: dict, end: dict) -> dict:
  """One row and seed: start_loss, end_loss and gain (start - end), per split (each a loss
  or per-window losses)."""
  s = {k: float(np.mean(v)) for k, v in start.items()}
  e = {k: float(np.mean(v)) for k, v in end.items()}
  return {"start_loss": s, "end_loss": e, "gain": {k: s[k] - e[k] for k in s}}


def gain_difference(ref: list[dict], other: list[dict], gains_w: list[tuple], doc_ids,
                    draws: int) -> dict:
  """The reference's gain minus another row's, over the seeds both ran (per-seed records
  with `seed` and `gain`), on test (with validation beside it): the mean with its 95% t
  interval across seeds, and per seed the paired document bootstrap of the per-window
  difference (end gap - start gap); `seeds_and_documents`: the t interval widened by the
  documents' bootstrap variance of the seed-mean difference (`widened_t_interval`), both
  noises. `gains_w`: per seed (ref, other) per-window test gains."""
  diff = {split: [a["gain"][split] - b["gain"][split] for a, b in zip(ref, other, strict=True)]
          for split in ("test", "validation")}
  per_seed = []
  for a, (ref_w, other_w) in zip(ref, gains_w, strict=True):
    d = paired(other_w, ref_w, doc_ids, draws, a["seed"])  # ref gain - other gain per window
    per_seed.append({"seed": a["seed"], "diff": d["diff"], "bootstrap_ci95": d["ci95"]})
  diff_SxN = np.stack([np.asarray(r, np.float64) - np.asarray(o, np.float64) for r, o in gains_w])
  both = widened_t_interval(diff["test"], document_variance(diff_SxN, doc_ids, draws,
                                                            ref[0]["seed"]))
  return {"split": "test", **t_interval(diff["test"]), "per_seed": per_seed,
          "seeds_and_documents": {"ci95": both["ci95"], "document_sd": both["document_sd"]},
          "validation": t_interval(diff["validation"]),
          "how": "reference gain minus this row's gain (= end gap minus start gap); ci95: "
                 "t interval across optimisation seeds (conditional on the test documents); "
                 "bootstrap_ci95: paired test-document bootstrap around this seed's runs "
                 "(document noise only); seeds_and_documents.ci95: both noises, the seed t "
                 "interval widened by the documents' variance, mean +- t_{0.975, S-1} * "
                 "sqrt(sd^2 / S + document_sd^2), document_sd the paired test-document "
                 "bootstrap sd of the seed-mean difference"}


def load_line(p: dict) -> str:
  """The sentence every table.md carries: the machine's 1-minute load at the start and end."""
  la = p["load_average"]
  return f"Load average {la['start'][0]:.2f} at the start, {la['end'][0]:.2f} at the end."


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


def sized(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Each method's training config, its width set so its total parameters match the
  reference method's (config.match_params); the reference first."""
  names = list(config.order) or list(config.methods.keys())
  if sorted(names) != sorted(config.methods.keys()):
    raise UserError(f"order={names} must name every method once: "
                    f"{', '.join(config.methods.keys())}")
  ref = config.reference
  if ref not in names:
    raise UserError(f"reference={ref!r} is not a method; have {', '.join(names)}")
  cfgs = {n: ml_collections.ConfigDict(config.methods[n].to_dict())
          for n in [ref] + [n for n in names if n != ref]}
  target = resolved(cfgs[ref]).method.ensemble_params
  keep = tuple(config.get("keep_width", ()))  # rows at their own width (e.g. one expert)
  for name, c in cfgs.items():
    if name != ref and name not in keep and config.match_params:
      c.model.d_t = resolved(c).method.width_for_params(target)
  return cfgs
