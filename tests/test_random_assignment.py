"""prepare's --assignment=random: the semantic-vs-random sharding control (SPEC 9.8)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from soma_jax.data import clustering, pipeline, prepare
from soma_jax.data import router as router_lib
from soma_jax.errors import UserError
from tests.conftest import DATA_DOMAINS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"test_docs": 6, "ensemble_val_docs": 3, "min_df": 2, "svd_dims": 16, "val_fraction": 0.05}


@pytest.fixture(scope="module")
def data_random(tmp_path_factory, data_textdir) -> str:
  out = str(tmp_path_factory.mktemp("data_random") / "dir")
  prepare.prepare(f"textdir:{data_textdir}", 3, out, assignment="random", assignment_seed=0, **SMALL)
  return out


def _windows(data_dir, k):
  return {e: np.concatenate([np.load(f"{data_dir}/experts/{e:04d}/{s}.npy") for s in ("train", "val")])
          for e in range(k)}


def _rows(a):
  return sorted(r.tobytes() for r in a)


def test_same_windows_same_sizes_same_heldout(data_prepared, data_random):
  """Only which shard a window sits in changes: sizes, the windows overall and held-out files stay."""
  sem, rnd = pipeline.check_data_dir(data_prepared, 3), pipeline.check_data_dir(data_random, 3)
  assert rnd["assignment"]["kind"] == "random" and rnd["assignment"]["seed"] == 0
  assert rnd["assignment"]["windows_per_shard"] == sem["assignment"]["windows_per_shard"]
  assert [s["windows"] for s in rnd["shards"]] == [s["windows"] for s in sem["shards"]]
  ws, wr = _windows(data_prepared, 3), _windows(data_random, 3)
  assert _rows(np.concatenate(list(ws.values()))) == _rows(np.concatenate(list(wr.values())))
  for rel in ("test.npy", "ensemble_val.npy", "test_docs.npy", "ensemble_val_docs.npy", "heldout_docs.json"):
    assert rnd["files"][rel] == sem["files"][rel], rel
  assert rnd["assignment"]["semantic"]["top_terms"] == sem["top_terms"]
  assert "assignment" not in sem["settings"] and rnd["settings"]["assignment"] == "random"


def test_random_shards_mix_the_domains(data_prepared, data_random):
  """Each semantic shard holds one domain; each random shard holds windows of every domain,
  and the moved fraction the manifest reports is what the files show."""
  words = {d: set(w.split()) for d, w in DATA_DOMAINS.items()}

  def domain(row):
    present = set(row[:1024].tobytes().decode("utf-8", "replace").split())
    return max(words, key=lambda d: len(present & words[d]))

  sem = {e: {domain(r) for r in w} for e, w in _windows(data_prepared, 3).items()}
  assert all(len(d) == 1 for d in sem.values()), sem
  rnd = _windows(data_random, 3)
  assert all({domain(r) for r in w} == set(DATA_DOMAINS) for w in rnd.values())
  home = {next(iter(d)): e for e, d in sem.items()}
  moved = sum(int(home[domain(r)] != e) for e, w in rnd.items() for r in w)
  total = sum(len(w) for w in rnd.values())
  m = pipeline.load_manifest(data_random)
  assert m["assignment"]["moved_fraction"] == pytest.approx(moved / total, abs=1e-9)
  assert 0.4 < moved / total < 0.9  # about 2/3 of the windows leave their domain's shard


def test_router_routes_to_the_random_shards_centroids(data_random):
  """The router's centroids are the normalised mean features of each random shard's windows."""
  router = router_lib.Router.load(f"{data_random}/router.npz")
  for e, w in _windows(data_random, 3).items():
    mean = router.featurizer.transform(clustering.decode(w[:, :1024])).astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(router.centroids[e], mean / np.linalg.norm(mean), atol=1e-4)
  m = pipeline.load_manifest(data_random)
  assert m["assignment"]["mean_similarity"] < 0.5 < m["assignment"]["semantic"]["mean_similarity"]


def test_seed_reproduces_and_changes_the_shards(data_random, data_textdir, tmp_path):
  again = prepare.prepare(f"textdir:{data_textdir}", 3, str(tmp_path / "again"), assignment="random", **SMALL)
  other = prepare.prepare(f"textdir:{data_textdir}", 3, str(tmp_path / "other"), assignment="random",
                          assignment_seed=1, **SMALL)
  assert again["files"] == pipeline.load_manifest(data_random)["files"]
  assert other["files"]["experts/0000/train.npy"] != again["files"]["experts/0000/train.npy"]
  assert other["files"]["test.npy"] == again["files"]["test.npy"]


@pytest.mark.parametrize("kw, match", [({"assignment": "semantic"}, "--assignment='semantic' is not one of"),
                                       ({"assignment": "random", "assignment_seed": -1}, "--assignment_seed=-1")])
def test_bad_assignment_is_a_user_error(data_textdir, tmp_path, kw, match):
  with pytest.raises(UserError, match=match):
    prepare.prepare(f"textdir:{data_textdir}", 3, str(tmp_path / "x"), **kw, **SMALL)
  assert not (tmp_path / "x").exists()


def test_cli_flag(data_textdir, tmp_path):
  out = tmp_path / "cli"
  r = subprocess.run([sys.executable, "experiments/prepare_data.py", f"--source=textdir:{data_textdir}",
                      "--num_clusters=3", f"--out={out}", "--assignment=random", "--assignment_seed=2", "--test_docs=6",
                      "--ensemble_val_docs=3", "--min_df=2", "--svd_dims=16"], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  assert "random shards of the nearest-centroid sizes, assignment seed 2" in r.stdout
  assert pipeline.load_manifest(str(out))["assignment"]["seed"] == 2
