r"""Runs a notebook's code cells in order in this Python, without Jupyter; times each cell.

  python -m scripts.run_notebook notebooks/quickstart.ipynb --param SIZE=gpu \
      --timings OUT.json

Parameters are assigned right after the cell tagged `parameters` (as papermill does), so
only names that cell assigns can be set; a value is a Python literal or else a string.
Cells share one namespace and must be plain Python (no `!` or `%` lines); as in a Jupyter
kernel, the working directory is on `sys.path`. The first
failing cell stops the run with its traceback and exit code 1; the timings JSON is
written either way.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import sys
import time
import traceback

from soma_jax.errors import check_output_args


def parse_params(items: list[str]) -> dict:
  """['SIZE=gpu', 'N=4'] -> {'SIZE': 'gpu', 'N': 4}: literals where they parse, else strings."""
  out = {}
  for item in items:
    name, sep, text = item.partition("=")
    if not sep or not name.isidentifier():
      raise ValueError(f"--param {item!r} is not NAME=VALUE; e.g. --param SIZE=tiny")
    try:
      out[name] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      out[name] = text
  return out


def code_cells(notebook: dict) -> list[tuple[str, bool]]:
  """(source, is the parameters cell) of every code cell, in order."""
  out = []
  for cell in notebook.get("cells", []):
    if cell.get("cell_type") != "code":
      continue
    src = cell.get("source", "")
    src = "".join(src) if isinstance(src, list) else src
    out.append((src, "parameters" in cell.get("metadata", {}).get("tags", [])))
  return out


def assigned_names(source: str) -> set[str]:
  """Names bound by top-level assignments of a cell."""
  names = set()
  for node in ast.parse(source).body:
    targets = node.targets if isinstance(node, ast.Assign) else (
        [node.target] if isinstance(node, ast.AnnAssign) else [])
    names.update(t.id for t in targets if isinstance(t, ast.Name))
  return names


def check_params(cells: list[tuple[str, bool]], params: dict) -> None:
  """ValueError unless every parameter is assigned by the notebook's parameters cell."""
  if not params:
    return
  marked = [src for src, is_param in cells if is_param]
  if not marked:
    raise ValueError("the notebook has no cell tagged 'parameters', so --param cannot be used")
  known = assigned_names(marked[0])
  unknown = sorted(set(params) - known)
  if unknown:
    raise ValueError(f"--param {', '.join(unknown)} is not assigned in the parameters cell; "
                     f"known: {', '.join(sorted(known))}")


def first_line(source: str) -> str:
  return next((line.strip() for line in source.splitlines() if line.strip()), "")[:80]


def _cpu_seconds() -> float:
  """CPU time of this process and its finished children (a busy machine stretches only wall time)."""
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return time.process_time() + children.ru_utime + children.ru_stime


def run(path: str, cells: list[tuple[str, bool]], params: dict, timings_path: str | None,
        command: str = "") -> int:
  """Executes the cells; returns 0, or after the first failing cell 2 for a UserError (its
  one line printed) and 1 for anything else (its traceback)."""
  namespace = {"__name__": "__main__", "__file__": os.path.abspath(path)}
  record = {"command": command, "notebook": path, "params": params,
            "python": sys.version.split()[0], "cells": [], "status": "ok",
            "total_seconds": 0.0, "total_cpu_seconds": 0.0}
  t_all = time.perf_counter()
  for i, (source, is_param) in enumerate(cells):
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    print(f"--- cell {i}: {first_line(source)}", flush=True)
    try:
      exec(compile(source, f"<{os.path.basename(path)} cell {i}>", "exec"), namespace)
      if is_param:
        namespace.update(params)
    except (Exception, SystemExit) as e:
      if type(e).__name__ == "UserError":  # soma_jax.errors: bad input, one line (exit 2)
        print(f"error: {e}", file=sys.stderr)
        record.update(status="error", failed_cell=i, user_error=True)
      else:
        traceback.print_exc()
        record.update(status="error", failed_cell=i)
    seconds = time.perf_counter() - t0
    record["cells"].append({"cell": i, "first_line": first_line(source), "seconds": seconds,
                            "cpu_seconds": _cpu_seconds() - cpu0})
    print(f"--- cell {i}: {seconds:.2f} s", flush=True)
    record["total_seconds"] = time.perf_counter() - t_all
    record["total_cpu_seconds"] = sum(c["cpu_seconds"] for c in record["cells"])
    _write(record, timings_path)  # after every cell: a run killed midway keeps what it timed
    if record["status"] != "ok":
      break
  print(f"--- {record['status']}: {len(record['cells'])} of {len(cells)} cells in "
        f"{record['total_seconds']:.1f} s", flush=True)
  return 2 if record.get("user_error") else int(record["status"] != "ok")


def _write(record: dict, path: str | None) -> None:
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      json.dump(record, f, indent=1, default=str)


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("notebook", help="path of the .ipynb file")
  ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                  help="override a name of the parameters cell (repeatable)")
  ap.add_argument("--timings", help="write per-cell wall and CPU times as JSON here "
                  "(rewritten after every cell)")
  argv = sys.argv[1:] if argv is None else argv
  args = ap.parse_args(argv)
  check_output_args(ap, args, timings="file")
  if not os.path.isfile(args.notebook):
    print(f"error: notebook {args.notebook!r} not found; fix: pass the path of an .ipynb file",
          file=sys.stderr)
    return 2
  try:
    params = parse_params(args.param)
    with open(args.notebook, encoding="utf-8") as f:
      cells = code_cells(json.load(f))
    check_params(cells, params)
  except (ValueError, SyntaxError) as e:  # JSONDecodeError is a ValueError
    print(f"error: {e}", file=sys.stderr)
    return 2
  command = " ".join(["python", "-m", "scripts.run_notebook", *argv])
  return run(args.notebook, cells, params, args.timings, command)


if __name__ == "__main__":
  sys.exit(main())
