"""1.5-SPSA on SOMA's experts (issue 56; docs/spsa15.md): SOMA's step with each direction's
coefficient divided by its own probe-space curvature estimate.

    L0 = L_B(theta)  (one clean forward on the same batch, one more row of the vmapped pass)
    curv_j = max((|L+_j - 2 L0 + L-_j| / eps^2) ** alpha, lambda)
    g = (1/n_pert) sum_j (L+_j - L-_j) / (2 eps curv_j) z_j

per expert, per accumulation batch (each batch its own L0), per direction; nothing crosses
experts (`spsa.estimate` with `SpsaConfig.curvature`). alpha = config.spsa15.alpha and lambda
= config.spsa15.lam; alpha = 0 with lambda = 1 is SOMA's estimate (curv = 1).

The estimate feeds the same per-expert Adam as SOMA's (the 1.5-SPSA paper's code uses
plain SGD). Adam divides each coordinate by the root of its running second moment, so a
scale shared by all directions (every curv_j alike) largely cancels; what survives is the
reweighting between directions (a sharp direction counts less than a flat one in the same
update), and in the moments, between updates.

Cost: A (2 n_pert + 1) forwards per expert per update, (2 n_pert + 1) / (2 n_pert) of SOMA's.
"""

from __future__ import annotations

import dataclasses
import functools

import ml_collections

from soma_jax import spsa
from soma_jax.methods import lstm, soma
from soma_jax.methods.base import Method


def step_config(s: lstm.Settings, pert_chunk=None, seed_as_data: bool = False, *,
                curvature: spsa.Curvature) -> spsa.StepConfig:
  """SOMA's step config (`lstm.step_config`) with the curvature scaling switched on."""
  base = lstm.step_config(s, pert_chunk, seed_as_data)
  return dataclasses.replace(base, spsa=dataclasses.replace(base.spsa, curvature=curvature))


def make(c: ml_collections.ConfigDict) -> Method:
  s = lstm.settings(c)
  curvature = spsa.Curvature(alpha=float(c.spsa15.alpha), floor=float(c.spsa15.lam))
  fields = soma.spsa_fields(s, step_config=functools.partial(step_config, curvature=curvature))
  # SPEC 7 plus the clean forward of every batch: A (2 n_pert + 1) B T F per expert.
  fields["ops_per_update"] = (2 * s.n_pert + 1) * lstm.forward_ops(s)
  fields["describe"] = fields["describe"] | {"gradient": "zero-order (1.5-SPSA)"}
  return lstm.lstm_method(s, **fields)
