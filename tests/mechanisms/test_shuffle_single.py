"""Single-message shuffle: eps0 from inverse amplification, exact check of the shuffled output."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import accounting
from jaxdistill import mechanisms as M
from jaxdistill import simulation
from tests.mechanisms._stats import assert_mean_and_variance


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


def test_shuffled_output_meets_the_claim_exactly_at_tiny_n():
  # n = 4 clients, d = 2 bits; every client holds entry 0, entry 1 or nothing.
  # Every neighbouring pair (one client's input replaced): the exact privacy profile
  # of the shuffled multiset at the claimed epsilon is <= delta. Without the shuffle
  # (messages in client order) the same epsilon fails: the amplification is real.
  n, eps, delta = 4, 0.5, 0.1
  mech = M.ShuffleSingleMessage(M.BsvsShape(2, 1, 1), eps, delta, n)
  claim = mech.privacy()
  assert claim.epsilon <= eps and mech.eps0 > 1.5 * eps
  inputs = [(1, 0), (0, 1), (0, 0)]
  worst = 0.0
  for others in itertools.combinations_with_replacement(inputs, n - 1):
    for x, y in itertools.permutations(inputs, 2):
      p = shuffled_pmf([rr_message_pmf(mech.eps0, t) for t in (x,) + others])
      q = shuffled_pmf([rr_message_pmf(mech.eps0, t) for t in (y,) + others])
      worst = max(worst, accounting.privacy_profile(p, q, claim.epsilon))
  assert worst <= delta
  ordered_p = rr_message_pmf(mech.eps0, (1, 0))
  ordered_q = rr_message_pmf(mech.eps0, (0, 1))
  assert accounting.privacy_profile(ordered_p, ordered_q, claim.epsilon) > delta


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
  # Spec I4: the condition eps0 <= ln(n / (16 ln(2/delta))) is on the *local* eps0.
  n, eps, delta = 10**4, 1.0, 1e-6
  closed = M.ShuffleSingleMessage(M.BsvsShape(4, 2, 1), eps, delta, n, method="closed-form")
  numeric = M.ShuffleSingleMessage(M.BsvsShape(4, 2, 1), eps, delta, n)
  assert closed.eps0 <= math.log(n / (16 * math.log(2 / delta))) + 1e-12
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
  var = mech.entry_variance(truth, 300)
  np.testing.assert_allclose(var, rr.entry_variance(truth, 300))
  alpha = 1e-3 / 12
  assert_mean_and_variance(runs, truth, var, alpha)


@pytest.mark.parametrize("kwargs,param", [
    ({"epsilon": 0.0}, "epsilon"), ({"epsilon": -0.5}, "epsilon"), ({"epsilon": math.nan}, "epsilon"),
    ({"epsilon": 800.0}, "epsilon=800.0 <= 60"), ({"epsilon": 61.0}, "epsilon=61.0 <= 60"),
    ({"delta": 0.0}, "delta"), ({"delta": 1.5}, "delta"), ({"delta": math.nan}, "delta"),
    ({"num_clients": 0}, "num_clients"), ({"num_clients": math.nan}, "num_clients"),
    ({"local": "laplace"}, "local"), ({"method": "exact"}, "method"),
])
def test_bad_input(kwargs, param):
  args = {"shape": M.BsvsShape(2, 2, 1), "epsilon": 1.0, "delta": 1e-6, "num_clients": 1000, **kwargs}
  with pytest.raises(ValueError, match=param):
    M.ShuffleSingleMessage(**args)


def test_collision_local_randomizer_when_available():
  pytest.importorskip("jaxdistill.mechanisms._collision")
  mech = M.ShuffleSingleMessage(M.BsvsShape(4, 2, 1), 1.0, 1e-6, 10**4, local="collision")
  assert mech.local_mechanism.epsilon == mech.eps0
  assert mech.privacy().parameters["local"] == "collision"
