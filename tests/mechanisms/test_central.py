"""Central Laplace and discrete Laplace: contribution, tight account, noise law, estimator."""

import math

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

MECHANISMS = [M.CentralLaplace, M.CentralDiscreteLaplace]


def numpy_workload(seed, n, s, y, k):
  """n clients with k distinct buckets and one label."""
  rng = np.random.default_rng(seed)
  buckets = np.stack([rng.choice(s, k, replace=False) for _ in range(n)])
  labels = rng.integers(0, y, (n, 1))
  return M.make_bsvs_input(buckets, labels, num_buckets=s, num_labels=y)


# --- the tight account ------------------------------------------------------------


def binomial_pair(a, m):
  """Exact dominating pair of m unit shifts of discrete Laplace(a).

  One unit shift has privacy loss +a when Z <= 0 (probability 1/(1 + e^-a)) and
  -a otherwise; m independent shifts give loss a(2K - m), K ~ Bin(m, 1/(1 + e^-a)).
  """
  pi = 1.0 / (1.0 + math.exp(-a))
  ks = np.arange(m + 1)
  return stats.binom.pmf(ks, m, pi), stats.binom.pmf(ks, m, 1 - pi)


def dlap_pmf(a, support):
  return (1 - math.exp(-a)) / (1 + math.exp(-a)) * np.exp(-a * np.abs(support))


def test_binomial_pair_is_the_real_worst_pair():
  # k = r = 1, replace-one: the record at entry (0, 0) is replaced by one at (1, 1), so
  # the released pair (A_00 + Z1, A_11 + Z2) shifts by (-1, +1). Exact profile over the
  # integer lattice |z| <= 80 (truncated mass < 1e-16 at a = 0.5) vs the binomial pair.
  mech = M.CentralDiscreteLaplace(M.BsvsShape(2, 2, 1), 1.0)
  a = mech.parameter
  z = np.arange(-80, 82)
  p1 = dlap_pmf(a, z - 1)  # coordinate carrying the record in D
  p0 = dlap_pmf(a, z)
  P = np.outer(p1, p0).reshape(-1)
  Q = np.outer(p0, p1).reshape(-1)
  bp, bq = binomial_pair(a, 2)
  eps = np.array([0.0, 0.2, 0.5, 0.9])
  np.testing.assert_allclose(accounting.privacy_profile(P, Q, eps),
                             accounting.privacy_profile(bp, bq, eps), atol=1e-12)


@pytest.mark.parametrize("k,relation,eps", [(1, "replace-one", 1.0), (2, "replace-one", 2.0),
                                            (2, "add-remove", 0.7)])
def test_discrete_account_is_the_exact_composition(k, relation, eps):
  mech = M.CentralDiscreteLaplace(M.BsvsShape(3, 2, k), eps, relation)
  delta_sens = 2 * k if relation == "replace-one" else k
  assert mech.sensitivity == delta_sens
  assert mech.parameter == pytest.approx(eps / delta_sens)
  acct = mech.account()
  bp, bq = binomial_pair(mech.parameter, delta_sens)
  for frac in (0.1, 0.4, 0.8):
    exact = accounting.privacy_profile(bp, bq, frac * eps)
    # dp-accounting's PLD is pessimistic: an upper bound, and tight here.
    assert exact - 1e-12 <= acct.delta(frac * eps) <= exact + 1e-6
  assert acct.epsilon(0.0) == pytest.approx(eps)
  st_ = mech.privacy()
  assert (st_.epsilon, st_.delta, st_.relation) == (eps, 0.0, accounting.Relation.parse(relation))


def laplace_two_shift_delta(b, eps, n=2000):
  """delta(eps) of two unit shifts of Laplace(b), by quadrature of the privacy loss.

  One shift's loss is +1/b w.p. 1/2, -1/b w.p. e^{-1/b}/2, and (2x - 1)/b for x in
  (0, 1) with density e^{-(1-x)/b}/(2b) (midpoint rule, error O(n^-2)).
  """
  x = (np.arange(n) + 0.5) / n
  loss = np.concatenate([[1 / b, -1 / b], (2 * x - 1) / b])
  w = np.concatenate([[0.5, 0.5 * math.exp(-1 / b)], np.exp(-(1 - x) / b) / (2 * b) / n])
  total = loss[:, None] + loss[None, :]
  return float((w[:, None] * w[None, :] * np.clip(1 - np.exp(eps - total), 0, None)).sum())


@pytest.mark.parametrize("eps", [0.5, 3.0])
def test_laplace_account_matches_quadrature_and_beats_one_big_shift(eps):
  mech = M.CentralLaplace(M.BsvsShape(2, 2, 1), eps)  # Delta = 2
  assert mech.scale == pytest.approx(2 / eps)
  acct = mech.account()
  for frac in (0.2, 0.5, 0.8):
    e = frac * eps
    exact = laplace_two_shift_delta(mech.scale, e)
    assert exact - 1e-6 <= acct.delta(e) <= exact + 1e-6
    # One shift by Delta (the scalar-sensitivity account) has delta = 1 - e^{(e - eps)/2}.
    assert acct.delta(e) < 0.75 * (1 - math.exp((e - eps) / 2))
  assert acct.epsilon(0.0) == pytest.approx(eps)
  assert mech.privacy().delta == 0.0


# --- the sampler --------------------------------------------------------------------


SHAPES = [M.BsvsShape(3, 2, 2, 1), M.BsvsShape(4, 3, 1, 2)]


@given(shape_index=st.integers(0, 1), data=st.data(), mech_index=st.integers(0, 1))
def test_contribution_is_the_clients_entries(shape_index, data, mech_index):
  shape = SHAPES[shape_index]
  buckets = data.draw(st.lists(st.integers(0, shape.num_buckets - 1), min_size=0, max_size=shape.k,
                               unique=True))
  labels = data.draw(st.lists(st.integers(0, shape.num_labels - 1), min_size=0, max_size=shape.r,
                              unique=True))
  b = jnp.array(buckets + [-1] * (shape.k - len(buckets)), jnp.int32)
  lab = jnp.array(labels + [-1] * (shape.r - len(labels)), jnp.int32)
  mech = MECHANISMS[mech_index](shape, 1.0)
  got = np.asarray(mech.analyze(mech.randomize(jax.random.key(0), b, lab)))
  want = np.zeros((shape.num_buckets, shape.num_labels), np.int32)
  for t in buckets:
    for y in labels:
      want[t, y] = 1
  np.testing.assert_array_equal(got, want.reshape(-1))


def test_laplace_noise_law():
  # KS against Laplace(b) on 20,000 draws: false-failure rate 1e-3. The same draws
  # reject Laplace(b/2) (the half-sensitivity bug) with p < 1e-10.
  # The scale is written out, b = Delta_1 / eps = 2kr / eps (replace-one), not read from mech.scale: a wrong
  # scale there would otherwise cancel (halving it passed this test).
  mech = M.CentralLaplace(M.BsvsShape(100, 50, 1), 1.3)
  b = 2 * 1 * 1 / 1.3
  draws = np.concatenate([mech.noise(jax.random.key(i)).reshape(-1) for i in range(4)])
  assert draws.dtype == np.float64
  assert stats.kstest(draws, stats.laplace(scale=b).cdf).pvalue > 1e-3
  assert stats.kstest(draws, stats.laplace(scale=b / 2).cdf).pvalue < 1e-10


def test_discrete_laplace_noise_law():
  # Chi-square against the exact pmf on |z| <= 12 (tails pooled), 20,000 draws:
  # false-failure rate 1e-3; the half-sensitivity law is rejected.
  mech = M.CentralDiscreteLaplace(M.BsvsShape(100, 50, 1), 1.0)  # a = 0.5
  draws = np.concatenate([mech.noise(jax.random.key(i)).reshape(-1) for i in range(4)])
  assert np.issubdtype(draws.dtype, np.integer)

  def expected(a):
    z = np.arange(-12, 13)
    pmf = dlap_pmf(a, z)
    tail = math.exp(-13 * a) / (1 + math.exp(-a))
    return np.concatenate([[tail], pmf, [tail]]) * len(draws)

  observed = np.bincount(np.clip(draws, -13, 13) + 13, minlength=27)
  a = 1.0 / (2 * 1 * 1)  # eps / Delta_1 with Delta_1 = 2kr, written out (mech.parameter doubled passed before)
  assert stats.chisquare(observed, expected(a)).pvalue > 1e-3
  assert stats.chisquare(observed, expected(2 * a)).pvalue < 1e-10


def noise_variance_and_kurtosis(cls, eps, sensitivity):
  """Var and kurtosis of one noise entry, independent of the library's closed forms.

  Laplace(b), b = Delta/eps: 2b^2 and 6. Discrete Laplace(a), a = eps/Delta: by summing the
  pmf over |z| <= 400 (at a >= 0.2 the dropped terms add < 1e-20 even to the fourth moment),
  checked against 2e^-a/(1 - e^-a)^2.
  """
  if cls is M.CentralLaplace:
    return 2 * (sensitivity / eps) ** 2, 6.0
  a = eps / sensitivity
  z = np.arange(-400, 401).astype(np.float64)
  pmf = dlap_pmf(a, z)
  var = float((pmf * z**2).sum())
  assert var == pytest.approx(2 * math.exp(-a) / (1 - math.exp(-a)) ** 2, rel=1e-12)
  return var, float((pmf * z**4).sum()) / var**2


@pytest.mark.parametrize("cls", MECHANISMS)
def test_unbiased_with_closed_form_variance(cls):
  # 200 runs through simulate (the client statistics are the exact counts, so each
  # replicate's error is one noise draw). Per entry, a z-test on the mean and a z-test
  # on log(sample variance / variance), whose sd sqrt((kappa - (m-3)/(m-1))/m) uses the
  # noise law's exact kurtosis kappa (about 6). Not a chi-square interval: it assumes
  # normal replicates and, at kurtosis 6, fails about 11% of fresh keys. Bonferroni over
  # 12 entries x 2 tests at nominal family-wise 1e-3; both z-tests are normal
  # approximations, so the real rate differs: a NumPy Monte Carlo of this exact test
  # (10^6 fresh families per law, not using the library) measured 1.2e-3 for Laplace
  # and 1.2e-3 for discrete Laplace (a = 0.2).
  inp, shape = numpy_workload(3, 300, 4, 3, 2)
  truth = np.asarray(M.bsvs_counts(inp, shape), np.float64)
  mech = cls(shape, 0.8)
  assert mech.sensitivity == 4  # replace-one, k = 2: Delta = 2k
  var, kurt = noise_variance_and_kurtosis(cls, 0.8, 4)
  np.testing.assert_allclose(mech.entry_variance(truth, 300), var, rtol=1e-12)
  results = [simulation.simulate(jax.random.key(500 + i), mech, inp) for i in range(200)]
  np.testing.assert_array_equal(np.asarray(results[0].stats).reshape(4, 3), truth)
  runs = np.stack([r.estimate for r in results])
  m = len(runs)
  crit = stats.norm.isf(1e-3 / 24 / 2)
  z_mean = (runs.mean(0) - truth) / math.sqrt(var / m)
  log_ratio = np.log(runs.var(0, ddof=1) / var)
  sd_log = math.sqrt((kurt - (m - 3) / (m - 1)) / m)
  assert np.all(np.abs(z_mean) < crit), z_mean
  assert np.all(np.abs(log_ratio / sd_log) < crit), log_ratio / sd_log
  # Power: noise with a quarter of this variance (scale halved) fails on every entry.
  assert np.all((log_ratio - math.log(4)) / sd_log < -crit)


def test_closed_form_variances():
  lap = M.CentralLaplace(M.BsvsShape(2, 2, 1), 2.0)
  np.testing.assert_allclose(lap.entry_variance(None, 10), 2 * 1.0**2)  # b = 2/2
  dl = M.CentralDiscreteLaplace(M.BsvsShape(2, 2, 1), 2.0)  # a = 1
  z = np.arange(-200, 201)
  np.testing.assert_allclose(dl.entry_variance(None, 10), (dlap_pmf(1.0, z) * z**2).sum(), rtol=1e-12)


def test_max_error_bound_covers_all_entries():
  # Proposition 1 over all s|Y| = 4 entries at once (the CLI's max-error bound):
  # Laplace b ln(s|Y|/beta); discrete Laplace the least integer alpha with
  # s|Y| Pr[|Z| > alpha] <= beta, by summing the pmf.
  shape, beta = M.BsvsShape(2, 2, 1), 0.05
  lap = M.CentralLaplace(shape, 2.0)  # b = 1
  assert lap.max_error_bound(beta, np.zeros((2, 2)), 10) == pytest.approx(math.log(4 / beta), rel=1e-12)
  dl = M.CentralDiscreteLaplace(shape, 2.0)  # a = 1
  z = np.arange(-200, 201)
  exceed = lambda alpha: dlap_pmf(1.0, z)[np.abs(z) > alpha].sum()
  beta = 0.03  # here the per-bucket bound (2 entries) is 4, the all-entries one 5
  alpha = dl.max_error_bound(beta)
  assert alpha == int(alpha) and 4 * exceed(alpha) <= beta < 4 * exceed(alpha - 1)
  assert alpha > dl.accuracy(beta)


@pytest.mark.parametrize("cls", MECHANISMS)
def test_bad_input(cls):
  shape = M.BsvsShape(3, 2, 1)
  for bad in (0.0, -1.0, math.nan, math.inf, None):
    with pytest.raises(ValueError, match="epsilon"):
      cls(shape, bad)
  with pytest.raises(ValueError, match="relation"):
    cls(shape, 1.0, "swap-two")
  with pytest.raises(ValueError, match="k"):
    cls(M.BsvsShape(2, 2, 3), 1.0)
  with pytest.raises(ValueError, match="r"):
    cls(M.BsvsShape(2, 2, 1, 0), 1.0)
  assert cls(shape, 1.0, "add-remove").sensitivity == 1
  assert cls(shape, 1.0).sensitivity == 2
  # beta is one probability: a list was a TypeError from float() of accuracy's array.
  for bad, needle in (([0.1, 0.2], "beta to be a real number"), (0.0, r"beta=0.0 in \(0, 1\)"),
                      (math.nan, "beta to be finite")):
    with pytest.raises(ValueError, match=needle):
      cls(shape, 1.0).max_error_bound(bad)


def _sampler_geometric_counts(a):
  """cnt[g] = #{m in [0, 2^53): G(m) >= g} for the library's G = floor(-ln((m + 1/2)/2^53)/a), exactly.

  G is non-increasing in m, so each count is found by bisection on m, with the same NumPy float64
  operations as ``CentralDiscreteLaplace.noise``.
  """
  two53 = 1 << 53
  geo = lambda m: int(np.floor(-np.log((np.float64(m) + 0.5) / float(two53)) / a))
  counts = [two53]
  for g in range(1, geo(0) + 2):
    lo, hi = 0, two53 - 1  # invariant: geo(lo) >= g > geo(hi), or no m at all
    if geo(0) < g:
      counts.append(0)
      continue
    while hi - lo > 1:
      mid = (lo + hi) // 2
      lo, hi = (mid, hi) if geo(mid) >= g else (lo, mid)
    counts.append(lo + 1)
  return counts


@pytest.mark.parametrize("a", [0.05, 0.5, 2.0])
def test_float_discrete_laplace_sampler_is_within_its_stated_delta(a):
  # The noise really is floor(-ln U / a) differences of host_uniform's U = (m + 1/2)/2^53.
  from jaxdistill.mechanisms._central import float_sampler_tv, host_uniform  # pylint: disable=import-outside-toplevel
  mech = M.CentralDiscreteLaplace(M.BsvsShape(3, 2, 1), 2 * a)  # Delta = 2, parameter a
  key = jax.random.key(7)
  u = host_uniform(key, (2, 3, 2))
  g = np.floor(-np.log(u) / a).astype(np.int64)
  np.testing.assert_array_equal(mech.noise(key), g[0] - g[1])
  # The sampler's exact law: P(G = g) = (cnt[g] - cnt[g + 1]) / 2^53.
  cnt = _sampler_geometric_counts(a)
  pg = [cnt[i] - cnt[i + 1] for i in range(len(cnt) - 1)]
  ideal = np.exp(-a * np.arange(len(pg))) * (1 - math.exp(-a))
  tv_g = 0.5 * (np.abs(np.array(pg, np.float64) / 2.0**53 - ideal).sum() + math.exp(-a * len(pg)))
  tv = float_sampler_tv(a)
  assert 0 < tv_g <= tv / 2 <= 1e-12
  # N = G1 - G2 exactly (integers scaled by 2^106), and the exact delta of a unit shift N vs N + 1 at
  # eps = a, computed in 50-digit decimals: not 0 (the sampler is not exactly pure), but within the
  # TV bound (1 + e^a) tv that privacy() states per unit shift.
  import decimal  # pylint: disable=import-outside-toplevel
  decimal.getcontext().prec = 50
  n = len(pg)
  pn = [0] * (2 * n - 1)  # index z + n - 1
  for i, x in enumerate(pg):
    if x:
      for j, y in enumerate(pg):
        pn[i - j + n - 1] += x * y
  p = pn + [0]
  q = [0] + pn
  ea = decimal.Decimal(a).exp()
  delta = sum((max(decimal.Decimal(x) - ea * decimal.Decimal(y), 0) for x, y in zip(p, q)), decimal.Decimal(0))
  delta = float(delta / decimal.Decimal(2) ** 106)
  assert 0 < delta <= (1 + math.exp(a)) * tv
  statement = mech.privacy()
  assert statement.delta == 0.0  # the ideal mechanism's; the float sampler's delta is the warning's
  (warn,) = statement.warnings
  assert warn.code == "float_sampler_delta"
  assert warn.details["delta_per_release"] == pytest.approx((1 + math.exp(2 * a)) * 2 * tv, rel=1e-12)


@pytest.mark.parametrize("eps", [700.0, 709.0, 710.0, 1000.0, 1e6])
def test_float_sampler_delta_at_huge_epsilon(eps):
  # (1 + e^eps) * Delta * tv overflowed from eps ~ 709.8 (OverflowError in privacy(), late in a run):
  # it is computed in log space and capped at 1.
  mech = M.CentralDiscreteLaplace(M.BsvsShape(3, 2, 1), eps)
  (warn,) = mech.privacy().warnings
  tv = warn.details["total_variation_per_entry"]
  exact = math.exp(math.log1p(math.exp(eps)) + math.log(mech.sensitivity * tv)) if eps < 709 else math.inf
  assert warn.details["delta_per_release"] == pytest.approx(min(1.0, exact), rel=1e-9)


@pytest.mark.parametrize("cls,eps", [(M.CentralLaplace, 1e-300), (M.CentralLaplace, 1e-150),
                                     (M.CentralDiscreteLaplace, 1e-300), (M.CentralDiscreteLaplace, 1e-18),
                                     # a = eps/Delta rounds to 0: a ZeroDivisionError, not the ValueError
                                     (M.CentralLaplace, 5e-324), (M.CentralDiscreteLaplace, 5e-324)])
def test_epsilon_whose_noise_overflows_is_refused(cls, eps):
  # Laplace: b = Delta/eps must stay <= 2^400 (b^2 overflows float64 past 2^512); discrete
  # Laplace: G <= 54 ln(2)/a must stay below 2^62, else the int64 cast wraps to about -2^63.
  with pytest.raises(ValueError, match="epsilon"):
    cls(M.BsvsShape(3, 2, 1), eps)


@pytest.mark.parametrize("eps", [1e300, 1e308, 2.0 * 2.0**400 * 1.01])
def test_epsilon_whose_laplace_noise_underflows_is_refused(eps):
  # b = Delta/eps below 2^-400: at eps = 1e300 the squared errors underflowed (simulate printed a predicted and
  # measured RMS of 0 beside a max error of 3e-300); at 1e308 XLA flushed the subnormal b to 0 and the
  # max-error bound said 0, below every error.
  with pytest.raises(ValueError, match=r"epsilon=.* <= Delta \* 2\^400 .* must stay >= 2\^-400"):
    M.CentralLaplace(M.BsvsShape(3, 2, 1), eps)


def test_huge_epsilon_inside_the_limits_keeps_a_true_bound():
  shape = M.BsvsShape(3, 2, 1)  # Delta = 2, 6 entries
  lap = M.CentralLaplace(shape, 2.0 * 2.0**400)  # b = 2^-400 exactly: the smallest accepted
  assert lap.scale == 2.0**-400
  alpha = lap.max_error_bound(0.05)
  np.testing.assert_allclose(alpha, 2.0**-400 * np.log(6 / 0.05), rtol=1e-12)  # b ln(m/beta), Proposition 1
  np.testing.assert_allclose(lap.entry_variance(None, 10), 2 * 2.0**-800, rtol=1e-12)
  err = lap.estimate(jax.random.key(0), np.zeros(6, np.int64), 10)
  assert 0 < np.sqrt(np.mean(err**2)) and np.abs(err).max() <= alpha


def test_tiny_epsilon_inside_the_limits_still_works():
  shape = M.BsvsShape(2, 2, 1)  # Delta = 2
  dl = M.CentralDiscreteLaplace(shape, 2e-17)  # a = 1e-17: 54 ln(2)/a = 3.7e18 < 2^62
  est = dl.estimate(jax.random.key(0), np.zeros(4, np.int64), 10)
  assert np.all(np.abs(est) < 2.0**62)
  # e^{-a} rounds to 1 here, so 2e^{-a}/(1 - e^{-a})^2 needs expm1 (it divided by zero).
  np.testing.assert_allclose(dl.entry_variance(None, 10), 2 / 1e-17**2, rtol=1e-12)
  lap = M.CentralLaplace(shape, 2e-120)  # b = 1e120 <= 2^400
  np.testing.assert_allclose(lap.entry_variance(None, 10), 2e240, rtol=1e-12)
  assert np.all(np.isfinite(lap.estimate(jax.random.key(0), np.zeros(4, np.int64), 10)))


@pytest.mark.parametrize("cls", MECHANISMS)
def test_estimate_accepts_legacy_keys_like_the_rest_of_the_library(cls):
  # host_uniform read jax.random.PRNGKey(0)'s raw uint32 [2] as a batch of two keys: a TypeError. It is
  # wrapped as _validate.prng_key does (the same numbers as the typed key), a [m, 2] batch as m keys.
  mech = cls(M.BsvsShape(4, 3, 1), 1.0)
  counts = np.arange(12, dtype=np.int64)
  typed = mech.estimate(jax.random.key(7), counts, 5)
  np.testing.assert_array_equal(mech.estimate(jax.random.PRNGKey(7), counts, 5), typed)
  batch = jax.random.split(jax.random.key(7), 3)
  np.testing.assert_array_equal(mech.estimate(jax.random.key_data(batch), counts, 5),
                                mech.estimate(batch, counts, 5))
  for bad in (0, None, "key", np.zeros(2, np.float32)):
    with pytest.raises(ValueError, match="key"):
      mech.estimate(bad, counts, 5)
    with pytest.raises(ValueError, match="key"):
      mech.noise(bad)


@pytest.mark.parametrize("cls", MECHANISMS)
def test_estimate_refuses_stats_no_counts_could_give(cls):
  # NaN stats were cast to -2^63 (an estimate of -9.2e18 everywhere) and 0.7 truncated to 0, silently.
  mech = cls(M.BsvsShape(4, 3, 1), 1.0)
  key = jax.random.key(0)
  for bad in (np.full(12, np.nan), np.full(12, np.inf), np.full(12, 0.7), np.full(12, 1e30),
              np.full(12, 2**62, np.int64), np.zeros(11), "12", [True] * 12):
    with pytest.raises(ValueError, match="stats"):
      mech.estimate(key, bad, 5)
  # Any shape of 12 entries used to pass: a transposed [|Y|, s] array was reshaped into scrambled entries.
  with pytest.raises(ValueError, match=r"stats of shape \[s, \|Y\|\] = \[4, 3\] \(or flat \[12\]\); got shape \[3, 4"):
    mech.estimate(key, np.zeros((3, 4), np.int64), 5)
  # Whole floats, lists and any integer dtype are the same counts.
  ref = mech.estimate(key, np.arange(12, dtype=np.int64), 5)
  for same in (np.arange(12.0), list(range(12)), np.arange(12, dtype=np.int32).reshape(4, 3),
               jnp.arange(12, dtype=jnp.int32)):
    np.testing.assert_array_equal(mech.estimate(key, same, 5), ref)


@pytest.mark.parametrize("cls", [M.CentralLaplace, M.CentralDiscreteLaplace])
def test_simultaneous_and_max_error_arguments_are_checked(cls):
  # accuracy used `simultaneous` as a truthy value ("no" chose the union over all s|Y| entries), and
  # max_error_bound accepted counts='abc' with num_clients=-5.
  mech = cls(M.BsvsShape(4, 3, 1), 1.0)
  for bad in ("no", 0.0, None):
    with pytest.raises(ValueError, match="Expected simultaneous to be a bool"):
      mech.accuracy(0.05, simultaneous=bad)
  assert mech.accuracy(0.05, simultaneous=True) > mech.accuracy(0.05, simultaneous=False)
  with pytest.raises(ValueError, match=r"Expected num_clients=-5 >= 1"):
    mech.max_error_bound(0.05, None, -5)
  with pytest.raises(ValueError, match="Expected counts"):
    mech.max_error_bound(0.05, "abc", 100)
  assert mech.max_error_bound(0.05, np.zeros((4, 3)), 100) == mech.accuracy(0.05, simultaneous=True)
