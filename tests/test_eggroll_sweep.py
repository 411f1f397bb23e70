"""scripts/eggroll_sweep.py: the grid its flags name, and one-line refusals of bad ones."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from scripts import eggroll_sweep
from soma_jax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(**kw):
  base = {"steps": 12, "lrs": ["0.01", "0.03"], "sigmas": ["0.125"], "points": []}
  return argparse.Namespace(**{**base, **kw})


def test_grid_is_the_product_then_each_extra_point_once():
  grid = eggroll_sweep._grid(_args(points=["0.1:0.125", "0.03:0.125", "0.1:0.125", "0.03:0.25"]))
  assert grid == [(0.01, 0.125), (0.03, 0.125), (0.1, 0.125), (0.03, 0.25)]


@pytest.mark.parametrize("kw,says", [
    ({"steps": 0}, "--steps=0 must be >= 1"),
    ({"lrs": ["0.01", "x"]}, "--lrs=0.01 x must be positive numbers"),
    ({"sigmas": ["-0.1"]}, "--sigmas=-0.1 must be positive numbers"),
    ({"lrs": ["nan"]}, "--lrs=nan must be positive numbers"),
    ({"sigmas": ["inf"]}, "--sigmas=inf must be positive numbers"),
    ({"points": ["0.1"]}, "--points 0.1: write each point as LR:SIGMA"),
    ({"points": ["0.1:0"]}, "--points 0.1:0: write each point as LR:SIGMA"),
    ({"points": ["0.1:0.2:0.3"]}, "--points 0.1:0.2:0.3: write each point as LR:SIGMA"),
])
def test_bad_grid_values_are_refused_by_name(kw, says):
  with pytest.raises(UserError, match="^" + says.replace("-", r"\-")):
    eggroll_sweep._grid(_args(**kw))


def test_reuse_refuses_another_setup_and_a_file_it_did_not_write(tmp_path):
  setup = {"config": "c", "model": {"d": 60, "depth": 6}, "eggroll": {"pop": 8192}}
  point = {"lr": 0.03, "sigma": 0.125, "updates": 12, "ensemble_val_loss": 4.5}
  good = tmp_path / "good.json"
  good.write_text(json.dumps({**setup, "grid": [point, {**point, "updates": 24}]}))
  assert eggroll_sweep._kept(str(good), 12, setup) == {(0.03, 0.125): point}
  assert eggroll_sweep._kept(str(good), 6, setup) == {}
  with pytest.raises(UserError, match="was run with model .* fix: drop --reuse"):
    eggroll_sweep._kept(str(good), 12, {**setup, "model": {"d": 41, "depth": 6}})
  bad = tmp_path / "bad.json"
  bad.write_text("{}")
  with pytest.raises(UserError, match="is not a JSON this script wrote"):
    eggroll_sweep._kept(str(bad), 12, setup)


def test_a_bad_flag_exits_2_with_one_line(tmp_path):
  r = subprocess.run([sys.executable, "-m", "scripts.eggroll_sweep", f"--out={tmp_path}",
                      "--sigmas", "0"], cwd=ROOT, capture_output=True, text=True,
                     env={**os.environ, "PYTHONPATH": ROOT})
  assert r.returncode == 2, r.stderr
  assert r.stderr.strip().splitlines() == ["error: --sigmas=0 must be positive numbers, e.g. "
                                           "--sigmas 0.01 0.03"]
  assert not os.listdir(tmp_path)  # refused before any data is prepared


def test_reused_points_that_out_also_trained_are_compared(tmp_path):
  args = argparse.Namespace(out=str(tmp_path), steps=12)
  done = tmp_path / "lr0.03_sigma0.125_steps12" / "sweep_point.json"
  done.parent.mkdir()
  done.write_text(json.dumps({"ensemble_val_loss": 4.5}))
  kept = {(0.03, 0.125): {"ensemble_val_loss": 4.5}, (0.01, 0.125): {"ensemble_val_loss": 5.2}}
  assert eggroll_sweep._retrained(args, kept) == [
      {"lr": 0.03, "sigma": 0.125, "recorded": 4.5, "retrained": 4.5, "equal": True}]
  done.write_text(json.dumps({"ensemble_val_loss": 4.25}))
  assert not eggroll_sweep._retrained(args, kept)[0]["equal"]


def test_default_grid_is_the_recorded_one():
  """README's command (the defaults) reproduces docs/results/eggroll_sweep_cpu.json's grid."""
  with open(os.path.join(ROOT, "docs", "results", "eggroll_sweep_cpu.json")) as f:
    record = json.load(f)
  defaults = _args(lrs=eggroll_sweep.LRS, sigmas=eggroll_sweep.SIGMAS, points=eggroll_sweep.POINTS)
  assert eggroll_sweep._grid(defaults) == [(p["lr"], p["sigma"]) for p in record["grid"]]
  assert (record["best"]["lr"], record["best"]["sigma"]) in eggroll_sweep._grid(defaults)
  setup = eggroll_sweep._setup()  # and --reuse of it is accepted by today's config
  assert {k: record[k] for k in setup} == setup


def test_cpu_preset_takes_the_sweeps_best():
  from soma_jax.config import load_config_file

  with open(os.path.join(ROOT, "docs", "results", "eggroll_sweep_cpu.json")) as f:
    best = json.load(f)["best"]
  c = load_config_file(os.path.join(ROOT, "experiments", "configs", "eggroll.py"), "n=1,size=cpu")
  assert (c.opt.lr, c.eggroll.sigma) == (best["lr"], best["sigma"])


def test_train_losses_are_the_logged_losses_by_step(tmp_path):
  """One loss per update in step order, from metrics.jsonl's loss records only (a step
  logged twice keeps its later record)."""
  records = [{"step": 2, "loss": [4.0]}, {"step": 1, "loss": [5.0]}, {"step": 2, "val_loss": [9.0]},
             {"step": 2, "loss": [3.5]}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert eggroll_sweep._train_losses(str(tmp_path)) == [5.0, 3.5]


def test_main_reuses_only_the_kept_points_its_grid_names(tmp_path, monkeypatch, capsys):
  """--reuse: a kept point of this grid is not retrained and is listed as reused; a kept
  point outside the grid is neither listed nor in the grid."""
  setup = eggroll_sweep._setup()
  old = tmp_path / "old.json"
  old.write_text(json.dumps({**setup, "grid": [
      {"lr": 0.01, "sigma": 0.125, "updates": 12, "ensemble_val_loss": 4.0},
      {"lr": 0.5, "sigma": 0.5, "updates": 12, "ensemble_val_loss": 1.0}]}))
  trained = []

  def point(args, data_dir, lr, sigma):
    trained.append((lr, sigma))
    return {"lr": lr, "sigma": sigma, "updates": 12, "ensemble_val_loss": 5.0}

  monkeypatch.setattr(eggroll_sweep, "_point", point)
  monkeypatch.setattr(eggroll_sweep, "_data", lambda args: "")
  out = tmp_path / "sweep.json"
  monkeypatch.setattr(sys, "argv", ["eggroll_sweep", f"--out={tmp_path / 'runs'}",
                                    "--lrs", "0.01", "0.03", "--sigmas", "0.125", "--points",
                                    f"--reuse={old}", f"--json={out}"])
  eggroll_sweep.main()
  record = json.loads(out.read_text())
  assert trained == [(0.03, 0.125)]
  assert record["reused_points"] == [[0.01, 0.125]] and record["reused_points_retrained"] == []
  assert [(p["lr"], p["sigma"]) for p in record["grid"]] == [(0.01, 0.125), (0.03, 0.125)]
  assert record["best"] == {"lr": 0.01, "sigma": 0.125, "ensemble_val_loss": 4.0}
  assert {k: record[k] for k in setup} == setup
