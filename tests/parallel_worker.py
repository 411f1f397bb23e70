"""Runs sharded SOMA steps in a fresh process with several (fake CPU) devices.

Used by tests/test_parallel.py and benchmarks/scaling.py; the parent sets
XLA_FLAGS=--xla_force_host_platform_device_count=D and JAX_PLATFORMS=cpu in the child's
environment, so the parent stays single-device.

  python tests/parallel_worker.py --out=/tmp/r.npz fso:4:4:1 ddpp:1:1:4
  # two processes x two devices each (run both):
  python tests/parallel_worker.py --out=/tmp/r.npz --coordinator=127.0.0.1:PORT \
      --num_processes=2 --process_id=I fso:4:4:1 ddpp:1:1:4

A case is NAME:N:E:P (N experts on an E x P mesh). For each case the worker writes the
final state's leaves, the per-step losses and the compiled step's collective counts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time

import numpy as np

STEPS = 5
A, B, T = 2, 2, 16  # accumulation batches, sequences, targets


def step_config(n_pert: int = 8, pert_chunk: int = 4):
  """The tiny model of the tests: per-expert trained heads, n_pert 8."""
  from soma_jax import model, spsa

  return spsa.StepConfig(
      model=model.ModelConfig(d_t=8, d_e=8, shared_head=False),
      spsa=spsa.SpsaConfig(n_pert=n_pert, accum=A, pert_chunk=pert_chunk), train_head=True)


def initial_state(cfg, n: int, lr: float = 1e-2, x64: bool = False):
  """The same host-complete state in every process; float64 leaves if x64.

  Parameters come from numpy (shapes from `model.init_experts`): compiling the real
  initialiser takes about 10 s on a busy CPU, and these tests only need fixed values.
  """
  import jax
  import jax.numpy as jnp

  from soma_jax import model, spsa, train_state

  rng = np.random.default_rng(1)
  dtype = np.float64 if x64 else np.float32

  def fill(path, leaf):
    if spsa._is_gain(path):
      return 1 + 0.1 * rng.standard_normal(leaf.shape).astype(dtype)
    return (rng.standard_normal(leaf.shape) / np.sqrt(leaf.shape[-2])).astype(dtype)

  shapes = jax.eval_shape(lambda: model.init_experts(jax.random.key(0), cfg.model, n))
  body_N, head_N = jax.tree_util.tree_map_with_path(fill, shapes)
  def init(body_N, head_N):
    state = train_state.init_state(body_N, head_N, lr, lr, cfg.weight_decay, cfg.train_head)
    return jax.tree.map(lambda x: x.astype(dtype) if x.dtype == jnp.float32 else x, state)

  with jax.enable_x64(True) if x64 else contextlib.nullcontext():
    return jax.jit(init)(body_N, head_N)


def batches(n: int, steps: int = STEPS, t: int = T) -> np.ndarray:
  """[steps, N, A, B, T+1] uint8, identical in every process."""
  return np.random.default_rng(0).integers(0, 256, (steps, n, A, B, t + 1), dtype=np.uint8)


def flat_leaves(tree) -> list[np.ndarray]:
  import jax

  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def run_case(n: int, e: int, p: int, steps: int = STEPS, cfg=None, x64: bool = False) -> dict:
  """`steps` sharded updates; returns host copies of the final state and the metrics."""
  import jax
  from jax.experimental import multihost_utils

  from soma_jax import parallel, spsa

  cfg = cfg or step_config()
  mesh = parallel.make_mesh(e, p, n_experts=n)
  step = parallel.make_train_step(spsa.train_step, cfg, mesh)
  state = parallel.put_state(initial_state(cfg, n, x64=x64), mesh)
  ids = parallel.expert_ids(n, mesh)
  mine = parallel.local_experts(n, mesh)
  data = batches(n, steps)
  hlo = parallel.step_hlo(step, state, parallel.global_batch(data[0, mine.start:mine.stop], mesh),
                          ids)
  losses = []
  for s in range(steps):
    batch = parallel.global_batch(data[s, mine.start:mine.stop], mesh)
    state, metrics = step(state, batch, ids)
    losses.append(metrics["loss"])
  full = multihost_utils.process_allgather(state, tiled=True)
  loss = multihost_utils.process_allgather(losses, tiled=True)
  return {"leaves": flat_leaves(full), "loss": np.stack([np.asarray(x) for x in loss]),
          "collectives": parallel.count_collectives(hlo), "cache_size": step._cache_size(),
          "local_experts": [mine.start, mine.stop], "devices": jax.device_count()}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("cases", nargs="*", help="NAME:N:E:P")
  parser.add_argument("--out", required=True)
  parser.add_argument("--coordinator")
  parser.add_argument("--num_processes", type=int)
  parser.add_argument("--process_id", type=int)
  parser.add_argument("--x64", action="store_true", help="float64 states (jax_enable_x64)")
  parser.add_argument("--bench", action="store_true", help="time steps instead (scaling.py)")
  parser.add_argument("--experts_per_device", type=int, default=2)
  parser.add_argument("--seconds", type=float, default=5.0)
  parser.add_argument("--d_t", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=64)
  args = parser.parse_args()
  import jax

  if args.x64:
    jax.config.update("jax_enable_x64", True)
  if args.coordinator:
    from soma_jax import parallel

    parallel.initialize_distributed(args.coordinator, args.num_processes, args.process_id,
                                    timeout_s=60)
  if args.bench:
    result = bench(args.experts_per_device, args.seconds, args.d_t, args.seq_len)
    with open(args.out, "w") as f:
      json.dump(result, f)
    return
  out, meta = {}, {}
  for case in args.cases:
    name, n, e, p = case.split(":")
    r = run_case(int(n), int(e), int(p), x64=args.x64)
    for i, x in enumerate(r.pop("leaves")):
      out[f"{name}/leaf{i}"] = x
    out[f"{name}/loss"] = r.pop("loss")
    meta[name] = r
  if jax.process_index() == 0:
    out["meta"] = np.array(json.dumps(meta))
    np.savez(args.out, **out)


def bench(per_device: int, seconds: float, d_t: int, seq_len: int) -> dict:
  """FSO steps/s with `per_device` experts on each of this process's devices."""
  import jax

  from soma_jax import model, parallel, spsa

  d = jax.device_count()
  n = per_device * d
  cfg = dataclasses.replace(
      step_config(n_pert=8, pert_chunk=8),
      model=model.ModelConfig(d_t=d_t, d_e=32, shared_head=False))
  mesh = parallel.make_mesh(d, 1, n_experts=n)
  step = parallel.make_train_step(spsa.train_step, cfg, mesh)
  state = parallel.put_state(initial_state(cfg, n, lr=1e-3), mesh)
  ids = parallel.expert_ids(n, mesh)
  batch = parallel.global_batch(batches(n, 1, seq_len)[0], mesh)
  t0 = time.perf_counter()
  state, m = step(state, batch, ids)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t0
  count, t0 = 0, time.perf_counter()
  while time.perf_counter() - t0 < seconds:
    state, m = step(state, batch, ids)
    count += 1
  jax.block_until_ready(m)
  elapsed = time.perf_counter() - t0
  return {"devices": d, "experts": n, "experts_per_device": per_device,
          "steps_per_second": count / elapsed, "steps": count, "first_step_seconds": compile_s,
          "d_t": d_t, "seq_len": seq_len, "n_pert": cfg.spsa.n_pert, "accum": A, "batch": B,
          "collectives": parallel.count_collectives(parallel.step_hlo(step, state, batch, ids))}


if __name__ == "__main__":
  main()
