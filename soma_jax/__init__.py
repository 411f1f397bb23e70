"""soma-jax: SOMA zero-order pretraining of sharded LSTM experts in JAX."""

__version__ = "0.1.0"
