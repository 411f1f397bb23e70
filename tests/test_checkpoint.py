"""Checkpoint round trip: the whole TrainState and the iterator state come back exactly."""

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from soma_jax import checkpoint as ckpt_lib
from soma_jax import model as M
from soma_jax import spsa as S
from soma_jax import train_state as TS
from soma_jax.errors import UserError

CFG = S.StepConfig(model=M.ModelConfig(d_t=4, d_e=4, depth=1, shared_head=False),
                   spsa=S.SpsaConfig(n_pert=2, pert_chunk=2), train_head=True)


def _trained_state() -> TS.TrainState:
  """A state where every field differs from its initial value: two updates, a plateau step."""
  body_N, head_N = M.init_experts(jax.random.key(0), CFG.model, 2)
  state = TS.init_state(body_N, head_N, 1e-2, 1e-3, CFG.weight_decay, CFG.train_head)
  batch = jax.random.randint(jax.random.key(1), (2, 1, 2, 9), 0, 256).astype(jnp.uint8)
  step = jax.jit(lambda s, b: S.train_step(s, b, jnp.arange(2), CFG)[0])
  for _ in range(2):
    state = step(state, batch)
  sched = TS.plateau_update(state.sched, jnp.array([2.5, 3.0]), 2, TS.PlateauConfig(patience=1))
  return state.replace(sched=sched, skipped=jnp.array([0, 3], jnp.int32))


def _differences(a, b) -> list[str]:
  """Paths of leaves that differ in value, shape or dtype; a structure mismatch is one entry."""
  if jax.tree.structure(a) != jax.tree.structure(b):
    return [f"structure {jax.tree.structure(a)} != {jax.tree.structure(b)}"]
  out = []
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y):
      out.append(jax.tree_util.keystr(path))
  return out


def test_round_trip_restores_the_whole_state(tmp_path):
  """Every leaf of body, head, both Adam states, the schedule, step and skip counters."""
  state = _trained_state()
  data = {"iterator": {"epoch": 3, "index": [5, 7]}, "device_seconds": 12.5}
  ckpt = ckpt_lib.Checkpointer(str(tmp_path))
  ckpt.save(2, state, data)
  ckpt.wait()
  step, restored, data_back = ckpt.restore_latest(ckpt_lib.abstract_like(state))
  ckpt.close()
  assert step == 2 and data_back == data
  assert _differences(state, restored) == []
  # The comparison is whole-tree: a state missing its Adam moments or with a stale
  # schedule is reported.
  zeroed = state.replace(opt=jax.tree.map(jnp.zeros_like, state.opt))
  assert _differences(state, zeroed)
  assert _differences(state, dataclasses.replace(state, sched=state.sched.replace(
      eps=state.sched.eps * 2)))


def test_newest_of_several_checkpoints_and_a_bounded_step(tmp_path):
  state = _trained_state()
  ckpt = ckpt_lib.Checkpointer(str(tmp_path), keep=3)
  later = state.replace(step=state.step + 1, body=jax.tree.map(lambda x: x + 1, state.body))
  ckpt.save(2, state, {"iterator": {}})
  ckpt.save(3, later, {"iterator": {}})
  ckpt.wait()
  abstract = ckpt_lib.abstract_like(state)
  assert _differences(ckpt.restore_latest(abstract)[1], later) == []
  assert _differences(ckpt.restore_latest(abstract, max_step=2)[1], state) == []
  ckpt.close()


@struct.dataclass
class _Before:
  step: jax.Array
  body: jax.Array


@struct.dataclass
class _After:  # _Before with a field added since (as TrainState gained `carry`)
  step: jax.Array
  body: jax.Array
  carry: Any = ()


def test_a_field_added_since_the_save_restores_empty_and_only_empty(tmp_path):
  ckpt = ckpt_lib.Checkpointer(str(tmp_path))
  ckpt.save(1, _Before(step=jnp.array(1), body=jnp.arange(3.0)), {"iterator": {}})
  ckpt.wait()
  step, restored, _ = ckpt.restore_latest(ckpt_lib.abstract_like(_After(jnp.array(0), jnp.zeros(3))))
  assert step == 1 and restored.carry == () and restored.body.tolist() == [0.0, 1.0, 2.0]
  with_arrays = ckpt_lib.abstract_like(_After(jnp.array(0), jnp.zeros(3), carry=jnp.zeros(2)))
  with pytest.raises(UserError, match="no readable checkpoint"):  # arrays it never held
    ckpt.restore_latest(with_arrays)
  ckpt.close()


def test_an_unreadable_checkpoint_is_reported_with_its_own_error(tmp_path, caplog):
  """A truncated checkpoint was reported as a tree-structure mismatch: its read error set off
  a second restore, without `carry`, whose error was the one logged."""
  state = _trained_state()
  ckpt = ckpt_lib.Checkpointer(str(tmp_path))
  ckpt.save(2, state, {"iterator": {}})
  ckpt.save(3, state, {"iterator": {}})
  ckpt.wait()
  for where, _, names in os.walk(os.path.join(tmp_path, "checkpoints", "3", "state")):
    for name in names:
      if os.sep + "d" + os.sep in os.path.join(where, name):  # the array chunks
        os.truncate(os.path.join(where, name), os.path.getsize(os.path.join(where, name)) // 2)
  with caplog.at_level("WARNING"):
    step, restored, _ = ckpt.restore_latest(ckpt_lib.abstract_like(state))
  ckpt.close()
  assert step == 2 and _differences(state, restored) == []
  noted = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
  assert len(noted) == 1 and "checkpoint 3" in noted[0], noted
  assert "tree structures do not match" not in noted[0] and "Error reading" in noted[0], noted
