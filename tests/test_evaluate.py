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


def disagreeing_experts(n: int, n_windows: int):
  """(body_N, own heads, random windows, a best-first permutation of the n experts per window).

  The heads differ per expert so the experts disagree.
  """
  cfg = model_lib.ModelConfig(d_t=8, d_e=8, shared_head=False)
  body_N, head = model_lib.init_experts(jax.random.key(0), cfg, n)
  head = head + 0.3 * jax.random.normal(jax.random.key(1), head.shape)
  rng = np.random.default_rng(0)
  windows = rng.integers(0, 256, (n_windows, windows_lib.WINDOW_BYTES), dtype=np.uint8)
  routes = np.stack([rng.permutation(n) for _ in range(n_windows)]).astype(np.int32)
  return body_N, head, windows, routes


@pytest.fixture(scope="module")
def setup():
  return disagreeing_experts(N, 10)


def target_probs(body_N, head, shared_head, e, windows):
  """p_e(y_t) of expert e for targets 257..1024: softmax of its logits, float64 [n, 768]."""
  body = jax.tree.map(lambda x: x[e], body_N)
  head_e = head if shared_head else head[e]
  logits = np.asarray(model_lib.logits(body, head_e, jnp.asarray(windows[:, :-1])), np.float64)
  logits = logits[:, ev.ROUTE_BYTES:]
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.take_along_axis(p, windows[:, ev.ROUTE_BYTES + 1:, None].astype(np.int64), -1)[..., 0]


def hand_mixture(body_N, head, shared_head, windows, routes_nxk, combine="probabilities"):
  """Per-window nats/byte of the routed mixture of each window's listed experts.

  p(y_t) = (1/k) sum_{e in routes} p_e(y_t), loss = -mean_t log p(y_t) (SPEC 4), straight
  from softmax probabilities. combine="log-probabilities" averages log p_e instead: a
  planted bug (a geometric mean).
  """
  probs = {e: target_probs(body_N, head, shared_head, e, windows)
           for e in np.unique(routes_nxk)}
  out = np.empty(len(windows))
  for i in range(len(windows)):
    p_kxT = np.stack([probs[e][i] for e in routes_nxk[i]])
    if combine == "probabilities":
      out[i] = -np.mean(np.log(p_kxT.mean(0)))
    else:
      out[i] = -np.mean(np.log(p_kxT).mean(0))
  return out


def _same_loss(got, want) -> bool:
  return np.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_routed_mixture_is_the_mean_of_softmax_probabilities(setup, k):
  """ensemble_loss and score equal the mixture computed from the experts' softmax outputs.

  For k >= 2 the same comparison rejects a mixture of log-probabilities (which, by Jensen,
  is never below the probability mixture's loss and differs when the experts disagree).
  """
  body_N, head, windows, routes = setup
  want = hand_mixture(body_N, head, False, windows, routes[:, :k])
  got = ev.ensemble_loss(body_N, head, windows, FakeRouter(routes), k, shared_head=False)
  assert _same_loss(got, want.mean()), (got, want.mean())
  sc = ev.score(body_N, head, windows, routes, False, ks=(k,))
  assert _same_loss(sc.mix_nxS[:, 0], want)
  if k > 1:
    assert not _same_loss(hand_mixture(body_N, head, False, windows, routes[:, :k], "log"), want)


def test_mixture_never_above_mean_of_selected_losses(setup):
  body_N, head, windows, routes = setup
  sc = ev.score(body_N, head, windows, routes, False, ks=(1, 2, 3))
  for s, k in enumerate(sc.ks):
    assert np.all(sc.mix_nxS[:, s] <= sc.own_nxK[:, :k].mean(axis=1) + 1e-9), k
  np.testing.assert_allclose(sc.mix_nxS[:, 0], sc.own_nxK[:, 0])


def test_k_sweep_one_pass_matches_hand_mixtures(setup):
  body_N, head, windows, routes = setup
  doc_ids = np.arange(len(windows))
  res = ev.evaluate(body_N, head, windows, doc_ids, FakeRouter(routes), 2, False,
                    ks=[1, 2, 3], pairs=True, draws=200)
  want = {}
  for row in res["k_sweep"]:
    k = row["k"]
    want[k] = hand_mixture(body_N, head, False, windows, routes[:, :k]).mean()
    assert _same_loss(row["nats_per_byte"], want[k]), (k, row["nats_per_byte"], want[k])
  assert _same_loss(res["nats_per_byte"], want[2])
  assert res["top_k"] == 2 and res["num_targets"] == 10 * 768
  assert set(res) >= {"nats_per_byte", "ci95", "bits_per_byte", "num_windows", "per_expert"}
  assert sum(r["num_windows"] for r in res["per_expert"]) == 2 * len(windows)
  for p in res["pairs"]:
    assert p["loss_reduction"] >= 0  # Jensen, per target
    assert -1 - 1e-9 <= p["error_correlation"] <= 1 + 1e-9


def _window_bootstrap(values, doc_ids, draws=2000, seed=0):
  """A planted bug: resamples windows, ignoring that windows of one document are correlated."""
  del doc_ids
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(values), (draws, len(values)))
  return tuple(np.quantile(values[idx].mean(1), [0.025, 0.975]))


def _width_ok(interval, doc_means) -> bool:
  """The 95% width is 2 * 1.96 * sd(document means) / sqrt(documents), within 15%."""
  lo, hi = interval
  want = 2 * 1.96 * doc_means.std() / np.sqrt(len(doc_means))
  return 0.85 <= (hi - lo) / want <= 1.15


def test_bootstrap_width_follows_documents_not_windows():
  """8 windows per document that share the document's loss: the interval is as wide as 50
  independent values, not 400. A window-level bootstrap is sqrt(8) too narrow and is
  rejected by the same check.
  """
  rng = np.random.default_rng(1)
  docs = np.repeat(np.arange(50), 8)
  doc_effect = rng.normal(0, 0.3, 50)
  vals = 2.0 + doc_effect[docs] + rng.normal(0, 0.01, docs.size)
  doc_means = np.array([vals[docs == d].mean() for d in range(50)])
  lo, hi = ev.bootstrap_ci(vals, docs, draws=4000, seed=0)
  assert lo < vals.mean() < hi
  assert _width_ok((lo, hi), doc_means), (hi - lo, 2 * 1.96 * doc_means.std() / np.sqrt(50))
  assert not _width_ok(_window_bootstrap(vals, docs), doc_means)


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
  own = -np.log(target_probs(body_N, head, False, 0, windows[:2])).mean(axis=1)
  np.testing.assert_allclose(-lp.mean(axis=1), own, rtol=1e-5)
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
