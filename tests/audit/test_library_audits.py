"""The auditor on the library's own mechanisms: no alarm on Collision and the central
releases, an alarm on a library Collision whose sampler uses a wrong p.

Rates. Every audit runs at alpha = 1e-4 (Clopper-Pearson + Bonferroni), which bounds the
probability that its epsilon_lower exceeds the true epsilon. Four assertions are such events:
no alarm in each of the 3 null audits (true epsilon = claim = 1), and the planted bug's bound
below its exact epsilon; family-wise <= 4e-4 for them. The accuracy floors on epsilon_lower are
separate events; their spread was measured at the test's seed and 10 other seeds (100-109):

=====================  ===========  ===============  ======  =================================
audit                  this seed    mean (sd)        floor   floor, sd below the mean
=====================  ===========  ===============  ======  =================================
Collision (null)       0.927        0.942 (0.012)    0.85    8.0
discrete Laplace       0.959        0.965 (0.009)    0.9     7.1
Laplace                0.948        0.949 (0.011)    0.87    6.9
planted bug            1.274        1.281 (0.010)    1.15    12.8 (the alarm at 1: 27)
=====================  ===========  ===============  ======  =================================

so each floor fails with probability < 1e-9 under a normal approximation of the bound (< 4e-9
together), and the file's family-wise false-failure rate is <= 4e-4 + 4e-9. Seeds are fixed;
the outcome is deterministic.

True epsilons come from the definitions, not from the code under test: enumeration of
the Collision statistic's pmf over every hash value of the three items and every output
(``collision_statistic_pmf``), checked against a closed form for the planted bug (true
epsilon ln(p / ((1 - 2p) / (l - 2))) = 1.3374 with p = e / (e + 7), l = 8), and closed
forms of the (discrete) Laplace likelihood ratio.
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
  # The bug's epsilon in closed form (independent of the enumeration): with Omega's c = 1 the
  # sampler puts p = e^eps / (e^eps + l - 1) on each value of C = h({0, 2}) and (1 - 2p) / (l - 2)
  # on each other value; the largest ratio is the event "z = h(0), no collisions", which has p
  # under {0, 2} and (1 - 2p) / (l - 2) under {1, 2}: 1.3374051 at eps = 1, l = 8.
  l, e = mech.bloom_length, math.exp(T.EPS)
  p = e / (e + l - 1)
  assert library_collision_true_epsilon(mech, 1) == pytest.approx(math.log(p / ((1 - 2 * p) / (l - 2))), rel=1e-9)


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
  assert 0.87 < r.epsilon_lower <= T.EPS


def test_batched_central_release_is_the_per_key_release():
  # The audit draws many releases at once; each equals the library's one-key estimate.
  for cls in (M.CentralLaplace, M.CentralDiscreteLaplace):
    mech = cls(T.CENTRAL_SHAPE, T.EPS)
    keys = jax.random.split(jax.random.key(3), 4)
    many = T.central_release(mech)(keys, T.CENTRAL_COUNTS_0)
    assert many.shape == (4, 2, 2) and many.dtype == np.float64
    for i in range(4):
      np.testing.assert_array_equal(many[i], mech.estimate(keys[i], T.CENTRAL_COUNTS_0, T.CENTRAL_N))
