"""A run's states for every tool: its initial state, and a workdir's checkpoints restored.

Beside `checkpoint` (the files) and above `methods` (what a state holds): training starts
from `initial_state`; evaluation, generation, merging, the studies and the benchmarks read
a run back with `restore_state` / `restore_params`, whatever its method.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from soma_jax import checkpoint as ckpt_lib
from soma_jax import spec as spec_lib
from soma_jax import train_state
from soma_jax.errors import UserError

PyTree = Any


def initial_params(spec: spec_lib.RunSpec) -> tuple[PyTree, jax.Array]:
  """Bodies and head(s) of this job's experts: warm from spec.init_from's newest checkpoint
  (SPEC 3.4; LSTM and GRU methods alike), or the method's fresh init."""
  seed = restore_params(spec.init_from) if spec.init_from else None
  if seed is not None:  # a GRU seeds a GRU, an LSTM an LSTM (the methods' model families)
    ours, theirs = spec.method, seed[2]
    if ours.family != theirs.family:
      raise UserError(f"init_from={spec.init_from!r} is a {theirs.family} run (method="
                      f"{theirs.name}); method={ours.name} trains a {ours.family}: fix: a seed "
                      "of the same model")
  return spec.method.init_params(seed)


def initial_state(spec: spec_lib.RunSpec) -> train_state.TrainState:
  """The TrainState a run starts from (every method's: Adam of the bodies, and of the heads
  where opt.train_head). With `init_state` (and `init_from`) the seed run's state goes on:
  see `continued`."""
  body_N, head = initial_params(spec)
  n = jax.tree.leaves(body_N)[0].shape[0]
  state = train_state.init_state(body_N, head, spec.lr, spec.eps, spec.weight_decay,
                                 spec.train_head, spec.method.init_carry(n))
  if spec.init_from and spec.init_state:
    return continued(state, spec.init_from)
  return state


def continued(fresh: train_state.TrainState, init_from: str) -> train_state.TrainState:
  """`fresh` (this run's initial state, warm from the seed's parameters) with the rest of
  the seed run's newest state: every expert takes the seed's Adam moments and count, its
  plateau state (lr and eps set to this config's) and its step counter (SPEC 9.6: the
  compared phase continues the seed run)."""
  _, seed, _, _ = restore_state(init_from)
  n = fresh.skipped.shape[0]
  every = lambda x: jnp.broadcast_to(x[0], (n,) + x.shape[1:])  # the seed's expert 0
  take = lambda ours, theirs, what: _same_tree(ours, theirs, what, init_from) and jax.tree.map(
      every, theirs)
  sched = jax.tree.map(every, seed.sched).replace(lr=fresh.sched.lr, eps=fresh.sched.eps)
  head_opt = take(fresh.head_opt, seed.head_opt, "head optimizer") if fresh.head_opt != () else ()
  return fresh.replace(step=seed.step, opt=take(fresh.opt, seed.opt, "optimizer"),
                       head_opt=head_opt, sched=sched)


def _same_tree(ours, theirs, what: str, where: str) -> bool:
  if jax.tree.structure(ours) != jax.tree.structure(theirs) or any(
      a.shape[1:] != b.shape[1:] for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs))):
    raise UserError(f"init_from={where!r}: its {what} state does not fit this run's (another "
                    "method or optimizer); fix: init_state=False, or a seed of this method")
  return True


def read_spec(workdir: str) -> spec_lib.RunSpec:
  """The resolved spec of a training workdir's config.json."""
  return spec_lib.resolve(ckpt_lib.read_config(workdir))


def restore_state(workdir: str, step: int | None = None):
  """(step, TrainState, iterator state, RunSpec) of a workdir's newest (or given) checkpoint."""
  spec = read_spec(workdir)
  # Onto this process's first device, whatever layout saved it: a run trained on several
  # (CPU host) devices restores in a one-device tool, and the other way round.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          jax.eval_shape(lambda: initial_state(spec.without_seed())))
  ckpt = ckpt_lib.Checkpointer(workdir)
  try:
    if step is not None and step not in ckpt.steps():
      raise UserError(f"no checkpoint at step {step} in {workdir!r}; have {ckpt.steps()}")
    restored = ckpt.restore_latest(abstract, max_step=step)
  finally:
    ckpt.close()
  if restored is None:
    raise UserError(f"{workdir!r} has no checkpoint yet; fix: train first (experiments/train.py)")
  return (*restored, spec)


def restore_params(workdir: str, step: int | None = None):
  """(body_N, head, Method) from a training workdir's newest (or given) checkpoint."""
  _, state, _, spec = restore_state(workdir, step)
  return state.body, state.head, spec.method
