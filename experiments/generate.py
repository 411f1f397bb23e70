"""Sample text from the routed ensemble of a training workdir.

  python experiments/generate.py --workdir=runs/soma_n4 --prompt="def main(" \
      --max_bytes=400 --temperature=0.8 --top_p=0.95 --seed=0

Cold start: the router sees the prompt's first 256 bytes; a shorter prompt is routed on
the bytes it has, and an empty prompt on the empty string (always the same experts).
The selected experts stay fixed for the whole sample. An empty prompt is fed a single
newline byte as context, which is not printed. Invalid UTF-8 in the output is shown
as \\xNN escapes.
"""

import os
import sys

from absl import flags

from soma_jax import checkpoint as ckpt_lib
from soma_jax import cli, runs
from soma_jax import generate as gen_lib
from soma_jax.data.router import Router
from soma_jax.errors import UserError

_WORKDIR = flags.DEFINE_string("workdir", None, "training run folder (checkpoints, config)")
_PROMPT = flags.DEFINE_string(
    "prompt", "", "text to continue; routed on its first 256 bytes, or on all of it if "
    "shorter (an empty prompt is routed on the empty string and fed one newline byte)")
_MAX_BYTES = flags.DEFINE_integer(
    "max_bytes", 400, f"bytes to sample, at most {gen_lib.MAX_BYTES:,} (printed as they come)")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "sampling temperature (0 = greedy)")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "nucleus mass kept, in (0, 1]")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed")
_TOP_K = flags.DEFINE_integer("top_k", 4, "experts mixed (capped at N)")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: the newest)")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "data dir holding router.npz (default: the run's)")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  del argv
  if not 0 <= _MAX_BYTES.value <= gen_lib.MAX_BYTES or _TOP_K.value < 1:
    raise UserError(f"--max_bytes must be in 0..{gen_lib.MAX_BYTES:,} and --top_k >= 1; "
                    "fix: pass values in range")
  gen_lib.check_sampling(_TEMPERATURE.value, _TOP_P.value)
  if not os.path.isdir(_WORKDIR.value):
    raise UserError(f"workdir {_WORKDIR.value!r} does not exist; fix: pass a training run folder")
  cli.log_devices()
  step, state, _, spec = runs.restore_state(_WORKDIR.value, _STEP.value)
  if not spec.method.generates:
    raise UserError(f"{_WORKDIR.value!r} is a method={spec.method.name} run (the paper's GRU); "
                    "generate.py samples LSTM experts only; fix: pass a soma, bptt or eggroll_lstm run")
  data_dir = ckpt_lib.check_data(_WORKDIR.value, spec.data_dir, _DATA_DIR.value)
  router = Router.load(os.path.join(data_dir, "router.npz"))
  prompt = _PROMPT.value.encode("utf-8", errors="surrogateescape")
  routes, chunks = gen_lib.generate_stream(
      state.body, state.head, spec.shared_head, router, prompt, _MAX_BYTES.value,
      _TEMPERATURE.value, _TOP_P.value, _SEED.value, _TOP_K.value)
  print(f"[checkpoint at step {step}; experts {', '.join(map(str, routes.tolist()))}]",
        file=sys.stderr)
  out = gen_lib.Printable()
  sys.stdout.write(out(prompt))
  for chunk in chunks:
    sys.stdout.write(out(chunk))
    sys.stdout.flush()
  sys.stdout.write(out(b"", final=True) + "\n")

if __name__ == "__main__":
  cli.run(main)
