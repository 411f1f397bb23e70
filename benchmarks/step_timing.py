"""Timing and planned memory of the SOMA step, shared by the benchmarks/ CLIs (spsa_step,
paper_shapes, step_sweep, plan_memory, profile_step).

See spsa_step.py for what each figure means. No flags here: importable by every CLI and
by the tests (a module defining absl flags could not be imported beside another).
"""


import dataclasses
import functools
import inspect
import itertools
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import config as config_lib
from soma_jax import memory, parallel, runs, sizing, spsa, train_state
from soma_jax import model as model_lib
from soma_jax import plan as plan_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError


def signs_values(values: list[str]) -> tuple[str, ...]:
  """A --signs list flag: spsa.signs settings to compare, or a UserError."""
  allowed = [s for s in config_lib.SIGNS if s != "auto"]
  if not values or not set(values) <= set(allowed):
    raise UserError(f"--signs={','.join(values)} must name {' and/or '.join(allowed)}")
  return tuple(values)


def timeit(fn, reps: int) -> float:
  return interleaved({"fn": fn}, reps)["fn"]


def check_reps(reps: int) -> int:
  """--reps, refused below 1 before anything is built or compiled."""
  if reps < 1:
    raise UserError(f"--reps={reps} must be >= 1 (timed rounds; the median is reported)")
  return reps


def interleaved(fns: dict, reps: int, warm: bool = True) -> dict:
  """Median seconds of each function, timed in `reps` rounds that run every function once.

  Interleaving makes ratios between the functions robust to the machine's drift (another
  job, clock changes) in a way that timing one function's reps after another's is not.
  """
  check_reps(reps)
  for fn in fns.values() if warm else ():  # warm-up (and compile)
    jax.block_until_ready(fn())
  times = {name: [] for name in fns}
  for _ in range(reps):
    for name, fn in fns.items():
      t = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - t)
  return {name: statistics.median(ts) for name, ts in times.items()}


def matmul_peak_gflops(n: int = 2048, reps: int = 5) -> float:
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  return 2 * n**3 / timeit(lambda: f(a), reps) / 1e9


@functools.cache
def undonated(train_step):
  """A method's jitted step (`Method.train_step`) jitted again without donating its state:
  the benchmarks time one state again and again."""
  return jax.jit(inspect.unwrap(train_step), static_argnames="cfg")


@dataclasses.dataclass(frozen=True)
class StepInputs:
  """A run's initial state, random bytes [N, A, B, T + 1] and expert ids: what every
  benchmark of the step compiles and runs it on."""

  spec: spec_lib.RunSpec
  state: train_state.TrainState
  batch: jax.Array
  ids: jax.Array

  def compile(self, cfg: spsa.StepConfig):
    """The one-device step compiled at the run's matmul precision (no run)."""
    with memory.matmul_precision(self.spec.precision):
      step = undonated(self.spec.method.train_step)
      return step.lower(self.state, self.batch, self.ids, cfg=cfg).compile()

  def runner(self, compiled):
    return lambda: compiled(self.state, self.batch, self.ids)[0].body

  @property
  def tokens(self) -> int:
    """Perturbed tokens per step: 2 A K B T N."""
    s = self.spec
    return 2 * s.accum * s.mesh.n_pert * s.batch * s.seq_len * s.n_experts


def step_inputs(spec: spec_lib.RunSpec) -> StepInputs:
  n, a, b, t = spec.n_experts, spec.accum, spec.batch, spec.seq_len
  batch = np.random.default_rng(0).integers(0, 256, (n, a, b, t + 1), dtype=np.uint8)
  return StepInputs(spec, runs.initial_state(spec), jnp.asarray(batch),
                    jnp.arange(n, dtype=jnp.int32))


@dataclasses.dataclass(frozen=True)
class LayoutStep:
  """The step on the mesh training would use for this run (`plan.place_step`), not
  donating, compiled, with its inputs laid out as training lays them out."""

  layout: parallel.Layout
  choice: memory.ChunkChoice
  run: object  # () -> (state, metrics)

  @staticmethod
  def build(inputs: StepInputs, placed: plan_lib.Placed) -> "LayoutStep | None":
    """None when training would run on one device (the plain step is the layout's)."""
    mesh, spec = placed.mesh, inputs.spec
    if mesh is None:
      return None
    # training's step config with its seed static (training gives it as data: the same work)
    step = spec.method.sharded_step(spec.method.step_config(placed.chunk.chunk), mesh,
                                    donate=False)
    state = parallel.put_state(inputs.state, mesh)
    batch = parallel.global_batch(np.asarray(inputs.batch), mesh)
    ids = parallel.expert_ids(spec.n_experts, mesh)
    with memory.matmul_precision(spec.precision):
      compiled = step.lower(state, batch, ids).compile()
    return LayoutStep(placed.layout, placed.chunk, lambda: compiled(state, batch, ids))


def one_device_chunk(spec: spec_lib.RunSpec, placed: plan_lib.Placed) -> memory.ChunkChoice:
  """The pert_chunk planned for the plain one-device step: the placed one where training
  runs on one device, else planned again without the mesh."""
  if placed.mesh is None:
    return placed.chunk
  return plan_lib.choose_chunk(spec.method, spec.n_experts)


def losses_agree(one_device, layout) -> dict:
  """The two layouts' per-expert losses after one update from the same state, and their
  largest relative difference (float32 rounding: about 1e-6)."""
  a = np.asarray(jax.device_get(one_device[1]["loss"]), np.float64)
  b = np.asarray(jax.device_get(layout[1]["loss"]), np.float64)
  return {"loss_one_device": a.tolist(), "loss_layout": b.tolist(),
          "loss_max_relative_difference": float(np.max(np.abs(a - b) / np.abs(a)))}


def describe(spec: spec_lib.RunSpec, **config) -> dict:
  """The fields every benchmark record starts with: the shapes, the backend, the device."""
  return {"config": {"n_experts": spec.n_experts, "d_t": spec.method.model.d_t,
                     "n_pert": spec.mesh.n_pert, "batch": spec.batch, "accum": spec.accum,
                     "seq_len": spec.seq_len, "precision": spec.precision, **config},
          "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
          "devices": jax.device_count()}


def ideal_forward(cfg: spsa.StepConfig, together: int = 1):
  """Plain forwards over 2 A K B windows per expert, `together` x B windows at a time.

  together = 1: the 2 A n_pert plain forward passes of B windows that an update replaces
  (`efficiency`); together = 2 C: plain forwards as wide as a chunk's both signs, a stronger
  ideal that shares one weight matrix over 2 C B rows (`efficiency_vs_batched`). Each
  piece's windows are the accumulation batch's, shifted by the piece index so no piece is
  loop-invariant (XLA would hoist it and time nothing).
  """
  k, a = cfg.spsa.n_pert, cfg.spsa.accum
  per_batch = 2 * k // together  # pieces per accumulation batch
  loss = functools.partial(model_lib.streamed_loss, time_block=cfg.spsa.time_block,
                           unroll=cfg.spsa.unroll)
  head_axis = None if cfg.model.shared_head else 0

  @jax.jit
  def fwd(body_N, head, batch_NxAxBxT1):
    def piece(i):
      w = batch_NxAxBxT1[:, i // per_batch]
      w = jnp.tile(w + i.astype(w.dtype), (1, together, 1))  # [N, together B, T + 1]
      return jax.vmap(loss, in_axes=(0, head_axis, 0))(body_N, head, w)
    return jax.lax.map(piece, jnp.arange(a * per_batch))
  return fwd


def estimate_only(cfg: spsa.StepConfig):
  """The step's SPSA estimate without the update: (state, batch, ids) -> (g_hat, mean loss).
  Both are returned, so XLA cannot drop the sum over directions as dead code."""
  @jax.jit
  def est(state, batch_NxAxBxT1, ids_N):
    return spsa.estimate(state.body, state.head, batch_NxAxBxT1, state.sched.eps, state.step,
                         ids_N, jax.random.key(cfg.seed), cfg.spsa,
                         shared_head=cfg.model.shared_head)
  return est


def benchmark(spec: spec_lib.RunSpec, reps: int = 5, loop: bool = True,
              ideals: bool = True) -> dict:
  """The figures above; `ideals=False` times the step alone (paper_shapes.py's rows).

  `step_seconds` and the rates are the step in the device layout training uses
  (`plan.place_step`: on a CPU one host device per core under the entry points); when that
  is not one device, the plain one-device step is timed in the same rounds
  (`one_device_step_seconds`, `speedup_vs_one_device`) and the ideals' ratios
  (`efficiency`, ...) read the one-device step, a one-device program like them.
  """
  load = os.getloadavg()[0]
  inputs = step_inputs(spec)
  state, batch = inputs.state, inputs.batch
  placed = plan_lib.place_step(spec)
  choice = one_device_chunk(spec, placed)
  cfg = spec.method.step_config(choice.chunk)
  compiled = inputs.compile(cfg)
  sharded = LayoutStep.build(inputs, placed)
  fns = {"one_device_step": inputs.runner(compiled)}
  if sharded is not None:
    fns["step"] = lambda: sharded.run()[0].body
  if ideals:  # timed in the same rounds as the step, so their ratios are robust
    fwd, wide = ideal_forward(cfg), ideal_forward(cfg, together=2 * cfg.spsa.chunk)
    fns["forward"] = lambda: fwd(state.body, state.head, batch)
    fns["batched_forward"] = lambda: wide(state.body, state.head, batch)
    est = estimate_only(cfg)
    fns["estimate"] = lambda: est(state, batch, inputs.ids)
  with memory.matmul_precision(spec.precision):
    seconds = interleaved(fns, reps)
  one_s = seconds["one_device_step"]
  step_s, tokens = seconds.get("step", one_s), inputs.tokens
  lay = placed.layout
  out = describe(spec, depth=cfg.model.depth, pert_chunk=placed.chunk.chunk,
                 pert_chunk_setting=str(spec.mesh.chunk or "auto"),
                 time_block=cfg.spsa.time_block, unroll=cfg.spsa.unroll, probe=cfg.spsa.probe,
                 signs=cfg.spsa.signs, forward=cfg.spsa.forward,
                 dot_algorithm=memory.dot_algorithm(spec.precision),
                 params_per_expert=sizing.body_params(cfg.model))
  out.update(
      load_average_1m_at_start=load, reps=reps, step_seconds=step_s,
      layout={"mesh_expert": lay.expert, "mesh_pert": lay.pert, "what": lay.why},
      perturbed_tokens_per_second=tokens / step_s,
      achieved_gflops=tokens * sizing.flops_per_token(cfg.model) / step_s / 1e9,
      one_device_step_seconds=one_s, one_device_pert_chunk=choice.chunk,
      one_device_perturbed_tokens_per_second=tokens / one_s, speedup_vs_one_device=one_s / step_s,
      # The one-device step's plan (not donating its state; training's donating step may
      # plan less).
      peak_memory_bytes=memory.planned_bytes(compiled),
      device_limit_bytes=choice.limit_bytes,
  )
  if sharded is not None:
    with memory.matmul_precision(spec.precision):
      out.update(losses_agree(compiled(state, batch, inputs.ids), sharded.run()))
  out.update(_allocator_peak(ideals))
  if ideals:
    out.update(_ideal_figures(spec, inputs, cfg, seconds, out, step_s, loop, reps))
  return out


def _allocator_peak(ideals: bool) -> dict:
  """The allocator's peak so far, where the device reports one: the step's alone without
  the ideals (paper_shapes.py's rows, one process each), else the step's and the ideals'."""
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" not in stats:
    return {}
  key = "process_peak_bytes_in_use" if ideals else "device_peak_bytes_in_use"
  return {key: int(stats["peak_bytes_in_use"])}


def _ideal_figures(spec: spec_lib.RunSpec, inputs: StepInputs, cfg, seconds: dict, out: dict,
                   step_s: float, loop: bool, reps: int) -> dict:
  """The step's ratios to its ideals (measured in the same rounds as the step), the matmul
  rate, the memory at 2 n_pert and, with `loop`, the per-direction loop."""
  one_s, tokens = seconds["one_device_step"], inputs.tokens
  fwd_s, wide_s, est_s = seconds["forward"], seconds["batched_forward"], seconds["estimate"]
  new = {}
  with memory.matmul_precision(spec.precision):
    new["matmul_peak_gflops"] = matmul_peak_gflops(4096 if jax.default_backend() == "gpu" else 2048)
  new.update(forward_seconds=fwd_s, forward_tokens_per_second=tokens / fwd_s,
             efficiency=fwd_s / one_s, batched_forward_seconds=wide_s,
             efficiency_vs_batched=wide_s / one_s,
             # The SPSA estimate alone (probes, perturbed forwards, the sum over directions):
             # what the step adds beyond it is the update (Adam; the delta-rule head's own
             # unperturbed forward when it trains the head).
             estimate_seconds=est_s, estimate_efficiency=fwd_s / est_s)
  new["fraction_of_matmul_peak"] = out["achieved_gflops"] / new["matmul_peak_gflops"]
  # Peak memory scales with pert_chunk, not n_pert: the same step at 2 n_pert.
  cfg2 = dataclasses.replace(cfg, spsa=dataclasses.replace(cfg.spsa, n_pert=2 * cfg.spsa.n_pert))
  new["peak_memory_bytes_2x_n_pert"] = memory.planned_bytes(inputs.compile(cfg2))
  new["memory_ratio_2x_n_pert"] = new["peak_memory_bytes_2x_n_pert"] / out["peak_memory_bytes"]
  if loop:
    with memory.matmul_precision(spec.precision):
      new["loop_seconds"] = naive_loop_seconds(inputs.state, inputs.batch, inputs.ids, cfg,
                                               min(reps, 3))
    new["speedup_vs_loop"] = new["loop_seconds"] / step_s
  return new


def naive_loop_seconds(state, batch, ids, cfg: spsa.StepConfig, reps: int) -> float:
  """What the step replaces: one jitted call per direction and accumulation batch."""
  one = spsa.SpsaConfig(n_pert=1, accum=1, probe=cfg.spsa.probe, pert_chunk=1,
                        time_block=cfg.spsa.time_block, unroll=cfg.spsa.unroll,
                        signs_together=cfg.spsa.signs_together, forward=cfg.spsa.forward)
  base_key = jax.random.key(cfg.seed)

  @jax.jit
  def direction(body, head, batch_a, eps, a, j):
    # One direction per call: its own key, the same estimator code, no vmap over K.
    g, loss = spsa.estimate(body, head, batch_a[:, None], eps, state.step, ids,
                            jax.random.fold_in(jax.random.fold_in(base_key, a), j), one,
                            shared_head=cfg.model.shared_head)
    return g, loss

  tx = train_state.adam(cfg.weight_decay)
  update = jax.jit(functools.partial(train_state.apply_updates, tx))

  def run():
    g_sum = None
    for a in range(cfg.spsa.accum):
      for j in range(cfg.spsa.n_pert):
        g, _ = direction(state.body, state.head, batch[:, a], state.sched.eps, a, j)
        g_sum = g if g_sum is None else jax.tree.map(jnp.add, g_sum, g)
    n = cfg.spsa.accum * cfg.spsa.n_pert
    g_sum = jax.tree.map(lambda x: x / n, g_sum)
    ok = jnp.ones(state.sched.lr.shape, bool)
    return update(state.body, state.opt, g_sum, state.sched.lr, ok)[0]

  return timeit(run, reps)


def sweep(spec: spec_lib.RunSpec, chunks: list[int], blocks: list[int], reps: int,
          signs: tuple[str, ...] = ("together",)) -> dict:
  """step_sweep.py's table: every dividing (pert_chunk, time_block, spsa.signs), timed in
  the same rounds."""
  inputs = step_inputs(spec)
  k = spec.mesh.n_pert
  rows, fns = {}, {}
  skipped = [f"pert_chunk={chunk} does not divide n_pert={k}" for chunk in chunks if k % chunk]
  limit = memory.device_limit_bytes()
  for chunk, block, sign in itertools.product([ch for ch in chunks if k % ch == 0], blocks,
                                              signs):
    cfg = spec.method.step_config(chunk)
    cfg = dataclasses.replace(cfg, spsa=dataclasses.replace(
        cfg.spsa, time_block=block, signs_together=sign == "together"))
    name = f"pert_chunk={chunk},time_block={block},signs={sign}"
    compiled = inputs.compile(cfg)
    plan = memory.planned_bytes(compiled)
    if limit and plan > memory.MARGIN * limit:  # would not fit: "auto" would not pick it
      skipped.append(f"{name} plans {plan / 1e9:.1f} GB, over {memory.MARGIN} x the "
                     f"device's {limit / 1e9:.1f} GB")
      continue
    try:
      with memory.matmul_precision(spec.precision):
        jax.block_until_ready(inputs.runner(compiled)())
    except jax.errors.JaxRuntimeError as e:  # out of memory despite the plan
      skipped.append(f"{name} failed: {str(e).splitlines()[0][:200]}")
      continue
    fns[name] = inputs.runner(compiled)
    rows[name] = {"pert_chunk": chunk, "time_block": block, "signs": sign,
                  "planned_bytes": plan}
  if not fns:
    raise UserError("no combination to time: " + "; ".join(skipped))
  with memory.matmul_precision(spec.precision):
    seconds = interleaved(fns, reps, warm=False)  # each ran once above, the out-of-memory probe
  best = min(seconds.values())
  for name, row in rows.items():
    row.update(step_seconds=seconds[name],
               perturbed_tokens_per_second=inputs.tokens / seconds[name],
               relative_to_fastest=seconds[name] / best)
  return describe(spec) | {
      "reps": reps, "auto_pert_chunk": plan_lib.choose_chunk(spec.method, spec.n_experts).chunk,
      "auto_signs": spec.method.step_config().spsa.signs,
      "rows": sorted(rows.values(), key=lambda r: r["step_seconds"]), "skipped": skipped}


def planned_bytes(spec: spec_lib.RunSpec, cfg: spsa.StepConfig) -> int:
  """XLA's buffer plan of the run's one-device step at `cfg` (`parallel.planned_step_bytes`,
  as `plan_chunk` plans a chunk for a device's limit)."""
  return parallel.planned_step_bytes(
      spec.method.train_step, cfg, (spec.n_experts, spec.accum, spec.batch, spec.seq_len + 1),
      spec.precision)


def plans(spec: spec_lib.RunSpec, chunks: list[int], signs: tuple[str, ...]) -> dict:
  """plan_memory.py's table: one row per dividing pert_chunk x signs, XLA's planned bytes."""
  if spec.method.plan_chunk is None:
    raise UserError(f"method={spec.method.name}: only the SOMA step has a pert_chunk to plan")
  k = spec.mesh.n_pert
  skipped = [f"pert_chunk={chunk} does not divide n_pert={k}" for chunk in chunks if k % chunk]
  rows = []
  for chunk, sign in itertools.product([ch for ch in chunks if k % ch == 0], signs):
    cfg = spec.method.step_config(chunk)
    cfg = dataclasses.replace(cfg, spsa=dataclasses.replace(
        cfg.spsa, signs_together=sign == "together"))
    rows.append({"pert_chunk": chunk, "signs": sign, "planned_bytes": planned_bytes(spec, cfg)})
  if not rows:
    raise UserError("nothing to plan: " + "; ".join(skipped))
  return describe(spec, time_block=spec.method.step_config().spsa.time_block) | {
      "device_limit_bytes": memory.device_limit_bytes(), "rows": rows, "skipped": skipped}
