"""study=table8 (the paper's Table 8): the experts variance study's jax.grad reference against
an independent batch of the same size, per N, at init and trained; the structure of the
results, the cosine distance, the disjointness of the independent batch, the recorded
relative changes, and the refusals. Tiny sizes: seconds."""

import json
import os

import numpy as np
import pytest

from soma_jax.errors import UserError
from soma_jax.studies import compare, driver, table8, variance, variance_settings, variance_windows
from tests.conftest import STUDY_PREPARE as PREPARE
from tests.test_compare import load_config


@pytest.fixture(scope="module")
def tabled(tmp_path_factory, data_textdir):
  config = load_config("compare", "study=table8,size=tiny")
  config.variance.trained_source = f"textdir:{data_textdir}"
  config.prepare.update(PREPARE)
  out = str(tmp_path_factory.mktemp("table8") / "out")
  return config, out, driver.run(table8.STUDY, config, out, "python experiments/compare.py --test")


def _overlaps(a: list[int], b: list[int], length: int) -> bool:
  return bool(np.any(np.abs(np.subtract.outer(a, b)) < length))


def test_results_hold_every_n_at_init_and_trained(tabled):
  config, out, p = tabled
  assert compare.STUDIES["table8"] is table8.STUDY
  assert p["paper"]["item"] == "Table 8" and [r["n"] for r in p["paper"]["rows"]] == [1, 2, 8, 256]
  states = p["measured"]["states"]
  assert set(states) == {"init", "trained"}
  for name, rows in states.items():
    assert [r["n"] for r in rows] == list(config.variance.n_list)
    for r in rows:
      assert (r["batch"], r["seq_len"]) == (config.variance.batch, config.variance.seq_len)
      assert len(r["cosine_distance_per_expert"]) == r["n"]
      assert r["cosine_distance"] == pytest.approx(np.mean(r["cosine_distance_per_expert"]))
      assert [q["n_pert"] for q in r["points"]] == [1, 2, 4, 8]
      assert (r["run"] is None) == (name == "init")
  for r in states["trained"]:  # each N trained here for train_updates updates
    assert r["run"]["update"] == config.train_updates and r["run"]["n_experts"] == r["n"]
    assert r["weights"].startswith("trained:")
  with open(os.path.join(out, "results.json")) as f:
    assert json.load(f)["study"] == "table8"
  md = open(os.path.join(out, "table.md")).read()
  assert "| 1 | 2 x 32 |" in md and "8000 / 8000 | 0.00002 / 0.01045" in md


def test_reference_values_are_the_experts_studys(tabled):
  config, _, p = tabled
  got = variance.study_experts(variance_settings.variance_spec(config.variance))
  for r, want in zip(p["measured"]["states"]["init"], got["points"], strict=True):
    point = next(q for q in r["points"] if q["n_pert"] == want["n_pert"])
    assert point["reference"] == pytest.approx(want["measured"], rel=1e-5)


def test_cosine_distance_is_zero_for_the_same_batch_only(tabled):
  a = np.random.default_rng(0).normal(size=(3, 50))
  assert table8.cosine_distance(a, 2.5 * a) == pytest.approx([0, 0, 0], abs=1e-12)
  assert table8.cosine_distance(a, -a) == pytest.approx([2, 2, 2])
  assert table8.cosine_distance(np.eye(2), np.eye(2)[::-1]) == pytest.approx([1, 1])
  config, _, p = tabled
  vs = variance_settings.variance_spec(config.variance)
  n = 2
  params, mcfg, data_dir, _, _ = variance._per_n(vs, n, None)
  body, head, shared, win, _, g, _, _ = variance._fixed_batch(vs, n, params, mcfg, "", data_dir)
  same = table8.compare_references(vs, body, head, shared, win, g, win)
  assert same["cosine_distance"] == pytest.approx(0, abs=1e-9)
  assert all(q["relative_change"] == pytest.approx(0, abs=1e-9) for q in same["points"])
  for rows in p["measured"]["states"].values():  # a disjoint batch: another gradient
    assert all(c > 1e-6 for r in rows for c in r["cosine_distance_per_expert"])


def test_free_starts_exclude_every_overlapping_window():
  free = table8.free_starts(np.array([10, 30]), 40, 8)
  assert list(free) == [0, 1, 2, 18, 19, 20, 21, 22, 38, 39]
  assert not _overlaps(list(free), [10, 30], 8)


@pytest.mark.parametrize("seed", range(4))
def test_independent_windows_share_no_byte_with_the_reference(seed):
  t, n, count = 16, 2, 3
  corpus_bytes = 2 * 10 * (t + 1)  # 10 windows' room per expert: overlaps likely unless avoided
  ref, rec = variance_windows.expert_windows(n, count, t, seed, "", corpus_bytes)
  ind, ind_rec = table8.independent_windows(n, count, t, seed, "", corpus_bytes, rec)
  corpus = variance_windows.stdlib_corpus(corpus_bytes)
  part = len(corpus) // n
  for e in range(n):
    starts = ind_rec["byte_offsets"][e]
    assert not _overlaps(starts, rec["byte_offsets"][e], t + 1)
    assert all(e * part <= s <= (e + 1) * part - t - 1 for s in starts)
    assert all(np.array_equal(ind[e, i], corpus[s:s + t + 1]) for i, s in enumerate(starts))
  with pytest.raises(UserError, match="share no byte"):
    table8.independent_windows(n, part, t, seed, "", corpus_bytes, rec)


def test_trained_independent_windows_are_other_subwindows(tabled):
  for r in tabled[2]["measured"]["states"]["trained"]:
    ref, ind = r["windows"]["reference"], r["windows"]["independent"]
    assert ind["shard_of_expert"] == ref["shard_of_expert"]
    for a, b in zip(ref["val_window_index"], ind["val_window_index"], strict=True):
      assert not _overlaps(a, b, 2)  # sub-windows k and k + 1 share a byte


def test_data_dir_independent_windows_skip_the_reference_and_its_neighbours(tabled):
  from soma_jax.data import pipeline

  data_dir, t = os.path.join(tabled[1], "trained", "data_n1"), tabled[0].variance.seq_len
  w = pipeline.expert_val_windows(data_dir, 0, t)
  taken = [i for i in range(len(w)) if i % 5 in (0, 1)]  # free: i % 5 == 3 alone
  free = [i for i in range(len(w)) if i % 5 == 3]
  ref = {"shard_of_expert": [0], "val_window_index": [taken]}
  ind, rec = table8.independent_windows(1, len(free), t, 0, data_dir, 0, ref)
  assert rec["val_window_index"] == [free] and len(free) >= 2
  assert np.array_equal(ind[0], w[free])
  with pytest.raises(UserError, match="share no byte"):
    table8.independent_windows(1, len(free) + 1, t, 0, data_dir, 0, ref)


def test_relative_changes_recompute_from_the_two_values(tabled):
  m = tabled[2]["measured"]
  worst = {}
  for name, rows in m["states"].items():
    for r in rows:
      for q in r["points"]:
        assert q["relative_change"] == pytest.approx(q["independent"] / q["reference"] - 1)
        assert q["reference"] > 0 and q["independent"] > 0
      assert r["max_abs_relative_change"] == max(abs(q["relative_change"]) for q in r["points"])
    worst[name] = max(r["max_abs_relative_change"] for r in rows)
  assert m["max_abs_relative_change"] == worst
  assert m["max_abs_relative_change_all"] == max(worst.values())
  assert m["within_paper_bound"] == (max(worst.values()) < 0.04)


@pytest.mark.parametrize("key, value, match", [
    ("train_updates", 0, "train_updates"), ("x64", "yes", "x64"),
    ("variance.batch", 0, "variance.batch"), ("variance.reps", 1, "variance.reps"),
    ("variance.study", "batch", "variance.study"), ("variance.n_list", (), "variance.n_list"),
    ("variance.n_list", (2, 2), "variance.n_list"),
    ("variance.trained_source", "", "variance.trained_source")])
def test_bad_fields_are_refused(key, value, match):
  config = load_config("compare", "study=table8,size=tiny")
  parent, _, leaf = key.rpartition(".")
  c = config[parent] if parent else config
  with c.unlocked():  # a value of another type: replace the field
    del c[leaf]
    c[leaf] = value
  with pytest.raises(UserError, match=match):
    driver.checked(table8.STUDY, config)[1]


def test_the_cpu_config_is_the_variance_experts_study():
  config = load_config("compare", "study=table8,size=cpu")
  want = load_config("variance", "experts,size=cpu")
  assert config.variance.to_dict() == want.to_dict()
  assert driver.checked(table8.STUDY, config)[1].vs.n_list == (1, 2, 8, 32)
  with pytest.raises(UserError, match="size=cpu or tiny"):
    load_config("compare", "study=table8,size=trained")
