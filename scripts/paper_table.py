r"""The paper table, generated from the committed JSON (soma_jax/studies/paper_rows.py): a
compact one in README (item | command | ours | paper | verdict) and the full one in
docs/reproducing.md (with what each row shows, what differs and why a verdict is what it is).
Each table sits between its markers; a file may hold either or both.

  python -m scripts.paper_table --write            (rewrite README.md and docs/reproducing.md)
  python -m scripts.paper_table --check            (exit 1 when either table is stale)
  python -m scripts.paper_table --check FILE ...   (only these files)
"""

from __future__ import annotations

import argparse
import os
import sys

from soma_jax.errors import UserError, check_output
from soma_jax.studies import paper, paper_rows
from soma_jax.studies.verdict import NO_VERDICT, NOT_COMPARABLE

ROOT = paper.ROOT
RESULTS = paper.RESULTS
ROWS = paper_rows.ROWS
FILES = ("README.md", os.path.join("docs", "reproducing.md"))
FULL = ("<!-- paper-table: start -->", "<!-- paper-table: end -->")
COMPACT = ("<!-- paper-table-compact: start -->", "<!-- paper-table-compact: end -->")


def _cell(text: str) -> str:
  return text.replace("|", "\\|") if text else "-"


def _short_command(command: str) -> str:
  """`study=table4` for a compare.py study, else the script or module and its config."""
  if command.startswith(paper.COMPARE):
    return f"`study={command[len(paper.COMPARE):].split(',')[0]}`"
  words = command.split()
  config = next((w.split("configs/", 1)[1] for w in words if "configs/" in w), "")
  head = words[2] if words[1] == "-m" else os.path.basename(words[1])
  return f"`{config or head}`"


def why(row: paper.Row) -> str:
  """The verdict cell of the full table: the verdict and what it reads, or why there is none."""
  v = row.verdict()
  if v == NOT_COMPARABLE:
    return f"{v}: {row.not_comparable}"
  if v == NO_VERDICT:
    return f"no verdict: {row.no_verdict}"
  how = sorted({iv.how for iv in row.intervals()})
  return f"**{v}** ({'; '.join(how)})"


def multiplicity() -> str:
  """How many primary intervals the verdicts read (rows sharing an interval count it once),
  and that none is corrected for multiple comparisons (SPEC 9.8: say how many)."""
  seen: dict[tuple[float, float, float], list[str]] = {}
  for r in ROWS:
    for iv in r.intervals():
      seen.setdefault((iv.mean, iv.lo, iv.hi), []).append(r.item)
  shared = sorted({" and ".join(dict.fromkeys(items)) for items in seen.values()
                   if len(set(items)) > 1})
  return (f"The verdicts read {len(seen)} distinct primary intervals"
          + (f" ({'; '.join(shared)} share theirs)" if shared else "") + "; only they carry a "
          "verdict, and every other figure in a cell is descriptive. No interval is corrected for "
          "multiple comparisons: among intervals whose true effect is zero, about one in twenty "
          "excludes zero by chance.")


def render_full() -> str:
  lines = [FULL[0], "| item | what it shows | command | ours (CPU scale) | paper | what differs "
           "| verdict (SPEC 9.8) |", "|---|---|---|---|---|---|---|"]
  for r in ROWS:
    ours = r.ours() if callable(r.ours) else r.ours
    src = "; ".join(f"`docs/results/{s}.json`" for s in r.sources)
    lines.append(f"| {r.item} | {r.shows} | " + (f"`{r.command}`" if r.command else "-")
                 + f" | {_cell(ours)}" + (f" ({src})" if src else "")
                 + f" | {_cell(r.paper)} | {_cell(r.differs)} | {_cell(why(r))} |")
  return "\n".join(lines + ["", multiplicity(), FULL[1]])


def render_compact() -> str:
  lines = [COMPACT[0], "| item | command | ours | paper | verdict |", "|---|---|---|---|---|"]
  for r in ROWS:
    lines.append(f"| {r.item} | {_short_command(r.command) if r.command else '-'} | "
                 f"{_cell(r.brief_cell())} | {_cell(r.paper_brief)} | {r.verdict()} |")
  return "\n".join(lines + [COMPACT[1]])


def section(text: str, markers: tuple[str, str] = FULL) -> str:
  """The table between the markers (markers included)."""
  start, end = text.index(markers[0]), text.index(markers[1]) + len(markers[1])
  return text[start:end]


def refresh(text: str) -> str:
  """The text with every table it holds rendered from the JSON now."""
  for markers, render in ((FULL, render_full), (COMPACT, render_compact)):
    if markers[0] in text and markers[1] in text:
      text = text.replace(section(text, markers), render())
  return text


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  g = p.add_mutually_exclusive_group(required=True)
  g.add_argument("--write", action="store_true", help="rewrite the tables in these files")
  g.add_argument("--check", action="store_true", help="exit 1 when a table is stale")
  p.add_argument("files", nargs="*", help=f"default: {', '.join(FILES)}")
  a = p.parse_args(argv)
  paths = a.files or [os.path.join(ROOT, f) for f in FILES]
  for path in paths if a.write else ():  # every file writable before any is rewritten
    try:
      check_output(path, "files", "file")
    except UserError as e:
      p.error(str(e))
  stale = 0
  for path in paths:
    with open(path) as f:
      text = f.read()
    if not any(m[0] in text and m[1] in text for m in (FULL, COMPACT)):
      print(f"error: {path} has no paper-table markers; fix: put {COMPACT[0]} ... "
            f"{COMPACT[1]} or {FULL[0]} ... {FULL[1]} where a table goes", file=sys.stderr)
      return 2
    new = refresh(text)
    if a.check and new != text:
      print(f"{path}: the paper table is stale; fix: python -m scripts.paper_table --write",
            file=sys.stderr)
      stale = 1
    elif a.write and new != text:
      with open(path, "w") as f:
        f.write(new)
  return stale


if __name__ == "__main__":
  sys.exit(main())
