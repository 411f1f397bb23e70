"""One CPU host device per usable core at entry-point start-up; what a CPU run is charged."""

import os
import subprocess
import sys

import jax
import pytest

from soma_jax import host_devices
from soma_jax.errors import UserError
from tests.conftest import default_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


def test_cgroup_v2_quota_is_the_tightest_of_the_process_and_its_ancestors(tmp_path):
  proc = tmp_path / "proc_cgroup"
  _write(proc, "0::/job/step\n")
  _write(tmp_path / "cg" / "cpu.max", "max 100000\n")
  _write(tmp_path / "cg" / "job" / "cpu.max", "250000 100000\n")
  _write(tmp_path / "cg" / "job" / "step" / "cpu.max", "300000 100000\n")
  assert host_devices.cgroup_cpu_limit(str(tmp_path / "cg"), str(proc)) == 2.5
  _write(tmp_path / "cg" / "job" / "cpu.max", "max 100000\n")
  assert host_devices.cgroup_cpu_limit(str(tmp_path / "cg"), str(proc)) == 3.0


def test_cgroup_v1_quota_and_no_quota(tmp_path):
  proc = tmp_path / "proc_cgroup"
  _write(proc, "4:memory:/x\n1:cpu,cpuacct:/\n0::/\n")
  cpu = tmp_path / "cg" / "cpu,cpuacct"
  _write(cpu / "cpu.cfs_quota_us", "150000\n")
  _write(cpu / "cpu.cfs_period_us", "100000\n")
  assert host_devices.cgroup_cpu_limit(str(tmp_path / "cg"), str(proc)) == 1.5
  _write(cpu / "cpu.cfs_quota_us", "-1\n")
  assert host_devices.cgroup_cpu_limit(str(tmp_path / "cg"), str(proc)) is None
  assert host_devices.cgroup_cpu_limit(str(tmp_path / "none"), str(tmp_path / "nope")) is None


@pytest.mark.parametrize("affinity,quota,cores", [(4, None, 4), (4, 2.5, 2), (4, 0.5, 1),
                                                  (2, 8.0, 2)])
def test_usable_cores_is_the_affinity_capped_by_the_quota(monkeypatch, affinity, quota, cores):
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
  monkeypatch.setattr(host_devices, "cgroup_cpu_limit", lambda: quota)
  assert host_devices.usable_cores() == cores


def test_users_count_from_xla_flags(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1 --xla_force_host_platform_device_count=3")
  assert host_devices.users_count() == (3, "XLA_FLAGS")
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1")
  assert host_devices.users_count() is None


def test_after_jax_started_nothing_changes_and_an_explicit_count_is_an_error(monkeypatch):
  jax.devices()  # this process's backends are up
  monkeypatch.setattr(host_devices, "chosen_by", "")
  assert host_devices.start() == "JAX had already started"
  with pytest.raises(UserError, match="--cpu_devices is set after JAX started"):
    host_devices.start(2)
  with pytest.raises(UserError, match="--cpu_devices=-1"):
    host_devices.start(-1)


def test_charged_units_on_a_cpu_are_the_usable_cores_whatever_the_layout():
  cores = host_devices.usable_cores()
  assert host_devices.charged_units(1) == host_devices.charged_units(8) == cores


PROBE = ("import sys; from soma_jax import host_devices; how = host_devices.start(int(sys.argv[1]));"
         " import jax; print(jax.device_count(), host_devices.usable_cores(), how)")


def _probe(env: dict, requested: int = 0) -> list[str]:
  proc = subprocess.run([sys.executable, "-c", PROBE, str(requested)], env=env, cwd=ROOT,
                        capture_output=True, text=True, check=True)
  return proc.stdout.split(maxsplit=2)


def test_start_gives_one_device_per_core_unless_the_user_chose():
  env = default_env(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  env.pop("JAX_NUM_CPU_DEVICES", None)
  devices, cores, how = _probe(env)
  assert devices == cores and how.strip() == "one per usable core"
  devices, _, how = _probe(dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=3"))
  assert (devices, how.strip()) == ("3", "XLA_FLAGS")
  devices, _, how = _probe(dict(env, JAX_NUM_CPU_DEVICES="5"))
  assert (devices, how.strip()) == ("5", "JAX_NUM_CPU_DEVICES")
  devices, _, how = _probe(dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=3"), 2)
  assert (devices, how.strip()) == ("2", "--cpu_devices")  # the explicit flag wins
