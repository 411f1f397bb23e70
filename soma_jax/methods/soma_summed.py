"""The summed-loss control (SPEC 5, 9.3): SOMA's step with every expert's SPSA estimate taken
from the sum of all N experts' losses before each finite difference (the shared loss),
on the same data and directions as SOMA.

The group's difference is the sum of the experts' own float32 differences
(`spsa._group_diff`), in float64 when x64 is enabled. The step sums over the whole expert
axis, so it runs as one job on one device.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from soma_jax.errors import need
from soma_jax.methods import lstm, soma
from soma_jax.methods.base import Method


def step_config(s: lstm.Settings, pert_chunk=None, seed_as_data: bool = False):
  return dataclasses.replace(lstm.step_config(s, pert_chunk, seed_as_data),
                             loss_groups=(0,) * s.n_experts)


def make(c: ml_collections.ConfigDict) -> Method:
  need(not c.experts, "method=soma_summed sums all N experts' losses: run them as one job "
       "(experts='')")
  s = lstm.settings(c)
  # one job on one device: the sum runs over the whole expert axis (no sharded step)
  return lstm.lstm_method(s, **soma.spsa_fields(s, step_config=step_config) | {"sharded_step": None})
