"""The paper's comparisons at any scale (SPEC 9): `run` dispatches on config.study.

  table4  SPEC 9.1: how to spend a device-time budget (SOMA N = 2, monoliths at 1x / 4x / 16x
          SOMA's directions, EGGROLL, BPTT, and the head-only and summed-loss controls)
  table7  SPEC 9.2: SOMA N = 2 against the monolith of the same size at equal device time
          and equal tuning (lr then eps grid, selection on validation, test once)

Both start every row from its architecture's own warm start (`protocol`). `run(config, out)`
writes OUT/results.json and OUT/table.md; the runs live in OUT/seeds and OUT/runs/seedS/NAME
and resume like any training run.
"""

from __future__ import annotations

import ml_collections

from soma_jax.errors import UserError
from soma_jax.studies import ladder, table4, table7

STUDIES = ("table4", "table7", "ladder")  # ladder: SPEC 9.7, the width ladder


def _module(study: object):
  if study not in STUDIES:
    raise UserError(f"study={study!r}; use one of {', '.join(STUDIES)}")
  return {"table4": table4, "table7": table7, "ladder": ladder}[study]


def run(config: ml_collections.ConfigDict, out: str, command: str = "") -> dict:
  """Runs config.study (table4 or table7) into `out`; returns its results.json payload."""
  return _module(config.study).run(config, out, command)


def table(payload: dict) -> str:
  """The markdown table of a study's results.json payload."""
  return _module(payload.get("study")).table(payload)
