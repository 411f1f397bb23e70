"""Window arithmetic: clustering chunks, training windows and evaluation windows (SPEC 4).

Conventions (all lengths in raw UTF-8 bytes, never re-encoded):
- A document is cut into non-overlapping 1,024-byte chunks; chunk j covers
  bytes [1024 j, 1024 j + 1024). Clustering sees the chunk; the training window
  is the chunk plus the next byte, [1024 j, 1024 j + 1025). A chunk is kept only
  when that next byte exists, so a document's final partial chunk (and a final
  full chunk with nothing after it) is dropped, never padded.
- Evaluation windows are 1,025 bytes advancing by 768 bytes within a segment
  (a document, or a WikiText-103 article); incomplete final windows are dropped.
  The router sees bytes 0..255; the loss is scored on targets 257..1024, i.e.
  the 768 predictions whose inputs are bytes 256..1023.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

CHUNK_BYTES = 1024  # clustering chunk length
WINDOW_BYTES = CHUNK_BYTES + 1  # training/eval window: 1,024 inputs, 1,024 targets
EVAL_STRIDE = 768  # evaluation windows advance by this many bytes
ROUTE_BYTES = 256  # the router sees only this many leading bytes
SCORED_TARGETS = WINDOW_BYTES - 1 - ROUTE_BYTES  # 768 scored targets per eval window
FIRST_SCORED_TARGET = ROUTE_BYTES + 1  # target positions 257..1024 are scored


def num_training_windows(doc_len: int) -> int:
  """Number of training windows (= clustering chunks kept) in a document of `doc_len` bytes."""
  return max(0, (doc_len - 1) // CHUNK_BYTES)


def training_windows(doc: bytes) -> np.ndarray:
  """Non-overlapping 1,025-byte training windows of a document, uint8 [m, 1025]."""
  m = num_training_windows(len(doc))
  if m == 0:
    return np.zeros((0, WINDOW_BYTES), np.uint8)
  buf = np.frombuffer(doc, np.uint8)
  starts = np.arange(m) * CHUNK_BYTES
  return buf[starts[:, None] + np.arange(WINDOW_BYTES)[None, :]]


def num_eval_windows(segment_len: int, stride: int = EVAL_STRIDE) -> int:
  """Number of complete 1,025-byte windows advancing by `stride` in a segment."""
  if segment_len < WINDOW_BYTES:
    return 0
  return (segment_len - WINDOW_BYTES) // stride + 1


def eval_windows(segment: bytes, stride: int = EVAL_STRIDE) -> np.ndarray:
  """1,025-byte windows advancing by `stride` bytes, incomplete end dropped; uint8 [m, 1025]."""
  m = num_eval_windows(len(segment), stride)
  if m == 0:
    return np.zeros((0, WINDOW_BYTES), np.uint8)
  buf = np.frombuffer(segment, np.uint8)
  starts = np.arange(m) * stride
  return buf[starts[:, None] + np.arange(WINDOW_BYTES)[None, :]]


def first_window(doc: bytes) -> np.ndarray | None:
  """The test-set window of a document: its first 1,025 bytes, or None if it is shorter."""
  if len(doc) < WINDOW_BYTES:
    return None
  return np.frombuffer(doc[:WINDOW_BYTES], np.uint8).copy()


def scored_targets(num_windows: int) -> int:
  """Total scored targets over `num_windows` evaluation windows (768 each)."""
  return num_windows * SCORED_TARGETS


def stack_windows(parts: list[np.ndarray], ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
  """Concatenates per-segment windows into ([n, 1025] uint8, [n] int32 segment index)."""
  if not parts:
    return np.zeros((0, WINDOW_BYTES), np.uint8), np.zeros((0,), np.int32)
  windows = np.concatenate(parts, axis=0).astype(np.uint8, copy=False)
  seg = np.concatenate([np.full(len(p), i, np.int32) for p, i in zip(parts, ids, strict=True)])
  return windows, seg


def is_wikitext_title(line: bytes) -> bool:
  """True for a WikiText top-level heading row ` = Title = ` (not ` = = Section = = `)."""
  s = line.strip()
  return (
    len(s) >= 5
    and s.startswith(b"= ")
    and s.endswith(b" =")
    and not s.startswith(b"= =")
    and not s.endswith(b"= =")
  )


def iter_wikitext_segments(lines: Iterable[bytes]) -> Iterator[tuple[str, bytes]]:
  """Splits WikiText raw lines at top-level headings; yields (title, segment bytes).

  Each segment starts with its heading row. Text before the first heading (only
  blank lines in the published files) forms its own segment titled "" if it is
  not blank.
  """
  title, buf = "", []
  for line in lines:
    if is_wikitext_title(line):
      if buf and (title or b"".join(buf).strip()):
        yield title, b"".join(buf)
      title = line.strip()[2:-2].decode("utf-8", errors="replace").strip()
      buf = [line]
    else:
      buf.append(line)
  if buf and (title or b"".join(buf).strip()):
    yield title, b"".join(buf)


def wikitext103_windows(path: str) -> tuple[np.ndarray, np.ndarray]:
  """Evaluation windows of a WikiText-103 raw file: ([n, 1025] uint8, [n] int32 segment id).

  Segments are top-level-heading articles; windows advance 768 bytes inside a
  segment and never cross into the next one; incomplete final windows are dropped.
  """
  from soma_jax.errors import UserError

  try:
    with open(path, "rb") as f:
      segments = list(iter_wikitext_segments(f))
  except OSError as e:
    raise UserError(
      f"cannot read WikiText-103 file {path!r} ({e.strerror}); fix: point at wiki.test.raw or wiki.valid.raw"
    ) from None
  parts = [eval_windows(seg) for _, seg in segments]
  return stack_windows(parts, list(range(len(parts))))
