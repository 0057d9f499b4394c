"""Single-message shuffle: eps0 from inverse amplification, exact check and statistical audit of the shuffled output."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import accounting
from jaxdistill import audit
from jaxdistill import mechanisms as M
from jaxdistill import simulation
from tests.mechanisms._stats import assert_mean_and_variance, audit_pair


def rr_message_pmf(eps0, truth):
  """pmf over the 2^d RR messages of a client whose true bit vector is ``truth``."""
  keep = 1 / (1 + math.exp(-eps0 / 2))  # k = r = 1: eps' = eps0 / 2
  out = {}
  for bits in itertools.product([0, 1], repeat=len(truth)):
    same = sum(int(b == t) for b, t in zip(bits, truth))
    out[bits] = keep**same * (1 - keep) ** (len(truth) - same)
  return out


def shuffled_pmf(client_pmfs):
  """pmf of the multiset of the clients' messages (as a sorted tuple), by enumeration."""
  dist = {(): 1.0}
  for pmf in client_pmfs:
    nxt = {}
    for ms, p in dist.items():
      for m, q in pmf.items():
        key = tuple(sorted(ms + (m,)))
        nxt[key] = nxt.get(key, 0.0) + p * q
    dist = nxt
  return dist


def neighbouring_shuffled_pmfs(eps0, n):
  """(p, q) aligned arrays: the shuffled multisets' pmfs of every neighbouring pair of the tiny setting below
  (n RR clients on d = 2 bits, each holding entry 0, entry 1 or nothing; one client's input replaced)."""
  inputs = [(1, 0), (0, 1), (0, 0)]
  for others in itertools.combinations_with_replacement(inputs, n - 1):
    for x, y in itertools.permutations(inputs, 2):
      p = shuffled_pmf([rr_message_pmf(eps0, v) for v in (x,) + others])
      q = shuffled_pmf([rr_message_pmf(eps0, v) for v in (y,) + others])
      keys = sorted(set(p) | set(q))
      yield tuple(np.array([d.get(m, 0.0) for m in keys]) for d in (p, q))


def test_shuffled_output_meets_the_claim_exactly_at_tiny_n():
  # n = 4 clients, d = 2 bits; every client holds entry 0, entry 1 or nothing.
  # Every neighbouring pair (one client's input replaced): the exact privacy profile
  # of the shuffled multiset at the claimed epsilon is <= delta. Without the shuffle
  # (messages in client order) the same epsilon fails: the amplification is real.
  # What this cannot see: at n = 4 the clone bound has much slack (the exact worst epsilon at delta = 0.1 is
  # about 0.08 against the claimed 0.5), so an accounting error that raises eps0 by 30% still meets the
  # claim here. Such errors are caught in tests/accounting/test_shuffle.py, where clone_delta is checked
  # against a direct sum over the clone pairs and against the published example.
  n, eps, delta = 4, 0.5, 0.1
  mech = M.ShuffleSingleMessage(M.BsvsShape(2, 1, 1), eps, delta, n)
  claim = mech.privacy()
  assert claim.epsilon <= eps and mech.eps0 > 1.5 * eps
  worst = max(accounting.privacy_profile(p, q, claim.epsilon) for p, q in neighbouring_shuffled_pmfs(mech.eps0, n))
  assert worst <= delta
  ordered_p = rr_message_pmf(mech.eps0, (1, 0))
  ordered_q = rr_message_pmf(mech.eps0, (0, 1))
  assert accounting.privacy_profile(ordered_p, ordered_q, claim.epsilon) > delta


def test_two_shuffled_releases_meet_the_composed_claim_exactly_at_tiny_n():
  # Over T = 2 iterations, given n, plan_budget composes the clone pair's PLD (pld-clone) and each release runs RR
  # at the eps0 its share calibrates. The setting of the test above (n = 4, d = 2 bits): for every neighbouring
  # pair, the exact profile of the two releases (the product of the shuffled multisets' pmfs) at the composed
  # epsilon is <= delta. The clone bound's slack at n = 4 makes this a check of the plumbing (plan -> mechanism
  # -> composed claim) on the real randomizer; the composition's tightness is tested in tests/labeling/test_budget.py.
  from jaxdistill import labeling  # pylint: disable=import-outside-toplevel
  n, eps, delta, t = 4, 0.5, 0.1, 2
  plan = labeling.plan_budget("shuffle-single", eps, delta, t, k=1, num_clients=n)
  pairs = labeling.plan_budget("shuffle-single", eps, delta, t, k=1)
  assert plan.method == "pld-clone" and plan.composed_epsilon <= eps
  mech = M.ShuffleSingleMessage(M.BsvsShape(2, 1, 1), plan.epsilon_per_iteration, plan.delta_per_iteration, n)
  assert mech.eps0 > M.ShuffleSingleMessage(M.BsvsShape(2, 1, 1), pairs.epsilon_per_iteration,
                                            pairs.delta_per_iteration, n).eps0
  worst = max(accounting.privacy_profile(np.outer(p, p).ravel(), np.outer(q, q).ravel(), plan.composed_epsilon)
              for p, q in neighbouring_shuffled_pmfs(mech.eps0, n))
  assert worst <= delta


def test_eps0_is_the_inverse_amplification():
  n, eps, delta = 10**4, 1.0, 1e-6
  mech = M.ShuffleSingleMessage(M.BsvsShape(40, 10, 1), eps, delta, n)
  assert mech.eps0 == accounting.shuffle_local_epsilon(eps, n, delta).eps0
  # Round trip: eps0 meets the target; a 1% larger local epsilon does not.
  assert accounting.clone_delta(eps, mech.eps0, n) <= delta
  assert accounting.clone_delta(eps, mech.eps0 * 1.01, n) > delta
  assert isinstance(mech.local_mechanism, M.RandomizedResponse)
  assert mech.local_mechanism.epsilon == mech.eps0
  st_ = mech.privacy()
  assert st_.relation is accounting.Relation.REPLACE_ONE
  assert st_.epsilon <= eps and st_.delta == delta
  assert st_.method == "numeric"
  assert st_.parameters["eps0"] == mech.eps0 and st_.parameters["n"] == n
  assert mech.name == "shuffle-single"


def test_closed_form_respects_its_local_validity_condition():
  # Spec I4: the closed form's condition is on the *local* eps0: eps0 <= ln(n / (16 ln(4/delta))), the
  # authors' code's check (I7; the printed theorem has ln(2/delta)).
  n, eps, delta = 10**4, 1.0, 1e-6
  closed = M.ShuffleSingleMessage(M.BsvsShape(4, 2, 1), eps, delta, n, method="closed-form")
  numeric = M.ShuffleSingleMessage(M.BsvsShape(4, 2, 1), eps, delta, n)
  assert closed.eps0 <= math.log(n / (16 * math.log(4 / delta))) + 1e-12
  assert closed.eps0 < numeric.eps0  # the numeric bound certifies more
  assert closed.privacy().method == "closed-form"
  assert accounting.fmt_closed_form_epsilon(closed.eps0, n, delta) <= eps


def test_messages_are_the_local_randomizer_and_estimate_is_unbiased():
  # 150 runs over n = 300 clients on 6 entries; z-test on the mean and chi-square
  # interval on the variance against RR's closed form at eps0, Bonferroni over
  # 12 tests: family-wise false-failure rate 1e-3.
  w = M.synthetic_workload(jax.random.key(21), num_clients=300, num_buckets=3, num_labels=2, k=1)
  inp = w.materialize()
  mech = M.ShuffleSingleMessage(w.shape, 1.0, 1e-5, 300)
  rr = M.RandomizedResponse(w.shape, mech.eps0)
  key = jax.random.key(22)
  b, lab = jnp.array([1], jnp.int32), jnp.array([0], jnp.int32)
  np.testing.assert_array_equal(mech.randomize(key, b, lab), rr.randomize(key, b, lab))
  truth = np.asarray(M.bsvs_counts(inp, w.shape), np.float64)
  runs = np.stack([simulation.simulate(jax.random.key(300 + i), mech, inp).estimate for i in range(150)])
  # Closed form derived here, not read from the library: an entry's n = 300 message bits are
  # independent, 1 w.p. p (true bit 1) or q = 1 - p (true bit 0), so Var[total] = n p q and the
  # estimate (total - n q) / (p - q) has variance n p q / (p - q)^2 whatever the truth. p is the
  # sampler's keep probability: q = 1 / (1 + e^{eps0 / (2kr)}) rounded up to a multiple of 2^-b.
  bits = mech.local_mechanism.sampler_bits
  assert bits in (16, 32)
  q = math.ceil(2.0**bits / (1 + math.exp(mech.eps0 / (2 * w.shape.c)))) / 2.0**bits
  p = 1 - q
  var = np.full(truth.shape, 300 * p * q / (p - q) ** 2)
  np.testing.assert_allclose(mech.entry_variance(truth, 300), var, rtol=1e-12)
  alpha = 1e-3 / 12
  assert_mean_and_variance(runs, truth, var, alpha)


# -- statistical audit of the analyzer's view ----------------------------------------------
# The setting of the exact test above: n = 4 RR clients on d = 2 bits, claim (eps ~0.5, 0.1).
# The analyzer sees the shuffled multiset of the 4 messages, coded as the counts of the
# message types 01, 10, 11 (a sufficient statistic, at most 35 values). The pair is a worst
# one of the exact test: all clients on entry 0 (D0) vs client 0 moved to entry 1 (D1).
# Every audit runs at alpha = 1e-4 (Clopper-Pearson + Bonferroni), which bounds both a false
# alarm and a lower bound above the pair's exact epsilon at the claimed delta.
AUDIT_SHAPE = M.BsvsShape(2, 1, 1)
AUDIT_N = 4


@functools.lru_cache(maxsize=None)
def shuffled_view(mech):
  """``(key, clients) -> int32``: the n messages' multiset, c01 + (n+1) c10 + (n+1)^2 c11."""
  def view(key, x):
    buckets, labels = x
    n = buckets.shape[0]
    msgs = jax.vmap(mech.randomize)(jax.random.split(key, n), buckets, labels).astype(jnp.int32)
    counts = jnp.zeros(4, jnp.int32).at[2 * msgs[:, 0] + msgs[:, 1]].add(1)
    return counts[1] + (n + 1) * counts[2] + (n + 1) ** 2 * counts[3]
  return view


def exact_pair_epsilon(eps0, delta):
  """The pair's exact epsilon at delta, by enumeration (RR at the unrounded keep probability,
  which is at least as leaky as the dyadic sampler: this is an upper bound)."""
  p = shuffled_pmf([rr_message_pmf(eps0, t) for t in [(1, 0)] * AUDIT_N])
  q = shuffled_pmf([rr_message_pmf(eps0, t) for t in [(0, 1)] + [(1, 0)] * (AUDIT_N - 1)])
  return accounting.epsilon_for_delta(p, q, delta)


def audit_view(mech, claim, seed):
  return audit.audit_privacy(jax.random.key(seed), shuffled_view(mech), *audit_pair(AUDIT_N),
                             num_samples=200_000, batch_size=40_000, alpha=1e-4,
                             claimed_epsilon=claim.epsilon, claimed_delta=claim.delta)


def test_audit_of_the_shuffled_view_finds_no_violation():
  # The bound is loose at n = 4: the pair's exact epsilon at delta = 0.1 is ~0.077 against the
  # claimed 0.5. No alarm, and epsilon_lower below the exact 0.077: false-failure rate <= 1e-4
  # for both together. Floor: epsilon_lower was 0.033-0.058 over this and 41 other seeds (mean
  # 0.048, sd 0.006), so 0.005 is 7 sd below the mean (normal approximation: < 1e-9). About
  # 1e-4 in all.
  mech = M.ShuffleSingleMessage(AUDIT_SHAPE, 0.5, 0.1, AUDIT_N)
  claim = mech.privacy()
  exact = exact_pair_epsilon(mech.eps0, claim.delta)
  assert 0.05 < exact < 0.1
  r = audit_view(mech, claim, 40)
  assert not r.alarm and r.kind == "bins"
  assert 0.005 < r.epsilon_lower <= exact


def test_audit_alarms_when_eps0_is_calibrated_for_too_many_clients():
  # Planted bug: the local epsilon is the one calibrated for 100 shuffled messages (~2.57
  # instead of ~0.85) while 4 are shuffled; the claim stays that of n = 4. The pair's exact
  # epsilon at delta = 0.1 is then ~1.34 (enumeration). epsilon_lower must lie below it (rate
  # <= 1e-4). Over this and 41 other seeds epsilon_lower was 1.13-1.20 (mean 1.155, sd 0.015):
  # the floor claim + 0.3 is 24 sd below the mean, a missed alarm 45 sd: rate < 1e-9.
  mech = M.ShuffleSingleMessage(AUDIT_SHAPE, 0.5, 0.1, AUDIT_N)
  claim = mech.privacy()
  bug = M.ShuffleSingleMessage(AUDIT_SHAPE, 0.5, 0.1, 100)
  assert bug.eps0 > 2.5
  exact = exact_pair_epsilon(bug.eps0, claim.delta)
  assert exact > claim.epsilon + 0.5
  r = audit_view(bug, claim, 41)
  assert r.alarm
  assert claim.epsilon + 0.3 < r.epsilon_lower <= exact


@pytest.mark.parametrize("kwargs,param", [
    ({"epsilon": 0.0}, "epsilon"), ({"epsilon": -0.5}, "epsilon"), ({"epsilon": math.nan}, "epsilon"),
    ({"epsilon": 800.0}, "epsilon=800.0 <= 60"), ({"epsilon": 61.0}, "epsilon=61.0 <= 60"),
    ({"delta": 0.0}, "delta"), ({"delta": 1.5}, "delta"), ({"delta": math.nan}, "delta"),
    ({"num_clients": 0}, "num_clients"), ({"num_clients": math.nan}, "num_clients"),
    ({"local": "laplace"}, "local"), ({"method": "exact"}, "method"),
    # The accounting's limits, under this class's names (they were target_epsilon and n).
    ({"epsilon": 1e-10}, r"Expected epsilon=1e-10 >= 1e-09"),
    ({"num_clients": 10**13}, r"Expected num_clients=10000000000000 <= 1e\+12 .* method='closed-form'"),
    ({"num_clients": 10**19, "method": "closed-form"}, r"num_clients=10000000000000000000 <= 1000000000000000000"),
    # A calibrated eps0 the local randomizer cannot take: named as eps0, not as the caller's epsilon.
    ({"epsilon": 40.0, "local": "collision"},
     r"The calibrated local eps0=\S+ \(from epsilon=40.0, delta=1e-06, num_clients=1000\) does not fit "
     r"local='collision': Expected epsilon=\S+ <= 21.488"),
])
def test_bad_input(kwargs, param):
  args = {"shape": M.BsvsShape(2, 2, 1), "epsilon": 1.0, "delta": 1e-6, "num_clients": 1000, **kwargs}
  with pytest.raises(ValueError, match=param):
    M.ShuffleSingleMessage(**args)


def test_collision_local_randomizer_is_wired_to_eps0():
  mech = M.ShuffleSingleMessage(M.BsvsShape(4, 2, 1), 1.0, 1e-6, 10**4, local="collision")
  assert isinstance(mech.local_mechanism, M.Collision) and mech.local_mechanism.epsilon == mech.eps0
  assert mech.privacy().parameters["local"] == "collision"


# -- the Collision randomizer under the shuffle: exact check and audit (they covered RR only) ---------------
def _merge(dist, pmf):
  """The multiset pmf ``dist`` with one more client's message drawn from ``pmf``."""
  out = {}
  for ms, p in dist.items():
    for m, q in pmf.items():
      key = tuple(sorted(ms + (m,)))
      out[key] = out.get(key, 0.0) + p * q
  return out


def collision_message_pmf(eps0, l, entries):
  """pmf over a client's (hash table, z) on d = 2 entries, c = 1 (Definition 5; the seed matters only via its
  table, which is uniform whatever the data, so the profile of (seed, z) multisets is that of (table, z))."""
  from tests.mechanisms.test_collision import joint_pmf  # pylint: disable=import-outside-toplevel
  tables, pmf = joint_pmf(entries, 2, l, eps0, 1)
  return {(t, z): pmf[i, z] for i, t in enumerate(tables) for z in range(l)}


def aligned(p, q):
  keys = sorted(set(p) | set(q))
  return tuple(np.array([d.get(k, 0.0) for k in keys]) for d in (p, q))


def test_collision_shuffled_output_meets_the_claim_exactly_at_tiny_n():
  # As the RR test above, with local="collision": n = 4 clients on d = 2 entries, each holding entry 0, entry 1 or
  # nothing; every neighbouring pair's shuffled multiset of (hash table, z) messages (l = 3: 27 messages) meets the
  # claim at its epsilon. One message alone (no shuffle) does not: the amplification is real.
  n, eps, delta = 4, 0.5, 0.1
  mech = M.ShuffleSingleMessage(AUDIT_SHAPE, eps, delta, n, local="collision")
  claim, l = mech.privacy(), mech.local_mechanism.bloom_length
  assert claim.epsilon <= eps and mech.eps0 > 1.5 * eps and l == 3
  pmfs = {S: collision_message_pmf(mech.eps0, l, S) for S in [(0,), (1,), ()]}
  worst = 0.0
  for others in itertools.combinations_with_replacement(pmfs, n - 1):
    base = shuffled_pmf([pmfs[o] for o in others])
    full = {S: _merge(base, pmf) for S, pmf in pmfs.items()}
    for x, y in itertools.permutations(pmfs, 2):
      worst = max(worst, accounting.privacy_profile(*aligned(full[x], full[y]), claim.epsilon))
  assert worst <= delta
  assert accounting.privacy_profile(*aligned(pmfs[(0,)], pmfs[(1,)]), claim.epsilon) > delta


@functools.lru_cache(maxsize=None)
def collision_hits_view(mech):
  """``(key, clients) -> int32``: the shuffled messages' hits on entries 0 and 1, h0 + (n + 1) h1 (a function of
  the multiset: post-processing of the shuffler's output)."""
  def view(key, x):
    buckets, labels = x
    n = buckets.shape[0]
    msgs = jax.vmap(mech.randomize)(jax.random.split(key, n), buckets, labels)
    hits = jax.vmap(mech.local_mechanism.analyze)(msgs).sum(0)
    return (hits[0] + (n + 1) * hits[1]).astype(jnp.int32)
  return view


def exact_hits_view_epsilon(eps0, l, delta):
  """The hits view's exact epsilon at delta for the audit pair, by enumeration."""
  one = {}
  for (table, z), p in collision_message_pmf(eps0, l, (0,)).items():
    key = (int(z == table[0]), int(z == table[1]))
    one[key] = one.get(key, 0.0) + p
  moved = {(b, a): p for (a, b), p in one.items()}  # entry 1's hits: the two entries swapped
  return accounting.epsilon_for_delta(*aligned(_sum_pmf([one] * AUDIT_N), _sum_pmf([moved] + [one] * (AUDIT_N - 1))),
                                      delta)


def _sum_pmf(pmfs):
  """pmf of the summed (h0, h1) over independent clients."""
  out = {(0, 0): 1.0}
  for pmf in pmfs:
    nxt = {}
    for (a, b), p in out.items():
      for (c, d), q in pmf.items():
        nxt[(a + c, b + d)] = nxt.get((a + c, b + d), 0.0) + p * q
    out = nxt
  return out


def collision_audit(mech, claim, seed):
  return audit.audit_privacy(jax.random.key(seed), collision_hits_view(mech), *audit_pair(AUDIT_N),
                             num_samples=200_000, batch_size=40_000, alpha=1e-4,
                             claimed_epsilon=claim.epsilon, claimed_delta=claim.delta)


def test_audit_of_the_shuffled_collision_view_finds_no_violation():
  # The hits view's exact epsilon at delta = 0.1 is ~0.054 against the claimed 0.5. No alarm, and epsilon_lower
  # below that exact value: false-failure rate <= 1e-4 for both. Floor: epsilon_lower was 0.014-0.037 over this
  # and 22 other seeds (mean 0.027, sd 0.005), so 0.002 is 5 sd below the mean (normal approximation: 3e-7).
  mech = M.ShuffleSingleMessage(AUDIT_SHAPE, 0.5, 0.1, AUDIT_N, local="collision")
  claim = mech.privacy()
  exact = exact_hits_view_epsilon(mech.eps0, mech.local_mechanism.bloom_length, claim.delta)
  assert 0.05 < exact < 0.06
  r = collision_audit(mech, claim, 40)
  assert not r.alarm and r.kind == "bins"
  assert 0.002 < r.epsilon_lower <= exact


def test_audit_alarms_when_the_collision_eps0_is_calibrated_for_too_many_clients():
  # Planted bug: the local Collision runs at the eps0 calibrated for 100 shuffled messages (~2.57, l = 14)
  # while 4 are shuffled; the claim stays that of n = 4. The hits view's exact epsilon at delta = 0.1 is then
  # ~0.91. epsilon_lower must lie below it (rate <= 1e-4). Over this and 22 other seeds it was 0.83-0.87 (mean
  # 0.85, sd 0.01, every one an alarm): the floor claim + 0.2 is 15 sd below the mean (rate < 1e-9).
  mech = M.ShuffleSingleMessage(AUDIT_SHAPE, 0.5, 0.1, AUDIT_N, local="collision")
  claim = mech.privacy()
  bug = M.ShuffleSingleMessage(AUDIT_SHAPE, 0.5, 0.1, 100, local="collision")
  assert bug.eps0 > 2.5
  exact = exact_hits_view_epsilon(bug.eps0, bug.local_mechanism.bloom_length, claim.delta)
  assert exact > claim.epsilon + 0.4
  r = collision_audit(bug, claim, 41)
  assert r.alarm
  assert claim.epsilon + 0.2 < r.epsilon_lower <= exact
