"""The training loop: SOMA recipe, metrics, checkpoints with exact resume (SPEC 3, 7).

`train(config, workdir)` is everything `experiments/train.py` does. Resuming is the same
call: the newest checkpoint in the workdir is restored (state and input iterator), and
the run continues bit-identically, because every random draw derives from (seed, step,
expert, accumulation index, direction) and the batches from (seed, expert, step).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from soma_jax import checkpoint as ckpt_lib
from soma_jax import config as config_lib
from soma_jax import evaluate as eval_lib
from soma_jax import metrics as metrics_lib
from soma_jax import model as model_lib
from soma_jax import spsa
from soma_jax.data import pipeline
from soma_jax.errors import UserError

PyTree = Any


def model_config(c: ml_collections.ConfigDict) -> model_lib.ModelConfig:
  return model_lib.ModelConfig(d_t=c.model.d_t, d_e=c.model.d_e, depth=c.model.depth,
                               shared_head=c.model.shared_head)


def step_config(c: ml_collections.ConfigDict) -> spsa.StepConfig:
  return spsa.StepConfig(
      model=model_config(c),
      spsa=spsa.SpsaConfig(n_pert=c.spsa.n_pert, accum=c.spsa.accum, probe=c.spsa.probe,
                           pert_chunk=c.spsa.pert_chunk),
      weight_decay=c.opt.weight_decay, train_head=c.opt.train_head, seed=c.seed)


def make_step(c: ml_collections.ConfigDict):
  """(jitted step(state, batch, expert_ids) -> (state, metrics), ops per update per expert).

  Ops follow SPEC 7: SPSA 2 A n_pert B T F; EGGROLL pop A B T F; BPTT 3 A B T F
  (forward plus a backward pass of about twice its cost).
  """
  from soma_jax import baselines, eggroll

  cfg = step_config(c)
  tokens = c.data.seq_len * c.spsa.batch * c.spsa.accum
  f = model_lib.flops_per_token(cfg.model)
  if c.method == "soma":
    return functools.partial(_train_step, cfg=cfg), 2 * c.spsa.n_pert * tokens * f
  if c.method == "bptt":
    step = jax.jit(baselines.bptt_train_step, static_argnames="cfg", donate_argnames="state")
    return functools.partial(step, cfg=cfg), 3 * tokens * f
  es = eggroll.EggrollConfig(pop=c.eggroll.pop, sigma=c.eggroll.sigma, rank=c.eggroll.rank,
                             pop_chunk=c.eggroll.pop_chunk)
  step = jax.jit(baselines.eggroll_train_step, static_argnames="cfg", donate_argnames="state")
  return (functools.partial(step, cfg=baselines.EggrollStepConfig(cfg, es)),
          c.eggroll.pop * tokens * f)


def plateau_config(c: ml_collections.ConfigDict) -> spsa.PlateauConfig:
  return spsa.PlateauConfig(patience=c.opt.patience, floor=c.opt.floor)


# ----------------------------------------------------------------------------- state


def initial_params(c: ml_collections.ConfigDict) -> tuple[PyTree, jax.Array]:
  """Bodies and head(s) of this job's experts: from the seed run, or a fresh init.

  A fresh init draws all N experts and keeps this job's slice, so a job training
  experts a:b starts exactly where the full job's experts a:b start.
  """
  a, b = config_lib.expert_range(c)
  cfg = model_config(c)
  if c.init_from:
    body, head = seed_params(c.init_from, cfg)
    body_N = jax.tree.map(lambda x: jnp.broadcast_to(x, (b - a,) + x.shape), body)
    head = head if cfg.shared_head else jnp.broadcast_to(head, (b - a,) + head.shape)
    return body_N, head
  body_N, head = model_lib.init_experts(jax.random.key(c.seed), cfg, c.n_experts)
  body_N = jax.tree.map(lambda x: x[a:b], body_N)
  return body_N, head if cfg.shared_head else head[a:b]


def seed_params(seed_workdir: str, cfg: model_lib.ModelConfig) -> tuple[PyTree, jax.Array]:
  """Expert 0's body and E from a seed run's newest checkpoint (SPEC 3.4 step 3)."""
  body_N, head, seed_cfg = restore_params(seed_workdir)
  theirs = model_config(seed_cfg)
  if (theirs.d_t, theirs.d_e, theirs.depth) != (cfg.d_t, cfg.d_e, cfg.depth):
    raise UserError(
        f"init_from={seed_workdir!r} has d_t={theirs.d_t}, d_e={theirs.d_e}, depth="
        f"{theirs.depth}; this run has d_t={cfg.d_t}, d_e={cfg.d_e}, depth={cfg.depth}; "
        "fix: train the seed at the same model size")
  body = jax.tree.map(lambda x: x[0], body_N)
  return body, head if theirs.shared_head else head[0]


def initial_state(c: ml_collections.ConfigDict) -> spsa.TrainState:
  body_N, head = initial_params(c)
  return spsa.init_state(body_N, head, c.opt.lr, c.spsa.eps, step_config(c))


def restore_params(workdir: str, step: int | None = None):
  """(body_N, head, config) from a training workdir's newest (or given) checkpoint."""
  _, state, _, c = restore_state(workdir, step)
  return state.body, state.head, c


def restore_state(workdir: str, step: int | None = None):
  """(step, TrainState, iterator state, config) of a workdir's newest (or given) checkpoint."""
  c = ckpt_lib.read_config(workdir)
  abstract = jax.eval_shape(lambda: initial_state(shapes_only(c)))
  ckpt = ckpt_lib.Checkpointer(workdir)
  try:
    if step is not None and step not in ckpt.steps():
      raise UserError(f"no checkpoint at step {step} in {workdir!r}; have {ckpt.steps()}")
    restored = ckpt.restore_latest(abstract, max_step=step)
  finally:
    ckpt.close()
  if restored is None:
    raise UserError(f"{workdir!r} has no checkpoint yet; fix: train first (experiments/train.py)")
  return (*restored, c)


def shapes_only(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(c.to_dict())
  c.init_from = ""  # shapes only; do not read the seed run again
  return c


# ----------------------------------------------------------------------------- loop

# Jitted once per process; the old state's buffers are donated to the new one.
_train_step = jax.jit(spsa.train_step, static_argnames="cfg", donate_argnames="state")
_val_losses = jax.jit(spsa.expert_losses, static_argnames="shared_head")
_plateau = jax.jit(spsa.plateau_update, static_argnames="cfg")


class _Stop:
  """SIGTERM / SIGINT ask the loop to checkpoint and return after the current update."""

  def __init__(self):
    self.signum = 0
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: no handlers, Ctrl-C raises as usual
        pass
    return self

  def _handle(self, signum, frame):
    if self.signum:  # a second signal: stop now
      raise KeyboardInterrupt
    self.signum = signum

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)


def pooled(c: ml_collections.ConfigDict) -> bool:
  """One expert on a clustered data dir reads all shards (seed run, monolithic controls)."""
  return c.n_experts == 1 and pipeline.load_manifest(c.data.dir)["num_clusters"] > 1


def _expert_val_windows(c, experts: range) -> np.ndarray:
  """[N, V, T + 1]: the same first V windows of each expert's 1% split at every eval."""
  per = [pipeline.expert_val_windows(c.data.dir, e, c.data.seq_len, pooled(c)) for e in experts]
  v = min([c.data.val_windows] + [w.shape[0] for w in per])
  return np.stack([w[:v] for w in per])


def _check_workdir(workdir: str) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, ".write_test")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise UserError(f"workdir {workdir!r} is not writable ({e.strerror}); "
                    "fix: choose a writable --workdir") from None


def train(c: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) the run in `workdir` to `c.steps`; returns a summary dict."""
  config_lib.validate(c)
  _check_workdir(workdir)
  if not c.data.dir:
    raise UserError("config.data.dir is empty; fix: --config.data.dir=DIR from "
                    "experiments/prepare_data.py")
  pipeline.check_data_dir(c.data.dir, c.n_experts)
  if c.init_from and not os.path.isdir(c.init_from):
    raise UserError(f"init_from={c.init_from!r} does not exist; fix: the seed run's workdir")
  ckpt_lib.write_config(workdir, c)
  a, b = config_lib.expert_range(c)
  experts = range(a, b)
  n_local = b - a
  step_cfg = step_config(c)

  ckpt = ckpt_lib.Checkpointer(workdir, keep=c.ckpt.keep)
  state = initial_state(c)
  mesh = _mesh(c, n_local)
  step_fn, ops_expert = make_step(c)
  if mesh is None:
    feed = list(experts)  # this process feeds every expert of the job
    expert_ids = jnp.arange(a, b, dtype=jnp.int32)
    to_global = jnp.asarray
  else:
    from soma_jax import parallel

    feed = [a + i for i in parallel.local_experts(n_local, mesh)]  # only this host's data
    expert_ids = parallel.expert_ids(n_local, mesh, first=a)
    to_global = functools.partial(parallel.global_batch, mesh=mesh)
    step_fn = parallel.make_train_step(step_cfg, mesh)
    state = parallel.put_state(state, mesh)
  data = pipeline.train_iterator(c.data.dir, feed, batch=c.spsa.batch, accum=c.spsa.accum,
                                 seq_len=c.data.seq_len, seed=c.seed, pooled=pooled(c))
  # Restoring onto the current layout: a checkpoint written on another device count
  # is resharded by orbax to the shardings of this abstract state.
  restored = ckpt.restore_latest(ckpt_lib.abstract_like(state))
  device_seconds = 0.0
  if restored is not None:
    start, state, data_state = restored
    data.set_state(data_state["iterator"])
    device_seconds = float(data_state.get("device_seconds", 0.0))
    logging.info("resumed from step %d in %s", start, workdir)
  start = int(state.step)

  val_windows = to_global(_expert_val_windows(c, feed))
  ops_step = ops_expert * n_local
  tokens_step = ops_step // model_lib.flops_per_token(step_cfg.model)
  n_devices = 1 if mesh is None else mesh.size

  writer = metrics_lib.MetricWriter(workdir, start_step=start)
  if start == 0:
    writer.hparams(json.loads(c.to_json()))
  progress = metrics_lib.Progress(c.steps, start)
  if start >= c.steps:
    progress.message(f"{workdir} is already trained to step {start} (steps={c.steps}); "
                     "raise --config.steps to continue")
  progress.message(
      f"training experts {a}..{b - 1} of {c.n_experts} ({model_lib.body_params(step_cfg.model):,}"
      f" params each) from step {start} to {c.steps} on {jax.devices()[0].platform}")

  def save(step: int) -> None:
    ckpt.save(step, state, {"iterator": data.get_state(), "device_seconds": device_seconds})

  last_val = None
  skipped_seen = None  # per-expert skip counters at the last log, to name new skips
  t_log, steps_since_log = time.perf_counter(), 0
  status = "done"
  with _Stop() as stop:
    for step in range(start, c.steps):
      batch = next(data)
      state, m = step_fn(state, to_global(batch), expert_ids)
      steps_since_log += 1
      done = step + 1
      record = None
      if done % c.log_every == 0 or done == c.steps:
        m_host = _to_host(m)
        now = time.perf_counter()
        step_seconds = (now - t_log) / steps_since_log
        device_seconds += (now - t_log) * n_devices
        t_log, steps_since_log = now, 0
        record = {
            "loss": m_host["loss"], "lr": m_host["lr"], "eps": m_host["eps"],
            "step_seconds": step_seconds,
            "tokens_per_second": tokens_step / step_seconds,
            "ops": ops_step * done, "device_seconds": device_seconds,
            "skipped": m_host["skipped"],
        }
        skipped_seen = _report_skips(done, m_host["skipped"], skipped_seen, experts, progress)
      if done % c.eval_every == 0 or done == c.steps:
        val = _val_losses(state.body, state.head, val_windows, shared_head=step_cfg.model.shared_head)
        state = state.replace(sched=_plateau(state.sched, val, done, cfg=plateau_config(c)))
        last_val = np.asarray(_to_host(val)).tolist()
        record = (record or {}) | {"val_loss": last_val}
      ensemble_due = done == c.steps or (c.ensemble_eval_every
                                         and done % c.ensemble_eval_every == 0)
      if ensemble_due and n_local == c.n_experts and jax.process_count() == 1:
        ens = ensemble_validation(c, state)
        if ens is not None:
          record = (record or {}) | {"ensemble_val_loss": ens}
      if record is not None:
        writer.write(done, record)
        if "loss" in record:
          progress.update(done, record["loss"])
      if done % c.ckpt_every == 0 or done == c.steps or stop.signum:
        save(done)
      if stop.signum:
        status = "interrupted"
        progress.message(f"interrupted by signal {stop.signum} at step {done}; checkpoint "
                         "saved; run the same command again to resume")
        break
  ckpt.close()
  writer.close()
  summary = {"status": status, "step": int(state.step), "signal": stop.signum,
             "val_loss": last_val, "skipped": np.asarray(_to_host(state.skipped)).tolist()}
  if status == "done":
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=1)
  return summary


def _mesh(c: ml_collections.ConfigDict, n_local: int):
  """The device mesh for mesh.expert x mesh.pert, or None for a plain one-device run."""
  e, p = (str(c.mesh.expert), str(c.mesh.pert))
  if e == "1" and p == "1" and jax.process_count() == 1:
    return None
  if c.method != "soma":
    raise UserError(f"mesh.expert / mesh.pert shard the SOMA step; method={c.method} runs on "
                    "one device: use mesh.expert=1 mesh.pert=1 (or independent experts=a:b jobs)")
  from soma_jax import parallel

  as_arg = lambda v: "auto" if v in ("auto", "0") else int(v)
  try:
    return parallel.make_mesh(as_arg(e), int(p), n_experts=n_local)
  except ValueError as err:
    raise UserError(f"mesh.expert={e!r} / mesh.pert={p!r}: {err}; use integers or auto") from None


def _to_host(tree):
  """Metrics as numpy on this host; gathers across processes in a multi-host run."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils

  return multihost_utils.process_allgather(tree, tiled=True)


def _report_skips(step: int, skipped_N, seen, experts: range,
                  progress: metrics_lib.Progress):
  """Names the experts that skipped an update (non-finite loss) since the last log.

  Read from the cumulative counters at log steps, so the loop never syncs for it.
  """
  skipped_N = np.asarray(skipped_N)
  new = skipped_N - (0 if seen is None else seen)
  if new.any():
    bad = [experts[i] for i in np.nonzero(new)[0]]
    progress.message(f"up to step {step}: non-finite loss in experts {bad}; they skipped "
                     "those updates, the others continued")
  return skipped_N


def ensemble_validation(c: ml_collections.ConfigDict, state: spsa.TrainState,
                        max_windows: int = 256) -> float | None:
  """Routed top-k ensemble loss on the data dir's ensemble-validation windows."""
  from soma_jax.router import Router

  windows, _ = pipeline.eval_split(c.data.dir, "ensemble_val")
  if windows.shape[0] == 0:
    return None
  router = Router.load(os.path.join(c.data.dir, "router.npz"))
  return eval_lib.ensemble_loss(state.body, state.head, windows[:max_windows], router,
                                min(4, c.n_experts), c.model.shared_head)
