"""A training run resolved once: the typed `Plan` every stage below the entry point reads.

`resolve(c)` turns a raw config into a frozen plan: the method and its final step config,
the experts of this job, the device layout and mesh, the pert_chunk planned for this device,
the data (its manifest hash, each expert's validation windows, and the router with the
ensemble-validation windows, all opened here, once), the cadences, the budget and the
run's initial state and input iterator. The raw config stays in `Plan.config` only to be
written to and compared with a workdir's config.json. Nothing below reads it again.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from soma_jax import checkpoint as ckpt_lib
from soma_jax import config as config_lib
from soma_jax import host_devices, memory, methods, parallel, runs, train_state
from soma_jax.data import pipeline
from soma_jax.data.router import Router
from soma_jax.errors import UserError

ENSEMBLE_WINDOWS = 256  # ensemble-validation windows scored at each ensemble evaluation


@dataclasses.dataclass(frozen=True)
class Cadence:
  """When the loop logs, validates, checkpoints, and where it stops (config's fields)."""

  steps: int  # the step to train to (with a budget: the most it may reach)
  log_every: int
  eval_every: int
  ensemble_eval_every: int  # 0 = at the end only, -1 = never
  ckpt_every: int
  keep: int  # newest checkpoints kept


@dataclasses.dataclass(frozen=True)
class BudgetSpec:
  """`budget` in `budget_unit` (0 = none), with a checkpoint after each 1/checkpoints."""

  unit: str
  amount: float
  checkpoints: int


@dataclasses.dataclass(frozen=True)
class Ensemble:
  """What the routed ensemble validation reads, opened once."""

  router: Router
  windows: np.ndarray  # [V, 1025] the first ENSEMBLE_WINDOWS ensemble-validation windows
  top_k: int


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything a training run is, resolved from its config by `resolve`.

  The arrays (`state`, `val_windows`) are placed on the run's devices; `batches` is the
  run's input iterator (a plan trains one run).
  """

  config: ml_collections.ConfigDict  # only to write / compare config.json
  method: methods.Method
  step_cfg: Hashable  # the method's static step settings
  n_experts: int  # N of the whole run
  experts: range  # this job's experts (global ids)
  layout: parallel.Layout
  n_devices: int  # devices the step runs on
  chunk: memory.ChunkChoice
  plan_seconds: float  # compiling the step to plan its chunk (counted as compile time)
  ops_step: int  # operations of one update of the job's experts (SPEC 7)
  tokens_step: int
  cadence: Cadence
  budget: BudgetSpec
  plateau: train_state.PlateauConfig
  lr: float  # initial lr and eps (what resume_overrides of opt.lr / spsa.eps set)
  eps: float
  precision: str
  shared_head: bool
  data_dir: str
  data_sha256: str | None  # manifest.json's, recorded in config_history.jsonl
  val_windows: jax.Array  # [N, V, T + 1] each expert's validation windows, every evaluation
  ensemble: Ensemble | None  # None where this job does not score the ensemble
  state: train_state.TrainState  # the initial state (fresh, warm or continued)
  step_fn: Callable  # (state, batch, expert_ids) -> (state, metrics), on the mesh if any
  expert_ids: jax.Array
  to_global: Callable  # host batch -> device (global) array
  batches: Any  # the input iterator: next() -> host batch; get_state / set_state
  init_from: str  # the seed workdir of a warm start ("" for none)
  start_line: str  # the start-up line, START standing for the step the run starts from


def resolve(c: ml_collections.ConfigDict) -> Plan:
  """The config, validated and converted once (see the module docstring)."""
  methods.validate(c)
  if not c.data.dir:
    raise UserError("config.data.dir is empty; fix: --config.data.dir=DIR from "
                    "experiments/prepare_data.py")
  c = absolute_data_dir(c)
  method = methods.get(c)
  manifest, ensemble = _open_data(c)
  a, b = config_lib.expert_range(c)
  n_local = b - a
  layout = _layout(c, method, n_local)
  mesh = None
  if (layout.expert, layout.pert) != (1, 1) or jax.process_count() > 1:
    mesh = parallel.make_mesh(layout.expert, layout.pert, n_experts=n_local)
  t0 = time.perf_counter()
  chunk = methods.choose_chunk(c, n_local, mesh)  # compiles the step (reused on one device)
  plan_seconds = time.perf_counter() - t0
  step_cfg = method.step_config(c, chunk.chunk)
  devices = _devices(method, step_cfg, runs.initial_state(c), mesh, a, n_local)
  pooled = c.n_experts == 1 and manifest["num_clusters"] > 1
  val = _expert_val_windows(c, devices["feed"], pooled)
  ops_step = method.ops_per_update(c) * n_local
  return Plan(
      config=c, method=method, step_cfg=step_cfg, n_experts=c.n_experts, experts=range(a, b),
      layout=layout, n_devices=1 if mesh is None else mesh.size, chunk=chunk,
      plan_seconds=plan_seconds, ops_step=ops_step,
      tokens_step=ops_step // method.flops_per_token(c),
      cadence=Cadence(c.steps, c.log_every, c.eval_every, c.ensemble_eval_every, c.ckpt_every,
                      c.ckpt.keep),
      budget=BudgetSpec(c.get("budget_unit", "device_seconds"), float(c.get("budget", 0.0)),
                        int(c.get("budget_checkpoints", 1))),
      plateau=train_state.PlateauConfig(patience=c.opt.patience, floor=c.opt.floor),
      lr=c.opt.lr, eps=c.spsa.eps, precision=c.precision, shared_head=c.model.shared_head,
      data_dir=c.data.dir, data_sha256=ckpt_lib.manifest_sha256(c.data.dir),
      val_windows=devices["to_global"](val),
      ensemble=ensemble if n_local == c.n_experts and jax.process_count() == 1 else None,
      state=devices["state"], step_fn=devices["step_fn"], expert_ids=devices["expert_ids"],
      to_global=devices["to_global"], batches=method.train_data(c, devices["feed"], pooled),
      init_from=c.init_from, start_line=_start_line(c, method, step_cfg, chunk, layout, a, b))


def absolute_data_dir(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config (a copy where it changes) whose data.dir is absolute: what a run's config.json
  holds, so it names the data from anywhere."""
  if not c.data.dir or os.path.isabs(c.data.dir):
    return c
  c = ml_collections.ConfigDict(c.to_dict())
  c.data.dir = os.path.abspath(c.data.dir)
  return c


def _open_data(c: ml_collections.ConfigDict) -> tuple[dict, Ensemble | None]:
  """(manifest, what the ensemble validation reads): every file checked, opened now, not
  after training."""
  manifest = pipeline.check_data_dir(c.data.dir, c.n_experts)  # every file's SHA-256
  router = Router.load(os.path.join(c.data.dir, "router.npz"))
  if router.num_clusters != manifest["num_clusters"]:
    raise UserError(f"{c.data.dir!r}: router.npz has {router.num_clusters} clusters, manifest.json "
                    f"{manifest['num_clusters']}; fix: re-run experiments/prepare_data.py")
  windows, _ = pipeline.eval_split(c.data.dir, "ensemble_val")
  if c.init_from and not os.path.isdir(c.init_from):
    raise UserError(f"init_from={c.init_from!r} does not exist; fix: the seed run's workdir")
  if c.ensemble_eval_every < 0 or windows.shape[0] == 0:
    return manifest, None
  return manifest, Ensemble(router, windows[:ENSEMBLE_WINDOWS], min(4, c.n_experts))


def layout(c: ml_collections.ConfigDict, n_local: int) -> parallel.Layout:
  """mesh.expert x mesh.pert for a config's `n_local` experts on this process's devices."""
  return _layout(c, methods.get(c), n_local)


def _layout(c: ml_collections.ConfigDict, method: methods.Method, n_local: int) -> parallel.Layout:
  chunk = config_lib.pert_chunk(c) if method.plan_chunk else "auto"
  return parallel.resolve_layout(
      str(c.mesh.expert), str(c.mesh.pert), n_experts=n_local, n_pert=c.spsa.n_pert,
      n_devices=jax.device_count(), chunk=None if chunk == "auto" else chunk,
      can_shard=method.sharded_step is not None, method=c.method,
      backend=jax.default_backend(), processes=jax.process_count())


def _devices(method: methods.Method, step_cfg: Hashable, state, mesh, first: int,
             n_local: int) -> dict:
  """The state, step and expert ids on the run's devices, the experts this process feeds
  and how a host batch becomes a device array."""
  if mesh is None:
    # Every leaf committed to the device: a warm start's leaves come from a restored seed run
    # (committed), a fresh init's not, and the step's outputs are; a mixture compiled the
    # step once per pattern (3 times for a warm start, its compiles counted as training).
    return {"state": jax.device_put(state, parallel.one_device()),
            "step_fn": functools.partial(method.train_step, cfg=step_cfg),
            "expert_ids": jnp.arange(first, first + n_local, dtype=jnp.int32),
            "feed": list(range(first, first + n_local)),  # this process feeds every expert
            "to_global": functools.partial(jax.tree.map, jnp.asarray)}
  return {"state": parallel.put_state(state, mesh),
          "step_fn": method.sharded_step(step_cfg, mesh),
          "expert_ids": parallel.expert_ids(n_local, mesh, first=first),
          "feed": [first + i for i in parallel.local_experts(n_local, mesh)],  # this host's
          "to_global": functools.partial(parallel.global_batch, mesh=mesh)}


def _expert_val_windows(c: ml_collections.ConfigDict, experts: list[int], pooled: bool
                        ) -> np.ndarray:
  """[N, V, T + 1]: the same first V windows of each expert's 1% split at every eval."""
  per = [pipeline.expert_val_windows(c.data.dir, e, c.data.seq_len, pooled) for e in experts]
  v = min([c.data.val_windows] + [w.shape[0] for w in per])
  return np.stack([w[:v] for w in per])


def _start_line(c, method, step_cfg, chunk, placed, a: int, b: int) -> str:
  """The start-up line, with START for the step it starts from: experts, sizes, steps (and
  budget), devices, chunk, precision."""
  signs = (f"signs {step_cfg.spsa.signs}; forward {step_cfg.spsa.forward}; "
           if method.plan_chunk else "")  # an SPSA step's (the methods with a chunk to plan)
  budget = (f"; until {c.budget:g} training {c.budget_unit.replace('_', '-')}"
            if c.get("budget", 0.0) else "")
  return (f"training experts {a}..{b - 1} of {c.n_experts} ({method.body_params(c):,} params "
          f"each) from step START to {c.steps}{budget} on {_devices_line(placed)}; "
          f"{chunk.describe()}; {signs}matmul precision {c.precision}")


def _devices_line(placed: parallel.Layout) -> str:
  """'2 cpu devices (one per usable core), experts over 2 devices (FSO)' and the like."""
  d, platform = jax.device_count(), jax.devices()[0].platform
  line = f"{d} {platform} device{'s' if d > 1 else ''}"
  if platform == "cpu":
    how = host_devices.chosen_by or "JAX's default"
    cores = host_devices.usable_cores()
    line += (" (one per usable core)" if how == "one per usable core" and cores == d
             else f" ({how}; {cores} usable core{'s' if cores > 1 else ''})")
  return f"{line}, {placed.why}"
