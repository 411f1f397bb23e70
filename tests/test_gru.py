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
    for name in ("w_f", "u_f", "w_h", "u_h"):
      assert layer[name].shape == (d, d), name
    assert layer["mlp_up"].shape == (d, 4 * d) and layer["mlp_down"].shape == (4 * d, d)
    assert layer["b_f"].shape == layer["b_h"].shape == (d,)
    assert layer["ln1"]["scale"].shape == layer["ln2"]["scale"].shape == (d,)
  assert sizing.gru_params(CFG) == 2 * v * d + CFG.depth * (12 * d * d + 4 * d) + d
  assert gru.GruConfig(d=4).depth == 6


def test_width_339_depth_6_is_the_papers_8_44m_row():
  n = sizing.gru_params(gru.GruConfig(d=339, depth=6))
  assert abs(n / 8.44e6 - 1) < 0.02, n
  assert {r["d"]: r["params"] for r in sizing.gru_size_table()}[339] == n


def test_sizing_cli_lists_the_gru_rows():
  import json
  import subprocess
  import sys

  out = subprocess.run([sys.executable, "-m", "soma_jax.sizing", "--json", "--gru"], check=True,
                       capture_output=True, text=True).stdout
  rows = {r["d"]: r for r in json.loads(out)}
  assert sorted(rows) == [20, 29, 58, 118, 339] and rows[339]["depth"] == 6
  assert abs(rows[339]["params"] / 8.44e6 - 1) < 0.02
  text = subprocess.run([sys.executable, "-m", "soma_jax.sizing", "--table"], check=True,
                        capture_output=True, text=True).stdout
  assert "EGGROLL GRU" in text and "8,456,355" in text


def test_layer_is_the_reference_block():
  """One layer by hand: x + GRU(LN x), then + MLP(LN x); f gates the past and the update."""
  cfg = gru.GruConfig(d=8, depth=1)
  p = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(5), x.shape),
                   _init(jax.random.key(1), cfg))
  ids = np.random.default_rng(3).integers(0, 256, (2, 5))
  got = jax.jit(gru.gru_logits)(p, ids)
  q = jax.tree.map(np.asarray, p)
  layer, s = q["layers"][0], 8 ** -0.5
  ln = lambda x, g: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g
  sig = lambda z: 1 / (1 + np.exp(-z))
  x = q["embed"][ids]
  u = ln(x, layer["ln1"]["scale"])
  h, ys = np.zeros((2, 8)), []
  for t in range(5):
    f = sig(u[:, t] @ layer["w_f"] * s + h @ layer["u_f"] * s + layer["b_f"])
    c = np.tanh(u[:, t] @ layer["w_h"] * s + (f * h) @ layer["u_h"] * s + layer["b_h"])
    h = h + f * (c - h)
    ys.append(h)
  x = x + np.stack(ys, 1)
  m = np.maximum(ln(x, layer["ln2"]["scale"]) @ layer["mlp_up"] * s, 0) @ layer["mlp_down"]
  x = x + m * (32 ** -0.5)
  want = ln(x, q["ln_f"]["scale"]) @ q["head"] * s
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


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
