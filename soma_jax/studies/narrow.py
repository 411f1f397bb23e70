"""Sharding, or just a narrower model? (SPEC 9.8) SOMA N = 2 against one expert of its width on
all the data and the monolith of its size, as the budget grows, every seed with its own start.

Rows (config.methods): `soma` (N = 2), `one_expert` (N = 1 at SOMA's width, continuing the
same seed run as SOMA's experts: `keep_width`), `mono` (the monolith, its own seed run), by
SPSA; and the same three by backprop with fresh Adam (`*_bptt`, `fresh_optimizer`) at
`row_fraction` of the budget, a capacity reference.

Protocol: every optimisation seed s continues its own seed runs, trained at seed_run_seed + s
(`own_starts`, `training.seed_stage`); every row runs `budget` of SOMA's updates in
operations (SPEC 7's count: one_expert runs twice SOMA's updates), times its row_fraction,
with checkpoints at `curve_fractions` of it (log-spaced), each scored on the spread
validation set inside the run. lr: a grid of lr_factors around each row's centre
(`row_base_lr`) on the first seed at `select_fraction` of its budget, selected on validation,
then fixed for every seed (`selection`, shared with table4 and table5). Test is scored once
per row and seed at each budget of `test_fractions`, declared in the config before anything
trains. At every checkpoint each SOMA expert is also scored alone on every validation window.

Readouts (`narrow_readouts`), declared in the config: primary, the test end-loss contrasts of
`primary` at each declared budget (seeds with their starts and test documents in the
interval) and the slopes of `primary_slopes` against log2 budget, each with SPEC 9.8's
verdict; secondary, every other contrast and slope, the mechanism D(u) against G(u) and the
experts scored alone. `STUDY` runs through the driver (`driver.run`).
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import metrics as metrics_lib
from soma_jax import runs as runs_lib
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  datasets,
  narrow_report,
  planning,
  recipes,
  results,
  scores,
  seeded,
  selection,
  table7,
  training,
)
from soma_jax.studies import narrow_readouts as readouts

SPEC = ("SPEC 9.8 (sharding or a narrower model: SOMA against one expert of its width as the "
        "budget grows, every seed with its own start)")
FIELDS = {**selection.FIELDS, "corpus": planning.one_of("builtin", "man"),
          "man_root": ("a string", lambda v: isinstance(v, str)),
          "man_sections": ("a tuple of section numbers", lambda v: isinstance(v, tuple | list)
                           and len(v) > 0 and all(isinstance(x, int) for x in v))}


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=narrow (SPEC 9.8): SOMA N = 2 x width 32 against one width-32 expert on all the
  data and the width-47 monolith as the budget grows to 16x decompose's compared phase,
  every optimisation seed with its own seed runs; backprop rows at 1x as a capacity
  reference. Readouts declared here, before anything trains.

    python experiments/compare.py --config=experiments/configs/compare.py:study=narrow,size=cpu --out=runs/narrow
    python experiments/compare.py --config=experiments/configs/compare.py:study=narrow,size=cpu,corpus=man --out=runs/narrow_man
    ...:study=narrow,size=cpu,width=16   (a narrower rung: 2 x 16 against 1 x 16 and the monolith
                                          matched in parameters, width 28)
  """
  a = recipes.args(arg, seeds=0, corpus="builtin", width=0)
  if a["corpus"] not in ("builtin", "man"):
    raise UserError(f"compare.py:study={STUDY.name},size={a['size']},corpus={a['corpus']}: use "
                    "size=cpu or tiny and corpus=builtin or man")
  size, cpu = a["size"], a["size"] == "cpu"
  c = recipes.pair(a["study"], size)
  c.seeds = a["seeds"] or (5 if cpu else 2)
  c.own_starts = True  # seed s continues its own seed runs, trained at seed_run_seed + s
  # The corpus: "builtin" (pystdlib, prepared under OUT/data) or "man" (this machine's man
  # pages of man_sections under man_root, linked under OUT/man and prepared into OUT/data, as
  # decompose_man's); data_dir, when set, is used as it is.
  c.corpus = a["corpus"]
  c.man_root = "/usr/share/man"
  c.man_sections = (2, 3, 5, 7, 8)
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
  # The budget: `budget` of SOMA's updates in operations per row and seed (16x decompose's
  # 1,000: 2.15e13 ops after the seed at size=cpu; one_expert runs twice SOMA's updates).
  # Cost on 2 idle cores (SOMA 0.0158 s, one_expert 0.0092 s, mono 0.0163 s per update, the
  # backprop rows about 0.011 / 0.006 / 0.011): per seed 808 s of SPSA updates and 75 s of
  # backprop, the grid 660 s, the seed runs 130 s: about 87 min of updates, 1.7 h with
  # compilation and scoring per corpus (the man pages' preparation adds a few minutes)
  c.budget = 16000.0 if cpu else 16.0
  # Checkpoints, scored on validation inside the run: log-spaced fractions of each row's
  # budget (powers of 2, so one_expert's update u and 2u and SOMA's u fall on checkpoints)
  c.curve_fractions = tuple(2.0 ** -k for k in range(8 if cpu else 4, -1, -1))
  # Declared before anything trains: the budgets each row's test loss is scored at, once
  c.test_fractions = (1 / 16, 1 / 4, 1 / 2, 1.0)
  # lr: a grid of lr_factors around each row's centre on the first seed at select_fraction
  # of its budget, selected on validation, then fixed for every seed (eps at the centre)
  c.lr_factors, c.lr_extend = (0.5, 1.0, 2.0), 0
  c.eps_factors, c.eps_extend = (1.0,), 0
  c.select_fraction = 0.25
  rows = _config_rows(c.methods.soma_n2, c.methods.mono, size, c.base_lr, a["width"])
  recipes.rows(c, rows)
  c.reference = "soma"
  c.order = tuple(rows)
  c.keep_width = ("one_expert", "one_expert_bptt")  # width 32; the others match SOMA's params
  c.fresh_optimizer = ("soma_bptt", "one_expert_bptt", "mono_bptt")
  # lr grid centres: decompose's selections at size=cpu (docs/results/decompose_cpu_shared_start.json)
  c.row_base_lr = ml_collections.ConfigDict({
      "soma": 0.0025, "one_expert": 0.00125, "mono": 0.000625,
      "soma_bptt": 0.006, "one_expert_bptt": 0.006, "mono_bptt": 0.003})
  # each row's budget as a fraction of `budget`: the backprop rows at 1x (decompose's)
  c.row_fraction = ml_collections.ConfigDict(
      {"soma_bptt": 1 / 16, "one_expert_bptt": 1 / 16, "mono_bptt": 1 / 16})
  c.update(_readouts())
  return c


def _readouts() -> dict:
  """study=narrow's readouts, declared before the run (SPEC 9.8)."""
  return {
      # contrasts: name -> (b, a), b's test end loss minus a's at each test fraction (> 0: a
      # lower, the paper's direction for a = soma)
      "contrasts": ml_collections.ConfigDict({
          "one_expert_minus_soma": ("one_expert", "soma"), "mono_minus_soma": ("mono", "soma"),
          "one_expert_bptt_minus_soma_bptt": ("one_expert_bptt", "soma_bptt"),
          "mono_bptt_minus_soma_bptt": ("mono_bptt", "soma_bptt")}),
      # primary: the contrasts whose end-loss differences carry a verdict (SPEC 9.8), and
      # those whose slope against log2 budget does; every other readout is secondary
      "primary": ("one_expert_minus_soma", "mono_minus_soma"),
      "primary_slopes": ("one_expert_minus_soma",),
      # D(u) = one_expert(u) - soma(u), G(u) = one(u) - one(2u)
      "mechanism": ("one_expert", "soma")}


def _config_rows(soma: ml_collections.ConfigDict, mono: ml_collections.ConfigDict, size: str,
          lr: float, width: int) -> dict:
  """study=narrow's rows from Table 7's pair (`soma`, `mono`): SOMA, one expert of its width
  and the monolith by SPSA, and the same three by backprop with fresh Adam (the capacity
  reference); SOMA's expert width `width` (0: the size's), the monoliths matched in
  parameters. {name: (training config, what it is, seed run)}."""
  one = recipes.recipe("soma.py", f"n=1,size={size}", size, lr)
  rows = {"soma": (soma, "SOMA N = 2 by SPSA", "soma_expert"),
          "one_expert": (one, "one expert of SOMA's width on all the data (N = 1) by SPSA, "
                         "continuing SOMA's seed run", "soma_expert"),
          "mono": (mono, "the monolith of SOMA's total size by SPSA", "monolith")}
  for name, n, seed, what in (
      ("soma_bptt", 2, "soma_expert", "SOMA N = 2"),
      ("one_expert_bptt", 1, "soma_expert", "one expert of SOMA's width (N = 1)"),
      ("mono_bptt", 1, "monolith", "the monolith")):
    bptt = recipes.recipe("bptt.py", f"n={n},size={size}", size, lr)
    bptt.method = "bptt"
    rows[name] = (bptt, f"{what} by backprop, fresh Adam", seed)
  for cfg, _, seed in rows.values():
    if width and seed == "soma_expert":
      cfg.model.d_t = width
  return rows


@dataclasses.dataclass(frozen=True)
class Narrow:
  """The study's own fields, checked once (`check`); the plan, methods and runs are the
  driver's (`base.Setup`)."""
  grid: table7.Grid
  rows: dict  # {row: what it stands for}
  row_base_lr: dict
  row_fraction: dict  # {row: its budget's fraction of `budget`}
  curve: tuple  # checkpoint fractions of each row's budget
  tests: tuple  # declared budgets: fractions of `budget`
  select_fraction: float
  contrasts: dict  # {name: (b, a)}: b's end loss minus a's
  primary: tuple
  primary_slopes: tuple
  mechanism: tuple  # (b, a)
  corpus: str
  man: tuple  # (root, sections)
  prepare: dict

  def fraction(self, name: str) -> float:
    return self.row_fraction.get(name, 1.0)

  def declared(self, name: str) -> list[float]:
    """The declared budgets (fractions of `budget`) a row reaches."""
    return [f for f in self.tests if f <= self.fraction(name) + 1e-12]


def _pair(value, field: str, names) -> tuple:
  """A (b, a) field naming two rows."""
  pair = tuple(value) if isinstance(value, tuple | list) else ()
  if len(pair) != 2 or any(n not in names for n in pair):
    raise UserError(f"{field}={value!r} must name two rows of {', '.join(names)}; fix: "
                    f"--config.{field}='(\"one_expert\", \"soma\")'")
  return pair


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Narrow:
  """Every field before anything trains (the plan, own starts: `driver.checked`; the runs:
  `driver.preparing`): the lr grid, the declared budgets (each a checkpoint), the rows' lr
  centres and budgets, the readouts."""
  del plan
  grid = table7.check_grid(config)
  planning.check_fields(config, FIELDS)
  curve = planning.check_fractions(config, "curve_fractions", "(0.25, 0.5, 1.0)")
  tests = planning.check_fractions(config, "test_fractions", "(0.0625, 0.25, 0.5, 1.0)")
  methods = list(planning.sized(config))
  for name, f in [*config.row_base_lr.items(), *config.row_fraction.items()]:
    if name not in methods or not planning.positive()[1](f):
      raise UserError(f"{name}={f!r}: row_base_lr and row_fraction name rows ({', '.join(methods)})"
                      " with finite numbers > 0")
  fractions = {n: float(config.row_fraction.get(n, 1.0)) for n in methods}
  for name, fr in fractions.items():
    missing = [f for f in tests if f <= fr + 1e-12 and not any(
        abs(f / fr - c) < 1e-9 for c in curve)]
    if fr > 1 or curve[-1] != 1 or missing:
      raise UserError(f"{name}: every declared budget it reaches ({missing}) must be a checkpoint "
                      f"(curve_fractions x row_fraction {fr:g}, the last 1, row_fraction <= 1); "
                      "fix: --config.curve_fractions with each test fraction in it")
  contrasts = {k: _pair(v, f"contrasts.{k}", methods) for k, v in config.contrasts.items()}
  for field in ("primary", "primary_slopes"):
    if not set(config[field]) <= set(contrasts):
      raise UserError(f"{field}={tuple(config[field])!r} must name contrasts of "
                      f"{', '.join(contrasts)}")
  return Narrow(grid, {n: config.rows.get(n, "") for n in methods}, dict(config.row_base_lr),
                fractions, curve, tests, float(config.select_fraction), contrasts,
                tuple(config.primary), tuple(config.primary_slopes),
                _pair(config.mechanism, "mechanism", methods), config.corpus,
                (config.man_root, tuple(config.man_sections)), config.prepare.to_dict())


# ----------------------------------------------------------------------------- data


def man_pages(n: Narrow, out: str) -> tuple[str, str]:
  """(the textdir source, what it holds): the man pages of man_sections, linked under OUT/man."""
  root, sections = n.man
  links = os.path.join(out, "man")
  os.makedirs(links, exist_ok=True)
  for s in sections:
    target, link = os.path.join(root, f"man{s}"), os.path.join(links, f"man{s}")
    if not os.path.isdir(target):
      raise UserError(f"man_sections: {target!r} is not a folder; fix: --config.man_sections "
                      "with sections this machine has, or --config.man_root")
    if not os.path.lexists(link):
      os.symlink(target, link)
  listed = ", ".join(map(str, sections))
  return f"textdir:{links}", (f"man pages, sections {listed} of this machine (textdir of "
                              f"symlinks to {root}/man{{{listed.replace(' ', '')}}}, .gz "
                              "decompressed)")


def corpus_dir(n: Narrow, plan: planning.StudyPlan, out: str) -> tuple[str, dict]:
  """(the prepared 2-shard data dir, what it holds): data_dir as given, else the built-in
  corpus or the man pages (`man_pages`), prepared under OUT/data."""
  if plan.data_dir:
    return datasets.ensure_data(plan.data_dir, out, 2), {"what": "data_dir as given"}
  source, what = (man_pages(n, out) if n.corpus == "man" else
                  ("pystdlib", "the built-in corpus (this Python's standard library)"))
  data = os.path.join(out, "data")
  if not os.path.isfile(os.path.join(data, "manifest.json")):
    datasets.prepare_data(source, 2, data, n.prepare, field="corpus")
  return data, {"corpus": n.corpus, "what": what,
                "manifest_documents": datasets.check_data(data, 2, None).get("documents")}


def data(n: Narrow, plan: planning.StudyPlan, specs: dict, out: str) -> base.Data:
  """The corpus's data dir (`corpus_dir`) and its sets; what it holds in `extra`."""
  path, corpus = corpus_dir(n, plan, out)
  sets = datasets.eval_sets(plan.eval, path, [s.seq_len for s in specs.values()])
  return base.Data({2: path}, {2: sets}, 2, 2, corpus)


# ----------------------------------------------------------------------------- runs


def _ops(ready: base.Setup) -> float:
  """Every row's budget before its row_fraction: `budget` of the reference's updates (ops)."""
  return ready.plan.budget * ready.ops[ready.plan.reference]


def _start(ready: base.Setup, seed: int, name: str) -> dict:
  """The seed run record row `name` continues at optimisation seed `seed` (its own)."""
  return training.seed_of(ready.plan, ready.seeds, seed, name)


def row_spec(n: Narrow, ready: base.Setup, name: str, seed: int, share: float,
             marks: tuple = ()):
  """Row `name` at optimisation seed `seed` from its seed's own start, for `share` of its
  budget (in operations), scored on validation at each checkpoint."""
  return training.budgeted(ready.methods[name], ready.data_dir, seed, _start(ready, seed, name),
                           "ops", _ops(ready) * n.fraction(name) * share, 1,
                           fresh=name in ready.plan.fresh_optimizer, score=ready.scored[0],
                           marks=marks)


def lr_trace(workdir: str) -> list[list[float]]:
  """[[step, lr]] where the logged lr changed (the plateau schedule), from metrics.jsonl."""
  trace = []
  for r in metrics_lib.read_metrics(workdir):
    if "lr" in r and (not trace or trace[-1][1] != r["lr"]):
      trace.append([r["step"], r["lr"]])
  return trace


def alone(workdir: str, spec, val: eval_lib.TestSet, points: list[dict]) -> list[dict]:
  """Each expert scored alone on every validation window, at every checkpoint (restored)."""
  out = []
  for p in points[1:]:
    _, state, _, _ = runs_lib.restore_state(workdir, step=p["step"])
    nats = lambda e, state=state: float(eval_lib.mixture_nats(eval_lib.routed_logprobs(
        state.body, state.head, val.windows, np.full((val.windows.shape[0], 1), e),
        spec.shared_head, first=val.route + 1, logits_fn=spec.method.logits)).mean())
    experts = [nats(e) for e in range(spec.n_experts)]
    out.append({"update": p["update"], "mixture": p["loss"], "experts": experts})
  return out


def record(n: Narrow, ready: base.Setup, name: str, spec, start_w: dict, workdir: str) -> dict:
  """One row and seed: its start, validation curve, test at each declared budget it reaches
  (scored once each), lr trace and, for N > 1 by SPSA, the experts alone."""
  (val, test), start = ready.scored, _start(ready, spec.config.seed, name)
  points, _ = scores.curve(workdir, spec, val, training.start_step(spec, start),
                           float(start_w["validation"].mean()))
  test_w = {}
  for f in n.declared(name):
    mark = spec.budget.amount * (f / n.fraction(name))
    at = next(p for p in points[1:] if p["ops"] >= mark * (1 - 1e-12))
    test_w[readouts.fraction_key(f)] = scores.scored_at(workdir, at["step"], spec, test)[0]
  rec = {"seed": spec.config.seed, "seed_run": training.start_of(start),
         "workdir": planning.shown(workdir, ready.out), "lr": spec.lr, "eps": spec.eps,
         "updates": points[-1]["update"], "ops": points[-1]["ops"],
         "start_loss": {k: float(v.mean()) for k, v in start_w.items()},
         "val_curve": points, "test": {k: float(v.mean()) for k, v in test_w.items()},
         "lr_trace": lr_trace(workdir), "_test_w": test_w}
  if spec.n_experts > 1 and name not in ready.plan.fresh_optimizer:
    rec["experts_alone"] = alone(workdir, spec, val, points)
  return rec


def describe(n: Narrow, ready: base.Setup, name: str, chosen: tuple) -> dict:
  """A row's settings (its per_seed records follow)."""
  spec = ready.specs[name]
  return {"what": n.rows[name], "n_experts": spec.n_experts,
          "d_t": ready.methods[name].model.d_t, "params": spec.method.ensemble_params,
          "gradient": spec.method.describe["gradient"], "ops_per_update": ready.ops[name],
          "budget_fraction": n.fraction(name), "lr": chosen[0], "eps": chosen[1],
          "optimizer_state": "fresh (the seed's parameters only)"
          if name in ready.plan.fresh_optimizer else "the seed's, continued", "per_seed": []}


def stages(n: Narrow, ready: base.Setup) -> base.Stages:
  """Every row's start scored at every seed, its lr grid on the first seed at select_fraction
  of its budget (`selection.selecting`), then every row at every seed at its selected (lr,
  eps) (one stage); (the searches, {row: {.., per_seed}})."""
  plan, out, (val, test) = ready.plan, ready.out, ready.scored
  starts = {(seed, name): scores.start_losses(row_spec(n, ready, name, seed, 1.0),
                                              {"validation": val, "test": test})
            for seed in plan.seeds for name in ready.methods}
  first = plan.seeds[0]
  specs = {name: row_spec(n, ready, name, first, n.select_fraction) for name in ready.methods}
  begins = {name: selection.start(spec, _start(ready, first, name),
                                  starts[(first, name)]["validation"].mean())
            for name, spec in specs.items()}
  found = selection.searches(n.grid, specs, begins,
                             {name: n.row_base_lr.get(name, n.grid.base_lr) for name in specs},
                             dict.fromkeys(specs, val), os.path.join(out, "runs", "select"))
  chosen = yield from selection.selecting(found)
  planned = selection.fixed({(seed, name): row_spec(n, ready, name, seed, 1.0, n.curve)
                             for seed in plan.seeds for name in ready.methods}, chosen)
  rows = {name: describe(n, ready, name, chosen[name]) for name in ready.methods}
  for run in (yield from seeded.trained(planned, out)):
    rows[run.name]["per_seed"].append(record(n, ready, run.name, run.spec,
                                             starts[(run.seed, run.name)], run.workdir))
  return found, rows


def measure(n: Narrow, ready: base.Setup, gathered: tuple) -> dict:
  """The corpus, what was declared, the lr selection, the rows and the readouts."""
  found, rows = gathered
  plan, ops = ready.plan, _ops(ready)
  got = readouts.read(n, plan, rows, ready.scored[1], ops)
  return {"budget": {"unit": "ops", "amount": ops, "per": "row and seed (times its row_fraction)",
                     "reference_updates": plan.budget, "seed_updates": plan.seed_updates,
                     "ops_per_update": ready.ops, "row_fraction": n.row_fraction},
          "corpus": ready.data.extra, "intervals": narrow_report.intervals(plan),
          "declared": narrow_report.declared(n),
          "selection": selection.report(found, ready.out),
          "rows": results.public(rows), "readouts": results.public(got),
          "intervals_printed": narrow_report.count_intervals(got)}


STUDY = base.Study(name="narrow",
                   spec=SPEC, config=config, check=check, stages=stages, measure=measure,
                   table=narrow_report.table, ops_tolerance=base.any_ops, data=data,
                   plot=narrow_report.plot)
