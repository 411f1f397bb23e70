"""A training config resolved once into a pure `RunSpec`: what a run is, before any device.

`resolve(c)` validates the config (the shared checks of `config.validate`, then the method's
own in its `make`), makes its `Method` (the one place a config's method is looked up) and
reads the run's cadences, budget, plateau rule, data and start into typed fields. It opens
no file and touches no device: `plan.place(spec)` does both. The raw config stays in
`RunSpec.config` only to be written to and compared with a workdir's config.json.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from soma_jax import config as config_lib
from soma_jax import methods, train_state


@dataclasses.dataclass(frozen=True)
class Cadence:
  """When the loop logs, validates, checkpoints, and where it stops (config's fields)."""

  steps: int  # the step to train to (with a budget: the most it may reach)
  log_every: int
  eval_every: int
  ensemble_eval_every: int  # 0 = at the end only, -1 = never
  ckpt_every: int
  keep: int  # newest checkpoints kept


@dataclasses.dataclass(frozen=True)
class BudgetSpec:
  """`budget` in `budget_unit` (0 = none), with a checkpoint after each 1/checkpoints, or
  after each fraction of `marks` where it is given (config.budget_marks)."""

  unit: str
  amount: float
  checkpoints: int
  marks: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class CheckpointEval:
  """The evaluation set scored at every checkpoint (config.checkpoint_eval, when on): the
  arguments of `evaluate.TestSet`, data_dir absolute."""

  data_dir: str
  split: str
  max_windows: int
  route: int
  score: int


@dataclasses.dataclass(frozen=True)
class MeshRequest:
  """mesh.expert / mesh.pert as the config gives them ("auto" or a count), with what the
  layout depends on: the directions per update and a fixed pert_chunk (None: "auto")."""

  expert: str
  pert: str
  n_pert: int
  chunk: int | None


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """Everything a run is, resolved from its config by `resolve` (no devices, no files)."""

  config: ml_collections.ConfigDict  # only to write / compare config.json (data.dir absolute)
  method: methods.Method
  n_experts: int  # N of the whole run
  experts: range  # this job's experts (global ids)
  seed: int
  cadence: Cadence
  budget: BudgetSpec
  plateau: train_state.PlateauConfig
  lr: float  # initial lr and eps (what resume_overrides of opt.lr / spsa.eps set)
  eps: float
  weight_decay: float
  train_head: bool
  precision: str
  shared_head: bool
  data_dir: str  # absolute; "" where the config names none (refused by `plan.place`)
  seq_len: int  # T: bytes of context per window
  batch: int  # B windows per batch, A batches per update
  accum: int
  val_windows: int  # each expert's validation windows scored at every evaluation
  init_from: str  # the seed workdir of a warm start ("" for none)
  init_state: bool  # continue the seed run's whole state, not only its parameters
  init_from_other_data: bool  # the seed may have trained on other data than data_dir
  mesh: MeshRequest
  checkpoint_eval: CheckpointEval | None = None  # None: no scoring at checkpoints

  @property
  def ops_step(self) -> int:
    """Operations of one update of this job's experts (SPEC 7)."""
    return self.method.ops_per_update * len(self.experts)

  @property
  def tokens_step(self) -> int:
    return self.ops_step // self.method.flops_per_token

  @property
  def total_ops_per_update(self) -> int:
    """Operations of one update of all N experts (SPEC 7)."""
    return self.method.ops_per_update * self.n_experts

  def without_seed(self) -> RunSpec:
    """The same run built fresh (no init_from): its shapes, without reading the seed."""
    return dataclasses.replace(self, init_from="", init_state=False)


def resolve(c: ml_collections.ConfigDict) -> RunSpec:
  """The config validated and converted once (see the module docstring)."""
  config_lib.validate(c)
  if c.data.dir and not os.path.isabs(c.data.dir):  # config.json names the data from anywhere
    c = ml_collections.ConfigDict(c.to_dict())
    c.data.dir = os.path.abspath(c.data.dir)
  method = methods.make(c)
  a, b = config_lib.expert_range(c.experts, c.n_experts)
  chunk = c.spsa.pert_chunk
  scored = c.get("checkpoint_eval")  # off ("" split) or absent in a config that predates it
  scored = scored if scored is not None and scored.split else None
  where = (scored.data_dir or c.data.dir) if scored is not None else ""
  return RunSpec(
      config=c, method=method, n_experts=c.n_experts, experts=range(a, b), seed=c.seed,
      cadence=Cadence(c.steps, c.log_every, c.eval_every, c.ensemble_eval_every, c.ckpt_every,
                      c.ckpt.keep),
      budget=BudgetSpec(c.get("budget_unit", "device_seconds"), float(c.get("budget", 0.0)),
                        int(c.get("budget_checkpoints", 1)),
                        tuple(float(f) for f in c.get("budget_marks", ()) or ())),
      plateau=train_state.PlateauConfig(patience=c.opt.patience, floor=c.opt.floor),
      lr=c.opt.lr, eps=c.spsa.eps, weight_decay=c.opt.weight_decay,
      train_head=c.opt.train_head, precision=c.precision, shared_head=c.model.shared_head,
      data_dir=c.data.dir, seq_len=c.data.seq_len, batch=c.spsa.batch, accum=c.spsa.accum,
      val_windows=c.data.val_windows,
      init_from=c.init_from, init_state=bool(c.get("init_state", False)),
      init_from_other_data=bool(c.get("init_from_other_data", False)),
      mesh=MeshRequest(str(c.mesh.expert), str(c.mesh.pert), c.spsa.n_pert,
                       None if chunk == "auto" or method.plan_chunk is None else int(chunk)),
      checkpoint_eval=None if scored is None else CheckpointEval(
          os.path.abspath(where) if where else "", scored.split, scored.max_windows,
          scored.route, scored.score))
