"""The variance studies of SPEC 5: measured error (`soma_jax.variance_measure`) against the theory
(`soma_jax.variance_theory`), one function per study in `STUDIES`, each returning a JSON-ready
dict with the record that replays its probes and data. Their settings and each N's experts are
in `variance_settings.py`, the windows they measure on in `variance_windows.py`.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import config as config_lib
from soma_jax import model as model_lib
from soma_jax import sizing, spsa, train_state
from soma_jax import spec as spec_lib
from soma_jax.loop import Loop
from soma_jax.studies.variance_settings import Trained, VarianceSpec, sized_model
from soma_jax.studies.variance_windows import disjoint_windows, expert_windows
from soma_jax.variance_measure import (
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


def run_study(vs: VarianceSpec, params=None) -> dict:
  """Runs the study of `vs` (`variance_spec` of its config); returns its JSON-ready result
  with the config and run time."""
  t0 = time.perf_counter()
  out = STUDIES[vs.study](vs, params)
  out.update(study=vs.study, seconds=time.perf_counter() - t0, x64=bool(jax.config.jax_enable_x64),
             config=vs.config.to_dict())
  return out
