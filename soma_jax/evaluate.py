"""Routed ensemble evaluation (SPEC 4): route on bytes 0..255, score targets 257..1024.

Each window's selected experts' next-byte probabilities are averaged uniformly; the
mixture and the loss reduction are in float64. Windows are grouped by expert so each
expert runs once per group of windows routed to it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import model as model_lib

PyTree = Any
ROUTE_BYTES = 256  # the router sees bytes 0..255
SCORED = 768  # targets 257..1024 of a 1,025-byte window


def expert_params(body_N: PyTree, head: jax.Array, e, shared_head: bool):
  body = jax.tree.map(lambda x: x[e], body_N)
  return body, head if shared_head else head[e]


@functools.partial(jax.jit, static_argnames=("shared_head", "first"))
def _target_logprobs(body_N, head, e, windows_BxW, shared_head: bool, first: int):
  body, head_e = expert_params(body_N, head, e, shared_head)
  logits = model_lib.logits(body, head_e, windows_BxW[:, :-1])[:, first - 1:]
  targets = windows_BxW[:, first:].astype(jnp.int32)
  return -model_lib.cross_entropy(logits, targets)


def target_logprobs(body_N: PyTree, head: jax.Array, e: int, windows: np.ndarray,
                    shared_head: bool, batch: int = 64, first: int = ROUTE_BYTES + 1) -> np.ndarray:
  """log p_e(y_t) for targets first..W-1 of each window, [n, W - first], float32.

  Windows run in fixed-size batches (the last one padded) so nothing recompiles.
  """
  n = windows.shape[0]
  out = np.empty((n, windows.shape[1] - first), np.float32)
  for i in range(0, n, batch):
    chunk = windows[i:i + batch]
    pad = batch - chunk.shape[0]
    if pad:
      chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
    lp = _target_logprobs(body_N, head, e, jnp.asarray(chunk), shared_head, first)
    out[i:i + batch] = np.asarray(lp)[:batch - pad]
  return out


def routed_logprobs(body_N: PyTree, head: jax.Array, windows: np.ndarray, routes_nxk: np.ndarray,
                    shared_head: bool, batch: int = 64) -> np.ndarray:
  """log p_e(y_t) for each window's selected experts: [n, k, 768] float32."""
  n, k = routes_nxk.shape
  out = np.empty((n, k, windows.shape[1] - ROUTE_BYTES - 1), np.float32)
  for e in np.unique(routes_nxk):
    rows, slots = np.nonzero(routes_nxk == e)
    out[rows, slots] = target_logprobs(body_N, head, int(e), windows[rows], shared_head, batch)
  return out


def mixture_nats(logprobs_nxkxT: np.ndarray, k: int | None = None) -> np.ndarray:
  """Per-window mean cross entropy of the uniform mixture of the first k experts, float64."""
  lp = logprobs_nxkxT[:, :k].astype(np.float64)
  kk = lp.shape[1]
  mix = np.logaddexp.reduce(lp, axis=1) - np.log(kk)
  return -mix.mean(axis=1)


def ensemble_loss(body_N: PyTree, head: jax.Array, windows: np.ndarray, router, top_k: int,
                  shared_head: bool) -> float:
  """Mean nats/byte of the routed top-k ensemble on 1,025-byte windows."""
  routes = router.route(windows[:, :ROUTE_BYTES], top_k)
  lp = routed_logprobs(body_N, head, windows, routes, shared_head)
  return float(mixture_nats(lp).mean())
