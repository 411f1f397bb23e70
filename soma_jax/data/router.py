"""The fixed tf-idf router: first 256 bytes of a window -> the k nearest expert centroids.

Saved as a plain zip of .npy arrays (no pickle): `header` (UTF-8 JSON with the
format name and version), `vocabulary` (unicode array), `idf`, `components`,
`mean` and `centroids`. Entries carry a fixed timestamp so the bytes depend only
on the arrays.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Sequence

import numpy as np

from soma_jax.data import clustering
from soma_jax.data.windows import ROUTE_BYTES
from soma_jax.errors import UserError

FORMAT = "soma_jax.router"  # the tag router.npz files carry (kept when the module moved)
VERSION = 1
_ARRAYS = ("header", "vocabulary", "idf", "components", "mean", "centroids")


class Router:
  """Routes byte prefixes to the nearest centroids of a fitted featurizer."""

  def __init__(self, featurizer: clustering.Featurizer, centroids: np.ndarray):
    self.featurizer = featurizer
    self.centroids = np.ascontiguousarray(centroids, np.float32)  # [N, D] unit rows
    if self.centroids.ndim != 2 or self.centroids.shape[1] != featurizer.dims:
      raise ValueError(f"centroids {self.centroids.shape} do not match feature dims {featurizer.dims}")

  @property
  def num_clusters(self) -> int:
    return int(self.centroids.shape[0])

  @staticmethod
  def prefix_texts(prefixes: Sequence[bytes] | np.ndarray) -> list[str]:
    """The first 256 bytes of each prefix, UTF-8 decoded with invalid bytes dropped."""
    if isinstance(prefixes, np.ndarray):
      if prefixes.ndim != 2:
        raise ValueError(f"prefix array must be [n, >=256] uint8, got shape {prefixes.shape}")
      rows = [r.tobytes() for r in np.ascontiguousarray(prefixes[:, :ROUTE_BYTES], np.uint8)]
    else:
      rows = [bytes(p[:ROUTE_BYTES]) for p in prefixes]
    return clustering.decode(rows)

  def scores(self, prefixes: Sequence[bytes] | np.ndarray) -> np.ndarray:
    """Cosine similarity of each prefix to each centroid, [n, N] float32."""
    feats = self.featurizer.transform(self.prefix_texts(prefixes))
    return feats @ self.centroids.T

  def route(self, prefixes: Sequence[bytes] | np.ndarray, k: int) -> np.ndarray:
    """Ids of the k = min(k, N) nearest centroids per prefix, best first: int32 [n, k]."""
    if k < 1:
      raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, self.num_clusters)
    s = self.scores(prefixes)
    # Stable sort on negated scores: ties go to the lower expert id.
    return np.argsort(-s, axis=1, kind="stable")[:, :k].astype(np.int32)

  def route_to(self, prefixes: Sequence[bytes] | np.ndarray, k: int, n_experts: int) -> np.ndarray:
    """Like `route`, for a model of n_experts: a single expert (trained on the pooled
    shards) takes every window; otherwise n_experts must equal the router's clusters."""
    n = len(prefixes)
    if n_experts == 1:
      return np.zeros((n, 1), np.int32)
    if n_experts != self.num_clusters:
      raise UserError(
        f"the model has {n_experts} experts but the router {self.num_clusters} clusters; "
        "fix: evaluate with the data dir the model was trained on"
      )
    return self.route(prefixes, k)

  def save(self, path: str) -> None:
    """Writes the versioned router file (deterministic bytes)."""
    f = self.featurizer
    header = {
      "format": FORMAT,
      "version": VERSION,
      "num_clusters": self.num_clusters,
      "dims": f.dims,
      "num_features": len(f.vocabulary),
      "route_bytes": ROUTE_BYTES,
      "features": "tfidf(words, lowercase, sublinear_tf, english stop words, l2) -> svd -> centre -> l2",
    }
    arrays = {
      "header": np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8),
      "vocabulary": np.array(f.vocabulary, dtype=np.str_) if f.vocabulary else np.zeros(0, "<U1"),
      "idf": f.idf.astype(np.float32),
      "components": f.components.astype(np.float32),
      "mean": f.mean.astype(np.float32),
      "centroids": self.centroids,
    }
    tmp = f"{path}.tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as z:
      for name in _ARRAYS:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
        info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        z.writestr(info, buf.getvalue())
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> Router:
    """Reads a router file; a missing, corrupt or wrong-version file raises UserError."""
    fix = "fix: point at the router.npz written by experiments/prepare_data.py, or re-run it"
    if not os.path.isfile(path):
      raise UserError(f"router file {path!r} not found; {fix}")
    try:
      with np.load(path, allow_pickle=False) as z:
        missing = [n for n in _ARRAYS if n not in z.files]
        if missing:
          raise UserError(f"{path!r} is not a soma_jax router (missing {', '.join(missing)}); {fix}")
        arrays = {n: z[n] for n in _ARRAYS}
      header = json.loads(arrays["header"].tobytes().decode())
    except UserError:
      raise
    except Exception as e:  # zip, npy and JSON errors all mean a corrupt file
      raise UserError(f"router file {path!r} is corrupt ({type(e).__name__}: {e}); {fix}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
      raise UserError(f"{path!r} is not a soma_jax router file; {fix}")
    if header.get("version") != VERSION:
      raise UserError(
        f"router file {path!r} has format version {header.get('version')}, this code reads version {VERSION}; {fix}"
      )
    vocab = [str(t) for t in arrays["vocabulary"].tolist()]
    idf, comps, mean, cents = arrays["idf"], arrays["components"], arrays["mean"], arrays["centroids"]
    ok = (
      idf.shape == (len(vocab),)
      and comps.ndim == 2
      and comps.shape[1] == len(vocab)
      and mean.shape == (comps.shape[0],)
      and cents.ndim == 2
      and cents.shape[1] == comps.shape[0]
      and cents.shape[0] == header.get("num_clusters")
    )
    if not ok:
      raise UserError(f"router file {path!r} has inconsistent array shapes (corrupt); {fix}")
    return cls(clustering.Featurizer(vocab, idf, comps, mean), cents)
