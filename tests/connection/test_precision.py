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


@pytest.mark.parametrize("rule", ["knn-labeling", "balanced-max-min"])
def test_every_rule_warns(rule):
  x, q = gaussian(4, 60, 3), gaussian(5, 6, 3)
  with pytest.warns(RuntimeWarning, match=_MESSAGE):
    connection.connect(rule, x + 500.0, q + 500.0, 1)


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
