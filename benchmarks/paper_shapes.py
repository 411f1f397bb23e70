"""The SOMA step at the paper's shapes on this device: one row per preset, JSON + Markdown.

  python -m benchmarks.paper_shapes --json bench_out/paper_shapes.json \
      --md bench_out/paper_shapes.md [--rows=n2,n16] [--n_pert=16] [--reps=3] \
      [--forward=direct,split] [--precision=default,highest] [--matmul_rate]

Each row is `experiments/configs/soma.py:<arg>,size=paper` (B = 64, T = 1024, the
preset's pert_chunk, "auto" by default) at one spsa.forward and one precision, timed in
its own process, so a row that runs out of memory is reported as such and the others
still run; the JSON is rewritten after every row, so a run stopped early keeps what it
measured. Columns: N, d_t, n_pert, the chunk chosen, forward and precision, step seconds,
perturbed tokens/s (2 A n_pert B T N per step), TFLOP/s (SPEC 7 operations), with
--matmul_rate its fraction of a 4096 x 4096 float32 matmul's rate at the same precision
(measured first, in a process of its own), XLA's planned memory and the device's limit.
"""

import json
import os
import subprocess
import sys
import time

from absl import flags

from soma_jax import cli, memory, spsa  # importing jax starts no backend
from soma_jax import config as config_lib
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# label: (soma.py argument, what the row is in the paper)
ROWS = {
    "n1": ("n=1", "monolith, N = 1 width 509 (own head)"),
    "n2": ("n=2", "SOMA N = 2 width 361 (own heads)"),
    "n8": ("n=8", "SOMA N = 8 width 181 (own heads)"),
    "n16": ("n=16", "SOMA N = 16 width 32 (shared frozen head)"),
    "n256": ("n=256", "SOMA N = 256 width 32 (shared frozen head)"),
    "mono1024": ("mono=1024", "monolith, n_pert 1024 on B = 64"),
}
_ROWS = flags.DEFINE_list("rows", ["n1", "n2", "n8", "n16", "n256"],
                          f"rows to run, from {', '.join(ROWS)}")
_N_PERT = flags.DEFINE_integer("n_pert", 0, "directions per step (0: the preset's 64)")
_REPS = flags.DEFINE_integer("reps", 3, "timed steps per row (median)")
_PRECISION = flags.DEFINE_list("precision", ["default"],
                               f"precisions of the step to time, from {', '.join(memory.PRECISIONS)}")
_FORWARD = flags.DEFINE_list("forward", ["direct"],
                             f"spsa.forward settings to time, from {', '.join(spsa.FORWARDS)}")
_MATMUL_RATE = flags.DEFINE_bool("matmul_rate", False, "measure the 4096 x 4096 matmul rate at "
                                 "each precision and report each row's fraction of it")
_TIME_BLOCK = flags.DEFINE_integer("time_block", 0, "spsa.time_block (0: the preset's)")
_UNROLL = flags.DEFINE_integer("unroll", 0, "spsa.unroll (0: the preset's)")
_SIGNS = flags.DEFINE_enum("signs", "auto", list(config_lib.SIGNS), "spsa.signs")
_JSON = cli.output_flag("json", None, "write the table here (JSON)")
_MD = cli.output_flag("md", None, "write the table here (Markdown)")
_ROW = flags.DEFINE_string("row", None, "internal: measure one row and print its JSON")
_TIMEOUT = flags.DEFINE_integer("row_timeout", 900, "seconds allowed per row")


def row_config(label: str, n_pert: int, precision: str, time_block: int = 0, unroll: int = 0,
               signs: str = "auto", forward: str = "direct"):
  c = config_lib.load_config_file(os.path.join(ROOT, "experiments/configs/soma.py"),
                                  f"{ROWS[label][0]},size=paper")
  with c.unlocked():
    if n_pert:
      c.spsa.n_pert = n_pert
    if time_block:
      c.spsa.time_block = time_block
    if unroll:
      c.spsa.unroll = unroll
    c.spsa.signs, c.spsa.forward = signs, forward
    c.precision = precision
  return c


def measure_row(label: str, n_pert: int, reps: int, precision: str, time_block: int = 0,
                unroll: int = 0, signs: str = "auto", forward: str = "direct") -> dict:
  from benchmarks import step_timing  # imported here: the parent process never times a step

  if label == "matmul":  # the 4096 x 4096 float32 matmul at this precision
    with memory.matmul_precision(precision):
      return {"row": label, "precision": precision, "dot_algorithm": memory.dot_algorithm(precision),
              "matmul_gflops": step_timing.matmul_peak_gflops(4096, max(reps, 5))}
  spec = spec_lib.resolve(row_config(label, n_pert, precision, time_block, unroll, signs,
                                     forward))
  out = step_timing.benchmark(spec, reps, loop=False, ideals=False)
  return {"row": label, "what": ROWS[label][1], **out}


def run_row(label: str, forward: str, precision: str) -> dict:
  """One row in a fresh process (its own allocator and peak; an OOM stays in that row)."""
  what = ROWS[label][1] if label in ROWS else f"{label} at {precision}"
  cmd = [sys.executable, "-m", "benchmarks.paper_shapes", f"--row={label}",
         f"--n_pert={_N_PERT.value}", f"--reps={_REPS.value}", f"--precision={precision}",
         f"--time_block={_TIME_BLOCK.value}", f"--unroll={_UNROLL.value}",
         f"--signs={_SIGNS.value}", f"--forward={forward}"]
  t = time.perf_counter()
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT.value, cwd=ROOT)
  except subprocess.TimeoutExpired:
    return {"row": label, "what": what, "forward": forward, "precision": precision,
            "error": f"timeout {_TIMEOUT.value} s"}
  wall = time.perf_counter() - t
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
  if proc.returncode or not lines:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    oom = "RESOURCE_EXHAUSTED" in proc.stderr or "out of memory" in proc.stderr.lower()
    return {"row": label, "what": what, "forward": forward, "precision": precision,
            "wall_s": wall, "error": "out of memory" if oom else tail[0][:300]}
  return json.loads(lines[-1]) | {"wall_s": wall}


def _write_json(result: dict, path: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(json.dumps(result, indent=1, default=float) + "\n")


def check_flags() -> None:
  unknown = [r for r in _ROWS.value if r not in ROWS]
  if unknown:
    raise UserError(f"--rows: unknown {unknown}; use some of {', '.join(ROWS)}")
  for name, values, allowed in (("forward", _FORWARD.value, spsa.FORWARDS),
                                ("precision", _PRECISION.value, memory.PRECISIONS)):
    if not values or not set(values) <= set(allowed):
      raise UserError(f"--{name}={','.join(values)} must name some of {', '.join(allowed)}")
  if _REPS.value < 1 or min(_N_PERT.value, _TIME_BLOCK.value, _UNROLL.value) < 0:
    raise UserError("--reps must be >= 1, and --n_pert, --time_block, --unroll >= 0 "
                    "(0: the preset's value)")


def markdown(rows: list[dict], device: str) -> str:
  head = ("| row | N | d_t | n_pert | chunk | time block / unroll / signs | forward / precision "
          "| step s | perturbed tokens/s | TFLOP/s | of matmul rate | planned memory | device limit |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
  gb = lambda b: f"{b / 1e9:.1f} GB" if b and b > 0 else "-"
  lines = []
  for r in rows:
    if r["row"] == "matmul" and "error" not in r:
      lines.append(f"| 4096 matmul ({r['dot_algorithm']}) | | | | | | {r['precision']} | | | "
                   f"{r['matmul_gflops'] / 1e3:.1f} | 1.00 | | |")
      continue
    if "error" in r:
      lines.append(f"| {r['what']} | | | | | | {r.get('forward')} / {r.get('precision')} | "
                   f"{r['error']} | | | | | |")
      continue
    k = r["config"]
    frac = f"{r['fraction_of_matmul_rate']:.2f}" if "fraction_of_matmul_rate" in r else "-"
    lines.append(
        f"| {r['what']} | {k['n_experts']} | {k['d_t']} | {k['n_pert']} | {k['pert_chunk']} | "
        f"{k['time_block']} / {k['unroll']} / {k['signs']} | {k['forward']} / {k['precision']} | "
        f"{r['step_seconds']:.3f} | {r['perturbed_tokens_per_second'] / 1e6:.1f}M | "
        f"{r['achieved_gflops'] / 1e3:.1f} | {frac} | {gb(r['peak_memory_bytes'])} | "
        f"{gb(r['device_limit_bytes'])} |")
  return f"Device: {device}; B = 64, T = 1024.\n\n" + head + "\n".join(lines) + "\n"


def main(argv):
  del argv
  if _ROW.value:
    print(json.dumps(measure_row(_ROW.value, _N_PERT.value, _REPS.value, _PRECISION.value[0],
                                 _TIME_BLOCK.value, _UNROLL.value, _SIGNS.value,
                                 _FORWARD.value[0])))
    return
  check_flags()
  # The device's name comes from the rows: a backend started here would hold GPU memory
  # (75% of it under JAX's default preallocation) that the rows' processes then lack.
  t = time.perf_counter()
  plan = [("matmul", "direct", p) for p in _PRECISION.value if _MATMUL_RATE.value]
  plan += [(label, f, p) for label in _ROWS.value for f in _FORWARD.value for p in _PRECISION.value]
  rows, rates = [], {}
  result = {"command": "python -m benchmarks.paper_shapes " + " ".join(sys.argv[1:]),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),  # the A/B of XLA's options
            "load_avg_before": os.getloadavg(), "rows": rows}
  for label, forward, precision in plan:
    rows.append(run_row(label, forward, precision))
    r = rows[-1]
    if label == "matmul" and "error" not in r:
      rates[precision] = r["matmul_gflops"]
    elif "achieved_gflops" in r and precision in rates:
      r["fraction_of_matmul_rate"] = r["achieved_gflops"] / rates[precision]
    print(json.dumps(r), flush=True)
    result.update(device=next((x["device"] for x in rows if "device" in x), "unknown (no row ran)"),
                  wall_s=time.perf_counter() - t, load_avg_after=os.getloadavg())
    if _JSON.value:  # after every row: a run stopped early keeps what it measured
      _write_json(result, _JSON.value)
  md = markdown(rows, result["device"])
  print(md)
  if _MD.value:
    os.makedirs(os.path.dirname(os.path.abspath(_MD.value)), exist_ok=True)
    with open(_MD.value, "w") as f:
      f.write(md)
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
