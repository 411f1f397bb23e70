r"""EGGROLL population forward throughput against two unperturbed ideals, with JSON output.

  python -m benchmarks.eggroll --d=256 --depth=6 --pop=64 --batch=8 --seq_len=128 \
      --json=bench_out/eggroll.json

Times `eggroll.population_losses` on the GRU (rank-r low-rank members, vmapped over
`--pop_chunk` members, `lax.map` over chunks, noise drawn inside) against the same
pop * batch sequences through the unperturbed model, in two layouts:

- `efficiency` = population tokens/s / tokens/s of the same population without its
  low-rank terms: the same call of `population_losses` (same members, layout, noise
  draws and batch), but every member's matrices are the plain w, so only the x B A^T
  terms differ. The ratio is what the low-rank perturbations cost (EGGROLL reports about
  0.91 of batch inference).
- `efficiency_vs_merged` = population tokens/s / merged-batch tokens/s, where each chunk's
  members are folded into one batch of chunk * batch sequences (plain batched inference).
  XLA may schedule the merged batch worse than the vmapped one, so this ratio can exceed 1;
  it is not a bound.

Compilation and one warm-up call are excluded; each figure is the median of --reps calls,
the three kinds interleaved.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import flags, logging

from benchmarks.step_timing import interleaved
from soma_jax import cli, eggroll, gru, sizing
from soma_jax.layers import LowRank

_D = flags.DEFINE_integer("d", 256, "GRU width.")
_DEPTH = flags.DEFINE_integer("depth", 6, "GRU layers.")
_POP = flags.DEFINE_integer("pop", 64, "Population members (both antithetic signs counted).")
_POP_CHUNK = flags.DEFINE_integer("pop_chunk", None, "Members per vmapped chunk (default: pop).")
_RANK = flags.DEFINE_integer("rank", 1, "Perturbation rank r.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sequences per member B.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 128, "Targets per sequence T.")
_REPS = flags.DEFINE_integer("reps", 5, "Timed calls; the median is reported.")
_JSON = cli.output_flag("json", None, "Write the results here as JSON.")


def measure(d: int, depth: int, pop: int, batch: int, seq_len: int, rank: int = 1,
            pop_chunk: int | None = None, reps: int = 5) -> dict:
  """Population, population-without-low-rank-terms and merged-batch tokens/s; their ratios."""
  cfg = eggroll.EggrollConfig(pop=pop, sigma=0.01, rank=rank, pop_chunk=pop_chunk)
  params = jax.jit(gru.init_gru, static_argnums=1)(jax.random.key(0), gru.GruConfig(d, depth))
  window_BxT1 = jax.random.randint(jax.random.key(1), (batch, seq_len + 1), 0, 256)
  n_chunks = pop // cfg.chunk

  @jax.jit
  def population(params, window_BxT1, key):
    return eggroll.population_losses(params, window_BxT1, key, 0, gru.gru_loss, cfg)

  def without_low_rank(member, window):
    # The member with its low-rank matrix terms dropped (gains and biases stay perturbed,
    # so each member still runs its own forward pass).
    plain = jax.tree.map(lambda x: x.w if isinstance(x, LowRank) else x, member,
                         is_leaf=lambda x: isinstance(x, LowRank))
    return gru.gru_loss(plain, window)

  @jax.jit
  def no_lowrank(params, window_BxT1, key):
    return eggroll.population_losses(params, window_BxT1, key, 0, without_low_rank, cfg)

  @jax.jit
  def merged(params, windows_KxSxT1):
    # The same pop * batch sequences, each chunk's members folded into one batch.
    return jax.lax.map(lambda w: gru.gru_loss(params, w), windows_KxSxT1)

  windows_KxSxT1 = jnp.tile(window_BxT1, (n_chunks, cfg.chunk, 1))
  tokens = pop * batch * seq_len
  seconds = interleaved({"pop": lambda: population(params, window_BxT1, jax.random.key(2)),
                         "no_lowrank": lambda: no_lowrank(params, window_BxT1, jax.random.key(2)),
                         "merged": lambda: merged(params, windows_KxSxT1)}, reps)
  t_pop, t_ideal, t_merged = seconds["pop"], seconds["no_lowrank"], seconds["merged"]
  return {
      "efficiency": t_ideal / t_pop,
      "efficiency_vs_merged": t_merged / t_pop,
      "population_tokens_per_second": tokens / t_pop,
      "no_lowrank_tokens_per_second": tokens / t_ideal,
      "merged_tokens_per_second": tokens / t_merged,
      "population_seconds": t_pop,
      "no_lowrank_seconds": t_ideal,
      "merged_seconds": t_merged,
      "d": d,
      "depth": depth,
      "pop": pop,
      "pop_chunk": cfg.chunk,
      "rank": rank,
      "batch": batch,
      "seq_len": seq_len,
      "reps": reps,
      "params": sizing.gru_params(gru.GruConfig(d, depth)),
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
