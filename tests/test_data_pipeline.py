"""grain training pipeline and data-dir loaders."""

import json
import os
import shutil

import numpy as np
import pytest

from soma_jax.data import pipeline
from soma_jax.errors import UserError


@pytest.mark.parametrize("seq_len", [1024, 256, 64])
def test_subwindows(seq_len):
  rng = np.random.default_rng(0)
  w = rng.integers(0, 256, (3, 1025), dtype=np.uint8)
  s = pipeline.subwindows(w, seq_len)
  per = 1024 // seq_len
  assert s.shape == (3 * per, seq_len + 1) and s.dtype == np.uint8
  for i in range(3):
    for k in range(per):
      np.testing.assert_array_equal(s[i * per + k], w[i, k * seq_len : k * seq_len + seq_len + 1])


def test_subwindows_rejects_non_divisor():
  with pytest.raises(UserError, match="must divide 1024"):
    pipeline.subwindows(np.zeros((1, 1025), np.uint8), 300)


def test_train_iterator_shapes_and_content(data_prepared):
  it = pipeline.train_iterator(data_prepared, [0, 1, 2], batch=4, accum=2, seq_len=256, seed=0)
  b = next(it)
  assert b.shape == (3, 2, 4, 257) and b.dtype == np.uint8
  for e in range(3):
    shard = {r.tobytes() for r in pipeline.subwindows(np.load(f"{data_prepared}/experts/{e:04d}/train.npy"), 256)}
    assert all(row.tobytes() in shard for row in b[e].reshape(-1, 257))


def test_train_iterator_covers_shard_each_epoch(data_prepared):
  n = len(pipeline.subwindows(np.load(f"{data_prepared}/experts/0001/train.npy"), 512))
  it = pipeline.train_iterator(data_prepared, [1], batch=1, accum=1, seq_len=512, seed=3)
  epoch1 = [next(it).tobytes() for _ in range(n)]
  epoch2 = [next(it).tobytes() for _ in range(n)]
  assert sorted(epoch1) == sorted(epoch2) and epoch1 != epoch2  # reshuffled each epoch


def test_state_resume_is_exact(data_prepared):
  it = pipeline.train_iterator(data_prepared, [0, 2], batch=3, accum=1, seq_len=128, seed=7)
  for _ in range(5):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  expected = [next(it) for _ in range(4)]
  fresh = pipeline.train_iterator(data_prepared, [0, 2], batch=3, accum=1, seq_len=128, seed=7)
  fresh.set_state(state)
  for want in expected:
    np.testing.assert_array_equal(next(fresh), want)
  other = pipeline.train_iterator(data_prepared, [0, 2], batch=2, accum=1, seq_len=128, seed=7)
  with pytest.raises(UserError, match="different settings"):
    other.set_state(state)
  with pytest.raises(UserError, match=r"iterator state has an invalid step \{'step': -1\}"):
    fresh.set_state({**state, "step": -1})
  with pytest.raises(UserError, match=r"expert ids \[3\] are outside the data dir's 0\.\.2"):
    pipeline.train_iterator(data_prepared, [0, 3], batch=2, accum=1, seq_len=128, seed=7)


def test_expert_batches_independent_of_expert_subset(data_prepared, tmp_path):
  full = pipeline.train_iterator(data_prepared, [0, 1, 2], batch=2, accum=2, seq_len=256, seed=1)
  # A copy holding only expert 2's shard: proves only requested shards are opened.
  sub_dir = tmp_path / "sub"
  shutil.copytree(data_prepared, sub_dir)
  for e in (0, 1):
    os.remove(sub_dir / "experts" / f"{e:04d}" / "train.npy")
  sub = pipeline.train_iterator(str(sub_dir), [2], batch=2, accum=2, seq_len=256, seed=1)
  for _ in range(6):
    np.testing.assert_array_equal(next(sub)[0], next(full)[2])
  other_seed = pipeline.train_iterator(data_prepared, [2], batch=2, accum=2, seq_len=256, seed=2)
  assert not np.array_equal(next(other_seed)[0], next(pipeline.train_iterator(data_prepared, [2], batch=2, accum=2, seq_len=256, seed=1))[0])


def test_batch_larger_than_shard_is_an_error(data_prepared):
  with pytest.raises(UserError, match="fewer than one batch"):
    pipeline.train_iterator(data_prepared, [0], batch=100_000, accum=1, seq_len=1024, seed=0)


def test_check_data_dir(data_prepared, tmp_path):
  assert pipeline.check_data_dir(data_prepared, 3)["num_clusters"] == 3
  with pytest.raises(UserError, match=r"3 expert shards.*4 experts.*--num_clusters=4.*n=3"):
    pipeline.check_data_dir(data_prepared, 4)
  with pytest.raises(UserError, match="does not exist"):
    pipeline.load_manifest(str(tmp_path / "nope"))
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "manifest.json").write_text("{not json")
  with pytest.raises(UserError, match="corrupt"):
    pipeline.load_manifest(str(bad))
  (bad / "manifest.json").write_text(json.dumps({"version": 999}))
  with pytest.raises(UserError, match="version 999"):
    pipeline.load_manifest(str(bad))


def test_eval_splits_and_val_windows(data_prepared):
  manifest = pipeline.load_manifest(data_prepared)
  w, docs = pipeline.eval_split(data_prepared, "test")
  assert w.shape == (manifest["test_windows"], 1025) and docs.dtype == np.int32
  np.testing.assert_array_equal(docs, np.arange(len(w)))  # one window per document
  w, docs = pipeline.eval_split(data_prepared, "ensemble_val")
  assert w.shape == (manifest["ensemble_val_windows"], 1025)
  assert np.all(np.diff(docs) >= 0) and docs.max() == manifest["ensemble_val_docs"] - 1
  v = pipeline.expert_val_windows(data_prepared, 1, 512)
  assert v.shape == (2 * manifest["shards"][1]["val_windows"], 513)
  with pytest.raises(UserError, match="unknown eval split"):
    pipeline.eval_split(data_prepared, "train")


def _pooled_windows(data_dir):
  n = pipeline.load_manifest(data_dir)["num_clusters"]
  return {r.tobytes() for e in range(n) for r in np.load(f"{data_dir}/experts/{e:04d}/train.npy")}


def test_streams_each_pair_reads_its_own_contiguous_stream(data_prepared):
  """Pairs of one update see different bytes; update u + 1 continues update u; a new window
  starts with a reset; each stream's first 1,024 positions are one training window."""
  it = pipeline.StreamSegments(data_prepared, [0], streams=4, segment=300, seed=0, pooled=True)
  segs = [next(it) for _ in range(4)]  # positions 0 .. 1,199
  for s in segs:
    assert s["inputs"].shape == s["targets"].shape == (1, 4, 300) and s["reset"].shape == (1, 300)
    rows = [s["inputs"][0, k].tobytes() for k in range(4)]
    assert len(set(rows)) == 4, "two antithetic pairs of one update read the same bytes"
  for a, b in zip(segs[:2], segs[1:3], strict=True):  # within window 0: targets lead inputs by one
    np.testing.assert_array_equal(b["inputs"][..., 0], a["targets"][..., -1])
  inputs = np.concatenate([s["inputs"] for s in segs], axis=-1)[0]  # [4, 1200]
  targets = np.concatenate([s["targets"] for s in segs], axis=-1)[0]
  reset = np.concatenate([s["reset"] for s in segs], axis=-1)[0]
  assert np.flatnonzero(reset).tolist() == [0, 1024]
  windows = _pooled_windows(data_prepared)
  for k in range(4):
    window = np.concatenate([inputs[k, :1024], targets[k, 1023:1024]])
    assert window.tobytes() in windows, f"stream {k} is not a training window"
    np.testing.assert_array_equal(inputs[k, 1:1024], targets[k, :1023])
  assert len({inputs[k, 1024:].tobytes() for k in range(4)} | {inputs[k, :1024].tobytes()
                                                                 for k in range(4)}) == 8


def test_streams_resume_exactly_and_refuse_other_settings(data_prepared):
  it = pipeline.StreamSegments(data_prepared, [0], streams=3, segment=200, seed=2, pooled=True)
  for _ in range(4):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  assert state["position"] == 800
  expected = [next(it) for _ in range(3)]
  fresh = pipeline.StreamSegments(data_prepared, [0], streams=3, segment=200, seed=2, pooled=True)
  fresh.set_state(state)
  for want in expected:
    got = next(fresh)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])
  other = pipeline.StreamSegments(data_prepared, [0], streams=3, segment=100, seed=2, pooled=True)
  with pytest.raises(UserError, match="different settings"):
    other.set_state(state)
  with pytest.raises(UserError, match=r"stream state has an invalid step \{'step': 4, 'position': 801\}"):
    fresh.set_state({**state, "position": 801})
  with pytest.raises(UserError, match="no experts requested"):
    pipeline.StreamSegments(data_prepared, [], streams=3, segment=200, seed=2)
  with pytest.raises(UserError, match="fewer than its"):
    pipeline.StreamSegments(data_prepared, [0], streams=10**6, segment=100, seed=2, pooled=True)
