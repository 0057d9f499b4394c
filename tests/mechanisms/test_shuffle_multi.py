"""Multi-message shuffle: sampler law, exact privacy vs brute force, statistical audit, calibration, protocol.

Oracles are independent of the code under test: scipy's negative-binomial and
logarithmic pmfs, per-client pmfs convolved by hand, the exact toolkit's
hockey-stick divergence, and dp-accounting's discrete Laplace. The protocol's
shuffle is checked against the client-order rows rebuilt from the clients' own
messages and by Monte Carlo permutation tests of the arrangement.
"""

import fractions
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import signal, stats

from jaxdistill import accounting
from jaxdistill import audit
from jaxdistill import mechanisms as M
from jaxdistill import simulation
from jaxdistill.accounting import _multi_message as mm
from jaxdistill.mechanisms import _nb_sampler as nbs
from tests.mechanisms._stats import audit_pair

# Tiny noise used for exact checks: a = 1, rho = 2, p' = 0.3.
TINY = accounting.MultiMessageNoise(math.exp(-1.0), 2.0, 0.3)


def decode(table):
  """uint32 [K, 3] thresholds -> survival probabilities (float64)."""
  t = np.asarray(table, np.float64)
  return (t[:, 0] * 2.0**64 + t[:, 1] * 2.0**32 + t[:, 2]) / 2.0**96


def chisquare_pooled(observed, expected, min_expected=5.0):
  """Chi-square p-value after pooling cells with small expected counts into one."""
  observed, expected = np.asarray(observed, float).ravel(), np.asarray(expected, float).ravel()
  expected = expected * observed.sum() / expected.sum()  # probabilities -> expected counts
  big = expected >= min_expected
  obs = np.append(observed[big], observed[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  return stats.chisquare(obs, exp).pvalue


# -- the negative-binomial sampler ----------------------------------------------------------


def test_count_below_is_an_exact_96_bit_inverse_cdf():
  table = nbs._words([3 << 64, (2 << 64) + 5, 7, 0])  # non-increasing
  cases = {(3 << 64) - 1: 1, 3 << 64: 0, (2 << 64) + 4: 2, (2 << 64) + 5: 1, 6: 3, 7: 2, 0: 3}
  u = nbs._words(list(cases))
  got = np.asarray(nbs.count_below(jnp.asarray(u), table))
  assert got.tolist() == list(cases.values())
  assert int(nbs.count_below(jnp.asarray(u[:1]), np.zeros((0, 3), np.uint32))[0]) == 0


@pytest.mark.parametrize("r,p", [(0.5, 0.6), (1 / 3, 0.9), (2.5, 0.3)])
def test_sampler_matches_negative_binomial_pmf(r, p):
  # Chi-square goodness of fit at 20000 draws (tail pooled); false-failure rate 1e-3 per case.
  x = np.asarray(M.sample_negative_binomial(jax.random.key(11), r, p, (20000,)))
  k = np.arange(x.max() + 2)
  expected = stats.nbinom.pmf(k, r, 1 - p)
  expected[-1] = stats.nbinom.sf(k[-2], r, 1 - p)
  observed = np.bincount(x, minlength=len(k))
  assert chisquare_pooled(observed, expected) > 1e-3


def test_sampler_tiny_shape_zero_mass_and_conditional_law():
  # r = 1e-3: Pr[X > 0] = 1 - 0.1^0.001 = 2.3e-3. 4e5 draws -> ~920 non-zero draws.
  # Binomial z-test on the zero mass and chi-square on the zero-truncated law,
  # Bonferroni over the two tests: false-failure rate 1e-3.
  r, p = 1e-3, 0.9
  x = np.asarray(M.sample_negative_binomial(jax.random.key(12), r, p, (400000,)))
  q0 = -math.expm1(r * math.log1p(-p))
  z = ((x > 0).sum() - len(x) * q0) / math.sqrt(len(x) * q0 * (1 - q0))
  assert abs(z) < stats.norm.isf(5e-4 / 2)
  pos = x[x > 0]
  k = np.arange(1, pos.max() + 2)
  cond = stats.nbinom.pmf(k, r, 1 - p) / q0
  cond[-1] = stats.nbinom.sf(k[-2], r, 1 - p) / q0
  assert chisquare_pooled(np.bincount(pos, minlength=k[-1] + 1)[1:], cond) > 5e-4


@pytest.mark.parametrize("n,p", [(10**6, 0.975), (2**20, 0.9), (3, 0.6)])
def test_tables_encode_the_exact_law_and_n_shares_sum_to_geometric(n, p):
  # Deterministic: decode the 96-bit tables back into probabilities and compare
  # with independent float64 formulas; then convolve the per-client law n times
  # (repeated squaring) and compare with NB(1, p) = Geometric.
  tables = nbs.compound_poisson_tables((1.0 / n,), (p,), 1)
  lam = -math.log1p(-p) / n
  assert tables.rate == pytest.approx(lam, rel=1e-12)
  e = np.arange(len(tables.count))
  np.testing.assert_allclose(decode(tables.count), stats.poisson.sf(e, lam), rtol=1e-9, atol=1e-28)
  mark_surv = decode(tables.mark)
  # Reference Pr[L > j] by summing logser's pmf from the far tail (no cancellation).
  pmf = stats.logser.pmf(np.arange(1, len(mark_surv) + 400), p)
  ref_sf = np.cumsum(pmf[::-1])[::-1][1:]
  np.testing.assert_allclose(mark_surv, ref_sf[:len(mark_surv)], rtol=1e-9, atol=1e-28)
  assert tables.tv_bound < 1e-20
  # Per-client pmf of the compound Poisson (Panjer recursion) from the decoded tables.
  K = int(math.log(1e-30) / math.log(p)) + 2
  log_pmf = np.zeros(K + 1)
  log_pmf[1:len(mark_surv) + 1] = -np.diff(np.concatenate([[1.0], mark_surv]))
  lam_hat = -math.log1p(-decode(tables.count)[0])
  g = np.zeros(K + 1)
  g[0] = math.exp(-lam_hat)
  for k in range(1, K + 1):
    g[k] = lam_hat / k * np.dot(np.arange(1, k + 1) * log_pmf[1:k + 1], g[k - 1::-1][:k])
  # Zero mass with full relative precision: 1 - Pr[X = 0] = -expm1(r log1p(-p)).
  assert decode(tables.count)[0] == pytest.approx(-math.expm1((1.0 / n) * math.log1p(-p)), rel=1e-12, abs=0)
  np.testing.assert_allclose(g[1:50], stats.nbinom.pmf(np.arange(1, 50), 1.0 / n, 1 - p), rtol=1e-7)
  # n-fold convolution by binary exponentiation (truncated at K; the tail is < 1e-25).
  total, base, m = np.zeros(K + 1), g.copy(), n
  total[0] = 1.0
  while m:
    if m & 1:
      total = np.convolve(total, base)[:K + 1]
    base = np.convolve(base, base)[:K + 1]
    m >>= 1
  np.testing.assert_allclose(total, (1 - p) * p ** np.arange(K + 1), rtol=1e-8, atol=1e-15)


@pytest.mark.parametrize("n", [3000, 10**6, 3_000_001])
def test_client_shares_sum_to_at_least_the_analysed_shapes(n):
  # fl(1/n) and fl(rho/n) summed over n clients can fall short of 1 and rho (n = 3,000: by 3.3e-17), less
  # noise than the statement analyses. The shares are now the smallest floats whose n-fold sum reaches them
  # (decided in exact rational arithmetic), and the sampler's tables are built from them.
  mech = M.ShuffleMultiMessage(M.BsvsShape(2, 2, 1), 1.0, 1e-6, n)
  a, b = mech.share_shapes()
  for share, total in ((a, 1.0), (b, mech.noise.rho)):
    assert n * fractions.Fraction(share) >= fractions.Fraction(total)
    assert n * fractions.Fraction(math.nextafter(share, 0.0)) < fractions.Fraction(total)  # the smallest
    assert share in (total / n, math.nextafter(total / n, math.inf))
  probs = (mech.noise.p, mech.noise.p, mech.noise.p_flood)
  ours = mech.tables()
  np.testing.assert_array_equal(ours.count, nbs.compound_poisson_tables((a, a, b), probs, 4).count)
  if n == 3000:  # n fl(1/n) < 1 here: the float shares gave other (smaller) event probabilities
    assert a > 1.0 / n
    floats = nbs.compound_poisson_tables((1.0 / n, 1.0 / n, mech.noise.rho / n), probs, 4)
    assert not np.array_equal(ours.count, floats.count)


def test_expected_messages_formula_matches_the_sampler_tables():
  # E[sum of sizes] = cells * sum_s lambda_s E[Log(p_s)], read from the decoded tables.
  shape = M.BsvsShape(5, 4, 1)
  mech = M.ShuffleMultiMessage(shape, 1.0, 1e-6, 10**6, noise=accounting.calibrate_multi_message(1.0, 1e-6))
  t = mech.tables()
  probs = np.diff(np.concatenate([[1.0], decode(t.mark), [0.0]])) * -1.0
  per_event_plus_minus = np.where(np.asarray(t.mark_stream) == 2, 2, 1) * np.asarray(t.mark_size)
  noise_msgs = t.rate * float(np.dot(probs, per_event_plus_minus))
  assert shape.c + noise_msgs == pytest.approx(mech.expected_messages(), rel=1e-9)


# -- per-client messages and their sum --------------------------------------------------------


def client_view_pmf(x, n, noise, size):
  """Exact pmf of one client's (#+, #-) on an entry with x real messages, on [0, size]^2."""
  g = stats.nbinom.pmf(np.arange(size + 1), 1 / n, 1 - noise.p)
  f = stats.nbinom.pmf(np.arange(size + 1), noise.rho / n, 1 - noise.p_flood)
  out = np.zeros((size + 1, size + 1))
  for z3 in range(size + 1):
    for u in range(size + 1):
      if u - x - z3 >= 0:
        out[u, z3:] += f[z3] * g[u - x - z3] * g[:size + 1 - z3]
  return out


def sum_of_views(views, size):
  acc = views[0]
  for v in views[1:]:
    acc = signal.convolve2d(acc, v)[:size + 1, :size + 1]
  return acc


def tiny_mechanism(n, shape=M.BsvsShape(2, 1, 1)):
  delta = accounting.multi_message_delta(TINY, 2.0, k=shape.k, r=shape.r)
  return M.ShuffleMultiMessage(shape, 2.0, min(0.99, delta * 1.01), n, noise=TINY)


def test_one_client_messages_follow_the_exact_pmf():
  # n = 2 (shares NB(1/2, p), NB(1, p')); client with entry 0. Joint law of (#+, #-)
  # on both entries vs the exact pmf; 20000 draws, pooled chi-square, false-failure
  # rate 1e-3 per entry (Bonferroni 2e-3 overall).
  mech = tiny_mechanism(2)
  keys = jax.random.split(jax.random.key(3), 20000)
  b, lab = jnp.array([0], jnp.int32), jnp.array([0], jnp.int32)
  msgs = np.asarray(jax.jit(jax.vmap(lambda k: mech.randomize(k, b, lab)))(keys))
  assert msgs.shape == (20000, 2, 2) and msgs.dtype == np.int32
  size = 40
  for entry, x in ((0, 1), (1, 0)):
    exact = client_view_pmf(x, 2, TINY, size)
    u, v = np.minimum(msgs[:, entry, 0], size), np.minimum(msgs[:, entry, 1], size)
    observed = np.zeros_like(exact)
    np.add.at(observed, (u, v), 1)
    assert chisquare_pooled(observed, exact) > 1e-3


def test_sum_over_clients_is_the_analysed_view():
  # n = 3 clients on d = 1: (#+, #-) = (3 + G1 + F, G2 + F) with G ~ NB(1, p), F ~ NB(rho, p').
  # The exact reference is computed from the *total* laws (not from the shares).
  # 20000 sums; pooled chi-square; false-failure rate 1e-3.
  mech = tiny_mechanism(3, M.BsvsShape(1, 1, 1))
  b, lab = jnp.array([0], jnp.int32), jnp.array([0], jnp.int32)

  def total(key):
    ks = jax.random.split(key, 3)
    return sum(mech.randomize(k, b, lab) for k in ks)[0]

  sums = np.asarray(jax.jit(jax.vmap(total))(jax.random.split(jax.random.key(4), 20000)))
  size = 45
  g = stats.geom.pmf(np.arange(size + 1) + 1, 1 - TINY.p)  # NB(1, p) on {0, 1, ...}
  f = stats.nbinom.pmf(np.arange(size + 1), TINY.rho, 1 - TINY.p_flood)
  exact = np.zeros((size + 1, size + 1))
  for fv in range(size + 1):
    for u in range(3 + fv, size + 1):
      exact[u, fv:] += f[fv] * g[u - 3 - fv] * g[:size + 1 - fv]
  observed = np.zeros_like(exact)
  np.add.at(observed, (np.minimum(sums[:, 0], size), np.minimum(sums[:, 1], size)), 1)
  assert chisquare_pooled(observed, exact) > 1e-3


# -- exact privacy: brute force, lattice, reduction, composition ---------------------------


@pytest.mark.parametrize("n", [2, 3])
def test_pld_upper_bounds_brute_force_enumeration_and_is_tight(n):
  # The whole analyzer view (the shuffled multiset = the count vector) of n clients on
  # d = 2 entries, by convolving the per-client pmfs (shares NB(1/n, .)). Neighbours:
  # all clients on entry 0, vs client 0 moved to entry 1 (one up, one down shift).
  size = 36  # the truncated mass is below 1e-13 on both sides
  mk = lambda xs: sum_of_views([client_view_pmf(x, n, TINY, size) for x in xs], size)
  p_view = np.outer(mk([1] * n), mk([0] * n)).ravel()
  q_view = np.outer(mk([0] + [1] * (n - 1)), mk([1] + [0] * (n - 1))).ravel()
  tail = max(1 - p_view.sum(), 1 - q_view.sum())
  assert tail < 1e-13
  for eps in (0.5, 1.0, 1.5, 2.0):
    brute = accounting.privacy_profile(p_view, q_view, eps)  # <= true delta <= brute + tail
    pld = accounting.multi_message_delta(TINY, eps)
    assert brute <= pld
    # Pessimistic grid (1e-4 in the loss) costs at most ~1e-4 relative here.
    assert pld <= (brute + tail) * (1 + 1e-4) + 1e-12


def test_lattice_pld_equals_reduced_pld():
  # The 2-D lattice and its lossless 1-D reduction give the same profile, up to the
  # pessimistic rounding of (float-equal) losses onto the 1e-4 grid.
  lattice = accounting.multi_message_pld(TINY, lattice_size=36)
  reduced = accounting.multi_message_pld(TINY)
  for eps in (0.0, 0.5, 1.0, 2.0, 3.0):
    assert lattice.get_delta_for_epsilon(eps) == pytest.approx(reduced.get_delta_for_epsilon(eps),
                                                              rel=2e-5, abs=1e-12)


def test_infinite_loss_mass_is_the_probability_of_no_noise():
  # At eps -> large only outcomes impossible under the neighbour remain: no geometric
  # share and no flooding on the shifted coordinate, (1-p)(1-p')^rho.
  delta = accounting.multi_message_delta(TINY, 30.0)
  assert delta == pytest.approx((1 - TINY.p) * (1 - TINY.p_flood) ** TINY.rho, rel=1e-6)


@pytest.mark.parametrize("k", [1, 2])
def test_large_flooding_approaches_discrete_laplace_from_above(k):
  # #(+) - #(-) = x + DLap(p) is a post-processing of the view, so the view's delta is
  # at least that of 2k discrete-Laplace unit shifts; with heavy flooding it is close.
  a = 0.4
  noise = accounting.MultiMessageNoise(math.exp(-a), 400.0, math.exp(-0.4))
  ref = accounting.discrete_laplace(a, sensitivity=1, relation="replace-one", count=2 * k)
  for eps in (0.2, 0.6):
    view = accounting.multi_message_delta(noise, eps, k=k)
    assert ref.delta(eps) - 1e-9 <= view <= ref.delta(eps) + 1e-3


@given(st.sampled_from([0.2, 0.5, 1.0]), st.sampled_from([0.05, 0.3, 0.8]), st.sampled_from([1.0, 5.0]),
       st.sampled_from([0.3, 1.0]))
def test_delta_monotone_in_flooding(a, b, rho, eps):
  # The view with rho + rho' is a post-processing of the view with rho (add the same
  # NB(rho', p') to both coordinates), so delta cannot increase with rho.
  base = accounting.MultiMessageNoise(math.exp(-a), rho, math.exp(-b))
  more = accounting.MultiMessageNoise(math.exp(-a), 2 * rho, math.exp(-b))
  assert accounting.multi_message_delta(more, eps) <= accounting.multi_message_delta(base, eps) + 1e-12


def test_calibration_round_trip():
  # Calibrated noise meets the target; slightly less noise (rho, or the DLap a) does not.
  eps, delta = 1.0, 1e-6
  noise = accounting.calibrate_multi_message(eps, delta)
  assert noise.dlap_a == pytest.approx(0.25)  # dlap_fraction * eps / (2kr)
  assert accounting.multi_message_delta(noise, eps) <= delta
  less_flood = accounting.MultiMessageNoise(noise.p, noise.rho / 1.02, noise.p_flood)
  assert accounting.multi_message_delta(less_flood, eps) > delta
  less_dlap = accounting.MultiMessageNoise(math.exp(-1.02 * noise.dlap_a), noise.rho, noise.p_flood)
  assert accounting.multi_message_delta(less_dlap, eps) > delta
  assert accounting.multi_message_epsilon(noise, delta) <= eps


# -- statistical audit of the analyzer's view ----------------------------------------------
# n = 2 clients on d = 2 entries with TINY noise; the claim is tiny_mechanism(2)'s (eps = 2, delta
# = its PLD delta at 2). The analyzer sees the shuffled multiset, i.e. the summed counts
# int32 [d, 2]. The pair is the worst one of the exact test above: all clients on entry 0 (D0)
# vs client 0 moved to entry 1 (D1). The statistic is the exact log-likelihood ratio of the
# view under TINY (the optimal test of the claimed mechanism), from closed-form pmfs.
# Rates: each audit runs at alpha = 1e-4 (Clopper-Pearson + Bonferroni), which bounds both a
# false alarm and a lower bound above the exact epsilon (or delta) of the pair.
AUDIT_ALPHA = 1e-4
AUDIT_SAMPLES, AUDIT_BATCH = 40_000, 8_000  # one jitted batch shape per view
AUDIT_SIZE = 60  # counts are clipped here for the statistic; Pr[a count > 60] < 1e-20


@functools.lru_cache(maxsize=None)
def analyzer_view(mech):
  """``(key, clients) -> int32 [d, 2]``: the n clients' messages summed, i.e. the shuffled multiset."""
  def view(key, x):
    buckets, labels = x
    return jax.vmap(mech.randomize)(jax.random.split(key, buckets.shape[0]), buckets, labels).sum(0)
  return view


@functools.lru_cache(maxsize=None)
def view_llr(n):
  """log Pr_D0[view] - log Pr_D1[view] under TINY for audit_pair(n); about +-1e4 where one side is 0."""
  size = AUDIT_SIZE
  g = (1 - TINY.p) * TINY.p ** np.arange(size + 1)  # the n geometric shares summed: NB(1, p)
  f = stats.nbinom.pmf(np.arange(size + 1), TINY.rho, 1 - TINY.p_flood)
  q = np.zeros((size + 2, size + 1))  # Pr[(G1 + F, G2 + F) = (a, b)]; row size + 1 (a = -1) is 0
  for fv in range(size + 1):
    q[fv:size + 1, fv:] += f[fv] * np.outer(g[:size + 1 - fv], g[:size + 1 - fv])
  with np.errstate(divide="ignore"):
    log_q = jnp.asarray(np.maximum(np.log(q), -1e4), jnp.float32)

  def lq(a, b):  # log-pmf of an entry's (#+, #-) = (a + x, b) with x real messages
    return log_q[jnp.where(a < 0, size + 1, a), b]

  def statistic(counts):
    u, v = jnp.minimum(counts[:, 0], size), jnp.minimum(counts[:, 1], size)
    # D0: entry 0 holds n real messages and entry 1 none; D1: n - 1 and 1.
    return lq(u[0] - n, v[0]) - lq(u[0] - n + 1, v[0]) + lq(u[1], v[1]) - lq(u[1] - 1, v[1])
  return statistic


def exact_view_pair(noise, n, size=36):
  """The pmfs of the whole view under audit_pair(n), by convolution (truncated mass < 1e-12)."""
  mk = lambda xs: sum_of_views([client_view_pmf(x, n, noise, size) for x in xs], size)
  p = np.outer(mk([1] * n), mk([0] * n)).ravel()
  q = np.outer(mk([0] + [1] * (n - 1)), mk([1] + [0] * (n - 1))).ravel()
  tail = max(1 - p.sum(), 1 - q.sum())
  assert tail < 1e-12
  return p, q, tail


def audit_view(mech, claim, seed):
  return audit.audit_privacy(jax.random.key(seed), analyzer_view(mech), *audit_pair(mech.num_clients),
                             num_samples=AUDIT_SAMPLES, batch_size=AUDIT_BATCH, alpha=AUDIT_ALPHA,
                             claimed_epsilon=claim.epsilon, claimed_delta=claim.delta,
                             statistic=view_llr(mech.num_clients))


def test_audit_of_the_analyzer_view_finds_no_violation():
  # The pair's exact profile (enumeration) is flat from eps ~1.69 on: delta(2) is the mass D1
  # cannot produce, ~0.3097, which is the claim. No alarm, and delta_lower below the exact
  # delta(2): false-failure rate <= 1e-4 for both together (an alarm means delta_lower > the
  # claimed delta >= the exact one). Floor (the audit has power on this view): delta_lower was
  # 0.198-0.246 over this and 19 other seeds (mean 0.213, sd 0.010), so 0.1 is 11 sd below the
  # mean (normal approximation: < 1e-9). Family-wise for this test: about 1e-4.
  mech = tiny_mechanism(2)
  claim = mech.privacy()
  p, q, tail = exact_view_pair(TINY, 2)
  exact = accounting.privacy_profile(p, q, claim.epsilon) + tail  # >= the true delta at eps = 2
  assert exact <= claim.delta * (1 + 1e-9)
  r = audit_view(mech, claim, 30)
  assert not r.alarm and r.kind == "thresholds"
  assert 0.1 < r.delta_lower <= exact


def test_audit_alarms_when_the_sampler_floods_with_a_quarter_of_rho():
  # Planted bug: the clients sample flooding NB(rho / 4, p') while the claim stays TINY's. The
  # view's exact delta at eps = 2 is then ~0.529 (enumeration) against the claimed ~0.310.
  # delta_lower must lie below that exact delta (false-failure rate <= 1e-4). Over this and 19
  # other seeds delta_lower was 0.509-0.523 (mean 0.516, sd 0.004), so the asserted floor
  # claim + 0.15 (~0.46) is 13 sd below the mean and a missed alarm (<= claim) 48 sd: < 1e-9.
  mech = tiny_mechanism(2)
  claim = mech.privacy()
  quarter = accounting.MultiMessageNoise(TINY.p, TINY.rho / 4, TINY.p_flood)
  bug = M.ShuffleMultiMessage(mech.shape, 2.0, 0.99, 2, noise=quarter)  # meets only a loose (2, 0.99)
  p, q, tail = exact_view_pair(quarter, 2)
  exact = accounting.privacy_profile(p, q, claim.epsilon) + tail  # >= the true delta at eps = 2
  assert exact > claim.delta + 0.2
  r = audit_view(bug, claim, 31)
  assert r.alarm
  assert claim.delta + 0.15 < r.delta_lower <= exact


# -- the mechanism in the runner ----------------------------------------------------------------


def test_unbiased_with_dlap_variance_and_law():
  # 300 runs over n = 200 clients on 8 entries. Per entry: z-test on the mean and a
  # z-test on the sample variance using DLap's exact 4th moment (normal approximation
  # of the sample variance, so the rate is approximate); plus a pooled chi-square of
  # all errors against the DLap pmf. Bonferroni over 17 tests: family-wise
  # false-failure rate about 1e-3.
  w = M.synthetic_workload(jax.random.key(5), num_clients=200, num_buckets=4, num_labels=2, k=1)
  inp = w.materialize()
  truth = np.asarray(M.bsvs_counts(inp, w.shape), np.float64)
  mech = M.ShuffleMultiMessage(w.shape, 1.0, 1e-6, 200)
  runs = np.stack([simulation.simulate(jax.random.key(1000 + i), mech, inp).estimate for i in range(300)])
  p = mech.noise.p
  var = 2 * p / (1 - p) ** 2
  np.testing.assert_allclose(mech.entry_variance(truth, 200), var)
  z = np.arange(-400, 401)
  pmf = (1 - p) / (1 + p) * p ** np.abs(z)
  mu4 = float(np.sum(pmf * z**4.0))
  alpha = 1e-3 / 17
  crit = stats.norm.isf(alpha / 2)
  err = runs - truth
  m = len(runs)
  assert np.all(np.abs(err.mean(0)) / math.sqrt(var / m) < crit)
  s2 = err.var(0, ddof=1)
  assert np.all(np.abs(s2 - var) / math.sqrt((mu4 - var**2 * (m - 3) / (m - 1)) / m) < crit)
  e = err.ravel().astype(int)
  lo, hi = -60, 60
  observed = np.bincount(np.clip(e, lo, hi) - lo, minlength=hi - lo + 1)
  expected = (1 - p) / (1 + p) * p ** np.abs(np.arange(lo, hi + 1.0))
  expected[0] = p ** -lo / (1 + p)  # Pr[Z <= lo]
  expected[-1] = p**hi / (1 + p)  # Pr[Z >= hi]
  assert chisquare_pooled(observed, expected) > alpha


@pytest.mark.parametrize("beta", [0.05, 0.5])
def test_max_error_bound_from_the_difference_of_two_geometrics(beta):
  # Independent of the library's discrete-Laplace closed form: the pmf of G1 - G2 with
  # G1, G2 i.i.d. Geometric, Pr[G = g] = (1 - p) p^g (n shares of NB(1/n, p) summed),
  # by convolution (truncated where p^g < 1e-17); the bound must be the least integer
  # alpha with d Pr[|G1 - G2| > alpha] <= beta.
  shape = M.BsvsShape(4, 2, 1)
  mech = M.ShuffleMultiMessage(shape, 1.0, 1e-6, 200)
  p = mech.noise.p
  g = np.arange(int(math.ceil(math.log(1e-17) / math.log(p))))
  geo = (1 - p) * p**g
  diff = np.convolve(geo, geo[::-1])  # support -(G-1) .. G-1
  z = np.arange(-(len(g) - 1), len(g))
  exceed = lambda alpha: float(diff[np.abs(z) > alpha].sum())
  alpha = mech.max_error_bound(beta)
  assert alpha == int(alpha) and alpha >= 0
  assert shape.d * exceed(alpha) <= beta
  assert alpha == 0 or shape.d * exceed(alpha - 1) > beta
  assert mech.max_error_bound(beta, None, 200) == alpha
  assert mech.max_error_bound(beta, None, 199) is None  # NB(m/n, p) with m != n: no exact bound
  with pytest.raises(ValueError, match="num_clients"):
    mech.max_error_bound(beta, None, 2.5)


def test_message_counts_and_expected_messages():
  # Total messages of n clients = n*c + sum_j (G1 + G2 + 2F)_j; exact mean and variance.
  # 300 runs; z-test with false-failure rate 1e-3.
  w = M.synthetic_workload(jax.random.key(6), num_clients=50, num_buckets=3, num_labels=2, k=1)
  inp = w.materialize()
  mech = M.ShuffleMultiMessage(w.shape, 1.0, 1e-6, 50)
  nz = mech.noise
  totals = np.array([simulation.client_statistics(jax.random.key(2000 + i), mech, inp).sum()
                     for i in range(300)], np.float64)
  d = w.shape.d
  mean = 50 * mech.expected_messages()
  var = d * (2 * nz.p / (1 - nz.p) ** 2 + 4 * nz.rho * nz.p_flood / (1 - nz.p_flood) ** 2)
  assert mean == pytest.approx(50 * 1 + 2 * d * nz.p / (1 - nz.p) + 2 * d * nz.rho * nz.p_flood / (1 - nz.p_flood))
  assert abs(totals.mean() - mean) / math.sqrt(var / len(totals)) < stats.norm.isf(5e-4)


@functools.lru_cache(maxsize=None)
def protocol_case():
  """The 40-client protocol run shared by the shuffle checks: (key, mechanism, inputs).

  k = 2: four shifts. Noise calibrated for (1, 1e-6) with kr = 1 composes to at most
  (2, 2e-6) by basic composition, so the target (2, 1e-5) holds.
  """
  w = M.synthetic_workload(jax.random.key(7), num_clients=40, num_buckets=3, num_labels=2, k=2)
  mech = M.ShuffleMultiMessage(w.shape, 2.0, 1e-5, 40, noise=accounting.calibrate_multi_message(1.0, 1e-6))
  return jax.random.key(8), mech, w.materialize()


def client_order_rows(key, mech, inputs):
  """int32 [M, 2] every client's (index, sign) rows in client order (before any shuffle); [n] rows per client.

  Rebuilt from the documented keys (client i randomizes with fold_in(split(key)[0], i)):
  client 0's rows, then client 1's, ...; within a client entry by entry, its (j, +1)
  copies before its (j, -1) copies.
  """
  clients_key = jax.random.split(key)[0]
  n = inputs.num_clients
  one = lambda i, b, lab: mech.randomize(jax.random.fold_in(clients_key, i), b, lab)
  per = np.asarray(jax.jit(jax.vmap(one))(jnp.arange(n, dtype=jnp.uint32), inputs.buckets, inputs.labels))
  rows = [(j, sign) for i in range(n) for j in range(mech.shape.d)
          for col, sign in ((0, 1), (1, -1)) for _ in range(int(per[i, j, col]))]
  return np.array(rows, np.int32).reshape(-1, 2), per.sum(axis=(1, 2))


SHUFFLE_TEST_ALPHA = 1e-3  # family-wise over the two statistics of arrangement_p_values


def arrangement_p_values(rows, num_perms=9999):
  """Two-sided Monte Carlo p-values that ``rows`` is a uniformly random arrangement of its multiset.

  Statistics (rows coded 2 index + [sign < 0]): adjacent equal rows, and adjacent
  non-decreasing rows. Client order is extreme on both (a client's noise copies are
  contiguous, and its rows ascend). The reference law is that of ``num_perms`` uniform
  numpy permutations of the same rows (fixed seed); under a uniform shuffle the observed
  arrangement is exchangeable with them, so Pr[p <= a] <= a for each statistic.
  """
  code = 2 * rows[:, 0].astype(np.int64) + (rows[:, 1] < 0)
  perms = np.random.default_rng(0).permuted(np.tile(code, (num_perms, 1)), axis=1)
  out = []
  for stat in (lambda c: (c[..., 1:] == c[..., :-1]).sum(-1), lambda c: (c[..., 1:] >= c[..., :-1]).sum(-1)):
    obs, null = stat(code), stat(perms)
    upper, lower = (1 + np.sum(null >= obs)) / (num_perms + 1), (1 + np.sum(null <= obs)) / (num_perms + 1)
    out.append(min(1.0, 2 * min(upper, lower)))
  return out


def test_protocol_with_real_shuffle_equals_streamed_counts():
  key, mech, inp = protocol_case()
  shape = mech.shape
  tr = M.shuffle_multi_message_protocol(key, mech, inp)
  res = simulation.simulate(key, mech, inp, chunk_size=7)
  np.testing.assert_array_equal(tr.counts, np.asarray(res.stats).reshape(-1, 2))
  np.testing.assert_array_equal(tr.estimate, res.estimate)
  assert tr.messages.shape == (int(tr.messages_per_client.sum()), 2)
  assert set(np.unique(tr.messages[:, 1]).tolist()) <= {-1, 1}
  assert np.all(tr.messages_per_client >= shape.c)  # every client sends its kr real messages
  # The rows are the clients' messages (same multiset and per-client totals) ...
  ordered, sizes = client_order_rows(key, mech, inp)
  sort = lambda rows: rows[np.lexsort((rows[:, 1], rows[:, 0]))]
  np.testing.assert_array_equal(sort(tr.messages), sort(ordered))
  np.testing.assert_array_equal(tr.messages_per_client, sizes)
  # ... but not in client order. A uniform shuffle returns client order with probability
  # prod_v c_v! / M! (c_v: copies of row v), computed here; test_protocol_check_fails_without_a_shuffle
  # shows this check (and the next) fails when the permutation is the identity.
  _, copies = np.unique(ordered, axis=0, return_counts=True)
  log_same = sum(math.lgamma(c + 1) for c in copies) - math.lgamma(len(ordered) + 1)
  assert log_same < math.log(1e-100)
  assert not np.array_equal(tr.messages, ordered)
  # And the arrangement looks uniform: Monte Carlo tests at 5e-4 each (Bonferroni over 2:
  # false-failure rate 1e-3; the seeds are fixed, so the outcome is deterministic).
  assert min(arrangement_p_values(tr.messages)) > SHUFFLE_TEST_ALPHA / 2
  truth = np.asarray(M.bsvs_counts(inp, shape))
  assert np.abs(tr.estimate - truth).max() < 80  # DLap(e^{-1/4}): Pr[|Z| >= 80] < 1e-8 per entry


def test_protocol_check_fails_without_a_shuffle(monkeypatch):
  # Power of the checks above: with jax.random.permutation (the protocol's shuffler, per its
  # docstring) replaced by the identity, the protocol's rows are exactly client_order_rows
  # (so that reference is right), and both arrangement statistics reject at their minimum
  # p-value 2e-4 < 5e-4 (measured: 51 and 39 sd from the null means at this seed).
  key, mech, inp = protocol_case()
  monkeypatch.setattr(jax.random, "permutation", lambda k, x, *a, **kw: np.arange(x))
  tr = M.shuffle_multi_message_protocol(key, mech, inp)
  np.testing.assert_array_equal(tr.messages, client_order_rows(key, mech, inp)[0])
  assert max(arrangement_p_values(tr.messages)) <= SHUFFLE_TEST_ALPHA / 2


def test_privacy_statement():
  shape = M.BsvsShape(40, 10, 1)
  mech = M.ShuffleMultiMessage(shape, 1.0, 1e-6, 10**6)
  st_ = mech.privacy()
  assert st_.relation is accounting.Relation.REPLACE_ONE
  assert st_.epsilon == 1.0 and 0 < st_.delta <= 1e-6
  assert st_.parameters["shifts"] == 2 and st_.parameters["num_clients"] == 10**6
  assert st_.parameters["sampler_tv_bound"] < 1e-15
  assert st_.parameters["expected_messages_per_client"] == pytest.approx(mech.expected_messages())
  assert mech.name == "shuffle-multi"


def test_given_noise_must_meet_the_target():
  shape = M.BsvsShape(2, 1, 1)
  with pytest.raises(ValueError, match="noise"):
    M.ShuffleMultiMessage(shape, 1.0, 1e-6, 10, noise=TINY)
  with pytest.raises(ValueError, match="noise"):
    M.ShuffleMultiMessage(shape, 1.0, 1e-6, 10, noise=(0.5, 1.0, 0.5))
  # The split of epsilon is the calibration's: with given noise it did nothing, yet the statement reported it.
  good = accounting.calibrate_multi_message(1.0, 1e-6)
  assert M.ShuffleMultiMessage(shape, 1.0, 1e-6, 10, noise=good).noise == good
  with pytest.raises(ValueError, match=r"Expected dlap_fraction=0.5 \(the default\) with noise given: .*got "
                                       r"dlap_fraction=0.9\.$"):
    M.ShuffleMultiMessage(shape, 1.0, 1e-6, 10, dlap_fraction=0.9, noise=good)


@pytest.mark.parametrize("kwargs,param", [
    ({"epsilon": 0.0}, "epsilon"), ({"epsilon": -1.0}, "epsilon"), ({"epsilon": math.nan}, "epsilon"),
    ({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"), ({"delta": math.nan}, "delta"),
    ({"num_clients": 0}, "num_clients"), ({"num_clients": 2.5}, "num_clients"),
    ({"dlap_fraction": 1.0}, "dlap_fraction"),
])
def test_bad_input(kwargs, param):
  args = {"shape": M.BsvsShape(2, 1, 1), "epsilon": 1.0, "delta": 1e-6, "num_clients": 10, **kwargs}
  with pytest.raises(ValueError, match=param):
    M.ShuffleMultiMessage(**args)


def test_too_few_clients_for_the_noise_is_a_clear_error():
  # n = 1 client would carry all the noise of d = 2000 entries (~8e4 Poisson events).
  with pytest.raises(ValueError, match="num_clients"):
    M.ShuffleMultiMessage(M.BsvsShape(200, 10, 1), 1.0, 1e-6, 1)


def test_bad_accounting_and_sampler_input():
  with pytest.raises(ValueError, match="p"):
    accounting.MultiMessageNoise(1.0, 1.0, 0.5)
  with pytest.raises(ValueError, match="rho"):
    accounting.MultiMessageNoise(0.5, math.nan, 0.5)
  with pytest.raises(ValueError, match="target_delta"):
    accounting.calibrate_multi_message(1.0, 0.0)
  with pytest.raises(ValueError, match="target_epsilon"):
    accounting.calibrate_multi_message(-1.0, 1e-6)
  with pytest.raises(ValueError, match="r"):
    M.sample_negative_binomial(jax.random.key(0), 0.0, 0.5, (3,))
  with pytest.raises(ValueError, match="p"):
    M.sample_negative_binomial(jax.random.key(0), 1.0, 1.5, (3,))
  # tail_mass=5e-324 was "math domain error"; dlap_fraction=5e-324 gave an infinite least epsilon; rho=1e308 an
  # infinite expected message count; dlap_fraction near 1 named only noise=..., which the caller never passed.
  with pytest.raises(ValueError, match=r"Expected tail_mass=5e-324 >= 1e-300"):
    accounting.multi_message_pld(accounting.MultiMessageNoise(0.5, 1.0, 0.5), tail_mass=5e-324)
  with pytest.raises(ValueError, match=r"Expected dlap_fraction=5e-324 large enough for a finite epsilon"):
    accounting.min_calibration_epsilon(dlap_fraction=5e-324)
  with pytest.raises(ValueError, match=r"finite expected message count; .* \(rho=1e\+308\)"):
    accounting.multi_message_expected_messages(accounting.MultiMessageNoise(0.5, 1e308, 0.5), num_clients=10, d=4,
                                               c=1)
  with pytest.raises(ValueError, match=r"with dlap_fraction=0.9999: .*lower dlap_fraction=0.9999\.$"):
    M.ShuffleMultiMessage(M.BsvsShape(4, 3, 1), 1.0, 1e-6, 1000, dlap_fraction=0.9999)
  # No bound on the shape: (2**40,) returned a lazy out-of-memory array, and reading it aborted the process.
  with pytest.raises(ValueError, match=r"Expected shape=1099511627776 <= 2147483647\."):
    M.sample_negative_binomial(jax.random.key(0), 1e-3, 0.5, (2**40,))
  with pytest.raises(ValueError, match=r"shape=\(65536, 65536\) to hold at most 2147483647 draws .*got 4294967296"):
    M.sample_negative_binomial(jax.random.key(0), 1e-3, 0.5, (2**16, 2**16))


# -- the runner's fast path: random access into a draw's words -------------------------------
def test_bits_at_reads_jax_random_bits_words():
  key = jax.random.key(4)
  assert nbs.random_access_supported(jax.random.split(key, 3))
  words = np.asarray(jax.random.bits(key, (23, 3), jnp.uint32)).reshape(-1)
  idx = np.array([0, 1, 2, 40, 68], np.uint32)
  np.testing.assert_array_equal(np.asarray(nbs.bits_at(jax.random.key_data(key), idx)), words[idx])
  assert not nbs.random_access_supported(jax.random.key(0, impl="rbg"))


def test_event_counts_fast_path_equals_the_96_bit_search_on_ties():
  # The fast path compares only the top word of each client's 96-bit uniform with the
  # thresholds' top words and falls back to the full search when they tie. Thresholds
  # built from the clients' own words force ties (both ways on the lower words).
  import dataclasses
  keys = jax.random.split(jax.random.key(8), 64)
  words = np.asarray(jax.vmap(lambda k: jax.random.bits(k, (3,), jnp.uint32))(keys))
  values = [int(w[0]) << 64 | int(w[1]) << 32 | int(w[2]) for w in words[:6]]
  values = sorted({v + d for v, d in zip(values, (1, 0, -1, 1, 0, -1))}, reverse=True)
  tables = dataclasses.replace(nbs.compound_poisson_tables((0.5,), (0.5,), 1),
                               count=nbs._words(values))
  fast = np.asarray(jax.jit(nbs.compound_poisson_event_counts, static_argnums=1)(keys, tables))
  full = np.asarray(nbs.count_below(jnp.asarray(words), tables.count))
  np.testing.assert_array_equal(fast, full)
  assert set(fast[:6]) != {fast[0]}  # the ties were decided by the lower words
  # Without ties the fast path answers from the top words alone; same integers.
  plain = nbs.compound_poisson_tables((0.5,), (0.5,), 1)
  np.testing.assert_array_equal(
      np.asarray(jax.jit(nbs.compound_poisson_event_counts, static_argnums=1)(keys, plain)),
      np.asarray(nbs.count_below(jnp.asarray(words), plain.count)))


@pytest.mark.parametrize("eps", [15.0, 20.0])
def test_larger_epsilon_calibrates_and_verifies(eps):
  # A larger epsilon is a weaker requirement. The calibration used to fail from eps ~ 15:
  # its largest flooding multiplier needs rho ~ ln(1/delta) e^b > 2^24 there.
  mech = M.ShuffleMultiMessage(M.BsvsShape(3, 2, 1), eps, 1e-6, 100)
  statement = mech.privacy()
  assert statement.epsilon == eps and statement.delta <= 1e-6
  assert accounting.multi_message_delta(mech.noise, eps) <= 1e-6


@pytest.mark.parametrize("eps,match", [(45.0, "epsilon=45.0 small enough that the sampler's total-variation"),
                                       (60.0, "epsilon=60.0 small enough that the sampler's total-variation"),
                                       (500.0, "epsilon=500.0 <= 60")])
def test_epsilon_beyond_what_the_accounting_supports_is_a_clear_error(eps, match):
  # 45, 60: (1 + e^eps) times the sampler's total variation (~8e-25 at n = 100) exceeds
  # delta (past the calibration, it recalibrated to a negative delta); 500: above the cap
  # of 60 (an IndexError inside dp-accounting).
  with pytest.raises(ValueError, match=match):
    M.ShuffleMultiMessage(M.BsvsShape(3, 2, 1), eps, 1e-6, 100)


def test_calibration_epsilon_above_the_cap_is_a_clear_error():
  with pytest.raises(ValueError, match="target_epsilon=150.0 <= 60"):
    accounting.calibrate_multi_message(150.0, 1e-6)


def test_epsilon_below_what_the_accounting_can_evaluate_is_a_clear_error():
  # eps = 1e-4 calibrated for more than 5 minutes and several GiB; eps = 1e-6 was killed for memory
  # (24 GiB). Each now refuses at once, naming the smallest supported epsilon.
  least = accounting.min_calibration_epsilon()
  assert 1e-3 < least < 1.1e-3
  # Linear in kr / dlap_fraction: the bound is on a = dlap_fraction * eps / (2kr).
  assert accounting.min_calibration_epsilon(k=2, r=3, dlap_fraction=0.25) == pytest.approx(12 * least)
  with pytest.raises(ValueError, match=r"target_epsilon=1e-06 >= 0.00106"):
    accounting.calibrate_multi_message(1e-6, 1e-6)
  with pytest.raises(ValueError, match=r"epsilon=0.0001 >= 0.00106"):
    M.ShuffleMultiMessage(M.BsvsShape(3, 2, 1), 1e-4, 1e-6, 100)
  # The bound is where the discrete-Laplace window reaches half the outcome budget.
  half = mm.MAX_VIEW_OUTCOMES // 2
  a_least = 0.5 * least / 2
  assert mm._geometric_window(a_least, mm.DEFAULT_TAIL_MASS) <= half < mm._geometric_window(
      a_least * 0.999, mm.DEFAULT_TAIL_MASS)


def test_a_given_noise_too_large_to_evaluate_is_a_clear_error():
  # A hand-made noise with p or the flooding too close to 1 for the exact view: one ValueError
  # naming the noise, before any array of its size is built.
  for noise in (accounting.MultiMessageNoise(1 - 1e-9, 1.0, 0.5), accounting.MultiMessageNoise(0.5, 1e6, 0.9)):
    with pytest.raises(ValueError, match="outcomes at tail mass"):
      accounting.multi_message_delta(noise, 1.0)


def test_wrapped_int32_message_counts_are_refused():
  # An entry's count is a_j plus flooding, so at n near 2^31 it can pass 2^31 - 1 and wrap to a
  # negative int32; the estimate would then be off by 2^32. The analyzer refuses such counts.
  mech = M.ShuffleMultiMessage(M.BsvsShape(3, 2, 1), 1.0, 1e-6, 100)
  counts = np.zeros((6, 2), np.int32)
  counts[2, 0] = np.array(2**31 + 4, np.int64).astype(np.int32)  # 2^31 + 4 wrapped to int32
  with pytest.raises(ValueError, match="int32 overflow"):
    mech.estimate(None, counts, 100)
  counts[2, 0] = 7
  assert mech.estimate(None, counts, 100)[1, 0] == 7.0  # row 1, label 0 = entry 2


def test_sampler_names_p_outside_its_supported_range():
  # p = 1e-300 raised decimal.InvalidOperation (1 - p rounds to 1 in 50 digits: 0 / 0); p = 1e-30 said
  # "probs[0] ... further from 1" after seconds of table building. The range is [1e-20, 1 - ~2e-5].
  key = jax.random.key(0)
  for p in (1e-300, 1e-30, 1e-21):
    for call in (lambda: M.sample_negative_binomial(key, 1.0, p, (2,)), lambda: nbs.total_variation_bound(1.0, p)):
      with pytest.raises(ValueError, match=r"p=.* >= 1e-20") as err:
        call()
      assert "probs" not in str(err.value)
  with pytest.raises(ValueError, match=r"p=0\.99999 further from 1") as err:
    M.sample_negative_binomial(key, 1.0, 0.99999, (2,))
  assert "probs" not in str(err.value)
  with pytest.raises(ValueError, match=r"r=1000000\.0 and p=0\.5"):  # too many events per draw
    M.sample_negative_binomial(key, 1e6, 0.5, (2,))
  # The internal tables (also used by ShuffleMultiMessage) refuse such p with a ValueError too.
  with pytest.raises(ValueError, match=r"probs\[0\]=1e-300 >= 1e-20"):
    nbs.compound_poisson_tables((1.0,), (1e-300,), 1)
  # At the edge of the range the sampler works; with r p ~ 1e-20 it returns zeros.
  assert np.asarray(M.sample_negative_binomial(key, 1.0, 1e-20, (3,))).tolist() == [0, 0, 0]
  assert nbs.total_variation_bound(1.0, 1e-20) < 1e-27


def test_a_user_noise_below_the_sampler_range_is_named_not_blamed_on_num_clients():
  # A tiny p_flood (or p) was reported as "Expected more num_clients ..." after the tables failed.
  shape = M.BsvsShape(2, 2, 1)
  for field, noise in (("p_flood", accounting.MultiMessageNoise(TINY.p, TINY.rho, 1e-30)),
                       ("p", accounting.MultiMessageNoise(1e-30, TINY.rho, TINY.p_flood))):
    with pytest.raises(ValueError, match=rf"noise\.{field}=1e-30 >= 1e-20") as err:
      M.ShuffleMultiMessage(shape, 2.0, 0.99, 100, noise=noise)
    assert "num_clients" not in str(err.value)


def test_a_noise_near_1_is_named_not_blamed_on_num_clients():
  # p or p_flood so close to 1 that the Logarithmic table cannot be built was reported as "Expected more
  # num_clients than ..." at any n, n = 10^12 included: no number of clients fixes it.
  shape = M.BsvsShape(2, 2, 1)
  for noise in (accounting.MultiMessageNoise(1 - 1e-7, TINY.rho, TINY.p_flood),
                accounting.MultiMessageNoise(TINY.p, TINY.rho, 1 - 1e-7)):
    for n in (1000, 10**12):
      with pytest.raises(ValueError, match=r"Expected noise\.p=.* and noise\.p_flood=.* that the multi-message "
                                           r"sampler's tables can resolve \(.*further from 1") as err:
        M.ShuffleMultiMessage(shape, 2.0, 0.99, n, noise=noise)
      assert "num_clients" not in str(err.value) and "\n" not in str(err.value)


def test_estimate_checks_its_statistics():
  # The analyzer reshaped whatever it got: a transposed [2, d] gave wrong numbers, fractions were truncated,
  # booleans counted, and num_clients='abc' passed; a NaN was blamed on an int32 overflow.
  mech = M.ShuffleMultiMessage(M.BsvsShape(2, 2, 1), 1.0, 1e-6, 1000)
  stats = np.array([[10, 3], [20, 4], [30, 5], [40, 6]])
  np.testing.assert_array_equal(mech.estimate(None, stats, 1000), [[7.0, 16.0], [25.0, 34.0]])
  np.testing.assert_array_equal(mech.estimate(None, stats.reshape(-1).astype(np.float64), 1000),
                                [[7.0, 16.0], [25.0, 34.0]])  # flat and whole floats pass
  for bad, needle in ((stats.T.copy(), r"Expected stats of shape \[d, 2\] = \[4, 2\] .*got shape \[2, 4\]"),
                      (stats + 0.5, r"Expected stats to hold message counts .*found 10\.5"),
                      (stats.astype(bool), "Expected stats to hold real numbers"),
                      (np.where(stats == 10, np.nan, stats), r"message counts .*found nan"),
                      (np.zeros(10), r"got shape \[10\]")):
    with pytest.raises(ValueError, match=needle) as err:
      mech.estimate(None, bad, 1000)
    assert "\n" not in str(err.value)
  with pytest.raises(ValueError, match="Expected num_clients to be an integer, got 'abc'"):
    mech.estimate(None, stats, "abc")
  with pytest.raises(ValueError, match=r"Expected counts"):
    mech.max_error_bound(0.05, "abc", 1000)


def test_cached_statements_and_tables_are_not_shared_for_writing():
  # privacy() returned the lru_cached PrivacyStatement itself: a caller editing its parameters (a dict) changed the
  # statement of every later equal mechanism, reports and the labeling ledger's check included. The sampler's
  # cached tables (ShuffleMultiMessage.tables()) were writable arrays shared the same way.
  shape = M.BsvsShape(3, 2, 1)
  first = M.ShuffleMultiMessage(shape, 1.0, 1e-6, 100).privacy()
  first.parameters["target_delta"] = 0.5
  again = M.ShuffleMultiMessage(shape, 1.0, 1e-6, 100).privacy()
  assert again.parameters["target_delta"] == 1e-6
  assert again.to_dict() == M.ShuffleMultiMessage(shape, 1.0, 1e-6, 100).privacy().to_dict()
  tables = M.ShuffleMultiMessage(shape, 1.0, 1e-6, 100).tables()
  for name in ("count", "mark", "mark_stream", "mark_size", "cell"):
    with pytest.raises(ValueError, match="read-only"):
      getattr(tables, name)[...] = 0
  from jaxdistill.mechanisms._collision import _coin_thresholds  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="read-only"):
    _coin_thresholds(0.25, 2)[...] = 0  # cached the same way (Collision's exact coins)
