"""Hypothesis-driven privacy audit of the library's randomized response at small sizes.

For random neighbouring client pairs (any two inputs: RR is a local
randomizer under replace-one) at epsilon in {0.5, 2} and k in {1, 2}, the
auditor must not alarm at the claimed epsilon, and its lower bound must stay
below the pair's exact epsilon, computed from the definition: (number of
differing bits) x ln(p/q) of the sampler. Each audit's false-alarm
probability is <= alpha = 1e-4; the ci profile runs 6 examples (<= 6e-4 in
all), the thorough profile 60 (<= 6e-3). Shapes and epsilons come from a
fixed set of 4, so at most 4 compilations.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxdistill import audit
from jaxdistill import mechanisms as M

# The active profile (HYPOTHESIS_PROFILE or --hypothesis-profile): `thorough` has 600 examples.
THOROUGH = settings().max_examples >= 600
S, Y = 4, 2


@functools.lru_cache(maxsize=None)
def _mechanism_with_pattern(mech):
  """(key, (b0, l0, b1, l1, which)) -> (message, x0's bits, x1's bits); one object per mech."""

  def dense(b, lab):
    ent = M.client_entries(b, lab, Y)
    return jnp.zeros(S * Y + 1, bool).at[jnp.where(ent >= 0, ent, S * Y)].set(True)[:-1]

  def fn(key, x):
    b0, l0, b1, l1, which = x
    b = jnp.where(which == 0, b0, b1)
    lab = jnp.where(which == 0, l0, l1)
    return mech.randomize(key, b, lab), dense(b0, l0), dense(b1, l1)

  return fn


def _agreement_with_x0(out):
  """Differing bits on which the message agrees with x0 (sufficient for the pair)."""
  msg, t0, t1 = out
  diff = t0 ^ t1
  return jnp.sum(diff & (msg == t0)).astype(jnp.int32)


@settings(max_examples=60 if THOROUGH else 6)
@given(eps=st.sampled_from([0.5, 2.0]), k=st.sampled_from([1, 2]), data=st.data())
def test_rr_never_alarms_and_stays_below_the_exact_pair_epsilon(eps, k, data):
  mech = M.RandomizedResponse(M.BsvsShape(S, Y, k), eps)
  b0 = data.draw(st.permutations(range(S)))[:k]
  b1 = data.draw(st.permutations(range(S)))[:k]
  l0, l1 = data.draw(st.integers(0, Y - 1)), data.draw(st.integers(0, Y - 1))
  base = (jnp.array(b0, jnp.int32), jnp.array([l0], jnp.int32), jnp.array(b1, jnp.int32),
          jnp.array([l1], jnp.int32))
  x0, x1 = (*base, jnp.int32(0)), (*base, jnp.int32(1))
  r = audit.audit_privacy(jax.random.key(data.draw(st.integers(0, 2**30))),
                          _mechanism_with_pattern(mech), x0, x1, num_samples=50_000, alpha=1e-4,
                          claimed_epsilon=eps, statistic=_agreement_with_x0)
  differing = len({b * Y + l0 for b in b0} ^ {b * Y + l1 for b in b1})
  exact = differing * mech.effective_bit_epsilon
  assert not r.alarm
  assert r.epsilon_lower <= exact + 1e-12
  if differing == 0:
    assert r.epsilon_lower == 0.0
  assert np.isfinite(r.epsilon_lower)
