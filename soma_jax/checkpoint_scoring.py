"""Each checkpoint scored from the state in memory, as training saves it: the save hook that
writes `checkpoint_scores` where the config names `checkpoint_eval`."""

from __future__ import annotations

import jax

from soma_jax import budget as budget_lib
from soma_jax import checkpoint_scores as scores_lib
from soma_jax import evaluate as eval_lib
from soma_jax import spec as spec_lib
from soma_jax import train_state


class Scorer:
  """Around each save of a run's checkpoints: before it, the step's score files of an older
  attempt removed (scored or not: a resume may turn scoring off); after it, the set
  config.checkpoint_eval names scored from the state in memory (eval_seconds) and its
  per-window losses written beside the checkpoint.

  The state is copied first onto the one device a restore puts it on, so the losses are bit
  for bit what restoring and scoring the checkpoint gives. No set is read where scoring is
  off, or in a run over several processes (whose state no one process holds; the study
  restores)."""

  def __init__(self, spec: spec_lib.RunSpec, clock: budget_lib.Clock, workdir: str):
    self.spec, self.clock, self.workdir = spec, clock, workdir
    self.test_set = None
    e = spec.checkpoint_eval
    if e is not None and jax.process_count() == 1:
      with clock.aside("eval_seconds"):  # read once per run
        self.test_set = eval_lib.TestSet(e.data_dir, e.max_windows, e.split, e.route, e.score)

  def before_save(self, step: int) -> None:
    scores_lib.forget(self.workdir, step)

  def after_save(self, step: int, state: train_state.TrainState, counters: dict) -> None:
    if self.test_set is None:
      return
    spec = self.spec
    with self.clock.aside("eval_seconds"):
      one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      body, head = jax.device_put((state.body, state.head), one)
      losses = self.test_set.losses(body, head, spec.n_experts, spec.shared_head,
                                    spec.method.logits)
      scores_lib.write(self.workdir, step, losses, self.test_set.settings(), counters)
