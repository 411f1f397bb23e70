"""Independent losses against their sum (the paper's Figure 4; SPEC 8).

As in the paper, SOMA with N experts starts from a trained seed (SPEC 3.4: every expert
copies the seed's body, the seed's E is frozen and shared): `train.init_from` names a seed
workdir, or the seed run `seed_run` is trained first into OUT/seed. From that state each seed
trains twice with the same batches and the same directions: once as SOMA does, each expert's
estimate from its own loss (`spsa.train_step`), once from the sum of all N losses
(`summed_train_step`, the shared-loss estimator `spsa.estimate(..., loss_groups=[0] * N)`).
Both run with x64 enabled, so the summed loss's difference is formed in float64
(`spsa._group_diff`; weights and forward passes stay float32), as the paper subtracts in FP64.
The routed test loss is taken at checkpoints; the paired difference (summed minus
independent) is reported per seed and as mean and standard deviation across seeds.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from soma_jax import checkpoint as ckpt_lib
from soma_jax import evaluate as eval_lib
from soma_jax import methods, runs, spsa
from soma_jax import train as train_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.methods import soma
from soma_jax.studies import report

PyTree = jax.typing.ArrayLike
VARIANTS = ("independent", "summed")


def summed_train_step(state: spsa.TrainState, batch_NxAxBxT1: jax.Array, expert_ids_N: jax.Array,
                      cfg: spsa.StepConfig) -> tuple[spsa.TrainState, dict]:
  """`spsa.train_step` with every expert's estimate taken from the sum of all N losses."""
  n = batch_NxAxBxT1.shape[0]
  return spsa.train_step(state, batch_NxAxBxT1, expert_ids_N,
                         dataclasses.replace(cfg, loss_groups=(0,) * n))


# The old state's buffers are donated; each variant starts from its own copy.
_STEPS = {
    "independent": soma.train_step,
    "summed": jax.jit(summed_train_step, static_argnames="cfg", donate_argnames="state"),
}


def train_seed(config: ml_collections.ConfigDict, data_dir: str, out: str) -> str:
  """The seed run's workdir: `train.init_from`, or `seed_run` trained (or resumed) in OUT/seed."""
  if config.train.init_from:
    if not os.path.isdir(config.train.init_from):
      raise UserError(f"train.init_from={config.train.init_from!r} does not exist; fix: a seed "
                      "run's workdir, or '' to train the seed first")
    return config.train.init_from
  s = ml_collections.ConfigDict(config.seed_run.to_dict())
  if s.n_experts != 1:
    raise UserError(f"seed_run.n_experts={s.n_experts}; the seed is one expert (SPEC 3.4)")
  s.data.dir = data_dir
  workdir = os.path.join(out, "seed")
  t0 = time.perf_counter()
  train_lib.train_to_end(s, workdir, "the seed run")
  print(f"[independent_vs_summed] seed run: {s.steps} updates in {time.perf_counter() - t0:.0f} s "
        f"({workdir})", flush=True)
  return workdir


def train_variant(c: ml_collections.ConfigDict, variant: str, test: eval_lib.TestSet,
                  checkpoints: list[int]) -> tuple[list[dict], np.ndarray, float]:
  """Trains one variant from the seed; ([{step, test}], final per-window losses, seconds).

  Runs with x64 enabled: the summed loss's difference is formed in float64 (float32 weights).
  """
  if not c.init_from:
    raise UserError("train.init_from is empty; fix: the seed run's workdir (SPEC 3.4)")
  with jax.enable_x64(True):
    cfg = methods.get(c).step_config(c)
    body_N, head = runs.initial_params(c)  # every expert copies the seed's body
    state = spsa.init_state(jax.tree.map(jnp.array, body_N), jnp.array(head), c.opt.lr, c.spsa.eps,
                            cfg)
    data = pipeline.train_iterator(c.data.dir, list(range(c.n_experts)), batch=c.spsa.batch,
                                   accum=c.spsa.accum, seq_len=c.data.seq_len, seed=c.seed)
    expert_ids = jnp.arange(c.n_experts, dtype=jnp.int32)
    step_fn = _STEPS[variant]
    curve, last = [], None
    t0 = time.perf_counter()
    for step in range(c.steps + 1):
      if step in checkpoints:
        last = test.losses(state.body, state.head, c.n_experts, c.model.shared_head)
        curve.append({"step": step, "test_nats_per_byte": float(last.mean())})
      if step < c.steps:
        state, _ = step_fn(state, jnp.asarray(next(data)), expert_ids, cfg=cfg)
    return curve, last, time.perf_counter() - t0


def run(config: ml_collections.ConfigDict, out: str) -> dict:
  """Every seed, both variants; writes results.json, curves.csv and figure4.png in `out`."""
  os.makedirs(out, exist_ok=True)
  c = ml_collections.ConfigDict(config.train.to_dict())
  if methods.get(c) is not soma.METHOD:
    raise UserError(f"train.method={c.method!r}; this experiment compares SOMA estimators")
  if config.num_seeds < 1:
    raise UserError(f"num_seeds={config.num_seeds} must be >= 1")
  c.data.dir = config.data_dir or _prepare(out, c.n_experts)
  methods.validate(c)
  pipeline.check_data_dir(c.data.dir, c.n_experts)
  if c.n_experts < 2:
    raise UserError("train.n_experts must be >= 2: one expert's loss is its own sum")
  c.init_from = train_seed(config, c.data.dir, out)
  every = max(1, min(config.eval_every, c.steps))
  checkpoints = sorted(set(range(0, c.steps, every)) | {c.steps})
  test = eval_lib.TestSet(c.data.dir, config.test_windows)
  seeds = list(range(config.seed, config.seed + config.num_seeds))
  per_seed = {}
  for seed in seeds:
    c.seed = seed
    curves, final = {}, {}
    for variant in VARIANTS:
      curves[variant], final[variant], secs = train_variant(c, variant, test, checkpoints)
      print(f"[independent_vs_summed] seed {seed} {variant}: {c.steps} updates in {secs:.0f} s, "
            f"test {curves[variant][-1]['test_nats_per_byte']:.4f} nats/byte", flush=True)
    diff_n = final["summed"] - final["independent"]
    lo, hi = eval_lib.bootstrap_ci(diff_n[:, None], test.doc_ids, config.bootstrap_draws, seed)
    per_seed[seed] = {**curves, "final_diff": float(diff_n.mean()),
                      "final_diff_ci95": [float(lo[0]), float(hi[0])]}
  paired = []
  for i, step in enumerate(checkpoints):
    d = np.array([per_seed[s]["summed"][i]["test_nats_per_byte"]
                  - per_seed[s]["independent"][i]["test_nats_per_byte"] for s in seeds])
    paired.append({"step": step, "diff_mean": float(d.mean()),
                   "diff_std": float(d.std(ddof=1)) if d.size > 1 else 0.0,
                   "per_seed": d.tolist()})
  payload = {
      "n_experts": c.n_experts, "d_t": c.model.d_t, "n_pert": c.spsa.n_pert,
      "batch": c.spsa.batch, "seq_len": c.data.seq_len, "steps": c.steps,
      "data_dir": _shown(c.data.dir, out), "init_from": _shown(c.init_from, out),
      "seed_run": _seed_summary(c.init_from), "lr": c.opt.lr, "eps": c.spsa.eps,
      "summed_difference_dtype": "float64", "seeds": seeds, "num_test_windows": int(test.windows.shape[0]),
      "difference": "summed - independent (test nats/byte; positive: independent is better)",
      "paired": paired, "runs": {str(s): r for s, r in per_seed.items()},
  }
  payload["summary"] = summarise(payload)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(payload, f, indent=1)
  _write_csv(payload, os.path.join(out, "curves.csv"))
  _plot(payload, os.path.join(out, "figure4.png"))
  return payload


def summarise(payload: dict) -> dict:
  """The final checkpoint's figures: difference mean and sd over seeds, wins, mean losses."""
  last, runs = payload["paired"][-1], list(payload["runs"].values())
  final = {v: [r[v][-1]["test_nats_per_byte"] for r in runs] for v in VARIANTS}
  return {"num_seeds": len(runs), "updates": last["step"], "diff_mean": last["diff_mean"],
          "diff_std": last["diff_std"],
          "seeds_independent_better": sum(d > 0 for d in last["per_seed"]),
          "start_test": runs[0]["independent"][0]["test_nats_per_byte"],
          **{f"{v}_final_mean": float(np.mean(final[v])) for v in VARIANTS}}


def _shown(path: str, out: str) -> str:
  """A path as results.json shows it: under the output folder as OUT/..., else as given."""
  rel = os.path.relpath(path, out)
  return path if rel.startswith("..") else os.path.join("OUT", rel)


def _seed_summary(workdir: str) -> dict:
  """The seed run's recipe, from its workdir's config."""
  s = ckpt_lib.read_config(workdir)
  return {"n_experts": s.n_experts, "d_t": s.model.d_t, "steps": s.steps, "lr": s.opt.lr,
          "eps": s.spsa.eps, "n_pert": s.spsa.n_pert, "batch": s.spsa.batch,
          "seq_len": s.data.seq_len, "train_head": s.opt.train_head}


def _prepare(out: str, n: int) -> str:
  data_dir = os.path.join(out, "data")
  if not os.path.isfile(os.path.join(data_dir, "manifest.json")):
    from soma_jax.data import prepare

    prepare.prepare("pystdlib", n, data_dir)
  return data_dir


def _write_csv(payload: dict, path: str) -> None:
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["seed", "step", "independent", "summed", "summed_minus_independent"])
    for seed, r in payload["runs"].items():
      for a, b in zip(r["independent"], r["summed"], strict=True):
        x, y = a["test_nats_per_byte"], b["test_nats_per_byte"]
        w.writerow([seed, a["step"], f"{x:.6f}", f"{y:.6f}", f"{y - x:.6f}"])


def _plot(payload: dict, path: str) -> None:
  plt = report.plt
  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8))
  for variant, color in zip(VARIANTS, ("C0", "C3"), strict=True):
    for i, r in enumerate(payload["runs"].values()):
      steps = [p["step"] for p in r[variant]]
      ax0.plot(steps, [p["test_nats_per_byte"] for p in r[variant]], color=color, alpha=0.7,
               label=f"{variant} losses" if i == 0 else None)
  ax0.set_xlabel("update")
  ax0.set_ylabel("routed test loss (nats/byte)")
  ax0.set_title(f"N = {payload['n_experts']}, {len(payload['seeds'])} seeds")
  ax0.legend()
  steps = np.array([p["step"] for p in payload["paired"]])
  mean = np.array([p["diff_mean"] for p in payload["paired"]])
  std = np.array([p["diff_std"] for p in payload["paired"]])
  ax1.fill_between(steps, mean - std, mean + std, alpha=0.25, label="+- 1 sd across seeds")
  ax1.plot(steps, mean, "o-", ms=3, label="mean")
  ax1.axhline(0.0, c="gray", lw=1)
  ax1.set_xlabel("update")
  ax1.set_ylabel("summed - independent (nats/byte)")
  ax1.legend()
  for ax in (ax0, ax1):
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
