"""A run folder's records: summary.json, the config it trained with and the history of its
starts (config_history.jsonl), read and written for the training loop."""

from __future__ import annotations

import json
import os

import jax

from soma_jax import checkpoint as ckpt_lib
from soma_jax import metrics as metrics_lib
from soma_jax import spec as spec_lib

SUMMARY_FILE = "summary.json"


def write_summary(workdir: str, summary: dict) -> None:
  """summary.json, written whole (a temporary file replaced), strict JSON."""
  tmp = os.path.join(workdir, SUMMARY_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump(metrics_lib.json_safe(summary), f, indent=1, allow_nan=False)
  os.replace(tmp, os.path.join(workdir, SUMMARY_FILE))


def done_message(workdir: str, step: int, steps: int, budget: str = "") -> None:
  """The line of a run with nothing to do: at its `steps`, or at its `budget` (described)."""
  metrics_lib.Progress(steps, step).message(
      f"budget reached: {budget} at step {step} ({workdir} is finished; nothing changed; "
      "raise --config.budget to continue)" if budget else
      f"{workdir} is already trained to step {step} (steps={steps}); nothing changed; raise "
      "--config.steps to continue")


def finished_summary(workdir: str, steps: int, budget: str = "") -> dict | None:
  """summary.json of a run that finished at its newest checkpoint, at or past `steps` (where
  a `budget`, described, ended it: at exactly its newest checkpoint)."""
  path = os.path.join(workdir, SUMMARY_FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return None  # rewritten by the run
  step = summary.get("step") if isinstance(summary, dict) else None
  if not isinstance(step, int) or step < steps or step != ckpt_lib.newest_step(workdir):
    return None
  done_message(workdir, step, steps, budget)
  return summary


def already_trained(workdir: str, start: int, steps: int, skipped: list, totals: dict) -> dict:
  """The summary of a resumed run that has nothing to do (its checkpoint at or past steps);
  summary.json is written only when it is missing and the run stands exactly at steps."""
  done_message(workdir, start, steps)
  records = metrics_lib.read_metrics(workdir)
  val = [r["val_loss"] for r in records if "val_loss" in r and r["step"] <= start]
  summary = {"status": "done", "step": start, "signal": 0, "val_loss": val[-1] if val else None,
             "skipped": skipped, **totals}
  if start == steps and jax.process_index() == 0:
    write_summary(workdir, summary)
  return summary


def open_workdir(workdir: str, spec: spec_lib.RunSpec, data_sha: str | None
                 ) -> tuple[dict, list[str]]:
  """(allowed changes, resume_overrides) of a resume of `spec` against the workdir's
  config.json (the method's shape and speed keys), or ({}, []) for a new run, its seed
  checked (`checkpoint.check_seed`: a resume reads only its own workdir); writes nothing."""
  if not ckpt_lib.has_checkpoint(workdir):
    ckpt_lib.check_seed(spec.init_from, spec.data_dir, data_sha, spec.init_from_other_data)
  elif os.path.isfile(os.path.join(workdir, ckpt_lib.CONFIG_FILE)):
    return ckpt_lib.check_resume(workdir, spec.config, data_sha, spec.method.shape_keys,
                                 spec.method.speed_keys)
  return {}, []


def record_start(workdir: str, spec: spec_lib.RunSpec, start: int, changed: dict,
                 overrides: list[str], data_sha: str | None) -> None:
  """`spec`'s config.json and one line of config_history.jsonl, by process 0, when updates
  begin."""
  if jax.process_index() == 0:
    ckpt_lib.write_config(workdir, spec.config)
    ckpt_lib.record_start(workdir, start, changed, overrides, data_sha)
