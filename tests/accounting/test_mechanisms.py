"""dp-accounting wrappers checked against closed forms and exact pmfs."""

import itertools
import math
import warnings

import dp_accounting
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from jaxdistill import accounting


def laplace_delta(eps, mu):
  """Exact delta(eps) of one Laplace release with sensitivity/scale = mu."""
  return max(0.0, 1 - math.exp((eps - mu) / 2))


def analytic_gaussian_delta(eps, mu):
  """Balle & Wang (2018) Thm 8: delta(eps) for a Gaussian with Delta/sigma = mu."""
  return stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)


@pytest.mark.parametrize("scale,sens", [(1.0, 1.0), (2.0, 1.0), (40.0, 2.0), (0.5, 2.0)])
def test_laplace_single_release_epsilon_is_sensitivity_over_scale(scale, sens):
  acct = accounting.laplace(scale, sensitivity=sens, relation="replace-one")
  assert acct.epsilon(0.0) == sens / scale  # exact pure DP
  # The PLD is a pessimistic grid with step 1e-4: within one step of the truth.
  assert sens / scale - 1e-9 <= acct.epsilon(1e-12) <= sens / scale + 2e-4
  for eps in (0.0, 0.25 * sens / scale, 0.9 * sens / scale):
    assert acct.delta(eps) == pytest.approx(laplace_delta(eps, sens / scale), abs=2e-4)


@pytest.mark.parametrize("scale", [1.0, 0.4])
@pytest.mark.parametrize("delta", [1.3942515363025932e-15, 1e-13, 1e-12, 1e-9])
def test_one_laplace_release_epsilon_is_never_below_the_exact_one(scale, delta):
  # One Laplace(b) release of sensitivity 1 has delta(eps) = 1 - exp((eps - 1/b)/2) below 1/b, so the exact
  # epsilon is 1/b + 2 ln(1 - delta), here in 40 digits. dp-accounting's float64 evaluation put the reported
  # epsilon 1-3 ulps below it (no round-off allowance for one release): at delta = 1.39e-15 the true delta was
  # 1.075 times the one asked for.
  import decimal  # pylint: disable=import-outside-toplevel
  ctx = decimal.Context(prec=40)
  r = ctx.divide(decimal.Decimal(1), decimal.Decimal(scale))
  exact = r + 2 * ctx.ln(1 - decimal.Decimal(delta))
  got = accounting.laplace(scale, sensitivity=1.0, relation="replace-one").epsilon(delta)
  assert decimal.Decimal(got) >= exact and got <= float(exact) + 1e-12


@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
@pytest.mark.parametrize("count", [1, 10, 1000, 100_000])
@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_gaussian_composition_matches_analytic(count, eps, relation):
  # ``sensitivity`` is the shift under the stated relation, so both relations give the same curve
  # (dp-accounting's own REPLACE_ONE would shift by 2 x sensitivity: 6.8e-3 instead of 2.9e-6 at
  # sigma = 4, eps = 1).
  sigma = 3.0 * math.sqrt(count)  # T-fold sigma = one Gaussian with sigma/sqrt(T) = 3
  acct = accounting.gaussian(sigma, sensitivity=1.0, relation=relation, count=count)
  want = analytic_gaussian_delta(eps, math.sqrt(count) / sigma)
  got = acct.delta(eps)
  # An upper bound, within 0.1% of the exact analytic value whatever the count: T releases are accounted as the one
  # Gaussian they make (the one-release PLD composed T times drifted up with T).
  assert want * (1 - 1e-9) <= got <= want * 1.001 + 1e-12


def rr_pmf(eps0, k, x):
  p = np.full(k, 1 / (math.exp(eps0) + k - 1))
  p[x] = math.exp(eps0) / (math.exp(eps0) + k - 1)
  return p


@given(st.floats(0.1, 4.0), st.integers(2, 5), st.integers(1, 3), st.floats(0.0, 4.0))
def test_randomized_response_against_exact_pmf(eps0, k, count, eps):
  acct = accounting.randomized_response(eps0, num_buckets=k, count=count)
  # The worst replace-one pair: every one of the T releases sees input 0 vs 1.
  p1, q1 = rr_pmf(eps0, k, 0), rr_pmf(eps0, k, 1)
  p = np.array([np.prod(o) for o in itertools.product(p1, repeat=count)])
  q = np.array([np.prod(o) for o in itertools.product(q1, repeat=count)])
  exact = accounting.privacy_profile(p, q, eps)
  got = acct.delta(eps)
  # Exact on its lattice: only float round-off and the composition's round-off allowance separate the two.
  assert exact - 1e-12 <= got <= exact * (1 + 1e-9) + acct.count * accounting.FFT_ROUNDOFF_PER_RELEASE + 1e-12


# (2.0, 100, .): a shift of 100 with a = 2, whose lattice PMF moves its tail z > 34 (mass < 1e-30) up to z = 34.
@pytest.mark.parametrize("a,sens,eps", [(0.5, 1, 0.2), (0.1, 2, 0.1), (1.0, 3, 1.5), (2.0, 100, 10.0),
                                        (2.0, 100, 150.0)])
def test_discrete_laplace_against_exact_pmf(a, sens, eps):
  z = np.arange(-400, 401)
  base = (1 - math.exp(-a)) / (1 + math.exp(-a)) * np.exp(-a * np.abs(z))
  # Output grid covers both; the truncated mass (< 1e-17) is negligible here.
  p = np.concatenate([base, np.zeros(sens)])
  q = np.concatenate([np.zeros(sens), base])
  exact = accounting.privacy_profile(p, q, eps)
  acct = accounting.discrete_laplace(a, sensitivity=sens, relation="add-remove")
  assert exact - 1e-12 <= acct.delta(eps) <= exact * (1 + 1e-9) + 1e-12  # exact on the lattice a·Z
  assert acct.epsilon(0.0) == pytest.approx(a * sens)


def lattice_delta(eps, unit, count, p_plus, p_minus):
  """Exact delta(eps) of ``count`` releases whose loss is +unit (p_plus), -unit (p_minus) or 0 (the rest).

  The composed loss is unit * (A - B) with (A, B) the first two counts of a multinomial: summed in log space
  over B + B' = m (binomial in the count) and A given m (binomial), independently of the library.
  """
  q = p_plus + p_minus
  total = 0.0
  for m in range(count + 1) if q < 1 else [count]:
    log_m = stats.binom.logpmf(m, count, q) if q < 1 else 0.0
    a = np.arange(m + 1)
    loss = unit * (2 * a - m)
    keep = loss > eps
    log_p = log_m + stats.binom.logpmf(a[keep], m, p_plus / q)
    total += float(np.sum(np.exp(log_p) * -np.expm1(eps - loss[keep])))
  return total


def lattice_epsilon(delta, unit, count, p_plus, p_minus):
  lo, hi = 0.0, unit * count
  for _ in range(80):
    mid = 0.5 * (lo + hi)
    lo, hi = (lo, mid) if lattice_delta(mid, unit, count, p_plus, p_minus) <= delta else (mid, hi)
  return hi


@pytest.mark.parametrize("eps0,count,old", [(0.01, 10**5, 24.32), (0.05, 20000, 58.88)])
def test_binary_randomized_response_over_many_releases_matches_the_binomial(eps0, count, old):
  # The old 1e-4 grid rounded eps0 = 0.01 up to 101 steps, so T = 10^5 releases drifted: epsilon(1e-6) was
  # 24.32 against the exact 19.42 (T = 10^6: 146.2 against 96.7; eps0 = 0.05, T = 20,000: 58.88 against 57.82).
  # On the lattice eps0·Z nothing is rounded; the FFT's round-off moved delta(eps) by 1.2e-6 relative here.
  keep = math.exp(eps0) / (1 + math.exp(eps0))
  acct = accounting.randomized_response(eps0, num_buckets=2, count=count)
  exact = lattice_epsilon(1e-6, eps0, count, keep, 1 - keep)
  assert exact <= acct.epsilon(1e-6) <= exact * (1 + 1e-4) < old
  for eps in (0.5 * exact, exact):
    want = lattice_delta(eps, eps0, count, keep, 1 - keep)
    assert want * (1 - 1e-9) <= acct.delta(eps) <= want * (1 + 1e-5) + count * accounting.FFT_ROUNDOFF_PER_RELEASE


@pytest.mark.parametrize("case", ["rr-k3", "rr-k10", "dlap-sens1", "dlap-sens2"])
def test_three_point_lattices_match_the_multinomial(case):
  # K-ary RR: loss +eps0 (output x), -eps0 (output x'), 0 (the K - 2 others). Discrete Laplace with a shift of
  # Delta = 1 is binary RR with eps0 = a; with Delta = 2 its loss is +2a (z <= 0), 0 (z = 1), -2a (z >= 2).
  # On the old 1e-4 grid the four epsilons were 4e-4 to 8e-4 above the exact ones (relative).
  count = 300
  if case.startswith("rr"):
    k, eps0 = int(case[4:]), 0.2
    acct = accounting.randomized_response(eps0, num_buckets=k, count=count)
    unit, p_plus, p_minus = eps0, math.exp(eps0) / (math.exp(eps0) + k - 1), 1 / (math.exp(eps0) + k - 1)
  else:
    a, sens = 0.15, int(case[-1])
    acct = accounting.discrete_laplace(a, sensitivity=sens, relation="replace-one", count=count)
    unit, p_plus, p_minus = a * sens, 1 / (1 + math.exp(-a)), math.exp(-a * sens) / (1 + math.exp(-a))
  exact = lattice_epsilon(1e-5, unit, count, p_plus, p_minus)
  assert exact <= acct.epsilon(1e-5) <= exact * (1 + 1e-6)
  for eps in (0.0, 0.5 * exact, exact):
    want = lattice_delta(eps, unit, count, p_plus, p_minus)
    assert want * (1 - 1e-9) <= acct.delta(eps) <= want * (1 + 1e-6) + count * accounting.FFT_ROUNDOFF_PER_RELEASE


def test_dp_event_matches_dp_accounting_accountant():
  acct = accounting.laplace(20.0, sensitivity=2.0, relation="add-remove", count=20)
  pld = dp_accounting.pld.PLDAccountant()
  pld.compose(acct.dp_event())
  assert acct.epsilon(1e-5) == pytest.approx(pld.get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize("count", [1, 3])
def test_randomized_response_event_counts_every_release(count):
  # dp-accounting 0.6.0's PLDAccountant ignores SelfComposedDpEvent's count for randomized response
  # (it reports one release's epsilon): the event must list the releases. Both of dp-accounting's
  # accountants must agree with the account, and T-fold RR at eps0 is T eps0-DP exactly.
  acct = accounting.randomized_response(1.0, num_buckets=4, count=count)
  rel = dp_accounting.NeighboringRelation.REPLACE_ONE
  pld = dp_accounting.pld.PLDAccountant(rel)
  pld.compose(acct.dp_event())
  rdp = dp_accounting.rdp.RdpAccountant(neighboring_relation=rel)
  rdp.compose(acct.dp_event())
  assert acct.epsilon(1e-6) == pytest.approx(pld.get_epsilon(1e-6), rel=1e-3)
  assert acct.epsilon(0.0) == pytest.approx(count * 1.0)
  assert count * 0.99 < pld.get_epsilon(1e-6) <= rdp.get_epsilon(1e-6) + 1e-9


@pytest.mark.parametrize("eps0", [700.0, 709.0, 710.0, 800.0])
def test_randomized_response_epsilon0_is_capped_before_overflow(eps0):
  # e^eps0 overflows float64 from ~709.8: the account refuses eps0 above MAX_RR_EPSILON0 with a ValueError.
  if eps0 <= accounting.MAX_RR_EPSILON0:
    assert accounting.randomized_response(eps0, num_buckets=2).epsilon(0.0) == pytest.approx(eps0)
  else:
    with pytest.raises(ValueError, match=f"epsilon0={eps0!r} <= 700"):
      accounting.randomized_response(eps0, num_buckets=2)
    with pytest.raises(ValueError, match="target_epsilon"):
      accounting.calibrate("randomized-response", target_epsilon=eps0, target_delta=1e-6,
                           relation="replace-one", num_buckets=2)


def test_randomized_response_calibration_near_the_cap():
  # The bracket stops at the cap; a target the cap already meets gets the cap.
  acct = accounting.calibrate("randomized-response", target_epsilon=699.0, target_delta=1e-6,
                              relation="replace-one", num_buckets=2)
  assert acct.epsilon(1e-6) <= 699.0 and acct.parameter <= accounting.MAX_RR_EPSILON0


def composed_laplace_loss(mu, count, step, up):
  """Privacy-loss pmf of `count` Laplace releases, each shifted by mu scales, on the grid step * Z.

  One release's loss (under the first distribution) has atoms +mu (mass 1/2) and -mu (mass
  e^{-mu}/2) and the density e^{-(mu - l)/2} / 4 on (-mu, mu) (as laplace_delta integrates).
  Each grid cell's exact mass goes to its upper end (``up``: the loss is rounded up, so every
  delta(eps) computed from it is an upper bound) or lower end (a lower bound). Composed by FFT.
  Returns (loss values, pmf).
  """
  k = int(round(mu / step))
  assert abs(k * step - mu) < 1e-12 * mu  # the atoms sit on the grid
  edges = np.arange(-k, k + 1) * step
  cells = 0.5 * np.diff(np.exp(-(mu - edges) / 2))  # mass of (edges[j], edges[j + 1])
  single = np.zeros(2 * k + 1)
  single[1:] += cells if up else 0.0
  single[:-1] += 0.0 if up else cells
  single[-1] += 0.5
  single[0] += 0.5 * math.exp(-mu)
  size = count * 2 * k + 1
  nfft = 1 << (size - 1).bit_length()
  pmf = np.clip(np.fft.irfft(np.fft.rfft(single, nfft) ** count, nfft)[:size], 0.0, None)
  return (np.arange(size) - count * k) * step, pmf


def delta_from_loss(values, pmf, eps):
  """delta(eps) = E[(1 - e^{eps - L})_+]."""
  return float(np.sum(pmf * np.clip(-np.expm1(eps - values), 0.0, None)))


def epsilon_from_loss(values, pmf, delta):
  """Smallest eps with delta(eps) <= delta, by bisection (delta(eps) falls in eps)."""
  lo, hi = 0.0, float(values[-1])
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if delta_from_loss(values, pmf, mid) > delta else (lo, mid)
  return hi


def test_composed_laplace_loss_brackets_the_closed_form():
  # The reference itself: mass 1, and one release brackets laplace_delta.
  for up in (True, False):
    values, pmf = composed_laplace_loss(0.05, 20, 1e-5, up)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12) and values[-1] == pytest.approx(20 * 0.05)
  assert pmf[-1] == pytest.approx(0.5**20, rel=1e-9)  # rounded down: every release at its atom +mu
  (vu, pu), (vd, pd) = (composed_laplace_loss(0.05, 1, 1e-5, up) for up in (True, False))
  for eps in (0.0, 0.01, 0.04):
    assert delta_from_loss(vd, pd, eps) <= laplace_delta(eps, 0.05) <= delta_from_loss(vu, pu, eps)


def test_laplace_composition_against_an_independent_loss_convolution():
  # spec/NFDP.md §3 (a): k=10, r=1, b=400, T=20, a shift of 2kr = 20 per release: mu = 20/400 = 0.05.
  # The reference composes the exact loss law on a grid of 1e-5, rounding up (upper bound) and down
  # (lower bound); the true values lie in between (delta(0.5) in [9.35618e-4, 9.35675e-4], eps(1e-5)
  # in [0.768901, 0.768904]; the spec's rounded 0.769 and 9.4e-4 agree).
  acct = accounting.laplace(400.0, sensitivity=20.0, relation="replace-one", count=20)
  up, down = composed_laplace_loss(0.05, 20, 1e-5, True), composed_laplace_loss(0.05, 20, 1e-5, False)
  # dp-accounting's pessimistic PLD (grid 1e-4) is an upper bound: never below the lower bound, and
  # within 1e-3 (relative) of the upper one.
  d_lo, d_hi = delta_from_loss(*down, 0.5), delta_from_loss(*up, 0.5)
  assert d_lo <= acct.delta(0.5) <= d_hi * (1 + 1e-3)
  e_lo, e_hi = epsilon_from_loss(*down, 1e-5), epsilon_from_loss(*up, 1e-5)
  assert e_lo - 1e-12 <= acct.epsilon(1e-5) <= e_hi * (1 + 1e-3)


@pytest.mark.parametrize("mechanism,kwargs", [
    ("laplace", dict(sensitivity=2.0, relation="replace-one", count=20)),
    ("discrete-laplace", dict(sensitivity=2, relation="replace-one", count=20)),
    ("gaussian", dict(sensitivity=1.0, relation="add-remove", count=50)),
    ("gaussian", dict(sensitivity=2.0, relation="replace-one", count=50)),
    ("randomized-response", dict(relation="replace-one", count=10, num_buckets=2)),
])
def test_calibration_is_tight_and_verified(mechanism, kwargs):
  target_eps, target_delta = 1.0, 1e-5
  acct = accounting.calibrate(mechanism, target_epsilon=target_eps, target_delta=target_delta,
                              rtol=1e-3, **kwargs)
  assert acct.epsilon(target_delta) <= target_eps
  # 1% less noise must break the target (the bracket is tight).
  less = acct.parameter * (0.99 if mechanism in ("laplace", "gaussian") else 1.01)
  other = accounting.MechanismAccount(acct.mechanism, less, acct.sensitivity, acct.relation,
                                      acct.count, acct.num_buckets)
  assert other.epsilon(target_delta) > target_eps
  assert acct.statement(delta=target_delta).relation.value == kwargs["relation"]


def test_gaussian_calibration_at_1e5_compositions_matches_analytic():
  # spec §3: explicit bracket gives z = 1179.73, the analytic value.
  acct = accounting.calibrate("gaussian", target_epsilon=1.0, target_delta=1e-5,
                              relation="add-remove", count=100_000, rtol=1e-4)
  analytic = math.sqrt(1e5) * dp_accounting.get_sigma_gaussian(1.0, 1e-5)
  assert analytic == pytest.approx(1179.73, rel=1e-4)
  assert acct.parameter == pytest.approx(analytic, rel=2e-4)


@pytest.mark.parametrize("eps,delta,count", [(1.0, 1e-20, 1), (0.05, 1e-6, 3), (20.0, 1e-5, 100), (0.3, 1e-8, 2)])
def test_gaussian_calibration_is_within_rtol_of_the_exact_least_sigma(eps, delta, count):
  # calibrate starts from the exact least sigma of the closed form (no PLD below it): the answer must meet the
  # target at 50 digits, and the least sigma that does must lie within rtol below it (bisected here at 50 digits).
  # (At an epsilon near the PLD's grid step, 1e-4, the accountant's own least sigma is further up: not a case here.)
  rtol = 1e-3
  acct = accounting.calibrate("gaussian", target_epsilon=eps, target_delta=delta, relation="replace-one",
                              count=count, rtol=rtol)
  scale = math.sqrt(count)
  assert acct.epsilon(delta) <= eps and float(_mp_gaussian_delta(eps, scale / acct.parameter)) <= delta
  lo, hi = acct.parameter / 4, acct.parameter  # sigma: lo fails, hi meets
  assert float(_mp_gaussian_delta(eps, scale / lo)) > delta
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if float(_mp_gaussian_delta(eps, scale / mid)) <= delta else (mid, hi)
  assert hi <= acct.parameter <= hi * (1 + 2 * rtol)


def _mp_laplace_delta(eps, scale, sens):
  """Hockey-stick divergence of Lap(0, b) over Lap(sens, b) at eps, by 50-digit quadrature (no closed form)."""
  import mpmath  # pylint: disable=import-outside-toplevel  (a dependency of dp-accounting)
  with mpmath.workdps(50):
    b, d = mpmath.mpf(scale), mpmath.mpf(sens)
    p = lambda x: mpmath.exp(-abs(x) / b) / (2 * b)  # pylint: disable=unnecessary-lambda-assignment
    q = lambda x: mpmath.exp(-abs(x - d) / b) / (2 * b)  # pylint: disable=unnecessary-lambda-assignment
    cut = (d - b * eps) / 2  # p = e^eps q there, when it lies in [0, d]
    points = sorted({mpmath.mpf(0), d, min(max(cut, 0), d)})
    return mpmath.quad(lambda x: max(0, p(x) - mpmath.exp(eps) * q(x)), [-mpmath.inf, *points, mpmath.inf])


@pytest.mark.parametrize("eps,delta,sens", [(1.0, 1e-6, 1.0), (0.1, 1e-3, 2.0), (5.0, 1e-9, 1.0)])
def test_laplace_calibration_of_one_release_is_within_rtol_of_the_least_scale(eps, delta, sens):
  # One Laplace release with delta > 0 starts from its exact least scale (it bisected from T Delta / eps with
  # about 11 PLD builds: 235 s at eps = 1000). The answer must meet the target by quadrature, and a scale
  # 2 rtol smaller must not.
  rtol = 1e-3
  acct = accounting.calibrate("laplace", target_epsilon=eps, target_delta=delta, relation="add-remove",
                              sensitivity=sens, rtol=rtol)
  assert acct.epsilon(delta) <= eps and float(_mp_laplace_delta(eps, acct.parameter, sens)) <= delta
  assert float(_mp_laplace_delta(eps, acct.parameter / (1 + 2 * rtol), sens)) > delta


def test_gaussian_calibration_below_the_pld_floor_is_refused_by_name(monkeypatch):
  # After 2 PLD checks: the first upper end, then the largest (2x); the 5 ends between them were also built
  # (7 builds: about 140 s for FedMD-LDP at epsilon 5e-324, delta 1e-5).
  checks = []
  epsilon = accounting.MechanismAccount.epsilon
  monkeypatch.setattr(accounting.MechanismAccount, "epsilon", lambda self, d: checks.append(d) or epsilon(self, d))
  with pytest.raises(ValueError, match=r"Could not verify a private starting point for gaussian at "
                                       r"target_epsilon=1.0, target_delta=1e-30: .* certifies no delta this small"):
    accounting.calibrate("gaussian", target_epsilon=1.0, target_delta=1e-30, relation="replace-one")
  assert checks == [1e-30, 1e-30]


def test_the_gaussian_account_does_not_drift_over_1e5_releases():
  # FedMD-LDP at the paper's T = 5000 queries x 20 rounds, one-hot releases (Delta = sqrt 2). The one-release PLD
  # composed 10^5 times rounded every release's loss up one grid step: epsilon(1e-4) came out 0.1004 against the
  # exact 0.0946, and a calibration to (0.1, 1e-4) was refused as "no delta this small".
  sigma, sens, count = 11508.4, math.sqrt(2), 10**5
  mu = math.sqrt(count) * sens / sigma
  lo, hi = 0.0, 1.0  # the exact epsilon at delta = 1e-4, by bisection on the closed form
  for _ in range(60):
    lo, hi = (lo, (lo + hi) / 2) if analytic_gaussian_delta((lo + hi) / 2, mu) <= 1e-4 else ((lo + hi) / 2, hi)
  got = accounting.gaussian(sigma, sensitivity=sens, relation="add-remove", count=count).epsilon(1e-4)
  assert hi * (1 - 1e-9) <= got <= hi + 1e-4  # at most one grid step above the exact value
  calibrated = accounting.calibrate("gaussian", target_epsilon=0.1, target_delta=1e-4, relation="add-remove",
                                    sensitivity=sens, count=count, value_discretization_interval=1e-4)
  mu = math.sqrt(count) * sens / calibrated.parameter
  assert analytic_gaussian_delta(0.1, mu) <= 1e-4 < analytic_gaussian_delta(0.1, mu * 1.002)  # the least sigma


def test_tiny_noise_large_count_stays_bounded():
  # Without the grid cap this PLD would need ~1e11 points (T * 20 / 1e-4).
  acct = accounting.laplace(0.05, sensitivity=1.0, relation="add-remove", count=100_000)
  assert acct.grid_interval() > 1e-4
  eps = acct.epsilon(1e-5)
  mean_loss = 1e5 * (20 - 1 + math.exp(-20))
  assert 0.9 * mean_loss <= eps <= acct.pure_epsilon() * (1 + 1e-6)


def test_relation_is_explicit_and_recorded():
  with pytest.raises(TypeError):
    accounting.laplace(1.0, sensitivity=1.0)  # relation is required
  st_ = accounting.laplace(1.0, sensitivity=1.0, relation="add-remove").statement(delta=1e-6)
  assert st_.to_dict()["relation"] == "add-remove"
  with pytest.raises(ValueError, match="relation"):
    accounting.randomized_response(1.0, num_buckets=2, relation="add-remove")


@pytest.mark.parametrize("call,name", [
    (lambda: accounting.laplace(0.0, sensitivity=1, relation="add-remove"), "scale"),
    (lambda: accounting.laplace(1.0, sensitivity=float("nan"), relation="add-remove"), "sensitivity"),
    (lambda: accounting.gaussian(1.0, sensitivity=1, relation="add-remove", count=2.5), "count"),
    (lambda: accounting.discrete_laplace(1.0, sensitivity=1.5, relation="add-remove"), "sensitivity"),
    (lambda: accounting.laplace(1.0, sensitivity=1, relation="add-remove").epsilon(1.5), "delta"),
    (lambda: accounting.laplace(1.0, sensitivity=1, relation="add-remove").delta(-1), "epsilon"),
    (lambda: accounting.calibrate("laplace", target_epsilon=0, target_delta=1e-5,
                                  relation="add-remove"), "target_epsilon"),
    (lambda: accounting.calibrate("gaussian", target_epsilon=1, target_delta=0.0,
                                  relation="add-remove"), "target_delta"),
    (lambda: accounting.calibrate("poisson", target_epsilon=1, target_delta=1e-5,
                                  relation="add-remove"), "mechanism"),
])
def test_bad_input(call, name):
  with pytest.raises(ValueError, match=name):
    call()


@pytest.mark.parametrize("mechanism,parameter,count", [
    ("discrete-laplace", 1 / 6, 6), ("discrete-laplace", 0.1 / 3, 3), ("laplace", 6.0, 6),
    ("randomized-response", 1 / 3, 3)])
def test_pld_never_reports_more_than_the_exact_pure_epsilon(mechanism, parameter, count):
  # The pessimistic grid rounds every loss up by up to one step (1e-4). When T x (largest loss) is not
  # a grid multiple, the PLD alone put eps(1e-6) at 1.00016 for six unit shifts of DLap(1/6), whose
  # exact pure epsilon is 1.0, and made calibrate() reject its own pure-DP starting point.
  kwargs = dict(num_buckets=2) if mechanism == "randomized-response" else dict(sensitivity=1)
  acct = accounting.MechanismAccount(mechanism, parameter, 1, accounting.Relation.REPLACE_ONE, count,
                                     kwargs.get("num_buckets"))
  pure = count * (parameter if mechanism != "laplace" else 1 / parameter)
  assert acct.pure_epsilon() == pytest.approx(pure, rel=1e-12)
  for d in (1e-9, 1e-6, 1e-3):
    assert acct.epsilon(d) <= acct.pure_epsilon()
  assert acct.delta(acct.pure_epsilon()) == 0.0
  # Below the pure epsilon the PLD still answers, as an upper bound of the exact binomial profile.
  if mechanism == "discrete-laplace":
    p = 1 / (1 + math.exp(-parameter))
    k = np.arange(count + 1)
    loss = parameter * (2 * k - count)
    eps = 0.5 * pure
    exact = float(np.sum(stats.binom.pmf(k, count, p) * np.clip(1 - np.exp(eps - loss), 0, None)))
    assert exact - 1e-12 <= acct.delta(eps) <= exact + 1e-3
  # calibrate() starts from the pure-DP end; it must verify it (it raised before the cap).
  target = acct.pure_epsilon()
  cal = accounting.calibrate(mechanism, target_epsilon=target, target_delta=1e-6, count=count,
                             relation="replace-one", **kwargs)
  assert cal.epsilon(1e-6) <= target


def test_tiny_noise_gives_the_pure_epsilon_and_a_delta_of_at_most_one():
  # Laplace(b = 0.001) with sensitivity 1: e^1000 overflows, so the PLD answered inf; a shift of 1000
  # scales gave delta(1) = 1 + 4e-12, above any probability. A grid step of 0.01 shows both failures in
  # 0.4 s (the default 1e-4 shows them too, with 2e7 grid points and about a minute).
  tiny = accounting.laplace(0.001, sensitivity=1, relation="replace-one", value_discretization_interval=0.01)
  assert tiny.pld().get_epsilon_for_delta(1e-5) == math.inf  # the failure is really there...
  assert tiny.epsilon(1e-5) == 1000.0  # ... and the pure epsilon caps it
  wide = accounting.laplace(1.0, sensitivity=1000, relation="replace-one", value_discretization_interval=0.01)
  assert wide.pld().get_delta_for_epsilon(1.0) > 1.0
  d = wide.delta(1.0)
  assert 1.0 - 1e-9 <= d <= 1.0  # exact: 1 - e^{(1 - 1000)/2}


@pytest.mark.parametrize("args,name", [
    (("laplace", -1.0, 1.0), "scale"),  # returned pure_epsilon() = -1.0
    (("laplace", 1.0, 0.0), "sensitivity"),
    (("gaussian", float("nan"), 1.0), "sigma"),
    (("foo", 1.0, 1.0), "mechanism"),  # was silently accounted as randomized response
    (("discrete-laplace", 1.0, 1.5), "sensitivity"),
    (("randomized-response", 1.0, 2.0), "sensitivity"),
])
def test_mechanism_account_validates_its_fields(args, name):
  with pytest.raises(ValueError, match=name):
    accounting.MechanismAccount(*args, accounting.Relation.REPLACE_ONE, 1,
                                2 if args[0] == "randomized-response" else None)


@pytest.mark.parametrize("mechanism,meaning", [
    ("laplace", "the Laplace scale b"), ("discrete-laplace", "the discrete-Laplace decay a"),
    ("gaussian", "the Gaussian sigma"), ("randomized-response", "the randomized-response epsilon0"),
])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), "1", None])
def test_mechanism_account_names_its_parameter_and_what_it_means(mechanism, meaning, value):
  # The field is `parameter`; errors said "scale", "sigma" or "epsilon0", which MechanismAccount has no field of.
  buckets = 2 if mechanism == "randomized-response" else None
  with pytest.raises(ValueError, match=rf"^Expected parameter \({meaning}\)(=| to be )") as err:
    accounting.MechanismAccount(mechanism, value, 1, "replace-one", 1, buckets)
  assert repr(value) in str(err.value) or str(value) in str(err.value)
  assert "\n" not in str(err.value)


def test_mechanism_account_relation_and_buckets_are_checked():
  # A string relation was kept as a string and broke .statement().to_dict() with an AttributeError.
  acct = accounting.MechanismAccount("laplace", 1.0, 1.0, "replace-one")
  assert acct.relation is accounting.Relation.REPLACE_ONE
  assert acct.statement(delta=0.1).to_dict()["relation"] == "replace-one"
  assert acct == accounting.laplace(1.0, sensitivity=1.0, relation="replace-one")
  with pytest.raises(ValueError, match="relation"):
    accounting.MechanismAccount("laplace", 1.0, 1.0, "swap")
  with pytest.raises(ValueError, match="relation"):
    accounting.MechanismAccount("randomized-response", 1.0, 1.0, "add-remove", 1, 2)
  with pytest.raises(ValueError, match="num_buckets"):
    accounting.MechanismAccount("randomized-response", 1.0, 1.0, "replace-one", 1, None)
  with pytest.raises(ValueError, match="count"):
    accounting.MechanismAccount("laplace", 1.0, 1.0, "replace-one", 0)


@pytest.mark.parametrize("call,needle", [
    # OverflowError: a grid step of 1e293 (the grid cap coarsens it) overflows e^step - 1.
    (lambda: accounting.laplace(1e-300, sensitivity=1, relation="replace-one"), r"scale b\)=1e-300"),
    # IndexError in dp-accounting's tail truncation.
    (lambda: accounting.laplace(1, sensitivity=1e308, relation="replace-one", count=10), r"sensitivity=1e\+308"),
    # OverflowError (sigma**2), then "cannot convert float NaN to integer".
    (lambda: accounting.gaussian(1e300, sensitivity=1, relation="replace-one"), r"sigma\)=1e\+300"),
    (lambda: accounting.gaussian(1e-300, sensitivity=1, relation="replace-one"), r"sigma\)=1e-300"),
    (lambda: accounting.gaussian(1e-300, sensitivity=1e-300, relation="replace-one"), r"sigma\)=1e-300"),
    (lambda: accounting.gaussian(1, sensitivity=1, relation="replace-one", value_discretization_interval=1e30),
     "value_discretization_interval=1e\\+30"),
    # OverflowError (C long), and a MemoryError from 2^40 on.
    (lambda: accounting.discrete_laplace(1.0, sensitivity=2**63, relation="replace-one"), "sensitivity=922"),
    (lambda: accounting.discrete_laplace(1e-15, sensitivity=2**40, relation="replace-one"), "sensitivity=109"),
    # The lattice's int64 index (count = 10^12 x sensitivity 10^7 overflowed a C long after a minute) and
    # its float64 losses.
    (lambda: accounting.discrete_laplace(700, sensitivity=10**7, relation="replace-one", count=10**12),
     r"count \* sensitivity <= 2\^62.*count=1000000000000, sensitivity=10000000"),
    (lambda: accounting.discrete_laplace(1e300, sensitivity=10**6, relation="replace-one", count=10**6),
     r"count \* parameter \* sensitivity <= 1e\+300.*parameter \(the discrete-Laplace decay a\)=1e\+300"),
    # dp-accounting's "Noise parameter must be strictly between 0 and 1", naming no parameter.
    (lambda: accounting.randomized_response(1e-300, num_buckets=2), r"epsilon0\)=1e-300"),
    (lambda: accounting.laplace(1, sensitivity=1, relation="replace-one", count=10**400), "count="),
    # OverflowError from the Gaussian's starting point, and a NaN inside dp-accounting's analytic sigma.
    (lambda: accounting.calibrate("gaussian", target_epsilon=1e30, target_delta=1e-5, relation="replace-one"),
     "target_epsilon=1e\\+30"),
    (lambda: accounting.calibrate("gaussian", target_epsilon=1e300, target_delta=1e-5, relation="replace-one"),
     "target_epsilon=1e\\+300"),
    (lambda: accounting.calibrate("laplace", target_epsilon=1e30, target_delta=1e-5, relation="replace-one"),
     "target_epsilon=1e\\+30"),
])
def test_extremes_dp_accounting_cannot_evaluate_are_clear_errors(call, needle):
  # The error alone: no RuntimeWarning from NumPy inside dp-accounting on the way (the Gaussian's analytic sigma
  # printed "divide by zero encountered in log1p" before its error at target_epsilon=1e30).
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with pytest.raises(ValueError, match=needle):
      acct = call()
      acct.epsilon(1e-5)


def test_steps_up_to_the_grid_interval_cap_are_valid_upper_bounds():
  # A coarse grid is pessimistic: never below the exact Laplace profile, and capped at the pure epsilon.
  acct = accounting.laplace(1.0, sensitivity=1.0, relation="replace-one",
                            value_discretization_interval=accounting.MAX_GRID_INTERVAL)
  assert acct.epsilon(1e-5) <= acct.pure_epsilon() == 1.0
  assert laplace_delta(0.5, 1.0) <= acct.delta(0.5) <= 1.0


def test_privacy_statement_validates_epsilon_delta_and_relation():
  rel = accounting.Relation.REPLACE_ONE
  with pytest.raises(ValueError, match="epsilon"):
    accounting.PrivacyStatement("x", rel, epsilon=-1.0, delta=0.1)
  with pytest.raises(ValueError, match="delta"):
    accounting.PrivacyStatement("x", rel, epsilon=1.0, delta=2.0)
  with pytest.raises(ValueError, match="delta"):
    accounting.PrivacyStatement("x", rel, epsilon=1.0, delta=float("nan"))
  with pytest.raises(ValueError, match="relation"):
    accounting.PrivacyStatement("x", "swap", epsilon=1.0, delta=0.1)
  st_ = accounting.PrivacyStatement("x", "add-remove", epsilon=math.inf, delta=1.0)
  assert st_.relation is accounting.Relation.ADD_OR_REMOVE and st_.to_dict()["epsilon"] == "inf"
  # The checked floats are stored (a NumPy scalar used to stay one).
  st_ = accounting.PrivacyStatement("x", rel, epsilon=np.float32(0.5), delta=np.float64(1e-6))
  assert type(st_.epsilon) is float and type(st_.delta) is float and (st_.epsilon, st_.delta) == (0.5, 1e-6)


@pytest.mark.parametrize("count, needle", [
    (0, r"count=0 >= 1"), (-1, r"count=-1 >= 1"), (1.5, r"count to be an integer, got 1\.5"),
    (True, r"count to be an integer, got True"), (float("nan"), r"count to be an integer, got nan"),
    ("2", r"count to be an integer, got '2'"), (None, r"count to be an integer, got None"),
])
def test_privacy_statement_refuses_a_count_that_is_not_a_positive_integer(count, needle):
  # count was stored as given: a statement "covering" 0, -1, 1.5 or True releases was written to reports.
  with pytest.raises(ValueError, match=needle) as err:
    accounting.PrivacyStatement("x", "replace-one", epsilon=1.0, delta=0.0, count=count)
  assert "\n" not in str(err.value)


def test_privacy_statement_stores_its_count_as_an_int():
  for count, want in ((np.int64(3), 3), (2.0, 2), (10**18, 10**18)):
    st_ = accounting.PrivacyStatement("x", "replace-one", epsilon=1.0, delta=0.0, count=count)
    assert type(st_.count) is int and st_.count == want and st_.to_dict()["count"] == want


def test_a_discrete_laplace_sensitivity_of_millions_is_accounted():
  # 2 x 10^6 was refused by the earlier cap of 10^6, though it computes in about 2 s. Ten releases of noise
  # a = 1 / sensitivity are each (1, 0)-DP: their composition is at most 10 (basic composition), and at
  # delta 1e-6 only slightly less (each release's loss is the full +-1 on a large part of its outcomes).
  s = 2_000_000
  eps = accounting.discrete_laplace(1.0 / s, sensitivity=s, relation="replace-one", count=10).epsilon(1e-6)
  assert 9.9 < eps <= 10.0 + 10 * 1e-4


@pytest.mark.parametrize("a", [1e-300, 1e-308, 5e-324])
def test_a_subnormal_discrete_laplace_parameter_is_accounted(a):
  # From a = 2.2e-308 down, the tail cut's quotient was inf and ceil raised OverflowError. Such a mechanism is
  # (a, 0)-DP and its (eps, delta) curve is flat at eps = 0 from delta = TV (about a / 2) on.
  acct = accounting.discrete_laplace(a, sensitivity=1, relation="add-remove")
  assert acct.epsilon(1e-6) == 0.0
  assert acct.epsilon(0.0) == a
  assert 0.0 <= acct.delta(0.0) <= 1e-12


def test_a_long_fine_discrete_laplace_lattice_is_coarsened_to_at_most_the_interval():
  # a = 1e-7, Delta = 10^7: the exact lattice has 2e7 + 1 points, and the 10-fold composition was refused after
  # 22 s ("FFT of 2e+08 points") with advice to coarsen an interval the lattice ignored. It is now rounded up to a
  # lattice m·a in (interval / 2, interval]: 2e4 points, as on dp-accounting's grid.
  s = 10**7
  acct = accounting.discrete_laplace(1.0 / s, sensitivity=s, relation="replace-one", count=10)
  assert 0.5e-4 < acct.grid_interval() <= 1e-4 * (1 + 1e-12)
  assert 9.9 < acct.epsilon(1e-6) <= 10.0
  # Against the exact lattice (an interval below twice the unit keeps it): never below it, and above by less
  # than T steps of the coarse lattice. Delta = 5 * 10^4, a = 2e-5: coarse step 1e-4 (m = 5).
  s = 50_000
  coarse = accounting.discrete_laplace(1.0 / s, sensitivity=s, relation="replace-one", count=10)
  exact = accounting.discrete_laplace(1.0 / s, sensitivity=s, relation="replace-one", count=10,
                                      value_discretization_interval=1e-5)
  assert exact.grid_interval() == pytest.approx(2e-5, rel=1e-12) and coarse.grid_interval() > 4 * 2e-5
  for delta in (1e-3, 1e-6, 1e-9):
    assert exact.epsilon(delta) <= coarse.epsilon(delta) <= exact.epsilon(delta) + 10 * 1e-4
  for eps in (5.0, 8.0, 9.5):
    assert exact.delta(eps) <= coarse.delta(eps)
  # A short lattice stays exact whatever the interval: Delta = 2, a = 1e-7 (5 points).
  assert accounting.discrete_laplace(1e-7, sensitivity=2, relation="replace-one").grid_interval() == pytest.approx(
      1e-7, rel=1e-12)


@pytest.mark.parametrize("kw,message", [
    (dict(mechanism="discrete-laplace", sensitivity=2.5), "Expected sensitivity to be an integer, got 2.5."),
    (dict(mechanism="randomized-response", num_buckets=1), "Expected num_buckets=1 >= 2."),
    (dict(mechanism="randomized-response", num_buckets=4, relation="add-remove"),
     "Expected relation=replace-one for randomized response"),
    # Accepted and ignored: RR at sensitivity 3 (or NaN) returned the sensitivity-1 eps0; K for the Gaussian.
    (dict(mechanism="randomized-response", num_buckets=4, sensitivity=3),
     "Expected sensitivity=1 (the default) for randomized-response"),
    (dict(mechanism="randomized-response", num_buckets=4, sensitivity=float("nan")),
     "Expected sensitivity to be finite, got nan."),
    (dict(mechanism="gaussian", num_buckets=5), "Expected num_buckets=None for the gaussian mechanism"),
    (dict(mechanism="laplace", num_buckets=5), "Expected num_buckets=None for the laplace mechanism"),
])
def test_calibrate_names_a_bad_argument_not_its_starting_noise(kw, message):
  # These said "Could not calibrate ...: its starting noise 0.4 is outside what the accounting supports (...)".
  args = {"target_epsilon": 1.0, "target_delta": 1e-6, "relation": "replace-one", **kw}
  with pytest.raises(ValueError) as err:
    accounting.calibrate(**args)
  assert str(err.value).startswith(message)


# --- Round-off of the T-fold FFT composition, randomized response at large K, composition size -----------------

def _mp_gaussian_delta(epsilon, mu):
  """Balle & Wang 2018, Theorem 8, at 50 digits (independent of the library's log-space float64 form)."""
  import mpmath  # pylint: disable=import-outside-toplevel  (a dependency of dp-accounting)
  ctx = mpmath.mp.clone()
  ctx.dps = 50
  e, m = ctx.mpf(epsilon), ctx.mpf(mu)
  return ctx.ncdf(m / 2 - e / m) - ctx.exp(e) * ctx.ncdf(-m / 2 - e / m)


def test_composed_gaussian_is_never_below_its_exact_closed_form():
  # At T = 10^5 the composed PLD's FFT round-off reported delta(30) = -2.6e-12 (exact 3.7e-16), delta(25)
  # 3.72e-11 (exact 4.12e-11) and epsilon(1e-11) = 25.515 (exact 25.671), and calibrate's sigma for
  # (30, 1e-12) had an exact delta of 1.49e-12.
  sigma, count = 100.0, 10**5
  mu = math.sqrt(count) / sigma
  acct = accounting.gaussian(sigma, sensitivity=1.0, relation="replace-one", count=count)
  for eps in (20.0, 25.0, 30.0):
    assert acct.delta(eps) >= float(_mp_gaussian_delta(eps, mu)) > 0
  for delta in (1e-8, 1e-10, 1e-11):
    eps = acct.epsilon(delta)
    assert float(_mp_gaussian_delta(eps, mu)) <= delta
    assert float(_mp_gaussian_delta(eps * (1 - 1e-6), mu)) > delta  # and tight: a hair less is not private
  cal = accounting.calibrate("gaussian", target_epsilon=30.0, target_delta=1e-12, relation="replace-one",
                             count=count)
  assert float(_mp_gaussian_delta(30.0, math.sqrt(count) / cal.parameter)) <= 1e-12


def test_gaussian_epsilon_where_dp_accounting_overflows_is_its_closed_form():
  # dp-accounting's epsilon divides by the mass_lower it accumulates, subnormal near a loss of 709 to 745: at
  # sigma = 7.4539e-3 (48 releases, sensitivity 0.04; FedMD's LDP at epsilon 400 met it) it returned inf with
  # NumPy's "overflow encountered in scalar divide", while sigma 1.3% either side gave 745 and 709. Exact now,
  # quietly, and decreasing in sigma.
  # A grid of 1e-3 (2.1M points, 7 s for the three; 64 s at the default 1e-4) meets the same overflow.
  sigmas, count, sens, delta = (7.36e-3, 7.4539e-3, 7.548e-3), 48, 0.04, 1 / 6
  accts = [accounting.gaussian(s, sensitivity=sens, relation="add-remove", count=count,
                               value_discretization_interval=1e-3) for s in sigmas]
  with np.errstate(over="raise"), pytest.raises(FloatingPointError):
    accts[1].pld().get_epsilon_for_delta(delta)  # dp-accounting's own evaluation overflows here
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    eps = [a.epsilon(delta) for a in accts]
  assert eps[0] > eps[1] > eps[2] and 709 < eps[1] < 745
  mu = math.sqrt(count) * sens / sigmas[1]
  assert float(_mp_gaussian_delta(eps[1], mu)) <= delta < float(_mp_gaussian_delta(eps[1] * (1 - 1e-6), mu))


def test_composed_laplace_delta_carries_the_round_off_allowance():
  # At T = 10^5 (44 s) dp-accounting gave delta(750) = -5.8e-14 and delta(800) = 5.0e-14: FFT round-off of about
  # 1e-12 either way where the true delta is below 1e-100. Every composed delta below the pure epsilon now carries
  # count * FFT_ROUNDOFF_PER_RELEASE. Checked at T = 10^4 (1.4 s; mean loss 50, sd 10), where the raw values are
  # 3e-13 to 8e-13, so the test fails without the allowance (7.1e-11 here).
  acct = accounting.laplace(10.0, sensitivity=1.0, relation="replace-one", count=10**4)
  allowance = 10**4 * accounting.FFT_ROUNDOFF_PER_RELEASE
  for eps in (200.0, 250.0, 300.0, 400.0):
    assert allowance <= acct.delta(eps) <= allowance + 1e-10
  assert acct.epsilon(1e-12) == acct.pure_epsilon()  # below the allowance nothing but the pure epsilon is certified


@pytest.mark.parametrize("num_buckets", [10**9, 10**12])
def test_randomized_response_with_many_buckets_is_never_below_exact(num_buckets):
  # dp-accounting formed 1 - p + p/K with p = K/(e^eps0 + K - 1) near 1: at K = 1e12, eps0 = 0.01 the
  # epsilon was 7e-4 too small (relative). One release's exact profile: for eps in [0, eps0],
  # delta(eps) = (e^eps0 - e^eps) / (e^eps0 + K - 1) (outcome x against x').
  import mpmath  # pylint: disable=import-outside-toplevel
  ctx = mpmath.mp.clone()
  ctx.dps = 50
  eps0 = 0.01
  acct = accounting.randomized_response(eps0, num_buckets=num_buckets)
  z = ctx.exp(eps0) + num_buckets - 1
  for frac in (0.1, 0.5, 0.8):
    eps = ctx.mpf(eps0) * frac
    delta = float((ctx.exp(eps0) - ctx.exp(eps)) / z)
    assert acct.epsilon(delta) >= float(eps) * (1 - 1e-12)
    assert acct.delta(float(eps)) >= delta * (1 - 1e-12)


@pytest.mark.parametrize("query,advice", [
    (lambda: accounting.laplace(1.0, sensitivity=0.01, relation="replace-one", count=10**8).epsilon(1e-6),
     "use fewer releases or a coarser value_discretization_interval."),
    # Randomized response's lattice ignores the interval: advising a coarser one would not help.
    (lambda: accounting.randomized_response(0.01, num_buckets=2, count=10**9).delta(1e4), "use fewer releases.")])
def test_a_composition_too_large_for_memory_is_refused_not_run(query, advice):
  # The Laplace account hung in dp-accounting (44 ** 10^8 as a Python integer). On its old grid the RR account
  # asked for a 1.06e9-point FFT (15.8 GiB) at T = 10^8 and was killed for memory; on its lattice T = 10^8 takes
  # 3.3e7 points (10 s), and dp-accounting's tail bound asks for 3.3e8 at T = 10^9.
  with pytest.raises(ValueError, match=r"composition dp-accounting can run in memory.*FFT of .* points") as err:
    query()
  assert "\n" not in str(err.value) and str(err.value).endswith(advice)


def test_gaussian_closed_form_is_an_upper_bound_where_its_terms_cancel():
  # The float64 closed form must never fall below the 50-digit value, also where Phi(mu/2 - eps/mu) and
  # e^eps Phi(-mu/2 - eps/mu) nearly cancel (tiny mu): an ulp-level error in either log term moved their
  # difference the wrong way (mu = 1e-9, eps = 7.6e-9: 7e-5 below the exact delta) before it was widened by it.
  from jaxdistill.accounting._mechanisms import (  # pylint: disable=import-outside-toplevel
      _gaussian_delta, _gaussian_epsilon)
  for mu in (1e-9, 1e-6, 1e-4, 1e-2, 0.3, 1.0, math.sqrt(10.0), 40.0):
    for eps in (0.0, 1e-9, 7.6e-9, 1e-6, 1e-3, 0.1, 1.0, 5.0, 25.0, 100.0):
      exact = float(_mp_gaussian_delta(eps, mu))
      assert exact <= _gaussian_delta(eps, mu) <= exact * 1.01 + 1e-300  # widened by ulps only
    for delta in (1e-3, 1e-8, 1e-12):
      assert float(_mp_gaussian_delta(_gaussian_epsilon(delta, mu), mu)) <= delta


def test_relation_parses_every_spelling_and_names_the_dp_accounting_relation():
  rel, nr = accounting.Relation, dp_accounting.NeighboringRelation
  for member, value, name in ((rel.ADD_ONE, "add-one", "ADD_ONE"), (rel.REMOVE_ONE, "remove-one", "REMOVE_ONE"),
                              (rel.ADD_OR_REMOVE, "add-remove", "ADD_OR_REMOVE"),
                              (rel.REPLACE_ONE, "replace-one", "REPLACE_ONE")):
    for spelling in (member, value, name, name.lower(), name.replace("_", "-")):
      assert rel.parse(spelling) is member
  # dp-accounting's relations: add-or-remove is unbounded DP, replace-one bounded DP.
  assert rel.parse(nr.ADD_OR_REMOVE_ONE) is rel.ADD_OR_REMOVE
  assert rel.parse(nr.REPLACE_ONE) is rel.REPLACE_ONE
  assert rel.REPLACE_ONE.to_dp_accounting() == nr.REPLACE_ONE
  for member in (rel.ADD_ONE, rel.REMOVE_ONE, rel.ADD_OR_REMOVE):
    assert member.to_dp_accounting() == nr.ADD_OR_REMOVE_ONE
  for bad in ("bounded", nr.REPLACE_SPECIAL, 1, None):
    with pytest.raises(ValueError, match="relation to be one of add-one, remove-one, add-remove, replace-one"):
      rel.parse(bad)
