"""The auditor on the library's own mechanisms: no alarm on Collision and the central
releases, an alarm on a library Collision whose sampler uses a wrong p.

Rates: every audit runs at alpha = 1e-4, so each of the 3 null audits below raises a false
alarm with probability <= 1e-4 (Clopper-Pearson + Bonferroni; family-wise <= 3e-4 for
this file). The planted bug (true epsilon 1.338, by enumeration) gave lower bounds
1.272 at this seed and 1.270-1.288 at 5 other seeds (sd 0.006), ~44 sd above the claim
of 1, so a missed alarm (or a bound below the asserted 1.15, 20 sd) has probability
< 1e-9. Measured null bounds: 0.939 (Collision), 0.963 (discrete Laplace), 0.941
(Laplace), against true epsilons of 1. Seeds are fixed; the outcome is deterministic.

True epsilons come from the definitions, not from the code under test: enumeration of
the Collision statistic's pmf over every hash value of the three items and every output
(``collision_statistic_pmf``), and closed forms of the (discrete) Laplace likelihood ratio.
"""

import math

import jax
import numpy as np
import pytest

from jaxdistill import audit
from jaxdistill import mechanisms as M
from tests.audit import _mechanisms as T
from tests.audit.test_privacy_audit import collision_statistic_pmf

ALPHA = 1e-4
N = 200_000


def library_collision_true_epsilon(mech, omega_c):
  """Exact epsilon of the statistic for LIB_COLLISION_PAIR, Omega with c = omega_c."""
  from jaxdistill import accounting
  p = collision_statistic_pmf((0, 1, 2), [0, 2], mech.epsilon, mech.bloom_length, omega_c)
  q = collision_statistic_pmf((0, 1, 2), [1, 2], mech.epsilon, mech.bloom_length, omega_c)
  return accounting.epsilon_for_delta(p, q, 0.0)


def test_library_collision_parameters_match_the_oracle():
  mech = M.Collision(T.LIB_COLLISION_SHAPE, T.EPS)
  assert mech.bloom_length == T.collision_length(2, T.EPS) == 8
  assert mech.p == pytest.approx(math.exp(1) / (2 * math.exp(1) + 6), rel=1e-15)
  assert library_collision_true_epsilon(mech, 2) == pytest.approx(T.EPS, rel=1e-9)
  assert library_collision_true_epsilon(mech, 1) == pytest.approx(1.3382, abs=1e-3)


def test_no_alarm_on_library_collision():
  mech = M.Collision(T.LIB_COLLISION_SHAPE, T.EPS)
  r = audit.audit_privacy(jax.random.key(20), audit.local_randomizer(mech), *T.LIB_COLLISION_PAIR,
                          num_samples=N, alpha=ALPHA, claimed_epsilon=mech.epsilon,
                          statistic=T.library_collision_statistic(mech))
  assert not r.alarm and r.kind == "bins"
  assert 0.85 < r.epsilon_lower <= library_collision_true_epsilon(mech, 2)


def test_alarm_on_library_collision_with_a_wrong_p():
  bug = T.CollisionOmegaOfC1(T.LIB_COLLISION_SHAPE, T.EPS)
  assert bug.privacy().epsilon == T.EPS  # the claim is unchanged; only the sampler is wrong
  r = audit.audit_privacy(jax.random.key(21), audit.local_randomizer(bug), *T.LIB_COLLISION_PAIR,
                          num_samples=N, alpha=ALPHA, claimed_epsilon=bug.epsilon,
                          statistic=T.library_collision_statistic(bug))
  assert r.alarm
  assert T.EPS + 0.15 < r.epsilon_lower <= library_collision_true_epsilon(bug, 1)
  assert r.delta_lower > 0.0


def test_no_alarm_on_library_central_discrete_laplace():
  mech = M.CentralDiscreteLaplace(T.CENTRAL_SHAPE, T.EPS)
  assert mech.sensitivity == 2 and mech.parameter == T.EPS / 2
  r = audit.audit_privacy(jax.random.key(22), T.central_release(mech), T.CENTRAL_COUNTS_0,
                          T.CENTRAL_COUNTS_1, num_samples=N, alpha=ALPHA,
                          claimed_epsilon=mech.epsilon, statistic=T.discrete_laplace_statistic,
                          batched=True, batch_size=50_000)
  assert not r.alarm and r.kind == "bins"
  # Code 2 vs 0: ratio e^{2a} = e^eps exactly (a = eps / 2), so the bound is tight.
  assert 0.9 < r.epsilon_lower <= T.EPS


def test_no_alarm_on_library_central_laplace():
  mech = M.CentralLaplace(T.CENTRAL_SHAPE, T.EPS)
  r = audit.audit_privacy(jax.random.key(23), T.central_release(mech), T.CENTRAL_COUNTS_0,
                          T.CENTRAL_COUNTS_1, num_samples=N, alpha=ALPHA,
                          claimed_epsilon=mech.epsilon, statistic=T.laplace_llr_statistic(mech.scale),
                          batched=True, batch_size=50_000)
  assert not r.alarm and r.kind == "thresholds"
  # The likelihood ratio's top atom {LLR = 2 / scale} has ratio e^eps exactly.
  assert 0.9 < r.epsilon_lower <= T.EPS


def test_batched_central_release_is_the_per_key_release():
  # The audit draws many releases at once; each equals the library's one-key estimate.
  for cls in (M.CentralLaplace, M.CentralDiscreteLaplace):
    mech = cls(T.CENTRAL_SHAPE, T.EPS)
    keys = jax.random.split(jax.random.key(3), 4)
    many = T.central_release(mech)(keys, T.CENTRAL_COUNTS_0)
    assert many.shape == (4, 2, 2) and many.dtype == np.float64
    for i in range(4):
      np.testing.assert_array_equal(many[i], mech.estimate(keys[i], T.CENTRAL_COUNTS_0, T.CENTRAL_N))
