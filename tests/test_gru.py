"""The EGGROLL reproduction GRU: shapes, initial loss, low-rank embedding."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from soma_jax import gru, sizing
from soma_jax.layers import LowRank

CFG = gru.GruConfig(d=8, depth=2)
_init = jax.jit(gru.init_gru, static_argnums=1)


def test_param_shapes():
  p = _init(jax.random.key(0), CFG)
  d, v = CFG.d, CFG.vocab
  assert p["embed"].shape == (v, d) and p["head"].shape == (d, v)
  assert len(p["layers"]) == CFG.depth
  for layer in p["layers"]:
    assert layer["w_x"].shape == (d, 3 * d) and layer["w_h"].shape == (d, 3 * d)
    assert layer["b"].shape == (3 * d,) and layer["ln"]["scale"].shape == (d,)
  assert sizing.gru_params(CFG) == 2 * v * d + CFG.depth * (6 * d * d + 4 * d) + d
  assert gru.GruConfig(d=4).depth == 6


def test_logits_shape_and_initial_loss():
  p = _init(jax.random.key(0), CFG)
  window = jnp.asarray(np.random.default_rng(1).integers(0, 256, (3, 17)), jnp.int32)
  assert gru.gru_logits(p, window[:, :-1]).shape == (3, 16, 256)
  loss = float(gru.gru_loss(p, window))
  assert abs(loss - math.log(256)) < 0.05, f"init loss {loss} should be near ln 256"


def test_lowrank_embed_matches_explicit_table():
  rng = np.random.default_rng(2)
  w, a, b = (rng.standard_normal(s).astype(np.float32) for s in ((256, 8), (8, 2), (256, 2)))
  ids = np.arange(20).reshape(4, 5) * 7
  both = jax.jit(lambda w, a, b: (gru.embed(LowRank(w, a, b), ids), gru.embed(w + b @ a.T, ids)))
  np.testing.assert_allclose(*both(w, a, b), rtol=1e-5, atol=1e-5)
