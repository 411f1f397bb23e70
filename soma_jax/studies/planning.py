"""A study's plan (seeds, budgets, fields) and the protocol the comparisons share (SPEC 9.6).

- Starts (SPEC 9.6): every architecture starts from a seed run of its own (an N = 1 run at
  the SOMA expert's width for SOMA, one at the monolith's width for the monoliths, one GRU
  for EGGROLL). Every seed gets the same number of updates (`seed_updates`, never seconds:
  a narrower model runs more updates per second and would start ahead) at `seed_run_seed`,
  a data and direction seed outside the optimisation seeds. The compared phase continues it
  (`init_state`): parameters, Adam moments, the plateau schedule's state and the step
  counter, so its first update is the seed's last + 1. Every optimisation seed of a row
  starts from that one state; the optimisation seed changes only the batches and directions.
  A study whose config sets `own_starts` (SPEC 9.8) gives each optimisation seed s seed runs
  of its own instead, trained at seed_run_seed + s (`training.seed_stage`), so where a
  start lands enters every interval (`interval_kind`). Seeds' cost: apart, counted for no row.
- The budget (`budget`, in `budget_unit`): "updates" where the compared models do equal
  operations per update (Table 7's equal-size pair: `check_equal_ops`), else "cpu_seconds"
  (the process's CPU time of training updates, all threads) on a CPU and "device_seconds"
  (SPEC 7, `host_devices.CHARGE_RULE`) on a GPU; "auto" picks between the last two. Never
  wall time. Compilation, evaluation and checkpoint saves are never counted; a run stops
  after the complete update that reaches its budget, with a checkpoint after each 1/k of it.
- Scoring: the routed top-min(4, N) mixture on an evaluation split cut into pieces of
  route + score + 1 bytes (`evaluate.cut_windows`), so every scored target lies inside
  the trained context; the paper scores whole 1,025-byte windows (route 256, score 768).
  Where a study passes its validation set to `training.budgeted` (`score`), training
  scores it at every checkpoint from the state in memory (config.checkpoint_eval,
  `checkpoint_scores`) and `scores.curve` / `scores.final_losses` read those losses, the
  same bit for bit; any other set (test) is restored and scored once.
- What is reported (SPEC 9.6): each row's start, end and gain (start - end) on validation
  and test, and the reference's gain minus each other row's gain with a 95% t interval
  across optimisation seeds (`statistics.gain_difference`) and, per seed, a paired document
  bootstrap of the same difference (end gap - start gap: document noise only);
  `seeds_and_documents` carries both noises (the t interval widened by the documents'
  variance: `statistics.widened_t_interval`, SPEC 9.8). The evaluation windows are spread
  over the split's documents (`pipeline.spread_windows`; `datasets.describe_span` counts).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable

import jax
import ml_collections

from soma_jax import budget as budget_lib
from soma_jax import config as config_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError

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
  own_starts: bool = False  # each optimisation seed s its own seed runs (`seed_stage`)


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


def check_fields(config: ml_collections.ConfigDict, rules: dict) -> None:
  """Each study field of `rules` ({dotted key: (what it must be, test)}) in range, else a
  UserError naming it as compare.py's flag (--config.KEY)."""
  fields = config_lib.flatten(config.to_dict())
  for key, (text, ok) in rules.items():
    value = fields[key]
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
  try:
    return spec_lib.resolve(c)
  except UserError as e:
    raise UserError(reworded(str(e), prefix, list(config_lib.flatten(c.to_dict())))) from None


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


def reworded(message: str, prefix: str, keys: list[str]) -> str:
  """A run config's UserError with its fields named as the study's: `prefix` before each
  field of `keys` (dotted ones wherever they stand, the rest before "=") and after every
  "--config."."""
  message = message.replace("--config.", "--config." + prefix)
  for key in sorted(keys, key=len, reverse=True):
    end = r"(?![\w.])" if "." in key else "(?==)"
    message = re.sub(rf"(?<![\w.]){re.escape(key)}{end}", prefix + key, message)
  return message


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


def seed_configs(plan: StudyPlan, specs: dict[str, spec_lib.RunSpec]
                 ) -> dict[str, ml_collections.ConfigDict]:
  """Each seed run's config: its recipe (the config's seed_runs) at the model of the methods
  that start from it (plan.start; `specs`: each method resolved, its model as its config
  records it); those methods must share one model."""
  out, seed_recipes = {}, plan.config.seed_runs
  for name, seed_c in seed_recipes.items():
    users = [m for m in specs if plan.start[m] == name]
    if not users:
      continue
    shapes = {m: (specs[m].config.model.d_t, specs[m].config.model.d_e,
                  specs[m].config.model.depth, specs[m].method.family) for m in users}
    if len(set(shapes.values())) > 1:
      raise UserError(f"methods {', '.join(users)} start from seed {name!r} but differ in "
                      "model size; fix: give each size its own seed run in config.start")
    s = ml_collections.ConfigDict(seed_c.to_dict())
    ref = specs[users[0]]
    m = ref.config.model
    s.model.update(d_t=m.d_t, d_e=m.d_e, depth=m.depth)
    if resolved(s).method.family != ref.method.family:
      raise UserError(f"seed {name!r} is method={s.method} but {users[0]} is method="
                      f"{ref.method.name}: a GRU seeds a GRU, an LSTM an LSTM")
    if s.n_experts != 1:
      raise UserError(f"seed_runs.{name}.n_experts={s.n_experts}; a seed is one model (SPEC 3.4)")
    out[name] = s
  for m in specs:
    if plan.start.get(m) not in out:
      raise UserError(f"start.{m}={plan.start.get(m)!r} is not a seed run; have "
                      f"{', '.join(seed_recipes.keys())}")
  return out


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
