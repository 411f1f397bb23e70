"""EGGROLL's low-rank ES on the SOMA LSTM expert (the extra control of SPEC 6).

With per-expert heads trained, E follows the delta rule, as in SOMA.
"""

from __future__ import annotations

import functools

import ml_collections

from soma_jax import model as model_lib
from soma_jax.methods import eggroll, lstm
from soma_jax.methods.base import Method


def make(c: ml_collections.ConfigDict) -> Method:
  es = eggroll.es_config(c)
  s = lstm.settings(c)
  return lstm.lstm_method(
      s, step_config=functools.partial(eggroll.step_config, s, es, model_lib.loss),
      train_step=eggroll.eggroll_step, ops_per_update=es.pop * lstm.forward_ops(s),
      describe=eggroll.es_describe(es, "lstm"),
      shape_keys=("eggroll.rank", "eggroll.pop"), speed_keys=("eggroll.pop_chunk",))
