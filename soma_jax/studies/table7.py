"""The paper's Table 7 (SPEC 9.2, scaled down by 9.6): SOMA N = 2 against the monolith of the
same total size at equal compute and equal tuning.

Per architecture and optimisation seed, continuing that architecture's seed run (`protocol`:
equal seed updates, the seed's whole train state; each optimisation seed s its own seed runs,
trained at seed_run_seed + s (`own_starts`, SPEC 9.8; off, every seed shares one, as the
width ladder's rungs do), results.json `intervals` saying which):
1. lr in base x lr_factors at eps = base (0.25x ... 4x); while the lowest final
   ensemble-validation loss is at the grid's edge, the grid grows by a factor of 2 past it
   (at most `lr_extend` times); a selected lr still at the edge is flagged;
2. at that lr, eps in base x eps_factors (the run at eps = base is reused), grown past an
   edge the same way at most `eps_extend` times (0 at size=cpu, as recorded). All of them
   see the same batches and directions (they share the optimisation seed; lr and eps
   change no random draw).
Each configuration trains for `budget` in `budget_unit` ("updates" at CPU scale, where both
architectures do equal operations per update: `planning.check_equal_ops` prints both and
refuses a pair more than `ops_tolerance` apart), with checkpoints after each quarter scored
on the ensemble-validation windows. The setting with the lowest final validation loss is
selected, and only its final checkpoint is scored on the test set, once (the start, the
same for every configuration, is scored on test once per architecture and seed run, before
any run).
Reported per seed: start, end and gain (start - end) on validation and test, the end test
difference (monolith minus SOMA) with its document-bootstrap CI; across seeds, each with its
95% t interval and its seeds-and-documents interval: the monolith's test end loss minus SOMA's
(`statistics.end_difference`) and SOMA's gain minus the monolith's
(`statistics.gain_difference`). The config declares which one is primary (`primary`, SPEC 9.8's
end difference by default; results.json `primary`): only it carries a verdict.

`STUDY` runs through the driver (`driver.run`); its setup (`driver.preparing`) and `stages` are
one such comparison on given data and scorers, reusable at any width (the width ladder of SPEC
9.7 yields one per rung). Its table.md is drawn by `table7_report.py`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

import ml_collections
import numpy as np

from soma_jax import budget as budget_lib
from soma_jax import evaluate as eval_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.studies import base, paper, planning, recipes, scores, statistics, training
from soma_jax.studies.table7_report import table
from soma_jax.studies.verdict import (
  END,
  GAIN,
  READOUTS,
  Interval,
  declared,
  from_stat,
  primary_stats,
)


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=table7: SOMA N = 2 against the monolith with equal tuning (5 optimisation seeds,
  each with its own 1,000-update seed runs, and 1,000 updates per configuration at size=cpu;
  size=tiny: tests).

    python experiments/compare.py --config=experiments/configs/compare.py:study=table7,size=cpu --out=runs/table7

  Cost at size=cpu on 2 cores, measured (docs/results/table7_cpu.json `cost`): 2,101 s for
  82 runs, 87% of it in training updates.
  """
  a = recipes.args(arg)
  c = recipes.pair(a["study"], a["size"])
  c.own_starts = True  # seed s continues its own seed runs, trained at seed_run_seed + s
  # The primary readout, declared before anything trains (SPEC 9.8): the test end loss at the
  # budget (END), or the compared phase's gain (GAIN); the other is secondary, no verdict.
  c.primary = END
  return c


@dataclasses.dataclass(frozen=True)
class Grid:
  """The lr-then-eps search's settings (`check_grid`): factors of the base, and how many
  times each stage may grow past an edge."""
  base_lr: float
  lr_factors: tuple[float, ...]
  lr_extend: int
  eps_factors: tuple[float, ...]
  eps_extend: int

  def record(self) -> dict:
    """results.json's `tuning` fields."""
    return {"base_lr": self.base_lr, "lr_factors": list(self.lr_factors),
            "lr_extend": self.lr_extend, "eps_factors": list(self.eps_factors),
            "eps_extend": self.eps_extend}


def grid_point(spec: spec_lib.RunSpec, lr: float, eps: float) -> spec_lib.RunSpec:
  """The budgeted run at another lr and eps (its config changed there, then resolved)."""
  c = ml_collections.ConfigDict(spec.config.to_dict())
  c.opt.lr, c.spsa.eps = lr, eps
  return spec_lib.resolve(c)


def extended(lrs: list[float], best: float) -> float | None:
  """The next lr past the grid's edge that `best` sits on (a factor 2 out), else None."""
  if best == min(lrs):
    return min(lrs) / 2
  if best == max(lrs):
    return max(lrs) * 2
  return None


class Search:
  """The two-stage lr-then-eps search of one architecture and seed, on validation only,
  advanced one stage of runs at a time (`wanted`, then `record` each, then `advance`).

  `spec` is the budgeted run (seed, start, budget set); `start` = {step, val}: the seed
  step it continues and its validation loss. Stage 1 runs lr in base x lr_factors at
  eps = base, growing the grid by 2x past the edge the best sits on (at most lr_extend
  times); stage 2 runs eps in base x eps_factors at the selected lr (the eps = base run
  reused), grown the same way at most eps_extend times. The best is the lowest final
  validation loss, the first in grid order on a tie.
  """

  def __init__(self, spec: spec_lib.RunSpec, grid: Grid, root: str, what: str, start: dict,
               base: float | None = None, scorer: eval_lib.TestSet | None = None):
    self.spec, self.root, self.what, self.start = spec, root, what, start
    self.base, self.settings = grid.base_lr if base is None else base, grid
    self.scorer = scorer  # its own validation set (None: the one `record` is given)
    self.windows: dict[tuple[float, float], list] = {}  # each point's per-window curve
    self.tried: dict[tuple[float, float], dict] = {}  # in the order trained
    self.key, self.grid, self.extend = "lr", [f * self.base for f in grid.lr_factors], grid.lr_extend
    self.lr: dict | None = None  # stage 1's choice
    self.chosen: dict | None = None  # the selected configuration, once done

  def _point(self, x: float) -> tuple[float, float]:
    return (x, self.base) if self.key == "lr" else (self.lr["lr"], x)

  def wanted(self) -> list[tuple[float, float]]:
    """The (lr, eps) points this stage still needs, in grid order ([] once done)."""
    if self.chosen is not None:
      return []
    return [p for p in map(self._point, self.grid) if p not in self.tried]

  def job(self, point: tuple[float, float]) -> tuple[spec_lib.RunSpec, str, str]:
    lr, eps = point
    folder = f"lr{planning.exact(lr)}_eps{planning.exact(eps)}"  # exact: never two points'
    return (grid_point(self.spec, lr, eps), os.path.join(self.root, folder),
            f"{self.what} lr={lr:g} eps={eps:g}")

  def record(self, point: tuple[float, float], val: eval_lib.TestSet, wall: float) -> None:
    """A trained point scored on validation (its curve) and kept."""
    run_spec, workdir, _ = self.job(point)
    self.windows[point] = []
    points, last = scores.curve(workdir, run_spec, self.scorer or val, self.start["step"],
                                  self.start["val"], keep=self.windows[point])
    self.tried[point] = {"lr": point[0], "eps": point[1], "workdir": workdir,
                         "val_curve": points, "val_nats_per_byte": float(last.mean()),
                         **scores.summary(workdir, run_spec, self.start["step"]),
                         "wall_seconds_this_call": wall}
    print(f"[table7] {self.what} lr={point[0]:g} eps={point[1]:g}: "
          f"{self.tried[point]['updates']} updates, ensemble val {last.mean():.4f}", flush=True)

  def advance(self) -> None:
    """With every wanted point tried: grow the grid past an edge, go to stage 2, or finish."""
    while self.chosen is None and not self.wanted():
      best = min((self.tried[p] for p in map(self._point, self.grid)),
                 key=lambda r: r["val_nats_per_byte"])
      more = extended(self.grid, best[self.key]) if self.extend > 0 else None
      if more is not None:
        self.grid, self.extend = [*self.grid, more], self.extend - 1
      elif self.key == "lr":
        self.lrs, self.lr = self.grid, best
        self.key, self.grid = "eps", [f * self.base for f in self.settings.eps_factors]
        self.extend = self.settings.eps_extend
      else:
        self.chosen = best

  def result(self) -> tuple[dict, list[dict], dict]:
    """(the selected configuration's record, every configuration's record in the order
    trained, the search: grids and edge flags)."""
    epss = self.grid
    return self.chosen, list(self.tried.values()), {
        "lr_grid": sorted(self.lrs), "eps_grid": sorted(epss),
        "lr_at_edge": extended(self.lrs, self.lr["lr"]) is not None,
        "eps_at_edge": len(epss) > 1 and extended(epss, self.chosen["eps"]) is not None}


def searching(searches: list[Search], val: eval_lib.TestSet) -> base.Stages:
  """Every search to its end, a stage at a time: each stage's runs (all searches' wanted
  points, independent of each other) yielded to be trained, then scored and recorded."""
  for search in searches:
    search.advance()
  while wanted := [(s, p) for s in searches for p in s.wanted()]:
    walls = yield [s.job(p) for s, p in wanted]
    for (search, point), wall in zip(wanted, walls, strict=True):
      search.record(point, val, wall)
    for search in searches:
      search.advance()


GRID_FIELDS = {"lr_factors": planning.factors(), "lr_extend": planning.whole(0),
               "eps_factors": planning.factors(), "eps_extend": planning.whole(0)}


def check_grid(config: ml_collections.ConfigDict) -> Grid:
  """The lr and eps grids: positive factors, an lr edge that can be seen, eps = 1x in stage 2."""
  planning.check_fields(config, GRID_FIELDS)
  if len(config.lr_factors) < 3:
    raise UserError(f"lr_factors={tuple(config.lr_factors)} needs at least 3 factors: an edge "
                    "choice must be detectable; fix: --config.lr_factors='(0.5, 1.0, 2.0)'")
  if 1.0 not in config.eps_factors:
    raise UserError(f"eps_factors={tuple(config.eps_factors)} must hold 1.0 (the stage-1 eps); "
                    "fix: --config.eps_factors='(0.5, 1.0, 2.0)'")
  if config.eps_extend and len(config.eps_factors) < 3:
    raise UserError(f"eps_extend={config.eps_extend}: growing the eps grid needs at least 3 "
                    f"eps_factors (have {tuple(config.eps_factors)}); fix: --config.eps_extend=0 "
                    "or --config.eps_factors='(0.5, 1.0, 2.0)'")
  return Grid(float(config.base_lr), tuple(config.lr_factors), int(config.lr_extend),
              tuple(config.eps_factors), int(config.eps_extend))


class Fields(NamedTuple):
  """Table 7's own fields (`check`): the search grid and the declared primary readout."""
  grid: Grid
  primary: str  # one of verdict.READOUTS: the readout that carries the verdict


def check_primary(config: ml_collections.ConfigDict) -> str:
  """The readout the config declares primary (`verdict.READOUTS`)."""
  planning.check_fields(config, {"primary": planning.one_of(*READOUTS)})
  return config.primary


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Fields:
  """The grid (`check_grid`), exactly two architectures and the primary readout."""
  del plan
  grid = check_grid(config)
  if len(config.methods) != 2:
    raise UserError(f"study={STUDY.name} compares two architectures; config.methods has "
                    f"{len(config.methods)}")
  return Fields(grid, check_primary(config))


def study_stages(fields: Fields, ready: base.Setup) -> base.Stages:
  """The study's `stages` (the width ladder runs `stages` on its own grid)."""
  return stages(fields.grid, ready)


def study_measure(fields: Fields, ready: base.Setup, gathered: tuple) -> dict:
  """`measure`, and which readout is primary (`verdict.declared`)."""
  return {**measure(fields.grid, ready, gathered), "primary": declared(fields.primary)}


def stages(grid: Grid, ready: base.Setup) -> base.Stages:
  """Each architecture's start scored (test: once per seed run), then every architecture x
  seed's search (`searching`), then each selected run's test losses (once); (described,
  finals, starts), finals and starts by (seed, architecture)."""
  plan, (val, test), out = ready.plan, ready.scored, ready.out
  seed_of = lambda seed, name: training.seed_of(plan, ready.seeds, seed, name)
  described, finals, starts, scored = {}, {}, {}, {}
  for seed in plan.seeds:
    for name, c in ready.methods.items():
      s = seed_of(seed, name)
      if (name, s["_path"]) not in scored:  # test: once per seed run
        first = training.budgeted(c, ready.data_dir, seed, s, plan.unit, plan.budget, 1)
        scored[(name, s["_path"])] = scores.start_losses(first, {"validation": val, "test": test})
        if name not in described:
          described[name] = describe(first, s, training.layout_of(first), plan.own_starts)
      starts[(seed, name)] = scored[(name, s["_path"])]
  searches = {(seed, name): Search(
      training.budgeted(c, ready.data_dir, seed, seed_of(seed, name), plan.unit,
                        plan.budget, plan.curve_points, score=val), grid,
      os.path.join(out, "runs", f"seed{seed}", name), f"seed {seed} {name}",
      {"step": seed_of(seed, name)["step"], "val": starts[(seed, name)]["validation"].mean()})
      for seed in plan.seeds for name, c in ready.methods.items()}
  yield from searching(list(searches.values()), val)
  for (seed, name), search in searches.items():
    chosen, tried, grids = search.result()
    finals[(seed, name)] = scores.final_losses(chosen["workdir"], search.spec, test)  # once
    described[name]["per_seed"].append(per_seed_record(
        seed, seed_of(seed, name), chosen, tried, grids, out, starts[(seed, name)],
        finals[(seed, name)]))
  return described, finals, starts


def measure(grid: Grid, ready: base.Setup, gathered: tuple) -> dict:
  """The gain and end differences across seeds and the records (`differences`), the tuning."""
  described, finals, starts = gathered
  plan, (ref, other) = ready.plan, list(ready.methods)
  readouts = differences(described, finals, starts, ref, other, ready.scored[1],
                         plan.bootstrap_draws)
  return {"budget": {"unit": plan.unit, "per": "configuration",
                     "seed_updates": plan.seed_updates, "ops_per_update": ready.ops},
          "intervals": planning.interval_kind(plan),
          "tuning": {**grid.record(),
                     "selection": "final ensemble-validation loss; test scored once, selected "
                                  "only (and the start once per architecture)"},
          "layout": {n: r["layout"] for n, r in described.items()}, "other": other,
          "methods": described, **readouts}


def describe(spec: spec_lib.RunSpec, seed: dict, layout: dict, own: bool = False) -> dict:
  """An architecture's settings; `start`: the seed checkpoint every seed continues (`seed`),
  or with own starts (`own`) a pointer to each per_seed record's."""
  c = spec.config  # the architecture's settings as its config names them
  return {"method": spec.method.name, "n_experts": spec.n_experts, "d_t": c.model.d_t,
          "params": spec.method.ensemble_params, "n_pert": c.spsa.n_pert,
          "batch": c.spsa.batch, "seq_len": spec.seq_len, "weight_decay": spec.weight_decay,
          "ops_per_update": spec.total_ops_per_update,
          "start": "each seed's own (per_seed start)" if own else training.start_of(seed),
          "layout": layout, "per_seed": []}


def per_seed_record(seed: int, start: dict, chosen: dict, tried: list[dict], search: dict,
                    out: str, start_w: dict, test_w: np.ndarray) -> dict:
  strip = lambda r: {k: (planning.shown(v, out) if k == "workdir" else v) for k, v in r.items()}
  ends = {"validation": chosen["val_nats_per_byte"], "test": test_w}
  return {
      "seed": seed, "start": training.start_of(start),
      "selected": {"lr": chosen["lr"], "eps": chosen["eps"],
                   "val_nats_per_byte": chosen["val_nats_per_byte"]},
      **search, **statistics.row_losses(start_w, ends),
      "updates": chosen["updates"], "updates_per_expert": chosen["updates"],
      "budget_used": scores.budget_used(chosen),
      **{k: chosen[k] for k in budget_lib.TRAINING_TIMERS},
      "curve": chosen["val_curve"], "curve_split": "ensemble_val",
      "test_nats_per_byte": float(test_w.mean()),
      "configurations": [strip(r) for r in tried],
  }


def differences(described: dict, finals: dict, starts: dict, ref: str, other: str,
                test: eval_lib.TestSet, draws: int) -> dict:
  """Per seed: other minus ref on the same test windows at the end, paired CI; then across
  seeds. Returns {GAIN: {other: the reference's gain minus the other's}, END: {other: the
  other's test end loss minus the reference's}}."""
  diffs, gains_w, ends_w = [], [], []
  for i, rec in enumerate(described[other]["per_seed"]):
    seed = rec["seed"]
    end_ref, end_other = finals[(seed, ref)], finals[(seed, other)]
    d = statistics.paired(end_ref, end_other, test.doc_ids, draws, seed)
    rec.update({"minus_ref": d["diff"], "minus_ref_ci95": d["ci95"]})
    described[ref]["per_seed"][i].update({"minus_ref": 0.0})
    diffs.append(d["diff"])
    gains_w.append((starts[(seed, ref)]["test"] - end_ref,
                    starts[(seed, other)]["test"] - end_other))
    ends_w.append((end_ref, end_other))
  for name in (ref, other):
    per = described[name]["per_seed"]
    described[name]["test_nats_per_byte"] = statistics.across_seeds(
        [r["test_nats_per_byte"] for r in per])
    described[name]["start_loss"] = {  # the seeds' mean: each seed's own, or the one shared
        s: float(np.mean([r["start_loss"][s] for r in per])) for s in ("validation", "test")}
    described[name]["gain"] = {s: statistics.t_interval([r["gain"][s] for r in per])
                             for s in ("validation", "test")}
  described[other]["minus_ref"] = statistics.across_seeds(diffs)
  described[other]["ref_wins"] = int(sum(d > 0 for d in diffs))
  described[other]["ref_wins_ci_excludes_zero"] = int(
      sum(r["minus_ref_ci95"][0] > 0 for r in described[other]["per_seed"]))
  per = described[ref]["per_seed"], described[other]["per_seed"]
  return {GAIN: {other: statistics.gain_difference(*per, gains_w, test.doc_ids, draws)},
          END: {other: statistics.end_difference(*per, ends_w, test.doc_ids, draws)}}


# Each readout as the paper row names it (mono: the other row; SOMA the reference).
NAMES = {END: "monolith − SOMA, test end", GAIN: "SOMA's gain − the monolith's"}


def primary_table7(d: dict) -> tuple[Interval, ...]:
  key, stats = primary_stats(d)
  return (from_stat(NAMES[key], stats["mono"]),)


def ours_table7(d: dict) -> str:
  p, m = d["primary"], d["methods"]["mono"]
  said = lambda k: f"{NAMES[k]} {paper.ci(d[k]['mono'], 4, both=True)}"
  return (f"{said(p['readout'])} (primary; seeds and documents); secondary: "
          f"{', '.join(map(said, p['secondary']))}; SOMA's end lower in {m['ref_wins']} of "
          f"{len(d['seeds'])} seeds{paper.declared_after(d)}")


PAPER_ROWS = (paper.StudyRow(
    "Table 7", "SOMA N = 2 against the monolith at equal tuning", ours_table7, "monolith − SOMA "
    "test +0.0396 ± 0.0057 (sd; 3 of 3 seeds)", "ours an interval over 5 equal-update seeds "
    "(each seed its own start) and the test documents, not an sd over 3; 82k params; validation "
    "128 windows from 79 documents", primary_table7, paper_brief="+0.0396 ± 0.0057"),)

STUDY = base.Study(name="table7",
                   spec="SPEC 9.2 (paper App. I.2, Table 7), scaled down by SPEC 9.6",
                   config=config, check=check, stages=study_stages, measure=study_measure,
                   table=table, paper_rows=PAPER_ROWS)
