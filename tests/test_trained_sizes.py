"""The experts and reference variance studies on one trained run per N (size=trained): the
trainer (`soma_jax.studies.trained_sizes.train_all`), what the studies read back, and the
refusals of a folder that does not match the study's sizes. Tiny runs: seconds."""

import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64

from soma_jax import checkpoint as ckpt_lib
from soma_jax import model as M
from soma_jax import runs
from soma_jax.data import pipeline, prepare
from soma_jax.errors import UserError
from soma_jax.studies import trained_sizes as TS
from soma_jax.studies import variance as V
from soma_jax.studies import variance_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _configs():
  spec = importlib.util.spec_from_file_location("variance_configs_ts",
                                                os.path.join(ROOT, "experiments/configs/variance.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


CONFIGS = _configs()


def _config(study: str, out: str):
  """The study's tiny config on the tiny trained folder (the experts' sizes for both)."""
  c = CONFIGS.get_config(f"{study},size=tiny")
  c.update(trained_dir=out, total_params=CONFIGS.get_config("experts,size=tiny").total_params)
  return c


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_textdir):
  """A tiny trained folder: N = 1 and 2, each on its own small data dir, 4 updates."""
  out = str(tmp_path_factory.mktemp("sizes"))
  c = _config("experts", out)
  for n in c.n_list:  # small data dirs (train_all reuses a prepared one, else pystdlib)
    prepare.prepare(f"textdir:{data_textdir}", n, os.path.join(out, f"data_n{n}"), test_docs=6,
                    ensemble_val_docs=3, min_df=2, svd_dims=16, val_fraction=0.05)
  TS.train_all(variance_settings.variance_spec(c), out)
  return out


def test_trained_preset():
  """size=trained: T = 1024, sparse probes, N = 1 and at least two more, no N at width d_E."""
  for study in ("experts", "reference"):
    c = CONFIGS.get_config(f"{study},size=trained")
    vs = variance_settings.variance_spec(c)
    assert (c.seq_len, c.probe, c.n_list[0]) == (1024, "sparse", 1) and len(c.n_list) >= 3
    for n in c.n_list:
      assert TS.run_config(vs, n, "d").model.d_t == variance_settings.sized_model(vs, n).d_t != c.model.d_e
  assert CONFIGS.get_config("reference,size=trained").windows == "ensemble_val"


def test_every_n_trained_alike_and_reused(trained):
  """Each N{n} is N experts at the sized width, same recipe; a second call trains nothing."""
  c = _config("experts", trained)
  for n in c.n_list:
    run = ckpt_lib.read_config(TS.workdir(trained, n))
    assert (run.n_experts, run.model.d_t) == (n, variance_settings.sized_model(variance_settings.variance_spec(c), n).d_t)
    assert (run.steps, run.spsa.n_pert, run.data.seq_len) == (
        c.train_run.steps, c.train_run.spsa.n_pert, c.train_run.data.seq_len)
    assert run.data.dir == os.path.join(trained, f"data_n{n}")
    assert pipeline.load_manifest(run.data.dir)["num_clusters"] == n
  before = {n: os.path.getmtime(os.path.join(TS.workdir(trained, n), "metrics.jsonl"))
            for n in c.n_list}
  TS.train_all(variance_settings.variance_spec(c), trained)
  assert before == {n: os.path.getmtime(os.path.join(TS.workdir(trained, n), "metrics.jsonl"))
                    for n in c.n_list}


def _grad_norm_sq(workdir: str, windows_NxBxT1: np.ndarray) -> np.ndarray:
  """||grad||^2 of each expert's loss at the checkpoint's weights (float64, own heads)."""
  body, head, _ = runs.restore_params(workdir)
  to64 = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
  g = jax.vmap(jax.grad(M.loss), in_axes=(0, 0, 0))(jax.tree.map(to64, body), to64(head),
                                                     jnp.asarray(windows_NxBxT1))
  return sum(np.asarray(jnp.sum(x**2, axis=tuple(range(1, x.ndim))), np.float64)
             for x in jax.tree.leaves(g))


def test_experts_study_measures_each_runs_checkpoint(trained):
  """Each N's exact gradient is the one of that N's checkpoint on its recorded windows."""
  c = _config("experts", trained)
  with enable_x64():
    r = V.study_experts(*TS.load_all(variance_settings.variance_spec(c)))
    for row in r["variance_by_n"]:
      n = row["n"]
      rec = r["replay"][str(n)]["data"]
      assert rec["data_dir"] == os.path.join(trained, f"data_n{n}")
      win = np.stack([pipeline.expert_val_windows(rec["data_dir"], s, c.seq_len)[idx]
                      for s, idx in zip(rec["shard_of_expert"], rec["val_window_index"],
                                        strict=True)])
      np.testing.assert_allclose(row["grad_norm_sq"], _grad_norm_sq(TS.workdir(trained, n), win),
                                 rtol=1e-9)
      assert row["weights"].endswith(f"N{n} at update {c.train_run.steps}")
      assert np.isfinite(row["measured"]) and row["measured"] > 0
  assert r["weights"].startswith("trained: one SOMA run per N")


def test_reference_study_measures_each_runs_checkpoint(trained, monkeypatch):
  """g_ref of each N is jax.grad at that N's checkpoint over its ensemble-validation slots."""
  monkeypatch.setattr(V, "step_seconds", lambda *a, **k: 1.0)  # timing is not under test here
  c = _config("reference", trained)
  c.update(windows="ensemble_val", pool=8, ref_batch=16, alloc_mult=(1,), reps=2)
  with enable_x64():
    r = V.study_reference(*TS.load_all(variance_settings.variance_spec(c)))
    for n in c.n_list:
      rec = r["replay"][str(n)]["data"]
      source = pipeline.subwindows(pipeline.eval_split(rec["data_dir"], "ensemble_val")[0],
                                   c.seq_len)
      ref = np.stack([source[s] for s in rec["reference_slots"]])
      point = next(p for p in r["points"] if p["n"] == n)
      want = _grad_norm_sq(TS.workdir(trained, n), ref).sum()
      np.testing.assert_allclose(point["ref_grad_norm_sq"], want, rtol=1e-9)


def test_a_folder_that_does_not_match_is_refused(trained, tmp_path):
  """Missing N, wrong N, wrong width, another recipe: one UserError naming the fix."""
  c = _config("experts", trained)
  cases = [({"trained_dir": str(tmp_path / "none")}, "does not exist"),
           ({"n_list": (1, 2, 4)}, "has no trained N = 4"),
           ({"total_params": 2 * c.total_params}, "the study needs N = 1 at width")]
  swapped = tmp_path / "swapped"  # N2/ holds the N = 1 run
  swapped.mkdir()
  os.symlink(TS.workdir(trained, 1), swapped / "N1")
  os.symlink(TS.workdir(trained, 1), swapped / "N2")
  cases.append(({"trained_dir": str(swapped)}, "holds N = 1 experts"))
  for change, message in cases:
    bad = _config("experts", trained)
    bad.update(change)
    with pytest.raises(UserError, match=message) as e:
      TS.load_all(variance_settings.variance_spec(bad))
    assert "fix: python -m scripts.train_sizes" in str(e.value) and "\n" not in str(e.value)
  bad = _config("experts", trained)
  bad.train_run.spsa.n_pert = 2 * c.train_run.spsa.n_pert
  with pytest.raises(UserError, match="trained with spsa.n_pert="):
    TS.load_all(variance_settings.variance_spec(bad))
  for key, value in (("opt.weight_decay", 0.5), ("seed", 7)):  # any recipe field, not a list
    bad = _config("experts", trained)
    parent, _, leaf = key.rpartition(".")
    (bad.train_run[parent] if parent else bad.train_run)[leaf] = value
    with pytest.raises(UserError, match=f"trained with {key}="):
      TS.load_all(variance_settings.variance_spec(bad))
  fast = _config("experts", trained)  # cadence is no part of the recipe
  fast.train_run.log_every = 1
  assert set(TS.load_all(variance_settings.variance_spec(fast))[1]) == set(fast.n_list)


def test_entry_point_refuses_in_one_line(tmp_path):
  """experiments/variance.py: a missing trained_dir, or size=trained without weights, exit 2."""
  for extra in (["--config=experiments/configs/variance.py:experts,size=tiny",
                 f"--config.trained_dir={tmp_path / 'none'}"],
                ["--config=experiments/configs/variance.py:reference,size=trained"]):
    p = subprocess.run([sys.executable, "experiments/variance.py", *extra, f"--out={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "fix:" in lines[0], p.stderr


def test_entry_point_measures_a_trained_folder(trained, tmp_path):
  """experiments/variance.py --config.trained_dir=DIR runs the experts study on it (it once
  crashed checking the folder's records, strings among them, for non-finite weights)."""
  total = CONFIGS.get_config("experts,size=tiny").total_params
  p = subprocess.run([sys.executable, "experiments/variance.py",
                      "--config=experiments/configs/variance.py:experts,size=tiny",
                      f"--config.trained_dir={trained}", f"--config.total_params={total}", "--x64",
                      f"--out={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                     env=dict(os.environ, PYTHONPATH=ROOT))
  assert p.returncode == 0, p.stderr[-2000:]
  assert os.path.isfile(tmp_path / "experts.json"), os.listdir(tmp_path)
