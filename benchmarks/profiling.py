"""The profiler's trace of the SOMA step, summed into ranked ops (profile_step.py's core).

No flags here: importable by tests and other scripts.
"""

import collections
import glob
import gzip
import json
import os
import tempfile

import jax

from benchmarks.step_timing import LayoutStep, describe, step_inputs
from soma_jax import memory
from soma_jax import plan as plan_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError

# Events that wrap others (whole executions, waits, Python frames) would count time twice.
WRAPPERS = ("ThunkExecutor", "$", "PjitFunction", "CommonPjRt", "PjRt", "TfrtCpu", "Await")


# Coarse kinds of ops, by name (first match wins): GPU kernel names (cuBLAS, CUTLASS,
# Triton, XLA fusions) and XLA:CPU thunks (YNNPACK dots, loop fusions).
CATEGORIES = (
    ("matmul", ("gemm", "cublas", "cutlass", "xmma", "nvjet", "ynn_fusion", "dot", "matmul")),
    ("random bits", ("threefry", "rng", "random")),
    ("copies and layout", ("copy", "memcpy", "memset", "transpose", "dynamic-update-slice",
                           "dynamic_update_slice", "concatenate")),
    ("reductions", ("reduce",)),
    ("elementwise fusions", ("fusion", "loop_", "wrapped_")),
    ("loop control", ("while", "cond")),
)


def category(name: str) -> str:
  low = name.lower()
  return next((cat for cat, keys in CATEGORIES if any(k in low for k in keys)), "other")


def self_times(events: list[dict]) -> list[tuple[dict, float]]:
  """(event, its duration minus that of the events nested in it on its thread), in us.

  A loop's event holds its body's ops; counting both would count the body twice.
  """
  out = []
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[(e.get("pid"), e.get("tid"))].append(e)
  for evs in by_thread.values():
    evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack: list[list] = []  # [event, end, child time]
    def close(entry):
      out.append((entry[0], entry[0]["dur"] - entry[2]))
    for e in evs:
      while stack and e["ts"] >= stack[-1][1]:
        close(stack.pop())
      if stack:
        stack[-1][2] += e["dur"]
      stack.append([e, e["ts"] + e["dur"], 0.0])
    while stack:
      close(stack.pop())
  return out


def summarize(trace: dict, steps: int, top: int) -> dict:
  """{process: {"total_ms_per_step", "categories": {kind: {"ms_per_step", "share"}},
  "ops": [{"name", "category", "ms_per_step", "calls_per_step", "share"}]}}, ranked by self
  time (an op's time minus the ops nested in it); categories sum every op, not just the top."""
  names = {e["pid"]: e["args"]["name"] for e in trace.get("traceEvents", [])
           if e.get("ph") == "M" and e.get("name") == "process_name" and "args" in e}
  ms = collections.defaultdict(collections.Counter)
  calls = collections.defaultdict(collections.Counter)
  spans = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
  for e, self_us in self_times(spans):
    if str(e.get("name", "")).startswith(WRAPPERS):
      continue
    proc = names.get(e.get("pid"), str(e.get("pid")))
    ms[proc][e["name"]] += self_us / 1e3
    calls[proc][e["name"]] += 1
  out = {}
  for proc, counter in ms.items():
    total = sum(counter.values())
    share = lambda t, total=total: t / total if total else 0.0
    kinds = collections.Counter()
    for name, t in counter.items():
      kinds[category(name)] += t
    out[proc] = {
        "total_ms_per_step": total / steps,
        "categories": {k: {"ms_per_step": t / steps, "share": share(t)}
                       for k, t in kinds.most_common()},
        "ops": [{"name": name, "category": category(name), "ms_per_step": t / steps,
                 "calls_per_step": calls[proc][name] / steps, "share": share(t)}
                for name, t in counter.most_common(top)]}
  return out


def profile(spec: spec_lib.RunSpec, steps: int, top: int, trace_dir: str | None) -> dict:
  """The step in the layout training uses (`plan.place_step`), its trace summed."""
  if steps < 1 or top < 1:
    raise UserError(f"--steps={steps} and --top={top} must be >= 1")
  inputs = step_inputs(spec)
  placed = plan_lib.place_step(spec)
  cfg = spec.method.step_config(placed.chunk.chunk)  # training's, its seed static here
  sharded = LayoutStep.build(inputs, placed)
  step = sharded.run if sharded else inputs.runner(inputs.compile(cfg))
  run = lambda: jax.block_until_ready(step())
  with memory.matmul_precision(spec.precision):
    run()  # warm-up: allocations and autotuning stay out of the trace
    with tempfile.TemporaryDirectory() as tmp:
      where = trace_dir or tmp
      jax.profiler.start_trace(where, create_perfetto_trace=True)  # the *.trace.json.gz read below
      for _ in range(steps):
        run()
      jax.profiler.stop_trace()
      files = sorted(glob.glob(os.path.join(where, "**", "*.trace.json.gz"), recursive=True),
                     key=os.path.getmtime)
      if not files:
        raise UserError(f"jax.profiler wrote no *.trace.json.gz under {where}; fix: install "
                        "a JAX whose profiler writes Perfetto traces (jax >= 0.4.30)")
      with gzip.open(files[-1]) as f:
        trace = json.load(f)
  lay = placed.layout
  return describe(spec, pert_chunk=placed.chunk.chunk, time_block=cfg.spsa.time_block,
                  forward=cfg.spsa.forward, dot_algorithm=memory.dot_algorithm(spec.precision)) | {
      "layout": {"mesh_expert": lay.expert, "mesh_pert": lay.pert, "what": lay.why},
      "steps": steps, "trace": files[-1] if trace_dir else None,
      "processes": summarize(trace, steps, top)}
