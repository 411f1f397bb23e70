"""The paper's Table 4 / Figure 1 at small scale: methods at equal size and equal compute.

Every method (SOMA, monolithic SPSA at several n_pert, EGGROLL, BPTT) trains on one
prepared data dir, at approximately the same total parameter count, for as many updates
as a shared arithmetic budget allows (SPEC 7), and is then scored on the same test
windows: routed top-min(4, N) mixture, per-window losses, paired document bootstrap.

`run(config, out)` writes OUT/table.md, OUT/results.json and OUT/figure1.png; the runs
live in OUT/runs/NAME and resume like any training run.
"""

from __future__ import annotations

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
from soma_jax import metrics as metrics_lib
from soma_jax import model as model_lib
from soma_jax import report
from soma_jax import train as train_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.router import Router

V = 256  # byte vocabulary


# ----------------------------------------------------------------------------- sizes


def params_formula(d_t: int, n: int, d_e: int = 32, depth: int = 2, shared_head: bool = False) -> int:
  """Total parameters of N experts of width d_t (SPEC 2), with N heads or one shared head.

  Per expert: 16 D d_t^2 + (2 D + 1) d_t, plus 2 d_E d_t projections when d_t != d_E.
  """
  body = 16 * depth * d_t * d_t + (2 * depth + 1) * d_t + (2 * d_e * d_t if d_t != d_e else 0)
  return n * body + (1 if shared_head else n) * V * d_e


def width_for_params(total: int, n: int, d_e: int = 32, depth: int = 2,
                     shared_head: bool = False) -> int:
  """The width d_t whose N-expert ensemble has the parameter count nearest to `total`.

  Solves the quadratic of `params_formula` (with projections) and compares the integer
  neighbours of the root, and d_t = d_E (no projections), exactly.
  """
  heads = (1 if shared_head else n) * V * d_e
  a, b, c = 16 * depth * n, n * (2 * depth + 1 + 2 * d_e), heads - total
  root = (-b + math.sqrt(max(b * b - 4 * a * c, 0.0))) / (2 * a)
  candidates = {max(1, math.floor(root)), max(1, math.ceil(root)), d_e}
  return min(sorted(candidates),
             key=lambda d: abs(params_formula(d, n, d_e, depth, shared_head) - total))


def total_params(c: ml_collections.ConfigDict) -> int:
  return model_lib.ensemble_params(train_lib.model_config(c), c.n_experts)


# ----------------------------------------------------------------------------- plan


def plan(config: ml_collections.ConfigDict, data_dir: str) -> dict[str, ml_collections.ConfigDict]:
  """One complete training config per method: data, width, steps from the ops budget."""
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
    c.seed = config.seed
    c.init_from = ""  # every method starts from its own fresh init (no seed run)
    runs[name] = c
  kinds = {"soma": 0, "eggroll": 1, "bptt": 2}
  order = sorted(names, key=lambda n: (n != reference, kinds.get(runs[n].method, 3), -runs[n].n_experts,
                                       runs[n].spsa.n_pert * runs[n].spsa.accum))
  runs = {n: runs[n] for n in order}  # ConfigDict sorts its keys; the table reads better so
  target = total_params(runs[reference])
  for name, c in runs.items():
    if config.match_params and name != reference:
      c.model.d_t = width_for_params(target, c.n_experts, c.model.d_e, c.model.depth,
                                     c.model.shared_head)
    ops_update = train_lib.make_step(c)[1] * c.n_experts
    c.steps = max(1, int(config.budget_ops // ops_update))
    every = max(1, math.ceil(c.steps / max(1, config.curve_points)))
    c.ckpt_every = every  # each checkpoint is one point of figure 1
    c.ckpt.keep = c.steps // every + 2  # keep them all
    c.eval_every = min(c.eval_every, c.steps)
    c.log_every = min(c.log_every, c.steps)
  return runs


def _check_existing(workdir: str, c: ml_collections.ConfigDict) -> None:
  if not os.path.isfile(os.path.join(workdir, "config.json")):
    return
  old = ckpt_lib.read_config(workdir)
  if json.loads(old.to_json()) != json.loads(c.to_json()):
    raise UserError(f"{workdir!r} holds a run with a different config (budget, size or data); "
                    "fix: choose a new --out or delete that folder")


# ----------------------------------------------------------------------------- evaluation


class TestSet:
  """The test windows, their documents and routes for every expert count in use."""

  def __init__(self, data_dir: str, max_windows: int = 0):
    self.windows, self.doc_ids = pipeline.eval_split(data_dir, "test")
    if max_windows:
      self.windows, self.doc_ids = self.windows[:max_windows], self.doc_ids[:max_windows]
    if self.windows.shape[0] == 0:
      raise UserError(f"{data_dir!r} has no test windows; fix: prepare it with --test_docs > 0")
    self.router = Router.load(os.path.join(data_dir, "router.npz"))
    self._routes = {}

  def losses(self, body_N, head, n_experts: int, shared_head: bool) -> np.ndarray:
    """Per-window nats/byte of the routed top-min(4, N) uniform mixture, float64 [n]."""
    k = min(4, n_experts)
    if n_experts not in self._routes:
      self._routes[n_experts] = self.router.route_to(
          self.windows[:, :eval_lib.ROUTE_BYTES], k, n_experts)
    lp = eval_lib.routed_logprobs(body_N, head, self.windows, self._routes[n_experts], shared_head)
    return eval_lib.mixture_nats(lp)


def _curve(workdir: str, c: ml_collections.ConfigDict, test: TestSet, ops_update: int):
  """[(ops, test nats/byte)] at the initial state and every kept checkpoint; final losses."""
  body, head = train_lib.initial_params(c)
  points = [(0, float(test.losses(body, head, c.n_experts, c.model.shared_head).mean()))]
  ckpt = ckpt_lib.Checkpointer(workdir)
  try:
    steps = sorted(ckpt.steps())
  finally:
    ckpt.close()
  final = None
  for s in steps:
    body, head, _ = train_lib.restore_params(workdir, step=s)
    final = test.losses(body, head, c.n_experts, c.model.shared_head)
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


def run(config: ml_collections.ConfigDict, out: str) -> dict:
  """Trains every method to the shared budget, evaluates, writes table.md, results.json, figure1.png."""
  os.makedirs(out, exist_ok=True)
  data_dir = ensure_data(config, out)
  runs = plan(config, data_dir)
  test = TestSet(data_dir, config.test_windows)
  results, losses, curves = {}, {}, {}
  for name, c in runs.items():
    workdir = os.path.join(out, "runs", name)
    _check_existing(workdir, c)
    ops_update = train_lib.make_step(c)[1] * c.n_experts
    print(f"[compare] {name}: N={c.n_experts} d_t={c.model.d_t} params={total_params(c):,} "
          f"updates={c.steps} ops/update={ops_update:.3g}", flush=True)
    t0 = time.perf_counter()
    summary = train_lib.train(c, workdir)
    if summary["status"] != "done":
      raise UserError(f"{name} stopped early ({summary['status']}); rerun the same command to resume")
    wall = time.perf_counter() - t0
    curves[name], losses[name] = _curve(workdir, c, test, ops_update)
    results[name] = {
        "method": c.method, "n_experts": c.n_experts, "d_t": c.model.d_t,
        "params": total_params(c), "n_pert": c.spsa.n_pert if c.method == "soma" else None,
        "accum": c.spsa.accum, "directions_per_update":
            c.spsa.n_pert * c.spsa.accum if c.method == "soma" else
            (c.eggroll.pop if c.method == "eggroll" else None),
        "updates": c.steps, "ops_per_update": ops_update, "ops": ops_update * c.steps,
        "device_seconds": _device_seconds(workdir), "wall_seconds_this_call": wall,
        "workdir": workdir, "curve": [{"ops": o, "test_nats_per_byte": v} for o, v in curves[name]],
    }
  names = list(runs)
  loss_nxM = np.stack([losses[n] for n in names], axis=1)
  lo, hi = eval_lib.bootstrap_ci(loss_nxM, test.doc_ids, config.bootstrap_draws, config.seed)
  ref = config.reference or names[0]
  diff_nxM = loss_nxM - losses[ref][:, None]
  dlo, dhi = eval_lib.bootstrap_ci(diff_nxM, test.doc_ids, config.bootstrap_draws, config.seed)
  for m, name in enumerate(names):
    results[name]["test_nats_per_byte"] = float(loss_nxM[:, m].mean())
    results[name]["ci95"] = [float(lo[m]), float(hi[m])]
    results[name][f"minus_{ref}"] = float(diff_nxM[:, m].mean())
    results[name][f"minus_{ref}_ci95"] = [float(dlo[m]), float(dhi[m])]
  payload = {
      "data_dir": data_dir, "budget_ops": config.budget_ops, "reference": ref,
      "num_test_windows": int(test.windows.shape[0]),
      "num_test_documents": int(np.unique(test.doc_ids).size),
      "bootstrap_draws": config.bootstrap_draws,
      "unigram_test_nats_per_byte": report.unigram_nats(data_dir) if not config.test_windows else None,
      "platform": jax.devices()[0].platform, "methods": results,
  }
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(payload, f, indent=1)
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


def table(payload: dict) -> str:
  """Markdown: one row per method, intervals from the paired document bootstrap."""
  ref = payload["reference"]
  lines = [
      f"Test set: {payload['num_test_windows']} windows from {payload['num_test_documents']} "
      f"documents; routed top-min(4, N) mixture; 95% paired document bootstrap "
      f"({payload['bootstrap_draws']} draws). Budget {_fmt(payload['budget_ops'])} ops per method.",
      "",
      f"| method | N | d_t | params | directions / update | updates | ops | device s | "
      f"test nats/byte | 95% CI | minus {ref} [95% CI] |",
      "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in payload["methods"].items():
    dirs = r["directions_per_update"] if r["directions_per_update"] is not None else "-"
    d = r[f"minus_{ref}"]
    dci = r[f"minus_{ref}_ci95"]
    lines.append(
        f"| {name} | {r['n_experts']} | {r['d_t']} | {_fmt(r['params'])} | {dirs} | "
        f"{r['updates']} | {_fmt(r['ops'])} | {r['device_seconds']:.0f} | "
        f"{r['test_nats_per_byte']:.3f} | [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | "
        + ("-" if name == ref else f"{d:+.3f} [{dci[0]:+.3f}, {dci[1]:+.3f}]") + " |")
  if payload.get("unigram_test_nats_per_byte") is not None:
    lines += ["", f"Byte-unigram baseline: {payload['unigram_test_nats_per_byte']:.3f} nats/byte."]
  return "\n".join(lines) + "\n"


def plot(curves: dict[str, list[tuple[int, float]]], path: str, unigram: float | None) -> None:
  """Figure 1: test loss against cumulative arithmetic operations, one line per method."""
  plt = report.plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, pts in curves.items():
    ops, loss = zip(*pts, strict=True)
    ax.plot(np.asarray(ops, np.float64), loss, "o-", ms=3, label=name)
  if unigram is not None:
    ax.axhline(unigram, ls="--", c="gray", lw=1, label="byte unigram")
  ax.set_xlabel("cumulative training operations (SPEC 7)")
  ax.set_ylabel("test loss (nats/byte)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
