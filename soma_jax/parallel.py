"""Experts over devices and hosts (FSO) and split directions for one model (DDPP), SPEC 3.5.

The mesh has two axes, ("expert", "pert"):

* "expert" splits the expert axis N: each device trains N / E experts with
  `spsa.train_step`, unchanged. With pert = 1 this is FSO, fully sharded
  optimisation: the compiled step contains no collective at all.
* "pert" splits each accumulation batch's n_pert directions: device p evaluates the
  directions p K/P .. (p + 1) K/P - 1 (the same global direction indices, hence the same
  probes, as a one-device run), then ONE all-reduce sums the partial estimates and losses
  of all pert devices and every replica applies the identical Adam update. This is DDPP,
  used for the monolith (N = 1) or any expert split over P > 1 devices.

Multi-host: call `initialize_distributed` first; each process then feeds only the
experts in `local_experts(n, mesh)` through `global_batch`.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from soma_jax import memory, train_state
from soma_jax import model as model_lib
from soma_jax.errors import UserError

PyTree = Any
AXES = ("expert", "pert")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
               "ragged-all-to-all", "collective-broadcast")


# ------------------------------------------------------------------------------ mesh


def mesh_shape(expert: int | str, pert: int, n_devices: int,
               n_experts: int | None = None) -> tuple[int, int]:
  """Validated (E, P); expert 0 or "auto" means all devices / P. Raises UserError."""
  if isinstance(pert, str) or pert < 1:
    raise UserError(f"mesh.pert={pert!r} must be an integer >= 1 (1 = FSO, > 1 = DDPP)")
  if expert in (0, "0", "auto"):
    if n_devices % pert:
      raise UserError(f"mesh.pert={pert} does not divide the {n_devices} devices; "
                      f"use a divisor of {n_devices} or set mesh.expert explicitly")
    expert = n_devices // pert
  try:
    expert = int(expert)
  except ValueError as e:
    raise UserError(f"mesh.expert={expert!r} must be an integer or 'auto'") from e
  if expert < 1:
    raise UserError(f"mesh.expert={expert} must be >= 1 (or 0 / 'auto' for all devices)")
  if expert * pert > n_devices:
    raise UserError(f"mesh.expert={expert} x mesh.pert={pert} = {expert * pert} devices asked, "
                    f"but only {n_devices} exist; lower mesh.expert or mesh.pert so "
                    f"their product is <= {n_devices}")
  if n_experts is not None and n_experts % expert:
    raise UserError(f"N={n_experts} experts are not divisible by mesh.expert={expert} (E); "
                    f"use an E that divides N (e.g. mesh.expert={np.gcd(n_experts, expert)}) "
                    f"or a multiple of E experts")
  return expert, pert


class Layout(NamedTuple):
  """A resolved mesh.expert x mesh.pert and the start-up line's words for it."""

  expert: int
  pert: int
  why: str


def _splits(n_pert: int, chunk: int | None, p: int) -> bool:
  """Whether P pert devices each get whole chunks of n_pert / P directions."""
  return n_pert % p == 0 and (chunk is None or (n_pert // p) % min(chunk, n_pert // p) == 0)


def auto_layout(n_experts: int, n_pert: int, n_devices: int, chunk: int | None = None
                ) -> Layout:
  """mesh.expert = mesh.pert = "auto" on D devices: experts over all D when D divides N
  (FSO, no collective), else directions over all D when they split (DDPP, one all-reduce),
  else both (the most devices, then the most expert groups); `chunk` a fixed pert_chunk."""
  d = n_devices
  if n_experts % d == 0:
    return Layout(d, 1, f"experts over {d} devices (FSO)")
  if _splits(n_pert, chunk, d):
    return Layout(1, d, f"the {n_pert} directions over {d} devices (DDPP)")
  fits = [(e * p, e, p) for e in range(1, d + 1) for p in range(1, d // e + 1)
          if n_experts % e == 0 and _splits(n_pert, chunk, p)]
  used, e, p = max(fits)
  if used == 1:
    return Layout(1, 1, f"one device: N={n_experts} experts and {n_pert} directions do not "
                  f"split over {d} devices")
  idle = f", {d - used} of {d} devices idle" if used < d else ""
  return Layout(e, p, f"experts over {e} x directions over {p} devices (FSO x DDPP{idle})")


def resolve_layout(expert: str, pert: str, *, n_experts: int, n_pert: int, n_devices: int,
                   chunk: int | None, can_shard: bool, method: str, backend: str,
                   processes: int = 1) -> Layout:
  """mesh.expert / mesh.pert of a config ("auto" or integers) as (E, P) on this machine.

  Both "auto" (the default): on a CPU, `auto_layout` over one host device per core; a
  method that cannot shard its step runs on one device. Elsewhere (a GPU) one device, as an
  explicit 1 x 1, unless the job spans processes (then every device, as it must).
  """
  auto = lambda v: v in ("auto", "0")
  if auto(expert) and auto(pert):
    if not can_shard:
      return Layout(1, 1, f"one device: method={method} does not shard its step"
                    + (f" ({n_devices - 1} of {n_devices} devices idle)" if n_devices > 1 else ""))
    if backend != "cpu" and processes == 1:
      return Layout(1, 1, "one device (mesh auto on a GPU; set mesh.expert / mesh.pert to shard)")
    if n_devices == 1:
      return Layout(1, 1, "one device")
    return auto_layout(n_experts, n_pert, n_devices, chunk)
  try:
    e = None if auto(expert) else int(expert)
    p = None if auto(pert) else int(pert)
  except ValueError:
    raise UserError(f"mesh.expert={expert!r} / mesh.pert={pert!r} must be integers or auto") \
        from None
  if p is None:  # mesh.expert given: the directions take the devices left per expert group
    free = max(1, n_devices // max(e, 1))
    p = max(q for q in range(1, free + 1) if free % q == 0 and _splits(n_pert, chunk, q))
  e, p = mesh_shape("auto" if e is None else e, p, n_devices, n_experts)
  if (e, p) != (1, 1) and not can_shard:
    raise UserError(f"mesh.expert / mesh.pert shard the SOMA step; method={method} runs on one "
                    "device: use mesh.expert=auto mesh.pert=auto (or 1 and 1, or independent "
                    "experts=a:b jobs)")
  kind = {(True, True): "one device", (True, False): "FSO", (False, True): "DDPP"}.get(
      (p == 1, e == 1), "FSO x DDPP")
  return Layout(e, p, f"mesh.expert={e} x mesh.pert={p} ({kind})")


def make_mesh(expert: int | str, pert: int = 1, n_experts: int | None = None) -> Mesh:
  """A ("expert", "pert") mesh of E x P devices over all hosts; validated (UserError)."""
  e, p = mesh_shape(expert, pert, jax.device_count(), n_experts)
  if jax.process_count() > 1 and e * p != jax.device_count():
    raise UserError(f"multi-host runs must use every device: mesh.expert x mesh.pert = {e * p} "
                    f"but {jax.process_count()} processes hold {jax.device_count()} devices; "
                    f"set mesh.expert=auto or make the product {jax.device_count()}")
  # "pert" is the minor axis, so a DDPP all-reduce stays among neighbouring (same-host)
  # devices where it can. Auto axes: arrays outside the step (evaluation, schedule
  # updates) get ordinary GSPMD propagation, and the step is manual anyway (shard_map).
  return jax.make_mesh((e, p), AXES, axis_types=(AxisType.Auto, AxisType.Auto))


# ------------------------------------------------------------------------- shardings


def _check_divisible(n: int, mesh: Mesh) -> None:
  if n % mesh.shape["expert"]:
    raise UserError(f"N={n} experts are not divisible by mesh.expert={mesh.shape['expert']} "
                    f"(E); use an E that divides N")


def state_specs(state: PyTree) -> PyTree:
  """PartitionSpecs for a (possibly abstract) `train_state.TrainState`, one per leaf."""
  # Per-expert leaves (bodies, their Adam moments and counts, per-expert heads, the
  # plateau schedule, skip counters) carry a leading N axis: split it on "expert", so each
  # device holds only its own experts, and replicate it over "pert" (every DDPP replica
  # applies the same update to the same parameters).
  expert = lambda x: P("expert") if x.ndim else P()
  # `step` is a scalar every device needs (it keys every probe): replicated. A shared
  # head [V, d_E] is frozen and read by every expert: replicated. A per-expert head
  # [N, V, d_E] is split like the bodies.
  head = P("expert") if state.head.ndim == 3 else P()
  return state.replace(
      step=P(), body=jax.tree.map(expert, state.body), head=head,
      opt=jax.tree.map(expert, state.opt), head_opt=jax.tree.map(expert, state.head_opt),
      sched=jax.tree.map(expert, state.sched), skipped=expert(state.skipped))


def state_sharding(state: PyTree, mesh: Mesh) -> PyTree:
  """NamedShardings for a (possibly abstract) TrainState on `mesh`; any E dividing N."""
  _check_divisible(state.skipped.shape[0], mesh)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), state_specs(state),
                      is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches [N, A, B, T+1]: experts split on "expert"; every pert device sees the whole
  batch (all directions of an accumulation batch use that batch, SPEC 3.1)."""
  return NamedSharding(mesh, P("expert"))


def one_device() -> jax.sharding.Sharding:
  """The sharding of a one-device run's state: committed to this process's first device.
  The step is planned (compiled) and run with it, so both are one program."""
  return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def abstract_state(cfg: Any, n: int) -> PyTree:
  """A TrainState of ShapeDtypeStructs for N experts (for shardings and restores)."""
  def init():
    body_N, head = model_lib.init_experts(jax.random.key(0), cfg.model, n)
    return train_state.init_state(body_N, head, 1.0, 1.0, cfg.weight_decay, cfg.train_head)
  return jax.eval_shape(init)


# ----------------------------------------------------------------------------- step


def planned_step_bytes(train_step: Callable, cfg: Any, batch_shape: tuple[int, ...],
                       precision: str) -> int:
  """XLA's buffer plan of a one-device `train_step(state, batch, ids, cfg=cfg)` for a batch of
  `batch_shape` [N, A, B, T + 1], compiled on abstract inputs (nothing allocated or run). The
  inputs carry the sharding training's have (`one_device`), and a seedless `cfg` takes its key
  as data as training's does, so training reuses this compile."""
  one = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one_device())  # noqa: E731
  n = batch_shape[0]
  state = jax.tree.map(one, abstract_state(cfg, n))
  batch = jax.ShapeDtypeStruct(batch_shape, jnp.uint8)
  ids = jax.ShapeDtypeStruct((n,), jnp.int32)
  key = {"key": one(jax.random.key(0))} if cfg.seed is None else {}
  with memory.matmul_precision(precision):
    return memory.planned_bytes(train_step.lower(state, batch, ids, cfg=cfg, **key).compile())


def _step_specs(train_step: Callable, cfg: Any, key: tuple) -> tuple[PyTree, PyTree]:
  """The state's and the metrics' partition specs. The spec trees depend only on the config
  (shared head, trained head), not on N; metrics are per expert ([N], split like the
  experts) or scalars (replicated)."""
  abstract = abstract_state(cfg, 1)
  ids = jax.ShapeDtypeStruct((1,), jnp.int32)
  batch = jax.ShapeDtypeStruct((1, cfg.spsa.accum, 1, 2), jnp.uint8)
  _, metrics = jax.eval_shape(lambda s, b, i, *k: train_step(s, b, i, cfg, key=k[0] if k else None),
                              abstract, batch, ids, *key)
  return state_specs(abstract), jax.tree.map(lambda x: P("expert") if x.ndim else P(), metrics)


@functools.lru_cache(maxsize=64)
def make_train_step(train_step: Callable, cfg: Any, mesh: Mesh, donate: bool = True):
  """The jitted, sharded `step(state, batch_NxAxBxT1, expert_ids_N) -> (state, metrics)` of
  a one-device `train_step(state, batch, ids, cfg, directions=, combine=, key=)` (SOMA's
  `spsa.train_step`; this module imports no estimator). Where `cfg.seed` is None the step
  takes the seed's key as data, `step(state, batch, ids, key)` (replicated), so one program
  serves every seed; built once per (step, settings, mesh, donation) in a process.

  FSO (pert = 1): each device runs `spsa.train_step` on its local experts; nothing is
  exchanged. DDPP (pert > 1): each pert device evaluates K/P directions of every
  accumulation batch, one `psum` over "pert" of a single flat vector (partial estimates
  and loss sums) completes the estimate, then every replica takes the same Adam step.
  The state is donated (unless `donate=False`: benchmarks run one state again and again).
  Results match a one-device `spsa.train_step` up to float
  summation order.
  """
  n_pert_dev = mesh.shape["pert"]
  k = cfg.spsa.n_pert // n_pert_dev
  if cfg.spsa.n_pert % n_pert_dev or k % min(cfg.spsa.chunk, k):
    raise UserError(f"spsa.n_pert={cfg.spsa.n_pert} must split evenly over mesh.pert="
                    f"{n_pert_dev} devices into whole chunks of spsa.pert_chunk="
                    f"{cfg.spsa.pert_chunk}; use n_pert a multiple of mesh.pert x pert_chunk")
  key = (jax.random.key(0),) if cfg.seed is None else ()  # the seed's key as data: replicated
  specs, metric_specs = _step_specs(train_step, cfg, key)

  def combine(g_N, loss_N):
    # The one collective of a DDPP step: all partial sums in one flat vector, one psum.
    flat, unravel = ravel_pytree((g_N, loss_N))
    return unravel(jax.lax.psum(flat, "pert"))

  def local_step(state, batch, expert_ids, *key):
    key = key[0] if key else None
    if n_pert_dev == 1:
      return train_step(state, batch, expert_ids, cfg, key=key)
    start = jax.lax.axis_index("pert") * k
    return train_step(state, batch, expert_ids, cfg, directions=(start, k),
                      combine=combine, key=key)

  # check_vma=False: the model's and the estimator's scans start from fresh zeros, which
  # the varying-axes checker would reject as carries; replication over "pert" of the
  # outputs holds by construction (identical inputs after the psum on every replica).
  sharded = jax.shard_map(local_step, mesh=mesh,
                          in_specs=(specs, P("expert"), P("expert")) + (P(),) * len(key),
                          out_specs=(specs, metric_specs), check_vma=False)
  named = lambda tree: jax.tree.map(lambda s: NamedSharding(mesh, s), tree,
                                    is_leaf=lambda x: isinstance(x, P))
  state_sh, batch_sh = named(specs), batch_sharding(mesh)

  def step(state, batch_NxAxBxT1, expert_ids_N, *key):
    return sharded(state, batch_NxAxBxT1, expert_ids_N, *key)

  # Explicit shardings: inputs already laid out this way (global_batch, expert_ids,
  # state_sharding) pass through without copies; the outputs keep the state's layout so
  # the next step needs no resharding; donation reuses the old state's buffers.
  key_sh = (NamedSharding(mesh, P()),) * len(key)
  return jax.jit(step, in_shardings=(state_sh, batch_sh, batch_sh) + key_sh,
                 out_shardings=(state_sh, named(metric_specs)),
                 donate_argnames=("state",) if donate else ())


# ---------------------------------------------------------------------------- inputs


def local_experts(n: int, mesh: Mesh) -> range:
  """The experts (indices into this job's N) whose data this process feeds."""
  _check_divisible(n, mesh)
  index_map = batch_sharding(mesh).addressable_devices_indices_map((n,))
  starts = sorted({idx[0].indices(n)[:2] for idx in index_map.values()})
  lo, hi = starts[0][0], starts[-1][1]
  if sum(b - a for a, b in starts) != hi - lo:
    raise UserError(f"this process's devices hold non-contiguous experts {starts}; "
                    "order the devices so each host owns one block of the expert axis")
  return range(lo, hi)


def global_batch(local_NxAxBxT1: np.ndarray, mesh: Mesh) -> jax.Array:
  """The global batch from this process's experts' data (`local_experts` rows)."""
  return jax.make_array_from_process_local_data(batch_sharding(mesh), local_NxAxBxT1)


def expert_ids(n: int, mesh: Mesh, first: int = 0) -> jax.Array:
  """Global expert ids first..first+n-1 (they key the probes), sharded like the batch."""
  _check_divisible(n, mesh)
  ids = np.arange(first, first + n, dtype=np.int32)
  return jax.make_array_from_callback((n,), batch_sharding(mesh), lambda idx: ids[idx])


def put_state(state: PyTree, mesh: Mesh) -> PyTree:
  """Places a host-complete TrainState (identical on every process) on the mesh."""
  def put(x, sharding):
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
  return jax.tree.map(put, state, state_sharding(state, mesh))


# ----------------------------------------------------------------------- distributed


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, *,
                           local_device_ids: list[int] | None = None,
                           timeout_s: int = 300) -> None:
  """`jax.distributed.initialize`, auto-detected on SLURM / Open MPI, else from the args.

  Raises UserError for incomplete or inconsistent arguments and for a process count that
  differs from the launcher's or from the one that joined. If fewer processes than
  `num_processes` ever connect, JAX's coordination service aborts the process after
  `timeout_s` (a fatal error in the C++ runtime, not a Python exception).
  """
  given = [x is not None for x in (coordinator, num_processes, process_id)]
  if any(given) and not all(given):
    raise UserError("pass all of --coordinator=HOST:PORT, --num_processes and --process_id, "
                    "or none of them on SLURM / Open MPI (auto-detected)")
  if num_processes is not None:
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise UserError(f"process_id={process_id} must be in [0, num_processes={num_processes})")
    if ":" not in coordinator:
      raise UserError(f"coordinator={coordinator!r} must be HOST:PORT, e.g. 10.0.0.1:12345")
    for var in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
      launched = os.environ.get(var)
      if launched and launched.isdigit() and int(launched) != num_processes:
        raise UserError(f"--num_processes={num_processes} but the launcher started {launched} "
                        f"processes ({var}); drop --num_processes or make them equal")
  try:
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
        local_device_ids=local_device_ids, initialization_timeout=timeout_s)
  except (ValueError, TypeError) as e:
    raise UserError(f"jax.distributed.initialize failed ({e}); outside SLURM / Open MPI pass "
                    "--coordinator=HOST:PORT --num_processes=N --process_id=I") from e
  except RuntimeError as e:  # e.g. the other processes never joined before the timeout
    raise UserError(f"jax.distributed.initialize failed ({e}); check that every process got "
                    "the same --coordinator and --num_processes and a distinct --process_id") \
        from e
  if num_processes is not None and jax.process_count() != num_processes:
    raise UserError(f"--num_processes={num_processes} but {jax.process_count()} processes "
                    "joined; launch exactly that many processes")


# ------------------------------------------------------------------------------- HLO


_COLLECTIVE_RE = re.compile(
    r"(?<![\w.%-])(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True)) + r")(-start)?\(")


def count_collectives(compiled_hlo_text: str) -> dict[str, int]:
  """Collective instructions per kind (async pairs counted once) and their "total"."""
  counts = dict.fromkeys(COLLECTIVES, 0)
  for m in _COLLECTIVE_RE.finditer(compiled_hlo_text):
    counts[m.group(1)] += 1
  counts["total"] = sum(counts.values())
  return counts


def step_hlo(step, *args) -> str:
  """The optimized (compiled) HLO text of a jitted step for these arguments."""
  return step.lower(*args).compile().as_text()
