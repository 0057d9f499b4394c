"""The auditor on the labeling pipeline's multi-message shuffle release, end to end, at the worst pair.

``test_labeling_release_audit`` audits the central and local releases; this module audits what the analyzer of
``mechanism="shuffle-multi"`` sees. The mechanism is the one ``plan_budget`` -> ``build_mechanism`` builds for the
run (T = 1: the target (eps, delta) itself; T = 2: (eps_t, delta/(2T)) per iteration, composed by the noise's PLD),
with n = |D_priv| = 6 clients of one record each, on the same worst pair of private data (record 0 moves; its
four edge-label cells change). In each iteration every client sends its real messages plus its share of the
negative-binomial noise and flooding, keyed as ``simulate`` keys it; the shuffled multiset is the per-entry counts
of (j, +) and (j, -) messages summed over the clients, int32 [T, d, 2], and that is the audited output. It is
summed as ``simulate`` sums it; a test checks it against ``simulate`` and against the clients' own messages.

The statistic is the view's exact log-likelihood ratio under the analysed law: an entry with a real votes shows
(a + G1 + F, G2 + F), G ~ NB(1, p) (the n shares' sum) and F ~ NB(rho, p'), and only the four changed entries
carry information. The reference (epsilon, delta) of the pair is computed here without the library's accounting:
the per-entry pmfs from SciPy's negative binomial, one dp-accounting PLD per changed entry (two entries gain D0's
message, two D1's; the two directions compose to the same PLD), composed over the entries and the T iterations
(pessimistic, grid 1e-4; the truncated mass, below 1e-8 in all, added). The sampler's float shares sum to at
least the analysed shapes (the surplus noise is post-processing), and its total-variation allowance (added; below
1e-12) covers its tables.

What it shows, at the target (eps, delta) = (1, 0.01):

* T = 1: the pair's exact delta at eps = 1 is 0.0099967 (the calibration is tight); no alarm.
* T = 2: eps_t = 0.991 and the pair's exact delta at eps = 1 is 0.0099670; no alarm. The split by worst-case
  (eps_t, delta_t) pairs (shuffle-single's without n, and shuffle-multi's before) gave eps_t = 0.507, and its
  pair's exact epsilon at delta = 0.01 is 0.462: more than half the budget unused.
* A mechanism built for 60 clients while the 6 records' clients are all that send (n miscounted, or clients that
  dropped out) has a tenth of the noise: its exact delta at eps = 1 is 0.945, and the audit alarms.

Rates. Each audit runs at alpha = 1e-4 (Clopper-Pearson + Bonferroni), which bounds both a false alarm and a bound
above the pair's exact epsilon (or delta): three audits, family-wise <= 3e-4. The floors are separate events;
their spread at the tests' seeds and at 100-109:

=================================  =========  ==========================  =======================================
audit                              samples    bound: mean (sd)            floor, sd below the mean
=================================  =========  ==========================  =======================================
T = 1                              200,000    epsilon 0.812 (0.038)       0.55, 6.8
T = 2                              100,000    epsilon 0.803 (0.024)       0.65, 6.3
built for 60 clients (planted)     200,000    delta 0.805 (0.009)         0.4, 43 (an alarm: claim 0.01)
=================================  =========  ==========================  =======================================

so each floor fails with probability < 1e-9 under a normal approximation of the bound. (At T = 1 the delta
bound at eps = 1 is a weaker witness of power: 0.0052, sd 0.0009.) Seeds are fixed; the outcome is deterministic.
"""

import functools
import math

from dp_accounting.pld import privacy_loss_distribution as pld_lib
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import linalg, stats

from jaxdistill import audit, labeling, mechanisms
from jaxdistill.simulation import simulate
from tests.audit.test_labeling_release_audit import ALPHA, EPSILON, N, counts_of, pipeline_pieces

DELTA = 0.01
NUM_CLIENTS = 6  # |D_priv| of the pair: one record per client
SIZE = 400  # the statistic clips counts here; the reference's grid is at least this (tails checked)
VDI = 1e-4  # dp-accounting's value discretization interval for the reference


def shuffle_pieces(iterations):
  return pipeline_pieces("discrete-laplace", iterations, "shuffle-multi", delta=DELTA)


def view_of(mech, iterations, messages=False):
  """``(key, clients) -> int32 [T, d, 2]``: the analyzer's counts of (j, +) and (j, -) in each iteration.

  Summed as ``simulate`` sums them (``chunk_statistics``, twice as fast), or with ``messages=True`` from each
  client's own ``randomize``: bitwise the same (checked).
  """
  def run(key, x):
    out = []
    for t in range(1, iterations + 1):
      clients_key = jax.random.split(jax.random.fold_in(key, t))[0]  # simulate's clients key of iteration t
      keys = jax.vmap(lambda i: jax.random.fold_in(clients_key, i))(jnp.arange(x.buckets.shape[0]))
      if messages:
        out.append(jax.vmap(mech.randomize)(keys, x.buckets, x.labels).sum(0))
      else:
        out.append(mech.chunk_statistics(keys, x.buckets, x.labels, jnp.ones(x.buckets.shape[0], bool)))
    return jnp.stack(out)
  return run


def noise_shapes(mech, clients=NUM_CLIENTS):
  """(total NB shape of G, total NB shape of F) when ``clients`` clients send ``mech``'s shares."""
  g, f = mech.share_shapes()
  return clients * g, clients * f


@functools.lru_cache(maxsize=None)
def entry_pmf(p, g_shape, rho, p_flood, size=SIZE):
  """Pr[(G1 + F, G2 + F) = (u, v)] on [0, size]^2 with G1, G2 ~ NB(g_shape, p), F ~ NB(rho, p'), and the tail.

  q[u, v] = sum_w Pr[F = w] Pr[G1 = u - w] Pr[G2 = v - w] is the product A diag(f) A^T with A[u, w] = Pr[G = u - w]
  (lower triangular): a sum of non-negative terms, so each entry, however small, keeps its relative precision.
  """
  grid = np.arange(size + 1)
  g = stats.nbinom.pmf(grid, g_shape, 1 - p)
  f = stats.nbinom.pmf(grid, rho, 1 - p_flood)
  a = linalg.toeplitz(g, np.zeros_like(g))
  q = (a * f) @ a.T
  return q, max(0.0, 1.0 - q.sum())


def law(mech, analysed=True):
  """The per-entry law's parameters: the analysed one (G ~ NB(1, p)), or what 6 clients' shares sum to."""
  nz = mech.noise
  g_shape, f_shape = (1.0, nz.rho) if analysed else noise_shapes(mech)
  return nz.p, g_shape, f_shape, nz.p_flood


def rounded_pld(lower, upper):
  """dp-accounting's pessimistic PLD of the loss ln(upper / lower) under ``upper``, grid VDI.

  What ``from_two_probability_mass_functions`` builds from the two pmfs' outcomes above 1e-300, vectorized (that
  constructor loops over the grid's millions of outcomes in Python): each outcome's loss rounded up to a multiple of
  VDI, its upper mass summed per multiple; an outcome that only ``upper`` shows is infinite loss.
  """
  seen_lower, seen_upper = lower > 1e-300, upper > 1e-300
  both = seen_lower & seen_upper
  steps = np.ceil((np.log(upper[both]) - np.log(lower[both])) / VDI).astype(np.int64)
  values, where = np.unique(steps, return_inverse=True)
  mass = np.bincount(where.ravel(), weights=upper[both])
  return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
      dict(zip(values.tolist(), mass.tolist())), float(upper[seen_upper & ~seen_lower].sum()), VDI,
      pessimistic_estimate=True)


@functools.lru_cache(maxsize=None)
def reference_pld(params, iterations, moves_0, moves_1):
  """The pair's PLD (D0 over D1) and truncated mass: ``moves_0`` entries gain D0's message, ``moves_1`` D1's.

  The grid reaches the 1 - 1e-13 quantiles of G and F (at least SIZE); the truncated mass is checked below 1e-8.
  """
  p, g_shape, rho, p_flood = params
  size = max(SIZE, int(stats.nbinom.isf(1e-13, g_shape, 1 - p) + stats.nbinom.isf(1e-13, rho, 1 - p_flood)))
  q, tail = entry_pmf(*params, size)
  assert 2 * iterations * (moves_0 + moves_1) * tail < 1e-8, f"size={size} truncates {tail:.3g} per entry"
  shifted = np.zeros_like(q)
  shifted[1:] = q[:-1]  # one more (j, +) message
  gain_0, gain_1 = rounded_pld(q, shifted), rounded_pld(shifted, q)
  one = gain_0.self_compose(moves_0).compose(gain_1.self_compose(moves_1))
  return one.self_compose(iterations) if iterations > 1 else one, 2 * iterations * (moves_0 + moves_1) * tail


def reference(mech, inputs, iterations, analysed=True):
  c0, c1 = counts_of(mech, inputs)
  pld, tail = reference_pld(law(mech, analysed), iterations, int(np.sum(c0 > c1)), int(np.sum(c1 > c0)))
  return pld, tail + mech.sampler_tv_bound()


def llr_statistic(mech, inputs, analysed=True):
  """ln Pr_D0[view] - ln Pr_D1[view], summed over the changed entries and the T iterations (float32)."""
  q, _ = entry_pmf(*law(mech, analysed))
  with np.errstate(divide="ignore"):
    log_q = jnp.asarray(np.maximum(np.log(np.pad(q, ((0, 1), (0, 0)))), -1e4), jnp.float32)  # row SIZE + 1: 0
  c0, c1 = (jnp.asarray(c.ravel(), jnp.int32) for c in counts_of(mech, inputs))

  def lq(a, b):  # the log-pmf at noise offsets (a, b); a < 0 is impossible
    return log_q[jnp.where(a < 0, SIZE + 1, jnp.minimum(a, SIZE)), jnp.minimum(b, SIZE)]

  def statistic(view):
    plus, minus = view[..., 0], view[..., 1]
    return jnp.sum(lq(plus - c0, minus) - lq(plus - c1, minus))
  return statistic


def run_audit(mech, inputs, iterations, seed, analysed=True, num_samples=N):
  return audit.audit_privacy(jax.random.key(seed), view_of(mech, iterations), *inputs, num_samples=num_samples,
                             alpha=ALPHA, claimed_epsilon=EPSILON, claimed_delta=DELTA, batch_size=50_000,
                             statistic=llr_statistic(mech, inputs, analysed))


def test_the_audited_view_is_what_simulate_sums():
  mech, inputs = shuffle_pieces(2)
  assert mech.num_clients == NUM_CLIENTS and mech.shape == mechanisms.BsvsShape(3, 2, 2)
  assert mech.delta == DELTA / 4 and mech.privacy().delta <= DELTA / 4  # delta_t = delta / 2T
  keys = jax.random.split(jax.random.key(7), 500)
  for x in inputs:
    summed, sent = (jax.jit(jax.vmap(view_of(mech, 2, m), in_axes=(0, None)))(keys, x) for m in (False, True))
    np.testing.assert_array_equal(summed, sent)
  key = keys[0]
  view = np.asarray(view_of(mech, 2)(key, inputs[0]))
  for t in (1, 2):
    got = simulate(jax.random.fold_in(key, t), mech, inputs[0]).estimate
    np.testing.assert_array_equal(np.asarray(got).ravel(), view[t - 1, :, 0] - view[t - 1, :, 1])
  # Each entry's messages are its real votes, the (j, +) and (j, -) noise and twice the flooding: never fewer
  # (j, +) messages than votes.
  c0, _ = counts_of(mech, inputs)
  assert np.all(view[..., 0] >= c0.ravel())


def test_the_vectorized_reference_pld_is_dp_accountings_own():
  # rounded_pld against dp-accounting's from_two_probability_mass_functions on a small grid: the same PLD, infinite
  # mass included (under q, the outcomes of row 0, which the shifted pmf never shows).
  mech, _ = shuffle_pieces(1)
  q, _ = entry_pmf(*law(mech), 60)
  shifted = np.zeros_like(q)
  shifted[1:] = q[:-1]
  for lower, upper in ((q, shifted), (shifted, q)):
    logs = [{(u, v): math.log(m[u, v]) for u, v in zip(*np.nonzero(m > 1e-300))} for m in (lower, upper)]
    theirs = pld_lib.from_two_probability_mass_functions(*logs, pessimistic_estimate=True,
                                                         value_discretization_interval=VDI)
    ours = rounded_pld(lower, upper)
    for eps in (0.0, 0.1, 0.5, 1.0, 3.0):
      assert ours.get_delta_for_epsilon(eps) == pytest.approx(theirs.get_delta_for_epsilon(eps), rel=1e-9, abs=1e-300)
    assert ours.get_delta_for_epsilon(math.inf) == pytest.approx(theirs.get_delta_for_epsilon(math.inf), rel=1e-12)
  assert ours.get_delta_for_epsilon(math.inf) == pytest.approx(q[0].sum(), rel=1e-12) and q[0].sum() > 1e-3


def test_the_reference_finds_the_claims_tight_at_t1_and_t2():
  mech, inputs = shuffle_pieces(1)
  assert mech.epsilon == EPSILON and mech.delta == DELTA
  c0, c1 = counts_of(mech, inputs)
  assert np.abs(c1 - c0).sum() == 4 and np.sum(c0 > c1) == np.sum(c1 > c0) == 2
  assert mech.sampler_tv_bound() < 1e-12
  pld, slack = reference(mech, inputs, 1)
  assert 0.999 * DELTA < pld.get_delta_for_epsilon(EPSILON) + slack <= DELTA
  # T = 2: per iteration (eps_t, delta / 4), its noise composed twice within 0.1% of the total epsilon: tight too.
  mech, inputs = shuffle_pieces(2)
  pld, slack = reference(mech, inputs, 2)
  assert 0.99 * DELTA < pld.get_delta_for_epsilon(EPSILON) + slack <= DELTA
  # The split by worst-case pairs (shuffle-single's without n; shuffle-multi's before) uses less than half the budget.
  pairs = labeling.plan_budget("shuffle-single", EPSILON, DELTA, 2, k=2)
  loose = mechanisms.ShuffleMultiMessage(mech.shape, pairs.epsilon_per_iteration, pairs.delta_per_iteration,
                                         NUM_CLIENTS)
  pld, slack = reference(loose, inputs, 2)
  assert 0.4 * EPSILON < pld.get_epsilon_for_delta(DELTA - slack) < 0.5 * EPSILON
  assert mech.epsilon > 1.9 * pairs.epsilon_per_iteration  # 0.991 against 0.507


@pytest.mark.parametrize("iterations, num_samples, seed, floor", [(1, N, 51, 0.55), (2, N // 2, 52, 0.65)])
def test_no_alarm_on_the_shuffle_release_chain(iterations, num_samples, seed, floor):
  mech, inputs = shuffle_pieces(iterations)
  pld, slack = reference(mech, inputs, iterations)
  r = run_audit(mech, inputs, iterations, seed, num_samples=num_samples)
  assert not r.alarm and r.kind == "thresholds"
  assert r.delta_lower <= pld.get_delta_for_epsilon(EPSILON) + slack
  assert floor < r.epsilon_lower <= pld.get_epsilon_for_delta(DELTA - slack)


def test_a_mechanism_built_for_more_clients_than_send_is_caught():
  # build_mechanism is handed n = |D_priv|; a mechanism for 60 clients when the 6 records' clients are all that send
  # (n miscounted, or 54 dropped out) splits the noise 60 ways: G ~ NB(0.1, p), F ~ NB(rho / 10, p').
  mech, inputs = shuffle_pieces(1)
  wrong = mechanisms.ShuffleMultiMessage(mech.shape, mech.epsilon, mech.delta, 10 * NUM_CLIENTS)
  assert wrong.noise == mech.noise and wrong.privacy().delta == mech.privacy().delta  # its claim is the same
  assert noise_shapes(wrong) == pytest.approx((0.1, mech.noise.rho / 10), rel=1e-12)
  pld, slack = reference(wrong, inputs, 1, analysed=False)
  exact = pld.get_delta_for_epsilon(EPSILON) + slack
  assert exact > 50 * DELTA
  r = run_audit(wrong, inputs, 1, 53, analysed=False)
  assert r.alarm and 40 * DELTA < r.delta_lower <= exact
