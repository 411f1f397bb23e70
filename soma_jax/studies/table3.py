"""The paper's Table 3 (scaled down by SPEC 9.6): one checkpoint's training compute, counted
by each accounting convention.

The checkpoint is Figure 7's largest N (its experts panel; `ensemble`) with one expert alone
(`solo`, N = 1 of the same shape) beside it, read from a finished fig7 folder (`runs_from`,
checked to hold the same settings) or trained here into OUT/fig7 (a whole study=fig7).
For each optimisation seed, in device-seconds (SPEC 7: seconds x the devices or cores charged):
- recorded: U x the mean step seconds the run recorded (summary.json `device_seconds`; the
  paper's U sum_e t_e / 3600: every expert is in one vmapped step, so the sum is its time);
- physical: the run's training calls' wall seconds times the devices charged (start-up,
  restore, compilation, checkpoints: the paper's W&B total), as the run recorded them
  (summary.json `physical_seconds`, summed over resumed calls; older runs: this call's wall);
- fixed solo rate: N x U x the solo's mean step seconds (the paper's 256 U x 0.168 s).
The paper's fourth row (a fixed 0.140-s normalization) names an unmeasured constant: none here.
Each row's ratio to the recorded, per seed and over seeds, beside the paper's (49.6k / 41.9k).
"""

from __future__ import annotations

import dataclasses
import math
import os

import ml_collections

from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  datasets,
  driver,
  fig7,
  paper,
  planning,
  recipes,
  results,
  statistics,
  training,
)

PAPER = {
    "item": "Table 3",
    "caption": "Compute accounting for the same N = 256 checkpoint. The first row is used for "
               "the endpoint in Figures 1 and 15. The other rows preserve the separate logged "
               "total and fixed-rate conventions. They do not identify different training "
               "endpoints.",
    "gpu_hours": {"recorded": 41_900, "physical": 49_600, "fixed_solo_rate": 49_700,
                  "fixed_normalization": 41_400},
    "calculation": {"recorded": "U sum_e mean step seconds of expert e / 3600",
                    "physical": "W&B physical_gpu_hr",
                    "fixed_solo_rate": "256 U (0.168) / 3600",
                    "fixed_normalization": "256 U (0.140) / 3600"},
}
ROWS = ("recorded", "physical", "fixed_solo_rate")
SAME = ("n_experts", "d_t", "n_pert", "batch", "accum")  # what runs_from must share with us
OWN_FIELDS = ("solo", "ensemble", "runs_from")  # table3's; the rest is fig7's config
SWEEP = fig7.STUDY.name  # the name fig7 is registered by: its results and its folder


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=table3 (the paper's Table 3): Figure 7's largest N and one expert alone, each
  seed's checkpoint accounted by the paper's conventions.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table3,size=cpu --out=runs/table3
    ... --config.runs_from=runs/fig7   (a finished study=fig7: read its runs, train nothing)
  """
  c = fig7.config(arg)
  n_max = max(m.n_experts for m in c.methods.values())
  keep = ("n1", f"n{n_max}")  # the solo and the checkpoint accounted (the paper's N = 256)
  recipes.rows(c, {n: (c.methods[n], c.rows[n], c.start[n]) for n in keep})
  c.panels = ml_collections.ConfigDict({"experts": keep})
  c.reference = keep[0]
  c.order = keep
  c.solo, c.ensemble = keep  # one expert alone (its step gives the fixed rate), the checkpoint
  c.runs_from = ""  # a finished study=fig7 --out with these settings; "" = train them here
  return c


@dataclasses.dataclass(frozen=True)
class Accounting:
  """The study's own fields (`check`): the fig7 sweep, its two settings, where it is read."""
  sweep_config: ml_collections.ConfigDict  # fig7's config of the two settings
  sweep: fig7.Sweep
  solo: str
  ensemble: str
  runs_from: str
  shapes: dict  # {solo / ensemble name: its resolved `_shape`}, what runs_from must match


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Accounting:
  """Every field before anything trains: fig7's (fig7's `check` on the config without this
  study's fields), the two settings (an N = 1 solo and a larger N of the same expert shape)
  and `runs_from`."""
  planning.check_fields(config, {
      "runs_from": ("a string (a fig7 --out folder, or empty)", lambda v: isinstance(v, str)),
      "solo": ("a method of config.methods", lambda v: v in config.methods),
      "ensemble": (f"a method of config.methods other than solo ({config.solo!r})",
                   lambda v: v in config.methods and v != config.solo)})
  sub = ml_collections.ConfigDict({k: v for k, v in config.to_dict().items()
                                   if k not in OWN_FIELDS} | {"study": SWEEP})
  sweep = fig7.check(plan, sub)
  specs = training.check_runs(plan, planning.sized(sub))
  solo, ens = specs[config.solo], specs[config.ensemble]
  if solo.n_experts != 1 or ens.n_experts < 2:
    raise UserError(f"solo={config.solo!r} has N = {solo.n_experts} and ensemble="
                    f"{config.ensemble!r} N = {ens.n_experts}: the solo is one expert (N = 1), "
                    "the ensemble more; fix: --config.solo=n1 --config.ensemble=the largest N")
  differ = [k for k in SAME[1:] if _shape(solo)[k] != _shape(ens)[k]]
  if differ:
    raise UserError(f"solo and ensemble differ in {', '.join(differ)}: the fixed solo rate "
                    "charges each expert the solo's step, which must be one expert of the same "
                    f"shape; fix: --config.methods.{config.solo}.<field>= the ensemble's")
  where = config.runs_from.strip()
  if where and not os.path.isdir(where):
    raise UserError(f"runs_from={where!r} is not a folder; fix: the --out of a finished "
                    f"study={SWEEP} run, or --config.runs_from= (train here)")
  return Accounting(sub, sweep, config.solo, config.ensemble, where,
                    {config.solo: _shape(solo), config.ensemble: _shape(ens)})


def _shape(spec) -> dict:
  c = spec.config
  return {"n_experts": spec.n_experts, "d_t": c.model.d_t, "n_pert": c.spsa.n_pert,
          "batch": c.spsa.batch, "accum": c.spsa.accum, "seq_len": spec.seq_len}


def sweep_in(study: Accounting, folder: str) -> dict:
  """A finished fig7 folder's results.json, read without training: fig7's, with both settings
  of the same shape, budget and seeds, and every run's summary.json; else a UserError."""
  fix = f"fix: run study={SWEEP} with these settings there first, or --config.runs_from= (train here)"
  theirs = results.finished_study(folder, SWEEP, "runs_from", fix)
  plan = study.sweep.plan
  settings = theirs.get("measured", {}).get("settings", {})
  for name in (study.solo, study.ensemble):
    got = settings.get(name) or {}
    differ = [k for k in SAME if got.get(k) != study.shapes[name][k]]
    if differ or theirs.get("budget", {}).get("amount") != plan.budget:
      raise UserError(f"runs_from={folder!r}: its {name} differs ({', '.join(differ) or 'budget'})"
                      f"; {fix}")
    seeds = [q["seed"] for q in got["per_seed"]]
    if seeds != list(plan.seeds):
      raise UserError(f"runs_from={folder!r}: {name} ran seeds {planning.seed_list(seeds)}, not "
                      f"{planning.seed_list(plan.seeds)}; {fix}")
    for q in got["per_seed"]:
      _summary(folder, q["workdir"])
  return theirs


COUNTED = ("updates", "ops", "device_seconds", "update_seconds")  # what `account` reads


def _summary(folder: str, workdir: str) -> dict:
  """A run's summary.json with every counter `account` reads a finite number (updates and
  update_seconds > 0), else a UserError (missing, truncated, tampered)."""
  done = results.read_summary(os.path.join(folder, workdir))
  if done is None or any(not isinstance(done.get(k), int | float) or isinstance(done.get(k), bool)
                         or not math.isfinite(done[k]) for k in COUNTED) or not (
                             done["updates"] > 0 and done["update_seconds"] > 0):
    raise UserError(f"{folder!r}: {workdir}/summary.json is missing, unreadable or lacks its "
                    f"counters ({', '.join(COUNTED)}); fix: --config.runs_from= a finished "
                    f"study={SWEEP} whose runs are whole, or another --out to train them again")
  return done


def account(ens_run: dict, solo_run: dict, wall: float, n_experts: int) -> dict:
  """One seed's rows from the ensemble's and the solo's summary.json and the ensemble's
  training-call wall seconds: device-seconds per convention, each one's ratio to the
  recorded, and the per-expert step seconds (in the vmapped step, and alone)."""
  updates = int(ens_run["updates"])
  units = ens_run["device_seconds"] / ens_run["update_seconds"]  # devices or cores charged
  solo_step = solo_run["update_seconds"] / solo_run["updates"]
  physical = ens_run.get("physical_seconds")  # what the run's calls took, recorded by it
  recorded = isinstance(physical, int | float) and math.isfinite(physical) and physical > 0
  rows = {"recorded": float(ens_run["device_seconds"]),
          "physical": float(physical) if recorded else wall * units,
          "fixed_solo_rate": n_experts * updates * solo_step * units}
  apart = {k: float(ens_run.get(k) or 0.0) for k in ("compile_seconds", "ckpt_seconds",
                                                     "eval_seconds")}
  return {"updates": updates, "devices_charged": units, "device_seconds": rows,
          "ratio_to_recorded": {k: v / rows["recorded"] for k, v in rows.items()},
          "per_expert_step_seconds": {"in_the_ensemble_step": ens_run["update_seconds"]
                                      / (updates * n_experts), "alone": solo_step},
          "physical_minus_recorded": rows["physical"] - rows["recorded"],
          "recorded_apart_device_seconds": apart, "ops": int(ens_run["ops"]),
          "training_call_wall_seconds": wall,
          "physical_from": ("summary.json physical_seconds (the run's training calls)"
                            if recorded else "this study call's wall seconds x devices")}


def readout(sweep: dict, folder: str, solo: str, ensemble: str) -> dict:
  """results.json `measured`: per seed the rows (`account`), and over seeds each row's mean
  device-seconds and ratio to the recorded."""
  settings = sweep["measured"]["settings"]
  n = int(settings[ensemble]["n_experts"])
  per_seed = []
  for q_ens, q_solo in zip(settings[ensemble]["per_seed"], settings[solo]["per_seed"],
                           strict=True):
    done = [_summary(folder, q["workdir"]) for q in (q_ens, q_solo)]
    per_seed.append({"seed": q_ens["seed"], "workdirs": [q_ens["workdir"], q_solo["workdir"]],
                     **account(*done, q_ens["wall_seconds_this_call"], n)})
  over = lambda key, row: statistics.across_seeds([s[key][row] for s in per_seed])
  paper = PAPER["gpu_hours"]
  return {
      "n_experts": n, "ensemble": ensemble, "solo": solo,
      "params": settings[ensemble]["params"], "per_seed": per_seed,
      "rows": {r: {"device_seconds": over("device_seconds", r),
                   "device_hours_mean": over("device_seconds", r)["mean"] / 3600,
                   "ratio_to_recorded": over("ratio_to_recorded", r),
                   "paper_gpu_hours": paper[r],
                   "paper_ratio_to_recorded": paper[r] / paper["recorded"],
                   "calculation": PAPER["calculation"][r]} for r in ROWS},
      "not_reproduced": {"fixed_normalization": "the paper's fixed 0.140-second "
                         "normalization names a constant without its measurement"},
      "per_expert_step_seconds": {k: statistics.across_seeds(
          [s["per_expert_step_seconds"][k] for s in per_seed])
          for k in ("in_the_ensemble_step", "alone")}}


def setup(study: Accounting, plan: planning.StudyPlan, out: str, executor=None) -> base.Setup:
  """fig7's two settings, read from `runs_from` (`sweep_in`) or trained into OUT/fig7 (a whole
  study=fig7); its data dir, sets and seed runs, and (data.extra) its results.json and folder."""
  if study.runs_from:
    folder = os.path.abspath(study.runs_from)
    sweep = sweep_in(study, folder)
  else:
    folder = os.path.join(out, SWEEP)
    sweep = driver.run(fig7.STUDY, study.sweep_config, folder, "", executor)
  data_dir = os.path.join(folder, sweep["data_dir"])
  scored = datasets.eval_sets(plan.eval, data_dir, [v["seq_len"] for v in study.shapes.values()])
  data = base.Data({1: data_dir}, {1: scored}, 1, 1, extra=(sweep, folder))
  return base.Setup(plan, {}, {}, {}, data_dir, scored, sweep["seed_runs"], out, data)


def stages(study: Accounting, ready: base.Setup) -> base.Stages:
  """Nothing more to train (`setup` trained or read the sweep): its results.json and folder."""
  return ready.data.extra
  yield


def measure(study: Accounting, ready: base.Setup, gathered: tuple) -> dict:
  """Each seed's checkpoint accounted (`readout`), beside the sweep it reads."""
  sweep, folder = gathered
  return {"budget": sweep["budget"], "runs_from": study.runs_from,
          "fig7_folder": study.runs_from or planning.shown(folder, ready.out),
          "sweep_load_average": sweep["load_average"], "paper": PAPER,
          "measured": readout(sweep, folder, study.solo, study.ensemble)}


def table(p: dict) -> str:
  """Markdown: each convention's device-seconds, its ratio to the recorded, the paper's."""
  m, b = p["measured"], p["budget"]
  lines = [f"Table 3 at this scale: SOMA N = {m['n_experts']} ({m['params']:,} parameters, "
           f"fixed-width experts, Figure 7's {m['ensemble']}) after {b['amount']:g} updates "
           f"from its seed run, seeds {p['seeds']}; one expert alone ({m['solo']}) gives the "
           f"fixed solo rate. Sweep from {p['fig7_folder']}; load average "
           f"{p['sweep_load_average']['start'][0]:.2f} at its start, "
           f"{p['sweep_load_average']['end'][0]:.2f} at its end.", "",
           *results.head("| accounting | ours: device-seconds (mean over seeds) | ours / "
                         "recorded | paper GPU-hours | paper / recorded | calculation |")]
  for name, r in m["rows"].items():
    sd = r["ratio_to_recorded"]["sd"]
    lines.append(f"| {name} | {r['device_seconds']['mean']:.2f} | "
                 f"{r['ratio_to_recorded']['mean']:.3f}"
                 f"{'' if sd is None else f' (sd {sd:.3f})'} | {r['paper_gpu_hours']:,} | "
                 f"{r['paper_ratio_to_recorded']:.3f} | {r['calculation']} |")
  lines.append(f"| fixed_normalization | - | - | {PAPER['gpu_hours']['fixed_normalization']:,} "
               f"| {PAPER['gpu_hours']['fixed_normalization'] / PAPER['gpu_hours']['recorded']:.3f}"
               f" | not reproduced: {m['not_reproduced']['fixed_normalization']} |")
  step = m["per_expert_step_seconds"]
  lines += ["", f"Per-expert step: {step['in_the_ensemble_step']['mean'] * 1e3:.3f} ms inside "
            f"the N = {m['n_experts']} step, {step['alone']['mean'] * 1e3:.3f} ms alone "
            f"(ratio {step['in_the_ensemble_step']['mean'] / step['alone']['mean']:.3f}).",
            "", "Per seed (device-seconds: recorded / physical / fixed solo rate; the physical "
            "total's excess over the recorded):"]
  for s in p["measured"]["per_seed"]:
    d = s["device_seconds"]
    lines.append(f"- seed {s['seed']}: {d['recorded']:.2f} / {d['physical']:.2f} / "
                 f"{d['fixed_solo_rate']:.2f}; excess {s['physical_minus_recorded']:.2f}")
  return "\n".join(lines) + "\n"


def ours_table3(d: dict) -> str:
  m = d["measured"]
  r, step = m["rows"], m["per_expert_step_seconds"]
  return (f"N = {m['n_experts']}: recorded {r['recorded']['device_seconds']['mean']:.1f} "
          f"device-s; physical {r['physical']['ratio_to_recorded']['mean']:.3f}x, fixed solo "
          f"rate {r['fixed_solo_rate']['ratio_to_recorded']['mean']:.3f}x of it (one expert's "
          f"step inside the N = {m['n_experts']} step "
          f"{step['in_the_ensemble_step']['mean'] / step['alone']['mean']:.2f}x its step alone)")


def brief_table3(d: dict) -> str:
  physical = d["measured"]["rows"]["physical"]["ratio_to_recorded"]["mean"]
  return f"physical {physical:.3f}x of recorded"


PAPER_ROWS = (paper.StudyRow(
    "Table 3", "compute accounting of one checkpoint", ours_table3, "41.9k GPU-hours from "
    "recorded mean step times; physical total 49.6k (1.18x), a fixed 0.168-s rate 49.7k "
    "(1.19x), a fixed 0.140-s normalization 41.4k (0.99x)", "Figure 7's N = 32 checkpoint "
    "(width 32, 300 updates) on 2 CPU cores, every expert in one vmapped step; the 0.140-s row "
    "not reproduced (its measurement is not given)", brief=brief_table3,
    paper_brief="physical 1.18x", no_verdict="one accounting of one checkpoint"),)

STUDY = base.Study(name="table3",
                   spec="paper Table 3 (compute accounting), scaled down by SPEC 9.6",
                   config=config, check=check, stages=stages, measure=measure, table=table,
                   setup=setup, paper_rows=PAPER_ROWS)
