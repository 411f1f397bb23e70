"""The lr x sigma sweep behind `eggroll.py:size=cpu`, scored on ensemble validation.

  python -m scripts.eggroll_sweep --out=runs/eggroll_sweep \
      --json=docs/results/eggroll_sweep_cpu.json [--data=DIR] [--steps=12] \
      [--lrs 0.003 0.01 0.03] [--sigmas 0.03125 0.0625 0.125] [--points 0.1:0.25 ...]

Trains `experiments/configs/eggroll.py:n=1,size=cpu` (the paper's GRU, each antithetic
pair on its own stream) once per (lr, sigma) for --steps updates from the same init, data
and noise (seed 0), and scores each end state on the data dir's ensemble-validation
windows (`evaluate.ensemble_validation`, routed as every method is). The points are the
--lrs x --sigmas grid, then each --points LR:SIGMA not already in it. Without --data it
prepares the built-in pystdlib corpus with 2 clusters under OUT/data, as compare.py:cpu
does. Runs resume: rerunning the same command reuses finished grid points, and --reuse
takes the points of an earlier --json (same steps, config, width and population; the code
is not compared, so rerun a point to check it still gives the recorded loss).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from soma_jax import cli, host_devices, runs
from soma_jax import evaluate as eval_lib
from soma_jax import metrics as metrics_lib
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.config import load_config_file
from soma_jax.errors import UserError, check_output_args, exit_on_user_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = "experiments/configs/eggroll.py"
# The recorded grid (docs/results/eggroll_sweep_cpu.json): a 3 x 3 grid, then points around
# its best until the lowest loss had a worse neighbour on each side in lr and in sigma.
LRS, SIGMAS = ["0.003", "0.01", "0.03"], ["0.03125", "0.0625", "0.125"]
POINTS = ["0.03:0.25", "0.1:0.0625", "0.1:0.125", "0.1:0.25", "0.3:0.0625", "0.3:0.125",
          "0.3:0.25", "0.3:0.5", "1:0.0625", "1:0.125", "1:0.25"]


def _data(args) -> str:
  if args.data:
    return args.data
  path = os.path.join(args.out, "data")
  if not os.path.isfile(os.path.join(path, "manifest.json")):
    from soma_jax.data import prepare

    prepare.prepare("pystdlib", 2, path)
  return path


def _done_path(args, lr: float, sigma: float) -> str:
  """Where a grid point's run in OUT records its scores once finished."""
  return os.path.join(args.out, f"lr{lr:g}_sigma{sigma:g}_steps{args.steps}", "sweep_point.json")


def _retrained(args, kept: dict) -> list[dict]:
  """Reused points that OUT also trained (a check that the code still gives their loss)."""
  out = []
  for (lr, sigma), old in sorted(kept.items()):
    if os.path.isfile(done := _done_path(args, lr, sigma)):
      with open(done) as f:
        new = json.load(f)["ensemble_val_loss"]
      out.append({"lr": lr, "sigma": sigma, "recorded": old["ensemble_val_loss"],
                  "retrained": new, "equal": new == old["ensemble_val_loss"]})
  return out


def _train_losses(workdir: str) -> list[float]:
  """The population's mean training loss at each update, from the run's metrics.jsonl."""
  by_step = {r["step"]: r["loss"][0] for r in metrics_lib.read_metrics(workdir) if "loss" in r}
  return [by_step[s] for s in sorted(by_step)]


def _point(args, data_dir: str, lr: float, sigma: float) -> dict:
  """Trains one grid point (or finds it trained) and scores it on ensemble validation."""
  c = load_config_file(os.path.join(ROOT, CONFIG), "n=1,size=cpu")
  c.data.dir = data_dir
  c.opt.lr, c.eggroll.sigma = lr, sigma
  c.update(steps=args.steps, log_every=1, eval_every=args.steps, ckpt_every=args.steps)
  spec = spec_lib.resolve(c)
  done = _done_path(args, lr, sigma)
  workdir = os.path.dirname(done)
  if os.path.isfile(done):  # a finished grid point of an earlier call
    with open(done) as f:
      point = json.load(f)
  else:
    t0 = time.perf_counter()
    summary = train_lib.train_to_end(spec, workdir, f"grid point lr={lr:g} sigma={sigma:g}")
    _, state, _, _ = runs.restore_state(workdir)
    point = {"lr": lr, "sigma": sigma,
             "ensemble_val_loss": eval_lib.ensemble_validation(
                 spec.data_dir, state.body, state.head, spec.shared_head, spec.method.logits),
             "expert_val_loss": summary["val_loss"][0], "updates": summary["step"],
             "step_seconds": summary["device_seconds"] / max(summary["step"], 1),
             "wall_seconds": time.perf_counter() - t0, "loadavg": list(os.getloadavg())}
    with open(done, "w") as f:
      json.dump(point, f)
  # the training curve is the run's metrics.jsonl, read from there (not kept a second time)
  return {**point, "train_loss": _train_losses(workdir)}


def _positive(text: str) -> float | None:
  """`text` as a positive finite float, or None."""
  try:
    value = float(text)
  except ValueError:
    return None
  return value if math.isfinite(value) and value > 0 else None


def _numbers(flag: str, values: list[str]) -> list[float]:
  """A list flag's values as positive finite floats, or a UserError naming the flag."""
  out = [_positive(v) for v in values]
  if not out or None in out:
    raise UserError(f"--{flag}={' '.join(values)} must be positive numbers, e.g. "
                    f"--{flag} 0.01 0.03")
  return out


def _grid(args) -> list[tuple[float, float]]:
  """The (lr, sigma) points to score: --lrs x --sigmas, then each --points LR:SIGMA, each once."""
  if args.steps < 1:
    raise UserError(f"--steps={args.steps} must be >= 1")
  grid = [(lr, s) for lr in _numbers("lrs", args.lrs) for s in _numbers("sigmas", args.sigmas)]
  for item in args.points:
    point = tuple(_positive(v) for v in item.split(":"))
    if len(point) != 2 or None in point:
      raise UserError(f"--points {item}: write each point as LR:SIGMA, two positive numbers, "
                      "e.g. --points 0.1:0.25")
    grid += [point] if point not in grid else []
  return grid


def _kept(path: str, steps: int, current: dict) -> dict:
  """The grid points of an earlier --json at the same steps, model and population."""
  try:
    with open(path) as f:
      old = json.load(f)
    points = {(p["lr"], p["sigma"]): p for p in old["grid"] if p["updates"] == steps}
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UserError(f"--reuse={path} is not a JSON this script wrote ({e}); fix: pass its "
                    "--json output, or drop --reuse") from None
  for key in ("config", "model", "eggroll"):
    if old.get(key) != current[key]:
      raise UserError(f"--reuse={path} was run with {key} {old.get(key)}, not today's "
                      f"{current[key]}; fix: drop --reuse to retrain its points")
  return points


def _setup() -> dict:
  """What a --reuse JSON must share with today's grid: the config, model and population."""
  c = load_config_file(os.path.join(ROOT, CONFIG), "n=1,size=cpu")
  return {"config": f"{CONFIG}:n=1,size=cpu", "model": {"d": c.model.d_t, "depth": c.model.depth},
          "eggroll": {k: c.eggroll[k] for k in ("pop", "pop_chunk", "segment", "rank")}}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="folder of the grid's runs (and data)")
  parser.add_argument("--data", default="", help="a prepared data dir (default: OUT/data)")
  parser.add_argument("--steps", type=int, default=12, help="updates per grid point")
  parser.add_argument("--lrs", nargs="+", default=LRS)
  parser.add_argument("--sigmas", nargs="+", default=SIGMAS)
  parser.add_argument("--points", nargs="*", default=POINTS, help="extra LR:SIGMA points beside "
                      "the --lrs x --sigmas grid, e.g. --points 0.1:0.25 0.3:0.125")
  parser.add_argument("--json", help="write the results here")
  parser.add_argument("--reuse", default="", help="an earlier --json of this script: its grid "
                      "points at the same --steps are kept, not retrained")
  args = parser.parse_args()
  check_output_args(parser, args, out="folder", json="file")
  grid_keys = _grid(args)
  setup = _setup()
  kept = _kept(args.reuse, args.steps, setup) if args.reuse else {}
  reused = {p: kept[p] for p in grid_keys if p in kept}  # the kept points this grid names
  data_dir = _data(args)
  grid = [reused.get(p) or _point(args, data_dir, *p) for p in grid_keys]
  best = min(grid, key=lambda r: r["ensemble_val_loss"])
  cli.emit_json({
      "command": "python -m scripts.eggroll_sweep " + " ".join(
          a if not a.startswith(("--out=", "--data=", "--reuse=")) else a.split("=")[0] + "=..."
          for a in sys.argv[1:]),
      **setup,
      "updates": args.steps, "seed": 0, "selected_by": "ensemble_val_loss (lowest)",
      "reused_points": sorted(reused),
      "reused_points_retrained": _retrained(args, reused),
      "step_seconds_are": f"train's device_seconds per update: {host_devices.CHARGE_RULE} "
                          "(reused points: what their earlier run recorded)",
      "best": {"lr": best["lr"], "sigma": best["sigma"],
               "ensemble_val_loss": best["ensemble_val_loss"]},
      "grid": grid,
  }, args.json)


if __name__ == "__main__":
  exit_on_user_error(main)()
