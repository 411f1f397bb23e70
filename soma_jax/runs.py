"""A run's states for every tool: its initial state, and a workdir's checkpoints restored.

Beside `checkpoint` (the files) and above `methods` (what a state holds): training starts
from `initial_state`; evaluation, generation, merging, the studies and the benchmarks read
a run back with `restore_state` / `restore_params`, whatever its method.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from soma_jax import checkpoint as ckpt_lib
from soma_jax import methods, train_state
from soma_jax.errors import UserError

PyTree = Any


def initial_params(c: ml_collections.ConfigDict) -> tuple[PyTree, jax.Array]:
  """Bodies and head(s) of this job's experts: warm from c.init_from's newest checkpoint
  (SPEC 3.4; LSTM and GRU methods alike), or the method's fresh init."""
  seed = restore_params(c.init_from) if c.init_from else None
  if seed is not None:  # a GRU seeds a GRU, an LSTM an LSTM (the methods' model families)
    ours, theirs = (methods.get(x).family for x in (c, seed[2]))
    if ours != theirs:
      raise UserError(f"init_from={c.init_from!r} is a {theirs} run (method={seed[2].method}); "
                      f"method={c.method} trains a {ours}: fix: a seed of the same model")
  return methods.get(c).init_params(c, seed)


def initial_state(c: ml_collections.ConfigDict) -> train_state.TrainState:
  """The TrainState a run starts from (every method's: Adam of the bodies, and of the heads
  where opt.train_head). With `init_state` (and `init_from`) the seed run's state goes on:
  see `continued`."""
  body_N, head = initial_params(c)
  method = methods.get(c)
  n = jax.tree.leaves(body_N)[0].shape[0]
  state = train_state.init_state(body_N, head, c.opt.lr, c.spsa.eps, c.opt.weight_decay,
                                 c.opt.train_head, method.init_carry(c, n))
  if c.init_from and c.get("init_state", False):
    return continued(state, c)
  return state


def continued(fresh: train_state.TrainState, c: ml_collections.ConfigDict) -> train_state.TrainState:
  """`fresh` (this run's initial state, warm from the seed's parameters) with the rest of
  the seed run's newest state: every expert takes the seed's Adam moments and count, its
  plateau state (lr and eps set to this config's) and its step counter (SPEC 9.6: the
  compared phase continues the seed run)."""
  _, seed, _, _ = restore_state(c.init_from)
  n = fresh.skipped.shape[0]
  every = lambda x: jnp.broadcast_to(x[0], (n,) + x.shape[1:])  # the seed's expert 0
  take = lambda ours, theirs, what: _same_tree(ours, theirs, what, c.init_from) and jax.tree.map(
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


def shapes_only(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of the config that builds the same shapes without reading the seed run again."""
  c = ml_collections.ConfigDict(c.to_dict())
  c.init_from = ""
  return c


def restore_state(workdir: str, step: int | None = None):
  """(step, TrainState, iterator state, config) of a workdir's newest (or given) checkpoint."""
  c = ckpt_lib.read_config(workdir)
  # Onto this process's first device, whatever layout saved it: a run trained on several
  # (CPU host) devices restores in a one-device tool, and the other way round.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          jax.eval_shape(lambda: initial_state(shapes_only(c))))
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


def restore_params(workdir: str, step: int | None = None):
  """(body_N, head, config) from a training workdir's newest (or given) checkpoint."""
  _, state, _, c = restore_state(workdir, step)
  return state.body, state.head, c
