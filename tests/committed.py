"""The committed results the docs quote (docs/results/NAME.json and the NAME.md its study
rendered from it), for the tests that check a table is its JSON rendered, not an edited copy."""

import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                       "results")


def result(name: str) -> tuple[dict, str]:
  """(docs/results/NAME.json parsed, docs/results/NAME.md's text)."""
  with open(os.path.join(RESULTS, f"{name}.json")) as f:
    payload = json.load(f)
  with open(os.path.join(RESULTS, f"{name}.md")) as f:
    return payload, f.read()
