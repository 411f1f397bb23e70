"""The paper's Figures 7, 8 and 14 (its App. M sweeps, scaled down by SPEC 9.6): SOMA's
ensemble-validation loss against training time as N, n_pert and the effective batch B grow.

Three panels, each a list of settings (`panels`, every setting a method of config.methods):
- experts: fixed-width experts, N in config.n_list (the paper's 1, 2, 8, 32, 256: more
  experts, more parameters; `match_params` is off);
- n_pert: N = 8, n_pert at 1/4, 1, 4 and 16 times the base (the paper's 16 ... 1,024 over 64);
- batch: N = 8, B likewise, the two largest by accumulating 4 and 16 batches of the base B
  (`spsa.accum`), each accumulated batch with its own directions, as the paper's 256 and 1,024.
Each N trains on the corpus (`source`) prepared into N shards under OUT/data_nN (the same
held-out documents for every N, checked), and every setting continues one seed run (N = 1 at
the experts' width, `seed_updates` updates on the one-shard data dir, its state continued)
for `budget` updates at each optimisation seed, with `curve_points` checkpoints scored on its
own data dir's ensemble-validation windows (its router). Time is each run's own: `update_seconds`
(wall seconds of training updates, Figure 7's axis), `device_seconds` (SPEC 7: the charged
devices' seconds, Figure 8's aggregate compute) and operations, all excluding the seed run.
results.json `paper` carries the paper's captions and claims (the figures give no loss values
in their text); `measured` each setting's curve and end, and per panel whether the end loss
falls with the setting (the paper: it does, monotonically) and, for Figure 8, which N is lowest
at each of the experts panel's common aggregate-compute points; Figure 14's map: the N of the
lowest-loss checkpoint under each pair of total and per-expert budgets (`fig7_readouts.py`).
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  driver,
  planning,
  recipes,
  report,
  results,
  scores,
  seeded,
  statistics,
  training,
)
from soma_jax.studies.fig7_readouts import (
  PANEL_KEYS,
  PAPER_ROWS,
  budget_map,
  lowest_at_compute,
  panel_readout,
)

PAPER = {
    "item": "Figures 7, 8 and 14",
    "figure7": "SOMA sweeps on logarithmic wall-clock axes. Left, fixed-width experts N in "
               "{1, 2, 8, 32, 256}, shown through a common cutoff of 183.6 estimated hours: "
               "increasing the number of experts (and ensemble size) improves training "
               "monotonically. Center, n_pert in {16, 64, 256, 1024}. Right, effective batch B "
               "in {16, 64, 256, 1024}, the B = 256 and 1,024 runs accumulating four and "
               "sixteen batches of 64, each with 64 independently sampled directions. SOMA "
               "N = 8 improves loss with more n_pert and B.",
    "figure8": "More experts do not lower loss at every training budget: the expert-count "
               "measurements against aggregate GPU-hours estimated from the recorded mean "
               "step times across all experts; expert width fixed, n_pert = B = 64.",
    "figure14": "More shards can lower loss under a tight per-expert budget: color gives the "
                "expert count of the lowest-loss saved checkpoint that fits both budgets (44 "
                "checkpoints from N = 1, 2, 8, 256); N = 1 is never selected; average work per "
                "expert is total GPU-hours divided by N; work from recorded update rates, "
                "initialisation excluded.",
    "claims": {"experts": "loss falls monotonically with N", "n_pert": "loss falls with n_pert",
               "batch": "loss falls with B",
               "figure8": "at a small aggregate budget fewer experts can be lower",
               "figure14": "N = 1 is never selected"},
    "settings": {"experts": [1, 2, 8, 32, 256], "n_pert": [16, 64, 256, 1024],
                 "batch": [16, 64, 256, 1024], "panel_n": 8, "base_n_pert": 64, "base_batch": 64},
}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=fig7 (the paper's Figures 7 and 8): SOMA with fixed-width experts as N, n_pert and
  B grow, every setting continuing one seed run.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig7,size=cpu --out=runs/fig7
  """
  c, a = recipes.paper_study(arg)
  size, cpu = a["size"], a["size"] == "cpu"
  # The paper's figure shows one run per setting; two seeds here, at 300 updates per setting
  # to fit about 45 min on 2 cores (its costliest settings, n_pert 64 and B 64 at N = 8, run
  # 16x the base's operations per update).
  c.seeds = a["seeds"] or 2
  c.budget = 300.0 if cpu else 3.0  # updates per setting and seed
  c.curve_points = 5 if cpu else 2  # checkpoints along each curve
  c.ops_tolerance = 1.0  # the settings differ in cost per update: that is the sweep
  c.match_params = False  # fixed-width experts: more experts, more parameters
  c.update(recipes.corpus())
  base = lambda n: recipes.recipe("soma.py", f"n={n},size={size}", size, c.base_lr)
  n_list = (1, 2, 8, 32) if cpu else (1, 2, 4)  # the paper's 1, 2, 8, 32, 256
  panel_n = 8 if cpu else 2  # the n_pert and batch panels' N (the paper's 8)
  rows = {f"n{n}": base(n) for n in n_list}
  mults = (0.25, 1, 4, 16) if cpu else (0.5, 1, 2)  # of the base: the paper's 16 ... 1,024 / 64
  panels = _allocations(lambda: base(panel_n), mults)
  recipes.rows(c, {name: (cfg, what, "soma_expert") for name, (cfg, what) in {
      **{f"n{n}": (rows[f"n{n}"], f"SOMA N = {n}, fixed-width experts") for n in n_list},
      **panels.pop("_rows")}.items()})
  c.panels = ml_collections.ConfigDict({"experts": tuple(f"n{n}" for n in n_list), **panels})
  c.reference = f"n{panel_n}"
  c.order = tuple(c.methods.keys())
  c.seed_runs = ml_collections.ConfigDict({"soma_expert": c.seed_runs.soma_expert})
  return c


def _allocations(base, mults: tuple) -> dict:
  """Figure 7's n_pert and batch panels at N = the base's: each multiple of the base n_pert
  and B (the base itself is the experts panel's run at that N); B above the base by
  accumulated batches of the base B, each with its own directions (`spsa.accum`). The
  panels, and under "_rows" {name: (training config, what it is)} of the runs they add."""
  ref = base()
  n, k, b = ref.n_experts, ref.spsa.n_pert, ref.spsa.batch  # the paper's 8, 64 and 64
  panels, rows = {"n_pert": [], "batch": []}, {}
  for m in mults:
    if m == 1:
      panels["n_pert"].append(f"n{n}")
      panels["batch"].append(f"n{n}")
      continue
    cfg = base()
    cfg.spsa.n_pert = max(1, int(k * m))
    rows[f"npert{cfg.spsa.n_pert}"] = (cfg, f"SOMA N = {n}, n_pert {cfg.spsa.n_pert}")
    panels["n_pert"].append(f"npert{cfg.spsa.n_pert}")
    cfg = base()
    if m < 1:
      cfg.spsa.batch = max(1, int(b * m))
    else:
      cfg.spsa.accum = int(m)
    eff = cfg.spsa.batch * cfg.spsa.accum
    rows[f"b{eff}"] = (cfg, f"SOMA N = {n}, B {eff}" + (
        f" ({cfg.spsa.accum} accumulated batches of {b})" if m > 1 else ""))
    panels["batch"].append(f"b{eff}")
  return {**{k: tuple(v) for k, v in panels.items()}, "_rows": rows}


@dataclasses.dataclass(frozen=True)
class Sweep:
  """The study's own fields (`check`): the checked plan, the panels and the corpus."""
  plan: planning.StudyPlan
  panels: dict  # {panel: (method, ...)} in the order of the setting
  source: str
  prepare: dict  # prepare.prepare's keyword settings


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Sweep:
  """Every field checked before anything trains: the panels (methods that exist, one
  setting each, in increasing order), the corpus."""
  if config.match_params:
    raise UserError("match_params=True would resize the experts; Figure 7's experts keep one "
                    "width; fix: --config.match_params=False")
  if plan.unit != "updates":
    raise UserError(f"budget_unit={plan.unit!r}: every setting of a sweep runs the same "
                    "updates (time is what the figure reads); fix: --config.budget_unit=updates")
  planning.check_source(config)
  panels = {}
  for panel in config.panels:
    if panel not in PANEL_KEYS:
      raise UserError(f"panels.{panel}: use {', '.join(PANEL_KEYS)}")
  for panel in (p for p in PANEL_KEYS if p in config.panels):  # the paper's left to right
    names = config.panels[panel]
    missing = [n for n in names if n not in config.methods]
    if missing or len(names) < 2:
      raise UserError(f"panels.{panel}={tuple(names)} must name at least 2 methods of "
                      f"{', '.join(config.methods)}; fix: --config.panels.{panel}=a tuple of them")
    values = [check_setting(config.methods[n], panel) for n in names]
    if values != sorted(set(values)):
      raise UserError(f"panels.{panel}: its settings {values} must grow strictly along the panel")
    panels[panel] = tuple(names)
  return Sweep(plan, panels, config.source, recipes.settings(config.get("prepare")))


def check_setting(c: ml_collections.ConfigDict, panel: str) -> int:
  """A method's value on a panel's axis (`check` reads it to order the panel): N, n_pert,
  or the effective batch B x accum."""
  if panel == "experts":
    return int(c.n_experts)
  if panel == "n_pert":
    return int(c.spsa.n_pert)
  return int(c.spsa.batch * c.spsa.accum)


def stages(sweep: Sweep, ready: base.Setup) -> base.Stages:
  """Every setting at every optimisation seed (one stage) from the seed run, on its N's
  shards; each one's validation curve: {setting: its record}."""
  plan, seeds, sets = ready.plan, ready.seeds, ready.data.sets
  planned = seeded.every_seed(ready, ready.methods, "updates", plan.budget)
  starts = {name: scores.start_losses(planned[(plan.seeds[0], name)],
                                      {"validation": sets[ready.specs[name].n_experts][0]})
            for name in ready.methods}
  settings = {}
  for run in (yield from seeded.trained(planned, ready.out)):
    start = seeds[plan.start[run.name]]
    if run.name not in settings:
      settings[run.name] = describe(run.spec, start, starts[run.name])
    points, _ = seeded.curve(run, start, sets[run.spec.n_experts][0],
                            starts[run.name]["validation"].mean())
    settings[run.name]["per_seed"].append(seeded.record(run, ready.out, curve=points,
                                                       end_loss=points[-1]["loss"]))
  return settings


def measure(sweep: Sweep, ready: base.Setup, settings: dict) -> dict:
  """Each setting's end loss over seeds, the panels and Figures 8 and 14 (`readouts`)."""
  for r in settings.values():
    r["end_loss"] = statistics.across_seeds([q["end_loss"] for q in r["per_seed"]])
  return {"budget": {"unit": "updates", "per": "setting and seed",
                     "seed_updates": ready.plan.seed_updates},
          "paper": PAPER, "measured": readouts(sweep, settings),
          "time": "update_seconds: wall seconds of training updates (Figure 7); "
                  "device_seconds: SPEC 7's charged device-seconds (Figure 8's aggregate "
                  "compute); both exclude the seed run, compilation, evaluation and "
                  "checkpoints"}


def figures(p: dict, out: str) -> None:
  """OUT/fig7.png, fig8.png and (with the experts panel) fig14.png."""
  plot(p, os.path.join(out, "fig7.png"), os.path.join(out, "fig8.png"))
  if "figure14" in p["measured"]:
    plot_map(p["measured"]["figure14"], os.path.join(out, "fig14.png"))


def readouts(sweep: Sweep, settings: dict) -> dict:
  """results.json `measured`: every setting, each panel's order, Figures 8 and 14."""
  measured = {"settings": settings,
              "panels": {p: panel_readout(p, names, settings) for p, names in sweep.panels.items()}}
  if "experts" in sweep.panels:
    measured["figure8"] = lowest_at_compute(sweep.panels["experts"], settings)
    measured["figure14"] = budget_map(sweep.panels["experts"], settings)
  return measured


def describe(spec, seed: dict, start: dict) -> dict:
  c = spec.config
  return {"method": spec.method.name, "n_experts": spec.n_experts, "d_t": c.model.d_t,
          "n_pert": c.spsa.n_pert, "batch": c.spsa.batch, "accum": c.spsa.accum,
          "effective_batch": c.spsa.batch * c.spsa.accum,
          "params": spec.method.ensemble_params, "ops_per_update": spec.total_ops_per_update,
          "lr": spec.lr, "eps": spec.eps, "start": training.start_of(seed),
          "start_loss": float(start["validation"].mean()), "per_seed": []}


def plot_map(f14: dict, path: str) -> None:
  """fig14.png: the lowest-loss N over (total, per-expert) budgets, its loss written in."""
  plt = report.plt
  ns = sorted({n for row in f14["lowest_n"] for n in row if n is not None})
  index = {n: i for i, n in enumerate(ns)}
  img = np.array([[np.nan if n is None else index[n] for n in row] for row in f14["lowest_n"]])
  fig, ax = plt.subplots(figsize=(7, 5.5))
  ax.imshow(img, origin="lower", cmap=plt.get_cmap("viridis", max(len(ns), 2)), aspect="auto",
            vmin=-0.5, vmax=max(len(ns), 2) - 0.5)
  for i, row in enumerate(f14["loss"]):
    for j, loss in enumerate(row):
      if loss is not None:
        ax.text(j, i, f"N={f14['lowest_n'][i][j]}\n{loss:.3f}", ha="center", va="center",
                fontsize=6, color="white")
  fmt = lambda xs: [f"{x:.3g}" for x in xs]
  ax.set_xticks(range(len(f14["total_device_seconds"])), fmt(f14["total_device_seconds"]),
                rotation=45, fontsize=7)
  ax.set_yticks(range(len(f14["per_expert_device_seconds"])),
                fmt(f14["per_expert_device_seconds"]), fontsize=7)
  ax.set_xlabel("total budget (aggregate device-seconds)")
  ax.set_ylabel("per-expert budget (device-seconds)")
  ax.set_title("N of the lowest-loss checkpoint that fits both budgets", fontsize=9)
  report.save_figure(fig, path)


def plot(p: dict, path7: str, path8: str) -> None:
  """fig7.png: one panel per sweep, validation loss against training wall seconds (log-log);
  fig8.png: the experts panel against aggregate device-seconds and against operations."""
  plt = report.plt
  m = p["measured"]
  mean_curve = lambda n, key: tuple(v[1:] for v in report.mean_curve(
      m["settings"][n]["per_seed"], key))
  panels = m["panels"]
  fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
  for ax, (panel, r) in zip(axes[0], panels.items(), strict=True):
    for name, value in zip(r["methods"], r["values"], strict=True):
      x, y = mean_curve(name, "update_seconds")
      ax.plot(x, y, marker="o", ms=3, label=f"{r['axis']} = {value}")
    ax.set_yscale("log")
    report.label(ax, "training wall seconds (updates only)", title=panel, log=True)
  report.save_figure(fig, path7)
  if "experts" not in panels:
    return
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  r = panels["experts"]
  for ax, key, label in ((axes[0], "device_seconds", "aggregate device-seconds (SPEC 7)"),
                         (axes[1], "ops", "training operations (SPEC 7)")):
    for name, value in zip(r["methods"], r["values"], strict=True):
      x, y = mean_curve(name, key)
      ax.plot(x, y, marker="o", ms=3, label=f"N = {value}")
    report.label(ax, label, log=True)
  report.save_figure(fig, path8)


def table(p: dict) -> str:
  """Markdown: per panel, each setting's sizes, cost and end loss; Figure 8's reading."""
  m, b = p["measured"], p["budget"]
  lines = [f"Figures 7 and 8 at this scale: every setting {b['amount']:g} updates from one seed "
           f"run ({b['seed_updates']} updates, state continued), {len(p['seeds'])} seed(s); "
           f"ensemble validation ({p['eval']['val_windows_scored']} windows from "
           f"{p['eval']['val_documents']} documents). " + results.load_line(p), ""]
  for panel, r in m["panels"].items():
    lines += [f"**{panel}** ({r['axis']}): end loss falls monotonically: "
              f"{'yes' if r['falls_monotonically'] else 'no'} (in "
              f"{r['seeds_falling_monotonically']} of {len(p['seeds'])} seeds; the paper: "
              f"{PAPER['claims'][panel]}).", "",
              *results.head("| setting | N | n_pert | B (accum) | params | ops / update | "
                            "update s | device s | start | end |")]
    for name, value in zip(r["methods"], r["values"], strict=True):
      s = m["settings"][name]
      last = [q["curve"][-1] for q in s["per_seed"]]
      lines.append(
          f"| {r['axis']} = {value} | {s['n_experts']} | {s['n_pert']} | {s['effective_batch']} "
          f"({s['accum']}) | {s['params']:,} | {s['ops_per_update']:.3g} | "
          f"{np.mean([q['update_seconds'] for q in last]):.3g} | "
          f"{np.mean([q['device_seconds'] for q in last]):.3g} | {s['start_loss']:.4f} | "
          f"{results.pm(s['end_loss'], digits=4)} |")
    lines.append("")
  f8 = m.get("figure8")
  f14 = m.get("figure14")
  if f14:
    lines += ["Figure 14 (lowest-loss N under a total and a per-expert budget; rows: per-expert "
              "device-seconds, columns: total):", "",
              *results.head("| per-expert \\ total | " + " | ".join(f"{x:.3g}" for x in
                                                   f14["total_device_seconds"]) + " |")]
    for share, row in zip(f14["per_expert_device_seconds"], f14["lowest_n"], strict=True):
      lines.append(f"| {share:.3g} | " + " | ".join("-" if n is None else str(n) for n in row)
                   + " |")
    lines.append("")
  if f8 and f8["lowest"]:
    lines.append("Figure 8 (experts against aggregate device-seconds): lowest N at "
                 + ", ".join(f"{x:.3g} s: {n}" for x, n in zip(f8["device_seconds"],
                                                               f8["lowest"], strict=True))
                 + f" ({f8['how']}).")
  return "\n".join(lines) + "\n"


STUDY = base.Study(name="fig7",
                   spec="paper Figures 7, 8 and 14 (App. M sweeps), scaled down by SPEC 9.6",
                   config=config, check=check, stages=stages, measure=measure, table=table,
                   data=driver.per_n(), plot=figures, ops_tolerance=base.any_ops,
                   paper_rows=PAPER_ROWS)
