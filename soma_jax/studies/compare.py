"""The paper's Table 4 / Figure 1 at small scale: methods at equal size and equal compute.

Every method (SOMA, monolithic SPSA at several n_pert on SOMA's batch, the GRU EGGROLL,
BPTT) trains on one prepared data dir, at approximately the same total parameter count,
for as many updates as a shared arithmetic budget allows (SPEC 7), once per optimisation
seed, and is then scored on the same test windows: routed top-min(4, N) mixture,
per-window losses, paired document bootstrap per seed, mean and sd over seeds.

`run(config, out)` writes OUT/table.md, OUT/results.json, OUT/results.csv and
OUT/figure1.png; the runs live in OUT/runs/seedS/NAME and resume like any training run.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time

import jax
import ml_collections
import numpy as np
from absl import logging

from soma_jax import checkpoint as ckpt_lib
from soma_jax import evaluate as eval_lib
from soma_jax import methods
from soma_jax import metrics as metrics_lib
from soma_jax import runs as runs_lib
from soma_jax import train as train_lib
from soma_jax.errors import UserError
from soma_jax.studies import report


def total_params(c: ml_collections.ConfigDict) -> int:
  return methods.get(c).ensemble_params(c)


# ----------------------------------------------------------------------------- plan


def seeds(config: ml_collections.ConfigDict) -> list[int]:
  """The optimisation seeds: first_seed, first_seed + 1, ... (config.seeds of them)."""
  if config.seeds < 1:
    raise UserError(f"seeds={config.seeds} must be >= 1 (optimisation seeds per method)")
  return list(range(config.first_seed, config.first_seed + config.seeds))


def ops_per_update(c: ml_collections.ConfigDict) -> int:
  """Training operations of one update of all N experts (SPEC 7)."""
  return methods.get(c).ops_per_update(c) * c.n_experts


def plan(config: ml_collections.ConfigDict, data_dir: str, seed: int = 0
         ) -> dict[str, ml_collections.ConfigDict]:
  """One complete training config per method at one seed: data, width, steps from the budget."""
  names = list(config.methods.keys())
  if not names:
    raise UserError("config.methods is empty; fix: name at least one method")
  if config.budget_ops <= 0:
    raise UserError(f"budget_ops={config.budget_ops} must be > 0")
  reference = config.reference or names[0]
  if reference not in names:
    raise UserError(f"reference={reference!r} is not a method; have {', '.join(names)}")
  runs = {}
  for name in names:
    c = ml_collections.ConfigDict(config.methods[name].to_dict())
    c.data.dir = data_dir
    c.seed = seed
    c.init_from = ""  # every method starts from its own fresh init (no seed run)
    runs[name] = c
  rank = lambda n: methods.get(runs[n]).table_rank
  order = sorted(names, key=lambda n: (n != reference, rank(n),
                                       -runs[n].n_experts, runs[n].spsa.n_pert * runs[n].spsa.accum))
  runs = {n: runs[n] for n in order}  # ConfigDict sorts its keys; the table reads better so
  target = total_params(runs[reference])
  for name, c in runs.items():
    if config.match_params and name != reference:
      c.model.d_t = methods.get(c).width_for_params(target, c)
    c.steps = max(1, int(config.budget_ops // ops_per_update(c)))
    every = max(1, math.ceil(c.steps / max(1, config.curve_points)))
    c.ckpt_every = every  # each checkpoint is one point of figure 1
    c.ckpt.keep = c.steps // every + 2  # keep them all
    c.eval_every = min(c.eval_every, c.steps)
    c.log_every = min(c.log_every, c.steps)
  return runs


def _check_existing(workdir: str, c: ml_collections.ConfigDict) -> None:
  if not os.path.isfile(os.path.join(workdir, "config.json")):
    return
  changes = ckpt_lib.config_changes(ckpt_lib.read_config(workdir), c)
  if any(not ckpt_lib.under(k, ckpt_lib.SPEED_KEYS) for k in changes):  # speed knobs may differ
    raise UserError(f"{workdir!r} holds a run with a different config (budget, size or data); "
                    "fix: choose a new --out or delete that folder")


# ----------------------------------------------------------------------------- evaluation


def _curve(workdir: str, c: ml_collections.ConfigDict, test: eval_lib.TestSet, ops_update: int):
  """[(ops, test nats/byte)] at the initial state and every kept checkpoint; final losses."""
  logits = methods.get(c).logits
  body, head = runs_lib.initial_params(c)
  points = [(0, float(test.losses(body, head, c.n_experts, c.model.shared_head, logits).mean()))]
  ckpt = ckpt_lib.Checkpointer(workdir)
  try:
    steps = sorted(ckpt.steps())
  finally:
    ckpt.close()
  final = None
  for s in steps:
    body, head, _ = runs_lib.restore_params(workdir, step=s)
    final = test.losses(body, head, c.n_experts, c.model.shared_head, logits)
    points.append((s * ops_update, float(final.mean())))
  return points, final


def _device_seconds(workdir: str) -> float:
  logged = [r for r in metrics_lib.read_metrics(workdir) if "device_seconds" in r]
  return float(logged[-1]["device_seconds"]) if logged else 0.0


# ----------------------------------------------------------------------------- driver


def ensure_data(config: ml_collections.ConfigDict, out: str) -> str:
  """config.data_dir, or a pystdlib dir prepared under OUT/data with one shard per SOMA expert."""
  n = max(c.n_experts for c in config.methods.values())
  if config.data_dir:
    return config.data_dir
  data_dir = os.path.join(out, "data")
  if not os.path.isfile(os.path.join(data_dir, "manifest.json")):
    from soma_jax.data import prepare

    logging.info("preparing pystdlib into %s with %d clusters", data_dir, n)
    prepare.prepare("pystdlib", n, data_dir)
  return data_dir


def _describe(c: ml_collections.ConfigDict, ops_update: int) -> dict:
  """What one method is: model, size, directions and sequences per update, budget use."""
  shape = methods.get(c).describe(c)
  return {
      "method": c.method, "model": shape["model"],
      "n_experts": c.n_experts, "d_t": c.model.d_t, "depth": c.model.depth,
      "params": total_params(c), "seq_len": c.data.seq_len, "batch": c.spsa.batch,
      "accum": c.spsa.accum, "n_pert": shape["n_pert"],
      "directions_per_update": shape["directions_per_update"],
      "sequences_per_update_per_expert": c.spsa.batch * c.spsa.accum,
      "lr": c.opt.lr, "updates": c.steps, "ops_per_update": ops_update,
      "ops": ops_update * c.steps,
  } | shape  # a method may name its own sequence shape (the GRU: one segment per member)


def _sd(x: list[float]) -> float | None:
  return float(np.std(x, ddof=1)) if len(x) > 1 else None


def _train_and_score(name: str, c: ml_collections.ConfigDict, seed: int, out: str,
                     test: eval_lib.TestSet, results: dict, curves: dict) -> np.ndarray:
  """Trains (or resumes) one method at one seed, records its row and curve; its final
  per-window test losses."""
  workdir = os.path.join(out, "runs", f"seed{seed}", name)
  _check_existing(workdir, c)
  ops_update = ops_per_update(c)
  print(f"[compare] seed {seed} {name}: N={c.n_experts} d_t={c.model.d_t} "
        f"params={total_params(c):,} updates={c.steps} ops/update={ops_update:.3g}", flush=True)
  t0 = time.perf_counter()
  train_lib.train_to_end(c, workdir, f"{name} (seed {seed})")
  wall = time.perf_counter() - t0
  curve, final = _curve(workdir, c, test, ops_update)
  curves.setdefault(name, []).append(curve)
  results.setdefault(name, _describe(c, ops_update) | {"per_seed": []})
  results[name]["per_seed"].append({
      "seed": seed, "device_seconds": _device_seconds(workdir),
      "wall_seconds_this_call": wall, "workdir": os.path.relpath(workdir, out),
      "curve": [{"ops": o, "test_nats_per_byte": v} for o, v in curve]})
  return final


def run(config: ml_collections.ConfigDict, out: str, command: str = "") -> dict:
  """Trains every method at every seed to the shared budget, evaluates, writes the outputs."""
  t_start = time.perf_counter()
  os.makedirs(out, exist_ok=True)
  data_dir = ensure_data(config, out)
  test = eval_lib.TestSet(data_dir, config.test_windows)
  seed_list = seeds(config)
  results, curves = {}, {}
  ref = None
  for seed in seed_list:
    runs = plan(config, data_dir, seed)
    names = list(runs)
    ref = config.reference or names[0]
    losses = {name: _train_and_score(name, c, seed, out, test, results, curves)
              for name, c in runs.items()}
    loss_nxM = np.stack([losses[n] for n in names], axis=1)
    lo, hi = eval_lib.bootstrap_ci(loss_nxM, test.doc_ids, config.bootstrap_draws, seed)
    diff_nxM = loss_nxM - losses[ref][:, None]
    dlo, dhi = eval_lib.bootstrap_ci(diff_nxM, test.doc_ids, config.bootstrap_draws, seed)
    for m, name in enumerate(names):
      results[name]["per_seed"][-1].update({
          "test_nats_per_byte": float(loss_nxM[:, m].mean()), "ci95": [float(lo[m]), float(hi[m])],
          "minus_ref": float(diff_nxM[:, m].mean()), "minus_ref_ci95": [float(dlo[m]), float(dhi[m])]})
  for r in results.values():
    loss_S = [p["test_nats_per_byte"] for p in r["per_seed"]]
    diff_S = [p["minus_ref"] for p in r["per_seed"]]
    r.update({
        "test_nats_per_byte_mean": float(np.mean(loss_S)), "test_nats_per_byte_sd": _sd(loss_S),
        "minus_ref_mean": float(np.mean(diff_S)), "minus_ref_sd": _sd(diff_S),
        "ref_wins": int(sum(d > 0 for d in diff_S)),  # seeds where the reference's loss is lower
        "ref_wins_ci_excludes_zero": int(sum(p["minus_ref_ci95"][0] > 0 for p in r["per_seed"])),
    })
  payload = {
      "command": command, "wall_seconds": time.perf_counter() - t_start,
      "data_dir": config.data_dir or os.path.relpath(data_dir, out), "budget_ops": config.budget_ops, "reference": ref,
      "seeds": seed_list, "num_test_windows": int(test.windows.shape[0]),
      "num_test_documents": int(np.unique(test.doc_ids).size),
      "bootstrap_draws": config.bootstrap_draws,
      "unigram_test_nats_per_byte": eval_lib.unigram_nats(data_dir) if not config.test_windows else None,
      "platform": jax.devices()[0].platform,
      "rows": {name: config.rows.get(name, "") for name in results},
      "methods": results,
  }
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(payload, f, indent=1)
  write_csv(payload, os.path.join(out, "results.csv"))
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table(payload))
  plot(curves, os.path.join(out, "figure1.png"), payload["unigram_test_nats_per_byte"])
  return payload


# ----------------------------------------------------------------------------- outputs


def _fmt(x: float) -> str:
  for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if x >= div:
      return f"{x / div:.3g}{unit}"
  return f"{x:.3g}"


def _pm(mean: float, sd: float | None, signed: bool = False) -> str:
  f = "+.3f" if signed else ".3f"
  return f"{mean:{f}}" + ("" if sd is None else f" ± {sd:.3f}")


def table(payload: dict) -> str:
  """Markdown: one row per method (mean ± sd over seeds), then each seed's paired CIs."""
  ref, n_seeds = payload["reference"], len(payload["seeds"])
  lines = [
      f"Test set: {payload['num_test_windows']} windows from {payload['num_test_documents']} "
      f"documents; routed top-min(4, N) mixture. Budget {_fmt(payload['budget_ops'])} ops per "
      f"method and seed; seeds {payload['seeds']}; mean ± sd over seeds; per-seed 95% paired "
      f"document bootstrap ({payload['bootstrap_draws']} draws).",
      "",
      f"| method | N | d_t | params | B x T | directions / update | updates | ops | "
      f"test nats/byte | minus {ref} | {ref} wins |",
      "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in payload["methods"].items():
    dirs = r["directions_per_update"] if r["directions_per_update"] is not None else "-"
    lines.append(
        f"| {name} | {r['n_experts']} | {r['d_t']} | {_fmt(r['params'])} | "
        f"{r['batch'] * r['accum']} x {r['seq_len']} | {dirs} | {r['updates']} | {_fmt(r['ops'])} | "
        f"{_pm(r['test_nats_per_byte_mean'], r['test_nats_per_byte_sd'])} | "
        + ("-" if name == ref else _pm(r["minus_ref_mean"], r["minus_ref_sd"], True))
        + " | " + ("-" if name == ref else f"{r['ref_wins']}/{n_seeds}") + " |")
  lines += ["", f"Per seed: test nats/byte, and minus {ref} [95% paired bootstrap CI].", "",
            "| method | " + " | ".join(f"seed {s}" for s in payload["seeds"]) + " |",
            "|---|" + "---|" * n_seeds]
  for name, r in payload["methods"].items():
    cells = [f"{p['test_nats_per_byte']:.3f}" + ("" if name == ref else
             f", {p['minus_ref']:+.3f} [{p['minus_ref_ci95'][0]:+.3f}, {p['minus_ref_ci95'][1]:+.3f}]")
             for p in r["per_seed"]]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  if payload.get("unigram_test_nats_per_byte") is not None:
    lines += ["", f"Byte-unigram baseline: {payload['unigram_test_nats_per_byte']:.3f} nats/byte."]
  return "\n".join(lines) + "\n"


def write_csv(payload: dict, path: str) -> None:
  """One row per method and seed: loss, its CI, the difference from the reference, its CI."""
  cols = ["method", "seed", "n_experts", "d_t", "params", "updates", "ops", "device_seconds",
          "test_nats_per_byte", "ci95_lo", "ci95_hi", "minus_ref", "minus_ref_ci95_lo",
          "minus_ref_ci95_hi"]
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for name, r in payload["methods"].items():
      for p in r["per_seed"]:
        w.writerow([name, p["seed"], r["n_experts"], r["d_t"], r["params"], r["updates"], r["ops"],
                    p["device_seconds"], p["test_nats_per_byte"], *p["ci95"], p["minus_ref"],
                    *p["minus_ref_ci95"]])


def plot(curves: dict[str, list[list[tuple[int, float]]]], path: str, unigram: float | None) -> None:
  """Figure 1: test loss against cumulative operations; mean over seeds, bars = sd."""
  plt = report.plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, per_seed in curves.items():
    ops = np.asarray([o for o, _ in per_seed[0]], np.float64)
    loss_SxP = np.asarray([[v for _, v in c] for c in per_seed])
    sd = loss_SxP.std(axis=0, ddof=1) if len(per_seed) > 1 else None
    ax.errorbar(ops, loss_SxP.mean(axis=0), yerr=sd, fmt="o-", ms=3, capsize=2, label=name)
  if unigram is not None:
    ax.axhline(unigram, ls="--", c="gray", lw=1, label="byte unigram")
  ax.set_xlabel("cumulative training operations (SPEC 7)")
  ax.set_ylabel(f"test loss (nats/byte), mean over {len(next(iter(curves.values())))} seeds")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
