"""Parameter counts, FLOPs per token, width search and the paper's size table (SPEC 2, 6, 7).

Counts come from the init code (`jax.eval_shape`, nothing allocated) and closed forms that
tests hold equal to them. `python -m soma_jax.sizing --table` prints the paper's table
(`--json`, `--n 4 --d_t 64`), with the EGGROLL GRU rows of SPEC 9.4 (`--json --gru`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import jax

from soma_jax import gru as gru_lib
from soma_jax import model as model_lib
from soma_jax.layers import VOCAB

PyTree = Any


# ------------------------------------------------------------------------------ counts


def num_params(tree: PyTree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def body_params(cfg: model_lib.ModelConfig) -> int:
  """Perturbed parameters per expert (body and projections), counted from the init code."""
  return num_params(jax.eval_shape(lambda: model_lib.init_body(jax.random.key(0), cfg)))


def head_params(cfg: model_lib.ModelConfig) -> int:
  return num_params(jax.eval_shape(lambda: model_lib.init_head(jax.random.key(0), cfg)))


def ensemble_params(cfg: model_lib.ModelConfig, n: int) -> int:
  """Bodies plus heads: one head if shared, N otherwise (SPEC section 2)."""
  heads = 1 if cfg.shared_head else n
  return n * body_params(cfg) + heads * head_params(cfg)


def flops_per_token(cfg: model_lib.ModelConfig) -> int:
  """Operations per token of one expert's forward pass (multiply-add = 2), F_N in SPEC 7."""
  return 2 * (body_params(cfg) - (2 * cfg.depth + 1) * cfg.d_t + head_params(cfg))


def gru_params(cfg: gru_lib.GruConfig) -> int:
  """Parameters of one GRU LM, its embedding and untied head included."""
  return num_params(jax.eval_shape(lambda: gru_lib.init_gru(jax.random.key(0), cfg)))


def gru_flops_per_token(cfg: gru_lib.GruConfig) -> int:
  """Forward operations per token of the GRU (multiply-add = 2), matmuls only: per layer
  the mixer's 4 d^2 and the MLP's 2 x 4 d^2, and the d V head."""
  return 2 * (cfg.depth * (4 + 2 * gru_lib.MLP_MULT) * cfg.d * cfg.d + cfg.d * cfg.vocab)


# ------------------------------------------------------------------------ closed forms


def body_count(d_t: int, d_e: int, depth: int) -> int:
  """M_body = 16 D d_t^2 + (2D + 1) d_t, plus 2 d_E d_t projections when d_t != d_E."""
  return 16 * depth * d_t**2 + (2 * depth + 1) * d_t + (2 * d_e * d_t if d_t != d_e else 0)


def params_formula(d_t: int, n: int, d_e: int = 32, depth: int = 2, shared_head: bool = False) -> int:
  """Total parameters of N experts of width d_t (SPEC 2), with N heads or one shared head."""
  return n * body_count(d_t, d_e, depth) + (1 if shared_head else n) * VOCAB * d_e


def ensemble_count(n: int, d_t: int, d_e: int, depth: int) -> int:
  """Width-d_E ensembles count one shared head, wide ones N heads (SPEC 2)."""
  return params_formula(d_t, n, d_e, depth, shared_head=(d_t == d_e))


# ------------------------------------------------------------------------ width search


def width_for_params(total: int, n: int, d_e: int = 32, depth: int = 2,
                     shared_head: bool = False) -> int:
  """The width d_t whose N-expert ensemble has the parameter count nearest to `total`.

  Solves the quadratic of `params_formula` (with projections) and compares the integer
  neighbours of the root, and d_t = d_E (no projections), exactly.
  """
  heads = (1 if shared_head else n) * VOCAB * d_e
  a, b, c = 16 * depth * n, n * (2 * depth + 1 + 2 * d_e), heads - total
  root = (-b + math.sqrt(max(b * b - 4 * a * c, 0.0))) / (2 * a)
  candidates = {max(1, math.floor(root)), max(1, math.ceil(root)), d_e}
  return min(sorted(candidates),
             key=lambda d: abs(params_formula(d, n, d_e, depth, shared_head) - total))


def gru_width_for_params(total: int, n: int, depth: int = 6) -> int:
  """The GRU width d whose N models have the parameter count nearest to `total`.

  A GRU (soma_jax.gru) holds 12 depth d^2 + (2 V + 4 depth + 1) d parameters: embedding
  and untied head V d each, per layer the mixer's four d x d matrices and two biases, the
  MLP's d x 4d and 4d x d, two gains, and a final gain d. The root of that quadratic
  gives two candidates; the GRU's own count (`gru_params`) picks between them.
  """
  a, b = 12 * depth * n, n * (2 * VOCAB + 4 * depth + 1)
  root = (-b + math.sqrt(b * b + 4 * a * total)) / (2 * a)
  count = lambda d: n * gru_params(gru_lib.GruConfig(d=d, depth=depth))
  return min(sorted({max(1, math.floor(root)), max(1, math.ceil(root))}),
             key=lambda d: abs(count(d) - total))


def width_for_total(total: int, n: int, d_e: int, depth: int) -> int:
  """The body width d_t whose N-expert ensemble (`ensemble_count`) is closest to `total`."""
  return min(range(1, 4097), key=lambda d: abs(ensemble_count(n, d, d_e, depth) - total))


def sized_config(total: int, n: int, d_e: int, depth: int) -> model_lib.ModelConfig:
  """The ModelConfig of `width_for_total`, sharing one head at width d_E."""
  d_t = width_for_total(total, n, d_e, depth)
  cfg = model_lib.ModelConfig(d_t=d_t, d_e=d_e, depth=depth, shared_head=(d_t == d_e))
  assert body_params(cfg) == body_count(d_t, d_e, depth), "count formula drifted"
  return cfg


# ------------------------------------------------------------------------- paper table


PAPER_WIDTH = {1: 509, 2: 361, 8: 181, 256: 32}  # N -> d_t of SPEC section 2's size table
PAPER_SIZES = tuple(PAPER_WIDTH.items())


def paper_config(n: int, d_t: int) -> model_lib.ModelConfig:
  """Width-32 ensembles share one frozen head; wide controls own theirs."""
  return model_lib.ModelConfig(d_t=d_t, shared_head=(d_t == 32))


def size_table(rows=PAPER_SIZES) -> list[dict]:
  out = []
  for n, d_t in rows:
    cfg = paper_config(n, d_t)
    out.append({
        "n": n,
        "d_t": d_t,
        "head": head_params(cfg),
        "shared_head": cfg.shared_head,
        "ensemble_params": ensemble_params(cfg, n),
        "body_params": body_params(cfg),
    })
  return out


GRU_PAPER_WIDTHS = (20, 29, 58, 118, 339)  # SPEC 9.4: the paper's EGGROLL rows, depth 6


def gru_size_table(widths=GRU_PAPER_WIDTHS, depth: int = 6) -> list[dict]:
  """Parameters of the EGGROLL GRU LM at each width (the paper's rows by default)."""
  return [{"d": d, "depth": depth, "params": gru_params(gru_lib.GruConfig(d=d, depth=depth))}
          for d in widths]


def _fmt(x: int) -> str:
  for unit, div in (("M", 1e6), ("k", 1e3)):
    if x >= div:
      return f"{x / div:#.3g}{unit}"
  return str(x)


def main(argv=None) -> None:
  import argparse

  parser = argparse.ArgumentParser(description="SOMA parameter counts from the model code.")
  parser.add_argument("--table", action="store_true", help="print the paper's size table")
  parser.add_argument("--json", action="store_true", help="print the table as JSON")
  parser.add_argument("--n", type=int, nargs="*", help="expert counts (pair with --d_t)")
  parser.add_argument("--d_t", type=int, nargs="*", help="body widths (pair with --n)")
  parser.add_argument("--gru", action="store_true",
                      help="with --json: the EGGROLL GRU rows (SPEC 9.4) instead")
  args = parser.parse_args(argv)
  rows = PAPER_SIZES
  if args.n or args.d_t:
    if not args.n or not args.d_t or len(args.n) != len(args.d_t):
      parser.error("--n and --d_t take the same number of values, e.g. --n 4 --d_t 64")
    if min(args.n) < 1 or min(args.d_t) < 1:
      parser.error("--n and --d_t must be positive")
    rows = tuple(zip(args.n, args.d_t, strict=True))
  table = size_table(rows)
  gru_rows = gru_size_table() if rows is PAPER_SIZES else []
  if args.json:
    print(json.dumps(gru_size_table() if args.gru else table, indent=1))
    return
  print(f"{'N':>5} {'d_t':>5} {'head':>18} {'ensemble params':>16} {'body params/expert':>19}")
  for r in table:
    head = f"{_fmt(r['head'])}, " + ("one shared" if r["shared_head"] else "own")
    print(f"{r['n']:>5} {r['d_t']:>5} {head:>18} {_fmt(r['ensemble_params']):>16} "
          f"{_fmt(r['body_params']):>19}")
  if gru_rows:
    print("\nEGGROLL GRU LM (soma_jax.gru: untied embedding and head, 12 d^2 + 4 d per layer)")
    print(f"{'depth':>5} {'d':>5} {'params':>12}")
    for r in gru_rows:
      print(f"{r['depth']:>5} {r['d']:>5} {r['params']:>12,}")


if __name__ == "__main__":
  main()
