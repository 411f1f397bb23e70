"""A resolved run placed on this machine: the `Plan` the training loop reads.

`place(spec)` takes a `spec.RunSpec` (what the run is) and adds where and how it runs: the
device layout and mesh, the pert_chunk planned for this device, the data opened (its
manifest hash, each expert's validation windows, and the router with the
ensemble-validation windows, all read here, once), the run's initial state and input
iterator, and the step on its devices. `place_step(spec)` is the step alone, for the
benchmarks. Nothing below reads the raw config.
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
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from soma_jax import budget as budget_lib
from soma_jax import checkpoint as ckpt_lib
from soma_jax import host_devices, memory, parallel, runs, train_state
from soma_jax import metrics as metrics_lib
from soma_jax import spec as spec_lib
from soma_jax.data import pipeline
from soma_jax.data.router import Router
from soma_jax.errors import UserError
from soma_jax.methods import Method

ENSEMBLE_WINDOWS = 256  # ensemble-validation windows scored at each ensemble evaluation


@dataclasses.dataclass(frozen=True)
class Ensemble:
  """What the routed ensemble validation reads, opened once."""

  router: Router
  windows: np.ndarray  # [V, 1025] the first ENSEMBLE_WINDOWS ensemble-validation windows
  top_k: int


@dataclasses.dataclass(frozen=True)
class Placed:
  """A run's step on this machine: layout, mesh, chunk and the step config it compiles."""

  layout: parallel.Layout
  mesh: Any  # jax.sharding.Mesh, or None on one device
  chunk: memory.ChunkChoice
  plan_seconds: float  # compiling the step to plan its chunk (counted as compile time)
  plan_compiles: int  # XLA compilations that planning made (0 on a persistent-cache hit)
  step_cfg: Hashable  # the method's static step settings

  @property
  def n_devices(self) -> int:
    return 1 if self.mesh is None else self.mesh.size


@dataclasses.dataclass(frozen=True)
class Plan:
  """A `RunSpec` placed (`place`): everything a training run reads.

  The arrays (`state`, `val_windows`) are placed on the run's devices; `batches` is the
  run's input iterator (a plan trains one run). `state` is built when first read: a resume
  restores onto `abstract_state` and reads no seed (`init_from`).
  """

  spec: spec_lib.RunSpec
  placed: Placed
  data_sha256: str | None  # manifest.json's, recorded in config_history.jsonl
  val_windows: jax.Array  # [N, V, T + 1] each expert's validation windows, every evaluation
  ensemble: Ensemble | None  # None where this job does not score the ensemble
  abstract_state: Any  # the initial state's shapes, dtypes and shardings (no seed read)
  start: Callable[[], train_state.TrainState]  # builds `state`, reading the seed if any
  step_fn: Callable  # (state, batch, expert_ids) -> (state, metrics), on the mesh if any
  expert_ids: jax.Array
  to_global: Callable  # host batch -> device (global) array
  batches: Any  # the input iterator: next() -> host batch; get_state / set_state
  start_line: str  # the start-up line, START standing for the step the run starts from

  @property
  def method(self) -> Method:
    return self.spec.method

  @functools.cached_property
  def state(self) -> train_state.TrainState:
    """The initial state (fresh, warm or continued) on the run's devices."""
    return self.start()


def place(spec: spec_lib.RunSpec) -> Plan:
  """The spec on this machine's devices, its data opened (see the module docstring)."""
  if not spec.data_dir:
    raise UserError("config.data.dir is empty; fix: --config.data.dir=DIR from "
                    "experiments/prepare_data.py")
  manifest, ensemble = _open_data(spec)
  placed = place_step(spec)
  n_local = len(spec.experts)
  devices = _devices(spec.method, placed, spec.experts.start, n_local,
                     jax.random.key(spec.seed))
  pooled = spec.n_experts == 1 and manifest["num_clusters"] > 1
  val = _expert_val_windows(spec, devices["feed"], pooled)
  return Plan(
      spec=spec, placed=placed, data_sha256=ckpt_lib.manifest_sha256(spec.data_dir),
      val_windows=devices["to_global"](val),
      ensemble=ensemble if n_local == spec.n_experts and jax.process_count() == 1 else None,
      abstract_state=_abstract_state(spec, placed.mesh),
      start=functools.partial(_start_state, spec, placed.mesh),
      step_fn=devices["step_fn"], expert_ids=devices["expert_ids"],
      to_global=devices["to_global"], batches=spec.method.train_data(devices["feed"], pooled),
      start_line=_start_line(spec, placed))


def place_step(spec: spec_lib.RunSpec) -> Placed:
  """The layout and mesh for this job's experts on this process's devices, the planned
  pert_chunk (compiling the one-device step, which training then reuses) and the step
  config at that chunk."""
  n_local = len(spec.experts)
  lay = layout(spec, n_local)
  mesh = None
  if (lay.expert, lay.pert) != (1, 1) or jax.process_count() > 1:
    mesh = parallel.make_mesh(lay.expert, lay.pert, n_experts=n_local)
  t0, compiled = time.perf_counter(), budget_lib.compiles()
  chunk = choose_chunk(spec.method, n_local, mesh)
  memory.check_fits(chunk, f"method={spec.method.name}, {n_local} experts on this process",
                    jax.default_backend())
  plan_seconds, plan_compiles = time.perf_counter() - t0, budget_lib.compiles() - compiled
  # The seed comes as data (`_devices` binds its key): one program for every seed of a shape.
  return Placed(lay, mesh, chunk, plan_seconds, plan_compiles,
                spec.method.step_config(chunk.chunk, seed_as_data=True))


def choose_chunk(method: Method, n_local: int, mesh=None) -> memory.ChunkChoice:
  """The method's pert_chunk plan for this device, or chunk 1 where it has none."""
  if method.plan_chunk is None:
    return memory.ChunkChoice(1, -1, memory.device_limit_bytes(), f"method={method.name}: unused")
  return method.plan_chunk(n_local, mesh)


def _open_data(spec: spec_lib.RunSpec) -> tuple[dict, Ensemble | None]:
  """(manifest, what the ensemble validation reads): every file checked, opened now, not
  after training."""
  manifest = pipeline.check_data_dir(spec.data_dir, spec.n_experts)  # every file's SHA-256
  router = Router.load(os.path.join(spec.data_dir, "router.npz"))
  if router.num_clusters != manifest["num_clusters"]:
    raise UserError(f"{spec.data_dir!r}: router.npz has {router.num_clusters} clusters, "
                    f"manifest.json {manifest['num_clusters']}; fix: re-run "
                    "experiments/prepare_data.py")
  windows, _ = pipeline.eval_split(spec.data_dir, "ensemble_val")
  if spec.cadence.ensemble_eval_every < 0 or windows.shape[0] == 0:
    return manifest, None
  return manifest, Ensemble(router, windows[:ENSEMBLE_WINDOWS], min(4, spec.n_experts))


def layout(spec: spec_lib.RunSpec, n_local: int) -> parallel.Layout:
  """mesh.expert x mesh.pert for a spec's `n_local` experts on this process's devices."""
  m = spec.mesh
  return parallel.resolve_layout(
      m.expert, m.pert, n_experts=n_local, n_pert=m.n_pert, n_devices=jax.device_count(),
      chunk=m.chunk, can_shard=spec.method.sharded_step is not None, method=spec.method.name,
      backend=jax.default_backend(), processes=jax.process_count())


def _start_state(spec: spec_lib.RunSpec, mesh) -> train_state.TrainState:
  """The initial state on the run's devices; a warm start's seed read now, and the line
  naming which of its experts each expert starts from printed."""
  seed = runs.read_seed(spec) if spec.init_from else None
  if seed is not None:
    metrics_lib.Progress(spec.cadence.steps, 0).message(seed.describe(spec.init_state))
  return _on_devices(runs.initial_state(spec, seed), mesh)


def _abstract_state(spec: spec_lib.RunSpec, mesh) -> train_state.TrainState:
  """The initial state's shapes, dtypes and shardings, seed unread (a warm state has the
  fresh one's shapes): what a resume restores onto."""
  shapes = jax.eval_shape(lambda: runs.initial_state(spec.without_seed()))
  shardings = (jax.tree.map(lambda _: parallel.one_device(), shapes) if mesh is None
               else parallel.state_sharding(shapes, mesh))
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                      shardings)


def _on_devices(state: train_state.TrainState, mesh) -> train_state.TrainState:
  if mesh is None:
    # Every leaf committed to the device: a warm start's leaves come from a restored seed run
    # (committed), a fresh init's not, and the step's outputs are; a mixture compiled the
    # step once per pattern (3 times for a warm start, its compiles counted as training).
    return jax.device_put(state, parallel.one_device())
  return parallel.put_state(state, mesh)


def _devices(method: Method, placed: Placed, first: int, n_local: int, key) -> dict:
  """The step and expert ids on the run's devices, the experts this process feeds and how a
  host batch becomes a device array."""
  mesh, step_cfg = placed.mesh, placed.step_cfg
  if mesh is None:
    return {"step_fn": functools.partial(method.train_step, cfg=step_cfg,
                                         key=jax.device_put(key, parallel.one_device())),
            "expert_ids": jnp.arange(first, first + n_local, dtype=jnp.int32),
            "feed": list(range(first, first + n_local)),  # this process feeds every expert
            "to_global": functools.partial(jax.tree.map, jnp.asarray)}
  return {"step_fn": _with_key(method.sharded_step(step_cfg, mesh),
                               jax.device_put(key, NamedSharding(mesh, P()))),
          "expert_ids": parallel.expert_ids(n_local, mesh, first=first),
          "feed": [first + i for i in parallel.local_experts(n_local, mesh)],  # this host's
          "to_global": functools.partial(parallel.global_batch, mesh=mesh)}


def _with_key(sharded: Callable, key: jax.Array) -> Callable:
  """`step(state, batch, ids)` of a sharded step that takes the seed's key last."""
  return lambda state, batch, ids: sharded(state, batch, ids, key)


def _expert_val_windows(spec: spec_lib.RunSpec, experts: list[int], pooled: bool) -> np.ndarray:
  """[N, V, T + 1]: the same first V windows of each expert's 1% split at every eval."""
  per = [pipeline.expert_val_windows(spec.data_dir, e, spec.seq_len, pooled) for e in experts]
  v = min([spec.val_windows] + [w.shape[0] for w in per])
  return np.stack([w[:v] for w in per])


def _start_line(spec: spec_lib.RunSpec, placed: Placed) -> str:
  """The start-up line, with START for the step it starts from: experts, sizes, steps (and
  budget), devices, chunk, precision."""
  cfg = placed.step_cfg
  signs = (f"signs {cfg.spsa.signs}; forward {cfg.spsa.forward}; "
           if spec.method.plan_chunk else "")  # an SPSA step's (the methods with a chunk to plan)
  b = spec.budget
  budget = f"; until {b.amount:g} training {b.unit.replace('_', '-')}" if b.amount else ""
  a, z = spec.experts.start, spec.experts.stop
  return (f"training experts {a}..{z - 1} of {spec.n_experts} ({spec.method.body_params:,} "
          f"params each) from step START to {spec.cadence.steps}{budget} on "
          f"{_devices_line(placed.layout)}; {placed.chunk.describe()}; {signs}matmul "
          f"precision {spec.precision}")


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
