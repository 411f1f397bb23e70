"""The memory-lean SPSA forward, XLA's plan at paper shapes, pert_chunk="auto", precision."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from soma_jax import config as config_lib
from soma_jax import memory, sizing
from soma_jax import model as M
from soma_jax import plan as plan_lib
from soma_jax import spec as spec_lib
from soma_jax import spsa as S
from soma_jax import train_state as TS
from soma_jax.errors import UserError
from soma_jax.methods import lstm


def _window(b: int, t: int, seed: int = 0) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).integers(0, 256, (b, t + 1)), jnp.uint8)


_streamed = jax.jit(M.streamed_loss, static_argnames="time_block")


@pytest.mark.parametrize("d_t,t,block", [
    (32, 64, 16),  # T a multiple of the block, no projections (d_t == d_E)
    (48, 100, 32),  # T not a multiple: a final block of 4 positions
    (64, 37, 8),  # width with projections, remainder 5
    (16, 7, 64),  # T shorter than one block
    (24, 64, 1),  # one position per block: the fused scan over time
])
def test_streamed_loss_equals_full_window_loss(d_t, t, block):
  cfg = M.ModelConfig(d_t=d_t, depth=2)
  body, head = M.init_body(jax.random.key(d_t), cfg), M.init_head(jax.random.key(1), cfg)
  # Train-like weights: scale the gains so every block matters and the carry is non-trivial.
  body = jax.tree.map(lambda x: x * 1.5, body)
  w = _window(3, t, seed=t)
  want = M.loss(body, head, w)
  got = _streamed(body, head, w, time_block=block)
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)


def test_streamed_loss_carries_state_across_blocks():
  """Zeroing the carry between blocks (a plausible bug) changes the loss: the test bites."""
  cfg = M.ModelConfig(d_t=16)
  body, head = M.init_body(jax.random.key(0), cfg), M.init_head(jax.random.key(1), cfg)
  w = _window(2, 64)
  carried = _streamed(body, head, w, time_block=16)
  reset = jnp.mean(jnp.stack([M.loss(body, head, w[:, i:i + 17]) for i in range(0, 64, 16)]))
  assert abs(float(carried) - float(reset)) > 1e-4
  np.testing.assert_allclose(carried, M.loss(body, head, w), rtol=2e-6)


def test_expert_losses_equal_per_expert_loss():
  cfg = M.ModelConfig(d_t=16, shared_head=False)
  body_N, head_N = M.init_experts(jax.random.key(0), cfg, 3)
  w = jnp.stack([_window(2, 80, seed=i) for i in range(3)])
  got = TS.expert_losses(body_N, head_N, w, shared_head=False)
  want = [M.loss(jax.tree.map(lambda x, e=e: x[e], body_N), head_N[e], w[e]) for e in range(3)]
  np.testing.assert_allclose(got, want, rtol=2e-6)


def _plan(n, d_t, b, t, n_pert, chunk, time_block, signs_together=True) -> int:
  mc = sizing.paper_config(n, d_t)
  cfg = S.StepConfig(model=mc, spsa=S.SpsaConfig(n_pert=n_pert, pert_chunk=chunk,
                                                   time_block=time_block,
                                                   signs_together=signs_together),
                     train_head=not mc.shared_head)

  def init():
    body_N, head = M.init_experts(jax.random.key(0), mc, n)
    return TS.init_state(body_N, head, 1e-3, 1e-3, cfg.weight_decay, cfg.train_head)

  state = jax.eval_shape(init)
  batch = jax.ShapeDtypeStruct((n, 1, b, t + 1), jnp.uint8)
  ids = jax.ShapeDtypeStruct((n,), jnp.int32)
  step = jax.jit(S.train_step, static_argnames="cfg")
  return memory.planned_bytes(step.lower(state, batch, ids, cfg=cfg).compile())


@pytest.mark.slow  # make test-all; kept out of make test's 15 minutes
def test_paper_shapes_plan_fits_16gb_and_does_not_grow_with_t():
  """SOMA N = 2 (d_t 361), B = 64, T = 1024, n_pert = pert_chunk = 64: compile only."""
  tb = config_lib.base_config(n=2, size="paper").spsa.time_block
  plan_1024 = _plan(2, 361, 64, 1024, 64, 64, tb)
  plan_256 = _plan(2, 361, 64, 256, 64, 64, tb)
  assert 0 < plan_1024 <= 16e9, f"N=2 paper step plans {plan_1024 / 1e9:.1f} GB (> 16 GB)"
  assert plan_1024 <= 1.3 * plan_256, (plan_1024, plan_256)


def test_signs_apart_plan_less_than_together():
  """+ then - keeps C perturbed copies live, not 2 C: the plan's per-direction part shrinks."""
  together = [_plan(2, 32, 8, 64, 8, chunk, 16) for chunk in (1, 8)]
  apart = [_plan(2, 32, 8, 64, 8, chunk, 16, signs_together=False) for chunk in (1, 8)]
  assert apart[1] < together[1]
  slope = lambda p: p[1] - p[0]  # bytes per 7 more directions in the chunk
  assert 0.3 < slope(apart) / slope(together) < 0.8, (apart, together)  # 0.60 measured


def test_plan_grows_with_chunk():
  small = functools.partial(_plan, 2, 16, 4, 64, 8)
  assert small(8, 16) > small(2, 16) > 0


def test_choose_pert_chunk_picks_largest_fitting_divisor():
  calls = []

  def plan_at(chunk):  # linear plan: 1 GB + 0.5 GB per direction
    calls.append(chunk)
    return int(1e9 + 0.5e9 * chunk)

  choice = memory.choose_pert_chunk(plan_at, 64, "gpu", limit_bytes=int(20e9), margin=0.85)
  assert choice.chunk == 32  # 17 GB <= 0.85 * 20 GB; 64 would need 33 GB
  assert len(calls) <= 4, calls  # a handful of compiles, not one per divisor
  calls.clear()
  assert memory.choose_pert_chunk(plan_at, 64, "gpu", int(100e9)).chunk == 64
  assert calls == [64]
  assert memory.choose_pert_chunk(plan_at, 48, "gpu", int(10e9), margin=1.0).chunk == 16
  # CPU: about CPU_ROWS = 8 rows per iteration, 4 perturbed copies of the default B = 2
  # (N C with the signs apart, 2 N C together), whatever the plan; one direction when even
  # that is more. At B = 4 (the studies'), 2 copies.
  def cpu(k, n, together=False):
    return memory.choose_pert_chunk(plan_at, k, "cpu", None, n_experts=n,
                                    signs_together=together).chunk
  assert [cpu(64, n) for n in (1, 2, 4, 8)] == [4, 2, 1, 1]
  assert [cpu(64, n, together=True) for n in (1, 2, 4)] == [2, 1, 1]
  assert cpu(9, 1) == 3  # 4 does not divide 9
  assert cpu(7, 1) == 1
  assert memory.choose_pert_chunk(plan_at, 4, "cpu", None, n_experts=1, signs_together=False,
                                  batch=4).chunk == 2


def test_choose_pert_chunk_steps_down_when_the_line_underestimates():
  plans = {64: 40e9, 1: 1e9, 32: 19e9, 16: 9e9}  # 32 predicted to fit (19.9) but does not
  choice = memory.choose_pert_chunk(lambda c: int(plans.get(c, 1e9 + 0.6e9 * c)), 64, "gpu",
                                    limit_bytes=int(20e9), margin=0.9)
  assert choice.chunk == 16 and "fits" in choice.reason


def test_auto_chunk_resolves_and_is_described():
  c = config_lib.base_config(n=2, size="tiny")
  with c.unlocked():
    c.spsa.pert_chunk = "auto"
  choice = plan_lib.choose_chunk(spec_lib.resolve(c).method, 2)
  # The CPU's small chunk (signs apart there); on a GPU all 4 directions fit at once.
  on_cpu = jax.default_backend() == "cpu"
  assert lstm.signs_together(c) == (not on_cpu)
  assert choice.chunk == (2 if on_cpu else 4)  # N C = 4 copies with the signs apart
  assert choice.planned_bytes > 0
  assert spec_lib.resolve(c).method.step_config(choice.chunk).spsa.pert_chunk == choice.chunk
  assert f"pert_chunk={choice.chunk}" in choice.describe()
  with c.unlocked():
    c.spsa.pert_chunk = "16"  # as a command line gives it
  assert config_lib.pert_chunk(c.spsa.pert_chunk) == 16
  # Clamped to n_pert = 4 as the step clamps it: the plan is the program training runs.
  assert plan_lib.choose_chunk(spec_lib.resolve(c).method, 2).chunk == 4
  with c.unlocked():
    c.spsa.pert_chunk = "big"
  with pytest.raises(UserError, match="pert_chunk"):
    config_lib.validate(c)
  with c.unlocked():
    c.spsa.pert_chunk, c.spsa.signs = "auto", "both"
  with pytest.raises(UserError, match="spsa.signs='both' is out of range: it must be one of auto, together, apart"):
    config_lib.validate(c)
  for signs, together in (("together", True), ("apart", False)):
    with c.unlocked():
      c.spsa.signs = signs
    assert spec_lib.resolve(c).method.step_config().spsa.signs_together is together
  with c.unlocked():
    c.spsa.signs, c.spsa.forward = "auto", "fused"
  with pytest.raises(UserError, match="spsa.forward='fused' is out of range: it must be one of "
                     "direct, split, split_recurrence"):
    config_lib.validate(c)
  for forward in ("direct", "split", "split_recurrence"):
    with c.unlocked():
      c.spsa.forward = forward
    config_lib.validate(c)
    assert spec_lib.resolve(c).method.step_config().spsa.forward == forward


def _dot_algorithms(lowered) -> list[str]:
  """The algorithm attribute of every dot_general in a lowered program ("" where none)."""
  text = lowered.as_text()
  dots = [ln for ln in text.splitlines() if "stablehlo.dot_general" in ln]
  assert dots and text.count("dot_general") == len(dots)  # one op per line, none missed
  out = []
  for ln in dots:
    alg = ln.split("algorithm = <")[1].split(">")[0] if "algorithm = <" in ln else ""
    keep = ("lhs_precision_type", "rhs_precision_type", "accumulation_type", "num_primitive")
    out.append(", ".join(p for p in alg.split(", ") if p.startswith(keep)))
  return out


def _alg(lhs: str, ops: int = 1) -> str:
  return (f"lhs_precision_type = {lhs}, rhs_precision_type = {lhs}, accumulation_type = f32, "
          f"num_primitive_operations = {ops}")


def _lowered_step(forward: str, name: str, platform: str):
  """The tiny training step (SPSA body, delta-rule heads, Adam) lowered for `platform`."""
  mc = M.ModelConfig(d_t=8, d_e=4, depth=1, shared_head=False)
  cfg = S.StepConfig(model=mc, spsa=S.SpsaConfig(n_pert=4, pert_chunk=2, time_block=8,
                                                 forward=forward), train_head=True)
  state = jax.eval_shape(lambda: TS.init_state(*M.init_experts(jax.random.key(0), mc, 2),
                                              1e-3, 1e-3, cfg.weight_decay, cfg.train_head))
  args = (state, jax.ShapeDtypeStruct((2, 1, 2, 21), jnp.uint8),
          jax.ShapeDtypeStruct((2,), jnp.int32))
  with memory.matmul_precision(name, platform):
    traced = jax.jit(S.train_step, static_argnames="cfg").trace(*args, cfg=cfg)
  return traced.lower(lowering_platforms=("cuda" if platform == "gpu" else "cpu",))


@pytest.mark.parametrize("forward", ["direct", "split"])
@pytest.mark.parametrize("platform,name,want", [
    ("gpu", "default", _alg("tf32")), ("gpu", "high", _alg("tf32", 3)),
    ("gpu", "highest", _alg("f32")), ("cpu", "default", _alg("f32")),
    ("cpu", "highest", _alg("f32"))])
def test_every_matmul_of_the_step_carries_the_precision_algorithm(forward, platform, name, want):
  """Every dot of the lowered step (input, recurrent, MLP and projection matmuls, batched
  over copies, the logits, the estimate's sum over directions, the delta rule) carries the
  setting's explicit algorithm; the GPU's is lowered here for CUDA without a GPU. In split,
  the probe corrections are bf16 x bf16 with float32 accumulation, and nothing else is."""
  algs = _dot_algorithms(_lowered_step(forward, name, platform))
  bf16 = _alg("bf16")
  assert len(algs) >= 12
  assert all(a == want for a in algs if a != bf16 or forward == "direct"), algs
  # 6 matrices, in the scan over full time blocks and in the remainder block (T = 20, 8).
  assert algs.count(bf16) == (12 if forward == "split" else 0)


def test_dot_algorithm_per_backend_and_evaluation_in_float32():
  assert [memory.dot_algorithm(p, "gpu") for p in memory.PRECISIONS] == [
      "TF32_TF32_F32", "TF32_TF32_F32_X3", "F32_F32_F32"]
  assert {memory.dot_algorithm(p, "cpu") for p in memory.PRECISIONS} == {"F32_F32_F32"}
  assert memory.dot_algorithm("high", "tpu") == "high"  # untested backends: legacy levels
  with pytest.raises(ValueError, match="precision='tf32'; use one of default, high, highest"):
    memory.matmul_precision("tf32")
  with pytest.raises(ValueError, match="not supported by dot_general on CPU"):  # why the CPU's
    with jax.default_matmul_precision("TF32_TF32_F32"):
      jax.jit(lambda a: a @ a).trace(jnp.ones((2, 2))).lower(lowering_platforms=("cpu",))
  # Evaluation inside a TF32 training context still lowers every dot as plain float32.
  mc = M.ModelConfig(d_t=8, d_e=4, depth=1, shared_head=False)
  body_N, head_N = jax.eval_shape(lambda: M.init_experts(jax.random.key(0), mc, 2))
  windows = jax.ShapeDtypeStruct((2, 2, 17), jnp.uint8)
  with memory.matmul_precision("default", "gpu"), memory.full_precision("gpu"):
    traced = jax.jit(TS.expert_losses, static_argnames="shared_head").trace(
        body_N, head_N, windows, shared_head=False)
  algs = _dot_algorithms(traced.lower(lowering_platforms=("cuda",)))
  assert algs and set(algs) == {_alg("f32")}


@pytest.mark.parametrize("unroll", [2, 5])
def test_unroll_does_not_change_the_loss(unroll):
  cfg = M.ModelConfig(d_t=16)
  body, head = M.init_body(jax.random.key(0), cfg), M.init_head(jax.random.key(1), cfg)
  w = _window(2, 40)
  got = jax.jit(M.streamed_loss, static_argnames=("time_block", "unroll"))(
      body, head, w, time_block=16, unroll=unroll)
  np.testing.assert_allclose(got, M.loss(body, head, w), rtol=2e-6)
