"""The windows the variance studies (`variance.py`) measure on, each with a record that replays
it: the standard library's sources as text, or a prepared data dir's expert shards; each
expert's fixed batch or pool, and a reference batch disjoint from it.
"""

from __future__ import annotations

import numpy as np

from soma_jax.errors import UserError


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
