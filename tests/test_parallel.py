"""FSO and DDPP on fake CPU devices (SPEC 3.5): collectives in the compiled step, and
sharded results equal to a one-device `spsa.train_step`.

Multi-device runs happen in child processes (tests/parallel_worker.py) with
XLA_FLAGS=--xla_force_host_platform_device_count=D, so this process stays single-device.
Equality runs in float64: SPSA divides loss differences by 2 eps, so in float32 the last-ulp
differences between the 4-expert program and the 1-expert-per-device program (XLA fuses
them differently) grow to about 1e-5 after 5 steps; in float64 they stay below 1e-12, and
a wrong direction index or a missing average would still show up at the 1e-2 scale.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from soma_jax import parallel, spsa
from soma_jax.errors import UserError
from tests import parallel_worker as W

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "parallel_worker.py")
# name -> (N, E, P): FSO with 4 experts on 4 devices; DDPP of one model over 4 devices;
# "mixed" (2-process run only): 2 experts, each split over 2 pert devices of one process.
CASES = {"fso": (4, 4, 1), "ddpp": (1, 1, 4)}
MIXED = {"mixed": (2, 2, 2)}


def _env(devices: int) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  return env


def _launch(out: str, devices: int, cases: dict, *extra: str) -> subprocess.Popen:
  args = [f"{name}:{n}:{e}:{p}" for name, (n, e, p) in cases.items()]
  return subprocess.Popen([sys.executable, WORKER, f"--out={out}", "--x64", *extra, *args],
                          env=_env(devices), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _wait(proc: subprocess.Popen, timeout: float = 600) -> None:
  out, _ = proc.communicate(timeout=timeout)
  assert proc.returncode == 0, f"worker failed (exit {proc.returncode}):\n{out[-4000:]}"


def _reference(n: int) -> list[np.ndarray]:
  """5 updates of the plain one-device `spsa.train_step`, float64."""
  with jax.enable_x64(True):
    cfg = W.step_config()
    state, data = W.initial_state(cfg, n, x64=True), W.batches(n)
    # A fresh function: jit caches are shared per function, and test_spsa counts compiles
    # of `spsa.train_step` itself.
    step = jax.jit(lambda state, batch, ids: spsa.train_step(state, batch, ids, cfg))
    for s in range(W.STEPS):
      state, _ = step(state, data[s], np.arange(n, dtype=np.int32))
    return W.flat_leaves(state)


_REFS: dict = {}


def _references(cases: dict) -> dict:
  for name, (n, _, _) in cases.items():
    if name not in _REFS:
      _REFS[name] = _reference(n)
  return {name: _REFS[name] for name in cases}


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory) -> tuple[dict, dict]:
  """One 4-device worker run, overlapping with the one-device references computed here."""
  out = str(tmp_path_factory.mktemp("par") / "four.npz")
  proc = _launch(out, 4, CASES)
  refs = _references(CASES)
  _wait(proc)
  return dict(np.load(out)), refs


def _meta(result: dict) -> dict:
  return json.loads(str(result["meta"]))


def _assert_same(result: dict, refs: dict, what: str) -> None:
  for name, ref in refs.items():
    for i, want in enumerate(ref):
      got = result[f"{name}/leaf{i}"]
      assert got.shape == want.shape and got.dtype == want.dtype
      np.testing.assert_allclose(
          got, want, rtol=1e-6, atol=1e-6,
          err_msg=f"{name} on {what}: leaf {i} of the state differs from one device")


# ----------------------------------------------------------- in-process (1 device)


def test_mesh_shape_auto_and_errors():
  assert parallel.mesh_shape("auto", 1, 8) == (8, 1)
  assert parallel.mesh_shape(0, 2, 8) == (4, 2)
  assert parallel.mesh_shape(2, 2, 8, n_experts=6) == (2, 2)
  with pytest.raises(UserError, match="6 devices asked, but only 4 exist"):
    parallel.mesh_shape(3, 2, 4)
  with pytest.raises(UserError, match=r"N=6 experts .* mesh.expert=4"):
    parallel.mesh_shape(4, 1, 4, n_experts=6)
  with pytest.raises(UserError, match="does not divide"):
    parallel.mesh_shape("auto", 3, 4)
  with pytest.raises(UserError, match="mesh.pert"):
    parallel.mesh_shape(1, 0, 4)
  with pytest.raises(UserError, match="only 1 exist"):
    parallel.make_mesh(2, 1)  # this process has one device


@pytest.mark.parametrize("n,n_pert,devices,chunk,want", [
    (4, 16, 2, None, (2, 1)),  # N allows: experts over the devices (FSO)
    (3, 16, 2, None, (1, 2)),  # N odd: the directions (DDPP)
    (2, 16, 4, None, (1, 4)),  # directions before mixing
    (2, 6, 4, None, (2, 2)),  # neither alone: both
    (6, 9, 4, None, (3, 1)),  # none uses all 4: the most devices, then expert groups
    (3, 5, 2, None, (1, 1)),  # nothing splits
    (3, 12, 2, 4, (1, 1)),  # 6 directions per device are not whole chunks of 4
    (3, 12, 2, 6, (1, 2)),
])
def test_auto_layout_prefers_experts_then_directions_then_both(n, n_pert, devices, chunk, want):
  got = parallel.auto_layout(n, n_pert, devices, chunk)
  assert (got.expert, got.pert) == want, got
  assert got.expert * got.pert <= devices and n % got.expert == 0 and n_pert % got.pert == 0


def test_resolve_layout_auto_explicit_and_methods_that_cannot_shard():
  kw = dict(n_experts=4, n_pert=16, chunk=None, method="soma", backend="cpu")
  layout = lambda e, p, d, **more: parallel.resolve_layout(e, p, n_devices=d, **{**kw, **more})
  assert layout("auto", "auto", 2, can_shard=True)[:2] == (2, 1)
  assert "FSO" in layout("auto", "auto", 2, can_shard=True).why
  bptt = layout("auto", "auto", 2, can_shard=False, method="bptt")
  assert bptt[:2] == (1, 1) and "method=bptt does not shard" in bptt.why
  assert layout("auto", "auto", 8, can_shard=True, backend="gpu")[:2] == (1, 1)  # GPU: as before
  assert layout("auto", "auto", 8, can_shard=True, backend="gpu", processes=2,
                n_experts=8)[:2] == (8, 1)  # a multi-process job uses every device
  assert layout("1", "1", 2, can_shard=True)[:2] == (1, 1)  # explicit wins
  assert layout("auto", "2", 4, can_shard=True)[:2] == (2, 2)
  assert layout("2", "auto", 8, can_shard=True)[:2] == (2, 4)
  with pytest.raises(UserError, match="method=bptt runs on one device"):
    layout("2", "1", 2, can_shard=False, method="bptt")
  with pytest.raises(UserError, match="must be integers or auto"):
    layout("two", "1", 2, can_shard=True)


def test_one_device_mesh():
  mesh = parallel.make_mesh("auto", 1, n_experts=3)
  assert dict(mesh.shape) == {"expert": 1, "pert": 1}
  assert parallel.local_experts(3, mesh) == range(3)


def test_state_specs_split_experts_and_replicate_the_rest():
  specs = parallel.state_specs(parallel.abstract_state(W.step_config(), 4))
  assert specs.step == P()
  assert specs.head == P("expert")  # per-expert heads
  assert all(s == P("expert") for s in jax.tree.leaves(
      (specs.body, specs.opt, specs.head_opt, specs.sched, specs.skipped),
      is_leaf=lambda x: isinstance(x, P)))
  shared = W.step_config()
  shared = spsa.StepConfig(model=shared.model.__class__(d_t=8, d_e=8, shared_head=True),
                           spsa=shared.spsa)
  assert parallel.state_specs(parallel.abstract_state(shared, 4)).head == P()  # frozen, shared


def test_bad_layouts_raise_user_errors():
  cfg = W.step_config()  # n_pert 8, pert_chunk 4
  with pytest.raises(UserError, match="n_pert=8 must split evenly over mesh.pert=3"):
    parallel.make_train_step(spsa.train_step, cfg, AbstractMesh((1, 3), parallel.AXES))
  with pytest.raises(UserError, match=r"N=3 experts .* mesh.expert=2"):
    parallel.state_sharding(parallel.abstract_state(cfg, 3), AbstractMesh((2, 1), parallel.AXES))


def test_initialize_distributed_argument_errors():
  with pytest.raises(UserError, match="pass all of"):
    parallel.initialize_distributed("127.0.0.1:1234", None, 0)
  with pytest.raises(UserError, match=r"process_id=2 must be in \[0, num_processes=2\)"):
    parallel.initialize_distributed("127.0.0.1:1234", 2, 2)
  with pytest.raises(UserError, match="HOST:PORT"):
    parallel.initialize_distributed("localhost", 2, 0)


def test_initialize_distributed_launcher_mismatch(monkeypatch):
  monkeypatch.setenv("SLURM_NTASKS", "4")
  with pytest.raises(UserError, match="--num_processes=2 but the launcher started 4"):
    parallel.initialize_distributed("127.0.0.1:1234", 2, 0)


def test_count_collectives():
  hlo = """
  %all-reduce.1 = f32[8]{0} all-reduce(f32[8]{0} %p), replica_groups={{0,1}}, to_apply=%add
  %ag = (f32[4]{0}, f32[8]{0}) all-gather-start(f32[4]{0} %x), dimensions={0}
  %agd = f32[8]{0} all-gather-done((f32[4]{0}, f32[8]{0}) %ag)
  %cp = f32[4]{0} collective-permute(f32[4]{0} %y), source_target_pairs={{0,1}}
  %add.2 = f32[] add(f32[] %a, f32[] %b), metadata={op_name="psum all-reduce"}
  """
  c = parallel.count_collectives(hlo)
  assert (c["all-reduce"], c["all-gather"], c["collective-permute"], c["total"]) == (1, 1, 1, 3)


# ------------------------------------------------------------- 4 fake devices (child)


def test_fso_step_has_no_collectives(four_devices):
  meta = _meta(four_devices[0])["fso"]
  assert meta["devices"] == 4
  assert meta["collectives"]["total"] == 0, f"FSO step has collectives: {meta['collectives']}"
  assert meta["cache_size"] == 1  # compiled once for 5 steps


def test_ddpp_step_has_exactly_one_all_reduce(four_devices):
  c = _meta(four_devices[0])["ddpp"]["collectives"]
  assert c["all-reduce"] == 1 and c["total"] == 1, f"DDPP collectives: {c}"


def test_four_devices_match_one_device(four_devices):
  result, refs = four_devices
  _assert_same(result, refs, "4 devices")
  for name in CASES:  # the per-step losses were computed and are finite
    assert np.all(np.isfinite(result[f"{name}/loss"]))


# ------------------------------------------------------- 2 processes x 2 devices


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _two_processes(tmp_path, cases: dict) -> tuple[dict, dict, dict]:
  """Runs `cases` as 2 processes x 2 fake devices under jax.distributed; (result, meta, refs)."""
  out = str(tmp_path / "two.npz")
  port = _free_port()
  procs = [_launch(out, 2, cases, f"--coordinator=127.0.0.1:{port}", "--num_processes=2",
                   f"--process_id={i}") for i in range(2)]
  references = _references(cases)
  for proc in procs:
    _wait(proc)
  result = dict(np.load(out))
  return result, _meta(result), references


def test_two_processes_ddpp_matches_one_device(tmp_path):
  """The default suite's multi-process check: one model's directions over 2 processes x 2
  devices (jax.distributed on 127.0.0.1, gloo all-reduce across the processes) gives the
  one-device update; the full set of layouts runs in the slow test below."""
  result, meta, references = _two_processes(tmp_path, {"ddpp": CASES["ddpp"]})
  assert meta["ddpp"]["devices"] == 4 and meta["ddpp"]["local_experts"] == [0, 1]
  assert meta["ddpp"]["collectives"]["all-reduce"] == 1
  _assert_same(result, references, "2 processes x 2 devices")


@pytest.mark.slow
def test_two_processes_match_one_device(tmp_path):
  """jax.distributed on 127.0.0.1, gloo CPU collectives (JAX's default on CPU)."""
  cases = CASES | MIXED
  result, meta, references = _two_processes(tmp_path, cases)
  assert meta["fso"]["devices"] == 4 and meta["fso"]["local_experts"] == [0, 2]
  assert meta["ddpp"]["local_experts"] == [0, 1]  # both processes feed the one expert
  assert meta["fso"]["collectives"]["total"] == 0
  assert meta["ddpp"]["collectives"]["all-reduce"] == 1
  assert meta["ddpp"]["collectives"]["total"] == 1
  assert meta["mixed"]["local_experts"] == [0, 1]  # process 0 holds expert 0's 2 replicas
  assert meta["mixed"]["collectives"]["all-reduce"] == 1
  _assert_same(result, references, "2 processes x 2 devices")
