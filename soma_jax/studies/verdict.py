"""SPEC 9.8's verdict against the paper, computed from a primary interval, never written by hand.

A primary readout is a 95% interval of a difference (or a ratio) with the sign the paper's
effect has in that quantity. Its verdict: "reproduces" when the interval excludes the null
value in the paper's direction, "contradicts" when it excludes it the other way, "unresolved"
when it holds it. A row whose protocol differs in a way that decides the reading is "not
comparable" whatever its interval says, and says why. A row with several primary intervals
(Table 4's three monoliths) carries one verdict where all agree, else each verdict's count.
A study that records several readouts (Tables 7 and 4: `READOUTS`) declares one primary in its
config; results.json says which (`declared`), and only that one is read for a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from scipy import stats

# The readouts of a two-row comparison (Tables 7 and 4), each {other row: statistic} in
# results.json: `statistics.end_difference` (SPEC 9.8's primary: the test end loss at the
# budget) and `statistics.gain_difference`. A study's config declares which one is primary.
END, GAIN = "end_difference", "gain_difference"
READOUTS = (END, GAIN)

REPRODUCES, CONTRADICTS, UNRESOLVED = "reproduces", "contradicts", "unresolved"
NOT_COMPARABLE, NO_VERDICT = "not comparable", "-"
VERDICTS = (REPRODUCES, CONTRADICTS, UNRESOLVED, NOT_COMPARABLE)


@dataclasses.dataclass(frozen=True)
class Interval:
  """One primary readout: `mean` [lo, hi], and `paper` the sign of the paper's effect in it
  (+1: the paper's claim makes this quantity larger than `null`; -1: smaller)."""
  name: str
  mean: float
  lo: float
  hi: float
  paper: int = 1
  null: float = 0.0
  how: str = ""  # which noises the interval carries

  def __post_init__(self):
    if self.paper not in (1, -1) or not self.lo <= self.mean <= self.hi:
      raise ValueError(f"{self.name}: paper must be +-1 and lo <= mean <= hi, got {self}")


def verdict(iv: Interval) -> str:
  """SPEC 9.8's rule for one interval."""
  if iv.lo > iv.null:
    side = 1
  elif iv.hi < iv.null:
    side = -1
  else:
    return UNRESOLVED
  return REPRODUCES if side == iv.paper else CONTRADICTS


def row_verdict(intervals: tuple[Interval, ...], not_comparable: str = "") -> str:
  """The verdict of a row: not comparable when it says why, none without a primary interval,
  else the one verdict its intervals share or each verdict's count ("reproduces 1,
  unresolved 2")."""
  if not_comparable:
    return NOT_COMPARABLE
  if not intervals:
    return NO_VERDICT
  counts = Counter(verdict(iv) for iv in intervals)
  if len(counts) == 1:
    return next(iter(counts))
  return ", ".join(f"{v} {counts[v]}" for v in VERDICTS if counts[v])


def t_interval(values: list[float]) -> tuple[float, float, float]:
  """(mean, lo, hi): the 95% Student's t interval of a mean over seeds."""
  n = len(values)
  mean = sum(values) / n
  sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
  half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
  return mean, mean - half, mean + half


def from_stat(name: str, stat: dict, paper: int = 1, both: bool = True) -> Interval:
  """An Interval from a results.json statistic {mean, ci95[, seeds_and_documents]}: with both
  noises where the study recorded them (`both`), else the seeds' t interval."""
  two = both and "seeds_and_documents" in stat
  lo, hi = stat["seeds_and_documents"]["ci95"] if two else stat["ci95"]
  return Interval(name, stat["mean"], lo, hi, paper,
                  how="seeds and documents" if two else "t over seeds")


def declared(primary: str) -> dict:
  """results.json's `primary`: the readout of `READOUTS` the config declared primary (the one
  that carries a verdict) and the others, secondary."""
  return {"readout": primary, "secondary": [r for r in READOUTS if r != primary],
          "rule": "SPEC 9.8: one primary readout, declared in the config (`primary`) before "
                  "anything trains, carries the verdict; every other readout is secondary"}


def primary_stats(d: dict) -> tuple[str, dict]:
  """(the readout a results.json declares primary, its statistics by row)."""
  key = d["primary"]["readout"]
  return key, d[key]


def role(d: dict, readout: str) -> str:
  """'primary' or 'secondary': `readout` as a results.json declares it ('' where it declares
  none: measured before the declaration)."""
  key = d.get("primary", {}).get("readout")
  return "" if key is None else "primary" if readout == key else "secondary"
