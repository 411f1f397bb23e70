"""Clustering features and balanced spherical k-means (SPEC 4).

Features: word-level tf-idf (sublinear tf, English stop words, L2-normalised rows)
-> truncated SVD -> subtract the fit-sample mean -> L2-normalise. The tf-idf
transform is written out explicitly (`Featurizer.tfidf`) from the fitted
vocabulary and idf, so the saved router reproduces the features bit for bit
without pickling scikit-learn objects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

from soma_jax.errors import UserError

BALANCE_TOLERANCE = 0.1  # every cluster within +-10% of the mean size


def decode(chunks: Sequence[bytes] | np.ndarray) -> list[str]:
  """UTF-8 decodes byte strings (or uint8 rows) dropping invalid sequences."""
  if isinstance(chunks, np.ndarray):
    chunks = [row.tobytes() for row in chunks]
  return [c.decode("utf-8", errors="ignore") for c in chunks]


def _l2_rows(x: np.ndarray) -> np.ndarray:
  norm = np.linalg.norm(x, axis=1, keepdims=True)
  return (x / np.maximum(norm, 1e-12)).astype(np.float32)


@dataclass
class Featurizer:
  """Fitted tf-idf vocabulary/idf, SVD basis and centring mean."""

  vocabulary: list[str]  # term of each tf-idf column
  idf: np.ndarray  # [F] float32
  components: np.ndarray  # [D, F] float32 SVD basis
  mean: np.ndarray  # [D] float32 mean of the projected fit sample

  @property
  def dims(self) -> int:
    return int(self.components.shape[0])

  def _counter(self) -> CountVectorizer:
    vec = getattr(self, "_count_vectorizer", None)
    if vec is None:
      vocab = {t: i for i, t in enumerate(self.vocabulary)}
      vec = CountVectorizer(vocabulary=vocab, lowercase=True, dtype=np.float32)
      self._count_vectorizer = vec
    return vec

  def tfidf(self, texts: Sequence[str]) -> sp.csr_matrix:
    """Sublinear-tf tf-idf rows, L2-normalised, exactly as TfidfVectorizer computes them."""
    x = self._counter().transform(texts).tocsr().astype(np.float32)
    x.sort_indices()
    np.log(x.data, out=x.data)
    x.data += 1.0
    x = (x @ sp.diags(self.idf.astype(np.float32))).tocsr()
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    x = (sp.diags(1.0 / np.maximum(norms, 1e-12)).astype(np.float32) @ x).tocsr()
    return x.astype(np.float32)

  def project(self, x: sp.spmatrix) -> np.ndarray:
    """SVD projection, centring and L2 normalisation of tf-idf rows: [n, D] float32."""
    z = np.asarray(x @ self.components.T, dtype=np.float32)
    return _l2_rows(z - self.mean[None, :])

  def transform(self, texts: Sequence[str]) -> np.ndarray:
    """Unit-norm features [n, D] float32 of decoded texts."""
    return self.project(self.tfidf(texts))


def _scaled_min_df(texts: Sequence[str], min_df: int, want: int) -> int:
  """The largest min_df <= `min_df` (and <= the sample's size) that keeps at least `want`
  terms, else 1: the document frequencies are counted once, not refitted per value."""
  try:
    counts = CountVectorizer(stop_words="english", binary=True, dtype=np.int32).fit_transform(texts)
  except ValueError:  # no terms at all
    return 1
  df = np.sort(np.asarray(counts.sum(axis=0)).ravel())[::-1]  # per term, most frequent first
  if df.size < want:
    return 1
  # `want` terms have a document frequency of at least df[want - 1], and no more do above it
  return max(1, min(min_df, len(texts), int(df[want - 1])))


def fit_featurizer(
  texts: Sequence[str], *, max_features: int = 50_000, min_df: int = 5, svd_dims: int = 128, seed: int = 0
) -> tuple[Featurizer, dict]:
  """Fits tf-idf + SVD on texts; scales min_df (and SVD dims) down only if the sample is too small.

  Returns the featurizer and an info dict (min_df_used, svd_dims_used, num_features, notes).
  """
  notes = []
  want = min(svd_dims + 1, max_features)
  md = _scaled_min_df(texts, min_df, want)
  vec = TfidfVectorizer(
    max_features=max_features, sublinear_tf=True, stop_words="english", min_df=md, dtype=np.float32
  )
  try:
    vec.fit(texts)
  except ValueError:  # no terms at all
    vec = None
  if vec is None:
    raise UserError(
      f"the corpus has no usable words for tf-idf in {len(texts)} sampled windows; "
      "fix: use a larger corpus with natural-language or code text"
    )
  md = int(vec.min_df)
  if md != min_df:
    notes.append(f"min_df scaled down from {min_df} to {md}: the sample ({len(texts)} windows) is too small")
  vocab = [""] * len(vec.vocabulary_)
  for term, i in vec.vocabulary_.items():
    vocab[i] = term
  feat = Featurizer(vocab, vec.idf_.astype(np.float32), np.zeros((0, len(vocab)), np.float32), np.zeros(0, np.float32))
  x = feat.tfidf(texts)
  dims = min(svd_dims, len(vocab) - 1, x.shape[0] - 1)
  if dims < 1:
    raise UserError(
      f"the corpus is too small to cluster ({x.shape[0]} windows, {len(vocab)} terms); fix: use a larger corpus"
    )
  if dims != svd_dims:
    notes.append(f"svd_dims capped from {svd_dims} to {dims} by the corpus size")
  svd = TruncatedSVD(n_components=dims, algorithm="randomized", n_iter=5, random_state=seed)
  svd.fit(x)
  feat.components = svd.components_.astype(np.float32)
  feat.mean = np.asarray(x @ feat.components.T, dtype=np.float32).mean(axis=0)
  info = {
    "min_df_requested": int(min_df),
    "min_df_used": md,
    "num_features": len(vocab),
    "svd_dims_requested": int(svd_dims),
    "svd_dims_used": int(dims),
    "svd_explained_variance": float(svd.explained_variance_ratio_.sum()),
    "notes": notes,
  }
  return feat, info


def balance_bounds(n: int, k: int, tol: float = BALANCE_TOLERANCE) -> tuple[int, int]:
  """Smallest and largest allowed cluster sizes: within +-tol of n/k (relaxed to floor/ceil)."""
  mean = n / k
  lo = min(math.ceil((1 - tol) * mean - 1e-9), n // k)
  hi = max(math.floor((1 + tol) * mean + 1e-9), -(-n // k))
  return lo, hi


def balanced_assign(sim: np.ndarray, lo: int, hi: int) -> np.ndarray:
  """Assigns rows to columns maximising similarity, every column getting between lo and hi rows.

  Capacity rounds: unassigned rows propose to their best open column, each column
  keeps its most similar proposers up to capacity hi; then columns below lo take
  the rows that lose least by moving, from columns above lo. Deterministic.
  """
  n, k = sim.shape
  if k * lo > n or k * hi < n:
    raise ValueError(f"infeasible balance bounds [{lo}, {hi}] for {n} rows in {k} clusters")
  assign = np.full(n, -1, np.int64)
  remaining = np.full(k, hi, np.int64)
  pending = np.arange(n)
  closed = np.zeros(k, bool)
  while pending.size:
    s = sim[pending].copy()
    s[:, closed] = -np.inf
    choice = np.argmax(s, axis=1)
    score = s[np.arange(pending.size), choice]
    order = np.lexsort((-score, choice))
    ch = choice[order]
    starts = np.searchsorted(ch, np.arange(k))
    rank = np.arange(ch.size) - starts[ch]
    ok = rank < remaining[ch]
    assign[pending[order[ok]]] = ch[ok]
    remaining -= np.bincount(ch[ok], minlength=k)
    pending = pending[order[~ok]]
    closed = remaining <= 0
  sizes = np.bincount(assign, minlength=k)
  for c in np.argsort(sizes, kind="stable"):
    need = lo - sizes[c]
    if need <= 0:
      continue
    cand = np.flatnonzero(assign != c)
    cost = sim[cand, assign[cand]] - sim[cand, c]
    for i in cand[np.argsort(cost, kind="stable")]:
      d = assign[i]
      if sizes[d] > lo:
        assign[i] = c
        sizes[d] -= 1
        sizes[c] += 1
        need -= 1
        if need == 0:
          break
  return assign.astype(np.int32)


def _init_centroids(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
  """Spherical k-means++ seeding (distance 1 - cosine)."""
  n = x.shape[0]
  idx = [int(rng.integers(n))]
  dist = np.maximum(1.0 - x @ x[idx[0]], 0.0).astype(np.float64)
  for _ in range(1, k):
    total = dist.sum()
    if total <= 0:
      nxt = int(rng.integers(n))
    else:
      nxt = int(np.searchsorted(np.cumsum(dist), rng.random() * total))
      nxt = min(nxt, n - 1)
    idx.append(nxt)
    dist = np.minimum(dist, np.maximum(1.0 - x @ x[nxt], 0.0))
  return x[idx].copy()


def balanced_spherical_kmeans(
  x: np.ndarray, k: int, *, seed: int = 0, max_iter: int = 30, tol: float = BALANCE_TOLERANCE
) -> tuple[np.ndarray, np.ndarray, dict]:
  """Balanced spherical k-means on unit rows x [n, D].

  Returns (centroids [k, D] unit float32, assignment [n] int32, info). Every
  cluster's size is within +-tol of n/k (or floor/ceil of it when n/k is small).
  """
  n = x.shape[0]
  if k < 1:
    raise UserError(f"num_clusters={k} must be at least 1; fix: pass --num_clusters>=1")
  if n < k:
    raise UserError(f"{n} windows cannot fill {k} clusters; fix: use a larger corpus or fewer clusters")
  x = np.ascontiguousarray(x, np.float32)
  rng = np.random.default_rng(seed)
  centroids = _init_centroids(x, k, rng)
  lo, hi = balance_bounds(n, k, tol)
  assign = np.full(n, -1, np.int32)
  iterations = 0
  while iterations < max_iter:
    iterations += 1
    new = balanced_assign(x @ centroids.T, lo, hi)
    changed = int(np.sum(new != assign))
    assign = new
    sums = np.zeros_like(centroids)
    np.add.at(sums, assign, x)
    centroids = _l2_rows(sums)
    if changed == 0:
      break
  sim = x @ centroids.T
  info = {
    "iterations": iterations,
    "objective": float(np.mean(sim[np.arange(n), assign])),
    "fraction_not_nearest": float(np.mean(assign != np.argmax(sim, axis=1))),
    "size_bounds": [int(lo), int(hi)],
  }
  return centroids, assign, info


def top_terms(
  feat: Featurizer, x_tfidf: sp.csr_matrix, assign: np.ndarray, k: int, num_terms: int = 10
) -> list[list[str]]:
  """Most distinctive terms per cluster: mean tf-idf in the cluster minus the overall mean."""
  overall = np.asarray(x_tfidf.mean(axis=0)).ravel()
  score = np.zeros((k, overall.size))
  for c in range(k):
    rows = np.flatnonzero(assign == c)
    if rows.size:  # an empty cluster keeps a zero score, so no term
      score[c] = np.asarray(x_tfidf[rows].mean(axis=0)).ravel() - overall
  return distinctive_terms(feat, score, num_terms)


def distinctive_terms(feat: Featurizer, score_KxF: np.ndarray, num_terms: int = 10) -> list[list[str]]:
  """Per row of scores over the vocabulary, its `num_terms` best terms with a positive score."""
  out = []
  for score in score_KxF:
    best = np.argsort(-score, kind="stable")[:num_terms]
    out.append([feat.vocabulary[i] for i in best if score[i] > 0])
  return out
