"""The one-step descent ratio rho and the effective rank r of a loss (SPEC 9.7).

Under a local quadratic model (gradient g, Hessian H) a step -eta u lowers the loss by
eta g.u - eta^2 u.H.u / 2. With one step size for every draw of an SPSA estimate g_hat
(as training has), the best expected decrease is (E g.g_hat)^2 / (2 E g_hat.H.g_hat), and
along g itself ||g||^4 / (2 g.H.g). Their ratio is the descent ratio

  rho = (E g.g_hat)^2 g.H.g / (E[g_hat.H.g_hat] ||g||^4)  ~  n / (r + n),
  r = tr(H) ||g||^2 / (g.H.g)                               (the effective rank),

for n directions per update (MeZO's argument; r = d for an isotropic H). For dense
Rademacher probes the exact value is n / (r + n + 1 - 2 sum_i g_i^2 H_ii / g.H.g); the
extra order-one terms vanish against r at the widths studied here.

Two measurements of rho, both from the estimates `spsa.estimate` makes (repeat k is the
estimate of update step k, so the probes are training's own), on the same batch as the
gradient g = `jax.grad`:
- "line_search": forward passes only. The mean decrease over the repeats, L(theta) -
  mean_k L(theta - eta g_hat_k), is searched over eta on a doubling grid until bracketed,
  then refined at the vertex of the parabola through the bracket; likewise along g. The
  ratio of the two best decreases is rho. On a quadratic loss this is exact (the
  parabola is the loss).
- "hvp": the formula above with one Hessian-vector product (`jax.jvp` of `jax.grad`)
  per repeat: exact under the quadratic model, whatever the loss.
r always comes from Hessian-vector products: tr(H) by Hutchinson (dense Rademacher v,
tr H = E v.H.v) and g.H.g by one product. Not from cos^2(g_hat, g), which for these probes
depends on d and n only (SPEC 9.7).

Over several batches, rho = sum_b best decrease along g_hat / sum_b best along g, and
r = sum_b tr(H_b) ||g_b||^2 / sum_b g_b.H_b.g_b; their Monte Carlo standard errors are
delete-one jackknives over the batches (which carries both batch and probe noise), or
over the repeats (for rho) and the Hutchinson vectors (for r) when there is one batch.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import spsa

PyTree = Any
# (body, head, batch_AxBxT1) -> scalar: the loss a measurement descends (the model's mean
# loss over the update's A batches, or a quadratic in the tests).
BatchLoss = Callable[[PyTree, jax.Array, jax.Array], jax.Array]
RHO_BY = ("line_search", "hvp")  # how rho is measured


def predicted_rho(r: float, n: int) -> float:
  """n / (r + n): the descent ratio the effective rank r implies for n directions."""
  return n / (r + n)


# ------------------------------------------------------------------------- primitives


def tree_dot(a: PyTree, b: PyTree) -> jax.Array:
  """sum_i a_i b_i over every leaf."""
  return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def hvp(f: Callable[[PyTree], jax.Array], params: PyTree, v: PyTree) -> PyTree:
  """H v, H the Hessian of f at params: forward-mode over the gradient."""
  return jax.jvp(jax.grad(f), (params,), (v,))[1]


@functools.partial(jax.jit, static_argnames=("cfg", "repeats", "loss_fn"))
def spsa_estimates(body: PyTree, head: jax.Array, batch_AxBxT1: jax.Array, eps: jax.Array,
                   base_key: jax.Array, expert: jax.Array, cfg: spsa.SpsaConfig, repeats: int,
                   loss_fn: spsa.LossFn | None = None) -> PyTree:
  """[R, ...]: the estimates `spsa.estimate` makes for one model (as expert `expert`) at
  update steps 0..R-1, all on this batch: R independent draws of its cfg.n_pert x A probes."""
  body_N = jax.tree.map(lambda x: x[None], body)
  ids = jnp.reshape(expert, (1,)).astype(jnp.int32)

  def one(step):
    g_N, _ = spsa.estimate(body_N, head, batch_AxBxT1[None], jnp.reshape(eps, (1,)), step, ids,
                           base_key, cfg, loss_fn=loss_fn, shared_head=True)
    return jax.tree.map(lambda x: x[0], g_N)

  return jax.lax.map(one, jnp.arange(repeats))


class Curvature(NamedTuple):
  """One batch's quadratic model, along g and along each estimate."""

  g_sq: float  # ||g||^2
  g_h_g: float  # g.H.g
  g_dot_ghat_R: np.ndarray  # g.g_hat_k
  ghat_h_ghat_R: np.ndarray  # g_hat_k.H.g_hat_k
  v_h_v_M: np.ndarray  # Hutchinson samples v_m.H.v_m (E = tr H)


@functools.partial(jax.jit, static_argnames=("vectors", "with_estimates"))
def _curvature(f, params, g, ghat_R, key, vectors: int, with_estimates: bool):
  hv = lambda v: tree_dot(v, hvp(f, params, v))
  leaves, treedef = jax.tree.flatten(params)

  def rademacher(k):
    keys = jax.random.split(k, len(leaves))
    return jax.tree.unflatten(treedef, [jax.random.rademacher(kk, x.shape, x.dtype)
                                        for kk, x in zip(keys, leaves)])

  v_h_v = jax.lax.map(lambda k: hv(rademacher(k)), jax.random.split(key, vectors))
  if with_estimates:
    dots = jax.lax.map(lambda u: jnp.stack([tree_dot(g, u), hv(u)]), ghat_R)
  else:
    dots = jnp.zeros((0, 2), v_h_v.dtype)
  return tree_dot(g, g), hv(g), dots, v_h_v


def curvature(f: Callable[[PyTree], jax.Array], params: PyTree, g: PyTree, ghat_R: PyTree | None,
              key: jax.Array, vectors: int) -> Curvature:
  """g.g, g.H.g, g.g_hat_k and g_hat_k.H.g_hat_k (none if ghat_R is None), and `vectors`
  Hutchinson samples of tr H, with H the Hessian of f at params."""
  g_sq, g_h_g, dots, v_h_v = _curvature(f, params, g, g if ghat_R is None else ghat_R, key,
                                        vectors, ghat_R is not None)
  dots = np.asarray(dots, np.float64)
  return Curvature(float(g_sq), float(g_h_g), dots[:, 0], dots[:, 1],
                   np.asarray(v_h_v, np.float64))


# ------------------------------------------------------------------------ line search


class Search(NamedTuple):
  """A line search's evaluated step sizes and the per-repeat decreases at each."""

  etas_P: np.ndarray
  decrease_RxP: np.ndarray  # L(theta) - L(theta - eta_p u_k)

  @property
  def best(self) -> float:
    return float(self.decrease_RxP.mean(axis=0).max())

  @property
  def eta(self) -> float:
    return float(self.etas_P[int(self.decrease_RxP.mean(axis=0).argmax())])

  def leave_one_out(self) -> np.ndarray:
    """[R]: the best mean decrease with repeat k left out, over the same step sizes."""
    r = self.decrease_RxP.shape[0]
    loo = (self.decrease_RxP.sum(axis=0) - self.decrease_RxP) / (r - 1)
    return loo.max(axis=1)


@jax.jit
def _decreases(f, params, u_R, eta):
  base = f(params)
  return jax.lax.map(
      lambda u: base - f(jax.tree.map(lambda p, d: p - (eta * d).astype(p.dtype), params, u)),
      u_R)


def line_search(f: Callable[[PyTree], jax.Array], params: PyTree, u_R: PyTree, eta0: float,
                max_evals: int = 60) -> Search:
  """The best mean decrease of f along -eta u_k (one eta for every repeat k), forward only.

  Doubles or halves eta from eta0 until the mean decrease at eta exceeds both neighbours
  (eta / 2, 2 eta) and is positive, then evaluates the vertex of the parabola through the
  three (exact for a quadratic f). Every evaluated eta is kept, for the jackknife.
  """
  cache: dict[float, np.ndarray] = {}

  def mean(eta: float) -> float:
    if eta not in cache:
      cache[eta] = np.asarray(_decreases(f, params, u_R, jnp.asarray(eta)), np.float64)
    return float(cache[eta].mean())

  eta = float(eta0)
  for _ in range(max_evals):
    here, up, down = mean(eta), mean(2 * eta), mean(eta / 2)
    if up > here:
      eta *= 2
    elif down > here:
      eta /= 2
    elif here > 0:
      _vertex(mean, eta)
      break
    else:  # flat at zero: too small a step to resolve in floating point
      eta *= 2
  etas = np.array(sorted(cache))
  return Search(etas, np.stack([cache[e] for e in etas], axis=1))


def _vertex(mean: Callable[[float], float], eta: float) -> None:
  """Evaluates the vertex of the parabola through eta / 2, eta, 2 eta (a maximum)."""
  x = np.array([eta / 2, eta, 2 * eta])
  a, b, _ = np.polyfit(x, [mean(e) for e in x], 2)
  if a < 0:
    mean(float(np.clip(-b / (2 * a), x[0], x[-1])))


# ------------------------------------------------------------------------ measurement


class BatchDescent(NamedTuple):
  """One batch: best decreases along g and g_hat, and its curvature."""

  along_g: float
  along_ghat: float
  along_ghat_loo_R: np.ndarray  # with repeat k left out
  eta_g: float
  eta_ghat: float
  curv: Curvature


def batch_descent(loss: BatchLoss, body: PyTree, head: jax.Array, batch_AxBxT1: jax.Array,
                  eps: float, cfg: spsa.SpsaConfig, base_key: jax.Array, *, repeats: int,
                  hutchinson: int, rho_by: str = "line_search", expert: int = 0,
                  loss_fn: spsa.LossFn | None = None) -> BatchDescent:
  """The descent of one model on one batch: g by `jax.grad` of `loss`, the R estimates of
  `spsa_estimates` (with `loss_fn`, None = the model's own), rho's two decreases by
  `rho_by`, and the Hutchinson trace from `hutchinson` vectors."""
  if rho_by not in RHO_BY:
    raise ValueError(f"rho_by must be one of {RHO_BY}, got {rho_by!r}")
  if repeats < 2 or hutchinson < 1:
    raise ValueError("need repeats >= 2 (for the jackknife) and hutchinson >= 1")
  f = jax.tree_util.Partial(_body_last(loss), head, batch_AxBxT1)
  g = jax.grad(f)(body)
  eps_a = jnp.asarray(eps, jax.tree.leaves(body)[0].dtype)
  ghat_R = spsa_estimates(body, head, batch_AxBxT1, eps_a, base_key, jnp.asarray(expert), cfg,
                          repeats, loss_fn)
  curv = curvature(f, body, g, ghat_R if rho_by == "hvp" else None,
                   jax.random.fold_in(base_key, 1 << 20), hutchinson)
  if rho_by == "hvp":
    along_g = curv.g_sq**2 / (2 * curv.g_h_g)
    a, b = curv.g_dot_ghat_R, curv.ghat_h_ghat_R
    best = lambda a, b: a.mean() ** 2 / (2 * b.mean())
    loo = np.array([best(np.delete(a, k), np.delete(b, k)) for k in range(repeats)])
    return BatchDescent(along_g, best(a, b), loo, curv.g_sq / curv.g_h_g,
                        a.mean() / b.mean(), curv)
  search_g = line_search(f, body, jax.tree.map(lambda x: x[None], g), 1 / np.sqrt(curv.g_sq))
  search = line_search(f, body, ghat_R, search_g.eta)
  return BatchDescent(search_g.best, search.best, search.leave_one_out(), search_g.eta,
                      search.eta, curv)


@functools.cache
def _body_last(loss: BatchLoss) -> Callable:
  """loss with the body last, one function object per loss (so jit caches by it): the
  measured f(body) is `jax.tree_util.Partial(_body_last(loss), head, batch)`."""
  return lambda head, batch, body: loss(body, head, batch)


@functools.cache
def summed(loss: BatchLoss, axis: int = 0) -> BatchLoss:
  """The summed-loss estimator's loss from one model's `loss` (SPEC 9.7): over N bodies
  stacked on a leading axis, heads [N, ...] and a batch with its expert axis at `axis`,
  sum_e loss(body_e, head_e, batch_e). Measured over the stacked bodies (`measure`), its
  Hessian is block diagonal (one block per expert) and one SPSA direction spans every
  expert's parameters: the control that sums the N losses before each difference. axis=1
  for `measure`'s batches [A, N, B, T + 1] (the loss g is taken of), axis=0 for the SPSA
  loss_fn's accumulation batch [N, B, T + 1]. One function per (loss, axis), so jit caches
  by it."""

  def loss_n(body_N: PyTree, head_N: PyTree, batch: jax.Array) -> jax.Array:
    return jnp.sum(jax.vmap(loss, in_axes=(0, 0, axis))(body_N, head_N, batch))

  return loss_n


def jackknife(full: float, loo_U: np.ndarray) -> float:
  """The delete-one jackknife standard error of a statistic from its leave-one-out values."""
  u = loo_U.shape[0]
  return float(np.sqrt((u - 1) / u * np.sum((loo_U - loo_U.mean()) ** 2))) if u > 1 else float("nan")


def fingerprint(batch: jax.typing.ArrayLike) -> str:
  """A short SHA-256 of a batch's bytes: which windows a measurement used."""
  return hashlib.sha256(np.ascontiguousarray(np.asarray(batch)).tobytes()).hexdigest()[:16]


def summarise(per_batch: Sequence[BatchDescent], n: int, params: int, rho_by: str) -> dict:
  """rho, r and their standard errors over batches (see the module docstring)."""
  dg = np.array([b.along_g for b in per_batch])
  dh = np.array([b.along_ghat for b in per_batch])
  tr = np.array([b.curv.v_h_v_M.mean() * b.curv.g_sq for b in per_batch])
  ghg = np.array([b.curv.g_h_g for b in per_batch])
  rho, r = dh.sum() / dg.sum(), tr.sum() / ghg.sum()
  if len(per_batch) > 1:
    keep = lambda x, i: np.delete(x, i).sum()
    rho_loo = np.array([keep(dh, i) / keep(dg, i) for i in range(len(dg))])
    r_loo = np.array([keep(tr, i) / keep(ghg, i) for i in range(len(dg))])
  else:
    one = per_batch[0]
    rho_loo = one.along_ghat_loo_R / one.along_g
    v = one.curv.v_h_v_M
    r_loo = ((v.sum() - v) / max(v.size - 1, 1)) * one.curv.g_sq / one.curv.g_h_g
  return {
      "rho": float(rho), "rho_se": jackknife(rho, rho_loo), "rho_by": rho_by,
      "r": float(r), "r_se": jackknife(r, r_loo), "r_by": "hvp (Hutchinson tr H)",
      "n": n, "params": params, "predicted_rho": predicted_rho(float(r), n),
      # what r = d (an isotropic H, or cos^2(g_hat, g)) would predict
      "predicted_rho_isotropic": predicted_rho(float(params), n),
      "per_batch": [{"decrease_g": b.along_g, "decrease_ghat": b.along_ghat,
                     "eta_g": b.eta_g, "eta_ghat": b.eta_ghat, "g_sq": b.curv.g_sq,
                     "g_h_g": b.curv.g_h_g, "trace_h": float(b.curv.v_h_v_M.mean())}
                    for b in per_batch],
  }


def measure(loss: BatchLoss, body: PyTree, head: jax.Array, batches: Sequence[jax.Array],
            eps: float, cfg: spsa.SpsaConfig, base_key: jax.Array, *, repeats: int,
            hutchinson: int, rho_by: str = "line_search", expert: int = 0,
            loss_fn: spsa.LossFn | None = None) -> dict:
  """rho and r of one model over `batches` ([A, B, T + 1] each, A = cfg.accum), with the
  fingerprints of the batches it used; see `batch_descent` for the arguments."""
  per = [batch_descent(loss, body, head, b, eps, cfg, base_key, repeats=repeats,
                       hutchinson=hutchinson, rho_by=rho_by, expert=expert, loss_fn=loss_fn)
         for b in batches]
  params = sum(x.size for x in jax.tree.leaves(body))
  out = summarise(per, cfg.n_pert * cfg.accum, params, rho_by)
  out.update(repeats=repeats, hutchinson=hutchinson, batch_fingerprints=[fingerprint(b) for b in batches])
  return out


# ------------------------------------------------ predicted progress ratios (the width ladder)


def rho_of(per_batch: list[dict]) -> float:
  """rho over batches: summed best decreases along g_hat over those along g (`descent`)."""
  return sum(b["decrease_ghat"] for b in per_batch) / sum(b["decrease_g"] for b in per_batch)


def predicted(experts: list[dict], monolith: dict) -> dict:
  """mean_e rho_e / rho_mono, and the same ratio from r alone (n / (r + n)).

  Its standard error is a delete-one-batch jackknife over the shared windows (dropping a
  batch of expert e drops it from expert e's sums and from the monolith's, which was measured
  on the same batch, so batch noise common to both cancels), given at least 2 batches per
  expert; else the delta method with the two errors taken as independent.
  """
  rho_e = float(np.mean([x["rho"] for x in experts]))
  ratio = rho_e / monolith["rho"]
  counts = [len(x["per_batch"]) for x in experts]
  if min(counts) >= 2:
    loo = []
    offsets = np.cumsum([0] + counts)
    for e, k in enumerate(counts):
      for i in range(k):
        drop = lambda b, j: b[:j] + b[j + 1:]
        rho_loo = [rho_of(drop(x["per_batch"], i) if f == e else x["per_batch"])
                   for f, x in enumerate(experts)]
        loo.append(np.mean(rho_loo) / rho_of(drop(monolith["per_batch"], offsets[e] + i)))
    se, how = jackknife(ratio, np.array(loo)), "jackknife over the shared batches"
  else:
    se, how = _delta_se(experts, monolith, ratio)
  from_r = np.mean([x["predicted_rho"] for x in experts]) / monolith["predicted_rho"]
  return {"rho_expert": rho_e, "predicted_ratio": float(ratio),
          "predicted_ratio_se": float(se), "predicted_ratio_se_by": how,
          "predicted_ratio_from_r": float(from_r)}


def _delta_se(experts: list[dict], other: dict, ratio: float) -> tuple[float, str]:
  """The SE of mean_e rho_e / rho_other by the delta method, the errors taken as independent."""
  rho_e = float(np.mean([x["rho"] for x in experts]))
  se_e = np.sqrt(np.sum([x["rho_se"] ** 2 for x in experts])) / len(experts)
  se = ratio * np.sqrt((se_e / rho_e) ** 2 + (other["rho_se"] / other["rho"]) ** 2)
  return se, "delta method, errors taken as independent"


def predicted_vs_summed(experts: list[dict], summed: dict) -> dict:
  """mean_e rho_e / rho_summed, and the same ratio from r alone (n / (r + n)).

  Its standard error is a delete-one-batch jackknife over the shared windows: summed batch k
  holds every expert's batch k, so dropping unit k drops batch k from each expert's sums and
  from the summed estimator's, given at least 2 batches each; else the delta method with
  the errors taken as independent (as `predicted`).
  """
  rho_e = float(np.mean([x["rho"] for x in experts]))
  ratio = rho_e / summed["rho"]
  counts = [len(x["per_batch"]) for x in experts] + [len(summed["per_batch"])]
  if min(counts) >= 2:
    drop = lambda b, i: b[:i] + b[i + 1:]  # noqa: E731 - unit i past b's end keeps b
    loo = [np.mean([rho_of(drop(x["per_batch"], i)) for x in experts])
           / rho_of(drop(summed["per_batch"], i)) for i in range(max(counts))]
    se, how = jackknife(ratio, np.array(loo)), "jackknife over the shared batches"
  else:
    se, how = _delta_se(experts, summed, ratio)
  from_r = np.mean([x["predicted_rho"] for x in experts]) / summed["predicted_rho"]
  return {"predicted_vs_summed": float(ratio), "predicted_vs_summed_se": float(se),
          "predicted_vs_summed_se_by": how, "predicted_vs_summed_from_r": float(from_r)}
