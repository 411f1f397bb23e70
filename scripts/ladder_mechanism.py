r"""The width ladder's mechanism (SPEC 9.7) at each rung's start, with the summed-loss
estimator beside it, set against a recorded ladder results.json.

  python -m scripts.ladder_mechanism \
      --config=experiments/configs/compare.py:study=ladder,size=cpu,rungs=16/32/64 \
      --out=runs/ladder_mechanism --results=docs/results/ladder_cpu.json \
      --json=docs/results/ladder_mechanism_cpu.json

For each rung of the config: its equal-update seed runs, trained into OUT/rungW/seeds as the
study trains them (`driver.setup` of Table 7's pair at the rung, `ladder.rung_plan`; a
finished run already there is reused, so OUT may be the study's own), then the study's
mechanism at that start (`ladder.rung_mechanism`: rho and r of each expert, of the monolith
and of the summed-loss estimator, `predicted_ratio` and `predicted_vs_summed`).
The seed runs are deterministic, so their starts are the ones the recorded results measured:
the recomputed experts' and monolith's rho and r are checked
against the recorded ones (the largest absolute and relative differences, the batches'
fingerprints, the seeds' ensemble-validation losses). Nothing of the compared phase is
trained: `measured_vs_summed` (SOMA's test gain over the control's, per seed, 95% t) comes
from the recorded SOMA and control gains, beside the recorded `measured_ratio`.
DATA: --data_dir, else the config's data_dir, else the built-in corpus prepared under
OUT/data (the study's default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from soma_jax import cli
from soma_jax.config import load_config_file
from soma_jax.errors import UserError, check_output_args, exit_on_user_error
from soma_jax.studies import datasets, driver, ladder, results, statistics, table7

# Relative difference under which a recomputed rho or r counts as the recorded one: float32
# rounding of reordered sums. A start that differed would move rho by about its SE (1e-2).
TOLERANCE = 1e-5


def _differences(recorded: list[dict], now: list[dict]) -> dict:
  """Largest absolute and relative differences of rho and r, recorded vs recomputed."""
  out = {}
  for key in ("rho", "r"):
    a = np.array([x[key] for x in recorded], np.float64)
    b = np.array([x[key] for x in now], np.float64)
    out[key] = {"max_abs_difference": float(np.max(np.abs(a - b))),
                "max_rel_difference": float(np.max(np.abs(a - b) / np.abs(a)))}
  return out


def check_recorded(rec: dict, mech: dict, seeds: dict) -> dict:
  """The recomputed mechanism against the recorded rung `rec`: equal within TOLERANCE?"""
  old = rec["mechanism"]["experts"] + [rec["mechanism"]["monolith"]]
  new = mech["experts"] + [mech["monolith"]]
  diff = _differences(old, new)
  same_windows = all(a["batch_fingerprints"] == b["batch_fingerprints"] for a, b in zip(old, new))
  seed_val = {k: abs(r["ensemble_val_nats_per_byte"]
                     - rec["seed_runs"][k]["ensemble_val_nats_per_byte"])
              for k, r in seeds.items() if k in rec["seed_runs"]}
  ratio = abs(mech["predicted_ratio"] - rec["mechanism"]["predicted_ratio"])
  equal = (same_windows and max(d["max_rel_difference"] for d in diff.values()) <= TOLERANCE)
  return {**diff, "predicted_ratio_abs_difference": ratio, "same_batches": same_windows,
          "seed_ensemble_val_abs_difference": seed_val, "tolerance_relative": TOLERANCE,
          "equal_within_tolerance": bool(equal)}


def rung(ls: ladder.LadderSpec, width: int, out: str, data_dir: str, scored,
         rec: dict) -> dict:
  """One rung: its seeds (trained or reused), the mechanism, and the recorded comparison."""
  t0 = time.perf_counter()
  seeds = driver.setup(table7.STUDY, ls.grid, ladder.rung_plan(ls, width, data_dir),
                       os.path.join(out, f"rung{width}"), scorers=scored).seeds
  cfgs = ladder.sized(ls, width)
  t_seeds = time.perf_counter() - t0
  mech = ladder.rung_mechanism(ls, cfgs, seeds, data_dir)
  somas = rec["methods"][ls.reference]["per_seed"]
  vs_summed = ladder.gain_ratios(somas, rec["control"]["per_seed"])
  check = check_recorded(rec, mech, seeds)
  print(f"[ladder_mechanism] rung {width}: rho summed {mech['summed']['rho']:.4g} (r "
        f"{mech['summed']['r']:.3g}), predicted vs summed {mech['predicted_vs_summed']:.3f} ± "
        f"{mech['predicted_vs_summed_se']:.3f}, measured vs summed "
        f"{results.ci(statistics.t_interval(vs_summed))}; recorded rho equal: "
        f"{check['equal_within_tolerance']}", file=sys.stderr, flush=True)
  return {"width": width, "mechanism": mech,
          "measured_vs_summed": statistics.t_interval(vs_summed),
          "measured_vs_summed_per_seed": vs_summed,
          "recorded_measured_ratio": rec["measured_ratio"],
          "recorded_measured_ratio_per_seed": rec["measured_ratio_per_seed"],
          "recorded_predicted_ratio": rec["mechanism"]["predicted_ratio"],
          "recorded_check": check, "seed_seconds": t_seeds,
          "wall_seconds": time.perf_counter() - t0}


def recorded_rungs(ls: ladder.LadderSpec, results: dict) -> dict[int, dict]:
  """The recorded rung of every width of the config, its mechanism settings the config's."""
  name = ladder.STUDY.name
  if results.get("study") != name:
    raise UserError(f"--results is not a study={name} results.json; fix: the results.json "
                    f"experiments/compare.py wrote with study={name}")
  if results["mechanism"] != ls.mechanism.record():
    raise UserError(f"--results measured with mechanism {results['mechanism']}, the config "
                    f"with {ls.mechanism.record()}; fix: the config the results were run with")
  have = {r["width"]: r for r in results["rungs"]}
  missing = [w for w in ls.widths if w not in have]
  if missing:
    raise UserError(f"--results has no rung {missing} (has {sorted(have)}); fix: "
                    f"--config ...,rungs={'/'.join(map(str, sorted(have)))}")
  return {w: have[w] for w in ls.widths}


def remeasure(ls: ladder.LadderSpec, out: str, results: dict, data_dir: str = "",
              command: str = "") -> dict:
  """Every rung of the ladder `ls` (`rung`), under load average and wall clock."""
  t0, load = time.perf_counter(), list(os.getloadavg())
  recorded = recorded_rungs(ls, results)
  os.makedirs(out, exist_ok=True)
  data_dir = datasets.ensure_data(data_dir or ls.plan.data_dir, out, 2)
  scored = datasets.eval_sets(ls.plan.eval, data_dir, [ls.seq_len])
  rungs = [rung(ls, w, out, data_dir, scored, recorded[w]) for w in ls.widths]
  return {"script": "ladder_mechanism", "spec": ladder.SPEC, "command": command,
          "recorded_command": results.get("command"), "mechanism": ls.mechanism.record(),
          "reference": ls.reference, "other": ls.other, "control": ls.control,
          "seeds": list(ls.plan.seeds), "rungs": rungs,
          "load_average": {"start": load, "end": list(os.getloadavg())},
          "wall_seconds": time.perf_counter() - t0}


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True,
                      help=f"experiments/configs/compare.py:study={ladder.STUDY.name},size=cpu,"
                      "rungs=...")
  parser.add_argument("--out", required=True, help="seed runs go to OUT/rungW/seeds")
  parser.add_argument("--results", required=True, help="the ladder's recorded results.json")
  parser.add_argument("--data_dir", default="", help="a prepared data dir with 2 shards")
  parser.add_argument("--json", default=None, help="write the result here")
  args = parser.parse_args(argv)
  check_output_args(parser, args, out="folder", json="file")
  path, _, arg = args.config.partition(":")
  if not os.path.isfile(path):
    raise UserError(f"--config={args.config!r}: no config file {path!r}")
  try:
    with open(args.results) as f:
      results = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"--results={args.results!r} is not a readable JSON file ({e})") from None
  command = "python -m scripts.ladder_mechanism " + " ".join(
      sys.argv[1:] if argv is None else argv)
  _, ls = driver.checked(ladder.STUDY, load_config_file(path, arg or None))
  out = remeasure(ls, args.out, results, args.data_dir, command)
  cli.emit_json(out, args.json)
  return out


if __name__ == "__main__":
  main()
