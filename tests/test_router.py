"""Router: routing on the first 256 bytes, save/load round trip, versioned format."""

import json
import zipfile

import numpy as np
import pytest

from soma_jax.data import clustering
from soma_jax.data import router as router_lib
from soma_jax.errors import UserError
from tests.conftest import DATA_DOMAINS, data_make_doc


@pytest.fixture(scope="module")
def data_router():
  rng = np.random.default_rng(0)
  texts = [data_make_doc(d, rng, 200) for d in DATA_DOMAINS for _ in range(20)]
  feat, _ = clustering.fit_featurizer(texts, min_df=2, svd_dims=8)
  cents, _, _ = clustering.balanced_spherical_kmeans(feat.transform(texts), 3, seed=0)
  return router_lib.Router(feat, cents)


def _prefixes(n=12):
  rng = np.random.default_rng(1)
  return [data_make_doc(d, rng, 100).encode() for d in DATA_DOMAINS for _ in range(n // 3)]


def test_route_shapes_and_k_cap(data_router):
  p = _prefixes()
  r = data_router.route(p, 2)
  assert r.shape == (12, 2) and r.dtype == np.int32
  assert data_router.route(p, 4).shape == (12, 3)  # k = min(k, N)
  assert np.all(r[:, 0] != r[:, 1])


def _hand_features(router, prefixes):
  """SPEC 4 written out: words of the first 256 bytes -> sublinear tf-idf -> L2 -> SVD ->
  centre -> L2 (scikit-learn's token pattern and stop words; no Featurizer code)."""
  import re

  from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

  f = router.featurizer
  col = {t: i for i, t in enumerate(f.vocabulary)}
  out = []
  for p in prefixes:
    words = re.findall(r"(?u)\b\w\w+\b", bytes(p[:256]).decode("utf-8", "ignore").lower())
    tf = np.zeros(len(col))
    for w in words:
      if w in col and w not in ENGLISH_STOP_WORDS:
        tf[col[w]] += 1
    x = np.where(tf > 0, 1 + np.log(np.maximum(tf, 1)), 0) * f.idf
    x /= max(np.linalg.norm(x), 1e-12)
    z = f.components.astype(np.float64) @ x - f.mean
    out.append(z / max(np.linalg.norm(z), 1e-12))
  return np.stack(out)


def _nearest(router, prefixes, k):
  """The k most cosine-similar centroids, best first (ties to the lower id)."""
  sim = _hand_features(router, prefixes) @ router.centroids.T.astype(np.float64)
  return np.argsort(-sim, axis=1, kind="stable")[:, :k]


def test_route_is_the_nearest_centroids_by_hand(data_router):
  """Routes equal a hand-written nearest-centroid assignment on the first 256 bytes.

  Mixed-domain prefixes make the order of the top 3 matter. The same comparison rejects
  the farthest centroids (an inverted sort) and routing on the last 256 bytes.
  """
  rng = np.random.default_rng(3)
  names = list(DATA_DOMAINS)
  prefixes = [(data_make_doc(names[i % 3], rng, 24) + data_make_doc(names[(i + 1) % 3], rng, 60)
               ).encode() for i in range(18)]
  want = _nearest(data_router, prefixes, 3)
  np.testing.assert_array_equal(data_router.route(prefixes, 3), want)
  np.testing.assert_array_equal(data_router.route(prefixes, 1), want[:, :1])
  assert not np.array_equal(want[:, ::-1], want)  # an inverted sort is caught
  tails = [p[-256:] for p in prefixes]
  assert not np.array_equal(_nearest(data_router, tails, 3), want)  # so is the wrong 256 bytes


def test_route_separates_domains(data_router):
  top = data_router.route(_prefixes(), 1)[:, 0].reshape(3, 4)
  assert all(len(set(row)) == 1 for row in top)
  assert len(set(top[:, 0])) == 3


def test_route_uses_only_first_256_bytes(data_router):
  p = _prefixes()
  changed = [x[:256] + b"completely different tail galaxy finance " * 20 for x in p]
  np.testing.assert_array_equal(data_router.route(p, 3), data_router.route(changed, 3))
  arr = np.stack([np.frombuffer(x[:300], np.uint8) for x in p])
  np.testing.assert_array_equal(data_router.route(arr, 3), data_router.route(p, 3))


def test_invalid_utf8_is_ignored(data_router):
  p = _prefixes()[0][:200]
  bad = p[:50] + b"\xff\xfe" + p[50:]
  assert data_router.route([bad], 3).tolist() == data_router.route([p], 3).tolist()


def test_save_load_round_trip(data_router, tmp_path):
  path = tmp_path / "router.npz"
  data_router.save(str(path))
  loaded = router_lib.Router.load(str(path))
  assert loaded.num_clusters == 3
  p = _prefixes()
  np.testing.assert_array_equal(loaded.route(p, 3), data_router.route(p, 3))
  np.testing.assert_array_equal(loaded.scores(p), data_router.scores(p))
  path2 = tmp_path / "again.npz"
  loaded.save(str(path2))
  assert path.read_bytes() == path2.read_bytes()  # deterministic bytes


def test_load_errors(data_router, tmp_path):
  with pytest.raises(UserError, match="not found"):
    router_lib.Router.load(str(tmp_path / "missing.npz"))
  good = tmp_path / "router.npz"
  data_router.save(str(good))
  truncated = tmp_path / "truncated.npz"
  truncated.write_bytes(good.read_bytes()[:1000])
  with pytest.raises(UserError, match="corrupt"):
    router_lib.Router.load(str(truncated))
  other = tmp_path / "other.npz"
  np.savez(other, a=np.zeros(3))
  with pytest.raises(UserError, match="not a soma_jax router"):
    router_lib.Router.load(str(other))
  # Same file with the version bumped.
  newer = tmp_path / "newer.npz"
  with zipfile.ZipFile(good) as zin, zipfile.ZipFile(newer, "w") as zout:
    for item in zin.namelist():
      data = zin.read(item)
      if item == "header.npy":
        import io

        header = json.loads(np.load(io.BytesIO(data)).tobytes())
        header["version"] = 99
        buf = io.BytesIO()
        np.save(buf, np.frombuffer(json.dumps(header).encode(), np.uint8))
        data = buf.getvalue()
      zout.writestr(item, data)
  with pytest.raises(UserError, match="version 99"):
    router_lib.Router.load(str(newer))
