"""Run folders written by the code before `soma_jax.methods` (c74bb5a) still evaluate and resume.

tests/fixtures/old_runs holds a SOMA N = 3 and an EGGROLL (GRU) run at step 3, written by
tests/fixtures/make_old_runs.py at c74bb5a on the data of `data_prepared`, and what that code
gave: the routed test loss at step 3, and the expert-validation losses after training the
same config uninterrupted to step 6. Today's code must evaluate the folder to the same test
loss and resume it to the same validation losses (the run's data re-prepared elsewhere, so
data.dir is named in resume_overrides).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from soma_jax import checkpoint as ckpt_lib
from soma_jax import evaluate as eval_lib
from soma_jax import runs, train
from soma_jax.data import pipeline
from soma_jax.data.router import Router
from soma_jax.errors import UserError

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "old_runs")


def _expected() -> dict:
  with open(os.path.join(FIXTURE, "expected.json")) as f:
    return json.load(f)


def _copy(name: str, data_dir: str, tmp_path) -> str:
  """The fixture run in tmp_path, its DATA placeholder pointing at this data dir."""
  workdir = str(tmp_path / name)
  shutil.copytree(os.path.join(FIXTURE, name), workdir)
  path = os.path.join(workdir, ckpt_lib.CONFIG_FILE)
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text.replace('"DATA"', json.dumps(data_dir)))
  return workdir


# router.npz holds the float output of a randomized SVD and k-means: its bits follow the
# machine's BLAS kernels (the recorded hash came from another processor; this code at the
# fixture's own commit prepares other router bits here). What the router decided is in the
# shards and splits, compared to the bit.
FLOAT_FILES = ("router.npz",)


def test_the_fixture_data_is_the_data_the_old_runs_read(data_prepared):
  files = pipeline.load_manifest(data_prepared)["files"]
  expected = _expected()["data_files_sha256"]
  assert set(files) == set(expected)
  assert {k: v for k, v in files.items() if k not in FLOAT_FILES} == {
      k: v for k, v in expected.items() if k not in FLOAT_FILES}


def test_an_old_gru_run_is_refused_in_one_line(data_prepared, tmp_path):
  """The GRU block changed (issue 22: mixer + MLP, SPEC 9.4); its old weights cannot load."""
  workdir = _copy("eggroll_gru", data_prepared, tmp_path)
  with pytest.raises(UserError, match="earlier 3-gate GRU.*fix: retrain"):
    runs.restore_state(workdir)
  c = ckpt_lib.read_config(workdir)
  c.steps, c.resume_overrides = 6, "data.dir"
  with pytest.raises(UserError, match="earlier 3-gate GRU"):
    train.run(c, workdir)


@pytest.mark.parametrize("name", ["soma_n3"])
def test_an_old_run_evaluates_as_it_did(name, data_prepared, tmp_path):
  workdir = _copy(name, data_prepared, tmp_path)
  step, state, _, c = runs.restore_state(workdir)
  assert step == 3
  windows, doc_ids = eval_lib.load_split(data_prepared, "test")
  router = Router.load(os.path.join(data_prepared, "router.npz"))
  got = eval_lib.evaluate(state.body, state.head, windows, doc_ids, router, 4,
                          c.shared_head, draws=10, logits_fn=c.method.logits)["nats_per_byte"]
  assert got == pytest.approx(_expected()["runs"][name]["test_nats_per_byte_at_3"], rel=1e-6)


@pytest.mark.parametrize("name", ["soma_n3"])
def test_an_old_run_resumes_to_where_the_old_code_went(name, data_prepared, tmp_path):
  workdir = _copy(name, data_prepared, tmp_path)
  c = ckpt_lib.read_config(workdir)
  c.steps = 6
  c.resume_overrides = "data.dir"  # the same data, prepared again in another folder
  summary = train.run(c, workdir)
  assert summary["status"] == "done" and summary["step"] == 6
  np.testing.assert_allclose(summary["val_loss"], _expected()["runs"][name]["val_loss_at_6"],
                             rtol=1e-6)
