r"""EGGROLL population forward throughput vs plain batched inference, with JSON output.

  python benchmarks/eggroll.py --d=256 --depth=6 --pop=64 --batch=8 --seq_len=128 \
      --json=bench_out/eggroll.json

Times `eggroll.population_losses` on the GRU (rank-r low-rank members, vmapped over
`--pop_chunk` members, `lax.map` over chunks, noise drawn inside) against `gru_loss` of the
unperturbed model on the same number of sequences (pop * batch, in the same chunks).
`efficiency` = population tokens/s / plain tokens/s (EGGROLL reports about 0.91).
Compilation and one warm-up call are excluded; each figure is the median of --reps calls,
the two kinds interleaved.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from absl import flags, logging

from soma_jax import cli, eggroll, gru

_D = flags.DEFINE_integer("d", 256, "GRU width.")
_DEPTH = flags.DEFINE_integer("depth", 6, "GRU layers.")
_POP = flags.DEFINE_integer("pop", 64, "Population members (both antithetic signs counted).")
_POP_CHUNK = flags.DEFINE_integer("pop_chunk", None, "Members per vmapped chunk (default: pop).")
_RANK = flags.DEFINE_integer("rank", 1, "Perturbation rank r.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sequences per member B.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 128, "Targets per sequence T.")
_REPS = flags.DEFINE_integer("reps", 5, "Timed calls; the median is reported.")
_JSON = flags.DEFINE_string("json", None, "Write the results here as JSON.")


def _median_seconds(fns, reps: int) -> list[float]:
  """Median wall time of each `fn()`, calls interleaved so load drift hits all alike."""
  for fn in fns:
    jax.block_until_ready(fn())  # compile + warm-up, not timed
  times = [[] for _ in fns]
  for _ in range(reps):
    for fn, ts in zip(fns, times, strict=True):
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      ts.append(time.perf_counter() - t0)
  return [statistics.median(ts) for ts in times]


def measure(d: int, depth: int, pop: int, batch: int, seq_len: int, rank: int = 1,
            pop_chunk: int | None = None, reps: int = 5) -> dict:
  """Population and plain forward throughput in tokens/s, and their ratio."""
  cfg = eggroll.EggrollConfig(pop=pop, sigma=0.01, rank=rank, pop_chunk=pop_chunk)
  params = jax.jit(gru.init_gru, static_argnums=1)(jax.random.key(0), gru.GruConfig(d, depth))
  window_BxT1 = jax.random.randint(jax.random.key(1), (batch, seq_len + 1), 0, 256)
  n_chunks = pop // cfg.chunk

  @jax.jit
  def population(params, window_BxT1, key):
    return eggroll.population_losses(params, window_BxT1, key, 0, gru.gru_loss, cfg)

  @jax.jit
  def plain(params, windows_CxSxT1):
    # The same pop * batch sequences through the unperturbed model, chunk by chunk.
    return jax.lax.map(lambda w: gru.gru_loss(params, w), windows_CxSxT1)

  windows_CxSxT1 = jnp.tile(window_BxT1, (n_chunks, cfg.chunk, 1)).reshape(
      n_chunks, cfg.chunk * batch, seq_len + 1)
  tokens = pop * batch * seq_len
  t_pop, t_plain = _median_seconds(
      [lambda: population(params, window_BxT1, jax.random.key(2)),
       lambda: plain(params, windows_CxSxT1)], reps)
  return {
      "efficiency": t_plain / t_pop,
      "population_tokens_per_second": tokens / t_pop,
      "plain_tokens_per_second": tokens / t_plain,
      "population_seconds": t_pop,
      "plain_seconds": t_plain,
      "d": d,
      "depth": depth,
      "pop": pop,
      "pop_chunk": cfg.chunk,
      "rank": rank,
      "batch": batch,
      "seq_len": seq_len,
      "reps": reps,
      "params": gru.gru_params(gru.GruConfig(d, depth)),
      "backend": jax.default_backend(),
      "device": str(jax.devices()[0].device_kind),
  }


def main(argv) -> None:
  del argv
  logging.info("devices: %s", jax.devices())
  result = measure(_D.value, _DEPTH.value, _POP.value, _BATCH.value, _SEQ_LEN.value,
                   _RANK.value, _POP_CHUNK.value, _REPS.value)
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
