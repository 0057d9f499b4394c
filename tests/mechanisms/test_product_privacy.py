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
Family-wise for this file: <= 2.1e-4.
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
