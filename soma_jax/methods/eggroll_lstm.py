"""EGGROLL's low-rank ES on the SOMA LSTM expert (the extra control of SPEC 6).

With per-expert heads trained, E follows the delta rule, as in SOMA.
"""

from __future__ import annotations

from soma_jax import model as model_lib
from soma_jax.methods import eggroll, lstm
from soma_jax.methods.base import tokens_per_update


def step_config(c, pert_chunk=None) -> eggroll.EggrollStepConfig:
  return eggroll.EggrollStepConfig(lstm.step_config(c, pert_chunk), eggroll.es_config(c),
                                   model_lib.loss)


METHOD = lstm.lstm_method(
    step_config=step_config, train_step=eggroll.eggroll_step,
    ops_per_update=lambda c: c.eggroll.pop * tokens_per_update(c) * lstm.flops_per_token(c),
    validate=eggroll.validate_es, describe=lambda c: eggroll.es_describe(c, "lstm"),
    table_rank=1, shape_keys=("eggroll.rank", "eggroll.pop"), speed_keys=("eggroll.pop_chunk",))
