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


def pytest_configure(config):
  """Share compiled programs between tests and their subprocesses (persistent cache)."""
  cache = os.path.join(os.path.dirname(os.path.dirname(__file__)), ".pytest_cache", "jax")
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", cache)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  # On a GPU the tests check the math at full float32 (no TF32) with deterministic
  # kernels, so one program run twice (e.g. exact resume) is bit-identical there as on the
  # CPU. Two different programs (N = 2 vs N = 4 vmaps, other chunks) may round differently
  # on a GPU: such tests compare with `exact_on_cpu`. No effect on the CPU.
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_gpu_deterministic_ops" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_gpu_deterministic_ops=true").strip()


def exact_on_cpu(actual, desired, rtol: float = 1e-4, atol: float = 1e-5, err_msg: str = ""):
  """Bit-identical on the CPU; on other backends (GPU autotuning may pick other kernels
  for two different programs) equal to `rtol` / `atol`. Measured on an H200 (JAX 0.11,
  full f32, deterministic ops): expert slices + merge vs one job after 4 tiny updates
  differ by at most 2.8e-6 absolute (3.2e-5 relative) in 1 of 768 weights."""
  import jax

  for x, y in zip(jax.tree.leaves(actual), jax.tree.leaves(desired), strict=True):
    if jax.default_backend() == "cpu":
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=err_msg)
    else:
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                                 err_msg=err_msg)
