"""Collision mechanism: exact pmf, tight eps-LDP, exact hit rates, sampler law, estimator."""

import dataclasses
import functools
import itertools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from jaxdistill import accounting
from jaxdistill import mechanisms as M
from jaxdistill import simulation
from tests.mechanisms._stats import assert_mean_and_variance
from jaxdistill.mechanisms import _collision


def definition_pmf(hashed, l, eps, c):
  """Pr[z = v | hash table] from Definition 5, for the hashed positions of S."""
  members = set(int(v) for v in hashed)
  omega = c * math.exp(eps) + l - c
  out = np.empty(l)
  for v in range(l):
    if v in members:
      out[v] = math.exp(eps) / omega
    else:
      out[v] = (omega - len(members) * math.exp(eps)) / ((l - len(members)) * omega)
  return out


def joint_pmf(entries, d, l, eps, c):
  """Exact pmf over (hash table, z): uniform table in [l]^d times Definition 5."""
  tables = list(itertools.product(range(l), repeat=d))
  out = np.empty((len(tables), l))
  for t, table in enumerate(tables):
    out[t] = definition_pmf([table[j] for j in entries], l, eps, c) / l**d
  return tables, out


def numpy_workload(seed, n, s, y, k):
  """n clients with k distinct buckets (skewed) and one label correlated with the first."""
  rng = np.random.default_rng(seed)
  weights = 1.0 / np.arange(1, s + 1)
  buckets = np.stack([rng.choice(s, k, replace=False, p=weights / weights.sum()) for _ in range(n)])
  labels = np.where(rng.random(n) < 0.7, buckets[:, 0] % y, rng.integers(0, y, n))[:, None]
  return M.make_bsvs_input(buckets, labels, num_buckets=s, num_labels=y)


# Tiny configurations: (s, |Y|, k, eps). d = s|Y|, c = k (r = 1).
CONFIGS = [(2, 2, 1, 1.0), (3, 1, 2, 0.5), (3, 1, 1, 2.0)]


def all_inputs(s, y, k):
  """Every client input (set of flattened entries) with r = 1: up to k buckets, one label."""
  out = []
  for size in range(0, k + 1):
    for buckets in itertools.combinations(range(s), size):
      for label in range(y):
        out.append(tuple(b * y + label for b in buckets))
  return sorted(set(out))


@pytest.mark.parametrize("s,y,k,eps", CONFIGS)
def test_exact_pmf_is_tight_pure_eps_ldp(s, y, k, eps):
  # Every table has probability l^-d > 0, so delta = 0 at eps on the joint pmf over
  # (table, z) is the same as eps-LDP of the pmf over z for every fixed hash table.
  mech = M.Collision(M.BsvsShape(s, y, k), eps)
  l, d, c = mech.bloom_length, s * y, k
  assert l == math.floor(c * math.exp(eps) + 2 * c - 1)
  pmfs = {S: joint_pmf(S, d, l, eps, c)[1].reshape(-1) for S in all_inputs(s, y, k)}
  for pmf in pmfs.values():
    assert math.fsum(pmf) == pytest.approx(1.0, abs=1e-12)
  worst = 0.0
  for (S, p), (S2, p2) in itertools.permutations(pmfs.items(), 2):
    assert accounting.privacy_profile(p, p2, eps) <= 1e-12, (S, S2)
    worst = max(worst, accounting.epsilon_for_delta(p, p2, 0.0))
  assert worst == pytest.approx(eps, rel=1e-9)  # tight: some pair attains e^eps
  assert mech.privacy().epsilon == eps and mech.privacy().delta == 0.0
  assert mech.privacy().relation is accounting.Relation.REPLACE_ONE


@pytest.mark.parametrize("s,y,k,eps", CONFIGS)
def test_exact_hit_rates_by_enumerating_hashes(s, y, k, eps):
  # E[hit_j] = p for j in S (whatever hash collisions shrink C to), q = 1/l otherwise.
  mech = M.Collision(M.BsvsShape(s, y, k), eps)
  l, d = mech.bloom_length, s * y
  for S in all_inputs(s, y, k):
    tables, pmf = joint_pmf(S, d, l, eps, k)
    hit = np.zeros(d)
    for t, table in enumerate(tables):
      for j in range(d):
        hit[j] += pmf[t, table[j]]
    for j in range(d):
      assert hit[j] == pytest.approx(mech.p if j in S else mech.q, abs=1e-12)
  assert mech.p == pytest.approx(math.exp(eps) / (k * math.exp(eps) + l - k), rel=1e-14)


@pytest.mark.parametrize("s,y,k,eps,bucket,label", [(2, 2, 1, 1.0, 1, 0), (2, 1, 2, 0.5, None, 0)])
def test_sampler_matches_exact_joint_pmf(s, y, k, eps, bucket, label):
  # Chi-square of (hash table, z) over all l^d * l cells at 40k draws; false-failure rate
  # 1e-3 per case. The second case (k = 2 in a domain of 2) covers |C| < c collisions.
  mech = M.Collision(M.BsvsShape(s, y, k), eps)
  l, d = mech.bloom_length, s * y
  buckets = jnp.array([bucket] if k == 1 else [0, 1], jnp.int32)
  labels = jnp.array([label], jnp.int32)
  S = tuple(sorted(int(b) * y + label for b in np.asarray(buckets)))
  tables, pmf = joint_pmf(S, d, l, eps, k)
  keys = jax.random.split(jax.random.key(11), 40000)
  msgs = jax.vmap(mech.randomize, in_axes=(0, None, None))(keys, buckets, labels)
  drawn = np.asarray(jax.vmap(lambda sd: _collision.hash_table(sd, d, l))(msgs.seed))
  z = np.asarray(msgs.output)
  cell = (drawn @ (l ** np.arange(d - 1, -1, -1))) * l + z
  observed = np.bincount(cell, minlength=pmf.size)
  assert stats.chisquare(observed, pmf.reshape(-1) * len(z)).pvalue > 1e-3


def variance_reference(counts, n, eps, c, l):
  """Var of the Collision estimate per entry, from Definition 5 (not from the code under test).

  hit_ij is Bernoulli(p) for the A_j clients holding entry j and Bernoulli(q) for the others,
  independent over clients, with p = e^eps / Omega and q = 1/l; the estimate divides the hit
  sum by p - q.
  """
  omega = c * math.exp(eps) + l - c
  p, q = math.exp(eps) / omega, 1.0 / l
  a = np.asarray(counts, np.float64)
  return (a * p * (1 - p) + (n - a) * q * (1 - q)) / (p - q) ** 2


@pytest.mark.parametrize("s,y,k,eps", CONFIGS + [(4, 3, 1, 1.5), (3, 2, 2, 0.3)])
def test_entry_variance_matches_the_definition(s, y, k, eps):
  mech = M.Collision(M.BsvsShape(s, y, k), eps)
  n = 7
  counts = np.arange(s * y).reshape(s, y) % (n + 1)  # includes 0 and, where s|Y| > 7, n
  want = variance_reference(counts, n, eps, k, mech.bloom_length)
  np.testing.assert_allclose(mech.entry_variance(counts, n), want, rtol=1e-10, atol=0)


@functools.lru_cache(maxsize=None)
def collision_replicates():
  """200 independent simulations of Collision(eps = 1.5) over n = 400 clients (shared by two tests)."""
  inp, shape = numpy_workload(1, 400, 4, 3, 1)
  truth = np.asarray(M.bsvs_counts(inp, shape), np.float64)
  mech = M.Collision(shape, 1.5)
  results = [simulation.simulate(jax.random.key(300 + i), mech, inp) for i in range(200)]
  return inp, truth, mech, results


def test_unbiased_with_closed_form_variance():
  # 200 independent runs over n = 400 clients; per-entry z-test on the mean and a
  # chi-square interval on the variance (from Definition 5), Bonferroni over 12
  # entries x 2 tests, family-wise false-failure rate 1e-3.
  _, truth, mech, results = collision_replicates()
  runs = np.stack([r.estimate for r in results])
  var = variance_reference(truth, 400, mech.epsilon, 1, mech.bloom_length)
  alpha = 1e-3 / 24
  assert_mean_and_variance(runs, truth, var, alpha)


@dataclasses.dataclass(frozen=True)
class CollisionWrongQ(M.Collision):
  """Planted bug: debiases with q = 1/(l + 1) instead of 1/l (sampler and statistics unchanged)."""

  def estimate(self, key, hit_sums, num_clients):
    del key
    hits = np.asarray(hit_sums, np.float64).reshape(self.shape.num_buckets, self.shape.num_labels)
    wrong_q = 1.0 / (self.bloom_length + 1)
    return (hits - num_clients * wrong_q) / (self.p - wrong_q)


def test_wrong_rate_is_detected():
  # Power check of test_unbiased_with_closed_form_variance: the same 200 replicates,
  # debiased by the planted estimator, must fail the same check at the same alpha.
  inp, truth, mech, results = collision_replicates()
  n, m, alpha = 400, len(results), 1e-3 / 24
  bug = CollisionWrongQ(mech.shape, mech.epsilon)
  assert (bug.bloom_length, bug.p, bug.q) == (mech.bloom_length, mech.p, mech.q)
  # The planted estimator runs in the real pipeline: simulate() with it gives the
  # replicate's statistics (same sampler, same key) and the planted estimate of them.
  one = simulation.simulate(jax.random.key(300), bug, inp)
  np.testing.assert_array_equal(one.stats, results[0].stats)
  np.testing.assert_array_equal(one.estimate, bug.estimate(None, results[0].stats, n))
  wrong = np.stack([bug.estimate(None, r.stats, n) for r in results])
  var = variance_reference(truth, n, mech.epsilon, 1, mech.bloom_length)
  with pytest.raises(AssertionError):
    assert_mean_and_variance(wrong, truth, var, alpha)
  # Control: the correct estimates of the same replicates pass the same check.
  assert_mean_and_variance(np.stack([r.estimate for r in results]), truth, var, alpha)
  # Rate of a missed detection, from Definition 5 (normal approximation of the mean of m
  # replicates): the planted mean of entry j is (E[H_j] - n q') / (p - q') with q' = 1/(l+1),
  # and the z-test alone passes entry j with the probability below; its smallest value
  # over the entries bounds the missed-detection rate (about 1e-78 here; asserted < 1e-12).
  p, q, qw = mech.p, mech.q, 1.0 / (mech.bloom_length + 1)
  mean_hits = truth * p + (n - truth) * q
  var_hits = truth * p * (1 - p) + (n - truth) * q * (1 - q)
  shift = (mean_hits - n * qw) / (p - qw) - truth
  sd_ref, sd_bug = np.sqrt(var / m), np.sqrt(var_hits / m) / (p - qw)
  thr = stats.norm.isf(alpha / 2)
  passes = stats.norm.cdf((thr * sd_ref - shift) / sd_bug) - stats.norm.cdf((-thr * sd_ref - shift) / sd_bug)
  assert passes.min() < 1e-12


# (shape, eps) pairs: each compiles once.
SHAPES = [(M.BsvsShape(3, 2, 2, 1), 0.3), (M.BsvsShape(4, 3, 1, 2), 2.0)]
_JITTED = {}


def jitted(mech):
  """One compiled (randomize, analyze, hash table) per mechanism (shapes are fixed)."""
  if mech not in _JITTED:
    d, l = mech.shape.d, mech.bloom_length
    _JITTED[mech] = jax.jit(lambda key, b, lab: (
        mech.randomize(key, b, lab),
        mech.analyze(mech.randomize(key, b, lab)),
        _collision.hash_table(mech.randomize(key, b, lab).seed, d, l)))
  return _JITTED[mech]


@given(shape_index=st.integers(0, len(SHAPES) - 1), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_message_and_hits_are_consistent(shape_index, data, seed):
  shape, eps = SHAPES[shape_index]
  buckets = data.draw(st.lists(st.integers(0, shape.num_buckets - 1), min_size=1, max_size=shape.k,
                               unique=True))
  labels = data.draw(st.lists(st.integers(0, shape.num_labels - 1), min_size=1, max_size=shape.r,
                              unique=True))
  b = jnp.array(buckets + [-1] * (shape.k - len(buckets)), jnp.int32)
  lab = jnp.array(labels + [-1] * (shape.r - len(labels)), jnp.int32)
  mech = M.Collision(shape, eps)
  key = jax.random.key(seed)
  msg, hits, table = jitted(mech)(key, b, lab)
  assert int(msg.output) == int(jitted(mech)(key, b, lab)[0].output)  # pure: same key, same z
  z = int(msg.output)
  assert 0 <= z < mech.bloom_length
  table, hits = np.asarray(table), np.asarray(hits)
  assert hits.dtype == np.int32 and hits.shape == (shape.d,)
  np.testing.assert_array_equal(hits, (table == z).astype(np.int32))


def test_bad_input():
  shape = M.BsvsShape(3, 2, 2)
  for bad in (0.0, -1.0, math.nan, math.inf):
    with pytest.raises(ValueError, match="epsilon"):
      M.Collision(shape, bad)
  for bad in (1, 2, 0, 2.5):  # l >= c + 1 = 3 and l >= 2
    with pytest.raises(ValueError, match="bloom_length"):
      M.Collision(shape, 1.0, bloom_length=bad)
  with pytest.raises(ValueError, match="epsilon"):
    M.Collision(shape, 30.0)  # default l would overflow int32
  with pytest.raises(ValueError, match="k"):
    M.Collision(M.BsvsShape(2, 2, 3), 1.0)
  with pytest.raises(ValueError, match="r"):
    M.Collision(M.BsvsShape(2, 2, 1, 0), 1.0)
  assert M.Collision(shape, 1.0, bloom_length=3).bloom_length == 3
  # simultaneous is a flag: "no" was truthy and gave the bound over all entries.
  mech = M.Collision(shape, 1.0)
  assert mech.accuracy(0.05, 1000, simultaneous=True) > mech.accuracy(0.05, 1000, simultaneous=False)
  with pytest.raises(ValueError, match="Expected simultaneous to be a bool, got 'no'"):
    mech.accuracy(0.05, 1000, simultaneous="no")


def test_coin_thresholds_are_exactly_m_times_p():
  # The sampler draws z in C with probability |C| p by comparing W uniform words with
  # round-free integers m p 2^(32 W): p is a float64, hence dyadic, so this is exact.
  from fractions import Fraction
  for eps, c, l in [(1.0, 1, 3), (0.5, 2, 6), (2.0, 3, 30), (0.01, 1, 2**31 - 1)]:
    p, q, omega = _collision.collision_rates(eps, c, l)
    table = _collision._coin_thresholds(p, c)
    width = table.shape[1]
    for m in range(c + 1):
      value = sum(int(w) << (32 * (width - 1 - i)) for i, w in enumerate(table[m]))
      assert Fraction(value, 2 ** (32 * width)) == m * Fraction(p)
    # p is the float64 just below e^eps / Omega (50 digits): the real ratio is <= e^eps.
    import decimal
    with decimal.localcontext(decimal.Context(prec=50)):
      e = decimal.Decimal(eps).exp()
      exact = e / (c * e + l - c)
      assert decimal.Decimal(p) <= exact < decimal.Decimal(math.nextafter(p, 1.0))
    assert q == 1.0 / l and omega == pytest.approx(c * math.exp(eps) + l - c)


@given(st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=2))
def test_multiword_comparison(pair):
  u, t = pair
  words = lambda v: jnp.array([v >> 32, v & 0xFFFFFFFF], jnp.uint32)
  assert bool(_collision._words_below(words(u), words(t))) == (u < t)
  assert not bool(_collision._words_below(words(u), words(u)))


@pytest.mark.parametrize("eps,bloom_length", [(1e-300, None), (1e-12, None), (1e-12, 2**20), (1e-300, 2**31 - 1)])
def test_epsilon_too_small_for_float64_rates_is_refused(eps, bloom_length):
  # p - q = (l - c)(e^eps - 1)/(l Omega) vanishes (p == q: NaN estimates) or is all
  # rounding error; p - q >= 2^-30 q (about eps >= 2^-29) is required.
  shape = M.BsvsShape(4, 2, 1)
  with pytest.raises(ValueError, match="epsilon"):
    M.Collision(shape, eps, bloom_length=bloom_length)
  mech = M.Collision(shape, 1e-8, bloom_length=bloom_length)
  assert mech.p - mech.q >= 2.0**-30 * mech.q


@pytest.mark.parametrize("eps", [100.5, 300.0, 800.0, 1e30])
@pytest.mark.parametrize("k", [1, 2])
def test_epsilon_too_large_for_an_explicit_bloom_length_is_refused(eps, k):
  # The default bloom length caps epsilon near 21 (int32); an explicit one did not. At eps = 300 with c = 1,
  # e^eps / Omega rounded to 1 (every present position hits: no privacy) and the rate search looped forever;
  # eps >= 710 overflowed math.exp (OverflowError) and 1e30 raised decimal.Overflow.
  shape = M.BsvsShape(4, 2, k)
  with pytest.raises(ValueError, match="^" + re.escape(f"Expected epsilon={eps!r} <= 100: ")):
    M.Collision(shape, eps, bloom_length=64)


@pytest.mark.parametrize("k", [1, 2])
def test_the_largest_epsilon_keeps_p_below_one_over_c_and_the_real_loss_within_epsilon(k):
  shape = M.BsvsShape(4, 2, k)
  c, l = shape.c, 64
  mech = M.Collision(shape, _collision.MAX_EPSILON, bloom_length=l)
  assert c * mech.p < 1.0
  # Real per-message loss of the sampled rates: the ratio of a present position's hit rate p to the rate of
  # any other output, (1 - c p) / (l - c).
  assert math.log(mech.p * (l - c) / (1.0 - c * mech.p)) <= mech.epsilon
