"""What every method on the SOMA LSTM expert shares: its config, init, losses and counts.

`lstm_method(**fields)` is a `Method` with these filled in; a method on the LSTM names its
step (and whatever else differs) and nothing more.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from soma_jax import config as config_lib
from soma_jax import memory, sizing, spsa
from soma_jax import model as model_lib
from soma_jax.errors import UserError
from soma_jax.methods.base import Method, Seed

Config = ml_collections.ConfigDict


def model_config(c: Config) -> model_lib.ModelConfig:
  """The expert's shape from config.model."""
  return model_lib.ModelConfig(d_t=c.model.d_t, d_e=c.model.d_e, depth=c.model.depth,
                               shared_head=c.model.shared_head)


def signs_together(c: Config) -> bool:
  """spsa.signs resolved: "auto" evaluates the two signs apart on a CPU (half as many
  perturbed copies per loop iteration, measured faster there) and together elsewhere."""
  signs = c.spsa.get("signs", "auto")
  return jax.default_backend() != "cpu" if signs == "auto" else signs == "together"


def step_config(c: Config, pert_chunk: int | None = None) -> spsa.StepConfig:
  """The static step settings; `pert_chunk` resolves spsa.pert_chunk="auto" (see
  `soma.plan_chunk`; without it "auto" stands for the CPU's chunk, enough for shapes)."""
  chunk = pert_chunk or config_lib.pert_chunk(c)
  together = signs_together(c)
  if chunk == "auto":  # the job's experts on one device, as `plan_chunk` counts them
    a, b = config_lib.expert_range(c)
    chunk = memory.cpu_chunk(c.spsa.n_pert, b - a, together)
  return spsa.StepConfig(
      model=model_config(c),
      # .get: configs saved before time_block / unroll / signs / forward existed restore.
      spsa=spsa.SpsaConfig(n_pert=c.spsa.n_pert, accum=c.spsa.accum, probe=c.spsa.probe,
                           pert_chunk=chunk, time_block=c.spsa.get("time_block", 64),
                           unroll=c.spsa.get("unroll", 1), signs_together=together,
                           forward=c.spsa.get("forward", "direct")),
      weight_decay=c.opt.weight_decay, train_head=c.opt.train_head, seed=c.seed)


def init_params(c: Config, seed: Seed = None):
  """Bodies and head(s) of this job's experts: the seed run's expert 0, or a fresh init.

  A fresh init draws all N experts and keeps this job's slice, so a job training
  experts a:b starts exactly where the full job's experts a:b start.
  """
  a, b = config_lib.expert_range(c)
  cfg = model_config(c)
  if seed is not None:
    body, head = seed_expert(seed, cfg, c.init_from)
    body_N = jax.tree.map(lambda x: jnp.broadcast_to(x, (b - a,) + x.shape), body)
    head = head if cfg.shared_head else jnp.broadcast_to(head, (b - a,) + head.shape)
    return body_N, head
  body_N, head = model_lib.init_experts(jax.random.key(c.seed), cfg, c.n_experts)
  body_N = jax.tree.map(lambda x: x[a:b], body_N)
  return body_N, head if cfg.shared_head else head[a:b]


def seed_expert(seed: Seed, cfg: model_lib.ModelConfig, where: str = "init_from"):
  """Expert 0's body and E of a seed run's checkpoint (SPEC 3.4 step 3), shapes checked."""
  body_N, head, seed_cfg = seed
  theirs = model_config(seed_cfg)
  if (theirs.d_t, theirs.d_e, theirs.depth) != (cfg.d_t, cfg.d_e, cfg.depth):
    raise UserError(
        f"init_from={where!r} has d_t={theirs.d_t}, d_e={theirs.d_e}, depth="
        f"{theirs.depth}; this run has d_t={cfg.d_t}, d_e={cfg.d_e}, depth={cfg.depth}; "
        "fix: train the seed at the same model size")
  body = jax.tree.map(lambda x: x[0], body_N)
  return body, head if theirs.shared_head else head[0]


def flops_per_token(c: Config) -> int:
  return sizing.flops_per_token(model_config(c))


def body_params(c: Config) -> int:
  return sizing.body_params(model_config(c))


def ensemble_params(c: Config) -> int:
  return sizing.ensemble_params(model_config(c), c.n_experts)


def width_for_params(total: int, c: Config) -> int:
  return sizing.width_for_params(total, c.n_experts, c.model.d_e, c.model.depth,
                                 c.model.shared_head)


def no_checks(c: Config) -> None:
  del c


def describe(c: Config) -> dict:
  """compare.py's columns of a method without SPSA directions."""
  del c
  return {"model": "lstm", "n_pert": None, "directions_per_update": None}


def lstm_method(**fields) -> Method:
  """A Method on the LSTM expert: init, step config, losses and counts as above."""
  shared = dict(init_params=init_params, step_config=step_config, val_loss=model_lib.streamed_loss,
                logits=model_lib.logits, flops_per_token=flops_per_token, body_params=body_params,
                ensemble_params=ensemble_params, width_for_params=width_for_params,
                validate=no_checks, describe=describe)
  return Method(**(shared | fields))
