"""The paper's comparisons (SPEC 9) at small scale, by SPEC 9.6: equal-update seeds continued
with their optimizer state, budgets the machine's load cannot move, the compared phase's gains.

  python experiments/compare.py --config=experiments/configs/compare.py:study=table4,size=cpu --out=runs/table4
  python experiments/compare.py --config=experiments/configs/compare.py:study=table7,size=cpu --out=runs/table7
  python experiments/compare.py --list   (every study, and what it is)

Arguments: study (default table4), size (cpu: the recorded runs; tiny: tests) and a study's
own (seeds=, rungs=, corpus=, width=: see its config). Each study's config lives with the
study, `config(arg)` of its module in soma_jax/studies/ (the shared recipes and scale:
soma_jax/studies/recipes.py); this file hands the argument to it. Any field can be changed
on the command line, e.g. --config.methods.bptt.opt.lr=1e-3 or --config.budget=2000.
"""

import ml_collections

from soma_jax.errors import UserError
from soma_jax.studies.compare import STUDIES  # the one list of compare.py's studies

DEFAULT = next(iter(STUDIES))  # the registry's first study (table4)


def study_of(arg: str | None) -> str:
  """The argument's study=NAME (DEFAULT when it names none)."""
  named = [item.split("=", 1)[1].strip() for item in (arg or "").split(",")
           if item.split("=", 1)[0].strip() == "study" and "=" in item]
  return named[-1] if named else DEFAULT


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  study = study_of(arg)
  if study not in STUDIES:
    raise UserError(f"compare.py:{arg}: use study= one of {', '.join(STUDIES)} (python "
                    "experiments/compare.py --list) and size=cpu or tiny")
  if study == DEFAULT and "study" not in (arg or ""):
    arg = f"study={DEFAULT}," + (arg or "")
  return STUDIES[study].config(arg)
