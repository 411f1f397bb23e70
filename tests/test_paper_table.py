"""README's "Reproducing the paper" table: every appendix figure and table has a row, every
row's JSON is committed, and README holds the table as the JSONs give it now."""

import os
import re

from scripts import paper_table

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
      assert r.ours.startswith(paper_table.NOT_YET) and not r.sources, r.item
      assert re.search(r"issue \d+|needs", r.ours), r.item  # says what will run it


def test_readme_holds_the_table_as_the_jsons_give_it():
  readme = os.path.join(paper_table.ROOT, "README.md")
  assert paper_table.main(["--check", readme]) == 0


def test_a_stale_table_is_caught(tmp_path):
  with open(os.path.join(paper_table.ROOT, "README.md")) as f:
    text = f.read()
  stale = tmp_path / "README.md"
  stale.write_text(text.replace("| Table 7 |", "| Table 7 (edited) |"))
  assert paper_table.main(["--check", str(stale)]) == 1
  assert paper_table.main(["--write", str(stale)]) == 0
  assert paper_table.main(["--check", str(stale)]) == 0
