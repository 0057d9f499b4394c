"""Mechanisms written by the auditor tests: correct ones and ones with planted bugs.

Each is a pure function (key, x) -> output, vmappable over keys, with the
neighbouring inputs and the statistic the audit uses. The correct versions
follow the definitions (spec/REVERSE_KNN.md §1.4, §1.6, §1.7) directly.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

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

  @property
  def bit_epsilon(self) -> float:
    return self.epsilon / self.shape.c


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
