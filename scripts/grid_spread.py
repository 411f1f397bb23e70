r"""How much each tuning stage of a Table 7 search moved the selected validation loss.

  python -m scripts.grid_spread --results=docs/results/table7_cpu_shared_start.json \
      --json=docs/results/table7_grid_spread.json

For every architecture and optimisation seed of a study=table7 results.json: the spread (largest minus smallest final ensemble-validation loss) over the
lr stage (every lr at the base eps) and over the eps stage (every eps at the selected lr),
then the smallest and largest of each over all searches. Nothing is trained: it reads the
configurations the study recorded. The ladder's cpu grid drops the eps stage on this
evidence (experiments/configs/compare.py).
"""

from __future__ import annotations

import argparse
import json

from soma_jax import cli
from soma_jax.errors import UserError, check_output_args, exit_on_user_error
from soma_jax.studies import table7


def spread(values: list[float]) -> float | None:
  return max(values) - min(values) if len(values) > 1 else None


def search_spread(per_seed: dict, base_eps: float) -> dict:
  """One search's stage spreads, from its recorded configurations."""
  tried, lr = per_seed["configurations"], per_seed["selected"]["lr"]
  lr_stage = [r["val_nats_per_byte"] for r in tried if r["eps"] == base_eps]
  eps_stage = [r["val_nats_per_byte"] for r in tried if r["lr"] == lr]
  return {"seed": per_seed["seed"], "selected": per_seed["selected"],
          "lr_stage_points": len(lr_stage), "lr_stage_spread": spread(lr_stage),
          "eps_stage_points": len(eps_stage), "eps_stage_spread": spread(eps_stage)}


def grid_spread(results: dict) -> dict:
  """Every search's spreads and the range of each stage's over all searches."""
  try:
    base, methods = results["tuning"]["base_lr"], results["methods"]
  except (KeyError, TypeError):
    raise UserError("--results has no 'tuning' and 'methods': give a "
                    f"study={table7.STUDY.name} results.json") from None
  searches = {name: [search_spread(p, base) for p in m["per_seed"]] for name, m in methods.items()}
  out = {"study": results.get("study"), "base_eps": base, "searches": searches}
  for stage in ("lr_stage_spread", "eps_stage_spread"):
    values = [s[stage] for ss in searches.values() for s in ss if s[stage] is not None]
    out[stage] = {"min": min(values), "max": max(values), "searches": len(values)} if values else None
  return out


@exit_on_user_error
def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--results", required=True, help="a study's results.json")
  parser.add_argument("--json", default=None, help="write the result here")
  args = parser.parse_args()
  check_output_args(parser, args, json="file")
  try:
    with open(args.results) as f:
      results = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"--results={args.results!r} is not a readable JSON file ({e}); fix: the "
                    "results.json a compare.py study wrote") from None
  cli.emit_json(grid_spread(results), args.json)


if __name__ == "__main__":
  main()
