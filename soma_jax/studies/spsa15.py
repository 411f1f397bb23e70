"""1.5-SPSA against SPSA (issue 56, docs/spsa15.md): does the curvature-scaled estimate help
SOMA N = 2, does it help the monolith of the same size more, and does SOMA against the
monolith keep its sign under it.

Both stages run `decompose`'s protocol (SPEC 9.6, 9.8): every row continues its own
architecture's seed run (every optimisation seed its own start), all rows at the operations
of `budget` of the reference's updates (1.5-SPSA's clean forwards counted, so it gets
2K / (2K + 1) of SPSA's updates), each row and seed on its own lr grid, selection on
ensemble validation, test once.

1. alpha (`alpha_seed` only): every row of `alpha_rows` (method soma15, whose alpha is its
   config.spsa15.alpha) at each alpha of `alphas`, as rows NAME_aALPHA beside the reference;
   each row keeps the alpha whose selected run ends lowest on validation.
2. the comparison: every row at every seed, the `alpha_rows` at their chosen alpha. The
   stages share OUT (seed runs, and the reference's runs at `alpha_seed`, are trained once);
   OUT/alpha_stage.json keeps the alpha stage's own results.

The primary readout, declared in the config (`primary`): the test end-loss differences of
those effects and interactions at the budget, seeds and documents in their intervals; each
gets a computed verdict (`verdict`). Everything else decompose prints is secondary. `STUDY`
runs through the driver (`driver.run`): decompose's setup, then both stages as its `stages`.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  decompose,
  decompose_report,
  driver,
  planning,
  recipes,
  results,
  training,
)

SPEC = "issue 56 (1.5-SPSA against SPSA, on the decomposition's protocol of SPEC 9.8)"

FIELDS = {
    "alphas": ("a non-empty tuple of finite numbers >= 0", lambda v: (
        isinstance(v, tuple | list) and len(v) > 0
        and all(planning.positive(strict=False)[1](x) for x in v))),
    "alpha_seed": planning.whole(0),
}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=spsa15 (issue 56, docs/spsa15.md): SOMA N = 2 and the monolith of the same total
  size, each by SPSA and by 1.5-SPSA (method=soma15), every row at the operations of `budget`
  of SOMA's updates from its own seed run, each on its own lr grid (no eps stage); alpha in
  `alphas` chosen per 1.5-SPSA row on seed `alpha_seed`, then fixed.

    python experiments/compare.py --config=experiments/configs/compare.py:study=spsa15,size=cpu --out=runs/spsa15
  """
  a = recipes.args(arg, seeds=0)
  cpu = a["size"] == "cpu"
  c = recipes.pair(a["study"], a["size"])
  c.seeds = a["seeds"] or (5 if cpu else 2)
  c.lr_factors = (0.5, 1.0, 2.0)  # one grid per row and seed around base_lr, grown past an
  c.lr_extend = 2 if cpu else 0  # edge at most lr_extend times (tiny: the grid alone)
  c.eps_factors, c.eps_extend = (1.0,), 0
  rows = {"soma": (c.methods.soma_n2, "SOMA N = 2 by SPSA", "soma_expert"),
          "mono": (c.methods.mono, "the monolith of the same total size by SPSA", "monolith")}
  for name, (cfg, what, seed) in list(rows.items()):
    curved = recipes.copy(cfg)
    curved.method = "soma15"  # the same run with 1.5-SPSA's estimate (spsa15.alpha, .lam)
    rows[name + "15"] = (curved, what.replace("by SPSA", "by 1.5-SPSA"), seed)
  recipes.rows(c, rows)
  c.reference, c.order = "soma", tuple(rows)
  c.keep_width, c.fresh_optimizer = (), ()
  c.own_starts = True  # seed s continues its own seed runs, trained at seed_run_seed + s
  c.row_base_lr, c.row_data = ml_collections.ConfigDict(), ml_collections.ConfigDict()
  c.data_dir_random = ""
  c.alphas = (0.1, 0.3)  # 1.5-SPSA's exponent, chosen per row on alpha_seed by validation
  c.alpha_seed = c.first_seed
  c.alpha_rows = ("soma15", "mono15")
  c.effects = ml_collections.ConfigDict({  # name: (a, b), read as a against b
      "spsa15_on_soma": ("soma15", "soma"), "spsa15_on_mono": ("mono15", "mono"),
      "sharding_spsa": ("soma", "mono"), "sharding_spsa15": ("soma15", "mono15")})
  # effect 1 minus effect 2: > 0 where 1.5-SPSA helps the monolith more than SOMA
  c.interactions = ml_collections.ConfigDict(
      {"helps_mono_more": ("spsa15_on_mono", "spsa15_on_soma")})
  # The primary readouts, declared before anything trains: test end loss at the budget of
  # these effects / interactions (does it help SOMA; the monolith more; SOMA's sign under it)
  c.primary = ("spsa15_on_soma", "helps_mono_more", "sharding_spsa15")
  # Does SOMA against the monolith keep its sign from SPSA to 1.5-SPSA (both intervals)?
  c.sign_kept = ("sharding_spsa", "sharding_spsa15")
  return c


def _alpha_name(row: str, alpha: float) -> str:
  return f"{row}_a{alpha:g}".replace(".", "p")


@dataclasses.dataclass(frozen=True)
class Alphas:
  """The study's own fields (`check`): both stages' rows, the alpha stage's plan, readouts."""
  rows: decompose.Rows  # the comparison's
  stage1: decompose.Rows  # the alpha stage's (`_config_alpha_stage`)
  stage1_plan: planning.StudyPlan
  searched: tuple[str, ...]  # alpha_rows
  alphas: tuple
  seed: int  # alpha_seed
  primary: tuple[str, ...]
  sign_kept: tuple[str, str]


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Alphas:
  """The study's own fields, then both stages' decompose fields and the alpha stage's runs
  checked before anything trains (the comparison's runs: `driver.preparing`)."""
  planning.check_fields(config, FIELDS)
  for row in config.alpha_rows:
    if row not in config.methods:
      raise UserError(f"alpha_rows names {row!r}, which is not a row of "
                      f"{', '.join(config.methods)}; fix: --config.alpha_rows='(\"soma15\",)'")
  if config.alpha_seed not in plan.seeds:
    raise UserError(f"alpha_seed={config.alpha_seed} is not one of the study's seeds; fix: "
                    f"--config.alpha_seed={config.first_seed}")
  if len(config.sign_kept) != 2 or any(e not in config.effects for e in config.sign_kept):
    raise UserError(f"sign_kept={tuple(config.sign_kept)!r} must name two effects of "
                    f"{', '.join(config.effects)}")
  for p in config.primary:
    if p not in config.effects and p not in config.interactions:
      raise UserError(f"primary names {p!r}, which is no effect or interaction; fix: one of "
                      f"{', '.join([*config.effects, *config.interactions])}")
  rows = decompose.check(plan, config)
  first = _config_alpha_stage(config)
  first_plan, first_rows = driver.checked(decompose.STUDY, first)
  training.check_runs(first_plan, planning.sized(first))
  return Alphas(rows, first_rows, first_plan, tuple(config.alpha_rows), tuple(config.alphas),
                config.alpha_seed, tuple(config.primary), tuple(config.sign_kept))


def _config_alpha_stage(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The alpha stage: the reference and each alpha row at each alpha, on alpha_seed only."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.seeds, c.first_seed = 1, config.alpha_seed
  ref = config.reference
  keep = {ref: (config.methods[ref], config.rows[ref], config.start[ref])}
  for row in config.alpha_rows:
    for alpha in config.alphas:
      m = recipes.copy(config.methods[row])
      m.spsa15.alpha = float(alpha)
      keep[_alpha_name(row, alpha)] = (m, f"{config.rows[row]}, alpha {alpha:g}",
                                       config.start[row])
  recipes.rows(c, keep)
  c.order = tuple(keep)
  c.effects, c.interactions = ml_collections.ConfigDict(), ml_collections.ConfigDict()
  c.row_base_lr = ml_collections.ConfigDict(
      {n: config.row_base_lr[r] for r in config.row_base_lr for n in keep
       if n == r or n.startswith(f"{r}_a")})
  c.keep_width = tuple(n for n in config.get("keep_width", ()) if n in keep)
  c.fresh_optimizer = tuple(n for n in config.get("fresh_optimizer", ()) if n in keep)
  return c


def _rows_at(ready: base.Setup, plan: planning.StudyPlan, methods: dict) -> base.Setup:
  """`ready` (the same data and seed runs) for other rows: each resolved, its cost printed."""
  specs = training.check_runs(plan, methods)
  return ready._replace(plan=plan, methods=methods, specs=specs,
                        ops=planning.check_equal_ops(specs, 1.0, plan.unit))


def stages(g: Alphas, ready: base.Setup) -> base.Stages:
  """The alpha stage (decompose's stages on alpha_seed; OUT/alpha_stage.json, its command in
  results.json), then the comparison with each alpha row at its chosen alpha; (the choice,
  the comparison's Setup, its rows)."""
  begun, plan = results.started(), g.stage1_plan
  first = _rows_at(ready, plan, planning.sized(plan.config))
  fields = decompose.measure(g.stage1, first, (yield from decompose.stages(g.stage1, first)))
  results.dump_json(os.path.join(ready.out, "alpha_stage.json"), results.results(
      plan.config.study, decompose.STUDY.spec, plan, "", begun, fields.pop("budget"),
      ready.scored, ready.data_dir, ready.out, ready.seeds, **fields))
  chosen = choose(fields, g.searched, g.alphas)
  methods = {n: recipes.copy(c) for n, c in ready.methods.items()}
  for row, r in chosen.items():
    methods[row].spsa15.alpha = float(r["chosen"])
  compared = _rows_at(ready, ready.plan, methods)
  return chosen, compared, (yield from decompose.stages(g.rows, compared))


def measure(g: Alphas, ready: base.Setup, gathered: tuple) -> dict:
  """decompose's fields of the comparison, the alpha stage, the primary verdicts and whether
  SOMA against the monolith keeps its sign."""
  chosen, compared, described = gathered
  fields = decompose.measure(g.rows, compared, described)
  e1, e2 = (fields["effects"][e]["end_loss_difference"] for e in g.sign_kept)
  return {**fields, "alpha_stage": {"seed": g.seed, "alphas": list(g.alphas), "rows": chosen},
          "primary": primary(fields, g.primary),
          "sign_kept": {"effects": list(g.sign_kept), "verdict": sign_kept(e1, e2)}}


def choose(payload: dict, alpha_rows: tuple, alphas: tuple) -> dict:
  """{row: its validation end loss at each alpha in the alpha stage, and the lowest's alpha}."""
  out = {}
  for row in alpha_rows:
    tried = {float(a): payload["rows"][_alpha_name(row, a)]["end_loss"]["validation"]["mean"]
             for a in alphas}
    out[row] = {"validation_end_loss": {f"{a:g}": v for a, v in tried.items()},
                "chosen": min(tried, key=tried.get)}
  return out


def verdict(stat: dict, lower: str, higher: str) -> str:
  """A test end-loss difference read at its 95% interval (seeds and documents): `lower`
  where it excludes zero above, `higher` where below, else no measurable difference with
  its bound."""
  ci = stat.get("ci95")
  if ci is None:
    return "unresolved (one seed: no interval)"
  lo, hi = ci
  if lo > 0:
    return f"{lower}, by {stat['mean']:.4f} [{lo:.4f}, {hi:.4f}]"
  if hi < 0:
    return f"{higher}, by {-stat['mean']:.4f} [{-hi:.4f}, {-lo:.4f}]"
  return f"no measurable difference, within +-{max(abs(lo), abs(hi)):.4f}"


def sign_kept(before: dict, after: dict) -> str:
  """Whether an effect keeps its sign from `before` to `after` (test end-loss differences,
  95% intervals): "kept" / "flipped" where both intervals exclude zero, else "unresolved"."""
  side = lambda s: 0 if s.get("ci95") is None else (s["ci95"][0] > 0) - (s["ci95"][1] < 0)
  a, b = side(before), side(after)
  if a and b:
    return "kept" if a == b else "flipped"
  return "unresolved (an interval holds zero)"


def primary(payload: dict, names: tuple) -> dict:
  """The declared readouts: each effect's or interaction's test end-loss difference at the
  budget (seeds and documents) with its verdict."""
  out = {}
  for name in names:
    if name in payload["effects"]:  # b's end loss minus a's
      e = payload["effects"][name]
      stat, words = e["end_loss_difference"], (f"{e['a']} ends lower", f"{e['b']} ends lower")
    else:  # effect 1's end-loss difference minus effect 2's
      x = payload["interactions"][name]
      stat = x["end_loss_difference"]
      words = tuple(f"{x['of'][i]} is the larger difference" for i in (0, 1))
    out[name] = {"end_loss_difference": stat, "verdict": verdict(stat, *words)}
  return out


def table(p: dict) -> str:
  """The primary verdicts and the alpha stage, then decompose's table (secondary beyond)."""
  lines = [f"1.5-SPSA against SPSA (issue 56). Primary readout: test end loss at the budget "
           f"({len(p['primary'])} intervals, seeds and documents).", "",
           *results.head("| primary | test end-loss difference [95%] | verdict |")]
  for name, r in p["primary"].items():
    s = r["end_loss_difference"]
    ci = "-" if s.get("ci95") is None else f"[{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}]"
    lines.append(f"| {name} | {s['mean']:+.4f} {ci} | {r['verdict']} |")
  st = p["alpha_stage"]
  lines += ["", f"alpha chosen on seed {st['seed']} by validation end loss: " + "; ".join(
      f"{row} {r['chosen']:g} (" + ", ".join(f"{a}: {v:.4f}" for a, v in
                                              r["validation_end_loss"].items()) + ")"
      for row, r in st["rows"].items()) + ".",
      "", f"Sign of {' → '.join(p['sign_kept']['effects'])}: {p['sign_kept']['verdict']}.",
      "", "Secondary:", ""]
  return "\n".join(lines) + decompose_report.table(p)


STUDY = base.Study(name="spsa15",
                   spec=SPEC, config=config, check=check, stages=stages, measure=measure,
                   table=table, plot=decompose_report.figures,
                   # decompose's setup: the data, and the seed runs both stages continue
                   setup=lambda g, plan, out, executor=None: decompose.setup(g.rows, plan, out,
                                                                             executor))
