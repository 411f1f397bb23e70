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
under SPSA" from sharding.

Protocol (`protocol`, SPEC 9.6): every row continues the seed run of its architecture (SPSA
rows with the seed's whole state, `fresh_optimizer` rows with its parameters only); the
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
sharding: sharding under SPSA minus sharding under backprop).
"""

from __future__ import annotations

import csv
import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.studies import (
  datasets,
  planning,
  recipes,
  report,
  results,
  scores,
  statistics,
  table7,
  training,
)

SPEC = "SPEC 9.8 (the decomposition: sharding under SPSA and backprop, random shards, summed loss)"
DATA_KINDS = ("semantic", "random")  # row_data values: the data dir a row trains and is scored on


# ----------------------------------------------------------------------------- checks


FIELDS = {"data_dir_random": ("a string", lambda v: isinstance(v, str))}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=decompose (SPEC 9.8): where SOMA's lead comes from. Table 7's seeds, scoring and
  statistics; every row at the operations of `budget` of SOMA's updates, each with its own
  lr grid (no eps stage), selection on validation.

    python experiments/compare.py --config=experiments/configs/compare.py:study=decompose,size=cpu --out=runs/decompose
    ...:study=decompose,size=cpu,seeds=5   (the headline's seed count)
  """
  a = recipes.args(arg, seeds=0)
  size, cpu = a["size"], a["size"] == "cpu"
  c = recipes.pair(a["study"], size)
  c.seeds = a["seeds"] or (3 if cpu else 2)
  # One lr grid per row around its own centre (row_base_lr, else base_lr), grown past an
  # edge at most lr_extend times; eps stays at base_lr (Table 7's eps stage moved the selected
  # validation loss by 0.0026 at most, its lr grid by 0.068 to 0.159).
  c.lr_factors = (0.5, 1.0, 2.0)
  c.lr_extend = 2 if cpu else 0  # tiny: the grid alone (the tests check rows, not the search)
  c.eps_factors, c.eps_extend = (1.0,), 0
  rows = _config_rows(c.methods.soma_n2, c.methods.mono, size, c.base_lr)
  recipes.rows(c, rows)
  c.reference = "soma"
  c.order = tuple(rows)
  c.keep_width = ("one_expert",)  # at SOMA's expert width; the others match SOMA's params
  c.fresh_optimizer = ("soma_bptt", "mono_bptt")  # the SPSA seed's parameters, fresh Adam
  c.row_base_lr = ml_collections.ConfigDict({"soma_bptt": 3e-3, "mono_bptt": 3e-3})  # bptt.py's
  c.row_data = ml_collections.ConfigDict({"soma_random": "random"})  # else the semantic shards
  c.data_dir_random = ""  # prepared with --assignment=random; "" = the built-in one under OUT
  c.effects = ml_collections.ConfigDict({  # name: (a, b), read as a against b
      "sharding_spsa": ("soma", "mono"), "sharding_bptt": ("soma_bptt", "mono_bptt"),
      "semantic_vs_random": ("soma", "soma_random"),
      "independent_vs_summed": ("soma", "soma_summed"),
      "sharding_at_width": ("soma", "one_expert"), "narrow_vs_wide": ("one_expert", "mono")})
  # name: (effect 1, effect 2), effect 1 minus effect 2: the zero-order-specific part
  c.interactions = ml_collections.ConfigDict({"interaction": ("sharding_spsa", "sharding_bptt")})
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
  for name, n, seed in (("soma_bptt", 2, "soma_expert"), ("mono_bptt", 1, "monolith")):
    bptt = recipes.recipe("bptt.py", f"n={n},size={size}", size, lr)
    bptt.method = "bptt"
    what = "SOMA N = 2" if n == 2 else "the monolith"
    rows[name] = (bptt, f"{what} by backprop, fresh Adam", seed)
  return rows


@dataclasses.dataclass(frozen=True)
class Study:
  """The decomposition's fields, checked once (`check`): Table 7's plan and grid, each row's
  training config (`methods`, the study's config space) and resolved run at the first seed
  (`specs`), and per row what it stands for, its data kind and its lr grid's centre."""
  plan: planning.StudyPlan
  grid: table7.Grid
  methods: dict
  specs: dict
  rows: dict  # {row: what it stands for}
  row_data: dict  # {row: "semantic" | "random"}
  row_base_lr: dict  # {row: its lr grid's centre}; else the grid's base
  effects: dict  # {effect: (a, b)}
  interactions: dict  # {name: (effect 1, effect 2)}
  data_dir_random: str

  def data(self, name: str) -> str:
    return self.row_data.get(name, "semantic")

  def base(self, name: str) -> float:
    return self.row_base_lr.get(name, self.plan.base_lr)


def check(config: ml_collections.ConfigDict) -> Study:
  """Every field and run before anything trains: Table 7's plan and lr grid, the rows' data
  kinds and lr bases, the effects' rows and the interactions' effects."""
  plan = planning.check_plan(config)
  grid = table7.check_grid(config)
  planning.check_fields(config, FIELDS)
  methods = planning.sized(config)
  for name, kind in config.row_data.items():
    if name not in methods or kind not in DATA_KINDS:
      raise UserError(f"row_data.{name}={kind!r}: a method's data must be one of "
                      f"{', '.join(DATA_KINDS)}; fix: --config.row_data.{name}=semantic")
  for name, base in config.row_base_lr.items():
    if name not in methods or not planning.positive()[1](base):
      raise UserError(f"row_base_lr.{name}={base!r}: a method's lr grid centre must be a "
                      f"finite number > 0; fix: --config.row_base_lr.{name}=0.003")
  for effect, pair in config.effects.items():
    if len(pair) != 2 or any(n not in methods for n in pair):
      raise UserError(f"effects.{effect}={tuple(pair)!r} must name two methods of "
                      f"{', '.join(methods)}; fix: --config.effects.{effect}='(\"soma\", \"mono\")'")
  for name, pair in config.interactions.items():
    if len(pair) != 2 or any(e not in config.effects for e in pair):
      raise UserError(f"interactions.{name}={tuple(pair)!r} must name two effects of "
                      f"{', '.join(config.effects)}")
  return Study(plan, grid, methods, training.check_runs(plan, methods),
               {n: config.rows.get(n, "") for n in methods}, dict(config.row_data),
               dict(config.row_base_lr), {k: tuple(v) for k, v in config.effects.items()},
               {k: tuple(v) for k, v in config.interactions.items()}, config.data_dir_random)


def random_data(study: Study, out: str) -> str:
  """The random-shard data dir: data_dir_random (prepared with --assignment=random from the
  same corpus as data_dir), or the built-in corpus's, prepared under OUT/data_random."""
  path = study.data_dir_random
  if not path:
    if study.plan.data_dir:
      raise UserError("data_dir is given but data_dir_random is not: soma_random needs the "
                      "same corpus on random shards; fix: python experiments/prepare_data.py "
                      "--assignment=random (same source and settings) --out=DIR, then "
                      "--config.data_dir_random=DIR")
    path = os.path.join(out, "data_random")
    if not os.path.isfile(os.path.join(path, "manifest.json")):
      datasets.prepare_data("pystdlib", 2, path, assignment="random")
  datasets.check_data(path, 2, "data_dir_random" if study.data_dir_random else None)
  kind = pipeline.load_manifest(path).get("assignment", {})
  if not (isinstance(kind, dict) and kind.get("kind") == "random"):
    raise UserError(f"data_dir_random={path!r} was not prepared with --assignment=random; fix: "
                    "prepare it so, from the same corpus as data_dir")
  return path


def same_windows(a: eval_lib.TestSet, b: eval_lib.TestSet, what: str) -> None:
  """The random-shard rows are scored on the semantic rows' windows, or not compared."""
  if a.windows.shape != b.windows.shape or not np.array_equal(a.windows, b.windows):
    raise UserError(f"the random-shard data's {what} windows differ from data_dir's: the "
                    "rows would be scored on other text; fix: prepare data_dir_random from the "
                    "same corpus and settings as data_dir (only --assignment differs)")


# ----------------------------------------------------------------------------- runs


def seed_curve(record: dict, val: eval_lib.TestSet) -> tuple[np.ndarray, np.ndarray]:
  """A seed run's validation curve from its initialisation: (ops_P, per-window losses PxN)
  at its fresh init and each of its checkpoints."""
  spec = record["_spec"]
  init = scores.start_losses(spec, {"validation": val})["validation"]
  keep = [init]
  points, _ = scores.curve(record["_path"], spec, val, 0, float(init.mean()), keep)
  return np.array([p["ops"] for p in points], np.float64), np.stack(keep)


def searches(study: Study, where: dict, seeds: dict, starts: dict, ops_budget: float,
             out: str) -> dict:
  """{(seed, row): its lr search} (`table7.Search`): every row at every optimisation seed,
  budgeted to `ops_budget` operations from its seed run (`fresh_optimizer` rows: its
  parameters only), on its data (`where[row]` = (data dir, (validation, test)))."""
  plan, out_searches = study.plan, {}
  for seed in plan.seeds:
    for name, c in study.methods.items():
      s = seeds[plan.start[name]]
      spec = training.budgeted(c, where[name][0], seed, s, "ops", ops_budget, plan.curve_points,
                               fresh=name in plan.fresh_optimizer, score=where[name][1][0])
      out_searches[(seed, name)] = table7.Search(
          spec, study.grid, os.path.join(out, "runs", f"seed{seed}", name),
          f"seed {seed} {name}",
          {"step": training.start_step(spec, s), "val": starts[name]["validation"].mean()},
          base=study.base(name), scorer=where[name][1][0])
  return out_searches


def row_record(search: table7.Search, test: eval_lib.TestSet, start_w: dict,
               seed_path: tuple[np.ndarray, np.ndarray], out: str) -> dict:
  """One row at one seed, its selected configuration scored on test once: start, end and
  gain per split, its validation curves (`_curves`: compared phase from its start; from
  initialisation, the seed run first) and the grid."""
  chosen, tried, grid = search.result()
  point = (chosen["lr"], chosen["eps"])
  windows = np.stack([start_w["validation"], *search.windows[point]])
  ops = np.array([p["ops"] for p in chosen["val_curve"]], np.float64)
  seed_ops, seed_w = seed_path
  end_test = scores.final_losses(chosen["workdir"], search.spec, test)
  ends = {"validation": windows[-1], "test": end_test}
  return {"seed": search.spec.config.seed, "lr": chosen["lr"], "eps": chosen["eps"], **grid,
          "updates": chosen["updates"], "ops": chosen["ops"],
          **statistics.row_losses(start_w, ends), "val_curve": chosen["val_curve"],
          "configurations": [{"lr": r["lr"], "eps": r["eps"], "workdir": planning.shown(
              r["workdir"], out), "val_nats_per_byte": r["val_nats_per_byte"]} for r in tried],
          "_curves": {"compared": (ops, windows),
                      "from_init": (np.concatenate([seed_ops, seed_ops[-1] + ops[1:]]),
                                    np.concatenate([seed_w, windows[1:]]))},
          "_test_w": end_test}


def describe(name: str, spec, study: Study, seed: dict) -> dict:
  return {"method": spec.method.name, "gradient": spec.method.describe["gradient"],
          "what": study.rows[name],
          "n_experts": spec.n_experts, "d_t": spec.config.model.d_t,
          "params": spec.method.ensemble_params, "ops_per_update": spec.total_ops_per_update,
          "data": study.data(name),
          "optimizer_state": ("fresh (the seed's parameters only)"
                              if name in study.plan.fresh_optimizer else "the seed's, continued"),
          "start": training.start_of(seed), "lr_base": study.base(name), "per_seed": []}


# ----------------------------------------------------------------------------- effects


def effect(rows: dict, a: str, b: str, scored: tuple, draws: int) -> dict:
  """a against b over the seeds both ran: a's gain minus b's (test, `gain_difference`), b's
  end loss minus a's (test), and a's log matched-loss speed-up over b on validation, in the
  compared phase and from initialisation (`speedup_effect`)."""
  val, test = scored
  ra, rb = rows[a]["per_seed"], rows[b]["per_seed"]
  start = lambda r: r["_start_w"]["test"]
  gains_w = [(start(rows[a]) - x["_test_w"], start(rows[b]) - y["_test_w"])
             for x, y in zip(ra, rb, strict=True)]
  end_w = np.stack([y["_test_w"] - x["_test_w"] for x, y in zip(ra, rb, strict=True)])
  gain = statistics.gain_difference(ra, rb, gains_w, test.doc_ids, draws)
  gain_w = np.stack([np.asarray(g, np.float64) - np.asarray(h, np.float64) for g, h in gains_w])
  pairs = [(x["_curves"], y["_curves"]) for x, y in zip(ra, rb, strict=True)]
  sp_draws = min(draws, statistics.SPEEDUP_DRAWS)
  out = {"a": a, "b": b,
         "gain_difference": {**gain, "_windows": gain_w},
         "end_loss_difference": {**statistics.difference_effect(
             [float(w.mean()) for w in end_w], end_w, test.doc_ids, draws, 0), "_windows": end_w},
         "log_speedup": {k: statistics.speedup_effect(pairs, val.doc_ids, sp_draws, k)
                         for k in ("compared", "from_init")},
         "_doc_ids": test.doc_ids, "_draws": draws}
  return out


def interaction(e1: dict, e2: dict) -> dict:
  """e1 minus e2 per seed on the gain difference, the end-loss difference and both log
  speed-ups (the zero-order-specific part, for sharding under SPSA minus under backprop)."""
  out = {"of": [f"{e1['a']} vs {e1['b']}", f"{e2['a']} vs {e2['b']}"]}
  for key in ("gain_difference", "end_loss_difference"):
    w = e1[key]["_windows"] - e2[key]["_windows"]
    out[key] = statistics.difference_effect([float(x) for x in w.mean(axis=1)], w, e1["_doc_ids"],
                                 e1["_draws"], 0)
  out["log_speedup"] = {k: statistics.interaction_effect(e1["log_speedup"], e2["log_speedup"], k)
                        for k in ("compared", "from_init")}
  return out


# ----------------------------------------------------------------------------- the study


def _prepare(study: Study, out: str) -> dict:
  """{row: (data dir, (validation, test))}: semantic rows on data_dir, random-shard rows on
  the random-shard dir, scored on the same windows (each routed by its own dir's router)."""
  dirs = {"semantic": datasets.ensure_data(study.plan.data_dir, out, 2)}
  seq = [s.seq_len for s in study.specs.values()]
  if "random" in study.row_data.values():
    dirs["random"] = random_data(study, out)
  scored = {k: datasets.eval_sets(study.plan.eval, d, seq) for k, d in dirs.items()}
  for k in dirs:
    for what, a, b in zip(("validation", "test"), scored["semantic"], scored[k], strict=True):
      same_windows(a, b, what)
  return {name: (dirs[study.data(name)], scored[study.data(name)]) for name in study.specs}


def _rows(study: Study, where: dict, seeds: dict, ops_budget: float) -> dict:
  """Each row's description and start losses (`_start_w`, at its first optimisation seed's
  budgeted run: every seed continues the same seed run, so they share the start)."""
  plan, rows = study.plan, {}
  for name, c in study.methods.items():
    s = seeds[plan.start[name]]
    first = training.budgeted(c, where[name][0], plan.seeds[0], s, "ops", ops_budget, 1,
                              fresh=name in plan.fresh_optimizer)
    v, t = where[name][1]
    start_w = scores.start_losses(first, {"validation": v, "test": t})
    rows[name] = {**describe(name, first, study, s), "_start_w": start_w}
  return rows


def run(config: ml_collections.ConfigDict, out: str, command: str = "", executor=None) -> dict:
  """Seeds, then every row at every optimisation seed searched on its lr grid (each stage by
  `executor`); the effects; OUT/results.json, table.md, effects.csv and curves.png."""
  begun = results.started(executor)
  os.makedirs(out, exist_ok=True)
  study = check(config)
  plan, specs, ref = study.plan, study.specs, study.plan.reference
  ops_budget = plan.budget * specs[ref].total_ops_per_update
  where = _prepare(study, out)
  val, test = where[ref][1]
  seeds = training.train_seeds(plan, study.methods, where[ref][0], out, val, executor,
                               checkpoints=plan.curve_points)
  seed_paths = {name: seed_curve(r, val) for name, r in seeds.items()}
  rows = _rows(study, where, seeds, ops_budget)
  starts = {name: r["_start_w"] for name, r in rows.items()}
  found = searches(study, where, seeds, starts, ops_budget, out)
  table7.run_searches(list(found.values()), val, executor)
  for (_, name), search in found.items():
    rows[name]["per_seed"].append(row_record(search, where[name][1][1], starts[name],
                                             seed_paths[plan.start[name]], out))
  for r in rows.values():
    _aggregate(r)
  effects = {k: effect(rows, a, b, (val, test), plan.bootstrap_draws)
             for k, (a, b) in study.effects.items()}
  inter = {k: interaction(effects[e1], effects[e2]) for k, (e1, e2) in study.interactions.items()}
  payload = results.results(
      "decompose", SPEC, plan, command, begun,
      {"unit": "ops", "amount": ops_budget, "per": "row and seed",
       "reference_updates": plan.budget, "seed_updates": plan.seed_updates,
       "ops_per_update": {n: s.total_ops_per_update for n, s in specs.items()}},
      (val, test), where[ref][0], out, seeds, rows=results.public(rows),
      effects=results.public(effects), interactions=results.public(inter), how=HOW,
      tuning={**study.grid.record(), "row_base_lr": study.row_base_lr})
  random = [where[n][0] for n in study.specs if study.data(n) == "random"]
  payload["data_dir_random"] = planning.shown(random[0], out) if random else None
  write_effects_csv(payload, os.path.join(out, "effects.csv"))
  plot(rows, os.path.join(out, "curves.png"))
  return results.write(out, payload, table)


HOW = ("effects: a against b per seed (a's gain minus b's, test; b's end loss minus a's, test; "
       "log of b's operations over a's across the common validation loss range of their curves: "
       "compared = each from its own start, from_init = from initialisation with the seed runs' "
       "operations and checkpoints first), across seeds: mean +- t_{0.975, S-1} * sqrt(sd^2 / S "
       "+ document_sd^2), document_sd the document-bootstrap sd of the seed mean (test documents "
       "for gains and end losses, validation documents for speed-ups, the same draw for every "
       "seed and both rows); interactions: effect 1 minus effect 2 per seed, the same way")


def _aggregate(r: dict) -> None:
  per = r["per_seed"]
  r["start_loss"] = per[0]["start_loss"]
  r["gain"] = {s: statistics.t_interval([p["gain"][s] for p in per]) for s in ("validation", "test")}
  r["end_loss"] = {s: statistics.t_interval([p["end_loss"][s] for p in per])
                   for s in ("validation", "test")}
  r["updates"] = statistics.across_seeds([p["updates"] for p in per])


# ----------------------------------------------------------------------------- output


def _ci(stat: dict, digits: int = 4) -> str:
  return "-" if stat.get("mean") is None else results.ci(stat, digits)


def _both(stat: dict, digits: int = 4) -> str:
  """Mean [seeds-and-documents interval] of a gain difference (its own `seeds_and_documents`)."""
  ci95 = stat.get("seeds_and_documents", {}).get("ci95")
  return results.ci({"mean": stat["mean"], "ci95": ci95}, digits)


def _speed(stat: dict) -> str:
  if stat.get("mean") is None:
    return "- (no common range)"
  lo, hi = stat["speedup_ci95"] or (None, None)
  return f"{stat['speedup']:.2f}x" + ("" if lo is None else f" [{lo:.2f}, {hi:.2f}]")


def table(p: dict) -> str:
  """Markdown: the rows (start, end, gain), the effects with their intervals, the
  interactions."""
  b, ev = p["budget"], p["eval"]
  lines = [
      f"Decomposition ({p['spec']}): every row from its seed run, {b['amount']:.4g} operations "
      f"per row and seed ({b['reference_updates']:g} of {p['reference']}'s updates), lr searched "
      f"per row and seed on validation, test once. {len(p['seeds'])} seeds; evaluation: route "
      f"{ev['route_bytes']} bytes, score {ev['score_bytes']}, {ev['val_windows']} validation "
      f"pieces from {ev['val_documents']} documents, {ev['test_windows']} test pieces from "
      f"{ev['test_documents']} documents. " + results.load_line(p), "",
      "| row | what | N x d_t | optimizer state | updates | test start → end | test gain [95% t] |",
      "|---|---|---|---|---|---|---|"]
  for name, r in p["rows"].items():
    lines.append(f"| {name} | {r['what']} | {r['n_experts']} x {r['d_t']} | "
                 f"{r['optimizer_state']} | {r['updates']['mean']:.0f} | "
                 f"{r['start_loss']['test']:.4f} → {r['end_loss']['test']['mean']:.4f} | "
                 f"{_ci(r['gain']['test'])} |")
  lines += ["", "| effect | a vs b | a's gain − b's (test) | b's end − a's (test) | speed-up of a, "
            "compared phase | speed-up of a, from init |", "|---|---|---|---|---|---|"]
  for name, e in p["effects"].items():
    sp = e["log_speedup"]
    lines.append(f"| {name} | {e['a']} vs {e['b']} | {_both(e['gain_difference'])} | "
                 f"{_ci(e['end_loss_difference'])} | {_speed(sp['compared'])} | "
                 f"{_speed(sp['from_init'])} |")
  for name, x in p["interactions"].items():
    sp = x["log_speedup"]
    lines += ["", f"**{name}** ({x['of'][0]} minus {x['of'][1]}): gain difference "
              f"{_ci(x['gain_difference'])}, end-loss difference "
              f"{_ci(x['end_loss_difference'])}, log speed-up compared "
              f"{_ci(sp['compared'], 3)}, from init {_ci(sp['from_init'], 3)}."]
  lines += ["", "Intervals: seeds and documents (" + p["how"] + ")."]
  return "\n".join(lines) + "\n"


def write_effects_csv(p: dict, path: str) -> None:
  """One line per effect and interaction: each readout's mean and interval."""
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["effect", "a", "b", "readout", "mean", "ci95_lo", "ci95_hi"])
    for kind in ("effects", "interactions"):
      for name, e in p[kind].items():
        a, b = (e["a"], e["b"]) if kind == "effects" else e["of"]
        stats = {"gain_difference": e["gain_difference"],
                 "end_loss_difference": e["end_loss_difference"],
                 **{f"log_speedup_{k}": v for k, v in e["log_speedup"].items()}}
        for readout, s in stats.items():
          ci95 = (s.get("seeds_and_documents", {}).get("ci95") if readout == "gain_difference"
                  and kind == "effects" else s.get("ci95")) or (None, None)
          w.writerow([name, a, b, readout, s.get("mean"), *ci95])


def plot(rows: dict, path: str) -> None:
  """Left: validation loss against operations from initialisation, every row (seed mean).
  Right: the compared phase of the zero-order rows alone, each from its own start (the
  backprop rows fall by ten times as much and would flatten them)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
  for i, (name, r) in enumerate(rows.items()):
    color = f"C{i % 10}"
    for axis, key in ((ax, "from_init"), (bx, "compared")):
      if axis is bx and r["gradient"] != "zero-order":
        continue
      curves = [x["_curves"][key] for x in r["per_seed"]]
      loss = np.mean([w.mean(axis=1) for _, w in curves], axis=0)
      axis.plot(curves[0][0], loss, marker="o", ms=3, label=name, color=color)
  ax.set_xscale("symlog", linthresh=1e9)
  ax.set_xlabel("training operations from initialisation (seed run included)")
  bx.set_xlabel("training operations in the compared phase")
  bx.set_title("zero-order rows, compared phase", fontsize=9)
  for axis in (ax, bx):
    axis.set_ylabel("ensemble-validation loss (nats/byte)")
    axis.legend(fontsize=8)
  report.save_figure(fig, path)
