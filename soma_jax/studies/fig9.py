"""The paper's Figure 9 (its ablations, scaled down by SPEC 9.6): semantic against random
shards, a warm start against a cold one, and three ways of handling the tied head.

Every condition (a method of config.methods) is SOMA at one N and one width (at size=cpu
Table 7's `soma_n2`), trained for `budget` updates at each optimisation seed, with
`curve_points` checkpoints scored on the ensemble-validation windows:
- (a) `shards`: `source` prepared into N semantic shards (OUT/data_nN) against the same
  corpus on random shards of the same sizes (`--assignment=random`: OUT/data_nN_random, or
  `data_dir_random`), scored on the same windows (`row_data` names the random-shard rows);
- (b) `start`: continuing the N = 1 seed run's whole state against a fresh init at the
  optimisation seed (`cold`), the same updates, the seed's cost excluded (as the paper's);
- (c) `head`: each expert's own tied head by the delta rule (SPEC 3.2, `opt.train_head`),
  the seed's head frozen and shared (`model.shared_head`, SPEC 3.4's width-32 recipe), and a
  frozen random head (its own seed run trained the body against a head never trained).
The default (`reference`) is one run set shared by the panels. Reported per condition and
checkpoint: mean over seeds and standard error; per `contrasts` entry (a, b, ...), a's final
loss minus the lowest-mean of the others per seed (95% t across seeds); whether each run's
head moved (the readouts: `fig9_readouts.py`). results.json `interpretation` maps the
paper's conditions onto ours.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from soma_jax import runs
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  datasets,
  planning,
  recipes,
  report,
  results,
  scores,
  seeded,
  statistics,
  training,
)
from soma_jax.studies.fig9_readouts import PAPER_ROWS, contrast, step_stats

PAPER = {
    "item": "Figure 9",
    "caption": "Semantic shards and warm initialization lower loss. Means and standard errors "
               "over three seeds for each condition at the shown training steps. The seed "
               "model's training cost is excluded. Updating the tied head only through the "
               "decoder raises loss by 0.029 nats/byte, while freezing a random head performs "
               "much worse.",
    "claims": {"shards": "semantic shards lower loss than random shards",
               "start": "warm initialization lowers loss against a cold start",
               "head": "updating the tied head only through the decoder raises loss by 0.029 "
                       "nats/byte; freezing a random head performs much worse"},
    "decoder_only_minus_default_nats_per_byte": 0.029,
    "seeds": 3,
}
PANELS = {"shards": "(a) semantic vs random shards", "start": "(b) warm vs cold start",
          "head": "(c) the tied head"}
DATA_KINDS = ("semantic", "random")  # row_data values
INTERPRETATION = (
    "The paper's head conditions on ours: its default (SPEC 3.4's width-32 recipe: the seed's "
    "E frozen and shared by every expert) is our `shared_head`; 'updating the tied head only "
    "through the decoder' is the delta rule of SPEC 3.2 (the decoder-side gradient of E with "
    "the hidden states held fixed, no gradient through the embedding lookup), our `soma` "
    "(each expert's own E, this project's CPU default); 'freezing a random head' is our "
    "`random_head` (a seed run whose E was never trained, the body warm against it, E kept "
    "frozen and shared by the experts; both seed runs start from the same init at "
    "seed_run_seed). The paper's +0.029 nats/byte is compared with our "
    "delta_minus_shared (soma minus shared_head, final ensemble-validation loss, per seed, "
    "95% t across seeds); random_head_minus_best is random_head minus the better of the two. "
    "Panels (a) and (b) hold our CPU default (semantic shards, warm, delta-rule heads: `soma`) "
    "as the common baseline, where the paper's baseline is its width-32 recipe: random_shards "
    "and cold differ from soma in that one factor. Random shards permute the semantic shards' "
    "labels (same sizes, same held-out windows); at N = 2 the top-min(4, N) router picks both "
    "experts, so routing plays no part and the difference is the training data. The cold start "
    "is a fresh init at each optimisation seed with fresh Adam and step counter, the same "
    "updates as the warm runs, which continue the seed's whole state; the seed's cost is "
    "excluded, as the paper's. The paper's 'shown training steps' are our checkpoints after "
    "each 1/curve_points of the budget; its standard errors ours, sd / sqrt(seeds) with ddof 1.")


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=fig9 (the paper's Figure 9): ablations of SOMA N = 2 at width 32 (Table 7's
  soma_n2): semantic vs random shards, warm vs cold start, and the head (own delta-rule
  heads, the seed's head frozen and shared, a frozen random head).

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig9,size=cpu --out=runs/fig9
  """
  c, a = recipes.paper_study(arg)
  cpu = a["size"] == "cpu"
  c.seeds = a["seeds"] or (3 if cpu else 2)  # the paper's three
  # 5 conditions x 3 seeds x 1,000 updates of N = 2 (about 40-60 updates/s on 2 cores) and two
  # 1,000-update seed runs: about 9 minutes with the data preparation
  c.budget = 1000.0 if cpu else 4.0  # updates per condition and seed
  c.curve_points = 4 if cpu else 2  # checkpoints scored: the figure's shown steps
  c.match_params = False  # one width: an ablation changes one factor, not the size
  c.update(recipes.corpus())  # the semantic, random and N = 1 data dirs: this corpus under OUT
  c.data_dir_random = ""  # prepared with --assignment=random; "" = source's under OUT
  soma = c.methods.soma_n2  # own delta-rule heads (SPEC 3.2), this project's CPU default
  shared = recipes.copy(soma)
  shared.model.shared_head, shared.opt.train_head = True, False  # SPEC 3.4's width-32 recipe
  rows = {"soma": (soma, "semantic shards, warm, own delta-rule heads (the default)",
                   "soma_expert"),
          "random_shards": (recipes.copy(soma), "random shards of the semantic sizes",
                            "soma_expert"),
          "cold": (recipes.copy(soma), "a fresh init (cold start), the same updates", None),
          "shared_head": (shared, "the seed's head frozen and shared", "soma_expert"),
          "random_head": (recipes.copy(shared), "a random head, never trained, frozen and "
                          "shared", "random_head")}
  recipes.rows(c, rows)
  del c.start["cold"]  # a fresh init: no seed run
  c.reference = "soma"
  c.order = tuple(rows)
  c.cold = ("cold",)  # conditions from a fresh init (training.budgeted(start=None))
  c.row_data = ml_collections.ConfigDict({"random_shards": "random"})  # else semantic
  c.panels = ml_collections.ConfigDict({"shards": ("soma", "random_shards"),
                                        "start": ("soma", "cold"),
                                        "head": ("soma", "shared_head", "random_head")})
  # name: (a, b, ...): a's final loss minus the better of b, ... (the paper's +0.029 is
  # delta_minus_shared)
  c.contrasts = ml_collections.ConfigDict({
      "random_minus_semantic": ("random_shards", "soma"), "cold_minus_warm": ("cold", "soma"),
      "delta_minus_shared": ("soma", "shared_head"),
      "random_head_minus_best": ("random_head", "soma", "shared_head")})
  seed = c.seed_runs.soma_expert  # N = 1 at the experts' width, its own delta-rule head
  never = recipes.copy(seed)
  never.model.shared_head, never.opt.train_head = True, False  # its head stays the random init
  c.seed_runs = ml_collections.ConfigDict({"soma_expert": seed, "random_head": never})
  return c


@dataclasses.dataclass(frozen=True)
class Ablation:
  """The study's fields, checked once (`check`): each condition's training config (the
  config space) and resolved run at the first seed, the panels and the data."""
  methods: dict  # {condition: training config}, the reference first
  specs: dict  # {condition: RunSpec at the first seed}
  rows: dict  # {condition: what it stands for}
  panels: dict  # {panel: (condition, ...)}
  cold: tuple[str, ...]  # conditions from a fresh init
  row_data: dict  # {condition: "semantic" | "random"}
  contrasts: dict  # {name: (a, b, ...)}: a minus the best of b, ...
  source: str
  prepare: dict
  data_dir_random: str
  n_experts: int

  def data(self, name: str) -> str:
    return self.row_data.get(name, "semantic")


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Ablation:
  """Every field and run before anything trains: the plan in updates (no resizing), the
  panels, the cold conditions, the rows' data kinds, the contrasts, one N and one width."""
  if plan.unit != "updates" or config.match_params:
    raise UserError("fig9 runs every condition for the same updates at one width; fix: "
                    "--config.budget_unit=updates --config.match_params=False")
  if plan.data_dir:
    raise UserError(f"data_dir={plan.data_dir!r}: fig9 prepares its semantic and random shards "
                    "from config.source under OUT (one corpus, one set of settings); fix: "
                    "--config.data_dir='' --config.source=textdir:FOLDER")
  source = planning.check_source(config)
  methods = planning.sized(config)  # match_params off: every condition as configured
  names = ", ".join(methods)
  known = lambda v, least=1: len(v) >= least and all(n in methods for n in v)
  planning.check_fields(config, {
      "data_dir_random": ("a string", lambda v: isinstance(v, str)),
      "cold": (f"conditions of {names} other than the reference {plan.reference!r}",
               lambda v: known(v, 0) and plan.reference not in v),
      **{f"panels.{p}": (f"a panel of {', '.join(PANELS)} naming at least 2 conditions of "
                         f"{names}", lambda v, p=p: p in PANELS and known(v, 2))
         for p in config.panels},
      **{f"row_data.{n}": (f"a condition's data, one of {', '.join(DATA_KINDS)}",
                           lambda v, n=n: n in methods and v in DATA_KINDS)
         for n in config.row_data},
      **{f"contrasts.{k}": (f"a condition and at least one other of {names}",
                            lambda v: known(v, 2) and v[0] not in v[1:])
         for k in config.contrasts}})
  cold, contrasts = tuple(config.cold), {k: tuple(v) for k, v in config.contrasts.items()}
  panels = {p: tuple(config.panels[p]) for p in PANELS if p in config.panels}  # left to right
  specs = training.check_runs(plan, {n: c for n, c in methods.items() if n not in cold})
  for n in cold:  # a fresh init: no seed run
    specs[n] = training.budgeted(methods[n], plan.data_dir, plan.seeds[0], None, "updates",
                                 plan.budget, plan.curve_points, f"methods.{n}.")
  n_experts = one_architecture(specs)
  return Ablation(methods, {n: specs[n] for n in methods},
                  {n: config.rows.get(n, "") for n in methods}, panels, cold,
                  dict(config.row_data), contrasts, source, recipes.settings(config.get("prepare")),
                  config.data_dir_random, n_experts)


def one_architecture(specs: dict) -> int:
  """The conditions' common N: they share N, d_t, d_e and depth (an ablation changes one
  factor)."""
  shapes = {n: (s.n_experts, s.config.model.d_t, s.config.model.d_e, s.config.model.depth)
            for n, s in specs.items()}
  if len(set(shapes.values())) != 1:
    raise UserError("every fig9 condition must share N, d_t, d_e and depth; have " + ", ".join(
        f"{n} {v}" for n, v in shapes.items()) + "; fix: --config.methods.NAME.n_experts / "
        "model.d_t as the reference's")
  return next(iter(shapes.values()))[0]


def random_dir(study: Ablation, out: str) -> str:
  """The random-shard data dir: data_dir_random, or `source` prepared with
  --assignment=random (the semantic dir's settings) under OUT/data_nN_random; checked to be a
  random assignment of N shards."""
  n = study.n_experts
  path = study.data_dir_random or os.path.join(out, f"data_n{n}_random")
  if not study.data_dir_random and not os.path.isfile(os.path.join(path, "manifest.json")):
    datasets.prepare_data(study.source, n, path, study.prepare, assignment="random")
  return datasets.check_random(path, n, "data_dir_random" if study.data_dir_random else None)


def setup(study: Ablation, plan: planning.StudyPlan, out: str, executor=None) -> base.Setup:
  """The data dirs and sets per data kind (the semantic shards and N = 1, the seed runs',
  from `source` under OUT; the random shards where a condition asks; every dir scored on the
  same windows) and the warm conditions' seed runs (the cold ones start fresh)."""
  dirs, scored = datasets.per_n_sets(plan.eval, study.specs, study.source, study.prepare, out)
  n = study.n_experts
  main = study.data(plan.reference)  # results.json's data_dir and sets
  data = base.Data({"semantic": dirs[n]}, {"semantic": scored[n]}, main, main)
  if "random" in study.row_data.values():
    data.dirs["random"] = random_dir(study, out)
    data.sets["random"] = datasets.random_sets(
        plan.eval, data.dirs["random"], [s.seq_len for s in study.specs.values()], scored[n])
  warm = {n: s for n, s in study.specs.items() if n not in study.cold}
  seeds = training.train_seeds(plan, warm, dirs[1], out, scored[1][0], executor)
  return base.Setup(plan, study.methods, study.specs, {}, data.dirs[data.main],
                    data.sets[data.main], seeds, out, data)


def run_record(spec, start: dict | None, val, workdir: str) -> dict:
  """One condition and seed: its start (losses and head), the curve of its checkpoints on the
  ensemble-validation windows `val`, and whether its head (E) moved: bit-identical to its
  start or not, and the largest absolute change."""
  start_w = scores.start_losses(spec, {"validation": val})["validation"]
  first = training.start_step(spec, start) if spec.init_from else 0
  keep = [start_w]
  points, _ = scores.curve(workdir, spec, val, first, float(start_w.mean()), keep)
  head, end = (np.asarray(h) for h in (runs.initial_params(spec)[1],
                                       runs.restore_params(workdir)[1]))
  return {"start_step": first, "start_loss": float(start_w.mean()), "curve": points,
          "_windows": (np.array([p["update"] for p in points], np.float64), np.stack(keep)),
          "end_loss": points[-1]["loss"],
          "head_bit_identical": bool(head.shape == end.shape and np.array_equal(head, end)),
          "head_max_abs_change": float(np.max(np.abs(end - head)))}


def stages(study: Ablation, ready: base.Setup) -> base.Stages:
  """Every condition at every optimisation seed (one stage): each warm one continuing its
  seed run's state (from the N = 1 data: init_from_other_data), each cold one from a fresh
  init; {condition: its description and per-seed records}."""
  plan, sets = ready.plan, ready.data.sets
  starts = {n: None if n in study.cold else ready.seeds[plan.start[n]] for n in study.methods}
  planned = seeded.every_seed(ready, study.methods, "updates", plan.budget, study.data, starts)
  conditions = {}
  for run in (yield from seeded.trained(planned, ready.out)):
    spec, name, start = run.spec, run.name, starts[run.name]
    r = conditions.setdefault(name, {
        "what": study.rows[name], "data": study.data(name), "n_experts": spec.n_experts,
        "d_t": spec.config.model.d_t, "shared_head": spec.shared_head,
        "train_head": spec.train_head, "params": spec.method.ensemble_params,
        "ops_per_update": spec.total_ops_per_update,
        "start": "fresh init at the optimisation seed" if start is None
        else training.start_of(start), "per_seed": []})
    r["per_seed"].append(seeded.record(
        run, ready.out, **run_record(spec, start, sets[study.data(name)][0], run.workdir)))
  return conditions


def measure(study: Ablation, ready: base.Setup, conditions: dict) -> dict:
  """Per condition its checkpoints' statistics over seeds (`step_stats`), the panels and the
  contrasts (`contrast`)."""
  plan = ready.plan
  for r in conditions.values():
    r["steps"] = step_stats(r["per_seed"])
  measured = {"conditions": conditions,
              "panels": {p: {"title": PANELS[p], "conditions": list(v)}
                         for p, v in study.panels.items()},
              "contrasts": {k: contrast(conditions, v, ready.scored[0].doc_ids,
                                        min(plan.bootstrap_draws, statistics.SPEEDUP_DRAWS))
                            for k, v in study.contrasts.items()}}
  for r in conditions.values():  # the per-window curves stay out of results.json
    for q in r["per_seed"]:
      del q["_windows"]
  return {"budget": {"unit": "updates", "per": "condition and seed",
                     "seed_updates": plan.seed_updates},
          "paper": PAPER, "measured": measured, "interpretation": INTERPRETATION,
          "cold": list(study.cold),
          "how": "per condition and checkpoint: mean over seeds and standard error sd / sqrt(S) "
                 "(sample sd, ddof 1); contrasts: a's final ensemble-validation loss minus the "
                 "lowest-mean other condition's, per seed, 95% Student-t interval across seeds; "
                 "speedup: SPEC 9.8's matched-loss speed-up of a over b in updates over their "
                 "common loss range (> 1: a covers it in fewer updates), its interval across "
                 "seeds widened by the validation documents' bootstrap variance"}


def plot(p: dict, out: str) -> None:
  """OUT/fig9.png: one panel per ablation, each condition's mean ensemble-validation loss at each
  checkpoint after the start, with standard-error bars (offset a little along the axis)."""
  m = p["measured"]
  panels = m["panels"]
  fig, axes = report.plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
  for ax, r in zip(axes[0], panels.values(), strict=True):
    k = len(r["conditions"])
    for j, name in enumerate(r["conditions"]):
      steps = m["conditions"][name]["steps"][1:]
      gap = (steps[-1]["update"] / max(len(steps), 1)) * 0.06
      x = np.array([s["update"] for s in steps]) + (j - (k - 1) / 2) * gap
      ax.errorbar(x, [s["mean"] for s in steps], yerr=[s["se"] or 0.0 for s in steps],
                  marker="o", ms=4, capsize=3, label=name)
    report.label(ax, "updates after the start (seed cost excluded)", title=r["title"])
  report.save_figure(fig, os.path.join(out, "fig9.png"))


def _speed(s: dict) -> str:
  if s["mean"] is None:
    return f"none ({s['why']})"
  ci = s["speedup_ci95"]
  return f"{s['speedup']:.2f}x" + ("" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")


def _cell(s: dict) -> str:
  return f"{s['mean']:.4f}" + ("" if s["se"] is None else f" ± {s['se']:.4f}")


def table(p: dict) -> str:
  """Markdown: per panel each condition's loss at each checkpoint (mean ± SE), then the
  contrasts beside the paper's claims."""
  m, b = p["measured"], p["budget"]
  lines = [f"Figure 9 at this scale: every condition {b['amount']:g} updates, {len(p['seeds'])} "
           f"seeds, from its seed run ({b['seed_updates']} updates, state continued, cost "
           f"excluded) or a fresh init (cold: {', '.join(p['cold']) or 'none'}); ensemble "
           f"validation ({p['eval']['val_windows_scored']} windows from "
           f"{p['eval']['val_documents']} documents), mean ± standard error over seeds. "
           + results.load_line(p), ""]
  for r in m["panels"].values():
    updates = [s["update"] for s in m["conditions"][r["conditions"][0]]["steps"]]
    lines += [f"**{r['title']}**", "", *results.head("| condition | heads | data | " + " | ".join(
        f"update {u}" for u in updates) + " |")]
    for name in r["conditions"]:
      c = m["conditions"][name]
      heads = ("shared, frozen" if c["shared_head"] else "own, delta rule" if c["train_head"]
               else "own, frozen")
      lines.append(f"| {name} | {heads} | {c['data']} | "
                   + " | ".join(_cell(s) for s in c["steps"]) + " |")
    lines.append("")
  paper = {"random_minus_semantic": PAPER["claims"]["shards"],
           "cold_minus_warm": PAPER["claims"]["start"],
           "delta_minus_shared": "+0.029 (updating the head only through the decoder)",
           "random_head_minus_best": "much worse (freezing a random head)"}
  lines += ["Final-step contrasts (a minus the better of the others, per seed; 95% t across "
            "seeds) and SPEC 9.8's matched-loss speed-up of a over b in updates (> 1: a "
            "faster; 95%, seeds and documents) beside the paper:", "",
            *results.head("| contrast | a − b | ours | speed-up of a over b | paper |")]
  for k, d in m["contrasts"].items():
    lines.append(f"| {k} | {d['a']} − {d['b']} | {results.ci(d, digits=4)} | "
                 f"{_speed(d['speedup'])} | {paper.get(k, '-')} |")
  return "\n".join(lines) + "\n\n" + p["interpretation"] + "\n"


STUDY = base.Study(name="fig9",
                   spec="paper Figure 9 (ablations: shards, start, head), scaled down by SPEC 9.6",
                   config=config, check=check, stages=stages, measure=measure, table=table,
                   plot=plot, setup=setup, paper_rows=PAPER_ROWS)
