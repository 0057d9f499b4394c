"""Separation and Concatenation: the literal Concatenation bias, by exact enumeration.

Claim under test (spec/REVERSE_KNN.md §5 I5): the paper's Concatenation product
estimator has E[t_a y_b] = -q/(p - q) for a true entry (a in T_i, b in y_i), and
0 otherwise; the unbiased estimator -(hit_a - q)(hit_b - q)/(q(p - q)) has mean
1[a]1[b]. Every expectation below is an exact finite sum over all hash tables in
[l]^(s+|Y|) and all outputs z, with probabilities from Definition 5.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxdistill import accounting
from jaxdistill import mechanisms as M
from jaxdistill import simulation
from tests.mechanisms._stats import assert_mean_and_variance


def definition_rates(eps, c, l):
  omega = c * math.exp(eps) + l - c
  return math.exp(eps) / omega, 1.0 / l, omega


def exact_hit_moments(S, domain, l, eps, c):
  """Exact E[hit_j] [domain] and E[hit_i hit_j] [domain, domain] for input set S."""
  _, _, omega = definition_rates(eps, c, l)
  tables = np.array(list(itertools.product(range(l), repeat=domain)))  # [l^D, D]
  member = np.zeros((len(tables), l), bool)
  for j in S:
    member[np.arange(len(tables)), tables[:, j]] = True
  size = member.sum(1, keepdims=True)
  out = (omega - size * math.exp(eps)) / ((l - size) * omega)
  pz = np.where(member, math.exp(eps) / omega, out) / len(tables)  # P(table, z)
  hits = tables[:, None, :] == np.arange(l)[None, :, None]  # [l^D, l, D]
  assert pz.sum() == pytest.approx(1.0, abs=1e-12)
  first = np.einsum("tz,tzj->j", pz, hits)
  second = np.einsum("tz,tzi,tzj->ij", pz, hits, hits)
  return first, second


def client_inputs(s, y, k):
  """All inputs with 1..k buckets and exactly one label (r = 1)."""
  for size in range(1, k + 1):
    for buckets in itertools.combinations(range(s), size):
      for label in range(y):
        yield buckets, label


# (s, |Y|, k, eps): l = 6, 17, 9; domains of 4, 3, 3 positions.
ENUM = [(2, 2, 1, 0.5), (1, 2, 1, 2.0), (2, 1, 2, 0.3)]


@pytest.mark.parametrize("s,y,k,eps", ENUM)
def test_concatenation_bias_by_exact_enumeration(s, y, k, eps):
  lit = M.ConcatenationLiteral(M.BsvsShape(s, y, k), eps)
  unb = M.Concatenation(M.BsvsShape(s, y, k), eps)
  c, domain = k + 1, s + y
  l = math.floor(c * math.exp(eps) + 2 * c - 1)
  assert lit.bloom_length == unb.bloom_length == l
  p, q, _ = definition_rates(eps, c, l)
  for buckets, label in client_inputs(s, y, k):
    S = set(buckets) | {s + label}
    first, second = exact_hit_moments(S, domain, l, eps, c)
    # The integrator's identities (fully random hash, a != b).
    for a, b in itertools.combinations(range(domain), 2):
      either = (a in S) or (b in S)
      assert second[a, b] == pytest.approx(q * q + (p * q - q * q) * either, abs=1e-13)
    for j in range(domain):
      assert first[j] == pytest.approx(q + (p - q) * (j in S), abs=1e-13)
    # The mechanisms' own estimate() applied to the exact expected statistics (it is
    # affine in them), for one client.
    expected = M.ProductStats(second[:s, s:], first[:s], first[s:])
    truth = np.zeros((s, y))
    truth[list(buckets), label] = 1.0
    np.testing.assert_allclose(unb.estimate(None, expected, 1), truth, atol=1e-10)
    np.testing.assert_allclose(lit.estimate(None, expected, 1), -q / (p - q) * truth, atol=1e-10)
  assert lit.bias_factor == pytest.approx(-q / (p - q), rel=1e-12)


def test_bias_matches_the_spec_numbers():
  # spec §5 I5: -0.31 at eps = 2 and -0.06 at eps = 3.5 for c = k + r = 2.
  assert M.ConcatenationLiteral(M.BsvsShape(10, 10, 1), 2.0).bias_factor == pytest.approx(-0.311, abs=5e-4)
  assert M.ConcatenationLiteral(M.BsvsShape(10, 10, 1), 3.5).bias_factor == pytest.approx(-0.06, abs=5e-3)


@pytest.mark.parametrize("s,y,k,eps", [(2, 2, 1, 1.0), (3, 2, 2, 0.6)])
def test_separation_unbiased_by_exact_enumeration(s, y, k, eps):
  mech = M.Separation(M.BsvsShape(s, y, k), eps)
  l1 = math.floor(k * math.exp(eps / 2) + 2 * k - 1)
  l2 = math.floor(math.exp(eps / 2) + 1)
  assert (mech.bucket_bloom_length, mech.label_bloom_length) == (l1, l2)
  for buckets, label in client_inputs(s, y, k):
    fb, _ = exact_hit_moments(set(buckets), s, l1, eps / 2, k)
    fl, _ = exact_hit_moments({label}, y, l2, eps / 2, 1)
    # Independent messages: E[hit_a hit_b] = E[hit_a] E[hit_b].
    expected = M.ProductStats(np.outer(fb, fl), fb, fl)
    truth = np.zeros((s, y))
    truth[list(buckets), label] = 1.0
    np.testing.assert_allclose(mech.estimate(None, expected, 1), truth, atol=1e-10)


def numpy_workload(seed, n, s, y, k):
  rng = np.random.default_rng(seed)
  buckets = np.stack([rng.choice(s, k, replace=False) for _ in range(n)])
  labels = np.where(rng.random(n) < 0.7, buckets[:, 0] % y, rng.integers(0, y, n))[:, None]
  return M.make_bsvs_input(buckets, labels, num_buckets=s, num_labels=y)


def check_mean_and_variance(mech, runs, truth, n, mean):
  """Per-entry z-test of the mean and chi-square interval on the variance (Bonferroni)."""
  var = mech.entry_variance(truth, n)
  assert_mean_and_variance(runs, mean, var, 1e-3 / (2 * truth.size), mech.name)
  return (runs.mean(0) - truth) / np.sqrt(var / len(runs))


@pytest.mark.parametrize("cls,eps", [(M.Concatenation, 2.0), (M.Separation, 3.0)])
def test_simulated_mean_and_variance(cls, eps):
  # 200 runs over n = 300 clients: per-entry z-test of the mean against its exact
  # expectation (A, or bias_factor * A for the literal estimator) and a chi-square
  # interval on the variance against entry_variance; Bonferroni over 6 entries x 2
  # tests, family-wise false-failure rate 1e-3 per estimator. The literal estimator
  # reuses Concatenation's statistics (same messages, other estimate).
  inp, shape = numpy_workload(7, 300, 3, 2, 1)
  truth = np.asarray(M.bsvs_counts(inp, shape), np.float64)
  mech = cls(shape, eps)
  results = [simulation.simulate(jax.random.key(900 + i), mech, inp) for i in range(200)]
  runs = np.stack([r.estimate for r in results])
  check_mean_and_variance(mech, runs, truth, 300, truth)
  if cls is M.Concatenation:
    lit = M.ConcatenationLiteral(shape, eps)
    lit_runs = np.stack([lit.estimate(None, r.stats, 300) for r in results])
    z_truth = check_mean_and_variance(lit, lit_runs, truth, 300, lit.bias_factor * truth)
    # The bias is visible: the literal mean is nowhere near A on the populated entries.
    assert np.max(np.abs(z_truth)) > 20


def test_privacy_statements():
  shape = M.BsvsShape(4, 3, 1)
  lit = M.ConcatenationLiteral(shape, 2.0).privacy()
  assert [w.code for w in lit.warnings] == ["biased-estimator"]
  assert lit.warnings[0].details["bias_factor"] < 0
  for mech in (M.Concatenation(shape, 2.0), M.Separation(shape, 2.0), M.ConcatenationLiteral(shape, 2.0)):
    st_ = mech.privacy()
    assert (st_.epsilon, st_.delta, st_.relation) == (2.0, 0.0, accounting.Relation.REPLACE_ONE)
  assert M.Concatenation(shape, 2.0).privacy().warnings == ()
  assert M.Separation(shape, 2.0).privacy().parameters["factor_epsilon"] == 1.0
  names = {M.Separation(shape, 1.0).name, M.Concatenation(shape, 1.0).name,
           M.ConcatenationLiteral(shape, 1.0).name}
  assert names == {"separation", "concatenation", "concatenation-literal"}


CASES = [(M.Separation, M.BsvsShape(3, 2, 2, 1), 1.0), (M.Concatenation, M.BsvsShape(4, 3, 1, 2), 2.0)]
_JITTED = {}


@given(case=st.integers(0, len(CASES) - 1), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_statistics_are_consistent(case, data, seed):
  cls, shape, eps = CASES[case]
  mech = cls(shape, eps)
  if mech not in _JITTED:
    _JITTED[mech] = jax.jit(lambda key, b, lab: mech.analyze(mech.randomize(key, b, lab)))
  buckets = data.draw(st.lists(st.integers(0, shape.num_buckets - 1), min_size=1, max_size=shape.k,
                               unique=True))
  labels = data.draw(st.lists(st.integers(0, shape.num_labels - 1), min_size=1, max_size=shape.r,
                              unique=True))
  b = jnp.array(buckets + [-1] * (shape.k - len(buckets)), jnp.int32)
  lab = jnp.array(labels + [-1] * (shape.r - len(labels)), jnp.int32)
  out = _JITTED[mech](jax.random.key(seed), b, lab)
  co, hb, hl = (np.asarray(x) for x in out)
  assert co.dtype == hb.dtype == hl.dtype == np.int32
  assert co.shape == (shape.num_buckets, shape.num_labels)
  np.testing.assert_array_equal(co, np.outer(hb, hl))
  assert set(np.unique(hb)) <= {0, 1} and set(np.unique(hl)) <= {0, 1}


@pytest.mark.parametrize("cls", [M.Separation, M.Concatenation, M.ConcatenationLiteral])
def test_bad_input(cls):
  shape = M.BsvsShape(3, 2, 1)
  for bad in (0.0, -2.0, math.nan, math.inf):
    with pytest.raises(ValueError, match="epsilon"):
      cls(shape, bad)
  with pytest.raises(ValueError, match="shape"):
    cls((3, 2, 1), 1.0)
  with pytest.raises(ValueError, match="k"):
    cls(M.BsvsShape(2, 2, 3), 1.0)


@pytest.mark.parametrize("cls", [M.Separation, M.Concatenation, M.ConcatenationLiteral])
@pytest.mark.parametrize("eps", [1e-300, 1e-12])
def test_epsilon_too_small_for_float64_rates_is_refused(cls, eps):
  # At 1e-300 p == q (Separation divided by zero) or p < q (Concatenation flipped its
  # estimate); at 1e-12 p - q is mostly rounding error.
  with pytest.raises(ValueError, match="epsilon"):
    cls(M.BsvsShape(3, 2, 1), eps)
  assert cls(M.BsvsShape(3, 2, 1), 1e-7).epsilon == 1e-7
