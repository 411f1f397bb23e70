"""Issue 43 (items 9, 10, 11): a study's plan is checked whole before anything trains: a budget
the step cap cuts off or a non-finite one, and every study field (seeds, grids, eval spans,
match_updates, the ladder's rungs and mechanism, each method's and seed run's own config),
each refused in one line that names the study's own field."""

import math
import os
import sys

import pytest

from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from soma_jax.config import load_config_file
from soma_jax.errors import UserError
from soma_jax.studies import compare, planning
from soma_jax.studies import jobs as jobs_lib
from tests.test_compare import ROOT
from tests.test_robustness import cli, one_error_line

CONFIG = os.path.join(ROOT, "experiments", "configs", "compare.py")


def tiny(study: str, data_dir: str):
  config = load_config_file(CONFIG, f"study={study},size=tiny")
  config.data_dir = data_dir
  config.bootstrap_draws = 100
  return config


class Trained(Exception):
  """jobs.train was called: the study's checks had all passed."""


@pytest.fixture
def no_training(monkeypatch):
  """Any training call raises Trained: the study's own, and the training loop's entries."""
  def train(*args, **kwargs):
    raise Trained(str(args[-1]) if args else "")

  monkeypatch.setattr(jobs_lib, "train", train)
  monkeypatch.setattr(train_lib, "train_to_end", train)
  monkeypatch.setattr(train_lib, "run", train)


def _set(config, key: str, value) -> None:
  *parents, leaf = key.split(".")
  for p in parents:
    config = config[p]
  config[leaf] = value


def refusal(config, out: str) -> str:
  """The study's UserError message; nothing trained and no run folder made."""
  with pytest.raises(UserError) as e:
    compare.run(config, out)
  for folder in ("seeds", "runs", "data"):
    assert not os.path.exists(os.path.join(out, folder)), folder
  assert not [f for f in os.listdir(out) if f.startswith("rung")]
  message = str(e.value)
  assert "\n" not in message
  return message


def accepted(config, out: str) -> None:
  """The study passed every check and went on to train (the first seed run)."""
  with pytest.raises(Trained):
    compare.run(config, out)


def _cap(config) -> int:
  """The updates a compared run may take: it continues its seed's step counter."""
  return planning.MAX_UPDATES - config.seed_updates


def _budget_rows(config) -> list[int]:
  """Operations per update of every run the study's budget stops."""
  cfgs = planning.sized(config)
  return [spec_lib.resolve(c).total_ops_per_update for n, c in cfgs.items()
          if n not in config.match_updates]


# ----------------------------------------------------------------- item 9: the step cap


@pytest.mark.parametrize("study", ["table7", "table4"])
def test_budget_the_step_cap_cuts_off_refused(study, data_two_shards, tmp_path, no_training):
  """A budget that needs more updates than the step cap allows, in any unit, is refused
  before anything trains (it headed for the 10,000,000-update cap: ETA 4.7e23 h); the
  largest budget the cap does not cut off is accepted."""
  config = tiny(study, data_two_shards)
  cap, ops = _cap(config), min(_budget_rows(config))
  slow = cap * planning.SLOW_UPDATE_SECONDS  # the longest time budget
  units = {"updates": (cap + 1, cap), "ops": (cap * ops + 1, cap * ops),
           "cpu_seconds": (slow * 1.001, 3600.0), "device_seconds": (slow * 1.001, 3600.0)}
  for unit, (over, ok) in units.items():
    for amount in (1e30, float(over)):
      config = tiny(study, data_two_shards)
      config.budget_unit, config.budget = unit, amount
      msg = refusal(config, str(tmp_path / f"{unit}{amount:g}"))
      assert "step cap" in msg and "--config.budget=" in msg, msg
      assert f"{planning.MAX_UPDATES:,}" in msg, msg
    config = tiny(study, data_two_shards)
    config.budget_unit, config.budget = unit, float(ok)
    accepted(config, str(tmp_path / f"{unit}_ok"))


def test_ladder_budget_the_step_cap_cuts_off_refused(data_two_shards, tmp_path, no_training):
  config = load_config_file(CONFIG, "study=ladder,size=tiny")
  config.data_dir = data_two_shards
  config.budget = 1e30
  msg = refusal(config, str(tmp_path / "out"))
  assert "step cap" in msg and "--config.budget=" in msg, msg


# ------------------------------------------------------------ item 10: non-finite budgets


@pytest.mark.parametrize("unit", ["updates", "ops", "cpu_seconds", "device_seconds"])
def test_non_finite_budget_refused(unit, data_two_shards, tmp_path, no_training):
  """budget=inf raised an OverflowError at int(config.budget) (rc 1, a traceback)."""
  for amount in (math.inf, -math.inf, math.nan):
    config = tiny("table7", data_two_shards)
    config.budget_unit, config.budget = unit, amount
    msg = refusal(config, str(tmp_path / f"{unit}{amount}"))
    assert "finite" in msg and "--config.budget=" in msg, msg


def test_non_finite_budget_refused_on_the_command_line(tmp_path):
  """The entry point: one error line, exit 2, before any data is prepared or run trained."""
  out = tmp_path / "out"
  proc = cli([sys.executable, "experiments/compare.py",
              "--config=experiments/configs/compare.py:study=table7,size=tiny",
              "--config.budget=inf", f"--out={out}"])
  one_error_line(proc, "budget=inf", "finite", "--config.budget=")
  assert not (out / "seeds").exists() and not (out / "data").exists()


# ------------------------------------------- item 11: every study field, before training


TABLE7 = [
    ("first_seed", -5, "--config.first_seed="),
    ("seed_run_seed", -1, "--config.seed_run_seed="),
    ("seed_run_seed", 1, "--config.seed_run_seed="),  # an optimisation seed
    ("seeds", 0, "--config.seeds="),
    ("seed_updates", 0, "--config.seed_updates="),
    ("seed_updates", planning.MAX_UPDATES, "--config.seed_updates="),
    ("curve_points", 0, "--config.curve_points="),
    ("bootstrap_draws", 0, "--config.bootstrap_draws="),
    ("ops_tolerance", math.nan, "--config.ops_tolerance="),
    ("base_lr", -1.0, "--config.base_lr="),
    ("base_lr", math.inf, "--config.base_lr="),
    ("lr_factors", (0.5, -1.0, 2.0), "--config.lr_factors="),
    ("lr_factors", (1.0, 2.0), "--config.lr_factors="),
    ("lr_extend", -1, "--config.lr_extend="),
    ("eps_factors", (0.5, 2.0), "--config.eps_factors="),
    ("eps_factors", (0.0, 1.0, 2.0), "--config.eps_factors="),
    ("eps_extend", -1, "--config.eps_extend="),
    ("budget_unit", "seconds", "--config.budget_unit="),
    ("eval.route_bytes", 0, "--config.eval.route_bytes="),
    ("eval.score_bytes", 1000, "--config.eval.score_bytes="),
    ("eval.val_windows", -1, "--config.eval.val_windows="),
    ("eval.test_windows", -2, "--config.eval.test_windows="),
    ("reference", "nope", "reference="),
    ("start.mono", "nope", "start.mono="),
    ("methods.mono.opt.lr", -1.0, "--config.methods.mono.opt.lr="),
    ("methods.soma_n2.spsa.pert_chunk", 3, "methods.soma_n2.spsa.pert_chunk=3"),
    ("methods.soma_n2.seed", -1, "--config.methods.soma_n2.seed="),
    ("seed_runs.monolith.opt.lr", -1.0, "--config.seed_runs.monolith.opt.lr="),
    ("seed_runs.soma_expert.spsa.n_pert", 0, "--config.seed_runs.soma_expert.spsa.n_pert="),
]
TABLE4 = [
    ("first_seed", -5, "--config.first_seed="),
    ("match_updates.head_only", "mono", "match_updates.head_only="),
    ("methods.eggroll.eggroll.pop", 3, "methods.eggroll.eggroll.pop=3"),
    ("methods.bptt.opt.lr", math.nan, "--config.methods.bptt.opt.lr="),
    ("seed_runs.gru.eggroll.sigma", -1.0, "--config.seed_runs.gru.eggroll.sigma="),
]
LADDER = [
    ("first_seed", -5, "--config.first_seed="),
    ("seed_run_seed", -1, "--config.seed_run_seed="),
    ("rungs", "4/x", "rungs="),
    ("control", "nope", "--config.control="),
    ("mechanism.rho_by", "nope", "--config.mechanism.rho_by="),
    ("mechanism.repeats", 1, "--config.mechanism.repeats="),
    ("mechanism.hutchinson", 0, "--config.mechanism.hutchinson="),
    ("mechanism.batches", 0, "--config.mechanism.batches="),
    ("mechanism.seed", -1, "--config.mechanism.seed="),
    ("lr_factors", (1.0, 2.0), "--config.lr_factors="),
    ("eps_factors", (2.0,), "--config.eps_factors="),
    ("methods.soma_n2_summed.opt.lr", -1.0, "--config.methods.soma_n2_summed.opt.lr="),
    ("methods.mono.spsa.n_pert", 0, "--config.methods.mono.spsa.n_pert="),
]
CASES = ([("table7", *c) for c in TABLE7] + [("table4", *c) for c in TABLE4]
         + [("ladder", *c) for c in LADDER])


@pytest.mark.parametrize("study,key,value,named", CASES,
                         ids=[f"{s}-{k}={v}" for s, k, v, _ in CASES])
def test_study_field_refused_before_training(study, key, value, named, data_two_shards,
                                             tmp_path, no_training):
  """first_seed=-5 and seed_run_seed=-1 were refused only once the seed runs had trained,
  by a fix naming --config.seed (compare.py has none); a method's field was named without
  its methods.NAME prefix; the ladder's mechanism was checked after each rung's seeds."""
  config = (load_config_file(CONFIG, "study=ladder,size=tiny") if study == "ladder"
            else tiny(study, data_two_shards))
  config.data_dir = data_two_shards
  _set(config, key, value)
  msg = refusal(config, str(tmp_path / "out"))
  assert named in msg, msg
  assert "--config.seed=" not in msg, msg  # compare.py has no --config.seed


@pytest.mark.parametrize("study", ["table7", "table4", "ladder"])
def test_default_plans_pass_every_check(study, data_two_shards, tmp_path, no_training):
  """The shipped tiny configs pass every check and go on to train."""
  config = load_config_file(CONFIG, f"study={study},size=tiny")
  config.data_dir = data_two_shards
  accepted(config, str(tmp_path / "out"))


@pytest.mark.parametrize("study", ["table7", "table4", "ladder"])
def test_cpu_plans_pass_the_plan_checks(study):
  """The size=cpu configs' plans (budget, seeds, spans) pass: the step cap does not cut off
  Table 4's 1.6e12 operations or Table 7's 1,000 updates."""
  config = load_config_file(CONFIG, f"study={study},size=cpu")
  assert planning.check_plan(config).unit == ("ops" if study == "table4" else "updates")
