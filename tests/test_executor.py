"""studies/executor.py: the same two tiny runs trained inline, by worker processes and by
submitit's LocalExecutor end bit-identical; a failed run is named after the other finished;
a worker takes the parent's CPU device count; bad specs and settings are refused."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
import submitit

from soma_jax import runs
from soma_jax.errors import UserError
from soma_jax.studies import executor, slurm
from soma_jax.studies import jobs as jobs_lib
from tests.test_train import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXECUTORS = ("inline", "processes:2", "submitit:local")


def two_jobs(data_dir: str, folder: str) -> list[jobs_lib.Job]:
  """Two runs that differ (their seeds), 2 updates each."""
  return [jobs_lib.Job(tiny_config(data_dir, steps=2, seed=seed).to_dict(),
                       os.path.join(folder, f"seed{seed}"), f"seed {seed}")
          for seed in (0, 1)]


def params(workdir: str) -> list[np.ndarray]:
  body, head, _ = runs.restore_params(workdir)
  return [np.asarray(x) for x in jax.tree.leaves((body, head))]


@pytest.fixture(scope="module")
def trained(data_prepared, tmp_path_factory):
  """{executor: (its two jobs, seconds per job, its wall seconds)}."""
  out = {}
  for name in EXECUTORS:
    jobs = two_jobs(data_prepared, str(tmp_path_factory.mktemp(name.replace(":", "_"))))
    t0 = time.perf_counter()
    seconds = executor.make(name).run(jobs)
    out[name] = (jobs, seconds, time.perf_counter() - t0)
  print("\ntwo-job wall seconds: " + ", ".join(f"{n} {w:.1f}" for n, (_, _, w) in out.items()))
  return out


@pytest.mark.parametrize("name", EXECUTORS[1:])
def test_same_params_whichever_executor(trained, name):
  jobs, seconds, _ = trained[name]
  assert len(seconds) == 2 and all(np.isfinite(s) and s > 0 for s in seconds), seconds
  workdirs = [j.workdir for j in jobs]
  for mine, inline in zip(workdirs, [j.workdir for j in trained["inline"][0]], strict=True):
    for x, y in zip(params(mine), params(inline), strict=True):
      np.testing.assert_array_equal(x, y, err_msg=f"{mine} (by {name}) != {inline} (inline)")
  # in order: each workdir holds its own seed's run, and the two seeds differ
  a, b = params(workdirs[0]), params(workdirs[1])
  assert any(not np.array_equal(x, y) for x, y in zip(a, b)), "the two seeds trained the same"


def test_where_the_output_goes(trained):
  for workdir in [j.workdir for j in trained["processes:2"][0]]:
    with open(os.path.join(workdir, executor.LOG_FILE)) as f:
      log = f.read()
    assert log.startswith(f"== seed {workdir[-1]}: processes:2 worker") and "step 2/2" in log, log
  for workdir in [j.workdir for j in trained["submitit:local"][0]]:
    names = os.listdir(os.path.join(workdir, slurm.SUBMITIT_DIR))
    assert any(n.endswith("_log.err") for n in names), names


def test_a_rerun_keeps_finished_runs(trained):
  jobs = trained["processes:2"][0]
  before = [params(j.workdir) for j in jobs]
  executor.make("inline").run(jobs)
  for job, old in zip(jobs, before, strict=True):
    for x, y in zip(params(job.workdir), old, strict=True):
      np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", EXECUTORS)
def test_a_failed_run_is_named_after_the_other_finished(data_prepared, tmp_path, name):
  good, bad = two_jobs(data_prepared, str(tmp_path))
  bad.config["data"]["dir"] = str(tmp_path / "no_such_data")
  bad = jobs_lib.Job(bad.config, bad.workdir, "the broken run")
  with pytest.raises(UserError) as e:
    executor.make(name).run([bad, good])
  text = str(e.value)
  assert text.startswith(f"1 of 2 runs failed under --executor={name}") and \
      "the broken run: " in text and "no_such_data" in text and "seed 1" not in text, text
  if name != "inline":
    assert bad.workdir in text, text  # its log, in its folder
  params(good.workdir)  # the other run finished


PARENT = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", 2)  # as an entry point's host_devices.start
    from soma_jax.studies import executor
    from soma_jax.studies import jobs as jobs_lib
    from tests.test_train import tiny_config
    data, workdir = sys.argv[1:]
    executor.make("processes:1").run(
        [jobs_lib.Job(tiny_config(data, steps=1).to_dict(), workdir, "two devices")])
""")


def test_a_worker_takes_the_parents_cpu_devices(data_prepared, tmp_path):
  """A parent on 2 CPU devices, its worker started under XLA_FLAGS' one device (as every
  child of pytest is): the worker trains on the parent's 2, with the parent's cache."""
  workdir = str(tmp_path / "run")
  subprocess.run([sys.executable, "-c", PARENT, data_prepared, workdir], cwd=ROOT, check=True,
                 env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True)
  with open(os.path.join(workdir, executor.LOG_FILE)) as f:
    log = f.read()
  assert " on 2 cpu devices (--cpu_devices" in log, log
  host = jobs_lib.parent_host()
  assert host.cpu_devices == len(jax.devices("cpu")) and host.cores == ()
  assert host.cache[0] == jax.config.jax_compilation_cache_dir


def children(pid: int) -> list[int]:
  with open(f"/proc/{pid}/task/{pid}/children") as f:
    return [int(c) for c in f.read().split()]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc")
def test_a_preempted_job_requeues_and_resumes_bit_identical(data_prepared, tmp_path):
  """submitit's preemption signal (USR2, as SLURM sends it to the job's task) mid-run: the
  run checkpoints, the job requeues itself, the next attempt resumes from the run's folder
  and ends with the parameters of an uninterrupted run."""
  config = tiny_config(data_prepared, steps=300, eval_every=1000, ckpt_every=1000)
  job = jobs_lib.Job(config.to_dict(), str(tmp_path / "preempted"), "preempted")
  ex = executor.make("submitit:local")
  (submitted,) = ex.submit([job])
  metrics, deadline = os.path.join(job.workdir, "metrics.jsonl"), time.time() + 120
  while not (os.path.exists(metrics) and os.path.getsize(metrics)):  # updates under way
    assert time.time() < deadline and not submitted.done(), "the job never started updating"
    time.sleep(0.05)
  (task,) = children(int(submitted.job_id))  # the controller's one task
  os.kill(task, signal.SIGUSR2)
  ex.wait([job], [submitted])
  with open(os.path.join(job.workdir, "config_history.jsonl")) as f:
    starts = [json.loads(line)["step"] for line in f]
  assert len(starts) == 2 and 0 < starts[1] < 300, starts  # resumed from its stop
  with open(submitted.paths.stderr) as f:
    assert "Requeued job" in f.read()
  straight = jobs_lib.Job(config.to_dict(), str(tmp_path / "straight"), "straight")
  executor.make("inline").run([straight])
  for x, y in zip(params(job.workdir), params(straight.workdir), strict=True):
    np.testing.assert_array_equal(x, y)


def test_shares():
  share = executor.shares
  assert [s.cores for s in share(2, "cpu", 4, [0, 1, 2, 3])] == [(0, 1), (2, 3)]
  assert [s.cores for s in share(3, "cpu", 1, [0, 1])] == [(), (), ()]  # fewer cores: no pins
  assert [s.gpus for s in share(2, "gpu", 4, [])] == [("0", "1"), ("2", "3")]
  assert [s.gpus for s in share(3, "gpu", 2, [])] == [("0",), ("1",), ("0",)]
  with pytest.raises(UserError, match="processes:2 on tpu"):
    share(2, "tpu", 4, [])


@pytest.mark.parametrize("spec,slurm,match", [
    ("thread:2", None, r"'thread:2' is not an executor; use one of inline, processes:K"),
    ("processes:0", None, "K must be >= 1"),
    ("processes:two", None, "is not an executor"),
    ("", None, "is not an executor"),
    ("processes:2", {"partition": "gpu"}, "--slurm_partition apply to --executor=submitit:slurm or submitit:local, not 'processes:2'"),
    ("submitit:local", {"time": 0}, "--slurm_time=0: it must be minutes"),
    ("submitit:local", {"gpus_per_node": 1.5}, "--slurm_gpus=1.5"),
    ("submitit:local", {"mem_gb": -1}, "--slurm_mem_gb=-1"),
    ("submitit:local", {"partition": " "}, "--slurm_partition"),
    ("submitit:local", {"nodes": 2}, "slurm setting 'nodes' is unknown"),
])
def test_bad_specs_are_refused(spec, slurm, match):
  with pytest.raises(UserError, match=match):
    executor.make(spec, slurm)


def test_choices():
  assert executor.make("inline").name == "inline"
  assert executor.make(" processes:3 ").name == "processes:3"
  assert executor.make("submitit:local", {"time": 30, "partition": None}).settings == {"time": 30}


def fake_slurm(folder) -> str:
  """A `sbatch` that records its script and answers as SLURM does (no job runs), and the
  `srun` submitit looks for."""
  for name, text in (("sbatch", f"cp \"$1\" {folder}/submitted.sh\n"
                                "echo 'Submitted batch job 4242'"), ("srun", "exit 1")):
    path = folder / name
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return str(folder)


def test_slurm_without_sbatch_is_refused(monkeypatch, tmp_path):
  monkeypatch.setenv("PATH", str(tmp_path))
  with pytest.raises(UserError, match="submitit:slurm needs SLURM's sbatch and srun"):
    executor.make("submitit:slurm")


def test_slurm_settings_reach_sbatch(monkeypatch, tmp_path, data_prepared):
  """The --slurm_* settings as #SBATCH lines, one job per run in its own folder, requeued on
  submitit's signal (USR2 before the time limit)."""
  monkeypatch.setenv("PATH", fake_slurm(tmp_path) + os.pathsep + os.environ["PATH"])
  ex = executor.make("submitit:slurm", {"partition": "gpu", "time": 60, "gpus_per_node": 1,
                                        "cpus_per_task": 8, "mem_gb": 64, "account": "lab"})
  job = two_jobs(data_prepared, str(tmp_path / "runs"))[0]
  (submitted,) = ex.submit([job])
  assert submitted.job_id == "4242"
  with open(tmp_path / "submitted.sh") as f:
    script = f.read()
  for line in ("--partition=gpu", "--time=60", "--gpus-per-node=1", "--cpus-per-task=8",
               "--mem=64GB", "--account=lab", "--signal=USR2@90", "--job-name=seed_0",
               f"--output={job.workdir}/submitit/%j_0_log.out"):
    assert f"#SBATCH {line}\n" in script, (line, script)
  delayed = submitit.helpers.DelayedSubmission.load(submitted.paths.submitted_pickle)
  assert delayed._timeout_countdown == slurm.MAX_REQUEUES  # a long run over many jobs
  assert delayed.args == (job,) and hasattr(delayed.function, "checkpoint")
