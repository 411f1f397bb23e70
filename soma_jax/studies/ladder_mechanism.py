"""The width ladder's mechanism (`ladder.py`, SPEC 9.7): at a rung's start, the descent ratio
rho and the effective rank r of a seed run under its own estimator (`seed_descent`), and of the
summed-loss estimator over all N experts' bodies (`summed_descent`), on expert-validation
batches every model measured at the rung shares (`measurement_batches`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import descent, memory, runs
from soma_jax import model as model_lib
from soma_jax import spec as spec_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Mechanism:
  """config.mechanism, checked (`MECHANISM_FIELDS`): how rho and r are measured at a rung's
  start (`descent.measure`)."""
  rho_by: str
  batches: int  # expert-validation batches per expert
  repeats: int  # SPSA estimates per batch
  hutchinson: int  # Hutchinson vectors per batch
  seed: int  # the probes' base key

  def record(self) -> dict:
    """results.json's `mechanism`, in config.mechanism.to_dict()'s (sorted) order."""
    return dict(sorted(dataclasses.asdict(self).items()))


def measurement_batches(data_dir: str, spec: spec_lib.RunSpec, count: int
                        ) -> list[list[np.ndarray]]:
  """Per expert, up to `count` batches [A, B, T + 1] of its shard's expert-validation
  windows (held out from training), the same for every model measured at the rung."""
  a, b, t = spec.accum, spec.batch, spec.seq_len
  out = []
  for e in range(spec.n_experts):
    w = pipeline.expert_val_windows(data_dir, e, t)
    k = min(count, w.shape[0] // (a * b))
    if k < 1:
      raise UserError(f"expert {e}'s validation split has {w.shape[0]} windows of {t + 1} bytes; "
                      f"the mechanism needs A x B = {a * b}; fix: a corpus with more text")
    out.append([w[i * a * b:(i + 1) * a * b].reshape(a, b, t + 1) for i in range(k)])
  return out


def batch_loss(body, head, batch_AxBxT1: jax.Array) -> jax.Array:
  """The model's mean loss over an update's A batches (what one update descends)."""
  return jnp.mean(jax.vmap(lambda w: model_lib.loss(body, head, w))(batch_AxBxT1))


def seed_descent(spec: spec_lib.RunSpec, workdir: str, batches: list[np.ndarray],
                 expert: int, m: Mechanism) -> dict:
  """rho and r of the seed run in `workdir` (a compared run's start: its expert 0) under
  the run's estimator, probes drawn as expert `expert`'s."""
  body_N, head, _ = runs.restore_params(workdir)
  body = jax.tree.map(lambda x: x[0], body_N)
  head_e = head if spec.shared_head else head[0]
  cfg = spec.method.step_config().spsa
  with memory.full_precision():
    return descent.measure(batch_loss, body, head_e, [jnp.asarray(b) for b in batches],
                           spec.eps, cfg, jax.random.key(m.seed), repeats=m.repeats,
                           hutchinson=m.hutchinson, rho_by=m.rho_by, expert=expert)


@functools.cache
def _streamed(time_block: int, unroll: int):
  """One expert's SPSA loss (`spsa`'s default, `model.streamed_loss`), one object per
  setting so `descent.summed` and jit cache by it."""
  return functools.partial(model_lib.streamed_loss, time_block=time_block, unroll=unroll)


def summed_batches(batches: list[list[np.ndarray]]) -> list[np.ndarray]:
  """[A, N, B, T + 1] per batch index k < every expert's count: expert e's batch k at e."""
  count = min(len(b) for b in batches)
  return [np.stack([b[k] for b in batches], axis=1) for k in range(count)]


def summed_descent(spec: spec_lib.RunSpec, workdir: str, batches: list[list[np.ndarray]],
                   m: Mechanism) -> dict:
  """rho and r of the summed-loss estimator at the control's start (its seed run in
  `workdir`, every expert as `spec`'s method starts it): the parameters are all N bodies
  stacked, the loss sum_e of expert e's on its own batch k (`summed_batches`; heads held as
  in the experts' measurement), one SPSA direction drawn over the whole stacked vector (as
  expert 0's probes: the law of the control's, whose expert e's block is drawn from expert
  e's key), with the experts' n, eps, repeats, Hutchinson vectors and key."""
  body_N, head = spec.method.init_params(runs.restore_params(workdir))
  n = spec.n_experts
  head_N = jnp.broadcast_to(head, (n,) + head.shape) if spec.shared_head else head
  # a custom loss_fn needs forward="direct" (`spsa`: speed only, the same losses)
  cfg = dataclasses.replace(spec.method.step_config().spsa, forward="direct")
  loss_fn = descent.summed(_streamed(cfg.time_block, cfg.unroll), 0)
  with memory.full_precision():
    return descent.measure(descent.summed(batch_loss, 1), body_N, head_N,
                           [jnp.asarray(b) for b in summed_batches(batches)], spec.eps, cfg,
                           jax.random.key(m.seed), repeats=m.repeats, hutchinson=m.hutchinson,
                           rho_by=m.rho_by, expert=0, loss_fn=loss_fn)
