r"""How far expert slices trained as separate jobs and merged are from one job, on this machine.

  python -m scripts.merge_rounding --json docs/results/merge_rounding_cpu.json

Prepares the built-in corpus into 3 shards (a temporary folder), then for each spsa.signs
setting trains the tiny SOMA config (N = 3, 4 updates) as one job and as the slices 0:1
and 1:3, merges the slices and reports how the merged weights differ from the one job's:
the largest differences, how many weights differ at all and by more than 1e-5. Also
reports, for the tiny model at N = 4, whether each slice's SPSA estimate at pert_chunk
1, 2 and 4 is bit-identical to the whole job's. docs/training.md's claims about slice merges
come from this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from soma_jax import cli, merge, runs, spsa, train
from soma_jax import config as config_lib
from soma_jax import spec as spec_lib
from soma_jax.data import prepare
from soma_jax.errors import check_output_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SLICES = ("0:1", "1:3")


def tiny(data_dir: str, signs: str, experts: str = "") -> ml_collections.ConfigDict:
  c = config_lib.load_config_file(os.path.join(ROOT, "experiments/configs/soma.py"),
                                  "n=3,size=tiny")
  c.data.dir, c.experts, c.spsa.signs = data_dir, experts, signs
  c.update(steps=4, log_every=4, eval_every=4, ckpt_every=4)
  return c


def merged_vs_one_job(tmp: str, data_dir: str, signs: str) -> dict:
  one = os.path.join(tmp, f"one_{signs}")
  train.run(tiny(data_dir, signs), one)
  parts = []
  for s in SLICES:
    parts.append(os.path.join(tmp, f"{signs}_{s.replace(':', '-')}"))
    train.run(tiny(data_dir, signs, s), parts[-1])
  merged = os.path.join(tmp, f"merged_{signs}")
  merge.merge(parts, merged)
  a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(runs.restore_params(w)[:2])])
          for w in (one, merged))
  diff = np.sort(np.abs(a - b))[::-1]
  return {"weights": int(diff.size), "largest_differences": diff[:3].tolist(),
          "weights_differing": int(np.sum(diff > 0)), "weights_over_1e-5": int(np.sum(diff > 1e-5))}


def estimates_bit_identical(signs: str) -> dict:
  """{pert_chunk: [slice 0:1, 0:2, 0:3, 1:3 bit-identical to the N = 4 job's estimate]}."""
  spec = spec_lib.resolve(config_lib.base_config(n=4, size="tiny"))
  state = runs.initial_state(spec)
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 1, 2, 33), dtype=np.uint8))
  out = {}
  for chunk in (1, 2, 4):
    cfg = dataclasses.replace(spec.method.step_config().spsa, pert_chunk=chunk,
                              signs_together=signs == "together")
    est = jax.jit(lambda body, head, b, eps, ids, cfg=cfg: spsa.estimate(
        body, head, b, eps, state.step, ids, jax.random.key(0), cfg, shared_head=False)[0])
    whole = est(state.body, state.head, batch, state.sched.eps, jnp.arange(4))
    same = []
    for lo, hi in ((0, 1), (0, 2), (0, 3), (1, 3)):
      part = est(jax.tree.map(lambda x, lo=lo, hi=hi: x[lo:hi], state.body), state.head[lo:hi],
                 batch[lo:hi], state.sched.eps[lo:hi], jnp.arange(lo, hi))
      same.append(all(bool(jnp.array_equal(x[lo:hi], y))
                      for x, y in zip(jax.tree.leaves(whole), jax.tree.leaves(part))))
    out[str(chunk)] = same
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", help="write the results here")
  args = parser.parse_args()
  check_output_args(parser, args, json="file")
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = os.path.join(tmp, "data")
    prepare.prepare("pystdlib", 3, data_dir, test_docs=6, ensemble_val_docs=3, min_df=2,
                    svd_dims=16, val_fraction=0.05)
    result = {"backend": jax.default_backend(), "slices": list(SLICES),
              "merged_vs_one_job": {s: merged_vs_one_job(tmp, data_dir, s)
                                    for s in ("together", "apart")},
              "estimate_bit_identical_slices_0:1_0:2_0:3_1:3": {
                  s: estimates_bit_identical(s) for s in ("together", "apart")}}
  cli.emit_json(result, args.json)


if __name__ == "__main__":
  main()
