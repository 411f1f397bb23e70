"""The paper's Table 4 / Figure 1 (SPEC 9.1, scaled down by 9.6): how to spend a budget.

Rows: SOMA N = 2; monolithic SPSA of the same total size with 1x, 4x and 16x SOMA's
directions on SOMA's batch (the paper's 64 / 256 / 1,024 against SOMA's 64); EGGROLL (the
paper's GRU); BPTT; and two controls that isolate SOMA's mechanism, both from SOMA's start,
on SOMA's data and for SOMA's number of updates in each seed (`match_updates`):
- `head_only`: SOMA N = 2 with its bodies frozen, only the delta-rule heads training;
- `soma_n2_summed`: SOMA N = 2 with the N losses summed before every finite difference
  (the shared loss), the same directions.
Every row continues the seed run of its own architecture (`training`: equal seed updates,
the seed's whole train state), the same for every optimisation seed, and trains for `budget`
in `budget_unit` (the paper: GPU-hours; here SPEC 7's operations at size=cpu, 1.6e12 per row
and seed on any machine, since the rows do unequal operations per update and no load moves
an operation count; updates at size=tiny; any other unit with --config.budget_unit). A
budget the step cap would cut off is refused before anything trains (`planning.check_plan`).
Reported per row: operations, updates and the budget used; per seed the start, end and gain
(start - end) on validation and test; the end test loss with its paired CI against SOMA;
across seeds, each with its 95% t interval and its seeds-and-documents interval, each row's
test end loss minus SOMA's (`statistics.end_difference`) and SOMA's gain minus the row's
(`statistics.gain_difference`), the config declaring which one is primary (`primary`, SPEC
9.8's end difference by default; results.json `primary`: only it carries a verdict); and
beside it, labelled as such, the ranking at equal operations (each row's test curve read at
the smallest operation count any budget row reached).

Protocol (SPEC 9.8): every optimisation seed s continues its own seed runs, trained at
seed_run_seed + s (`own_starts`); every row's lr (SOMA's, the monoliths', EGGROLL's opt.lr,
BPTT's and the controls' alike) is selected on a grid of lr_factors around its config's lr,
trained on the first seed at `select_fraction` of its budget (a control: of the reference's
selected run's updates), on validation, then fixed for every seed (`selection`); EGGROLL's
sigma and SPSA's eps stay at their config's (eps at the centre lr, tied). table.md states the
ordering of the rows' end test losses against the paper's (`PAPER`).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  paper,
  planning,
  recipes,
  scores,
  seeded,
  selection,
  statistics,
  table4_report,
  table7,
  training,
)
from soma_jax.studies.verdict import END, GAIN, Interval, declared, from_stat, primary_stats

# The paper's Table 4 (test loss near 150 GPU-hours, three significant figures) by our rows:
# SOMA N = 2 (n_pert 64), the monoliths at 1x / 4x / 16x its directions (64 / 256 / 1,024),
# EGGROLL; the paper has no BPTT row or controls.
PAPER = {"item": "Table 4", "test_nats_per_byte": {
    "soma_n2": 1.76, "mono_k4": 2.00, "mono_k16": 2.11, "mono_k64": 2.00, "eggroll": 2.21}}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=table4: the allocation rows and two controls, 1.6e12 of SPEC 7's operations per
  row and seed at size=cpu (on a CPU and a GPU alike: the rows differ in cost per update).

    python experiments/compare.py --config=experiments/configs/compare.py:study=table4,size=cpu --out=runs/table4
  """
  a = recipes.args(arg)
  c = recipes.allocation(a["study"], a["size"])
  c.own_starts = True  # seed s continues its own seed runs, trained at seed_run_seed + s
  # lr: a grid of lr_factors around each row's own lr (SOMA, monoliths and controls 0.0025,
  # EGGROLL 0.01, BPTT bptt.py's) on the first seed at select_fraction of its budget, selected
  # on validation, then fixed for every seed (eps at the centre; `selection`); the Table 7
  # grid fields `allocation` sets are replaced. Tiny: one update per point, the tests' speed.
  c.lr_factors, c.lr_extend = (0.5, 1.0, 2.0), 0
  c.eps_factors, c.eps_extend = (1.0,), 0
  c.select_fraction = 0.25 if a["size"] == "cpu" else 0.1
  # The primary readout, declared before anything trains (SPEC 9.8): the test end loss at the
  # budget (END), or the compared phase's gain (GAIN); the other is secondary, no verdict.
  c.primary = END
  return c


class Rows(NamedTuple):
  """Table 4's own fields (`check`): what each row stands for in the paper's table, its lr
  grid, select_fraction and the primary readout."""
  rows: dict[str, str]
  lr: table7.Grid  # each row's lr grid (factors of its own lr: `selection`)
  select_fraction: float  # of its budget, each grid point's on the first seed
  primary: str  # one of verdict.READOUTS: the readout that carries the verdict


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Rows:
  """The controls match the reference's updates, and are methods; the lr grid,
  select_fraction and the primary readout."""
  ref = plan.reference
  for name, target in plan.match_updates.items():
    if name not in config.methods or target != ref:
      raise UserError(f"match_updates.{name}={target!r}: controls match the reference {ref!r}, "
                      f"and must be methods; fix: --config.match_updates.{name}={ref}")
  lr = table7.check_grid(config)
  planning.check_fields(config, selection.FIELDS)
  return Rows({n: config.rows.get(n, "") for n in config.methods}, lr,
              float(config.select_fraction), table7.check_primary(config))


def run_config(name: str, methods: dict, plan: planning.StudyPlan, data_dir: str, seed: int,
               start: dict, ref_updates: int | None, score: eval_lib.TestSet | None = None,
               share: float = 1.0, checkpoints: int | None = None) -> spec_lib.RunSpec:
  """The run of row `name` (its training config in `methods`) at one seed: to `share` of the
  budget, or (a control) to the reference's updates in this seed, with `checkpoints` (default
  plan.curve_points). `score`: the set its curve is read on (the test set; the selection's:
  validation), scored by training at each checkpoint (`training.budgeted`)."""
  fresh = name in plan.fresh_optimizer  # its seed's parameters, fresh Adam moments
  points = checkpoints or plan.curve_points
  if name in plan.match_updates:
    return training.budgeted(methods[name], data_dir, seed, start, "updates", ref_updates,
                             points, fresh=fresh, score=score)
  return training.budgeted(methods[name], data_dir, seed, start, plan.unit, plan.budget * share,
                           points, fresh=fresh, score=score)


def stages(grid: Rows, ready: base.Setup) -> base.Stages:
  """Each row's start scored at every seed (its own: own_starts), each row's lr selected on
  the first seed (`selecting`), then every row at every seed at its lr (`rows_stages`);
  (described, per-seed records, end test losses, starts, the searches)."""
  plan, (val, test), seeds = ready.plan, ready.scored, ready.seeds
  starts, described, scored = {}, {}, {}
  for seed in plan.seeds:
    for n, c in ready.methods.items():
      start = training.seed_of(plan, seeds, seed, n)
      first = training.budgeted(c, ready.data_dir, seed, start, plan.unit, 1, 1)
      if (start["workdir"], n) not in scored:  # a start shared by seeds is scored once
        scored[(start["workdir"], n)] = scores.start_losses(first, {"validation": val,
                                                                    "test": test})
      starts[(seed, n)] = scored[(start["workdir"], n)]
      if seed == plan.seeds[0]:
        described[n] = describe(n, first, plan, start, training.layout_of(first))
  found = yield from selecting(grid, ready, starts)
  lrs = selection.chosen(found)
  for n, (lr, eps) in lrs.items():
    described[n].update(lr=lr, eps=eps)
  records, ends = yield from rows_stages(plan, ready.methods, (ready.data_dir, ready.out),
                                         seeds, starts, ready.scored, lrs)
  return described, records, ends, starts, found


def selecting(grid: Rows, ready: base.Setup, starts: dict) -> base.Stages:
  """Every row's lr grid on the first seed (`selection`), on validation: the budget rows at
  select_fraction of the budget, then the controls at the updates of the reference's selected
  run; {row: its search}."""
  plan, val, first = ready.plan, ready.scored[0], ready.plan.seeds[0]
  found = {}
  for stage in ([n for n in ready.methods if n not in plan.match_updates],
                [n for n in ready.methods if n in plan.match_updates]):
    ref = found[plan.reference].result()[0]["updates"] if found else None
    runs = {n: training.seed_of(plan, ready.seeds, first, n) for n in stage}
    specs = {n: run_config(n, ready.methods, plan, ready.data_dir, first, runs[n], ref,
                           score=val, share=grid.select_fraction, checkpoints=1)
             for n in stage}
    now = selection.searches(
        grid.lr, specs, {n: selection.start(s, runs[n], starts[(first, n)]["validation"].mean())
                         for n, s in specs.items()},
        {n: s.lr for n, s in specs.items()}, dict.fromkeys(specs, val),
        os.path.join(ready.out, "runs", "select"))
    yield from selection.selecting(now)
    found |= now
  return found


def measure(grid: Rows, ready: base.Setup, gathered: tuple) -> dict:
  """Each row's per-seed records with its end gap to the reference, aggregated; the end and
  gain differences with the declared primary, the ranking at equal operations, the lr
  selection and the ordering against the paper's."""
  described, records, ends, starts, found = gathered
  plan, test, ref = ready.plan, ready.scored[1], ready.plan.reference
  for seed in plan.seeds:
    for name in ready.methods:
      described[name]["per_seed"].append(records[(seed, name)])
    for name in ready.methods:
      described[name]["per_seed"][-1].update(_paired(ends, ref, name, seed, test,
                                                     plan.bootstrap_draws))
  for r in described.values():
    aggregate(r)
  fields = {"budget": {"unit": plan.unit, "per": "row and seed",
                       "seed_updates": plan.seed_updates,
                       "controls": f"{', '.join(plan.match_updates)}: {ref}'s updates per "
                                   "seed, not the budget"},
            "layout": {n: r["layout"] for n, r in described.items()}, "rows": grid.rows,
            "methods": described,
            **differences(described, ends, starts, ref, test, plan.bootstrap_draws),
            "primary": declared(grid.primary)}
  fields["equal_ops"] = equal_ops(fields, [n for n in ready.methods
                                           if n not in plan.match_updates])
  fields.update(intervals=planning.interval_kind(plan), paper=PAPER,
                tuning=selection.tuning(grid.lr, grid.select_fraction),
                selection=selection.report(found, ready.out),
                ordering=ordering({n: r["test_nats_per_byte"]["mean"]
                                   for n, r in described.items()}))
  return fields


def ordering(ends: dict[str, float]) -> dict:
  """The rows' end test losses (seed means) against the paper's Table 4: the order of the rows
  both have (`statistics.ordering`; the paper's 64 and 1,024 directions tie at 2.00), and
  SOMA below each monolith (the paper: 1.76 against 2.00-2.11)."""
  monoliths = [n for n in ends if n.startswith("mono") and n in PAPER["test_nats_per_byte"]]
  return {"of": "end test loss, seed means (an order of means resolves no pair by itself: "
                "end_difference's intervals do)",
          **statistics.ordering(ends, PAPER["test_nats_per_byte"]),
          "soma_below_monoliths": {m: bool(ends["soma_n2"] < ends[m]) for m in monoliths}
          if "soma_n2" in ends else {}}


def _start_w(starts: dict, seed: int, name: str) -> dict:
  """A row's start losses at a seed: starts[(seed, row)] (own starts), else starts[row]."""
  return starts[(seed, name)] if (seed, name) in starts else starts[name]


def rows_stages(plan: planning.StudyPlan, methods: dict, where: tuple[str, str],
                seeds: dict, starts: dict, scored: tuple[eval_lib.TestSet, eval_lib.TestSet],
                lrs: dict | None = None) -> base.Stages:
  """Every row at every optimisation seed in two stages: the rows on the budget, then the
  controls at the reference's updates in their seed; each continuing its seed run at that
  seed (`training.seed_of`), at its selected (lr, eps) where `lrs` names it (else its config's).
  `starts`: each row's start losses, {(seed, row): ...} or {row: ...}. Returns ({(seed, row):
  its per-seed record}, {(seed, row): its end per-window test losses})."""
  data_dir, out = where
  records, ends = {}, {}
  for stage in ([n for n in methods if n not in plan.match_updates],
                [n for n in methods if n in plan.match_updates]):
    planned = {(seed, name): run_config(
        name, methods, plan, data_dir, seed, training.seed_of(plan, seeds, seed, name),
        records[(seed, plan.reference)]["updates"] if name in plan.match_updates else None,
        score=scored[1])
        for seed in plan.seeds for name in stage}
    if lrs:
      planned = selection.fixed(planned, lrs)
    for run in (yield from seeded.trained(planned, out)):
      records[(run.seed, run.name)], ends[(run.seed, run.name)] = row_record(
          run, out, training.seed_of(plan, seeds, run.seed, run.name),
          _start_w(starts, run.seed, run.name), scored)
  return records, ends


def row_record(run: seeded.Run, out: str, start: dict, start_w: dict,
               scored: tuple[eval_lib.TestSet, eval_lib.TestSet]) -> tuple[dict, np.ndarray]:
  """One trained row at one seed scored: (its per-seed record, its end per-window test
  losses)."""
  val, test = scored
  first = training.start_step(run.spec, start)
  points, end_test = seeded.curve(run, start, test, start_w["test"].mean())
  end_val = scores.final_losses(run.workdir, run.spec, val)
  done = scores.summary(run.workdir, run.spec, first)
  print(f"[table4] seed {run.seed} {run.name}: {done['updates']} updates, "
        f"{scores.budget_used(done):.4g} {done['budget_unit']}, test "
        f"{start_w['test'].mean():.4f} -> {end_test.mean():.4f}", flush=True)
  return {"seed": run.seed, "start": training.start_of(start), **done,
          "budget_used": scores.budget_used(done), "wall_seconds_this_call": run.wall,
          "workdir": planning.shown(run.workdir, out), "curve": points, "curve_split": "test",
          "test_nats_per_byte": float(end_test.mean()),
          **statistics.row_losses(start_w, {"validation": end_val, "test": end_test})}, end_test


def _paired(ends: dict, ref: str, name: str, seed: int, test: eval_lib.TestSet,
            draws: int) -> dict:
  d = statistics.paired(ends[(seed, ref)], ends[(seed, name)], test.doc_ids, draws, seed)
  return {"minus_ref": d["diff"], "minus_ref_ci95": d["ci95"]}


def differences(described: dict, ends: dict, starts: dict, ref: str,
                test: eval_lib.TestSet, draws: int) -> dict:
  """{GAIN: {row: the reference's gain minus the row's}, END: {row: the row's test end loss
  minus the reference's}} for every row but the reference."""
  out = {GAIN: {}, END: {}}
  for name, r in described.items():
    if name == ref:
      continue
    seeds = [q["seed"] for q in r["per_seed"]]
    ends_w = [(ends[(s, ref)], ends[(s, name)]) for s in seeds]
    gains_w = [(_start_w(starts, s, ref)["test"] - e_ref, _start_w(starts, s, name)["test"] - e)
               for s, (e_ref, e) in zip(seeds, ends_w, strict=True)]
    per = described[ref]["per_seed"], r["per_seed"]
    out[GAIN][name] = statistics.gain_difference(*per, gains_w, test.doc_ids, draws)
    out[END][name] = statistics.end_difference(*per, ends_w, test.doc_ids, draws)
  return out


def describe(name: str, spec: spec_lib.RunSpec, plan: planning.StudyPlan, seed: dict,
             layout: dict) -> dict:
  """What a row is (its Method's `describe`: model, directions per update) and its budget."""
  c = spec.config  # the row's settings as its config names them
  return {"method": spec.method.name, **spec.method.describe, "n_experts": spec.n_experts,
          "optimizer_state": ("fresh (the seed's parameters only)"
                              if name in plan.fresh_optimizer else "the seed's, continued"),
          "d_t": c.model.d_t, "depth": c.model.depth, "params": spec.method.ensemble_params,
          "seq_len": spec.seq_len, "batch": c.spsa.batch, "accum": c.spsa.accum, "lr": spec.lr,
          "eps": spec.eps, "layout": layout,
          "ops_per_update": spec.total_ops_per_update, "start": training.start_of(seed),
          "budget": ("updates of " + plan.reference if name in plan.match_updates
                     else plan.unit),
          "per_seed": []}


def aggregate(r: dict) -> None:
  per = r["per_seed"]
  for key in ("test_nats_per_byte", "minus_ref", "updates", "ops", "device_seconds",
              "cpu_seconds", "budget_used"):
    r[key] = statistics.across_seeds([p[key] for p in per])
  if len({p["start"] for p in per}) == 1:  # one start every seed shares
    r["start_loss"] = per[0]["start_loss"]
  else:  # each seed its own: their mean
    r["start_loss"] = {s: float(np.mean([p["start_loss"][s] for p in per]))
                       for s in per[0]["start_loss"]}
  r["gain"] = {s: statistics.t_interval([p["gain"][s] for p in per]) for s in ("validation", "test")}
  r["ref_wins"] = int(sum(p["minus_ref"] > 0 for p in per))
  r["ref_wins_ci_excludes_zero"] = int(sum(p["minus_ref_ci95"][0] > 0 for p in per))


def equal_ops(payload: dict, names: list[str]) -> dict:
  """Test loss of each budget row at the smallest final operation count among them, read
  off its checkpoint curve by linear interpolation in operations; mean over seeds."""
  methods = payload["methods"]
  ops = min(p["curve"][-1]["ops"] for n in names for p in methods[n]["per_seed"])
  at = {}
  for n in names:
    per = [float(np.interp(ops, [q["ops"] for q in p["curve"]], [q["loss"] for q in p["curve"]]))
           for p in methods[n]["per_seed"]]
    at[n] = statistics.across_seeds(per)
  order = sorted(names, key=lambda n: at[n]["mean"])
  return {"ops": ops, "how": "each row's test curve (its start and its checkpoints) "
          "interpolated linearly in operations at the smallest final ops of any budget row",
          "test_nats_per_byte": at, "ranking": order}


# Each readout as the paper row names it (SOMA the reference; each interval one monolith's).
NAMES = {END: "the monoliths' test end minus SOMA's", GAIN: "SOMA's test gain minus the monoliths'"}
MONOLITHS = {f"mono_k{k}": f"{k} dirs" for k in (4, 16, 64)}  # the primary intervals' rows


def primary_table4(d: dict) -> tuple[Interval, ...]:
  _, stats = primary_stats(d)
  return tuple(from_stat(name, stats[row]) for row, name in MONOLITHS.items())


def ours_table4(d: dict) -> str:
  p, end = d["primary"], d["equal_ops"]["test_nats_per_byte"]
  ends = ", ".join(f"{end[k]['mean']:.3f}" for k in MONOLITHS)
  said = lambda k: (f"{NAMES[k]}: 4 directions {paper.ci(d[k]['mono_k4'], both=True)}, 16 "
                    f"{paper.ci(d[k]['mono_k16'], both=True)}, 64 "
                    f"{paper.ci(d[k]['mono_k64'], both=True)}")
  out = (f"at {d['budget']['amount']:.2g} ops, {said(p['readout'])} (primary; "
         f"{len(d['seeds'])} seeds, seeds and documents); secondary: "
         f"{'; '.join(map(said, p['secondary']))}; test ends SOMA {end['soma_n2']['mean']:.3f}, "
         f"monoliths {ends} (4 / 16 / 64)")
  if "ordering" not in d:  # measured before each row's lr was selected
    return out + paper.declared_after(d)
  o = d["ordering"]
  return (f"{out}; {selection.edges(d['selection'])}; order of the means, lowest first: "
          f"{' < '.join(o['ours'])} (the paper's {' < '.join(o['paper'])}; {o['agreeing']} of "
          f"{o['pairs']} pairs alike){paper.declared_after(d)}")


PAPER_ROWS = (paper.StudyRow(
    "Figure 1, Table 4", "how to spend a budget: SOMA N = 2 against monoliths with more "
    "directions, EGGROLL", ours_table4, "test 1.76 (SOMA) against 2.00 / 2.11 / 2.00 (64 / 256 / "
    "1,024 directions), EGGROLL 2.21, near 150 GPU-hours", "82k params; SPEC 7 operations, not "
    "GPU-hours; end losses continued from equal-update seeds (each seed its own), with intervals "
    "over seeds and test documents; each row's lr from its own 3-point grid on seed 0, not "
    "extended past an edge", primary_table4, paper_brief="SOMA 1.76, monoliths 2.00-2.11",
    result="{name}_ops_cpu"),)

STUDY = base.Study(name="table4",
                   spec="SPEC 9.1 (paper App. I.1, Table 4 / Figure 1), scaled down by SPEC 9.6",
                   config=config, check=check, stages=stages, measure=measure,
                   table=table4_report.table,
                   ops_tolerance=base.any_ops,  # unequal costs per update are Table 4's point
                   paper_rows=PAPER_ROWS)
