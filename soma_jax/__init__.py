"""soma-jax: SOMA zero-order pretraining of sharded LSTM experts in JAX."""

__version__ = "0.1.0"

import os as _os

# `import jax` fails with a traceback on a JAX_NUM_CPU_DEVICES that is not a number: it is set
# aside here, before any module of this package imports JAX, and the entry points refuse it
# in one line (host_devices.check_environment).
BAD_ENV: dict[str, str] = {}
if not _os.environ.get("JAX_NUM_CPU_DEVICES", "0").strip().lstrip("-").isdigit():
  BAD_ENV["JAX_NUM_CPU_DEVICES"] = _os.environ.pop("JAX_NUM_CPU_DEVICES")
