"""What the two comparisons here share (SPEC 9.1, 9.2): warm starts, the time budget, scoring.

- Warm starts: every architecture starts from a seed run of its own (an N = 1 run at the
  SOMA expert's width for SOMA, one at the monolith's width for the monoliths, one GRU for
  EGGROLL). The seeds get one equal time budget; their cost is reported apart and counted
  for no row (as SPEC 9.1 does for the monoliths' seeds). Every optimisation seed of a row
  starts from the same seed checkpoint, so from bit-identical parameters; the optimisation
  seed changes only the batches and the directions (SPEC 9.2). Where the paper differs: its
  Table 7 starts from each architecture's step-1 checkpoint with its optimizer state, while
  `init_from` copies parameters only (Adam's moments start at zero here).
- The budget is training device-seconds (`train.budget_seconds`, charged as
  `host_devices.CHARGE_RULE`: core-seconds on a CPU; compilation, evaluation and checkpoint
  saves excluded). A run stops after the complete update that reaches it, with a checkpoint
  after each 1/k of it.
- Scoring: the routed top-min(4, N) mixture on an evaluation split cut into pieces of
  route + score + 1 bytes (`evaluate.cut_windows`), so every scored target lies inside
  the trained context; the paper scores whole 1,025-byte windows (route 256, score 768).
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
import numpy as np

from soma_jax import checkpoint as ckpt_lib
from soma_jax import evaluate as eval_lib
from soma_jax import host_devices, methods, runs
from soma_jax import train as train_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError

MAX_UPDATES = 10_000_000  # the step cap of a budgeted run: its time budget ends it first


def total_params(c: ml_collections.ConfigDict) -> int:
  """Parameters of a config's N experts and their heads."""
  return methods.get(c).ensemble_params(c)


def ops_per_update(c: ml_collections.ConfigDict) -> int:
  """Training operations of one update of all N experts (SPEC 7)."""
  return methods.get(c).ops_per_update(c) * c.n_experts


def optimisation_seeds(config: ml_collections.ConfigDict) -> list[int]:
  """first_seed, first_seed + 1, ... (config.seeds of them)."""
  if config.seeds < 1:
    raise UserError(f"seeds={config.seeds} must be >= 1 (optimisation seeds per method)")
  return list(range(config.first_seed, config.first_seed + config.seeds))


def ensure_data(config: ml_collections.ConfigDict, out: str, n_experts: int) -> str:
  """config.data_dir, or the built-in pystdlib corpus prepared under OUT/data."""
  if config.data_dir:
    pipeline.check_data_dir(config.data_dir, n_experts)
    return config.data_dir
  data_dir = os.path.join(out, "data")
  if not os.path.isfile(os.path.join(data_dir, "manifest.json")):
    from soma_jax.data import prepare

    prepare.prepare("pystdlib", n_experts, data_dir)
  return data_dir


def eval_sets(config: ml_collections.ConfigDict, data_dir: str, seq_lens: list[int]):
  """(ensemble-validation set, test set) on the configured route / score span."""
  route, score = config.eval.route_bytes, config.eval.score_bytes
  if route + score > min(seq_lens):
    raise UserError(f"eval.route_bytes + eval.score_bytes = {route + score} exceeds the "
                    f"trained context T = {min(seq_lens)}: scored targets must lie inside it; "
                    f"fix: route + score <= {min(seq_lens)} (e.g. 64 + 192 at T = 256)")
  if 1024 % (route + score):
    raise UserError(f"eval.route_bytes + eval.score_bytes = {route + score} must divide 1024")
  val = eval_lib.TestSet(data_dir, config.eval.val_windows, "ensemble_val", route, score)
  test = eval_lib.TestSet(data_dir, config.eval.test_windows, "test", route, score)
  return val, test


def describe_span(val: eval_lib.TestSet, test: eval_lib.TestSet) -> dict:
  return {"route_bytes": test.route, "score_bytes": test.score,
          "window_bytes": test.route + test.score + 1,
          "windows_per_1025_byte_window": 1024 // (test.route + test.score),
          "val_windows": int(val.windows.shape[0]), "test_windows": int(test.windows.shape[0]),
          "test_documents": int(np.unique(test.doc_ids).size)}


# ----------------------------------------------------------------------------- runs


def budgeted(c: ml_collections.ConfigDict, data_dir: str, seed: int, init_from: str,
             seconds: float, checkpoints: int) -> ml_collections.ConfigDict:
  """A copy of training config `c` that runs until `seconds` of training device time."""
  c = ml_collections.ConfigDict(c.to_dict())
  c.data.dir, c.seed, c.init_from = data_dir, seed, init_from
  c.budget_seconds, c.budget_checkpoints = float(seconds), checkpoints
  c.steps = MAX_UPDATES
  c.ckpt_every = MAX_UPDATES  # the budget's checkpoints are the curve
  c.ckpt.keep = checkpoints + 1
  c.ensemble_eval_every = -1  # the study scores checkpoints itself, on its own span
  return c


def check_existing(workdir: str, c: ml_collections.ConfigDict) -> None:
  """A study run found in `workdir` continues only under the same experiment: speed knobs
  may differ, anything else (budget, size, data) is a UserError."""
  if not os.path.isfile(os.path.join(workdir, ckpt_lib.CONFIG_FILE)):
    return
  changes = ckpt_lib.config_changes(ckpt_lib.read_config(workdir), c)
  if any(not ckpt_lib.under(k, ckpt_lib.SPEED_KEYS) for k in changes):
    raise UserError(f"{workdir!r} holds a run with a different config (budget, size or data: "
                    f"{', '.join(changes)}); fix: choose a new --out or delete that folder")


def train(c: ml_collections.ConfigDict, workdir: str, what: str) -> float:
  """Trains (or resumes) one run to its end; the wall seconds of this call."""
  check_existing(workdir, c)
  t0 = time.perf_counter()
  train_lib.train_to_end(c, workdir, what)
  return time.perf_counter() - t0


def checkpoints(workdir: str) -> list[int]:
  ckpt = ckpt_lib.Checkpointer(workdir)
  try:
    return sorted(ckpt.steps())
  finally:
    ckpt.close()


def curve(workdir: str, c: ml_collections.ConfigDict, scorer: eval_lib.TestSet,
          steps: list[int] | None = None) -> tuple[list[dict], np.ndarray]:
  """The start (update 0: the warm start) and each checkpoint scored by `scorer`:
  ([{step, ops, device_seconds, loss}], per-window losses of the last point)."""
  logits = methods.get(c).logits
  body, head = runs.initial_params(c)
  last = scorer.losses(body, head, c.n_experts, c.model.shared_head, logits)
  points = [{"step": 0, "ops": 0, "device_seconds": 0.0, "loss": float(last.mean())}]
  for s in checkpoints(workdir) if steps is None else steps:
    _, state, data_state, _ = runs.restore_state(workdir, step=s)
    last = scorer.losses(state.body, state.head, c.n_experts, c.model.shared_head, logits)
    points.append({"step": s, "ops": int(data_state.get("ops", 0)),
                   "device_seconds": float(data_state.get("device_seconds", 0.0)),
                   "loss": float(last.mean())})
  return points, last


def final_losses(workdir: str, c: ml_collections.ConfigDict, scorer: eval_lib.TestSet
                 ) -> np.ndarray:
  """Per-window losses of a run's newest checkpoint (scored once)."""
  body, head, _ = runs.restore_params(workdir)
  return scorer.losses(body, head, c.n_experts, c.model.shared_head, methods.get(c).logits)


def summary(workdir: str) -> dict:
  """Updates and cumulative training seconds of a finished run (its newest checkpoint), and
  with a time budget the seconds counted one update before the stop (below the budget)."""
  step, _, data_state, _ = runs.restore_state(workdir)
  with open(os.path.join(workdir, "summary.json")) as f:
    before = json.load(f).get("budget_seconds_before_last_update")
  return {"updates": int(step), "ops": int(data_state.get("ops", 0)),
          **{k: float(data_state.get(k, 0.0)) for k in train_lib.TIMERS},
          "device_seconds_before_last_update": before}


def shown(path: str, out: str) -> str:
  """A path as results.json shows it: relative to the output folder when inside it."""
  rel = os.path.relpath(path, out)
  return path if rel.startswith("..") else rel


# ----------------------------------------------------------------------------- seeds


def model_kind(c: ml_collections.ConfigDict) -> str:
  """"lstm" or "gru": the model family of a config's method (its `describe`)."""
  return methods.get(c).describe(c)["model"]


def seed_configs(config: ml_collections.ConfigDict, cfgs: dict[str, ml_collections.ConfigDict]
                 ) -> dict[str, ml_collections.ConfigDict]:
  """Each seed run's config: its recipe (config.seed_runs) at the model of the methods
  that start from it (config.start); those methods must share one model."""
  out = {}
  for name, seed_c in config.seed_runs.items():
    users = [m for m in cfgs if config.start[m] == name]
    if not users:
      continue
    models = {(cfgs[m].model.d_t, cfgs[m].model.d_e, cfgs[m].model.depth, model_kind(cfgs[m]))
              for m in users}
    if len(models) > 1:
      raise UserError(f"methods {', '.join(users)} start from seed {name!r} but differ in "
                      "model size; fix: give each size its own seed run in config.start")
    s = ml_collections.ConfigDict(seed_c.to_dict())
    ref = cfgs[users[0]]
    s.model.update(d_t=ref.model.d_t, d_e=ref.model.d_e, depth=ref.model.depth)
    if model_kind(s) != model_kind(ref):
      raise UserError(f"seed {name!r} is method={s.method} but {users[0]} is method="
                      f"{ref.method}: a GRU seeds a GRU, an LSTM an LSTM")
    if s.n_experts != 1:
      raise UserError(f"seed_runs.{name}.n_experts={s.n_experts}; a seed is one model (SPEC 3.4)")
    out[name] = s
  for m in cfgs:
    if config.start.get(m) not in out:
      raise UserError(f"start.{m}={config.start.get(m)!r} is not a seed run; have "
                      f"{', '.join(config.seed_runs.keys())}")
  return out


def train_seeds(config: ml_collections.ConfigDict, cfgs: dict[str, ml_collections.ConfigDict],
                data_dir: str, out: str, val: eval_lib.TestSet) -> dict[str, dict]:
  """Trains every seed run to the seed budget in OUT/seeds/NAME; their cost, apart, and
  their final loss on the study's ensemble-validation set `val`."""
  records = {}
  for name, s in seed_configs(config, cfgs).items():
    workdir = os.path.join(out, "seeds", name)
    c = budgeted(s, data_dir, config.seed_run_seed, "", config.seed_budget_seconds, 1)
    print(f"[compare] seed run {name}: {s.method} d_t={s.model.d_t} until "
          f"{config.seed_budget_seconds:g} training device-seconds", flush=True)
    wall = train(c, workdir, f"seed run {name}")
    records[name] = {"workdir": shown(workdir, out), "method": s.method, "d_t": s.model.d_t,
                     "depth": s.model.depth, "lr": s.opt.lr, "eps": s.spsa.eps,
                     "n_pert": s.spsa.n_pert, "batch": s.spsa.batch, "seq_len": s.data.seq_len,
                     "budget_seconds": config.seed_budget_seconds, **summary(workdir),
                     "ensemble_val_nats_per_byte": float(final_losses(workdir, c, val).mean()),
                     "wall_seconds_this_call": wall, "_path": workdir}
  return records


def start_of(seed_record: dict) -> str:
  """The `start` field of a run: the seed checkpoint it began from."""
  return f"{seed_record['workdir']}@{seed_record['updates']}"


# ----------------------------------------------------------------------------- results


def results(study: str, spec: str, config: ml_collections.ConfigDict, command: str, t0: float,
            per: str, budget: dict, scored: tuple[eval_lib.TestSet, eval_lib.TestSet],
            data_dir: str, out: str, seeds: dict[str, dict], **rest) -> dict:
  """The results.json fields both studies write, then the study's own (`rest`).

  One budget is `per` a row, a configuration...; `budget` adds the study's own budget
  fields; `scored` = (validation, test) sets; `seeds` the records of `train_seeds`.
  """
  val, test = scored
  return {
      "study": study, "spec": spec, "command": command,
      "wall_seconds": time.perf_counter() - t0, "load_average": list(os.getloadavg()),
      "platform": jax.devices()[0].platform,
      "budget": {"counts": f"training device-seconds per {per} ({host_devices.CHARGE_RULE}; "
                           "compilation, evaluation and checkpoints excluded)",
                 "seconds": config.budget_seconds, **budget},
      "eval": describe_span(val, test),
      "unigram_test_nats_per_byte": eval_lib.unigram_nats(data_dir, "test", test.route, test.score),
      "data_dir": shown(data_dir, out), "seeds": optimisation_seeds(config),
      "bootstrap_draws": config.bootstrap_draws, "reference": config.reference,
      "seed_runs": {k: {f: v for f, v in r.items() if f != "_path"} for k, r in seeds.items()},
      **rest,
  }


def write(out: str, payload: dict, table) -> dict:
  """OUT/results.json (the payload) and OUT/table.md (`table(payload)`); the payload."""
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(payload, f, indent=1)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table(payload))
  return payload


# ----------------------------------------------------------------------------- statistics


def paired(ref_n: np.ndarray, other_n: np.ndarray, doc_ids: np.ndarray, draws: int,
           seed: int) -> dict:
  """other minus ref: mean per-window difference and its paired document-bootstrap 95% CI."""
  diff = np.asarray(other_n, np.float64) - np.asarray(ref_n, np.float64)
  lo, hi = eval_lib.bootstrap_ci(diff[:, None], doc_ids, draws, seed)
  return {"diff": float(diff.mean()), "ci95": [float(lo[0]), float(hi[0])]}


def across_seeds(values: list[float]) -> dict:
  """Mean and sample sd (None for one seed)."""
  x = np.asarray(values, np.float64)
  return {"mean": float(x.mean()), "sd": float(x.std(ddof=1)) if x.size > 1 else None}


def pm(stat: dict, signed: bool = False, digits: int = 3) -> str:
  f = f"+.{digits}f" if signed else f".{digits}f"
  return f"{stat['mean']:{f}}" + ("" if stat["sd"] is None else f" ± {stat['sd']:.{digits}f}")


def sized(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Each method's training config, its width set so its total parameters match the
  reference method's (config.match_params); the reference first."""
  names = list(config.order) or list(config.methods.keys())
  if sorted(names) != sorted(config.methods.keys()):
    raise UserError(f"order={names} must name every method once: "
                    f"{', '.join(config.methods.keys())}")
  ref = config.reference
  if ref not in names:
    raise UserError(f"reference={ref!r} is not a method; have {', '.join(names)}")
  cfgs = {n: ml_collections.ConfigDict(config.methods[n].to_dict())
          for n in [ref] + [n for n in names if n != ref]}
  target = total_params(cfgs[ref])
  for name, c in cfgs.items():
    if name != ref and config.match_params:
      c.model.d_t = methods.get(c).width_for_params(target, c)
  return cfgs
