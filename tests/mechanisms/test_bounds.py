"""Proposition 1, Theorem 1 and Theorem 2: closed forms and measured failure rates.

Failure-rate tests count independent failures F in N trials and run a binomial
test of "rate <= beta" (one-sided, upper tail at beta). For the Laplace and
discrete-Laplace bounds the true failure probability is known exactly
(independent entries), so the count is also tested two-sided against it: the
test fails if the noise or the bound is wrong in either direction. The file
runs 30 binomial tests: 12 in test_proposition1_laplace (3 configurations x
per-bucket and simultaneous x one- and two-sided), 12 in
test_proposition1_discrete_laplace, 3 in test_theorem1_labeling_error and 3 in
test_theorem1_and_2_collision_failure_rates. Each rejects at p <= THRESHOLD =
2e-3 / 30, and an exact binomial test rejects a true null with probability at
most its threshold, so the family-wise false-failure rate is at most 2e-3.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, stats

from jaxdistill import mechanisms as M
from jaxdistill import simulation

NUM_BINOMIAL_TESTS = 30
THRESHOLD = 2e-3 / NUM_BINOMIAL_TESTS


def assert_rate_at_most(failures, trials, beta):
  """One-sided binomial test of failures/trials <= beta."""
  assert stats.binom.sf(failures - 1, trials, beta) > THRESHOLD, (failures, trials, beta)


def assert_rate_equals(failures, trials, prob):
  assert stats.binomtest(int(failures), trials, prob).pvalue > THRESHOLD, (failures, trials, prob)


# (s, |Y|, k, eps, beta)
CONFIGS = [(40, 10, 1, 1.0, 0.1), (20, 4, 2, 0.5, 0.05), (30, 2, 1, 2.0, 0.3)]
DRAWS = 300


@pytest.mark.parametrize("s,y,k,eps,beta", CONFIGS)
def test_proposition1_laplace(s, y, k, eps, beta):
  mech = M.CentralLaplace(M.BsvsShape(s, y, k), eps)
  b = 2 * k / eps
  # The paper's closed form, per bucket and over all buckets (spec I2).
  assert mech.accuracy(beta) == pytest.approx(b * math.log(y / beta), rel=1e-12)
  assert mech.accuracy(beta, simultaneous=True) == pytest.approx(b * math.log(s * y / beta), rel=1e-12)
  noise = np.stack([mech.noise(jax.random.key(1000 + i)) for i in range(DRAWS)])  # [R, s, |Y|]
  for simultaneous in (False, True):
    alpha = mech.accuracy(beta, simultaneous=simultaneous)
    per_bucket = np.abs(noise).max(axis=2) > alpha  # [R, s]
    if simultaneous:
      fails, trials, entries = int(per_bucket.any(axis=1).sum()), DRAWS, s * y
    else:
      fails, trials, entries = int(per_bucket.sum()), DRAWS * s, y  # independent buckets
    true_rate = 1 - (1 - math.exp(-alpha / b)) ** entries
    assert true_rate <= beta
    assert_rate_at_most(fails, trials, beta)
    assert_rate_equals(fails, trials, true_rate)


def dlap_exceed(a, alpha):
  """Pr[|Z| > alpha] by summing the pmf (independent of the library's closed form)."""
  z = np.arange(-20000, 20001)
  pmf = (1 - math.exp(-a)) / (1 + math.exp(-a)) * np.exp(-a * np.abs(z))
  return float(pmf[np.abs(z) > alpha].sum())


@pytest.mark.parametrize("s,y,k,eps,beta", CONFIGS)
def test_proposition1_discrete_laplace(s, y, k, eps, beta):
  mech = M.CentralDiscreteLaplace(M.BsvsShape(s, y, k), eps)
  a = eps / (2 * k)
  noise = np.stack([mech.noise(jax.random.key(2000 + i)) for i in range(DRAWS)])
  for simultaneous in (False, True):
    entries = y * (s if simultaneous else 1)
    alpha = mech.accuracy(beta, simultaneous=simultaneous)
    assert alpha == int(alpha) and alpha >= 0
    # Brute force: the least integer alpha with m Pr[|Z| > alpha] <= beta.
    assert entries * dlap_exceed(a, alpha) <= beta
    assert alpha == 0 or entries * dlap_exceed(a, alpha - 1) > beta
    per_bucket = np.abs(noise).max(axis=2) > alpha
    if simultaneous:
      fails, trials = int(per_bucket.any(axis=1).sum()), DRAWS
    else:
      fails, trials = int(per_bucket.sum()), DRAWS * s
    true_rate = 1 - (1 - dlap_exceed(a, alpha)) ** entries
    assert_rate_at_most(fails, trials, beta)
    assert_rate_equals(fails, trials, true_rate)


def wrong_labels(estimates, true_label):
  """Bucket-wise: some other label scores >= the true one (ties count as wrong)."""
  others = np.delete(estimates, true_label, axis=-1)
  return (others >= estimates[..., true_label:true_label + 1]).any(axis=-1)


@pytest.mark.parametrize("cls,gap", [(M.CentralLaplace, 18.0), (M.CentralDiscreteLaplace, 17.0),
                                     (M.CentralDiscreteLaplace, 18.0)])
def test_theorem1_labeling_error(cls, gap):
  # Every bucket has true label 0 with count 100 + gap, the others 100.
  s, y, k, eps = 40, 5, 1, 0.5
  mech = cls(M.BsvsShape(s, y, k), eps)
  counts = np.full((s, y), 100, np.int64)
  counts[:, 0] += int(gap)
  bound = mech.labeling_error(gap)
  if cls is M.CentralLaplace:
    assert bound == pytest.approx(y * math.exp(-eps * gap / (4 * k)), rel=1e-12)  # paper form
  else:
    a = eps / (2 * k)
    assert bound == pytest.approx(y * dlap_exceed(a, math.ceil(gap / 2) - 1), rel=1e-9)
  assert 0.05 < bound < 1  # not vacuous at this gap
  n = int(counts.sum())  # k = r = 1: one vote per client
  est = np.stack([mech.estimate(jax.random.key(3000 + i), counts, n) for i in range(DRAWS)])
  fails = int(wrong_labels(est, 0).sum())
  assert_rate_at_most(fails, DRAWS * s, bound)
  assert mech.labeling_error(0.0) == 1.0


def test_theorem2_closed_form_inverts_bernstein():
  p, q, n, m, beta = 0.31, 0.07, 5000, 10, 0.05
  v = n * max(p * (1 - p), q * (1 - q)) / (p - q) ** 2
  bnd = max(p, 1 - q) / (p - q)
  tail = lambda t: 2 * m * math.exp(-t * t / (2 * (v + bnd * t / 3))) - beta
  want = optimize.brentq(tail, 1e-9, 1e9, xtol=1e-12, rtol=1e-14)
  got = M.collision_alpha(beta, p=p, q=q, num_clients=n, num_entries=m)
  assert got == pytest.approx(want, rel=1e-9)
  assert M.collision_beta(got, p=p, q=q, num_clients=n, num_entries=m) == pytest.approx(beta, rel=1e-9)


@pytest.mark.parametrize("eps,s,y,k", [(0.5, 8, 10, 1), (1.5, 4, 3, 2), (4.0, 20, 5, 1)])
def test_collision_accuracy_and_labeling_error_are_theorem_2_at_the_mechanisms_rates(eps, s, y, k):
  # Collision.accuracy / labeling_error were checked only through a 1x-6x rate band and one-sided failure
  # counts, so a bound 40% too small passed. Here both are written out from Definition 5's rates
  # (p = e^eps / Omega, q = 1/l, Omega = c e^eps + l - c with c = kr) and Bernstein's inequality.
  mech = M.Collision(M.BsvsShape(s, y, k), eps)
  l, c, n, beta = mech.bloom_length, k, 5000, 0.05
  omega = c * math.exp(eps) + l - c
  p, q = math.exp(eps) / omega, 1.0 / l
  v = n * max(p * (1 - p), q * (1 - q)) / (p - q) ** 2
  bnd = max(p, 1 - q) / (p - q)
  for simultaneous, m in ((False, y), (True, s * y)):
    want = optimize.brentq(lambda t, m=m: 2 * m * math.exp(-t * t / (2 * (v + bnd * t / 3))) - beta, 1e-9, 1e9,
                           xtol=1e-12, rtol=1e-14)
    assert mech.accuracy(beta, n, simultaneous=simultaneous) == pytest.approx(want, rel=1e-9)
  for gap in (0.5 * want, want, 2 * want):
    bound = 2 * y * math.exp(-(gap / 2) ** 2 / (2 * (v + bnd * gap / 6)))
    assert mech.labeling_error(gap, n) == pytest.approx(min(bound, 1.0), rel=1e-9)
  assert mech.labeling_error(2 * want, n) < 0.5  # the gaps above reach the non-vacuous range


def test_theorem2_rate():
  # alpha = O(sqrt(n kr log(|Y|/beta))/eps) for eps = O(1) at the default bloom length:
  # the ratio stays in a narrow band over n, c and eps (it tends to ~sqrt(27/2) for
  # small eps and large c).
  ratios = []
  for eps in (0.25, 0.5, 1.0):
    for c in (1, 2, 4):
      mech = M.Collision(M.BsvsShape(8, 10, c), eps)
      for n in (10**4, 10**6):
        alpha = mech.accuracy(0.05, n)
        ratios.append(alpha * eps / math.sqrt(n * c * math.log(2 * 10 / 0.05)))
  assert 1.0 < min(ratios) and max(ratios) < 6.0


def test_theorem1_and_2_collision_failure_rates():
  # 300 simulated runs over n = 1000 clients (s = 4, |Y| = 3, k = 1, eps = 1.5). Runs
  # are independent; per run: the per-bucket event for bucket 0, the all-buckets
  # event, and a wrong label on bucket 0, whose true gap (256) makes the Theorem 1
  # bound non-vacuous (about 0.2).
  rng = np.random.default_rng(0)
  n, s, y = 1000, 4, 3
  buckets = rng.choice(s, (n, 1), p=[0.55, 0.15, 0.15, 0.15])
  labels = np.where(rng.random(n) < 0.5, 0, rng.integers(0, y, n))[:, None]
  inp, shape = M.make_bsvs_input(buckets, labels, num_buckets=s, num_labels=y)
  truth = np.asarray(M.bsvs_counts(inp, shape), np.float64)
  mech = M.Collision(shape, 1.5)
  est = np.stack([simulation.simulate(jax.random.key(4000 + i), mech, inp).estimate
                  for i in range(DRAWS)])
  err = np.abs(est - truth)
  beta = 0.2
  per_bucket = int((err[:, 0].max(axis=1) > mech.accuracy(beta, n)).sum())
  everywhere = int((err.max(axis=(1, 2)) > mech.accuracy(beta, n, simultaneous=True)).sum())
  assert_rate_at_most(per_bucket, DRAWS, beta)
  assert_rate_at_most(everywhere, DRAWS, beta)
  gap = truth[0, 0] - truth[0, 1:].max()
  bound = mech.labeling_error(gap, n)
  assert 0.05 < bound < 0.5
  wrong = int(wrong_labels(est[:, 0], int(np.argmax(truth[0]))).sum())
  assert_rate_at_most(wrong, DRAWS, bound)


def test_bounds_broadcast_and_vmap():
  gaps = np.array([0.0, 4.0, 10.0, 30.0])
  concrete = M.laplace_labeling_error(gaps, 2.0, num_labels=10)
  assert concrete.dtype == np.float64 and concrete.shape == (4,)
  np.testing.assert_allclose(concrete, np.minimum(1, 10 * np.exp(-gaps / 4)).clip(max=1) * (gaps > 0)
                             + (gaps <= 0), rtol=1e-12)
  traced = jax.vmap(lambda g: M.laplace_labeling_error(g, 2.0, num_labels=10))(jnp.asarray(gaps))
  np.testing.assert_allclose(np.asarray(traced), concrete, rtol=1e-6)
  betas = jnp.array([0.01, 0.1, 0.5])
  fn = jax.jit(jax.vmap(lambda b: M.collision_alpha(b, p=0.3, q=0.1, num_clients=100, num_entries=5)))
  np.testing.assert_allclose(np.asarray(fn(betas)),
                             [M.collision_alpha(float(b), p=0.3, q=0.1, num_clients=100, num_entries=5)
                              for b in betas], rtol=1e-5)
  got = jax.vmap(lambda b: M.discrete_laplace_alpha(0.5, b, num_entries=10))(betas)
  np.testing.assert_allclose(np.asarray(got), M.discrete_laplace_alpha(0.5, np.asarray(betas), num_entries=10))


def test_bad_input():
  with pytest.raises(ValueError, match="beta"):
    M.laplace_alpha(1.0, 0.0)
  with pytest.raises(ValueError, match="beta"):
    M.laplace_alpha(1.0, 1.5)
  with pytest.raises(ValueError, match="beta"):
    M.discrete_laplace_alpha(1.0, math.nan)
  with pytest.raises(ValueError, match="scale"):
    M.laplace_alpha(-1.0, 0.1)
  with pytest.raises(ValueError, match="parameter"):
    M.discrete_laplace_beta(0.0, 1.0)
  with pytest.raises(ValueError, match="num_entries"):
    M.laplace_alpha(1.0, 0.1, num_entries=0)
  with pytest.raises(ValueError, match="num_entries"):
    M.laplace_beta(1.0, 0.1, num_entries=2.5)
  with pytest.raises(ValueError, match="scale"):  # text is a caller's bug even when it parses
    M.laplace_alpha("2", 0.1)
  with pytest.raises(ValueError, match="beta"):
    M.laplace_alpha(2.0, [0.1, "0.2"])
  with pytest.raises(ValueError, match="scale"):
    M.laplace_alpha(True, 0.1)
  with pytest.raises(ValueError, match="alpha"):
    M.laplace_beta(1.0, -0.1)
  with pytest.raises(ValueError, match="p="):
    M.collision_alpha(0.1, p=0.1, q=0.2, num_clients=10)
  with pytest.raises(ValueError, match="num_clients"):
    M.collision_alpha(0.1, p=0.3, q=0.2, num_clients=0)
  with pytest.raises(ValueError, match="gap"):
    M.laplace_labeling_error(math.nan, 1.0, num_labels=3)
  with pytest.raises(ValueError, match="num_labels"):
    M.discrete_laplace_labeling_error(3.0, 1.0, num_labels=0)


def _mp_bound(name, *args, **kw):
  """The docstring formulas evaluated in 50-digit mpmath (independent of the float64 kernels)."""
  import mpmath as mp  # pylint: disable=import-outside-toplevel
  mp.mp.dps = 50
  f = mp.mpf
  if name == "laplace_alpha":
    scale, beta = map(f, args)
    return scale * mp.log(f(kw.get("num_entries", 1)) / beta)
  if name == "laplace_beta":
    scale, alpha = map(f, args)
    return min(f(1), f(kw.get("num_entries", 1)) * mp.exp(-alpha / scale))
  if name == "discrete_laplace_alpha":  # least integer alpha >= 0 with m 2 e^{-a(alpha + 1)} / (1 + e^{-a}) <= beta
    a, beta = map(f, args)
    m = f(kw.get("num_entries", 1))
    return max(mp.ceil(mp.log(2 * m / (beta * (1 + mp.exp(-a)))) / a), 1) - 1
  x = f(args[0])
  p, q, n, m = f(kw["p"]), f(kw["q"]), f(kw["num_clients"]), f(kw.get("num_entries", kw.get("num_labels", 1)))
  v = n * max(p * (1 - p), q * (1 - q)) / (p - q) ** 2
  b = max(p, 1 - q) / (p - q)
  if name == "collision_alpha":
    log_term = mp.log(2 * m / x)
    return log_term * b / 3 + mp.sqrt((log_term * b / 3) ** 2 + 2 * log_term * v)
  if name == "collision_labeling_error":
    x = x / 2
  return min(f(1), 2 * m * mp.exp(-x**2 / (2 * (v + b * x / 3))))


@pytest.mark.parametrize("name,args,kw", [
    ("laplace_alpha", (1.0, 1e-320), {}),  # m / beta overflowed: inf instead of about 737
    ("laplace_alpha", (2.0, 0.5), {"num_entries": 1e308}),
    ("laplace_beta", (1e-320, 0.0), {}),  # 0 / 0 once XLA flushed the subnormal scale
    ("laplace_alpha", (1e-310, 0.5), {}),  # the flushed scale gave alpha = 0 (finite, so kept): Pr[|N| > 0] <= 0.5
    ("laplace_beta", (1e-310, 1e-309), {}),  # exp(-alpha / 0) = 0: beta 0 instead of e^-10
    ("discrete_laplace_alpha", (0.5, 1e-320), {}),
    ("collision_alpha", (1e-320,), {"p": 0.5, "q": 0.25, "num_clients": 10}),
    ("collision_alpha", (0.1,), {"p": 2e-300, "q": 1e-300, "num_clients": 1}),  # (p - q)^2 underflows
    ("collision_beta", (1e308,), {"p": 0.5, "q": 0.25, "num_clients": 10}),  # inf / inf: NaN
    ("collision_beta", (1e300,), {"p": 2e-300, "q": 1e-300, "num_clients": 1}),
    ("collision_labeling_error", (2e300,), {"p": 2e-300, "q": 1e-300, "num_clients": 1, "num_labels": 1}),
])
def test_bounds_at_extremes_match_the_formula_in_high_precision(name, args, kw):
  got = getattr(M, name)(*args, **kw)
  want = float(_mp_bound(name, *args, **kw))
  assert math.isfinite(got)
  assert got == pytest.approx(want, rel=1e-12, abs=0.0), (got, want)


def test_bounds_at_extremes_keep_ordinary_entries_of_an_array():
  # Only the overflowing entry is recomputed; its neighbours keep the kernel's value bitwise.
  betas = np.array([0.1, 1e-320, 0.5])
  got = M.laplace_alpha(2.0, betas, num_entries=3)
  assert got[0] == M.laplace_alpha(2.0, 0.1, num_entries=3) and got[2] == M.laplace_alpha(2.0, 0.5, num_entries=3)
  assert got[1] == pytest.approx(float(_mp_bound("laplace_alpha", 2.0, 1e-320, num_entries=3)), rel=1e-12)


def test_bounds_that_overflow_float64_or_mismatch_in_shape_are_refused():
  with pytest.raises(ValueError, match=r"scale=1e\+308"):
    M.laplace_alpha(1e308, 0.1)  # b ln(1/beta) = 2.3e308: inf
  with pytest.raises(ValueError, match=r"parameter=1e-320"):
    M.discrete_laplace_alpha(1e-320, 0.1)
  with pytest.raises(ValueError, match="scale, beta"):
    M.laplace_alpha(np.ones(2), np.full(3, 0.5))  # was a JAX TypeError
  with pytest.raises(ValueError, match="alpha, p"):
    M.collision_beta(np.ones(2), p=np.full(3, 0.5), q=0.25, num_clients=10)
  with pytest.raises(ValueError, match="p and q"):
    M.collision_alpha(0.1, p=np.full(3, 0.5), q=np.full(2, 0.25), num_clients=10)
  with pytest.raises(ValueError, match="gap, parameter"):
    M.discrete_laplace_labeling_error(np.ones(2), np.full(3, 0.5), num_labels=2)
