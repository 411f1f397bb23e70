"""EGGROLL: evolution strategies with low-rank perturbations (SPEC section 6).

Written from the paper's description. For every matrix leaf w [in, out] (EGGROLL's
W = w^T, out x in) a member draws A [out, r] and B [in, r] from N(0, 1), scales A by
sign * sigma / sqrt(r) and runs the forward pass with `model.LowRank(w, A, B)`, i.e.
x w + (x B) A^T, never forming B A^T. Other leaves (gains, biases) get a full-rank
perturbation sign * sigma * eps. Noise is derived from keys, never stored:

  leaf key = fold_in(fold_in(fold_in(key, step), noise), leaf_index)

(one vmapped draw for all leaves; leaves other than matrices and vectors are assumed small).

With `antithetic=True` member m uses noise m // 2 and sign +1 (m even) / -1 (m odd).
Fitness is -loss z-scored across the population and the ascent estimate is

  g = 1 / (pop * sigma) * sum_m fitness_m * sign_m * eps_m,   eps = B A^T / sqrt(r),

accumulated chunk by chunk as an einsum over fitness-weighted factors (never a
[pop, in, out] tensor). `estimate` returns -g, a loss gradient for any optax optimiser.
Members are evaluated with `vmap` over `pop_chunk` members at a time and `lax.map` over
chunks, so memory is bounded by one chunk.

Members either share one batch (`estimate`, `population_losses`) or each antithetic pair
reads its own stream segment and every member carries its state to the next update
(`stream_losses`, then `estimate_from_losses`), as the EGGROLL reference LM trains.

`loss_fn(params, batch) -> scalar` may be any loss whose 2-D leaves reach the maths only
through `model.linear` (or `gru.embed`): the GRU (`gru.gru_loss`) or a SOMA expert
(`lambda body, b: model.loss(body, E, b)`).

sigma is in the units the weights are stored in. The EGGROLL reference LM (nano-egg) sets
it by `sigma_shift`: its weights are int8 fixed point at 2^4 per unit, its rank-1 term
(x B) A^T has factors at the same 2^4 per unit and is shifted right by 4 + sigma_shift
before joining x W^T, so the perturbation of a unit-scale weight is B A^T * 2^-sigma_shift
(vectors alike: a product of two such normals, shifted the same). `soma_jax.gru` stores its
matrices at that unit scale (applied as x W / sqrt(fan_in), like the reference), so
`sigma = sigma_from_shift(4) = 0.0625` is the paper's recorded setting.

  cfg = EggrollConfig(pop=4096, sigma=0.01, rank=1, pop_chunk=512)
  step_fn = jax.jit(make_step(gru.gru_loss, cfg, optax.adam(1e-3)))
  params, opt_state, metrics = step_fn(params, opt_state, batch_BxT1, key, step)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from soma_jax.layers import LowRank

PyTree = Any
LossFn = Callable[[PyTree, jax.Array], jax.Array]
StreamLossFn = Callable[[PyTree, Any, PyTree], tuple[jax.Array, PyTree]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EggrollConfig:
  """Population and noise settings."""

  pop: int  # members per update (both signs counted)
  sigma: float  # perturbation scale
  rank: int = 1  # r of each matrix perturbation B A^T
  pop_chunk: int | None = None  # members per vmapped chunk; None = the whole population
  antithetic: bool = True  # members 2k and 2k+1 share noise with opposite signs

  def __post_init__(self):
    if self.pop < 1 or self.rank < 1 or self.sigma <= 0:
      raise ValueError(f"need pop >= 1, rank >= 1, sigma > 0; got {self}")
    if self.antithetic and self.pop % 2:
      raise ValueError(f"antithetic sampling needs an even pop, got {self.pop}")
    chunk = self.chunk
    if self.pop % chunk or (self.antithetic and chunk % 2):
      raise ValueError(f"pop_chunk={chunk} must divide pop={self.pop} (and be even if "
                       "antithetic)")

  @property
  def chunk(self) -> int:
    return self.pop if self.pop_chunk is None else self.pop_chunk

  @property
  def signs(self) -> tuple[float, ...]:
    return (1.0, -1.0) if self.antithetic else (1.0,)

  @property
  def num_noise(self) -> int:
    """Distinct noise draws per update (pop / 2 when antithetic)."""
    return self.pop // len(self.signs)


def sigma_from_shift(sigma_shift: int) -> float:
  """The reference's sigma_shift as sigma on unit-scale weights: 2^-sigma_shift."""
  return 2.0 ** -sigma_shift


def _noise_len(w: jax.Array, rank: int) -> int:
  """Normals one leaf needs: (out + in) * r for a matrix, its size otherwise."""
  return (w.shape[0] + w.shape[1]) * rank if w.ndim == 2 else w.size


def noise(params: PyTree, key: jax.Array, member: jax.ArrayLike, cfg: EggrollConfig) -> PyTree:
  """Unit noise of one noise index: (A [out, r], B [in, r]) per matrix, eps per other leaf.

  `key` is the step key `fold_in(base_key, step)`; `member` is the noise index. Leaf i
  draws from `fold_in(fold_in(key, member), i)`; all leaves are drawn in one vmapped call
  (padded to the longest leaf) so the compiled program holds a single RNG kernel.
  """
  leaves, treedef = jax.tree.flatten(params)
  lens = [_noise_len(w, cfg.rank) for w in leaves]
  dtype = jnp.result_type(*leaves)
  key = jax.random.fold_in(key, member)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(len(leaves)))
  flat_LxM = jax.vmap(lambda k: jax.random.normal(k, (max(lens),), dtype))(keys)
  out = []
  for i, (w, n) in enumerate(zip(leaves, lens, strict=True)):
    z = flat_LxM[i, :n].astype(w.dtype)
    if w.ndim == 2:
      n_in, n_out = w.shape
      out.append((z[:n_out * cfg.rank].reshape(n_out, cfg.rank),
                  z[n_out * cfg.rank:].reshape(n_in, cfg.rank)))
    else:
      out.append(z.reshape(w.shape))
  return jax.tree.unflatten(treedef, out)


def _apply(params: PyTree, eps: PyTree, sign: jax.ArrayLike, cfg: EggrollConfig) -> PyTree:
  """params + sign * sigma * eps, with matrices as factored `LowRank` leaves."""
  leaves, treedef = jax.tree.flatten(params)
  eps_leaves = treedef.flatten_up_to(eps)
  scale = sign * cfg.sigma
  out = []
  for w, e in zip(leaves, eps_leaves, strict=True):
    if w.ndim == 2:
      a, b = e
      out.append(LowRank(w, (scale / math.sqrt(cfg.rank)) * a, b))
    else:
      out.append(w + scale * e)
  return jax.tree.unflatten(treedef, out)


def perturb(params: PyTree, key: jax.Array, member: jax.ArrayLike, sign: jax.ArrayLike,
            cfg: EggrollConfig) -> PyTree:
  """One perturbed model: matrices become `LowRank` leaves, other leaves are shifted.

  `key` is the step key `fold_in(base_key, step)`, `member` the noise index (antithetic
  partners share it) and `sign` +1 or -1.
  """
  return _apply(params, noise(params, key, member, cfg), sign, cfg)


def _by_chunk(one_noise: Callable, cfg: EggrollConfig, *xs_N: PyTree) -> PyTree:
  """`one_noise(n, *x[n])` for every noise index n, leading [num_noise] axis on the outputs.

  `vmap` over a chunk's pop_chunk / n_signs noise indices and `lax.map` over chunks, so
  memory is bounded by one chunk; every x has a leading [num_noise] axis.
  """
  per_chunk, n_chunk = cfg.chunk // len(cfg.signs), cfg.pop // cfg.chunk
  split = lambda x: x.reshape((n_chunk, per_chunk) + x.shape[1:])

  def one_chunk(args):
    c, *xs = args
    return jax.vmap(one_noise)(c * per_chunk + jnp.arange(per_chunk), *xs)

  out = jax.lax.map(one_chunk, (jnp.arange(n_chunk), *jax.tree.map(split, xs_N)))
  return jax.tree.map(lambda x: x.reshape((cfg.num_noise,) + x.shape[2:]), out)


def population_losses(params: PyTree, batch: Any, key: jax.Array, step: jax.ArrayLike,
                      loss_fn: LossFn, cfg: EggrollConfig) -> jax.Array:
  """Loss of every member on the same batch, [pop], member m = noise * n_signs + sign index."""
  skey = jax.random.fold_in(key, step)
  signs = jnp.asarray(cfg.signs, jnp.float32)

  def one_noise(n):
    eps = noise(params, skey, n, cfg)
    return jax.vmap(lambda s: loss_fn(_apply(params, eps, s, cfg), batch))(signs)

  return _by_chunk(one_noise, cfg).reshape(cfg.pop)


def fitness(loss_P: jax.Array) -> jax.Array:
  """-loss z-scored across the population (zero if all losses are equal)."""
  centred = loss_P - jnp.mean(loss_P)
  std = jnp.std(loss_P)
  return jnp.where(std > 0, -centred / jnp.where(std > 0, std, 1.0), 0.0)


def _weighted_noise_sum(params: PyTree, skey: jax.Array, weight_N: jax.Array,
                        cfg: EggrollConfig) -> PyTree:
  """sum_n weight_n eps_n, as B A^T / sqrt(r) for matrices, chunk by chunk."""
  per_chunk = cfg.chunk // len(cfg.signs)
  weight_CxP = weight_N.reshape(-1, per_chunk)
  leaves, treedef = jax.tree.flatten(params)

  def body(acc, xs):
    c, w_P = xs
    eps = jax.vmap(lambda n: noise(params, skey, n, cfg))(c * per_chunk + jnp.arange(per_chunk))
    new = []
    for g, w, e in zip(acc, leaves, treedef.flatten_up_to(eps), strict=True):
      if w.ndim == 2:
        a_PxOxR, b_PxIxR = e
        wb_PxIxR = b_PxIxR * w_P[:, None, None].astype(w.dtype)
        new.append(g + jnp.einsum("pir,por->io", wb_PxIxR, a_PxOxR) / math.sqrt(cfg.rank))
      else:
        new.append(g + jnp.tensordot(w_P.astype(w.dtype), e, axes=1))
    return new, None

  zeros = [jnp.zeros_like(w) for w in leaves]
  acc, _ = jax.lax.scan(body, zeros, (jnp.arange(weight_CxP.shape[0]), weight_CxP))
  return jax.tree.unflatten(treedef, acc)


def estimate_from_losses(params: PyTree, loss_P: jax.Array, key: jax.Array, step: jax.ArrayLike,
                         cfg: EggrollConfig) -> tuple[PyTree, dict[str, jax.Array]]:
  """The EGGROLL update (-g above) from the population's losses, and their statistics."""
  fit_NxS = fitness(loss_P).reshape(cfg.num_noise, len(cfg.signs))
  weight_N = fit_NxS @ jnp.asarray(cfg.signs, fit_NxS.dtype)  # sum over signs of f * sign
  g = _weighted_noise_sum(params, jax.random.fold_in(key, step), weight_N, cfg)
  grads = jax.tree.map(lambda x: -x / (cfg.pop * cfg.sigma), g)
  metrics = {
      "loss_mean": jnp.mean(loss_P),
      "loss_std": jnp.std(loss_P),
      "loss_min": jnp.min(loss_P),
      "loss_max": jnp.max(loss_P),
      "grad_norm": optax.tree.norm(grads),
  }
  return grads, metrics


def estimate(params: PyTree, batch: Any, key: jax.Array, step: jax.ArrayLike, loss_fn: LossFn,
             cfg: EggrollConfig) -> tuple[PyTree, dict[str, jax.Array]]:
  """The EGGROLL update as a loss gradient (-g above) and population loss statistics."""
  loss_P = population_losses(params, batch, key, step, loss_fn, cfg)
  return estimate_from_losses(params, loss_P, key, step, cfg)


def stream_losses(params: PyTree, segments_N: PyTree, carry_P: PyTree, key: jax.Array,
                  step: jax.ArrayLike, loss_fn: StreamLossFn, cfg: EggrollConfig
                  ) -> tuple[jax.Array, PyTree]:
  """Each member on its own stream: (loss [pop], carried state [pop, ...]).

  `segments_N` has a leading [num_noise] axis: noise index n's segment, read by both of
  its antithetic members (2n, 2n + 1), as the reference LM feeds each pair its own stream.
  `carry_P` (leading [pop]) is each member's state from the previous update;
  `loss_fn(params, segment, carry) -> (loss, new carry)`. Chunked like `population_losses`.
  """
  skey = jax.random.fold_in(key, step)
  signs = jnp.asarray(cfg.signs, jnp.float32)

  def one_noise(n, segment, carry_S):
    eps = noise(params, skey, n, cfg)
    return jax.vmap(lambda s, c: loss_fn(_apply(params, eps, s, cfg), segment, c))(signs, carry_S)

  carry_NxS = jax.tree.map(lambda x: x.reshape((cfg.num_noise, len(cfg.signs)) + x.shape[1:]),
                           carry_P)
  loss, carry = _by_chunk(one_noise, cfg, segments_N, carry_NxS)
  merge = lambda x: x.reshape((cfg.pop,) + x.shape[2:])
  return loss.reshape(cfg.pop), jax.tree.map(merge, carry)


def make_step(loss_fn: LossFn, cfg: EggrollConfig, optimizer: optax.GradientTransformation
              ) -> Callable[..., tuple[PyTree, optax.OptState, dict[str, jax.Array]]]:
  """A pure, jittable `step(params, opt_state, batch, key, step) -> (params, opt_state, metrics)`.

  `key` is the run's base key; the step index goes into the noise keys, so any update can
  be replayed from (key, step) alone. Initialise with `optimizer.init(params)`.
  """

  def step_fn(params: PyTree, opt_state: optax.OptState, batch: Any, key: jax.Array,
              step: jax.ArrayLike):
    grads, metrics = estimate(params, batch, key, step, loss_fn, cfg)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics

  return step_fn
