"""One trained SOMA run per N at one total size: the weights of the experts and reference
variance studies at size=trained (SPEC 9.5).

The folder `out` holds, for each N of the study's `n_list`, `out/data_n{N}` (the corpus
`trained_source` prepared into N shards) and `out/N{N}` (a SOMA workdir: N experts of the
width `variance_settings.sized_model` gives N, each on its own shard, trained by the study's
`train_run` recipe). Every N gets the same updates, n_pert, B and T. `train_all` trains or
resumes them (a finished run is reused as it is); `load_all` reads them back for the
studies and refuses a folder that does not match the study's sizes.
"""

from __future__ import annotations

import os
import time

import ml_collections

from soma_jax import checkpoint as ckpt_lib
from soma_jax import model as model_lib
from soma_jax import runs
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.data import pipeline
from soma_jax.errors import UserError
from soma_jax.studies import results, variance_settings


def workdir(out: str, n: int) -> str:
  return os.path.join(out, f"N{n}")


def _fix(vs: variance_settings.VarianceSpec, out: str) -> str:
  return (f"fix: python -m scripts.train_sizes --config=experiments/configs/variance.py:"
          f"{vs.study},size={vs.size} --out={out} (trains each missing N, reuses finished ones)")


def run_config(vs: variance_settings.VarianceSpec, n: int, data_dir: str) -> ml_collections.ConfigDict:
  """The training config of the N-expert run: `train_run` at the width of `sized_model`."""
  m = variance_settings.sized_model(vs, n)
  if m.shared_head:
    raise UserError(f"total_params={vs.total_params:,} puts N = {n} at width d_E = {m.d_e}, "
                    "which shares one frozen E seeded first (SPEC 3.4); train_sizes trains "
                    "every N from scratch with its own head; fix: another total_params or n_list")
  run = ml_collections.ConfigDict(vs.train_run.to_dict())
  run.n_experts = n
  run.model.update(d_t=m.d_t, d_e=m.d_e, depth=m.depth, shared_head=False)
  run.opt.train_head = True
  run.data.dir = data_dir
  return run


def train_all(vs: variance_settings.VarianceSpec, out: str) -> dict[int, str]:
  """Prepares the data and trains (or resumes, or reuses) every N's run of `vs`
  (`variance_settings.variance_spec` of its config); {N: workdir}."""
  from soma_jax.data import prepare

  done = {}
  for n in vs.n_list:
    data_dir = os.path.join(out, f"data_n{n}")
    if not os.path.isfile(os.path.join(data_dir, "manifest.json")):
      prepare.prepare(vs.trained_source, n, data_dir)
    pipeline.check_data_dir(data_dir, n)
    run = run_config(vs, n, data_dir)
    t0 = time.perf_counter()
    results.own(workdir(out, n))  # a run of the study in progress (its cost)
    train_lib.train_to_end(spec_lib.resolve(run), workdir(out, n), f"the N = {n} run")
    print(f"[train_sizes] N = {n}: width {run.model.d_t}, {run.steps} updates, "
          f"{time.perf_counter() - t0:.0f} s ({workdir(out, n)})", flush=True)
    done[n] = workdir(out, n)
  return done


def _check_run(vs: variance_settings.VarianceSpec, n: int, run: spec_lib.RunSpec,
               where: str) -> model_lib.ModelConfig:
  """The run's model, once its N, width and recipe are the study's; else one UserError."""
  want = variance_settings.sized_model(vs, n)
  fix = _fix(vs, os.path.dirname(where))
  if run.method.family != "lstm" or len(run.experts) != run.n_experts:
    raise UserError(f"{where!r} is not a whole LSTM ensemble (method={run.method.name}, "
                    f"experts={run.config.get('experts', '')!r}); {fix}")
  m = run.method.model
  got, need = (run.n_experts, m.d_t, m.d_e, m.depth), (n, want.d_t, want.d_e, want.depth)
  if got != need:
    raise UserError(f"{where!r} holds N = {got[0]} experts of width {got[1]} (d_E {got[2]}, "
                    f"depth {got[3]}); the study needs N = {n} at width {want.d_t} (d_E "
                    f"{want.d_e}, depth {want.depth}) for total_params={vs.total_params:,}; {fix}")
  # The run's whole config against the one train_all writes for this N (`run_config`):
  # what a resume may change (cadence, speed knobs) aside, but not the length.
  changes = ckpt_lib.config_changes(run.config, run_config(vs, n, run.data_dir))
  for key, (a, b) in changes.items():
    if key == "steps" or not ckpt_lib.under(key, ckpt_lib.RESUMABLE_KEYS):
      raise UserError(f"{where!r} was trained with {key}={a}, the study's train_run has {b}; "
                      f"{fix}")
  return m


def _record(where: str, run: spec_lib.RunSpec, step: int) -> dict:
  """What the results say of one N's run: recipe, last expert-validation loss, seconds."""
  summary = results.read_summary(where) or {}  # none, or unreadable: no numbers from it
  return {"workdir": os.path.normpath(where), "update": step, "n_experts": run.n_experts,
          "d_t": run.method.model.d_t, "n_pert": run.config.spsa.n_pert, "batch": run.batch,
          "seq_len": run.seq_len, "lr": run.lr, "eps": run.eps,
          "weight_decay": run.weight_decay, "data_dir": run.data_dir,
          "val_loss": summary.get("val_loss"), "device_seconds": summary.get("device_seconds")}


def load_all(vs: variance_settings.VarianceSpec
             ) -> tuple[variance_settings.VarianceSpec, dict[int, variance_settings.Trained]]:
  """Every N's newest checkpoint in `vs.trained_dir`, checked against the study's sizes, and
  `vs` with its weights naming them."""
  out = vs.trained_dir
  if not os.path.isdir(out):
    raise UserError(f"trained_dir={out!r} does not exist; {_fix(vs, out)}")
  loaded = {}
  for n in vs.n_list:
    where = workdir(out, n)
    if not os.path.isfile(os.path.join(where, ckpt_lib.CONFIG_FILE)):
      raise UserError(f"trained_dir={out!r} has no trained N = {n} (no {where}); {_fix(vs, out)}")
    mcfg = _check_run(vs, n, runs.read_spec(where), where)
    step, state, _, run = runs.restore_state(where)
    if int(step) != vs.train_run.steps:
      raise UserError(f"{where!r} is at update {int(step)} of {vs.train_run.steps}; "
                      f"{_fix(vs, out)}")
    loaded[n] = variance_settings.Trained(state.body, state.head, mcfg, run.data_dir,
                                 f"trained: {os.path.normpath(where)} at update {int(step)}",
                                 _record(where, run, int(step)))
  weights = (f"trained: one SOMA run per N in {os.path.normpath(out)}, "
             f"{vs.train_run.steps} updates each")
  return variance_settings.with_changes(vs, weights=weights), loaded
