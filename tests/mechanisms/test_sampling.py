"""Dyadic Bernoulli sampling: exact probabilities, both threefry words, vmap invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdistill import mechanisms as M


def test_dyadic_ceil():
  assert M.dyadic_ceil(0.25, 16) == 16384
  assert M.dyadic_ceil(0.25 + 1e-9, 16) == 16385
  assert M.dyadic_ceil(1.0, 32) == 2**32 and M.dyadic_ceil(0.0, 16) == 0
  with pytest.raises(ValueError, match="bits"):
    M.dyadic_ceil(0.5, 8)
  with pytest.raises(ValueError, match="prob"):
    M.dyadic_ceil(1.5, 16)


def test_uniform_words_use_both_threefry_outputs_and_are_uniform():
  key = jax.random.key(3)
  w = np.asarray(M.uniform_words(key, 200_001))
  assert w.dtype == np.uint32 and w.shape == (200_001,)
  assert len(np.unique(w)) > 199_990  # no repeated halves
  # Every byte uniform: chi-square on 256 bins per byte position, Bonferroni over 4,
  # false-failure rate 1e-4.
  for shift in (0, 8, 16, 24):
    counts = np.bincount((w >> shift) & 0xFF, minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4 / 4
  # A prefix of a longer stream is the shorter stream (counter mode).
  np.testing.assert_array_equal(np.asarray(M.uniform_words(key, 7)), w[:7])


@pytest.mark.parametrize("bits,threshold", [(16, 24_000), (32, 1_700_000_000)])
def test_bernoulli_dyadic_rate(bits, threshold):
  # 1e6 draws; |mean - t/2^b| < 5 sd: false-failure rate < 1e-6.
  x = np.asarray(M.bernoulli_dyadic(jax.random.key(1), threshold, bits, 1_000_000))
  p = threshold / 2**bits
  assert abs(x.mean() - p) < 5 * np.sqrt(p * (1 - p) / x.size)


def test_bernoulli_dyadic_edges_and_vmap_invariance():
  key = jax.random.key(0)
  assert not np.asarray(M.bernoulli_dyadic(key, 0, 16, 9)).any()
  assert np.asarray(M.bernoulli_dyadic(key, 2**16, 16, 9)).all()
  assert np.asarray(M.bernoulli_dyadic(key, 2**32, 32, 9)).all()
  keys = jax.random.split(key, 5)
  batched = np.asarray(jax.vmap(lambda k: M.bernoulli_dyadic(k, 30_000, 16, 11))(keys))
  single = np.stack([np.asarray(M.bernoulli_dyadic(k, 30_000, 16, 11)) for k in keys])
  np.testing.assert_array_equal(batched, single)


def test_other_key_implementations_fall_back():
  key = jax.random.key(0, impl="rbg")
  x = M.bernoulli_dyadic(key, 2**15, 16, 10)
  assert x.shape == (10,) and x.dtype == jnp.bool_
