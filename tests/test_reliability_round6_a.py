"""Issue 55, first half (items 1, 2, 5, 6, 10, 14, 16 and the notes on signals and orphans):
a study stops on Ctrl-C / SIGTERM after saving; a huge n_pert is refused and a long first
update can be stopped; a full disk stops a study with one line; a failed SLURM submission is
one line; every output path is checked before the work; an unwritable compilation cache and a
NaN temperature are refused."""

import ast
import errno
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from soma_jax import cli, errors
from soma_jax.errors import UserError
from tests.test_compare import ROOT
from tests.test_robustness import one_error_line

PY = [sys.executable]


def run_cli(args, **kw):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.run(PY + args, capture_output=True, text=True, cwd=ROOT, timeout=300,
                        env=env, **kw)


# ------------------------------------------------------------ item 10: outputs checked first

OUTPUT_NAMES = ("out", "json", "md", "out_dir", "trace_dir", "timings", "docs", "write")


def _entry_points() -> list[str]:
  return sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")) +
                glob.glob(os.path.join(ROOT, "benchmarks", "*.py")) +
                glob.glob(os.path.join(ROOT, "scripts", "*.py")))


def test_every_output_flag_of_every_entry_point_is_checked_before_the_work():
  """The class: an output flag (absl) is defined with cli.output_flag, which `cli.run` checks
  once the flags are parsed; an argparse script checks its outputs right after parsing."""
  unchecked = []
  for path in _entry_points():
    tree = ast.parse(open(path).read())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    checked_args = set()
    for call in calls:
      name = ast.unparse(call.func)
      if name.endswith("check_output_args"):
        checked_args |= {k.arg for k in call.keywords}
    for call in calls:
      name = ast.unparse(call.func)
      first = call.args[0] if call.args else None
      if not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        continue
      flag = first.value.lstrip("-")
      if name == "flags.DEFINE_string" and flag in OUTPUT_NAMES:
        unchecked.append(f"{os.path.relpath(path, ROOT)}: --{flag} (flags.DEFINE_string)")
      switch = any(k.arg == "action" and isinstance(k.value, ast.Constant)
                   and k.value.value in ("store_true", "store_false") for k in call.keywords)
      if (name.endswith("add_argument") and flag in OUTPUT_NAMES and flag not in checked_args
          and not switch):  # a switch (--write: rewrite these files) is no path
        unchecked.append(f"{os.path.relpath(path, ROOT)}: --{flag} (argparse, unchecked)")
  assert not unchecked, unchecked


def test_variance_out_that_is_a_file_is_refused_before_measuring(tmp_path):
  """It measured for minutes, then failed writing with a traceback (the result lost)."""
  a_file = tmp_path / "a_file"
  a_file.write_text("keep me")
  t0 = time.time()
  proc = run_cli([os.path.join("experiments", "variance.py"),
                  "--config=experiments/configs/variance.py:shared_vs_separate",
                  f"--out={a_file}"])
  one_error_line(proc, "--out=", "is a file")
  assert time.time() - t0 < 60
  assert a_file.read_text() == "keep me"


def test_benchmark_json_that_is_a_folder_is_refused_before_benchmarking(tmp_path):
  proc = run_cli(["-m", "benchmarks.spsa_step", "--config=experiments/configs/soma.py:n=2,size=tiny",
                  f"--json={tmp_path}"])
  one_error_line(proc, "--json=", "is a folder")
  assert "SPSA" not in proc.stdout and not proc.stdout.strip(), proc.stdout[-500:]


def test_script_json_that_is_a_folder_is_refused_before_the_work(tmp_path):
  proc = run_cli(["-m", "scripts.study_settings", f"--json={tmp_path}"])
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert "is a folder" in proc.stderr.strip().splitlines()[-1]
  assert not proc.stdout.strip()


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_check_output_refuses_what_cannot_be_written_and_makes_nothing(tmp_path, kind,
                                                                       monkeypatch):
  blocker = tmp_path / "blocker"
  blocker.write_text("x")
  with pytest.raises(UserError, match="is a file, not a folder"):
    errors.check_output(str(blocker / "sub" / "out"), "--out", kind)
  target = tmp_path / "new" / "deeper" / "out"
  assert errors.check_output(str(target), "--out", kind) == str(target)
  assert not (tmp_path / "new").exists()  # checked, not made

  real_mkstemp = errors.tempfile.mkstemp

  def refused(*args, dir=None, **kw):  # what the kernel says for a read-only folder
    if dir and str(dir).startswith(str(tmp_path)):
      raise PermissionError(errno.EACCES, "Permission denied", dir)
    return real_mkstemp(*args, dir=dir, **kw)

  monkeypatch.setattr(errors.tempfile, "mkstemp", refused)
  with pytest.raises(UserError, match="is not writable"):
    errors.check_output(str(target), "--out", kind)


# -------------------------------------------------- item 14: a read-only compilation cache


def test_read_only_compilation_cache_is_refused(tmp_path, monkeypatch):
  """An existing folder the process may not write: JAX printed 39 warnings and exit 0."""
  cache = tmp_path / "cache"
  cache.mkdir()
  real_mkstemp = errors.tempfile.mkstemp

  def refused(*args, dir=None, **kw):
    if dir and str(dir).startswith(str(cache)):
      raise PermissionError(errno.EACCES, "Permission denied", dir)
    return real_mkstemp(*args, dir=dir, **kw)

  monkeypatch.setattr(errors.tempfile, "mkstemp", refused)
  with pytest.raises(UserError, match="--compilation_cache=.* is not writable; fix: .*off"):
    cli.compilation_cache(str(cache))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes a read-only folder")
def test_read_only_compilation_cache_is_refused_on_the_command_line(tmp_path):
  cache = tmp_path / "cache"
  cache.mkdir()
  cache.chmod(0o555)
  try:
    proc = run_cli([os.path.join("experiments", "generate.py"), f"--workdir={tmp_path}",
                    f"--compilation_cache={cache}"])
  finally:
    cache.chmod(0o755)
  one_error_line(proc, "--compilation_cache=", "not writable")


# ------------------------------------------------------------ item 16: temperature=nan


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_generate_refuses_a_temperature_that_is_not_a_finite_number(tmp_path, value):
  proc = run_cli([os.path.join("experiments", "generate.py"), f"--workdir={tmp_path}",
                  f"--temperature={value}"])
  one_error_line(proc, "--temperature")


def test_generate_library_refuses_nan_sampling_settings():
  from soma_jax import generate as gen_lib

  for t, p in ((float("nan"), 1.0), (float("inf"), 1.0), (1.0, float("nan")), (-0.5, 1.0)):
    with pytest.raises(UserError):
      gen_lib.check_sampling(t, p)
  gen_lib.check_sampling(0.0, 1.0)


def test_every_float_flag_refuses_nan(tmp_path):
  """The class of item 16: nan passes every comparison-based range check."""
  proc = run_cli(["-m", "benchmarks.scaling", "--seconds=nan", f"--json={tmp_path / 'r.json'}"])
  one_error_line(proc, "--seconds=nan")


# ------------------------------------------- item 1: a signal stops the whole study, saved

from soma_jax import checkpoint as ckpt_lib  # noqa: E402
from soma_jax.studies import executor  # noqa: E402
from soma_jax.studies import jobs as jobs_lib  # noqa: E402
from tests.test_train import tiny_config  # noqa: E402


def long_jobs(data_dir: str, folder: str, n: int = 3) -> list[jobs_lib.Job]:
  """Runs far longer than any test: only a signal ends them."""
  return [jobs_lib.Job(tiny_config(data_dir, steps=100000, log_every=1, eval_every=100000,
                                   ckpt_every=100000).to_dict(),
                       os.path.join(folder, f"run{i}"), f"run {i}") for i in range(n)]


def wait_until(predicate, what: str, timeout: float = 240):
  t0 = time.time()
  while not predicate():
    assert time.time() - t0 < timeout, f"timed out waiting for {what}"
    time.sleep(0.1)


def updating(workdir: str) -> bool:
  metrics = os.path.join(workdir, "metrics.jsonl")
  return os.path.isfile(metrics) and os.path.getsize(metrics) > 0


def lock_holder(workdir: str) -> int:
  with open(os.path.join(workdir, ckpt_lib.LOCK_FILE)) as f:
    return int(f.read().split()[0])


def gone(pid: int) -> bool:
  """The process ended (a zombie counts: it runs nothing)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
  except FileNotFoundError:
    return True


@pytest.fixture
def sigterm_raises():
  """SIGTERM in this process as an entry point has it (`cli.run`): Interrupted."""
  old = signal.getsignal(signal.SIGTERM)
  errors.stop_on_sigterm()
  yield
  signal.signal(signal.SIGTERM, old)


def signal_once(predicate, pid: int, signum=signal.SIGTERM):
  def go():
    wait_until(predicate, "updates")
    os.kill(pid, signum)
  thread = threading.Thread(target=go, daemon=True)
  thread.start()
  return thread


@pytest.mark.parametrize("name", ["inline", "processes:1"])
def test_sigterm_stops_the_whole_stage_after_saving(data_prepared, tmp_path, sigterm_raises,
                                                    name):
  """It saved the run in progress, logged it as FAILED and started the next run of the grid
  (9 more within 60 s): only SIGKILL stopped a study."""
  jobs = long_jobs(data_prepared, str(tmp_path))
  signal_once(lambda: updating(jobs[0].workdir), os.getpid())
  with pytest.raises(errors.Interrupted) as e:
    executor.make(name).run(jobs)
  assert e.value.signum == signal.SIGTERM
  assert "rerun the same command" in str(e.value), str(e.value)
  assert ckpt_lib.Checkpointer(jobs[0].workdir).steps(), "the run in progress was not saved"
  for job in jobs[1:]:
    assert not os.path.exists(os.path.join(job.workdir, "config.json")), job.what


def test_a_worker_stopped_by_a_signal_stops_the_stage(data_prepared, tmp_path):
  """A scheduler's SIGTERM to a worker: the parent starts no other run and stops, saved."""
  jobs = long_jobs(data_prepared, str(tmp_path))
  def go():
    wait_until(lambda: updating(jobs[0].workdir), "updates")
    os.kill(lock_holder(jobs[0].workdir), signal.SIGTERM)
  threading.Thread(target=go, daemon=True).start()
  with pytest.raises(errors.Interrupted, match="run 0 stopped by SIGTERM.*2 runs not started"):
    executor.make("processes:1").run(jobs)
  assert ckpt_lib.Checkpointer(jobs[0].workdir).steps()
  assert not os.path.exists(jobs[1].workdir)


def test_an_interrupted_study_exits_with_one_line_and_the_signal_status(capsys):
  @errors.exit_on_user_error
  def main():
    raise errors.Interrupted("run 0 stopped early (interrupted by SIGTERM, saved at step 3); "
                             "rerun the same command to resume", signal.SIGTERM)

  with pytest.raises(SystemExit) as e:
    main()
  assert e.value.code == 128 + signal.SIGTERM
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and "rerun the same command" in lines[0], lines


def test_train_to_end_raises_interrupted_for_a_signal(monkeypatch):
  """Interrupted is no Exception: an executor's `except Exception` cannot swallow it."""
  from soma_jax import train as train_lib

  monkeypatch.setattr(train_lib.plan_lib, "place", lambda spec: spec)
  monkeypatch.setattr(train_lib, "train", lambda plan, w, called=None: {
      "status": "interrupted", "step": 3, "signal": signal.SIGTERM})
  with pytest.raises(errors.Interrupted, match="seed 0 stopped early .*SIGTERM, saved at step 3"):
    train_lib.train_to_end(None, "w", "seed 0")
  assert not issubclass(errors.Interrupted, Exception)


ORPHAN_PARENT = """
import sys
from soma_jax.studies import executor
from tests.test_reliability_round6_a import long_jobs
executor.make("processes:1").run(long_jobs(sys.argv[1], sys.argv[2], 1))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_a_worker_does_not_outlive_its_parent(data_prepared, tmp_path):
  """kill -9 of a processes:K study: its worker ran on as an orphan and its temp folder
  stayed. Now the worker saves, stops and removes the folder."""
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  runs = tmp_path / "runs"
  env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=ROOT)
  parent = subprocess.Popen(PY + ["-c", ORPHAN_PARENT, data_prepared, str(runs)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  workdir = str(runs / "run0")
  try:
    wait_until(lambda: updating(workdir), "the worker's updates")
    worker = lock_holder(workdir)
    parent.kill()
    parent.wait()
    wait_until(lambda: gone(worker), "the orphaned worker to stop", timeout=120)
  finally:
    if parent.poll() is None:
      parent.kill()
  assert ckpt_lib.Checkpointer(workdir).steps(), "the orphan did not save its run"
  assert not [p for p in os.listdir(tmp) if p.startswith("soma-executor-")], os.listdir(tmp)


# ------------------------------------------------------ item 2: a huge n_pert, a long update


def test_a_huge_n_pert_is_refused_before_the_first_update(data_prepared, tmp_path):
  """n_pert = 1e9 stayed inside its first update, ignored SIGTERM and took 16.7 GB."""
  w = tmp_path / "w"
  proc = run_cli([os.path.join("experiments", "train.py"),
                  "--config=experiments/configs/soma.py:n=3,size=tiny",
                  f"--config.data.dir={data_prepared}", f"--workdir={w}",
                  "--config.spsa.n_pert=1000000000"])
  one_error_line(proc, "spsa.n_pert=1,000,000,000", "directions per update")
  assert not w.exists()


def test_a_step_planned_beyond_the_machine_is_refused(data_prepared, monkeypatch):
  """The memory planner's answer is acted on, on a CPU too (against the machine's memory)."""
  from soma_jax import memory
  from soma_jax import plan as plan_lib
  from soma_jax import spec as spec_lib

  monkeypatch.setattr(memory, "host_memory_bytes", lambda: 1000)
  spec = spec_lib.resolve(tiny_config(data_prepared))
  with pytest.raises(UserError, match="plans .* GB at pert_chunk=.* more than the 0.00 GB"):
    plan_lib.place_step(spec)


def test_a_signal_during_a_long_first_update_stops_without_waiting_for_it(data_prepared,
                                                                         tmp_path):
  """A first update of 100,000 directions (about a minute here) is left unfinished: nothing
  since the start to save, so the run stops within seconds of SIGTERM."""
  w = tmp_path / "w"
  proc = subprocess.Popen(
      PY + [os.path.join("experiments", "train.py"),
            "--config=experiments/configs/soma.py:n=3,size=tiny",
            f"--config.data.dir={data_prepared}", f"--workdir={w}",
            "--config.spsa.n_pert=1000000"], cwd=ROOT, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True)
  try:
    wait_until(lambda: os.path.exists(w / "metrics.jsonl") or proc.poll() is not None,
               "the first update to start")
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    time.sleep(3)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    took = time.time() - t0
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
  assert took < 30, took
  assert "left unfinished" in err and "Traceback" not in err, err[-2000:]


# ------------------------------------------------------------ item 5: a full disk mid-study


def enospc(path="somewhere"):
  return OSError(errno.ENOSPC, "No space left on device", path)


def test_the_workdir_lock_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
  """The lock's ENOSPC was not caught: a traceback per run."""
  def write(fd, data):
    raise enospc()

  monkeypatch.setattr(ckpt_lib.os, "write", write)
  with pytest.raises(errors.DiskFull, match="no space left .*free disk space, then rerun"):
    with ckpt_lib.WorkdirLock(str(tmp_path / "w")):
      pass


@pytest.mark.parametrize("failure", ["oserror", "diskfull"])
def test_inline_stops_at_a_full_disk_instead_of_starting_every_run(tmp_path, monkeypatch,
                                                                   failure):
  started = []

  def train_job(job):
    started.append(job.what)
    if failure == "oserror":
      raise enospc(os.path.join(job.workdir, "metrics.jsonl"))
    raise errors.DiskFull("could not save checkpoint 4 (no space left on device)")

  monkeypatch.setattr(executor, "train_job", train_job)
  jobs = [jobs_lib.Job({}, str(tmp_path / f"run{i}"), f"run {i}") for i in range(3)]
  with pytest.raises(errors.DiskFull) as e:
    executor.make("inline").run(jobs)
  assert started == ["run 0"]
  text = str(e.value)
  assert "run 0 could not write" in text and "2 more runs not started" in text, text
  assert "free disk space" in text and "rerun the same command" in text, text
  assert "\n" not in text


def test_processes_stop_starting_runs_at_a_full_disk(tmp_path, monkeypatch):
  """A worker's full disk: no run starts after it (the ones running end by themselves)."""
  started = []

  class Done:
    returncode = 1

    def poll(self):
      return 1

  def start(self, job, host, share, folder, i):
    started.append(job.what)
    with open(os.path.join(folder, f"result{i}.json"), "w") as f:
      json.dump({"error": "no space left on the disk", "disk_full": True}, f)
    return Done(), open(os.devnull, "w"), "log"

  monkeypatch.setattr(executor.Processes, "_start", start)
  monkeypatch.setattr(executor.Processes, "_shares", lambda self: [executor._Share()])
  jobs = [jobs_lib.Job({}, str(tmp_path / f"run{i}"), f"run {i}") for i in range(3)]
  with pytest.raises(errors.DiskFull, match="run 0 could not write.*2 more runs not started"):
    executor.make("processes:1").run(jobs)
  assert started == ["run 0"]


def test_a_full_disk_at_an_entry_point_is_one_line_exit_2(capsys):
  @errors.exit_on_user_error
  def main():
    raise enospc("/out/results.json")

  with pytest.raises(SystemExit) as e:
    main()
  assert e.value.code == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: no space left"), lines
  assert "/out/results.json" in lines[0] and "rerun the same command" in lines[0]


def test_a_full_disk_while_training_is_a_disk_full(data_prepared, tmp_path, monkeypatch):
  """The training loop's own writes (metrics) on a full disk: DiskFull, the executor's cue."""
  from soma_jax import metrics as metrics_lib
  from soma_jax import train as train_lib

  def write(self, step, record):
    raise enospc(self.path)

  monkeypatch.setattr(metrics_lib.MetricWriter, "write", write)
  with pytest.raises(errors.DiskFull, match="free disk space"):
    train_lib.run(tiny_config(data_prepared, steps=2), str(tmp_path / "w"))


# ---------------------------------------------- item 6: a SLURM submission that fails


def failing_slurm(folder) -> str:
  """An `sbatch` that fails as it does without a controller, and the `srun` submitit wants."""
  import stat

  for name, text in (("sbatch", "echo 'sbatch: error: Batch job submission failed: Unable to "
                                "contact slurm controller (connect failure)' >&2\nexit 1"),
                     ("srun", "exit 1")):
    path = folder / name
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return str(folder)


def test_a_failed_slurm_submission_is_one_line(monkeypatch, tmp_path, data_prepared):
  """sbatch exists but refuses (no controller; a bad partition, account or QOS): a
  traceback, exit 1."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  monkeypatch.setenv("PATH", failing_slurm(bin_dir) + os.pathsep + os.environ["PATH"])
  ex = executor.make("submitit:slurm", {"partition": "nope"})
  jobs = [jobs_lib.Job(tiny_config(data_prepared, steps=2).to_dict(),
                       str(tmp_path / f"run{i}"), f"run {i}") for i in range(2)]
  with pytest.raises(UserError) as e:
    ex.run(jobs)
  text = str(e.value)
  assert "--executor=submitit:slurm could not submit run 0" in text, text
  assert "Unable to contact slurm controller" in text and "--slurm_partition" in text, text
  assert "\n" not in text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.slow  # runs into its 60-s timeout when it blocks
@pytest.mark.xfail(reason="passes alone; blocks when run after this file's other full-disk "
                   "tests in one process (not yet understood)", strict=False)
def test_tensorboard_on_a_full_disk_does_not_block_the_run(tmp_path):
  """tensorboardX's writer thread died on ENOSPC, its queue filled, and the next scalar
  blocked the run for good (a processes:K worker hung, orphaned, on a full disk)."""
  from soma_jax import metrics as metrics_lib

  writer = metrics_lib.MetricWriter(str(tmp_path))
  for file_writer in writer._tb.all_writers.values():
    def write_event(event):
      raise enospc()
    file_writer.event_writer._ev_writer.write_event = write_event
  done = []

  def go():
    for step in range(1, 20):  # 19 x 12 scalars: far more than the queue's 10
      writer.write(step, {"loss": [1.0] * 6, "lr": [0.1] * 6})
      time.sleep(0.01)
    writer.close()
    done.append(True)

  thread = threading.Thread(target=go, daemon=True)
  thread.start()
  thread.join(timeout=60)
  assert done, "the metrics writer blocked"
  with open(tmp_path / "metrics.jsonl") as f:
    assert len(f.readlines()) == 19


def test_ctrl_c_stops_a_study_with_one_line(data_two_shards, tmp_path):
  """The issue's case: table6 at tiny size, Ctrl-C once the grid's runs have started."""
  out = tmp_path / "study"
  proc = subprocess.Popen(
      PY + [os.path.join("experiments", "compare.py"),
            "--config=experiments/configs/compare.py:study=table6,size=tiny",
            f"--config.data_dir={data_two_shards}", f"--out={out}", "--config.budget=3000"],
      cwd=ROOT, stdout=open(tmp_path / "stdout.txt", "w"), stderr=subprocess.PIPE, text=True)

  def grid_updating():
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    return any(updating(os.path.dirname(p))
               for p in glob.glob(str(out / "runs" / "**" / "metrics.jsonl"), recursive=True))

  try:
    wait_until(grid_updating, "the grid's first run", timeout=280)
    started = len(glob.glob(str(out / "runs" / "**" / "config.json"), recursive=True))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
  lines = [line for line in err.splitlines() if line.strip()]
  assert lines[-1].startswith("stopped: ") and "rerun the same command" in lines[-1], lines[-3:]
  assert "Traceback" not in err, err[-2000:]
  assert "FAILED" not in (tmp_path / "stdout.txt").read_text()  # it went on to the next run
  assert len(glob.glob(str(out / "runs" / "**" / "config.json"), recursive=True)) == started
