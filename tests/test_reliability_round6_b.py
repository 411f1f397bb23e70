"""Issue 55 (round 6), items 3, 4, 7, 8, 9, 11, 12, 13, 15, 17 and the notes beside them: a
table that changes on rerun, a moved study folder, fixes that name other entry points' flags,
mixed budget units, unchecked numbers and files, folder names that clash."""

import json
import math
import os
import sys

import numpy as np
import pytest

from soma_jax.data import prepare
from soma_jax.errors import UserError
from tests.test_compare import ROOT
from tests.test_robustness import cli, one_error_line


# ----------------------------------------------------------------------------- item 9


@pytest.mark.parametrize("flag,value", [("seed", -1), ("seed", 2**32), ("assignment_seed", -1),
                                        ("assignment_seed", 2**40)])
def test_prepare_seeds_out_of_range_refused(flag, value, data_textdir, tmp_path):
  """Item 9: a negative (or too large) seed is one UserError naming the flag, before any
  reading; numpy's traceback before."""
  with pytest.raises(UserError, match=f"--{flag}={value}"):
    prepare.prepare(f"textdir:{data_textdir}", 2, str(tmp_path / "d"), **{flag: value})
  assert not os.path.exists(tmp_path / "d")


def test_prepare_negative_seed_on_the_command_line(data_textdir, tmp_path):
  """Item 9: `prepare_data.py --seed=-1` is one line, exit 2."""
  proc = cli([sys.executable, "experiments/prepare_data.py", f"--source=textdir:{data_textdir}",
              "--num_clusters=2", f"--out={tmp_path / 'd'}", "--seed=-1"])
  one_error_line(proc, "--seed=-1")
