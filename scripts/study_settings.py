r"""The settings of the comparison studies at size=cpu, read from their configs and the model
code (nothing is trained or timed): what docs/table7.md and docs/ladder.md
quote before their results are recorded.

  python -m scripts.study_settings --json docs/results/study_settings.json

Per study: its seeds, seed updates and seed-run seed, budget and unit, tuning grids,
evaluation span and each row's width, parameters and operations per update; for the
ladder, every rung's sizes (`ladder.sizes`) and the mechanism's measurement settings.
"""

from __future__ import annotations

import argparse
import math
import os

from soma_jax import cli
from soma_jax import spec as spec_lib
from soma_jax.config import load_config_file
from soma_jax.errors import check_output_args
from soma_jax.studies import base, driver, ladder, planning, table4, table7

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "experiments", "configs", "compare.py")
KEYS = ("seeds", "seed_updates", "seed_run_seed", "budget", "budget_unit", "budget_checkpoints",
        "lr_factors", "eps_factors", "lr_extend", "eps_extend", "ops_tolerance", "bootstrap_draws")


def study(s: base.Study) -> dict:
  """One study's settings at size=cpu and its rows' sizes."""
  config = load_config_file(CONFIG, f"study={s.name},size=cpu")
  out = {k: config.to_dict()[k] for k in KEYS if k in config}
  out["eval"] = config.eval.to_dict()
  rows = planning.sized(config) if s is not ladder.STUDY else {}
  out["rows"] = {n: {"method": c.method, "d_t": c.model.d_t, "n_experts": c.n_experts,
                     "n_pert": c.spsa.n_pert, "batch": c.spsa.batch, "seq_len": c.data.seq_len,
                     "params": spec_lib.resolve(c).method.ensemble_params,
                     "ops_per_update": spec_lib.resolve(c).total_ops_per_update} for n, c in rows.items()}
  if out.get("budget_unit") == "ops":  # the update at which each row's operations reach it
    matched = config.get("match_updates", {})
    for n, row in out["rows"].items():
      if n in matched:  # a control: the updates its reference took in the same seed
        row["updates_matched_to"] = matched[n]
      else:
        row["updates_in_budget"] = math.ceil(config.budget / row["ops_per_update"])
  if s is ladder.STUDY:
    _, ls = driver.checked(s, config)
    out["rungs"] = [ladder.sizes(ls, w) for w in ls.widths]
    out["mechanism"] = ls.mechanism.record()
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", default=None, help="write the result here")
  args = parser.parse_args()
  check_output_args(parser, args, json="file")
  cli.emit_json({s.name: study(s) for s in (table7.STUDY, table4.STUDY, ladder.STUDY)}, args.json)


if __name__ == "__main__":
  main()
