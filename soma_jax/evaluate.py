"""Routed ensemble evaluation (SPEC 4): route on bytes 0..255, score targets 257..1024.

Each window's selected experts' next-byte probabilities are averaged uniformly; the
mixture and the loss reduction are in float64. Windows are grouped by expert so each
expert runs once per group of windows routed to it.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import memory
from soma_jax import model as model_lib
from soma_jax.data import pipeline
from soma_jax.data import windows as windows_lib
from soma_jax.data.router import Router
from soma_jax.errors import UserError

PyTree = Any
LogitsFn = Callable[[PyTree, jax.Array, jax.Array], jax.Array]  # (body, head_e, inputs_BxT)
ROUTE_BYTES = 256  # the router sees bytes 0..255
SCORED = 768  # targets 257..1024 of a 1,025-byte window


def expert_params(body_N: PyTree, head: jax.Array, e, shared_head: bool):
  body = jax.tree.map(lambda x: x[e], body_N)
  return body, head if shared_head else head[e]


@functools.partial(jax.jit, static_argnames=("shared_head", "first", "logits_fn"))
def _target_logprobs(body_N, head, e, windows_BxW, shared_head: bool, first: int,
                     logits_fn: LogitsFn):
  body, head_e = expert_params(body_N, head, e, shared_head)
  with memory.full_precision():  # evaluation never uses TF32 (SPEC 3.3)
    logits = logits_fn(body, head_e, windows_BxW[:, :-1])[:, first - 1:]
  targets = windows_BxW[:, first:].astype(jnp.int32)
  return -model_lib.cross_entropy(logits, targets)


def target_logprobs(body_N: PyTree, head: jax.Array, e: int, windows: np.ndarray,
                    shared_head: bool, batch: int = 64, first: int = ROUTE_BYTES + 1,
                    logits_fn: LogitsFn = model_lib.logits) -> np.ndarray:
  """log p_e(y_t) for targets first..W-1 of each window, [n, W - first], float32.

  `logits_fn(body, head_e, inputs_BxT)` is the method's model (`Method.logits`).

  Windows run in batches of `batch`; a short last batch is padded to the next power of
  two, so at most log2(batch) + 1 shapes ever compile and small groups stay cheap.
  """
  n = windows.shape[0]
  out = np.empty((n, windows.shape[1] - first), np.float32)
  for i in range(0, n, batch):
    chunk = windows[i:i + batch]
    m = chunk.shape[0]
    pad = min(batch, 1 << (m - 1).bit_length()) - m
    if pad:
      chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
    lp = _target_logprobs(body_N, head, e, jnp.asarray(chunk), shared_head, first, logits_fn)
    out[i:i + batch] = np.asarray(lp)[:m]
  return out


def routed_logprobs(body_N: PyTree, head: jax.Array, windows: np.ndarray, routes_nxk: np.ndarray,
                    shared_head: bool, batch: int = 64, first: int = ROUTE_BYTES + 1,
                    logits_fn: LogitsFn = model_lib.logits) -> np.ndarray:
  """log p_e(y_t) for each window's selected experts and targets first..W-1: [n, k, 768]
  float32 for 1,025-byte windows at the paper's first = 257."""
  n, k = routes_nxk.shape
  out = np.empty((n, k, windows.shape[1] - first), np.float32)
  for e in np.unique(routes_nxk):
    rows, slots = np.nonzero(routes_nxk == e)
    out[rows, slots] = target_logprobs(body_N, head, int(e), windows[rows], shared_head, batch,
                                       first, logits_fn)
  return out


def mixture_nats(logprobs_nxkxT: np.ndarray, k: int | None = None) -> np.ndarray:
  """Per-window mean cross entropy of the uniform mixture of the first k experts, float64."""
  lp = logprobs_nxkxT[:, :k].astype(np.float64)
  kk = lp.shape[1]
  mix = np.logaddexp.reduce(lp, axis=1) - np.log(kk)
  return -mix.mean(axis=1)


def ensemble_loss(body_N: PyTree, head: jax.Array, windows: np.ndarray, router, top_k: int,
                  shared_head: bool, logits_fn: LogitsFn = model_lib.logits) -> float:
  """Mean nats/byte of the routed top-k ensemble on 1,025-byte windows."""
  routes = router.route_to(windows[:, :ROUTE_BYTES], top_k, jax.tree.leaves(body_N)[0].shape[0])
  lp = routed_logprobs(body_N, head, windows, routes, shared_head, logits_fn=logits_fn)
  return float(mixture_nats(lp).mean())


# ----------------------------------------------------------------------------- splits


def check_split(split: str) -> None:
  """UserError for a split name that is not test, ensemble_val or wikitext103:EXISTING_FILE."""
  if split.startswith("wikitext103:"):
    path = split.split(":", 1)[1]
    if not os.path.isfile(path):
      raise UserError(f"WikiText-103 file {path!r} not found; fix: pass wikitext103:PATH/wiki.test.raw")
  elif split not in ("test", "ensemble_val"):
    raise UserError(f"unknown split {split!r}; fix: use test, ensemble_val or wikitext103:PATH")


def split_files(split: str) -> tuple[str, ...]:
  """The data-dir files `load_split` reads for a split (none for a WikiText-103 file)."""
  if split.startswith("wikitext103:"):
    return ()
  return (f"{split}.npy", f"{split}_docs.npy")


def load_split(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(windows [n, 1025] uint8, document id [n] int32) of test, ensemble_val or wikitext103:PATH.

  WikiText-103 documents are its top-level-heading articles.
  """
  check_split(split)
  if split.startswith("wikitext103:"):
    windows, doc_ids = windows_lib.wikitext103_windows(split.split(":", 1)[1])
  else:
    windows, doc_ids = pipeline.eval_split(data_dir, split)
  if windows.shape[0] == 0:
    raise UserError(f"split {split!r} has no complete 1,025-byte windows; fix: use a larger split")
  return windows, doc_ids


# ----------------------------------------------------------------------------- bootstrap


def bootstrap_ci(values_n: np.ndarray, doc_ids_n: np.ndarray, draws: int = 10_000, seed: int = 0,
                 level: float = 0.95, chunk: int = 500) -> tuple[np.ndarray, np.ndarray]:
  """Paired document-bootstrap interval of the window mean of `values` [n, ...].

  Each draw resamples documents with replacement and keeps all their windows; every
  trailing column of `values` (systems, k values) sees the same draws, so intervals of
  differences between columns are paired. Returns (lo, hi), each of shape values.shape[1:].
  """
  stats = bootstrap_means(values_n, doc_ids_n, draws, seed, chunk)
  alpha = (1.0 - level) / 2
  lo, hi = np.quantile(stats, [alpha, 1.0 - alpha], axis=0)
  return lo, hi


def bootstrap_means(values_n: np.ndarray, doc_ids_n: np.ndarray, draws: int = 10_000,
                    seed: int = 0, chunk: int = 500) -> np.ndarray:
  """The window mean of `values` [n, ...] on each of `draws` document resamples (documents
  drawn with replacement, all their windows kept; every trailing column sees the same
  draws): [draws, ...] float64."""
  values = np.asarray(values_n, np.float64)
  _, doc_n = np.unique(np.asarray(doc_ids_n), return_inverse=True)
  num_docs = int(doc_n.max()) + 1
  flat = values.reshape(values.shape[0], -1)
  sums_DxS = np.zeros((num_docs, flat.shape[1]))
  np.add.at(sums_DxS, doc_n, flat)
  counts_D = np.bincount(doc_n, minlength=num_docs).astype(np.float64)
  rng = np.random.default_rng(seed)
  stats = np.empty((draws, flat.shape[1]))
  for i in range(0, draws, chunk):
    m = min(chunk, draws - i)
    # How often each document is drawn: one multinomial row per bootstrap draw.
    times_MxD = rng.multinomial(num_docs, np.full(num_docs, 1.0 / num_docs), size=m).astype(np.float64)
    stats[i:i + m] = (times_MxD @ sums_DxS) / (times_MxD @ counts_D)[:, None]
  return stats.reshape((draws,) + values.shape[1:])


# ----------------------------------------------------------------------------- one pass


class PairStats:
  """Running float64 moments of two routed experts' per-target losses, per expert pair.

  For a pair (a, b) selected together on a window, at every scored target: l_a, l_b, the
  shared difficulty d (the mean loss of ALL N experts at that target, as in the paper's
  N.3) and the two-expert mixture loss l_ab. Moments are kept per unordered pair a < b.
  """

  _NAMES = ("n", "a", "b", "d", "aa", "bb", "dd", "ab", "ad", "bd", "mix")

  def __init__(self, num_experts: int):
    self.num_experts = num_experts
    self.windows = np.zeros((num_experts, num_experts), np.int64)
    self.m = np.zeros((num_experts, num_experts, len(self._NAMES)))

  def update(self, logprobs_nxkxT: np.ndarray, routes_nxk: np.ndarray,
             difficulty_nxT: np.ndarray) -> None:
    """Adds a block's selected experts' log-probs and the all-expert mean loss per target."""
    loss = -logprobs_nxkxT.astype(np.float64)
    k = loss.shape[1]
    d = np.asarray(difficulty_nxT, np.float64)
    for i, j in itertools.combinations(range(k), 2):
      la, lb = loss[:, i], loss[:, j]
      mix = -(np.logaddexp(-la, -lb) - np.log(2.0))
      cols = (np.ones_like(la), la, lb, d, la * la, lb * lb, d * d, la * lb, la * d, lb * d, mix)
      mom_nxM = np.stack([c.sum(axis=1) for c in cols], axis=1)
      a, b = routes_nxk[:, i], routes_nxk[:, j]
      swap = a > b
      mom_nxM[swap] = mom_nxM[swap][:, [0, 2, 1, 3, 5, 4, 6, 7, 9, 8, 10]]
      lo, hi = np.minimum(a, b), np.maximum(a, b)
      np.add.at(self.m, (lo, hi), mom_nxM)
      np.add.at(self.windows, (lo, hi), 1)

  def rows(self, min_windows: int = 1) -> list[dict]:
    """One dict per pair seen on >= min_windows windows: losses, reduction, correlation."""
    out = []
    for a, b in zip(*np.nonzero(self.windows >= min_windows), strict=True):
      n, sa, sb, sd, saa, sbb, sdd, sab, sad, sbd, smix = self.m[a, b]
      mean = np.array([sa, sb, sd]) / n
      second = np.array([[saa, sab, sad], [sab, sbb, sbd], [sad, sbd, sdd]]) / n
      cov = second - np.outer(mean, mean)
      if self.num_experts <= 2:  # d = (l_a + l_b) / 2 leaves nothing: plain correlation
        corr = cov[0, 1] / np.sqrt(max(cov[0, 0] * cov[1, 1], 1e-300))
      else:  # partial correlation of l_a and l_b given the shared difficulty d
        prec = np.linalg.pinv(cov)
        corr = -prec[0, 1] / np.sqrt(max(prec[0, 0] * prec[1, 1], 1e-300))
      out.append({
          "expert_a": int(a),
          "expert_b": int(b),
          "num_windows": int(self.windows[a, b]),
          "loss_a": float(mean[0]),
          "loss_b": float(mean[1]),
          "mixture_loss": float(smix / n),
          "loss_reduction": float((sa + sb) / (2 * n) - smix / n),
          "error_correlation": float(corr),
      })
    return out


class Scores(NamedTuple):
  """Per-window results of one pass over the data with the top-K routes."""

  routes_nxK: np.ndarray  # int32, best first
  own_nxK: np.ndarray  # float64, each selected expert's own nats/byte on the window
  mix_nxS: np.ndarray  # float64, nats/byte of the uniform mixture of the first ks[s] experts
  ks: tuple[int, ...]
  pairs: PairStats | None


def score(body_N: PyTree, head: jax.Array, windows: np.ndarray, routes_nxK: np.ndarray,
          shared_head: bool, ks: Sequence[int] | None = None, pairs: bool = False,
          batch: int = 64, block_bytes: int = 1 << 28,
          logits_fn: LogitsFn = model_lib.logits, first: int = ROUTE_BYTES + 1) -> Scores:
  """Scores every window once with its K routed experts; the mixtures of all k in ks follow.

  Routes are best-first, so the top-k ensemble is the first k columns. Windows go in
  blocks sized so the [block, K, 768] float32 log-probabilities stay under block_bytes.
  With `pairs`, every expert scores every window ([block, N, 768]): the pair analysis's
  shared difficulty is the mean loss of all N experts at each target. `first`: the first
  scored target (route + 1; 257 on the paper's windows, less on `cut_windows`' pieces).
  """
  n, kk = routes_nxK.shape
  ks = tuple(ks) if ks else (kk,)
  if min(ks) < 1 or max(ks) > kk:
    raise ValueError(f"ks={ks} must lie in 1..{kk}")
  n_experts = int(jax.tree.leaves(body_N)[0].shape[0])
  width = n_experts if pairs else kk  # pairs need every expert's loss (shared difficulty)
  block = max(batch, block_bytes // (width * SCORED * 4) // batch * batch)
  own = np.empty((n, kk))
  mix = np.empty((n, len(ks)))
  stats = PairStats(n_experts) if pairs else None
  for i in range(0, n, block):
    routes = routes_nxK[i:i + block]
    if stats is None:
      lp = routed_logprobs(body_N, head, windows[i:i + block], routes, shared_head, batch,
                           first, logits_fn=logits_fn)
    else:
      everyone = np.broadcast_to(np.arange(n_experts, dtype=np.int32), (len(routes), n_experts))
      lp_all = routed_logprobs(body_N, head, windows[i:i + block], everyone, shared_head, batch,
                               first, logits_fn=logits_fn)
      lp = np.take_along_axis(lp_all, routes[:, :, None], axis=1)
      stats.update(lp, routes, -lp_all.mean(axis=1, dtype=np.float64))
    own[i:i + block] = -lp.mean(axis=2, dtype=np.float64)
    for s, k in enumerate(ks):
      mix[i:i + block, s] = mixture_nats(lp, k)
  return Scores(np.asarray(routes_nxK, np.int32), own, mix, ks, stats)


def per_expert(scores: Scores, num_experts: int, k: int) -> list[dict]:
  """Each expert's own loss on the windows routed to it (in the top k), and the ensemble's."""
  s = scores.ks.index(k)
  out = []
  for e in range(num_experts):
    rows, slots = np.nonzero(scores.routes_nxK[:, :k] == e)
    m = rows.size
    out.append({
        "expert": e,
        "num_windows": int(m),
        "num_top1": int(np.sum(scores.routes_nxK[:, 0] == e)),
        "nats_per_byte": float(scores.own_nxK[rows, slots].mean()) if m else None,
        "ensemble_nats_per_byte": float(scores.mix_nxS[rows, s].mean()) if m else None,
    })
  return out


def summary(loss_n: np.ndarray, doc_ids_n: np.ndarray, draws: int = 10_000, seed: int = 0) -> dict:
  """Mean nats/byte, bits/byte and the 95% document-bootstrap interval of per-window losses."""
  lo, hi = bootstrap_ci(loss_n, doc_ids_n, draws, seed)
  mean = float(np.mean(loss_n))
  return {
      "nats_per_byte": mean,
      "ci95": [float(lo), float(hi)],
      "bits_per_byte": mean / math.log(2),
      "num_windows": int(loss_n.shape[0]),
      "num_documents": int(np.unique(doc_ids_n).size),
      "num_targets": int(loss_n.shape[0]) * SCORED,
  }


def evaluate(body_N: PyTree, head: jax.Array, windows: np.ndarray, doc_ids: np.ndarray, router,
             top_k: int, shared_head: bool, ks: Sequence[int] | None = None, pairs: bool = False,
             draws: int = 10_000, seed: int = 0, logits_fn: LogitsFn = model_lib.logits) -> dict:
  """Routed top-k evaluation with intervals; optional k sweep and pair analysis in the same pass.

  Returns a JSON-friendly dict: nats_per_byte, ci95, bits_per_byte, num_windows,
  num_targets, top_k, per_expert, and "k_sweep" / "pairs" when asked for.
  """
  n_experts = int(jax.tree.leaves(body_N)[0].shape[0])
  top_k = min(top_k, n_experts)
  ks = sorted({min(k, n_experts) for k in (ks or [])} | {top_k})
  kk = max(ks)
  if pairs:
    kk = max(kk, min(2, n_experts))
  routes = router.route_to(windows[:, :ROUTE_BYTES], kk, n_experts)
  sc = score(body_N, head, windows, routes, shared_head, ks, pairs, logits_fn=logits_fn)
  out = summary(sc.mix_nxS[:, ks.index(top_k)], doc_ids, draws, seed)
  out["top_k"] = top_k
  out["per_expert"] = per_expert(sc, n_experts, top_k)
  if len(ks) > 1:
    lo, hi = bootstrap_ci(sc.mix_nxS, doc_ids, draws, seed)
    out["k_sweep"] = [{"k": k, "nats_per_byte": float(sc.mix_nxS[:, s].mean()),
                       "ci95": [float(lo[s]), float(hi[s])],
                       "bits_per_byte": float(sc.mix_nxS[:, s].mean() / math.log(2))}
                      for s, k in enumerate(ks)]
  if sc.pairs is not None:
    out["pairs"] = sc.pairs.rows()
    out["pairs_k"] = kk
  return out


# ----------------------------------------------------------------------------- outputs


def write_k_sweep(rows: list[dict], csv_path: str, png_path: str | None = None,
                  mark_k: int = 4) -> None:
  """CSV (k, nats/byte, interval, bits/byte) and a loss-vs-k plot with a dashed line at k = 4."""
  with open(csv_path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["k", "nats_per_byte", "ci95_lo", "ci95_hi", "bits_per_byte"])
    for r in rows:
      w.writerow([r["k"], f"{r['nats_per_byte']:.6f}", f"{r['ci95'][0]:.6f}",
                  f"{r['ci95'][1]:.6f}", f"{r['bits_per_byte']:.6f}"])
  if png_path:
    plt = _pyplot()
    k = np.array([r["k"] for r in rows])
    y = np.array([r["nats_per_byte"] for r in rows])
    lo = np.array([r["ci95"][0] for r in rows])
    hi = np.array([r["ci95"][1] for r in rows])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.fill_between(k, lo, hi, alpha=0.25, label="95% document bootstrap")
    ax.plot(k, y, "o-", label="routed top-k ensemble")
    ax.axvline(mark_k, ls="--", c="gray", label=f"k = {mark_k}")
    ax.set_xlabel("experts averaged k")
    ax.set_ylabel("loss (nats/byte)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    if k.max() > 16:
      ax.set_xscale("log", base=2)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)


def write_pairs(rows: list[dict], csv_path: str, png_path: str | None = None,
                bins: int = 8) -> None:
  """CSV of the pair analysis and a scatter (with binned means) of reduction vs correlation."""
  keys = ["expert_a", "expert_b", "num_windows", "loss_a", "loss_b", "mixture_loss",
          "loss_reduction", "error_correlation"]
  with open(csv_path, "w", newline="") as f:
    w = csv.DictWriter(f, keys)
    w.writeheader()
    w.writerows(rows)
  if png_path:
    plt = _pyplot()
    x = np.array([r["error_correlation"] for r in rows])
    y = np.array([r["loss_reduction"] for r in rows])
    size = np.array([r["num_windows"] for r in rows], np.float64)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.scatter(x, y, s=8 + 40 * size / max(size.max(initial=1), 1), alpha=0.5, label="expert pair")
    if len(rows) >= 2 * bins:
      edges = np.quantile(x, np.linspace(0, 1, bins + 1))
      idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
      cx = [x[idx == b].mean() for b in range(bins) if np.any(idx == b)]
      cy = [y[idx == b].mean() for b in range(bins) if np.any(idx == b)]
      ax.plot(cx, cy, "k-o", ms=3, label="binned mean")
    ax.set_xlabel("error correlation (shared difficulty removed)")
    ax.set_ylabel("loss reduction of the 2-mixture (nats/byte)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


# ------------------------------------------------------------------- test split


def cut_windows(windows_nx1025: np.ndarray, doc_ids_n: np.ndarray, route: int, score: int
                ) -> tuple[np.ndarray, np.ndarray]:
  """Pieces of route + score + 1 bytes cut from each 1,025-byte window (and their documents).

  1024 // (route + score) pieces per window, each starting route + score bytes after the
  previous one (neighbours share one byte), so a model trained on T = route + score
  targets is scored inside its trained context. route + score = 1024 is the paper's
  window itself (route 256, score 768).
  """
  span = route + score
  if route < 1 or score < 1 or span > windows_nx1025.shape[1] - 1:
    raise UserError(f"route={route}, score={score}: need route, score >= 1 and route + score <= "
                    f"{windows_nx1025.shape[1] - 1}")
  pieces = (windows_nx1025.shape[1] - 1) // span
  out = np.stack([windows_nx1025[:, i * span:i * span + span + 1] for i in range(pieces)], axis=1)
  return out.reshape(-1, span + 1), np.repeat(doc_ids_n, pieces)


def unigram_nats(data_dir: str, split: str = "test", route: int = ROUTE_BYTES,
                 score: int = SCORED) -> float:
  """Cross entropy of the split's scored targets under the training shards' byte unigram."""
  manifest = pipeline.load_manifest(data_dir)
  counts = np.ones(256)  # add-one smoothing
  for e in range(manifest["num_clusters"]):
    w = np.load(os.path.join(pipeline.expert_dir(data_dir, e), "train.npy"), mmap_mode="r")
    counts += np.bincount(np.asarray(w).ravel(), minlength=256)
  logp = np.log(counts / counts.sum())
  windows, docs = pipeline.eval_split(data_dir, split)
  targets = cut_windows(windows, docs, route, score)[0][:, route + 1:]
  return float(-logp[targets].mean())


class TestSet:
  """An evaluation split's windows (test by default), their documents and routes for every
  expert count in use.

  The router sees the first `route` bytes of a window and the loss is the mean over the
  next `score` targets: the paper's 256 / 768 on whole 1,025-byte windows, or shorter
  pieces of each window (`cut_windows`) for a model trained on T < 1024.

  `max_windows` 1,025-byte windows are taken spread across the split's documents
  (`pipeline.spread_windows`: each document's first window before any document's second),
  before they are cut; 0: every window, in the split's order.
  """

  def __init__(self, data_dir: str, max_windows: int = 0, split: str = "test",
               route: int = ROUTE_BYTES, score: int = SCORED):
    windows, doc_ids = pipeline.eval_split(data_dir, split)
    self.documents_available = int(np.unique(doc_ids).size)  # the split's documents
    keep = pipeline.spread_windows(doc_ids, max_windows)
    windows, doc_ids = windows[keep], doc_ids[keep]
    self.windows_scored = int(windows.shape[0])  # 1,025-byte windows, before they are cut
    self.windows, self.doc_ids = cut_windows(windows, doc_ids, route, score)
    if self.windows.shape[0] == 0:
      raise UserError(f"{data_dir!r} has no {split} windows; fix: prepare it with more held-out "
                      "documents (--test_docs, --ensemble_val_docs)")
    self.split, self.route, self.score = split, route, score
    self.data_dir, self.max_windows = os.path.abspath(data_dir), max_windows
    self.router = Router.load(os.path.join(data_dir, "router.npz"))
    self._routes = {}
    self._settings = None

  def settings(self) -> dict | None:
    """What makes this set: its constructor's arguments (data_dir absolute) and digests of
    its cut windows and router.npz, so scores saved for it are never read for another set
    (`checkpoint_scores`); None for a set not read by this constructor (a subclass's own
    windows), which nothing saved may stand for."""
    if not hasattr(self, "data_dir"):
      return None
    if getattr(self, "_settings", None) is None:
      with open(os.path.join(self.data_dir, "router.npz"), "rb") as f:
        router = hashlib.sha256(f.read()).hexdigest()
      self._settings = {
          "data_dir": self.data_dir, "split": self.split, "max_windows": int(self.max_windows),
          "route": int(self.route), "score": int(self.score),
          "windows": int(self.windows.shape[0]), "router_sha256": router,
          "windows_sha256": hashlib.sha256(np.ascontiguousarray(self.windows).tobytes()
                                           ).hexdigest()}
    return dict(self._settings)

  def losses(self, body_N, head, n_experts: int, shared_head: bool,
             logits_fn: LogitsFn = model_lib.logits) -> np.ndarray:
    """Per-window nats/byte of the routed top-min(4, N) uniform mixture, float64 [n]."""
    k = min(4, n_experts)
    if n_experts not in self._routes:
      self._routes[n_experts] = self.router.route_to(
          self.windows[:, :self.route], k, n_experts)
    lp = routed_logprobs(body_N, head, self.windows, self._routes[n_experts], shared_head,
                         first=self.route + 1, logits_fn=logits_fn)
    return mixture_nats(lp)


def ensemble_validation(data_dir: str, body_N: PyTree, head: jax.Array, shared_head: bool,
                        logits_fn: LogitsFn = model_lib.logits, max_windows: int = 256
                        ) -> float | None:
  """The routed top-min(4, N) loss on a data dir's first `max_windows` ensemble-validation
  windows (what training logs as ensemble_val_loss), or None where the split is empty."""
  windows, _ = pipeline.eval_split(data_dir, "ensemble_val")
  if windows.shape[0] == 0:
    return None
  n = jax.tree.leaves(body_N)[0].shape[0]
  router = Router.load(os.path.join(data_dir, "router.npz"))
  return ensemble_loss(body_N, head, windows[:max_windows], router, min(4, n), shared_head,
                       logits_fn=logits_fn)

