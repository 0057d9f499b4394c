"""The auditor on the labeling pipeline's own release chain, end to end, for the worst pair of private data.

One labeling iteration releases ``mechanism(counts(reverse k-NN edges of D_priv, labels))``. The other audits
test each mechanism on counts given to it; this one builds the counts and the mechanism the way
``run_labeling`` does (``connect`` -> ``make_bsvs_input`` at the rule's declared degree ->
``plan_budget`` -> ``build_mechanism``) and checks that the *total* epsilon the run states holds for two
private data sets that differ in one record, at T = 1 and over T = 2 iterations (two releases with
independent noise on the same edges: the worst case of the adaptive composition, since the central
sensitivity 2kr does not depend on the queries).

The pair is the worst one: record 0 moves from next to query 0 (label 0) to next to query 2 (label 1), so
with k = 2 its four edge-label cells all change and the counts differ by 2k = 4 in L1. For the discrete
Laplace the per-cell log-likelihood ratio is +-a (a = eps_t / 2k), so the number of changed cells on D1's
side (minus those on D0's) carries the whole privacy loss, and its extreme code has ratio e^eps exactly:
the bound is tight. For the Laplace the statistic is the log-likelihood ratio: rounded to 1e-9 it audits
the real-valued mechanism; unrounded it finds the float64 output's leak that the statement warns of.

k-NN labeling (each query takes its k nearest records) is audited at its own worst pair: one record in every
query's list, so all s rows change and the counts differ by 2s in L1 (its declared out-degree is s, not k).
Appendix C's balanced rules state no guarantee; the audit shows why, on a pair where moving one record
re-routes two others: the noise the pipeline calibrates for them (nominally 2k) is far from its nominal epsilon.

Under local DP the release is record 0's own message in each iteration (what the server sees of it; the sum
is post-processing), keyed as ``simulate`` keys client 0, at the per-iteration epsilon the plan gives. Its
two entry sets are disjoint, so all 2kr = 4 entries differ. Randomized response: the differing bits that
agree with D0, summed over T (sufficient). Collision: each message's hits-and-collisions code on the four
entries, mapped to its exact log-likelihood ratio (pmfs enumerated over every hash value and output) and
summed over T. The true epsilons come from those definitions, not from the code under test.

Rates. Each audit runs at alpha = 1e-4 (Clopper-Pearson + Bonferroni). Fourteen assertions are such events: no
alarm in the eight null audits (true epsilon <= claim = 1) and the bounds of the planted bugs and the balanced
rules below their true epsilons (the k = 1 noise, 2; k-NN labeling's noise for 2k, 3; the balanced rules, 3
each; the local chains without the split over T, 2 each); family-wise <= 1.4e-3. The floors are separate
events; their spread, measured at the tests' seeds and at 31-35 and 100-104 (reverse k-NN, central; the T = 1
discrete Laplace at 9), at 36-39 and 100-109 (k-NN labeling, balanced rules) or at 40-49 and 100-109 (local;
the 1,000,000-sample ones at 100-109):

=================================  =========  ===============  ==========================
audit                              samples    mean (sd)        floor, sd below the mean
=================================  =========  ===============  ==========================
discrete Laplace, T = 1            200,000    0.923 (0.012)    0.85, 6.1
discrete Laplace, T = 2            1,000,000  0.859 (0.010)    0.78, 7.9
Laplace, rounded ratio             200,000    0.895 (0.027)    0.7, 7.2
Laplace, float64 ratio             200,000    2.422 (0.094)    1.5, 9.8 (an alarm)
noise for k = 1 (planted)          200,000    1.919 (0.009)    1.5, 46
k-NN labeling, T = 1               1,000,000  0.931 (0.010)    0.85, 8.1
k-NN labeling, noise for 2k        200,000    2.802 (0.038)    2, 21 (an alarm)
balanced rules, nominal noise      200,000    2.862 (0.032)    2, 27 (an alarm)
local randomized response, T = 1   200,000    0.924 (0.009)    0.85, 8.6
local randomized response, T = 2   1,000,000  0.865 (0.028)    0.7, 6.0
local Collision, T = 1             200,000    0.960 (0.006)    0.9, 10
local Collision, T = 2             200,000    0.891 (0.012)    0.8, 7.4
local RR without the split         1,000,000  1.847 (0.025)    1.5, 14 (an alarm)
local Collision without the split  200,000    1.883 (0.027)    1.5, 14 (an alarm)
=================================  =========  ===============  ==========================

so each floor fails with probability < 1e-9 under a normal approximation of the bound. Seeds are fixed; the
outcome is deterministic.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import accounting, audit, labeling, mechanisms
from jaxdistill.labeling import _components as components
from jaxdistill.mechanisms._collision import hash_table
from jaxdistill.simulation import simulate
from tests.audit._mechanisms import _hits_and_collisions
from tests.audit.test_privacy_audit import collision_statistic_pmf, rr_true_epsilon

ALPHA = 1e-4
N = 200_000
EPSILON = 1.0
K, S, C = 2, 3, 2
QUERIES = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], np.float32)
#: D0's record 0 sits at (1, 0) with label 0: edges to queries 0 and 1 (distances 1, 9). D1 moves it to (0, 9)
#: with label 1: edges to queries 2 and 0 (distances 1, 9). The other five records are the same in both.
OTHERS = np.array([[9.0, 1.0], [1.0, 9.0], [5.0, 4.0], [2.0, 2.0], [8.0, 8.0]], np.float32)
OTHER_LABELS = np.array([1, 1, 0, 1, 0])
D0 = (np.concatenate([[[1.0, 0.0]], OTHERS]).astype(np.float32), np.concatenate([[0], OTHER_LABELS]))
D1 = (np.concatenate([[[0.0, 9.0]], OTHERS]).astype(np.float32), np.concatenate([[1], OTHER_LABELS]))
NUM_PRIVATE = 6
#: k-NN labeling (each query takes its k = 1 nearest record): record 0 (label 0) at (3, 3) is the nearest of all three
#: queries (distances 4.2, 7.6, 7.6); D1 moves it far away, and each query's next-nearest record, all label 1, takes
#: its place: (-6, -6) for query 0 (8.5), (18, 0) for query 1 (8.0), (0, 18) for query 2 (8.0). Every row of the
#: counts loses a vote for label 0 and gains one for label 1: L1 distance 2s = 6, where reverse k-NN's is 2k.
KNN_OTHERS = np.array([[-6.0, -6.0], [18.0, 0.0], [0.0, 18.0], [30.0, 30.0], [-30.0, 30.0]], np.float32)
KNN_OTHER_LABELS = np.array([1, 1, 1, 0, 0])
KNN_D0 = (np.concatenate([[[3.0, 3.0]], KNN_OTHERS]).astype(np.float32), np.concatenate([[0], KNN_OTHER_LABELS]))
KNN_D1 = (np.concatenate([[[100.0, 100.0]], KNN_OTHERS]).astype(np.float32),
          np.concatenate([[1], KNN_OTHER_LABELS]))


def pipeline_pieces(noise, iterations, mechanism="central", connection="reverse-knn", pair=(D0, D1), k=K,
                    queries=QUERIES, delta=0.0):
  """The mechanism and both data sets' BSVS inputs, built as ``run_labeling`` builds them."""
  s = len(queries)
  config = labeling.LabelingConfig(mechanism=mechanism, central_noise=noise, epsilon=EPSILON, delta=delta,
                                   iterations=iterations, num_queries=s, k=k, connection=connection)
  degree = components.connection_privacy(config.connection, k, s).shape_k
  n = len(pair[0][1])
  plan = labeling.plan_budget(mechanism, EPSILON, delta, iterations, k=degree, central_noise=noise, num_clients=n)
  shape = mechanisms.BsvsShape(s, C, degree)
  mech = labeling.build_mechanism(config, plan, shape, n)
  inputs = []
  for features, labels in pair:
    buckets = components.connect(config.connection, features, queries, k).buckets
    inputs.append(mechanisms.make_bsvs_input(buckets, labels[:, None], num_buckets=s, num_labels=C, k=degree)[0])
  return mech, inputs


def central_pieces(connection, iterations, noise="discrete-laplace"):
  """``pipeline_pieces`` at the rule's worst pair: reverse k-NN's (k = 2) or k-NN labeling's (k = 1)."""
  if connection == "reverse-knn":
    return pipeline_pieces(noise, iterations)
  return pipeline_pieces(noise, iterations, connection="knn-labeling", pair=(KNN_D0, KNN_D1), k=1)


def counts_of(mech, inputs):
  return [np.asarray(mechanisms.bsvs_counts(x, mech.shape), np.float64) for x in inputs]


def release(mech, counts, iterations):
  """``(keys [m], which) -> float64 [m, T, s, |Y|]``: m runs' T releases of ``counts[which]`` (which: 0 or 1)."""
  counts = np.stack(counts)

  def server_keys(keys, t):  # iteration t's noise key, then simulate's server key (split(key)[1])
    return jax.vmap(lambda k: jax.random.split(jax.random.fold_in(k, t))[1])(keys)

  def run(keys, which):
    per_t = [mech.estimate(server_keys(keys, t), counts[int(which)], NUM_PRIVATE) for t in range(1, iterations + 1)]
    return np.stack([np.asarray(r, np.float64) for r in per_t], axis=1)

  return run


def side_code(c0, c1):
  """Changed cells on D1's side minus those on D0's, summed over the T releases (integer, -4T..4T)."""
  changed = c0 != c1

  def statistic(outputs):
    towards_1 = np.where(c1 > c0, outputs >= c1, outputs <= c1)  # a unit shift: at or beyond D1's count
    return np.sum(np.where(changed, np.where(towards_1, 1, -1), 0), axis=(1, 2, 3)).astype(np.int64)

  return statistic


def laplace_llr(c0, c1, scale):
  def statistic(outputs):
    return np.sum((np.abs(outputs - c0) - np.abs(outputs - c1)) / scale, axis=(1, 2, 3))
  return statistic


def test_the_worst_pair_differs_by_2k_in_every_edge_label_cell():
  # Checked on the pipeline's own edges, written out: D0 votes (q0, 0) and (q1, 0); D1 votes (q2, 1), (q0, 1).
  mech, inputs = pipeline_pieces("discrete-laplace", 1)
  c0, c1 = counts_of(mech, inputs)
  diff = c1 - c0
  want = np.zeros((S, C))
  want[0, 0] = want[1, 0] = -1
  want[2, 1] = want[0, 1] = 1
  np.testing.assert_array_equal(diff, want)
  assert np.abs(diff).sum() == 2 * K == mech.sensitivity
  # The audited function is the pipeline's release: one key gives simulate's estimate.
  key = jax.random.key(5)
  got = release(mech, (c0, c1), 1)(key[None], 0)[0, 0]
  np.testing.assert_array_equal(got, np.asarray(simulate(jax.random.fold_in(key, 1), mech, inputs[0]).estimate))


@pytest.mark.parametrize("connection, sensitivity, iterations, num_samples, seed, floor", [
    ("reverse-knn", 2 * K, 1, N, 31, 0.85), ("reverse-knn", 2 * K, 2, 5 * N, 32, 0.78),
    ("knn-labeling", 2 * S, 1, 5 * N, 36, 0.85)])
def test_no_alarm_and_a_tight_bound_on_the_discrete_laplace_release_chain(connection, sensitivity, iterations,
                                                                          num_samples, seed, floor):
  mech, inputs = central_pieces(connection, iterations)
  # a = eps_t / 2k (k-NN labeling: eps_t / 2s), by hand
  assert mech.parameter == pytest.approx(EPSILON / iterations / sensitivity, rel=1e-12)
  c0, c1 = counts_of(mech, inputs)
  r = audit.audit_privacy(jax.random.key(seed), release(mech, (c0, c1), iterations), 0, 1,
                          num_samples=num_samples, alpha=ALPHA, claimed_epsilon=EPSILON, statistic=side_code(c0, c1),
                          batched=True, batch_size=50_000)
  assert not r.alarm and r.kind == "bins"
  assert floor < r.epsilon_lower <= EPSILON


def test_the_laplace_release_chain_is_eps_dp_up_to_the_float_leak_its_statement_warns_of():
  mech, inputs = pipeline_pieces("laplace", 1)
  assert mech.scale == pytest.approx(2 * K / EPSILON, rel=1e-12)
  c0, c1 = counts_of(mech, inputs)
  run, llr = release(mech, (c0, c1), 1), laplace_llr(c0, c1, mech.scale)
  # The real-valued mechanism: the likelihood ratio rounded to 1e-9 (coarser than float64's rounding of it) has
  # its top atom at ratio e^eps exactly; no alarm.
  r = audit.audit_privacy(jax.random.key(33), run, 0, 1, num_samples=N, alpha=ALPHA, claimed_epsilon=EPSILON,
                          statistic=lambda out: np.round(llr(out), 9), batched=True, batch_size=50_000)
  assert not r.alarm and r.kind == "thresholds"
  assert 0.7 < r.epsilon_lower <= EPSILON
  # The float64 release itself: A + noise carries which integer A was in its rounding (Mironov 2012), and the
  # unrounded ratio exceeds 1 = 4 / scale only for outputs of D1 ("T > 1": about 1 in 1,000 under D1, never under
  # D0). The auditor proves the statement's warning true: the float output is not eps-DP.
  assert [w.code for w in mech.privacy().warnings] == ["float_laplace_output"]
  r = audit.audit_privacy(jax.random.key(35), run, 0, 1, num_samples=N, alpha=ALPHA, claimed_epsilon=EPSILON,
                          statistic=llr, batched=True, batch_size=50_000)
  assert r.alarm and r.epsilon_lower > 1.5 * EPSILON


def test_the_knn_labeling_worst_pair_moves_a_vote_in_every_row():
  mech, inputs = central_pieces("knn-labeling", 1)
  c0, c1 = counts_of(mech, inputs)
  want = np.zeros((S, C))
  want[:, 0], want[:, 1] = -1, 1
  np.testing.assert_array_equal(c1 - c0, want)
  assert np.abs(c1 - c0).sum() == 2 * S == mech.sensitivity


@pytest.mark.parametrize("connection, seed, true_epsilon, floor", [("reverse-knn", 34, 2, 1.5),
                                                                  ("knn-labeling", 37, 3, 2.0)])
def test_a_chain_calibrated_for_k_1_is_caught(connection, seed, true_epsilon, floor):
  # The bug class the audit exists for: noise for sensitivity 2 (k = 1) on counts that move further. Reverse
  # k-NN's edges of out-degree 2 move 4 (true epsilon 2: the statistic's extreme code has ratio e^{4 a} with
  # a = eps / 2); k-NN labeling calibrated as if it were reverse k-NN, 2s = 6 (true epsilon 3).
  mech, inputs = central_pieces(connection, 1)
  wrong = mechanisms.CentralDiscreteLaplace(mechanisms.BsvsShape(S, C, 1), EPSILON)
  assert math.isclose(wrong.parameter, EPSILON / 2)
  c0, c1 = counts_of(mech, inputs)
  r = audit.audit_privacy(jax.random.key(seed), release(wrong, (c0, c1), 1), 0, 1, num_samples=N, alpha=ALPHA,
                          claimed_epsilon=EPSILON, statistic=side_code(c0, c1), batched=True, batch_size=50_000)
  assert r.alarm and floor * EPSILON < r.epsilon_lower <= true_epsilon * EPSILON


# --- Appendix C's balanced rules: the nominal noise is not DP ------------------------------------------------------
#: Two queries on a line and three records. Under D0 the balanced rules send record 0 (at 1) to query 0 and records
#: 1 and 2 to query 1; D1 moves record 0 alone to 9.5, and the rules re-route records 1 and 2 to query 0 (spec §5,
#: I8). The counts differ by 6 in L1 against reverse k-NN's 2k = 2.
BALANCED_QUERIES = np.array([[0.0], [10.0]], np.float32)
BALANCED_D0 = (np.array([[1.0], [2.0], [3.0]], np.float32), np.array([0, 1, 1]))
BALANCED_D1 = (np.array([[9.5], [2.0], [3.0]], np.float32), np.array([0, 1, 1]))


@pytest.mark.parametrize("rule, seed", [("balanced-max-min", 38), ("balanced-harmonic", 39)])
def test_balanced_rules_nominal_noise_is_not_dp_as_their_statement_says(rule, seed):
  assert not components.connection_privacy(rule, 1, 2).dp_valid  # the statement: no guarantee (epsilon = inf)
  mech, inputs = pipeline_pieces("discrete-laplace", 1, connection=rule, pair=(BALANCED_D0, BALANCED_D1), k=1,
                                 queries=BALANCED_QUERIES)
  assert mech.sensitivity == 2  # the nominal calibration, for reverse k-NN's 2k
  c0, c1 = counts_of(mech, inputs)
  np.testing.assert_array_equal(c1 - c0, [[-1, 2], [1, -2]])  # record 0's own edge, and two re-routed ones
  # True epsilon of the pair: a = eps / 2 per unit of L1, 6 units: 3 eps.
  r = audit.audit_privacy(jax.random.key(seed), release(mech, (c0, c1), 1), 0, 1, num_samples=N, alpha=ALPHA,
                          claimed_epsilon=EPSILON, statistic=side_code(c0, c1), batched=True, batch_size=50_000)
  assert r.alarm and 2 * EPSILON < r.epsilon_lower <= 3 * EPSILON


# --- local mechanisms: what record 0's client sends -------------------------------------------------------------
#: Client 0's flattened entries (bucket * |Y| + label) in D0 and D1: {(q0, 0), (q1, 0)} and {(q2, 1), (q0, 1)}.
ENTRIES_0, ENTRIES_1 = (0, 2), (5, 1)


def client_zero(inputs):
  return [(x.buckets[0], x.labels[0]) for x in inputs]


def local_release(mech, iterations):
  """``(key, client) -> T messages``: record 0's message in each iteration, keyed as ``simulate`` keys client 0."""
  def run(key, client):
    buckets, labels = client
    return tuple(mech.randomize(jax.random.fold_in(jax.random.split(jax.random.fold_in(key, t))[0], 0), buckets,
                                labels) for t in range(1, iterations + 1))
  return run


def rr_agreement(messages):
  """Over the T messages, the differing bits that agree with D0 (integer, 0..4T): sufficient for the pair."""
  x0, x1 = jnp.array(ENTRIES_0), jnp.array(ENTRIES_1)
  return sum(m[x0].sum() + (~m[x1]).sum() for m in messages).astype(jnp.int32)


@functools.lru_cache(maxsize=None)
def collision_pmfs(mech):
  """Exact pmfs of the hits-and-collisions code on items ENTRIES_0 + ENTRIES_1 under D0 and D1 (enumerated)."""
  items = ENTRIES_0 + ENTRIES_1
  return [collision_statistic_pmf(items, list(e), mech.epsilon, mech.bloom_length, K) for e in (ENTRIES_0, ENTRIES_1)]


def collision_llr(mech):
  """Summed over the T messages, ln(Pr_D0 / Pr_D1) of each message's code: the likelihood-ratio test."""
  p, q = collision_pmfs(mech)
  table = np.zeros(2 ** 10)
  for code in p:
    table[code] = math.log(p[code] / q[code])
  table = jnp.asarray(table, jnp.float32)
  items = ENTRIES_0 + ENTRIES_1

  def statistic(messages):
    codes = [_hits_and_collisions((m.output, hash_table(m.seed, mech.shape.d, mech.bloom_length)), items)
             for m in messages]
    return sum(table[c] for c in codes)

  return statistic


def test_the_local_chain_splits_epsilon_over_iterations_and_sends_what_simulate_sums():
  for iterations in (1, 2):
    rr, inputs = pipeline_pieces("discrete-laplace", iterations, "local-rr")
    assert rr.epsilon == EPSILON / iterations and rr.shape == mechanisms.BsvsShape(S, C, K)
    assert rr.bit_epsilon == pytest.approx(EPSILON / iterations / (2 * K), rel=1e-15)  # eps_t / 2kr, r = 1
    coll, _ = pipeline_pieces("discrete-laplace", iterations, "local-collision")
    assert coll.epsilon == EPSILON / iterations and coll.shape == rr.shape
  # Client 0's entries as the connection made them (written out in the module's data).
  for x, entries in zip(client_zero(inputs), (ENTRIES_0, ENTRIES_1)):
    np.testing.assert_array_equal(np.sort(mechanisms.client_entries(*x, C)), np.sort(entries))
  # The audited message is the one simulate sums: run alone, client 0's RR bits are simulate's estimate undone.
  key = jax.random.key(6)
  one = mechanisms.BsvsInput(inputs[0].buckets[:1], inputs[0].labels[:1])
  for t in (1, 2):
    message = np.asarray(local_release(rr, 2)(key, client_zero(inputs)[0])[t - 1])
    estimate = np.asarray(simulate(jax.random.fold_in(key, t), rr, one).estimate).ravel()
    q = 1 - rr.keep_probability
    np.testing.assert_allclose(estimate * (rr.keep_probability - q) + q, message, atol=1e-9)


def local_true_epsilon(mech, iterations):
  """The pair's exact epsilon over T messages, from the definitions: T times one message's largest ratio."""
  if isinstance(mech, mechanisms.RandomizedResponse):  # 4 differing bits, each p / q at most
    return iterations * rr_true_epsilon(mech)
  return iterations * accounting.epsilon_for_delta(*collision_pmfs(mech), 0.0)


def local_statistic(mech):
  return rr_agreement if isinstance(mech, mechanisms.RandomizedResponse) else collision_llr(mech)


@pytest.mark.parametrize("mechanism, iterations, num_samples, seed, floor", [
    ("local-rr", 1, N, 41, 0.85), ("local-rr", 2, 5 * N, 42, 0.7),
    ("local-collision", 1, N, 43, 0.9), ("local-collision", 2, N, 44, 0.8)])
def test_no_alarm_and_a_tight_bound_on_the_local_release_chain(mechanism, iterations, num_samples, seed, floor):
  mech, inputs = pipeline_pieces("discrete-laplace", iterations, mechanism)
  true_epsilon = local_true_epsilon(mech, iterations)
  assert 0.999 * EPSILON < true_epsilon <= EPSILON * (1 + 1e-12)  # the claim holds, and is tight
  r = audit.audit_privacy(jax.random.key(seed), local_release(mech, iterations), *client_zero(inputs),
                          num_samples=num_samples, alpha=ALPHA, claimed_epsilon=EPSILON,
                          statistic=local_statistic(mech))
  assert not r.alarm
  assert floor < r.epsilon_lower <= true_epsilon


@pytest.mark.parametrize("mechanism, num_samples, seed", [("local-rr", 5 * N, 45), ("local-collision", N, 46)])
def test_a_local_chain_that_spends_the_total_in_every_iteration_is_caught(mechanism, num_samples, seed):
  # The composition forgotten: each of T = 2 messages at the total epsilon (true epsilon 2, claimed 1).
  split, inputs = pipeline_pieces("discrete-laplace", 2, mechanism)
  mech = type(split)(split.shape, EPSILON)
  r = audit.audit_privacy(jax.random.key(seed), local_release(mech, 2), *client_zero(inputs), num_samples=num_samples,
                          alpha=ALPHA, claimed_epsilon=EPSILON, statistic=local_statistic(mech))
  assert r.alarm and 1.5 * EPSILON < r.epsilon_lower <= local_true_epsilon(mech, 2) <= 2 * EPSILON * (1 + 1e-12)
