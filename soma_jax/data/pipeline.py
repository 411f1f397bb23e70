"""Training input pipeline (grain) and loaders for a prepared data dir.

Each expert is its own grain dataset over the memory-mapped sub-windows of its
train shard, shuffled with a seed derived from (seed, global expert id) and
repeated, so the batch an expert sees at step s depends only on (seed, expert,
s), never on which other experts the process loads.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import grain
import numpy as np

from soma_jax.data import windows
from soma_jax.errors import UserError

MANIFEST_VERSION = 1  # bump when the data-dir layout changes
WINDOW_BYTES = windows.WINDOW_BYTES
_SEED_MIX = 0x9E3779B1  # mixes (seed, expert) into one 32-bit shuffle seed


def load_manifest(data_dir: str) -> dict:
  """Reads DIR/manifest.json; UserError if missing, corrupt or of another version."""
  path = os.path.join(data_dir, "manifest.json")
  fix = "fix: run experiments/prepare_data.py --out=DIR and pass that DIR"
  if not os.path.isdir(data_dir):
    raise UserError(f"data dir {data_dir!r} does not exist; {fix}")
  if not os.path.isfile(path):
    raise UserError(f"{path!r} not found: {data_dir!r} is not a prepared data dir; {fix}")
  try:
    with open(path) as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"{path!r} is corrupt ({e}); {fix}") from None
  if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
    got = manifest.get("version") if isinstance(manifest, dict) else None
    raise UserError(f"{path!r} has manifest version {got}, this code reads version {MANIFEST_VERSION}; {fix}")
  return manifest


def expert_dir(data_dir: str, expert: int) -> str:
  """Folder of one expert's shard."""
  return os.path.join(data_dir, "experts", f"{expert:04d}")


def check_data_dir(data_dir: str, num_experts: int) -> dict:
  """Checks that data_dir is a prepared dir for exactly num_experts experts; returns its manifest."""
  manifest = load_manifest(data_dir)
  n = manifest.get("num_clusters")
  if num_experts == 1 and isinstance(n, int):
    num_experts = n  # one expert (a monolith or the seed) trains on all shards pooled
  if n != num_experts:
    raise UserError(
      f"data dir {data_dir!r} has {n} expert shards but the model has {num_experts} experts; "
      f"fix: re-run prepare_data.py with --num_clusters={num_experts} or set n={n}"
    )
  missing = [rel for rel in manifest.get("files", {}) if not os.path.isfile(os.path.join(data_dir, rel))]
  missing += [
    os.path.join("experts", f"{e:04d}", name)
    for e in range(num_experts)
    for name in ("train.npy", "val.npy")
    if not os.path.isfile(os.path.join(expert_dir(data_dir, e), name))
  ]
  if missing:
    raise UserError(
      f"data dir {data_dir!r} is incomplete (missing {', '.join(sorted(set(missing))[:5])}); "
      "fix: re-run experiments/prepare_data.py"
    )
  verify_files(data_dir, manifest)
  return manifest


def sha256_file(path: str) -> str:
  """Hex SHA-256 of a file, read in 8 MiB blocks."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(8 << 20), b""):
      h.update(block)
  return h.hexdigest()


def verify_files(data_dir: str, manifest: dict) -> None:
  """Every file listed in the manifest still has the SHA-256 prepare recorded; a UserError
  names the first that does not. Hashing ran at about 2 GB/s on one CPU core here (1.3 GB,
  the paper's corpus, in 0.65 s cached and 0.72 s cold: docs/results/hash_rate.json), so
  every byte is checked, not a sample."""
  files = manifest.get("files")
  if not isinstance(files, dict):
    raise UserError(f"{os.path.join(data_dir, 'manifest.json')!r} lists no file hashes; "
                    "fix: re-run experiments/prepare_data.py")
  for rel, digest in sorted(files.items()):
    path = os.path.join(data_dir, rel)
    try:
      ok = sha256_file(path) == digest
    except OSError as e:
      raise UserError(f"cannot read {path!r} ({e.strerror}); fix: re-run experiments/prepare_data.py") from None
    if not ok:
      raise UserError(
        f"{path!r} does not match the SHA-256 that manifest.json records for it (changed or corrupted "
        "since prepare); fix: restore the data dir or re-run experiments/prepare_data.py"
      )


def _check_seq_len(seq_len: int) -> int:
  if seq_len < 1 or windows.CHUNK_BYTES % seq_len:
    raise UserError(f"seq_len={seq_len} must divide {windows.CHUNK_BYTES}; fix: use e.g. 64, 128, 256, 512 or 1024")
  return windows.CHUNK_BYTES // seq_len


def _load_windows(path: str) -> np.ndarray:
  """Memory-maps a uint8 [n, 1025] window file, with a clear error if it is wrong."""
  try:
    arr = np.load(path, mmap_mode="r", allow_pickle=False)
  except (OSError, ValueError) as e:
    raise UserError(f"cannot read {path!r} ({e}); fix: re-run experiments/prepare_data.py") from None
  if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[1] != WINDOW_BYTES:
    raise UserError(
      f"{path!r} holds {arr.dtype} {arr.shape}, expected uint8 [n, {WINDOW_BYTES}]; fix: re-run prepare_data.py"
    )
  return arr


def subwindows(windows_nx1025: np.ndarray, seq_len: int) -> np.ndarray:
  """Cuts each 1,025-byte row into 1024 // T windows of T + 1 bytes (k-th: bytes [kT, kT + T + 1))."""
  per = _check_seq_len(seq_len)
  w = np.asarray(windows_nx1025)
  if w.ndim != 2 or w.shape[1] != WINDOW_BYTES:
    raise ValueError(f"expected [n, {WINDOW_BYTES}] windows, got {w.shape}")
  idx = np.arange(per)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
  return w[:, idx].reshape(-1, seq_len + 1)


class SubwindowSource:
  """Random-access grain source: the sub-windows of a memory-mapped [n, 1025] shard."""

  def __init__(self, windows_nx1025: np.ndarray, seq_len: int):
    self._w = windows_nx1025
    self._seq_len = seq_len
    self._per = _check_seq_len(seq_len)

  def __len__(self) -> int:
    return int(self._w.shape[0]) * self._per

  def __getitem__(self, index: int) -> np.ndarray:
    row, k = divmod(int(index), self._per)
    start = k * self._seq_len
    return np.array(self._w[row, start : start + self._seq_len + 1])

  def __repr__(self) -> str:
    return f"SubwindowSource(n={self._w.shape[0]}, seq_len={self._seq_len})"


def expert_seed(seed: int, expert: int) -> int:
  """The shuffle seed of one expert, a function of (seed, global expert id) only."""
  return int(np.random.SeedSequence([seed, expert, _SEED_MIX]).generate_state(1)[0])


class ConcatSource:
  """Random-access grain source over several sources back to back (pooled shards)."""

  def __init__(self, sources: Sequence[SubwindowSource]):
    self._sources = list(sources)
    self._ends = np.cumsum([len(s) for s in self._sources])

  def __len__(self) -> int:
    return int(self._ends[-1])

  def __getitem__(self, index: int) -> np.ndarray:
    i = int(np.searchsorted(self._ends, index, side="right"))
    start = int(self._ends[i - 1]) if i else 0
    return self._sources[i][int(index) - start]

  def __repr__(self) -> str:
    return f"ConcatSource({len(self._sources)} shards, n={len(self)})"


def _shard_source(data_dir: str, expert: int, seq_len: int) -> SubwindowSource:
  path = os.path.join(expert_dir(data_dir, expert), "train.npy")
  if not os.path.isfile(path):
    raise UserError(f"shard {path!r} not found; fix: check --data_dir and the expert ids, or re-run prepare_data.py")
  return SubwindowSource(_load_windows(path), seq_len)


def _train_source(data_dir: str, expert: int, seq_len: int, pooled: bool
                  ) -> SubwindowSource | ConcatSource:
  """One expert's training sub-windows; pooled: every shard's, back to back."""
  if not pooled:
    return _shard_source(data_dir, expert, seq_len)
  n = load_manifest(data_dir)["num_clusters"]
  return ConcatSource([_shard_source(data_dir, e, seq_len) for e in range(n)])


def expert_dataset(
  data_dir: str, expert: int, *, batch: int, accum: int, seq_len: int, seed: int, pooled: bool = False
) -> grain.MapDataset:
  """One expert's infinite dataset of uint8 [accum, batch, seq_len + 1] batches.

  pooled: the expert reads every shard of the data dir (a monolith or the seed run on a
  clustered corpus), so N = 1 and N > 1 runs share one data dir and one test set.
  """
  source = _train_source(data_dir, expert, seq_len, pooled)
  if len(source) < batch:
    raise UserError(
      f"expert {expert}'s shard has {len(source)} sequences of {seq_len + 1} bytes, fewer than one batch of {batch}; "
      "fix: use a larger corpus, fewer --num_clusters, or a smaller batch"
    )
  return (
    grain.MapDataset.source(source)
    .shuffle(seed=expert_seed(seed, expert))
    .repeat()
    .batch(accum * batch, drop_remainder=True)
    .map(lambda x: x.reshape(accum, batch, seq_len + 1))
  )


class _Feed:
  """What both training feeds share: the experts they feed (global ids, checked against the
  data dir), the step, and a JSON state that restores only under the settings it was saved
  with. Subclasses give `next()`."""

  _what = "iterator"  # names the state in its errors

  def __init__(self, data_dir: str, experts: Sequence[int], settings: dict):
    if not experts:
      raise UserError("no experts requested; fix: pass at least one expert id")
    n = load_manifest(data_dir)["num_clusters"]
    bad = [e for e in experts if not 0 <= e < n]
    if bad:
      raise UserError(f"expert ids {bad} are outside the data dir's 0..{n - 1}; fix: request "
                      "existing experts")
    self.experts = [int(e) for e in experts]
    if settings["pooled"] and self.experts != [0]:
      raise UserError(f"a pooled iterator feeds one expert (id 0), not {self.experts}")
    self._config = settings
    self._step = 0

  def __iter__(self):
    return self

  @property
  def step(self) -> int:
    """Index of the next batch."""
    return self._step

  def _position(self, step: int) -> dict:
    """State fields that follow from the step (saved, and checked on restore)."""
    return {}

  def get_state(self) -> dict:
    """JSON-serialisable state: the next step and the settings it is valid for."""
    return {"step": self._step, **self._position(self._step), "experts": list(self.experts),
            **self._config}

  def set_state(self, state: dict) -> None:
    """Restores a state from get_state; the settings must match (experts may be any subset)."""
    mismatch = {k: (state.get(k, False), v) for k, v in self._config.items()
                if state.get(k, False) != v}
    if mismatch:
      raise UserError(f"{self._what} state was saved with different settings {mismatch} (saved, "
                      "now); fix: resume with the same settings")
    step = state.get("step")
    if not isinstance(step, int) or step < 0 or any(
        state.get(k, v) != v for k, v in self._position(step).items()):
      shown = {k: state.get(k) for k in ("step", *self._position(0))}
      raise UserError(f"{self._what} state has an invalid step {shown}; fix: pass a state from "
                      "get_state()")
    self._step = step


class TrainBatches(_Feed):
  """Iterator over uint8 [len(experts), accum, batch, seq_len + 1] batches with checkpointable state.

  Each expert's batches come from random access into its grain MapDataset at
  the current step (grain's own iterator over a MapDataset keeps the same
  single index as state); this skips the iterator's thread pool, which only
  adds contention on small CPU hosts.
  """

  def __init__(
    self,
    data_dir: str,
    experts: Sequence[int],
    *,
    batch: int,
    accum: int,
    seq_len: int,
    seed: int,
    pooled: bool = False,
  ):
    if batch < 1 or accum < 1:
      raise UserError(f"batch={batch} and accum={accum} must be >= 1; fix: pass positive sizes")
    super().__init__(data_dir, experts, {"batch": batch, "accum": accum, "seq_len": seq_len,
                                         "seed": seed, "pooled": pooled})
    self.shape = (len(self.experts), accum, batch, seq_len + 1)
    self._datasets = [
      expert_dataset(data_dir, e, batch=batch, accum=accum, seq_len=seq_len, seed=seed, pooled=pooled)
      for e in self.experts
    ]

  def __next__(self) -> np.ndarray:
    out = np.empty(self.shape, np.uint8)
    for i, ds in enumerate(self._datasets):
      out[i] = ds[self._step]
    self._step += 1
    return out


# The training batches of the given (global) experts; only their shards are opened.
train_iterator = TrainBatches


def _row_dataset(data_dir: str, expert: int, seed: int, pooled: bool, streams: int
                 ) -> grain.MapDataset:
  """One expert's shuffled, repeated 1,025-byte training windows (as `expert_dataset` reads)."""
  source = _train_source(data_dir, expert, windows.CHUNK_BYTES, pooled)
  if len(source) < streams:
    raise UserError(f"expert {expert}'s shard has {len(source)} windows, fewer than its "
                    f"{streams} streams (eggroll.pop / 2), so pairs would share bytes; fix: a "
                    "smaller eggroll.pop or a larger corpus")
  return grain.MapDataset.source(source).shuffle(seed=expert_seed(seed, expert)).repeat()


class StreamSegments(_Feed):
  """Each expert's `streams` byte streams, `segment` positions per update (method=eggroll).

  The EGGROLL reference LM cuts its corpus into one contiguous stream per antithetic pair
  and feeds each update the next `segment` bytes of every stream, carrying the members'
  hidden states on. Here stream k of an expert reads that expert's shuffled training
  windows k, S + k, 2 S + k, ... (S = streams): position p of stream k is byte p mod 1,024
  of its window floor(p / 1,024), predicting the byte after it, and the state is reset where
  a new window starts (`reset`), as the reference resets at each document's start.

  `next()` gives {"inputs", "targets": uint8 [N, S, segment], "reset": bool [N, segment]};
  update u covers positions [u segment, (u + 1) segment) of every stream. Everything
  follows from (seed, expert, u), so `get_state` (the step and the streams' byte position)
  restores it exactly.
  """

  _what = "stream"

  def __init__(self, data_dir: str, experts: Sequence[int], *, streams: int, segment: int,
               seed: int, pooled: bool = False):
    if streams < 1 or not 1 <= segment <= windows.CHUNK_BYTES:
      raise UserError(f"streams={streams} must be >= 1 and segment={segment} in 1.."
                      f"{windows.CHUNK_BYTES}; fix: set eggroll.pop and eggroll.segment")
    super().__init__(data_dir, experts, {"streams": streams, "segment": segment, "seed": seed,
                                         "pooled": pooled})
    self.streams, self.segment = streams, segment
    self._rows = [_row_dataset(data_dir, e, seed, pooled, streams) for e in self.experts]
    self._cache: dict[int, np.ndarray] = {}  # window index -> [N, S, 1025]

  def _position(self, step: int) -> dict:
    return {"position": step * self.segment}  # the streams' byte position

  def _windows(self, j: int) -> np.ndarray:
    """Window j of every stream of every expert, [N, S, 1025]."""
    if j not in self._cache:
      base = j * self.streams
      self._cache = {k: v for k, v in self._cache.items() if k >= j - 1}
      self._cache[j] = np.stack([np.stack([ds[base + k] for k in range(self.streams)])
                                 for ds in self._rows])
    return self._cache[j]

  def __next__(self) -> dict[str, np.ndarray]:
    pos = self._step * self.segment + np.arange(self.segment)
    row, off = np.divmod(pos, windows.CHUNK_BYTES)
    first = int(row[0])
    block = np.stack([self._windows(j) for j in range(first, int(row[-1]) + 1)])
    inputs = block[row - first, :, :, off]  # [L, N, S]
    targets = block[row - first, :, :, off + 1]
    self._step += 1
    n = len(self.experts)
    return {"inputs": np.ascontiguousarray(inputs.transpose(1, 2, 0)),
            "targets": np.ascontiguousarray(targets.transpose(1, 2, 0)),
            "reset": np.broadcast_to(off == 0, (n, self.segment)).copy()}


def expert_val_windows(data_dir: str, expert: int, seq_len: int, pooled: bool = False) -> np.ndarray:
  """One expert's validation sub-windows, uint8 [n, seq_len + 1].

  pooled: every shard's validation split, interleaved row by row so any prefix of the
  result covers all shards evenly.
  """
  if not pooled:
    return subwindows(_load_windows(os.path.join(expert_dir(data_dir, expert), "val.npy")), seq_len)
  n = load_manifest(data_dir)["num_clusters"]
  parts = [subwindows(_load_windows(os.path.join(expert_dir(data_dir, e), "val.npy")), seq_len) for e in range(n)]
  rows = [p[i] for i in range(max(len(p) for p in parts)) for p in parts if i < len(p)]
  return np.stack(rows)


def eval_split(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(windows [n, 1025] uint8, document index [n] int32) of "test" or "ensemble_val"."""
  if split not in ("test", "ensemble_val"):
    raise UserError(f"unknown eval split {split!r}; fix: use 'test' or 'ensemble_val'")
  w = _load_windows(os.path.join(data_dir, f"{split}.npy"))
  try:
    docs = np.load(os.path.join(data_dir, f"{split}_docs.npy"), allow_pickle=False)
  except (OSError, ValueError) as e:
    raise UserError(f"cannot read {split}_docs.npy in {data_dir!r} ({e}); fix: re-run prepare_data.py") from None
  if docs.shape != (w.shape[0],):
    raise UserError(f"{split}_docs.npy does not match {split}.npy in {data_dir!r}; fix: re-run prepare_data.py")
  return np.asarray(w), docs.astype(np.int32)


# The fixed shuffle of document order behind `spread_windows`: any seed would do; fixing
# one makes every study score the same evaluation windows on a given data dir.
SPREAD_SEED = 20_250


def spread_windows(doc_ids_n: np.ndarray, n: int, seed: int = SPREAD_SEED) -> np.ndarray:
  """Indices of n windows spread across documents: round robin over the documents.

  The documents are put in an order shuffled by `seed`; round r takes, in that order, the
  r-th window (in split order) of every document that has more than r, so every document's
  first window comes before any document's second and n windows cover min(n, documents)
  documents. A smaller n selects a prefix of a larger n's windows. n = 0, or n at least
  the split's windows: every window, in the split's order.
  """
  doc_ids = np.asarray(doc_ids_n)
  total = doc_ids.shape[0]
  if n < 0:
    raise ValueError(f"n={n} must be >= 0 (0: every window)")
  if n == 0 or n >= total:
    return np.arange(total)
  docs, doc_n = np.unique(doc_ids, return_inverse=True)
  place_D = np.empty(docs.size, np.int64)  # each document's place in the shuffled order
  place_D[np.random.default_rng(seed).permutation(docs.size)] = np.arange(docs.size)
  order = np.argsort(doc_n, kind="stable")  # windows grouped by document, split order within
  starts_D = np.searchsorted(doc_n[order], np.arange(docs.size))
  rank_n = np.empty(total, np.int64)  # a window's rank inside its document: 0 for the first
  rank_n[order] = np.arange(total) - starts_D[doc_n[order]]
  return np.lexsort((place_D[doc_n], rank_n))[:n]
