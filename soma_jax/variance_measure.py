"""Measured SPSA gradient variance against the theory of SPEC 5.

The measurement primitive is `probe_stats`: for every repeat r (update `step` r), expert e
and direction j it evaluates the central difference of the expert's loss on each of S
sequence groups,

  D[r, e, j, s] = [L_e,s(theta_e + eps z_ej) - L_e,s(theta_e - eps z_ej)] / (2 eps),

with z_ej = probe(probe_key(base_key, step, e, 0, j)), exactly the directions and the
difference `spsa.estimate` uses, plus the direction Gram matrix z_j . z_k and the
projections z_j . m_c on a few centres m_c (the exact gradient, q * g, a reference). Any
estimate g_hat = sum_j w_j z_j built from those directions then has the squared error

  ||g_hat - m||^2 = w^T G w - 2 w^T (Z m) + ||m||^2

without forming g_hat, so one compiled call serves every n_pert (disjoint blocks of
directions), every batch size (disjoint blocks of sequence groups), accumulation, and
shared-loss groupings (sums of D over the experts of a group). Block 0 of step r with
n_pert = K is bit-for-bit the estimate `spsa.estimate` makes at that step; block b uses
direction indices b K .. (b + 1) K - 1 of the same step (independent, identically
distributed directions). Centred variance is measured around the estimator's exact
small-eps mean q * g (q = E z^2), with q = 1 for dense probes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import model as model_lib
from soma_jax import spsa

PyTree = Any
LossFn = Callable[[PyTree, jax.Array, jax.Array], jax.Array]


# ---------------------------------------------------------------------------- pytrees


def flat_N(tree_N: PyTree) -> jax.Array:
  """[N, d]: each expert's parameters as one vector (leaf order of `jax.tree.leaves`)."""
  leaves = jax.tree.leaves(tree_N)
  return jnp.concatenate([x.reshape(x.shape[0], -1) for x in leaves], axis=1)


def _flat(tree: PyTree) -> jax.Array:
  return jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(tree)])


def take_experts(body_N: PyTree, head: jax.Array, ids: Sequence[int],
                 shared_head: bool) -> tuple[PyTree, jax.Array]:
  """Experts `ids` (repeats allowed) of a stacked ensemble, with their heads."""
  idx = np.asarray(ids)
  body = jax.tree.map(lambda x: x[idx], body_N)
  return body, (head if shared_head else head[idx])


# ------------------------------------------------------------------- exact gradients


@functools.partial(jax.jit, static_argnames=("shared_head", "loss_fn"))
def exact_grads(body_N: PyTree, head: jax.Array, batch_NxBxT1: jax.Array,
                shared_head: bool = True, loss_fn: LossFn = model_lib.loss) -> PyTree:
  """Each expert's `jax.grad` of its own loss on its own batch."""
  return jax.vmap(jax.grad(loss_fn), in_axes=(0, None if shared_head else 0, 0))(
      body_N, head, batch_NxBxT1)


@functools.partial(jax.jit, static_argnames=("shared_head", "chunk", "loss_fn"))
def pool_grad_moments(body_N: PyTree, head: jax.Array, pool_NxPxT1: jax.Array,
                      shared_head: bool = True, chunk: int = 16,
                      loss_fn: LossFn = model_lib.loss) -> tuple[jax.Array, jax.Array]:
  """(g_NxD, var_NxD): the pool's mean gradient and each coordinate's per-sequence variance.

  g is the large-batch backprop gradient over all P pool sequences; var = mean_p (g_p - g)^2
  is the batch noise of one sequence drawn from the pool with replacement.
  """
  def one_expert(body, head_e, pool_PxT1):
    grad_seq = lambda w: _flat(jax.grad(loss_fn)(body, head_e, w[None]))
    g_PxD = jax.lax.map(grad_seq, pool_PxT1, batch_size=chunk)
    g = jnp.mean(g_PxD, axis=0)
    return g, jnp.mean((g_PxD - g) ** 2, axis=0)

  return jax.vmap(one_expert, in_axes=(0, None if shared_head else 0, 0))(
      body_N, head, pool_NxPxT1)


def pool_grad_stats(body_N: PyTree, head: jax.Array, pool_NxPxT1: jax.Array,
                    shared_head: bool = True, chunk: int = 16,
                    loss_fn: LossFn = model_lib.loss) -> tuple[jax.Array, jax.Array]:
  """(g_NxD, sigma2_N): `pool_grad_moments` with sigma^2 = mean_p ||g_p - g||^2 per expert."""
  g, var = pool_grad_moments(body_N, head, pool_NxPxT1, shared_head, chunk, loss_fn)
  return g, jnp.sum(var, axis=-1)


def second_moment_N(body_N: PyTree, kind: str) -> jax.Array:
  """[N, d]: q = E z^2 of each coordinate under the probe `kind`."""
  return flat_N(spsa.probe_second_moment(body_N, kind))


# ---------------------------------------------------------------------- measurement


class ProbeStats(NamedTuple):
  """Everything the error of any estimate built from a run's directions depends on."""

  diff_RxNxJxS: np.ndarray  # central differences per repeat, expert, direction, group
  gram_RxNxJxJ: np.ndarray  # z_j . z_k per expert
  proj_RxNxJxC: np.ndarray  # z_j . m_c per expert and centre
  centre_sq_NxC: np.ndarray  # ||m_c||^2 per expert


@functools.partial(jax.jit, static_argnames=(
    "n_dirs", "kind", "shared_head", "dir_chunk", "rep_chunk", "loss_fn"))
def _probe_stats(body_N, head, windows, centres_NxCxD, eps_N, steps_R, expert_ids_N, base_key,
                 *, n_dirs, kind, shared_head, dir_chunk, rep_chunk, loss_fn):
  fixed = windows.ndim == 4  # [N, S, B, T1] for every repeat, else [R, N, S, B, T1]

  def expert_stats(step, body, head_e, win_SxBxT1, centres_CxD, eps, expert):
    def direction(j):
      z = spsa.probe(spsa.probe_key(base_key, step, expert, 0, j), body, kind)
      def loss_at(sign):
        moved = jax.tree.map(lambda p, d: p + sign * eps * d, body, z)
        return jax.vmap(lambda w: loss_fn(moved, head_e, w))(win_SxBxT1)
      loss_2xS = jax.vmap(loss_at)(jnp.array([1.0, -1.0], eps.dtype))  # one traced forward
      return (loss_2xS[0] - loss_2xS[1]) / (2 * eps), _flat(z)

    diff_JxS, z_JxD = jax.lax.map(direction, jnp.arange(n_dirs), batch_size=dir_chunk)
    return diff_JxS, z_JxD @ z_JxD.T, z_JxD @ centres_CxD.T

  def one_rep(args):
    step, win = args
    win = windows if fixed else win
    return jax.vmap(functools.partial(expert_stats, step),
                    in_axes=(0, None if shared_head else 0, 0, 0, 0, 0))(
        body_N, head, win, centres_NxCxD, eps_N, expert_ids_N)

  xs = (steps_R, steps_R if fixed else windows)
  return jax.lax.map(one_rep, xs, batch_size=rep_chunk)


def probe_stats(body_N: PyTree, head: jax.Array, windows: jax.Array,
                centres_NxCxD: jax.Array, eps: float, steps_R: jax.Array,
                expert_ids_N: jax.Array, base_key: jax.Array, *, n_dirs: int,
                kind: str = "rademacher", shared_head: bool = True, dir_chunk: int = 16,
                rep_chunk: int = 4, loss_fn: LossFn = model_lib.loss) -> ProbeStats:
  """Central differences, Gram matrices and centre projections for R repeats (see module doc).

  windows: [N, S, B, T+1] fixed sequence groups for every repeat, or [R, N, S, B, T+1] with
  each repeat's own groups. Each group's loss is the mean over its B windows. Repeat r draws
  its n_dirs directions at update `steps_R[r]`, so repeats are independent.
  """
  n = expert_ids_N.shape[0]
  dtype = jax.tree.leaves(body_N)[0].dtype
  eps_N = jnp.full((n,), eps, dtype)
  out = _probe_stats(body_N, head, jnp.asarray(windows), centres_NxCxD.astype(dtype), eps_N,
                     jnp.asarray(steps_R), jnp.asarray(expert_ids_N), base_key,
                     n_dirs=n_dirs, kind=kind, shared_head=shared_head,
                     dir_chunk=min(dir_chunk, n_dirs), rep_chunk=min(rep_chunk, len(steps_R)),
                     loss_fn=loss_fn)
  diff, gram, proj = (np.asarray(x, np.float64) for x in out)
  centre_sq = np.sum(np.asarray(centres_NxCxD, np.float64) ** 2, axis=-1)
  return ProbeStats(diff, gram, proj, centre_sq)


def block_errors(stats: ProbeStats, n_pert: int, *, n_groups: int = 1, accum: int = 1,
                 centre: int = 0, loss_groups: Sequence[int] | None = None,
                 max_blocks: int | None = None) -> np.ndarray:
  """[R, N]: per repeat, the mean over disjoint blocks of ||g_hat_e - m_e||^2.

  One block is one estimate: `accum` accumulation batches, each of `n_pert` directions
  and `n_groups` sequence groups (B = n_groups * group size). Blocks use disjoint
  directions; when the repeat holds fewer disjoint sequence blocks than direction blocks
  they are reused (each block stays an unbiased draw; error bars are over repeats). `loss_groups` sums the differences of each group of experts
  before weighting the directions (the shared-loss estimator).
  """
  r, n, j_max, s_max = stats.diff_RxNxJxS.shape
  per = n_pert * accum
  seq_blocks = s_max // (n_groups * accum)  # blocks beyond these reuse sequence groups
  blocks = j_max // per if seq_blocks else 0
  if max_blocks:
    blocks = min(blocks, max_blocks)
  if blocks < 1:
    raise ValueError(f"{j_max} directions x {s_max} groups cannot hold one block of "
                     f"n_pert={n_pert}, groups={n_groups}, accum={accum}")
  err = np.zeros((r, n))
  for b in range(blocks):
    dirs, coef = [], []
    for a in range(accum):
      k = b * accum + a
      d = np.arange(k * n_pert, (k + 1) * n_pert)
      ks = (b % seq_blocks) * accum + a
      s = slice(ks * n_groups, (ks + 1) * n_groups)
      dirs.append(d)
      coef.append(stats.diff_RxNxJxS[:, :, d, s].mean(-1))
    d = np.concatenate(dirs)
    c_RxNxJ = np.concatenate(coef, axis=-1)
    if loss_groups is not None:
      ids = np.asarray(loss_groups)
      sums = np.zeros((r, ids.max() + 1, c_RxNxJ.shape[-1]))
      np.add.at(sums, (slice(None), ids), c_RxNxJ)
      c_RxNxJ = sums[:, ids]
    w = c_RxNxJ / per
    gram = stats.gram_RxNxJxJ[:, :, d][:, :, :, d]
    quad = np.einsum("rnj,rnjk,rnk->rn", w, gram, w)
    lin = np.einsum("rnj,rnj->rn", w, stats.proj_RxNxJxC[:, :, d, centre])
    err += quad - 2 * lin + stats.centre_sq_NxC[None, :, centre]
  return err / blocks


def relative(err_RxN: np.ndarray, norm_sq_N: np.ndarray) -> tuple[float, float]:
  """(mean, standard error over repeats) of sum_e err_e / sum_e ||g_e||^2."""
  x = err_RxN.sum(axis=1) / float(np.sum(norm_sq_N))
  se = float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")
  return float(np.mean(x)), se
