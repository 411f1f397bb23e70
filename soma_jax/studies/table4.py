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
(start - end) on validation and test; SOMA's gain minus each row's gain with its 95% t
interval across seeds (`statistics.gain_difference`); the end test loss with its paired CI
against SOMA; and beside it, labelled as such, the ranking at equal operations (each row's
test curve read at the smallest operation count any budget row reached).
"""

from __future__ import annotations

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
  results,
  scores,
  seeded,
  statistics,
  training,
)
from soma_jax.studies.verdict import Interval, from_stat


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=table4: the allocation rows and two controls, 1.6e12 of SPEC 7's operations per
  row and seed at size=cpu (on a CPU and a GPU alike: the rows differ in cost per update).

    python experiments/compare.py --config=experiments/configs/compare.py:study=table4,size=cpu --out=runs/table4
  """
  a = recipes.args(arg)
  return recipes.allocation(a["study"], a["size"])


class Rows(NamedTuple):
  """Table 4's own fields (`check`): what each row stands for in the paper's table."""
  rows: dict[str, str]


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Rows:
  """The controls match the reference's updates, and are methods."""
  ref = plan.reference
  for name, target in plan.match_updates.items():
    if name not in config.methods or target != ref:
      raise UserError(f"match_updates.{name}={target!r}: controls match the reference {ref!r}, "
                      f"and must be methods; fix: --config.match_updates.{name}={ref}")
  return Rows({n: config.rows.get(n, "") for n in config.methods})


def run_config(name: str, methods: dict, plan: planning.StudyPlan, data_dir: str, seed: int,
               start: dict, ref_updates: int | None,
               score: eval_lib.TestSet | None = None) -> spec_lib.RunSpec:
  """The run of row `name` (its training config in `methods`) at one seed: to the budget, or
  (a control) to the reference's updates in this seed. `score`: the set its curve is read on
  (the test set), scored by training at each checkpoint (`training.budgeted`)."""
  fresh = name in plan.fresh_optimizer  # its seed's parameters, fresh Adam moments
  if name in plan.match_updates:
    return training.budgeted(methods[name], data_dir, seed, start, "updates", ref_updates,
                             plan.curve_points, fresh=fresh, score=score)
  return training.budgeted(methods[name], data_dir, seed, start, plan.unit, plan.budget,
                           plan.curve_points, fresh=fresh, score=score)


def stages(grid: Rows, ready: base.Setup) -> base.Stages:
  """Each row's start scored, then every row at every seed (`rows_stages`); (described, per-seed
  records, end test losses, starts)."""
  plan, (val, test) = ready.plan, ready.scored
  starts, described = {}, {}
  for n, c in ready.methods.items():
    start = ready.seeds[plan.start[n]]
    first = training.budgeted(c, ready.data_dir, plan.seeds[0], start, plan.unit, 1, 1)
    starts[n] = scores.start_losses(first, {"validation": val, "test": test})
    described[n] = describe(n, first, plan, start, training.layout_of(first))
  records, ends = yield from rows_stages(plan, ready.methods, (ready.data_dir, ready.out),
                                         ready.seeds, starts, ready.scored)
  return described, records, ends, starts


def measure(grid: Rows, ready: base.Setup, gathered: tuple) -> dict:
  """Each row's per-seed records with its end gap to the reference, aggregated; the gain
  differences and the ranking at equal operations."""
  described, records, ends, starts = gathered
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
            "gain_difference": gain_differences(described, ends, starts, ref, test,
                                                plan.bootstrap_draws)}
  fields["equal_ops"] = equal_ops(fields, [n for n in ready.methods
                                           if n not in plan.match_updates])
  return fields


def rows_stages(plan: planning.StudyPlan, methods: dict, where: tuple[str, str],
                seeds: dict, starts: dict, scored: tuple[eval_lib.TestSet, eval_lib.TestSet]
                ) -> base.Stages:
  """Every row at every optimisation seed in two stages: the rows on the budget, then the
  controls at the reference's updates in their seed. Returns ({(seed, row): its per-seed
  record}, {(seed, row): its end per-window test losses})."""
  data_dir, out = where
  records, ends = {}, {}
  for stage in ([n for n in methods if n not in plan.match_updates],
                [n for n in methods if n in plan.match_updates]):
    planned = {(seed, name): run_config(
        name, methods, plan, data_dir, seed, seeds[plan.start[name]],
        records[(seed, plan.reference)]["updates"] if name in plan.match_updates else None,
        score=scored[1])
        for seed in plan.seeds for name in stage}
    for run in (yield from seeded.trained(planned, out)):
      records[(run.seed, run.name)], ends[(run.seed, run.name)] = row_record(
          run, out, seeds[plan.start[run.name]], starts[run.name], scored)
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


def gain_differences(described: dict, ends: dict, starts: dict, ref: str,
                     test: eval_lib.TestSet, draws: int) -> dict:
  """{row: the reference's gain minus the row's} for every row but the reference."""
  out = {}
  for name, r in described.items():
    if name == ref:
      continue
    seeds = [q["seed"] for q in r["per_seed"]]
    gains_w = [(starts[ref]["test"] - ends[(s, ref)], starts[name]["test"] - ends[(s, name)])
               for s in seeds]
    out[name] = statistics.gain_difference(described[ref]["per_seed"], r["per_seed"], gains_w,
                                         test.doc_ids, draws)
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
  r["start_loss"] = per[0]["start_loss"]  # the same for every seed
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


def _fmt(x: float) -> str:
  for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if x >= div:
      return f"{x / div:.3g}{unit}"
  return f"{x:.3g}"


def _line(name: str, r: dict, p: dict) -> str:
  """One row of the main table; its budget column in the study's unit for every row (a
  control that ran to the reference's updates too: what it spent, in that unit)."""
  ref, n_seeds, unit = p["reference"], len(p["seeds"]), p["budget"]["unit"]
  dirs = r["directions_per_update"] if r["directions_per_update"] is not None else "-"
  g = p["gain_difference"].get(name)
  return (f"| {name} | {r['budget']} | {r['n_experts']} | {r['d_t']} | {_fmt(r['params'])} | "
          f"{dirs} | {_fmt(r['ops_per_update'])} | {r['updates']['mean']:.0f} | "
          f"{r[unit]['mean']:.4g} | {r['start_loss']['test']:.4f} | "
          f"{results.pm(r['test_nats_per_byte'], digits=4)} | {results.ci(r['gain']['test'])} | "
          f"{results.ci(r['gain']['validation'])} | " + ("-" if g is None else results.ci(g))
          + " | " + ("-" if name == ref else f"{results.pm(r['minus_ref'], True)} "
                    f"({r['ref_wins']}/{n_seeds})") + " |")


def table(p: dict) -> str:
  """Markdown: the budget table (start, end, gains, gain differences), per-seed values, the
  equal-ops ranking beside it."""
  ref, ev, b = p["reference"], p["eval"], p["budget"]
  rank = sorted(p["methods"], key=lambda n: p["methods"][n]["test_nats_per_byte"]["mean"])
  lines = [
      f"Table 4 protocol (SPEC 9.1, 9.6) at this scale. Budget: {b['amount']:g} {b['unit']} per "
      f"row and seed ({b['controls']}). Every row continues its architecture's seed run "
      f"({b['seed_updates']} updates, optimizer state included). Evaluation: route on "
      f"{ev['route_bytes']} bytes, score the next {ev['score_bytes']} ({ev['test_windows']} "
      f"test windows from {ev['test_documents']} documents); seeds {p['seeds']}; gains are "
      f"start − end, with 95% t intervals over seeds; load average "
      f"{p['load_average']['start'][0]:.2f} at the start, {p['load_average']['end'][0]:.2f} at "
      "the end.",
      "",
      *results.head(f"| row | budget | N | d_t | params | directions / update | ops / update | "
                    f"updates | {b['unit']} spent | start test | end test | gain test | gain "
                    f"validation | {ref} gain minus row gain (test) | end minus {ref} "
                    f"({ref} wins) |"),
  ]
  lines += [_line(name, r, p) for name, r in p["methods"].items()]
  eq = p["equal_ops"]
  lines += ["", f"Ranking by end test loss at this budget: {' < '.join(rank)}.",
            f"Ranking at equal operations ({_fmt(eq['ops'])} ops, {eq['how']}): "
            + " < ".join(f"{n} {eq['test_nats_per_byte'][n]['mean']:.3f}" for n in eq["ranking"])
            + ".", "", f"Per seed: gain (test), and {ref}'s gain minus it [95% paired document "
            "bootstrap: document noise around one start only].", "",
            *results.head("| row | " + " | ".join(f"seed {s}" for s in p["seeds"]) + " |")]
  for name, r in p["methods"].items():
    g = p["gain_difference"].get(name)
    cells = [f"{q['gain']['test']:+.3f}" + ("" if g is None else
             f", {d['diff']:+.3f} [{d['bootstrap_ci95'][0]:+.3f}, {d['bootstrap_ci95'][1]:+.3f}]")
             for q, d in zip(r["per_seed"], g["per_seed"] if g else r["per_seed"], strict=True)]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += ["", f"Byte-unigram baseline on the same targets: {p['unigram_test_nats_per_byte']:.3f} "
            "nats/byte. Seed runs (cost excluded): " + "; ".join(
                f"{k} {s['method']} d_t={s['d_t']}: {s['updates']} updates at seed {s['seed']}, "
                f"ensemble val {s['ensemble_val_nats_per_byte']:.3f}"
                for k, s in p["seed_runs"].items()) + "."]
  return "\n".join(lines) + "\n"


def primary_table4(d: dict) -> tuple[Interval, ...]:
  g = d["gain_difference"]
  return tuple(from_stat(f"{k} dirs", g[f"mono_k{k}"]) for k in (4, 16, 64))


def ours_table4(d: dict) -> str:
  g, end = d["gain_difference"], d["equal_ops"]["test_nats_per_byte"]
  ends = ", ".join(f"{end[k]['mean']:.3f}" for k in ("mono_k4", "mono_k16", "mono_k64"))
  ci = lambda k: paper.ci(g[k], both=True)
  return (f"SOMA's test gain minus the monoliths' at {d['budget']['amount']:.2g} ops: 4 "
          f"directions {ci('mono_k4')}, 16 {ci('mono_k16')}, 64 {ci('mono_k64')} "
          f"({len(d['seeds'])} seeds, seeds and documents); test ends SOMA "
          f"{end['soma_n2']['mean']:.3f}, monoliths {ends} (4 / 16 / 64)")


PAPER_ROWS = (paper.StudyRow(
    "Figure 1, Table 4", "how to spend a budget: SOMA N = 2 against monoliths with more "
    "directions, EGGROLL", ours_table4, "test 1.76 (SOMA) against 2.00 / 2.11 / 2.00 (64 / 256 / "
    "1,024 directions), EGGROLL 2.21, near 150 GPU-hours", "82k params; SPEC 7 operations, not "
    "GPU-hours; gains from equal-update seeds, not end losses; the monoliths at SOMA's lr 0.0025 "
    "as the paper's (Table 7 finds their best 4x lower); ranking: 16 directions best here, the "
    "paper's 256 worst", primary_table4, paper_brief="SOMA 1.76, monoliths 2.00-2.11",
    result="{name}_ops_cpu"),)

STUDY = base.Study(spec="SPEC 9.1 (paper App. I.1, Table 4 / Figure 1), scaled down by SPEC 9.6",
                   config=config, check=check, stages=stages, measure=measure, table=table,
                   ops_tolerance=base.any_ops,  # unequal costs per update are Table 4's point
                   paper_rows=PAPER_ROWS)
