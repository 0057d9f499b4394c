"""Mechanisms written by the auditor tests: correct ones and ones with planted bugs.

Each is a pure function (key, x) -> output, vmappable over keys, with the
neighbouring inputs and the statistic the audit uses. The correct versions
follow the definitions (spec/REVERSE_KNN.md §1.4, §1.6, §1.7) directly. The
last section holds pairs, statistics and one planted bug (a subclass) for
the library's own Collision and central mechanisms.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import mechanisms as M

# --- Laplace release of a count with L1 sensitivity DELTA ----------------------
# A BSVS entry under replace-one with k = r = 1 has sensitivity 2kr = 2.
DELTA = 2.0
EPS = 1.0


def laplace_release(key, count):
  """count + Lap(DELTA / EPS): EPS-DP for counts differing by at most DELTA."""
  return count + jax.random.laplace(key, dtype=jnp.float32) * (DELTA / EPS)


def laplace_half_sensitivity(key, count):
  """Planted bug: scale DELTA / (2 EPS), as if the sensitivity were kr instead of 2kr (true eps 2)."""
  return count + jax.random.laplace(key, dtype=jnp.float32) * (DELTA / (2 * EPS))


LAPLACE_PAIR = (jnp.float32(10.0), jnp.float32(10.0 + DELTA))


# --- Randomized response with budget splitting ------------------------------------
@dataclasses.dataclass(frozen=True)
class RandomizedResponseEpsOverKr(M.RandomizedResponse):
  """Planted bug: eps' = eps / (kr) per bit instead of eps / (2kr) (true eps 2 eps)."""

  def _exact_bit_epsilon(self):  # the sampler's threshold and bit_epsilon both derive from it
    return super()._exact_bit_epsilon() * 2


RR_SHAPE = M.BsvsShape(4, 2, 2)  # k = 2: the worst pair differs in 2kr = 4 bits
RR_PAIR = ((jnp.array([0, 1], jnp.int32), jnp.array([0], jnp.int32)),
           (jnp.array([2, 3], jnp.int32), jnp.array([0], jnp.int32)))
_X0_BITS = jnp.array([0, 2])  # flattened entries bucket * |Y| + label of x0
_X1_BITS = jnp.array([4, 6])


def rr_statistic(message):
  """Differing bits that agree with x0 (in 0..4): sufficient for the worst pair."""
  return (message[_X0_BITS].sum() + (~message[_X1_BITS]).sum()).astype(jnp.int32)


# --- Collision (Definition 5) with c = |S| -----------------------------------------
def _collision(key, items, epsilon, c, length, omega_c):
  """One Collision message for the item set ``items`` [c] (distinct) of domain D_COLL.

  The hash is public and fully random (drawn from the key); output z in [length]
  with Pr[z = v] = e^eps / Omega for v in C = h(S), the rest of the mass uniform
  over the other values. ``omega_c`` is the c used in Omega = c e^eps + l - c
  (the correct mechanism uses c = |S|).
  """
  k_hash, k_out = jax.random.split(key)
  h = jax.random.randint(k_hash, (D_COLL,), 0, length)
  in_c = jnp.zeros(length, bool).at[h[items]].set(True)
  omega = omega_c * math.exp(epsilon) + length - omega_c
  p_hit = math.exp(epsilon) / omega
  size_c = in_c.sum()
  p_miss = (1.0 - size_c * p_hit) / (length - size_c)
  probs = jnp.where(in_c, p_hit, p_miss)
  z = jax.random.categorical(k_out, jnp.log(probs))
  return z, h


D_COLL = 6


def collision_length(c, epsilon):
  return int(math.floor(c * math.exp(epsilon) + 2 * c - 1))


def collision(key, items):
  """Correct (D_COLL, c = 1, EPS, l)-Collision."""
  return _collision(key, items, EPS, 1, collision_length(1, EPS), 1)


def collision_forgot_omega(key, items):
  """Planted bug: p = e^eps / l (the Omega normalisation forgotten); true eps ~ 2.96 at eps = 1."""
  length = collision_length(1, EPS)
  k_hash, k_out = jax.random.split(key)
  h = jax.random.randint(k_hash, (D_COLL,), 0, length)
  in_c = jnp.zeros(length, bool).at[h[items]].set(True)
  p_hit = math.exp(EPS) / length
  probs = jnp.where(in_c, p_hit, (1 - p_hit) / (length - 1))
  return jax.random.categorical(k_out, jnp.log(probs)), h


def collision_c2(key, items):
  """Correct Collision with c = 2 (two items per client)."""
  return _collision(key, items, EPS, 2, collision_length(2, EPS), 2)


def collision_c2_omega_of_c1(key, items):
  """Subtle planted bug: c = 2 but Omega computed with c = 1 (true eps ~ 1.34 at eps = 1)."""
  return _collision(key, items, EPS, 2, collision_length(2, EPS), 1)


COLLISION_PAIR = (jnp.array([0], jnp.int32), jnp.array([1], jnp.int32))
COLLISION_C2_PAIR = (jnp.array([0, 2], jnp.int32), jnp.array([1, 2], jnp.int32))


def _hits_and_collisions(message, items):
  """Integer code of which items z hits and which of their hashes collide.

  For a Collision message this is a sufficient statistic for the pair (the
  output law depends on the input only through these events), so the
  auditor's bins can reach the true epsilon.
  """
  z, h = message
  code, bit = jnp.int32(0), 1
  for i in items:
    code, bit = code + bit * (z == h[i]).astype(jnp.int32), bit * 2
  for a in range(len(items)):
    for b in range(a + 1, len(items)):
      code, bit = code + bit * (h[items[a]] == h[items[b]]).astype(jnp.int32), bit * 2
  return code


def collision_statistic(message):
  """For COLLISION_PAIR: hits on items 0, 1 and whether h(0) = h(1)."""
  return _hits_and_collisions(message, (0, 1))


def collision_c2_statistic(message):
  """For COLLISION_C2_PAIR: hits on items 0, 1, 2 and their hash collisions."""
  return _hits_and_collisions(message, (0, 1, 2))


# --- An (eps, delta) mechanism: RR that leaks its input with probability LEAK -----
LEAK = 0.01


def leaky_rr(key, bit):
  """With prob LEAK output (bit, revealed=1), else (RR_eps(bit), 0); code = 2*revealed + out.

  Exact profile: delta(EPS) = LEAK (the revealed outputs have no counterpart).
  """
  k_leak, k_rr = jax.random.split(key)
  keep = jax.random.bernoulli(k_rr, math.exp(EPS) / (1 + math.exp(EPS)))
  out = jnp.where(keep, bit, 1 - bit)
  revealed = jax.random.bernoulli(k_leak, LEAK)
  return jnp.where(revealed, 2 + bit, out).astype(jnp.int32)


# --- The library's own mechanisms ---------------------------------------------------
# Collision with c = kr = 2: shape (3 buckets, 1 label, k = 2), so a client's entries are
# its buckets; the worst pair swaps one of two items, as COLLISION_C2_PAIR does.
LIB_COLLISION_SHAPE = M.BsvsShape(3, 1, 2)
LIB_COLLISION_PAIR = ((jnp.array([0, 2], jnp.int32), jnp.array([0], jnp.int32)),
                      (jnp.array([1, 2], jnp.int32), jnp.array([0], jnp.int32)))


@dataclasses.dataclass(frozen=True)
class CollisionOmegaOfC1(M.Collision):
  """Planted bug in the library Collision: its sampler's p uses Omega with c = 1.

  p = e^eps / (e^eps + l - 1) instead of e^eps / (2 e^eps + l - 2) for c = 2
  (l, the estimator and the privacy statement unchanged), sampled exactly by
  the library's own sampler; true epsilon ln(p / ((1 - 2p)/(l - 2))) = 1.3374 at eps = 1 (l = 8).
  """

  def randomize(self, key, buckets, labels):
    from jaxdistill.mechanisms import _collision
    wrong_p, _, _ = _collision.collision_rates(self.epsilon, 1, self.bloom_length)
    entries = M.client_entries(buckets, labels, self.shape.num_labels)
    return _collision.sample_collision_output(key, entries, domain=self.shape.d,
                                              bloom_length=self.bloom_length, p=wrong_p,
                                              cardinality=self.cardinality)[0]


@functools.lru_cache(maxsize=None)
def library_collision_statistic(mech):
  """Hits of z on items 0, 1, 2 and their hash collisions, the table regenerated from the seed.

  Sufficient for LIB_COLLISION_PAIR (as collision_c2_statistic is for the test's own
  Collision). One function object per mechanism, so audits compile once.
  """
  from jaxdistill.mechanisms import _collision

  def statistic(message):
    table = _collision.hash_table(message.seed, mech.shape.d, mech.bloom_length)
    return _hits_and_collisions((message.output, table), (0, 1, 2))

  return statistic


# Central mechanisms: k = r = 1, replace-one, so one record moves from entry B to entry A
# of the counts and the sensitivity is 2. The release is the library's estimate(), whose
# noise is drawn on the host: audited as a batched mechanism (an array of keys at once).
CENTRAL_SHAPE = M.BsvsShape(2, 2, 1)
CENTRAL_N = 10
CENTRAL_A, CENTRAL_B = (0, 0), (1, 1)  # the record's entry in D1 and in D0
CENTRAL_COUNTS_0 = np.array([[3, 2], [1, 4]])  # A of D0 (n = 10 clients)
CENTRAL_COUNTS_1 = CENTRAL_COUNTS_0 + np.array([[1, 0], [0, -1]])


def central_release(mech):
  """``(keys [m], counts) -> float64 [m, s, |Y|]``: m independent releases of the library."""
  return lambda keys, counts: mech.estimate(keys, counts, CENTRAL_N)


def discrete_laplace_statistic(releases):
  """#coordinates where the release sits on D1's side: sufficient for a discrete Laplace pair.

  Per coordinate the log-likelihood ratio of D1 vs D0 is +a if the released count is
  beyond D0's count towards D1's, else -a; so this code (0, 1, 2) carries the whole
  privacy loss, 2a = eps at the extremes.
  """
  towards_a = releases[:, CENTRAL_A[0], CENTRAL_A[1]] >= CENTRAL_COUNTS_0[CENTRAL_A] + 1
  towards_b = releases[:, CENTRAL_B[0], CENTRAL_B[1]] <= CENTRAL_COUNTS_0[CENTRAL_B] - 1
  return towards_a.astype(np.int64) + towards_b.astype(np.int64)


def laplace_llr_statistic(scale):
  """The log-likelihood ratio log f_D1(x) / f_D0(x) of a Laplace(scale) release (optimal)."""
  def statistic(releases):
    xa = releases[:, CENTRAL_A[0], CENTRAL_A[1]] - CENTRAL_COUNTS_0[CENTRAL_A]
    xb = releases[:, CENTRAL_B[0], CENTRAL_B[1]] - CENTRAL_COUNTS_0[CENTRAL_B]
    return ((np.abs(xa) - np.abs(xa - 1)) + (np.abs(xb) - np.abs(xb + 1))) / scale
  return statistic
