"""Routed evaluation: k = 1 identity, convexity, one-pass k sweep, bootstrap, WikiText, CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from soma_jax import evaluate as ev
from soma_jax import model as model_lib
from soma_jax.data import windows as windows_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 3


class FakeRouter:
  """Routes window i to a fixed best-first permutation of the experts."""

  def __init__(self, routes_nxN: np.ndarray):
    self.routes = routes_nxN

  def route(self, prefixes, k):
    assert np.asarray(prefixes).shape[1] == ev.ROUTE_BYTES
    return self.routes[:, :min(k, self.routes.shape[1])]

  def route_to(self, prefixes, k, n_experts):
    assert n_experts == self.routes.shape[1]
    return self.route(prefixes, k)


@pytest.fixture(scope="module")
def setup():
  cfg = model_lib.ModelConfig(d_t=8, d_e=8, shared_head=False)
  body_N, head = model_lib.init_experts(jax.random.key(0), cfg, N)
  # Different heads per expert so the experts disagree.
  head = head + 0.3 * jax.random.normal(jax.random.key(1), head.shape)
  rng = np.random.default_rng(0)
  windows = rng.integers(0, 256, (10, windows_lib.WINDOW_BYTES), dtype=np.uint8)
  routes = np.stack([rng.permutation(N) for _ in range(10)]).astype(np.int32)
  return body_N, head, windows, routes


def _own_loss(body_N, head, e, windows):
  """Expert e's mean cross entropy on targets 257..1024, computed straight from the model."""
  body = jax.tree.map(lambda x: x[e], body_N)
  logits = model_lib.logits(body, head[e], jnp.asarray(windows[:, :-1]))
  ce = model_lib.cross_entropy(logits, jnp.asarray(windows[:, 1:]))
  return np.asarray(ce[:, ev.ROUTE_BYTES:]).mean(axis=1)


def test_k1_equals_selected_experts_own_loss(setup):
  body_N, head, windows, routes = setup
  got = ev.ensemble_loss(body_N, head, windows, FakeRouter(routes), 1, shared_head=False)
  want = np.mean([_own_loss(body_N, head, routes[i, 0], windows[i:i + 1])[0]
                  for i in range(len(windows))])
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_mixture_never_above_mean_of_selected_losses(setup):
  body_N, head, windows, routes = setup
  sc = ev.score(body_N, head, windows, routes, False, ks=(1, 2, 3))
  for s, k in enumerate(sc.ks):
    assert np.all(sc.mix_nxS[:, s] <= sc.own_nxK[:, :k].mean(axis=1) + 1e-9), k
  np.testing.assert_allclose(sc.mix_nxS[:, 0], sc.own_nxK[:, 0])


def test_k_sweep_one_pass_matches_separate_runs(setup):
  body_N, head, windows, routes = setup
  doc_ids = np.arange(len(windows))
  res = ev.evaluate(body_N, head, windows, doc_ids, FakeRouter(routes), 2, False,
                    ks=[1, 2, 3], pairs=True, draws=200)
  for row in res["k_sweep"]:
    alone = ev.ensemble_loss(body_N, head, windows, FakeRouter(routes), row["k"], False)
    # Same windows, different batch groupings: equal up to float32 summation order.
    np.testing.assert_allclose(row["nats_per_byte"], alone, rtol=1e-6)
  assert res["top_k"] == 2 and res["num_targets"] == 10 * 768
  assert set(res) >= {"nats_per_byte", "ci95", "bits_per_byte", "num_windows", "per_expert"}
  assert sum(r["num_windows"] for r in res["per_expert"]) == 2 * len(windows)
  for p in res["pairs"]:
    assert p["loss_reduction"] >= 0  # Jensen, per target
    assert -1 - 1e-9 <= p["error_correlation"] <= 1 + 1e-9


def test_bootstrap_contains_mean_and_shrinks():
  rng = np.random.default_rng(1)

  def interval(n_docs):
    docs = np.repeat(np.arange(n_docs), 2)  # two windows per document
    vals = 2.0 + rng.normal(0, 0.3, n_docs).repeat(2) + rng.normal(0, 0.1, 2 * n_docs)
    lo, hi = ev.bootstrap_ci(vals, docs, draws=2000, seed=0)
    assert lo < vals.mean() < hi
    return hi - lo

  small, large = interval(25), interval(400)
  assert large < 0.5 * small  # width ~ 1/sqrt(docs): 4x narrower expected


def test_bootstrap_is_paired_and_seeded():
  rng = np.random.default_rng(2)
  vals = rng.normal(size=(50, 1))
  docs = np.arange(50) // 3
  lo, hi = ev.bootstrap_ci(np.concatenate([vals, vals + 1.0], axis=1), docs, draws=500)
  np.testing.assert_allclose(lo[1] - lo[0], 1.0)  # same draws for both columns
  np.testing.assert_array_equal(ev.bootstrap_ci(vals, docs, draws=500), (lo[:1], hi[:1]))


def test_wikitext_scored_targets_tile_each_article(tmp_path, setup):
  body_N, head, _, _ = setup
  articles = [b"x" * 3000, b"y" * 900, bytes(range(256)) * 12]
  raw = b" \n" + b"".join(f" = Article {i} = \n".encode() + a + b"\n"
                          for i, a in enumerate(articles))
  path = tmp_path / "wiki.test.raw"
  path.write_bytes(raw)
  windows, seg = windows_lib.wikitext103_windows(str(path))
  segs = list(windows_lib.iter_wikitext_segments(raw.splitlines(keepends=True)))
  for s, (_, text) in enumerate(segs):
    w = windows[seg == s]
    assert len(w) == windows_lib.num_eval_windows(len(text))
    # Targets 257..1024 of consecutive windows tile the article from byte 257 on.
    scored = w[:, ev.ROUTE_BYTES + 1:].reshape(-1).tobytes()
    assert scored == text[ev.ROUTE_BYTES + 1:ev.ROUTE_BYTES + 1 + 768 * len(w)]
  # target_logprobs column j scores byte 257 + j from inputs 0..256 + j.
  lp = ev.target_logprobs(body_N, head, 0, windows[:2], False)
  np.testing.assert_allclose(-lp.mean(axis=1), _own_loss(body_N, head, 0, windows[:2]), rtol=1e-5)
  w_doc, d_doc = ev.load_split("", f"wikitext103:{path}")
  np.testing.assert_array_equal(w_doc, windows)
  np.testing.assert_array_equal(d_doc, seg)


def _cli(*args):
  return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "evaluate.py"), *args],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args, needle", [
    (("--workdir={tmp}/missing",), "does not exist"),
    (("--workdir={tmp}", "--split=train"), "unknown split"),
    (("--workdir={tmp}", "--split=wikitext103:{tmp}/nope.raw"), "not found"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args, needle):
  r = _cli(*(a.format(tmp=tmp_path) for a in args))
  assert r.returncode == 2, r.stderr
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert len(lines) == 1 and needle in lines[0], r.stderr
