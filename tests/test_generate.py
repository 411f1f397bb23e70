"""Incremental generation: the step function equals the model, sampling, cold start, output."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from soma_jax import generate as gen
from soma_jax import model as model_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RecordingRouter:
  """Routes everything to experts [2, 0, 1, ...] and records the prefixes it saw."""

  def __init__(self):
    self.seen = []

  def route_to(self, prefixes, k, n_experts):
    self.seen.append(list(prefixes))
    order = np.roll(np.arange(n_experts), 1)
    return np.tile(order[:k], (len(prefixes), 1)).astype(np.int32)


@pytest.fixture(scope="module")
def experts():
  cfg = model_lib.ModelConfig(d_t=12, d_e=8, shared_head=False)  # d_t != d_e: projections too
  body_N, head = model_lib.init_experts(jax.random.key(0), cfg, 3)
  return body_N, head + 0.5 * jax.random.normal(jax.random.key(1), head.shape)


def test_step_reproduces_model_logits(experts):
  body_N, head = experts
  body = jax.tree.map(lambda x: x[1], body_N)
  seq = jnp.asarray(np.random.default_rng(0).integers(0, 256, 40), jnp.uint8)
  want = model_lib.logits(body, head[1], seq[None])[0]
  got = jax.jit(gen.step_logits)(body, head[1], seq)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_greedy_generation_follows_the_mixture_of_full_sequence_logits(experts):
  body_N, head = experts
  router = RecordingRouter()
  prompt = b"hello"
  out, routes = gen.generate(body_N, head, False, router, prompt, 12, temperature=0.0, top_k=3)
  assert len(out) == 12 and routes.tolist() == [2, 0, 1]
  seq = jnp.asarray(np.frombuffer(prompt + out, np.uint8))
  logits_KxTxV = jnp.stack([model_lib.logits(jax.tree.map(lambda x, e=e: x[e], body_N), head[e],
                                             seq[None])[0] for e in routes])
  logp_TxV = jax.vmap(gen.mixture_logprobs, in_axes=1)(logits_KxTxV)
  want = np.asarray(jnp.argmax(logp_TxV, axis=-1))[len(prompt) - 1:-1]
  np.testing.assert_array_equal(np.frombuffer(out, np.uint8), want)


def test_sampling_is_seeded_and_top_p_tiny_is_greedy(experts):
  body_N, head = experts
  a, _ = gen.generate(body_N, head, False, RecordingRouter(), b"abcde", 12, 1.0, 1.0, seed=3)
  b, _ = gen.generate(body_N, head, False, RecordingRouter(), b"abcde", 12, 1.0, 1.0, seed=3)
  c, _ = gen.generate(body_N, head, False, RecordingRouter(), b"abcde", 12, 1.0, 1.0, seed=4)
  assert a == b and a != c
  greedy, _ = gen.generate(body_N, head, False, RecordingRouter(), b"abcde", 12, 0.0)
  nucleus, _ = gen.generate(body_N, head, False, RecordingRouter(), b"abcde", 12, 1.0, 1e-6, seed=5)
  assert nucleus == greedy


def test_cold_start_routes_on_what_is_there(experts):
  body_N, head = experts
  router = RecordingRouter()
  gen.generate(body_N, head, False, router, b"", 12)
  gen.generate(body_N, head, False, router, b"short", 12)
  assert router.seen == [[b""], [b"short"]]


def test_printable_escapes_invalid_utf8():
  text = gen.printable("héllo ".encode() + b"\xff\xfe" + "→ ok\n".encode() + b"\x00")
  assert text == "héllo \\xff\\xfe→ ok\n\\x00"
  text.encode("utf-8")  # always encodable


def test_cli_missing_workdir_exits_2_with_one_line(tmp_path):
  r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "generate.py"),
                      f"--workdir={tmp_path}/none", "--prompt=x"],
                     capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert r.returncode == 2, r.stderr
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert len(lines) == 1 and "does not exist" in lines[0], r.stderr


def test_cli_refuses_a_gru_run_in_one_line(data_prepared, tmp_path):
  """The GRU EGGROLL run has no byte-by-byte step (`Method.generates` is False for it)."""
  from soma_jax import train
  from soma_jax.config import load_config_file

  c = load_config_file(os.path.join(ROOT, "experiments", "configs", "eggroll.py"), "n=1,size=tiny")
  c.data.dir, c.steps = data_prepared, 1
  train.run(c, str(tmp_path / "gru"))
  r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "generate.py"),
                      f"--workdir={tmp_path / 'gru'}", "--prompt=x"],
                     capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert len(lines) == 1 and "samples LSTM experts only" in lines[0], r.stderr[-2000:]
