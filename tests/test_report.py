"""The run report: loss curves PNG, report.json and report.md with the unigram baseline."""

import json
import os

import numpy as np
import pytest

from soma_jax import checkpoint as ckpt_lib
from soma_jax import runs, train
from soma_jax import spec as spec_lib
from soma_jax.data import pipeline
from soma_jax.data.router import Router
from soma_jax.studies import report, results
from tests.test_evaluate import hand_mixture
from tests.test_train import tiny_config


def test_report_for_seed_and_warm_started_soma(data_prepared, tmp_path):
  seed_cfg = tiny_config(data_prepared, steps=2, n_experts=1)
  seed = str(tmp_path / "seed")
  train.run(seed_cfg, seed)
  soma = str(tmp_path / "soma")
  train.run(tiny_config(data_prepared, steps=2, init_from=seed), soma)
  out = str(tmp_path / "report")
  payload = report.write_report(out, {"seed": seed, "soma": soma}, data_prepared)
  for name in ("report.md", "report.json", "loss_curves.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0
  with open(os.path.join(out, "report.json")) as f:
    assert json.load(f) == json.loads(json.dumps(payload))
  assert 0 < payload["unigram_test_nats_per_byte"] < np.log(256)
  runs = payload["runs"]
  assert runs["seed"]["n_experts"] == 1 and runs["soma"]["n_experts"] == 3
  # The unigram baseline and each run's routed test loss, recomputed by hand.
  assert payload["unigram_test_nats_per_byte"] == pytest.approx(_hand_unigram(data_prepared))
  for name, workdir in (("seed", seed), ("soma", soma)):
    want = _hand_routed_loss(workdir, data_prepared)
    assert runs[name]["test_nats_per_byte"] == pytest.approx(want, rel=1e-5), name
  md = open(os.path.join(out, "report.md")).read()
  assert "Unigram baseline" in md
  assert f"{runs['soma']['test_nats_per_byte']:.3f}" in md


def _hand_unigram(data_dir):
  """Add-one byte frequencies of all training shards; cross entropy on test targets 257..1024."""
  counts = np.ones(256)
  for e in range(pipeline.load_manifest(data_dir)["num_clusters"]):
    counts += np.bincount(np.load(f"{data_dir}/experts/{e:04d}/train.npy").ravel(), minlength=256)
  windows, _ = pipeline.eval_split(data_dir, "test")
  return float(-np.log(counts / counts.sum())[windows[:, 257:]].mean())


def _hand_routed_loss(workdir, data_dir):
  """Top-min(4, N) experts by the router; mean of their softmax probabilities; nats/byte."""
  body_N, head, _ = runs.restore_params(workdir)
  c = ckpt_lib.read_config(workdir)
  windows, _ = pipeline.eval_split(data_dir, "test")
  n = c.n_experts
  routes = (np.zeros((len(windows), 1), int) if n == 1 else
            Router.load(f"{data_dir}/router.npz").route(windows[:, :256], min(4, n)))
  return float(hand_mixture(body_N, head, c.model.shared_head, windows, routes).mean())


def test_warm_start_copies_seed_into_every_expert(data_prepared, tmp_path):
  seed = str(tmp_path / "seed")
  train.run(tiny_config(data_prepared, steps=2, n_experts=1), seed)
  body_1, head_1, _ = runs.restore_params(seed)
  c = tiny_config(data_prepared, steps=2, init_from=seed)
  body_N, head_N = runs.initial_params(spec_lib.resolve(c))
  for x1, xn in zip(*(__import__("jax").tree.leaves(t) for t in (body_1, body_N))):
    for e in range(3):
      np.testing.assert_array_equal(xn[e], x1[0])
  for e in range(3):
    np.testing.assert_array_equal(head_N[e], head_1[0])


def test_a_table_head_has_one_separator_per_cell():
  """results.head counts the header's cells, a header joined from a list too (every study's
  table.md starts its tables so)."""
  assert results.head("| a | b |") == ["| a | b |", "|---|---|"]
  seeds = [0, 1, 2]
  head = "| row | " + " | ".join(f"seed {s}" for s in seeds) + " |"
  assert results.head(head) == [head, "|---|---|---|---|"]


def test_png_draws_into_the_study_folder(tmp_path):
  """report.png: a Study's plot hook hands its plot OUT/name."""
  drawn = []
  report.png(lambda p, path: drawn.append((p, path)), "fig.png")({"x": 1}, str(tmp_path))
  assert drawn == [({"x": 1}, os.path.join(str(tmp_path), "fig.png"))]
