"""The paper's Table 4 / Figure 1 (SPEC 9.1): how to spend a device-time budget.

Rows: SOMA N = 2; monolithic SPSA of the same total size with 1x, 4x and 16x SOMA's
directions on SOMA's batch (the paper's 64 / 256 / 1,024 against SOMA's 64); EGGROLL (the
paper's GRU); BPTT; and two controls that isolate SOMA's mechanism, both from SOMA's start,
on SOMA's data and for SOMA's number of updates in each seed (`match_updates`):
- `head_only`: SOMA N = 2 with its bodies frozen, only the delta-rule heads training;
- `soma_n2_summed`: SOMA N = 2 with the N losses summed before every finite difference
  (the shared loss), the same directions.
Every row starts warm, from the seed run of its own architecture (`protocol`), the same for
every optimisation seed, and trains until `budget_seconds` of training device time (the
paper's budget is GPU-hours). Reported per row: operations, updates and measured
device-seconds, the test loss per seed with the paired CI against SOMA, mean ± sd and wins;
beside it, labelled as such, the ranking at equal operations (each row's test curve read
at the smallest operation count any budget row reached).
"""

from __future__ import annotations

import math
import os
import time

import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import methods as methods_lib
from soma_jax.errors import UserError
from soma_jax.studies import protocol


def run_config(name: str, c: ml_collections.ConfigDict, config: ml_collections.ConfigDict,
               data_dir: str, seed: int, start: dict, ref_updates: int | None
               ) -> ml_collections.ConfigDict:
  """The run of row `name` at one seed: to the time budget, or to the reference's updates."""
  rc = protocol.budgeted(c, data_dir, seed, start["_path"], config.budget_seconds,
                         config.curve_points)
  if name in config.match_updates:
    rc.budget_seconds, rc.steps = 0.0, ref_updates
    rc.ckpt_every = max(1, math.ceil(ref_updates / config.curve_points))
    rc.ckpt.keep = config.curve_points + 2
  return rc


def run(config: ml_collections.ConfigDict, out: str, command: str = "") -> dict:
  """Seeds, then every row at every optimisation seed; writes results.json and table.md."""
  t0 = time.perf_counter()
  os.makedirs(out, exist_ok=True)
  methods = protocol.sized(config)
  ref = config.reference
  for name, target in config.match_updates.items():
    if name not in methods or target != ref:
      raise UserError(f"match_updates.{name}={target!r}: controls match the reference {ref!r}, "
                      "and must be methods")
  data_dir = protocol.ensure_data(config, out, max(c.n_experts for c in methods.values()))
  val, test = protocol.eval_sets(config, data_dir, [c.data.seq_len for c in methods.values()])
  seeds = protocol.train_seeds(config, methods, data_dir, out, val)
  results = {n: describe(n, c, config, seeds[config.start[n]]) for n, c in methods.items()}
  for seed in protocol.optimisation_seeds(config):
    finals, ref_updates = {}, None
    for name, c in methods.items():
      start = seeds[config.start[name]]
      rc = run_config(name, c, config, data_dir, seed, start, ref_updates)
      workdir = os.path.join(out, "runs", f"seed{seed}", name)
      wall = protocol.train(rc, workdir, f"{name} (seed {seed})")
      points, finals[name] = protocol.curve(workdir, rc, test)
      done = protocol.summary(workdir)
      ref_updates = done["updates"] if name == ref else ref_updates
      print(f"[table4] seed {seed} {name}: {done['updates']} updates, "
            f"{done['device_seconds']:.1f} device-s, test {finals[name].mean():.4f}", flush=True)
      results[name]["per_seed"].append({
          "seed": seed, "start": protocol.start_of(start), **done,
          "wall_seconds_this_call": wall, "workdir": protocol.shown(workdir, out),
          "curve": points, "curve_split": "test",
          "test_nats_per_byte": float(finals[name].mean())})
    for name in methods:
      results[name]["per_seed"][-1].update(_paired(finals, ref, name, test, config, seed))
  for r in results.values():
    aggregate(r)
  payload = protocol.results(
      "table4", "SPEC 9.1 (paper App. I.1, Table 4 / Figure 1)", config, command, t0,
      "row and seed",
      {"controls": f"{', '.join(config.match_updates.keys())}: {ref}'s updates per seed, "
                   "not the time budget"},
      (val, test), data_dir, out, seeds,
      rows={n: config.rows.get(n, "") for n in methods}, methods=results)
  payload["equal_ops"] = equal_ops(payload, [n for n in methods if n not in config.match_updates])
  payload["start_vs_end"] = start_vs_end(payload)
  return protocol.write(out, payload, table)


def _paired(finals: dict, ref: str, name: str, test: eval_lib.TestSet,
            config: ml_collections.ConfigDict, seed: int) -> dict:
  d = protocol.paired(finals[ref], finals[name], test.doc_ids, config.bootstrap_draws, seed)
  return {"minus_ref": d["diff"], "minus_ref_ci95": d["ci95"]}


def describe(name: str, c: ml_collections.ConfigDict, config: ml_collections.ConfigDict,
             seed: dict) -> dict:
  """What a row is (its Method's `describe`: model, directions per update) and its budget."""
  return {"method": c.method, **methods_lib.get(c).describe(c), "n_experts": c.n_experts,
          "d_t": c.model.d_t, "depth": c.model.depth, "params": protocol.total_params(c),
          "seq_len": c.data.seq_len, "batch": c.spsa.batch, "accum": c.spsa.accum, "lr": c.opt.lr,
          "eps": c.spsa.eps,
          "ops_per_update": protocol.ops_per_update(c), "start": protocol.start_of(seed),
          "budget": "updates of " + config.reference if name in config.match_updates
                    else "device time", "per_seed": []}


def aggregate(r: dict) -> None:
  per = r["per_seed"]
  for key in ("test_nats_per_byte", "minus_ref", "updates", "ops", "device_seconds"):
    r[key] = protocol.across_seeds([p[key] for p in per])
  r["ref_wins"] = int(sum(p["minus_ref"] > 0 for p in per))
  r["ref_wins_ci_excludes_zero"] = int(sum(p["minus_ref_ci95"][0] > 0 for p in per))


def start_vs_end(payload: dict) -> dict:
  """Each row's test loss at its warm start and at its end (means over seeds): how much
  of a row's standing its start already had."""
  out = {}
  for name, m in payload["methods"].items():
    start = float(np.mean([q["curve"][0]["loss"] for q in m["per_seed"]]))
    end = m["test_nats_per_byte"]["mean"]
    out[name] = {"start_test": start, "end_test": end, "change": end - start}
  return out


def equal_ops(payload: dict, names: list[str]) -> dict:
  """Test loss of each budget row at the smallest final operation count among them, read
  off its checkpoint curve by linear interpolation in operations; mean over seeds."""
  methods = payload["methods"]
  ops = min(p["curve"][-1]["ops"] for n in names for p in methods[n]["per_seed"])
  at = {}
  for n in names:
    per = [float(np.interp(ops, [q["ops"] for q in p["curve"]], [q["loss"] for q in p["curve"]]))
           for p in methods[n]["per_seed"]]
    at[n] = protocol.across_seeds(per)
  order = sorted(names, key=lambda n: at[n]["mean"])
  return {"ops": ops, "how": "each row's test curve (warm start and its checkpoints) "
          "interpolated linearly in operations at the smallest final ops of any budget row",
          "test_nats_per_byte": at, "ranking": order}


def _fmt(x: float) -> str:
  for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if x >= div:
      return f"{x / div:.3g}{unit}"
  return f"{x:.3g}"


def table(p: dict) -> str:
  """Markdown: the device-time table, per-seed CIs, and the equal-ops ranking beside it."""
  ref, ev, n_seeds = p["reference"], p["eval"], len(p["seeds"])
  rank_time = sorted(p["methods"], key=lambda n: p["methods"][n]["test_nats_per_byte"]["mean"])
  lines = [
      f"Table 4 protocol (SPEC 9.1) at this scale. Budget: {p['budget']['seconds']:g} training "
      f"device-seconds per row and seed ({p['budget']['controls']}). Every row starts from its "
      f"architecture's seed run. Evaluation: route on {ev['route_bytes']} bytes, score the next "
      f"{ev['score_bytes']} ({ev['test_windows']} test windows from {ev['test_documents']} "
      f"documents); seeds {p['seeds']}; mean ± sd over seeds; 95% paired document bootstrap.",
      "",
      f"| row | budget | N | d_t | params | directions / update | updates | ops | device-s | "
      f"test nats/byte | minus {ref} | {ref} wins |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for name in p["methods"]:
    r = p["methods"][name]
    dirs = r["directions_per_update"] if r["directions_per_update"] is not None else "-"
    lines.append(
        f"| {name} | {r['budget']} | {r['n_experts']} | {r['d_t']} | {_fmt(r['params'])} | {dirs} | "
        f"{r['updates']['mean']:.0f} | {_fmt(r['ops']['mean'])} | {r['device_seconds']['mean']:.1f} | "
        f"{protocol.pm(r['test_nats_per_byte'])} | "
        + ("-" if name == ref else protocol.pm(r["minus_ref"], True))
        + " | " + ("-" if name == ref else f"{r['ref_wins']}/{n_seeds}") + " |")
  eq = p["equal_ops"]
  lines += ["", f"Ranking at equal device time (this table): {' < '.join(rank_time)}.",
            f"Ranking at equal operations ({_fmt(eq['ops'])} ops, {eq['how']}): "
            + " < ".join(f"{n} {eq['test_nats_per_byte'][n]['mean']:.3f}" for n in eq["ranking"])
            + ".", "", f"Per seed: test nats/byte, and minus {ref} [95% paired bootstrap CI].", "",
            "| row | " + " | ".join(f"seed {s}" for s in p["seeds"]) + " |",
            "|---|" + "---|" * n_seeds]
  for name, r in p["methods"].items():
    cells = [f"{q['test_nats_per_byte']:.3f}" + ("" if name == ref else
             f", {q['minus_ref']:+.3f} [{q['minus_ref_ci95'][0]:+.3f}, {q['minus_ref_ci95'][1]:+.3f}]")
             for q in r["per_seed"]]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += ["", f"Byte-unigram baseline on the same targets: {p['unigram_test_nats_per_byte']:.3f} "
            "nats/byte. Seed runs (cost excluded): " + "; ".join(
                f"{k} {s['method']} d_t={s['d_t']}: {s['updates']} updates, "
                f"{s['device_seconds']:.1f} device-s, ensemble val {s['ensemble_val_nats_per_byte']:.3f}"
                for k, s in p["seed_runs"].items()) + "."]
  return "\n".join(lines) + "\n"
