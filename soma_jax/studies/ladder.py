"""The width ladder (SPEC 9.7): does sharding's advantage grow with width, and does the
measured estimator noise predict it?

At each rung (SOMA N = 2 experts of width w, against the monolith of equal total
parameters, `planning.sized`; SOMA and the monolith then do equal operations per update):
1. the seed runs of Table 7's protocol (`training.train_seeds`: equal updates), then the
   mechanism at the rung's start, before any compared update: for each expert (the SOMA
   seed on its own shard's expert-validation windows) and for the monolith (its seed on the
   same windows, both shards'), the descent ratio rho (`descent.measure`, by
   config.mechanism.rho_by: a forward-only line search along training's own SPSA estimates
   against `jax.grad`) and the effective rank r (Hessian-vector products). The predicted
   progress ratio is mean_e rho_e / rho_mono. The same for the summed-loss estimator (the
   control's, `summed_descent`): one SPSA direction over both experts' bodies, the N losses
   summed (a block-diagonal Hessian, r_summed ~ r_1 + r_2), predicting SOMA against the
   control by mean_e rho_e / rho_summed (SPEC 9.7: the pair the variance argument separates);
2. Table 7's comparison at that width (`driver.preparing`, `table7.stages`: the lr-then-eps grid,
   selection on ensemble validation, test scored once, per optimisation seed);
3. the summed-loss control (config.control) from SOMA's start, at SOMA's selected lr and eps
   and SOMA's number of updates in each seed (as Table 4's controls run).
The measured ratio is SOMA's compared-phase test gain (start - end) over the monolith's, per
seed, with its 95% t interval across seeds; `measured_vs_summed` the same over the control's.
Every field, the mechanism's settings and every rung's runs are checked before the first rung
trains (`check`). OUT/rungW holds each rung's seeds and runs (they resume); `STUDY` runs
through the driver (`driver.run`), which writes OUT/results.json, table.md and ladder.png
(`ladder_report.py`). The mechanism's measurement is in `ladder_mechanism.py`.
"""

from __future__ import annotations

import dataclasses
import os
import time

import ml_collections

from soma_jax import descent
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  datasets,
  driver,
  planning,
  recipes,
  report,
  results,
  scores,
  statistics,
  table7,
  training,
)
from soma_jax.studies.ladder_mechanism import (
  Mechanism,
  measurement_batches,
  seed_descent,
  summed_descent,
)
from soma_jax.studies.ladder_report import plot, table

SPEC = "SPEC 9.7 (this project's width ladder: Table 7's protocol at each width)"


# ------------------------------------------------------------------------------ rungs


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=ladder (SPEC 9.7): Table 7's config (its seeds, budget, grid and scoring) run at
  each rung, SOMA N = 2 experts of width w against the monolith of equal total parameters,
  with the summed-loss control at SOMA's selected settings.

    python experiments/compare.py --config=experiments/configs/compare.py:study=ladder,size=cpu --out=runs/ladder
    ...:study=ladder,size=cpu,rungs=16/32/64,seeds=3   (the first pass; rungs split by /)
  """
  a = recipes.args(arg, seeds=0, rungs="")
  cpu = a["size"] == "cpu"
  c = recipes.pair(a["study"], a["size"])
  # SOMA's expert widths, one rung each (the monolith's width is matched at each rung)
  c.rungs = a["rungs"] or ("16/32/64/128" if cpu else "4/8")
  c.seeds = a["seeds"] or (3 if cpu else 2)
  if cpu:  # to fit the first pass's 3 rungs in about an hour: Table 7's lr grid without its
    # 4x point (never selected there: SOMA took 1x in 5 of 5 seeds, the monolith 0.25x or
    # 0.5x; an edge choice still grows it twice, to 4x and 8x or 0.125x and 0.0625x), and no
    # eps stage: in Table 7's 10 shared-start searches (docs/results/table7_cpu_shared_start.json) eps 0.5x..2x moved
    # the selected run's validation loss by 0.0026 at most, the lr grid by 0.068 to 0.159
    c.lr_factors = (0.25, 0.5, 1.0, 2.0)
    c.eps_factors = (1.0,)
  summed = recipes.copy(c.methods.soma_n2)
  summed.method = "soma_summed"  # every expert's estimate from the N losses summed
  c.methods.soma_n2_summed = summed
  c.rows.soma_n2_summed = "control: SOMA N = 2 with the N losses summed before each difference"
  c.start.soma_n2_summed = "soma_expert"
  c.order = ("soma_n2", "mono", "soma_n2_summed")
  c.control = "soma_n2_summed"  # run at SOMA's selected lr / eps for SOMA's updates, per seed
  c.mechanism = ml_collections.ConfigDict()  # rho and r at each rung's start (soma_jax.descent)
  c.mechanism.rho_by = "line_search"  # rho by line_search (forward only) or hvp
  c.mechanism.batches = 4 if cpu else 1  # expert-validation batches per expert (B x A windows)
  c.mechanism.repeats = 16 if cpu else 2  # SPSA estimates per batch (update steps 0..R-1)
  c.mechanism.hutchinson = 16 if cpu else 1  # Hutchinson vectors per batch for tr(H)
  c.mechanism.seed = 0  # the probes' base key of the measurement
  return c


@dataclasses.dataclass(frozen=True)
class LadderSpec:
  """The ladder's own fields, checked and typed once (`check`), beside Table 7's plan and
  grid. `config` stays the config space each rung's runs are built from (`rung_config`) and
  what results.json records; everything else is read from the fields."""
  config: ml_collections.ConfigDict
  plan: planning.StudyPlan
  grid: table7.Grid
  widths: tuple[int, ...]  # SOMA's expert widths, one rung each
  reference: str  # SOMA
  other: str  # the monolith
  control: str  # the summed-loss control
  seq_len: int  # the reference's (the scored windows')
  mechanism: Mechanism


def widths(rungs: object) -> list[int]:
  """config.rungs ("16/32/64"): SOMA's expert widths, one rung each."""
  try:
    out = [int(w) for w in str(rungs).split("/")]
  except ValueError:
    out = []
  if not out or min(out) < 1 or len(set(out)) != len(out):
    raise UserError(f"rungs={rungs!r} must be distinct positive widths split by '/', "
                    "e.g. rungs=16/32/64")
  return out


def rung_config(ls: LadderSpec, width: int, control: bool = True) -> ml_collections.ConfigDict:
  """The study's config at one rung: SOMA (and the control) at expert width `width`, the
  monolith matched by `planning.sized`; without the control, Table 7's pair."""
  c = ml_collections.ConfigDict(ls.config.to_dict())
  for name in (ls.reference, ls.control):
    c.methods[name].model.d_t = width
  if not control:
    for field in ("methods", "rows", "start"):
      del c[field][ls.control]
    c.order = tuple(n for n in ls.config.order if n != ls.control)
  return c


def sized(ls: LadderSpec, width: int) -> dict[str, ml_collections.ConfigDict]:
  """Every method's training config at the rung, the reference first."""
  return planning.sized(rung_config(ls, width))


def sizes(ls: LadderSpec, width: int) -> dict:
  """Widths, total parameters and operations per update of every method at a rung, and how
  far the monolith's are from SOMA's (relative to SOMA's)."""
  cfgs = sized(ls, width)
  specs = {n: spec_lib.resolve(c) for n, c in cfgs.items()}
  ref, mono = ls.reference, ls.other
  params = {n: s.method.ensemble_params for n, s in specs.items()}
  ops = {n: s.total_ops_per_update for n, s in specs.items()}
  return {"width": width, "d_t": {n: c.model.d_t for n, c in cfgs.items()},
          "n_experts": {n: s.n_experts for n, s in specs.items()}, "params": params,
          "ops_per_update": ops,
          "params_difference": (params[mono] - params[ref]) / params[ref],
          "ops_difference": (ops[mono] - ops[ref]) / ops[ref]}


MECHANISM_FIELDS = {"mechanism.rho_by": planning.one_of(*descent.RHO_BY),
                    "mechanism.batches": planning.whole(1), "mechanism.repeats": planning.whole(2),
                    "mechanism.hutchinson": planning.whole(1), "mechanism.seed": planning.whole(0)}


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> LadderSpec:
  """Every field of the ladder checked and every rung's runs resolved before any rung trains:
  Table 7's grid, the control, the mechanism, and at each rung its seed runs and methods
  (`training.check_runs`) and the monolith's operations within ops_tolerance of SOMA's; the
  ladder's fields, typed."""
  ws = widths(config.rungs)
  grid = table7.check_grid(config)
  ref, control, methods = plan.reference, config.control, list(config.methods)
  if control not in methods or control == ref:
    raise UserError(f"control={control!r} must name a method other than the reference "
                    f"{ref!r}; fix: --config.control= one of "
                    f"{', '.join(n for n in methods if n != ref)}")
  other = _other(methods, ref, control)
  planning.check_fields(config, MECHANISM_FIELDS)
  m = config.mechanism
  ls = LadderSpec(config=config, plan=plan, grid=grid, widths=tuple(ws), reference=ref,
                  other=other, control=control, seq_len=config.methods[ref].data.seq_len,
                  mechanism=Mechanism(m.rho_by, m.batches, m.repeats, m.hutchinson, m.seed))
  for w in ws:
    training.check_runs(planning.check_plan(rung_config(ls, w)), sized(ls, w), (control,))
    s = sizes(ls, w)
    if abs(s["ops_difference"]) > plan.ops_tolerance:
      raise UserError(f"rung {w}: the monolith's operations per update differ from SOMA's by "
                      f"{s['ops_difference']:+.1%} (> {plan.ops_tolerance:.0%}); fix: other "
                      "--config.rungs")
  return ls


def _other(methods: list[str], reference: str, control: str) -> str:
  """The monolith: the method that is neither the reference nor the control."""
  others = [n for n in methods if n not in (reference, control)]
  if len(others) != 1:
    raise UserError(f"study={STUDY.name} needs SOMA ({reference}), one monolith and the "
                    f"control ({control}); config.methods has {', '.join(methods)}")
  return others[0]


# -------------------------------------------------------------------------- mechanism


def mechanism(ls: LadderSpec, specs: dict, seeds: dict, data_dir: str) -> dict:
  """rho and r of each SOMA expert, of the monolith and of the summed-loss estimator at the
  rung's start, on identical windows: expert e on its shard's batches, the monolith on all
  of them, the summed estimator on every expert's batch k at once."""
  ref, mono, ctl, m = ls.reference, ls.other, ls.control, ls.mechanism
  batches = measurement_batches(data_dir, specs[ref], m.batches)
  start = lambda name: seeds[ls.plan.start[name]]["_path"]
  experts = [seed_descent(specs[ref], start(ref), b, e, m) for e, b in enumerate(batches)]
  monolith = seed_descent(specs[mono], start(mono), [x for b in batches for x in b], 0, m)
  summed = summed_descent(specs[ctl], start(ctl), batches, m)
  return {"experts": experts, "monolith": monolith, **descent.predicted(experts, monolith),
          "summed": summed, **descent.predicted_vs_summed(experts, summed)}


def gain_ratios(a_per_seed: list[dict], b_per_seed: list[dict]) -> list[float]:
  """Per seed, a's compared-phase test gain over b's (records of the same seeds, in order)."""
  out = []
  for a, b in zip(a_per_seed, b_per_seed, strict=True):
    if a["seed"] != b["seed"]:
      raise ValueError(f"seed {a['seed']} against seed {b['seed']}: the records' seeds differ")
    out.append(a["gain"]["test"] / b["gain"]["test"])
  return out


# ------------------------------------------------------------------------------ a rung


def setup(ls: LadderSpec, plan: planning.StudyPlan, out: str, executor=None) -> base.Setup:
  """The data dir and its evaluation sets, shared by every rung (each rung sizes and seeds
  its own runs: `rung`)."""
  del executor
  data_dir = datasets.ensure_data(plan.data_dir, out, 2)
  sets = datasets.eval_sets(plan.eval, data_dir, [ls.seq_len])
  return base.Setup(plan, {}, {}, {}, data_dir, sets, {}, out,
                    base.Data({2: data_dir}, {2: sets}, 2, 2))


def rung_plan(ls: LadderSpec, width: int, data_dir: str) -> planning.StudyPlan:
  """Table 7's plan at a rung: its pair (`rung_config` without the control) on `data_dir`."""
  c = rung_config(ls, width, control=False)
  c.data_dir = data_dir
  return planning.check_plan(c)


def rung_mechanism(ls: LadderSpec, cfgs: dict, seeds: dict, data_dir: str) -> dict:
  """`mechanism` at a rung's start (its seed records), with its wall seconds."""
  t = time.perf_counter()
  mech = mechanism(ls, {n: spec_lib.resolve(c) for n, c in cfgs.items()}, seeds, data_dir)
  mech["wall_seconds"] = time.perf_counter() - t
  return mech


def control(ls: LadderSpec, cfgs: dict, pair: base.Setup, somas: list[dict]) -> base.Stages:
  """The control from SOMA's start at SOMA's selected lr / eps and updates, per seed (one
  stage); its start is SOMA's (the same seed run and state), so its gain is SOMA's start
  minus its end."""
  name, out = ls.control, pair.out
  start = pair.seeds[ls.plan.start[name]]
  planned = [(table7.grid_point(training.budgeted(
      cfgs[name], pair.data_dir, soma["seed"], start, "updates", soma["updates"], 1),
      soma["selected"]["lr"], soma["selected"]["eps"]),
      os.path.join(out, "runs", f"seed{soma['seed']}", name),
      f"seed {soma['seed']} {name} lr={soma['selected']['lr']:g} eps={soma['selected']['eps']:g}")
      for soma in somas]
  yield planned
  per_seed = []
  for soma, (run_spec, workdir, _) in zip(somas, planned, strict=True):
    ends = {s: float(scores.final_losses(workdir, run_spec, sc).mean())
            for s, sc in zip(("validation", "test"), pair.scored, strict=True)}
    gain = {s: soma["start_loss"][s] - ends[s] for s in ends}
    per_seed.append({"seed": soma["seed"], "lr": soma["selected"]["lr"],
                     "eps": soma["selected"]["eps"], "updates": soma["updates"],
                     "end_loss": ends, "gain": gain, "workdir": planning.shown(workdir, out),
                     "soma_minus_control_gain": soma["gain"]["test"] - gain["test"]})
  return {"method": name, "per_seed": per_seed,
          "gain": statistics.t_interval([r["gain"]["test"] for r in per_seed]),
          "soma_minus_control_gain": statistics.t_interval(
              [r["soma_minus_control_gain"] for r in per_seed])}


def rung(ls: LadderSpec, width: int, ready: base.Setup) -> base.Stages:
  """One rung into OUT/rungW: its seeds, the mechanism at the start, Table 7's pair
  (`table7.stages`), the control; its record."""
  t0 = time.perf_counter()
  cfgs, ref, mono = sized(ls, width), ls.reference, ls.other
  print(f"[ladder] rung {width}: {ref} d_t={cfgs[ref].model.d_t} x {cfgs[ref].n_experts}, "
        f"{mono} d_t={cfgs[mono].model.d_t}", flush=True)
  pair = yield from driver.preparing(table7.STUDY, ls.grid, rung_plan(ls, width, ready.data_dir),
                                     os.path.join(ready.out, f"rung{width}"), ready.scored)
  mech = rung_mechanism(ls, cfgs, pair.seeds, ready.data_dir)
  print(f"[ladder] rung {width}: rho expert {mech['rho_expert']:.4g}, monolith "
        f"{mech['monolith']['rho']:.4g}, summed {mech['summed']['rho']:.4g}, predicted ratio "
        f"{mech['predicted_ratio']:.3f} ± {mech['predicted_ratio_se']:.3f}, vs summed "
        f"{mech['predicted_vs_summed']:.3f} ± {mech['predicted_vs_summed_se']:.3f}", flush=True)
  compared = table7.measure(ls.grid, pair, (yield from table7.stages(ls.grid, pair)))
  somas = compared["methods"][ref]["per_seed"]
  ctl = yield from control(ls, cfgs, pair, somas)
  ratios = gain_ratios(somas, compared["methods"][mono]["per_seed"])
  vs_summed = gain_ratios(somas, ctl["per_seed"])
  measured = statistics.t_interval(ratios)
  print(f"[ladder] rung {width}: predicted ratio {mech['predicted_ratio']:.3f} ± "
        f"{mech['predicted_ratio_se']:.3f}, measured gain ratio {results.ci(measured)}; vs "
        f"summed predicted {mech['predicted_vs_summed']:.3f}, measured "
        f"{results.ci(statistics.t_interval(vs_summed))}", flush=True)
  return {**sizes(ls, width), "folder": f"rung{width}", "mechanism": mech,
          "seed_runs": results.public(pair.seeds), "methods": compared["methods"],
          "gain_difference": compared["gain_difference"], "control": ctl,
          "measured_ratio": measured, "measured_ratio_per_seed": ratios,
          "measured_vs_summed": statistics.t_interval(vs_summed),
          "measured_vs_summed_per_seed": vs_summed, "wall_seconds": time.perf_counter() - t0}


def stages(ls: LadderSpec, ready: base.Setup) -> base.Stages:
  """Every rung (`rung`), one after another; their records."""
  rungs = []
  for w in ls.widths:
    rungs.append((yield from rung(ls, w, ready)))
  return rungs


def measure(ls: LadderSpec, ready: base.Setup, rungs: list[dict]) -> dict:
  """The rungs, and the settings they share."""
  return {"budget": {"unit": ready.plan.unit, "per": "configuration, at every rung",
                     "seed_updates": ready.plan.seed_updates},
          "rungs_asked": list(ls.widths), "mechanism": ls.mechanism.record(),
          "other": ls.other, "control": ls.control, "rungs": rungs}


STUDY = base.Study(name="ladder",
                   spec=SPEC, config=config, check=check, stages=stages, measure=measure,
                   table=table, setup=setup, plot=report.png(plot, "ladder.png"))
