r"""SPSA gradient variance measured against the theory (SPEC 5); writes OUT/STUDY.{json,csv,png}.

  python experiments/variance.py --config=experiments/configs/variance.py:shared_vs_separate \
      --x64 --out=runs/variance [--workdir=runs/soma_n4]

Studies: shared_vs_separate, n_pert, experts, batch, reference. Points carry standard
errors over repeated probe draws; predictions are drawn dashed and never fitted. The
experts and reference studies measure one trained run per N with
--config.trained_dir=DIR (DIR/N{n}, trained by `python -m scripts.train_sizes`).
"""

from __future__ import annotations

import csv
import json
import os

import matplotlib
import numpy as np
from absl import flags, logging
from ml_collections import config_flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from soma_jax import cli  # noqa: E402
from soma_jax.errors import UserError  # noqa: E402
from soma_jax.studies import trained_sizes, variance, variance_settings  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiments/configs/variance.py:STUDY",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir: measure its newest checkpoint.")
_X64 = flags.DEFINE_bool("x64", False, "Measure in float64.")
_OUT = cli.output_flag("out", None, "Output folder for STUDY.json, STUDY.csv, STUDY.png.", kind="folder")
flags.mark_flag_as_required("out")


def load_params(workdir: str, vs: variance_settings.VarianceSpec) -> tuple[variance_settings.VarianceSpec, tuple]:
  """`vs` measuring the newest checkpoint, and its (body_N, head); the model shape comes from
  the run's config, and so do the windows (its data dir, expert e on shard e) unless data_dir
  is set."""
  from soma_jax import runs  # imported here: the studies need no checkpoint machinery

  if vs.trained_dir is not None:
    raise UserError(f"--workdir: the {vs.study} study needs one trained run per N; fix: "
                    "--config.trained_dir=DIR holding DIR/N{n} (python -m scripts.train_sizes)")
  step, state, _, spec = runs.restore_state(workdir)
  vs = variance_settings.with_changes(
      vs, model={key: int(spec.config.model[key]) for key in ("d_t", "d_e", "depth")},
      data_dir=vs.data_dir or spec.data_dir,
      weights=f"trained: {os.path.normpath(workdir)} at update {int(step)}")
  return vs, (state.body, state.head)


def _finite(weights, where: str):
  """`weights` (any pytree of arrays), refused when any is NaN or infinite: every variance
  of a diverged run is NaN, and the plot of them fails."""
  import jax

  bad = sum(int(np.size(x) - np.isfinite(np.asarray(x)).sum()) for x in jax.tree.leaves(weights))
  if bad:
    raise UserError(f"{where} holds {bad:,} non-finite weights (NaN or inf: the run diverged), "
                    "so every measured variance would be NaN; fix: measure a run whose "
                    "weights are finite (an earlier one, or retrain with a smaller opt.lr)")
  return weights


def _weights(vs: variance_settings.VarianceSpec) -> tuple:
  """`vs` naming what the study measures, and those weights: a --workdir's checkpoint, one
  trained run per N (`trained_dir`), or None for a fresh init; finite, or a UserError."""
  if vs.trained_dir:
    if _WORKDIR.value:
      raise UserError("--workdir and --config.trained_dir both name weights; fix: keep one")
    vs, trained = trained_sizes.load_all(vs)
    _finite({n: (t.body, t.head) for n, t in trained.items()},
            f"--config.trained_dir={vs.trained_dir}")
    return vs, trained
  if _WORKDIR.value:
    vs, params = load_params(_WORKDIR.value, vs)
    return vs, _finite(params, f"--workdir={_WORKDIR.value}")
  if vs.size == "trained":
    raise UserError("size=trained measures trained weights; fix: --workdir=RUN (a trained "
                    "SOMA workdir), or for the experts and reference studies "
                    "--config.trained_dir=DIR (python -m scripts.train_sizes --out=DIR)")
  return vs, None


def _experts_title(res: dict) -> str:
  pts = res["points"]
  return (f"about {res['total_params']:,} parameters, {res['probe']} probes: N = {pts[0]['n']} / "
          f"N = {pts[-1]['n']} = {res['first_over_last']:.1f}x (predicted "
          f"{res['predicted_first_over_last']:.1f}x)\n{res['weights']}, T = {res['seq_len']}, "
          f"B = {res['batch']}")


def _plot(res: dict, path: str) -> None:
  pts, study = res["points"], res["study"]
  fig, ax = plt.subplots(figsize=(6.4, 4.4))

  def series(rows, x, label, color):
    xs = np.array([r[x] for r in rows], float)
    ax.errorbar(xs, [r["measured"] for r in rows], yerr=[r["se"] for r in rows], fmt="o-",
                color=color, capsize=3, label=f"{label} measured")
    ax.plot(xs, [r["predicted"] for r in rows], "--", color=color, label=f"{label} predicted")

  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  if study in ("shared_vs_separate", "n_pert"):
    key = "grouping" if study == "shared_vs_separate" else "probe"
    for i, name in enumerate(dict.fromkeys(r[key] for r in pts)):
      series([r for r in pts if r[key] == name], "n_pert", name, colors[i])
    ax.set(xscale="log", yscale="log", xlabel="n_pert (directions)",
           ylabel="relative error E||g_hat - g||^2 / ||g||^2" if key == "grouping"
           else "relative centred variance")
    where = f"{res['weights']}, T = {res['seq_len']}, B = {res['batch']}"
    if study == "shared_vs_separate":
      ax.set_title(f"N = 4, {res['probe']} probes: one summed / separate = "
                   f"{res['ratio_separate_vs_shared']:.2f}x (predicted "
                   f"{res['predicted_ratio_by_grouping']['one_sum']:.2f}x)\n{where}", fontsize=8)
    else:
      ax.set_title(f"dense slope {res['slope_loglog']:.3f}, sparse "
                   f"{res['slope_loglog_sparse']:.3f} (predicted -1)\n{where}", fontsize=8)
  elif study == "experts":
    series(pts, "n", "N experts", colors[0])
    ax.set(xscale="log", yscale="log", xlabel="N experts (fixed total parameters)",
           ylabel="relative centred variance", title=_experts_title(res))
  elif study == "batch":
    series([r for r in pts if r["series"] == "tradeoff"], "batch",
           f"n_pert B = {res['budget']}", colors[0])
    ax.axvline(res["b_star"], color="gray", ls=":", label=f"B* = {res['b_star']:.1f}")
    ax.set(xscale="log", yscale="log", xlabel="B (batch) at fixed n_pert B",
           ylabel="E||g_hat - g||^2 / ||g||^2", title=f"nu = {res['nu']:.3g}")
    inset = ax.inset_axes([0.62, 0.58, 0.35, 0.35])
    for i, s in enumerate(("accumulate", "large_batch")):
      rows = [r for r in pts if r["series"] == s]
      inset.errorbar([r["accum"] for r in rows], [r["measured"] for r in rows],
                     yerr=[r["se"] for r in rows], fmt="o-", color=colors[i + 1], label=s)
      inset.plot([r["accum"] for r in rows], [r["predicted"] for r in rows], "--",
                 color=colors[i + 1])
    inset.set(xscale="log", yscale="log", xlabel="A", ylabel="error")
    inset.legend(fontsize=6)
  else:
    for i, alloc in enumerate(("n_pert", "B", "N")):
      rows = sorted((r for r in pts if r["allocation"] == alloc),
                    key=lambda r: r["seconds_per_step"])
      series(rows, "seconds_per_step", f"{alloc} allocation", colors[i])
    ax.set(xscale="log", yscale="log", xlabel="seconds per global step (jitted train_step)",
           ylabel="R = E||g_hat - g_ref||^2 / ||g_ref||^2",
           title=f"error against backprop on {res['ref_batch']} disjoint windows per expert, "
                 f"{res['probe']} probes\n{res['weights']}, T = {res['seq_len']}")
  ax.title.set_fontsize(8)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_outputs(res: dict, out: str) -> dict:
  """OUT/STUDY.json (everything), OUT/STUDY.csv (one row per point), OUT/STUDY.png."""
  os.makedirs(out, exist_ok=True)
  base = os.path.join(out, res["study"])
  with open(base + ".json", "w") as f:
    json.dump(res, f, indent=1, default=float)
  keys = list(dict.fromkeys(k for r in res["points"] for k in r))
  with open(base + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, keys)
    w.writeheader()
    w.writerows(res["points"])
  _plot(res, base + ".png")
  return {ext: base + ext for ext in (".json", ".csv", ".png")}


def main(argv):
  del argv
  import jax  # after soma_jax (cli.run): a bad JAX_NUM_CPU_DEVICES is refused in one line

  out = cli.workdir_flag(_OUT.value, "--out")
  if _X64.value:
    jax.config.update("jax_enable_x64", True)
  c = _CONFIG.value
  cli.absolute_paths(c)
  logging.info("devices %s, process %d, x64=%s", jax.devices(), jax.process_index(), _X64.value)
  vs, params = _weights(variance_settings.variance_spec(c))
  res = variance.run_study(vs, params)
  paths = write_outputs(res, out)
  logging.info("%s done in %.1fs: %s", vs.study, res["seconds"], ", ".join(paths.values()))


if __name__ == "__main__":
  cli.run(main)
