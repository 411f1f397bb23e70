"""EGGROLL (SPEC 6, 9.4): low-rank evolution strategies on the paper's GRU LM (`soma_jax.gru`).

Every parameter of the GRU, its embedding and untied head included, lives in
`TrainState.body`; `TrainState.head` is an unused zero placeholder [V, d_E] (shared, frozen).
As in the EGGROLL reference LM, each antithetic pair reads its own byte stream,
`eggroll.segment` bytes per update (`pipeline.StreamSegments`), and every member's hidden
state is carried from update to update in `TrainState.carry` ([N, pop, depth, d]), reset
where its stream enters a new window. `eggroll_step` (every member on one shared batch) is
the step of `eggroll_lstm`, the same ES on the LSTM expert.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections

from soma_jax import eggroll as eggroll_lib
from soma_jax import gru as gru_lib
from soma_jax import sizing, spsa, train_state
from soma_jax.data import pipeline
from soma_jax.errors import UserError, need
from soma_jax.layers import VOCAB
from soma_jax.methods import lstm
from soma_jax.methods.base import DataSettings, Method, Seed, adam_step


@dataclasses.dataclass(frozen=True)
class EggrollStepConfig:
  """The static settings of an EGGROLL step: the shared ones, the population's, the loss."""

  step: spsa.StepConfig
  es: eggroll_lib.EggrollConfig
  loss_fn: Callable  # (body, head_e, window_BxT1) -> mean nats/byte


def es_config(c: ml_collections.ConfigDict) -> eggroll_lib.EggrollConfig:
  """config.eggroll, checked (SPEC 6: antithetic pairs, chunks of whole pairs)."""
  e = c.eggroll
  need(e.pop >= 2 and e.pop % 2 == 0, f"eggroll.pop={e.pop} must be even (antithetic pairs)")
  need(e.rank >= 1 and e.sigma > 0, "eggroll.rank must be >= 1 and eggroll.sigma > 0")
  need(e.pop % e.pop_chunk == 0 and e.pop_chunk % 2 == 0,
       f"eggroll.pop_chunk={e.pop_chunk} must be even and divide eggroll.pop={e.pop}")
  return eggroll_lib.EggrollConfig(pop=e.pop, sigma=e.sigma, rank=e.rank, pop_chunk=e.pop_chunk)


def _eggroll_step(state: train_state.TrainState, batch_NxAxBxT1: jax.Array, expert_ids_N: jax.Array,
                  cfg: EggrollStepConfig, key: jax.Array | None = None
                  ) -> tuple[train_state.TrainState, dict]:
  """EGGROLL on each expert's body (its own population, key and loss), then Adam.

  The A batches are concatenated into one batch of A*B sequences per member. A GRU body
  carries its own head (ES trains it); an LSTM body with per-expert heads has E follow
  the delta rule, as in SOMA.
  """
  scfg = cfg.step
  head_axis = None if scfg.model.shared_head else 0
  base_key = spsa.step_key(scfg.seed, key)

  def one(body, head_e, batch_AxBxT1, e):
    windows = batch_AxBxT1.reshape((-1,) + batch_AxBxT1.shape[2:])
    loss_fn = lambda b, w: cfg.loss_fn(b, head_e, w)
    g, m = eggroll_lib.estimate(body, windows, jax.random.fold_in(base_key, e), state.step,
                                loss_fn, cfg.es)
    return g, m["loss_mean"]

  g_N, loss_N = jax.vmap(one, in_axes=(0, head_axis, 0, 0))(
      state.body, state.head, batch_NxAxBxT1, expert_ids_N)
  g_head = jax.vmap(spsa.head_grad)(state.body, state.head, batch_NxAxBxT1) \
      if scfg.train_head else None
  return adam_step(state, g_N, loss_N, scfg.weight_decay, g_head)


eggroll_step = jax.jit(_eggroll_step, static_argnames="cfg", donate_argnames="state")


def _stream_step(state: train_state.TrainState, segments: dict, expert_ids_N: jax.Array,
                 cfg: EggrollStepConfig, key: jax.Array | None = None
                 ) -> tuple[train_state.TrainState, dict]:
  """EGGROLL on each expert's GRU, every pair on its own stream (SPEC 9.4), then Adam.

  `segments` is `pipeline.StreamSegments` output: inputs and targets [N, S, L], reset
  [N, L]. Pair n of expert e reads stream n; member m starts from `state.carry[e, m]`, its
  state at the end of the previous update, and leaves its new state there (zeros for an
  expert whose update is skipped as non-finite, so a NaN never travels on).
  """
  base_key = spsa.step_key(cfg.step.seed, key)

  def one(body, carry_P, inputs_SxL, targets_SxL, reset_L, e):
    loss_fn = lambda p, seg, h: gru_lib.segment_loss(p, seg[0], seg[1], reset_L, h)
    key = jax.random.fold_in(base_key, e)
    loss_P, carry_P = eggroll_lib.stream_losses(body, (inputs_SxL, targets_SxL), carry_P, key,
                                                state.step, loss_fn, cfg.es)
    g, m = eggroll_lib.estimate_from_losses(body, loss_P, key, state.step, cfg.es)
    return g, m["loss_mean"], carry_P

  g_N, loss_N, carry_N = jax.vmap(one)(state.body, state.carry, segments["inputs"],
                                       segments["targets"], segments["reset"], expert_ids_N)
  new, metrics = adam_step(state, g_N, loss_N, cfg.step.weight_decay)
  ok_N = metrics["finite"]
  return new.replace(carry=jnp.where(ok_N[:, None, None, None], carry_N, 0.0)), metrics


stream_step = jax.jit(_stream_step, static_argnames="cfg", donate_argnames="state")


def es_describe(es: eggroll_lib.EggrollConfig, model: str) -> dict:
  return {"model": model, "n_pert": None, "directions_per_update": es.pop,
          "gradient": "zero-order"}


def step_config(s: lstm.Settings, es: eggroll_lib.EggrollConfig, loss_fn: Callable,
                pert_chunk=None, seed_as_data: bool = False) -> EggrollStepConfig:
  return EggrollStepConfig(lstm.step_config(s, pert_chunk, seed_as_data), es, loss_fn)


# ------------------------------------------------------------------------- the GRU


def gru_loss(body, head_e, window_BxT1):
  del head_e  # the GRU's head is inside its body
  return gru_lib.gru_loss(body, window_BxT1)


def gru_logits(body, head_e, inputs_BxT):
  del head_e
  return gru_lib.gru_logits(body, inputs_BxT)


def init_params(s: lstm.Settings, gru: gru_lib.GruConfig, seed: Seed = None):
  """N GRUs (this job's slice) and the unused shared-head placeholder: fresh from the run's
  seed, or warm from the seed run's GRUs (same width and depth): its one GRU in every
  model, or each model from its own (`lstm.each_expert`)."""
  a, b = s.experts
  head = jnp.zeros((VOCAB, s.model.d_e), jnp.float32)
  if seed is not None:
    body_K, _, seed_method = seed
    theirs = seed_method.model
    need(theirs == gru, f"init_from={s.init_from!r} is a GRU of width {theirs.d} and depth "
         f"{theirs.depth}; this run has width {gru.d}, depth {gru.depth}; fix: seed at the "
         "same model size")
    return lstm.each_expert(body_K, b - a, s.init_from), head
  keys = jax.random.split(jax.random.key(s.seed), s.n_experts)
  body_N = jax.vmap(lambda k: gru_lib.init_gru(k, gru))(keys)
  return jax.tree.map(lambda x: x[a:b], body_N), head


def check_gru_generation(c: ml_collections.ConfigDict) -> None:
  """A run saved before eggroll.segment existed holds the earlier bare 3-gate GRU (6 d^2
  weights a layer), whose weights do not fit today's block (mixer + MLP, 12 d^2)."""
  if "segment" not in c.eggroll:
    raise UserError("this method=eggroll run was trained on the earlier 3-gate GRU, whose "
                    "weights do not fit today's GRU block (SPEC 9.4); fix: retrain it with "
                    "experiments/train.py --config=experiments/configs/eggroll.py")


def init_carry(pop: int, gru: gru_lib.GruConfig, n: int) -> jax.Array:
  """Every member's GRU state at the start of its stream: zeros [N, pop, depth, d]."""
  return jnp.zeros((n, pop) + gru_lib.state_shape(gru), jnp.float32)


def train_data(data: DataSettings, streams: int, segment: int, experts: list[int],
               pooled: bool) -> pipeline.StreamSegments:
  """Each pair's own stream (one per antithetic pair), `segment` bytes per update."""
  return pipeline.StreamSegments(data.dir, experts, streams=streams, segment=segment,
                                 seed=data.seed, pooled=pooled)


def make(c: ml_collections.ConfigDict) -> Method:
  """EGGROLL on N GRUs of width model.d_t and model.depth layers, each pair on its stream."""
  check_gru_generation(c)
  es = es_config(c)
  segment = c.eggroll.segment
  need(1 <= segment <= 1024, f"eggroll.segment={segment} bytes per stream update must be in 1..1024")
  s = lstm.settings(c)
  gru = gru_lib.GruConfig(d=c.model.d_t, depth=c.model.depth)
  streams = es.pop // 2  # one per antithetic pair
  flops = sizing.gru_flops_per_token(gru)
  return Method(
      name=s.name, model=gru, init_params=functools.partial(init_params, s, gru),
      step_config=functools.partial(step_config, s, es, gru_loss), train_step=stream_step,
      val_loss=gru_loss, logits=gru_logits, flops_per_token=flops,
      ops_per_update=es.pop * segment * flops, body_params=sizing.gru_params(gru),
      ensemble_params=s.n_experts * sizing.gru_params(gru),
      width_for_params=functools.partial(sizing.gru_width_for_params, n=s.n_experts,
                                         depth=gru.depth),
      # compare.py's columns: each member forwards its pair's segment, one sequence
      describe=es_describe(es, "gru") | {"seq_len": segment, "batch": 1, "accum": 1,
                                         "sequences_per_update_per_expert": streams},
      generates=False, init_carry=functools.partial(init_carry, es.pop, gru),
      train_data=functools.partial(train_data, s.data, streams, segment),
      family="gru", shape_keys=("eggroll.rank", "eggroll.pop", "eggroll.segment"),
      speed_keys=("eggroll.pop_chunk",))
