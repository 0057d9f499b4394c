"""Local DP: randomized response on every bit of A^i, with budget splitting."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import MechanismAccount, PrivacyStatement, Relation
from jaxdistill.accounting import randomized_response as rr_account
from jaxdistill.mechanisms._base import BsvsMechanism
from jaxdistill.mechanisms._bsvs import BsvsShape, client_entries

__all__ = ["RandomizedResponse"]


@dataclasses.dataclass(frozen=True)
class RandomizedResponse(BsvsMechanism):
  """Bitwise randomized response on the flattened A^i (d = s|Y| bits).

  Each bit is kept with probability p = e^{eps'}/(e^{eps'} + 1) and flipped
  with probability q = 1 - p, where eps' = eps / (2kr). Two inputs differ in
  at most 2kr bits, so a message is eps-LDP. The server debiases the bit sums:

  .. math::

     \\hat a_j = \\frac{\\sum_i \\tilde b_{ij} - n q}{p - q},\\qquad
     \\mathrm{Var}[\\hat a_j] = \\frac{n\\,p q}{(p - q)^2}.

  Formal guarantees:
    eps-LDP (pure) for any two inputs (replace-one, local model). The exact
    worst case is 2kr binary randomized responses at eps' each, which
    :meth:`account` hands to dp-accounting.

  References:
    Warner (1965); the reverse-k-NN paper's budget splitting (arXiv:2207.13253,
    §"Local DP", error Θ̃(kr/eps) per client).

  Attributes:
    shape: BSVS sizes.
    epsilon: local epsilon of one message.
  """

  shape: BsvsShape
  epsilon: float
  name: str = dataclasses.field(default="rr", init=False)

  def __post_init__(self):
    object.__setattr__(self, "epsilon", _validate.positive("epsilon", self.epsilon))

  @property
  def bit_epsilon(self) -> float:
    """eps' = eps / (2kr)."""
    return self.epsilon / (2 * self.shape.c)

  @property
  def keep_probability(self) -> float:
    """p = e^{eps'} / (e^{eps'} + 1)."""
    return 1.0 / (1.0 + math.exp(-self.bit_epsilon))

  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> jax.Array:
    """bool ``[d]``: the client's bits of A^i, each flipped w.p. q."""
    d = self.shape.d
    ent = client_entries(buckets, labels, self.shape.num_labels)
    truth = jnp.zeros(d + 1, jnp.bool_).at[jnp.where(ent >= 0, ent, d)].set(True)[:d]
    flip = jax.random.bernoulli(key, 1.0 - self.keep_probability, (d,))
    return jnp.logical_xor(truth, flip)

  def analyze(self, message: jax.Array) -> jax.Array:
    return message.astype(jnp.int32)

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    del key  # no server-side randomness
    p = self.keep_probability
    q = 1.0 - p
    total = np.asarray(stats, dtype=np.float64).reshape(self.shape.num_buckets, self.shape.num_labels)
    return (total - num_clients * q) / (p - q)

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    del counts  # every bit has variance pq whatever its true value
    p = self.keep_probability
    q = 1.0 - p
    v = num_clients * p * q / (p - q) ** 2
    return np.full((self.shape.num_buckets, self.shape.num_labels), v, dtype=np.float64)

  def account(self) -> MechanismAccount:
    """The worst pair: 2kr binary randomized responses at eps' each."""
    return rr_account(self.bit_epsilon, num_buckets=2, count=2 * self.shape.c)

  def privacy(self) -> PrivacyStatement:
    return PrivacyStatement(
        mechanism="local-randomized-response", relation=Relation.REPLACE_ONE,
        epsilon=self.epsilon, delta=0.0, count=1, method="closed-form",
        parameters={"bit_epsilon": self.bit_epsilon, "keep_probability": self.keep_probability,
                    "d": self.shape.d, "k": self.shape.k, "r": self.shape.r, "model": "local"})
