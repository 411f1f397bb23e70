"""The variance studies of SPEC 5: measured error (`soma_jax.variance_measure`) against the theory
(`soma_jax.variance_theory`), one function per study in `STUDIES`, each returning a JSON-ready
dict with the record that replays its probes and data.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from soma_jax import config as config_lib
from soma_jax import model as model_lib
from soma_jax import sizing, spsa, train_state
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from soma_jax.loop import Loop
from soma_jax.variance_measure import (
  PyTree,
  block_errors,
  exact_grads,
  flat_N,
  pool_grad_moments,
  pool_grad_stats,
  probe_stats,
  relative,
  second_moment_N,
  take_experts,
)
from soma_jax.variance_theory import (
  batch_error,
  batch_noise,
  batch_prediction,
  best_batch,
  dense_prediction,
  grouped_sparse_prediction,
  sparse_prediction,
)

# ----------------------------------------------------------------------------- timing


def step_seconds(cfg: model_lib.ModelConfig, n: int, n_pert: int, batch: int, seq_len: int,
                 pert_chunk: int = 16, steps: int = 3, seed: int = 0) -> float:
  """Mean seconds of SOMA's jitted step (FP32) for N experts, after compiling."""
  step_cfg = spsa.StepConfig(
      model=cfg, spsa=spsa.SpsaConfig(n_pert=n_pert, pert_chunk=math.gcd(n_pert, pert_chunk)),
      train_head=False, seed=seed)
  body_N, head = model_lib.init_experts(jax.random.key(seed), cfg, n)
  body_N = jax.tree.map(lambda x: x.astype(jnp.float32), body_N)
  state = train_state.init_state(body_N, head.astype(jnp.float32), 1e-3, 1e-3, step_cfg.weight_decay,
                                 step_cfg.train_head)
  data = jax.random.randint(jax.random.key(seed), (n, 1, batch, seq_len + 1), 0, 256)
  data = data.astype(jnp.uint8)
  # SOMA's registered step (a soma config's Method; at this study's step config), advanced by
  # the training loop: the first (compiling) update is waited for, then `steps` are timed.
  soma_step = spec_lib.resolve(config_lib.base_config(n=1, size="tiny")).method.train_step
  loop = Loop(state, functools.partial(soma_step, cfg=step_cfg),
              itertools.repeat(data), jnp.arange(n))
  updates = loop.run(0, steps + 1)
  jax.block_until_ready(next(updates)[1])
  t0 = time.perf_counter()
  m = None
  for _, m in updates:  # noqa: B007 - the last update's metrics are waited for below
    pass
  jax.block_until_ready((loop.state, m))
  return (time.perf_counter() - t0) / steps


# ------------------------------------------------------------------------------ data


def stdlib_corpus(max_bytes: int) -> np.ndarray:
  """The first `max_bytes` bytes of this Python's standard library sources (real text)."""
  from soma_jax.data import sources

  out, total = [], 0
  for _, text in sources.iter_pystdlib():
    out.append(np.frombuffer(text, np.uint8))
    total += len(text)
    if total >= max_bytes:
      break
  return np.concatenate(out)[:max_bytes]


def shard_of_experts(n: int, data_dir: str, expert_shards: str = "") -> list[int]:
  """The shard each of n experts reads: `expert_shards` ("4,5,6,7", one per expert, e.g.
  experts 4-7 of a trained ensemble), else shard e mod num_clusters."""
  from soma_jax.data import pipeline

  shards = int(pipeline.load_manifest(data_dir)["num_clusters"])
  if not expert_shards:
    return [e % shards for e in range(n)]
  try:
    ids = [int(x) for x in str(expert_shards).split(",")]
  except ValueError:
    raise UserError(f"expert_shards={expert_shards!r} is not a comma list of shard ids") from None
  if len(ids) != n or not all(0 <= e < shards for e in ids):
    raise UserError(f"expert_shards={expert_shards!r}: need {n} shard ids in 0..{shards - 1}")
  return ids


def expert_windows(n: int, count: int, seq_len: int, seed: int, data_dir: str = "",
                   corpus_bytes: int = 1 << 21, expert_shards: str = "") -> tuple[np.ndarray, dict]:
  """[N, count, T + 1] uint8 windows per expert, and a record that replays them.

  With `data_dir`: expert e's expert-validation windows of its shard (`shard_of_experts`),
  picked by a seeded choice. Without: expert e reads the e-th of N contiguous slices of the
  standard-library corpus at seeded offsets, so each expert has its own "cluster".
  """
  rng = np.random.default_rng(seed)
  if data_dir:
    from soma_jax.data import pipeline

    shard_of = shard_of_experts(n, data_dir, expert_shards)
    rows, picks = [], []
    for shard in shard_of:
      w = pipeline.expert_val_windows(data_dir, shard, seq_len)
      idx = rng.choice(len(w), count, replace=len(w) < count)
      rows.append(np.asarray(w[np.sort(idx)]))
      picks.append(np.sort(idx).tolist())
    return np.stack(rows), {"data_dir": data_dir, "shard_of_expert": shard_of,
                            "val_window_index": picks}
  corpus = stdlib_corpus(corpus_bytes)
  part = len(corpus) // n
  if part < seq_len + 1:
    raise ValueError(f"{len(corpus)} corpus bytes are too few for {n} experts")
  starts = [e * part + np.sort(rng.integers(0, part - seq_len, count)) for e in range(n)]
  idx = np.stack(starts)[..., None] + np.arange(seq_len + 1)
  return corpus[idx], {"source": "pystdlib", "corpus_bytes": len(corpus),
                       "byte_offsets": [s.tolist() for s in starts]}


def _slot_sources(n: int, seq_len: int, data_dir: str, corpus_bytes: int, split: str
                  ) -> tuple[list[np.ndarray], dict]:
  """Each expert's windows of T + 1 bytes to draw from, and how to find them again."""
  if data_dir:
    from soma_jax.data import pipeline

    if split == "ensemble_val":  # the same chunks for every expert (SPEC 9.5)
      w = pipeline.subwindows(pipeline.eval_split(data_dir, "ensemble_val")[0], seq_len)
      return [np.asarray(w)] * n, {"data_dir": data_dir, "split": split,
                                   "slot": f"index into ensemble_val.npy's {seq_len + 1}-byte "
                                           "sub-windows"}
    if split != "expert_val":
      raise UserError(f"windows={split!r}; use expert_val or ensemble_val")
    shards = int(pipeline.load_manifest(data_dir)["num_clusters"])
    sources = [np.asarray(pipeline.expert_val_windows(data_dir, e % shards, seq_len))
               for e in range(n)]
    return sources, {"data_dir": data_dir, "split": split,
                     "shard_of_expert": [e % shards for e in range(n)],
                     "slot": "index into the shard's expert-validation windows"}
  corpus = stdlib_corpus(corpus_bytes)
  part = len(corpus) // n
  slots = part // (seq_len + 1)
  sources = [corpus[e * part:e * part + slots * (seq_len + 1)].reshape(slots, seq_len + 1)
             for e in range(n)]
  return sources, {"source": "pystdlib", "corpus_bytes": len(corpus),
                   "slot": f"bytes e * {part} + slot * {seq_len + 1} onwards, {seq_len + 1} of them"}


def disjoint_windows(n: int, count_zo: int, count_ref: int, seq_len: int, seed: int,
                     data_dir: str = "", corpus_bytes: int = 1 << 21, split: str = "expert_val"
                     ) -> tuple[np.ndarray, np.ndarray, dict]:
  """Zero-order and reference windows per expert that share no window, and their record.

  Returns [N, count_zo, T + 1], [N, count_ref, T + 1]. Each expert's source is cut into
  slots of T + 1 bytes: with `data_dir`, its expert-validation windows of shard
  e mod num_clusters (split="expert_val") or the ensemble-validation chunks
  (split="ensemble_val"); else non-overlapping slots of its 1/N slice of the
  standard-library corpus. One seeded permutation per expert gives the zero-order set its
  first count_zo slots and the reference set the next count_ref, so no slot is in both.
  """
  rng = np.random.default_rng(seed)
  need = count_zo + count_ref
  sources, record = _slot_sources(n, seq_len, data_dir, corpus_bytes, split)
  zo, ref, zo_slots, ref_slots = [], [], [], []
  for e, src in enumerate(sources):
    if len(src) < need:
      raise UserError(f"expert {e} has {len(src)} windows of {seq_len + 1} bytes; the study needs "
                      f"{need} (pool + ref_batch); fix: lower pool or ref_batch, or raise "
                      "corpus_bytes")
    perm = rng.permutation(len(src))
    a, b = np.sort(perm[:count_zo]), np.sort(perm[count_zo:need])
    zo.append(src[a])
    ref.append(src[b])
    zo_slots.append(a.tolist())
    ref_slots.append(b.tolist())
  record.update(zero_order_slots=zo_slots, reference_slots=ref_slots)
  return np.stack(zo), np.stack(ref), record


# ------------------------------------------------------------------------------ spec


@dataclasses.dataclass(frozen=True)
class VarianceSpec:
  """A variance study's settings (experiments/configs/variance.py), read once from its config
  by `variance_spec`; the studies read these, and `config` only goes into the results."""

  study: str  # which study runs, a key of STUDIES
  size: str  # the preset the defaults come from: tiny, cpu or trained
  seed: int  # fresh-init key and window selection
  probe_seed: int  # base key of every direction
  eps: float  # central-difference scale
  probe: str  # probe of the shared_vs_separate, experts and reference studies
  reps: int  # independent repeats; error bars are over these
  rep_chunk: int  # repeats evaluated at once
  dir_chunk: int  # directions evaluated at once
  n_experts: int  # experts of the n_pert and batch studies
  n_pert: int  # the headline n_pert
  n_pert_list: tuple[int, ...]  # n_pert values (shared_vs_separate, n_pert)
  batch: int  # B: windows in the fixed batch; the reference study's base B
  seq_len: int  # T: targets per window
  data_dir: str  # a prepared data dir; "" = stdlib text
  expert_shards: str  # the shard of each expert, "4,5,6,7"; "" = expert e on shard e
  weights: str  # which trained weights are measured; "" = none named
  corpus_bytes: int  # stdlib bytes read when data_dir is ""
  pool: int  # windows per expert behind the batch draws
  ref_batch: int  # reference: windows per expert of the BPTT reference
  budget: int  # batch study: n_pert * B held fixed
  accum_list: tuple[int, ...]  # batch study: A accumulated batches
  accum_batch: int  # batch study: windows per accumulated batch
  accum_n_pert: int  # batch study: directions per accumulated batch
  n_list: tuple[int, ...]  # experts / reference studies: expert counts N
  total_params: int  # each N's ensemble size; 0 = N bodies that hold one model.d_t body
  alloc_mult: tuple[int, ...]  # reference: multiples of the base n_pert and B
  time_steps: int  # reference: timed train steps per allocation
  model: model_lib.ModelConfig  # model.d_t, d_e and depth, one shared head
  windows: str  # reference windows with a data dir: expert_val or ensemble_val
  trained_dir: str | None  # the folder of trained runs per N; None: the study has none
  trained_source: str | None  # the corpus train_sizes prepares for each N
  train_run: ml_collections.ConfigDict | None  # the recipe of every N's training run
  config: ml_collections.ConfigDict  # the config all of this is read from, for the results


def variance_spec(c: ml_collections.ConfigDict) -> VarianceSpec:
  """The `VarianceSpec` of a variance config (experiments/configs/variance.py:STUDY); the
  per-N fields (trained_dir, windows, trained_source, train_run) only where the study has
  them."""
  m = c.model
  return VarianceSpec(
      study=c.study, size=c.size, seed=c.seed, probe_seed=c.probe_seed, eps=c.eps,
      probe=c.probe, reps=c.reps, rep_chunk=c.rep_chunk, dir_chunk=c.dir_chunk,
      n_experts=c.n_experts, n_pert=c.n_pert, n_pert_list=tuple(c.n_pert_list), batch=c.batch,
      seq_len=c.seq_len, data_dir=c.data_dir, expert_shards=c.get("expert_shards", ""),
      weights=c.get("weights", ""), corpus_bytes=c.corpus_bytes, pool=c.pool,
      ref_batch=c.ref_batch, budget=c.budget, accum_list=tuple(c.accum_list),
      accum_batch=c.accum_batch, accum_n_pert=c.accum_n_pert, n_list=tuple(c.n_list),
      total_params=c.total_params, alloc_mult=tuple(c.alloc_mult), time_steps=c.time_steps,
      model=model_lib.ModelConfig(d_t=m.d_t, d_e=m.d_e, depth=m.depth, shared_head=True),
      windows=c.get("windows", "expert_val"), trained_dir=c.get("trained_dir"),
      trained_source=c.get("trained_source"), train_run=c.get("train_run"), config=c)


def with_changes(vs: VarianceSpec, **changes: Any) -> VarianceSpec:
  """`vs` read again from a copy of its config with `changes` made (a dict value updates the
  sub-config of its key), e.g. the model and weights of a trained run it measures."""
  changed = copy.deepcopy(vs.config)
  with changed.unlocked():
    for key, value in changes.items():
      if isinstance(value, dict):
        changed[key].update(value)
      else:
        changed[key] = value
  return variance_spec(changed)


# --------------------------------------------------------------------------- studies

GROUPINGS = {"one_sum": (0, 0, 0, 0), "pairs": (0, 0, 1, 1), "separate": (0, 1, 2, 3)}


def _dtype():
  return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def _experts(vs: VarianceSpec, n: int, params=None, mcfg: model_lib.ModelConfig | None = None):
  """(body_N, head, shared_head, model config): experts 0..n-1 of `params` (cyclically) or fresh."""
  if params is None:
    mcfg = mcfg or vs.model
    body_N, head = model_lib.init_experts(jax.random.key(vs.seed), mcfg, n)
    shared = mcfg.shared_head
  else:
    body_N, head = params
    shared = head.ndim == 2
    have = jax.tree.leaves(body_N)[0].shape[0]
    body_N, head = take_experts(body_N, head, [e % have for e in range(n)], shared)
  dt = _dtype()
  return jax.tree.map(lambda x: x.astype(dt), body_N), head.astype(dt), shared, mcfg


def _weights(vs: VarianceSpec, params) -> str:
  """What the study measured: the trained weights `vs.weights` names, or a fresh init."""
  if params is None:
    return f"fresh init (seed {vs.seed})"
  return vs.weights or "trained (given parameters)"


def _probe_record(vs: VarianceSpec, steps: int, n_dirs: int, kind: str, n: int) -> dict:
  return {"base_key": f"jax.random.key({vs.probe_seed})", "steps": [0, steps], "n_dirs": n_dirs,
          "expert_ids": list(range(n)), "probe": kind, "eps": vs.eps,
          "direction_key": "spsa.probe_key(base_key, step, expert, 0, j)",
          "block": "block b of n_pert K uses directions j = b K .. (b + 1) K - 1"}


def _stats(vs: VarianceSpec, body_N, head, shared, windows, centres_NxCxD, n_dirs, kind,
           first_step=0):
  """probe_stats for repeats at steps first_step .. first_step + reps - 1."""
  n = jax.tree.leaves(body_N)[0].shape[0]
  return probe_stats(body_N, head, windows, centres_NxCxD, vs.eps,
                     jnp.arange(first_step, first_step + vs.reps),
                     jnp.arange(n), jax.random.key(vs.probe_seed), n_dirs=n_dirs, kind=kind,
                     shared_head=shared, dir_chunk=vs.dir_chunk, rep_chunk=vs.rep_chunk)


def _ratio(err_a_RxN, err_b_RxN) -> tuple[float, float]:
  """mean(a) / mean(b) over repeats with a delta-method standard error."""
  x, y = err_a_RxN.sum(1), err_b_RxN.sum(1)
  ratio = x.mean() / y.mean()
  return float(ratio), float(np.std(x - ratio * y, ddof=1) / math.sqrt(len(x)) / y.mean())


def _fixed_batch(vs: VarianceSpec, n: int, params=None, mcfg: model_lib.ModelConfig | None = None,
                 expert_shards: str | None = None, data_dir: str | None = None):
  """The experts (`_experts`), each one's fixed batch of vs.batch windows (`expert_windows`,
  on `expert_shards`, default vs.expert_shards, of `data_dir`, default vs.data_dir) and exact
  gradients on it:
  (body_N, head, shared, windows, data record, g_NxD, g_NxD as float64 numpy, ||g_e||^2)."""
  body_N, head, shared, _ = _experts(vs, n, params, mcfg)
  shards = vs.expert_shards if expert_shards is None else expert_shards
  data_dir = vs.data_dir if data_dir is None else data_dir
  win, data_rec = expert_windows(n, vs.batch, vs.seq_len, vs.seed, data_dir, vs.corpus_bytes,
                                 shards)
  g = flat_N(exact_grads(body_N, head, jnp.asarray(win), shared))
  g_np = np.asarray(g, np.float64)
  return body_N, head, shared, win, data_rec, g, g_np, np.sum(g_np**2, -1)


def study_shared_vs_separate(vs: VarianceSpec, params=None) -> dict:
  """N = 4: one summed loss, two pair losses, four own losses; same weights, data, directions.

  Probes `vs.probe` (the paper's sparse ones by default); error around the estimator's mean
  q * g, predicted by `grouped_sparse_prediction` (dense: (M_G - 1) / n_pert per group).
  """
  n = 4
  body_N, head, shared, win, data_rec, g, g_np, g2 = _fixed_batch(vs, n, params)
  q = second_moment_N(body_N, vs.probe)
  q_np = np.asarray(q, np.float64)
  d = g.shape[1]
  k_max = max(vs.n_pert_list)
  st = _stats(vs, body_N, head, shared, win[:, None], (q * g)[:, None], k_max, vs.probe)
  points, errs = [], {}
  for k in vs.n_pert_list:
    for name, groups in GROUPINGS.items():
      errs[name, k] = block_errors(st, k, loss_groups=groups)
      rel, se = relative(errs[name, k], g2)
      points.append({"grouping": name, "n_pert": k, "measured": rel, "se": se,
                     "predicted": grouped_sparse_prediction(g_np, q_np, groups, k),
                     "reps": vs.reps, "blocks_per_rep": k_max // k})
  ratios, predicted = {}, {}
  separate = grouped_sparse_prediction(g_np, q_np, GROUPINGS["separate"], 1)
  for name, groups in GROUPINGS.items():
    r, se = _ratio(errs[name, vs.n_pert], errs["separate", vs.n_pert])
    ratios[name] = {"measured": r, "se": se}
    predicted[name] = grouped_sparse_prediction(g_np, q_np, groups, 1) / separate
  size = d * n
  return {
      "points": points, "d_per_expert": d, "M": size, "grad_norm_sq": g2.tolist(),
      "probe": vs.probe, "seq_len": vs.seq_len, "batch": vs.batch,
      "weights": _weights(vs, params),
      "ratio_separate_vs_shared": ratios["one_sum"]["measured"],
      "ratio_separate_vs_shared_se": ratios["one_sum"]["se"],
      "ratio_by_grouping": ratios, "predicted_ratio_by_grouping": predicted,
      # (M/N - 1)/(M - 1): separate over one summed loss, equal blocks, dense probes.
      "predicted_separate_over_shared": (size / n - 1) / (size - 1),
      "ratio_at_n_pert": vs.n_pert,
      "replay": {"probes": _probe_record(vs, vs.reps, k_max, vs.probe, n), "data": data_rec,
                 "batch": "expert e uses all its windows as one fixed batch"},
  }


def _loglog_slope(x, y) -> float:
  return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def study_n_pert(vs: VarianceSpec, params=None) -> dict:
  """Relative centred variance against n_pert, dense and sparse probes, fixed batch.

  Every n_pert draws its own directions (repeats at steps i R .. (i + 1) R - 1 for the i-th
  n_pert), so the points are independent measurements and the slope is not forced by
  shared draws.
  """
  n = vs.n_experts
  body_N, head, shared, win, data_rec, g, g_np, g2 = _fixed_batch(vs, n, params)
  k_max = max(vs.n_pert_list)
  out: dict[str, Any] = {"points": [], "d_per_expert": g.shape[1], "seq_len": vs.seq_len,
                         "batch": vs.batch, "weights": _weights(vs, params)}
  for kind in ("rademacher", "sparse"):
    q = second_moment_N(body_N, kind)
    meas, pred = [], []
    for i, k in enumerate(vs.n_pert_list):
      st = _stats(vs, body_N, head, shared, win[:, None], (q * g)[:, None], k_max, kind,
                  first_step=i * vs.reps)
      rel, se = relative(block_errors(st, k), g2)
      p = (dense_prediction(g.shape[1], k) if kind == "rademacher"
           else sparse_prediction(g_np, np.asarray(q, np.float64), k))
      meas.append(rel)
      pred.append(p)
      out["points"].append({"probe": kind, "n_pert": k, "measured": rel, "se": se,
                            "predicted": p, "measured_over_predicted": rel / p,
                            "measured_over_predicted_se": se / p,
                            "reps": vs.reps, "blocks_per_rep": k_max // k})
    key = "" if kind == "rademacher" else "_sparse"
    out["slope_loglog" + key] = _loglog_slope(vs.n_pert_list, meas)
    out["measured_over_predicted" + key] = [m / p for m, p in zip(meas, pred, strict=True)]
  out["n_pert_list"] = list(vs.n_pert_list)
  out["replay"] = {"probes": {kind: _probe_record(vs, vs.reps * len(vs.n_pert_list), k_max, kind, n)
                              for kind in ("rademacher", "sparse")},
                   "steps_of_n_pert": {str(k): [i * vs.reps, (i + 1) * vs.reps]
                                       for i, k in enumerate(vs.n_pert_list)},
                   "data": data_rec, "batch": "expert e's windows, one fixed batch"}
  return out


class Trained(NamedTuple):
  """One N's trained run, as the experts and reference studies read it (`trained_sizes`)."""

  body: PyTree  # the N bodies, stacked
  head: jax.Array  # [N, V, d_E] own heads, or one shared [V, d_E]
  model: model_lib.ModelConfig  # the run's model
  data_dir: str  # the run's data dir (expert e trained on shard e)
  weights: str  # which weights: the workdir and its update
  run: dict  # the run's record for the results (its recipe, validation loss, seconds)


def sized_model(vs: VarianceSpec, n: int) -> model_lib.ModelConfig:
  """N experts at the study's size: the width whose ensemble count (SPEC 2) is nearest
  `total_params`, or, when it is 0, N bodies that together hold one width-model.d_t body."""
  d_e, depth = vs.model.d_e, vs.model.depth
  if vs.total_params:
    return sizing.sized_config(vs.total_params, n, d_e, depth)
  m_total = sizing.body_count(vs.model.d_t, d_e, depth)
  d_t = min(range(1, 4097), key=lambda x: abs(n * sizing.body_count(x, d_e, depth) - m_total))
  return model_lib.ModelConfig(d_t=d_t, d_e=d_e, depth=depth, shared_head=True)


def _per_n(vs: VarianceSpec, n: int, trained: dict[int, Trained] | None):
  """(params or None, model config, data dir, what was measured, the trained run's record or
  None) of the N-expert ensemble."""
  if trained is None:
    return None, sized_model(vs, n), vs.data_dir, _weights(vs, None), None
  t = trained[n]
  return (t.body, t.head), t.model, t.data_dir, t.weights, t.run


def study_experts(vs: VarianceSpec, trained: dict[int, Trained] | None = None) -> dict:
  """Relative centred variance at a fixed total size for N experts (paper Figure 10, left):
  fresh experts sized for each N, or `trained`, one trained run per N of `vs.n_list`."""
  rows, records = [], {}
  for n in vs.n_list:
    params, mcfg, data_dir, weights, run = _per_n(vs, n, trained)
    # Each N has its own experts and data: `expert_shards` names four, not n, of them.
    body_N, head, shared, win, data_rec, g, g_np, g2 = _fixed_batch(vs, n, params, mcfg, "",
                                                                    data_dir)
    q = second_moment_N(body_N, vs.probe)
    st = _stats(vs, body_N, head, shared, win[:, None], (q * g)[:, None], vs.n_pert, vs.probe)
    rel, se = relative(block_errors(st, vs.n_pert), g2)
    pred = (dense_prediction(g.shape[1], vs.n_pert) if vs.probe == "rademacher"
            else sparse_prediction(g_np, np.asarray(q, np.float64), vs.n_pert))
    rows.append({"n": n, "d_t": mcfg.d_t, "body_params_per_expert": int(g.shape[1]),
                 "ensemble_params": sizing.params_formula(mcfg.d_t, n, mcfg.d_e, mcfg.depth,
                                                          shared),
                 "measured": rel, "se": se, "predicted": pred, "n_pert": vs.n_pert,
                 "measured_over_predicted": rel / pred, "grad_norm_sq": g2.tolist(),
                 "weights": weights, "run": run})
    records[str(n)] = {"probes": _probe_record(vs, vs.reps, vs.n_pert, vs.probe, n),
                       "data": data_rec}
  return {"points": rows, "variance_by_n": rows, "total_params": vs.total_params,
          "probe": vs.probe, "seq_len": vs.seq_len, "batch": vs.batch,
          "weights": _weights(vs, trained),
          "first_over_last": rows[0]["measured"] / rows[-1]["measured"],
          "predicted_first_over_last": rows[0]["predicted"] / rows[-1]["predicted"],
          "replay": records}


def _random_windows(pool_NxPxT1: np.ndarray, reps: int, groups: int, seed: int):
  """[R, N, S, 1, T+1] windows drawn with replacement from each expert's pool, and indices."""
  n, p = pool_NxPxT1.shape[:2]
  idx = np.random.default_rng(seed + 1).integers(0, p, (reps, n, groups))
  win = pool_NxPxT1[np.arange(n)[None, :, None], idx]
  return win[:, :, :, None], idx


def _pool_setup(vs: VarianceSpec, n, params=None, mcfg=None):
  body_N, head, shared, mcfg = _experts(vs, n, params, mcfg)
  pool, data_rec = expert_windows(n, vs.pool, vs.seq_len, vs.seed, vs.data_dir, vs.corpus_bytes)
  g, sigma2 = pool_grad_stats(body_N, head, jnp.asarray(pool), shared)
  g2 = np.asarray(jnp.sum(g**2, -1), np.float64)
  return body_N, head, shared, mcfg, pool, data_rec, g, g2, np.asarray(sigma2, np.float64)


def study_batch(vs: VarianceSpec, params=None) -> dict:
  """v against B at fixed n_pert * B, B* from measured nu; accumulation vs one large batch."""
  n = vs.n_experts
  body_N, head, shared, _, pool, data_rec, g, g2, sigma2 = _pool_setup(vs, n, params)
  a, nu = g.shape[1] - 1, batch_noise(sigma2, g2)
  w = vs.budget
  need_s = max(w, max(vs.accum_list) * vs.accum_batch)
  need_j = max(w, max(vs.accum_list) * vs.accum_n_pert)
  win, idx = _random_windows(pool, vs.reps, need_s, vs.seed)
  st = _stats(vs, body_N, head, shared, win, g[:, None], need_j, "rademacher")
  points = []
  b = 1
  while b <= w:
    k = w // b
    rel, se = relative(block_errors(st, k, n_groups=b), g2)
    points.append({"series": "tradeoff", "n_pert": k, "batch": b, "accum": 1, "measured": rel,
                   "se": se, "predicted": batch_prediction(a, nu, k, b)})
    b *= 2
  for acc in vs.accum_list:
    k, b = vs.accum_n_pert, vs.accum_batch
    for series, kw, pred in (
        ("accumulate", {"n_groups": b, "accum": acc}, batch_prediction(a, nu, k, b, acc)),
        ("large_batch", {"n_groups": b * acc}, batch_prediction(a, nu, k, b * acc))):
      rel, se = relative(block_errors(st, k, **kw), g2)
      points.append({"series": series, "n_pert": k, "batch": kw["n_groups"], "accum": acc,
                     "measured": rel, "se": se, "predicted": pred})
  return {"points": points, "nu": nu, "a": a, "budget": w, "b_star": best_batch(w, nu, a),
          "sigma2": sigma2.tolist(), "grad_norm_sq": g2.tolist(), "pool": vs.pool,
          "weights": _weights(vs, params),
          "replay": {"probes": _probe_record(vs, vs.reps, need_j, "rademacher", n),
                     "data": data_rec, "pool_index_RxNxS": idx.tolist(),
                     "batch": "sequence groups of 1 window; a block of batch B uses S-slots "
                              "b B .. (b + 1) B - 1 of its repeat"}}


def _reference_n(vs: VarianceSpec, n: int, trained: dict[int, Trained] | None
                 ) -> tuple[list[dict], dict]:
  """The reference study's points and replay record for the N-expert ensemble."""
  mults, k0, b0 = list(vs.alloc_mult), vs.n_pert, vs.batch
  params, mcfg, data_dir, weights, run = _per_n(vs, n, trained)
  body_N, head, shared, _ = _experts(vs, n, params, mcfg)
  pool, ref, data_rec = disjoint_windows(n, vs.pool, vs.ref_batch, vs.seq_len, vs.seed, data_dir,
                                         vs.corpus_bytes, vs.windows)
  g, var = pool_grad_moments(body_N, head, jnp.asarray(pool), shared)
  # The mean of per-window gradients over the reference batch is jax.grad of its mean loss.
  g_ref = pool_grad_stats(body_N, head, jnp.asarray(ref), shared)[0]
  g_np, ref_np, var_np = (np.asarray(x, np.float64) for x in (g, g_ref, var))
  q_np = np.asarray(second_moment_N(body_N, vs.probe), np.float64)
  g2, ref2 = np.sum(g_np**2, -1), np.sum(ref_np**2, -1)
  # ||q g - g_ref||^2: the estimator's mean (q g over the pool) against the reference.
  offset = float(np.sum((q_np * g_np - ref_np) ** 2))
  nu = batch_noise(var_np.sum(-1), g2)
  grid = ([("N", k0, b0)] if n != 1 else
          [("n_pert", k0 * m, b0) for m in mults] + [("B", k0, b0 * m) for m in mults[1:]])
  j = max(k for _, k, _ in grid)
  win, idx = _random_windows(pool, vs.reps, max(b for _, _, b in grid), vs.seed)
  st = _stats(vs, body_N, head, shared, win, g_ref[:, None], j, vs.probe)
  points = []
  for alloc, k, b in grid:
    rel, se = relative(block_errors(st, k, n_groups=b), ref2)
    secs = step_seconds(mcfg, n, k, b, vs.seq_len, vs.dir_chunk, vs.time_steps, vs.seed)
    pred = (batch_error(g_np, var_np, q_np, k, b) + offset) / ref2.sum()
    points.append({"allocation": alloc, "n": n, "d_t": mcfg.d_t, "n_pert": k, "batch": b,
                   "body_params": n * int(g.shape[1]), "measured": rel, "se": se,
                   "predicted": pred, "measured_over_predicted": rel / pred, "nu": nu,
                   "pool_vs_reference": offset / ref2.sum(),
                   "ref_grad_norm_sq": float(ref2.sum()), "seconds_per_step": secs,
                   "weights": weights, "run": run})
    if n == 1 and alloc == "n_pert" and k == k0:
      points.append({**points[-1], "allocation": "N"})  # N = 1 starts the N allocation
  return points, {"probes": _probe_record(vs, vs.reps, j, vs.probe, n), "data": data_rec,
                  "pool_index_RxNxS": idx.tolist(),
                  "pool_index": "indexes each expert's zero_order_slots"}


def study_reference(vs: VarianceSpec, trained: dict[int, Trained] | None = None) -> dict:
  """Total error R against a backprop reference gradient, and seconds per step (Figure 5).

  g_ref is SPEC 5's backprop reference, `jax.grad` of the same loss, here over a large batch
  of `ref_batch` windows per expert that no zero-order batch contains (`disjoint_windows`);
  the zero-order batches are drawn from a pool of `pool` other windows. The N experts are
  fresh ones sized by `sized_model`, or `trained`, one trained run per N. Probes `vs.probe`
  (the paper's sparse ones by default). With the pool's mean gradient g, its per-coordinate
  batch noise and the probe's q = E z^2, the prediction is
  R = (batch_error(g, var, q, n_pert, B) + ||q g - g_ref||^2) / ||g_ref||^2 (dense probes:
  v ||g||^2 + ||g - g_ref||^2 with v = batch_prediction(d - 1, nu, n_pert, B)).
  """
  points, records = [], {}
  for n in vs.n_list:
    rows, records[str(n)] = _reference_n(vs, n, trained)
    points.extend(rows)
  return {"points": points, "total_params": vs.total_params,
          "body_params_by_n": {str(p["n"]): p["body_params"] for p in points},
          "pool": vs.pool, "ref_batch": vs.ref_batch, "probe": vs.probe, "seq_len": vs.seq_len,
          "batch": vs.batch, "windows": vs.windows,
          "weights": _weights(vs, trained),
          "reference": f"jax.grad of the loss over {vs.ref_batch} windows per expert, disjoint "
                       f"from the {vs.pool}-window pool the zero-order batches come from",
          "replay": records}


STUDIES = {"shared_vs_separate": study_shared_vs_separate, "n_pert": study_n_pert,
           "experts": study_experts, "batch": study_batch, "reference": study_reference}


def run_study(spec: VarianceSpec | ml_collections.ConfigDict, params=None) -> dict:
  """Runs the study of `spec` (a `VarianceSpec`, or the config `variance_spec` reads); returns
  its JSON-ready result with the config and run time."""
  vs = spec if isinstance(spec, VarianceSpec) else variance_spec(spec)
  t0 = time.perf_counter()
  out = STUDIES[vs.study](vs, params)
  out.update(study=vs.study, seconds=time.perf_counter() - t0, x64=bool(jax.config.jax_enable_x64),
             config=vs.config.to_dict())
  return out
