"""The auditor on FedMD's two privacy claims: NFDP's sampling and FedMD-LDP's Gaussian releases.

NFDP (Sun & Lyu 2021, Theorems 1-2). A party of n records draws k of them, and everything it releases is
computed from that sample; the worst case releases the sampled records themselves, which this audit does
(``NfdpSampler.sample``; D0 holds records 0..n-1, its add/remove neighbour D1 the records 1..n-1, and the
statistic is whether record 0 was released). The exact profile (``accounting.nfdp_privacy``, enumerated in
``tests/properties/test_nfdp_enumeration.py``) is flat: delta(eps) = p for every eps, with p = k/n without
replacement and 1 - (1 - 1/n)^k with it (1 - (1 - p)^R when each of R rounds draws afresh). The audit checks
the three sides of that statement: the paper's pair, and (0, p), hold with delta tight; no epsilon, even 14
times the paper's, buys a delta below p; and at a delta below p the epsilon bound is large (the truth is
infinite). A run that resamples in each of R = 2 rounds breaks the paper's one-sample pair.

FedMD-LDP. Each round a party releases its Q public-sample rows (``fedmd.release``: logits clipped to L2 norm
``clip`` by ``fedmd.clip_rows``, or argmax votes), plus N(0, sigma^2) per entry, keyed per round; sigma comes
from ``calibrate_ldp_sigma`` for the Q x R releases at sensitivity ``release_sensitivity`` (the range's
diameter: 2 clip, or sqrt 2 for votes). The pair sits at the diameter's two ends; the sum of all releases
projected on the direction between them is sufficient. The true delta(eps) is the Gaussian's, written out
(Balle & Wang 2018, Thm. 8) with mu = sqrt(QR) diameter / sigma; the planted bug calibrates sigma for R
releases, forgetting the Q rows per round.

Rates. Each audit runs at alpha = 1e-4 (Clopper-Pearson + Bonferroni), so its bounds exceed the truth with
probability <= 1e-4. Thirteen audits: family-wise <= 1.3e-3. The floors are separate events; their spread,
measured at seeds 0-9 (the tests use others):

================================================  ================  ===============================
audit (200,000 samples)                           mean (sd)         floor, sd below the mean
================================================  ================  ===============================
NFDP WOR, delta_lower at (0, p = 0.2)             0.1950 (0.0007)   0.94 p = 0.188, 10.4
NFDP WOR, delta_lower at (3, 0.9 p)               0.1937 (0.0007)   0.188, 8.5
NFDP WR, delta_lower at (0, p = 0.1855)           0.1814 (0.0010)   0.94 p = 0.1744, 7.2
NFDP WR, delta_lower at (3, 0.9 p)                0.1801 (0.0010)   0.1744, 5.9
NFDP WOR, R = 2 resampled, at (0, 0.36)           0.3539 (0.0009)   0.94 x 0.36 = 0.338, 16.9
NFDP WOR / WR, epsilon_lower at delta = p / 2     7.23 / 7.16       5, > 190 (the truth is infinite)
FedMD-LDP logits, epsilon_lower at delta = 0.01   0.877 (0.014)     0.75, 9.1
FedMD-LDP argmax, epsilon_lower at delta = 0.01   0.887 (0.015)     0.75, 9.2
FedMD-LDP with sigma for R releases (planted)     1.431 (0.032)     1.2, 7.2 (an alarm)
================================================  ================  ===============================

so each floor fails with probability < 2e-9 under a normal approximation of the bound. Seeds are fixed; the
outcome is deterministic.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, stats

from jaxdistill import accounting, audit, fedmd

ALPHA = 1e-4
N = 200_000


# --- NFDP: the sample itself is released --------------------------------------------------------------------------
def nfdp_release(n, k, with_replacement, rounds):
  """``(keys [m], which) -> int [m, rounds * k]``: the record ids sampled from D0 (which = 0) or D1 (which = 1)."""
  holder, neighbour = fedmd.NfdpSampler(n, k, with_replacement), fedmd.NfdpSampler(n - 1, k, with_replacement)

  def run(keys, which):
    draws = []
    for r in range(rounds):  # a fresh sample per round
      round_keys = jax.vmap(lambda key: jax.random.fold_in(key, r))(keys)
      ids = (jax.vmap(holder.sample)(round_keys) if int(which) == 0
             else jax.vmap(neighbour.sample)(round_keys) + 1)  # D1 holds records 1..n-1
      draws.append(np.asarray(ids))
    return np.concatenate(draws, axis=1)

  return run


def record_0_released(ids):
  return np.any(ids == 0, axis=1).astype(np.int64)


def audit_nfdp(run, seed, epsilon, delta):
  return audit.audit_privacy(jax.random.key(seed), run, 0, 1, num_samples=N, alpha=ALPHA, claimed_epsilon=epsilon,
                             claimed_delta=delta, statistic=record_0_released, batched=True, batch_size=50_000)


@pytest.mark.parametrize("with_replacement, p, seed", [(False, 4 / 20, 11), (True, 1 - (19 / 20) ** 4, 12)])
def test_nfdp_release_is_flat_at_delta_p_and_the_papers_epsilon_buys_nothing(with_replacement, p, seed):
  n, k = 20, 4
  privacy = accounting.nfdp_privacy(n, k, with_replacement=with_replacement)
  assert privacy.flat_delta == pytest.approx(p, rel=1e-12) and privacy.paper_delta == pytest.approx(p, rel=1e-12)
  run = nfdp_release(n, k, with_replacement, 1)
  # The paper's pair holds, and so does (0, p): its epsilon adds nothing. Delta is tight at both.
  for i, epsilon in enumerate((privacy.paper_epsilon, 0.0)):
    r = audit_nfdp(run, seed + 100 * i, epsilon, p)
    assert not r.alarm and r.kind == "bins"
    assert 0.94 * p < r.delta_lower <= p
  # At 14 times the paper's epsilon, delta is still p: a claim of 0.9 p is caught.
  r = audit_nfdp(run, seed + 200, 3.0, 0.9 * p)
  assert 14 * privacy.paper_epsilon < 3.0
  assert r.alarm and 0.94 * p < r.delta_lower <= p
  # Below delta = p no finite epsilon holds: at p / 2 the bound is far above the paper's epsilon.
  r = audit_nfdp(run, seed + 300, privacy.paper_epsilon, p / 2)
  assert r.alarm and r.epsilon_lower > 5.0


def test_nfdp_resampled_each_round_is_flat_at_one_minus_one_minus_p_to_the_r():
  n, k, rounds = 20, 4, 2
  privacy = accounting.nfdp_privacy(n, k, rounds=rounds, resample_each_round=True)
  truth = 1 - (1 - k / n) ** rounds  # 0.36: record 0 stays hidden only if neither round draws it
  assert privacy.flat_delta == pytest.approx(truth, rel=1e-12)
  run = nfdp_release(n, k, False, rounds)
  r = audit_nfdp(run, 13, 0.0, truth)
  assert not r.alarm and 0.94 * truth < r.delta_lower <= truth
  # The paper's one-sample pair (0.211, 0.2) does not cover a run that resamples.
  assert privacy.paper_delta == pytest.approx(k / n)
  r = audit_nfdp(run, 14, privacy.paper_epsilon, privacy.paper_delta)
  assert r.alarm and 0.94 * truth < r.delta_lower <= truth


# --- FedMD-LDP: clipped logits plus Gaussian noise ----------------------------------------------------------------
Q, R, C, CLIP = 2, 2, 3, 1.0
EPSILON, DELTA = 1.0, 0.01
E = np.eye(C, dtype=np.float32)
#: Per release mode: a party's logits row on each of the round's Q public samples under D0 and D1, the unit vector
#: along which their releases differ, and that distance written out. Logits: far outside the clip ball at opposite
#: ends of a diameter (2 clip apart). Argmax: votes for different classes (sqrt 2 apart).
PAIRS = {"logits": (50 * E[0], -50 * E[0], E[0], 2 * CLIP),
         "argmax": (50 * E[0], 50 * E[1], (E[0] - E[1]) / math.sqrt(2), math.sqrt(2))}


def ldp_release(mode, sigma):
  """``(key, logits [Q, C]) -> [R, Q, C]``: the party's R rounds of releases plus N(0, sigma^2) noise."""
  def run(key, logits):
    rel = fedmd.release(logits[None], mode)[0]
    if mode == "logits":  # as the runner: only logits are clipped
      rel = fedmd.clip_rows(rel, CLIP)
    return jnp.stack([rel + sigma * jax.random.normal(jax.random.fold_in(key, r), rel.shape) for r in range(R)])
  return run


def projection(mode):
  direction = jnp.asarray(PAIRS[mode][2])
  return lambda released: jnp.sum(released @ direction)


def gaussian_delta(epsilon, mu):
  """delta(eps) of N(0, 1) against N(mu, 1) (Balle & Wang 2018, Thm. 8), written out."""
  return stats.norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon) * stats.norm.cdf(-mu / 2 - epsilon / mu)


def true_epsilon(mode, sigma):
  mu = math.sqrt(Q * R) * PAIRS[mode][3] / sigma  # QR releases, each moved by the range's diameter
  return optimize.brentq(lambda e: gaussian_delta(e, mu) - DELTA, 0.0, 50.0)


def audit_ldp(mode, sigma, seed):
  x0, x1 = (jnp.asarray(np.tile(row, (Q, 1))) for row in PAIRS[mode][:2])
  return audit.audit_privacy(jax.random.key(seed), ldp_release(mode, sigma), x0, x1, num_samples=N, alpha=ALPHA,
                             claimed_epsilon=EPSILON, claimed_delta=DELTA, statistic=projection(mode))


@pytest.mark.parametrize("mode, seed", [("logits", 15), ("argmax", 17)])
def test_fedmd_ldp_release_meets_its_calibrated_epsilon(mode, seed):
  sensitivity = fedmd.release_sensitivity(mode, CLIP if mode == "logits" else None)
  assert sensitivity == pytest.approx(PAIRS[mode][3], rel=1e-15)
  sigma = fedmd.calibrate_ldp_sigma(EPSILON, DELTA, sensitivity=sensitivity, count=Q * R)
  assert 0.999 * EPSILON < true_epsilon(mode, sigma) <= EPSILON  # calibrated, and tight
  r = audit_ldp(mode, sigma, seed)
  assert not r.alarm and r.kind == "thresholds"
  assert 0.75 < r.epsilon_lower <= true_epsilon(mode, sigma)


def test_fedmd_ldp_noise_for_r_releases_instead_of_q_times_r_is_caught():
  sigma = fedmd.calibrate_ldp_sigma(EPSILON, DELTA, sensitivity=2 * CLIP, count=R)
  assert true_epsilon("logits", sigma) > 1.5 * EPSILON
  r = audit_ldp("logits", sigma, 16)
  assert r.alarm and 1.2 < r.epsilon_lower <= true_epsilon("logits", sigma)
