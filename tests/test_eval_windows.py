"""Evaluation sets that represent the corpus (SPEC 9.8): windows spread across documents,
their counts in results.json, and the gain interval that carries both seed and document
noise."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from scipy import stats as scipy_stats

from soma_jax import evaluate as eval_lib
from soma_jax.data import pipeline
from soma_jax.studies import datasets, statistics, verdict

# Windows per document, split order: the built-in corpus's first five ensemble-validation
# documents hold 28, 32, 8, 4 and 56 windows, so its first 128 windows come from 5 of them.
COUNTS = [28, 32, 8, 4, 56] + [1 + (7 * i) % 23 for i in range(74)]


def doc_ids_of(counts: list[int]) -> np.ndarray:
  return np.repeat(np.arange(len(counts), dtype=np.int32), counts)


def assert_round_robin(doc_ids: np.ndarray, idx: np.ndarray) -> None:
  """idx is a round robin over the documents: the windows a document gives are its first
  ones (split order), and no document gives its (r + 1)-th window before every document
  with more than r windows has given its r-th; each round visits documents in one order."""
  doc_ids = np.asarray(doc_ids)
  assert len(set(idx.tolist())) == idx.size, "a window taken twice"
  rank = np.array([np.sum(doc_ids[:i] == doc_ids[i]) for i in idx])  # 0: a document's first
  for d in np.unique(doc_ids[idx]):  # each document's first windows, in split order
    mine = idx[doc_ids[idx] == d]
    np.testing.assert_array_equal(mine, np.flatnonzero(doc_ids == d)[:mine.size])
  assert np.all(np.diff(rank) >= 0), f"a second window before a first: ranks {rank.tolist()}"
  sizes = np.bincount(doc_ids)
  for r in range(int(rank.max(initial=-1))):  # every earlier round complete
    assert np.sum(rank == r) == np.sum(sizes > r), f"round {r} left documents out"
  first = doc_ids[idx[rank == 0]].tolist()
  for r in range(1, int(rank.max(initial=0)) + 1):  # later rounds: the first round's order
    got = doc_ids[idx[rank == r]].tolist()  # (the last round may stop part way)
    assert got == [d for d in first if sizes[d] > r][:len(got)], f"round {r} out of order"


@pytest.mark.parametrize("n", [1, 5, 79, 80, 128, 400, 1000])
def test_spread_windows_is_a_round_robin_over_documents(n):
  doc_ids = doc_ids_of(COUNTS)
  idx = pipeline.spread_windows(doc_ids, n)
  assert idx.size == n
  assert_round_robin(doc_ids, idx)
  assert np.unique(doc_ids[idx]).size == min(n, len(COUNTS))


def test_the_round_robin_check_sees_a_planted_case():
  """Taking the first n windows (what TestSet did) is not a round robin; nor a shuffle of
  the same windows, nor a round robin with a document's later window before its first."""
  doc_ids = doc_ids_of(COUNTS)
  with pytest.raises(AssertionError, match="second window before a first"):
    assert_round_robin(doc_ids, np.arange(128))
  good = pipeline.spread_windows(doc_ids, 128)
  with pytest.raises(AssertionError):
    assert_round_robin(doc_ids, good[::-1])
  swapped = good.copy()
  swapped[np.flatnonzero(doc_ids[good] == 0)[0]] = np.flatnonzero(doc_ids == 0)[1]
  with pytest.raises(AssertionError):
    assert_round_robin(doc_ids, swapped)


def test_spread_windows_is_deterministic_nested_and_shuffled():
  doc_ids = doc_ids_of(COUNTS)
  a, b = pipeline.spread_windows(doc_ids, 300), pipeline.spread_windows(doc_ids.copy(), 300)
  np.testing.assert_array_equal(a, b)  # the fixed seed: the same windows every call
  np.testing.assert_array_equal(pipeline.spread_windows(doc_ids, 128), a[:128])  # a prefix
  firsts = doc_ids[a[:len(COUNTS)]]
  assert sorted(firsts.tolist()) == list(range(len(COUNTS)))
  assert firsts.tolist() != sorted(firsts.tolist())  # shuffled, not the split's order
  other = pipeline.spread_windows(doc_ids, 300, seed=pipeline.SPREAD_SEED + 1)
  assert not np.array_equal(other, a)
  assert_round_robin(doc_ids, other)


def test_spread_windows_zero_means_every_window_in_split_order():
  doc_ids = doc_ids_of(COUNTS)
  for n in (0, doc_ids.size, doc_ids.size + 5):
    np.testing.assert_array_equal(pipeline.spread_windows(doc_ids, n), np.arange(doc_ids.size))
  with pytest.raises(ValueError):
    pipeline.spread_windows(doc_ids, -1)
  # Document ids need not be 0..D-1 nor sorted.
  odd = np.array([9, 9, 4, 9, 7, 4])
  idx = pipeline.spread_windows(odd, 4)
  assert sorted(odd[idx[:3]].tolist()) == [4, 7, 9] and idx[3] in (1, 5)


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory, data_prepared) -> str:
  """A data dir whose ensemble-validation split has COUNTS windows per document (the test
  split 3 windows for each of 7 documents); the router is data_prepared's."""
  d = str(tmp_path_factory.mktemp("eval_windows"))
  shutil.copy(os.path.join(data_prepared, "router.npz"), d)
  rng = np.random.default_rng(0)
  for split, ids in (("ensemble_val", doc_ids_of(COUNTS)), ("test", doc_ids_of([3] * 7))):
    np.save(os.path.join(d, f"{split}.npy"),
            rng.integers(32, 127, (ids.size, 1025), dtype=np.uint8))
    np.save(os.path.join(d, f"{split}_docs.npy"), ids)
  return d


def test_test_set_takes_windows_spread_across_documents(eval_dir):
  windows, doc_ids = pipeline.eval_split(eval_dir, "ensemble_val")
  assert np.unique(doc_ids[:128]).size == 5  # the first 128 windows: 5 documents
  s = eval_lib.TestSet(eval_dir, 128, "ensemble_val", route=64, score=192)
  assert (s.windows_scored, s.documents_available) == (128, len(COUNTS))
  assert np.unique(s.doc_ids).size == len(COUNTS)  # 128 windows: all 79 documents
  idx = pipeline.spread_windows(doc_ids, 128)
  want, want_docs = eval_lib.cut_windows(windows[idx], doc_ids[idx], 64, 192)
  np.testing.assert_array_equal(s.windows, want)
  np.testing.assert_array_equal(s.doc_ids, want_docs)
  every = eval_lib.TestSet(eval_dir, 0, "ensemble_val", route=64, score=192)  # 0: all, in order
  want, want_docs = eval_lib.cut_windows(windows, doc_ids, 64, 192)
  np.testing.assert_array_equal(every.windows, want)
  np.testing.assert_array_equal(every.doc_ids, want_docs)
  assert every.windows_scored == doc_ids.size


def test_describe_span_counts_windows_and_documents(eval_dir):
  val = eval_lib.TestSet(eval_dir, 50, "ensemble_val", route=64, score=192)
  test = eval_lib.TestSet(eval_dir, 10, "test", route=64, score=192)
  span = datasets.describe_span(val, test)
  assert span == {
      "route_bytes": 64, "score_bytes": 192, "window_bytes": 257,
      "windows_per_1025_byte_window": 4,
      "val_windows": 50 * 4, "test_windows": 10 * 4,  # the scored pieces, as before
      "test_documents": 7,
      "val_documents": 50, "val_documents_available": len(COUNTS), "val_windows_scored": 50,
      "test_documents_available": 7, "test_windows_scored": 10}


# ----------------------------------------------------------------------------- intervals


def test_widened_t_interval_by_hand():
  """values 1, 2, 4 and a document variance 0.25: mean 7/3, sd^2 = 7/3, so the half width
  is t_{0.975, 2} sqrt(7/9 + 1/4) with t_{0.975, 2} = 4.302652729749462."""
  got = statistics.widened_t_interval([1.0, 2.0, 4.0], 0.25)
  half = 4.302652729749462 * np.sqrt(7 / 9 + 0.25)
  assert got["mean"] == pytest.approx(7 / 3) and got["sd"] == pytest.approx(np.sqrt(7 / 3))
  assert got["document_sd"] == pytest.approx(0.5) and got["n"] == 3
  np.testing.assert_allclose(got["ci95"], [7 / 3 - half, 7 / 3 + half], rtol=1e-12)
  # No document variance: the plain t interval across seeds.
  np.testing.assert_allclose(statistics.widened_t_interval([1.0, 2.0, 4.0], 0.0)["ci95"],
                             statistics.t_interval([1.0, 2.0, 4.0])["ci95"], rtol=1e-12)
  assert statistics.widened_t_interval([1.5], 0.25)["ci95"] is None  # one seed: no seed noise


def test_document_variance_matches_numpy_references():
  rng = np.random.default_rng(1)
  # One window per document: the bootstrap variance of the mean is var(x) / D (ddof 0).
  x_SxD = rng.normal(size=(3, 60)) + rng.normal(size=60)
  got = statistics.document_variance(x_SxD, np.arange(60), draws=40_000, seed=3)
  assert got == pytest.approx(x_SxD.mean(axis=0).var() / 60, rel=0.05)
  # Unequal windows per document: an explicit resample of document indices (the ratio mean).
  counts = rng.integers(1, 9, size=40)
  doc_ids = np.repeat(np.arange(40), counts)
  x_SxN = rng.normal(size=(2, doc_ids.size)) + rng.normal(size=40)[doc_ids]
  got = statistics.document_variance(x_SxN, doc_ids, draws=40_000, seed=4)
  sums_D = np.array([x_SxN.mean(axis=0)[doc_ids == d].sum() for d in range(40)])
  pick_BxD = np.random.default_rng(5).integers(0, 40, size=(40_000, 40))
  ref = (sums_D[pick_BxD].sum(axis=1) / counts[pick_BxD].sum(axis=1)).var(ddof=1)
  assert got == pytest.approx(ref, rel=0.05)


def noisy_gains(seeds: int = 3, docs: int = 30, per_doc: int = 4, seed: int = 0):
  """Per-seed records and per-window gains (ref, other) with a shared document effect on
  the difference (the same documents score every seed) and a small seed effect."""
  rng = np.random.default_rng(seed)
  doc_ids = np.repeat(np.arange(docs), per_doc)
  doc_effect = rng.normal(scale=0.05, size=docs)[doc_ids]
  ref, other, gains_w = [], [], []
  for s in range(seeds):
    other_w = rng.normal(0.1, 0.01, doc_ids.size)
    ref_w = other_w + 0.02 + doc_effect + rng.normal(0, 0.002) + rng.normal(0, 0.001, doc_ids.size)
    gains_w.append((ref_w, other_w))
    ref.append({"seed": s, "gain": {"test": float(ref_w.mean()), "validation": 0.0}})
    other.append({"seed": s, "gain": {"test": float(other_w.mean()), "validation": 0.0}})
  return ref, other, gains_w, doc_ids


def test_gain_difference_interval_carries_document_noise():
  ref, other, gains_w, doc_ids = noisy_gains()
  g = statistics.gain_difference(ref, other, gains_w, doc_ids, draws=2_000)
  diffs = [a["gain"]["test"] - b["gain"]["test"] for a, b in zip(ref, other, strict=True)]
  assert g["ci95"] == statistics.t_interval(diffs)["ci95"]  # the old keys, unchanged
  assert {"split", "mean", "sd", "n", "ci95", "per_seed", "validation", "how"} < set(g)
  both = g["seeds_and_documents"]
  diff_SxN = np.stack([r - o for r, o in gains_w])
  doc_var = statistics.document_variance(diff_SxN, doc_ids, 2_000, ref[0]["seed"])
  assert both["document_sd"] == pytest.approx(np.sqrt(doc_var))
  half = scipy_stats.t.ppf(0.975, 2) * np.sqrt(np.var(diffs, ddof=1) / 3 + doc_var)
  np.testing.assert_allclose(both["ci95"], [np.mean(diffs) - half, np.mean(diffs) + half])
  (lo, hi), (t_lo, t_hi) = both["ci95"], g["ci95"]
  assert lo < t_lo and t_hi < hi  # wider than the seeds' interval: the documents' noise
  # Here the documents dominate: the seeds' interval alone is far too narrow.
  assert (hi - lo) > 3 * (t_hi - t_lo)
  assert "seeds_and_documents" in g["how"] and "widened" in g["how"]


def test_end_difference_by_hand():
  """SPEC 9.8's primary readout: the other row's test end loss minus the reference's across 3
  seeds, against a hand computation: the t interval over the seeds' differences, and that
  interval widened by the documents' bootstrap variance, here by the closed form for equal
  windows per document (resampling D documents: Var = var_ddof0(document means) / D)."""
  rng = np.random.default_rng(7)
  seeds, docs, per_doc = 3, 40, 2
  doc_ids = np.repeat(np.arange(docs), per_doc)
  doc_effect = rng.normal(scale=0.05, size=docs)[doc_ids]  # shared by every seed
  ref, other, ends_w = [], [], []
  for s in range(seeds):
    ref_w = rng.normal(2.9, 0.05, doc_ids.size)
    other_w = ref_w + 0.03 + doc_effect + rng.normal(0, 0.005) + rng.normal(0, 0.001, doc_ids.size)
    ends_w.append((ref_w, other_w))
    ref.append({"seed": s, "end_loss": {"test": float(ref_w.mean()), "validation": 2.8}})
    other.append({"seed": s, "end_loss": {"test": float(other_w.mean()),
                                          "validation": 2.83 + 0.01 * s}})
  e = statistics.end_difference(ref, other, ends_w, doc_ids, draws=20_000)
  d = np.array([o.mean() - r.mean() for r, o in ends_w])  # other minus ref, per seed
  t = scipy_stats.t.ppf(0.975, seeds - 1)
  sd = d.std(ddof=1)
  assert e["mean"] == pytest.approx(d.mean()) and e["mean"] > 0  # the sign: other - ref
  np.testing.assert_allclose(e["ci95"], d.mean() + np.array([-1, 1]) * t * sd / np.sqrt(seeds))
  v = np.array([0.03, 0.04, 0.05])
  np.testing.assert_allclose(e["validation"]["ci95"],
                             v.mean() + np.array([-1, 1]) * t * v.std(ddof=1) / np.sqrt(seeds))
  diff_SxN = np.stack([o - r for r, o in ends_w])
  doc_means = diff_SxN.mean(axis=0).reshape(docs, per_doc).mean(axis=1)
  doc_var = doc_means.var() / docs  # the bootstrap's variance in closed form
  both = e["seeds_and_documents"]
  assert both["document_sd"] ** 2 == pytest.approx(doc_var, rel=0.05)
  half = (both["ci95"][1] - both["ci95"][0]) / 2
  assert half == pytest.approx(t * np.sqrt(sd**2 / seeds + doc_var), rel=0.03)
  np.testing.assert_allclose(  # exactly the widened interval of the reported document_sd
      both["ci95"], d.mean() + np.array([-1, 1]) * t * np.sqrt(
          sd**2 / seeds + both["document_sd"] ** 2))
  assert half > 2 * t * sd / np.sqrt(seeds)  # here the documents' noise dominates
  for s, q in enumerate(e["per_seed"]):
    assert q["seed"] == s and q["diff"] == pytest.approx(d[s])
    assert q["bootstrap_ci95"][0] < q["diff"] < q["bootstrap_ci95"][1]
  assert e["how"].startswith("this row's test end loss minus the reference's")
  # gain_difference's shape, which the verdict reads with both noises
  assert set(e) == {"split", "mean", "sd", "n", "ci95", "per_seed", "seeds_and_documents",
                    "validation", "how"}
  iv = verdict.from_stat("end", e)
  assert (iv.lo, iv.hi, iv.how) == (*both["ci95"], "seeds and documents")
