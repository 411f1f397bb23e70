"""A row of the paper table (`paper_rows.py`) and what every row's readers share: the committed
JSON under docs/results/, read, never typed in, and its intervals shown.

A study carries its own rows (`base.Study.paper_rows`) as StudyRows, whose readers take the
study's results JSON; `StudyRow.bind` makes each a Row under the name the study is registered
by, so a row never writes its study's name. This module imports nothing from the studies.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

from soma_jax.studies.verdict import Interval, row_verdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")
COMPARE = "python experiments/compare.py --config=experiments/configs/compare.py:study="
NOT_YET = "not yet"


def load(name: str) -> dict:
  with open(os.path.join(RESULTS, f"{name}.json")) as f:
    return json.load(f)


def ci(stat: dict, digits: int = 3, both: bool = False) -> str:
  """'+0.051 [+0.038, +0.063]' from {mean, ci95}; `both`: the seeds-and-documents interval."""
  lo, hi = stat["seeds_and_documents"]["ci95"] if both else stat["ci95"]
  f = f"+.{digits}f"
  return f"{stat['mean']:{f}} [{lo:{f}}, {hi:{f}}]"


def declared_after(d: dict) -> str:
  """'; ...' saying the JSON's primary readout was declared after its runs (`remeasured`:
  re-measured from the same runs under another declaration), else ''."""
  r = d.get("remeasured")
  return "" if r is None else (f"; primary declared after the runs (theirs: "
                               f"{r['primary_declared_by_the_runs']}), re-measured from them")


def show(iv: Interval, digits: int = 3) -> str:
  """'+0.051 [+0.038, +0.063]'; a ratio (null 1) with 2 decimals and no sign."""
  if iv.null:
    return f"{iv.mean:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}]"
  f = f"+.{digits}f"
  return f"{iv.mean:{f}} [{iv.lo:{f}}, {iv.hi:{f}}]"


def shown(ivs: tuple[Interval, ...], digits: int = 3) -> str:
  """'name +0.051 [+0.038, +0.063]; ...' for each interval."""
  return "; ".join(f"{iv.name} {show(iv, digits)}" for iv in ivs)


@dataclasses.dataclass(frozen=True)
class Row:
  item: str
  shows: str
  command: str  # "" when no command runs it yet
  ours: Callable[[], str] | str  # the full cell, read from the JSONs in `sources`
  paper: str
  differs: str
  sources: tuple[str, ...] = ()  # docs/results/NAME.json the cells read
  primary: Callable[[], tuple[Interval, ...]] | None = None  # the readouts a verdict reads
  brief: Callable[[], str] | str = ""  # the compact cell; default: the primary intervals
  paper_brief: str = ""  # the paper's value in a few words
  not_comparable: str = ""  # why the protocol decides the reading, if it does
  no_verdict: str = ""  # why the row has no primary interval

  def intervals(self) -> tuple[Interval, ...]:
    return self.primary() if self.primary else ()

  def verdict(self) -> str:
    return row_verdict(self.intervals(), self.not_comparable)

  def brief_cell(self) -> str:
    if self.brief:
      return self.brief() if callable(self.brief) else self.brief
    return shown(self.intervals())


@dataclasses.dataclass(frozen=True)
class StudyRow:
  """A row a study carries, its readers taking the study's results JSON (`result`)."""
  item: str
  shows: str
  ours: Callable[[dict], str]
  paper: str
  differs: str
  primary: Callable[[dict], tuple[Interval, ...]] | None = None
  brief: Callable[[dict], str] | str = ""
  paper_brief: str = ""
  not_comparable: str = ""
  no_verdict: str = ""
  result: str = "{name}_cpu"  # docs/results/RESULT.json, by the study's registered name
  flags: str = ""  # the command's flags after size=cpu

  def bind(self, name: str) -> Row:
    """The Row of the study registered as `name`: its command compare.py:study=NAME,size=cpu,
    its readers reading docs/results/`result`.json."""
    source = self.result.format(name=name)
    read = lambda f: lambda: f(load(source))
    return Row(self.item, self.shows, f"{COMPARE}{name},size=cpu{self.flags}", read(self.ours),
               self.paper, self.differs, (source,),
               read(self.primary) if self.primary else None,
               read(self.brief) if callable(self.brief) else self.brief,
               self.paper_brief, self.not_comparable, self.no_verdict)
