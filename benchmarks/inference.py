r"""Teacher-forced scoring throughput of the routed ensemble vs a monolith (SPEC 7).

  python -m benchmarks.inference --workdir=runs/soma_n4 --json=bench_out/inference.json

A batch of requests (1,025-byte windows from the run's test split) is routed on the first
256 bytes, grouped by selected expert so each expert runs once per group, scored on the
next 768 targets and mixed in float64. The monolith is one expert whose width d_t gives
the same total parameter count (random weights: only speed matters); it scores the same
windows without routing. Compilation and a warm-up batch are excluded; figures are
medians of --repeats timed batches. Tokens are the 1,024 teacher-forced positions a
window runs through; routing time is included.

With N <= top_k every expert runs on every request, so the ensemble does the monolith's
work in smaller matmuls; the paper's advantage needs N >> k. `--synthetic_experts=64`
times such an ensemble (random weights, width 32) on any workdir's data and featurizer.
"""

from __future__ import annotations

import os
import resource
import sys

import jax
import numpy as np
from absl import flags, logging

from benchmarks import step_timing
from soma_jax import cli, runs, sizing
from soma_jax import evaluate as eval_lib
from soma_jax import model as model_lib
from soma_jax.data.router import Router
from soma_jax.errors import UserError

_WORKDIR = flags.DEFINE_string("workdir", None, "training run folder (checkpoints, config)")
_JSON = cli.output_flag("json", None, "write the results here as JSON")
_TOP_K = flags.DEFINE_integer("top_k", 4, "experts per request (capped at N)")
_REQUESTS = flags.DEFINE_integer("requests", 128, "windows per timed batch")
_BATCH = flags.DEFINE_integer("batch", 64, "most windows one expert runs at once")
_REPEATS = flags.DEFINE_integer("repeats", 7, "timed batches; medians are reported")
_SPLIT = flags.DEFINE_string("split", "test", "where the request windows come from")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: the newest)")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "prepared data dir (default: the run's)")
_SYNTH_N = flags.DEFINE_integer(
    "synthetic_experts", 0, "if > 0, time a random-weight ensemble of this many experts of width "
    "--synthetic_d_t (shared head) instead of the checkpoint, routed by the run's featurizer to "
    "random centroids: the paper's many-narrow-experts regime on any workdir")
_SYNTH_D = flags.DEFINE_integer("synthetic_d_t", 32, "expert width for --synthetic_experts")
flags.mark_flags_as_required(["workdir"])

TOKENS_PER_REQUEST = eval_lib.ROUTE_BYTES + eval_lib.SCORED  # 1,024 positions per window


def monolith_config(cfg: model_lib.ModelConfig, n: int) -> model_lib.ModelConfig:
  """One expert with its own head whose total parameters come closest to the N-ensemble's."""
  d_t = sizing.width_for_params(sizing.ensemble_params(cfg, n), 1, cfg.d_e, cfg.depth)
  return model_lib.ModelConfig(d_t=d_t, d_e=cfg.d_e, depth=cfg.depth, shared_head=False)


def peak_memory() -> tuple[int, str]:
  """Peak bytes in use on the first device if it reports them, else the process's peak RSS."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(rss if sys.platform == "darwin" else rss * 1024), "process peak RSS (ru_maxrss)"


def _ensemble():
  """(bodies, head, model config, N, request windows, router): the run's, or the synthetic
  ensemble of --synthetic_n experts routed by random centroids."""
  _, state, _, spec = runs.restore_state(_WORKDIR.value, _STEP.value)
  body_N, head = state.body, state.head
  data_dir = _DATA_DIR.value or spec.data_dir
  windows, _ = eval_lib.load_split(data_dir, _SPLIT.value)
  windows = np.resize(windows, (_REQUESTS.value, windows.shape[1]))  # tiles a short split
  router = Router.load(os.path.join(data_dir, "router.npz"))
  cfg, n = spec.method.model, spec.n_experts
  if _SYNTH_N.value > 0:
    n = _SYNTH_N.value
    cfg = model_lib.ModelConfig(d_t=_SYNTH_D.value, d_e=cfg.d_e, depth=cfg.depth, shared_head=True)
    body_N, head = model_lib.init_experts(jax.random.key(1), cfg, n)
    cents = np.random.default_rng(0).normal(size=(n, router.featurizer.dims))
    router = Router(router.featurizer, cents / np.linalg.norm(cents, axis=1, keepdims=True))
  return body_N, head, cfg, n, windows, router


def main(argv):
  del argv
  if min(_TOP_K.value, _REQUESTS.value, _BATCH.value, _REPEATS.value) < 1:
    raise UserError("--top_k, --requests, --batch and --repeats must be >= 1")
  if not os.path.isdir(_WORKDIR.value):
    raise UserError(f"workdir {_WORKDIR.value!r} does not exist; fix: pass a training run folder")
  logging.info("devices: %s", jax.devices())
  body_N, head, cfg, n, windows, router = _ensemble()
  top_k = min(_TOP_K.value, n)
  shared = cfg.shared_head

  def routed(w):
    routes = router.route_to(w[:, :eval_lib.ROUTE_BYTES], top_k, n)
    lp = eval_lib.routed_logprobs(body_N, head, w, routes, shared, _BATCH.value)
    return eval_lib.mixture_nats(lp)

  ens_s = step_timing.timeit(lambda: routed(windows), _REPEATS.value)  # after a warm-up
  ens_mem, mem_source = peak_memory()

  mono_cfg = monolith_config(cfg, n)
  mono_body, mono_head = model_lib.init_experts(jax.random.key(0), mono_cfg, 1)

  def monolith(w):
    return eval_lib.target_logprobs(mono_body, mono_head, 0, w, False, _BATCH.value).mean(axis=1)

  mono_s = step_timing.timeit(lambda: monolith(windows), _REPEATS.value)
  mono_mem, _ = peak_memory()

  tokens = _REQUESTS.value * TOKENS_PER_REQUEST
  result = {
      "tokens_per_second": tokens / ens_s,
      "batch_latency_ms": 1e3 * ens_s,
      "peak_memory_bytes": ens_mem,
      "peak_memory_source": mem_source,
      "monolith_tokens_per_second": tokens / mono_s,
      "monolith_batch_latency_ms": 1e3 * mono_s,
      "monolith_peak_memory_bytes": mono_mem,  # cumulative: the monolith runs second
      "speedup_vs_monolith": mono_s / ens_s,
      "settings": {
          "workdir": _WORKDIR.value, "synthetic": _SYNTH_N.value > 0, "num_experts": n,
          "top_k": top_k, "d_t": cfg.d_t, "d_e": cfg.d_e, "depth": cfg.depth,
          "shared_head": shared,
          "ensemble_params": sizing.ensemble_params(cfg, n),
          "flops_per_token": top_k * sizing.flops_per_token(cfg),
          "monolith_d_t": mono_cfg.d_t,
          "monolith_params": sizing.ensemble_params(mono_cfg, 1),
          "monolith_flops_per_token": sizing.flops_per_token(mono_cfg),
          "requests": _REQUESTS.value,
          "tokens_per_request": TOKENS_PER_REQUEST,
          "expert_batch": _BATCH.value,
          "repeats": _REPEATS.value,
          "statistic": "median",
          "includes_routing": True,
          "device": str(jax.devices()[0]),
      },
  }
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
