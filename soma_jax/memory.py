"""Device memory: XLA's plan for a compiled step, the device's limit, `pert_chunk="auto"`.

The SPSA step's memory grows with the number of directions evaluated at once (the
chunk C: 2 N C perturbed copies of the weights and their activations, N C with the signs
of a direction evaluated apart) and not with T
(`model.streamed_loss`). On a GPU the fastest step is the largest chunk that fits, so
"auto" compiles the step (no run) and reads XLA's buffer plan against the device's
`bytes_limit`. On a CPU small chunks measure fastest: about 8 rows per loop iteration,
rows being perturbed copies of the weights (N C, the two signs of a direction apart)
times the B sequences each copy runs. At the cpu preset (B = 2) on 2 cores that is 4
copies, C = 4, 2, 1, 1 for N = 1, 2, 4, 8: the fastest of C = 1, 2, 4 with the signs
apart or together at N = 2, 4, 8, and 1% behind the fastest at N = 1
(`benchmarks/step_sweep.py`, docs/results/step_sweep_cpu_n*.json). At the studies' B = 4 it
is 2 copies: SOMA N = 2 (one expert per host device) at C = 2 ran 0.82x and 0.89x the
seconds per update of C = 4, side by side (docs/results/study_steps_levers_cpu.json).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import jax

from soma_jax.errors import UserError

# Rows per loop iteration, perturbed weight copies (N C with the signs apart, 2 N C
# together) x B, that run fastest on a CPU: 4 copies of B = 2 at N = 1, 2, 4 (at N = 8 one
# direction, 8 copies, was fastest), measured from 1 to 64 copies on 2 cores
# (docs/results/step_sweep_cpu_n*.json); 2 copies of B = 4 at the studies' width 32
# (docs/results/study_steps_levers_cpu.json: 1 copy was slower for the monolith).
CPU_ROWS = 8
MARGIN = 0.85  # plan at most this fraction of the device limit (allocator slack, metrics)
PRECISIONS = ("default", "high", "highest")


def planned_bytes(compiled) -> int:
  """XLA's buffer plan of a compiled program: arguments + outputs + temporaries - aliased."""
  m = compiled.memory_analysis()
  if m is None:
    return -1
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)


def device_limit_bytes(device: jax.Device | None = None) -> int | None:
  """What the allocator may hand out on `device` (None where unknown, e.g. the CPU)."""
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # some backends do not implement memory_stats
    return None
  limit = stats.get("bytes_limit")
  return int(limit) if limit else None


def host_memory_bytes() -> int | None:
  """This machine's physical memory (None where unknown): what a CPU step can plan at most."""
  try:
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
  except (AttributeError, ValueError, OSError):
    return None


def check_fits(choice: ChunkChoice, what: str, platform: str) -> None:
  """A UserError when XLA's plan for the step is more than the device holds (its limit; on a
  CPU the machine's memory): the run would fail inside its first update, or swap."""
  limit = choice.limit_bytes or (host_memory_bytes() if platform == "cpu" else None)
  if choice.planned_bytes > 0 and limit and choice.planned_bytes > limit:
    where = "device" if choice.limit_bytes else "machine's memory"
    raise UserError(f"the training step plans {choice.planned_bytes / 1e9:.2f} GB at "
                    f"pert_chunk={choice.chunk} ({what}), more than the {limit / 1e9:.2f} GB "
                    f"of this {where}; fix: a smaller spsa.pert_chunk (or auto), spsa.n_pert, "
                    "spsa.batch or model size")


def divisors_desc(n: int) -> list[int]:
  """n's divisors, largest first (in O(sqrt n): n_pert may be large)."""
  small = [c for c in range(1, math.isqrt(n) + 1) if n % c == 0]
  return sorted(set(small) | {n // c for c in small}, reverse=True)


def cpu_chunk(n_pert: int, n_experts: int, signs_together: bool = True, batch: int = 2) -> int:
  """The CPU's chunk: the largest divisor C of n_pert whose rows per loop iteration
  (perturbed copies, 2 N C with both signs together, N C with the signs apart, times the
  B = `batch` sequences of each) are at most CPU_ROWS, or 1."""
  per_direction = n_experts * (2 if signs_together else 1) * batch
  return max(c for c in divisors_desc(n_pert) if c == 1 or per_direction * c <= CPU_ROWS)


@dataclasses.dataclass(frozen=True)
class ChunkChoice:
  chunk: int
  planned_bytes: int  # XLA's plan for the step at this chunk (-1 if not compiled)
  limit_bytes: int | None  # device limit, None on the CPU
  reason: str

  def describe(self) -> str:
    gb = lambda b: f"{b / 1e9:.2f} GB"
    plan = gb(self.planned_bytes) if self.planned_bytes >= 0 else "not planned"
    limit = f" of {gb(self.limit_bytes)} device limit" if self.limit_bytes else ""
    return f"pert_chunk={self.chunk} ({self.reason}); step plans {plan}{limit}"


def choose_pert_chunk(plan_at: Callable[[int], int], n_pert: int, platform: str,
                      limit_bytes: int | None, margin: float = MARGIN,
                      n_experts: int = 1, signs_together: bool = True,
                      batch: int = 2) -> ChunkChoice:
  """The largest divisor of n_pert whose step plans within margin x limit (GPU/TPU), or
  the CPU's small chunk for `n_experts` experts of B = `batch` on the device (`cpu_chunk`).
  `plan_at(chunk)` compiles
  the step and returns planned bytes.

  Plans grow about linearly in the chunk, so after the full chunk and the smallest one
  the fit is predicted from the line through them and checked by one more compile,
  stepping down until a chunk fits: a handful of compiles, not one per divisor.
  """
  divs = divisors_desc(n_pert)
  if platform == "cpu" or not limit_bytes:
    chunk = cpu_chunk(n_pert, n_experts, signs_together, batch)
    why = "auto: small chunks run fastest on the CPU" if platform == "cpu" else \
        "auto: device limit unknown, CPU default"
    return ChunkChoice(chunk, plan_at(chunk), limit_bytes, why)
  budget = margin * limit_bytes
  plans = {divs[0]: plan_at(divs[0])}
  if plans[divs[0]] <= budget:
    return ChunkChoice(divs[0], plans[divs[0]], limit_bytes, "auto: all directions at once")
  smallest = divs[-1]
  plans[smallest] = plan_at(smallest)
  if plans[smallest] > budget:
    return ChunkChoice(smallest, plans[smallest], limit_bytes,
                       "auto: even one direction at a time exceeds the device; expect OOM")
  per_dir = (plans[divs[0]] - plans[smallest]) / max(divs[0] - smallest, 1)
  fits = lambda c: plans[smallest] + per_dir * (c - smallest) <= budget
  for c in (c for c in divs if fits(c) or c == smallest):
    plans.setdefault(c, plan_at(c))
    if plans[c] <= budget:
      return ChunkChoice(c, plans[c], limit_bytes, "auto: largest chunk that fits")
  raise AssertionError("unreachable: the smallest chunk fits")


# The dot algorithm (`jax.lax.DotAlgorithmPreset`) each precision setting names on every
# matmul of the training step, per backend, chosen when the step is traced. A GPU (CUDA):
# default = one TF32 tensor-core pass, high = three TF32 passes (about float32's accuracy,
# still on tensor cores), highest = plain float32; so XLA can neither fall back to the
# non-tensor-core float32 path at default nor round to TF32 at highest. The CPU: JAX
# refuses the TF32 algorithms there, and XLA:CPU computes every float32 dot in float32
# whatever the algorithm (its other "supported" presets only round the operands to bf16
# first), so all three are F32_F32_F32. Other backends keep the legacy Precision levels.
DOT_ALGORITHMS = {
    "gpu": {"default": "TF32_TF32_F32", "high": "TF32_TF32_F32_X3", "highest": "F32_F32_F32"},
    "cpu": {"default": "F32_F32_F32", "high": "F32_F32_F32", "highest": "F32_F32_F32"},
}
FULL_F32 = "F32_F32_F32"  # evaluation (SPEC 3.3), on the CPU and GPU alike


def dot_algorithm(name: str, platform: str | None = None) -> str:
  """The algorithm (or, off CPU and GPU, the legacy level) of precision `name` on
  `platform` ("cpu", "gpu", ...; None: the default backend)."""
  if name not in PRECISIONS:
    raise ValueError(f"precision={name!r}; use one of {', '.join(PRECISIONS)}")
  platform = platform or jax.default_backend()
  return DOT_ALGORITHMS.get(platform, {}).get(name, name)


def matmul_precision(name: str, platform: str | None = None):
  """Context for the step's float32 matmuls: every dot traced inside carries the explicit
  algorithm of `name` on `platform` (`dot_algorithm`), batched ones included. Float32
  only: an algorithm names its operand types, so a float64 dot traced inside would be
  rounded to float32 (the training step has none; the float64 tests run outside)."""
  return jax.default_matmul_precision(dot_algorithm(name, platform))


def full_precision(platform: str | None = None):
  """Context for evaluation: plain float32 dots whatever the training precision."""
  platform = platform or jax.default_backend()
  return jax.default_matmul_precision(FULL_F32 if platform in DOT_ALGORITHMS else "highest")
