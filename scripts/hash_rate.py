r"""How long the start-up check of a data dir's SHA-256 hashes takes for the paper's corpus.

  python -m scripts.hash_rate --json docs/results/hash_rate.json

Writes 1.3 GB of random bytes (about the paper's prepared FineWeb-Edu sample; --gb) to a
temporary file, hashes it with the function training uses (`pipeline.sha256_file`), once
straight after writing (the file in the page cache, as after prepare) and, where the
kernel lets this process drop its caches (root), once read cold from disk. The file is
deleted afterwards. docs/training.md's hash-check figure comes from this file.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from soma_jax import cli
from soma_jax.data import pipeline
from soma_jax.errors import check_output_args


def drop_caches() -> bool:
  """Empties the page cache (needs root); False where not allowed."""
  os.sync()
  try:
    with open("/proc/sys/vm/drop_caches", "w") as f:
      f.write("3\n")
    return True
  except OSError:
    return False


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--gb", type=float, default=1.3, help="file size in GB (1e9 bytes)")
  parser.add_argument("--dir", default=None, help="folder for the temporary file")
  parser.add_argument("--json", default=None, help="write the result here")
  args = parser.parse_args()
  check_output_args(parser, args, dir="folder", json="file")
  n = int(args.gb * 1e9)
  result = {"command": "python -m scripts.hash_rate " + " ".join(sys.argv[1:]), "bytes": n}
  with tempfile.NamedTemporaryFile(dir=args.dir, suffix=".bin") as f:
    block = 64 << 20
    for start in range(0, n, block):
      f.write(os.urandom(min(block, n - start)))
    f.flush()
    result["loadavg_before"] = list(os.getloadavg())
    t = time.perf_counter()
    pipeline.sha256_file(f.name)
    result["cached_seconds"] = time.perf_counter() - t
    if drop_caches():
      t = time.perf_counter()
      pipeline.sha256_file(f.name)
      result["cold_seconds"] = time.perf_counter() - t
    result["loadavg_after"] = list(os.getloadavg())
  result["cached_gb_per_second"] = n / 1e9 / result["cached_seconds"]
  cli.emit_json(result, args.json)


if __name__ == "__main__":
  main()
