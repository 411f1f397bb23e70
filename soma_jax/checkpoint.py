"""Checkpoints of the whole training state with orbax, and parameter loading for tools.

One checkpoint is one unit: the `TrainState` (parameters, Adam moments, per-expert lr /
eps / plateau counters, step) and the input iterator's state, written atomically by
orbax (a temporary folder renamed on completion), newest K kept. `config.json` in the
workdir records the run's config; tools rebuild the state's shapes from it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from soma_jax.errors import UserError

CONFIG_FILE = "config.json"
CKPT_DIR = "checkpoints"
# Config fields that fix the shapes (and meaning) of the state; a resume must match them.
SHAPE_KEYS = ("method", "n_experts", "experts", "model", "spsa.accum", "data.seq_len",
              "opt.train_head", "eggroll.rank")


def _get(cfg: dict, dotted: str) -> Any:
  for part in dotted.split("."):
    cfg = cfg.get(part, {}) if isinstance(cfg, dict) else {}
  return cfg


def read_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise UserError(f"{path!r} not found: {workdir!r} is not a training workdir; "
                    "fix: pass the --workdir given to experiments/train.py")
  try:
    with open(path) as f:
      return ml_collections.ConfigDict(json.load(f))
  except ValueError as e:
    raise UserError(f"{path!r} is corrupt ({e}); fix: restore it or use a new workdir") from None


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes config.json, or checks a resumed run has the same shape-defining fields."""
  path = os.path.join(workdir, CONFIG_FILE)
  new = json.loads(config.to_json())
  if os.path.isfile(path):
    old = read_config(workdir).to_dict()
    diff = [k for k in SHAPE_KEYS if _get(old, k) != _get(new, k)]
    if diff:
      k = diff[0]
      raise UserError(
          f"workdir {workdir!r} holds another run ({k}: {_get(old, k)!r} there, "
          f"{_get(new, k)!r} now); fix: use a new --workdir or the original config")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(new, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


class Checkpointer:
  """Save / restore `TrainState` + iterator state as one orbax checkpoint per step."""

  def __init__(self, workdir: str, keep: int = 3):
    self.directory = os.path.abspath(os.path.join(workdir, CKPT_DIR))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    self._mngr = ocp.CheckpointManager(self.directory, options=options,
                                       item_names=("state", "data"))

  def steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def save(self, step: int, state: Any, data_state: dict) -> None:
    """Saves (asynchronously); the previous checkpoint survives a failed save."""
    try:
      self._mngr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=True)
    except OSError as e:
      raise UserError(f"could not save checkpoint {step} under {self.directory!r} ({e}); "
                      "the previous checkpoint is kept; fix: free disk space and re-run") from e

  def wait(self) -> None:
    try:
      self._mngr.wait_until_finished()
    except OSError as e:
      raise UserError(f"could not finish writing a checkpoint under {self.directory!r} ({e}); "
                      "the previous checkpoint is kept; fix: free disk space and re-run") from e

  def restore_latest(self, abstract_state: Any,
                     max_step: int | None = None) -> tuple[int, Any, dict] | None:
    """The newest readable checkpoint as (step, state, data_state); None if there is none.

    An unreadable newest checkpoint (truncated copy, bad disk) is reported and skipped
    in favour of the one before it; it is left on disk for inspection.
    """
    for step in reversed(self.steps()):
      if max_step is not None and step > max_step:
        continue
      try:
        out = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return step, out["state"], out["data"]
      except Exception as e:  # noqa: BLE001 - any failure to read means "try an older one"
        logging.warning("checkpoint %d in %s is unreadable (%s: %s); trying an older one",
                        step, self.directory, type(e).__name__, str(e).splitlines()[0][:200])
    if self.steps():
      raise UserError(f"no readable checkpoint in {self.directory!r} (all "
                      f"{len(self.steps())} failed); fix: restore the files or use a new workdir")
    return None

  def close(self) -> None:
    self.wait()
    self._mngr.close()


def abstract_like(tree: Any) -> Any:
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
