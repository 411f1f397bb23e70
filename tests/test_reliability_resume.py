"""Warm starts and resumes (issue 43 items 3, 4, 5, 12, 13 and its budget line): a seed of
several experts seeds each expert from its own, or is refused; a seed trained on other data
is refused, naming the override; a resume reads only its own workdir, checks it first, and a
fix it prints works when followed; a resumed run already at its budget says so."""

from __future__ import annotations

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from soma_jax import checkpoint as ckpt_lib
from soma_jax import runs, train
from soma_jax import spec as spec_lib
from soma_jax.errors import UserError
from tests.test_compare import load_config
from tests.test_train import assert_same_params, metrics_without_timing, tiny_config


def _equal(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _expert(tree, e: int):
  return jax.tree.map(lambda x: x[e], tree)


@pytest.fixture(scope="module")
def seed_n2(data_two_shards, tmp_path_factory) -> str:
  """A trained SOMA N = 2 (its experts differ: each trained on its own shard)."""
  w = str(tmp_path_factory.mktemp("seed_n2") / "w")
  train.run(tiny_config(data_two_shards, n_experts=2, steps=2), w)
  return w


@pytest.fixture(scope="module")
def seed_n1(data_prepared, tmp_path_factory) -> str:
  """A one-expert seed on the 3-shard data (pooled)."""
  w = str(tmp_path_factory.mktemp("seed_n1") / "w")
  train.run(tiny_config(data_prepared, n_experts=1, steps=2, seed=11), w)
  return w


# ------------------------------------------------------------- item 3: seeds of several experts


def test_a_seed_of_several_experts_starts_each_expert_from_its_own(data_two_shards, seed_n2,
                                                                   tmp_path, capsys):
  """init_from a SOMA N = 2 took expert 0 for both experts and dropped expert 1 silently.
  With the same N, expert e starts from the seed's expert e: parameters, and with init_state
  its Adam moments and plateau state too; the start says so."""
  _, seed, _, _ = runs.restore_state(seed_n2)
  assert not _equal(_expert(seed.body, 0), _expert(seed.body, 1))
  c = tiny_config(data_two_shards, n_experts=2, steps=4, init_from=seed_n2, init_state=True)
  start = runs.initial_state(spec_lib.resolve(c))
  for e in range(2):
    assert _equal(_expert(start.body, e), _expert(seed.body, e)), e
    assert _equal(_expert(start.head, e), _expert(seed.head, e)), e
    assert _equal(_expert(start.opt, e), _expert(seed.opt, e)), e
    assert float(start.sched.best[e]) == float(seed.sched.best[e])
  assert int(start.step) == int(seed.step)
  job = tiny_config(data_two_shards, n_experts=2, steps=4, init_from=seed_n2, experts="1:2")
  body, head = runs.initial_params(spec_lib.resolve(job))  # a slice job: its own experts
  assert _equal(_expert(body, 0), _expert(seed.body, 1)) and _equal(head[0], seed.head[1])
  capsys.readouterr()
  summary = train.run(c, str(tmp_path / "w"))
  assert summary["status"] == "done" and summary["step"] == 4
  assert "each expert e starts from its expert e" in capsys.readouterr().err


def test_a_seed_of_several_experts_is_refused_for_another_n(data_two_shards, seed_n2, tmp_path):
  c = tiny_config(data_two_shards, n_experts=1, steps=2, init_from=seed_n2)
  with pytest.raises(UserError, match=r"holds 2 experts.*n_experts=1.*fix: .*n_experts=2"):
    train.run(c, str(tmp_path / "w"))
  assert not os.path.exists(os.path.join(tmp_path, "w", ckpt_lib.CONFIG_FILE))


def test_a_gru_seed_of_several_experts_starts_each_expert_from_its_own(data_two_shards,
                                                                       tmp_path):
  """The GRU (method=eggroll) the same: expert e from expert e, its Adam state with it."""
  def config(**over):
    c = load_config("eggroll", "n=2,size=tiny")
    c.data.dir = data_two_shards
    c.update({"steps": 1, **over})
    return c

  seed_dir = str(tmp_path / "seed")
  train.run(config(), seed_dir)
  _, seed, _, _ = runs.restore_state(seed_dir)
  assert not _equal(_expert(seed.body, 0), _expert(seed.body, 1))
  start = runs.initial_state(spec_lib.resolve(config(steps=2, init_from=seed_dir,
                                                     init_state=True)))
  for e in range(2):
    assert _equal(_expert(start.body, e), _expert(seed.body, e)), e
    assert _equal(_expert(start.opt, e), _expert(seed.opt, e)), e
  with pytest.raises(UserError, match="holds 2 experts"):
    runs.initial_params(spec_lib.resolve(config(n_experts=1, init_from=seed_dir)))


def test_a_one_expert_seed_still_seeds_every_expert(data_prepared, seed_n1):
  """Unchanged: every expert copies the seed's one expert (parameters and optimizer)."""
  _, seed, _, _ = runs.restore_state(seed_n1)
  c = tiny_config(data_prepared, steps=4, init_from=seed_n1, init_state=True)
  start = runs.initial_state(spec_lib.resolve(c))
  for e in range(3):
    assert _equal(_expert(start.body, e), _expert(seed.body, 0))
    assert _equal(_expert(start.opt, e), _expert(seed.opt, 0))


# --------------------------------------------------------- item 4: a seed of another corpus


def test_a_seed_trained_on_other_data_is_refused_naming_the_override(data_prepared,
                                                                    data_two_shards, tmp_path):
  """A seed trained on another corpus was accepted with no note. Refused by the manifests
  recorded at the seed's start; the printed override, when followed, trains."""
  seed_dir = str(tmp_path / "seed")
  train.run(tiny_config(data_two_shards, n_experts=1, steps=2), seed_dir)
  w = str(tmp_path / "w")
  c = tiny_config(data_prepared, steps=2, init_from=seed_dir)
  with pytest.raises(UserError, match="trained on other data") as e:
    train.run(c, w)
  assert not os.path.exists(os.path.join(w, ckpt_lib.CONFIG_FILE))
  fix = re.search(r"--config\.(\w+)=(True)", str(e.value))
  assert fix, str(e.value)
  c[fix.group(1)] = True
  assert train.run(c, w)["status"] == "done"


def test_a_seed_that_is_not_a_run_is_named_as_init_from(data_prepared, tmp_path):
  os.makedirs(tmp_path / "empty")
  for seed, what in ((tmp_path / "empty", r"is not a training workdir \(no config\.json\)"),
                     (tmp_path / "gone", "does not exist")):
    with pytest.raises(UserError, match=rf"init_from=.* {what}; fix: the seed run's workdir"):
      train.run(tiny_config(data_prepared, steps=2, init_from=str(seed)), str(tmp_path / "w"))


# ---------------------------------------------- item 5: a resume reads only its own workdir


def test_a_warm_run_resumes_after_its_seed_moved(data_prepared, seed_n1, tmp_path):
  """The run's own command failed with init_from='...' does not exist once the seed moved,
  though the resume restores its own checkpoint. Now it resumes, bit-identically (a run
  continuing its seed's 2 updates: init_state counts on from them)."""
  seed = str(tmp_path / "seed")
  shutil.copytree(seed_n1, seed)
  config = lambda steps: tiny_config(data_prepared, steps=steps, init_from=seed,  # noqa: E731
                                     init_state=True)
  straight, w = str(tmp_path / "straight"), str(tmp_path / "w")
  train.run(config(6), straight)
  train.run(config(4), w)
  shutil.move(seed, str(tmp_path / "moved"))
  summary = train.run(config(6), w)
  assert summary["status"] == "done" and summary["step"] == 6
  assert_same_params(straight, w)
  losses = lambda d: [r["loss"] for r in metrics_without_timing(d) if "loss" in r]  # noqa: E731
  assert losses(straight) == losses(w)


# ---------------------------------------------------- item 12: the workdir is checked first


def test_a_changed_shape_on_a_warm_run_names_the_workdir(data_prepared, seed_n1, tmp_path):
  """--config.model.d_t=16 on a finished d_t=8 warm run blamed the seed ("train the seed at
  the same model size"); the workdir's config.json is checked first."""
  w = str(tmp_path / "w")
  train.run(tiny_config(data_prepared, steps=2, init_from=seed_n1), w)
  c = tiny_config(data_prepared, steps=2, init_from=seed_n1)
  c.model.d_t *= 2
  with pytest.raises(UserError, match=rf"workdir {re.escape(repr(w))} holds another run "
                                      r"\(model\.d_t: "):
    train.run(c, w)


# ------------------------------------------------------ item 13: the printed fix is followed


@pytest.mark.parametrize("moved", [False, True])
def test_the_printed_fix_for_re_prepared_data_works(data_prepared, tmp_path, moved):
  """The fix printed for a re-prepared data dir, --config.resume_overrides=data.dir,
  data.manifest_sha256, was itself refused (not a config field). Followed, it resumes."""
  data = str(tmp_path / "data")
  shutil.copytree(data_prepared, data)
  w = str(tmp_path / "w")
  train.run(tiny_config(data, steps=2), w)
  history = os.path.join(w, ckpt_lib.HISTORY_FILE)
  records = [json.loads(line) for line in open(history)]
  records[-1]["data_manifest_sha256"] = "0" * 64  # as if re-prepared since
  with open(history, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  if moved:
    shutil.move(data, data + "-new")
    data += "-new"
  with pytest.raises(UserError, match="holds another run") as e:
    train.run(tiny_config(data, steps=4), w)
  fix = re.search(r"--config\.resume_overrides=(\S+)", str(e.value))
  assert fix, str(e.value)
  summary = train.run(tiny_config(data, steps=4, resume_overrides=fix.group(1)), w)
  assert summary["status"] == "done" and summary["step"] == 4


# ----------------------------------------------------------------------- the budget line


def test_a_resumed_run_at_its_budget_says_budget_reached(data_prepared, tmp_path, capsys):
  """A resumed run whose restored totals already meet its budget ended at once with status
  done and no "budget reached" line; it prints the line as the run that reached it did."""
  w = str(tmp_path / "w")
  c = tiny_config(data_prepared, steps=100, budget_unit="updates", budget=2.0)
  assert train.run(c, w)["step"] == 2
  assert "budget reached: 2 of 2 updates at step 2" in capsys.readouterr().err
  again = train.run(c, w)
  assert again["status"] == "done" and again["step"] == 2
  assert "budget reached: 2 of 2 updates at step 2" in capsys.readouterr().err
