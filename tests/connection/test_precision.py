"""float32 distances are not translation invariant: off-centre public features are warned about."""

import warnings

import jax
import numpy as np
import pytest

from jaxdistill import connection, data, representations

_MESSAGE = r"sit far from the origin compared with their spread"


def gaussian(seed, n, d):
  return np.random.default_rng(seed).normal(size=(n, d))


def nearest_float64(x, q):
  return np.argmin(((x[:, None, :] - q[None, :, :]) ** 2).sum(-1), axis=1)


def test_the_warning_marks_a_real_loss_of_nearest_queries():
  x, q = gaussian(0, 2000, 8), gaussian(1, 50, 8)
  truth = nearest_float64(x, q)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # centred: no warning, and float32 finds every float64 nearest query
    centred = np.asarray(connection.reverse_knn(x, q, 1))[:, 0]
  assert np.array_equal(centred, truth)
  shift = np.full(8, 300.0)  # ||mean||^2 / spread is about 300^2 * 8 / 8 = 9e4
  with pytest.warns(RuntimeWarning, match=_MESSAGE) as caught:
    shifted = np.asarray(connection.reverse_knn(x + shift, q + shift, 1))[:, 0]
  assert "query_features" in str(caught[0].message)
  assert caught[0].filename == __file__  # points at the caller, not into the library
  assert np.mean(shifted != truth) > 0.01  # the same neighbours in float64: float32 lost them


@pytest.mark.parametrize("c, warns", [(31.0, False), (32.0, True)])
def test_the_threshold_is_a_ratio_of_1000(c, warns):
  # Queries c - 1 and c + 1: ||mean||^2 = c^2, mean ||q - mean||^2 = 1, ratio c^2 (961 or 1024), exact in float32.
  q = np.array([[c - 1.0], [c + 1.0]])
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    connection.reverse_knn(np.array([[c]]), q, 1)
  assert [issubclass(w.category, RuntimeWarning) for w in caught] == ([True] if warns else [])
  if warns:
    assert "1.02e+03 > 1000" in str(caught[0].message)


def test_the_decision_reads_the_public_queries_only():
  x, q = gaussian(2, 200, 4), gaussian(3, 20, 4)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # far-off private records, centred queries: nothing said about them
    connection.reverse_knn(x + 1e3, q, 2)
    connection.knn_labeling(x + 1e3, q, 2)


@pytest.mark.parametrize("rule", ["reverse-knn", "knn-labeling", "balanced-max-min"])
def test_every_rule_warns_at_the_callers_line(rule):
  # Through connect (and reverse_knn_connection) the fixed stacklevel pointed into the library, where the
  # default filter shows a warning once per process.
  x, q = gaussian(4, 60, 3), gaussian(5, 6, 3)
  with pytest.warns(RuntimeWarning, match=_MESSAGE) as caught:
    connection.connect(rule, x + 500.0, q + 500.0, 1)
  assert [w.filename for w in caught] == [__file__]
  if rule == "reverse-knn":
    with pytest.warns(RuntimeWarning, match=_MESSAGE) as caught:
      connection.reverse_knn_connection(x + 500.0, q + 500.0, 1)
    assert [w.filename for w in caught] == [__file__]


def test_kmeans_and_select_queries_warn_once_naming_their_parameter():
  x = gaussian(6, 120, 3) + 1e3
  with pytest.warns(RuntimeWarning, match="features sit far") as caught:
    connection.kmeans(jax.random.key(0), x, 4)
  assert len(caught) == 1 and str(caught[0].message).startswith("features ")
  assert caught[0].filename == __file__
  with pytest.warns(RuntimeWarning, match=_MESSAGE) as caught:
    connection.select_queries(jax.random.key(0), x, 4)
  assert len(caught) == 1 and str(caught[0].message).startswith("public_features ")
  assert caught[0].filename == __file__


def test_the_library_pixel_and_hog_features_stay_quiet():
  images = data.load_embedded_mnist().images[:300]
  for features in (representations.raw_pixels(images), representations.hog(images)):
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      connection.select_queries(jax.random.key(0), features, 10)
      connection.reverse_knn(features, features[:10], 1)


# -- the direct measurement: tight groups far from the origin, overall mean near zero ------------------------------
_LOSS = r"lose nearest neighbours to float32 rounding: for \d+\.\d% of \d+ sampled rows"


def two_groups(seed, n, sep, d=8):
  """Unit-spread Gaussian groups at -sep and +sep in every coordinate: ||mean||^2 / spread is near 0."""
  rng = np.random.default_rng(seed)
  return np.where(rng.random(n) < 0.5, -1.0, 1.0)[:, None] * sep + rng.normal(size=(n, d))


def test_two_far_groups_warn_although_the_ratio_is_small():
  x, q = two_groups(0, 3000, 3000.0), two_groups(1, 200, 3000.0)
  with pytest.warns(RuntimeWarning, match=_LOSS) as caught:
    got = np.asarray(connection.reverse_knn(x, q, 1))[:, 0]
  assert len(caught) == 1 and str(caught[0].message).startswith("query_features ")
  assert caught[0].filename == __file__
  assert "centre or rescale" in str(caught[0].message)
  assert np.mean(got != nearest_float64(x, q)) > 0.5  # the loss is real
  with pytest.warns(RuntimeWarning, match=_LOSS) as caught:
    connection.select_queries(jax.random.key(0), q, 4)
  assert len(caught) == 1 and str(caught[0].message).startswith("public_features ")


def test_pairs_of_queries_far_from_the_origin_warn_although_each_ones_nearest_query_is_clear():
  # Two queries 1 apart at +3000 and two at -3000 in every coordinate (d = 8): each query's nearest other query is
  # never in doubt, so the rows' own check measured no loss and nothing was said, while float32 placed 45% of the
  # records between a pair at the wrong query (k-NN labeling took records 3-6 squared units farther than its true
  # 50 nearest, at about 1).
  d, c = 8, 3000.0
  pair = np.stack([np.zeros(d), np.eye(d)[0]])
  q = np.concatenate([c + pair, -c + pair])
  rng = np.random.default_rng(0)
  x = np.concatenate([s + pair.mean(0) + 0.5 * rng.normal(size=(500, d)) for s in (c, -c)])
  with pytest.warns(RuntimeWarning, match=_LOSS) as caught:
    got = np.asarray(connection.reverse_knn(x, q, 1))[:, 0]
  assert len(caught) == 1 and caught[0].filename == __file__
  assert np.mean(got != nearest_float64(x, q)) > 0.2  # the loss is real
  with pytest.warns(RuntimeWarning, match=_LOSS):
    connection.knn_labeling(x, q, 50)


@pytest.mark.parametrize("n, d", [(200, 2), (1000, 8), (3000, 64), (1000, 784)])
def test_centred_gaussian_data_stays_quiet(n, d):
  x = gaussian(7, n, d)
  assert connection._common.float32_neighbour_loss(jax.numpy.asarray(x, np.float32)) == (0.0, min(n, 512))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    connection.reverse_knn(gaussian(8, 50, d), x, 1)


def test_near_ties_and_confident_probabilities_stay_quiet():
  # Float32 rounding picks among equidistant neighbours (a lattice of step 0.1, 4 neighbours per point in real
  # arithmetic): a 1e-9 margin counted 50% of these rows as lost. Near-copies of a confident softmax lose
  # neighbours by excesses far below the set's typical spacing.
  lattice = np.stack(np.meshgrid(np.arange(20), np.arange(20)), -1).reshape(-1, 2) * 0.1 - 1.0
  rng = np.random.default_rng(10)
  logits = 12.0 * (rng.normal(size=(600, 10)) + 2.0 * np.eye(10)[rng.integers(0, 10, 600)])
  probs = np.exp(logits - logits.max(axis=1, keepdims=True))
  probs /= probs.sum(axis=1, keepdims=True)
  assert probs.max(axis=1).mean() > 0.94
  for x in (lattice, probs):
    assert connection._common.float32_neighbour_loss(jax.numpy.asarray(x, np.float32))[0] == 0.0
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      connection.select_queries(jax.random.key(0), x, 8)


def test_exact_duplicates_do_not_count_as_lost():
  rng = np.random.default_rng(9)
  for x in (np.repeat(rng.normal(size=(300, 16)), 3, axis=0),  # every row three times
            rng.integers(0, 3, size=(600, 2)).astype(np.float64),  # 9 distinct points, each about 67 times
            np.ones((40, 4))):  # all rows equal
    assert connection._common.float32_neighbour_loss(jax.numpy.asarray(x, np.float32))[0] == 0.0
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      # At most as many queries as distinct points (more are refused: their copies would split the votes).
      connection.select_queries(jax.random.key(0), x, min(3, len(np.unique(x, axis=0))))
      connection.reverse_knn(x[:5], x, 1)
