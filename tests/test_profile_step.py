"""benchmarks/profile_step.py: ops ranked by self time, per profiler process."""

import os
import subprocess
import sys

import pytest

from benchmarks import profiling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _span(name, ts, dur, pid=1, tid=1):
  return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def test_summary_counts_nested_ops_once_and_per_step():
  trace = {"traceEvents": [
      {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
      {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
      _span("while.1", 0, 100), _span("dot", 10, 30), _span("tanh", 50, 10),  # in the loop
      _span("dot", 200, 30),  # a second call, outside
      _span("dot", 0, 500, tid=2),  # another thread: not nested in the loop
      _span("ThunkExecutor::Execute", 0, 1000, tid=3),  # a wrapper: not an op
      _span("gemm_kernel", 5, 40, pid=2),
  ]}
  out = profiling.summarize(trace, steps=2, top=10)
  host = {op["name"]: op for op in out["/host:CPU"]["ops"]}
  assert host["while.1"]["ms_per_step"] == pytest.approx(60 / 1e3 / 2)  # 100 - 30 - 10
  assert host["dot"]["ms_per_step"] == pytest.approx(560 / 1e3 / 2)
  assert host["dot"]["calls_per_step"] == 1.5
  assert "ThunkExecutor::Execute" not in host
  assert out["/host:CPU"]["total_ms_per_step"] == pytest.approx(630 / 1e3 / 2)
  assert sum(op["share"] for op in host.values()) == pytest.approx(1.0)
  assert [op["name"] for op in out["/host:CPU"]["ops"]][0] == "dot"  # ranked
  assert out["/device:GPU:0"]["ops"] == [{"name": "gemm_kernel", "category": "matmul",
                                          "ms_per_step": 0.02, "calls_per_step": 0.5, "share": 1.0}]
  kinds = out["/host:CPU"]["categories"]
  assert set(kinds) == {"matmul", "loop control", "other"}  # dot; while.1; tanh
  assert kinds["matmul"]["ms_per_step"] == pytest.approx(560 / 1e3 / 2)
  assert sum(k["share"] for k in kinds.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("name,kind", [
    ("ynn_fusion.17", "matmul"), ("cutlass_80_tensorop_s1688gemm_128x128", "matmul"),
    ("sm90_xmma_gemm_f32f32_tf32f32", "matmul"), ("threefry2x32", "random bits"),
    ("bitcast_dynamic-update-slice_fusion.3", "copies and layout"),
    ("input_reduce_fusion", "reductions"), ("multiply_tanh_fusion.2", "elementwise fusions"),
    ("while.250", "loop control"), ("ParseArguments", "other")])
def test_categories_of_kernel_names(name, kind):
  assert profiling.category(name) == kind


@pytest.mark.slow  # make test-all; kept out of make test's 15 minutes
def test_profiles_a_tiny_step(tmp_path):
  out = tmp_path / "p.json"
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.profile_step", "--steps=1",
       "--config=experiments/configs/soma.py:n=2,size=tiny", f"--json={out}"],
      cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stderr[-2000:]
  import json

  result = json.loads(out.read_text())
  assert result["config"]["n_experts"] == 2 and result["steps"] == 1
  ops = [op for p in result["processes"].values() for op in p["ops"]]
  # The LSTM recurrence runs T = 32 times per layer and chunk: its kernels are in the trace.
  assert any(op["calls_per_step"] >= 32 for op in ops), ops[:5]
  assert all(op["ms_per_step"] >= 0 for op in ops)
