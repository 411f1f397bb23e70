"""Shared data fixtures: small corpora in the real on-disk formats."""

from __future__ import annotations

import os

import numpy as np
import pytest

DATA_DOMAINS = {
  "cooking": "recipe oven butter flour sugar bake simmer garlic onion pepper salt sauce dough whisk "
  "skillet roast boil chop kitchen dinner lunch spoon bread cheese tomato basil",
  "astronomy": "galaxy star planet orbit telescope nebula comet asteroid gravity cosmic redshift "
  "supernova quasar lunar solar eclipse spectrum photon universe meteor jupiter saturn",
  "finance": "market stock bond yield dividend investor portfolio equity inflation interest "
  "banking credit loan mortgage revenue profit budget audit currency trading hedge",
}


def data_make_doc(domain: str, rng: np.random.Generator, n_words: int) -> str:
  """A document of random domain words with some shared filler."""
  words = DATA_DOMAINS[domain].split() + ["the", "and", "of", "report", "today", "people"]
  lines = []
  for _ in range(n_words // 12):
    lines.append(" ".join(rng.choice(words, 12)).capitalize() + ".")
  return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def data_textdir(tmp_path_factory) -> str:
  """A three-domain text folder (one subfolder per domain), about 270 KB."""
  root = tmp_path_factory.mktemp("data_textdir")
  rng = np.random.default_rng(0)
  for domain in DATA_DOMAINS:
    os.makedirs(root / domain)
    for i in range(30):
      text = data_make_doc(domain, rng, int(rng.integers(300, 700)))
      (root / domain / f"doc{i:03d}.txt").write_text(text)
  return str(root)


@pytest.fixture(scope="session")
def data_prepared(tmp_path_factory, data_textdir) -> str:
  """A data dir prepared from data_textdir with 3 clusters and small settings."""
  from soma_jax.data import prepare

  out = str(tmp_path_factory.mktemp("data_prepared") / "dir")
  prepare.prepare(
    f"textdir:{data_textdir}", 3, out, test_docs=6, ensemble_val_docs=3, min_df=2, svd_dims=16, val_fraction=0.05
  )
  return out


# prepare.prepare's settings for the tiny per-N studies (fig7, fig9, fig13, fig16, fig17,
# table5): the held-out sets of data_two_shards, on data_textdir prepared into each N shards
STUDY_PREPARE = {"test_docs": 6, "ensemble_val_docs": 3, "min_df": 2, "svd_dims": 16,
                 "val_fraction": 0.05}


@pytest.fixture(scope="session")
def data_two_shards(tmp_path_factory, data_textdir) -> str:
  """A data dir prepared from data_textdir with 2 clusters (the comparisons' SOMA N = 2)."""
  from soma_jax.data import prepare

  out = str(tmp_path_factory.mktemp("compare_data") / "dir")
  prepare.prepare(f"textdir:{data_textdir}", 2, out, test_docs=6, ensemble_val_docs=3, min_df=2,
                  svd_dims=16, val_fraction=0.05)
  return out


# The checkpoint-scores tests' validation set (test_checkpoint_scores, test_reliability_round6_b)
CKPT_ROUTE, CKPT_SCORE = 8, 24  # pieces of 33 bytes inside the tiny preset's T = 32


def ckpt_val_set(data_dir: str, max_windows: int = 0, split: str = "ensemble_val",
                 route: int = CKPT_ROUTE):
  """The validation windows a scored run scores at every checkpoint (route + score = 32)."""
  from soma_jax import evaluate as eval_lib

  return eval_lib.TestSet(data_dir, max_windows, split, route, CKPT_ROUTE + CKPT_SCORE - route)


@pytest.fixture(scope="session")
def scored_run(tmp_path_factory, data_two_shards):
  """A tiny N = 2 budgeted run of 6 updates with 3 checkpoints, scored on validation by
  training: (spec, workdir, val). Read-only: a test that changes it works on a copy."""
  from soma_jax import config as config_lib
  from soma_jax.studies import jobs, training

  c = config_lib.base_config(n=2, size="tiny")
  val = ckpt_val_set(data_two_shards)
  spec = training.budgeted(c, data_two_shards, 0, None, "updates", 6, 3, score=val)
  workdir = str(tmp_path_factory.mktemp("scored") / "run")
  jobs.train(spec, workdir, "scored run")
  return spec, workdir, val


def pytest_configure(config):
  """Share compiled programs between tests and their subprocesses (persistent cache)."""
  cache = os.path.join(os.path.dirname(os.path.dirname(__file__)), ".pytest_cache", "jax")
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", cache)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  # On a GPU the tests check the math at full float32 (no TF32) with deterministic
  # kernels, so one program run twice (e.g. exact resume) is bit-identical there as on the
  # CPU. Two different programs (N = 2 vs N = 4 vmaps, other chunks) may round differently
  # on any backend: such tests compare with `equal_to_rounding`. No effect on the CPU.
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_gpu_deterministic_ops" not in flags:
    flags += " --xla_gpu_deterministic_ops=true"
  # Entry points started by tests keep one CPU device (the user's XLA_FLAGS count wins over
  # host_devices' one per core); a test that wants the default layout uses `default_env`.
  if DEVICE_COUNT_FLAG not in flags:
    flags += f" {DEVICE_COUNT_FLAG}=1"
  os.environ["XLA_FLAGS"] = flags.strip()


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def default_env(**extra: str) -> dict:
  """os.environ for a child entry point that picks its own CPU device count (one per usable
  core), as a user's shell would: without the one-device XLA flag of pytest_configure."""
  flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                   if not f.startswith(DEVICE_COUNT_FLAG))
  return dict(os.environ, XLA_FLAGS=flags, **extra)


def equal_to_rounding(actual, desired, close: float = 1e-5, outliers: float = 0.001,
                      atol: float = 1e-2):
  """Two different programs training the same thing (expert slices vs the whole job):
  equal to float32 rounding, as Adam carries it. XLA compiles each number of experts on its
  own and may pick kernels that round differently, on the CPU as on a GPU; Adam's first
  updates are about lr * sign(g), so a coordinate whose estimate nearly cancels can move by
  a visible fraction of lr, or flip its step (2 lr). Hence: all but `outliers` of the
  weights within `close` (a slice given wrong directions or batches moves nearly every
  weight by ~lr = 1e-3, the tests' rate), and every weight within `atol`, 2 lr for each of
  up to 5 updates. Measured after 4 tiny updates, slices +
  merge vs one job: 1 of 768 body weights 2.8e-6 apart on an H200 (JAX 0.11, full f32,
  deterministic ops); on the CPU with spsa.signs apart, the largest differences of the
  12,408 weights (bodies and heads) of this test's fixture were 7.0e-5, 4.3e-5 and 8.4e-6
  (scripts/merge_rounding.py measures the built-in corpus)."""
  import jax

  assert jax.tree.structure(actual) == jax.tree.structure(desired)
  for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(desired), strict=True):
    assert np.shape(a) == np.shape(b), (np.shape(a), np.shape(b))
  x = np.concatenate([np.ravel(a) for a in jax.tree.leaves(actual)])
  y = np.concatenate([np.ravel(b) for b in jax.tree.leaves(desired)])
  diff = np.abs(x - y)
  far = np.mean(diff > close)
  assert far <= outliers, f"{far:.2%} of weights differ by more than {close} ({outliers:.1%} allowed)"
  assert diff.max() <= atol, f"max difference {diff.max():.3g} > {atol}"
