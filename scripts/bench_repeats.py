"""The spread of `make bench` across processes: its ratios from --runs fresh processes.

  python -m scripts.bench_repeats --runs=3 --json docs/results/bench_repeats.json

Runs `benchmarks/spsa_step.py` at the cpu preset (N = 4) --runs times, one after another,
each in its own process, without the loop reference (--loop=false), and keeps each run's
step, forward and estimate times and the ratios between them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from soma_jax import cli
from soma_jax.errors import check_output_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KEPT = ("step_seconds", "forward_seconds", "efficiency", "estimate_seconds",
        "estimate_efficiency", "batched_forward_seconds", "efficiency_vs_batched")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=3, help="processes, one after another")
  parser.add_argument("--json", help="write the results here")
  args = parser.parse_args()
  check_output_args(parser, args, json="file")
  if args.runs < 1:
    parser.error("--runs must be >= 1")
  runs = []
  with tempfile.TemporaryDirectory() as tmp:
    for i in range(args.runs):
      out = os.path.join(tmp, f"run_{i}.json")
      subprocess.run([sys.executable, "-m", "benchmarks.spsa_step",
                      "--config=" + os.path.join(ROOT, "experiments/configs/soma.py") +
                      ":n=4,size=cpu", "--loop=false", f"--json={out}"],
                     check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
      with open(out) as f:
        r = json.load(f)
      runs.append({k: r[k] for k in KEPT} | {k: r["config"][k] for k in
                                               ("pert_chunk", "time_block", "signs")})
  cli.emit_json({"runs": runs}, args.json)


if __name__ == "__main__":
  main()
