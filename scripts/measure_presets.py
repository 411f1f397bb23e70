r"""Wall time of the size presets on this machine; writes the JSON docs/training.md's preset table quotes.

  nice -n 10 .venv/bin/python -m scripts.measure_presets --out docs/presets_cpu.json

Runs, each as its own process: prepare the built-in corpus (N = 2), the tiny seed and
SOMA runs, short runs (--steps updates) of the cpu seed and SOMA presets, and the
evaluation of the short SOMA run (the test set's size and interval width). Records
every command, its wall time and CPU time (other jobs on the machine stretch the wall
time, not the CPU time), the mean seconds per update after the first log interval
(which holds the compile), and a training run's start-up line (its devices and layout:
the commands pass no device flag, so they show the default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

from soma_jax import config as config_lib
from soma_jax.errors import check_output_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd: list[str]) -> tuple[float, float, str]:
  """(wall seconds, CPU seconds of the process and its children, the training start-up line
  naming devices and layout, or "") of one command."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        text=True)
  wall = time.perf_counter() - t0
  if proc.returncode:
    raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = [line for line in proc.stderr.splitlines() if line.startswith("training experts")]
  return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), \
      start[0] if start else ""


def _train_record(workdir: str) -> dict:
  """Config fields that set the cost, and seconds per update after the first log interval."""
  with open(os.path.join(workdir, "config.json")) as f:
    c = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    logged = [r for r in map(json.loads, f) if "step_seconds" in r]
  steady = [r["step_seconds"] for r in logged[1:]]
  return {"n_experts": c["n_experts"], "d_t": c["model"]["d_t"], "n_pert": c["spsa"]["n_pert"],
          "batch": c["spsa"]["batch"], "seq_len": c["data"]["seq_len"],
          "pert_chunk": c["spsa"]["pert_chunk"], "updates": logged[-1]["step"],
          "seconds_per_update": sum(steady) / len(steady) if steady else None}


def measure(work: str, steps: int) -> list[dict]:
  py = sys.executable
  data = os.path.join(work, "data")
  rows = [{"what": "prepare pystdlib, N = 2",
           "command": [py, "experiments/prepare_data.py", "--source=pystdlib",
                       "--num_clusters=2", f"--out={data}"]}]
  for size, extra in (("tiny", []), ("cpu", [f"--config.steps={steps}"])):
    seed = os.path.join(work, f"{size}_seed")
    rows.append({"what": f"seed, size={size}", "workdir": seed, "size": size, "config": "seed.py",
                 "command": [py, "experiments/train.py",
                             f"--config=experiments/configs/seed.py:size={size}",
                             f"--config.data.dir={data}", f"--workdir={seed}", *extra]})
    soma = os.path.join(work, f"{size}_soma")
    rows.append({"what": f"SOMA N = 2 from the seed, size={size}", "workdir": soma, "size": size,
                 "config": "soma.py",
                 "command": [py, "experiments/train.py",
                             f"--config=experiments/configs/soma.py:n=2,size={size}",
                             f"--config.data.dir={data}", f"--config.init_from={seed}",
                             f"--workdir={soma}", *extra]})
  rows.append({"what": "evaluate the cpu SOMA run (routed top-2, 95% document bootstrap)",
               "json": os.path.join(work, "eval.json"),
               "command": [py, "experiments/evaluate.py", f"--workdir={os.path.join(work, 'cpu_soma')}",
                           "--split=test", f"--json={os.path.join(work, 'eval.json')}"]})
  for row in rows:
    wall, cpu, start = _run(row["command"])
    row.update(wall_s=round(wall, 2), cpu_s=round(cpu, 2))
    if start:
      row["start_line"] = start
    if "workdir" in row:
      row.update(_train_record(row.pop("workdir")))
      arg = f"size={row['size']}" + (",n=2" if row["config"] == "soma.py" else "")
      row["preset_updates"] = config_lib.load_config_file(
          os.path.join(ROOT, "experiments", "configs", row.pop("config")), arg).steps
    if "json" in row:
      with open(row.pop("json")) as f:
        ev = json.load(f)
      row.update({k: ev[k] for k in ("nats_per_byte", "ci95", "num_windows", "num_documents")})
    row["command"] = " ".join(os.path.relpath(a, ROOT) if a == py else a for a in row["command"])
    row["command"] = row["command"].replace(work, "W")
    print(json.dumps(row), flush=True)
  return rows


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="JSON file to write")
  ap.add_argument("--steps", type=int, default=20, help="updates of the short cpu runs")
  args = ap.parse_args()
  check_output_args(ap, args, out="file")
  commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
  load = os.getloadavg()[0]
  with tempfile.TemporaryDirectory() as work:
    t0 = time.time()
    rows = measure(work, args.steps)
  result = {"machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, no GPU",
            "commit": commit, "load_average_at_start": load,
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)),
            "note": ("W is a temporary folder; wall_s and cpu_s include Python start-up and the "
                     "compile; seconds_per_update is wall time"),
            "runs": rows}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")


if __name__ == "__main__":
  main()
