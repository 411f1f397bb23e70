"""The training driver: exact resume after kill -9, expert-slice jobs merged, bad input."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from soma_jax import budget as budget_lib
from soma_jax import checkpoint as ckpt_lib
from soma_jax import host_devices, merge, runs, train
from soma_jax.config import load_config_file
from soma_jax.errors import Interrupted, UserError
from tests.conftest import default_env, equal_to_rounding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What differs from run to run of one config: timings, and whether the step compiled here
# (JAX's persistent cache may hold it).
TIMING = ("step_seconds", "tokens_per_second", "step_compiles") + budget_lib.TIMERS


def tiny_config(data_dir, **overrides):
  c = load_config_file(os.path.join(ROOT, "experiments", "configs", "soma.py"), "n=3,size=tiny")
  c.data.dir = data_dir
  c.update(steps=8, log_every=1, eval_every=2, ckpt_every=2)
  for k, v in overrides.items():
    c[k] = v
  return c


def metrics_without_timing(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f]


def assert_same_params(w1, w2, same_program: bool = True):
  """Bit-identical parameters; runs of two different programs (e.g. expert slices and the
  whole job) are equal to float32 rounding."""
  b1, h1, _ = runs.restore_params(w1)
  b2, h2, _ = runs.restore_params(w2)
  if not same_program:
    equal_to_rounding((b1, h1), (b2, h2))
    return
  for x, y in zip(jax.tree.leaves((b1, h1)), jax.tree.leaves((b2, h2)), strict=True):
    np.testing.assert_array_equal(x, y)


def assert_resumes_like(straight, w, data_dir, method="soma"):
  """Training w on to step 8 ends done, with straight's parameters and metrics exactly."""
  summary = train.run(tiny_config(data_dir, method=method), w)
  assert summary["status"] == "done" and summary["step"] == 8
  assert_same_params(straight, w)
  assert metrics_without_timing(straight) == metrics_without_timing(w)


KILLER = textwrap.dedent("""
    import os, signal
    from soma_jax import host_devices, train
    from soma_jax.config import load_config_file
    from soma_jax.data import pipeline

    if {default_layout!r}:  # as an entry point starts: one CPU device per usable core
      host_devices.start()
    real_next = pipeline.TrainBatches.__next__
    def next_or_die(self):
      if self.step == {kill_at}:  # power loss while fetching the batch of this update
        os.kill(os.getpid(), signal.SIGKILL)
      return real_next(self)
    if {kill_at} >= 0:
      pipeline.TrainBatches.__next__ = next_or_die
    c = load_config_file({configs!r} + "/soma.py", "n=3,size=tiny")
    c.data.dir = {data!r}
    c.method = {method!r}
    c.update(steps=8, log_every=1, eval_every=2, ckpt_every=2)
    train.run(c, {workdir!r})
""")


def _child_train(workdir: str, data: str, kill_at: int = -1, default_layout: bool = False,
                 method: str = "soma"):
  script = KILLER.format(configs=os.path.join(ROOT, "experiments", "configs"), kill_at=kill_at,
                         data=data, workdir=workdir, default_layout=default_layout,
                         method=method)
  env = default_env(JAX_PLATFORMS="cpu") if default_layout else None
  return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                        cwd=ROOT)


@pytest.mark.parametrize("method", ["soma", "soma15"])
def test_resume_after_kill9_is_bit_identical(data_prepared, tmp_path, method):
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  train.run(tiny_config(data_prepared, method=method), straight)
  proc = _child_train(resumed, data_prepared, kill_at=5, method=method)
  assert proc.returncode == -9, proc.stderr[-2000:]
  assert max(r["step"] for r in metrics_without_timing(resumed)) < 8
  assert_resumes_like(straight, resumed, data_prepared, method)


def test_resume_after_kill9_in_the_default_layout_is_bit_identical(data_prepared, tmp_path):
  """As `experiments/train.py` runs without flags: one host device per usable core, the
  default mesh (on 2 cores, N = 3 experts: the directions over 2 devices, DDPP). The
  uninterrupted run, the killed run and its resume all run in that layout."""
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  proc = _child_train(straight, data_prepared, default_layout=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  cores = host_devices.usable_cores()
  devices = f"{cores} cpu device{'s' if cores > 1 else ''} (one per usable core)"
  assert devices in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]
  proc = _child_train(resumed, data_prepared, kill_at=5, default_layout=True)
  assert proc.returncode == -9, proc.stderr[-2000:]
  assert max(r["step"] for r in metrics_without_timing(resumed)) < 8
  proc = _child_train(resumed, data_prepared, default_layout=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert_same_params(straight, resumed)
  assert metrics_without_timing(straight) == metrics_without_timing(resumed)


@pytest.mark.parametrize("cpu_devices,what", [(2, "DDPP"), (3, "FSO")])
def test_three_updates_equal_to_rounding_across_layouts(data_prepared, tmp_path, cpu_devices,
                                                        what):
  """3 tiny updates of N = 3 experts on one device and through experiments/train.py on 2
  host devices (the directions split, DDPP) or 3 (experts split, FSO): equal losses and
  weights to float32 rounding (XLA compiles each layout's program on its own)."""
  one, laid = str(tmp_path / "one"), str(tmp_path / "laid")
  c = tiny_config(data_prepared, steps=3)
  train.run(c, one)
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
         "--config=" + os.path.join(ROOT, "experiments", "configs", "soma.py") + ":n=3,size=tiny",
         f"--config.data.dir={data_prepared}", f"--workdir={laid}", "--config.steps=3",
         "--config.log_every=1", "--config.eval_every=2", "--config.ckpt_every=2",
         f"--cpu_devices={cpu_devices}"]
  proc = subprocess.run(cmd, env=default_env(JAX_PLATFORMS="cpu"), capture_output=True,
                        text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  said = proc.stdout + proc.stderr
  assert f"{cpu_devices} cpu devices (--cpu_devices" in said and what in said, said[-2000:]
  losses = lambda w: np.array([r["loss"] for r in metrics_without_timing(w) if "loss" in r])
  np.testing.assert_allclose(losses(laid), losses(one), rtol=1e-5)
  assert_same_params(one, laid, same_program=False)


def test_expert_slices_merged_equal_one_job(data_prepared, tmp_path):
  full = str(tmp_path / "full")
  train.run(tiny_config(data_prepared, steps=4), full)
  parts = []
  for rng in ("0:1", "1:3"):
    w = str(tmp_path / rng.replace(":", "-"))
    c = tiny_config(data_prepared, steps=4, experts=rng)
    c.log_every = 1 if rng == "1:3" else c.log_every  # free to differ, as on resume
    train.run(c, w)
    parts.append(w)
  merged = str(tmp_path / "merged")
  merge.merge(parts, merged)
  assert_same_params(full, merged, same_program=False)
  with pytest.raises(UserError, match="cover experts"):
    merge.merge(parts[:1], str(tmp_path / "bad"))
  other = str(tmp_path / "other-lr")
  c = tiny_config(data_prepared, steps=4, experts="1:3")
  c.opt.lr = 2 * c.opt.lr  # another experiment: refused
  train.run(c, other)
  with pytest.raises(UserError, match=r"different config \(opt\.lr\)"):
    merge.merge([parts[0], other], str(tmp_path / "bad-lr"))
  again = str(tmp_path / "re-prepared")  # job 1:3 as if trained after the data dir changed
  shutil.copytree(parts[1], again)
  history = os.path.join(again, ckpt_lib.HISTORY_FILE)
  records = [json.loads(line) for line in open(history)]
  assert records[-1]["data_manifest_sha256"] is not None
  records[-1]["data_manifest_sha256"] = "0" * 64
  with open(history, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  with pytest.raises(UserError, match="trained on other data than"):
    merge.merge([parts[0], again], str(tmp_path / "bad-data"))


@pytest.mark.slow  # make test-all; kept out of make test's 15 minutes
def test_gru_eggroll_slices_merge_with_their_carried_states(data_prepared, tmp_path):
  """merge concatenates each job's carried member states (TrainState.carry) with its experts:
  the merged run is the whole job's, states and stream position included."""
  from tests.test_compare import load_config

  def config(**over):
    c = load_config("eggroll", "n=3,size=tiny")
    c.data.dir = data_prepared
    c.update(steps=2, **over)
    return c

  full, merged = str(tmp_path / "full"), str(tmp_path / "merged")
  train.run(config(), full)
  parts = [str(tmp_path / rng.replace(":", "-")) for rng in ("0:1", "1:3")]
  for rng, w in zip(("0:1", "1:3"), parts, strict=True):
    train.run(config(experts=rng), w)
  merge.merge(parts, merged)
  _, a, data_a, _ = runs.restore_state(full)
  _, b, data_b, _ = runs.restore_state(merged)
  assert a.carry.shape == b.carry.shape and a.carry.shape[0] == 3
  assert float(np.max(np.abs(np.asarray(a.carry)))) > 0, "the members' states must be carried"
  equal_to_rounding((a.body, a.carry), (b.body, b.carry))
  position = 2 * config().eggroll.segment  # the streams' byte position after 2 updates
  assert data_b["iterator"]["position"] == data_a["iterator"]["position"] == position


def test_incompatible_workdir_and_data_refused(data_prepared, tmp_path):
  w = str(tmp_path / "run")
  train.run(tiny_config(data_prepared, steps=2), w)
  c = tiny_config(data_prepared, steps=2)
  c.model.d_t = 16
  with pytest.raises(UserError, match="holds another run"):
    train.run(c, w)
  c = tiny_config(data_prepared, steps=2, n_experts=2)
  with pytest.raises(UserError, match="expert shards"):
    train.run(c, str(tmp_path / "other"))


@pytest.mark.parametrize("flag,message", [
    ("--config.no_such_field=1", "unknown config field"),
    ("--config.experts=3:9", "out of range"),
    ("--config.data.dir=/does/not/exist", "does not exist"),
    ("--config.data.seq_len=100", "a divisor of 1024"),
])
def test_cli_bad_input_exits_2(data_prepared, tmp_path, flag, message):
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
         "--config=" + os.path.join(ROOT, "experiments", "configs", "soma.py") + ":n=3,size=tiny",
         f"--config.data.dir={data_prepared}", f"--workdir={tmp_path / 'w'}", flag]
  proc = subprocess.run(cmd, capture_output=True, text=True)
  assert proc.returncode == 2
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error:") and message in last
  assert "Traceback" not in proc.stderr


def test_nonwritable_workdir(data_prepared, tmp_path):
  ro = tmp_path / "ro"
  ro.mkdir()
  (ro / "file").write_text("x")
  with pytest.raises(UserError, match="is a file, not a folder"):
    train.run(tiny_config(data_prepared), str(ro / "file" / "sub"))


def test_resume_on_a_different_device_count(data_prepared, tmp_path):
  """Train on 3 (fake) devices, resume on one: the checkpoint restores onto the new layout.

  Float32 results across device layouts agree to rounding (XLA's CPU matmuls split work by
  thread count), so the comparison is allclose; within one layout resume is bit-identical.
  """
  sharded, straight = str(tmp_path / "sharded"), str(tmp_path / "straight")
  train.run(tiny_config(data_prepared, steps=6), straight)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=3",
             JAX_PLATFORMS="cpu")
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
         "--config=" + os.path.join(ROOT, "experiments", "configs", "soma.py") + ":n=3,size=tiny",
         f"--config.data.dir={data_prepared}", f"--workdir={sharded}", "--config.steps=6",
         "--config.log_every=1", "--config.eval_every=2", "--config.ckpt_every=2",
         "--config.mesh.expert=3"]
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  # Device-seconds (SPEC 7): updates x mean step seconds x the 3 devices the step held; the
  # mean is over updates 2..6 (update 1 compiles; each record here times one update).
  with open(os.path.join(sharded, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  mean = np.mean([r["step_seconds"] for r in records[1:]])
  # On a CPU they are core-seconds: the cores the process may use, not the 3 host devices
  # (one partition of those cores), so one-device and sharded runs are charged alike.
  cores = host_devices.usable_cores()
  assert records[-1]["device_seconds"] == pytest.approx(cores * 6 * mean, rel=1e-6)
  with open(os.path.join(straight, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  mean = np.mean([r["step_seconds"] for r in records[1:]])
  assert records[-1]["device_seconds"] == pytest.approx(cores * 6 * mean, rel=1e-6)
  # Drop the last checkpoint, then resume from step 4 on a single device.
  shutil.rmtree(os.path.join(sharded, "checkpoints", "6"))
  summary = train.run(tiny_config(data_prepared, steps=6), sharded)
  assert summary["status"] == "done"
  b1, h1, _ = runs.restore_params(sharded)
  b2, h2, _ = runs.restore_params(straight)
  for x, y in zip(jax.tree.leaves((b1, h1)), jax.tree.leaves((b2, h2)), strict=True):
    np.testing.assert_allclose(x, y, atol=1e-4)


def test_train_to_end_refuses_a_run_stopped_early(monkeypatch):
  """compare / independent_vs_summed go on with a run only if it reached c.steps."""
  monkeypatch.setattr(train.plan_lib, "place", lambda spec: spec)
  monkeypatch.setattr(train, "train",
                      lambda plan, w, called=None: {"status": "interrupted", "step": 3})
  # a signal stops the whole study (Interrupted, no Exception: no executor goes on past it)
  with pytest.raises(Interrupted, match="the seed run stopped early \\(interrupted by SIGINT, "
                     "saved at step 3\\); rerun"):
    train.train_to_end(None, "w", "the seed run")
  monkeypatch.setattr(train, "train", lambda plan, w, called=None: {"status": "done",
                                                                    "step": 8})
  assert train.train_to_end(None, "w", "the seed run")["step"] == 8


@pytest.mark.parametrize("config", ["bptt.py:n=3,size=tiny", "eggroll.py:n=3,size=tiny"])
def test_methods_that_cannot_shard_run_on_one_device_by_default(data_prepared, tmp_path,
                                                               config):
  """BPTT and EGGROLL steps have no mesh: on several CPU devices the default layout trains
  them on one and the start-up line says so."""
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
         f"--config={os.path.join(ROOT, 'experiments', 'configs', config)}",
         f"--config.data.dir={data_prepared}", f"--workdir={tmp_path / 'w'}", "--config.steps=2",
         "--cpu_devices=2"]
  proc = subprocess.run(cmd, env=default_env(JAX_PLATFORMS="cpu"), capture_output=True,
                        text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  method = config.split(".")[0]
  assert f"one device: method={method} does not shard its step (1 of 2 devices idle)" in \
      proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]
  with open(os.path.join(tmp_path, "w", "summary.json")) as f:
    assert json.load(f)["step"] == 2


def test_a_summed_run_compiles_its_step_once(data_prepared, tmp_path, caplog):
  """method=soma_summed planned its chunk on SOMA's step (no loss_groups), a program it never
  runs: the summed step was compiled again at the first update, inside the run."""
  c = tiny_config(data_prepared, method="soma_summed", steps=2, seed=5151)  # a new program
  with jax.log_compiles(True), caplog.at_level("WARNING"):
    train.run(c, str(tmp_path / "w"))
  compiles = [r for r in caplog.records if "Compiling jit(train_step)" in r.getMessage()]
  assert len(compiles) == 1, [r.getMessage()[:200] for r in compiles]
