"""Committed results name no folder of the machine that made them (a study's `command` keeps
what the user typed, so a run with an absolute --out writes that machine's path)."""

import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# an absolute path into a home, scratch or work folder, alone or after '=' or a space
MACHINE_PATH = re.compile(r"(^|[\s=:'\"])/(work|home|root|Users|mnt|scratch|data)/")


def _strings(x):
  if isinstance(x, dict):
    for v in x.values():
      yield from _strings(v)
  elif isinstance(x, list):
    for v in x:
      yield from _strings(v)
  elif isinstance(x, str):
    yield x


def _committed_jsons() -> list[str]:
  out = subprocess.run(["git", "ls-files", "docs/results/*.json", "docs/*.json"], cwd=ROOT,
                       capture_output=True, text=True, check=True).stdout.split()
  return sorted(out)


def test_the_pattern_sees_a_machine_path():
  assert MACHINE_PATH.search("compare.py --out=/work/runs/table7_s")
  assert MACHINE_PATH.search("/home/me/runs/x")
  assert not MACHINE_PATH.search("compare.py --out=runs/table7_cpu")
  assert not MACHINE_PATH.search("seeds/seed0/monolith")


@pytest.mark.parametrize("path", _committed_jsons())
def test_a_committed_result_names_no_machine_path(path):
  with open(os.path.join(ROOT, path)) as f:
    found = [s for s in _strings(json.load(f)) if MACHINE_PATH.search(s)]
  assert not found, (f"{path} holds a path of the machine that made it: {found[0][:120]!r}; "
                     f"fix: write the folder relative (runs/NAME), as the docs' commands do")
