"""The run report: loss curves PNG, report.json and report.md with the unigram baseline."""

import json
import os

import numpy as np

from soma_jax import report, train
from tests.test_train import tiny_config


def test_report_for_seed_and_warm_started_soma(data_prepared, tmp_path):
  seed_cfg = tiny_config(data_prepared, steps=2, n_experts=1)
  seed = str(tmp_path / "seed")
  train.train(seed_cfg, seed)
  soma = str(tmp_path / "soma")
  train.train(tiny_config(data_prepared, steps=2, init_from=seed), soma)
  out = str(tmp_path / "report")
  payload = report.write_report(out, {"seed": seed, "soma": soma}, data_prepared)
  for name in ("report.md", "report.json", "loss_curves.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0
  with open(os.path.join(out, "report.json")) as f:
    assert json.load(f) == json.loads(json.dumps(payload))
  assert 0 < payload["unigram_test_nats_per_byte"] < np.log(256)
  runs = payload["runs"]
  assert runs["seed"]["n_experts"] == 1 and runs["soma"]["n_experts"] == 3
  assert all(np.isfinite(r["test_nats_per_byte"]) for r in runs.values())
  assert "Unigram baseline" in open(os.path.join(out, "report.md")).read()


def test_warm_start_copies_seed_into_every_expert(data_prepared, tmp_path):
  seed = str(tmp_path / "seed")
  train.train(tiny_config(data_prepared, steps=2, n_experts=1), seed)
  body_1, head_1, _ = train.restore_params(seed)
  c = tiny_config(data_prepared, steps=2, init_from=seed)
  body_N, head_N = train.initial_params(c)
  for x1, xn in zip(*(__import__("jax").tree.leaves(t) for t in (body_1, body_N))):
    for e in range(3):
      np.testing.assert_array_equal(xn[e], x1[0])
  for e in range(3):
    np.testing.assert_array_equal(head_N[e], head_1[0])
