"""Dyadic Bernoulli sampling: exact probabilities, both threefry words, vmap invariance."""

import math

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
  # No repeated halves. Among 200,001 uniform words the lost (repeated) count is about
  # Poisson(200001 * 200000 / 2^33 = 4.66); requiring at most 23 fails with probability
  # P(Poisson(4.66) >= 24) = 2e-10. Reusing a threefry output word would lose ~100k.
  assert len(np.unique(w)) >= 200_001 - 23
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
  # An rbg key falls back to jax.random.bits, with the same law. 100k draws each at
  # p = 2^15/2^16 and 24000/2^16 (a fallback ignoring the threshold fails the second);
  # |mean - p| < 5 sd: exact binomial false-failure rate 5.7e-7 each, 1.2e-6 for both.
  key = jax.random.key(0, impl="rbg")
  x = M.bernoulli_dyadic(key, 2**15, 16, 10)
  assert x.shape == (10,) and x.dtype == jnp.bool_
  for i, threshold in enumerate((2**15, 24_000)):
    x = np.asarray(M.bernoulli_dyadic(jax.random.fold_in(key, i), threshold, 16, 100_000))
    p = threshold / 2**16
    assert x.shape == (100_000,) and abs(x.mean() - p) < 5 * np.sqrt(p * (1 - p) / x.size)
  assert not np.asarray(M.bernoulli_dyadic(key, 0, 16, 9)).any()
  assert np.asarray(M.bernoulli_dyadic(key, 2**16, 16, 9)).all()
  # Still a pure function of the key.
  np.testing.assert_array_equal(M.bernoulli_dyadic(key, 30_000, 16, 11), M.bernoulli_dyadic(key, 30_000, 16, 11))


# -- exact uniform integers -------------------------------------------------------------
def _binned_expected(bound, bins):
  """Exact probabilities of floor(v * bins / bound) for v uniform on [0, bound)."""
  edges = -(-np.arange(bins + 1) * bound // bins)  # smallest v in each bin
  return np.diff(np.minimum(edges, bound)) / bound


@pytest.mark.parametrize("bound", [3, 7, 8, 70_000, 2**31 - 1])
def test_uniform_below_is_uniform(bound):
  # 3: 16 digits per word (rejection 2^-7); 7: rejection; 8: a power of two (none);
  # 70_000: above 2^16, where jax.random.randint's 32-bit products overflow; 2^31 - 1: the
  # largest bound, one value per word. Chi-square over <= 64 bins of 400k values:
  # false-failure rate 1e-4 per case.
  keys = jax.random.split(jax.random.key(bound % 1000), 1000)
  x = np.asarray(jax.jit(jax.vmap(lambda k: M.uniform_below(k, bound, 400)))(keys)).reshape(-1)
  assert x.dtype == np.int32 and x.min() >= 0 and x.max() < bound
  bins = min(bound, 64)
  observed = np.bincount((x.astype(np.int64) * bins // bound), minlength=bins)
  assert stats.chisquare(observed, _binned_expected(bound, bins) * x.size).pvalue > 1e-4
  # A pure function of the key, batched or not.
  np.testing.assert_array_equal(np.asarray(M.uniform_below(keys[3], bound, 400)), x[1200:1600])


def test_uniform_below_extra_rounds_are_exact():
  # Without spare words, every rejection among the first words forces while_loop rounds
  # (bound 2^26 + 1: one value per word, rejection ~1/64, so 1 - (1 - 1/64)^200 = 95.7% of
  # the 200-value draws need them; fewer than 90% of 2,000 has binomial probability 2e-27).
  # The values stay exactly uniform: chi-square over 64 bins of 400k values, false-failure
  # rate 1e-4; and draws without a rejection equal the spare-word plan's.
  from jaxdistill.mechanisms import _sampling
  bound, num = 2**26 + 1, 200
  plan = _sampling.uniform_plan(bound, num)
  assert plan[0] == 1 and plan[4] > 0
  no_spare = plan[:4] + (0,)
  keys = jax.random.split(jax.random.key(5), 2000)
  x = np.asarray(jax.jit(jax.vmap(lambda k: _sampling._uniform_below(k, bound, num, no_spare)))(keys))
  words = np.asarray(jax.vmap(lambda k: M.uniform_words(k, num))(keys))
  rejected = (words >= plan[2]).any(axis=1)
  assert rejected.mean() > 0.9
  observed = np.bincount(x.reshape(-1).astype(np.int64) * 64 // bound, minlength=64)
  assert stats.chisquare(observed, _binned_expected(bound, 64) * x.size).pvalue > 1e-4
  with_spare = np.asarray(jax.jit(jax.vmap(lambda k: M.uniform_below(k, bound, num)))(keys))
  np.testing.assert_array_equal(x[~rejected], with_spare[~rejected])
  np.testing.assert_array_equal(x[~rejected], words[~rejected] % bound)


def test_uniform_below_edges():
  key = jax.random.key(0)
  assert np.asarray(M.uniform_below(key, 1, 5)).tolist() == [0] * 5
  assert M.uniform_below(key, 3, 0).shape == (0,)
  with pytest.raises(ValueError, match="bound"):
    M.uniform_below(key, 2**31, 3)


@pytest.mark.parametrize("bound", [1, 3, 1000, 2**31 - 1])
def test_uniform_index_is_uniform_for_traced_bounds(bound):
  # 200k draws; chi-square over <= 50 bins, false-failure rate 1e-4 per case.
  keys = jax.random.split(jax.random.key(7), 200_000)
  x = np.asarray(jax.jit(jax.vmap(M.uniform_index, in_axes=(0, None)))(keys, np.int32(bound)))
  assert x.min() >= 0 and x.max() < bound
  if bound > 1:
    bins = min(bound, 50)
    observed = np.bincount(x.astype(np.int64) * bins // bound, minlength=bins)
    assert stats.chisquare(observed, _binned_expected(bound, bins) * x.size).pvalue > 1e-4


def test_uniform_index_falls_back_to_more_words(monkeypatch):
  # Force both first words to be rejected (0xFFFFFFFF is rejected for bound 3, since
  # 2^32 mod 3 = 1): the value must then come from the first word of fold_in(key, 2^31 + 1).
  from jaxdistill.mechanisms import _sampling
  real = _sampling.uniform_words
  calls = []

  def first_call_rejects(key, num):
    calls.append(num)
    return jnp.full((num,), 0xFFFFFFFF, jnp.uint32) if len(calls) == 1 else real(key, num)

  monkeypatch.setattr(_sampling, "uniform_words", first_call_rejects)
  key = jax.random.key(9)
  got = int(_sampling.uniform_index(key, jnp.int32(3)))
  assert len(calls) == 2
  assert got == int(real(jax.random.fold_in(key, 2**31 + 1), 2)[0]) % 3


def test_fallback_keys_are_not_words_of_the_first_draw():
  # fold_in(key, j) hashes the counter (0, j) that also gives words 2j, 2j + 1 of uniform_words(key):
  # with j = r a fallback round's key would be two words the first draw used as values.
  from jaxdistill.mechanisms import _sampling
  key = jax.random.key(3)
  words = np.asarray(M.uniform_words(key, 64)).reshape(-1, 2)
  assert np.array_equal(np.asarray(jax.random.key_data(jax.random.fold_in(key, 1))), words[1])  # the hazard
  for r in (1, 2, 31):
    data = np.asarray(jax.random.key_data(_sampling._round_key(key, jnp.uint32(r))))
    assert not (words == data).all(axis=1).any()


@pytest.mark.parametrize("call,match", [
    (lambda k: M.bernoulli_dyadic(k, 0.3, 16, 8), "threshold"),
    (lambda k: M.bernoulli_dyadic(k, 2**16 + 1, 16, 8), "threshold"),
    (lambda k: M.bernoulli_dyadic(k, -1, 32, 8), "threshold"),
    (lambda k: M.bernoulli_dyadic(k, 3, 8, 8), "bits"),
    (lambda k: M.bernoulli_dyadic(k, 3, 16, -1), "num"),
    (lambda k: M.uniform_index(k, 0), "bound"),
    (lambda k: M.uniform_index(k, jnp.int32(2**31 - 1) + 1), "bound"),
    (lambda k: M.uniform_index(k, 2.5), "bound"),
    (lambda k: M.uniform_below(k, 5, -3), "num"),
    (lambda k: M.uniform_below(k, 0, 3), "bound"),
    (lambda k: M.uniform_words(k, -3), "num_words")])
def test_sampling_helpers_reject_bad_arguments(call, match):
  with pytest.raises(ValueError, match=match):
    call(jax.random.key(0))


@pytest.mark.parametrize("call", [
    lambda k: M.uniform_words(k, 4),
    lambda k: M.uniform_below(k, 3, 4),
    lambda k: M.uniform_index(k, 3),
    lambda k: M.bernoulli_dyadic(k, 5, 16, 4)])
def test_sampling_helpers_name_a_bad_key(call):
  # key=0 or None raised a JAX TypeError; legacy PRNGKey data is wrapped (the same numbers as the typed key).
  for bad in (0, None, "key", np.zeros(2, np.float32)):
    with pytest.raises(ValueError, match="key"):
      call(bad)
  np.testing.assert_array_equal(np.asarray(call(jax.random.PRNGKey(4))), np.asarray(call(jax.random.key(4))))


def test_dyadic_ceil_refuses_what_is_not_a_probability():
  # "0.5" and None raised TypeError, and True was read as 1.0 (65536), silently.
  for bad in ("0.5", None, True, np.bool_(False), math.nan, -0.1, 1.5):
    with pytest.raises(ValueError, match="prob"):
      M.dyadic_ceil(bad, 16)
  for bad_bits in (True, 8, "16", None):
    with pytest.raises(ValueError, match="bits"):
      M.dyadic_ceil(0.5, bad_bits)
  # Valid probabilities of any real type give ceil(prob * 2^bits) as before (exact: 2^bits scales exactly).
  assert M.dyadic_ceil(np.float32(0.3), 16) == math.ceil(float(np.float32(0.3)) * 2**16)
  assert M.dyadic_ceil(0, 32) == 0 and M.dyadic_ceil(1, 32) == 2**32
  # Small NumPy types: prob * 2^bits in their own dtype overflowed (float16 to inf, int8 to int32 to NumPy's
  # OverflowError; float16 0 to 0 * inf = NaN). The reference is Fraction arithmetic, exact for every input.
  from fractions import Fraction  # pylint: disable=import-outside-toplevel
  for prob in (np.float16(0.3), np.float16(0.5), np.float16(0.0), np.int8(1), np.uint8(0), np.int16(1),
               np.int32(1), np.longdouble(1) / 3, Fraction(1, 3), np.asarray(0.25)):
    for bits in (16, 32):
      value = prob[()] if isinstance(prob, np.ndarray) else prob
      exact = Fraction(int(value)) if isinstance(value, np.integer) else Fraction(*value.as_integer_ratio())
      want = min(math.ceil(exact * 2**bits), 2**bits)
      assert M.dyadic_ceil(prob, bits) == want, (prob, bits)


def test_uniform_below_caps_num_and_uniform_index_takes_one_bound():
  # uniform_below took any num: past 2^31 - 1 it named num_words (never passed) or overflowed int32 as a jitted
  # argument (OverflowError), after eager mode had asked for the values' memory (16 GiB at 2^32).
  with pytest.raises(ValueError, match=r"^Expected num=2147483648 <= 2147483647\.$"):
    M.uniform_below(jax.random.key(0), 2**31 - 1, 2**31)
  # An array of bounds drew every value from one word: all equal for equal bounds, and each word was accepted by
  # one entry's bound, biasing the others modulo theirs.
  for bound in (np.array([1000, 1000]), jnp.ones((1, 1), jnp.int32)):
    with pytest.raises(ValueError, match=r"^Expected bound to be one integer \(0-d\); got shape "):
      M.uniform_index(jax.random.key(0), bound)
  with pytest.raises(ValueError, match=r"one integer \(0-d\); got shape \(2,\)"):
    jax.jit(M.uniform_index)(jax.random.key(0), jnp.array([3, 4]))


@pytest.mark.parametrize("bad_bits, needle", [
    (np.array([16, 32]), r"bits to be an integer, got array"),  # NumPy's "truth value ... is ambiguous"
    (np.array([16]), r"bits to be an integer, got array"),  # was accepted as 16 by bernoulli_dyadic
    (64, r"bits to be 16 or 32 .*got bits=64"),
    (16.5, r"bits to be an integer, got 16\.5"),
])
def test_dyadic_sampling_names_bits_that_are_not_16_or_32(bad_bits, needle):
  for call in (lambda: M.dyadic_ceil(0.5, bad_bits), lambda: M.bernoulli_dyadic(jax.random.key(0), 3, bad_bits, 4)):
    with pytest.raises(ValueError, match=needle) as err:
      call()
    assert "\n" not in str(err.value)
  assert M.SAMPLER_BITS == (16, 32) and M.dyadic_ceil(0.5, 16.0) == 2**15  # a whole float is the int


@pytest.mark.parametrize("bits, threshold, num", [
    (32, 2**32, 2**40),  # was jnp.ones((2^40,)): a deep RESOURCE_EXHAUSTED error (a TiB)
    (32, 5, 2**33),  # failed naming num_words, which the caller never passed
    (16, 5, 2**40),
    (16, 5, 2**31),  # MAX_DRAWS + 1
])
def test_bernoulli_dyadic_refuses_more_draws_than_max_draws(bits, threshold, num):
  with pytest.raises(ValueError, match=rf"^Expected num={num} <= 2147483647\.$"):
    M.bernoulli_dyadic(jax.random.key(0), threshold, bits, num)
  assert M.MAX_DRAWS == 2**31 - 1


def test_dyadic_ceil_refuses_an_infinite_probability():
  for bad in (math.inf, -math.inf, 10**400):
    with pytest.raises(ValueError, match="prob"):
      M.dyadic_ceil(bad, 32)
