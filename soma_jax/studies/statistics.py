"""The studies' statistics (SPEC 9.6, 9.8): paired document bootstraps, t intervals over
seeds, the t interval widened by the documents' variance, gains, two rows' differences in
gain or end loss across seeds (`seed_difference`), matched-loss speed-ups from loss curves
(crossings), and one row's effect against another's (`effect`, `interaction`)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats

from soma_jax import evaluate as eval_lib


def paired(ref_n: np.ndarray, other_n: np.ndarray, doc_ids: np.ndarray, draws: int,
           seed: int) -> dict:
  """other minus ref: mean per-window difference and its paired document-bootstrap 95% CI."""
  diff = np.asarray(other_n, np.float64) - np.asarray(ref_n, np.float64)
  lo, hi = eval_lib.bootstrap_ci(diff[:, None], doc_ids, draws, seed)
  return {"diff": float(diff.mean()), "ci95": [float(lo[0]), float(hi[0])]}


def across_seeds(values: list[float]) -> dict:
  """Mean and sample sd (None for one seed)."""
  x = np.asarray(values, np.float64)
  return {"mean": float(x.mean()), "sd": float(x.std(ddof=1)) if x.size > 1 else None}


def t_interval(values: list[float]) -> dict:
  """Mean, sample sd and the 95% Student-t interval of the mean over seeds (None for one)."""
  x = np.asarray(values, np.float64)
  out = {**across_seeds(values), "n": int(x.size), "ci95": None}
  if x.size > 1:
    half = float(scipy_stats.t.ppf(0.975, x.size - 1) * out["sd"] / np.sqrt(x.size))
    out["ci95"] = [out["mean"] - half, out["mean"] + half]
  return out


def document_variance(values_SxN: np.ndarray, doc_ids_n: np.ndarray, draws: int,
                      seed: int) -> float:
  """Document-bootstrap variance of the seed-averaged window mean of `values` [S, n] (each
  seed's per-window values on the same n windows): Var_b[(1/S) sum_s mean_b(values_s)],
  ddof 1 over the draws b, each draw resampling documents once for every seed (the seeds
  are scored on the same test documents)."""
  means_BxS = eval_lib.bootstrap_means(np.asarray(values_SxN, np.float64).T, doc_ids_n, draws,
                                       seed)
  return float(means_BxS.mean(axis=1).var(ddof=1)) if draws > 1 else 0.0


def widened_t_interval(values: list[float], doc_var: float, level: float = 0.95) -> dict:
  """The t interval across seeds widened by the documents' variance (SPEC 9.8):

    mean +- t_{(1 + level) / 2, S - 1} * sqrt(sd^2 / S + doc_var)

  with S seeds, `values` their results (sd: sample sd, ddof 1) and `doc_var` the document
  bootstrap variance of their mean (`document_variance`). sd^2 / S is the seed noise
  conditional on the documents, doc_var the noise of drawing the test documents; the t
  quantile at S - 1 degrees of freedom keeps it conservative. At least as wide as
  `t_interval` (doc_var >= 0); ci95 None for one seed (no seed noise to estimate).
  """
  x = np.asarray(values, np.float64)
  out = {"mean": float(x.mean()), "n": int(x.size), "document_sd": float(np.sqrt(doc_var)),
         "sd": None, "ci95": None}
  if x.size > 1:
    out["sd"] = float(x.std(ddof=1))
    half = float(scipy_stats.t.ppf((1 + level) / 2, x.size - 1)
                 * np.sqrt(out["sd"] ** 2 / x.size + doc_var))
    out["ci95"] = [out["mean"] - half, out["mean"] + half]
  return out


def row_losses(start: dict, end: dict) -> dict:
  """One row and seed: start_loss, end_loss and gain (start - end), per split (each a loss
  or per-window losses)."""
  s = {k: float(np.mean(v)) for k, v in start.items()}
  e = {k: float(np.mean(v)) for k, v in end.items()}
  return {"start_loss": s, "end_loss": e, "gain": {k: s[k] - e[k] for k in s}}


INTERVALS_HOW = ("ci95: t interval across optimisation seeds (conditional on the test "
                 "documents); bootstrap_ci95: paired test-document bootstrap around this seed's "
                 "runs (document noise only); seeds_and_documents.ci95: both noises, the seed t "
                 "interval widened by the documents' variance, mean +- t_{0.975, S-1} * "
                 "sqrt(sd^2 / S + document_sd^2), document_sd the paired test-document "
                 "bootstrap sd of the seed-mean difference")


def seed_difference(first: list[dict], second: list[dict], key: str, windows: list[tuple],
                    doc_ids, draws: int, what: str) -> dict:
  """first[key] minus second[key] over the seeds both ran (per-seed records with `seed` and
  `key`: {"test": value, "validation": value}), on test (with validation beside it): the mean
  with its 95% t interval across seeds; per seed the paired document bootstrap of the
  per-window difference; `seeds_and_documents`: the t interval widened by the documents'
  bootstrap variance of the seed-mean difference (`widened_t_interval`), both noises.
  `windows`: per seed (first's, second's) per-window test values; `what` opens `how`."""
  diff = {split: [a[key][split] - b[key][split] for a, b in zip(first, second, strict=True)]
          for split in ("test", "validation")}
  per_seed = []
  for a, (first_w, second_w) in zip(first, windows, strict=True):
    d = paired(second_w, first_w, doc_ids, draws, a["seed"])  # first - second per window
    per_seed.append({"seed": a["seed"], "diff": d["diff"], "bootstrap_ci95": d["ci95"]})
  diff_SxN = np.stack([np.asarray(f, np.float64) - np.asarray(s, np.float64) for f, s in windows])
  both = widened_t_interval(diff["test"], document_variance(diff_SxN, doc_ids, draws,
                                                            first[0]["seed"]))
  return {"split": "test", **t_interval(diff["test"]), "per_seed": per_seed,
          "seeds_and_documents": {"ci95": both["ci95"], "document_sd": both["document_sd"]},
          "validation": t_interval(diff["validation"]), "how": f"{what}; {INTERVALS_HOW}"}


def gain_difference(ref: list[dict], other: list[dict], gains_w: list[tuple], doc_ids,
                    draws: int) -> dict:
  """The reference's gain minus another row's (`seed_difference`; per window: end gap -
  start gap). `gains_w`: per seed (ref, other) per-window test gains."""
  return seed_difference(ref, other, "gain", gains_w, doc_ids, draws,
                         "reference gain minus this row's gain (= end gap minus start gap)")


def end_difference(ref: list[dict], other: list[dict], ends_w: list[tuple], doc_ids,
                   draws: int) -> dict:
  """Another row's test end loss minus the reference's (`seed_difference` on the records'
  `end_loss`): SPEC 9.8's primary readout, with each seed's own start in the seeds' noise.
  `ends_w`: per seed (ref, other) per-window test end losses."""
  return seed_difference(other, ref, "end_loss", [(o, r) for r, o in ends_w], doc_ids, draws,
                         "this row's test end loss minus the reference's (the end gap)")


# ------------------------------------------------------------------ matched-loss speed-ups

SPEEDUP_DRAWS = 2000  # document resamples of the speed-ups (each redoes every crossing)


def crossing(ops: np.ndarray, loss: np.ndarray, level: float) -> float | None:
  """The operations at which the running minimum of `loss` (over `ops`, ascending) first
  reaches `level`, linear between points; None if it never does."""
  best = np.minimum.accumulate(np.asarray(loss, np.float64))
  hit = np.nonzero(best <= level)[0]
  if hit.size == 0:
    return None
  i = int(hit[0])
  if i == 0:
    return float(ops[0])
  l0, l1 = best[i - 1], best[i]
  t = 0.0 if l0 == l1 else (l0 - level) / (l0 - l1)
  return float(ops[i - 1] + t * (ops[i] - ops[i - 1]))


def log_speedup(a: tuple, b: tuple) -> float | None:
  """log(cost_b / cost_a) over the two curves' common loss range: each curve (ops, loss) from
  the lower of the two starts down to the higher of the two best losses; cost = the
  operations a curve spends between them. > 0: a covers it in fewer operations. None when
  the ranges do not overlap or a cost is 0."""
  hi = min(float(a[1][0]), float(b[1][0]))
  lo = max(float(np.min(a[1])), float(np.min(b[1])))
  if not hi > lo:
    return None
  cost = [crossing(*c, lo) - crossing(*c, hi) for c in (a, b)]
  if min(cost) <= 0:
    return None
  return math.log(cost[1] / cost[0])


def _curve_means(windows_PxN: np.ndarray, doc_ids: np.ndarray, draws: int, seed: int):
  """The curve's point means, and the same on `draws` document resamples [draws, P]."""
  means = windows_PxN.mean(axis=1)
  if draws < 2:
    return means, None
  return means, eval_lib.bootstrap_means(windows_PxN.T, doc_ids, draws, seed)


def speedup_effect(pairs: list[tuple[dict, dict]], doc_ids: np.ndarray, draws: int,
                   key: str) -> dict:
  """The log speed-up of a over b on curve `key` ("compared" or "from_init") per seed, and
  across seeds widened by the validation documents' bootstrap variance of the seed mean (every
  seed's curves resampled with the same documents in a draw; a draw without a common range
  is dropped). `pairs`: per seed (a's curves, b's curves), each {key: (ops_P, windows_PxN)}."""
  per_seed, boot = [], []
  for a, b in pairs:  # one bootstrap seed: draw k resamples the same documents everywhere
    (oa, wa), (ob, wb) = a[key], b[key]
    ma, ba = _curve_means(np.asarray(wa), doc_ids, draws, 0)
    mb, bb = _curve_means(np.asarray(wb), doc_ids, draws, 0)
    per_seed.append(log_speedup((oa, ma), (ob, mb)))
    if ba is not None:
      boot.append([log_speedup((oa, x), (ob, y)) for x, y in zip(ba, bb, strict=True)])
  got = [v for v in per_seed if v is not None]
  if len(got) < len(per_seed):
    return {"per_seed": per_seed, "mean": None, "ci95": None,
            "why": "no common loss range in some seed"}
  doc_var, mean_B = 0.0, None
  if boot:  # a draw where some seed has no common range is dropped (NaN)
    mean_B = np.array([[np.nan if v is None else v for v in row] for row in boot]).mean(axis=0)
    doc_var = float(np.var(mean_B[np.isfinite(mean_B)], ddof=1))
  out = widened_t_interval(per_seed, doc_var)
  return {**out, "per_seed": per_seed, "_boot": mean_B, "speedup": math.exp(out["mean"]),
          "speedup_ci95": None if out["ci95"] is None else [math.exp(x) for x in out["ci95"]]}


def difference_effect(values: list[float], windows_SxN: np.ndarray, doc_ids: np.ndarray,
                      draws: int, seed: int) -> dict:
  """Per-seed values (each the window mean of a row of `windows_SxN`) across seeds, widened
  by the documents' bootstrap variance of their mean."""
  return {**widened_t_interval(values, document_variance(
      windows_SxN, doc_ids, draws, seed)), "per_seed": values}


def interaction_effect(s1: dict, s2: dict, key: str) -> dict:
  """Speed-up `key` of effect 1 minus effect 2 per seed, across seeds, widened by the
  documents' variance of the difference (both drew the same validation documents)."""
  a, b = s1[key], s2[key]
  if a["mean"] is None or b["mean"] is None:
    return {"mean": None, "ci95": None, "why": "a speed-up without a common loss range"}
  values = [x - y for x, y in zip(a["per_seed"], b["per_seed"], strict=True)]
  doc_var = 0.0
  if a.get("_boot") is not None and b.get("_boot") is not None:
    d = a["_boot"] - b["_boot"]
    doc_var = float(np.var(d[np.isfinite(d)], ddof=1))
  return {**widened_t_interval(values, doc_var), "per_seed": values}


def effect(rows: dict, a: str, b: str, scored: tuple, draws: int) -> dict:
  """Row a against row b over the seeds both ran (`rows[r]["per_seed"]`: per seed its
  per-window start losses `_start_w` (its own start, or the one every seed shares), test end
  losses `_test_w` and validation curves `_curves` {"compared", "from_init"}:
  (ops_P, windows_PxN)): a's gain minus b's (test, `gain_difference`), b's end loss minus
  a's (test), and a's log matched-loss speed-up over b on validation, in the compared phase
  and from initialisation (`speedup_effect`); `scored` = (validation, test)."""
  val, test = scored
  ra, rb = rows[a]["per_seed"], rows[b]["per_seed"]
  start = lambda r: r["_start_w"]["test"]
  gains_w = [(start(x) - x["_test_w"], start(y) - y["_test_w"])
             for x, y in zip(ra, rb, strict=True)]
  end_w = np.stack([y["_test_w"] - x["_test_w"] for x, y in zip(ra, rb, strict=True)])
  gain = gain_difference(ra, rb, gains_w, test.doc_ids, draws)
  gain_w = np.stack([np.asarray(g, np.float64) - np.asarray(h, np.float64) for g, h in gains_w])
  pairs = [(x["_curves"], y["_curves"]) for x, y in zip(ra, rb, strict=True)]
  sp_draws = min(draws, SPEEDUP_DRAWS)
  return {"a": a, "b": b, "gain_difference": {**gain, "_windows": gain_w},
          "end_loss_difference": {**difference_effect(
              [float(w.mean()) for w in end_w], end_w, test.doc_ids, draws, 0), "_windows": end_w},
          "log_speedup": {k: speedup_effect(pairs, val.doc_ids, sp_draws, k)
                          for k in ("compared", "from_init")},
          "_doc_ids": test.doc_ids, "_draws": draws}


def interaction(e1: dict, e2: dict) -> dict:
  """Effect e1 minus effect e2 (`effect`) per seed on the gain difference, the end-loss
  difference and both log speed-ups (the zero-order-specific part, for sharding under SPSA
  minus under backprop)."""
  out = {"of": [f"{e1['a']} vs {e1['b']}", f"{e2['a']} vs {e2['b']}"]}
  for key in ("gain_difference", "end_loss_difference"):
    w = e1[key]["_windows"] - e2[key]["_windows"]
    out[key] = difference_effect([float(x) for x in w.mean(axis=1)], w, e1["_doc_ids"],
                                 e1["_draws"], 0)
  out["log_speedup"] = {k: interaction_effect(e1["log_speedup"], e2["log_speedup"], k)
                        for k in ("compared", "from_init")}
  return out


def ordering(ours: dict[str, float], paper: dict[str, float]) -> dict:
  """Our order of the rows both hold (lowest first, by `ours`: seed means) against the
  paper's: {ours, paper, pairs: the pairs the paper orders (a tie orders none), agreeing: how
  many of them ours orders alike, same: all of them, left_out: our rows the paper lacks}. An
  order of means resolves no pair by itself (the intervals do)."""
  both = [k for k in ours if k in paper]
  pairs = [(a, b) for i, a in enumerate(both) for b in both[i + 1:] if paper[a] != paper[b]]
  agreeing = sum((ours[a] < ours[b]) == (paper[a] < paper[b]) for a, b in pairs)
  return {"ours": sorted(both, key=ours.get), "paper": sorted(both, key=paper.get),
          "pairs": len(pairs), "agreeing": int(agreeing), "same": agreeing == len(pairs),
          "left_out": [k for k in ours if k not in paper]}
