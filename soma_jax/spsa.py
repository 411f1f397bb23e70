"""SPSA for SOMA: probes from keys, the vmapped central-difference estimator, the step.

One jitted call evaluates every expert x direction x sign (SPEC 3.1). Each expert has
its own scalar loss; nothing is reduced across the expert axis (unless a shared-loss
grouping is asked for, which exists only for the variance experiments of SPEC 5).

Shapes: N experts, A accumulation batches, K = n_pert directions, C = pert_chunk,
B sequences, T + 1 bytes per window.

Directions are never stored: direction j of accumulation batch a of expert e at update
`step` is drawn from `probe_key(base_key, step, e, a, j)`, where e is the *global* expert
id, so a job training a subset of experts draws exactly what the full job draws.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from soma_jax import layers, train_state
from soma_jax import model as model_lib
from soma_jax.train_state import TrainState

PyTree = Any
PROBES = ("sparse", "rademacher", "gaussian")
FORWARDS = layers.FORWARDS  # spsa.forward


@dataclasses.dataclass(frozen=True)
class Curvature:
  """1.5-SPSA's probe-space curvature scaling (docs/spsa15.md): direction j's coefficient is
  divided by curv_j = max((|L+_j - 2 L0 + L-_j| / eps^2) ** alpha, floor), L0 the clean loss."""

  alpha: float = 0.1  # exponent; 0 gives curv = max(1, floor)
  floor: float = 1.0  # lambda: the smallest curv (> 0)

  def __post_init__(self):
    if not (math.isfinite(self.alpha) and self.alpha >= 0):
      raise ValueError(f"curvature alpha={self.alpha} must be finite and >= 0")
    if not (math.isfinite(self.floor) and self.floor > 0):
      raise ValueError(f"curvature floor (lambda)={self.floor} must be finite and > 0")


@dataclasses.dataclass(frozen=True)
class SpsaConfig:
  """Static settings of the estimator."""

  n_pert: int = 64  # directions per accumulation batch
  accum: int = 1  # A: batches averaged per update, each with fresh directions
  probe: str = "sparse"  # sparse | rademacher | gaussian
  pert_chunk: int = 16  # directions evaluated at once; peak memory scales with this
  time_block: int = 64  # positions per block of the streamed loss; memory ~ this, not T
  unroll: int = 1  # LSTM time steps per loop iteration of the streamed loss (speed only)
  # Both signs of a direction in one vmapped pass (2 C perturbed copies per expert per
  # iteration: wide work for a GPU), or theta + eps z then theta - eps z (C copies at a
  # time, faster on a CPU). The same arithmetic either way, equal to float32 rounding.
  signs_together: bool = True
  # One of FORWARDS (`perturb`). Speed only: the same losses to float32 rounding.
  forward: str = "direct"
  # None: plain SPSA. 1.5-SPSA (`Curvature`): one clean forward per accumulation batch, one
  # more row of that batch's first chunk, and each coefficient divided by its curvature.
  curvature: Curvature | None = None

  def __post_init__(self):
    if self.probe not in PROBES:
      raise ValueError(f"probe must be one of {PROBES}, got {self.probe!r}")
    if self.forward not in FORWARDS:
      raise ValueError(f"forward must be one of {FORWARDS}, got {self.forward!r}")
    if min(self.n_pert, self.accum, self.pert_chunk, self.time_block, self.unroll) < 1:
      raise ValueError("n_pert, accum, pert_chunk, time_block and unroll must be positive")
    if self.n_pert % self.chunk:
      raise ValueError(f"pert_chunk={self.pert_chunk} must divide n_pert={self.n_pert}")

  @property
  def chunk(self) -> int:
    return min(self.pert_chunk, self.n_pert)

  @property
  def signs(self) -> str:
    """The spsa.signs setting this resolves: "together" or "apart"."""
    return "together" if self.signs_together else "apart"


# ----------------------------------------------------------------------------- probes


def probe_key(base_key: jax.Array, step, expert, accum, direction) -> jax.Array:
  """The key of one direction: (base key, step, expert, accumulation index, direction)."""
  key = jax.random.fold_in(base_key, step)
  key = jax.random.fold_in(key, expert)
  key = jax.random.fold_in(key, accum)
  return jax.random.fold_in(key, direction)


def _is_gain(path) -> bool:
  return any(getattr(k, "key", None) == model_lib.GAIN_KEY for k in path)


def probe(key: jax.Array, params: PyTree, kind: str = "sparse") -> PyTree:
  """A direction z shaped like `params`, drawn as one flat vector from `key`.

  sparse: LayerNorm gains dense +-1; other coordinates 0 w.p. 1/2, +-1 w.p. 1/4 each
  (no inverse-probability rescaling). rademacher: dense +-1. gaussian: N(0, 1).
  One draw for the whole tree keeps the compiled step small (one RNG call, not one per leaf).
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  sizes = [leaf.size for _, leaf in leaves]
  dtype = leaves[0][1].dtype
  total = sum(sizes)
  if kind == "gaussian":
    flat = jax.random.normal(key, (total,), dtype)
  else:
    bits = jax.random.bits(key, (total,), jnp.uint8)
    flat = ((bits >> 1) & 1).astype(dtype) * 2 - 1  # +-1
    if kind == "sparse":
      dense = jnp.concatenate([jnp.full((n,), _is_gain(path)) for (path, _), n in zip(leaves, sizes)])
      flat = jnp.where(dense | ((bits & 1) == 1), flat, 0)
  parts = jnp.split(flat, list(itertools.accumulate(sizes))[:-1])
  return jax.tree_util.tree_unflatten(
      treedef, [z.reshape(leaf.shape).astype(leaf.dtype) for z, (_, leaf) in zip(parts, leaves)])


def probe_second_moment(params: PyTree, kind: str = "sparse") -> PyTree:
  """q = E[z^2] per coordinate: 1 for dense probes and gains, 1/2 for sparse others."""
  def q(path, leaf):
    if kind != "sparse" or _is_gain(path):
      return jnp.ones(leaf.shape, leaf.dtype)
    return jnp.full(leaf.shape, 0.5, leaf.dtype)

  return jax.tree_util.tree_map_with_path(q, params)


# ------------------------------------------------------------------------- estimator

LossFn = Callable[[PyTree, jax.Array, jax.Array], jax.Array]  # (body, head, batch) -> scalar


def _group_diff(losses_NxCx2: jax.Array, groups: Sequence[int] | None) -> jax.Array:
  """[N, C] L(theta + eps z) - L(theta - eps z): each expert's own, or its group's summed loss's.

  The group's difference is the sum of its experts' own differences, summed in float64 when
  x64 is enabled: each float32 difference of two nearby losses is exact (Sterbenz), whereas
  the float32 sum of N losses would round the difference at N times the loss's precision.
  """
  diff_NxC = losses_NxCx2[..., 0] - losses_NxCx2[..., 1]
  if groups is None:
    return diff_NxC
  wide_NxC = diff_NxC.astype(jnp.float64 if jax.config.jax_enable_x64 else diff_NxC.dtype)
  ids = jnp.asarray(groups, jnp.int32)
  return jax.ops.segment_sum(wide_NxC, ids, num_segments=max(groups) + 1)[ids]


def _splits(path, leaf: jax.Array, forward: str) -> bool:
  """Whether one expert's leaf at `path` is applied split (a matrix) under `forward`."""
  if forward == "split":
    return leaf.ndim == 2
  return forward == "split_recurrence" and getattr(path[-1], "key", None) == layers.RECURRENT_KEY


def perturb(body: PyTree, z: PyTree, scale: jax.Array, forward: str = "direct",
            probe_kind: str = "sparse") -> PyTree:
  """theta + scale z for one expert: formed leaf by leaf ("direct"), or with the matrices
  `forward` splits left as `layers.Split(theta, z, scale)`, which `layers.linear` applies as
  x theta + scale (x z). A split z is held in bfloat16 when the probe is ternary (sparse,
  rademacher: exact), in float32 when gaussian (bfloat16 would round it)."""
  z_dtype = jnp.float32 if probe_kind == "gaussian" else jnp.bfloat16

  def one(path, p, d):
    if _splits(path, p, forward):
      return layers.Split(p, d.astype(z_dtype), scale)
    return p + scale * d

  return jax.tree_util.tree_map_with_path(one, body, z)


def perturbed_losses(body: PyTree, head_e: jax.Array, batch: jax.Array, eps: jax.Array,
                     z: PyTree, cfg: SpsaConfig, loss_fn: LossFn) -> jax.Array:
  """[2]: L(theta + eps z), L(theta - eps z) of one expert on the same batch."""
  signs = jnp.array([1.0, -1.0], eps.dtype)

  def one(s):
    return loss_fn(perturb(body, z, s * eps, cfg.forward, cfg.probe), head_e, batch)

  return jax.vmap(one)(signs) if cfg.signs_together else jax.lax.map(one, signs)


def _default_loss(cfg: SpsaConfig, loss_fn: LossFn | None) -> LossFn:
  if loss_fn is None:
    return functools.partial(model_lib.streamed_loss, time_block=cfg.time_block,
                             unroll=cfg.unroll)
  if cfg.forward != "direct":  # a Split weight means something only to layers.linear
    raise ValueError(f"forward={cfg.forward!r} needs the model's own loss (loss_fn=None)")
  return loss_fn


def _chunk_losses(body_N, head, batch_NxBxT1, eps_N, z_NxC, cfg: SpsaConfig, loss_fn: LossFn,
                  shared_head: bool) -> jax.Array:
  """[N, C, 2]: L(theta + eps z_j), L(theta - eps z_j) of one chunk's directions."""
  return jax.vmap(
      lambda body, h, b, eps, z: jax.vmap(
          lambda zj: perturbed_losses(body, h, b, eps, zj, cfg, loss_fn))(z),
      in_axes=(0, None if shared_head else 0, 0, 0, 0),
  )(body_N, head, batch_NxBxT1, eps_N, z_NxC)


def _chunk_coefficients(body_N, head, batch_NxBxT1, eps_N, z_NxC, cfg: SpsaConfig,
                        loss_fn: LossFn, shared_head: bool, loss_groups) -> tuple:
  """([N, C] coefficients (L+ - L-) / (2 eps), [N, C, 2] losses) of one chunk's directions."""
  losses_NxCx2 = _chunk_losses(body_N, head, batch_NxBxT1, eps_N, z_NxC, cfg, loss_fn,
                               shared_head)
  diff_NxC = _group_diff(losses_NxCx2, loss_groups)
  return (diff_NxC / (2 * eps_N[:, None])).astype(eps_N.dtype), losses_NxCx2


def _chunk_and_clean_losses(body_N, head, batch_NxBxT1, eps_N, z_NxC, cfg: SpsaConfig,
                            loss_fn: LossFn, shared_head: bool) -> tuple:
  """([N, C, 2] losses L(theta +- eps z_j), [N] clean losses L(theta)) of a batch's first
  chunk (1.5-SPSA). The clean forward is one more row of the same vmapped pass over the
  2 C + 1 rows theta + s_r eps z_r: its s = 0 and z = z_0 (theta + 0 z is theta exactly),
  so there is no second pass; these rows are evaluated at once whatever `cfg.signs_together`.
  """
  def rows(body, h, b, eps, z_C):
    c = jax.tree.leaves(z_C)[0].shape[0]
    z_R = jax.tree.map(lambda z: jnp.concatenate([z, z, z[:1]]), z_C)
    s_R = jnp.concatenate([jnp.ones(c), -jnp.ones(c), jnp.zeros(1)]).astype(eps.dtype)
    loss_R = jax.vmap(lambda z, s: loss_fn(perturb(body, z, s * eps, cfg.forward, cfg.probe),
                                           h, b))(z_R, s_R)
    return jnp.stack([loss_R[:c], loss_R[c:2 * c]], axis=-1), loss_R[2 * c]

  return jax.vmap(rows, in_axes=(0, None if shared_head else 0, 0, 0, 0))(
      body_N, head, batch_NxBxT1, eps_N, z_NxC)


def curvature(losses_NxCx2: jax.Array, clean_N: jax.Array, eps_N: jax.Array,
              c: Curvature) -> jax.Array:
  """[N, C] curv_j = max((|L+_j - 2 L0 + L-_j| / eps^2) ** alpha, floor), each expert's own.

  The second difference is taken as (L+ - L0) + (L- - L0): each float32 difference of two
  nearby losses is exact (Sterbenz), so only their sum rounds.
  """
  l0_Nx1 = clean_N[:, None]
  second_NxC = (losses_NxCx2[..., 0] - l0_Nx1) + (losses_NxCx2[..., 1] - l0_Nx1)
  scaled_NxC = jnp.abs(second_NxC) / jnp.square(eps_N)[:, None]
  return jnp.maximum(scaled_NxC ** c.alpha, c.floor).astype(eps_N.dtype)


def _spsa_scan(body_N, head, batch_NxAxBxT1, eps_N, step, expert_ids_N, base_key,
               cfg: SpsaConfig, loss_fn: LossFn, shared_head: bool, loss_groups, carry, start,
               size: int, n_chunks: int) -> tuple:
  """(sum of coef z, sum of perturbed losses) over the A batches' chunks (`estimate`)."""
  def body_fn(carry, idx):
    g_N, loss_N = carry
    a, c = idx // n_chunks, idx % n_chunks
    z_NxC = _draw_chunk(body_N, expert_ids_N, base_key, step, a,
                        start + c * size + jnp.arange(size), cfg.probe)
    coef_NxC, losses_NxCx2 = _chunk_coefficients(
        body_N, head, batch_NxAxBxT1[:, a], eps_N, z_NxC, cfg, loss_fn, shared_head,
        loss_groups)
    g_N = jax.tree.map(lambda g, z: g + jnp.einsum("nc,nc...->n...", coef_NxC, z), g_N, z_NxC)
    return (g_N, loss_N + jnp.sum(losses_NxCx2, axis=(1, 2))), None

  return jax.lax.scan(body_fn, carry, jnp.arange(cfg.accum * n_chunks))[0]


def _curved_scan(body_N, head, batch_NxAxBxT1, eps_N, step, expert_ids_N, base_key,
                 cfg: SpsaConfig, loss_fn: LossFn, shared_head: bool, loss_groups, carry,
                 start, size: int, n_chunks: int) -> tuple:
  """1.5-SPSA's sums over the A batches (as `_spsa_scan`): batch a's first chunk brings
  its clean loss L0 as one more row, and every chunk of that batch divides its directions'
  coefficients (L+ - L-) / (2 eps) by their `curvature` against that L0."""
  if loss_groups is not None:
    raise ValueError("curvature scaling takes each expert's own loss (loss_groups=None)")

  def add(carry, losses_NxCx2, clean_N, z_NxC):
    g_N, loss_N = carry
    diff_NxC = losses_NxCx2[..., 0] - losses_NxCx2[..., 1]
    coef_NxC = (diff_NxC / (2 * eps_N[:, None]) / curvature(
        losses_NxCx2, clean_N, eps_N, cfg.curvature)).astype(eps_N.dtype)
    g_N = jax.tree.map(lambda g, z: g + jnp.einsum("nc,nc...->n...", coef_NxC, z), g_N, z_NxC)
    return g_N, loss_N + jnp.sum(losses_NxCx2, axis=(1, 2))

  def batch_fn(carry, a):
    draw = lambda c: _draw_chunk(body_N, expert_ids_N, base_key, step, a,
                                 start + c * size + jnp.arange(size), cfg.probe)
    batch_NxBxT1 = batch_NxAxBxT1[:, a]
    z_NxC = draw(0)
    losses_NxCx2, clean_N = _chunk_and_clean_losses(body_N, head, batch_NxBxT1, eps_N, z_NxC,
                                                    cfg, loss_fn, shared_head)
    carry = add(carry, losses_NxCx2, clean_N, z_NxC)

    def chunk_fn(carry, c):  # the batch's other chunks: 2 C rows each, the same L0
      z_NxC = draw(c)
      losses_NxCx2 = _chunk_losses(body_N, head, batch_NxBxT1, eps_N, z_NxC, cfg, loss_fn,
                                   shared_head)
      return add(carry, losses_NxCx2, clean_N, z_NxC), None

    if n_chunks > 1:
      carry, _ = jax.lax.scan(chunk_fn, carry, jnp.arange(1, n_chunks))
    return carry, None

  return jax.lax.scan(batch_fn, carry, jnp.arange(cfg.accum))[0]


def _draw_chunk(body_N, expert_ids_N, base_key, step, a, dirs_C, kind: str) -> PyTree:
  """z_NxC: each expert's directions dirs_C of accumulation batch a, from its own keys."""
  return jax.vmap(lambda body, e: jax.vmap(
      lambda j: probe(probe_key(base_key, step, e, a, j), body, kind))(dirs_C)
  )(body_N, expert_ids_N)


def estimate(
    body_N: PyTree,
    head: jax.Array,
    batch_NxAxBxT1: jax.Array,
    eps_N: jax.Array,
    step: jax.Array,
    expert_ids_N: jax.Array,
    base_key: jax.Array,
    cfg: SpsaConfig,
    loss_fn: LossFn | None = None,
    shared_head: bool = True,
    loss_groups: Sequence[int] | None = None,
    directions: tuple[jax.typing.ArrayLike, int] | None = None,
) -> tuple[PyTree, jax.Array]:
  """The central-difference SPSA estimate for every expert, and its mean perturbed loss.

    g_hat_e = 1/(A K) sum_a sum_j [L_e(theta + eps z) - L_e(theta - eps z)] / (2 eps) z

  All K directions and both signs of accumulation batch a use that batch. Directions are
  processed C at a time in a `lax.scan`, so memory holds C perturbed copies, not K. The
  default loss is `model.streamed_loss` in blocks of `cfg.time_block` positions, so
  activation memory is ~ 2 N C B time_block 4 d_t floats (N C B ... with the signs apart,
  `cfg.signs_together=False`), independent of T; `cfg.forward` says how each perturbed
  copy applies its weights (`perturb`).
  `loss_groups` (one group id per expert) sums losses within each group before the
  difference: the shared-loss estimator. Returns (g_hat_N, loss_N), loss_N being the
  mean of the 2 A K perturbed losses of each expert.

  `directions=(start, count)` evaluates only directions start..start+count-1 of every
  accumulation batch (`start` may be traced, e.g. from `lax.axis_index`) and returns that
  slice's share of the full estimate: the sums are still divided by the full A K, so the
  shares of a partition of 0..K-1 add up to the estimate above (DDPP, `parallel.py`).

  `cfg.curvature` set (1.5-SPSA, docs/spsa15.md): each coefficient is divided by its own
  curv_j (`curvature`) against the clean loss L0 = L_e(theta) of its batch, evaluated once per
  accumulation batch as one more row of that batch's first chunk (2 C + 1 perturbed copies
  at once there), so an update costs A (2 K + 1) forwards per expert; a DDPP slice evaluates
  its own L0 (the same number on every device). loss_N stays the mean perturbed loss.
  """
  start, count = (0, cfg.n_pert) if directions is None else directions
  size = min(cfg.chunk, count)
  if count < 1 or count % size:
    raise ValueError(f"direction count {count} must be a positive multiple of the chunk {size}")
  carry = (jax.tree.map(jnp.zeros_like, body_N), jnp.zeros(eps_N.shape, eps_N.dtype))
  sums = _spsa_scan if cfg.curvature is None else _curved_scan
  g_N, loss_N = sums(body_N, head, batch_NxAxBxT1, eps_N, step, expert_ids_N, base_key, cfg,
                     _default_loss(cfg, loss_fn), shared_head, loss_groups, carry, start, size,
                     count // size)
  total = cfg.accum * cfg.n_pert
  g_N = jax.tree.map(lambda g: g / total, g_N)
  return g_N, loss_N / (2 * total)


def coefficients(body_N: PyTree, head: jax.Array, batch_NxAxBxT1: jax.Array, eps_N: jax.Array,
                 step: jax.Array, expert_ids_N: jax.Array, base_key: jax.Array,
                 cfg: SpsaConfig, shared_head: bool = True) -> jax.Array:
  """[N, A, K]: each direction's coefficient (L+ - L-) / (2 eps), the directions and
  batches `estimate` uses (so settings can be compared direction by direction). SPSA's
  only: a `cfg.curvature` is refused."""
  if cfg.curvature is not None:
    raise ValueError("spsa.coefficients gives SPSA's (L+ - L-) / (2 eps); drop cfg.curvature")
  loss_fn = _default_loss(cfg, None)
  n_chunks = cfg.n_pert // cfg.chunk

  def one(idx):
    a, c = idx // n_chunks, idx % n_chunks
    z_NxC = _draw_chunk(body_N, expert_ids_N, base_key, step, a,
                        c * cfg.chunk + jnp.arange(cfg.chunk), cfg.probe)
    return _chunk_coefficients(body_N, head, batch_NxAxBxT1[:, a], eps_N, z_NxC, cfg,
                               loss_fn, shared_head, None)[0]

  coef_IxNxC = jax.lax.map(one, jnp.arange(cfg.accum * n_chunks))
  n = eps_N.shape[0]
  return jnp.moveaxis(coef_IxNxC, 0, 1).reshape(n, cfg.accum, cfg.n_pert)


# ------------------------------------------------------------------- delta-rule head


def delta_rule_grad(h_BxTxE: jax.Array, embed_VxE: jax.Array, targets_BxT: jax.Array) -> jax.Array:
  """grad_E = 1/(B T) sum_{b,t} (softmax(E h) - onehot(y)) h^T with h held fixed (SPEC 3.2)."""
  p = jax.nn.softmax(h_BxTxE @ embed_VxE.T, axis=-1)
  err_BxTxV = p - jax.nn.one_hot(targets_BxT, embed_VxE.shape[0], dtype=p.dtype)
  return jnp.einsum("btv,bte->ve", err_BxTxV, h_BxTxE) / (h_BxTxE.shape[0] * h_BxTxE.shape[1])


def head_grad(body: PyTree, embed_VxE: jax.Array, batch_AxBxT1: jax.Array) -> jax.Array:
  """Delta-rule gradient for one expert's head, averaged over its A batches."""
  def one(batch):
    h = jax.lax.stop_gradient(model_lib.features(body, embed_VxE, batch[:, :-1]))
    return delta_rule_grad(h, embed_VxE, batch[:, 1:])
  return jnp.mean(jax.vmap(one)(batch_AxBxT1), axis=0)


# ------------------------------------------------------------------------ the step


def step_key(seed: int | None, key: jax.Array | None) -> jax.Array:
  """The step's base key: `jax.random.key(seed)` of a static seed, or the one given as data."""
  if (seed is None) == (key is None):
    raise ValueError("a step takes its seed once: as cfg.seed or as its key argument")
  return jax.random.key(seed) if key is None else key


@dataclasses.dataclass(frozen=True)
class StepConfig:
  model: model_lib.ModelConfig
  spsa: SpsaConfig
  weight_decay: float = 0.0
  train_head: bool = False  # delta rule on each expert's own head (seed run, wide controls)
  # The optimisation seed; None: it comes as data, the step's `key` argument (training:
  # one compiled program serves every seed of a shape).
  seed: int | None = 0
  # None: each expert's own loss (SOMA). A group id per expert: losses summed within
  # each group before the difference (the shared-loss control of SPEC 5 and Figure 4).
  loss_groups: tuple[int, ...] | None = None


def train_step(state: TrainState, batch_NxAxBxT1: jax.Array, expert_ids_N: jax.Array,
               cfg: StepConfig, *, directions: tuple[jax.typing.ArrayLike, int] | None = None,
               combine: Callable[[PyTree, jax.Array], tuple[PyTree, jax.Array]] | None = None,
               key: jax.Array | None = None) -> tuple[TrainState, dict]:
  """One SOMA update of every expert: SPSA body estimate, Adam, optional delta-rule head.

  An expert whose loss or estimate is not finite skips this update (its parameters and
  Adam state are unchanged); the other experts are unaffected. For DDPP (`parallel.py`),
  `directions` picks this device's slice of the directions (see `estimate`) and
  `combine(g_N, loss_N)` sums the slices' shares across devices before the update.
  `key` is `jax.random.key(seed)` given as data where `cfg.seed` is None (`base_key`).
  """
  if cfg.train_head and cfg.model.shared_head:
    raise ValueError("train_head needs per-expert heads (model.shared_head=False)")
  base_key = step_key(cfg.seed, key)
  g_N, loss_N = estimate(
      state.body, state.head, batch_NxAxBxT1, state.sched.eps, state.step, expert_ids_N,
      base_key, cfg.spsa, shared_head=cfg.model.shared_head, loss_groups=cfg.loss_groups,
      directions=directions)
  if combine is not None:
    g_N, loss_N = combine(g_N, loss_N)
  ok_N = jax.vmap(train_state.all_finite)(g_N) & jnp.isfinite(loss_N)
  tx = train_state.adam(cfg.weight_decay)
  body, opt = train_state.apply_updates(
      tx, state.body, state.opt, g_N, state.sched.lr, ok_N)
  head, head_opt = state.head, state.head_opt
  if cfg.train_head:
    # The head's gradient is taken at the pre-update body, like the SPSA estimate.
    gh_N = jax.vmap(head_grad)(state.body, state.head, batch_NxAxBxT1)
    ok_h = ok_N & jax.vmap(train_state.all_finite)(gh_N)
    head, head_opt = train_state.apply_updates(
        tx, state.head, state.head_opt, gh_N, state.sched.lr, ok_h)
  return train_state.finish_update(state, body, opt, head, head_opt, loss_N, ok_N)


