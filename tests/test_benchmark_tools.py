"""benchmarks/ tools: step_sweep times every combination in the same rounds; bad input exits 2."""

import os
import subprocess
import sys

import pytest

from benchmarks import step_timing
from soma_jax import config as config_lib
from soma_jax import spec as spec_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # make test-all; kept out of make test's 15 minutes
def test_sweep_times_each_dividing_combination_and_ranks_them():
  c = config_lib.base_config(n=2, size="tiny")  # n_pert 4
  out = step_timing.sweep(spec_lib.resolve(c), chunks=[1, 3, 4], blocks=[8, 16], reps=2,
                          signs=("together", "apart"))
  combos = {(r["pert_chunk"], r["time_block"], r["signs"]) for r in out["rows"]}
  assert combos == {(k, t, s) for k in (1, 4) for t in (8, 16) for s in ("together", "apart")}
  assert out["skipped"] == ["pert_chunk=3 does not divide n_pert=4"]
  seconds = [r["step_seconds"] for r in out["rows"]]
  assert seconds == sorted(seconds)
  assert out["rows"][0]["relative_to_fastest"] == 1.0
  assert all(r["relative_to_fastest"] >= 1.0 and r["planned_bytes"] > 0 for r in out["rows"])
  by_chunk = {r["pert_chunk"]: r["planned_bytes"] for r in out["rows"]
              if r["time_block"] == 8 and r["signs"] == "together"}
  assert by_chunk[4] > by_chunk[1]  # more directions at once plan more memory
  tokens = 2 * 4 * c.spsa.batch * c.data.seq_len * 2
  r = out["rows"][0]
  assert r["perturbed_tokens_per_second"] == pytest.approx(tokens / r["step_seconds"])


@pytest.mark.parametrize("script,flag,says", [
    ("step_sweep.py", "--pert_chunk=a", "positive integers"),
    ("step_sweep.py", "--time_block=0", "positive integers"),
    ("step_sweep.py", "--reps=0", "must be >= 1"),
    ("step_sweep.py", "--signs=both", "must name together and/or apart"),
    ("plan_memory.py", "--signs=both", "must name together and/or apart"),
    ("plan_memory.py", "--pert_chunk=0", "positive integers"),
    ("spsa_step.py", "--reps=0", "must be >= 1"),
    ("paper_shapes.py", "--reps=0", "must be >= 1"),
    ("paper_shapes.py", "--signs=both", "should be one of <auto|together|apart>"),
    ("paper_shapes.py", "--forward=fused", "--forward=fused must name some of direct, split, "
                                           "split_recurrence"),
    ("paper_shapes.py", "--precision=tf32", "--precision=tf32 must name some of default, high"),
    ("coefficients.py", "--forward=fused", "--forward=fused must name some of direct, split"),
    ("profile_step.py", "--steps=0", "must be >= 1"),
])
def test_bad_values_exit_2_with_one_line(script, flag, says):
  config = [] if script == "paper_shapes.py" else ["--config=experiments/configs/soma.py:n=2,size=tiny"]
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks." + script.removesuffix(".py"), *config, flag],
      cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().count("\n") == 0 and says in proc.stderr, proc.stderr


def test_paper_shapes_help_lists_the_forward_and_precision_settings():
  proc = subprocess.run([sys.executable, "-m", "benchmarks.paper_shapes", "--help"], cwd=ROOT,
                        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stderr
  assert "--forward: spsa.forward settings to time, from direct, split, split_recurrence" in proc.stdout
  assert "--precision: precisions of the step to time, from default, high, highest" in proc.stdout
  assert "--[no]matmul_rate" in proc.stdout


def test_sweep_skips_combinations_that_would_not_fit_the_device(monkeypatch):
  spec = spec_lib.resolve(config_lib.base_config(n=2, size="tiny"))
  full = step_timing.sweep(spec, chunks=[1, 4], blocks=[8], reps=1)
  plan = {r["pert_chunk"]: r["planned_bytes"] for r in full["rows"]}
  limit = (plan[1] + plan[4]) / 2 / step_timing.memory.MARGIN  # chunk 1 fits, 4 does not
  monkeypatch.setattr(step_timing.memory, "device_limit_bytes", lambda: int(limit))
  out = step_timing.sweep(spec, chunks=[1, 4], blocks=[8], reps=1)
  assert [r["pert_chunk"] for r in out["rows"]] == [1]
  assert len(out["skipped"]) == 1 and out["skipped"][0].startswith(
      "pert_chunk=4,time_block=8,signs=together plans")


def test_ideal_forwards_cover_the_steps_tokens_with_plain_losses():
  import jax
  import numpy as np

  from soma_jax import model as M

  c = config_lib.base_config(n=2, size="tiny")  # n_pert 4, A 1, B 2, T 32, own heads
  spec = spec_lib.resolve(c)
  inputs = step_timing.step_inputs(spec)
  cfg = spec.method.step_config(pert_chunk=2)
  s = inputs.state
  plain = step_timing.ideal_forward(cfg)(s.body, s.head, inputs.batch)
  wide = step_timing.ideal_forward(cfg, together=4)(s.body, s.head, inputs.batch)
  assert plain.shape == (2 * 4, 2) and wide.shape == (4 // 2, 2)  # [pieces, N]
  b_t_n = c.spsa.batch * c.data.seq_len * c.n_experts
  assert plain.shape[0] * b_t_n == wide.shape[0] * 4 * b_t_n == inputs.tokens
  # Piece 0 is each expert's plain loss on its own (unshifted) windows.
  want = jax.vmap(M.loss)(s.body, s.head, inputs.batch[:, 0])
  np.testing.assert_allclose(plain[0], want, rtol=1e-5)
  assert not np.allclose(plain[1], want)  # later pieces see shifted bytes, not a hoisted copy


@pytest.mark.slow  # make test-all; kept out of make test's 15 minutes
def test_benchmark_reports_ratios_of_the_times_it_measured():
  spec = spec_lib.resolve(config_lib.base_config(n=2, size="tiny"))
  out = step_timing.benchmark(spec, reps=1, loop=False)
  assert out["reps"] == 1 and out["config"]["pert_chunk"] == 4  # the tiny preset fixes it
  # One device here: the layout training uses is the plain step, timed once.
  assert out["layout"]["what"] == "one device" and out["speedup_vs_one_device"] == 1.0
  assert out["one_device_step_seconds"] == out["step_seconds"]
  assert out["efficiency"] == out["forward_seconds"] / out["step_seconds"]
  assert out["efficiency_vs_batched"] == out["batched_forward_seconds"] / out["step_seconds"]
  assert out["estimate_efficiency"] == out["forward_seconds"] / out["estimate_seconds"]
  step_inputs = step_timing.step_inputs(spec)
  assert out["perturbed_tokens_per_second"] == pytest.approx(step_inputs.tokens / out["step_seconds"])
  assert out["memory_ratio_2x_n_pert"] == out["peak_memory_bytes_2x_n_pert"] / out["peak_memory_bytes"]
  assert out["memory_ratio_2x_n_pert"] < 1.5  # memory ~ chunk, not n_pert (2 if it grew with K)


@pytest.mark.slow  # make test-all; kept out of make test's 15 minutes
def test_plan_memory_plans_each_dividing_chunk_and_signs():
  from soma_jax.errors import UserError

  c = config_lib.base_config(n=2, size="tiny")  # n_pert 4
  out = step_timing.plans(spec_lib.resolve(c), [1, 3, 4], ("together", "apart"))
  assert [(r["pert_chunk"], r["signs"]) for r in out["rows"]] == [
      (1, "together"), (1, "apart"), (4, "together"), (4, "apart")]
  assert out["skipped"] == ["pert_chunk=3 does not divide n_pert=4"]
  plan = {(r["pert_chunk"], r["signs"]): r["planned_bytes"] for r in out["rows"]}
  assert plan[4, "together"] > plan[1, "together"] and plan[4, "apart"] < plan[4, "together"]
  assert c.spsa.pert_chunk == 4 and c.spsa.signs == "auto"  # the caller's config unchanged
  with pytest.raises(UserError, match="nothing to plan"):
    step_timing.plans(spec_lib.resolve(c), [3], ("apart",))
  c.spsa.pert_chunk = "auto"  # every preset's default (the paper one's too): still planned
  plans = step_timing.plans(spec_lib.resolve(c), [1, 4], ("apart",))
  assert [r["pert_chunk"] for r in plans["rows"]] == [1, 4]
  with c.unlocked():
    c.method = "bptt"
  with pytest.raises(UserError, match="only the SOMA step"):
    step_timing.plans(spec_lib.resolve(c), [1], ("apart",))


def test_estimate_only_is_the_steps_estimate():
  """The benchmark's estimate returns g_hat (not just the loss, which let XLA drop the sum
  over directions as dead code) and it is spsa.estimate's."""
  import jax
  import numpy as np

  from soma_jax import spsa

  c = config_lib.base_config(n=2, size="tiny")
  spec = spec_lib.resolve(c)
  inputs = step_timing.step_inputs(spec)
  cfg = spec.method.step_config()
  s = inputs.state
  g, loss = step_timing.estimate_only(cfg)(s, inputs.batch, inputs.ids)
  want = spsa.estimate(s.body, s.head, inputs.batch, s.sched.eps, s.step, inputs.ids,
                       jax.random.key(cfg.seed), cfg.spsa, shared_head=cfg.model.shared_head)
  for x, y in zip(jax.tree.leaves((g, loss)), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def _bench_child(script: str, *args: str, python: tuple[str, ...] = ()) -> dict:
  """A benchmark as a user runs it (it picks its own CPU devices), its JSON output."""
  from tests.conftest import default_env

  cmd = [sys.executable, *python] if python else [sys.executable, "-m", f"benchmarks.{script}"]
  proc = subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True,
                        env=default_env(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc.stdout


@pytest.mark.slow  # make test-all; kept out of make test's 15 minutes
def test_spsa_step_times_the_training_layout_beside_one_device():
  import json

  out = json.loads(_bench_child("spsa_step", "--config=experiments/configs/soma.py:n=2,size=tiny",
                                "--cpu_devices=2", "--reps=1", "--noloop"))
  assert out["devices"] == 2 and out["layout"]["mesh_expert"] == 2, out["layout"]
  assert "FSO" in out["layout"]["what"]
  assert out["speedup_vs_one_device"] == out["one_device_step_seconds"] / out["step_seconds"]
  assert out["efficiency"] == out["forward_seconds"] / out["one_device_step_seconds"]
  assert len(out["loss_layout"]) == 2 and out["loss_max_relative_difference"] < 1e-5
  # ... and the step once more in a one-device child process.
  assert out["speedup_vs_one_device_process"] == (out["one_device_process_step_seconds"]
                                                  / out["step_seconds"])


def test_torch_mezo_says_so_without_pytorch():
  # A finder that refuses torch, rather than sys.modules['torch'] = None: scipy treats a
  # 'torch' key in sys.modules as an imported torch and fails on the None.
  hide = ("import runpy, sys\n"
          "class NoTorch:\n"
          "  def find_spec(self, name, path=None, target=None):\n"
          "    if name.split('.')[0] == 'torch': raise ImportError('hidden: ' + name)\n"
          "sys.meta_path.insert(0, NoTorch()); sys.argv = ['torch_mezo.py']\n"
          "import importlib.util as u; f = u.find_spec\n"
          "u.find_spec = lambda n, p=None: None if n.split('.')[0] == 'torch' else f(n, p)\n"
          "runpy.run_module('benchmarks.torch_mezo', run_name='__main__')")
  said = _bench_child("", python=("-c", hide))
  assert said.strip() == "torch_mezo: PyTorch is not installed, nothing measured; fix: " \
      "pip install -e '.[bench]' (or pip install torch)"


def test_torch_mezo_measures_both_sides():
  import json

  pytest.importorskip("torch")
  out = json.loads(_bench_child("torch_mezo", "--n=2", "--d_t=8", "--n_pert=2", "--batch=2",
                                "--seq_len=16", "--reps=1", "--cpu_devices=2"))
  assert out["perturbed_tokens_per_update"] == 2 * 2 * 2 * 16 * 2
  assert out["jax_layout"]["mesh_expert"] == 2
  assert out["speedup_vs_torch"] == out["torch_step_seconds"] / out["jax_step_seconds"]
  # Same shape on both sides, bar the JAX head's place outside the body's count.
  assert out["torch_params_per_expert"] == out["jax_params_per_expert"] + 256 * 32
  assert all(4.5 < x < 7.0 for x in out["torch_mean_loss"])  # near ln 256 at init


def test_study_steps_side_by_side_times_each_checkout_in_its_own_processes():
  import json

  # one device per child (each side's own XLA_FLAGS): one compiled step per child, not also
  # the multi-device layout's (timed in the slow test_spsa_step_times_the_training_layout_...)
  one = "--xla_force_host_platform_device_count=1"
  out = json.loads(_bench_child(
      "study_steps", "--size=tiny", "--rows=one_expert", "--reps=1", "--rounds=1",
      "--nofigures", f"--against={ROOT}", "--against_set=spsa.unroll=2", f"--xla_flags={one}",
      f"--against_xla_flags={one}"))
  assert out["side_by_side"]["this_xla_flags"] == out["side_by_side"]["against_xla_flags"] == one
  row = out["side_by_side"]["rows"]["one_expert"]
  # each side's own config: the other side's field changed, this side's as the preset has it
  assert row["this_config"]["unroll"] == 1 and row["against_config"]["unroll"] == 2
  this, other = row["this_step_seconds"]["values"], row["against_step_seconds"]["values"]
  assert len(this) == len(other) == 1
  assert row["ratio_this_over_against"]["values"] == [a / b for a, b in zip(this, other)]
  loads = out["side_by_side"]["child_load_average_1m"]
  assert len(loads["this"]) == len(loads["against"]) == 1
  assert len(out["load_average"]["start"]) == 3 and "rows" not in out  # --nofigures


def test_study_steps_set_takes_the_fields_type():
  from benchmarks import study_steps

  assert study_steps.parse_sets(["spsa.unroll=4", "spsa.signs=together"]) == [
      ("spsa.unroll", "4"), ("spsa.signs", "together")]
  assert study_steps._typed(1, "4") == 4 and study_steps._typed(True, "false") is False
  assert study_steps._typed("auto", "2") == 2 and study_steps._typed(0.5, "1") == 1.0
  with pytest.raises(Exception, match="KEY=VALUE"):
    study_steps.parse_sets(["unroll"])


def test_study_steps_pairs_time_both_sides_in_lock_step():
  import json

  one = "--xla_force_host_platform_device_count=1"  # the side-by-side test's steps, cached
  out = json.loads(_bench_child(
      "study_steps", "--size=tiny", "--rows=one_expert", "--pairs=3", "--nofigures",
      f"--against={ROOT}", "--set=spsa.unroll=2", f"--xla_flags={one}",
      f"--against_xla_flags={one}"))
  row = out["paired"]["rows"]["one_expert"]
  assert row["this"]["config"]["unroll"] == 2 and row["against"]["config"]["unroll"] == 1
  for clock in ("", "cpu_"):  # wall seconds, and the processes' CPU seconds
    lo, hi = row[f"{clock}ratio_min_max"]
    assert 0 < lo <= row[f"{clock}ratio_median"] <= hi
    assert row[f"{clock}this_step_seconds_median"] > 0
  assert out["paired"]["pairs"] == 3 and len(out["paired"]["load_average_1m"]["values"]) == 3
