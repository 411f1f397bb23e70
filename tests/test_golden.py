"""One SOMA update of the tiny config, pinned to golden values.

The property tests check the estimator against the math; this one notices any change at
all to what an update computes: the init, the probe stream (keys from seed, step, expert,
accumulation index and direction), the estimator, Adam, the delta-rule head. If a change
is meant to alter the numbers (a new probe stream, another init, a new JAX whose random
numbers differ), run `python tests/test_golden.py`, paste the printed values below and say
in the commit why they moved. Float32 rounding alone (e.g. another way to compute the LSTM
gates) stays within the tolerance; a wrong sign, scale or key does not.
"""

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import config as config_lib
from soma_jax import runs, spsa
from soma_jax import spec as spec_lib

GOLDEN = {
    "loss": [6.169713, 6.0624514],
    "estimate_sum": [0.78177476, 9.608804],
    "estimate_norm": [17.412277, 10.096808],
    "body_update_sum": [-0.011998827, -0.069998032],
    "body_update_norm": [0.044135737, 0.044271478],
    "head_update_norm": [0.045251877, 0.045252462],
    "head_update_sum": [0.015965184, -0.083981782],
}
TEXT = b"def main(argv):\n  del argv\n  print('one SOMA update, pinned')\n" * 4


def one_update() -> dict:
  """The tiny config's first update of N = 2 experts on fixed bytes, summarised per expert."""
  c = config_lib.base_config(n=2, size="tiny")  # d_t 8, n_pert 4, B 2, T 32, own heads
  state = runs.initial_state(spec_lib.resolve(c))
  t1 = c.data.seq_len + 1
  windows = np.frombuffer(TEXT, np.uint8)[: 2 * 2 * t1].reshape(2, 1, 2, t1)  # [N, A, B, T+1]
  cfg = spec_lib.resolve(c).method.step_config(pert_chunk=4)
  new, metrics = jax.jit(spsa.train_step, static_argnames="cfg")(
      state, jnp.asarray(windows), jnp.arange(2, dtype=jnp.int32), cfg=cfg)
  # Adam's first step is about lr x sign(g): the estimate itself pins g's scale.
  g, _ = jax.jit(spsa.estimate, static_argnames=("cfg", "shared_head"))(
      state.body, state.head, jnp.asarray(windows), state.sched.eps, state.step,
      jnp.arange(2, dtype=jnp.int32), jax.random.key(cfg.seed), cfg=cfg.spsa, shared_head=False)
  g = [np.asarray(x, np.float64).reshape(2, -1) for x in jax.tree.leaves(g)]
  delta = [np.asarray(a - b, np.float64).reshape(2, -1)
           for a, b in zip(jax.tree.leaves(new.body), jax.tree.leaves(state.body))]
  d_head = np.asarray(new.head - state.head, np.float64).reshape(2, -1)
  return {"loss": np.asarray(metrics["loss"]).tolist(),
          "estimate_sum": sum(x.sum(1) for x in g).tolist(),
          "estimate_norm": np.sqrt(sum((x ** 2).sum(1) for x in g)).tolist(),
          "body_update_sum": sum(d.sum(1) for d in delta).tolist(),
          "body_update_norm": np.sqrt(sum((d ** 2).sum(1) for d in delta)).tolist(),
          "head_update_norm": np.sqrt((d_head ** 2).sum(1)).tolist(),
          # Adam's first step is ~lr x sign(g) whatever g's size: the norm cannot see a
          # flipped head gradient, the signed sum can.
          "head_update_sum": d_head.sum(1).tolist()}


# Relative tolerances on the CPU. The estimate divides a difference of two nearby float32
# losses by 2 eps: computing the LSTM gates as one tanh instead of four sigmoid / tanh
# moved it by 1.6e-4 relative, and everything else not at all. GPU kernels round
# differently again, hence 10x there.
RTOL = {"estimate_sum": 1e-3, "estimate_norm": 1e-3}


def test_first_update_matches_golden_values():
  got = one_update()
  scale = 1.0 if jax.default_backend() == "cpu" else 10.0
  for name, want in GOLDEN.items():
    np.testing.assert_allclose(
        got[name], want, rtol=scale * RTOL.get(name, 1e-5), atol=1e-9,
        err_msg=f"{name} of the tiny config's first update moved. If you meant to change "
                "what an update computes, rerun `python tests/test_golden.py` and update "
                "GOLDEN with the reason in the commit; otherwise this is a regression.")


if __name__ == "__main__":
  for key, value in one_update().items():
    print(f'    "{key}": [{", ".join(f"{v:.8g}" for v in value)}],')
