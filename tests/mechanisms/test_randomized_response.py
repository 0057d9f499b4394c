"""Randomized response: exact pmf, tight privacy, unbiasedness and variance."""

import decimal
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdistill import accounting
from jaxdistill import mechanisms as M
from jaxdistill import simulation
from tests.mechanisms._stats import assert_mean_and_variance


def exact_pmf(mech, buckets, labels):
  """pmf over all 2^d messages, from the definition (keep p, flip q per bit)."""
  d = mech.shape.d
  truth = np.zeros(d, bool)
  for b in buckets:
    for lab in labels:
      if b >= 0 and lab >= 0:
        truth[b * mech.shape.num_labels + lab] = True
  p = mech.keep_probability
  out = {}
  for bits in itertools.product([False, True], repeat=d):
    same = np.sum(np.array(bits) == truth)
    out[bits] = p**same * (1 - p)**(d - same)
  return out


def test_sampler_matches_exact_pmf():
  # s=2, |Y|=2, k=1: 16 messages. Chi-square goodness of fit at 2e4 draws;
  # false-failure rate 1e-3 at the fixed seed.
  mech = M.RandomizedResponse(M.BsvsShape(2, 2, 1), 1.2)
  b, lab = jnp.array([1], jnp.int32), jnp.array([0], jnp.int32)
  keys = jax.random.split(jax.random.key(0), 20000)
  msgs = np.asarray(jax.vmap(lambda k: mech.randomize(k, b, lab))(keys))
  pmf = exact_pmf(mech, [1], [0])
  outcomes = list(pmf)
  index = {o: i for i, o in enumerate(outcomes)}
  observed = np.bincount([index[tuple(m)] for m in msgs], minlength=len(outcomes))
  expected = np.array([pmf[o] for o in outcomes]) * len(msgs)
  assert stats.chisquare(observed, expected).pvalue > 1e-3


@pytest.mark.parametrize("eps,k", [(0.5, 1), (2.0, 1), (1.0, 2)])
def test_privacy_is_exactly_epsilon_on_the_worst_pair(eps, k):
  # The worst pair: disjoint supports (2kr differing bits).
  mech = M.RandomizedResponse(M.BsvsShape(3, 2, k), eps)
  p = exact_pmf(mech, list(range(k)), [0])
  q = exact_pmf(mech, list(range(3 - k, 3)) if k > 1 else [2], [1])
  assert accounting.privacy_profile(p, q, eps) <= 1e-12
  assert accounting.privacy_profile(p, q, eps * 0.99) > 1e-6  # tight
  # The sampler's flip probability is q rounded up to a dyadic value, so the
  # exact epsilon is 2kr ln(p/q) of that value: at most eps, within 0.1%.
  exact = accounting.epsilon_for_delta(p, q, 0.0)
  assert exact == pytest.approx(2 * mech.shape.c * mech.effective_bit_epsilon, rel=1e-9)
  assert eps * (1 - 1e-3) <= exact <= eps
  assert mech.account().epsilon(0.0) == pytest.approx(exact, rel=1e-6)
  assert mech.privacy().relation is accounting.Relation.REPLACE_ONE


def variance_reference(mech, n):
  """n p(1 - p) / (2p - 1)^2 per entry, p the sampler's keep probability: each of the n
  clients' bits is Bernoulli(p) or Bernoulli(1 - p), and the estimate divides by p - q = 2p - 1."""
  p = mech.keep_probability
  return np.full((mech.shape.num_buckets, mech.shape.num_labels), n * p * (1 - p) / (2 * p - 1) ** 2)


@pytest.mark.parametrize("eps,k", [(0.5, 1), (2.0, 1), (1.0, 2), (1e-3, 1)])
def test_entry_variance_matches_the_closed_form_and_the_exact_pmf(eps, k):
  mech = M.RandomizedResponse(M.BsvsShape(3, 2, k), eps)
  n = 9
  counts = np.array([[0, 9], [3, 1], [9, 2]])
  want = variance_reference(mech, n)
  np.testing.assert_allclose(mech.entry_variance(counts, n), want, rtol=1e-10, atol=0)
  # The same per-client variance by summing the exact pmf over all 2^6 messages, for the
  # estimate (bit - q)/(p - q) of each entry (it does not depend on the client's input).
  p = mech.keep_probability
  pmf = exact_pmf(mech, list(range(k)), [0])
  bits = np.array(list(pmf), np.float64)
  prob = np.array(list(pmf.values()))
  est = (bits - (1 - p)) / (2 * p - 1)
  mean = prob @ est
  per_client = prob @ (est - mean) ** 2
  np.testing.assert_allclose(n * per_client.reshape(3, 2), want, rtol=1e-10, atol=0)


def test_unbiased_with_closed_form_variance():
  # 200 independent runs over n = 500 clients; per-entry z-test on the mean and
  # chi-square interval on the variance (n p(1-p)/(2p-1)^2), Bonferroni over 8 entries
  # x 2 tests, family-wise false-failure rate 1e-3.
  w = M.synthetic_workload(jax.random.key(1), num_clients=500, num_buckets=4, num_labels=2, k=1)
  inp = w.materialize()
  truth = np.asarray(M.bsvs_counts(inp, w.shape), np.float64)
  mech = M.RandomizedResponse(w.shape, 1.0)
  runs = np.stack([simulation.simulate(jax.random.key(100 + i), mech, inp).estimate for i in range(200)])
  var = variance_reference(mech, 500)
  alpha = 1e-3 / 16
  assert_mean_and_variance(runs, truth, var, alpha)


@pytest.mark.parametrize("eps,k,bits", [(1.0, 1, 16), (0.3, 2, 16), (0.05, 1, 32), (1e-4, 1, 32)])
def test_flip_probability_is_dyadic_and_rounded_towards_one_half(eps, k, bits):
  mech = M.RandomizedResponse(M.BsvsShape(4, 2, k), eps)
  q_exact = 1 / (1 + math.exp(eps / (2 * k)))
  q = 1 - mech.keep_probability
  assert mech.sampler_bits == bits
  assert (q * 2**bits).is_integer()
  assert q_exact <= q < q_exact + 2.0**-bits
  assert mech.effective_bit_epsilon <= mech.bit_epsilon * (1 + 1e-15)
  assert mech.effective_bit_epsilon >= mech.bit_epsilon * (1 - 1e-3)


def test_rounding_costs_at_most_the_documented_share_of_eps_prime():
  # Class docstring: rounding q up to the sampler's grid lowers the per-bit loss by at most 0.1% for
  # 1e-6 <= eps' <= 18, and by at most ln(1 + 2^-32 / q) - ln(1 - 2^-32 / p) (about 3%) up to ln(2^32 - 1).
  # Checked against q's ceiling computed here, on a grid of eps' (c = 1: eps = 2 eps'), short of the top, where
  # the float e^eps' here can round q * 2^32 above 1.
  shape = M.BsvsShape(2, 2, 1)
  top = math.log(2.0**32 - 1)
  for e in [*np.geomspace(1e-6, 18.0, 80), *np.linspace(18.0, top - 1e-9, 60)]:
    mech = M.RandomizedResponse(shape, 2 * float(e))
    bits = mech.sampler_bits
    q = 1 / (1 + math.exp(e))
    t = math.ceil(q * 2**bits)
    actual = math.log((2**bits - t) / t)
    assert mech.effective_bit_epsilon == pytest.approx(actual, rel=1e-12, abs=1e-18)
    loss = (e - actual) / e
    bound = 1e-3 if e <= 18.0 else (math.log1p(2.0**-32 / q) - math.log1p(-(2.0**-32) / (1 - q))) / e
    assert -1e-15 <= loss <= bound * (1 + 1e-9), (e, loss, bound)


def test_flip_threshold_is_the_exact_ceiling_on_the_grid_edges():
  # Epsilons whose exact q * 2^16 lies within a few ulps of an integer j. The threshold came from the float
  # q, which can land on j when the exact value is just above it: a flip probability below q and a per-bit
  # loss above eps' (about 1e-16 relative; 3,791 such epsilons in a finer search). Checked exactly.
  shape = M.BsvsShape(4, 4, 1)  # c = 1: eps' = eps / 2
  with decimal.localcontext(decimal.Context(prec=60)):
    for j in range(1000, 30000, 97):
      eps = 2 * math.log((2**16 - j) / j)
      for step in range(-4, 5):
        e = eps
        for _ in range(abs(step)):
          e = math.nextafter(e, math.inf if step > 0 else 0.0)
        mech = M.RandomizedResponse(shape, e)
        assert mech.sampler_bits == 16
        exact = 2**16 / (1 + (decimal.Decimal(e) / 2).exp())  # q * 2^16
        assert mech.flip_threshold - 1 < exact <= mech.flip_threshold, (e, mech.flip_threshold, exact)


def test_flip_frequency_matches_the_dyadic_probability():
  # 4e6 flips (d = 8 bits x 5e5 keys): |freq - q| < 5 sd, false failure < 1e-6.
  mech = M.RandomizedResponse(M.BsvsShape(4, 2, 1), 1.0)
  b, lab = jnp.array([0], jnp.int32), jnp.array([0], jnp.int32)
  keys = jax.random.split(jax.random.key(11), 500_000)
  msgs = np.asarray(jax.vmap(lambda k: mech.randomize(k, b, lab))(keys))
  flips = np.concatenate([~msgs[:, :1], msgs[:, 1:]], axis=1)
  q = 1 - mech.keep_probability
  assert abs(flips.mean() - q) < 5 * math.sqrt(q * (1 - q) / flips.size)


@pytest.mark.parametrize("epsilon", [60.0, 1500.0, 1e30])
def test_huge_epsilon_flips_with_the_smallest_dyadic_probability(epsilon):
  # e^eps' overflowed a float (an OverflowError beyond eps' ~ 709); a q that underflows to 0 must not
  # switch the noise off: the sampler keeps flipping w.p. 2^-32, so its loss is ln(2^32 - 1) per bit.
  mech = M.RandomizedResponse(M.BsvsShape(2, 2, 1), epsilon)
  assert (mech.sampler_bits, mech.flip_threshold) == (32, 1)
  assert mech.effective_bit_epsilon == pytest.approx(math.log(2.0**32 - 1), rel=1e-12)
  assert mech.privacy().epsilon == epsilon  # the asked epsilon bounds the smaller actual loss


def test_bad_epsilon():
  with pytest.raises(ValueError, match="epsilon"):
    M.RandomizedResponse(M.BsvsShape(2, 2, 1), 0.0)
  with pytest.raises(ValueError, match="epsilon"):
    M.RandomizedResponse(M.BsvsShape(2, 2, 1), math.nan)
  with pytest.raises(ValueError, match="epsilon"):
    M.RandomizedResponse(M.BsvsShape(2, 2, 1), 1e-12)


def test_max_error_bound_at_a_subnormal_beta_is_the_cap():
  # log(beta / (2d)) failed with "math domain error" at beta = 5e-324 (the quotient underflowed to 0). So small a
  # beta asks for more than n(1 - q) / (p - q) = n p / (2p - 1), the most |error| can be: the bound is that cap.
  mech = M.RandomizedResponse(M.BsvsShape(4, 3, 1), 1.0)
  p = mech.keep_probability
  cap = 100 * p / (2 * p - 1)
  assert mech.max_error_bound(5e-324, num_clients=100) == pytest.approx(cap, rel=1e-12)
  assert mech.max_error_bound(0.05, num_clients=100) < mech.max_error_bound(1e-300, num_clients=100) <= cap
