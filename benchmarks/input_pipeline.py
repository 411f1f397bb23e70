r"""Throughput of the training input pipeline (batches/s), with JSON output.

  python -m benchmarks.input_pipeline --data_dir=/tmp/soma_data --n=4 --batch=16 \
      --accum=1 --seq_len=256 --json=bench_out/input_pipeline.json

Without --data_dir it first prepares a temporary data dir from pystdlib.
"""

from __future__ import annotations

import os
import tempfile
import time

from absl import flags, logging

from soma_jax import cli
from soma_jax.data import pipeline, prepare

_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data dir (default: a temporary pystdlib one).")
_N = flags.DEFINE_integer("n", 4, "Number of experts to load (experts 0..n-1).")
_BATCH = flags.DEFINE_integer("batch", 16, "Sequences per batch B.")
_ACCUM = flags.DEFINE_integer("accum", 1, "Accumulated batches A.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "Targets per sequence T (divides 1024).")
_SECONDS = flags.DEFINE_float("seconds", 5.0, "How long to time.")
_SEED = flags.DEFINE_integer("seed", 0, "Pipeline seed.")
_JSON = cli.output_flag("json", None, "Write the results here as JSON.")


def measure(data_dir: str, n: int, batch: int, accum: int, seq_len: int, seconds: float, seed: int = 0) -> dict:
  """Times the pipeline for about `seconds`; returns batches/s and bytes/s."""
  t0 = time.perf_counter()
  it = pipeline.train_iterator(data_dir, range(n), batch=batch, accum=accum, seq_len=seq_len, seed=seed)
  first = next(it)
  startup = time.perf_counter() - t0
  count, t0 = 0, time.perf_counter()
  while time.perf_counter() - t0 < seconds:
    next(it)
    count += 1
  elapsed = time.perf_counter() - t0
  return {
    "batches_per_second": count / elapsed,
    "bytes_per_second": count * first.nbytes / elapsed,
    "batch_shape": list(first.shape),
    "startup_seconds": startup,
    "batches": count,
    "n": n,
    "batch": batch,
    "accum": accum,
    "seq_len": seq_len,
    "data_dir": data_dir,
  }



def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as tmp:
    data_dir = _DATA_DIR.value
    if data_dir is None:
      data_dir = os.path.join(tmp, "data")
      logging.info("preparing a pystdlib data dir with %d clusters in %s", _N.value, data_dir)
      prepare.prepare("pystdlib", _N.value, data_dir)
    else:
      pipeline.check_data_dir(data_dir, pipeline.load_manifest(data_dir)["num_clusters"])
    result = measure(data_dir, _N.value, _BATCH.value, _ACCUM.value, _SEQ_LEN.value, _SECONDS.value, _SEED.value)
  if _DATA_DIR.value is None:
    result["data_dir"] = "pystdlib (temporary)"
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
