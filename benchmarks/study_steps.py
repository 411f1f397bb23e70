r"""The SOMA step at the studies' shapes beside `make bench`'s, and side by side with another
checkout: seconds per update, perturbed tokens/s, the matmul rate's and the plain forwards'
fractions, JSON.

  python -m benchmarks.study_steps --json bench_out/study_steps.json
  python -m benchmarks.study_steps --against=COMMIT_OR_CHECKOUT --pairs=60 --nofigures \
      --json bench_out/study_steps_vs_before.json [--set=spsa.unroll=4] [--xla_flags=...]

Rows (--rows): `soma`, `one_expert`, `mono` are `experiments/configs/compare.py:
study=decompose,size=SIZE`'s rows of those names (at size=cpu: SOMA N = 2 width 32, one
expert N = 1 width 32, the monolith N = 1 at the matched width 47; n_pert 4, B 4, T 256,
own delta-rule heads), `bench` is `make bench`'s `soma.py:n=4,size=SIZE` (N = 4 width 64,
n_pert 16). --set=KEY=VALUE (repeatable) changes a field of every row's config (e.g.
spsa.unroll=4) on this checkout's side; --against_set on the other side.

Figures (--figures, default on): each row through `step_timing.benchmark` in this process,
in the device layout training uses: `step_seconds`, `perturbed_tokens_per_second`,
`fraction_of_matmul_peak` (SPEC 7 operations per second over a 2048^2 float32 matmul's rate,
measured in the same run) and `efficiency` (the row's own plain forwards over the same
tokens, as a fraction of the one-device step's time).

Side by side (--against): a checkout's folder, or a git commit of this repository written
out to a temporary folder (`git archive`). --rounds rounds, each running this file's
`--child` mode once per side (the order alternating from round to round), each in its own
process with PYTHONPATH and the working folder set to its side's checkout, so each side
times its own library's step with its own configs at the load of the moment. Each round's
ratio is this side's step seconds over the other's; the median ratio over rounds and its
spread (min, max) are reported per row, with every child's 1-minute load average.

Lock step (--against with --pairs=P, the better reading on a busy machine): both sides'
steps are compiled once, in two long-lived processes (this file's `--serve` mode, each on
its side's checkout as above); then for each row P pairs of one update per side back to
back, which side goes first alternating, so both updates of a pair see the same load. Per
row: each pair's ratio, their median, quartiles and extremes, and the load average at
each pair, for wall seconds (`ratio_median`, ...) and for each process's CPU seconds, all
threads (`cpu_ratio_median`, ...). On a loaded machine read the ratios, not the seconds;
where a higher-priority job holds the cores, a step's wall time is mostly waiting for one
and the CPU ratio is the steadier reading (it does not see a lever that only overlaps work,
e.g. two devices running at once). Run an A/A pair (against this checkout's own commit,
nothing set) beside a lever to see the harness's noise.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

from soma_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = "study={study},size={size}"  # decompose's rows (`study_name`)
ROWS = {
    "soma": ("compare.py", STUDY, "SOMA N = 2 width 32 (study shape)"),
    "one_expert": ("compare.py", STUDY, "one expert N = 1 width 32"),
    "mono": ("compare.py", STUDY, "monolith N = 1, matched width"),
    "bench": ("soma.py", "n=4,size={size}", "make bench: N = 4 width 64, n_pert 16"),
}
_ROWS = flags.DEFINE_list("rows", list(ROWS), f"rows, from {', '.join(ROWS)}")
_SIZE = flags.DEFINE_enum("size", "cpu", ["cpu", "tiny"], "the configs' size (tiny: tests)")
_REPS = flags.DEFINE_integer("reps", 7, "timed steps per row and process (median)")
_FIGURES = flags.DEFINE_bool("figures", True, "the full figures of each row, in this process")
_AGAINST = flags.DEFINE_string("against", None, "a checkout's folder or a git commit to time "
                               "side by side with this checkout")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "side-by-side rounds (each: one process per side)")
_PAIRS = flags.DEFINE_integer("pairs", 0, "lock-step side by side instead of rounds: this many "
                              "pairs of updates per row, one per side back to back, in two "
                              "long-lived processes")
_SET = flags.DEFINE_multi_string("set", [], "KEY=VALUE: a config field of every row, this side")
_AGAINST_SET = flags.DEFINE_multi_string("against_set", [], "KEY=VALUE on the other side")
_XLA_FLAGS = flags.DEFINE_string("xla_flags", None, "XLA_FLAGS of this side's children")
_AGAINST_XLA_FLAGS = flags.DEFINE_string("against_xla_flags", None,
                                         "XLA_FLAGS of the other side's children")
_CHILD = flags.DEFINE_bool("child", False, "internal: time the rows' steps, print JSON")
_SERVE = flags.DEFINE_bool("serve", False, "internal: compile the rows' steps, then time one "
                           "step of the row named on each stdin line")
# cli.output_flag (checked writable before the work), or a plain flag in a child running on
# a checkout compared from before output_flag existed
_JSON = (cli.output_flag if hasattr(cli, "output_flag") else flags.DEFINE_string)(
    "json", None, "write the results here")
_TIMEOUT = flags.DEFINE_integer("child_timeout", 1800, "seconds allowed per child process")


def parse_sets(sets: list[str]) -> list[tuple[str, str]]:
  out = []
  for s in sets:
    key, eq, value = s.partition("=")
    if not eq or not key:
      from soma_jax.errors import UserError
      raise UserError(f"--set={s}: give KEY=VALUE, e.g. spsa.unroll=4")
    out.append((key, value))
  return out


def _typed(old, value: str):
  """`value` as the type of the field's current value (bool, int, float, else the string)."""
  if isinstance(old, bool):
    return value.lower() in ("1", "true", "yes")
  for kind in (int, float):
    if isinstance(old, kind) and not isinstance(old, bool):
      return kind(value)
  try:
    return int(value)
  except ValueError:
    return value


def study_name() -> str:
  """The name of the study whose rows are timed (decompose) in this side's checkout: its
  Study's, or its module's in a checkout from before `base.Study.name`."""
  from soma_jax.studies import decompose

  return getattr(getattr(decompose, "STUDY", None), "name", decompose.__name__.rsplit(".")[-1])


def row_config(name: str, size: str, sets: list[tuple[str, str]]):
  """A row's training config (the checkout's own config files), with `sets` applied."""
  from soma_jax.config import load_config_file

  file, arg, _ = ROWS[name]
  study = study_name() if file == "compare.py" else None
  c = load_config_file(os.path.join("experiments", "configs", file),
                       arg.format(size=size, study=study))
  if file == "compare.py":
    try:
      from soma_jax.studies.planning import sized
    except ImportError:  # a checkout compared from before protocol.py was split
      from soma_jax.studies.protocol import sized
    c = sized(c)[name]  # the width the study trains it at
  for key, value in sets:
    *path, last = key.split(".")
    node = c
    for part in path:
      node = node[part]
    with node.ignore_type():  # e.g. spsa.pert_chunk: "auto" or an int
      node[last] = _typed(node[last], value)
  return c


def time_rows(rows: list[str], size: str, reps: int, sets, figures: bool) -> dict:
  """Each row's step through `step_timing.benchmark` (the step alone unless `figures`)."""
  from benchmarks import step_timing
  from soma_jax import spec as spec_lib

  out = {}
  for name in rows:
    spec = spec_lib.resolve(row_config(name, size, sets))
    r = step_timing.benchmark(spec, reps, loop=False, ideals=figures)
    r["row"] = ROWS[name][2]
    out[name] = r
    print(f"[study_steps] {name}: {r['step_seconds'] * 1e3:.2f} ms per update "
          f"(load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
  return out


def materialise(against: str, scratch: str) -> str:
  """The other side's checkout: a folder as given, else a commit written out with git archive."""
  from soma_jax.errors import UserError

  if os.path.isdir(against):
    return os.path.abspath(against)
  dest = os.path.join(scratch, "against")
  os.makedirs(dest)
  archive = subprocess.run(["git", "-C", ROOT, "archive", against], capture_output=True)
  if archive.returncode:
    raise UserError(f"--against={against} is neither a folder nor a commit here: "
                    f"{archive.stderr.decode()[-300:]}")
  subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
  return dest


# Runs this file in a child whose imports (soma_jax, benchmarks) come from its working folder,
# the checkout compared (first on sys.path under `-c`), even one older than this file.
_RUN_THIS_FILE = [sys.executable, "-c", "import runpy, sys; sys.argv = sys.argv[1:]; "
                  "runpy.run_path(sys.argv[0], run_name='__main__')", os.path.abspath(__file__)]


def child_run(checkout: str, rows: list[str], size: str, reps: int, sets: list[str],
              xla_flags: str | None, scratch: str) -> dict:
  """This file's --child mode in its own process on `checkout`'s library and configs."""
  from soma_jax.errors import UserError

  path = os.path.join(scratch, "child.json")
  env = dict(os.environ, PYTHONPATH=checkout)
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  cmd = [*_RUN_THIS_FILE, "--child", f"--rows={','.join(rows)}",
         f"--size={size}", f"--reps={reps}", f"--json={path}", *[f"--set={s}" for s in sets]]
  load = os.getloadavg()[0]
  proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True,
                        timeout=_TIMEOUT.value)
  if proc.returncode:
    raise UserError(f"the child run on {checkout} failed:\n{proc.stderr[-3000:]}")
  with open(path) as f:
    result = json.load(f)
  os.remove(path)
  result["load_average_1m_before"] = load
  return result


def row_step(name: str, size: str, sets):
  """(a function running one update of the row's step as training lays it out, and the row's
  description): `step_timing.benchmark`'s step, compiled and warmed up."""
  import jax

  from benchmarks import step_timing
  from soma_jax import memory
  from soma_jax import plan as plan_lib
  from soma_jax import spec as spec_lib

  spec = spec_lib.resolve(row_config(name, size, sets))
  inputs = step_timing.step_inputs(spec)
  placed = plan_lib.place_step(spec)
  sharded = step_timing.LayoutStep.build(inputs, placed)
  if sharded is None:
    cfg = spec.method.step_config(placed.chunk.chunk)
    run = inputs.runner(inputs.compile(cfg))
  else:
    run = lambda: sharded.run()[0].body

  def once() -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds, all threads) of one update."""
    with memory.matmul_precision(spec.precision):
      t, c = time.perf_counter(), time.process_time()
      jax.block_until_ready(run())
      return time.perf_counter() - t, time.process_time() - c

  once()  # warm-up
  cfg = spec.method.step_config(placed.chunk.chunk)
  return once, step_timing.describe(spec, pert_chunk=placed.chunk.chunk,
                                    time_block=cfg.spsa.time_block, unroll=cfg.spsa.unroll,
                                    signs=cfg.spsa.signs) | {"layout": placed.layout.why}


def serve(rows: list[str], size: str, sets) -> None:
  """--serve: compile every row, say READY with their descriptions, then for each stdin line
  naming a row time one update of it and answer its (wall, CPU) seconds (lines starting
  with '@')."""
  steps = {name: row_step(name, size, sets) for name in rows}
  print("@" + json.dumps({name: d for name, (_, d) in steps.items()}), flush=True)
  for line in sys.stdin:
    name = line.strip()
    if not name:
      break
    print("@" + json.dumps(steps[name][0]()), flush=True)


class Server:
  """A --serve child on one side's checkout."""

  def __init__(self, checkout: str, rows: list[str], size: str, sets: list[str],
               xla_flags: str | None):
    env = dict(os.environ, PYTHONPATH=checkout)
    if xla_flags is not None:
      env["XLA_FLAGS"] = xla_flags
    cmd = [*_RUN_THIS_FILE, "--serve", f"--rows={','.join(rows)}",
           f"--size={size}", *[f"--set={s}" for s in sets]]
    self.proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
    self.rows = json.loads(self._answer())

  def _answer(self) -> str:
    for line in self.proc.stdout:
      if line.startswith("@"):
        return line[1:]
    from soma_jax.errors import UserError
    raise UserError(f"a --serve child ({self.proc.args[-1]}) stopped: see its stderr above")

  def time(self, row: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one update of `row`."""
    self.proc.stdin.write(row + "\n")
    self.proc.stdin.flush()
    return tuple(json.loads(self._answer()))

  def close(self):
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


def paired(against: str, rows: list[str], size: str, reps: int) -> dict:
  """Both sides' steps compiled in two long-lived processes, then timed in lock step: for
  each row, `reps` pairs of one update on each side back to back (which side goes first
  alternating), so both updates of a pair see the same load; each pair's ratio, and their
  median and quartiles."""
  with tempfile.TemporaryDirectory() as scratch:
    other = materialise(against, scratch)
    this_side = Server(ROOT, rows, size, _SET.value, _XLA_FLAGS.value)
    other_side = Server(other, rows, size, _AGAINST_SET.value, _AGAINST_XLA_FLAGS.value)
    times = {name: {"this": [], "against": []} for name in rows}
    loads = []
    try:
      for i in range(reps):
        loads.append(os.getloadavg()[0])
        for name in rows:
          order = [("this", this_side), ("against", other_side)]
          for side, server in order if i % 2 == 0 else order[::-1]:
            times[name][side].append(server.time(name))
    finally:
      this_side.close()
      other_side.close()
  out = {"against": against, "pairs": reps, "this_set": _SET.value,
         "against_set": _AGAINST_SET.value, "this_xla_flags": _XLA_FLAGS.value,
         "against_xla_flags": _AGAINST_XLA_FLAGS.value,
         "load_average_1m": spread(loads), "rows": {}}
  for name in rows:
    out["rows"][name] = {"row": ROWS[name][2], "this": this_side.rows[name],
                         "against": other_side.rows[name]}
    # wall seconds (the keys without a prefix), and the processes' CPU seconds ("cpu_"): on
    # a machine whose cores another, higher-priority job holds, a step's wall time is mostly
    # waiting for a core, while its CPU time is the work the step did
    for clock, prefix in ((0, ""), (1, "cpu_")):
      t = [x[clock] for x in times[name]["this"]]
      a = [x[clock] for x in times[name]["against"]]
      ratios = [x / y for x, y in zip(t, a)]
      q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
      out["rows"][name] |= {
          f"{prefix}this_step_seconds_median": statistics.median(t),
          f"{prefix}against_step_seconds_median": statistics.median(a),
          f"{prefix}ratio_median": statistics.median(ratios),
          f"{prefix}ratio_quartiles": [q[0], q[2]],
          f"{prefix}ratio_min_max": [min(ratios), max(ratios)],
          f"{prefix}ratio_of_medians": statistics.median(t) / statistics.median(a)}
  return out


def spread(xs: list[float]) -> dict:
  return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "values": xs}


def side_by_side(against: str, rows: list[str], size: str, reps: int, rounds: int) -> dict:
  """--rounds rounds of one child per side, alternating which goes first; per row the ratio
  this side / the other side of each round, and its median and spread."""
  with tempfile.TemporaryDirectory() as scratch:
    other = materialise(against, scratch)
    sides = {"this": (ROOT, _SET.value, _XLA_FLAGS.value),
             "against": (other, _AGAINST_SET.value, _AGAINST_XLA_FLAGS.value)}
    runs = {"this": [], "against": []}
    for r in range(rounds):
      order = ["this", "against"] if r % 2 == 0 else ["against", "this"]
      for side in order:
        checkout, sets, xla = sides[side]
        runs[side].append(child_run(checkout, rows, size, reps, sets, xla, scratch))
  out = {"against": against, "rounds": rounds, "reps_per_child": reps,
         "this_set": _SET.value, "against_set": _AGAINST_SET.value,
         "this_xla_flags": _XLA_FLAGS.value, "against_xla_flags": _AGAINST_XLA_FLAGS.value,
         "child_load_average_1m": {s: [c["load_average_1m_before"] for c in runs[s]]
                                   for s in runs},
         "rows": {}}
  for name in rows:
    this = [c["rows"][name]["step_seconds"] for c in runs["this"]]
    other_s = [c["rows"][name]["step_seconds"] for c in runs["against"]]
    first, other_first = runs["this"][0]["rows"][name], runs["against"][0]["rows"][name]
    out["rows"][name] = {
        "row": ROWS[name][2], "this_config": first["config"], "layout": first["layout"],
        "against_config": other_first["config"],
        "this_step_seconds": spread(this), "against_step_seconds": spread(other_s),
        "ratio_this_over_against": spread([a / b for a, b in zip(this, other_s)])}
  return out


def main(argv):
  del argv
  from soma_jax import cli
  from soma_jax.errors import UserError

  bad = [r for r in _ROWS.value if r not in ROWS]
  if bad or not _ROWS.value:
    raise UserError(f"--rows={','.join(_ROWS.value)}: choose from {', '.join(ROWS)}")
  if _REPS.value < 1 or _ROUNDS.value < 1:
    raise UserError("--reps and --rounds must be >= 1")
  sets = parse_sets(_SET.value)
  parse_sets(_AGAINST_SET.value)
  load = list(os.getloadavg())
  if _SERVE.value:
    serve(_ROWS.value, _SIZE.value, sets)
    return
  if _CHILD.value:
    rows = time_rows(_ROWS.value, _SIZE.value, _REPS.value, sets, figures=False)
    cli.emit_json({"rows": rows}, _JSON.value)
    return
  import jax
  result = {"benchmark": "study_steps",
            "command": "python -m benchmarks.study_steps " + " ".join(sys.argv[1:]),
            "jax": jax.__version__, "backend": jax.default_backend(),
            "devices": jax.device_count(), "cpu_count": os.cpu_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", "")}
  if _FIGURES.value:
    result["rows"] = time_rows(_ROWS.value, _SIZE.value, _REPS.value, sets, figures=True)
  if _AGAINST.value:
    if shutil.which("git") is None and not os.path.isdir(_AGAINST.value):
      raise UserError("--against=COMMIT needs git; give a checkout's folder instead")
    if _PAIRS.value:
      result["paired"] = paired(_AGAINST.value, _ROWS.value, _SIZE.value, _PAIRS.value)
    else:
      result["side_by_side"] = side_by_side(_AGAINST.value, _ROWS.value, _SIZE.value,
                                            _REPS.value, _ROUNDS.value)
  result["load_average"] = {"start": load, "end": list(os.getloadavg())}
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
