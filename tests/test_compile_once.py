"""One compile per step shape (issue 39): the optimisation seed is data, not a static setting,
so runs that differ only in their seed share one program; the seed given as data draws the
same directions as the seed given statically; the sharded step is built once per (settings,
mesh); entry points keep compiled programs in JAX's persistent cache."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from soma_jax import cli, parallel, runs, spsa
from soma_jax import spec as spec_lib
from soma_jax import train as train_lib
from tests.test_train import ROOT, tiny_config


def _state_and_batch(c):
  spec = spec_lib.resolve(c)
  state = runs.initial_state(spec)
  n, t1 = len(spec.experts), spec.seq_len + 1
  batch = jax.random.randint(jax.random.key(1), (n, spec.accum, spec.batch, t1), 0, 256)
  return spec, state, batch.astype(jnp.uint8), jnp.arange(n, dtype=jnp.int32)


def test_a_seed_given_as_data_is_the_static_seed(data_prepared):
  """Bit for bit the same update, whether the seed is cfg.seed or the step's key (a seed
  past 2^31 included: the key is made on the host, as jax.random.key makes it)."""
  for seed in (3, 2**31 + 5):
    c = tiny_config(data_prepared, seed=seed)
    spec, state, batch, ids = _state_and_batch(c)
    step = jax.jit(spsa.train_step, static_argnames="cfg")
    static, _ = step(state, batch, ids, cfg=spec.method.step_config())
    keyed, _ = step(state, batch, ids, cfg=spec.method.step_config(seed_as_data=True),
                    key=jax.random.key(seed))
    for a, b in zip(jax.tree.leaves(static), jax.tree.leaves(keyed), strict=True):
      np.testing.assert_array_equal(a, b)
    other, _ = step(state, batch, ids, cfg=spec.method.step_config(seed_as_data=True),
                    key=jax.random.key(seed + 1))
    assert not np.array_equal(other.opt[1].mu["blocks"][0]["lstm"]["w_x"],
                              static.opt[1].mu["blocks"][0]["lstm"]["w_x"])


def test_a_step_takes_its_seed_once():
  cfg = spsa.StepConfig(model=None, spsa=spsa.SpsaConfig(n_pert=2, pert_chunk=2), seed=None)
  with pytest.raises(ValueError, match="seed once"):
    spsa.step_key(cfg.seed, None)
  with pytest.raises(ValueError, match="seed once"):
    spsa.step_key(0, jax.random.key(0))


def test_runs_that_differ_only_in_seed_compile_the_step_once(data_prepared, tmp_path):
  """Two runs at two seeds of one shape (a batch no other test trains): one program."""
  first = tiny_config(data_prepared, steps=2, seed=11)
  first.spsa.batch = 5
  step = spec_lib.resolve(first).method.train_step
  before = step._cache_size()
  train_lib.run(first, str(tmp_path / "a"))
  second = first.copy_and_resolve_references()
  second.seed = 12
  train_lib.run(second, str(tmp_path / "b"))
  assert step._cache_size() == before + 1
  a, b = (runs.restore_params(str(tmp_path / w))[0] for w in "ab")
  assert not np.array_equal(jax.tree.leaves(a)[0], jax.tree.leaves(b)[0])  # other draws


def test_the_sharded_step_is_built_once_per_settings_and_mesh(data_prepared):
  c = tiny_config(data_prepared)
  spec = spec_lib.resolve(c)
  cfg = spec.method.step_config(seed_as_data=True)
  mesh = parallel.make_mesh(1, 1, n_experts=len(spec.experts))
  assert spec.method.sharded_step(cfg, mesh) is spec.method.sharded_step(cfg, mesh)
  other = dataclasses.replace(cfg, weight_decay=0.5)
  assert spec.method.sharded_step(other, mesh) is not spec.method.sharded_step(cfg, mesh)


def test_entry_points_use_the_persistent_cache(data_prepared, tmp_path):
  """`--compilation_cache=DIR` fills DIR; the same run again into a new workdir compiles
  nothing new (the same programs), and 'off' writes nothing."""
  cache = tmp_path / "cache"
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")
         and k != "JAX_COMPILATION_CACHE_DIR"}

  def train(workdir: str, where: str):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
           f"--config={os.path.join(ROOT, 'experiments', 'configs', 'soma.py')}:n=3,size=tiny",
           f"--config.data.dir={data_prepared}", "--config.steps=2", f"--workdir={workdir}",
           f"--compilation_cache={where}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]

  compiles = lambda name: json.load(open(tmp_path / name / "summary.json"))["step_compiles"]
  train(str(tmp_path / "one"), str(cache))
  entries = set(os.listdir(cache))
  assert entries, "nothing cached"
  assert compiles("one") >= 1  # a cold cache: the step is compiled
  train(str(tmp_path / "two"), str(cache))
  assert set(os.listdir(cache)) == entries
  assert compiles("two") == 0  # read from the cache: no XLA compilation
  train(str(tmp_path / "three"), "off")
  assert set(os.listdir(cache)) == entries
  assert compiles("three") >= 1  # no cache: compiled again


def test_the_default_cache_folder(monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
  assert cli.default_cache_dir() == "/x/cache/soma-jax/jax"
  monkeypatch.delenv("XDG_CACHE_HOME")
  assert cli.default_cache_dir().endswith(os.path.join(".cache", "soma-jax", "jax"))
