"""spsa.forward=split: x W + s eps (x Z) against the direct (W + s eps Z) forward.

The split forward is a speed setting, so each test compares it with the direct forward
at a bound derived from the dtypes involved, or against float64 where float32 rounding
sets the floor.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from soma_jax import layers as L
from soma_jax import memory
from soma_jax import model as M
from soma_jax import spsa as S
from soma_jax import train_state as TS

U32, U16 = 2.0 ** -24, 2.0 ** -8  # unit roundoff of float32 and bfloat16


def _ternary(key, shape):
  return jax.random.randint(key, shape, -1, 2).astype(jnp.float32)


@pytest.mark.parametrize("eps", [1e-3, 0.1])
def test_split_linear_equals_direct_within_the_derived_bound(eps):
  """Elementwise |split - direct| against a bound from the dtypes, both signs.

  With a = |x| and S_w = a |W|, S_z = a |Z| (sums over the d = 64 inputs), floating point
  gives (|theta| <= 1.01 u for each rounding, gamma_d = d u / (1 - d u)):
  - direct: W + s eps Z rounds each weight once (u32 |W + s eps Z|), the f32 dot of d terms
    adds gamma_d: |direct - exact| <= (u32 + gamma_d) (S_w + eps S_z) (1 + u32).
  - split: x W in f32 (gamma_d S_w); the correction uses x = hi + lo + r with hi, lo in
    bfloat16 and |r| <= u16^2 |x| (two roundings to 8 significant bits), Z exact in bf16,
    products exact in f32, accumulated over 2 d terms (gamma_2d); then eps times it and the
    final add round twice more: |split - exact| <= gamma_d S_w + eps (u16^2 + gamma_2d) S_z
    (1 + u32) + 2 u32 (S_w + eps S_z).
  The test asserts the sum of the two bounds, which is 1e-5 relative here: a correction in
  a single bfloat16 (error u16 S_z eps) or an unscaled one exceeds it.
  """
  kx, kw, kz = jax.random.split(jax.random.key(0), 3)
  d, out = 64, 48
  x = jax.random.normal(kx, (2, 32, d))  # two signs' rows, stacked as under vmap
  w = jax.random.normal(kw, (d, out)) / np.sqrt(d)
  z = _ternary(kz, (d, out))
  scale = jnp.array([eps, -eps])[:, None, None]
  with memory.matmul_precision("highest", "cpu"):
    direct = jax.jit(lambda x, w, z: L.linear(x, w + scale * z))(x, w, z)
    split = jax.jit(lambda x, w, z: jax.vmap(
        lambda xs, s: L.linear(xs, L.Split(w, z.astype(jnp.bfloat16), s)))(x, scale[:, 0, 0]))(
            x, w, z)
  a = np.abs(np.asarray(x, np.float64))
  s_w, s_z = a @ np.abs(np.asarray(w, np.float64)), a @ np.abs(np.asarray(z, np.float64))
  gamma = lambda n: n * U32 / (1 - n * U32)
  bound_direct = (1.01 * U32 + gamma(d)) * (s_w + eps * s_z) * (1 + U32)
  bound_split = (gamma(d) * s_w + eps * (1.01 * U16 ** 2 + gamma(2 * d)) * s_z * (1 + U32)
                 + 2.02 * U32 * (s_w + eps * s_z))
  gap = np.abs(np.asarray(split, np.float64) - np.asarray(direct, np.float64))
  assert np.all(gap <= bound_direct + bound_split), (
      f"split - direct up to {gap.max():.3g}; bound {np.min(bound_direct + bound_split):.3g}")
  # And the bound is not vacuous: the perturbation itself is far above it.
  assert eps * np.abs(np.asarray(x) @ np.asarray(z)).mean() > 100 * (bound_direct + bound_split).mean()


def _setup(d_t=16, t=64, b=4, n=2):
  cfg = M.ModelConfig(d_t=d_t, d_e=8, depth=2, shared_head=True)
  body_N, head = M.init_experts(jax.random.key(0), cfg, n)
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 256, (n, 1, b, t + 1)), jnp.uint8)
  return body_N, head, batch


_coefficients = jax.jit(S.coefficients, static_argnames=("cfg", "shared_head"))


def _coefs(body_N, head, batch, forward, probe, together=True, eps=1e-3):
  cfg = S.SpsaConfig(n_pert=16, pert_chunk=8, probe=probe, time_block=16, forward=forward,
                     signs_together=together)
  n = batch.shape[0]
  return np.asarray(_coefficients(body_N, head, batch, jnp.full((n,), eps, body_N["ln_f"]["scale"].dtype),
                                  jnp.int32(0), jnp.arange(n), jax.random.key(1), cfg),
                    np.float64)


def _rel(a, b) -> float:
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("forward,probe,together", [
    ("split", "sparse", True), ("split", "rademacher", False),
    ("split_recurrence", "sparse", True), ("split", "gaussian", True)])
def test_split_coefficients_agree_with_direct(forward, probe, together):
  """Per-direction coefficients (L+ - L-) / (2 eps) at eps 1e-3: split within 1e-3 relative
  norm of direct (the issue's bound), and no further from the float64 coefficients than
  twice direct's own float32 error, so split adds no error of its own above float32
  rounding (measured: both about 7e-5 from each other; a correction with x in a single
  bfloat16 measured 5e-4, which the second check refuses)."""
  body_N, head, batch = _setup()
  direct = _coefs(body_N, head, batch, "direct", probe, together)
  split = _coefs(body_N, head, batch, forward, probe, together)
  with jax.enable_x64(True):  # the reference: direct, every operation in float64
    as64 = lambda t: jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), t)
    exact = _coefs(as64(body_N), as64(head), batch, "direct", probe, together)
  assert _rel(split, direct) < 1e-3
  floor = _rel(direct, exact)
  assert _rel(split, exact) < 2 * floor + 1e-6, (_rel(split, exact), floor)


def test_split_losses_equal_direct_losses():
  """The mean perturbed loss estimate returns is the same to float32 rounding of the loss."""
  body_N, head, batch = _setup(t=32)
  out = {}
  for forward in ("direct", "split"):
    cfg = S.SpsaConfig(n_pert=8, pert_chunk=4, time_block=16, forward=forward)
    est = jax.jit(S.estimate, static_argnames="cfg")
    with memory.matmul_precision("highest", "cpu"):
      out[forward] = est(body_N, head, batch, jnp.full((2,), 1e-3), jnp.int32(3), jnp.arange(2),
                         jax.random.key(2), cfg=cfg)
  np.testing.assert_allclose(out["split"][1], out["direct"][1], rtol=1e-6)
  for g_s, g_d in zip(jax.tree.leaves(out["split"][0]), jax.tree.leaves(out["direct"][0])):
    assert _rel(np.asarray(g_s), np.asarray(g_d)) < 1e-3


TEXT = (b"The quick brown fox jumps over the lazy dog. A byte-level model learns which bytes "
        b"follow which: spaces after words, capitals after full stops, and the word 'the' "
        b"again and again. ") * 8


def _train(forward: str, steps: int = 12):
  mc = M.ModelConfig(d_t=16, d_e=8, depth=2, shared_head=False)
  cfg = S.StepConfig(model=mc, spsa=S.SpsaConfig(n_pert=8, pert_chunk=4, time_block=16,
                                                 forward=forward), train_head=True)
  body_N, head_N = M.init_experts(jax.random.key(0), mc, 2)
  state = TS.init_state(body_N, head_N, 1e-2, 1e-3, cfg.weight_decay, cfg.train_head)
  data = np.frombuffer(TEXT, np.uint8)
  rng = np.random.default_rng(0)
  step = jax.jit(S.train_step, static_argnames="cfg")
  with memory.matmul_precision("default", "cpu"):
    for _ in range(steps):
      starts = rng.integers(0, len(data) - 33, (2, 1, 4))
      batch = jnp.asarray(data[starts[..., None] + np.arange(33)])
      state, _ = step(state, batch, jnp.arange(2), cfg=cfg)
  held_out = jnp.asarray(np.stack([data[i:i + 33] for i in range(0, 8 * 40, 40)]).reshape(2, 4, 33))
  return np.asarray(TS.expert_losses(state.body, state.head, held_out, shared_head=False))


def test_twelve_updates_split_end_within_0_2_percent_of_direct():
  """12 tiny training updates both ways: the held-out losses end within 0.2% of each
  other, while training moved them by far more than that (so the check can fail)."""
  direct, split = _train("direct"), _train("split")
  start = _train("direct", steps=0)
  assert np.all(np.abs(split - direct) <= 2e-3 * direct), (split, direct)
  assert np.all(start - direct > 10 * 2e-3 * direct), (start, direct)


def test_split_weights_are_read_once_per_expert():
  """In the lowered split step no float32 matmul takes a per-copy weight (the direct step's
  are [N, C, 2, in, out]: N = 2 experts, C = 3 directions, 2 signs, checked too); the probes
  [N, C, in, out] enter bfloat16 matmuls, once for both signs."""
  mc = M.ModelConfig(d_t=8, d_e=4, depth=1, shared_head=False)

  def rhs_shapes(forward):
    cfg = S.StepConfig(model=mc, spsa=S.SpsaConfig(n_pert=3, pert_chunk=3, time_block=8,
                                                   forward=forward), train_head=True)
    state = jax.eval_shape(lambda: TS.init_state(*M.init_experts(jax.random.key(0), mc, 2),
                                                1e-3, 1e-3, cfg.weight_decay, cfg.train_head))
    batch = jax.ShapeDtypeStruct((2, 1, 5, 17), jnp.uint8)
    text = jax.jit(S.train_step, static_argnames="cfg").lower(
        state, batch, jax.ShapeDtypeStruct((2,), jnp.int32), cfg=cfg).as_text()
    return [line.rsplit(" : (", 1)[1].split(") ->")[0].split(", ")[1]
            for line in text.splitlines() if "stablehlo.dot_general" in line]

  per_copy = lambda shapes: [s for s in shapes if s.startswith("tensor<2x3x2x") and "f32" in s]
  split, direct = rhs_shapes("split"), rhs_shapes("direct")
  assert not per_copy(split), per_copy(split)
  probes = [s for s in split if s.endswith("xbf16>")]
  assert len(probes) == 6 and all(s.startswith("tensor<2x3x") and s.count("x") == 4 for s in probes)
  assert len(per_copy(direct)) == 6 and not [s for s in direct if "bf16" in s]


def test_split_needs_the_model_loss_and_a_known_forward():
  with pytest.raises(ValueError, match="forward must be one of"):
    S.SpsaConfig(forward="fused")
  body_N, head, batch = _setup(t=8)
  cfg = S.SpsaConfig(n_pert=2, pert_chunk=2, forward="split")
  with pytest.raises(ValueError, match="needs the model's own loss"):
    S.estimate(body_N, head, batch, jnp.full((2,), 1e-3), jnp.int32(0), jnp.arange(2),
               jax.random.key(0), cfg, loss_fn=M.loss)


def test_split_leaves_only_the_matrices_it_names():
  body = M.init_body(jax.random.key(0), M.ModelConfig(d_t=8, d_e=4, depth=1))
  z = jax.tree.map(jnp.ones_like, body)
  kinds = lambda forward: {
      jax.tree_util.keystr(path): type(leaf).__name__
      for path, leaf in jax.tree_util.tree_flatten_with_path(
          S.perturb(body, z, jnp.float32(1e-3), forward), is_leaf=lambda x: isinstance(x, L.Split))[0]}
  split, recurrence = kinds("split"), kinds("split_recurrence")
  assert {k for k, v in split.items() if v == "Split"} == {
      "['blocks'][0]['lstm']['w_x']", "['blocks'][0]['lstm']['w_h']", "['blocks'][0]['mlp']['w_in']",
      "['blocks'][0]['mlp']['w_out']", "['in_proj']", "['out_proj']"}
  assert {k for k, v in recurrence.items() if v == "Split"} == {"['blocks'][0]['lstm']['w_h']"}
  gaussian = S.perturb(body, z, jnp.float32(1e-3), "split", probe_kind="gaussian")
  assert gaussian["blocks"][0]["lstm"]["w_h"].z.dtype == jnp.float32
  assert S.perturb(body, z, jnp.float32(1e-3), "split")["in_proj"].z.dtype == jnp.bfloat16

