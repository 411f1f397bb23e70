"""A run's states for every tool: its initial state, and a workdir's checkpoints restored.

Beside `checkpoint` (the files) and above `methods` (what a state holds): training starts
from `initial_state`; evaluation, generation, merging, the studies and the benchmarks read
a run back with `restore_state` / `restore_params`, whatever its method.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from soma_jax import checkpoint as ckpt_lib
from soma_jax import spec as spec_lib
from soma_jax import train_state
from soma_jax.errors import UserError
from soma_jax.methods import Method, Seed

PyTree = Any


@dataclasses.dataclass(frozen=True)
class SeedRun:
  """A warm start's seed (`read_seed`): its newest state cut to this job's experts, or its
  one expert, which then seeds every expert."""

  where: str  # its workdir (spec.init_from)
  n_experts: int  # the seed run's N: 1 seeds every expert, N seeds expert e from its expert e
  state: train_state.TrainState  # leading 1, or this job's experts
  method: Method  # the seed's (its model checked against this run's by `init_params`)

  @property
  def params(self) -> Seed:
    return self.state.body, self.state.head, self.method

  def describe(self, init_state: bool) -> str:
    """The line a warm start prints: which of the seed's experts each expert starts from."""
    what = "parameters, Adam and plateau state" if init_state else "parameters"
    if self.n_experts == 1:
      return f"init_from={self.where!r} holds one expert: every expert starts from it ({what})"
    return (f"init_from={self.where!r} holds {self.n_experts} experts: each expert e starts "
            f"from its expert e ({what})")


def read_seed(spec: spec_lib.RunSpec) -> SeedRun:
  """spec.init_from's newest state for this job (SPEC 3.4; LSTM and GRU methods alike): a
  seed of one expert as it is, one of N experts (this run's N) cut to this job's experts;
  a seed of another family or another N refused before its state is read."""
  where = ckpt_lib.seed_workdir(spec.init_from)
  theirs = read_spec(where)
  ours = spec.method
  if ours.family != theirs.method.family:  # a GRU seeds a GRU, an LSTM an LSTM
    raise UserError(f"init_from={where!r} is a {theirs.method.family} run (method="
                    f"{theirs.method.name}); method={ours.name} trains a {ours.family}: fix: a "
                    "seed of the same model")
  if theirs.n_experts == 1:
    return SeedRun(where, 1, restore_state(where)[1], theirs.method)
  if theirs.n_experts != spec.n_experts:
    raise UserError(f"init_from={where!r} holds {theirs.n_experts} experts and this run has "
                    f"n_experts={spec.n_experts}; a seed of several experts starts each expert e "
                    f"from its expert e; fix: --config.n_experts={theirs.n_experts}, or a seed "
                    "of one expert (every expert starts from it)")
  a, b = (spec.experts.start - theirs.experts.start, spec.experts.stop - theirs.experts.start)
  if a < 0 or b > len(theirs.experts):
    raise UserError(f"init_from={where!r} holds experts {theirs.experts.start}.."
                    f"{theirs.experts.stop - 1} of {theirs.n_experts}; this job trains experts "
                    f"{spec.experts.start}..{spec.experts.stop - 1}; fix: merge the seed's slices "
                    "first (experiments/merge.py)")
  state = restore_state(where)[1]
  take = lambda tree: jax.tree.map(lambda x: x[a:b], tree)  # noqa: E731
  state = state.replace(body=take(state.body), opt=take(state.opt),
                        head=state.head if theirs.shared_head else state.head[a:b],
                        head_opt=take(state.head_opt), sched=take(state.sched),
                        skipped=state.skipped[a:b], carry=take(state.carry))
  return SeedRun(where, theirs.n_experts, state, theirs.method)


def initial_params(spec: spec_lib.RunSpec, seed: SeedRun | None = None
                   ) -> tuple[PyTree, jax.Array]:
  """Bodies and head(s) of this job's experts: warm from spec.init_from's newest checkpoint
  (`read_seed`, or `seed` where it was read already), or the method's fresh init."""
  if seed is None and spec.init_from:
    seed = read_seed(spec)
  return spec.method.init_params(None if seed is None else seed.params)


def initial_state(spec: spec_lib.RunSpec, seed: SeedRun | None = None
                  ) -> train_state.TrainState:
  """The TrainState a run starts from (every method's: Adam of the bodies, and of the heads
  where opt.train_head). With `init_state` (and `init_from`) the seed run's state goes on:
  see `continued`. `seed`: spec.init_from already read (`read_seed`)."""
  if seed is None and spec.init_from:
    seed = read_seed(spec)
  body_N, head = initial_params(spec, seed)
  n = jax.tree.leaves(body_N)[0].shape[0]
  state = train_state.init_state(body_N, head, spec.lr, spec.eps, spec.weight_decay,
                                 spec.train_head, spec.method.init_carry(n))
  if seed is not None and spec.init_state:
    return continued(state, seed)
  return state


def continued(fresh: train_state.TrainState, seed: SeedRun) -> train_state.TrainState:
  """`fresh` (this run's initial state, warm from the seed's parameters) with the rest of
  the seed run's newest state: each expert takes its seed expert's Adam moments and count
  (the one expert's, or its own of a seed of N), its plateau state (lr and eps set to this
  config's) and the step counter (SPEC 9.6: the compared phase continues the seed run)."""
  theirs = seed.state
  n = fresh.skipped.shape[0]
  every = lambda x: jnp.broadcast_to(x, (n,) + x.shape[1:])  # noqa: E731 - [1] or [n] to [n]
  take = lambda ours, t, what: _same_tree(ours, t, what, seed.where) and jax.tree.map(every, t)
  sched = jax.tree.map(every, theirs.sched).replace(lr=fresh.sched.lr, eps=fresh.sched.eps)
  head_opt = (take(fresh.head_opt, theirs.head_opt, "head optimizer")
              if fresh.head_opt != () else ())
  return fresh.replace(step=theirs.step, opt=take(fresh.opt, theirs.opt, "optimizer"),
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
