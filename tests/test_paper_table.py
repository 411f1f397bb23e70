"""The paper table: every appendix figure and table has a row, every row's JSON is committed,
README (compact) and docs/reproducing.md (full) hold the table as the JSONs give it now, and
every verdict is SPEC 9.8's rule applied to the row's primary intervals in the committed JSON."""

import dataclasses
import os
import re

import pytest

from scripts import paper_table
from soma_jax.studies import paper
from soma_jax.studies import verdict as verdict_lib
from soma_jax.studies.verdict import Interval

ITEMS = [f"Figure {i}" for i in range(7, 18)] + [f"Table {i}" for i in range(1, 14)]


def test_every_figure_and_table_has_one_row():
  named = [name.strip() for r in paper_table.ROWS for name in r.item.split(",")]
  assert sorted(set(ITEMS) - set(named)) == []
  assert len(named) == len(set(named))


def test_every_measured_row_reads_a_committed_json():
  for r in paper_table.ROWS:
    if callable(r.ours):
      assert r.sources, r.item
      for s in r.sources:
        assert os.path.isfile(os.path.join(paper_table.RESULTS, f"{s}.json")), (r.item, s)
    else:
      assert r.ours.startswith(paper.NOT_YET) and not r.sources, r.item
      assert re.search(r"issue \d+|needs", r.ours), r.item  # says what will run it


def test_readme_and_reproducing_hold_the_tables_as_the_jsons_give_them():
  assert paper_table.main(["--check"]) == 0
  with open(os.path.join(paper_table.ROOT, "README.md")) as f:
    assert paper_table.render_compact() in f.read()
  with open(os.path.join(paper_table.ROOT, "docs", "reproducing.md")) as f:
    assert paper_table.render_full() in f.read()


def test_a_stale_table_is_caught(tmp_path):
  for name in paper_table.FILES:
    with open(os.path.join(paper_table.ROOT, name)) as f:
      text = f.read()
    stale = tmp_path / os.path.basename(name)
    stale.write_text(text.replace("| Table 7 |", "| Table 7 (edited) |"))
    assert paper_table.main(["--check", str(stale)]) == 1
    assert paper_table.main(["--write", str(stale)]) == 0
    assert paper_table.main(["--check", str(stale)]) == 0


# ------------------------------------------------------------------ verdicts (SPEC 9.8)

def rule(iv: Interval) -> str:
  """SPEC 9.8's rule written out once more, independently of verdict.verdict."""
  if iv.lo <= iv.null <= iv.hi:
    return "unresolved"
  above = iv.lo > iv.null
  return "reproduces" if above == (iv.paper > 0) else "contradicts"


def compact_verdicts(text: str) -> dict[str, str]:
  """item -> the verdict cell (the last column) of a rendered compact table."""
  out = {}
  for line in text.splitlines():
    cols = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("| ") and cols[0] != "item":
      out[cols[0]] = cols[-1]
  return out


@pytest.mark.parametrize("row", paper_table.ROWS, ids=lambda r: r.item)
def test_every_verdict_is_the_rule_on_the_committed_json(row):
  """Each primary interval read from the committed JSON, each verdict by the rule: a row cannot
  say "reproduces" while its interval holds zero, and a row without an interval says why."""
  ivs = row.intervals()
  for iv in ivs:
    assert iv.lo <= iv.mean <= iv.hi and iv.paper in (1, -1), (row.item, iv)
  expected = sorted({rule(iv) for iv in ivs})
  shown = row.verdict()
  if row.not_comparable:
    assert shown == "not comparable"
  elif not ivs:
    assert shown == "-" and row.no_verdict, f"{row.item}: no primary interval and no reason"
  elif len(expected) == 1:
    assert shown == expected[0], (row.item, shown, expected)
  else:
    assert sorted(re.findall(r"[a-z]+(?= \d)", shown)) == expected, (row.item, shown)
  if "reproduces" in shown:
    assert any(not iv.lo <= iv.null <= iv.hi for iv in ivs), row.item
  assert compact_verdicts(paper_table.render_compact())[row.item] == shown


def test_rows_declare_a_primary_interval_or_a_reason():
  for r in paper_table.ROWS:
    assert bool(r.primary) or bool(r.not_comparable) or bool(r.no_verdict), r.item
    assert not (r.primary and r.no_verdict), r.item  # a reason for no interval, yet one given


def test_a_flipped_verdict_is_caught():
  """Flip the paper's direction of a reproducing row: the rule says "contradicts"; widen its
  interval over zero: "unresolved"; and a rendered table whose verdict was edited by hand
  fails the check."""
  row = next(r for r in paper_table.ROWS if r.item == "Table 7")
  (iv,) = row.intervals()
  assert verdict_lib.verdict(iv) == "reproduces"
  assert verdict_lib.verdict(dataclasses.replace(iv, paper=-iv.paper)) == "contradicts"
  assert verdict_lib.verdict(dataclasses.replace(iv, lo=-0.01)) == "unresolved"
  flipped = dataclasses.replace(row, primary=lambda: (dataclasses.replace(iv, lo=-0.01),))
  assert flipped.verdict() == "unresolved"
  with open(os.path.join(paper_table.ROOT, "README.md")) as f:
    text = f.read()
  line = next(x for x in text.splitlines() if x.startswith("| Table 9 |"))
  edited = text.replace(line, line.replace("reproduces 1, unresolved 2", "reproduces"))
  assert edited != text and paper_table.refresh(edited) != edited  # --check would fail


def test_verdicts_on_known_intervals():
  iv = lambda lo, hi, paper=1, null=0.0: Interval("x", (lo + hi) / 2, lo, hi, paper, null)
  assert verdict_lib.verdict(iv(0.01, 0.03)) == "reproduces"
  assert verdict_lib.verdict(iv(-0.03, -0.01)) == "contradicts"
  assert verdict_lib.verdict(iv(-0.03, -0.01, paper=-1)) == "reproduces"
  assert verdict_lib.verdict(iv(-0.01, 0.03)) == "unresolved"
  assert verdict_lib.verdict(iv(0.9, 1.2, null=1.0)) == "unresolved"
  assert verdict_lib.verdict(iv(1.1, 1.2, null=1.0)) == "reproduces"
  both = (iv(0.01, 0.03), iv(-0.01, 0.03), iv(-0.02, 0.03))
  assert verdict_lib.row_verdict(both) == "reproduces 1, unresolved 2"
  assert verdict_lib.row_verdict(both, not_comparable="why") == "not comparable"
  assert verdict_lib.row_verdict(()) == "-"
  with pytest.raises(ValueError):
    Interval("x", 0.5, 0.0, 0.4)
