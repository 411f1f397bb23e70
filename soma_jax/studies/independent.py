"""Independent losses against their sum (the paper's Figure 4, App. J; SPEC 9.3).

The paper continues experts 0-3 of a trained SOMA N = 8 (2,000 updates) with their weights
and Adam moments, heads frozen, lr and eps fixed at 1e-3, on one fixed training sample of
each shard, and trains each seed twice with the same batches and the same directions: once
as SOMA does, each expert's estimate from its own loss (`spsa.train_step`), once from the sum
of the four losses (`summed_train_step`, `spsa.estimate(..., loss_groups=[0] * 4)`). Both run
with x64 enabled, so the summed loss's difference is formed in float64 (`spsa._group_diff`;
weights and forward passes stay float32), as the paper subtracts in FP64.

Here `init_from` names a trained SOMA workdir with at least 4 experts (or, when empty, the
seed run and the N-expert ensemble of the SOMA recipe are trained first into OUT/seed and
OUT/ensemble). The routed test loss (the four experts' uniform mixture: top-min(4, N) of
N = 4 picks all four) is scored at 0, 1/4, 1/2 and all of the continuation. Reported: summed
minus independent per seed, their mean and sample sd, the fraction of test documents on
which independent is lower, and the shared-vs-separate gradient variance
(`variance.study_shared_vs_separate`) at the common start and at every end state.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import itertools
import os
import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from soma_jax import evaluate as eval_lib
from soma_jax import runs, train_state
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.loop import Loop
from soma_jax.methods import Method
from soma_jax.studies import datasets, report, results, variance, variance_settings
from soma_jax.studies.independent_data import FixedSample, doc_means, test_losses

VARIANTS = ("independent", "summed")
NUM_EXPERTS = 4  # the paper's Figure 4 ensemble; the variance study's groupings are of four


# Each variant is a registered method (the old state's buffers are donated; each variant
# starts from its own copy): SOMA's own losses, and the summed-loss control.
VARIANT_METHODS = {"independent": "soma", "summed": "soma_summed"}


# ------------------------------------------------------------------------- the start


def parse_experts(spec: str) -> tuple[int, ...]:
  """'0,1,2,3' -> (0, 1, 2, 3): four distinct expert ids of the trained ensemble."""
  try:
    ids = tuple(int(x) for x in str(spec).split(","))
  except ValueError:
    raise UserError(f"experts={spec!r} is not a comma list of expert ids; fix: e.g. "
                    "--config.experts=0,1,2,3") from None
  if len(ids) != NUM_EXPERTS or len(set(ids)) != NUM_EXPERTS or min(ids) < 0:
    raise UserError(f"experts={spec!r}: Figure 4 continues {NUM_EXPERTS} distinct experts; "
                    "fix: e.g. --config.experts=0,1,2,3")
  return ids


@dataclasses.dataclass(frozen=True)
class Settings:
  """The study's fields, checked once (`check`). `seed_run` and `ensemble_run` stay configs:
  the training runs they are built into; `variance` is the variance study's settings."""
  experts: tuple[int, ...]
  steps: int
  lr: float
  eps: float
  seeds: tuple[int, ...]
  n_pert: int
  batch: int
  probe: str
  pert_chunk: object
  seq_len: int
  sample_windows: int
  sample_seed: int
  test_windows: int
  bootstrap_draws: int
  data_dir: str
  init_from: str
  seed_run: ml_collections.ConfigDict
  ensemble_run: ml_collections.ConfigDict
  variance: variance_settings.VarianceSpec  # on the continued experts' data: `_variance_spec`


def check(config: ml_collections.ConfigDict) -> Settings:
  """The study config's fields, checked and typed once: the study's one door (`run` and
  everything below it hold the Settings)."""
  if config.num_seeds < 1:
    raise UserError(f"num_seeds={config.num_seeds} must be >= 1")
  if config.steps < 1 or config.lr <= 0 or config.eps <= 0:
    raise UserError("steps must be >= 1 and lr, eps > 0")
  sp = config.spsa
  return Settings(
      parse_experts(config.experts), config.steps, config.lr, config.eps,
      tuple(range(config.seed, config.seed + config.num_seeds)), sp.n_pert, sp.batch, sp.probe,
      sp.pert_chunk, config.seq_len, config.sample_windows, config.sample_seed,
      config.test_windows, config.bootstrap_draws, config.data_dir, config.init_from,
      *(ml_collections.ConfigDict(config[k].to_dict()) for k in ("seed_run", "ensemble_run")),
      variance_settings.variance_spec(ml_collections.ConfigDict(config.variance.to_dict())))


def ensemble_workdir(st: Settings, out: str) -> str:
  """`init_from`, or the SOMA recipe trained (or resumed) into OUT/seed then OUT/ensemble."""
  if st.init_from:
    if not os.path.isdir(st.init_from):
      raise UserError(f"init_from={st.init_from!r} does not exist; fix: a trained SOMA "
                      "workdir with >= 4 experts, or '' to train one first")
    return st.init_from
  s, e = (ml_collections.ConfigDict(x.to_dict()) for x in (st.seed_run, st.ensemble_run))
  if s.n_experts != 1:
    raise UserError(f"seed_run.n_experts={s.n_experts}; the seed is one expert (SPEC 3.4)")
  data_dir = datasets.ensure_data(st.data_dir, out, e.n_experts)
  seed_dir, ens_dir = os.path.join(out, "seed"), os.path.join(out, "ensemble")
  s.data.dir = e.data.dir = data_dir
  e.init_from = seed_dir
  for run, workdir, what in ((s, seed_dir, "the seed run"), (e, ens_dir, "the ensemble run")):
    t0 = time.perf_counter()
    train_lib.train_to_end(spec_lib.resolve(run), workdir, what)
    print(f"[independent_vs_summed] {what}: N = {run.n_experts}, {run.steps} updates in "
          f"{time.perf_counter() - t0:.0f} s ({workdir})", flush=True)
  return ens_dir


def continuation_start(workdir: str, ids: tuple[int, ...], lr: float, eps: float
                       ) -> tuple[int, train_state.TrainState, spec_lib.RunSpec]:
  """(checkpoint step, state, the run's spec): experts `ids` of the newest checkpoint.

  Bodies and Adam moments (mu, nu and count) are the checkpoint's own arrays; heads are
  kept and frozen (no head optimizer); lr and eps are set to the fixed values.
  """
  run = runs.read_spec(workdir)
  if run.method.name != VARIANT_METHODS["independent"]:
    raise UserError(f"{workdir!r} is a method={run.method.name!r} run; fix: a SOMA workdir")
  if run.n_experts < NUM_EXPERTS:
    raise UserError(f"{workdir!r} has {run.n_experts} experts; Figure 4 continues "
                    f"{NUM_EXPERTS} of a trained SOMA N >= {NUM_EXPERTS}; fix: train one with "
                    "more experts, or --config.init_from='' to train it first")
  if len(run.experts) != run.n_experts:
    raise UserError(f"{workdir!r} holds the slice experts={run.config.experts}; fix: merge the "
                    "slices first (experiments/merge.py)")
  if max(ids) >= run.n_experts:
    raise UserError(f"experts={','.join(map(str, ids))} but {workdir!r} has experts 0.."
                    f"{run.n_experts - 1}; fix: choose ids among them")
  step, state, _, _ = runs.restore_state(workdir)
  idx = np.asarray(ids)
  take = lambda tree: jax.tree.map(lambda x: x[idx], tree)  # noqa: E731
  n = len(ids)
  state = train_state.TrainState(
      step=state.step, body=take(state.body),
      head=state.head if run.shared_head else state.head[idx], opt=take(state.opt),
      head_opt=(), sched=train_state.plateau_init(jnp.full((n,), lr, jnp.float32),
                                           jnp.full((n,), eps, jnp.float32)),
      skipped=jnp.zeros((n,), jnp.int32))
  return int(step), state, run


def variant_spec(st: Settings, run: spec_lib.RunSpec, seed: int,
                 variant: str = "independent") -> spec_lib.RunSpec:
  """The continuation of `variant`: the run's model and weight decay, the study's
  directions (the summed variant's losses grouped into one), resolved; its method's
  step config and train step are what the continuation runs."""
  d = run.config.to_dict()
  d.update(method=VARIANT_METHODS[variant], n_experts=NUM_EXPERTS, experts="", seed=seed)
  d["spsa"].update(n_pert=st.n_pert, batch=st.batch, accum=1, probe=st.probe,
                   pert_chunk=st.pert_chunk)
  d["data"]["seq_len"] = st.seq_len
  d["opt"]["train_head"] = False  # heads frozen
  return spec_lib.resolve(ml_collections.ConfigDict(d))


# --------------------------------------------------------------------------- training


def train_variant(start: train_state.TrainState, method: Method, ids: jax.Array,
                  batches: Iterator[np.ndarray], steps: int, checkpoints: list[int],
                  score) -> tuple[list[dict], np.ndarray, train_state.TrainState, float]:
  """One variant (its `Method`) from its own copy of `start`, through the training loop
  (`loop.Loop`): ([{step, test}], final per-window test losses, end state, seconds). Run
  under x64: the summed difference is formed in float64."""
  step_fn = functools.partial(method.train_step, cfg=method.step_config())
  loop = Loop(jax.tree.map(jnp.array, start), step_fn, batches, ids)  # a copy: it is donated
  curve, last = [], None
  t0 = time.perf_counter()
  for done, _ in itertools.chain([(0, None)], loop.run(0, steps)):
    if done in checkpoints:
      last = score(loop.state)
      curve.append({"step": done, "test_nats_per_byte": float(last.mean())})
  return curve, last, loop.state, time.perf_counter() - t0


def variance_at(vs: variance_settings.VarianceSpec, state: train_state.TrainState) -> dict:
  """The shared-vs-separate study on `state`'s four experts, each on its own shard's
  expert-validation windows (`vs.expert_shards`); the study's ratios, its points, and
  its probe and data record."""
  res = variance.run_study(vs, (state.body, state.head))
  print(f"[independent_vs_summed] shared-vs-separate variance: "
        f"{res['ratio_separate_vs_shared']:.2f}x in {res['seconds']:.0f} s", flush=True)
  keys = ("ratio_separate_vs_shared", "ratio_separate_vs_shared_se", "ratio_by_grouping",
          "predicted_ratio_by_grouping", "ratio_at_n_pert", "probe", "d_per_expert", "points",
          "grad_norm_sq", "seconds", "replay")
  return {k: res[k] for k in keys if k in res}


def _checkpoints(steps: int) -> list[int]:
  """0, 1/4, 1/2 and all of the continuation (the paper: 0, 250, 500, 1,000)."""
  return sorted({0, steps // 4, steps // 2, steps})


def _seed_result(curves: dict, final: dict, doc_ids: np.ndarray, draws: int, seed: int) -> dict:
  diff_n = final["summed"] - final["independent"]
  lo, hi = eval_lib.bootstrap_ci(diff_n[:, None], doc_ids, draws, seed)
  docs = doc_means(diff_n, doc_ids)
  return {**curves, "final_diff": float(diff_n.mean()),
          "final_diff_ci95": [float(lo[0]), float(hi[0])],
          "docs_independent_lower": int(np.sum(docs > 0)), "num_docs": int(docs.size)}


def run(st: Settings, out: str) -> dict:
  """Every seed, both variants, the variance at every state of the checked settings `st`
  (`check`); writes results.json, curves.csv and figure4.png in `out`."""
  os.makedirs(out, exist_ok=True)
  ids = st.experts
  workdir = ensemble_workdir(st, out)
  ckpt_step, start, run = continuation_start(workdir, ids, st.lr, st.eps)
  data_dir = st.data_dir or run.data_dir
  pipeline.check_data_dir(data_dir, run.n_experts)
  sample = FixedSample(data_dir, ids, st.sample_windows, st.seq_len, st.sample_seed)
  windows, doc_ids = pipeline.eval_split(data_dir, "test")
  if st.test_windows:
    windows, doc_ids = windows[:st.test_windows], doc_ids[:st.test_windows]
  shared = bool(run.shared_head)
  score = lambda s: test_losses(s.body, s.head, windows, shared)  # noqa: E731
  vs = _variance_spec(st.variance, data_dir, ids)
  checkpoints, seeds = _checkpoints(st.steps), list(st.seeds)
  per_seed, variances = {}, {}
  expert_ids = jnp.asarray(ids, jnp.int32)
  with jax.enable_x64(True):
    variances["start"] = variance_at(vs, start)
    for seed in seeds:
      curves, final = {}, {}
      for variant in VARIANTS:
        method = variant_spec(st, run, seed, variant).method
        curves[variant], final[variant], end, secs = train_variant(
            start, method, expert_ids, sample.batches(seed, st.batch),
            st.steps, checkpoints, score)
        variances[f"seed{seed}/{variant}"] = variance_at(vs, end)
        print(f"[independent_vs_summed] seed {seed} {variant}: {st.steps} updates in "
              f"{secs:.0f} s, test {curves[variant][-1]['test_nats_per_byte']:.4f} nats/byte",
              flush=True)
      per_seed[seed] = _seed_result(curves, final, doc_ids, st.bootstrap_draws, seed)
  payload = _payload(st, out, workdir, ckpt_step, run, data_dir, seeds, checkpoints,
                     per_seed, variances, windows.shape[0], vs)
  results.dump_json(os.path.join(out, "results.json"), payload)
  _write_csv(payload, os.path.join(out, "curves.csv"))
  _plot(payload, os.path.join(out, "figure4.png"))
  return payload


def _variance_spec(vs: variance_settings.VarianceSpec, data_dir: str, ids
                   ) -> variance_settings.VarianceSpec:
  """The variance study's settings: `variance` on this data, over the continued experts."""
  return variance_settings.with_changes(vs, study="shared_vs_separate", data_dir=data_dir,
                                        expert_shards=",".join(map(str, ids)))


def _paired(per_seed: dict, seeds: list[int], checkpoints: list[int]) -> list[dict]:
  paired = []
  for i, step in enumerate(checkpoints):
    d = np.array([per_seed[s]["summed"][i]["test_nats_per_byte"]
                  - per_seed[s]["independent"][i]["test_nats_per_byte"] for s in seeds])
    paired.append({"step": step, "diff_mean": float(d.mean()),
                   "diff_std": float(d.std(ddof=1)) if d.size > 1 else 0.0,
                   "per_seed": d.tolist()})
  return paired


def _payload(st: Settings, out, workdir, ckpt_step, run, data_dir, seeds, checkpoints, per_seed,
             variances, num_windows, vs: variance_settings.VarianceSpec) -> dict:
  payload = {
      "init_from": _shown(workdir, out), "init_step": ckpt_step,
      "ensemble_run": _run_summary(run), "experts": list(st.experts),
      "seed_run": (_run_summary(runs.read_spec(run.init_from))
                   if run.init_from and os.path.isdir(run.init_from) else None),
      "n_experts": NUM_EXPERTS, "d_t": run.config.model.d_t, "shared_head": run.shared_head,
      "n_pert": st.n_pert, "batch": st.batch, "probe": st.probe,
      "seq_len": st.seq_len, "steps": st.steps, "lr": st.lr, "eps": st.eps,
      "sample_windows_per_shard": st.sample_windows, "sample_seed": st.sample_seed,
      "data_dir": _shown(data_dir, out), "summed_difference_dtype": "float64",
      "adam_moments": "restored from the checkpoint (mu, nu, count)", "heads": "frozen",
      "seeds": seeds, "num_test_windows": int(num_windows),
      "scoring": "uniform mixture of the four experts (top-4 of N = 4)",
      "difference": "summed - independent (test nats/byte; positive: independent is better)",
      "paired": _paired(per_seed, seeds, checkpoints),
      "runs": {str(s): r for s, r in per_seed.items()},
      "variance": {"config": vs.config.to_dict(), "states": variances},
  }
  payload["summary"] = summarise(payload)
  return payload


def summarise(payload: dict) -> dict:
  """The final checkpoint's figures: per-seed reductions, their mean and sd, documents on
  which independent is lower, mean losses, the variance ratios at the start and the ends."""
  last, runs = payload["paired"][-1], list(payload["runs"].values())
  final = {v: [r[v][-1]["test_nats_per_byte"] for r in runs] for v in VARIANTS}
  states = payload.get("variance", {}).get("states", {})
  return {"num_seeds": len(runs), "updates": last["step"], "diff_per_seed": last["per_seed"],
          "diff_mean": last["diff_mean"], "diff_std": last["diff_std"],
          "seeds_independent_better": sum(d > 0 for d in last["per_seed"]),
          "docs_independent_lower": [r["docs_independent_lower"] for r in runs],
          "docs_fraction_independent_lower": [r["docs_independent_lower"] / r["num_docs"]
                                              for r in runs],
          "start_test": runs[0]["independent"][0]["test_nats_per_byte"],
          **{f"{v}_final_mean": float(np.mean(final[v])) for v in VARIANTS},
          "variance_ratio_separate_vs_shared": {k: s["ratio_separate_vs_shared"]
                                                for k, s in states.items()}}


def _shown(path: str, out: str) -> str:
  """A path as results.json shows it: under the output folder as OUT/..., else as given."""
  rel = os.path.relpath(path, out)
  return path if rel.startswith("..") else os.path.join("OUT", rel)


def _run_summary(run: spec_lib.RunSpec) -> dict:
  """A training run's recipe, from its resolved spec (its width and directions as its
  config.json records them)."""
  return {"n_experts": run.n_experts, "d_t": run.config.model.d_t, "steps": run.cadence.steps,
          "lr": run.lr, "eps": run.eps, "n_pert": run.config.spsa.n_pert, "batch": run.batch,
          "seq_len": run.seq_len, "train_head": run.train_head, "shared_head": run.shared_head}


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
      ax0.plot(steps, [p["test_nats_per_byte"] for p in r[variant]], "o-", ms=3, color=color,
               alpha=0.7, label=f"{variant} losses" if i == 0 else None)
  ax0.set_xlabel(f"update of the continuation (from step {payload['init_step']})")
  ax0.set_ylabel("test loss, 4-expert mixture (nats/byte)")
  ax0.set_title(f"experts {payload['experts']}, {len(payload['seeds'])} seeds")
  ax0.legend()
  steps = np.array([p["step"] for p in payload["paired"]])
  mean = np.array([p["diff_mean"] for p in payload["paired"]])
  std = np.array([p["diff_std"] for p in payload["paired"]])
  ax1.fill_between(steps, mean - std, mean + std, alpha=0.25, label="+- 1 sd across seeds")
  ax1.plot(steps, mean, "o-", ms=3, label="mean")
  ax1.axhline(0.0, c="gray", lw=1)
  ax1.set_xlabel("update of the continuation")
  ax1.set_ylabel("summed - independent (nats/byte)")
  ax1.legend()
  for ax in (ax0, ax1):
    ax.grid(alpha=0.3)
  report.save_figure(fig, path)
