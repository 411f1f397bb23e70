r"""FSO weak scaling: steps/s with a fixed number of experts per device, 1 -> 2 -> 4 devices.

  python -m benchmarks.scaling --devices=1,2,4 --experts_per_device=2 --json=bench_out/scaling.json

Each device count runs in its own process (tests/parallel_worker.py --bench) with
XLA_FLAGS=--xla_force_host_platform_device_count=D on CPU, or on the real accelerators
with --platform=gpu (then D must not exceed the GPUs present). Weak-scaling efficiency is
steps/s(D) / steps/s(1): 1.0 means D devices train D times the experts in the same time.
Fake CPU devices share this machine's cores, so on CPU the efficiency measures how the
cores are shared, not how FSO scales on real devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from absl import flags

from soma_jax import cli
from soma_jax.cli import positive_ints
from soma_jax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "parallel_worker.py")

_DEVICES = flags.DEFINE_list("devices", ["1", "2", "4"], "Device counts to time.")
_PER_DEVICE = flags.DEFINE_integer("experts_per_device", 2, "Experts on each device (fixed).")
_SECONDS = flags.DEFINE_float("seconds", 5.0, "Timing window per device count.")
_D_T = flags.DEFINE_integer("d_t", 32, "Expert body width.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 64, "Targets per window T.")
_PLATFORM = flags.DEFINE_enum("platform", "cpu", ["cpu", "gpu"], "cpu = fake host devices.")
_JSON = cli.output_flag("json", None, "Write the results here as JSON.")


def run_one(devices: int, platform: str, per_device: int, seconds: float, d_t: int,
            seq_len: int) -> dict:
  """One device count in a fresh process; returns the worker's measurement."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS=platform)
  if platform == "cpu":
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  else:
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(devices))
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "bench.json")
    proc = subprocess.run(
        [sys.executable, WORKER, "--bench", f"--out={out}", f"--experts_per_device={per_device}",
         f"--seconds={seconds}", f"--d_t={d_t}", f"--seq_len={seq_len}"],
        env=env, capture_output=True, text=True)
    if proc.returncode:
      raise UserError(f"the {devices}-device run failed:\n{proc.stderr[-2000:]}")
    with open(out) as f:
      return json.load(f)


def measure(devices: list[int], platform: str, per_device: int, seconds: float, d_t: int,
            seq_len: int) -> dict:
  runs = [run_one(d, platform, per_device, seconds, d_t, seq_len) for d in devices]
  for r in runs:
    # Weak scaling against the smallest run: work per device is fixed, so ideal is 1.0.
    r["efficiency"] = r["steps_per_second"] / runs[0]["steps_per_second"]
    r["expert_updates_per_second"] = r["steps_per_second"] * r["experts"]
  note = ("fake CPU devices (--xla_force_host_platform_device_count) share this machine's "
          f"{os.cpu_count()} CPU cores (and whatever else runs on it), so D fake devices do D "
          "times the work on the same cores: efficiency near 1/D is expected and says nothing "
          "about FSO on real devices; FSO steps have no collectives (see 'collectives')."
          if platform == "cpu" else "real devices, one process")
  return {"regime": "FSO weak scaling", "platform": platform, "cpu_cores": os.cpu_count(),
          "runs": runs, "note": note}


def main(argv):
  del argv
  devices = sorted(positive_ints("devices", _DEVICES.value))
  result = measure(devices, _PLATFORM.value, _PER_DEVICE.value, _SECONDS.value, _D_T.value,
                   _SEQ_LEN.value)
  for r in result["runs"]:
    print(f"{r['devices']} devices, {r['experts']} experts: {r['steps_per_second']:.2f} steps/s, "
          f"efficiency {r['efficiency']:.2f}, collectives {r['collectives']['total']}")
  print(result["note"])
  if _JSON.value:
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
