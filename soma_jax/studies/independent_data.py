"""The data of the independent-against-summed study (`independent.py`, Figure 4): one fixed
training sample per shard and the batches each seed draws from it, and the test windows' loss
under the four experts' uniform mixture, averaged per document.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import jax
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError

PyTree = jax.typing.ArrayLike


class FixedSample:
  """One fixed sample of training windows per shard (drawn once from `sample_seed`), and the
  batches a seed draws from it: each expert walks its own seeded permutations, epoch by
  epoch. Both variants of a seed see the same batches; every seed sees the same sample."""

  def __init__(self, data_dir: str, shards: tuple[int, ...], size: int, seq_len: int,
               sample_seed: int):
    self.shards = shards
    self.windows_NxSxT1 = np.stack([self._sample(data_dir, e, size, seq_len, sample_seed)
                                    for e in shards])

  @staticmethod
  def _sample(data_dir: str, shard: int, size: int, seq_len: int, sample_seed: int):
    w = np.load(os.path.join(pipeline.expert_dir(data_dir, shard), "train.npy"), mmap_mode="r")
    per = 1024 // seq_len
    if size > w.shape[0] * per:
      raise UserError(f"sample_windows={size} but shard {shard} holds {w.shape[0] * per} "
                      f"windows of {seq_len + 1} bytes; fix: a smaller sample_windows")
    rng = np.random.default_rng([sample_seed, shard])
    idx = np.sort(rng.choice(w.shape[0] * per, size, replace=False))
    rows, k = np.divmod(idx, per)
    full = np.asarray(w[np.unique(rows)])
    row_of = np.searchsorted(np.unique(rows), rows)
    starts = k * seq_len
    return np.stack([full[r, s:s + seq_len + 1] for r, s in zip(row_of, starts, strict=True)])

  def batches(self, seed: int, batch: int) -> Iterator[np.ndarray]:
    """Infinite uint8 [N, 1, B, T + 1] batches for `seed`."""
    n, size = self.windows_NxSxT1.shape[:2]
    rngs = [np.random.default_rng([seed, e, 0x4F1]) for e in self.shards]
    queue = [np.empty(0, np.int64) for _ in range(n)]
    while True:
      out = np.empty((n, 1, batch) + self.windows_NxSxT1.shape[2:], np.uint8)
      for i in range(n):
        while queue[i].size < batch:
          queue[i] = np.concatenate([queue[i], rngs[i].permutation(size)])
        out[i, 0] = self.windows_NxSxT1[i, queue[i][:batch]]
        queue[i] = queue[i][batch:]
      yield out


def test_losses(body_N: PyTree, head: jax.Array, windows: np.ndarray, shared_head: bool):
  """Per-window nats/byte of the four experts' uniform mixture (top-4 of N = 4), float64."""
  n = jax.tree.leaves(body_N)[0].shape[0]
  routes = np.broadcast_to(np.arange(n, dtype=np.int32), (windows.shape[0], n))
  return eval_lib.mixture_nats(eval_lib.routed_logprobs(body_N, head, windows, routes,
                                                        shared_head))


def doc_means(values_n: np.ndarray, doc_ids_n: np.ndarray) -> np.ndarray:
  """The mean of `values` over each test document's windows, one entry per document."""
  _, inv = np.unique(doc_ids_n, return_inverse=True)
  return np.bincount(inv, weights=values_n) / np.bincount(inv)
