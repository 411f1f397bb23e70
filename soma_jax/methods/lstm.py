"""What every method on the SOMA LSTM expert shares: its settings, init, losses and counts.

`settings(c)` reads the config's sections once; `lstm_method(s, **fields)` is a `Method`
with the shared fields bound to them, so a method on the LSTM names its step (and whatever
else differs) and nothing more.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections

from soma_jax import config as config_lib
from soma_jax import memory, sizing, spsa
from soma_jax import model as model_lib
from soma_jax.errors import UserError
from soma_jax.methods.base import DataSettings, Method, Seed, expert_batches


@dataclasses.dataclass(frozen=True)
class Settings:
  """An LSTM method's config, read once (`settings`): nothing below reads the config."""

  name: str  # config.method
  model: model_lib.ModelConfig
  n_experts: int  # N of the whole run
  experts: tuple[int, int]  # this job's [a, b)
  seed: int
  init_from: str  # named in a warm start's messages
  n_pert: int
  probe: str
  pert_chunk: int | str  # "auto" or a positive int
  time_block: int
  unroll: int
  signs_together: bool
  forward: str
  weight_decay: float
  train_head: bool
  precision: str
  data: DataSettings

  @property
  def n_local(self) -> int:
    return self.experts[1] - self.experts[0]


def settings(c: ml_collections.ConfigDict) -> Settings:
  """The config's model, spsa, opt and data sections as one frozen record."""
  s = c.spsa
  return Settings(
      name=c.method,
      model=model_lib.ModelConfig(d_t=c.model.d_t, d_e=c.model.d_e, depth=c.model.depth,
                                  shared_head=c.model.shared_head),
      n_experts=c.n_experts, experts=config_lib.expert_range(c.experts, c.n_experts),
      seed=c.seed, init_from=c.init_from, n_pert=s.n_pert, probe=s.probe,
      pert_chunk=config_lib.pert_chunk(s.pert_chunk),
      # .get: configs saved before time_block / unroll / signs / forward existed restore.
      time_block=s.get("time_block", 64), unroll=s.get("unroll", 1),
      signs_together=signs_together(s.get("signs", "auto")), forward=s.get("forward", "direct"),
      weight_decay=c.opt.weight_decay, train_head=c.opt.train_head, precision=c.precision,
      data=DataSettings(dir=c.data.dir, seq_len=c.data.seq_len, batch=s.batch, accum=s.accum,
                        seed=c.seed))


def signs_together(signs: str) -> bool:
  """spsa.signs resolved: "auto" evaluates the two signs apart on a CPU (half as many
  perturbed copies per loop iteration, measured faster there) and together elsewhere."""
  return jax.default_backend() != "cpu" if signs == "auto" else signs == "together"


def step_config(s: Settings, pert_chunk: int | None = None, seed_as_data: bool = False
                ) -> spsa.StepConfig:
  """The static step settings; `pert_chunk` resolves spsa.pert_chunk="auto" (see
  `soma.plan_chunk`; without it "auto" stands for the CPU's chunk, enough for shapes).
  `seed_as_data`: no seed inside (None); the step takes `jax.random.key(seed)` as its `key`
  argument, so every seed of a shape runs one compiled program (what training does)."""
  chunk = pert_chunk or s.pert_chunk
  if chunk == "auto":  # the job's experts on one device, as `plan_chunk` counts them
    chunk = memory.cpu_chunk(s.n_pert, s.n_local, s.signs_together, s.data.batch)
  return spsa.StepConfig(
      model=s.model,
      spsa=spsa.SpsaConfig(n_pert=s.n_pert, accum=s.data.accum, probe=s.probe,
                           pert_chunk=chunk, time_block=s.time_block, unroll=s.unroll,
                           signs_together=s.signs_together, forward=s.forward),
      weight_decay=s.weight_decay, train_head=s.train_head,
      seed=None if seed_as_data else s.seed)


def init_params(s: Settings, seed: Seed = None):
  """Bodies and head(s) of this job's experts: warm from `seed` (`seed_experts`), or a fresh
  init.

  A fresh init draws all N experts and keeps this job's slice, so a job training
  experts a:b starts exactly where the full job's experts a:b start.
  """
  a, b = s.experts
  cfg = s.model
  if seed is not None:
    return seed_experts(seed, cfg, b - a, s.init_from)
  body_N, head = model_lib.init_experts(jax.random.key(s.seed), cfg, s.n_experts)
  body_N = jax.tree.map(lambda x: x[a:b], body_N)
  return body_N, head if cfg.shared_head else head[a:b]


def seed_experts(seed: Seed, cfg: model_lib.ModelConfig, n: int, where: str = "init_from"):
  """The n bodies and E of this job from a seed run's checkpoint (SPEC 3.4 step 3), shapes
  checked: its one expert in every expert, or (a seed of this run's N, cut to this job's
  experts by `runs.read_seed`) each expert from its own."""
  body_K, head, seed_method = seed
  theirs = seed_method.model
  if (theirs.d_t, theirs.d_e, theirs.depth) != (cfg.d_t, cfg.d_e, cfg.depth):
    raise UserError(
        f"init_from={where!r} has d_t={theirs.d_t}, d_e={theirs.d_e}, depth="
        f"{theirs.depth}; this run has d_t={cfg.d_t}, d_e={cfg.d_e}, depth={cfg.depth}; "
        "fix: train the seed at the same model size")
  body_N = each_expert(body_K, n, where)
  head_K = head[None] if theirs.shared_head else head  # [1 or n, V, d_E]
  if cfg.shared_head:
    if head_K.shape[0] > 1:
      raise UserError(f"init_from={where!r} has a head per expert and this run one shared "
                      "head (model.shared_head=True); fix: --config.model.shared_head=False, "
                      "or a seed of one expert")
    return body_N, head_K[0]
  return body_N, jnp.broadcast_to(head_K, (n,) + head_K.shape[1:])


def each_expert(tree_K, n: int, where: str = "init_from"):
  """A seed's experts for this job's n: its one expert ([1, ...] leaves) in every expert, or
  its n experts ([n, ...]) each in its own."""
  k = jax.tree.leaves(tree_K)[0].shape[0]
  if k not in (1, n):
    raise UserError(f"init_from={where!r} holds {k} experts and this job trains {n}; fix: a "
                    "seed of one expert, or one of this run's n_experts")
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape[1:]), tree_K)


def forward_ops(s: Settings) -> int:
  """SPEC 7's forward operations of one expert's update batch: A B T F."""
  return s.data.tokens_per_update * sizing.flops_per_token(s.model)


def describe(s: Settings) -> dict:
  """compare.py's columns of a method without SPSA directions."""
  del s
  return {"model": "lstm", "n_pert": None, "directions_per_update": None,
          "gradient": "exact (backprop)"}


def lstm_method(s: Settings, **fields) -> Method:
  """A Method on the LSTM expert: init, step config, losses and counts bound to `s`."""
  m = s.model
  shared = dict(
      name=s.name, model=m, init_params=functools.partial(init_params, s),
      step_config=functools.partial(step_config, s), val_loss=model_lib.streamed_loss,
      logits=model_lib.logits, flops_per_token=sizing.flops_per_token(m),
      body_params=sizing.body_params(m), ensemble_params=sizing.ensemble_params(m, s.n_experts),
      width_for_params=functools.partial(sizing.width_for_params, n=s.n_experts, d_e=m.d_e,
                                         depth=m.depth, shared_head=m.shared_head),
      describe=describe(s), train_data=functools.partial(expert_batches, s.data))
  return Method(**(shared | fields))
