"""Separation and Concatenation: bias and variance by exact enumeration.

Claim under test (spec/REVERSE_KNN.md §5 I5): the paper's Concatenation product
estimator has E[t_a y_b] = -q/(p - q) for a true entry (a in T_i, b in y_i), and
0 otherwise; the unbiased estimator -(hit_a - q)(hit_b - q)/(q(p - q)) has mean
1[a]1[b]. The entry_variance closed forms of all three estimators are checked
against the exact per-client variance, summed over clients. Every expectation
below is an exact finite sum over all hash tables in [l]^(s+|Y|) and all outputs z,
with probabilities from Definition 5. The privacy claims are checked in
test_product_privacy.py.
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


def collision_law(S, domain, l, p):
  """Exact law of one Collision message (hash table, z) for the input set S, from Definition 5.

  The table h is uniform on [l]^domain; given h, Pr[z = v] = p for v in C = h(S) and
  (1 - |C| p) / (l - |C|) otherwise (with p = e^eps / Omega this is the Definition's
  (Omega - |C| e^eps) / ((l - |C|) Omega)).

  Returns:
    ``(tables [l^domain, domain], pmf [l^domain, l])``, pmf[t, v] = Pr[h = tables[t], z = v].
  """
  tables = np.array(list(itertools.product(range(l), repeat=domain)), np.int64).reshape(-1, domain)
  member = np.zeros((len(tables), l), bool)
  for j in S:
    member[np.arange(len(tables)), tables[:, j]] = True
  size = member.sum(1, keepdims=True)
  pmf = np.where(member, p, (1 - size * p) / (l - size)) / len(tables)
  assert math.fsum(pmf.ravel()) == pytest.approx(1.0, abs=1e-12)
  return tables, pmf


def hit_moments(S, domain, l, p):
  """Exact E[hit_j] [domain] and E[hit_i hit_j] [domain, domain] for input set S and hit rate p."""
  tables, pz = collision_law(S, domain, l, p)
  hits = tables[:, None, :] == np.arange(l)[None, :, None]  # [l^D, l, D]
  first = np.einsum("tz,tzj->j", pz, hits)
  second = np.einsum("tz,tzi,tzj->ij", pz, hits, hits)
  return first, second


def exact_hit_moments(S, domain, l, eps, c):
  """hit_moments with p = e^eps / Omega of Definition 5."""
  return hit_moments(S, domain, l, definition_rates(eps, c, l)[0])


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
  # README: relative bias -3.81 at eps = 0.5, by hand: l = floor(2 e^0.5 + 3) = 6, q = 1/6,
  # p = e^0.5 / (2 e^0.5 + l - 2).
  e = math.exp(0.5)
  p, q = e / (2 * e + 4), 1 / 6
  assert round(-q / (p - q) - 1, 2) == -3.81
  assert M.ConcatenationLiteral(M.BsvsShape(10, 10, 1), 0.5).bias_factor == pytest.approx(-q / (p - q), rel=1e-12)


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


def full_inputs(s, y, k, r):
  """Every input with exactly k buckets and r labels (the population entry_variance assumes)."""
  return [(b, lab) for b in itertools.combinations(range(s), k)
          for lab in itertools.combinations(range(y), r)]


def centered_square(first, q):
  """E[(hit - q)^2] = E[hit](1 - 2q) + q^2, as hit^2 = hit."""
  return first * (1 - 2 * q) + q * q


def separation_client_variance(mech, buckets, labels):
  """Exact Var of one client's Separation estimate [s, |Y|], from enumerated hit moments.

  The estimate is (hb_a - q1)(hl_b - q2) / ((p1 - q1)(p2 - q2)) with independent factors,
  so both its mean and its second moment factor over the two messages.
  """
  sh = mech.shape
  (p1, q1), (p2, q2) = mech.bucket_rates, mech.label_rates  # the sampler's float64 rates
  fb, _ = hit_moments(set(buckets), sh.num_buckets, mech.bucket_bloom_length, p1)
  fl, _ = hit_moments(set(labels), sh.num_labels, mech.label_bloom_length, p2)
  scale = (p1 - q1) * (p2 - q2)
  mean = np.outer(fb - q1, fl - q2) / scale
  second = np.outer(centered_square(fb, q1), centered_square(fl, q2)) / scale**2
  return second - mean**2


def concatenation_client_variance(mech, buckets, labels, literal):
  """Exact Var of one client's (literal or unbiased) Concatenation estimate [s, |Y|].

  Both estimates are (hit_a - q)(hit_b - q) / scale, scale = (p - q)^2 (literal) or -q(p - q);
  with hit^2 = hit, (hit_a - q)^2 (hit_b - q)^2 = ((1 - 2q) hit_a + q^2)((1 - 2q) hit_b + q^2),
  so first and second hit moments give the variance.
  """
  s = mech.shape.num_buckets
  p, q = mech.p, mech.q
  S = set(buckets) | {s + lab for lab in labels}
  first, second = hit_moments(S, mech.domain, mech.bloom_length, p)
  fa, fb, both = first[:s, None], first[None, s:], second[:s, s:]
  prod = both - q * fa - q * fb + q * q
  prod_sq = (1 - 2 * q) ** 2 * both + (1 - 2 * q) * q * q * (fa + fb) + q**4
  scale = (p - q) ** 2 if literal else -q * (p - q)
  return prod_sq / scale**2 - (prod / scale) ** 2


# (s, |Y|, k, r, eps) for the variance references; every client holds exactly k buckets, r labels.
VAR_SHAPES = [(2, 2, 1, 1, 0.5), (1, 2, 1, 1, 2.0), (2, 1, 2, 1, 0.3), (2, 2, 1, 2, 0.5), (3, 2, 2, 1, 0.2)]


@pytest.mark.parametrize("s,y,k,r,eps", VAR_SHAPES)
@pytest.mark.parametrize("cls", [M.Separation, M.Concatenation, M.ConcatenationLiteral])
def test_entry_variance_matches_exact_enumeration(cls, s, y, k, r, eps):
  # Reference: the sum over clients of the exact per-client variance (independent clients),
  # each from the enumerated law of its message(s), for two populations: every input with
  # multiplicities 1, 2, 3, ... (all counts > 0), and one input three times (zeros and n).
  mech = cls(M.BsvsShape(s, y, k, r), eps)
  inputs = full_inputs(s, y, k, r)
  if cls is M.Separation:
    per_client = {x: separation_client_variance(mech, *x) for x in inputs}
  else:
    per_client = {x: concatenation_client_variance(mech, *x, cls is M.ConcatenationLiteral)
                  for x in inputs}
  for population in ({x: 1 + i % 3 for i, x in enumerate(inputs)}, {inputs[-1]: 3}):
    counts = np.zeros((s, y))
    want = np.zeros((s, y))
    for (buckets, labels), times in population.items():
      counts[np.ix_(list(buckets), list(labels))] += times
      want += times * per_client[buckets, labels]
    n = sum(population.values())
    np.testing.assert_allclose(mech.entry_variance(counts, n), want, rtol=1e-10, atol=0)


@pytest.mark.parametrize("cls", [M.Separation, M.Concatenation, M.ConcatenationLiteral])
def test_entry_variance_refuses_counts_of_clients_holding_fewer_than_k_buckets(cls):
  # Padded clients pass make_bsvs_input and the estimators (still unbiased), but the closed form reads
  # "#clients holding label b" as column sum / k: for 3 clients holding one bucket each of k = 2 it gave
  # Separation a variance 0.77-0.92 of the exact one (a membership of -0.5 clients), silently.
  shape = M.BsvsShape(3, 2, 2, 1)
  mech = cls(shape, 4.0)
  inp, _ = M.make_bsvs_input(np.array([[0, -1], [1, -1], [2, -1]]), np.array([[0], [0], [1]]),
                             num_buckets=3, num_labels=2)
  counts = np.asarray(M.bsvs_counts(inp, shape), np.float64)
  for call in (lambda: mech.entry_variance(counts, 3), lambda: mech.entry_mse(counts, 3),
               lambda: mech.max_error_bound(0.05, counts, 3)):
    with pytest.raises(ValueError, match=r"each hold exactly k=2 buckets and r=1 labels") as err:
      call()
    assert "\n" not in str(err.value)
  # Two full clients' counts (buckets {0, 1} with label 0, buckets {1, 2} with label 1) are taken; said to
  # come from one client, whose sums fit, they give a negative membership and are refused.
  two = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
  assert np.all(mech.entry_variance(two, 2) > 0)
  with pytest.raises(ValueError, match="padded clients"):
    mech.entry_variance(two, 1)


def numpy_workload(seed, n, s, y, k):
  rng = np.random.default_rng(seed)
  buckets = np.stack([rng.choice(s, k, replace=False) for _ in range(n)])
  labels = np.where(rng.random(n) < 0.7, buckets[:, 0] % y, rng.integers(0, y, n))[:, None]
  return M.make_bsvs_input(buckets, labels, num_buckets=s, num_labels=y)


def check_mean_and_variance(mech, runs, truth, n, mean):
  """Per-entry z-test of the mean and chi-square interval on the variance (Bonferroni).

  The variance is entry_variance, which test_entry_variance_matches_exact_enumeration
  checks against exact enumeration (here the law has too many tables to enumerate).
  """
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
  # Too large for an int32 bloom length: the message gives the epsilon passed (Separation's said 25.0 for 50).
  with pytest.raises(ValueError, match=r"Expected epsilon=50.0 <= "):
    cls(shape, 50.0)
  if cls is M.Separation:  # each factor spends epsilon / 2: the largest epsilon is twice Collision's (c = 1)
    limit = 2 * math.log(2**31 - 1)
    assert cls(shape, limit * (1 - 1e-9)).bucket_bloom_length <= 2**31 - 1
    with pytest.raises(ValueError, match=f"Expected epsilon={limit * (1 + 1e-9)!r} <= {limit:.3f}: each factor"):
      cls(shape, limit * (1 + 1e-9))


@pytest.mark.parametrize("cls", [M.Separation, M.Concatenation, M.ConcatenationLiteral])
@pytest.mark.parametrize("eps", [1e-300, 1e-12, 5e-324])
def test_epsilon_too_small_for_float64_rates_is_refused(cls, eps):
  # At 1e-300 p == q (Separation divided by zero) or p < q (Concatenation flipped its
  # estimate); at 1e-12 p - q is mostly rounding error. At 5e-324 Separation's epsilon / 2 rounds to 0, and the
  # error named that 0 ("Expected epsilon=0.0 > 0"), not the caller's value.
  with pytest.raises(ValueError, match=f"epsilon={eps!r}"):
    cls(M.BsvsShape(3, 2, 1), eps)
  assert cls(M.BsvsShape(3, 2, 1), 1e-7).epsilon == 1e-7
