"""The privacy auditor is itself audited: no alarm on correct mechanisms, an alarm on planted bugs.

Every audit below runs at alpha = 1e-4, so within one audit all its bounds lie
below the truth (epsilon_lower <= true epsilon, delta_lower <= true delta)
except with probability <= 1e-4 (the Clopper-Pearson + Bonferroni guarantee).
15 audits are null audits (a correct claim: the 4 x 3 parametrised ones, the
given events, the batched NumPy mechanism and the ``ok`` audit of the leaky
mechanism), so a false alarm has family-wise probability <= 1.5e-3. With the
"<= truth" checks of the 5 planted-bug audits and of the 2 estimate-only audits,
all such checks hold except with probability <= 2.2e-3.

Every audit also asserts an accuracy floor: the auditor has power, and for a
planted bug a floor above the claim implies the alarm. Their false-failure
rates were measured on other seeds (100-1,099 or 2,000-11,999; the exploration
is not part of the suite), and each floor's comment gives its numbers:

* Bin statistics (randomized response, Collision), 1,000 seeds each: close to
  normal (the 0.1% quantiles lie 2.7-3.3 sd below the mean), and every floor
  is >= 6.7 sd below the mean: a normal tail < 1e-10 each.
* Laplace thresholds, 10,000 seeds each: a heavy left tail (the selection
  split sometimes prefers thresholds deep in the upper tail, where fewer
  samples give a looser bound), so the sd says little. The floors lie below
  every measured value: 0 of 10,000 at or below, a rate <= 3e-4 per floor at
  95% confidence (extrapolating the measured 1e-2, 1e-3 and 1e-4 quantiles:
  about 1e-5, up to 1e-4 for the batched audit with 4x fewer samples). The
  former floors (0.9, 0.8, 1.8 and delta 0.2) failed on 1.6%, 1.4%, 0.6% and
  21% of the seeds.
* The leaky mechanism's delta floor: a binomial calculation (in its test).

So the 6 Laplace floors add <= 1.8e-3 (95% confidence; about 2e-4
extrapolated) and the others < 1e-7: the whole file fails falsely with
probability <= 4.1e-3. Seeds are fixed, so the outcome is deterministic; the
rates say how unlucky a seed would have to be.

The "true" epsilon of each case is computed exactly, not by the code under
test: closed forms for Laplace and randomized response, and enumeration of
the statistic's pmf for Collision. Every lower bound must lie below it.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdistill import accounting
from jaxdistill import audit
from jaxdistill import mechanisms as M
from tests.audit import _mechanisms as T

ALPHA = 1e-4
N = 200_000


def run(fn, pair, seed, **kw):
  return audit.audit_privacy(jax.random.key(seed), fn, *pair, num_samples=N, alpha=ALPHA,
                             claimed_epsilon=T.EPS, **kw)


# --- exact epsilons, from the definitions -------------------------------------------
def rr_true_epsilon(mech):
  # The statistic is Bin(4, p) under x0 and Bin(4, q) under x1: max ratio (p/q)^4.
  p = mech.keep_probability
  return 4 * math.log(p / (1 - p))


def collision_statistic_pmf(items, in_set, epsilon, length, omega_c):
  """Exact pmf of _hits_and_collisions for item set ``in_set``: enumerate h on ``items`` and z."""
  e = math.exp(epsilon)
  omega = omega_c * e + length - omega_c
  pmf = {}
  for hs in itertools.product(range(length), repeat=len(items)):
    h = dict(zip(items, hs))
    # Items outside ``items`` may also be in the set; COLLISION pairs only use ``items``.
    cset = {h[i] for i in in_set}
    p_hit = e / omega
    p_miss = (1 - len(cset) * p_hit) / (length - len(cset))
    for z in range(length):
      pz = p_hit if z in cset else p_miss
      code, bit = 0, 1
      for i in items:
        code, bit = code + bit * (z == h[i]), bit * 2
      for a in range(len(items)):
        for b in range(a + 1, len(items)):
          code, bit = code + bit * (h[items[a]] == h[items[b]]), bit * 2
      pmf[code] = pmf.get(code, 0.0) + pz / length**len(items)
  return pmf


def collision_true_epsilon(items, s0, s1, c, omega_c):
  length = T.collision_length(c, T.EPS)
  p = collision_statistic_pmf(items, s0, T.EPS, length, omega_c)
  q = collision_statistic_pmf(items, s1, T.EPS, length, omega_c)
  return accounting.epsilon_for_delta(p, q, 0.0)


def test_exact_epsilons_of_the_test_mechanisms():
  # The oracles themselves: correct mechanisms are exactly EPS, bugs are above.
  # (RR's flip probability is dyadic, rounded towards 1/2: within 0.1% below.)
  assert 0.999 <= rr_true_epsilon(M.RandomizedResponse(T.RR_SHAPE, 1.0)) <= 1.0
  assert 1.998 <= rr_true_epsilon(T.RandomizedResponseEpsOverKr(T.RR_SHAPE, 1.0)) <= 2.0
  assert collision_true_epsilon((0, 1), [0], [1], 1, 1) == pytest.approx(1.0, rel=1e-9)
  assert collision_true_epsilon((0, 1, 2), [0, 2], [1, 2], 2, 2) == pytest.approx(1.0, rel=1e-9)
  # The planted bug (Omega with c = 1 for two items): p = e^eps / (e^eps + l - 1) on each of the
  # two hashed values, the rest uniform on the other l - 2; the worst output is the value of the
  # swapped item: eps = ln(p / ((1 - 2p) / (l - 2))) = 1.33741 at l = 8.
  length, e = T.collision_length(2, T.EPS), math.exp(T.EPS)
  p = e / (e + length - 1)
  want = math.log(p / ((1 - 2 * p) / (length - 2)))
  assert collision_true_epsilon((0, 1, 2), [0, 2], [1, 2], 2, 1) == pytest.approx(want, rel=1e-9)


# --- null cases: correct mechanisms never alarm --------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_alarm_on_a_correct_laplace_release(seed):
  r = run(T.laplace_release, T.LAPLACE_PAIR, seed)
  assert not r.alarm
  assert r.kind == "thresholds"
  # Floor: 10,000 seeds gave mean 0.961, sd 0.017, min 0.742 (heavy tail): rate <= 3e-4 (module docstring).
  assert 0.7 < r.epsilon_lower <= T.EPS
  assert r.delta_lower == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_alarm_on_library_randomized_response(seed):
  mech = M.RandomizedResponse(T.RR_SHAPE, T.EPS)
  r = run(audit.local_randomizer(mech), T.RR_PAIR, seed, statistic=T.rr_statistic)
  assert not r.alarm and r.kind == "bins"
  # Floor: 1,000 seeds gave mean 0.924, sd 0.012, min 0.886; 6.9 sd below the mean.
  assert 0.84 < r.epsilon_lower <= rr_true_epsilon(mech)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_alarm_on_a_correct_collision(seed):
  r = run(T.collision, T.COLLISION_PAIR, seed, statistic=T.collision_statistic)
  assert not r.alarm
  # Floor: 1,000 seeds gave mean 0.964, sd 0.006, min 0.943; 10.8 sd below the mean.
  assert 0.9 < r.epsilon_lower <= T.EPS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_alarm_on_a_correct_collision_with_two_items(seed):
  r = run(T.collision_c2, T.COLLISION_C2_PAIR, seed, statistic=T.collision_c2_statistic)
  assert not r.alarm
  # Floor: 1,000 seeds gave mean 0.940, sd 0.010, min 0.910; 9.2 sd below the mean.
  assert 0.85 < r.epsilon_lower <= T.EPS


# --- planted bugs: alarms -------------------------------------------------------------
def test_alarm_on_laplace_with_half_the_sensitivity():
  r = run(T.laplace_half_sensitivity, T.LAPLACE_PAIR, 0)
  assert r.alarm
  # Floors: 10,000 seeds gave epsilon_lower mean 1.942, sd 0.026, min 1.650, and delta_lower mean
  # 0.258, min 0.0066 (heavy tails): rates <= 3e-4 each (module docstring).
  assert 1.6 < r.epsilon_lower <= 2 * T.EPS  # true epsilon 2
  # delta at the claimed eps = 1: exact value 1 - e^{-1/2} = 0.393 (the event {T <= 10.5}). The bound is
  # often far below it: the events are chosen for epsilon, and those deep in the tails carry little mass.
  assert 0.005 < r.delta_lower <= 1 - math.exp(-0.5)


def test_alarm_on_randomized_response_with_eps_over_kr():
  mech = T.RandomizedResponseEpsOverKr(T.RR_SHAPE, T.EPS)
  r = run(audit.local_randomizer(mech), T.RR_PAIR, 0, statistic=T.rr_statistic)
  assert mech.privacy().epsilon == T.EPS  # it claims eps ...
  assert r.alarm  # ... but delivers 2 eps
  # Floor: 1,000 seeds gave mean 1.914, sd 0.015, min 1.861; 7.7 sd below the mean.
  assert 1.8 < r.epsilon_lower <= rr_true_epsilon(mech)


def test_alarm_on_collision_with_p_missing_the_omega_normalisation():
  r = run(T.collision_forgot_omega, T.COLLISION_PAIR, 0, statistic=T.collision_statistic)
  assert r.alarm
  length = T.collision_length(1, T.EPS)
  p_bug = math.exp(T.EPS) / length
  true_eps = math.log(p_bug / ((1 - p_bug) / (length - 1)))  # 2.96
  # Floor: 1,000 seeds gave mean 2.902, sd 0.012, min 2.869; 17 sd below the mean.
  assert 2.7 < r.epsilon_lower <= true_eps


def test_alarm_on_collision_with_omega_of_the_wrong_c():
  # Subtle: Omega = c e^eps + l - c computed with c = 1 for 2-item sets; true eps 1.33741.
  r = run(T.collision_c2_omega_of_c1, T.COLLISION_C2_PAIR, 0, statistic=T.collision_c2_statistic)
  assert r.alarm
  # Floor: 1,000 seeds gave mean 1.276, sd 0.010, min 1.241; 12 sd below the mean.
  assert 1.15 < r.epsilon_lower <= collision_true_epsilon((0, 1, 2), [0, 2], [1, 2], 2, 1)


# --- delta ------------------------------------------------------------------------------
def test_delta_lower_bound_and_alarm_on_an_approximate_dp_mechanism():
  pair = (jnp.int32(0), jnp.int32(1))
  low = audit.audit_privacy(jax.random.key(0), T.leaky_rr, *pair, num_samples=N, alpha=ALPHA,
                            claimed_epsilon=T.EPS, claimed_delta=0.001)
  assert low.alarm  # claims delta 0.001 but leaks w.p. 0.01
  # Floor, by a binomial calculation: delta_lower is the larger of two bounds, one per revealing event
  # ({2} from x0, {3} from x1; both chosen on each of 300 seeds tried), each CP_lower(K) - e CP_upper(0)
  # at level 1e-4/6 with K ~ Bin(160,000, 0.01) independent; that is <= 0.008 iff K <= 1,462, probability
  # 2.3e-4, so both fail with probability 5e-8. (1,000 seeds: mean 0.00894, sd 0.0002, min 0.00838.)
  assert 0.008 < low.delta_lower <= T.LEAK
  assert math.isclose(low.alarm, low.delta_lower > 0.001)
  ok = audit.audit_privacy(jax.random.key(1), T.leaky_rr, *pair, num_samples=N, alpha=ALPHA,
                           claimed_epsilon=T.EPS, claimed_delta=0.02)
  assert not ok.alarm and ok.delta_lower <= T.LEAK and ok.epsilon_lower <= T.EPS


# --- fixed events, batched host mechanisms, reporting, errors ----------------------------
def test_given_events_skip_the_selection_split():
  mech = M.RandomizedResponse(T.RR_SHAPE, T.EPS)
  r = audit.audit_privacy(jax.random.key(3), audit.local_randomizer(mech), *T.RR_PAIR,
                          num_samples=N, alpha=ALPHA, claimed_epsilon=T.EPS,
                          statistic=T.rr_statistic, events=[lambda t: t == 4])
  assert r.kind == "given" and r.num_selection == 0 and len(r.events) == 2
  # Floor: 1,000 seeds gave mean 0.927, sd 0.013, min 0.887; 6.7 sd below the mean.
  assert not r.alarm and 0.84 < r.epsilon_lower <= T.EPS
  assert r.events[0].trials == N
  assert_bonferroni_clopper_pearson(r, num_bounds=2 * 2)  # one event, both directions


def assert_bonferroni_clopper_pearson(r, num_bounds):
  """Each event's two bounds are exact Clopper-Pearson at alpha / num_bounds, written out with scipy's beta.

  Nothing else checked the split: a level of alpha instead of alpha / (2m) passed every audit test (the
  '<= truth' checks and the floors cannot see a level that is too generous).
  """
  level = r.alpha / num_bounds
  for e in r.events:
    lo = stats.beta.ppf(level, e.count_top, e.trials - e.count_top + 1) if e.count_top > 0 else 0.0
    hi = (stats.beta.ppf(1 - level, e.count_bottom + 1, e.trials - e.count_bottom) if e.count_bottom < e.trials
          else 1.0)
    assert e.p_top_lower == pytest.approx(lo, rel=1e-9, abs=1e-15), e
    assert e.p_bottom_upper == pytest.approx(hi, rel=1e-9, abs=1e-15), e
    want = math.log((lo - r.claimed_delta) / hi) if lo > r.claimed_delta else 0.0
    assert e.epsilon_lower == pytest.approx(max(want, 0.0), rel=1e-9, abs=1e-12), e


def test_batched_numpy_mechanism():
  def numpy_laplace(keys, x):
    seed = int(np.asarray(jax.random.key_data(keys))[0, -1])
    rng = np.random.default_rng(seed)
    return float(x) + rng.laplace(size=len(keys)) * (T.DELTA / T.EPS)

  r = audit.audit_privacy(jax.random.key(0), numpy_laplace, 10.0, 12.0, num_samples=50_000,
                          alpha=ALPHA, claimed_epsilon=T.EPS, batched=True, batch_size=10_000)
  # Floor: 10,000 seeds gave mean 0.924, sd 0.033, min 0.459 (heavy tail, and 4x fewer samples than the
  # other audits): rate <= 3e-4 (module docstring).
  assert not r.alarm and 0.4 < r.epsilon_lower <= T.EPS
  assert len(r.events) == 3
  assert_bonferroni_clopper_pearson(r, num_bounds=2 * 3)  # three selected (event, direction) pairs
  d = r.to_dict()
  assert d["alarm"] is False and len(d["events"]) == 3 and d["events"][0]["trials"] == 40_000


def test_estimate_only_without_a_claim():
  r = audit.audit_privacy(jax.random.key(5), T.laplace_release, *T.LAPLACE_PAIR, num_samples=N, alpha=ALPHA)
  assert r.claimed_epsilon is None and r.delta_lower is None and not r.alarm and r.kind == "thresholds"
  # The claim does not steer the estimate: 60 seeds without one gave mean 0.964, sd 0.013 (min 0.89), as with it
  # (test_no_alarm_on_a_correct_laplace_release), so the same floor holds at the same rate (<= 3e-4). It only
  # asserted 0 <= epsilon_lower, which an audit returning 0 passed.
  assert 0.7 < r.epsilon_lower <= T.EPS


def two_point_release(key, x):
  """T = 0.75 w.p. 0.1 (x = 0) or 0.9 (x = 1), else 0.25: a real-valued statistic on two points."""
  return jnp.where(jax.random.uniform(key) < 0.1 + 0.8 * x, 0.75, 0.25)


def test_bins_of_a_real_valued_statistic():
  # Bin events cast every value with int(): 0.25 and 0.75 both became the bin {0}, which no sample
  # matched, and the audit silently found epsilon_lower = 0. True epsilon: log(0.9 / 0.1) = 2.197.
  r = audit.audit_privacy(jax.random.key(6), two_point_release, 0.0, 1.0, num_samples=20_000, alpha=ALPHA,
                          events="bins")
  assert r.kind == "bins" and {e.description for e in r.events} <= {"T in {0.25}", "T in {0.75}"}
  # Floor: ~10,000 estimation samples put each rate within ~0.01 of 0.1 / 0.9 (Clopper-Pearson at
  # 1e-4 / 4), so epsilon_lower is about 2.0; 1.5 is over 10 sd below. "<= truth" fails w.p. <= 1e-4.
  assert 1.5 < r.epsilon_lower <= math.log(9.0)


def test_a_huge_claimed_epsilon_is_no_overflow():
  # e^1000 overflowed (OverflowError) in the delta lower bound; lo - inf * hi is -inf, clamped to 0.
  r = audit.audit_privacy(jax.random.key(7), two_point_release, 0.0, 1.0, num_samples=2_000, alpha=ALPHA,
                          claimed_epsilon=1000.0)
  assert not r.alarm and r.delta_lower == 0.0


def test_clopper_pearson_closed_forms_and_exact_coverage():
  a, n = 0.01, 30
  assert audit.clopper_pearson_upper(0, n, a) == pytest.approx(1 - a**(1 / n))
  assert audit.clopper_pearson_lower(n, n, a) == pytest.approx(a**(1 / n))
  assert audit.clopper_pearson_lower(0, n, a) == 0.0 and audit.clopper_pearson_upper(n, n, a) == 1.0
  ks = np.arange(n + 1)
  lo, hi = audit.clopper_pearson_lower(ks, n, a), audit.clopper_pearson_upper(ks, n, a)
  assert np.all(lo <= ks / n) and np.all(ks / n <= hi)
  # Exact coverage by enumeration over k for a grid of p: Pr[L > p] <= a and Pr[U < p] <= a.
  for p in np.linspace(0.001, 0.999, 199):
    pk = stats.binom.pmf(ks, n, p)
    assert pk[lo > p].sum() <= a + 1e-12
    assert pk[hi < p].sum() <= a + 1e-12


def _binomial_tail_root(k, n, a, upper):
  """Reference Clopper-Pearson bound, independent of SciPy: mpmath at 60 digits.

  Lower: p with P[Bin(n, p) >= k] = a; upper: p with P[Bin(n, p) <= k] = a. The tail is the pmf sum
  over j < k (or j <= k), each term from the previous one by the ratio (n - j + 1) / j * p / (1 - p).
  """
  import mpmath  # pylint: disable=import-outside-toplevel  (a dependency of dp-accounting)
  ctx = mpmath.mp.clone()
  ctx.dps = 60
  n = ctx.mpf(n)

  def cdf(p, last):  # P[Bin(n, p) <= last]
    term = ctx.exp(n * ctx.log1p(-p))
    total = term
    for j in range(1, last + 1):
      term *= (n - j + 1) / j * p / (1 - p)
      total += term
    return total

  def excess(p):  # increasing in p for the lower bound, decreasing for the upper
    return cdf(p, k) - a if upper else (1 - cdf(p, k - 1)) - a

  lo, hi = ctx.mpf(0), ctx.mpf(k) / n
  if upper:
    lo, hi = ctx.mpf(k) / n, min(1 - ctx.mpf("1e-40"), ctx.mpf(k + 10) / n * 20)
  # Illinois (regula falsi keeping a bracket [a, b] with a sign change) to a relative 1e-20.
  a_, b_, fa, fb = lo, hi, excess(lo), excess(hi)
  assert fa * fb < 0
  for _ in range(300):
    c = b_ - fb * (b_ - a_) / (fb - fa)
    fc = excess(c)
    if fc * fb < 0:
      a_, fa = b_, fb
    else:
      fa /= 2
    b_, fb = c, fc
    if abs(b_ - a_) <= ctx.mpf("1e-20") * b_:
      break
  root = b_
  # Self-check: the excess changes sign within a relative 1e-12 of the root, so it is the root to 1e-12.
  assert excess(root * (1 - ctx.mpf("1e-12"))) * excess(root * (1 + ctx.mpf("1e-12"))) < 0
  return float(root)


@pytest.mark.parametrize("k,n", [(1000, 1e9), (1000, 2e8), (1000, 1e12), (1, 1e12), (7, 30), (40, 1e15),
                                 (3, 2.0**53)])
def test_clopper_pearson_matches_the_binomial_tail_equation_for_large_n(k, n):
  # SciPy's beta.ppf lost the root here: lower(1000, 1e9, 0.05) was 1.9e-6 > k/n = 1e-6 > upper, and
  # lower(1000, 1e12) was 15 k/n; an inflated lower bound is a false privacy alarm. Deterministic.
  for a in (0.05, 1e-6):
    lo, hi = audit.clopper_pearson_lower(k, n, a), audit.clopper_pearson_upper(k, n, a)
    assert 0 < lo <= k / n <= hi < 1
    assert lo == pytest.approx(_binomial_tail_root(k, n, a, upper=False), rel=1e-9, abs=0)
    assert hi == pytest.approx(_binomial_tail_root(k, n, a, upper=True), rel=1e-9, abs=0)


def test_clopper_pearson_is_finite_and_brackets_the_rate_on_random_inputs():
  # Real-valued counts up to 2^53 trials (log-uniform), alpha in [1e-12, 0.5]: the bounds must be finite and
  # lie either side of k / n (true for alpha <= 1/2, as the median of Bin(n, k / n) is k). Deterministic.
  rng = np.random.default_rng(3)
  n = np.floor(10.0**rng.uniform(0, np.log10(2.0**53), 400))
  k = np.concatenate([np.floor(n[:200] * 10.0**rng.uniform(-16, 0, 200)), n[200:] * rng.uniform(size=200)])
  for a in (0.5, 0.05, 1e-12):
    lo, hi = audit.clopper_pearson_lower(k, n, a), audit.clopper_pearson_upper(k, n, a)
    assert np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))
    assert np.all((0 <= lo) & (lo <= k / n) & (k / n <= hi) & (hi <= 1))


@pytest.mark.parametrize("bound", [audit.clopper_pearson_lower, audit.clopper_pearson_upper])
def test_clopper_pearson_refuses_trials_beyond_float64_counts(bound):
  # upper(1e30, 1e308) was NaN: SciPy's incomplete beta gives NaN for such parameters, and counts above 2^53
  # are not exact in float64.
  for successes, trials in ((1e30, 1e308), (1.0, 2.0**53 * 2)):
    with pytest.raises(ValueError, match="trials"):
      bound(successes, trials, 0.05)


@pytest.mark.parametrize("bound", [audit.clopper_pearson_lower, audit.clopper_pearson_upper])
def test_clopper_pearson_bad_arguments_name_themselves(bound):
  for alpha in (0.0, 1.0, None, "0.1", math.nan):
    with pytest.raises(ValueError, match="alpha"):
      bound(3, 10, alpha)
  for successes, trials in ((11, 10), (-1, 10), (0, 0), ("three", 10)):
    with pytest.raises(ValueError, match="successes"):
      bound(successes, trials, 0.05)
  # Mismatched shapes gave NumPy's "operands could not be broadcast" from the range check.
  with pytest.raises(ValueError, match=r"successes and trials .* shapes \(3,\) and \(2,\)"):
    bound([1, 2, 3], [10, 20], 0.05)
  assert bound([[1], [2]], [10, 20, 30], 0.05).shape == (2, 3)


@pytest.mark.parametrize("kwargs,needle", [
    ({"num_samples": 5}, "num_samples=5"),
    ({"alpha": 0.0}, "alpha=0.0"),
    ({"alpha": 1.5}, "alpha=1.5"),
    ({"claimed_epsilon": -1.0}, "claimed_epsilon=-1.0"),
    ({"claimed_delta": 1.0}, "claimed_delta=1.0"),
    ({"events": "histogram"}, "events"),
    ({"events": []}, "events"),
    # Not iterable: list(events) gave a raw TypeError ("'function' object is not iterable").
    ({"events": None}, "sequence of functions; got None"),
    ({"events": 3}, "sequence of functions; got 3"),
    ({"events": lambda v: v > 0}, r"wrap a single function in a list: events=\[fn\]"),
    ({"selection_fraction": 1.0}, "selection_fraction=1.0"),
    ({"num_events": 0}, "num_events=0"),
    # Given events take no selection split: both were ignored, even as NaN or -3.
    ({"events": [lambda v: v > 0], "selection_fraction": math.nan}, "selection_fraction to be finite"),
    ({"events": [lambda v: v > 0], "selection_fraction": -3.0}, r"selection_fraction=-3.0 in \(0, 1\)"),
    ({"events": [lambda v: v > 0], "num_events": 7}, r"Expected num_events=3 and selection_fraction=0.2 \(the "
                                                     r"defaults\) with events given: .*got num_events=7"),
    ({"events": [lambda v: v > 0], "selection_fraction": 0.5}, "got num_events=3, selection_fraction=0.5"),
])
def test_bad_arguments_name_themselves(kwargs, needle):
  args = {"num_samples": 1000, **kwargs}
  with pytest.raises(ValueError, match=needle):
    audit.audit_privacy(jax.random.key(0), T.laplace_release, *T.LAPLACE_PAIR, **args)


def test_statistic_must_be_one_scalar_per_sample():
  with pytest.raises(ValueError, match="one scalar per sample"):
    audit.sample_statistic(jax.random.key(0), T.collision, T.COLLISION_PAIR[0], 100,
                           statistic=lambda m: m[1])
  with pytest.raises(ValueError, match="NaN"):
    audit.sample_statistic(jax.random.key(0), lambda k, x: x * jnp.nan, jnp.float32(1), 10)


def test_more_samples_than_uint32_keys_are_refused():
  # Sample j's key folds in j as a uint32: sample 2^32 would have repeated sample 0's key.
  def never(k, x):
    raise AssertionError("sampled before the count was checked")
  with pytest.raises(ValueError, match="num_samples=4294967297 <= 4294967296"):
    audit.sample_statistic(jax.random.key(0), never, jnp.float32(1), 2**32 + 1)


def test_samples_do_not_depend_on_batch_size():
  # Sample j's key is fold_in(key, j): batch_size (and whether the mechanism is batched) only
  # changes memory. Before, each batch split its own key, and audit_privacy's epsilon_lower moved
  # from 0.79 to 0.57 between batch sizes 1,000 and 65,536 on the same key.
  key = jax.random.key(3)
  ref = audit.sample_statistic(key, T.laplace_release, T.LAPLACE_PAIR[0], 50)
  for bs in (1, 7, 50, 64):
    np.testing.assert_array_equal(audit.sample_statistic(key, T.laplace_release, T.LAPLACE_PAIR[0], 50,
                                                         batch_size=bs), ref)
  assert np.unique(ref).size == 50  # 50 independent continuous draws
  runs = [audit.audit_privacy(key, T.laplace_release, *T.LAPLACE_PAIR, num_samples=4_000, alpha=ALPHA,
                              claimed_epsilon=T.EPS, batch_size=bs) for bs in (333, 4_000)]
  assert runs[0].to_dict() == runs[1].to_dict()


def test_local_randomizer_refuses_a_neighbour_the_mechanism_cannot_take():
  # Bucket 5 outside s = 2 was dropped by the kernel: the audit ran on the empty client instead.
  mech = M.RandomizedResponse(M.BsvsShape(2, 1, 1), 1.0)
  rand = audit.local_randomizer(mech)
  ok = (jnp.array([1], jnp.int32), jnp.array([0], jnp.int32))
  for bad, needle in (((jnp.array([5], jnp.int32), jnp.array([0], jnp.int32)), r"x0's buckets .* \[0, 2\)"),
                      ((jnp.array([0, 1], jnp.int32), jnp.array([0], jnp.int32)), "x0's buckets to be at most 1"),
                      ((jnp.array([0.5]), jnp.array([0], jnp.int32)), "dtype float"),
                      ((jnp.array([0], jnp.int32), jnp.array([1], jnp.int32)), r"x0's labels .* \[0, 1\)")):
    with pytest.raises(ValueError, match=needle):
      audit.audit_privacy(jax.random.key(0), rand, bad, ok, num_samples=100)


def test_non_threefry_keys_are_refused():
  # Sample j uses fold_in(key, j) "whatever batch_size" held only for threefry: with an rbg key
  # the samples changed with batch_size.
  lap = lambda k, x: x + jax.random.laplace(k)
  key = jax.random.key(0, impl="rbg")
  with pytest.raises(ValueError, match="threefry2x32 key.*got a rbg key"):
    audit.sample_statistic(key, lap, jnp.float32(0), 16, batch_size=7)
  with pytest.raises(ValueError, match="threefry2x32 key.*got a rbg key"):
    audit.audit_privacy(key, lap, jnp.float32(0), jnp.float32(1), num_samples=100, claimed_epsilon=1.0)
  a = audit.sample_statistic(jax.random.key(0), lap, jnp.float32(0), 16, batch_size=16)
  assert np.array_equal(a, audit.sample_statistic(jax.random.key(0), lap, jnp.float32(0), 16, batch_size=7))


@pytest.mark.parametrize("n, k", [(2**53, 2**53 - 2), (10**15, 10**15 - 5), (10**14, 10**14 - 1)])
def test_clopper_pearson_is_conservative_near_one(n, k):
  # SciPy's quantile was accepted within a relative 1e-9 of the root, more than 1 - p near p = 1:
  # the lower bound for (2^53 - 2 of 2^53) had tail 0.0138 at alpha 0.01. Checked exactly here
  # (mpmath at 60 digits): each bound's tail at it must be <= alpha.
  mp = pytest.importorskip("mpmath")
  alpha = 0.01
  lo, hi = audit.clopper_pearson_lower(k, n, alpha), audit.clopper_pearson_upper(k, n, alpha)
  with mp.workdps(60):
    assert mp.betainc(k, n - k + 1, 0, mp.mpf(lo), regularized=True) <= alpha  # P[Bin(n, L) >= k]
    if hi < 1.0:
      assert 1 - mp.betainc(k + 1, n - k, 0, mp.mpf(hi), regularized=True) <= alpha  # P[Bin(n, U) <= k]


def test_audit_arguments_are_validated():
  # batched="no" and batched=1 were taken as true, a non-callable statistic or mechanism gave a
  # TypeError, and an event returning counts or a wrong shape was counted silently.
  lap = lambda k, x: x + jax.random.laplace(k)
  key, x0, x1 = jax.random.key(0), jnp.float32(0), jnp.float32(1)
  for bad in ("no", 1):
    with pytest.raises(ValueError, match="Expected batched to be a bool"):
      audit.sample_statistic(key, lap, x0, 16, batched=bad)
    with pytest.raises(ValueError, match="Expected batched to be a bool"):
      audit.audit_privacy(key, lap, x0, x1, num_samples=100, batched=bad)
  with pytest.raises(ValueError, match="Expected mechanism to be a function"):
    audit.sample_statistic(key, "laplace", x0, 16)
  with pytest.raises(ValueError, match="Expected statistic to be None or a function"):
    audit.audit_privacy(key, lap, x0, x1, num_samples=100, statistic="mean")
  for event in (lambda v: (v > 0).astype(int), lambda v: (v > 0)[:1]):
    with pytest.raises(ValueError, match="Expected event 0 to return a boolean array of shape"):
      audit.audit_privacy(key, lap, x0, x1, num_samples=100, events=[event])
  r = audit.audit_privacy(key, lap, x0, x1, num_samples=100, events=[lambda v: v > 0.5])
  assert len(r.events) == 2 and r.num_selection == 0


def test_local_randomizer_validates_before_caching():
  # The cache hashed its argument first: a list or dict gave TypeError "unhashable type", not this ValueError.
  for bad in ([1, 2], {"eps": 1}):
    with pytest.raises(ValueError, match="Expected mechanism to be a BsvsMechanism; got"):
      audit.local_randomizer(bad)

  class Unhashable(M.RandomizedResponse):
    __hash__ = None

  mech = Unhashable(M.BsvsShape(2, 1, 1), 1.0)  # valid but not hashable: built without the cache
  rand = audit.local_randomizer(mech)
  rand.check_input("x0", (jnp.array([1], jnp.int32), jnp.array([0], jnp.int32)))
  with pytest.raises(ValueError, match=r"x0's buckets .* \[0, 2\)"):
    rand.check_input("x0", (jnp.array([5], jnp.int32), jnp.array([0], jnp.int32)))
  hashable = M.RandomizedResponse(M.BsvsShape(2, 1, 1), 1.0)
  assert audit.local_randomizer(hashable) is audit.local_randomizer(hashable)


def _host_coin(keys, x):
  """Batched host draws of Pr[heads] = 0.1 + 0.8 x (x in {0, 1}: the two outputs' epsilon is ln 9)."""
  return np.asarray(jax.vmap(jax.random.uniform)(keys)) < 0.1 + 0.8 * x


@pytest.mark.parametrize("heads, tails, claimed", [
    (np.inf, 0.0, 1.0),  # x0 never gives inf, x1 mostly: infinite epsilon
    (1.5e308, 1e308, 1.0),  # the midpoint overflowed to inf
    (np.int64(6 * 10**18), np.int64(5 * 10**18), 1.0),  # the int64 midpoint wrapped negative
])
def test_threshold_events_on_extreme_statistics_still_find_the_leak(heads, tails, claimed):
  # Threshold cuts were midpoints of adjacent values: with +inf, a float sum past 1.8e308 or an int64 sum past
  # 9.2e18, every event came out empty or certain (epsilon_lower 0, no alarm) for mechanisms of epsilon ln 9 or
  # infinity. With 4,000 samples per input the audit at alpha = 0.05 finds epsilon_lower > 1 except with
  # negligible probability (the inf case: ln(Clopper-Pearson bounds) > 5; the others about 2.1), fixed seed.
  def mech(keys, x):
    coin = _host_coin(keys, x)
    if np.isinf(heads):
      coin &= x > 0  # x0 never gives inf (x1: w.p. 0.9)
    return np.where(coin, heads, tails)
  r = audit.audit_privacy(jax.random.key(0), mech, 0.0, 1.0, num_samples=4000, claimed_epsilon=claimed,
                          alpha=0.05, batched=True, events="thresholds")
  assert r.alarm and r.epsilon_lower > 1.5, (r.epsilon_lower, [e.description for e in r.events])


def test_sample_statistic_refuses_complex_and_audit_privacy_names_a_num_samples_past_its_limit():
  # A complex statistic was cast to its real part (a ComplexWarning); 8.6e9 samples were refused naming the
  # estimation split's 6.9e9, a number the caller never passed.
  with pytest.raises(ValueError, match=r"^Expected a real statistic; got dtype complex128 "):
    audit.sample_statistic(jax.random.key(0), lambda keys, x: np.full(len(keys), 1j * x), 1.0, 5, batched=True)
  with pytest.raises(ValueError, match=r"^Expected num_samples=8589934592 at most 5368709120 \(2\^32 samples per "
                                       r"split, selection_fraction=0.2\)\.$"):
    audit.audit_privacy(jax.random.key(0), _host_coin, 0.0, 1.0, num_samples=2**33, batched=True)


def test_clopper_pearson_lower_bound_of_a_subnormal_count_is_zero():
  # Counts may be real-valued; a subnormal one (5e-324, 1e-310) raised boost's OverflowError from SciPy's Beta
  # quantile while 1e-300 gave 0. The bound is 0: I_x(k, n - k + 1) >= x^k (1 - x)^(n - k) is about 1 > alpha even
  # at the smallest positive float x. Other entries of an array keep their values; the upper bound is k = 0's.
  for k in (5e-324, 1e-310, np.nextafter(np.finfo(np.float64).tiny, 0)):
    assert audit.clopper_pearson_lower(k, 10, 0.05) == 0.0
    assert audit.clopper_pearson_upper(k, 10, 0.05) == audit.clopper_pearson_upper(0, 10, 0.05)
  ks = np.array([0.0, 5e-324, 1e-310, 1e-300, 2.0, 10.0])
  lo = audit.clopper_pearson_lower(ks, 10, 0.05)
  assert lo.tolist() == [0.0, 0.0, 0.0, 0.0, audit.clopper_pearson_lower(2.0, 10, 0.05),
                         audit.clopper_pearson_lower(10.0, 10, 0.05)]
  assert audit.clopper_pearson_lower([5e-324, 3.0], [1, 2**53], 0.999).tolist() == [
      0.0, audit.clopper_pearson_lower(3.0, 2**53, 0.999)]


@pytest.mark.parametrize("x0, x1, needle", [
    ("a", 1.0, r"x0 to be a number, an array or a pytree of them .*got 'a' \(Argument 'a' of type"),
    (0.0, ["a"], r"x1 to be a number, an array or a pytree of them .*got \['a'\], whose leaf 'a' is not a JAX"),
    (np.array(["a"]), 1.0, r"x0 to be a number, .*got array\(\['a'\], dtype='<U1'\) \(Dtype <U1 is not a valid JAX"),
    (2**40, 1, r"x0 to be a number, .*\(Python int 1099511627776 too large to convert to int32\)"),
    ([1.0, 2.0], 1.0, r"x0 and x1 to have the same structure \(neighbouring inputs\); got \[1\.0, 2\.0\] and 1\.0"),
    (None, 1.0, r"x0 and x1 to have the same structure .*got None and 1\.0"),
    ({"a": 0.0}, {"b": 1.0}, r"x0 and x1 to have the same structure"),
    (jnp.zeros(2), jnp.ones(3), r"x0 and x1 to have the same shapes .*leaf 0 has shape \(2,\) in x0 and \(3,\) in x1"),
])
def test_audit_privacy_names_x0_and_x1_that_are_not_neighbouring_jax_inputs(x0, x1, needle):
  # x0 and x1 were not checked: "a" was JAX's two-line TypeError about _vmapped_batch, and [1.0, 2.0] against 1.0
  # reached the mechanism, a TypeError ('list' + BatchTracer). Both are refused by name before any sampling.
  lap = lambda k, x: x + jax.random.laplace(k)  # noqa: E731
  with pytest.raises(ValueError, match=rf"^Expected {needle}") as err:
    audit.audit_privacy(jax.random.key(0), lap, x0, x1, num_samples=200)
  assert "\n" not in str(err.value)


def test_audit_privacy_takes_pytrees_and_host_values_it_can_run():
  # Matching pytrees of numbers run; a batched (host) mechanism may take values JAX cannot, but x1 still needs
  # x0's structure.
  lap = lambda k, x: x["a"][0] + x["b"] + jax.random.laplace(k)  # noqa: E731
  r = audit.audit_privacy(jax.random.key(0), lap, {"a": [0.0], "b": jnp.float32(0)}, {"a": [1.0], "b": 0},
                          num_samples=200)
  assert r.num_samples == 200
  host = lambda keys, x: _host_coin(keys, float(x == "one"))  # noqa: E731
  r = audit.audit_privacy(jax.random.key(0), host, "zero", "one", num_samples=200, batched=True)
  assert r.num_samples == 200
  with pytest.raises(ValueError, match=r"^Expected x0 and x1 to have the same structure .*got \('zero',\) and"):
    audit.audit_privacy(jax.random.key(0), host, ("zero",), "one", num_samples=200, batched=True)


@pytest.mark.parametrize("fraction, selection, estimation", [(0.999, 200, 0), (5e-324, 0, 200), (0.001, 0, 200)])
def test_audit_privacy_names_the_selection_fraction_that_empties_a_split(fraction, selection, estimation):
  # The message named num_samples alone ("Expected num_samples=200 large enough for both splits."), though the
  # selection_fraction the caller passed is what left a split empty.
  with pytest.raises(ValueError, match=rf"^Expected num_samples=200 and selection_fraction={fraction!r} to leave at "
                                       rf"least one sample in each split; got {selection} selection and {estimation} "
                                       r"estimation samples\.$"):
    audit.audit_privacy(jax.random.key(0), _host_coin, 0.0, 1.0, num_samples=200, batched=True,
                        selection_fraction=fraction)
