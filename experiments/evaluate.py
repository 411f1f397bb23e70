"""Routed ensemble evaluation of a training workdir (SPEC 4): nats/byte with a 95% interval.

  python experiments/evaluate.py --workdir=runs/soma_n4 --split=test --json=eval.json
  python experiments/evaluate.py --workdir=runs/soma_n4 --split=wikitext103:wiki.test.raw
  python experiments/evaluate.py --workdir=runs/soma_n4 --k_sweep --pairs --out_dir=eval_out

Each window is routed on its first 256 bytes to its top-k experts, whose next-byte
probabilities are averaged in float64; the loss is the mean over targets 257..1024.
`--k_sweep` scores k = 1..N (or --ks) in the same pass and writes k_sweep.csv/.png;
`--pairs` writes the pairwise complementarity analysis (pairs.csv/.png).
"""

import json
import os

from absl import flags

from soma_jax import checkpoint as ckpt_lib
from soma_jax import cli, runs
from soma_jax import evaluate as eval_lib
from soma_jax.data.router import Router
from soma_jax.errors import UserError, check_output, writable_dir, writable_file

_WORKDIR = flags.DEFINE_string("workdir", None, "training run folder (checkpoints, config)")
_SPLIT = flags.DEFINE_string("split", "test", "test | ensemble_val | wikitext103:PATH")
_TOP_K = flags.DEFINE_integer("top_k", 4, "experts averaged per window (capped at N)")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: the newest)")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "prepared data dir (default: the run's config)")
_JSON = cli.output_flag("json", None, "write the result dict here")
_K_SWEEP = flags.DEFINE_bool("k_sweep", False, "also score k = 1..N (or --ks) in the same pass")
_KS = flags.DEFINE_list("ks", None, "k values for --k_sweep, e.g. 1,2,4,8 (default 1..N)")
_PAIRS = flags.DEFINE_bool("pairs", False, "pairwise complementarity of the top-k experts")
_OUT_DIR = cli.output_flag("out_dir", None, "folder for CSV/PNG (default WORKDIR/eval)", kind="folder")
_DRAWS = flags.DEFINE_integer("draws", 10_000, "document-bootstrap draws")
_SEED = flags.DEFINE_integer("seed", 0, "bootstrap seed")
flags.mark_flags_as_required(["workdir"])


def _ks(n: int) -> list[int] | None:
  if not _K_SWEEP.value:
    return None
  if not _KS.value:
    return list(range(1, n + 1))
  try:
    ks = [int(k) for k in _KS.value]
  except ValueError:
    raise UserError(f"--ks={','.join(_KS.value)} must be integers, e.g. 1,2,4") from None
  if min(ks) < 1:
    raise UserError("--ks values must be >= 1")
  return ks


def main(argv):
  del argv
  if _TOP_K.value < 1 or _DRAWS.value < 1:
    raise UserError("--top_k and --draws must be >= 1")
  eval_lib.check_split(_SPLIT.value)
  workdir = _WORKDIR.value
  if not os.path.isdir(workdir):
    raise UserError(f"workdir {workdir!r} does not exist; fix: pass a training run folder")
  if _JSON.value:
    writable_file(_JSON.value, "--json")  # before the evaluation, not after it
  if _OUT_DIR.value:
    writable_dir(_OUT_DIR.value, "--out_dir")
  else:  # the default, WORKDIR/eval (written only for a k sweep or pairs), checked as well
    check_output(os.path.join(workdir, "eval"), "--out_dir (default WORKDIR/eval)", "folder")
  cli.log_devices()
  trained_dir = ckpt_lib.read_config(workdir).data.dir
  data_dir = ckpt_lib.check_data(workdir, trained_dir, _DATA_DIR.value,
                                 ("router.npz", *eval_lib.split_files(_SPLIT.value)))
  step, state, _, spec = runs.restore_state(workdir, _STEP.value)
  body_N, head = state.body, state.head
  print(f"{workdir}: checkpoint at step {step}")
  windows, doc_ids = eval_lib.load_split(data_dir, _SPLIT.value)
  router = Router.load(os.path.join(data_dir, "router.npz"))
  result = eval_lib.evaluate(body_N, head, windows, doc_ids, router, _TOP_K.value,
                             spec.shared_head, ks=_ks(spec.n_experts), pairs=_PAIRS.value,
                             draws=_DRAWS.value, seed=_SEED.value, logits_fn=spec.method.logits)
  result.update(split=_SPLIT.value, workdir=workdir, step=step, num_experts=spec.n_experts)
  out_dir = _OUT_DIR.value or os.path.join(workdir, "eval")
  if "k_sweep" in result or "pairs" in result:
    writable_dir(out_dir, "--out_dir")
  if "k_sweep" in result:
    eval_lib.write_k_sweep(result["k_sweep"], os.path.join(out_dir, "k_sweep.csv"),
                           os.path.join(out_dir, "k_sweep.png"), mark_k=min(4, spec.n_experts))
    print(f"k sweep: {out_dir}/k_sweep.csv, {out_dir}/k_sweep.png")
  if "pairs" in result:
    eval_lib.write_pairs(result["pairs"], os.path.join(out_dir, "pairs.csv"),
                         os.path.join(out_dir, "pairs.png"))
    print(f"pairs: {out_dir}/pairs.csv, {out_dir}/pairs.png")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(result, f, indent=1)
  lo, hi = result["ci95"]
  print(f"{_SPLIT.value}: {result['nats_per_byte']:.4f} nats/byte (95% CI {lo:.4f}..{hi:.4f}), "
        f"{result['bits_per_byte']:.4f} bits/byte, top-{result['top_k']} of {spec.n_experts}, "
        f"{result['num_windows']} windows, {result['num_targets']} targets")
  for r in result["per_expert"]:
    own = "-" if r["nats_per_byte"] is None else f"{r['nats_per_byte']:.4f}"
    print(f"  expert {r['expert']}: {r['num_windows']} windows, own loss {own}")


if __name__ == "__main__":
  cli.run(main)
