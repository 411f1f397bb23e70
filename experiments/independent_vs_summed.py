"""SOMA's independent per-expert losses against their sum (the paper's Figure 4): four experts
of a trained ensemble continued twice, same start, sample, batches and directions.

  python experiments/independent_vs_summed.py \
      --config=experiments/configs/independent_vs_summed.py:cpu --out=runs/ivs \
      [--config.init_from=runs/soma_n8] [--config.experts=0,1,2,3]

Writes OUT/results.json, OUT/curves.csv and OUT/figure4.png.
"""

from absl import flags
from ml_collections import config_flags

from soma_jax import cli
from soma_jax.studies import independent

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiments/configs/independent_vs_summed.py:cpu|tiny", lock_config=True)
_OUT = cli.output_flag("out", None, "output folder: results.json, curves.csv, figure4.png", kind="folder")
flags.mark_flags_as_required(["config", "out"])


def main(argv):
  del argv
  cli.log_devices()
  cli.absolute_paths(_CONFIG.value)
  out = cli.workdir_flag(_OUT.value, "--out")
  payload = independent.run(independent.check(_CONFIG.value), out)  # checked, then trained
  for p in payload["paired"]:
    print(f"step {p['step']:>6}: summed - independent = {p['diff_mean']:+.4f} "
          f"+- {p['diff_std']:.4f} nats/byte (sd over {len(p['per_seed'])} seeds; per seed "
          + ", ".join(f"{d:+.4f}" for d in p["per_seed"]) + ")")
  s = payload["summary"]
  print("test documents on which independent is lower, per seed: " + ", ".join(
      f"{k} of {r['num_docs']}" for k, r in zip(s["docs_independent_lower"],
                                                payload["runs"].values(), strict=True)))
  for state, ratio in s["variance_ratio_separate_vs_shared"].items():
    print(f"variance, one summed loss / four own losses at {state}: {ratio:.2f}x")


if __name__ == "__main__":
  cli.run(main)
