"""Window arithmetic (SPEC 4)."""

import numpy as np
import pytest

from soma_jax.data import windows


@pytest.mark.parametrize(
  "length,expected", [(0, 0), (1024, 0), (1025, 1), (2048, 1), (2049, 2), (10 * 1024 + 1, 10)]
)
def test_num_training_windows(length, expected):
  assert windows.num_training_windows(length) == expected
  assert windows.training_windows(bytes(length)).shape == (expected, 1025)


def test_training_windows_are_chunks_plus_next_byte():
  doc = bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8))
  w = windows.training_windows(doc)
  assert w.shape == (4, 1025) and w.dtype == np.uint8
  for j in range(4):
    assert w[j].tobytes() == doc[1024 * j : 1024 * j + 1025]


def test_invalid_utf8_kept_exactly():
  doc = (b"\xff\xfe abc \xc3" * 400)[:3000]
  assert windows.training_windows(doc)[0].tobytes() == doc[:1025]


@pytest.mark.parametrize(
  "length,expected", [(1024, 0), (1025, 1), (1792, 1), (1793, 2), (1025 + 768 * 5, 6), (1025 + 768 * 5 - 1, 5)]
)
def test_eval_windows_count_and_stride(length, expected):
  seg = (np.arange(length) % 251).astype(np.uint8).tobytes()
  w = windows.eval_windows(seg)
  assert w.shape == (expected, 1025)
  for j in range(expected):
    assert w[j].tobytes() == seg[768 * j : 768 * j + 1025]
  assert windows.scored_targets(len(w)) == 768 * expected


def test_scored_target_constants():
  assert windows.SCORED_TARGETS == 768
  assert windows.FIRST_SCORED_TARGET == 257
  assert windows.FIRST_SCORED_TARGET + windows.SCORED_TARGETS - 1 == 1024


def test_first_window():
  assert windows.first_window(b"x" * 1024) is None
  doc = bytes(range(256)) * 5
  assert windows.first_window(doc).tobytes() == doc[:1025]


def test_wikitext_headings():
  assert windows.is_wikitext_title(b" = Valkyria Chronicles III = \n")
  assert not windows.is_wikitext_title(b" = = Gameplay = = \n")
  assert not windows.is_wikitext_title(b" = = = Story = = = \n")
  assert not windows.is_wikitext_title(b" The score was 2 = 2 . \n")


def _wiki_text(bodies: list[int]) -> bytes:
  parts = [b" \n"]
  for i, n in enumerate(bodies):
    parts.append(f" = Article {i} = \n \n".encode())
    parts.append(b" = = Section = = \n")
    parts.append((b"word " * (n // 5)) + b"\n")
  return b"".join(parts)


def test_wikitext103_windows(tmp_path):
  bodies = [3000, 500, 1025 + 768 * 3]
  raw = _wiki_text(bodies)
  path = tmp_path / "wiki.test.raw"
  path.write_bytes(raw)
  segments = list(windows.iter_wikitext_segments(raw.splitlines(keepends=True)))
  assert [t for t, _ in segments] == ["Article 0", "Article 1", "Article 2"]
  # Every byte after the blank preamble lands in exactly one segment.
  assert b"".join(s for _, s in segments) == raw[len(b" \n") :]
  w, seg = windows.wikitext103_windows(str(path))
  expected = [windows.num_eval_windows(len(s)) for _, s in segments]
  assert w.shape == (sum(expected), 1025) and w.dtype == np.uint8
  assert np.bincount(seg, minlength=3).tolist() == expected
  assert expected[1] == 0  # a short article gives no window; windows never cross articles
  for i, (_, s) in enumerate(segments):
    rows = w[seg == i]
    for j, row in enumerate(rows):
      assert row.tobytes() == s[768 * j : 768 * j + 1025]
  assert windows.scored_targets(len(w)) == 768 * sum(expected)
