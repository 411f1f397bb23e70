"""SOMA (SPEC 3): the SPSA step of `spsa.train_step` on N LSTM experts, shardable over a mesh."""

from __future__ import annotations

import dataclasses
import functools

import jax
import ml_collections

from soma_jax import memory, parallel, spsa
from soma_jax.methods import lstm
from soma_jax.methods.base import Method

# Jitted once per process; the old state's buffers are donated to the new one.
train_step = jax.jit(spsa.train_step, static_argnames="cfg", donate_argnames="state")


def plan_chunk(s: lstm.Settings, n_local: int, mesh=None, step_config=lstm.step_config
               ) -> memory.ChunkChoice:
  """spsa.pert_chunk for this device ("auto" resolved) and the step's planned memory.

  Plans the one-device `train_step` at the method's `step_config` (the program training
  runs, its seed given as data) on one device's share: N / mesh.expert experts and
  n_pert / mesh.pert directions (compile only, nothing runs). On a mesh without a device
  limit to plan against (the CPU) nothing is compiled: the mesh runs another program.
  """
  n_dev = n_local // (mesh.shape["expert"] if mesh is not None else 1)
  k_dev = s.n_pert // (mesh.shape["pert"] if mesh is not None else 1)
  base = step_config(s, seed_as_data=True)
  limit = memory.device_limit_bytes()

  def plan_at(chunk: int) -> int:
    if mesh is not None and not limit:
      return -1
    cfg = dataclasses.replace(base, spsa=dataclasses.replace(base.spsa, n_pert=k_dev,
                                                             pert_chunk=chunk))
    return parallel.planned_step_bytes(
        train_step, cfg, (n_dev, s.data.accum, s.data.batch, s.data.seq_len + 1), s.precision)

  if s.pert_chunk != "auto":  # clamped as the step clamps it, so training reuses this compile
    chunk = min(s.pert_chunk, k_dev)
    return memory.ChunkChoice(chunk, plan_at(chunk), limit, "fixed")
  return memory.choose_pert_chunk(plan_at, k_dev, jax.default_backend(), limit,
                                  n_experts=n_dev, signs_together=base.spsa.signs_together,
                                  batch=s.data.batch)


def sharded_step(cfg, mesh, donate: bool = True):
  """`spsa.train_step` over the mesh (FSO: no collective; DDPP: one psum over "pert")."""
  return parallel.make_train_step(spsa.train_step, cfg, mesh, donate=donate)


def spsa_fields(s: lstm.Settings, step_config=lstm.step_config) -> dict:
  """What SOMA and its summed-loss control share: the step, its counts and its planner."""
  return dict(
      train_step=train_step,
      # SPEC 7: 2 A n_pert B T F per expert (two signs of every direction).
      ops_per_update=2 * s.n_pert * lstm.forward_ops(s),
      describe={"model": "lstm", "n_pert": s.n_pert,
                "directions_per_update": s.n_pert * s.data.accum, "gradient": "zero-order"},
      step_config=functools.partial(step_config, s),
      # planned on the method's own step config, the program training runs
      plan_chunk=functools.partial(plan_chunk, s, step_config=step_config),
      sharded_step=sharded_step)


def make(c: ml_collections.ConfigDict) -> Method:
  s = lstm.settings(c)
  return lstm.lstm_method(s, **spsa_fields(s))
