r"""The SOMA step against a PyTorch nn.LSTM trained by a MeZO-style loop, perturbed tokens/s.

  python -m benchmarks.torch_mezo --n=4 --d_t=64 --n_pert=16 --batch=16 --seq_len=256 \
      --json=bench_out/torch_mezo.json

PyTorch is optional (`pip install -e ".[bench]"`); without it this prints one line saying
so and exits 0. Both sides train N experts of the same shape (a byte embedding of width
d_E tied to the output, projections to width d_t, D pre-norm residual blocks of a bias-free
LSTM and a 4 d_t GELU MLP, gain-only LayerNorms) with n_pert two-sided directions per
update, every direction on the same B x T batch:

* PyTorch: one `nn.LSTM` per block (oneDNN / MKL kernels), experts one after another, and
  the MeZO recipe (Malladi et al. 2023): for each direction, add eps z in place, loss, add
  -2 eps z, loss, add eps z back, z regenerated each time from the direction's seed, then
  an SGD step that regenerates each z once more. Gaussian z, `torch.inference_mode`, all of
  PyTorch's intra-op threads.
* JAX: the SOMA step of `soma.py:n=N,size=cpu` at these shapes, in the device layout that
  training uses (on a CPU one host device per core) and on one device.

Perturbed tokens per update are 2 n_pert B T N on both sides. JAX is timed first, then
PyTorch (so PyTorch's OpenMP threads, which spin after each call, never run beside XLA's);
each figure is the median of --reps updates after one warm-up update.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
from absl import flags

from benchmarks import step_timing
from soma_jax import cli
from soma_jax import config as config_lib
from soma_jax import spec as spec_lib

_N = flags.DEFINE_integer("n", 4, "experts N")
_D_T = flags.DEFINE_integer("d_t", 64, "body width")
_N_PERT = flags.DEFINE_integer("n_pert", 16, "directions per update")
_BATCH = flags.DEFINE_integer("batch", 16, "sequences B per batch")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "targets T per sequence")
_TIME_BLOCK = flags.DEFINE_integer(
    "time_block", 0, "JAX's spsa.time_block; 0 = the cpu preset's rows per block, "
    "B x time_block = 2 x 256 = 512 (32 at B = 16)")
_REPS = flags.DEFINE_integer("reps", 5, "timed updates per side (median)")
_JSON = cli.output_flag("json", None, "write the results here")

PRESET_ROWS = 2 * 256  # the cpu preset's B x time_block
MISSING = ("torch_mezo: PyTorch is not installed, nothing measured; fix: "
           "pip install -e '.[bench]' (or pip install torch)")


def soma_config(n: int, d_t: int, n_pert: int, batch: int, seq_len: int, time_block: int = 0):
  """The cpu preset at the benchmark's shapes (width, directions, B, T).

  Its time block of 256 positions was the fastest at B = 2 (step_sweep); what matters for
  the cache is the block's rows, B x time_block, so `time_block=0` keeps those at the
  preset's 512 (at B = 16 on 2 cores, 32 ran faster than 256: `--time_block=256` times it).
  """
  c = config_lib.load_config_file(
      os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                   "configs", "soma.py"), f"n={n},size=cpu")
  c.model.d_t = d_t
  c.spsa.update(n_pert=n_pert, batch=batch)
  c.data.seq_len = seq_len
  rows = PRESET_ROWS
  c.spsa.time_block = min(time_block or max(1, rows // batch), seq_len)
  return c


class TorchExpert:
  """One expert in PyTorch: the SOMA body's shape, built from nn.LSTM / nn.Linear."""

  def __init__(self, torch, d_t: int, d_e: int, depth: int, seed: int):
    nn = torch.nn
    torch.manual_seed(seed)
    self.torch = torch
    self.embed = nn.Embedding(256, d_e)
    nn.init.normal_(self.embed.weight, std=d_e**-0.5)  # unit-variance logits, as JAX's head
    self.in_proj = nn.Linear(d_e, d_t, bias=False)
    self.blocks = [(nn.LayerNorm(d_t, bias=False), nn.LSTM(d_t, d_t, bias=False),
                    nn.LayerNorm(d_t, bias=False),
                    nn.Sequential(nn.Linear(d_t, 4 * d_t, bias=False), nn.GELU(),
                                  nn.Linear(4 * d_t, d_t, bias=False)))
                   for _ in range(depth)]
    self.ln_f = nn.LayerNorm(d_t, bias=False)
    self.out_proj = nn.Linear(d_t, d_e, bias=False)
    modules = [self.embed, self.in_proj, self.ln_f, self.out_proj,
               *(m for block in self.blocks for m in block)]
    self.params = [p for m in modules for p in m.parameters()]

  def loss(self, inputs_TxB, targets_TxB) -> float:
    """Mean next-byte cross entropy of time-major byte windows."""
    x = self.in_proj(self.embed(inputs_TxB))
    for ln1, lstm, ln2, mlp in self.blocks:
      x = x + lstm(ln1(x))[0]
      x = x + mlp(ln2(x))
    logits = self.out_proj(self.ln_f(x)) @ self.embed.weight.T
    return float(self.torch.nn.functional.cross_entropy(logits.reshape(-1, 256),
                                                        targets_TxB.reshape(-1)))

  def add_noise(self, seed: int, scale: float) -> None:
    """params += scale z, z ~ N(0, 1) drawn afresh from `seed` (MeZO keeps no z)."""
    gen = self.torch.Generator().manual_seed(seed)
    for p in self.params:
      p.add_(self.torch.randn(p.shape, generator=gen), alpha=scale)


def mezo_update(expert: TorchExpert, inputs, targets, seeds, eps: float, lr: float) -> float:
  """One MeZO-style update of one expert: len(seeds) two-sided directions, then SGD."""
  grads, losses = [], []
  for s in seeds:
    expert.add_noise(s, eps)
    plus = expert.loss(inputs, targets)
    expert.add_noise(s, -2 * eps)
    minus = expert.loss(inputs, targets)
    expert.add_noise(s, eps)
    grads.append((plus - minus) / (2 * eps))
    losses.append((plus + minus) / 2)
  for s, g in zip(seeds, grads, strict=True):
    expert.add_noise(s, -lr * g / len(seeds))
  return float(np.mean(losses))


def torch_side(n, d_t, d_e, depth, n_pert, batch_NxBxT1, reps) -> dict:
  import torch

  experts = [TorchExpert(torch, d_t, d_e, depth, seed=e) for e in range(n)]
  windows = [torch.from_numpy(w.T.astype(np.int64)) for w in batch_NxBxT1]  # [T + 1, B]
  rng = np.random.default_rng(0)

  def update() -> list[float]:
    out = []
    for expert, w in zip(experts, windows, strict=True):
      seeds = rng.integers(0, 2**31, n_pert).tolist()
      out.append(mezo_update(expert, w[:-1], w[1:], seeds, eps=1e-3, lr=1e-4))
    return out

  losses = []
  with torch.inference_mode():  # one warm-up update (oneDNN primitive caches), then the median
    seconds = step_timing.timeit(lambda: losses.append(update()), reps)
  return {"torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
          "torch_params_per_expert": sum(p.numel() for p in experts[0].params),
          "torch_step_seconds": seconds, "torch_mean_loss": losses[-1]}


def jax_side(spec: spec_lib.RunSpec, reps: int) -> dict:
  """The SOMA step in training's layout and on one device (step_timing's timings)."""
  out = step_timing.benchmark(spec, reps, loop=False, ideals=False)
  keep = ("layout", "step_seconds", "one_device_step_seconds", "pert_chunk",
          "one_device_pert_chunk", "params_per_expert", "devices")
  return {k: out.get(k, out["config"].get(k)) for k in keep}


def main(argv):
  del argv
  if importlib.util.find_spec("torch") is None:
    print(MISSING)
    return
  spec = spec_lib.resolve(soma_config(_N.value, _D_T.value, _N_PERT.value, _BATCH.value,
                                      _SEQ_LEN.value, _TIME_BLOCK.value))
  n, m, k = spec.n_experts, spec.method.model, spec.mesh.n_pert
  load = os.getloadavg()[0]
  jax_out = jax_side(spec, _REPS.value)
  batch = np.random.default_rng(0).integers(0, 256, (n, spec.batch, spec.seq_len + 1),
                                            dtype=np.uint8)
  torch_out = torch_side(n, m.d_t, m.d_e, m.depth, k, batch, _REPS.value)
  tokens = 2 * k * spec.batch * spec.seq_len * n
  result = {
      "config": {"n_experts": n, "d_t": m.d_t, "d_e": m.d_e, "depth": m.depth, "n_pert": k,
                 "batch": spec.batch, "seq_len": spec.seq_len,
                 "time_block": spec.method.step_config().spsa.time_block, "reps": _REPS.value},
      "load_average_1m_at_start": load, "perturbed_tokens_per_update": tokens,
      **{f"jax_{k}": v for k, v in jax_out.items()}, **torch_out,
      "torch_perturbed_tokens_per_second": tokens / torch_out["torch_step_seconds"],
      "jax_perturbed_tokens_per_second": tokens / jax_out["step_seconds"],
      "jax_one_device_perturbed_tokens_per_second": tokens / jax_out["one_device_step_seconds"],
  }
  result["speedup_vs_torch"] = torch_out["torch_step_seconds"] / jax_out["step_seconds"]
  result["one_device_speedup_vs_torch"] = (torch_out["torch_step_seconds"]
                                           / jax_out["one_device_step_seconds"])
  cli.emit_json(result, _JSON.value)


if __name__ == "__main__":
  cli.run(main)
