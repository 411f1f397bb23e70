"""A run report: loss curves (PNG), final numbers (JSON) and report.md for one or more runs; and
what the studies' figures share (`save_figure`, `mean_curve`, `label`, `png`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from soma_jax import checkpoint as ckpt_lib  # noqa: E402
from soma_jax import evaluate as eval_lib  # noqa: E402
from soma_jax import metrics as metrics_lib  # noqa: E402
from soma_jax import runs  # noqa: E402
from soma_jax.data import pipeline  # noqa: E402
from soma_jax.data.router import Router  # noqa: E402


def save_figure(fig, path: str) -> None:
  """Lays `fig` out, writes it to `path` as a 120-dpi PNG and frees it."""
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


LOSS = "ensemble-validation loss (nats/byte)"  # the y label of the studies' loss figures


def mean_curve(per_seed: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """The seed-mean of equally long curves (each per-seed record's "curve"): (x = each point's
  `key`, y = its loss)."""
  x = np.mean([[q[key] for q in s["curve"]] for s in per_seed], axis=0)
  y = np.mean([[q["loss"] for q in s["curve"]] for s in per_seed], axis=0)
  return x, y


def png(plot: Callable[[dict, str], None], name: str) -> Callable[[dict, str], None]:
  """A Study's `plot` hook: `plot(payload, OUT/name)`."""
  return lambda p, out: plot(p, os.path.join(out, name))


def label(ax, xlabel: str, ylabel: str = LOSS, title: str | None = None, log: bool = False,
          legend: int = 8) -> None:
  """A figure's axis: log x (`log`), its labels, its title (fontsize 9), its legend."""
  if log:
    ax.set_xscale("log")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if title is not None:
    ax.set_title(title, fontsize=9)
  ax.legend(fontsize=legend)


def plot_offset(workdir: str) -> int:
  """Where step 0 of this run lies on its seed's curve: a warm-started run (its steps counted
  from 0) continues after its seed's updates; a continued one (init_state) already counts
  on from its seed's step."""
  c = ckpt_lib.read_config(workdir)
  seed = c.get("init_from", "")
  if not seed or c.get("init_state", False) or not os.path.isdir(seed):
    return 0
  steps = [r["step"] for r in metrics_lib.read_metrics(seed)]
  return max(steps, default=0)


def plot_curves(runs: dict[str, str], path: str, baseline: float | None = None) -> None:
  """Train loss (mean over experts) and expert-validation loss against update, per run.

  A run warm-started from a seed is drawn after the seed's updates.
  """
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for name, workdir in runs.items():
    recs = metrics_lib.read_metrics(workdir)
    off = plot_offset(workdir)
    tr = [(off + r["step"], np.mean(r["loss"])) for r in recs if "loss" in r]
    va = [(off + r["step"], np.mean(r["val_loss"])) for r in recs if "val_loss" in r]
    if tr:
      axes[0].plot(*zip(*tr), label=name)
    if va:
      axes[1].plot(*zip(*va), marker="o", label=name)
  for ax, title in zip(axes, ("train loss (mean of perturbed losses)",
                              "expert validation loss (mean over experts)")):
    if baseline is not None:
      ax.axhline(baseline, color="gray", ls="--", label="unigram (test)")
    ax.set_xlabel("update (warm starts continue the seed's count)")
    ax.set_ylabel("nats/byte")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
  save_figure(fig, path)


def run_summary(workdir: str, data_dir: str, split: str = "test") -> dict:
  """Final metrics of one run (its own updates: a continued seed's step counts the seed's
  too) and its routed loss on a held-out split (refused, as evaluate.py refuses it, when the
  split has no complete window)."""
  body_N, head, method = runs.restore_params(workdir)
  c = ckpt_lib.read_config(workdir)
  windows, _ = eval_lib.load_split(data_dir, split)
  router = Router.load(os.path.join(data_dir, "router.npz"))
  k = min(4, c.n_experts)
  loss = eval_lib.ensemble_loss(body_N, head, windows, router, k, c.model.shared_head,
                                logits_fn=method.logits)
  logged = [r for r in metrics_lib.read_metrics(workdir) if "ops" in r]
  last = logged[-1] if logged else {"step": 0, "ops": 0, "device_seconds": 0.0}
  return {"workdir": workdir, "n_experts": c.n_experts, "d_t": c.model.d_t,
          "updates": last.get("updates", last["step"]), "ops": last["ops"],
          "device_seconds": last["device_seconds"], f"{split}_nats_per_byte": loss,
          "top_k": k, "num_windows": int(windows.shape[0])}


def write_report(out_dir: str, runs: dict[str, str], data_dir: str) -> dict:
  """report.md + loss_curves.png + report.json in `out_dir`; every run is first checked to
  have trained on `data_dir` (`checkpoint.check_data`: its manifest and the files read)."""
  manifest = pipeline.load_manifest(data_dir)
  shards = tuple(f"experts/{e:04d}/train.npy" for e in range(manifest["num_clusters"]))
  for w in runs.values():  # the unigram baseline reads the shards; the scores test and router
    ckpt_lib.check_data(w, ckpt_lib.read_config(w).data.dir, data_dir,
                        ("router.npz", "test.npy", "test_docs.npy") + shards)
  eval_lib.load_split(data_dir, "test")  # no test window: refused before anything is written
  os.makedirs(out_dir, exist_ok=True)
  baseline = eval_lib.unigram_nats(data_dir)
  plot_curves(runs, os.path.join(out_dir, "loss_curves.png"), baseline)
  results = {name: run_summary(w, data_dir) for name, w in runs.items()}
  payload = {"unigram_test_nats_per_byte": baseline, "runs": results}
  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(metrics_lib.json_safe(payload), f, indent=1, allow_nan=False, default=float)
  cfgs = {name: ckpt_lib.read_config(w) for name, w in runs.items()}
  lines = ["# soma-jax run report", "",
           f"Data: `{data_dir}`; test windows score targets 257..1024 after routing on "
           "bytes 0..255.", "",
           "| run | N | d_t | updates | ops | device-seconds | test nats/byte |",
           "|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    lines.append(f"| {name} | {r['n_experts']} | {r['d_t']} | {r['updates']} | "
                 f"{r['ops']:.3g} | {r['device_seconds']:.3g} | {r['test_nats_per_byte']:.3f} |")
  lines += ["", f"Unigram baseline (byte frequencies of the training shards) on the same "
            f"targets: **{baseline:.3f}** nats/byte.", "", "![loss curves](loss_curves.png)", "",
            "Configs: " + ", ".join(f"{n}: n_pert={c.spsa.n_pert}, B={c.spsa.batch}, "
                                   f"T={c.data.seq_len}, lr={c.opt.lr}"
                                   for n, c in cfgs.items()), ""]
  with open(os.path.join(out_dir, "report.md"), "w") as f:
    f.write("\n".join(lines))
  return payload
