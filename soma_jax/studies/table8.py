"""The paper's Table 8: the variance figures' exact-gradient references against an
independent batch of the same size, at init and after training, per N.

The reference is the one the experts variance study (the paper's Figure 10, left:
`variance.study_experts`) centres on and divides by: each expert's `jax.grad` of its loss on
its fixed batch of `batch` windows of T bytes, the batch its SPSA estimates difference
(`variance._fixed_batch`, with the study's seed and windows). For every N of the study's
n_list, at its fresh init and after training (the study's trained runs where its
`trained_dir` names them, else every N trained by its `train_run` recipe for `train_updates`
updates under OUT/trained, `trained_sizes`), this records the reference batch; the cosine
distance 1 - cos(g_ref, g_indep) of each expert, g_indep on `batch` other windows of the same
expert's source that share no byte with the reference (`independent_windows`), averaged over
the experts with equal weight (the paper gives one number per N and says no more); and each
variance value twice from the same estimates (one `probe_stats` call, two centres): the
relative centred variance E||g_hat - q g||^2 / ||g||^2 at the study's n_pert and at every
n_pert of its n_pert_list below it (disjoint blocks of the same directions), with g = g_ref
(the study's value) and with g = g_indep, and the relative change indep / ref - 1.
results.json `paper` carries the paper's table beside ours (`measured`).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from soma_jax.errors import UserError
from soma_jax.studies import (
  base,
  datasets,
  paper,
  planning,
  recipes,
  results,
  trained_sizes,
  variance,
  variance_settings,
  variance_windows,
)
from soma_jax.variance_measure import (
  block_errors,
  exact_grads,
  flat_N,
  relative,
  second_moment_N,
)

# The paper's Table 8 (../shared/paper/figures-and-tables.txt): BPTT reference batch sizes
# and the cosine distance to an independent batch of the same size, at initialisation and at
# 10,000 updates; the caption's bound on what the independent references change.
PAPER = {
    "item": "Table 8",
    "caption": "BPTT reference batch sizes and cosine distance to an independent batch of the "
               "same size. Trained N=1 is just above 0.01. Using the independent references "
               "changes every plotted value by less than 4%.",
    "trained_updates": 10_000,
    "rows": [
        {"n": 1, "batch_init": 8000, "cosine_distance_init": 0.00002,
         "batch_trained": 8000, "cosine_distance_trained": 0.01045},
        {"n": 2, "batch_init": 8000, "cosine_distance_init": 0.00002,
         "batch_trained": 8000, "cosine_distance_trained": 0.00503},
        {"n": 8, "batch_init": 8000, "cosine_distance_init": 0.00002,
         "batch_trained": 4000, "cosine_distance_trained": 0.00492},
        {"n": 256, "batch_init": 8000, "cosine_distance_init": 0.00013,
         "batch_trained": 1600, "cosine_distance_trained": 0.00759},
    ],
    "max_relative_change": 0.04,
}

INDEPENDENT_STREAM = 8  # the independent batch's draws: np.random.default_rng([seed, 8])


def config(arg: str | None = None) -> ml_collections.ConfigDict:
  """study=table8 (the paper's Table 8): the experts variance study's jax.grad references
  (Figure 10, left) against an independent batch of the same size, per N, at init and after
  training; what each variance value changes by.

    python experiments/compare.py --config=experiments/configs/compare.py:study=table8,size=cpu --out=runs/table8
  """
  a = recipes.args(arg)
  c = ml_collections.ConfigDict()
  c.study = a["study"]
  c.size = a["size"]  # the variance config's preset below
  # The experts study as experiments/configs/variance.py:experts has it at this size (cpu:
  # N = 1, 2, 8, 32 at about 2M parameters, fixed batch B = 4 windows of T = 64, sparse
  # probes, n_pert 16, 8 repeats; its trained_dir names trained runs, "" = train them here).
  c.variance = recipes.method("variance.py", f"experts,size={a['size']}")
  # Updates of each N's run by the study's train_run recipe (n_pert 4, B 4, T = 256 at cpu)
  # where variance.trained_dir is "": the paper measured at 10,000; about 1 s per update per
  # N here at 2M parameters (the recipe's own 1,000 would take over an hour)
  c.train_updates = 40 if a["size"] == "cpu" else 3
  c.x64 = False  # measure in float64 (about 2x the measurement's time)
  c.prepare = ml_collections.ConfigDict()  # prepare.prepare's keyword settings (tests)
  return c


@dataclasses.dataclass(frozen=True)
class Table8Spec:
  """The study's settings, read once from its config by `check`."""

  vs: variance_settings.VarianceSpec  # the experts variance study measured
  train_updates: int  # updates of each N's run where the study names no trained runs
  prepare: dict  # prepare.prepare's keyword settings for the training data (tests)
  x64: bool  # measure in float64


FIELDS = {
    "train_updates": planning.whole(1), "x64": planning.one_of(True, False),
    "variance.batch": planning.whole(1), "variance.seq_len": planning.whole(1),
    "variance.n_pert": planning.whole(1), "variance.reps": planning.whole(2),
    "variance.seed": planning.whole(0),
}


def check(plan: None, config: ml_collections.ConfigDict) -> Table8Spec:
  """Every field of study=table8 checked before anything trains (it has no shared plan:
  `base.Study.planned`); its typed settings."""
  del plan
  planning.check_fields(config, FIELDS)
  v = config.variance
  if v.study != "experts":
    raise UserError(f"variance.study={v.study!r}: Table 8 reads the experts study's per-N "
                    "references (Figure 10, left); fix: --config.variance.study=experts")
  ns = tuple(v.n_list)
  if not ns or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in ns) or (
      len(set(ns)) != len(ns)):
    raise UserError(f"variance.n_list={ns!r} must be distinct expert counts >= 1; fix: "
                    "--config.variance.n_list='(1, 2, 8, 32)'")
  if not v.trained_dir and not (isinstance(v.trained_source, str) and v.trained_source):
    raise UserError(f"variance.trained_source={v.trained_source!r}: the corpus each N's run "
                    "trains on; fix: --config.variance.trained_source=pystdlib or textdir:DIR")
  return Table8Spec(variance_settings.variance_spec(v), config.train_updates,
                    dict(config.get("prepare", {}).items()), bool(config.x64))


def free_starts(taken: np.ndarray, size: int, length: int) -> np.ndarray:
  """The starts 0..size-1 of `length`-byte windows that share no byte with a window of the
  same length starting at any of `taken`."""
  ok = np.ones(size, bool)
  for s in np.asarray(taken, np.int64):
    ok[max(0, s - length + 1):max(0, s + length)] = False
  return np.flatnonzero(ok)


def _enough(free: int, count: int, e: int) -> None:
  if free < count:
    raise UserError(f"expert {e} has {free} windows that share no byte with its reference "
                    f"batch; the independent batch needs {count}; fix: raise "
                    "variance.corpus_bytes or lower variance.batch")


def independent_windows(n: int, count: int, seq_len: int, seed: int, data_dir: str,
                        corpus_bytes: int, reference: dict) -> tuple[np.ndarray, dict]:
  """[N, count, T + 1] windows per expert, from the same source as the reference batch whose
  `variance_windows.expert_windows` record is `reference`, none sharing a byte with it, and their
  record. With a data dir: expert-validation sub-windows other than the reference's and their
  neighbours (sub-windows k and k + 1 share a byte); else starts in the expert's slice of the
  standard-library corpus at least T + 1 bytes from every reference start."""
  rng = np.random.default_rng([seed, INDEPENDENT_STREAM])
  if data_dir:
    from soma_jax.data import pipeline

    rows, picks = [], []
    for e, (shard, taken) in enumerate(zip(reference["shard_of_expert"],
                                           reference["val_window_index"], strict=True)):
      w = pipeline.expert_val_windows(data_dir, shard, seq_len)
      near = np.asarray(taken)[:, None] + np.array([-1, 0, 1])
      free = np.setdiff1d(np.arange(len(w)), near.ravel())
      _enough(len(free), count, e)
      idx = np.sort(rng.choice(free, count, replace=False))
      rows.append(np.asarray(w[idx]))
      picks.append(idx.tolist())
    return np.stack(rows), {"data_dir": data_dir, "shard_of_expert": reference["shard_of_expert"],
                            "val_window_index": picks}
  corpus = variance_windows.stdlib_corpus(corpus_bytes)
  part = len(corpus) // n
  starts = []
  for e, taken in enumerate(reference["byte_offsets"]):
    free = free_starts(np.asarray(taken) - e * part, part - seq_len, seq_len + 1)
    _enough(len(free), count, e)
    starts.append(e * part + np.sort(rng.choice(free, count, replace=False)))
  idx = np.stack(starts)[..., None] + np.arange(seq_len + 1)
  return corpus[idx], {"source": "pystdlib", "corpus_bytes": len(corpus),
                       "byte_offsets": [s.tolist() for s in starts]}


def cosine_distance(a_NxD: np.ndarray, b_NxD: np.ndarray) -> np.ndarray:
  """[N]: 1 - cos(a_e, b_e) of each row, in float64."""
  a, b = np.asarray(a_NxD, np.float64), np.asarray(b_NxD, np.float64)
  return 1.0 - np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def relative_change(reference: float, independent: float) -> float:
  """What the independent reference changes a variance value by: indep / ref - 1."""
  return independent / reference - 1.0


def n_pert_points(vs: variance_settings.VarianceSpec) -> tuple[int, ...]:
  """The study's n_pert and every n_pert of its n_pert_list that divides it."""
  return tuple(sorted({vs.n_pert, *(k for k in vs.n_pert_list if vs.n_pert % k == 0)}))


def compare_references(vs: variance_settings.VarianceSpec, body_N, head, shared: bool,
                       win_NxBxT1: np.ndarray, g_NxD: jax.Array, ind_NxBxT1: np.ndarray) -> dict:
  """The reference g_NxD (jax.grad on `win_NxBxT1`, the probes' batch) against the gradient
  of `ind_NxBxT1`: cosine distances and every variance value with either as the reference."""
  g_ind = flat_N(exact_grads(body_N, head, jnp.asarray(ind_NxBxT1), shared))
  g_np, ind_np = (np.asarray(x, np.float64) for x in (g_NxD, g_ind))
  q = second_moment_N(body_N, vs.probe)
  # One set of estimates, two centres: q g_ref (the study's) and q g_indep.
  st = variance._stats(vs, body_N, head, shared, win_NxBxT1[:, None],
                       jnp.stack([q * g_NxD, q * g_ind], axis=1), vs.n_pert, vs.probe)
  norms = (np.sum(g_np**2, -1), np.sum(ind_np**2, -1))
  points = []
  for k in n_pert_points(vs):
    (ref, ref_se), (ind, ind_se) = (relative(block_errors(st, k, centre=c), norms[c])
                                    for c in (0, 1))
    points.append({"n_pert": k, "reference": ref, "reference_se": ref_se, "independent": ind,
                   "independent_se": ind_se, "relative_change": relative_change(ref, ind),
                   "blocks_per_rep": vs.n_pert // k, "reps": vs.reps})
  cos = cosine_distance(g_np, ind_np)
  return {"cosine_distance": float(cos.mean()), "cosine_distance_per_expert": cos.tolist(),
          "cosine_distance_ensemble": float(cosine_distance(g_np.reshape(1, -1),
                                                            ind_np.reshape(1, -1))[0]),
          "norm_sq_independent_over_reference": float(norms[1].sum() / norms[0].sum()),
          "points": points}


def measure_n(vs: variance_settings.VarianceSpec, n: int,
              trained: dict[int, variance_settings.Trained] | None) -> dict:
  """One N's row: the experts study's experts, batch and reference (fresh, or `trained`)
  against an independent batch of the same size."""
  params, mcfg, data_dir, weights, run = variance._per_n(vs, n, trained)
  body_N, head, shared, win, ref_rec, g, _, _ = variance._fixed_batch(vs, n, params, mcfg, "",
                                                                      data_dir)
  ind, ind_rec = independent_windows(n, vs.batch, vs.seq_len, vs.seed, data_dir,
                                     vs.corpus_bytes, ref_rec)
  got = compare_references(vs, body_N, head, shared, win, g, ind)
  return {"n": n, "d_t": mcfg.d_t, "body_params_per_expert": int(g.shape[1]),
          "batch": vs.batch, "seq_len": vs.seq_len, "batch_bytes": vs.batch * vs.seq_len,
          "weights": weights, "run": run, **got,
          "max_abs_relative_change": max(abs(p["relative_change"]) for p in got["points"]),
          "windows": {"reference": ref_rec, "independent": ind_rec}}


def setup(t: Table8Spec, plan: None, out: str, executor=None) -> base.Setup:
  """Each N's trained run: the study's (its trained_dir) or, where it names none, every N
  trained by its train_run recipe for train_updates updates under OUT/trained (finished runs
  are reused; one after another in this process, `trained_sizes.train_all`: `executor` is
  unused); data.extra: (spec, {N: Trained}, how)."""
  del executor
  vs = t.vs
  how = f"the variance study's trained runs in {vs.trained_dir}"
  if not vs.trained_dir:
    where = os.path.join(out, "trained")
    vs = variance_settings.with_changes(vs, trained_dir=where, train_run={"steps": t.train_updates})
    datasets.prepared_dirs(vs.trained_source, t.prepare, list(vs.n_list), where)
    trained_sizes.train_all(vs, where)
    how = (f"the variance study names no trained runs at size={vs.size}: each N trained here "
           f"by its train_run recipe for {t.train_updates} updates (the paper: "
           f"{PAPER['trained_updates']:,})")
  return base.Setup(plan, {}, {}, {}, "", None, {}, out,
                    base.Data({}, {}, None, None, (*trained_sizes.load_all(vs), how)))


def stages(t: Table8Spec, ready: base.Setup) -> base.Stages:
  """Every N measured at init and trained (nothing more to train): ({state: rows}, how)."""
  vs_trained, trained, how = ready.data.extra
  with jax.enable_x64(t.x64):
    states = {"init": [measure_n(t.vs, n, None) for n in t.vs.n_list],
              "trained": [measure_n(vs_trained, n, trained) for n in vs_trained.n_list]}
  return states, how
  yield


def measure(t: Table8Spec, ready: base.Setup, gathered: tuple) -> dict:
  """results.json's fields beyond the common ones: ours (`summarise`) beside the paper's."""
  states, how = gathered
  return {
      "x64": t.x64, "paper": PAPER, "measured": summarise(states), "trained": how,
      "reference": f"jax.grad of each expert's mean loss on its fixed batch of {t.vs.batch} "
                   f"windows of T = {t.vs.seq_len} (the batch its SPSA estimates difference)",
      "independent": f"{t.vs.batch} windows of each expert's own source sharing no byte "
                     "with its reference batch; same parameters",
      "averaging": "cosine distance per expert, then the mean over experts (equal weight); "
                   "cosine_distance_ensemble: of the N experts' concatenated gradients",
      "variance_value": "relative centred variance E||g_hat - q g||^2 / ||g||^2 (sums over "
                        "experts), with g = g_ref (the experts study's value) or g = g_indep, "
                        "from the same estimates; relative change = indep / ref - 1",
      "variance_config": t.vs.config.to_dict()}


def summarise(states: dict[str, list[dict]]) -> dict:
  """Per state its rows, the largest |relative change| over its points; over both states."""
  worst = {s: max(r["max_abs_relative_change"] for r in rows) for s, rows in states.items()}
  return {"states": states, "max_abs_relative_change": worst,
          "max_abs_relative_change_all": max(worst.values()),
          "within_paper_bound": max(worst.values()) < PAPER["max_relative_change"]}


def table(p: dict) -> str:
  """Markdown: the paper's layout (N, batch and cosine distance at init and trained) with
  ours beside it, and the largest relative change of a variance value."""
  m, states = p["measured"], p["measured"]["states"]
  init, done = ({r["n"]: r for r in states[s]} for s in ("init", "trained"))
  lines = [
      f"Table 8 at this scale: the experts variance study's reference (jax.grad on each "
      f"expert's fixed batch) against an independent batch of the same size. Trained: "
      f"{p['trained']}. Batch: windows of T bytes per expert; cosine distance: the mean over "
      "experts. Paper: windows of its own length, 8.44M parameters.", "",
      *results.head("| N | batch (init) | cos. dist. (init) | batch (trained) | cos. dist. "
                    "(trained) | max abs rel. change (init / trained) | paper batch | paper "
                    "cos. dist. (init / trained) |")]
  paper = {r["n"]: r for r in PAPER["rows"]}
  cell = lambda r: ("- | -" if r is None else
                    f"{r['batch']} x {r['seq_len']} | {r['cosine_distance']:.5f}")
  for n in sorted(set(init) | set(paper)):
    a, b, q = init.get(n), done.get(n), paper.get(n)
    change = " / ".join("-" if r is None else f"{r['max_abs_relative_change']:.2%}"
                        for r in (a, b))
    theirs = ("- | -" if q is None else f"{q['batch_init']} / {q['batch_trained']} | "
              f"{q['cosine_distance_init']:.5f} / {q['cosine_distance_trained']:.5f}")
    lines.append(f"| {n} | {cell(a)} | {cell(b)} | {change} | {theirs} |")
  lines += ["", f"Largest change of a variance value (every N, every n_pert of "
            f"{[q['n_pert'] for q in states['init'][0]['points']]}, init and trained): "
            f"{m['max_abs_relative_change_all']:.2%} (paper: every plotted value < "
            f"{PAPER['max_relative_change']:.0%}; "
            f"{'within' if m['within_paper_bound'] else 'not within'} it here)."]
  return "\n".join(lines) + "\n"


def ours_table8(d: dict) -> str:
  st = d["measured"]
  dist = lambda k: ", ".join(f"{r['cosine_distance']:.3f}" for r in st["states"][k])
  return (f"cosine distance at init {dist('init')}, trained {dist('trained')} (N = 1, 2, 8, 32); "
          f"largest change of a variance value {st['max_abs_relative_change']['init']:.0%}")


def brief_table8(d: dict) -> str:
  states = d["measured"]["states"]
  dist = [s["cosine_distance"] for k in ("init", "trained") for s in states[k]]
  return f"cosine distance {min(dist):.3f}-{max(dist):.3f}"


PAPER_ROWS = (paper.StudyRow(
    "Table 8", "BPTT reference gradients against an independent batch", ours_table8, "cosine "
    "distance 0.00002 to 0.0105; every variance value moves < 4%", "", brief=brief_table8,
    paper_brief="0.00002-0.0105", not_comparable="our reference is jax.grad on the estimator's "
    "own 4-window batch (paper: 1,600 to 8,000 windows), so an independent batch differs far "
    "more"),)

STUDY = base.Study(name="table8",
                   spec="paper Table 8 (BPTT reference against an independent batch), on the "
                        "experts variance study (Figure 10, left) at this size",
                   config=config, check=check, stages=stages, measure=measure, table=table,
                   setup=setup, planned=False, paper_rows=PAPER_ROWS)
