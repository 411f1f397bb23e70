"""The paper's Table 7 (SPEC 9.2): SOMA N = 2 against the monolith of the same total size at
equal compute and equal tuning.

Per architecture and optimisation seed, from that architecture's own warm start (the same
for every seed; a seed run's parameters with fresh Adam moments, where the paper starts from
each architecture's step-1 checkpoint, optimizer state included):
1. lr in base x lr_factors at eps = base; the lowest final ensemble-validation loss picks lr;
2. at that lr, eps in base x eps_factors (the run at eps = base is reused): 5 configurations
   with the paper's factors 0.5, 1, 2. All of them see the same batches and directions
   (they share the optimisation seed; lr and eps change no random draw).
Each configuration trains until `budget_seconds` of training device time, the job's charged
time in whatever layout training picks (on a CPU: core-seconds, with SOMA's experts over the
cores by FSO and the monolith's directions over them by DDPP; the paper runs the monolith on
one GPU and gives each expert its own GPU for 1/N of it), with checkpoints after each quarter
scored on the ensemble-validation windows. The setting with the lowest final validation loss is selected, and only its final
checkpoint is scored on the test set, once. Reported per seed: both test losses, the paired
difference (monolith minus SOMA) with its document-bootstrap 95% CI; then the mean, the
sample sd over seeds and the wins.
"""

from __future__ import annotations

import os
import time

import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax.errors import UserError
from soma_jax.studies import protocol


def grid_point(c: ml_collections.ConfigDict, lr: float, eps: float) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(c.to_dict())
  c.opt.lr, c.spsa.eps = lr, eps
  return c


def tune(c: ml_collections.ConfigDict, config: ml_collections.ConfigDict, root: str,
         val: eval_lib.TestSet, what: str) -> tuple[dict, list[dict]]:
  """The two-stage lr-then-eps search of one architecture and seed, on validation only.

  `c` is the budgeted run config (seed, start, budget set). Returns (the selected
  configuration's record, every configuration's record in the order trained).
  """
  base = config.base_lr
  tried: dict[tuple[float, float], dict] = {}

  def run(lr: float, eps: float) -> dict:
    if (lr, eps) not in tried:
      workdir = os.path.join(root, f"lr{lr:g}_eps{eps:g}")
      wall = protocol.train(grid_point(c, lr, eps), workdir, f"{what} lr={lr:g} eps={eps:g}")
      points, last = protocol.curve(workdir, grid_point(c, lr, eps), val)
      tried[(lr, eps)] = {"lr": lr, "eps": eps, "workdir": workdir, "val_curve": points,
                          "val_nats_per_byte": float(last.mean()),
                          **protocol.summary(workdir), "wall_seconds_this_call": wall}
      print(f"[table7] {what} lr={lr:g} eps={eps:g}: {tried[(lr, eps)]['updates']} updates, "
            f"ensemble val {last.mean():.4f}", flush=True)
    return tried[(lr, eps)]

  best = lambda records: min(records, key=lambda r: r["val_nats_per_byte"])
  lr = best([run(f * base, base) for f in config.lr_factors])["lr"]
  chosen = best([run(lr, f * base) for f in config.eps_factors])
  return chosen, list(tried.values())


def run(config: ml_collections.ConfigDict, out: str, command: str = "",
        scorers: tuple[eval_lib.TestSet, eval_lib.TestSet] | None = None) -> dict:
  """Seeds, then every architecture x seed x grid point; writes OUT/results.json, table.md.

  `scorers` = (validation, test) replaces the data dir's own (tests use it to give the
  test set a ranking opposite to validation's).
  """
  t0 = time.perf_counter()
  os.makedirs(out, exist_ok=True)
  methods = protocol.sized(config)
  if len(methods) != 2:
    raise UserError(f"study=table7 compares two architectures; config.methods has {len(methods)}")
  ref, other = list(methods)
  data_dir = protocol.ensure_data(config, out, max(c.n_experts for c in methods.values()))
  val, test = scorers or protocol.eval_sets(config, data_dir, [c.data.seq_len for c in methods.values()])
  seeds = protocol.train_seeds(config, methods, data_dir, out, val)
  results = {name: describe(c, config, seeds[config.start[name]]) for name, c in methods.items()}
  finals = {}
  for seed in protocol.optimisation_seeds(config):
    for name, c in methods.items():
      start = seeds[config.start[name]]
      rc = protocol.budgeted(c, data_dir, seed, start["_path"], config.budget_seconds,
                             config.curve_points)
      chosen, tried = tune(rc, config, os.path.join(out, "runs", f"seed{seed}", name), val,
                           f"seed {seed} {name}")
      finals[(seed, name)] = protocol.final_losses(chosen["workdir"], rc, test)  # once
      results[name]["per_seed"].append(per_seed_record(seed, start, chosen, tried, rc, out,
                                                        finals[(seed, name)]))
  differences(results, finals, ref, other, test, config)
  payload = protocol.results(
      "table7", "SPEC 9.2 (paper App. I.2, Table 7)", config, command, t0,
      "configuration", {"per_expert": "SOMA's N experts share it equally (one job: a vmapped step, or "
                                     "the experts over devices by FSO)"},
      (val, test), data_dir, out, seeds,
      tuning={"base_lr": config.base_lr, "lr_factors": list(config.lr_factors),
              "eps_factors": list(config.eps_factors),
              "selection": "final ensemble-validation loss; test scored once, selected only"},
      other=other, methods=results)
  payload["start_vs_end"] = start_vs_end(payload)
  return protocol.write(out, payload, table)


def describe(c: ml_collections.ConfigDict, config: ml_collections.ConfigDict, seed: dict) -> dict:
  return {"method": c.method, "n_experts": c.n_experts, "d_t": c.model.d_t,
          "params": protocol.total_params(c), "n_pert": c.spsa.n_pert, "batch": c.spsa.batch,
          "seq_len": c.data.seq_len, "weight_decay": c.opt.weight_decay,
          "start": protocol.start_of(seed), "per_seed": []}


def per_seed_record(seed: int, start: dict, chosen: dict, tried: list[dict],
                    c: ml_collections.ConfigDict, out: str, test_n: np.ndarray) -> dict:
  strip = lambda r: {k: (protocol.shown(v, out) if k == "workdir" else v) for k, v in r.items()}
  return {
      "seed": seed, "start": protocol.start_of(start),
      "selected": {"lr": chosen["lr"], "eps": chosen["eps"],
                   "val_nats_per_byte": chosen["val_nats_per_byte"]},
      "updates": chosen["updates"], "updates_per_expert": chosen["updates"],
      "device_seconds": chosen["device_seconds"],
      "device_seconds_per_expert": chosen["device_seconds"] / c.n_experts,
      "curve": chosen["val_curve"], "curve_split": "ensemble_val",
      "test_nats_per_byte": float(test_n.mean()),
      "configurations": [strip(r) for r in tried],
  }


def differences(results: dict, finals: dict, ref: str, other: str, test: eval_lib.TestSet,
                config: ml_collections.ConfigDict) -> None:
  """Per seed: other minus ref on the same test windows, paired CI; then across seeds."""
  diffs = []
  for i, rec in enumerate(results[other]["per_seed"]):
    seed = rec["seed"]
    d = protocol.paired(finals[(seed, ref)], finals[(seed, other)], test.doc_ids,
                        config.bootstrap_draws, seed)
    rec.update({"minus_ref": d["diff"], "minus_ref_ci95": d["ci95"]})
    results[ref]["per_seed"][i].update({"minus_ref": 0.0})
    diffs.append(d["diff"])
  for name in (ref, other):
    results[name]["test_nats_per_byte"] = protocol.across_seeds(
        [r["test_nats_per_byte"] for r in results[name]["per_seed"]])
  results[other]["minus_ref"] = protocol.across_seeds(diffs)
  results[other]["ref_wins"] = int(sum(d > 0 for d in diffs))
  results[other]["ref_wins_ci_excludes_zero"] = int(
      sum(r["minus_ref_ci95"][0] > 0 for r in results[other]["per_seed"]))


def start_vs_end(p: dict) -> dict:
  """How much of the final validation gap the warm starts already had: each architecture's
  start (update 0) and selected final ensemble-validation loss, means over seeds."""
  ref, other = p["reference"], p["other"]
  out = {}
  for name in (ref, other):
    per = p["methods"][name]["per_seed"]
    start = float(np.mean([q["curve"][0]["loss"] for q in per]))
    end = float(np.mean([q["selected"]["val_nats_per_byte"] for q in per]))
    out[name] = {"start_val": start, "end_val": end, "change": end - start}
  out["gap_at_start"] = out[other]["start_val"] - out[ref]["start_val"]
  out["gap_at_end"] = out[other]["end_val"] - out[ref]["end_val"]
  out["gap_from_training"] = out["gap_at_end"] - out["gap_at_start"]
  return out


def table(p: dict) -> str:
  """Markdown: the setup line, one row per seed, then mean ± sd and wins."""
  ref, other, ev = p["reference"], p["other"], p["eval"]
  r, o = p["methods"][ref], p["methods"][other]
  lines = [
      f"Table 7 protocol (SPEC 9.2) at this scale: {ref} (N={r['n_experts']}, d_t={r['d_t']}, "
      f"{r['params']:,} params) vs {other} (N={o['n_experts']}, d_t={o['d_t']}, "
      f"{o['params']:,} params). Budget {p['budget']['seconds']:g} training device-seconds per "
      f"configuration; lr grid {p['tuning']['base_lr']:g} x {p['tuning']['lr_factors']}, then eps "
      f"grid x {p['tuning']['eps_factors']}; selection on ensemble validation "
      f"({ev['val_windows']} windows), test scored once. Evaluation: route on {ev['route_bytes']} "
      f"bytes, score the next {ev['score_bytes']} ({ev['test_windows']} test windows from "
      f"{ev['test_documents']} documents). 95% paired document bootstrap.",
      "",
      f"| seed | {ref} selected lr / eps | updates | {ref} test | {other} selected lr / eps | "
      f"updates | {other} test | {other} minus {ref} [95% CI] |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for a, b in zip(r["per_seed"], o["per_seed"], strict=True):
    lines.append(
        f"| {a['seed']} | {a['selected']['lr']:g} / {a['selected']['eps']:g} | {a['updates']} | "
        f"{a['test_nats_per_byte']:.4f} | {b['selected']['lr']:g} / {b['selected']['eps']:g} | "
        f"{b['updates']} | {b['test_nats_per_byte']:.4f} | {b['minus_ref']:+.4f} "
        f"[{b['minus_ref_ci95'][0]:+.4f}, {b['minus_ref_ci95'][1]:+.4f}] |")
  n = len(o["per_seed"])
  lines += ["", f"Mean ± sd over {n} seeds: {ref} {protocol.pm(r['test_nats_per_byte'], digits=4)}, "
            f"{other} {protocol.pm(o['test_nats_per_byte'], digits=4)}; {other} minus {ref} "
            f"{protocol.pm(o['minus_ref'], True, 4)}; {ref} lower in {o['ref_wins']} of {n} seeds "
            f"(CI above zero in {o['ref_wins_ci_excludes_zero']}). Byte unigram "
            f"{p['unigram_test_nats_per_byte']:.3f}."]
  if "start_vs_end" in p:
    g = p["start_vs_end"]
    lines += ["", f"Ensemble validation, start -> selected end (mean over seeds): {ref} "
              f"{g[ref]['start_val']:.4f} -> {g[ref]['end_val']:.4f}, {other} "
              f"{g[other]['start_val']:.4f} -> {g[other]['end_val']:.4f}; {other} minus {ref}: "
              f"{g['gap_at_start']:+.4f} at the warm starts, {g['gap_at_end']:+.4f} at the end "
              f"({g['gap_from_training']:+.4f} from this training)."]
  return "\n".join(lines) + "\n"
