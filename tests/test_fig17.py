"""study=fig17 (the paper's Figure 17): every pair of Figure 16's experts averaged on every
window; read from a finished fig16 folder or trained here, the same pairs either way; one
pair's reduction and error similarity checked against an independent numpy computation."""

import json
import os

import numpy as np
import pytest

from soma_jax.errors import UserError
from soma_jax.studies import driver, fig16, fig17
from tests.test_compare import load_config
from tests.test_fig16 import expert_logprobs, tiny_config, val_set


@pytest.fixture(scope="module")
def paired(tmp_path_factory, data_textdir):
  """fig16 at one seed, fig17 reading it, and fig17 training the same ensembles itself."""
  root = tmp_path_factory.mktemp("fig17")
  out16, read, trained = (str(root / name) for name in ("fig16", "read", "trained"))
  driver.run(fig16.STUDY, tiny_config("fig16", data_textdir, seeds=1), out16, "test")
  config = tiny_config("fig17", data_textdir, seeds=1)
  config.ensembles_from = out16
  p_read = driver.run(fig17.STUDY, config, read, "test")
  config = tiny_config("fig17", data_textdir, seeds=1)
  return config, out16, read, p_read, driver.run(fig17.STUDY, config, trained, "test")


def test_every_pair_is_scored_on_every_window(paired):
  config, out16, read, p, _ = paired
  windows = p["eval"]["val_windows"]
  assert p["ensembles_from"] == out16 and not os.path.isdir(os.path.join(read, "runs"))
  for name, r in p["measured"]["ensembles"].items():
    n = config.methods[name].n_experts
    assert r["pairs_per_seed"] == n * (n - 1) // 2 and r["windows"] == windows
    assert r["tokens_per_pair"] == windows * config.eval.score_bytes
    for s in r["per_seed"]:
      got = {(q["expert_a"], q["expert_b"]) for q in s["pairs"]}
      assert got == {(a, b) for a in range(n) for b in range(a + 1, n)}
      assert all(q["num_windows"] == windows for q in s["pairs"])
      assert os.path.isfile(os.path.join(read, "pairs", f"{name}_seed{s['seed']}.csv"))
    assert sum(b["pairs"] for b in r["bins"]) == r["pairs_per_seed"] * len(p["seeds"])
    assert len(r["bins"]) == min(config.bins, r["pairs_per_seed"] * len(p["seeds"]))
    assert all(b["tokens_per_pair"] == r["tokens_per_pair"] for b in r["bins"])
  assert os.path.getsize(os.path.join(read, "fig17.png")) > 1000
  assert p["paper"]["tokens"] == 749_568
  assert "tokens each" in open(os.path.join(read, "table.md")).read()


def test_reading_fig16_gives_the_pairs_training_gives(paired):
  *_, p_read, p_trained = paired
  for name, r in p_read["measured"]["ensembles"].items():
    mine = p_trained["measured"]["ensembles"][name]["per_seed"][0]["pairs"]
    theirs = r["per_seed"][0]["pairs"]
    for a, b in zip(mine, theirs, strict=True):
      assert a["loss_reduction"] == pytest.approx(b["loss_reduction"], rel=1e-6)
      assert a["error_correlation"] == pytest.approx(b["error_correlation"], rel=1e-6)


def test_averaging_never_scores_worse_than_the_mean_of_the_two(paired):
  *_, p, _ = paired
  for r in p["measured"]["ensembles"].values():
    red = [q["loss_reduction"] for s in r["per_seed"] for q in s["pairs"]]
    assert min(red) >= 0 and max(red) > 0
    assert r["min_loss_reduction"] == min(red)


def test_one_pair_against_an_independent_computation(paired):
  config, out16, _, p, _ = paired
  name = config.ensembles[-1]  # N = 6: the shared difficulty is not the pair's own mean
  r = p["measured"]["ensembles"][name]
  s = r["per_seed"][0]
  loss_NxWxT = -expert_logprobs(os.path.join(out16, "runs", f"seed{s['seed']}", name),
                                val_set(config, out16, r["n_experts"]))
  a, b = 1, r["n_experts"] - 1
  la, lb, d = loss_NxWxT[a].ravel(), loss_NxWxT[b].ravel(), loss_NxWxT.mean(axis=0).ravel()
  mix = -np.logaddexp(-la, -lb) + np.log(2)
  design = np.stack([np.ones_like(d), d], axis=1)
  resid = [v - design @ np.linalg.lstsq(design, v, rcond=None)[0] for v in (la, lb)]
  row = next(q for q in s["pairs"] if (q["expert_a"], q["expert_b"]) == (a, b))
  assert row["loss_reduction"] == pytest.approx((la.mean() + lb.mean()) / 2 - mix.mean(), rel=1e-4)
  assert row["error_correlation"] == pytest.approx(np.corrcoef(*resid)[0, 1], abs=1e-4)
  assert abs(row["error_correlation"] - np.corrcoef(la, lb)[0, 1]) > 1e-3  # d is removed


def test_the_relation_and_the_bins(paired):
  *_, p, _ = paired
  for r in p["measured"]["ensembles"].values():
    pairs = [q for s in r["per_seed"] for q in s["pairs"]]
    x = np.array([q["error_correlation"] for q in pairs])
    y = np.array([q["loss_reduction"] for q in pairs])
    if r["relation"]["pearson"] is None:
      assert len(pairs) < 3
      continue
    assert r["relation"]["pearson"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert r["negative_slope"] == (np.polyfit(x, y, 1)[0] < 0)
    order = np.argsort(x, kind="stable")
    first = r["bins"][0]["pairs"]
    assert r["bins"][0]["loss_reduction"] == pytest.approx(y[order[:first]].mean())
    means = [b["error_similarity"] for b in r["bins"]]
    assert means == sorted(means)


def test_a_fig16_folder_of_other_settings_is_refused(paired, tmp_path):
  config, out16, read, *_ = paired
  other = load_config("compare", "study=fig17,size=tiny")
  other.update(source=config.source, seeds=1, ensembles_from=out16, budget=4.0)
  other.prepare.update(config.prepare)
  with pytest.raises(UserError, match="budget"):
    driver.run(fig17.STUDY, other, str(tmp_path / "a"))
  other.budget, other.ensembles_from = config.budget, read  # a fig17 folder, not fig16
  with pytest.raises(UserError, match="not fig16"):
    driver.run(fig17.STUDY, other, str(tmp_path / "b"))
  other.ensembles_from = str(tmp_path / "missing")
  with pytest.raises(UserError, match="not a folder"):
    driver.checked(fig17.STUDY, other)
  other.ensembles_from, other.bins = "", 0
  with pytest.raises(UserError, match="bins"):
    driver.checked(fig17.STUDY, other)
  with open(os.path.join(out16, "results.json")) as f:
    assert json.load(f)["study"] == "fig16"  # nothing above wrote into the fig16 folder
