"""Parameter counts, width search and the paper's size table, in one place (SPEC 2)."""

from __future__ import annotations

from soma_jax import model as model_lib


def body_count(d_t: int, d_e: int, depth: int) -> int:
  """M_body = 16 D d_t^2 + (2D + 1) d_t, plus 2 d_E d_t projections when d_t != d_E."""
  return 16 * depth * d_t**2 + (2 * depth + 1) * d_t + (2 * d_e * d_t if d_t != d_e else 0)


def ensemble_count(n: int, d_t: int, d_e: int, depth: int, vocab: int = model_lib.VOCAB) -> int:
  """Width-d_E ensembles count one shared head, wide ones N heads (SPEC 2)."""
  heads = 1 if d_t == d_e else n
  return n * body_count(d_t, d_e, depth) + heads * vocab * d_e


def width_for_total(total: int, n: int, d_e: int, depth: int) -> int:
  """The body width d_t whose N-expert ensemble is closest to `total` parameters."""
  return min(range(1, 4097), key=lambda d: abs(ensemble_count(n, d, d_e, depth) - total))


def sized_config(total: int, n: int, d_e: int, depth: int) -> model_lib.ModelConfig:
  d_t = width_for_total(total, n, d_e, depth)
  cfg = model_lib.ModelConfig(d_t=d_t, d_e=d_e, depth=depth, shared_head=(d_t == d_e))
  assert model_lib.body_params(cfg) == body_count(d_t, d_e, depth), "count formula drifted"
  return cfg


