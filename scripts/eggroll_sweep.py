"""The lr x sigma sweep behind `eggroll.py:size=cpu`, scored on ensemble validation.

  python -m scripts.eggroll_sweep --out=runs/eggroll_sweep \
      --json=docs/results/eggroll_sweep_cpu.json [--data=DIR] [--steps=12]

Trains `experiments/configs/eggroll.py:n=1,size=cpu` (the paper's GRU, each antithetic
pair on its own stream) once per (lr, sigma) for --steps updates from the same init, data
and noise (seed 0), and scores each end state on the data dir's ensemble-validation
windows (`train.ensemble_validation`, routed as every method is). Without --data it
prepares the built-in pystdlib corpus with 2 clusters under OUT/data, as compare.py:cpu
does. Runs resume: rerunning the same command reuses finished grid points.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from soma_jax import cli, runs
from soma_jax import train as train_lib
from soma_jax.config import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = "experiments/configs/eggroll.py"


def _data(args) -> str:
  if args.data:
    return args.data
  path = os.path.join(args.out, "data")
  if not os.path.isfile(os.path.join(path, "manifest.json")):
    from soma_jax.data import prepare

    prepare.prepare("pystdlib", 2, path)
  return path


def _point(args, data_dir: str, lr: float, sigma: float) -> dict:
  """Trains one grid point (or finds it trained) and scores it on ensemble validation."""
  c = load_config_file(os.path.join(ROOT, CONFIG), "n=1,size=cpu")
  c.data.dir = data_dir
  c.opt.lr, c.eggroll.sigma = lr, sigma
  c.update(steps=args.steps, log_every=1, eval_every=args.steps, ckpt_every=args.steps)
  workdir = os.path.join(args.out, f"lr{lr:g}_sigma{sigma:g}_steps{args.steps}")
  done = os.path.join(workdir, "sweep_point.json")
  if os.path.isfile(done):  # a finished grid point of an earlier call
    with open(done) as f:
      return json.load(f)
  t0 = time.perf_counter()
  summary = train_lib.train_to_end(c, workdir, f"grid point lr={lr:g} sigma={sigma:g}")
  _, state, _, _ = runs.restore_state(workdir)
  point = {"lr": lr, "sigma": sigma,
           "ensemble_val_loss": train_lib.ensemble_validation(c, state),
           "expert_val_loss": summary["val_loss"][0], "updates": summary["step"],
           "step_seconds": summary["device_seconds"] / max(summary["step"], 1),
           "wall_seconds": time.perf_counter() - t0, "loadavg": list(os.getloadavg())}
  with open(done, "w") as f:
    json.dump(point, f)
  return point


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="folder of the grid's runs (and data)")
  parser.add_argument("--data", default="", help="a prepared data dir (default: OUT/data)")
  parser.add_argument("--steps", type=int, default=12, help="updates per grid point")
  parser.add_argument("--lrs", type=float, nargs="+", default=[3e-3, 1e-2, 3e-2])
  parser.add_argument("--sigmas", type=float, nargs="+", default=[2**-5, 2**-4, 2**-3])
  parser.add_argument("--json", help="write the results here")
  parser.add_argument("--reuse", default="", help="an earlier --json of this script: its grid "
                      "points at the same --steps are kept, not retrained")
  args = parser.parse_args()
  if args.steps < 1 or min(args.lrs) <= 0 or min(args.sigmas) <= 0:
    parser.error("--steps, --lrs and --sigmas must be positive")
  data_dir = _data(args)
  kept = {}
  if args.reuse:
    with open(args.reuse) as f:
      kept = {(p["lr"], p["sigma"]): p for p in json.load(f)["grid"] if p["updates"] == args.steps}
  grid = [kept.get((lr, s)) or _point(args, data_dir, lr, s) for lr in args.lrs
          for s in args.sigmas]
  best = min(grid, key=lambda r: r["ensemble_val_loss"])
  c = load_config_file(os.path.join(ROOT, CONFIG), "n=1,size=cpu")
  cli.emit_json({
      "command": "python -m scripts.eggroll_sweep " + " ".join(
          a if not a.startswith(("--out=", "--data=", "--reuse=")) else a.split("=")[0] + "=..."
          for a in sys.argv[1:]),
      "config": f"{CONFIG}:n=1,size=cpu",
      "model": {"d": c.model.d_t, "depth": c.model.depth},
      "eggroll": {k: c.eggroll[k] for k in ("pop", "pop_chunk", "segment", "rank")},
      "updates": args.steps, "seed": 0, "selected_by": "ensemble_val_loss (lowest)",
      "reused_points": sorted(kept) if kept else [],
      "best": {"lr": best["lr"], "sigma": best["sigma"],
               "ensemble_val_loss": best["ensemble_val_loss"]},
      "grid": grid,
  }, args.json)


if __name__ == "__main__":
  main()
