"""Where SOMA's advantage comes from (SPEC 9.8): one study, every row from its own equal-update
start, at equal operations, each with its own lr grid.

Rows (config.methods; config.rows says what each stands for): SOMA N = 2 by SPSA (`soma`, the
reference), the monolith of the same total size by SPSA (`mono`), the same two by backprop
with fresh Adam moments (`soma_bptt`, `mono_bptt`: `fresh_optimizer`, since an SPSA seed's
second moments would damp backprop's first updates about 100x), SOMA on random shards of the
semantic shards' sizes (`soma_random`: `prepare_data.py --assignment=random`, routed by its
own shards' centroids, scored on the same windows), the summed-loss control with its own lr
grid (`soma_summed`), and one expert of SOMA's width on all the data (`one_expert`, N = 1,
its seed continued: `keep_width`), which separates "a narrower model learns faster early
under SPSA" from sharding, and the same expert by backprop (`one_expert_bptt`), which asks
the same of backprop.

Protocol (`protocol`, SPEC 9.6, 9.8): every optimisation seed s continues seed runs of its
own, trained at seed_run_seed + s (`own_starts`, `training.seed_stage`; results.json
`intervals` says which), each row the seed run of its architecture (SPSA rows with the seed's
whole state, `fresh_optimizer` rows with its parameters only); the
budget is the reference's `budget` updates, every row running the operations those take
(SPEC 7's count: one expert does half of SOMA's per update, backprop about 3/8 of it at
n_pert = 4); each row and seed searches lr over base x lr_factors (its base: `row_base_lr`,
else base_lr), selection on ensemble validation, test scored once for the selected run.

Read out (results.json `effects`, each over the optimisation seeds with document noise:
the seed t interval widened by the documents' bootstrap variance of the seed mean,
`statistics.widened_t_interval`): for each pair of `effects` (a, b), a's gain minus b's
(`statistics.gain_difference`), b's end loss minus a's, and the log matched-loss speed-up of a
over b (`speedup`) read two ways: over the compared phase (the common loss range of the two
validation curves, each from its own start) and along the whole trajectory from
initialisation in operations, the seed runs included (what training from scratch pays);
`interactions` (e1, e2): e1's values minus e2's per seed (the zero-order-specific part of
sharding: sharding under SPSA minus sharding under backprop; the same at equal width, and
narrow against wide). `STUDY` runs through the driver
(`driver.run`); its table, effects.csv and curves are drawn by `decompose_report.py`.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  datasets,
  driver,
  planning,
  recipes,
  results,
  scores,
  statistics,
  table7,
  training,
)
from soma_jax.studies.decompose_report import figures, plot, table

SPEC = "SPEC 9.8 (the decomposition: sharding under SPSA and backprop, random shards, summed loss)"
DATA_KINDS = ("semantic", "random")  # row_data values: the data dir a row trains and is scored on

FIELDS = {"data_dir_random": ("a string", lambda v: isinstance(v, str))}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=decompose (SPEC 9.8): where SOMA's lead comes from. Table 7's seeds, scoring and
  statistics; every row at the operations of `budget` of SOMA's updates, each with its own
  lr grid (no eps stage), selection on validation.

    python experiments/compare.py --config=experiments/configs/compare.py:study=decompose,size=cpu --out=runs/decompose
    ...:study=decompose,size=cpu,seeds=5   (the headline's seed count)

  Cost at size=cpu on 2 cores (docs/results/decompose_cpu.json `cost`, 5 seeds): 158 runs,
  5,440 s in training updates and 650 s scoring (it was resumed once, so its wall_seconds
  counts the second process only).
  """
  a = recipes.args(arg, seeds=0)
  size, cpu = a["size"], a["size"] == "cpu"
  c = recipes.pair(a["study"], size)
  c.seeds = a["seeds"] or (3 if cpu else 2)
  c.own_starts = True  # seed s continues its own seed runs, trained at seed_run_seed + s
  # One lr grid per row around its own centre (row_base_lr, else base_lr), grown past an
  # edge at most lr_extend times; eps stays at base_lr (Table 7's eps stage moved the selected
  # validation loss by 0.0026 at most, its lr grid by 0.068 to 0.159).
  c.lr_factors = (0.5, 1.0, 2.0)
  c.lr_extend = 2 if cpu else 0  # tiny: the grid alone (the tests check rows, not the search)
  # tiny: two checkpoints per run (still a curve, for the seed runs too), which keeps its
  # tests as short as before the eighth row and each seed's own seed runs
  c.curve_points = c.curve_points if cpu else 2
  c.eps_factors, c.eps_extend = (1.0,), 0
  rows = _config_rows(c.methods.soma_n2, c.methods.mono, size, c.base_lr)
  recipes.rows(c, rows)
  c.reference = "soma"
  c.order = tuple(rows)
  c.keep_width = ("one_expert", "one_expert_bptt")  # SOMA's expert width; the others match
  # SOMA's params. The backprop rows: the SPSA seed's parameters with fresh Adam, bptt.py's lr
  c.fresh_optimizer = ("soma_bptt", "one_expert_bptt", "mono_bptt")
  c.row_base_lr = ml_collections.ConfigDict(
      {"soma_bptt": 3e-3, "one_expert_bptt": 3e-3, "mono_bptt": 3e-3})
  c.row_data = ml_collections.ConfigDict({"soma_random": "random"})  # else the semantic shards
  c.data_dir_random = ""  # prepared with --assignment=random; "" = the built-in one under OUT
  c.effects = ml_collections.ConfigDict({  # name: (a, b), read as a against b
      "sharding_spsa": ("soma", "mono"), "sharding_bptt": ("soma_bptt", "mono_bptt"),
      "semantic_vs_random": ("soma", "soma_random"),
      "independent_vs_summed": ("soma", "soma_summed"),
      "sharding_at_width": ("soma", "one_expert"), "narrow_vs_wide": ("one_expert", "mono"),
      "sharding_at_width_bptt": ("soma_bptt", "one_expert_bptt"),
      "narrow_vs_wide_bptt": ("one_expert_bptt", "mono_bptt")})
  # name: (effect 1, effect 2), effect 1 minus effect 2 per seed: what is zero-order-specific
  # in sharding (at equal size; at equal width) and in a narrower model
  c.interactions = ml_collections.ConfigDict({
      "interaction": ("sharding_spsa", "sharding_bptt"),
      "interaction_at_width": ("sharding_at_width", "sharding_at_width_bptt"),
      "interaction_narrow_vs_wide": ("narrow_vs_wide", "narrow_vs_wide_bptt")})
  return c


def _config_rows(soma: ml_collections.ConfigDict, mono: ml_collections.ConfigDict, size: str,
          lr: float) -> dict:
  """The decomposition's rows from Table 7's pair (`soma`, `mono`): {name: (training
  config, what it is, seed run)}."""
  rows = {"soma": (soma, "SOMA N = 2 by SPSA, semantic shards", "soma_expert"),
          "mono": (mono, "the monolith of the same total size by SPSA", "monolith")}
  summed = recipes.copy(soma)
  summed.method = "soma_summed"
  rows["soma_summed"] = (summed, "SOMA N = 2 with the N losses summed before each difference",
                         "soma_expert")
  random = recipes.copy(soma)
  # Its seed trained on the semantic dir: the same windows (only the shard labels differ,
  # prepare --assignment=random), so its manifest's hash differs but the seed is the same start.
  random.init_from_other_data = True
  rows["soma_random"] = (random, "SOMA N = 2 on random shards of the semantic shards' sizes",
                         "soma_expert")
  rows["one_expert"] = (recipes.recipe("soma.py", f"n=1,size={size}", size, lr),
                        "one expert of SOMA's width on all the data (N = 1)", "soma_expert")
  for name, n, seed, what in (
      ("soma_bptt", 2, "soma_expert", "SOMA N = 2"),
      ("one_expert_bptt", 1, "soma_expert", "one expert of SOMA's width on all the data (N = 1)"),
      ("mono_bptt", 1, "monolith", "the monolith")):
    bptt = recipes.recipe("bptt.py", f"n={n},size={size}", size, lr)
    bptt.method = "bptt"
    rows[name] = (bptt, f"{what} by backprop, fresh Adam", seed)
  return rows


@dataclasses.dataclass(frozen=True)
class Rows:
  """The decomposition's own fields, checked once (`check`): Table 7's lr grid, and per row
  what it stands for, its data kind and its lr grid's centre; the effects and interactions."""
  grid: table7.Grid
  rows: dict  # {row: what it stands for}
  row_data: dict  # {row: "semantic" | "random"}
  row_base_lr: dict  # {row: its lr grid's centre}; else the grid's base
  effects: dict  # {effect: (a, b)}
  interactions: dict  # {name: (effect 1, effect 2)}
  data_dir_random: str

  def data(self, name: str) -> str:
    return self.row_data.get(name, "semantic")

  def base(self, name: str) -> float:
    return self.row_base_lr.get(name, self.grid.base_lr)


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Rows:
  """Every field before anything trains (the runs: `driver.setup`): Table 7's lr grid, the
  rows' data kinds and lr bases, the effects' rows and the interactions' effects."""
  del plan
  grid = table7.check_grid(config)
  planning.check_fields(config, FIELDS)
  methods = list(config.methods)
  for name, kind in config.row_data.items():
    if name not in methods or kind not in DATA_KINDS:
      raise UserError(f"row_data.{name}={kind!r}: a method's data must be one of "
                      f"{', '.join(DATA_KINDS)}; fix: --config.row_data.{name}=semantic")
  for name, lr in config.row_base_lr.items():
    if name not in methods or not planning.positive()[1](lr):
      raise UserError(f"row_base_lr.{name}={lr!r}: a method's lr grid centre must be a "
                      f"finite number > 0; fix: --config.row_base_lr.{name}=0.003")
  for field, of, what in (("effects", methods, "methods"),
                          ("interactions", list(config.effects), "effects")):
    for name, pair in config[field].items():
      if len(pair) != 2 or any(n not in of for n in pair):
        raise UserError(f"{field}.{name}={tuple(pair)!r} must name two {what} of {', '.join(of)}")
  return Rows(grid, {n: config.rows.get(n, "") for n in methods}, dict(config.row_data),
              dict(config.row_base_lr), {k: tuple(v) for k, v in config.effects.items()},
              {k: tuple(v) for k, v in config.interactions.items()}, config.data_dir_random)


def random_data(rows: Rows, plan: planning.StudyPlan, out: str) -> str:
  """The random-shard data dir: data_dir_random (prepared with --assignment=random from the
  same corpus as data_dir), or the built-in corpus's, prepared under OUT/data_random."""
  path = rows.data_dir_random
  if not path:
    if plan.data_dir:
      raise UserError("data_dir is given but data_dir_random is not: soma_random needs the "
                      "same corpus on random shards; fix: python experiments/prepare_data.py "
                      "--assignment=random (same source and settings) --out=DIR, then "
                      "--config.data_dir_random=DIR")
    path = os.path.join(out, "data_random")
    if not os.path.isfile(os.path.join(path, "manifest.json")):
      datasets.prepare_data("pystdlib", 2, path, assignment="random")
  return datasets.check_random(path, 2, "data_dir_random" if rows.data_dir_random else None)


def data(rows: Rows, plan: planning.StudyPlan, specs: dict, out: str) -> base.Data:
  """The semantic shards (`driver.one_dir`), and where a row asks, the random shards and their
  sets (data.extra), scored on the same windows (each routed by its own dir's router)."""
  semantic = driver.one_dir(plan, specs, out)
  if "random" not in rows.row_data.values():
    return semantic
  path = random_data(rows, plan, out)
  return semantic._replace(extra=(path, datasets.random_sets(
      plan.eval, path, [s.seq_len for s in specs.values()], semantic.sets[semantic.main])))


def setup(rows: Rows, plan: planning.StudyPlan, out: str, executor=None) -> base.Setup:
  """The driver's, each seed run checkpointed curve_points times (its curve from
  initialisation, `seed_curve`)."""
  return driver.setup(STUDY, rows, plan, out, executor, checkpoints=plan.curve_points)


# ----------------------------------------------------------------------------- runs


def seed_curve(record: dict, val: eval_lib.TestSet) -> tuple[np.ndarray, np.ndarray]:
  """A seed run's validation curve from its initialisation: (ops_P, per-window losses PxN)
  at its fresh init and each of its checkpoints."""
  spec = record["_spec"]
  init = scores.start_losses(spec, {"validation": val})["validation"]
  keep = [init]
  points, _ = scores.curve(record["_path"], spec, val, 0, float(init.mean()), keep)
  return np.array([p["ops"] for p in points], np.float64), np.stack(keep)


def starts(ready: base.Setup, where: dict, ops_budget: float) -> dict:
  """{(seed, row): (the seed run record the row continues at that optimisation seed, its
  per-window start losses on validation and test)}, each row's start scored once per seed
  run it continues (once per row and seed with own starts, once per row where every seed
  shares one)."""
  plan, got, scored = ready.plan, {}, {}
  for seed in plan.seeds:
    for name, c in ready.methods.items():
      s = training.seed_of(plan, ready.seeds, seed, name)
      if (name, s["_path"]) not in scored:
        first = training.budgeted(c, where[name][0], seed, s, "ops", ops_budget, 1,
                                  fresh=name in plan.fresh_optimizer)
        scored[(name, s["_path"])] = scores.start_losses(
            first, dict(zip(("validation", "test"), where[name][1])))
      got[(seed, name)] = (s, scored[(name, s["_path"])])
  return got


def searches(rows: Rows, ready: base.Setup, where: dict, begun: dict,
             ops_budget: float) -> dict:
  """{(seed, row): its lr search} (`table7.Search`): every row at every optimisation seed,
  budgeted to `ops_budget` operations from that seed's seed run (`begun`: `starts`;
  `fresh_optimizer` rows: its parameters only), on its data (`where[row]` = (data dir,
  (validation, test)))."""
  plan, found = ready.plan, {}
  for seed in plan.seeds:
    for name, c in ready.methods.items():
      s, start_w = begun[(seed, name)]
      spec = training.budgeted(c, where[name][0], seed, s, "ops", ops_budget, plan.curve_points,
                               fresh=name in plan.fresh_optimizer, score=where[name][1][0])
      found[(seed, name)] = table7.Search(
          spec, rows.grid, os.path.join(ready.out, "runs", f"seed{seed}", name),
          f"seed {seed} {name}", {"step": training.start_step(spec, s),
                                  "val": start_w["validation"].mean()},
          base=rows.base(name), scorer=where[name][1][0])
  return found


def row_record(search: table7.Search, test: eval_lib.TestSet, begun: tuple,
               seed_path: tuple[np.ndarray, np.ndarray], out: str) -> dict:
  """One row at one seed, its selected configuration scored on test once: its start (`begun`
  = (seed run record, per-window start losses)), end and gain per split, its validation
  curves (`_curves`: compared phase from its start; from initialisation, the seed run's
  initialisation and checkpoints first, whose loss `init_val_nats_per_byte` and the seed
  run's `val_curve` let results.json recompute it) and the grid."""
  chosen, tried, grid = search.result()
  seed, start_w = begun
  point = (chosen["lr"], chosen["eps"])
  windows = np.stack([start_w["validation"], *search.windows[point]])
  ops = np.array([p["ops"] for p in chosen["val_curve"]], np.float64)
  seed_ops, seed_w = seed_path
  end_test = scores.final_losses(chosen["workdir"], search.spec, test)
  ends = {"validation": windows[-1], "test": end_test}
  return {"seed": search.spec.config.seed, "start": training.start_of(seed),
          "init_val_nats_per_byte": float(seed_w[0].mean()), "lr": chosen["lr"],
          "eps": chosen["eps"], **grid, "updates": chosen["updates"], "ops": chosen["ops"],
          **statistics.row_losses(start_w, ends), "val_curve": chosen["val_curve"],
          "configurations": [{"lr": r["lr"], "eps": r["eps"], "workdir": planning.shown(
              r["workdir"], out), "val_nats_per_byte": r["val_nats_per_byte"]} for r in tried],
          "_curves": {"compared": (ops, windows),
                      "from_init": (np.concatenate([seed_ops, seed_ops[-1] + ops[1:]]),
                                    np.concatenate([seed_w, windows[1:]]))},
          "_test_w": end_test, "_start_w": start_w}


def describe(name: str, spec, rows: Rows, plan: planning.StudyPlan, seed: dict) -> dict:
  """A row's settings (its per_seed records follow); `start`: the seed checkpoint every seed
  continues (`seed`), or with own starts a pointer to each per_seed record's."""
  fresh = name in plan.fresh_optimizer
  return {"method": spec.method.name, "gradient": spec.method.describe["gradient"],
          "what": rows.rows[name], "n_experts": spec.n_experts, "d_t": spec.config.model.d_t,
          "params": spec.method.ensemble_params, "ops_per_update": spec.total_ops_per_update,
          "data": rows.data(name), "optimizer_state": ("fresh (the seed's parameters only)"
                                                       if fresh else "the seed's, continued"),
          "seed_run": plan.start[name], "start": ("each seed's own (per_seed start)"
                                                  if plan.own_starts else training.start_of(seed)),
          "lr_base": rows.base(name), "per_seed": []}


def stages(rows: Rows, ready: base.Setup) -> base.Stages:
  """Each row's description and start losses at each seed's seed run (`starts`), every row
  at every seed searched on its lr grid (`table7.searching`), each selected run scored on
  test once; OUT/curves.png (`plot`: the per-window curves stay out of results.json); the
  rows."""
  plan, out, val = ready.plan, ready.out, ready.scored[0]
  kinds = {"semantic": (ready.data_dir, ready.scored), "random": ready.data.extra}
  where = {name: kinds[rows.data(name)] for name in ready.methods}  # (dir, (val, test))
  budget = _ops_budget(ready)
  begun = starts(ready, where, budget)
  runs = {s["_path"]: s for s, _ in begun.values()}
  seed_paths = {path: seed_curve(s, val) for path, s in runs.items()}
  described = {name: describe(name, ready.specs[name], rows, plan, begun[(plan.seeds[0], name)][0])
               for name in ready.methods}
  found = searches(rows, ready, where, begun, budget)
  yield from table7.searching(list(found.values()), val)
  for (seed, name), search in found.items():
    s = begun[(seed, name)]
    described[name]["per_seed"].append(row_record(search, where[name][1][1], s,
                                                  seed_paths[s[0]["_path"]], out))
  plot(described, os.path.join(out, "curves.png"))
  return described


def _ops_budget(ready: base.Setup) -> float:
  """Every row's budget: `budget` of the reference's updates, in operations."""
  return ready.plan.budget * ready.ops[ready.plan.reference]


def measure(rows: Rows, ready: base.Setup, described: dict) -> dict:
  """Each row across seeds, the effects and the interactions."""
  plan = ready.plan
  for r in described.values():
    per = r["per_seed"]  # the seeds' mean start: each seed's own, or the one they share
    r["start_loss"] = {k: float(np.mean([p["start_loss"][k] for p in per]))
                       for k in ("validation", "test")}
    for key in ("gain", "end_loss"):
      r[key] = {s: statistics.t_interval([p[key][s] for p in per]) for s in ("validation", "test")}
    r["updates"] = statistics.across_seeds([p["updates"] for p in per])
  effects = {k: statistics.effect(described, a, b, ready.scored, plan.bootstrap_draws)
             for k, (a, b) in rows.effects.items()}
  inter = {k: statistics.interaction(effects[e1], effects[e2])
           for k, (e1, e2) in rows.interactions.items()}
  random = ready.data.extra
  return {"budget": {"unit": "ops", "amount": _ops_budget(ready), "per": "row and seed",
                     "reference_updates": plan.budget, "seed_updates": plan.seed_updates,
                     "ops_per_update": ready.ops},
          "intervals": planning.interval_kind(plan),
          "rows": results.public(described), "effects": results.public(effects),
          "interactions": results.public(inter), "how": HOW,
          "tuning": {**rows.grid.record(), "row_base_lr": rows.row_base_lr},
          "data_dir_random": planning.shown(random[0], ready.out) if random else None}


HOW = ("effects: a against b per seed (a's gain minus b's, test; b's end loss minus a's, test; "
       "log of b's operations over a's across the common validation loss range of their curves: "
       "compared = each from its own start, from_init = from initialisation with the seed runs' "
       "operations and checkpoints first), across seeds: mean +- t_{0.975, S-1} * sqrt(sd^2 / S "
       "+ document_sd^2), document_sd the document-bootstrap sd of the seed mean (test documents "
       "for gains and end losses, validation documents for speed-ups, the same draw for every "
       "seed and both rows); interactions: effect 1 minus effect 2 per seed, the same way")


STUDY = base.Study(name="decompose",
                   spec=SPEC, config=config, check=check, stages=stages, measure=measure,
                   table=table, ops_tolerance=base.any_ops, data=data, setup=setup,
                   plot=figures)
