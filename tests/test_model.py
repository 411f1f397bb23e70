"""The expert of SPEC section 2: parameter counts, shapes, the LSTM, low-rank matmuls."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from soma_jax import model as M
from soma_jax import sizing

# SPEC section 2 size table, to 3 significant figures.
PAPER = {(1, 509): (8.33e6, 8.33e6), (2, 361): (8.41e6, 4.20e6), (8, 181): (8.55e6, 1.06e6),
         (256, 32): (8.44e6, 32.9e3)}


def sig3(x):
  return float(f"{x:.3g}")


@pytest.mark.parametrize("n,d_t", list(PAPER))
def test_paper_size_table(n, d_t):
  cfg = sizing.paper_config(n, d_t)
  ensemble, body = PAPER[(n, d_t)]
  assert sig3(sizing.ensemble_params(cfg, n)) == ensemble
  assert sig3(sizing.body_params(cfg)) == body
  assert sizing.head_params(cfg) == 256 * 32


@pytest.mark.parametrize("d_t,depth", [(32, 2), (17, 3), (64, 1)])
def test_body_formula(d_t, depth):
  cfg = M.ModelConfig(d_t=d_t, depth=depth)
  proj = 2 * cfg.d_e * d_t if d_t != cfg.d_e else 0
  assert sizing.body_params(cfg) == 16 * depth * d_t**2 + (2 * depth + 1) * d_t + proj


def test_width32_ops_per_token():
  assert sizing.flops_per_token(M.ModelConfig(d_t=32)) == 81920  # SPEC: about 81.9k


def test_table_cli_json():
  out = subprocess.run([sys.executable, "-m", "soma_jax.sizing", "--json"], check=True,
                       capture_output=True, text=True).stdout
  rows = json.loads(out)
  assert [(r["n"], r["d_t"]) for r in rows] == list(PAPER)
  assert {"n", "d_t", "ensemble_params", "body_params"} <= set(rows[0])
  custom = json.loads(subprocess.run(
      [sys.executable, "-m", "soma_jax.sizing", "--json", "--n", "4", "--d_t", "48"],
      check=True, capture_output=True, text=True).stdout)
  assert custom[0]["body_params"] == sizing.body_params(M.ModelConfig(d_t=48))


def naive_lstm(p, x_BxTxD):
  """Reference LSTM: input and recurrent matmuls both inside the loop."""
  b, t, d = x_BxTxD.shape
  h = c = jnp.zeros((b, d))
  outs = []
  for i in range(t):
    gates = x_BxTxD[:, i] @ p["w_x"] + h @ p["w_h"]
    ig, fg, gg, og = jnp.split(gates, 4, -1)
    c = jax.nn.sigmoid(fg) * c + jax.nn.sigmoid(ig) * jnp.tanh(gg)
    h = jax.nn.sigmoid(og) * jnp.tanh(c)
    outs.append(h)
  return jnp.stack(outs, 1)


def test_gate_activations_are_sigmoid_sigmoid_tanh_sigmoid():
  """One tanh over all four gates equals sigmoid / tanh applied gate by gate, saturation included."""
  x = jnp.linspace(-40.0, 40.0, 3 * 4 * 16).reshape(3, 64)
  ig, fg, gg, og = jnp.split(x, 4, -1)
  want = jnp.concatenate([jax.nn.sigmoid(ig), jax.nn.sigmoid(fg), jnp.tanh(gg), jax.nn.sigmoid(og)], -1)
  np.testing.assert_allclose(M.gate_activations(x), want, rtol=0, atol=2e-7)


def test_gelu_is_exact_gelu_to_float32_rounding():
  """model.gelu (the erf form) equals x Phi(x) computed in float64 to a few float32 ulps of
  max(|x|, 1) over the range activations reach, and jax.nn.gelu(approximate=False)."""
  from scipy.special import ndtr

  x = np.linspace(-12.0, 12.0, 48_001, dtype=np.float32)
  got = np.asarray(M.gelu(jnp.asarray(x)), np.float64)
  want = x.astype(np.float64) * ndtr(x.astype(np.float64))
  ulp = np.finfo(np.float32).eps * np.maximum(np.abs(x), 1.0)
  assert np.max(np.abs(got - want) / ulp) < 4
  np.testing.assert_allclose(got, jax.nn.gelu(jnp.asarray(x), approximate=False),
                             rtol=0, atol=4 * 12 * np.finfo(np.float32).eps)


def test_lstm_matches_naive_loop():
  cfg = M.ModelConfig(d_t=8, d_e=8)
  body = M.init_body(jax.random.key(0), cfg)
  x = jax.random.normal(jax.random.key(1), (3, 7, 8))
  out_TxBxD = M.lstm(body["blocks"][0]["lstm"], jnp.swapaxes(x, 0, 1))[0]
  np.testing.assert_allclose(jnp.swapaxes(out_TxBxD, 0, 1),
                             naive_lstm(body["blocks"][0]["lstm"], x), atol=1e-5)


def test_hidden_state_reset_per_window():
  """A window's outputs do not depend on other windows in the batch."""
  cfg = M.ModelConfig(d_t=16)
  body, head = M.init_body(jax.random.key(0), cfg), M.init_head(jax.random.key(1), cfg)
  x = jax.random.randint(jax.random.key(2), (2, 12), 0, 256)
  both = M.logits(body, head, x)
  np.testing.assert_allclose(both[1], M.logits(body, head, x[1:])[0], atol=1e-5)


def test_experts_share_one_pytree_with_leading_axis():
  cfg = M.ModelConfig(d_t=16, shared_head=False)
  body_N, head_N = M.init_experts(jax.random.key(0), cfg, 3)
  assert all(x.shape[0] == 3 for x in jax.tree.leaves(body_N))
  assert head_N.shape == (3, 256, 32)
  assert "in_proj" in jax.tree.map(lambda x: x, body_N)  # d_t != d_E: projections
  windows = jax.random.randint(jax.random.key(1), (3, 2, 9), 0, 256)
  losses = jax.vmap(M.loss)(body_N, head_N, windows)
  assert losses.shape == (3,) and np.all(np.abs(np.asarray(losses) - np.log(256)) < 1.5)


def test_lowrank_linear_equals_explicit():
  w = jax.random.normal(jax.random.key(0), (5, 7))  # [in, out]
  a = jax.random.normal(jax.random.key(1), (7, 2))  # [out, r]
  b = jax.random.normal(jax.random.key(2), (5, 2))  # [in, r]
  x = jax.random.normal(jax.random.key(3), (4, 5))
  explicit = x @ (w.T + a @ b.T).T  # x (W + A B^T)^T with W = w^T
  np.testing.assert_allclose(M.linear(x, M.LowRank(w, a, b)), explicit, rtol=1e-5, atol=1e-5)
