"""NFDP's sampler has exactly the law the accounting assumes; the oracle accounts its draws.

Statistical tests use fixed keys (with the fixed key the outcome is
deterministic); the rates below are those of a fresh key under the null. Each
chi-square test rejects at p < 1e-3 (3 of them: rate 1e-3 each, asymptotic,
every expected count >= 62). Each inclusion-probability check allows 4.5 sd
(WOR, 6 records: exact binomial rate 6.5e-6 each, 3.9e-5 together) or 4 sd
(WR, one record: exact binomial rate 6.3e-5). File-wise about 3.1e-3. Each law
test is paired with a check that the *wrong* law is rejected, so the tests have
power.
"""

import itertools
import math

import jax
import numpy as np
import pytest
from scipy import stats

from jaxdistill import accounting, fedmd
from jaxdistill.data import ImageData

ALPHA = 1e-3


def draws(n, k, wr, trials, seed=0):
  keys = jax.random.split(jax.random.key(seed), trials)
  return np.stack([np.asarray(fedmd.nfdp_sample(kk, n, k, with_replacement=wr)) for kk in keys])


@pytest.fixture(scope="module")
def wor_6_3():
  return draws(6, 3, False, 4000)


@pytest.fixture(scope="module")
def wr_4_3():
  return draws(4, 3, True, 4000, seed=1)


def test_wor_gives_exactly_k_distinct_uniform_subsets(wor_6_3):
  s = wor_6_3
  assert s.shape == (4000, 3) and s.min() >= 0 and s.max() < 6
  assert all(len(set(row)) == 3 for row in s.tolist())
  subsets = list(itertools.combinations(range(6), 3))
  counts = np.array([0] * len(subsets))
  index = {c: i for i, c in enumerate(subsets)}
  for row in s.tolist():
    counts[index[tuple(sorted(row))]] += 1
  # Uniform over the C(6,3) = 20 subsets.
  assert stats.chisquare(counts).pvalue > ALPHA
  # Marginal inclusion probability k/n = 1/2 for every record, as the accounting's p.
  p = accounting.nfdp_inclusion_probability(6, 3, relation="replace-one")
  incl = np.array([(s == j).any(axis=1).mean() for j in range(6)])
  # 4.5 sd each: exact binomial rate 6.5e-6 per record, 3.9e-5 for the 6.
  assert np.all(np.abs(incl - p) < 4.5 * math.sqrt(p * (1 - p) / len(s)))


def test_wr_gives_iid_uniform_draws_with_binomial_counts(wr_4_3):
  s = wr_4_3
  assert s.shape == (4000, 3) and s.min() >= 0 and s.max() < 4
  # Ordered sequences uniform over 4^3 = 64 (i.i.d. uniform draws).
  seq = s[:, 0] * 16 + s[:, 1] * 4 + s[:, 2]
  assert stats.chisquare(np.bincount(seq, minlength=64)).pvalue > ALPHA
  # Inclusion count of record 0 ~ Binomial(3, 1/4).
  c = (s == 0).sum(axis=1)
  expected = stats.binom.pmf(np.arange(4), 3, 0.25) * len(s)
  assert stats.chisquare(np.bincount(c, minlength=4), expected).pvalue > ALPHA
  # Inclusion probability 1 - (1 - 1/n)^k = the accounting's p.
  p = accounting.nfdp_inclusion_probability(4, 3, with_replacement=True, relation="replace-one")
  assert p == pytest.approx(1 - 0.75**3)
  # 4 sd: exact Binomial(4000, 0.578) two-sided rate 6.3e-5.
  assert abs((c > 0).mean() - p) < 4 * math.sqrt(p * (1 - p) / len(s))


def test_the_wrong_law_is_rejected(wor_6_3, wr_4_3):
  # Power: WOR counts are not Binomial(3, 1/6) (they are 0/1 only); WR draws repeat records.
  c = (wor_6_3 == 0).sum(axis=1)
  expected = stats.binom.pmf(np.arange(4), 3, 1 / 6) * len(c)
  assert stats.chisquare(np.bincount(c, minlength=4), expected).pvalue < 1e-12
  assert any(len(set(r)) < 3 for r in wr_4_3.tolist())


def test_pure_and_key_dependent():
  a = fedmd.nfdp_sample(jax.random.key(5), 100, 10)
  np.testing.assert_array_equal(a, fedmd.nfdp_sample(jax.random.key(5), 100, 10))
  assert not np.array_equal(a, fedmd.nfdp_sample(jax.random.key(6), 100, 10))
  assert a.dtype == np.int32


@pytest.mark.parametrize("n,k,wr,needle", [
    (5, 6, False, "k=6"), (0, 1, False, "n=0"), (5, 0, True, "k=0"), (5, 2.5, False, "k"),
    (5, 2, "yes", "with_replacement"),
])
def test_bad_input(n, k, wr, needle):
  with pytest.raises(ValueError, match=needle):
    fedmd.nfdp_sample(jax.random.key(0), n, k, with_replacement=wr)
  if wr in (True, False):
    with pytest.raises(ValueError):
      fedmd.NfdpSampler(n, k, wr)


@pytest.mark.parametrize("wr", ["yes", 1])
def test_sampler_flag_must_be_a_bool(wr):
  with pytest.raises(ValueError, match="with_replacement"):
    fedmd.NfdpSampler(5, 2, wr)
  with pytest.raises(ValueError, match="with_replacement"):
    fedmd.FedMDConfig(with_replacement=wr)


@pytest.mark.parametrize("k", [3, 7])
def test_k_at_least_n_with_replacement_is_allowed(k):
  s = np.asarray(fedmd.nfdp_sample(jax.random.key(0), 3, k, with_replacement=True))
  assert s.shape == (k,) and s.dtype == np.int32
  assert 0 <= s.min() and s.max() < 3  # indices of the 3 records


def records(n):
  """Record i is one pixel of value i / n (pixels are in [0, 1]); :func:`record_ids` reads i back."""
  return ImageData((np.arange(n) / n).astype(np.float32).reshape(n, 1, 1, 1), np.zeros(n, np.int32), 1)


def record_ids(data, n):
  return np.rint(data.images[:, 0, 0, 0].astype(np.float64) * n).astype(int)


def test_oracle_accounts_its_draws():
  n, k, rounds = 50, 5, 4
  o = fedmd.SampleOracle(records(n), fedmd.NfdpSampler(n, k))
  s = o.draw(jax.random.key(0))
  assert len(s) == k and sorted(record_ids(s, n).tolist()) == sorted(o.draws[0].tolist())
  once = o.privacy(rounds=rounds)
  assert once.flat_delta == pytest.approx(k / n) and not once.resample_each_round
  # Replaying the same sample costs nothing; replaying anything else is refused.
  np.testing.assert_array_equal(o.replay(o.draws[0]).images, s.images)
  with pytest.raises(ValueError, match="already drawn"):
    o.replay(np.arange(k))
  for r in range(1, rounds):
    o.draw(jax.random.key(r))
  fresh = o.privacy(rounds=rounds)
  assert fresh.flat_delta == pytest.approx(1 - (1 - k / n)**rounds) and fresh.resample_each_round
  with pytest.raises(ValueError, match="draws"):
    o.privacy(rounds=rounds + 1)


def test_oracle_restore_validates():
  o = fedmd.SampleOracle(records(10), fedmd.NfdpSampler(10, 3))
  with pytest.raises(ValueError):
    o.restore([np.array([1, 1, 2])])  # WOR sample with a repeat
  o2 = fedmd.SampleOracle(records(10), fedmd.NfdpSampler(10, 3))
  with pytest.raises(ValueError):
    o2.restore([np.array([1, 2, 10])])  # out of range
  o3 = fedmd.SampleOracle(records(10), fedmd.NfdpSampler(10, 3))
  o3.restore([np.array([1, 2, 3])])
  assert o3.privacy(rounds=5).flat_delta == pytest.approx(0.3)
  with pytest.raises(ValueError, match="n=10"):
    fedmd.SampleOracle(records(9), fedmd.NfdpSampler(10, 3))


@pytest.mark.parametrize("recs, sampler, needle", [
    (lambda: records(5), lambda: "x", r"sampler to be an NfdpSampler; got str"),  # an AttributeError
    (lambda: None, lambda: fedmd.NfdpSampler(5, 2), r"records to be a jaxdistill\.data\.ImageData; got NoneType"),
    (lambda: np.zeros((5, 1, 1, 1)), lambda: fedmd.NfdpSampler(5, 2), r"records .*ImageData; got ndarray"),  # accepted
])
def test_oracle_names_records_or_sampler_of_the_wrong_type(recs, sampler, needle):
  with pytest.raises(ValueError, match=needle):
    fedmd.SampleOracle(recs(), sampler())


@pytest.mark.parametrize("bad, needle", [
    ([0.5, 1.2, 2.0], r"dtype float64 \(\[0\.5, 1\.2, 2\.0\]\)"),  # truncated to [0, 1, 2] and accepted by restore
    ([float("nan"), 1, 2], r"dtype float64 \(\[nan, 1\.0, 2\.0\]\)"),  # "cannot convert float NaN to integer"
    (None, r"dtype object"),  # a TypeError
    ([0, 1, 10**30], r"dtype object"),  # an OverflowError
    ([True, False, True], r"dtype bool"),
    (["a", "b", "c"], r"dtype <U1"),
])
def test_oracle_replay_and_restore_name_indices_that_are_not_integers(bad, needle):
  o = fedmd.SampleOracle(records(10), fedmd.NfdpSampler(10, 3, True))
  with pytest.raises(ValueError, match=r"^Expected draws\[1\] to be an array of integer indices; got " + needle):
    o.restore([np.array([1, 2, 3]), bad])
  assert o.draws == []  # nothing restored from a history with a bad sample
  o.restore([np.array([1, 2, 3])])
  with pytest.raises(ValueError, match=r"^Expected indices to be an array of integer indices; got " + needle):
    o.replay(bad)


@pytest.mark.parametrize("bad", [None, 5, "ab", {"a": [1, 2, 3]}])
def test_oracle_restore_names_draws_that_are_not_a_sequence(bad):
  # None and 5 were TypeErrors; "ab" was read as samples "a" and "b" ("invalid literal for int()").
  with pytest.raises(ValueError, match=r"^Expected draws to be a sequence of samples"):
    fedmd.SampleOracle(records(10), fedmd.NfdpSampler(10, 3)).restore(bad)


@pytest.mark.parametrize("rounds, needle", [(None, "got None"), (2.5, r"got 2\.5"), (True, "got True"),
                                            (float("nan"), "got nan"), (0, r"0 >= 1")])
def test_oracle_privacy_names_a_bad_rounds_after_several_draws(rounds, needle):
  # With two draws a bad rounds was only compared with 2: "Made 2 draws over rounds=None".
  o = fedmd.SampleOracle(records(10), fedmd.NfdpSampler(10, 3))
  o.restore([np.array([1, 2, 3]), np.array([4, 5, 6])])
  with pytest.raises(ValueError, match=rf"^Expected rounds(=| to be an integer, ){needle}"):
    o.privacy(rounds=rounds)
  assert o.privacy(rounds=2.0).resample_each_round


def test_party_sizes_beyond_int32_indices_are_refused():
  # jax.random.randint raised an OverflowError on maxval; the indices are int32.
  with pytest.raises(ValueError, match=r"n=2147483653 <= 2147483647"):
    fedmd.nfdp_sample(jax.random.key(0), 2**31 + 5, 5, with_replacement=True)
  with pytest.raises(ValueError, match=r"n=1099511627776"):
    fedmd.NfdpSampler(2**40, 5, True)
  idx = np.asarray(fedmd.nfdp_sample(jax.random.key(0), 2**31 - 1, 5, with_replacement=True))
  assert idx.shape == (5,) and idx.min() >= 0


@pytest.mark.parametrize("k", [2**31, 3 * 10**9, 10**12])
def test_sample_sizes_beyond_int32_are_refused_with_replacement(k):
  # With replacement k had no bound: k = 3e9 or 1e12 passed every check, then JAX aborted the whole process
  # (SIGABRT, "Check failed: buffer_.IsConcrete()") when the [k] sample was drawn.
  needle = rf"Expected k={k} <= 2147483647\."
  for make in (lambda: fedmd.nfdp_sample(jax.random.key(0), 10, k, with_replacement=True),
               lambda: fedmd.NfdpSampler(10, k, True),
               lambda: fedmd.FedMDConfig(k=k, with_replacement=True)):
    with pytest.raises(ValueError, match=needle) as err:
      make()
    assert "\n" not in str(err.value)
  assert fedmd.MAX_K == 2**31 - 1 and fedmd.NfdpSampler(10, fedmd.MAX_K, True).k == fedmd.MAX_K


def test_sampling_without_replacement_from_a_huge_party_is_refused_not_run():
  # jax.random.choice(replace=False) permutes all n indices whatever k is: n = 2^26 took 126 s and 3.6 GiB, and
  # n near 2^31 (accepted before) would need about 110 GiB: the out-of-memory killer, not an error.
  key = jax.random.key(0)
  for call in (lambda: fedmd.nfdp_sample(key, fedmd.MAX_WOR_N + 1, 1),
               lambda: fedmd.NfdpSampler(fedmd.MAX_WOR_N + 1, 1).sample(key)):
    with pytest.raises(ValueError, match=r"n=67108865 <= MAX_WOR_N.*with_replacement=True") as err:
      call()
    assert "\n" not in str(err.value)
  # With replacement it is k draws, and the accounting has no such limit.
  assert fedmd.nfdp_sample(key, 2**31 - 1, 3, with_replacement=True).shape == (3,)
  assert fedmd.NfdpSampler(2**31 - 1, 5).privacy().flat_delta == pytest.approx(5 / (2**31 - 1))
