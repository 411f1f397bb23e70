"""Complete warm inference of a routed ensemble (SPEC 7; the paper's Table 12): throughput,
batch latency and peak memory at each batch of requests, and the fastest batch.

A request is one evaluation window of route + score + 1 bytes. Serving a batch runs the whole
pipeline from bytes to per-request losses: the router reads each request's first `route`
bytes (when N > 1: one expert needs no routing), each of the top min(k, N) experts runs once
on the requests routed to it (`evaluate.routed_logprobs`, at most `batch` windows at once), and
their next-byte probabilities are mixed uniformly in float64 over the next `score` targets
(`evaluate.mixture_nats`). A batch is served once to compile and warm up, then timed
`repeats` times; medians are reported. Tokens are bytes, and only the scored targets count
(the paper: 768 of each 1,024-byte request). Arithmetic per token counts the selected experts'
forward operations and excludes routing: min(k, N) F_N (SPEC 7).

Peak memory, on every backend: XLA's buffer plan of the largest scoring program the batch runs
(its arguments, every expert's weights among them, outputs and temporaries:
`memory.planned_bytes`) plus the host arrays of the mixture (the requests, the float32
log-probabilities and their float64 copy and mixture), the paper's "peak allocated memory
including intermediates". Beside it, what the process measured: the rise of its peak RSS over
the timed repetitions (CPU; zero where an earlier stage of the process peaked higher) and the
device's `peak_bytes_in_use` where the backend reports one (a high-water mark of the whole
process: an upper bound after training).
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import time
from typing import Any

import jax
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import memory
from soma_jax.data.router import Router
from soma_jax.errors import UserError

PyTree = Any
TOP_K = 4  # experts mixed per request, capped at N (SPEC 4; as `evaluate.TestSet.losses`)


@dataclasses.dataclass(frozen=True)
class Ensemble:
  """A trained model as it serves: N experts' bodies and head(s), its router, its forward
  pass (`Method.logits`) and one expert's forward operations per token (F_N)."""
  body_N: PyTree
  head: jax.Array
  n_experts: int
  shared_head: bool
  logits_fn: eval_lib.LogitsFn
  router: Router
  flops_per_token: int

  @property
  def top_k(self) -> int:
    return min(TOP_K, self.n_experts)


def ops_per_token(n_experts: int, flops_per_token: int) -> int:
  """Inference operations per token: the min(4, N) selected experts' forward passes (SPEC 7:
  Q tokens cost Q min(4, N) F_N), routing excluded."""
  return min(TOP_K, n_experts) * flops_per_token


def serve(model: Ensemble, requests: np.ndarray, route: int, batch: int) -> np.ndarray:
  """Per-request nats/byte of the routed top-min(4, N) mixture: route, score, mix."""
  routes = model.router.route_to(requests[:, :route], model.top_k, model.n_experts)
  lp = eval_lib.routed_logprobs(model.body_N, model.head, requests, routes, model.shared_head,
                                batch, first=route + 1, logits_fn=model.logits_fn)
  return eval_lib.mixture_nats(lp)


def rss_peak_bytes() -> int:
  """The process's peak resident set so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(rss if sys.platform == "darwin" else rss * 1024)


def planned_peak_bytes(model: Ensemble, requests: np.ndarray, route: int, batch: int) -> dict:
  """XLA's plan of the batch's largest scoring program (one expert's group, padded as
  `evaluate.target_logprobs` pads it) and the host arrays of the mixture, in bytes."""
  routes = model.router.route_to(requests[:, :route], model.top_k, model.n_experts)
  largest = int(np.bincount(routes.ravel()).max())
  rows = min(batch, 1 << (largest - 1).bit_length())
  # The program target_logprobs runs (its private jit), lowered at that shape only.
  lowered = eval_lib._target_logprobs.lower(
      model.body_N, model.head, 0, jax.ShapeDtypeStruct((rows, requests.shape[1]), np.uint8),
      shared_head=model.shared_head, first=route + 1, logits_fn=model.logits_fn)
  program = memory.planned_bytes(lowered.compile())
  scored = requests.shape[0] * model.top_k * (requests.shape[1] - route - 1)
  host = requests.nbytes + scored * (4 + 8) + (scored // model.top_k) * 8
  return {"planned_peak_bytes": program + host if program >= 0 else None,
          "program_bytes": program, "host_bytes": host, "program_rows": rows}


def time_batch(model: Ensemble, requests: np.ndarray, route: int, batch: int,
               repeats: int) -> dict:
  """One batch of `batch` requests (the split's requests tiled to it) served once to compile
  and warm up, then `repeats` timed times: seconds, medians, tokens/s and memory."""
  reqs = np.resize(requests, (batch, requests.shape[1]))
  score = requests.shape[1] - route - 1
  serve(model, reqs, route, batch)  # compilation and warm-up: not timed
  before = rss_peak_bytes()
  seconds = []
  for _ in range(repeats):
    t = time.perf_counter()
    serve(model, reqs, route, batch)  # returns host arrays: the work is done
    seconds.append(time.perf_counter() - t)
  median = float(np.median(seconds))
  return {"batch": batch, "seconds": seconds, "median_seconds": median,
          "tokens_per_second": batch * score / median, "batch_latency_ms": 1e3 * median,
          "requests_per_second": batch / median,
          **planned_peak_bytes(model, reqs, route, batch),
          "rss_peak_rise_bytes": rss_peak_bytes() - before,
          "device_peak_bytes_in_use": device_peak_bytes()}


def device_peak_bytes() -> int | None:
  """The first device's peak_bytes_in_use where the backend reports it (None on a CPU)."""
  try:
    stats = jax.local_devices()[0].memory_stats() or {}
  except Exception:  # some backends do not implement memory_stats
    return None
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else int(peak)


def fastest(rows: list[dict]) -> int:
  """The index of the batch with the highest measured throughput (the first on a tie)."""
  return int(np.argmax([r["tokens_per_second"] for r in rows]))


def time_batches(model: Ensemble, requests: np.ndarray, route: int, batches: tuple[int, ...],
                 repeats: int) -> dict:
  """Every batch of `batches` timed (`time_batch`) and the fastest: {batches, fastest,
  fastest_batch, top_k, ops_per_token, scored_tokens_per_request, ...}."""
  if not batches or min(batches) < 1 or repeats < 1:
    raise UserError(f"batches={batches}, repeats={repeats}: need at least one batch, each >= 1, "
                    "and repeats >= 1")
  rows = [time_batch(model, requests, route, b, repeats) for b in batches]
  best = fastest(rows)
  return {"batches": rows, "fastest": rows[best], "fastest_batch": rows[best]["batch"],
          "top_k": model.top_k, "ops_per_token": ops_per_token(model.n_experts,
                                                               model.flops_per_token),
          "scored_tokens_per_request": requests.shape[1] - route - 1,
          "request_bytes": int(requests.shape[1]), "route_bytes": route, "repeats": repeats,
          "statistic": "median", "includes_routing": model.n_experts > 1,
          "device": str(jax.devices()[0])}
