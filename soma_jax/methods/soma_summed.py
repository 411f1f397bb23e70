"""The summed-loss control (SPEC 5, 9.3): SOMA's step with every expert's SPSA estimate taken
from the sum of all N experts' losses before each finite difference (the shared loss),
on the same data and directions as SOMA.

The group's difference is the sum of the experts' own float32 differences
(`spsa._group_diff`), in float64 when x64 is enabled. The step sums over the whole expert
axis, so it runs as one job on one device.
"""

from __future__ import annotations

import dataclasses
import functools

from soma_jax.errors import need
from soma_jax.methods import lstm, soma


def step_config(c, pert_chunk=None):
  return dataclasses.replace(lstm.step_config(c, pert_chunk), loss_groups=(0,) * c.n_experts)


def validate(c) -> None:
  need(not c.experts, "method=soma_summed sums all N experts' losses: run them as one job "
       "(experts='')")


METHOD = lstm.lstm_method(step_config=step_config, train_step=soma.train_step,
                          ops_per_update=soma.ops_per_update, describe=soma.describe,
                          # planned on the summed step itself, the program training runs
                          plan_chunk=functools.partial(soma.plan_chunk, step_config=step_config),
                          validate=validate, table_rank=0)
