"""The paper's Figure 16 (scaled down by SPEC 9.6): top-k routing, k = 1 .. N, on saved
ensembles; k = 4 marked.

Each ensemble (`ensembles`: methods of config.methods, fixed-width SOMA experts, N >= 2
growing; the paper's N = 8 and 256) trains on the corpus (`source`) prepared into N shards
under OUT/data_nN (the same held-out documents for every N, checked) and continues one seed
run (N = 1 at the experts' width, `seed_updates` updates on the one-shard data dir, its state
continued) for `budget` updates at each optimisation seed. Its newest checkpoint is then
scored on the study's ensemble-validation windows with its own router ranking all N experts
per window (`evaluate.score`): the uniform mixture of the top k for every k in 1..N in one
pass, per seed with a paired document-bootstrap interval, and across seeds the mean and sd.
results.json `measured`: per N and k the loss, and the gain captured at k = `mark_k` as a
fraction of the k = 1 -> k = N gain (the paper: k = 4 captures most of it).

`ensembles` (a stage that trains them) and `trained_in` (a finished fig16 folder, validated,
read without training) are the ensembles the pair analysis (fig17.py) reads too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import runs as runs_lib
from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  datasets,
  driver,
  paper,
  planning,
  recipes,
  report,
  results,
  seeded,
)

PAPER = {
    "item": "Figure 16",
    "caption": "Top-k routing with k=4 captures most of the gain at the same training stage. "
               "Each curve varies k in a saved 4M-update ensemble. All experts have the same "
               "width and use n_pert=B=64. SOMA N=8 and SOMA N=256 reach these checkpoints "
               "after approximately 176 and 192 elapsed hours, respectively. All scores use "
               "the same ensemble validation set and average the selected experts’ "
               "probabilities. The dashed line marks k=4.",
    "updates": "4M", "n_experts": [8, 256], "n_pert": 64, "batch": 64, "mark_k": 4,
    "elapsed_hours": {"8": 176, "256": 192},
    "claim": "top-k routing with k = 4 captures most of the gain (k = 1 to k = N)",
}
SETTINGS = ("methods", "seed_runs", "start", "seeds", "first_seed", "seed_run_seed",
            "seed_updates", "budget", "budget_unit", "source", "prepare", "eval", "ensembles")


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=fig16 (the paper's Figure 16): top-k routing, k = 1..N, on saved SOMA ensembles of
  fixed-width experts (Figure 7's experts panel), each continuing one seed run; also
  fig17's ensembles.

    python experiments/compare.py --config=experiments/configs/compare.py:study=fig16,size=cpu --out=runs/fig16
  """
  c, a = recipes.paper_study(arg)
  size, cpu = a["size"], a["size"] == "cpu"
  c.seeds = a["seeds"] or 2  # the paper's figure shows one ensemble per N
  # 500 updates per ensemble and seed (the paper: 4M; 1,000 would not fit 12 min): N = 8 ran
  # 5.9 updates/s and N = 32 2.9 on 2 cores (docs/results/fig7_cpu.json), so 2 seeds x
  # (85 + 175) s of training: about 11-12 min with the seed run, the three data dirs' preparation
  # and the k sweeps
  c.budget = 500.0 if cpu else 3.0
  c.curve_points = 1  # the final checkpoint is the saved ensemble the figure scores
  c.ops_tolerance = 1.0  # the ensembles differ in cost per update (N)
  c.match_params = False  # fixed-width experts: more experts, more parameters
  c.update(recipes.corpus())
  # the figure's dashed line (the paper's top-4 routing), in 1..N of every ensemble
  c.mark_k = 4 if cpu else 2
  n_list = (8, 32) if cpu else (2, 6)  # the paper's 8 and 256
  recipes.rows(c, {f"n{n}": (recipes.recipe("soma.py", f"n={n},size={size}", size, c.base_lr),
                             f"SOMA N = {n}, fixed-width experts", "soma_expert")
                   for n in n_list})
  c.ensembles = tuple(f"n{n}" for n in n_list)  # N growing
  c.reference = c.ensembles[0]
  c.order = c.ensembles
  c.seed_runs = ml_collections.ConfigDict({"soma_expert": c.seed_runs.soma_expert})
  return c


@dataclasses.dataclass(frozen=True)
class Ensembles:
  """The study's own fields (`check`); `settings`: what fixes the trained ensembles and
  their scoring (fig17 reads a fig16 folder only under the same)."""
  plan: planning.StudyPlan
  names: tuple[str, ...]  # the ensembles' methods, N growing
  ns: tuple[int, ...]
  mark_k: int
  source: str
  prepare: dict
  seq_lens: tuple[int, ...]
  settings: dict


@dataclasses.dataclass(frozen=True)
class Run:
  """One trained ensemble at one optimisation seed."""
  seed: int
  name: str
  n_experts: int
  workdir: str
  wall: float | None  # wall seconds of this call's training (None: read, not trained here)


@dataclasses.dataclass(frozen=True)
class Trained:
  """The ensembles: data dirs {N: dir}, scored sets {N: (validation, test)}, seed-run
  records, every run, and the folder they live in."""
  dirs: dict
  scored: dict
  seeds: dict
  runs: tuple[Run, ...]
  folder: str


def check(plan: planning.StudyPlan, config: ml_collections.ConfigDict) -> Ensembles:
  """The ensembles (methods that exist, N >= 2 growing, one expert width); the mark; the
  corpus: every field checked before anything trains."""
  if plan.unit != "updates" or config.match_params:
    raise UserError(f"{config.study} trains every ensemble for the same updates at one expert "
                    "width; fix: --config.budget_unit=updates --config.match_params=False")
  names = tuple(config.ensembles)
  missing = [n for n in names if n not in config.methods]
  if missing or not names:
    raise UserError(f"ensembles={names} must name methods of {', '.join(config.methods)}; fix: "
                    "--config.ensembles=a tuple of them")
  ns = tuple(int(config.methods[n].n_experts) for n in names)
  if min(ns) < 2 or list(ns) != sorted(set(ns)):
    raise UserError(f"ensembles={names} have N = {list(ns)}: each needs N >= 2 (k = 1 .. N), "
                    "growing strictly; fix: --config.ensembles in increasing N")
  # k = mark_k must exist in every ensemble (k = 1 .. N): never clamped to a smaller N
  planning.check_fields(config, {"mark_k": planning.whole(1, min(ns))})
  widths = {int(config.methods[n].model.d_t) for n in names}
  if len(widths) != 1:
    raise UserError(f"ensembles={names} have expert widths {sorted(widths)}: the figure's "
                    "experts share one width; fix: the same model.d_t for each")
  planning.check_source(config)
  settings = json.loads(json.dumps({k: _plain(config[k]) for k in SETTINGS}))
  return Ensembles(plan, names, ns, config.mark_k, config.source,
                   recipes.settings(config.get("prepare")),
                   tuple(int(config.methods[n].data.seq_len) for n in names), settings)


def _plain(value):
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value


def ensembles(ens: Ensembles, ready: base.Setup) -> base.Stages:
  """Every ensemble at every optimisation seed (one stage), each continuing the seed's state
  on its own N-shard data dir under OUT; the Trained."""
  planned = seeded.every_seed(ready, ens.names, "updates", ready.plan.budget, score=False)
  done = tuple(Run(r.seed, r.name, r.spec.n_experts, r.workdir, r.wall)
               for r in (yield from seeded.trained(planned, ready.out)))
  return Trained(ready.data.dirs, ready.data.sets, ready.seeds, done, ready.out)


def trained_in(ens: Ensembles, folder: str) -> Trained:
  """A finished fig16 folder's ensembles, read without training: its results.json must be
  fig16's, with the same `settings` (same methods, seeds, budget, corpus and scoring), and
  every run's newest checkpoint and data dir present; else a UserError naming the fix."""
  folder = os.path.abspath(folder)
  fix = (f"fix: run study={STUDY.name} with the same settings there first, or "
         "--config.ensembles_from= (train here)")
  theirs = results.finished_study(folder, STUDY.name, "ensembles_from", fix)
  got = theirs.get("ensemble_settings") or {}
  differ = [k for k in SETTINGS if got.get(k) != ens.settings[k]]
  if differ:
    raise UserError(f"ensembles_from={folder!r} was trained with other settings "
                    f"({', '.join(differ)} differ); {fix}")
  dirs = {int(n): os.path.join(folder, d) for n, d in theirs["data_dirs"].items()}
  done = tuple(Run(int(r["seed"]), r["name"], int(r["n_experts"]),
                   os.path.join(folder, r["workdir"]), None) for r in theirs["runs"])
  wanted = {(s, n) for s in ens.plan.seeds for n in ens.names}
  lacking = [p for p in [*(os.path.join(d, "manifest.json") for d in dirs.values()),
                         *(r.workdir for r in done)] if not os.path.exists(p)]
  if lacking or {(r.seed, r.name) for r in done} != wanted:
    raise UserError(f"ensembles_from={folder!r} lacks {', '.join(lacking) or 'runs'}; {fix}")
  scored = {n: datasets.eval_sets(ens.plan.eval, d, list(ens.seq_lens)) for n, d in dirs.items()}
  datasets.same_windows(scored)
  return Trained(dirs, scored, theirs["seed_runs"], done, folder)


def scores(workdir: str, val: eval_lib.TestSet, pairs: bool = False
           ) -> tuple[eval_lib.Scores, int]:
  """(`evaluate.score` of a run's newest checkpoint on `val`, its step). Without `pairs`:
  each window's N experts ranked by its router, the top-k mixture for every k in 1..N; with
  `pairs`: every expert on every window (every pair seen on every window, `PairStats`)."""
  step, state, _, spec = runs_lib.restore_state(workdir)
  n = spec.n_experts
  if pairs:
    routes, ks = np.tile(np.arange(n, dtype=np.int32), (val.windows.shape[0], 1)), (n,)
  else:
    routes, ks = val.router.route_to(val.windows[:, :val.route], n, n), range(1, n + 1)
  sc = eval_lib.score(state.body, state.head, val.windows, routes, spec.shared_head, ks=ks,
                      pairs=pairs, logits_fn=spec.method.logits, first=val.route + 1)
  return sc, int(step)


def k_sweep(run: Run, val: eval_lib.TestSet, draws: int) -> dict:
  """One run's loss for every k in 1..N with its paired document-bootstrap interval (every
  k on the same draws), and the step scored."""
  sc, step = scores(run.workdir, val)
  lo, hi = eval_lib.bootstrap_ci(sc.mix_nxS, val.doc_ids, draws, run.seed)
  rows = [{"k": k, "nats_per_byte": float(sc.mix_nxS[:, s].mean()),
           "ci95": [float(lo[s]), float(hi[s])],
           "bits_per_byte": float(sc.mix_nxS[:, s].mean() / math.log(2))}
          for s, k in enumerate(sc.ks)]
  return {"seed": run.seed, "step": step, "k_sweep": rows}


def captured(losses: list[float], mark: int) -> float | None:
  """The k = 1 -> k = `mark` gain as a fraction of the k = 1 -> k = N gain (losses[k - 1]
  at k; None where k = N gains nothing)."""
  whole_gain = losses[0] - losses[-1]
  return (losses[0] - losses[mark - 1]) / whole_gain if whole_gain > 0 else None


def readout(ens: Ensembles, trained: Trained, per_seed: dict) -> dict:
  """results.json `measured`: per ensemble its loss against k (seed mean and sd, each seed's)
  and the gain captured at the mark, per seed and on the seed means."""
  start = trained.seeds[ens.plan.start[ens.names[0]]]["step"]
  out = {}
  for name, n in zip(ens.names, ens.ns, strict=True):
    rows = per_seed[name]
    loss_SxK = np.array([[q["nats_per_byte"] for q in r["k_sweep"]] for r in rows])
    mean = loss_SxK.mean(axis=0)
    mark = ens.mark_k  # in 1 .. N (`check`)
    fractions = [captured(list(x), mark) for x in loss_SxK]
    out[name] = {
        "n_experts": n, "ks": list(range(1, n + 1)), "mark_k": mark,
        "loss": [float(x) for x in mean],
        "loss_sd": [float(x) for x in loss_SxK.std(axis=0, ddof=1)] if len(rows) > 1 else None,
        "per_seed": [{**r, "updates": r["step"] - start} for r in rows],
        "gain_k1_to_kN": float(mean[0] - mean[-1]),
        "gain_k1_to_mark": float(mean[0] - mean[mark - 1]),
        "fraction_captured_at_mark": captured(list(mean), mark),
        "fraction_captured_per_seed": fractions,
        "how": "fraction = (loss(k=1) - loss(k=mark)) / (loss(k=1) - loss(k=N)), on the seed "
               "means (per seed beside it); None where k = N gains nothing"}
  f = [r["fraction_captured_at_mark"] for r in out.values()]
  return {"ensembles": out, "mark_k": ens.mark_k,
          "mark_captures_most": all(x is not None and x > 0.5 for x in f)}


def stages(ens: Ensembles, ready: base.Setup) -> base.Stages:
  """The ensembles (`ensembles`), then each one's k sweep on its validation set, written to
  OUT/k_sweep/NAME_seedS.csv; (the Trained, {ensemble: per-seed sweeps})."""
  trained = yield from ensembles(ens, ready)
  out, per_seed = ready.out, {name: [] for name in ens.names}
  os.makedirs(os.path.join(out, "k_sweep"), exist_ok=True)
  for r in trained.runs:
    swept = k_sweep(r, trained.scored[r.n_experts][0], ready.plan.bootstrap_draws)
    per_seed[r.name].append({**swept, "workdir": planning.shown(r.workdir, out),
                             "wall_seconds_this_call": r.wall})
    eval_lib.write_k_sweep(swept["k_sweep"], os.path.join(out, "k_sweep",
                                                          f"{r.name}_seed{r.seed}.csv"))
  return trained, per_seed


def measure(ens: Ensembles, ready: base.Setup, gathered: tuple) -> dict:
  """Each ensemble's loss against k and the gain captured at the mark (`readout`)."""
  trained, per_seed = gathered
  out = ready.out
  return {"budget": {"unit": "updates", "per": "ensemble and seed",
                     "seed_updates": ready.plan.seed_updates},
          "paper": PAPER, "measured": readout(ens, trained, per_seed),
          "ensemble_settings": ens.settings,
          "runs": [{"seed": r.seed, "name": r.name, "n_experts": r.n_experts,
                    "workdir": planning.shown(r.workdir, out)} for r in trained.runs],
          "scoring": "each window's own router ranks all N experts on its first route_bytes; "
                     "the top-k experts' next-byte probabilities averaged uniformly (float64), "
                     "k = 1..N"}


def plot(p: dict, path: str) -> None:
  """fig16.png: ensemble-validation loss against k per N (seed mean, each seed thin),
  the dashed line at k = mark."""
  fig, ax = report.plt.subplots(figsize=(6, 4))
  ens = p["measured"]["ensembles"]
  for r in ens.values():
    line, = ax.plot(r["ks"], r["loss"], "o-", ms=3, label=f"SOMA N = {r['n_experts']}")
    for q in r["per_seed"]:
      ax.plot(r["ks"], [x["nats_per_byte"] for x in q["k_sweep"]], "-", lw=0.7, alpha=0.4,
              color=line.get_color())
  mark = p["measured"].get("mark_k", PAPER["mark_k"])
  ax.axvline(mark, ls="--", c="gray", label=f"k = {mark}")
  if max(r["n_experts"] for r in ens.values()) > 16:
    ax.set_xscale("log", base=2)
  report.label(ax, "experts averaged k (top-k routing)")
  report.save_figure(fig, path)


def table(p: dict) -> str:
  """Markdown: per ensemble the loss at each k (seed mean ± sd) and the gain captured."""
  m, b = p["measured"], p["budget"]
  lines = [f"Figure 16 at this scale: every ensemble {b['amount']:g} updates from one seed run "
           f"({b['seed_updates']} updates, state continued), seeds {p['seeds']}; ensemble "
           f"validation ({p['eval']['val_windows']} windows of {p['eval']['score_bytes']} scored "
           f"targets from {p['eval']['val_documents']} documents). " + results.load_line(p), ""]
  for r in m["ensembles"].values():
    f = r["fraction_captured_at_mark"]
    lines += [f"**SOMA N = {r['n_experts']}**: k = {r['mark_k']} captures "
              f"{'n/a' if f is None else f'{f:.1%}'} of the k = 1 -> {r['n_experts']} gain "
              f"({r['gain_k1_to_kN']:+.4f} nats/byte).", "",
              *results.head("| k | loss | per seed |")]
    for i, k in enumerate(r["ks"]):
      sd = "" if r["loss_sd"] is None else f" ± {r['loss_sd'][i]:.4f}"
      per = ", ".join(f"{q['k_sweep'][i]['nats_per_byte']:.4f}" for q in r["per_seed"])
      lines.append(f"| {k}{' (marked)' if k == r['mark_k'] else ''} | {r['loss'][i]:.4f}{sd} "
                   f"| {per} |")
    lines.append("")
  mark = m.get("mark_k", PAPER["mark_k"])  # the sentence's k is the one its fractions used
  lines.append(f"k = {mark} captures most (> 50%) of the gain in every ensemble: "
               f"{'yes' if m['mark_captures_most'] else 'no'} (the paper: {PAPER['claim']}).")
  return "\n".join(lines) + "\n"


def _k_sweep_cell(r: dict) -> str:
  best = r["ks"][min(range(len(r["ks"])), key=lambda i: r["loss"][i])]
  at = lambda k: r["loss"][r["ks"].index(k)]
  return (f"N = {r['n_experts']}: k = 1 {at(1):.4f}, k = 4 {at(4):.4f}, k = N "
          f"{at(r['n_experts']):.4f}, lowest at k = {best}, k = 4 captures "
          f"{r['fraction_captured_at_mark']:.0%} of the k = 1 to N gain")


def ours_figure16(d: dict) -> str:
  ens = d["measured"]["ensembles"]
  return "; ".join(_k_sweep_cell(r) for r in ens.values()) + " (validation, 2 seeds)"


def brief_figure16(d: dict) -> str:
  ens = d["measured"]["ensembles"].values()
  return ("k = 4 captures " + " and ".join(f"{e['fraction_captured_at_mark']:.0%}" for e in ens)
          + " of k = N's gain")


PAPER_ROWS = (paper.StudyRow(
    "Figure 16", "top-k routing, k = 1 .. N", ours_figure16, "k = 4 captures most of the gain of "
    "k = N (N = 8 and 256, 4M updates)", "N = 8 and 32, 500 updates from one seed; k = 4 "
    "captures more than all of it here: the loss is lowest near k = 3 to 4 and rises towards "
    "k = N", brief=brief_figure16, paper_brief="k = 4 captures most",
    no_verdict="fractions of a gain over 2 seeds, no interval"),)

STUDY = base.Study(name="fig16",
                   spec="paper Figure 16 (top-k routing on saved ensembles), scaled down by "
                        "SPEC 9.6", config=config, check=check, stages=stages, measure=measure,
                   table=table, data=driver.per_n(lambda ens: ens.ns[-1]), plot=report.png(plot, "fig16.png"),
                   ops_tolerance=base.any_ops, paper_rows=PAPER_ROWS)
