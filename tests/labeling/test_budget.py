"""Splitting the total budget over T iterations, checked against independent exact computations."""

import math

import numpy as np
import pytest
from scipy import stats

from jaxdistill import labeling


def exact_dlap_delta(a: float, shifts: int, eps: float) -> float:
  """delta(eps) of `shifts` unit shifts of a discrete Laplace(a), exactly.

  One unit shift has privacy loss +a w.p. 1/(1+e^-a) and -a otherwise (under
  the first distribution), so the composed loss is a(2K - m), K ~ Bin(m, .).
  delta(eps) = E[(1 - e^{eps - L})_+].
  """
  m = shifts
  p = 1.0 / (1.0 + math.exp(-a))
  k = np.arange(m + 1)
  loss = a * (2 * k - m)
  return float(np.sum(stats.binom.pmf(k, m, p) * np.clip(1.0 - np.exp(eps - loss), 0.0, None)))


def exact_pairs_delta(eps: float, delta: float, count: int, eps_total: float) -> float:
  """delta(eps_total) of `count` composed (eps, delta)-DP mechanisms (optimal composition, KOV15).

  The dominating pair reveals the input w.p. delta and else runs binary
  randomized response at eps; enumerating the number l of "wrong" answers:
  1 - (1-delta)^T (1 - sum_l C(T,l) max(0, e^{(T-l)eps} - e^{eps_total} e^{l eps}) / (1+e^eps)^T).
  """
  t = count
  s = sum(math.comb(t, l) * max(0.0, math.exp((t - l) * eps) - math.exp(eps_total + l * eps))
          for l in range(t + 1)) / (1.0 + math.exp(eps)) ** t
  return 1.0 - (1.0 - delta) ** t * (1.0 - s)


@pytest.mark.parametrize("t,k", [(1, 1), (3, 2), (5, 1)])
def test_central_pure_split_adds_up_exactly(t, k):
  plan = labeling.plan_budget("central", 0.3, 0.0, t, k=k)
  assert plan.method == "pure-sum"
  assert plan.epsilon_per_iteration == pytest.approx(0.3 / t, rel=1e-12)
  # The pure epsilon of T releases, each shifting 2k entries by one under DLap(a): T * 2k * a.
  assert t * 2 * k * plan.noise_parameter == pytest.approx(0.3, rel=1e-12)
  assert plan.composed_epsilon == pytest.approx(0.3, rel=1e-12) and plan.composed_delta == 0.0


@pytest.mark.parametrize("t,k", [(3, 1), (10, 5)])
def test_central_with_delta_meets_target_exactly_and_tightly(t, k):
  eps, delta = 1.0, 1e-5
  plan = labeling.plan_budget("central", eps, delta, t, k=k)
  assert plan.method == "pld"
  a = plan.noise_parameter
  assert plan.epsilon_per_iteration == pytest.approx(2 * k * a, rel=1e-12)
  shifts = t * 2 * k
  # Private: the exact delta at the target epsilon is within the budget ...
  assert exact_dlap_delta(a, shifts, eps) <= delta
  # ... and the calibration is tight (rtol 1e-3 bisection; 2% less noise breaks the target).
  assert exact_dlap_delta(a * 1.02, shifts, eps) > delta
  # Spending delta never costs noise; with many unit shifts (T*2k = 100) it buys a lot, with
  # few (6) the largest loss itself has mass far above delta and nothing is gained.
  gain = plan.epsilon_per_iteration / (eps / t)
  assert gain > 2.0 if t * k >= 50 else gain == pytest.approx(1.0, rel=2e-3)


def test_central_laplace_with_delta_is_private_by_quadrature():
  eps, delta, t, k = 1.0, 1e-5, 4, 2
  plan = labeling.plan_budget("central", eps, delta, t, k=k, central_noise="laplace")
  b = plan.noise_parameter  # Laplace scale of each entry
  m = t * 2 * k
  # Loss of one unit shift of Lap(b): (|x-1| - |x|)/b, x ~ Lap(b); compose by sampling-free convolution
  # on a fine grid of x (independent of dp-accounting).
  x = np.linspace(-40 * b, 40 * b, 400_001)
  dens = np.exp(-np.abs(x) / b) / (2 * b)
  w = dens * (x[1] - x[0])
  loss = (np.abs(x - 1) - np.abs(x)) / b
  bins = np.round(loss / 1e-3).astype(int)
  lo = bins.min()
  single = np.bincount(bins - lo, weights=w)
  total = single
  for _ in range(m - 1):
    total = np.convolve(total, single)
  values = (np.arange(total.size) + m * lo) * 1e-3
  got = float(np.sum(total * np.clip(1 - np.exp(eps - values), 0, None)))
  assert got <= delta * 1.05  # grid rounding of the loss (1e-3) moves delta by far less than 5%
  assert plan.epsilon_per_iteration > eps / t


@pytest.mark.parametrize("mech", ["shuffle-single", "shuffle-multi"])
@pytest.mark.parametrize("t", [2, 4])
def test_shuffle_pairs_composition_matches_optimal_composition(mech, t):
  eps, delta = 1.0, 1e-6
  plan = labeling.plan_budget(mech, eps, delta, t, k=1)
  assert plan.method == "pld-of-pairs"
  assert plan.delta_per_iteration == pytest.approx(delta / (2 * t))
  e = plan.epsilon_per_iteration
  assert exact_pairs_delta(e, plan.delta_per_iteration, t, eps) <= delta
  assert exact_pairs_delta(e * 1.02, plan.delta_per_iteration, t, eps) > delta  # tight
  assert e >= eps / t  # never worse than basic composition
  assert labeling.compose_pairs_epsilon(e, plan.delta_per_iteration, t, delta) <= eps


def test_shuffle_single_iteration_is_the_target():
  plan = labeling.plan_budget("shuffle-single", 0.7, 1e-7, 1, k=1)
  assert (plan.epsilon_per_iteration, plan.delta_per_iteration) == (0.7, 1e-7)


@pytest.mark.parametrize("mech", ["local-rr", "local-collision"])
def test_local_is_a_pure_sum(mech):
  plan = labeling.plan_budget(mech, 0.4, 0.0, 4, k=1)
  assert plan.epsilon_per_iteration == pytest.approx(0.1) and plan.composed_epsilon == pytest.approx(0.4)
  assert plan.delta_per_iteration == 0.0 and plan.method == "pure-sum"


def test_none_is_not_private():
  plan = labeling.plan_budget("none", math.inf, 0.0, 2, k=1)
  assert math.isinf(plan.composed_epsilon) and plan.method == "none"


@pytest.mark.parametrize("args,match", [
    (("central", -1.0, 0.0, 1), "epsilon"),
    (("central", 1.0, 1.5, 1), "delta"),
    (("central", 1.0, 0.0, 0), "iterations"),
    (("shuffle-single", 1.0, 0.0, 1), "delta"),
    (("bogus", 1.0, 0.0, 1), "mechanism"),
])
def test_bad_budget_arguments(args, match):
  with pytest.raises(ValueError, match=match):
    labeling.plan_budget(*args, k=1)


def test_compose_pairs_count_is_bounded():
  # The composed PLD's support grows linearly in the count: 10^6 pairs needed about 29 GiB.
  with pytest.raises(ValueError, match="count=10001 <= 10000"):
    labeling.compose_pairs_epsilon(0.1, 1e-9, 10_001, 1e-6)
  with pytest.raises(ValueError, match="epsilon"):
    labeling.compose_pairs_epsilon("0.1", 1e-9, 2, 1e-6)


@pytest.mark.parametrize("mechanism", ["central", "shuffle-single", "shuffle-multi"])
@pytest.mark.parametrize("eps,t", [(1.0, 3), (0.5, 3), (2.0, 3), (1.0, 6), (0.3, 7)])
def test_every_split_is_found_and_meets_the_total(mechanism, eps, t):
  # dp-accounting's pessimistic grid rounds losses up; before the pure / basic-composition caps,
  # T = 3 at delta = 1e-6 raised "Could not split" (shuffle) or "Could not verify" (central).
  delta = 1e-6
  plan = labeling.plan_budget(mechanism, eps, delta, t, k=1)
  assert plan.composed_epsilon <= eps and plan.composed_delta <= delta
  # At least as good as basic composition, which is always available.
  assert plan.epsilon_per_iteration >= eps / t * (1 - 1e-12)
  if mechanism == "central":
    assert exact_dlap_delta(plan.noise_parameter, t * 2, eps) <= delta
  else:
    assert exact_pairs_delta(plan.epsilon_per_iteration, plan.delta_per_iteration, t, eps) <= delta
