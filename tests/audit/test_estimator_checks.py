"""Estimator checks (z-test of the mean, chi-square / kurtosis test of the variance) are tested.

They must pass on correct estimators and fail on planted bugs. Rates: each
passing check runs at family-wise alpha = 1e-3 (false failure <= 1e-3 each,
4 such checks here); planted bugs are >= 8 standard errors away (miss
< 1e-12). Seeds are fixed.
"""

import dataclasses

import jax
import numpy as np
import pytest

from jaxdistill import audit
from jaxdistill import mechanisms as M

ALPHA = 1e-3


@dataclasses.dataclass(frozen=True)
class RRWrongDebias(M.RandomizedResponse):
  """Planted bug in the estimator only: debiases with q computed at eps' = eps/kr."""

  def estimate(self, key, stats, num_clients):
    import math
    p = 1.0 / (1.0 + math.exp(-self.epsilon / self.shape.c))
    q = 1.0 - p
    total = np.asarray(stats, np.float64).reshape(self.shape.num_buckets, self.shape.num_labels)
    return (total - num_clients * q) / (p - q)


@pytest.fixture(scope="module")
def rr_setup():
  w = M.synthetic_workload(jax.random.key(1), num_clients=400, num_buckets=4, num_labels=2, k=1)
  inp = w.materialize()
  truth = np.asarray(M.bsvs_counts(inp, w.shape), np.float64)
  return w.shape, inp, truth


def test_library_rr_passes_both_checks(rr_setup):
  shape, inp, truth = rr_setup
  mech = M.RandomizedResponse(shape, 1.0)
  est = audit.replicate_estimates(jax.random.key(7), mech, inp, 150)
  assert est.shape == (150, 4, 2) and est.dtype == np.float64
  var = mech.entry_variance(truth, 400)
  u = audit.check_unbiased(est, truth, var, alpha=ALPHA)
  v = audit.check_variance(est, var, alpha=ALPHA)
  assert u.passed and v.passed, (u.to_dict(), v.to_dict())
  assert u.test == "z-mean" and v.test == "chi2-variance" and u.num_replicates == 150


def test_wrong_debiasing_fails_the_z_test(rr_setup):
  shape, inp, truth = rr_setup
  bug = RRWrongDebias(shape, 1.0)
  est = audit.replicate_estimates(jax.random.key(7), bug, inp, 150)
  u = audit.check_unbiased(est, truth, bug.entry_variance(truth, 400), alpha=ALPHA)
  assert not u.passed and u.worst_p_value < 1e-12


def test_wrong_variance_formula_fails_the_variance_test(rr_setup):
  shape, inp, truth = rr_setup
  mech = M.RandomizedResponse(shape, 1.0)
  est = audit.replicate_estimates(jax.random.key(7), mech, inp, 150)
  half = mech.entry_variance(truth, 400) / 2  # e.g. forgetting a factor 2
  assert not audit.check_variance(est, half, alpha=ALPHA).passed
  assert not audit.check_variance(est, half, alpha=ALPHA, method="kurtosis").passed
  assert audit.check_unbiased(est, truth, mech.entry_variance(truth, 400), alpha=ALPHA).passed


def test_kurtosis_method_holds_its_level_where_chi_square_does_not():
  # Laplace replicates (kurtosis 6), variance 1, m = 400, 4000 independent entries,
  # per-entry level 1%. chi-square's real rate is ~10%; the kurtosis test's ~2%.
  # Binomial sd of a rate over 4000 entries is <= 0.005, so the bounds below are
  # > 4 sd from the measured rates (0.106 and 0.018 at this seed).
  rng = np.random.default_rng(0)
  x = rng.laplace(size=(400, 4000)) / np.sqrt(2)
  rej = {m: np.mean([not audit.check_variance(x[:, j], 1.0, alpha=0.01, method=m).passed
                     for j in range(4000)]) for m in ("chi2", "kurtosis")}
  assert rej["chi2"] > 0.07
  assert rej["kurtosis"] < 0.035
  # ... and it still catches a variance that is off by 30%.
  assert not audit.check_variance(x[:, :50], 1.3, alpha=ALPHA, method="kurtosis").passed


def test_normal_replicates_exact_levels():
  rng = np.random.default_rng(1)
  x = 5.0 + 2.0 * rng.normal(size=(300, 20))
  assert audit.check_unbiased(x, 5.0, 4.0, alpha=ALPHA).passed
  assert audit.check_variance(x, 4.0, alpha=ALPHA).passed
  shifted = audit.check_unbiased(x, 5.0 + 8 * 2.0 / np.sqrt(300), 4.0, alpha=ALPHA)  # 8 SE off
  assert not shifted.passed


@pytest.mark.parametrize("scale", [1e-100, 1e100])
@pytest.mark.parametrize("method", ["chi2", "kurtosis"])
def test_variance_check_does_not_depend_on_the_scale(scale, method):
  # The kurtosis was mean(c^4) / s2^2 in the data's units: at 1e-100 or 1e100 it underflowed or
  # overflowed to NaN and correct data failed. Rescaling the data and its variance together must give
  # the unit-scale statistic (the same draws, so no new false-failure rate).
  x = np.random.default_rng(2).normal(size=(400, 3))
  unit = audit.check_variance(x, 1.0, alpha=ALPHA, method=method)
  scaled = audit.check_variance(x * scale, scale**2, alpha=ALPHA, method=method)
  assert unit.passed and scaled.passed
  np.testing.assert_allclose(scaled.statistic, unit.statistic, rtol=1e-9)


@pytest.mark.parametrize("call,needle", [
    (lambda: audit.check_unbiased(np.ones((1, 3)), 1.0, 1.0, alpha=ALPHA), "m >= 2"),
    (lambda: audit.check_unbiased(np.ones((5, 3)), 1.0, 0.0, alpha=ALPHA), "variance"),
    (lambda: audit.check_unbiased(np.full((5, 3), np.nan), 1.0, 1.0, alpha=ALPHA), "finite"),
    (lambda: audit.check_variance(np.ones((5, 3)), 1.0, alpha=2.0), "alpha=2.0"),
    (lambda: audit.check_variance(np.ones((5, 3)), 1.0, alpha=ALPHA, method="f"), "method"),
    (lambda: audit.check_unbiased(np.ones((5, 3)), "1", 1.0, alpha=ALPHA), "truth"),
    (lambda: audit.check_unbiased(np.ones((5, 3)), np.nan, 1.0, alpha=ALPHA), "finite truth"),
    (lambda: audit.check_unbiased(np.ones((5, 3)), np.ones(4), 1.0, alpha=ALPHA), r"truth to broadcast .* \(3,\)"),
    (lambda: audit.check_unbiased([["1", "2"]] * 5, 1.0, 1.0, alpha=ALPHA), "estimates"),
    (lambda: audit.check_variance(np.ones((5, 3)), ["1"], alpha=ALPHA), "variance"),
    (lambda: audit.clopper_pearson_lower("3", 10, 0.05), "successes"),
    (lambda: audit.clopper_pearson_upper(3, "10", 0.05), "trials"),
    # The kurtosis test's normal limit is far off below 100 replicates (11% at nominal 1%, m = 20).
    (lambda: audit.check_variance(np.random.default_rng(0).normal(size=(99, 3)), 1.0, alpha=ALPHA,
                                  method="kurtosis"), "at least 100 replicates"),
])
def test_bad_arguments(call, needle):
  with pytest.raises(ValueError, match=needle):
    call()


@pytest.mark.parametrize("method", ["chi2", "kurtosis"])
def test_empty_entries_are_refused(method):
  # Shape (m, 0) has no entries: it raised NumPy's "argmax of an empty sequence".
  with pytest.raises(ValueError, match=r"estimates.*\(5, 0\)"):
    audit.check_unbiased(np.zeros((5, 0)), 0.0, 1.0, alpha=ALPHA)
  with pytest.raises(ValueError, match=r"estimates.*\(100, 0\)"):
    audit.check_variance(np.zeros((100, 0)), 1.0, alpha=ALPHA, method=method)


def test_kurtosis_test_refuses_constant_replicates():
  # A constant sample has s^2 = 0 and a kurtosis 0 / 0: the statistic and p-value were NaN. The
  # chi-square test (normal model, where s^2 = 0 has probability 0) rejects it with p = 0.
  x = np.zeros((100, 3))
  x[:, 0] = np.random.default_rng(4).normal(size=100)
  with pytest.raises(ValueError, match=r"estimates.*entry \(1,\)"):
    audit.check_variance(x, 1.0, alpha=ALPHA, method="kurtosis")
  chi2 = audit.check_variance(x, 1.0, alpha=ALPHA)
  assert not chi2.passed and chi2.worst_p_value == 0.0 and np.all(np.isfinite(chi2.statistic))
  chi2 = audit.check_variance(np.full(100, 1e308), 1e-10, alpha=ALPHA)  # 0 * (1e308 / 1e-5)^2 must not be NaN
  assert not chi2.passed and chi2.statistic == 0.0 and chi2.worst_p_value == 0.0


@pytest.mark.parametrize("method", ["chi2", "kurtosis"])
def test_variance_check_statistic_is_never_nan_at_extreme_ranges(method):
  # Tiny deviations (1e-170 sd: s^2 underflows) reject; huge values far off the claimed variance reject
  # (s^2 / sigma^2 overflows) instead of returning NaN. Both are > 1e100 sd off: no false failure.
  rng = np.random.default_rng(5)
  for x, var in ((1e-170 * rng.normal(size=(200, 2)), 1.0), (1e300 * rng.normal(size=(200, 2)), 1e-10)):
    v = audit.check_variance(x, var, alpha=ALPHA, method=method)
    assert not v.passed and not np.any(np.isnan(v.statistic)) and v.worst_p_value == 0.0


def test_unbiased_check_does_not_overflow_near_the_largest_float():
  # The mean of four 1e308 overflowed to inf, failing an estimator that is exactly right.
  # Deterministic (no noise); the shifted case is 1e308 standard errors off: no false failure.
  u = audit.check_unbiased(np.full(4, 1e308), 1e308, 1.0, alpha=ALPHA)
  assert u.passed and u.statistic == 0.0 and u.worst_p_value == 1.0
  # Each column sums 1.5e308 + 1.5e308 first (overflow); means 0 and 1e307, se = sqrt(1e300 / 4) = 5e149.
  x = np.array([1.5e308, 1.5e308, -1.5e308, -1.5e308])[:, None] + [0.0, 1e307]
  u = audit.check_unbiased(x, [0.0, 0.0], 1e300, alpha=ALPHA)
  np.testing.assert_allclose(u.statistic, [0.0, 1e307 / 5e149], rtol=1e-12)
  assert not u.passed and u.worst_entry == (1,)


@pytest.mark.parametrize("num_runs", [10**6 + 1, 10**12])  # MAX_RUNS = 10^6
def test_replicate_estimates_refuses_more_runs_than_max_runs(rr_setup, monkeypatch, num_runs):
  # num_runs had no upper bound: 10^12 was accepted and simulated run after run for hours. It is now refused
  # before the first run (a run here would fail the test, not hang it).
  from jaxdistill import simulation  # pylint: disable=import-outside-toplevel

  def no_run(*args, **kwargs):
    raise AssertionError("replicate_estimates started simulating")

  monkeypatch.setattr(simulation, "simulate", no_run)
  shape, inp, _ = rr_setup
  with pytest.raises(ValueError, match=rf"^Expected num_runs={num_runs} <= 1000000\.$"):
    audit.replicate_estimates(jax.random.key(7), M.RandomizedResponse(shape, 1.0), inp, num_runs)
  assert audit.MAX_RUNS == 10**6


def test_check_variance_reports_the_most_extreme_entry_when_p_values_underflow():
  # Two-sided p = 2 min(cdf, 1 - cdf): 1 - cdf rounds to 0 below 1e-16, so entries 1 and 2 (sd 1.6 and 2.0 against a
  # claimed variance 1) both had p = 0 and the first was reported. Their p-values (scipy's sf, computed here) are
  # 6e-29 and 3e-66; the kurtosis test's 2 sf(|z|) underflowed the same way.
  from scipy import stats  # pylint: disable=import-outside-toplevel
  x = np.random.default_rng(0).standard_normal((200, 3)) * np.array([1.0, 1.6, 2.0])
  c = audit.check_variance(x, 1.0, alpha=0.01)
  want = 2 * stats.chi2.sf(c.statistic, 199)
  assert not c.passed and c.worst_entry == (2,) and c.worst_p_value == pytest.approx(want[2], rel=1e-6)
  x = np.random.default_rng(1).standard_normal((4000, 3)) * np.array([1.0, 3.0, 4.0])
  k = audit.check_variance(x, 1.0, alpha=0.01, method="kurtosis")
  assert not k.passed and k.worst_entry == (2,)  # z = 96 and 119: both p-values underflow to 0 in float64


def test_normal_quantile_bounds_stay_finite_at_a_subnormal_alpha():
  # alpha / (2J) underflowed to 0 for alpha = 5e-324, and norm.isf(0) made the acceptance region (-inf, inf): a
  # z-test that could not fail. The quantile at that level, from its logarithm, is 38.5 (norm.isf(5e-324) is 38.47,
  # at twice the level 38.29). Normal alphas keep norm.isf's value exactly.
  from scipy import stats  # pylint: disable=import-outside-toplevel
  x = np.random.default_rng(0).normal(size=(100, 3))
  u = audit.check_unbiased(x, np.zeros(3), np.ones(3), alpha=5e-324)
  assert u.passed and np.isfinite(u.upper) and u.lower == -u.upper
  assert stats.norm.isf(5e-324) < u.upper < 38.6 and stats.norm.logsf(u.upper) == pytest.approx(
      np.log(5e-324) - np.log(6), rel=1e-12)
  assert not audit.check_unbiased(x + 40.0 / np.sqrt(100), np.zeros(3), np.ones(3), alpha=5e-324).passed
  k = audit.check_variance(x, 1.0, alpha=5e-324, method="kurtosis")
  assert k.passed and k.upper == u.upper and k.lower == -u.upper
  assert audit.check_unbiased(x, 0.0, 1.0, alpha=ALPHA).upper == stats.norm.isf(ALPHA / 6)


def test_chi2_variance_check_names_an_alpha_whose_per_entry_level_underflows():
  # SciPy's chi-square quantiles at the underflowed level 0 are 0 and inf: every variance passed. The chi-square
  # quantile cannot be taken from a logarithm, so alpha is refused by name; 3e-323 (level 5e-324) still runs.
  x = np.random.default_rng(0).normal(size=(100, 3))
  with pytest.raises(ValueError, match=r"^Expected alpha=5e-324 > 1\.48e-323 for method='chi2' over 3 entries: its "
                                       r"per-entry level alpha / \(2 x 3\) underflows float64 to 0, where the "
                                       r"chi-square quantile is inf\.$"):
    audit.check_variance(x, 1.0, alpha=5e-324)
  v = audit.check_variance(x, 1.0, alpha=3e-323)
  assert v.passed and 0 < v.lower < v.upper < np.inf
