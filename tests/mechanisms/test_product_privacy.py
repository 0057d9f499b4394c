"""Separation, Concatenation and ConcatenationLiteral: their eps-LDP claims, exactly and by audit.

Exact checks. One client's output is its public hash table(s) and its value(s) z. Its law is
enumerated from the Collision Definition (spec/REVERSE_KNN.md §1.7, §1.8), with the l and the
float64 p that the sampler draws:
  * Separation: two independent messages, Collision(eps/2, c = k, l1) on the buckets (domain s)
    and Collision(eps/2, c = r, l2) on the labels (domain |Y|). The law is the product.
  * Concatenation(Literal): one Collision(eps, c = k + r, l) on [T; y] (domain s + |Y|).
For every pair of client inputs (0..k buckets, 0..r labels), privacy_profile(P, Q, eps) must be
at most 1e-12. The worst epsilon_for_delta(P, Q, 0) must equal a closed form derived here.
Given h, one message puts p on each v in C = h(S) and f(|C|) = (1 - |C| p)/(l - |C|) on each
other v; f decreases in |C|, and f(0) = 1/l < p. The largest ratio P_S(h, v) / P_S'(h, v) is
therefore the larger of two cases:
  * p / f(m): v = h(a) for an item a in S but not in S', and h is injective on S'. Here m is the
    largest |S'| of an input that misses an item some other input holds. m = c unless every
    item fits into one input (s = k for buckets, |Y| = r for labels, both for Concatenation);
    then m = c - 1.
  * f(0) / f(M): S is empty, and S' is the largest input (M = c items).
At m = c the first case is e^eps (tight), because 1 - c p = (l - c)/Omega, and it dominates,
because f(0) < p. Below that, either case can be the larger one. (For example, with
|Y| = r = 1 and l2 = 2, {} against {label} is the worst label pair.)
A Separation pair can take each factor's worst case at once, so its exact epsilon is the sum.

Statistical audits. The library's randomizer (audit.local_randomizer) is audited on a worst
pair at alpha = 1e-4. The statistic is (z in h(S0), |h(S0)|, z in h(S1), |h(S1)|) per message.
Under input S_a the law of (h, z) is l^-D times a function of (z in h(S_a), |h(S_a)|), so the
statistic is sufficient for the pair and keeps the output's epsilon. The two audit events are
fixed in advance from the exact law: the bins where P0/P1, respectively P1/P0, is largest. So
there is no selection split, and each audit makes 4 (event, direction) bounds, each at level
alpha/8. False-failure rates:
  * A null audit alarms with probability <= alpha = 1e-4 (2 null audits: <= 2e-4).
  * Its floor on the lower bound fails with probability <= 2e-6. For the fixed top event,
    K0 ~ Bin(N, P0(E)) and K1 ~ Bin(N, P1(E)). Outside their 1e-6 binomial tails, the bound
    is at least the asserted value (see assured_epsilon_lower).
  * The planted bug misses its alarm with probability <= 2e-6, by the same argument.

Sampler checks. The library's own randomizer (mech.randomize, vmapped over keys) must draw from
the enumerated law: one shape per class (ConcatenationLiteral shares Concatenation's randomizer,
asserted), two inputs each, GOF_N draws per input. Each sampler test makes two chi-square tests
at level 5e-5: of the whole outcome (h, z) of each message, and of its sufficient statistic
(z in h(S), |h(S)|), which keeps the power against a wrong p. Sparse cells are pooled to
expected counts >= 5. A right sampler fails each sampler test with probability <= 1e-4 (2 tests:
<= 2e-4; chi-square p-values are asymptotic, and every expected count here is >= 10).
Family-wise for this file: <= 4.1e-4.
"""

import dataclasses
import functools
import itertools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdistill import accounting
from jaxdistill import audit
from jaxdistill import mechanisms as M
from jaxdistill.mechanisms import _collision
from tests.mechanisms.test_product import collision_law, definition_rates


def subsets(n, most):
  """All subsets of range(n) with at most ``most`` elements (the empty one included)."""
  return [S for size in range(most + 1) for S in itertools.combinations(range(n), size)]


def factor_epsilon(p, l, m, big_m):
  """ln of one Collision message's largest probability ratio (see the module docstring)."""
  f = lambda size: (1 - size * p) / (l - size)
  return math.log(max(p / f(m), f(0) / f(big_m)))


def check_parameters(l, p, q, eps, c):
  """l, p and q are the Definition's: l = floor(c e^eps + 2c - 1), p = e^eps / Omega, q = 1/l."""
  assert l == math.floor(c * math.exp(eps) + 2 * c - 1)
  want_p, want_q, _ = definition_rates(eps, c, l)
  assert p == pytest.approx(want_p, rel=1e-14) and q == want_q


def check_pairs(laws, eps):
  """Asserts the eps claim on every pair; returns {pair: exact epsilon}."""
  out = {}
  for (x, P), (x2, Q) in itertools.combinations(laws.items(), 2):
    assert accounting.privacy_profile(P, Q, eps) <= 1e-12, (x, x2)
    out[x, x2] = accounting.epsilon_for_delta(P, Q, 0.0)
  return out


# (s, |Y|, k, r, eps). Tight factors: buckets iff s > k, labels iff |Y| > r.
SEPARATION_SHAPES = [(2, 2, 1, 1, 0.5), (1, 2, 1, 1, 2.0), (2, 1, 2, 1, 0.3), (2, 2, 1, 2, 0.5),
                     (3, 2, 2, 1, 0.6)]


@pytest.mark.parametrize("s,y,k,r,eps", SEPARATION_SHAPES)
def test_separation_meets_its_claim_exactly(s, y, k, r, eps):
  mech = M.Separation(M.BsvsShape(s, y, k, r), eps)
  claim = mech.privacy()
  assert (claim.epsilon, claim.delta, claim.relation) == (eps, 0.0, accounting.Relation.REPLACE_ONE)
  l1, l2 = mech.bucket_bloom_length, mech.label_bloom_length
  (p1, q1), (p2, q2) = mech.bucket_rates, mech.label_rates
  check_parameters(l1, p1, q1, eps / 2, k)
  check_parameters(l2, p2, q2, eps / 2, r)
  law_b = {B: collision_law(B, s, l1, p1)[1].ravel() for B in subsets(s, k)}
  law_l = {Y: collision_law(Y, y, l2, p2)[1].ravel() for Y in subsets(y, r)}
  laws = {(B, Y): np.outer(law_b[B], law_l[Y]).ravel() for B in law_b for Y in law_l}
  exact = check_pairs(laws, claim.epsilon)
  want_b = factor_epsilon(p1, l1, k - (s == k), k)
  want_l = factor_epsilon(p2, l2, r - (y == r), r)
  # Pairs that differ only in the buckets (labels) spend only the bucket (label) factor's budget.
  assert max(e for (x, x2), e in exact.items() if x[1] == x2[1]) == pytest.approx(want_b, rel=1e-9)
  assert max(e for (x, x2), e in exact.items() if x[0] == x2[0]) == pytest.approx(want_l, rel=1e-9)
  assert max(exact.values()) == pytest.approx(want_b + want_l, rel=1e-9)
  assert want_b <= eps / 2 * (1 + 1e-12) and want_l <= eps / 2 * (1 + 1e-12)
  assert (want_b == pytest.approx(eps / 2, rel=1e-9)) == (s > k)
  assert (want_l == pytest.approx(eps / 2, rel=1e-9)) == (y > r)


# (s, |Y|, k, r, eps). Tight iff s > k or |Y| > r.
CONCATENATION_SHAPES = [(2, 2, 1, 1, 0.5), (1, 2, 1, 1, 2.0), (2, 1, 2, 1, 0.3), (2, 2, 1, 2, 0.2)]


@pytest.mark.parametrize("s,y,k,r,eps", CONCATENATION_SHAPES)
def test_concatenation_meets_its_claim_exactly(s, y, k, r, eps):
  shape = M.BsvsShape(s, y, k, r)
  mechs = [M.Concatenation(shape, eps), M.ConcatenationLiteral(shape, eps)]
  c, domain = k + r, s + y
  for mech in mechs:  # the two classes share the sampler; both claim eps
    claim = mech.privacy()
    assert (claim.epsilon, claim.delta, claim.relation) == (eps, 0.0, accounting.Relation.REPLACE_ONE)
    assert (mech.cardinality, mech.domain) == (c, domain)
    check_parameters(mech.bloom_length, mech.p, mech.q, eps, c)
  l, p = mechs[0].bloom_length, mechs[0].p
  assert (mechs[1].bloom_length, mechs[1].p) == (l, p)
  laws = {(B, Y): collision_law(set(B) | {s + j for j in Y}, domain, l, p)[1].ravel()
          for B in subsets(s, k) for Y in subsets(y, r)}
  exact = check_pairs(laws, eps)
  want = factor_epsilon(p, l, c - (s == k and y == r), c)
  assert max(exact.values()) == pytest.approx(want, rel=1e-9)
  assert want <= eps * (1 + 1e-12)
  assert (want == pytest.approx(eps, rel=1e-9)) == (s > k or y > r)


# --- Statistical audits ------------------------------------------------------------------
ALPHA = 1e-4
N = 100_000  # samples per input
TAIL = 1e-6  # binomial tail of each count in assured_epsilon_lower
AUDIT_SHAPE = M.BsvsShape(2, 2, 1)  # k = r = 1: both factors (and the concatenation) are tight
AUDIT_EPS = 2.0
# Worst pair: bucket 0 and label 0 against bucket 1 and label 1.
AUDIT_PAIR = ((jnp.array([0], jnp.int32), jnp.array([0], jnp.int32)),
              (jnp.array([1], jnp.int32), jnp.array([1], jnp.int32)))


def pair_code(table, z, sets, c):
  """Integer code of (z in h(S), |h(S)|) for each S in ``sets`` (works on NumPy and JAX arrays)."""
  code, base = 0, 1
  for S in sets:
    vals = [table[..., j] for j in S]
    inside = functools.reduce(operator.or_, [v == z for v in vals])
    size = sum(functools.reduce(operator.and_, [v != w for w in vals[:i]], True) * 1
               for i, v in enumerate(vals))
    code = code + base * (inside * 1 + 2 * size)
    base *= 2 * (c + 1)
  return code


def code_law(S, sets, domain, l, p, c):
  """Exact pmf of pair_code under input S: the enumerated law pushed forward."""
  tables, pmf = collision_law(S, domain, l, p)
  codes = pair_code(tables[:, None, :], np.arange(l)[None, :], sets, c)
  return np.bincount(codes.ravel(), weights=pmf.ravel(), minlength=(2 * (c + 1)) ** len(sets))


def top_events(P0, P1):
  """The bins where P0/P1 is largest and those where P1/P0 is (host event functions)."""
  out = []
  for a, b in ((P0, P1), (P1, P0)):
    ratio = np.where(a > 0, a / np.maximum(b, 1e-300), 0.0)
    codes = np.flatnonzero(ratio >= ratio.max() * (1 - 1e-9))
    out.append(lambda v, codes=codes: np.isin(v, codes))
  return out


def assured_epsilon_lower(p_top, p_bottom, level):
  """A value that the audit's epsilon_lower exceeds except with probability <= 2 TAIL.

  For one fixed event with probabilities p_top, p_bottom and N trials:
  P(K_top < k_top) <= TAIL and P(K_bottom > k_bottom) <= TAIL, and the Clopper-Pearson
  bounds increase with the counts.
  """
  k_top = stats.binom.ppf(TAIL, N, p_top)
  k_bottom = stats.binom.isf(TAIL, N, p_bottom)
  lo = audit.clopper_pearson_lower(int(k_top), N, level)
  hi = audit.clopper_pearson_upper(int(k_bottom), N, level)
  return math.log(lo / hi)


def separation_statistic_law(mech, p1, p2):
  """Exact pmfs of the Separation statistic for AUDIT_PAIR, hit rates p1 (buckets), p2 (labels)."""
  codes = []
  for domain, l, p in ((mech.shape.num_buckets, mech.bucket_bloom_length, p1),
                       (mech.shape.num_labels, mech.label_bloom_length, p2)):
    codes.append([code_law({x}, ({0}, {1}), domain, l, p, 1) for x in (0, 1)])
  return [np.outer(codes[0][x], codes[1][x]).ravel() for x in (0, 1)]


@functools.lru_cache(maxsize=None)
def separation_statistic(mech):
  """Sufficient statistic of a Separation message for AUDIT_PAIR (one object per mechanism)."""
  radix = 4 ** 2  # pair_code with two singletons, c = 1

  def statistic(message):
    codes = []
    for msg, domain, l in ((message.buckets, mech.shape.num_buckets, mech.bucket_bloom_length),
                           (message.labels, mech.shape.num_labels, mech.label_bloom_length)):
      table = _collision.hash_table(msg.seed, domain, l)
      codes.append(pair_code(table, msg.output, ((0,), (1,)), 1))
    return (codes[0] * radix + codes[1]).astype(jnp.int32)

  return statistic


@dataclasses.dataclass(frozen=True)
class SeparationFullEpsilonPerFactor(M.Separation):
  """Planted bug: each factor's sampler uses eps instead of eps/2 (l, estimator and claim unchanged)."""

  def randomize(self, key, buckets, labels):
    k_bucket, k_label = jax.random.split(key)
    sh = self.shape
    mb = _collision.collision_randomize(k_bucket, buckets, domain=sh.num_buckets,
                                        bloom_length=self.bucket_bloom_length, epsilon=self.epsilon,
                                        cardinality=sh.k)
    ml = _collision.collision_randomize(k_label, labels, domain=sh.num_labels,
                                        bloom_length=self.label_bloom_length, epsilon=self.epsilon,
                                        cardinality=sh.r)
    return M.SeparationMessage(mb, ml)


def test_separation_audit_no_alarm_and_planted_bug_alarms():
  mech = M.Separation(AUDIT_SHAPE, AUDIT_EPS)
  P0, P1 = separation_statistic_law(mech, mech.bucket_rates[0], mech.label_rates[0])
  assert accounting.epsilon_for_delta(P0, P1, 0.0) == pytest.approx(AUDIT_EPS, rel=1e-9)  # sufficient
  events = top_events(P0, P1)
  top = events[0](np.arange(len(P0)))
  level = ALPHA / 8
  r = audit.audit_privacy(jax.random.key(40), audit.local_randomizer(mech), *AUDIT_PAIR, num_samples=N,
                          alpha=ALPHA, claimed_epsilon=mech.privacy().epsilon,
                          statistic=separation_statistic(mech), events=events)
  assert r.kind == "given" and not r.alarm
  assert r.epsilon_lower >= assured_epsilon_lower(P0[top].sum(), P1[top].sum(), level)

  bug = SeparationFullEpsilonPerFactor(AUDIT_SHAPE, AUDIT_EPS)
  assert bug.privacy().epsilon == AUDIT_EPS  # only the sampler is wrong
  wrong_p = [definition_rates(AUDIT_EPS, 1, l)[0] for l in (bug.bucket_bloom_length, bug.label_bloom_length)]
  B0, B1 = separation_statistic_law(bug, *wrong_p)
  # The exact check sees it too: the true epsilon is 2 eps (each factor is tight at l = 3).
  assert accounting.epsilon_for_delta(B0, B1, 0.0) == pytest.approx(2 * AUDIT_EPS, rel=1e-9)
  assert accounting.privacy_profile(B0, B1, AUDIT_EPS) > 0.1
  assert assured_epsilon_lower(B0[top].sum(), B1[top].sum(), level) > AUDIT_EPS  # power >= 1 - 2e-6
  r = audit.audit_privacy(jax.random.key(41), audit.local_randomizer(bug), *AUDIT_PAIR, num_samples=N,
                          alpha=ALPHA, claimed_epsilon=bug.privacy().epsilon,
                          statistic=separation_statistic(bug), events=events)
  assert r.alarm


@functools.lru_cache(maxsize=None)
def concatenation_statistic(mech):
  """Sufficient statistic of a Concatenation message for AUDIT_PAIR: S0 = {0, 2}, S1 = {1, 3}."""
  def statistic(message):
    table = _collision.hash_table(message.seed, mech.domain, mech.bloom_length)
    return pair_code(table, message.output, ((0, 2), (1, 3)), 2).astype(jnp.int32)

  return statistic


def test_concatenation_audit_no_alarm():
  mech = M.Concatenation(AUDIT_SHAPE, AUDIT_EPS)
  lit = M.ConcatenationLiteral(AUDIT_SHAPE, AUDIT_EPS)
  # The literal estimator's messages are Concatenation's (the same sampler and analyzer code
  # with the same parameters), so this audit covers both claims.
  assert M.ConcatenationLiteral.randomize is M.Concatenation.randomize
  assert M.ConcatenationLiteral.analyze is M.Concatenation.analyze
  assert (lit.bloom_length, lit.p, lit.domain, lit.cardinality) == (mech.bloom_length, mech.p, mech.domain,
                                                                     mech.cardinality)
  assert lit.privacy().epsilon == mech.privacy().epsilon == AUDIT_EPS
  l, p, s = mech.bloom_length, mech.p, AUDIT_SHAPE.num_buckets
  P0, P1 = (code_law(S, ((0, 2), (1, 3)), mech.domain, l, p, 2) for S in ({0, s}, {1, s + 1}))
  assert accounting.epsilon_for_delta(P0, P1, 0.0) == pytest.approx(AUDIT_EPS, rel=1e-9)  # sufficient
  events = top_events(P0, P1)
  top = events[0](np.arange(len(P0)))
  r = audit.audit_privacy(jax.random.key(42), audit.local_randomizer(mech), *AUDIT_PAIR, num_samples=N,
                          alpha=ALPHA, claimed_epsilon=mech.privacy().epsilon,
                          statistic=concatenation_statistic(mech), events=events)
  assert r.kind == "given" and not r.alarm
  assert r.epsilon_lower >= assured_epsilon_lower(P0[top].sum(), P1[top].sum(), ALPHA / 8)


# --- The real sampler draws from the enumerated law ----------------------------------------
GOF_ALPHA = 1e-4  # false-failure rate of each sampler test (two chi-square tests at GOF_ALPHA / 2)
GOF_N = 30_000  # draws per input


def merged_chisquare(observed, expected, minimum=5.0):
  """(Pearson statistic, degrees of freedom) after pooling the sparse cells.

  Cells of expected count 0 must stay empty and are dropped. The cells with expected count
  < ``minimum`` are pooled into one cell, with the next smallest cells added until the pool's
  expected count is >= ``minimum`` too.
  """
  observed, expected = np.asarray(observed, np.float64), np.asarray(expected, np.float64)
  assert observed.shape == expected.shape and not observed[expected == 0].any()
  observed, expected = observed[expected > 0], expected[expected > 0]
  order = np.argsort(expected, kind="stable")
  pool = int(np.sum(expected < minimum))
  if pool:
    pool = max(pool, int(np.searchsorted(np.cumsum(expected[order]), minimum)) + 1)
    observed = np.append(observed[order[pool:]], observed[order[:pool]].sum())
    expected = np.append(expected[order[pool:]], expected[order[:pool]].sum())
  assert len(expected) >= 2 and expected.min() >= minimum
  return float(np.sum((observed - expected) ** 2 / expected)), len(expected) - 1


def chisquare_pvalue(samples, pmfs):
  """p-value of the summed chi-square statistics of independent samples (their dofs add up).

  ``samples[i]`` are outcome indices drawn for input i, ``pmfs[i]`` their exact law.
  """
  total, dof = 0.0, 0
  for drawn, pmf in zip(samples, pmfs):
    assert math.fsum(pmf) == pytest.approx(1.0, abs=1e-12)
    observed = np.bincount(drawn, minlength=len(pmf))
    assert len(observed) == len(pmf)  # every draw is an outcome of the law
    stat, df = merged_chisquare(observed, pmf * len(drawn))
    total, dof = total + stat, dof + df
  return stats.chi2.sf(total, dof)


def message_law(S, domain, l, p, c):
  """(pmf, code) over the outcomes (h, z) of one Collision message, in collision_law's order.

  code[outcome] = pair_code of (z in h(S), |h(S)|): the law is l^-domain times a function of it,
  so it is sufficient for p (it carries the evidence against a wrong p, undiluted by h).
  """
  assert S  # pair_code needs a non-empty S
  tables, pmf = collision_law(S, domain, l, p)
  code = pair_code(tables[:, None, :], np.arange(l)[None, :], (tuple(sorted(S)),), c)
  return pmf.ravel(), np.broadcast_to(code, pmf.shape).ravel()


def check_sampler(cells, laws):
  """Chi-square of the whole outcome and of its sufficient statistic, each at GOF_ALPHA / 2."""
  full = chisquare_pvalue(cells, [pmf for pmf, _ in laws])
  coarse = chisquare_pvalue([code[drawn] for drawn, (_, code) in zip(cells, laws)],
                            [np.bincount(code, weights=pmf) for pmf, code in laws])
  assert full > GOF_ALPHA / 2 and coarse > GOF_ALPHA / 2, (full, coarse)


def table_cell(message, domain, l):
  """Index of one Collision message's (h, z) in collision_law(..., domain, l, p)[1].ravel()."""
  table = _collision.hash_table(message.seed, domain, l)
  return (table * jnp.asarray(l ** np.arange(domain - 1, -1, -1), jnp.int32)).sum() * l + message.output


@functools.lru_cache(maxsize=None)
def sampled_cells(mech):
  """Jitted ``(keys [N], buckets [N, k], labels [N, r]) -> int32 [N]``: each client's outcome.

  The message is the library's own ``mech.randomize``; the tables are regenerated from its seeds.
  """
  sh = mech.shape

  def one(key, buckets, labels):
    msg = mech.randomize(key, buckets, labels)
    if isinstance(msg, M.SeparationMessage):  # index in np.outer(law_b, law_l).ravel()
      l1, l2 = mech.bucket_bloom_length, mech.label_bloom_length
      return (table_cell(msg.buckets, sh.num_buckets, l1) * l2 ** (sh.num_labels + 1)
              + table_cell(msg.labels, sh.num_labels, l2))
    return table_cell(msg, mech.domain, mech.bloom_length)

  return jax.jit(jax.vmap(one))


def draw_cells(mech, key, inputs):
  """GOF_N outcomes for each input (buckets, labels), all inputs in one batch of fixed shape."""
  b = np.repeat(np.array([x[0] for x in inputs], np.int32), GOF_N, axis=0)
  lab = np.repeat(np.array([x[1] for x in inputs], np.int32), GOF_N, axis=0)
  cells = np.asarray(sampled_cells(mech)(jax.random.split(key, len(b)), jnp.asarray(b), jnp.asarray(lab)))
  return np.split(cells, len(inputs))


def held(items):
  """The set of non-padding items."""
  return {j for j in items if j >= 0}


SEPARATION_SAMPLER_SHAPE, SEPARATION_SAMPLER_EPS = M.BsvsShape(2, 2, 2, 1), 1.0  # l1 = 6, l2 = 2
# A full input (h(0) = h(1) makes |C| < c) and a padded one; each label is some input's.
SEPARATION_SAMPLER_INPUTS = (((0, 1), (1,)), ((1, -1), (0,)))


def separation_sampler_laws(mech, p1, p2):
  """message_law of SEPARATION_SAMPLER_INPUTS with hit rates p1 (buckets) and p2 (labels)."""
  sh = mech.shape
  out = []
  for B, Y in SEPARATION_SAMPLER_INPUTS:
    pb, cb = message_law(held(B), sh.num_buckets, mech.bucket_bloom_length, p1, sh.k)
    pl, cl = message_law(held(Y), sh.num_labels, mech.label_bloom_length, p2, sh.r)
    out.append((np.outer(pb, pl).ravel(), (cb[:, None] * 2 * (sh.r + 1) + cl[None, :]).ravel()))
  return out


def test_separation_sampler_draws_the_enumerated_law():
  # Chi-square of the whole outcome (h1, z1, h2, z2): 6^2 * 6 * 2^2 * 2 = 1728 cells per input
  # (expected counts >= 10, nothing to pool), and of its sufficient statistic (both factors'
  # (z in h(S), |h(S)|)), GOF_N draws per input; false-failure rate GOF_ALPHA. The product law
  # also tests that the two factors are independent.
  # Power (scratch runs, not committed): the test fails on each of these (p-values full / sufficient):
  #   * SeparationFullEpsilonPerFactor's draws (eps in both factors): 0 / 0;
  #   * draws with eps in the bucket factor only: 2e-123 / 0; in the label factor only: 2e-183 / 0;
  #   * draws with one key for both factors (dependent tables): 0 / 0;
  #   * these draws against the law with p1 of eps: 5e-162 / 0; with p1 * 1.05: 1e-4 / 4e-16.
  # The sufficient test carries the power against a wrong p: at p1 * 1.05 (noncentrality 76) its
  # power is 0.9994 against 0.0015 for the full test (3454 dof); p1 * 1.02 (3e-3 / 3e-3) passes.
  mech = M.Separation(SEPARATION_SAMPLER_SHAPE, SEPARATION_SAMPLER_EPS)
  sh, eps = mech.shape, mech.epsilon
  (p1, q1), (p2, q2) = mech.bucket_rates, mech.label_rates
  check_parameters(mech.bucket_bloom_length, p1, q1, eps / 2, sh.k)
  check_parameters(mech.label_bloom_length, p2, q2, eps / 2, sh.r)
  cells = draw_cells(mech, jax.random.key(43), SEPARATION_SAMPLER_INPUTS)
  check_sampler(cells, separation_sampler_laws(mech, p1, p2))


CONCATENATION_SAMPLER_SHAPE, CONCATENATION_SAMPLER_EPS = M.BsvsShape(1, 2, 1, 1), 0.5  # l = 6
# S = {0, 2} (h(0) = h(2) makes |C| < c) and S = {1} (a padded bucket).
CONCATENATION_SAMPLER_INPUTS = (((0,), (1,)), ((-1,), (0,)))


def concatenation_sampler_laws(mech, p, offset):
  """message_law of CONCATENATION_SAMPLER_INPUTS with hit rate p, label j at position offset + j."""
  return [message_law(held(B) | {offset + j for j in held(Y)}, mech.domain, mech.bloom_length, p,
                      mech.cardinality) for B, Y in CONCATENATION_SAMPLER_INPUTS]


def test_concatenation_sampler_draws_the_enumerated_law():
  # Chi-square of the whole outcome (h, z): 6^3 * 6 = 1296 cells per input (expected counts
  # >= 19), and of its sufficient statistic (z in h(S), |h(S)|), GOF_N draws per input;
  # false-failure rate GOF_ALPHA. ConcatenationLiteral sends the same messages.
  # Power (scratch runs, not committed): the test fails on each of these (p-values full / sufficient):
  #   * draws with eps/2 (l unchanged): 6e-10 / 2e-122; without the label offset s: 2e-245 / 4e-248;
  #   * these draws against the law with p of eps/2: 6e-9 / 3e-129; with p * 1.05: 0.7 / 2e-16.
  # At p * 1.05 (noncentrality 76) the sufficient test's power is 0.99996, the full test's 0.0024
  # (2590 dof); p * 1.02 (0.96 / 3e-3) passes.
  mech = M.Concatenation(CONCATENATION_SAMPLER_SHAPE, CONCATENATION_SAMPLER_EPS)
  lit = M.ConcatenationLiteral(CONCATENATION_SAMPLER_SHAPE, CONCATENATION_SAMPLER_EPS)
  assert M.ConcatenationLiteral.randomize is M.Concatenation.randomize
  assert (lit.bloom_length, lit.p, lit.domain, lit.cardinality) == (mech.bloom_length, mech.p, mech.domain,
                                                                     mech.cardinality)
  check_parameters(mech.bloom_length, mech.p, mech.q, mech.epsilon, mech.cardinality)
  cells = draw_cells(mech, jax.random.key(44), CONCATENATION_SAMPLER_INPUTS)
  check_sampler(cells, concatenation_sampler_laws(mech, mech.p, mech.shape.num_buckets))
