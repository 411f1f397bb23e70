"""Every measured number in README's headline section and in the docs/ pages that hold the
measured results appears in a committed JSON under docs/.

Numbers are compared at the precision README prints them (3.93 matches 3.9319), with
k / M / G / T suffixes, percentages, and minutes or hours of a JSON's seconds. A line
that carries the visible marker NOT_RERUN is skipped: it holds figures nobody has rerun
since the code changed. Code spans (commands) and link targets are not figures, and
neither are references such as "SPEC 7", "Figure 4" or "Table 5". The paper's own
figures live in docs/results/paper.json (copied from SPEC.md, not measured).

Each figure must also be in a JSON that its own part of the page names: a "##" or "###"
section, or one top-level bullet of "Other measured figures" (by path or file name,
e.g. `docs/results/bench.json`, `input_pipeline.json`, `step_sweep_cpu_n*.json`), or in
paper.json. Against every committed JSON at once, a figure of 2 decimals finds some match
by chance about a third of the time. Confidence levels ("95% CI") and targets ("the
target was 12M") are not measurements.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_RERUN = "(not rerun)"
SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "kB": 1e3, "MB": 1e6, "GB": 1e9}
LONG_INDEX_LIST = 32  # longer all-integer lists are index arrays (slots, ids), not figures
NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-−+]?)(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"(?P<exp>e[-+]?\d+)?(?P<unit>[kMGT](?![A-Za-z])| ?[kMG]B\b|%| ?min\b| ?h\b)?")
REFERENCE = re.compile(r"(SPEC|Figure|Table|section|Section|issue)\s*$")
NOT_MEASURED_BEFORE = re.compile(r"\btarget(?: was|,)?\s*$")  # "the target was 12M"
NOT_MEASURED_AFTER = re.compile(r"\s*(CI|interval|confidence)\b")  # "95% CI"
JSON_NAME = re.compile(r"[\w*.-]+\.json")


# Where measured numbers live: README's headline section, and docs/ pages from a heading on
# ("" = the whole page). Other pages (data, training, layout, commands) hold settings, not
# measurements, and the generated paper tables are checked by tests/test_paper_table.py.
MEASURED_PAGES = {
    "docs/benchmarks.md": "", "docs/table7.md": "", "docs/table4.md": "", "docs/table6.md": "",
    "docs/ladder.md": "", "docs/decompose.md": "", "docs/sweeps.md": "",
    "docs/ablations.md": "", "docs/variance.md": "", "docs/eggroll.md": "## Measured",
    "docs/narrow.md": "## Measured",
}
HEADLINE = "## Headline results"


def measured_section(text: str, heading: str = HEADLINE) -> str:
  """The section from `heading` up to the next level-2 heading ("": the whole text)."""
  if not heading:
    return text
  start = text.index(heading)
  end = text.find("\n## ", start + 1)
  return text[start:] if end < 0 else text[start:end]


def measured_texts() -> dict[str, str]:
  """path -> its measured text: README's headline section and MEASURED_PAGES."""
  out = {}
  for path, heading in {"README.md": HEADLINE, **MEASURED_PAGES}.items():
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      text = f.read()
    out[path] = measured_section(text, heading) if heading != "## Measured" else (
        text[text.index(heading):])
  return out


def figures(section: str) -> list[tuple[str, str]]:
  """(number as printed, its line) for every figure in the section outside NOT_RERUN lines."""
  out = []
  for line in section.splitlines():
    if NOT_RERUN in line:
      continue
    text = re.sub(r"`[^`]*`", " ", line)  # commands
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    for m in NUMBER.finditer(text):
      if (REFERENCE.search(text[:m.start()]) or NOT_MEASURED_BEFORE.search(text[:m.start()])
          or (m["unit"] == "%" and NOT_MEASURED_AFTER.match(text[m.end():]))):
        continue
      out.append((m, line))
  return out


def _json_numbers(x, out: list[float]) -> None:
  """Every number in a JSON value, including numbers inside strings (commands, labels)."""
  if isinstance(x, bool):
    return
  if isinstance(x, int | float):
    if math.isfinite(x):
      out.append(float(x))
  elif isinstance(x, str):
    out.extend(float(s) for s in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?", x))
  elif isinstance(x, dict):
    for v in x.values():
      _json_numbers(v, out)
  elif isinstance(x, list):
    if len(x) > LONG_INDEX_LIST and all(isinstance(v, int) and not isinstance(v, bool) for v in x):
      return  # every small integer would match one of these by chance
    for v in x:
      _json_numbers(v, out)


def committed_jsons() -> list[str]:
  """Every JSON file under docs/ that git tracks (uncommitted files do not count)."""
  listed = subprocess.run(["git", "ls-files", "docs"], cwd=ROOT, capture_output=True, text=True)
  if listed.returncode:
    pytest.skip("not a git checkout: cannot tell committed files from others")
  return [path for path in listed.stdout.split() if path.endswith(".json")]


def json_numbers(paths: list[str]) -> list[float]:
  out: list[float] = []
  for path in paths:
    with open(os.path.join(ROOT, path)) as f:
      _json_numbers(json.load(f), out)
  return out


def committed_json_numbers() -> list[float]:
  """Numbers of every JSON file under docs/ that git tracks."""
  return json_numbers(committed_jsons())


def parts(section: str) -> list[str]:
  """The pieces of the section that each name their JSON: the text before the first heading,
  each "##" or "###" section, and each top-level bullet of "Other measured figures"."""
  out = []
  for sub in re.split(r"\n(?=###? )", section):
    if re.match(r"###? Other measured figures", sub):
      out.extend(re.split(r"\n(?=- )", sub))
    else:
      out.append(sub)
  return out


def named_jsons(part: str, committed: list[str]) -> list[str]:
  """The committed JSONs a part names, by path or file name (shell patterns allowed)."""
  names = {os.path.basename(n) for n in JSON_NAME.findall(part)}
  return [p for p in committed if any(fnmatch.fnmatch(os.path.basename(p), n) for n in names)]


def unsourced(section: str, committed: list[str], paper: str = "docs/results/paper.json"
              ) -> list[str]:
  """Figures that are in no JSON their part names, nor in the paper's."""
  paper = json_numbers([paper])
  out = []
  for part in parts(section):
    values = paper + json_numbers(named_jsons(part, committed))
    out.extend(f"{m.group(0)!r} in: {line.strip()[:90]}" for m, line in figures(part)
               if not appears(m, values))
  return sorted(set(out))


def appears(m: re.Match, values: list[float]) -> bool:
  """Whether some JSON value, rounded as README prints it, gives this number."""
  sign = -1.0 if m["sign"] in ("-", "−") else 1.0
  digits = m["int"].replace(",", "") + (m["frac"] or "") + (m["exp"] or "")
  x = sign * float(digits)
  decimals = len(m["frac"]) - 1 if m["frac"] else 0
  if m["exp"]:  # 1e-13, 2.82e12: the printed mantissa's precision
    half = 0.5 * 10.0 ** (int(m["exp"][1:]) - decimals)
  else:
    half = 0.5 * 10.0 ** -decimals
  unit = (m["unit"] or "").strip()
  # Sizes match bytes or a JSON field already in that unit (e.g. planned_memory_gb).
  sizes = {u: [(1 / SCALE[u], 0.0), (1.0, 0.0)] for u in ("kB", "MB", "GB")}
  candidates = {"": [(1.0, 0.0)], "%": [(100.0, 0.0), (1.0, 0.0)],
                "min": [(1 / 60, 0.5)], "h": [(1 / 3600, 0.5)], **sizes}.get(
                    unit, [(1 / SCALE.get(unit, 1), 0.0)])
  for factor, slack in candidates:
    tol = max(half, slack) * (1 + 1e-9) + 1e-12
    if any(abs(v * factor - x) <= tol for v in values):
      return True
  return False


def test_every_readme_figure_is_in_a_committed_json():
  values = committed_json_numbers()
  missing = sorted({f"{path}: {m.group(0)!r} in: {line.strip()[:90]}"
                    for path, section in measured_texts().items()
                    for m, line in figures(section) if not appears(m, values)})
  assert not missing, (
      f"{len(missing)} README figures are in no committed docs/**/*.json; rerun them "
      f"(make figures) or mark the line {NOT_RERUN}:\n" + "\n".join(missing))


def test_every_readme_figure_is_in_a_json_its_part_names():
  committed = committed_jsons()
  missing = [f"{path}: {m}" for path, section in measured_texts().items()
             for m in unsourced(section, committed)]
  assert not missing, (
      f"{len(missing)} README figures are in no JSON their subsection (or bullet of 'Other "
      f"measured figures') names; name the docs/results/NAME.json they come from, rerun them "
      f"or mark the line {NOT_RERUN}:\n" + "\n".join(missing))


def test_a_figure_counts_only_in_the_json_its_part_names():
  """2.5 is in a.json only: the part naming b.json (or none) does not find it there."""
  import tempfile

  with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
    rel = os.path.relpath(tmp, ROOT)
    for name, value in (("a.json", 2.5), ("b.json", 7.25), ("paper.json", 1.75)):
      with open(os.path.join(tmp, name), "w") as f:
        json.dump({"x": value}, f)
    committed = [f"{rel}/a.json", f"{rel}/b.json"]
    section = ("## Headline results\nintro 1.75 and 2.5\n### One (`a.json`)\nrate 2.5, 95% CI\n"
               "### Two (`b*.json`)\nrate 2.5 and 7.25; the target was 9.5\n"
               "### Other measured figures\n- x (`a.json`): 2.5\n- y: 2.5\n")
    missing = unsourced(section, committed, paper=f"{rel}/paper.json")
  assert missing == ["'2.5' in: - y: 2.5", "'2.5' in: intro 1.75 and 2.5",
                     "'2.5' in: rate 2.5 and 7.25; the target was 9.5"], missing


def test_the_check_rejects_a_stale_figure():
  """A number no JSON holds is reported; rounding, suffixes and time units are understood."""
  values = [3.9318, 2089.3, 67712.0, 0.161, 505.0, -1.00006, 7.97e12, 50751508.0, 10.9]
  found = {m.group(0): appears(m, values) for m, _ in figures(
      "## Headline results\nratio 3.93 and 3.97, slope −1.000, 67.7k tokens/s, 16%, 8 min,"
      " 7.97T ops, 2089 (SPEC 7), 51 MB, 52 MB, 10.9 GB\nold 9.99 " + NOT_RERUN + "\n")}
  assert found == {"3.93": True, "3.97": False, "−1.000": True, "67.7k": True, "16%": True,
                   "8 min": True, "7.97T": True, "2089": True, "51 MB": True, "52 MB": False,
                   "10.9 GB": True}
  # Long integer lists are index arrays: their entries would match any small figure.
  out: list[float] = []
  _json_numbers({"slots": list(range(LONG_INDEX_LIST + 1)), "steps": [1, 2], "n": 53}, out)
  assert out == [1.0, 2.0, 53.0]


def test_results_files_carry_command_and_wall_time():
  """docs/results/NAME.json of every figure scripts/figures.py knows says how it was made."""
  path = os.path.join(ROOT, "scripts", "figures.py")
  spec = importlib.util.spec_from_file_location("_figures_script", path)
  figures_lib = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = figures_lib  # dataclasses look their module up
  spec.loader.exec_module(figures_lib)
  for name, fig in figures_lib.FIGURES.items():
    path = os.path.join(ROOT, "docs", "results", f"{name}.json")
    if not os.path.isfile(path):
      continue
    with open(path) as f:
      record = json.load(f)
    assert record["command"] == figures_lib.command_line(fig), path
    assert record["wall_s"] > 0 and "results" in record, path
  with open(os.path.join(ROOT, "docs", "results", "paper.json")) as f:
    assert json.load(f)["command"] is None  # quoted from the paper, nothing was run
