"""Shuffle amplification: closed form, clone-reduction numeric bound, inverse.

The numeric bound is also checked against the *exact* privacy profile of real
shuffled randomizers enumerated at tiny n (it must upper-bound them), and
against a direct (non-cutoff) evaluation of the clone pair.
"""

import itertools
import math
import re
import warnings

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import stats

from jaxdistill import accounting

NS = [500, 5_000, 50_000]


def test_published_example_both_methods():
  # FMT21 README example: n=1e5, eps0=4, delta=1e-6: numeric in [0.1675, 0.1728], closed ~0.54.
  num = accounting.shuffle_epsilon(4.0, 10**5, 1e-6, method="numeric")
  closed = accounting.shuffle_epsilon(4.0, 10**5, 1e-6, method="closed-form")
  assert 0.1675 <= num.epsilon <= 0.1728
  assert closed.epsilon == pytest.approx(0.54, abs=0.01)
  assert (num.method, closed.method) == ("numeric", "closed-form")


def printed_theorem_3_1(e0, n, d):
  """FMT21 Theorem 3.1 exactly as printed (spec §3)."""
  return math.log(1 + (math.exp(e0) - 1) / (math.exp(e0) + 1) * (
      8 * math.sqrt(math.exp(e0) * math.log(4 / d)) / math.sqrt(n) + 8 * math.exp(e0) / n))


def test_closed_form_formula_written_out():
  # The authors' code's variant (spec §3, "Apple code variant"), written out as the spec gives it.
  e0, n, d = 1.5, 20_000, 1e-7
  a = 8 * math.sqrt(math.exp(e0) * math.log(4 / d) / n)
  c = 8 * math.exp(e0) / n
  e1 = math.log(1 + a + c)
  want = math.log(1 + (1 - math.exp(-e0)) / (1 + math.exp(-e0 - e1)) * (a + c))
  assert accounting.fmt_closed_form_epsilon(e0, n, d) == pytest.approx(want, rel=1e-14)


@pytest.mark.parametrize("n", [200, 10**4, 10**5, 10**8])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_closed_form_is_never_below_the_printed_theorem(n, delta):
  # Spec I7: where the printed theorem and the authors' code differ, the library takes the larger epsilon
  # and the stricter validity condition (ln(4/delta) in place of the printed ln(2/delta)).
  cap = math.log(n / (16 * math.log(4 / delta)))
  assert cap < math.log(n / (16 * math.log(2 / delta)))
  for e0 in np.linspace(0.01, cap, 9) if cap > 0.01 else []:
    got = accounting.fmt_closed_form_epsilon(e0, n, delta)
    assert got >= printed_theorem_3_1(e0, n, delta) * (1 - 1e-14)
    # (1 + e^-e0) / (1 + e^(-e0-e1)) < 2, and ln(1 + 2u) <= 2 ln(1 + u): at most twice the printed value
    # (about 1% more at e0 = 4, n = 1e5; up to 45% more at e0 -> 0, n = 200, where a + c is large).
    assert got <= 2 * printed_theorem_3_1(e0, n, delta)
  if cap > 0:
    assert not accounting.fmt_closed_form_valid(cap * (1 + 1e-9) + 1e-12, n, delta)
  else:  # n = 200 at delta 1e-6 and 1e-10: the validity range is empty, so the loop above checked nothing
    assert not any(accounting.fmt_closed_form_valid(e0, n, delta) for e0 in (1e-6, 0.01, 1.0))
    with pytest.raises(ValueError, match="eps0"):
      accounting.fmt_closed_form_epsilon(0.01, n, delta)


@given(st.floats(0.1, 5.0), st.sampled_from(NS), st.sampled_from([1e-4, 1e-6, 1e-8]))
def test_numeric_never_above_closed_form(eps0, n, delta):
  # Outside the closed form's validity range there is nothing to compare: draw another example.
  assume(accounting.fmt_closed_form_valid(eps0, n, delta))
  num = accounting.shuffle_epsilon(eps0, n, delta).epsilon
  assert num <= accounting.fmt_closed_form_epsilon(eps0, n, delta) + 1e-9
  assert num <= eps0  # shuffling never hurts


@given(st.floats(0.2, 4.0), st.floats(1.05, 2.0), st.sampled_from(NS[:2]), st.sampled_from([1e-5, 1e-7]))
def test_numeric_monotone(eps0, factor, n, delta):
  tol = 1e-5
  base = accounting.shuffle_epsilon(eps0, n, delta, tol=tol).epsilon
  # Bisection tolerance: answers are within tol (relative) above the true minimum.
  slack = 2 * tol * base + 1e-12
  assert accounting.shuffle_epsilon(min(eps0 * factor, 6.0), n, delta, tol=tol).epsilon >= base - slack
  assert accounting.shuffle_epsilon(eps0, int(n * factor), delta, tol=tol).epsilon <= base + slack
  assert accounting.shuffle_epsilon(eps0, n, delta * factor, tol=tol).epsilon <= base + slack


@given(st.floats(0.05, 1.5), st.sampled_from(NS), st.sampled_from(["numeric", "closed-form"]))
def test_inverse_then_forward_round_trips(target, n, method):
  delta = 1e-6
  try:
    inv = accounting.shuffle_local_epsilon(target, n, delta, method=method, tol=1e-4)
  except ValueError:
    assert method == "closed-form"  # empty validity range at this n and delta
    assume(False)  # nothing to round-trip: draw another example
  fwd = accounting.shuffle_epsilon(inv.eps0, n, delta, method=method, tol=1e-6).epsilon
  assert fwd <= target * (1 + 2e-6)
  cap = math.log(n / (16 * math.log(4 / delta)))
  # Tight, unless capped at the closed form's validity limit (no larger eps0 is allowed there).
  if method == "numeric" or inv.eps0 < cap * (1 - 1e-12):
    bigger = inv.eps0 * (1 + 1e-3)
    assert accounting.shuffle_epsilon(bigger, n, delta, method=method, tol=1e-6).epsilon > target


def test_closed_form_validity_condition():
  n, delta = 1000, 1e-6
  cap = math.log(n / (16 * math.log(4 / delta)))  # the authors' code's check (spec I7), stricter than printed
  # Between the two conditions: valid as printed, refused here.
  between = 0.5 * (cap + math.log(n / (16 * math.log(2 / delta))))
  assert not accounting.fmt_closed_form_valid(between, n, delta)
  with pytest.raises(ValueError, match=r"ln\(n/\(16 ln\(4/delta\)\)\)"):
    accounting.fmt_closed_form_epsilon(between, n, delta)
  with pytest.raises(ValueError, match="eps0"):
    accounting.fmt_closed_form_epsilon(cap + 0.1, n, delta)
  with pytest.raises(ValueError, match="eps0"):
    accounting.shuffle_epsilon(cap + 0.1, n, delta, method="closed-form")
  fb = accounting.shuffle_epsilon(cap + 0.1, n, delta, method="closed-form", on_invalid="numeric")
  assert fb.fell_back and fb.method == "numeric" and fb.epsilon <= cap + 0.1


def clone_pair_direct(c, eps0):
  """P_c, Q_c over a = 0..c+1, built directly (no cutoff algebra)."""
  alpha = math.exp(eps0) / (math.exp(eps0) + 1)
  b = stats.binom.pmf(np.arange(c + 1), c, 0.5)
  base, shifted = np.append(b, 0.0), np.insert(b, 0, 0.0)
  return alpha * base + (1 - alpha) * shifted, (1 - alpha) * base + alpha * shifted


@pytest.mark.parametrize("n,eps0", [(2, 1.0), (7, 0.5), (30, 2.0), (200, 3.0)])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4, 0.9])
def test_clone_delta_equals_direct_sum(n, eps0, eps):
  weights = stats.binom.pmf(np.arange(n), n - 1, math.exp(-eps0))
  d_pq = d_qp = 0.0
  for c, w in enumerate(weights):
    p, q = clone_pair_direct(c, eps0)
    d_pq += w * accounting.hockey_stick_divergence(p, q, eps)
    d_qp += w * accounting.hockey_stick_divergence(q, p, eps)
  assert accounting.clone_delta(eps, eps0, n) == pytest.approx(max(d_pq, d_qp), abs=1e-12)


@pytest.mark.parametrize("eps0", [0.5, 2.0, 4.0])
def test_clone_divergence_does_not_increase_with_c(eps0):
  # What the binned window of clone_delta relies on: the pair at c + 1 is the pair at c plus an independent
  # Bernoulli(1/2) message, so neither hockey-stick divergence can grow with c. Exact, c = 0..60.
  for eps in (0.0, 0.05, 0.3, 0.9 * eps0):
    prev = (math.inf, math.inf)
    for c in range(61):
      p, q = clone_pair_direct(c, eps0)
      cur = (accounting.hockey_stick_divergence(p, q, eps), accounting.hockey_stick_divergence(q, p, eps))
      assert cur[0] <= prev[0] + 1e-15 and cur[1] <= prev[1] + 1e-15, (eps, c)
      prev = cur


@pytest.mark.parametrize("n,eps0,eps", [(10**6, 4.0, 0.05), (10**6, 2.0, 0.01), (10**5, 1.0, 0.02)])
def test_binned_clone_window_is_an_upper_bound_close_to_the_exact_sum(n, eps0, eps):
  # The windows here hold 2,200 to 6,000 values of c, summed exactly by default; 64 and 512 bins
  # must stay above that sum (the bins are evaluated at their smallest c) and approach it.
  exact = accounting.clone_delta(eps, eps0, n)
  assert 1e-9 < exact < 1e-2  # a delta where the bins, not float rounding, make the difference
  coarse, finer = (accounting.clone_delta(eps, eps0, n, max_points=m) for m in (64, 512))
  assert exact <= finer <= coarse
  assert finer <= exact * 1.002 and coarse <= exact * 1.02
  assert coarse > exact  # the bins really were used


@pytest.mark.parametrize("n,eps0", [(10**7, 2.0), (10**9, 4.0)])
def test_coarse_first_pass_is_nested_and_never_below_the_default_window(n, eps0):
  # The bisections decide clone_delta(eps) <= delta from a coarse window first: each of its bins must be a
  # union of the default window's values or bins, keep their total mass, and so give a sum at least the
  # default one (the divergence does not increase with c) and close to it.
  from jaxdistill.accounting import _shuffle
  c, weight, missing = _shuffle._clone_window(n, eps0, _shuffle.MAX_CLONE_POINTS)
  c_coarse, w_coarse, missing_coarse = _shuffle._coarse_window(n, eps0, _shuffle.MAX_CLONE_POINTS)
  assert c.size > 4 * c_coarse.size and np.all(np.isin(c_coarse, c)) and c_coarse[0] == c[0]
  assert missing_coarse == missing and math.isclose(w_coarse.sum(), weight.sum(), rel_tol=1e-12)
  upper = np.append(c_coarse[1:], np.inf)  # each coarse bin holds the default entries up to the next one
  for j in (0, c_coarse.size // 2, c_coarse.size - 1):
    inside = (c >= c_coarse[j]) & (c < upper[j])
    assert math.isclose(w_coarse[j], weight[inside].sum(), rel_tol=1e-12, abs_tol=1e-300)
  for eps in (0.0, 0.005, 0.02, 0.1):
    fine = accounting.clone_delta(eps, eps0, n)
    coarse = _shuffle._window_delta(eps, eps0, c_coarse, w_coarse, missing_coarse)
    assert fine <= coarse <= fine * 1.05 + 1e-14, (eps, fine, coarse)


def bisect_with_clone_delta(eps0, n, delta, tol=1e-4):
  """shuffle_epsilon's bisection as it was before the coarse first pass: every step asks clone_delta."""
  lo, hi = 0.0, eps0
  if accounting.fmt_closed_form_valid(eps0, n, delta):
    hi = min(hi, accounting.fmt_closed_form_epsilon(eps0, n, delta) * 1.0001 + 1e-12)
  if accounting.clone_delta(hi, eps0, n) > delta:
    hi = eps0
  while hi - lo > tol * max(hi, 1e-12):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    lo, hi = (lo, mid) if accounting.clone_delta(mid, eps0, n) <= delta else (mid, hi)
  return hi


@pytest.mark.parametrize("eps0,n,delta", [(0.5, 10**7, 1e-6), (4.0, 10**9, 1e-6), (2.0, 10**6, 1e-8)])
def test_coarse_first_pass_changes_no_answer(eps0, n, delta):
  assert accounting.shuffle_epsilon(eps0, n, delta).epsilon == bisect_with_clone_delta(eps0, n, delta)


def test_epsilon_is_zero_exactly_when_the_pair_is_within_total_variation_delta():
  # At eps = 0 the hockey-stick divergence is the total variation distance, summed here directly over
  # C ~ Bin(n - 1, e^{-eps0}) with the clone pairs built from their definition. At or above it, (0, delta)
  # holds and epsilon is 0; the bisection used to creep down to ~1e-16 instead (minutes at n = 10**12).
  n, eps0 = 2000, 1e-3
  weights = stats.binom.pmf(np.arange(n), n - 1, math.exp(-eps0))
  tv = sum(w * 0.5 * np.abs(np.subtract(*clone_pair_direct(c, eps0))).sum() for c, w in enumerate(weights))
  assert 1e-6 < tv < 1e-4
  assert accounting.shuffle_epsilon(eps0, n, tv * 1.001).epsilon == 0.0
  below = accounting.shuffle_epsilon(eps0, n, tv * 0.5).epsilon
  assert 0.0 < below < eps0 and accounting.clone_delta(below, eps0, n) <= tv * 0.5


def test_epsilon_is_zero_for_a_trillion_weakly_private_messages():
  # n = 10**12, eps0 = 0.3, delta = 1e-6: the case that took more than 5 minutes. The coarse window's sum at
  # eps = 0 (an upper bound on the total variation) is already below delta.
  from jaxdistill.accounting import _shuffle
  n, eps0, delta = 10**12, 0.3, 1e-6
  assert _shuffle._window_delta(0.0, eps0, *_shuffle._coarse_window(n, eps0, _shuffle.MAX_CLONE_POINTS)) <= delta
  assert accounting.shuffle_epsilon(eps0, n, delta).epsilon == 0.0


def shuffled_rr_count_pmf(eps0, k, inputs):
  """Exact pmf of the shuffled histogram of n k-ary RR messages."""
  keep = math.exp(eps0) / (math.exp(eps0) + k - 1)
  other = 1 / (math.exp(eps0) + k - 1)
  pmf = {tuple([0] * k): 1.0}
  for x in inputs:
    nxt = {}
    for hist, pr in pmf.items():
      for o in range(k):
        h = list(hist)
        h[o] += 1
        nxt[tuple(h)] = nxt.get(tuple(h), 0.0) + pr * (keep if o == x else other)
    pmf = nxt
  return pmf


@pytest.mark.parametrize("k,n", [(2, 6), (2, 12), (3, 5)])
@pytest.mark.parametrize("eps0", [0.5, 1.5, 3.0])
def test_numeric_bound_dominates_exact_shuffled_rr(k, n, eps0):
  # Replace-one neighbours differ in client 0's input (0 vs 1); the others range
  # over every multiset of inputs. The exact profile must be below clone_delta.
  for others in itertools.combinations_with_replacement(range(k), n - 1):
    p = shuffled_rr_count_pmf(eps0, k, (0,) + others)
    q = shuffled_rr_count_pmf(eps0, k, (1,) + others)
    for eps in (0.0, 0.25 * eps0, 0.5 * eps0, 0.9 * eps0):
      assert accounting.privacy_profile(p, q, eps) <= accounting.clone_delta(eps, eps0, n) + 1e-12


@pytest.mark.parametrize("call,name", [
    (lambda: accounting.shuffle_epsilon(0.0, 100, 1e-6), "eps0"),
    (lambda: accounting.shuffle_epsilon(1.0, 0, 1e-6), "n"),
    (lambda: accounting.shuffle_epsilon(1.0, 100, 1.0), "delta"),
    (lambda: accounting.shuffle_epsilon(1.0, 100, float("nan")), "delta"),
    (lambda: accounting.shuffle_epsilon(1.0, 100.5, 1e-6), "n"),
    (lambda: accounting.shuffle_epsilon(1.0, 100, 1e-6, method="exact"), "method"),
    (lambda: accounting.shuffle_local_epsilon(-1.0, 100, 1e-6), "target_epsilon"),
    (lambda: accounting.clone_delta(0.1, 1.0, 100, max_points=1), "max_points"),
    (lambda: accounting.clone_delta(0.1, 1.0, 100, max_points=2.5), "max_points"),
])
def test_bad_input(call, name):
  with pytest.raises(ValueError, match=name):
    call()


@pytest.mark.parametrize("call,name", [
    (lambda: accounting.shuffle_epsilon(710.0, 1000, 1e-6), "eps0"),
    (lambda: accounting.shuffle_epsilon(710.0, 1000, 1e-6, method="closed-form", on_invalid="numeric"), "eps0"),
    (lambda: accounting.clone_delta(0.5, 800.0, 1000), "eps0"),
    (lambda: accounting.shuffle_local_epsilon(800.0, 1000, 1e-6), "target_epsilon"),
])
def test_epsilon_above_the_supported_range_is_a_clear_error(call, name):
  # e^eps overflowed float64 (OverflowError) past 709; the accounting now states its range (0, 60].
  with pytest.raises(ValueError, match=rf"{name}=\S+ <= 60"):
    call()


@pytest.mark.parametrize("call,needle", [
    # alpha rounded to exactly 1/2 and the cutoffs divided by 0 (ZeroDivisionError).
    (lambda: accounting.shuffle_local_epsilon(1e-20, 1000, 1e-6), r"target_epsilon=1e-20 >= 1e-09"),
    (lambda: accounting.clone_delta(0.0, 1e-12, 1000), r"eps0=1e-12 >= 1e-09"),
    # NumPy's rint failed on an int past 2^63 (TypeError); at 2^63 - 1 the weights were NaN and epsilon = eps0.
    (lambda: accounting.shuffle_epsilon(1.0, 10**23, 1e-6), r"n=\d+ <= 1000000000000000000"),
    (lambda: accounting.shuffle_epsilon(1.0, 2**63 - 1, 1e-6), r"n=9223372036854775807 <= 1000000000000000000"),
    # n = 1e13 took 41 s, 1e17 more than 100 s.
    (lambda: accounting.shuffle_epsilon(1.0, 10**13, 1e-6), r"n=10000000000000 <= 1e\+12"),
    (lambda: accounting.shuffle_local_epsilon(1.0, 10**13, 1e-6), r"n=10000000000000 <= 1e\+12"),
    (lambda: accounting.clone_delta(0.5, 1.0, 10**13), r"n=10000000000000 <= 1e\+12"),
])
def test_edges_of_the_supported_range_are_clear_errors(call, needle):
  with pytest.raises(ValueError, match=needle):
    call()


def test_closed_form_takes_huge_n_and_tiny_delta():
  # 2/delta overflowed at delta = 1e-320: ln(inf) and a "math domain error" from ln(0).
  eps = accounting.fmt_closed_form_epsilon(1.0, 10**17, 1e-320)
  e0 = math.e
  want = math.log1p(math.tanh(0.5) * (8 * math.sqrt(e0 * (math.log(4) + 320 * math.log(10)) / 1e17) + 8 * e0 / 1e17))
  assert eps == pytest.approx(want, rel=1e-9)
  # The clone reduction cannot certify delta = 1e-320 below eps0 at n = 1000: with probability
  # (1 - 1/e)^999 = 1e-199 there is no clone at all, and the message is then only eps0-private.
  assert accounting.shuffle_epsilon(1.0, 1000, 1e-320).epsilon == 1.0


@pytest.mark.parametrize("eps0,n,delta", [(1.0, 10**5, 1e-15), (1.0, 10**5, 1e-20), (2.0, 10**8, 1e-16),
                                          (4.0, 10**6, 1e-30), (1.0, 10**5, 1e-100)])
def test_numeric_beats_the_closed_form_at_deltas_below_the_windows_tail_mass(eps0, n, delta):
  # C's mass outside the window (~2e-15) used to count as a loss of 1: below that delta the numeric method
  # silently gave eps0 itself (n = 1e8, eps0 = 2, delta = 1e-16: 2.0 where the closed form gives 0.0102), and
  # the inverse calibrated eps0 = target (no amplification). The tails are now binned, no mass left out.
  assert accounting.fmt_closed_form_valid(eps0, n, delta)
  closed = accounting.fmt_closed_form_epsilon(eps0, n, delta)
  got = accounting.shuffle_epsilon(eps0, n, delta).epsilon
  assert 0 < got <= closed
  # The answer is certified, not assumed (up to float rounding of the sum: 1e-9 of delta is 1e-13 in eps).
  assert accounting.clone_delta(got, eps0, n) <= delta * (1 + 1e-9)
  amp = accounting.shuffle_local_epsilon(closed, n, delta)
  assert amp.eps0 >= eps0 and accounting.clone_delta(closed, amp.eps0, n) <= delta * (1 + 1e-9)


@pytest.mark.parametrize("n,eps0", [(10**5, 1.0), (10**6, 4.0)])
def test_both_directions_of_the_symmetric_clone_pair_agree_far_into_the_tails(n, eps0):
  # a' -> c + 1 - a' maps P_c onto Q_c, so H(P||Q) = H(Q||P) at every c. The Q||P side, computed as 1 - CDF,
  # rounded an upper tail of 1e-20 to 1e-16 and so set clone_delta for every delta below 1e-15.
  from jaxdistill.accounting import _shuffle
  c, weight, _ = _shuffle._clone_window(n, eps0, _shuffle.MAX_CLONE_POINTS)
  for eps in np.linspace(0.02, 0.5, 7) * eps0:
    both = []
    for side in (slice(None), None):
      alpha, beta, beta_q = _shuffle._hockey_cutoffs(eps, eps0)
      b = beta if side is not None else beta_q
      m = np.floor(b * (c + 1))
      if side is not None:  # P(A' <= m) - e^eps Q(A' <= m), lower tails
        f, f1 = stats.binom.cdf(m, c, 0.5), stats.binom.cdf(m - 1, c, 0.5)
        h = alpha * f + (1 - alpha) * f1 - math.exp(eps) * ((1 - alpha) * f + alpha * f1)
      else:  # Q(A' > m) - e^eps P(A' > m), upper tails
        f, f1 = stats.binom.sf(m, c, 0.5), stats.binom.sf(m - 1, c, 0.5)
        h = (1 - alpha) * f + alpha * f1 - math.exp(eps) * (alpha * f + (1 - alpha) * f1)
      both.append(float(np.sum(weight * np.clip(h, 0.0, None))))
    got = accounting.clone_delta(eps, eps0, n)
    assert got == pytest.approx(max(both), rel=1e-12, abs=1e-300)
    assert both[0] == pytest.approx(both[1], rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("n,eps0", [(10**5, 1.0), (60000, 5.0), (10**8, 2.0), (10**12, 0.3), (100, 1.0)])
def test_clone_window_places_all_of_cs_mass_below_above_and_inside(n, eps0):
  # Each entry's weight must be the mass of C from its c up to the next entry's c (the last: all above it), so
  # that evaluating the non-increasing divergence at each entry's c bounds the sum from above.
  from jaxdistill.accounting import _shuffle
  c, weight, missing = _shuffle._clone_window(n, eps0, _shuffle.MAX_CLONE_POINTS)
  dist = stats.binom(n - 1, math.exp(-eps0))
  assert missing == 0.0 and c[0] == 0 and np.all(np.diff(c) > 0)
  assert math.isclose(weight.sum(), 1.0, rel_tol=1e-12)
  for j in (0, 1, 2, c.size // 2, c.size - 2):
    lo, hi = c[j], c[j + 1]
    want = dist.cdf(hi - 1) - dist.cdf(lo - 1) if lo < dist.median() else dist.sf(lo - 1) - dist.sf(hi - 1)
    assert math.isclose(weight[j], want, rel_tol=1e-9, abs_tol=1e-300), (j, lo, hi)
  assert math.isclose(weight[-1], dist.sf(c[-1] - 1), rel_tol=1e-9)


@pytest.mark.parametrize("target", [45.0, 60.0])
def test_large_target_inside_the_range_is_met(target):
  n, delta = 1000, 1e-6
  amp = accounting.shuffle_local_epsilon(target, n, delta)
  assert target <= amp.eps0 <= 60.0 and amp.epsilon <= target
  assert accounting.clone_delta(target, amp.eps0, n) <= delta


@pytest.mark.parametrize("call", [
    lambda: accounting.shuffle_local_epsilon(0.1, 10**9, 1e-6, tol=1e-17, method="closed-form"),
    lambda: accounting.shuffle_local_epsilon(0.5, 10**5, 1e-6, tol=1e-17),
    lambda: accounting.shuffle_epsilon(4.0, 10**5, 1e-6, tol=1e-300),
    lambda: accounting.shuffle_epsilon(4.0, 10**5, 1e-6, tol=1e-17, method="closed-form", on_invalid="numeric"),
])
def test_tolerance_below_float64_resolution_is_refused(call):
  # Once lo and hi were adjacent floats the bisection's midpoint never moved: these looped forever.
  with pytest.raises(ValueError, match=r"tol=\S+ >= 1e-15"):
    call()


@pytest.mark.parametrize("name,call", [
    ("tol", lambda t: accounting.shuffle_epsilon(1.0, 1000, 1e-6, tol=t)),
    ("tol", lambda t: accounting.shuffle_local_epsilon(0.5, 1000, 1e-6, tol=t)),
    ("rtol", lambda t: accounting.calibrate("laplace", target_epsilon=1.0, target_delta=0.0, relation="add-remove",
                                            rtol=t)),
    ("rtol", lambda t: accounting.calibrate_multi_message(1.0, 1e-6, rtol=t, flood_multipliers=(1.0,))),
])
def test_a_relative_tolerance_above_a_tenth_is_refused(name, call):
  # No upper bound: shuffle_epsilon(1, 1000, 1e-6, tol=1e308) returned 0.6496 against 0.1824 at the default tol
  # (safe, but 3.5x loose, without a word); shuffle_local_epsilon's eps0 came out 1.0 against 1.90.
  for bad in (1e308, 2.5, 0.11):
    with pytest.raises(ValueError, match=rf"Expected {name}={re.escape(repr(bad))} <= 0.1: a relative tolerance"):
      call(bad)


@pytest.mark.parametrize("method", ["closed-form", "numeric"])
def test_finest_tolerance_terminates_and_meets_the_target(method):
  amp = accounting.shuffle_local_epsilon(0.5, 10**5, 1e-6, tol=1e-15, method=method)
  coarse = accounting.shuffle_local_epsilon(0.5, 10**5, 1e-6, tol=1e-4, method=method)
  assert amp.epsilon <= 0.5 and amp.eps0 == pytest.approx(coarse.eps0, rel=2e-4)
  assert accounting.shuffle_epsilon(4.0, 10**5, 1e-6, tol=1e-15).epsilon == pytest.approx(
      accounting.shuffle_epsilon(4.0, 10**5, 1e-6).epsilon, rel=2e-4)


# ---- clone_pld: the clone pair's PLD, for composing T shuffled releases ----

def clone_joint_direct(n, eps0):
  """The clone pair's joint pmfs over (c, a'), c = 0..n-1, flattened (no windows, no cutoffs)."""
  weights = stats.binom.pmf(np.arange(n), n - 1, math.exp(-eps0))
  pairs = [clone_pair_direct(c, eps0) for c in range(n)]
  return (np.concatenate([w * p for w, (p, _) in zip(weights, pairs)]),
          np.concatenate([w * q for w, (_, q) in zip(weights, pairs)]))


def two_sided_profile(p, q, eps):
  """max(H(P||Q), H(Q||P)) at e^eps, eps of any sign (privacy_profile takes eps >= 0 only)."""
  g = math.exp(eps)
  return max(float(np.sum(np.clip(p - g * q, 0.0, None))), float(np.sum(np.clip(q - g * p, 0.0, None))))


def product(pmf, t):
  out = pmf
  for _ in range(t - 1):
    out = np.outer(out, pmf).ravel()
  return out


@pytest.mark.parametrize("n,eps0", [(6, 0.5), (6, 2.0), (12, 1.0)])
@pytest.mark.parametrize("t", [1, 2, 3])
def test_clone_pld_composed_brackets_the_exact_profile_of_the_product_pair(n, eps0, t):
  # The exact T-fold profile of the clone pair, from its product pmfs (up to 36^3 outcomes). The PLD rounds each
  # loss up by less than one grid step (1e-4), so exact(eps) <= pld(eps) <= exact(eps - T * 1e-4), up to round-off.
  p, q = clone_joint_direct(n, eps0)
  pt, qt = product(p, t), product(q, t)
  pld = accounting.clone_pld(eps0, n)
  pld = pld if t == 1 else pld.self_compose(t)
  for eps in (0.0, 0.1, 0.3, 0.6, 0.9 * eps0 * t):
    got = pld.get_delta_for_epsilon(eps)
    assert accounting.privacy_profile(pt, qt, eps) <= got + 1e-12, eps
    assert got <= two_sided_profile(pt, qt, eps - t * 1e-4) + 1e-11, eps


@pytest.mark.parametrize("k,n", [(2, 5), (3, 4)])
@pytest.mark.parametrize("eps0", [1.0, 3.0])
def test_composed_clone_pld_dominates_two_exact_shuffled_rr_releases(k, n, eps0):
  # Two releases of n shuffled k-ary RR messages, exact (the histograms' product pmf), for every multiset of the
  # other clients' inputs: the profile must stay below the clone pair's PLD composed twice.
  pld = accounting.clone_pld(eps0, n).self_compose(2)
  for others in itertools.combinations_with_replacement(range(k), n - 1):
    p = shuffled_rr_count_pmf(eps0, k, (0,) + others)
    q = shuffled_rr_count_pmf(eps0, k, (1,) + others)
    keys = sorted(set(p) | set(q))
    pa, qa = (np.array([d.get(h, 0.0) for h in keys]) for d in (p, q))
    for eps in (0.0, 0.5 * eps0, eps0, 1.5 * eps0):
      assert accounting.privacy_profile(product(pa, 2), product(qa, 2), eps) <= pld.get_delta_for_epsilon(eps) + 1e-12


@pytest.mark.parametrize("n,eps0", [(1_000, 0.5), (10**5, 2.0), (10**6, 4.0), (60_000, 6.5)])
def test_clone_pld_agrees_with_clone_delta_within_one_grid_step(n, eps0):
  # One release: clone_delta sums the same pair exactly (same window of C), the PLD rounds losses up by < 1e-4
  # and adds the mass of A' beyond 9 standard deviations (about 1e-19) as an infinite loss.
  pld = accounting.clone_pld(eps0, n)
  for eps in (0.0, 0.02, 0.1, 0.3):
    if eps >= eps0:
      continue
    got = pld.get_delta_for_epsilon(eps)
    assert accounting.clone_delta(eps, eps0, n) <= got + 1e-15
    if eps > 0:  # clone_delta takes eps >= 0
      assert got <= accounting.clone_delta(eps - 1e-4, eps0, n) + 1e-15


def test_merged_clone_bins_stay_an_upper_bound_close_to_the_full_window(monkeypatch):
  # Past MAX_CLONE_PLD_POINTS outcomes, consecutive values of C are merged into bins evaluated at their smallest c:
  # the PLD must stay above the full window's, and close to it.
  from jaxdistill.accounting import _shuffle  # pylint: disable=import-outside-toplevel
  n, eps0 = 10**5, 1.0
  full = accounting.clone_pld(eps0, n)
  monkeypatch.setattr(_shuffle, "MAX_CLONE_PLD_POINTS", 2**17)
  _shuffle._clone_pld.cache_clear()  # pylint: disable=protected-access
  try:
    merged = accounting.clone_pld(eps0, n)
  finally:
    _shuffle._clone_pld.cache_clear()  # pylint: disable=protected-access
  assert merged is not full
  for eps in (0.005, 0.01, 0.02):
    a, b = full.get_delta_for_epsilon(eps), merged.get_delta_for_epsilon(eps)
    assert 1e-12 < a <= b <= 1.05 * a, eps
  assert merged.get_delta_for_epsilon(0.02) > full.get_delta_for_epsilon(0.02) * (1 + 1e-9)  # bins were merged


@pytest.mark.parametrize("kwargs,needle", [
    ({"eps0": 0.0, "n": 100}, "eps0"),
    ({"eps0": 61.0, "n": 100}, r"eps0=61.0 <= 60"),
    ({"eps0": 1.0, "n": 0}, "n"),
    ({"eps0": 1.0, "n": 10**13}, r"n=10000000000000 <= 1e\+12"),
    ({"eps0": 1.0, "n": 100, "value_discretization_interval": 0.0}, "value_discretization_interval"),
    ({"eps0": 1.0, "n": 100, "value_discretization_interval": float("nan")}, "value_discretization_interval"),
])
def test_clone_pld_bad_input(kwargs, needle):
  with pytest.raises(ValueError, match=needle):
    accounting.clone_pld(**kwargs)


# ---- releases: T shuffled releases stated together (shuffle_epsilon / shuffle_local_epsilon) ----

@pytest.mark.parametrize("n,eps0", [(6, 2.0), (12, 1.0)])
@pytest.mark.parametrize("t,delta", [(2, 0.05), (3, 0.01)])
def test_releases_epsilon_is_valid_and_tight_for_the_exact_product_pair(n, eps0, t, delta):
  # The exact T-fold pair (product pmfs) meets (eps, delta) at the stated eps, and misses delta a grid step per
  # release (plus one for the search) below it: the composed statement is the clone pair's own, not a loose one.
  amp = accounting.shuffle_epsilon(eps0, n, delta, releases=t)
  assert amp.method == "pld-clone" and amp.releases == t and 0 < amp.epsilon < t * eps0
  p, q = clone_joint_direct(n, eps0)
  pt, qt = product(p, t), product(q, t)
  assert two_sided_profile(pt, qt, amp.epsilon) <= delta
  assert two_sided_profile(pt, qt, amp.epsilon - (t + 1) * 1e-4 - 1e-9) > delta
  statement = amp.statement()
  assert (statement.count, statement.epsilon, statement.delta) == (t, amp.epsilon, delta)


def _mp_rr_composed_epsilon(eps0, t, delta):
  """Exact epsilon at ``delta`` of T randomized-response pairs with losses +-eps0 (the clone pair at n = 1: one
  message, no clones), at 50 digits: B ~ Bin(T, q), q = e^eps0 / (1 + e^eps0), has loss eps0 (2B - T) and
  delta(eps) = sum_b Pr[b] max(0, 1 - e^(eps - loss_b)), decreasing in eps; bisected to 1e-30."""
  import mpmath  # pylint: disable=import-outside-toplevel  (a dependency of dp-accounting)
  ctx = mpmath.mp.clone()
  ctx.dps = 50
  q = ctx.exp(eps0) / (1 + ctx.exp(eps0))
  terms = [(ctx.binomial(t, b) * q**b * (1 - q)**(t - b), eps0 * (2 * b - t)) for b in range(t + 1)]

  def profile(eps):
    return ctx.fsum(pr * (1 - ctx.exp(eps - loss)) for pr, loss in terms if loss > eps)

  lo, hi = ctx.mpf(0), ctx.mpf(eps0 * t)
  while hi - lo > ctx.mpf(10)**-30:
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if profile(mid) <= delta else (mid, hi)
  return hi


@pytest.mark.parametrize("eps0,t", [(5.0, 145), (3.0, 240)])
def test_releases_epsilon_where_dp_accounting_overflows_is_the_pure_bound(eps0, t):
  # dp-accounting's epsilon divides by a mass_lower that is subnormal where the answer's loss is 709-745: at
  # eps0 = 5, n = 1, 145 releases, delta = 1e-3 it returned inf with NumPy's "overflow encountered in scalar
  # divide". Each shuffled release is eps0-DP, so T eps0 = 725 is a valid answer there (exact: 724.9973);
  # (3, 240), just below the overflow (exact 701.88), stays on the PLD, within a grid step per release of exact.
  delta = 1e-3
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    eps = accounting.shuffle_epsilon(eps0, 1, delta, releases=t).epsilon
  exact = float(_mp_rr_composed_epsilon(eps0, t, delta))
  assert exact <= eps <= min(t * eps0, exact + (t + 1) * 1e-4)


@pytest.mark.parametrize("target", [0.05, 1e-3])
def test_releases_small_targets_use_a_finer_grid_and_stay_exact(target):
  # With a fixed 1e-4 loss grid, targets below about T * 1e-4 could not be met at all (every positive loss rounded
  # up to 1e-4); below eps0 = 0.1 the grid is eps0 / 1000. Checked against the exact product pair at n = 6.
  n, t, delta = 6, 2, 1e-6
  amp = accounting.shuffle_local_epsilon(target, n, delta, releases=t)
  assert 0 < amp.epsilon <= target
  p, q = clone_joint_direct(n, amp.eps0)
  assert two_sided_profile(product(p, t), product(q, t), target) <= delta
  p, q = clone_joint_direct(n, amp.eps0 * 1.01)
  assert two_sided_profile(product(p, t), product(q, t), target) > delta
  # Forward, at eps0 = 0.01: valid, and within (T + 1) grid steps of 1e-5 of the exact epsilon.
  fwd = accounting.shuffle_epsilon(0.01, n, delta, releases=t)
  p, q = clone_joint_direct(n, 0.01)
  pt, qt = product(p, t), product(q, t)
  assert two_sided_profile(pt, qt, fwd.epsilon) <= delta < two_sided_profile(pt, qt, fwd.epsilon - (t + 1) * 1e-5)


@pytest.mark.parametrize("k,n", [(2, 5), (3, 4)])
def test_releases_epsilon_covers_two_exact_shuffled_rr_releases(k, n):
  # Real shuffled k-ary randomized response, two releases, every multiset of the other inputs.
  eps0, delta = 2.0, 0.02
  eps = accounting.shuffle_epsilon(eps0, n, delta, releases=2).epsilon
  assert eps < accounting.shuffle_epsilon(eps0, n, delta / 2).epsilon * 2  # tighter than two (eps, delta/2) pairs
  for others in itertools.combinations_with_replacement(range(k), n - 1):
    p = shuffled_rr_count_pmf(eps0, k, (0,) + others)
    q = shuffled_rr_count_pmf(eps0, k, (1,) + others)
    keys = sorted(set(p) | set(q))
    pa, qa = (np.array([d.get(h, 0.0) for h in keys]) for d in (p, q))
    assert accounting.privacy_profile(product(pa, 2), product(qa, 2), eps) <= delta


@pytest.mark.parametrize("target,n,delta,t", [(1.0, 5_000, 1e-5, 2), (1.0, 60_000, 1e-6, 5)])
def test_releases_local_epsilon_is_exact_and_tight_against_an_independent_reference(target, n, delta, t):
  # The reference builds the clone pair outcome by outcome (SciPy) and composes it with dp-accounting's generic
  # PMF route; the largest eps0 must meet the target there, and 1% more must not.
  from tests.labeling.test_budget import reference_clone_delta  # pylint: disable=import-outside-toplevel
  amp = accounting.shuffle_local_epsilon(target, n, delta, releases=t)
  assert amp.method == "pld-clone" and amp.releases == t and target * (1 - 1e-3) < amp.epsilon <= target
  assert reference_clone_delta(amp.eps0, n, t, target) <= delta
  assert reference_clone_delta(amp.eps0 * 1.01, n, t, target) > delta
  # The forward direction at the answer states the same epsilon.
  assert accounting.shuffle_epsilon(amp.eps0, n, delta, releases=t).epsilon == amp.epsilon


def test_releases_local_epsilon_agrees_with_the_labeling_plan():
  # Two routes to the same eps0: the labeling plan searches the per-release (eps_t, delta_t) whose calibrated eps0
  # composes within 0.1% of the total; this bisects on eps0 directly (to 1e-4). The docs quote 5.14 (n = 60,000).
  from jaxdistill import labeling, mechanisms  # pylint: disable=import-outside-toplevel
  n, t = 60_000, 5
  plan = labeling.plan_budget("shuffle-single", 1.0, 1e-6, t, k=1, num_clients=n)
  planned = mechanisms.ShuffleSingleMessage(mechanisms.BsvsShape(4, 2, 1), plan.epsilon_per_iteration,
                                            plan.delta_per_iteration, n).eps0
  direct = accounting.shuffle_local_epsilon(1.0, n, 1e-6, releases=t).eps0
  assert direct * (1 - 5e-3) <= planned <= direct * (1 + 2e-4)
  assert 5.13 < direct < 5.15


# dp-accounting's self_compose bounds its support with SciPy's logsumexp, which overflows harmlessly at n = 1e5.
@pytest.mark.filterwarnings("ignore:overflow encountered in divide:RuntimeWarning")
def test_docs_ten_release_comparison():
  # The docstring, README and privacy_accounting notebook quote, at n = 1e5, eps0 = 4, delta = 1e-6: ten releases
  # composed through the clone pair 0.58, against 2.0 for ten worst-case (eps, delta/20) pairs composed. Both
  # routes are checked against references that share no code with the library (the numbers were only pinned):
  # the clone pair built outcome by outcome from SciPy's binomials and composed by dp-accounting, its pessimistic
  # delta (an upper bound) at the library's epsilon within the target and its optimistic delta (a lower bound) 1%
  # below it beyond; and the pairs' exact optimal composition (a binomial sum).
  from jaxdistill import labeling  # pylint: disable=import-outside-toplevel
  from tests.labeling.test_budget import (  # pylint: disable=import-outside-toplevel
      exact_pairs_epsilon, reference_clone_delta)
  n, eps0, delta = 10**5, 4.0, 1e-6
  ten = accounting.shuffle_epsilon(eps0, n, delta, releases=10).epsilon
  assert reference_clone_delta(eps0, n, 10, ten, grid=2e-5) <= delta
  assert reference_clone_delta(eps0, n, 10, 0.99 * ten, grid=2e-5, pessimistic=False) > delta
  assert 0.575 <= ten < 0.585  # the quoted 0.58
  per_release = accounting.shuffle_epsilon(eps0, n, delta / 20).epsilon
  assert reference_clone_delta(eps0, n, 1, per_release, grid=1e-5) <= delta / 20
  assert reference_clone_delta(eps0, n, 1, 0.99 * per_release, grid=1e-5, pessimistic=False) > delta / 20
  pairs = labeling.compose_pairs_epsilon(per_release, delta / 20, 10, delta)
  exact = exact_pairs_epsilon(per_release, delta / 20, 10, delta)
  assert exact <= pairs <= exact * (1 + 1e-6)
  assert 1.995 <= exact < 2.005  # the quoted 2.0


def test_one_release_keeps_the_single_release_bound():
  one = accounting.shuffle_epsilon(4.0, 10**5, 1e-6, releases=1)
  assert one == accounting.shuffle_epsilon(4.0, 10**5, 1e-6) and one.method == "numeric" and one.releases == 1
  assert one.statement().count == 1 and one.to_dict()["releases"] == 1
  assert accounting.shuffle_local_epsilon(0.5, 10**5, 1e-6, releases=1) == accounting.shuffle_local_epsilon(
      0.5, 10**5, 1e-6)


@pytest.mark.parametrize("call,needle", [
    (lambda: accounting.shuffle_epsilon(1.0, 100, 1e-6, releases=0), "releases=0 >= 1"),
    (lambda: accounting.shuffle_epsilon(1.0, 100, 1e-6, releases=1001), "releases=1001 <= 1000"),
    (lambda: accounting.shuffle_epsilon(1.0, 100, 1e-6, releases=2.5), "releases"),
    (lambda: accounting.shuffle_epsilon(1.0, 100, 1e-6, releases=True), "releases"),
    (lambda: accounting.shuffle_epsilon(1.0, 10**5, 1e-6, releases=2, method="closed-form"),
     "method='numeric' for releases=2"),
    (lambda: accounting.shuffle_local_epsilon(1.0, 10**5, 1e-6, releases=2, method="closed-form"),
     "method='numeric' for releases=2"),
    (lambda: accounting.shuffle_epsilon(1.0, 100, 1e-12, releases=1000), r"delta=1e-12 > 1.4\d*e-11"),
    (lambda: accounting.shuffle_local_epsilon(1.0, 10**13, 1e-6, releases=2), r"n=10000000000000 <= 1e\+12"),
    # target / releases is below the eps0 floor, and eps0 = 1e-9 composes to more than the target:
    (lambda: accounting.shuffle_local_epsilon(1e-9, 1, 3e-11, releases=1000),
     r"No eps0 >= 1e-09 meets target_epsilon=1e-09 over releases=1000 with n=1, delta=3e-11: eps0=1e-09 composes "
     r"to epsilon=8\.9\d*e-08\.$"),
])
def test_releases_bad_input(call, needle):
  with pytest.raises(ValueError, match=needle):
    call()


@pytest.mark.parametrize("eps0", [30.0, 33.0, 37.0])
def test_tiny_clone_probability_gives_no_quantile_warning(eps0):
  # Boost's binomial quantile warned "unable to bracket root" for e^-eps0 below ~1e-12 (n = 1e5); the window it
  # sizes only decides the work, and what lies outside is counted, so the answer stays a bound and nothing warns.
  import warnings  # pylint: disable=import-outside-toplevel
  from jaxdistill.accounting import _shuffle  # pylint: disable=import-outside-toplevel
  _shuffle._clone_window.cache_clear()  # pylint: disable=protected-access
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    amp = accounting.shuffle_epsilon(eps0, 10**5, 1e-6)
  # One message's replacement is seen through at most 1e5 * e^-eps0 < 1e-8 clones: no amplification to speak of.
  assert eps0 - 1e-3 < amp.epsilon <= eps0


def test_releases_inverse_reports_a_target_no_eps0_meets(monkeypatch):
  # Every eps0 down to the floor composes above the target: a clear error after the halvings, not a loop or
  # eps0 = 0. (The composed epsilon is at most releases * eps0, so only a target below releases * 1e-9 meets this
  # for real: test_releases_bad_input.)
  from jaxdistill.accounting import _shuffle  # pylint: disable=import-outside-toplevel
  calls = []
  monkeypatch.setattr(_shuffle, "_composed_epsilon", lambda *args: calls.append(args[0]) or math.inf)
  with pytest.raises(ValueError, match=r"No eps0 >= 1e-09 meets target_epsilon=1.0 over releases=2 with n=100000, "
                                       r"delta=1e-06: eps0=1.86\d*e-09 composes to epsilon=inf\.$"):
    accounting.shuffle_local_epsilon(1.0, 10**5, 1e-6, releases=2)
  assert calls[0] == 0.5 and 1e-9 <= calls[-1] < 2e-9 and len(calls) == 29  # 0.5 / 2^28 ~ 1.9e-9
