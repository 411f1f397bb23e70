"""tf-idf featurizer and balanced spherical k-means."""

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from soma_jax.data import clustering
from tests.conftest import DATA_DOMAINS, data_make_doc


def _texts(n_per_domain=(60, 30, 10), seed=0):
  rng = np.random.default_rng(seed)
  texts, labels = [], []
  for label, (domain, n) in enumerate(zip(DATA_DOMAINS, n_per_domain, strict=True)):
    for _ in range(n):
      texts.append(data_make_doc(domain, rng, 150))
      labels.append(label)
  return texts, np.array(labels)


def test_tfidf_matches_scikit_learn():
  texts, _ = _texts()
  feat, info = clustering.fit_featurizer(texts, min_df=2, svd_dims=8)
  ref = TfidfVectorizer(sublinear_tf=True, stop_words="english", min_df=2, dtype=np.float32).fit(texts)
  assert feat.vocabulary == sorted(ref.vocabulary_, key=ref.vocabulary_.get)
  np.testing.assert_allclose(feat.tfidf(texts).toarray(), ref.transform(texts).toarray(), rtol=1e-5, atol=1e-6)
  x = feat.transform(texts)
  assert x.shape == (len(texts), 8) and x.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-5)
  assert info["min_df_used"] == 2 and not info["notes"]


def test_min_df_scaled_down_only_when_needed():
  texts = ["alpha beta gamma", "delta epsilon", "zeta eta theta"]
  feat, info = clustering.fit_featurizer(texts, min_df=5, svd_dims=128)
  assert info["min_df_used"] == 1 and info["svd_dims_used"] == 2
  assert any("min_df scaled down" in n for n in info["notes"])
  assert feat.dims == 2


@pytest.mark.parametrize("n,k", [(100, 8), (1000, 7), (17, 4), (5, 5), (1, 1)])
def test_balance_bounds(n, k):
  lo, hi = clustering.balance_bounds(n, k)
  assert k * lo <= n <= k * hi
  mean = n / k
  if mean >= 10:
    assert lo >= 0.9 * mean - 1e-9 and hi <= 1.1 * mean + 1e-9


def test_balanced_assign_respects_bounds_under_skew():
  rng = np.random.default_rng(0)
  sim = rng.normal(size=(1000, 5)).astype(np.float32)
  sim[:, 0] += 3.0  # everyone prefers cluster 0
  lo, hi = clustering.balance_bounds(1000, 5)
  a = clustering.balanced_assign(sim, lo, hi)
  sizes = np.bincount(a, minlength=5)
  assert sizes.sum() == 1000 and sizes.min() >= lo and sizes.max() <= hi
  np.testing.assert_array_equal(a, clustering.balanced_assign(sim, lo, hi))


def test_balanced_kmeans_is_balanced_and_separates_domains():
  texts, labels = _texts((60, 30, 30))
  feat, _ = clustering.fit_featurizer(texts, min_df=2, svd_dims=16)
  x = feat.transform(texts)
  cents, assign, info = clustering.balanced_spherical_kmeans(x, 3, seed=0)
  sizes = np.bincount(assign, minlength=3)
  assert np.all(np.abs(sizes / sizes.mean() - 1) <= 0.1 + 1e-9), sizes
  np.testing.assert_allclose(np.linalg.norm(cents, axis=1), 1.0, rtol=1e-5)
  # The small domains each get a pure cluster; the large one fills the rest.
  for label in (1, 2):
    counts = np.bincount(assign[labels == label], minlength=3)
    assert counts.max() == counts.sum(), (label, counts)
  cents2, assign2, _ = clustering.balanced_spherical_kmeans(x, 3, seed=0)
  np.testing.assert_array_equal(assign, assign2)
  np.testing.assert_array_equal(cents, cents2)


def test_kmeans_rejects_too_few_points():
  from soma_jax.errors import UserError

  with pytest.raises(UserError, match="cannot fill"):
    clustering.balanced_spherical_kmeans(np.eye(3, dtype=np.float32), 4)


def test_top_terms():
  texts, labels = _texts((20, 20, 20))
  feat, _ = clustering.fit_featurizer(texts, min_df=2, svd_dims=8)
  terms = clustering.top_terms(feat, feat.tfidf(texts), labels, 3, num_terms=5)
  for domain, t in zip(DATA_DOMAINS, terms, strict=True):
    assert len(t) == 5 and set(t) <= set(DATA_DOMAINS[domain].split())


def test_min_df_scaled_down_in_one_count_as_the_refits_chose():
  """The min_df the featurizer falls back to equals what refitting tf-idf for every min_df
  from the asked one down to 1 chose (the refits hung prepare at --min_df=100000)."""
  import numpy as np
  from sklearn.feature_extraction.text import TfidfVectorizer

  from soma_jax.data import clustering

  rng = np.random.default_rng(0)
  words = [f"w{i}x" for i in range(300)]
  for _ in range(20):
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 30))))
             for _ in range(int(rng.integers(3, 50)))]
    min_df, want = int(rng.integers(1, 40)), int(rng.integers(2, 120))
    for md in range(min_df, 0, -1):
      fitted = TfidfVectorizer(stop_words="english", min_df=md)
      try:
        fitted.fit(texts)
      except ValueError:
        continue
      if len(fitted.vocabulary_) >= want or md == 1:
        break
    assert clustering._scaled_min_df(texts, min_df, want) == md, (min_df, want)
