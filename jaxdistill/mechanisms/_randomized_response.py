"""Local DP: randomized response on every bit of A^i, with budget splitting."""

from __future__ import annotations

import dataclasses
import decimal
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from jaxdistill import _validate
from jaxdistill.accounting import MechanismAccount, PrivacyStatement, Relation
from jaxdistill.accounting import randomized_response as rr_account
from jaxdistill.mechanisms._base import BsvsMechanism, count_free_clients, summed_stats
from jaxdistill.mechanisms._bsvs import BsvsShape, check_client, check_shape, client_entries, entry_indicator
from jaxdistill.mechanisms._sampling import bernoulli_dyadic

__all__ = ["RandomizedResponse"]

_DECIMAL = decimal.Context(prec=60)


@dataclasses.dataclass(frozen=True)
class RandomizedResponse(BsvsMechanism):
  """Bitwise randomized response on the flattened A^i (d = s|Y| bits).

  Each bit is kept with probability p and flipped with probability q = 1 - p,
  where q is 1 / (e^{eps'} + 1), eps' = eps / (2kr), rounded *up* to a
  multiple of 2^-16 (of 2^-32 when 2^-16 would cost more than 0.1% of
  eps'): the sampler compares integers, so q is exactly the probability
  sampled, and rounding towards 1/2 only lowers the real per-bit epsilon
  ln(p/q) <= eps' (by at most 0.1% for 1e-6 <= eps' <= 18; from there to
  eps' = ln(2^32 - 1) ~ 22.18, where q * 2^32 is a small integer, by at
  most ln(1 + 2^-32 / q) - ln(1 - 2^-32 / p), up to about ln 2, 3% of eps').
  Two inputs differ in at most 2kr bits, so a message is eps-LDP. The
  server debiases the bit sums with the same p and q:

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
    check_shape(self.shape)
    object.__setattr__(self, "epsilon", _validate.positive("epsilon", self.epsilon))
    if not self.keep_probability > 0.5:
      raise ValueError(f"Expected epsilon={self.epsilon!r} large enough that eps' = eps/(2kr) "
                       f"exceeds 2^-30; got eps' = {self.bit_epsilon!r}.")

  @property
  def bit_epsilon(self) -> float:
    """eps' = eps / (2kr) (float64, correctly rounded from :meth:`_exact_bit_epsilon`)."""
    return float(self._exact_bit_epsilon())

  def _exact_bit_epsilon(self) -> decimal.Decimal:
    """eps / (2kr) to 60 digits: the flip threshold is computed from it."""
    with decimal.localcontext(_DECIMAL):
      return decimal.Decimal(self.epsilon) / (2 * self.shape.c)

  @property
  def sampler_bits(self) -> int:
    """16 (four flips per threefry hash) unless rounding q to 2^-16 could cost > 0.1% of eps' (then 32)."""
    q = self._flip_probability
    return 16 if 2.0**-16 <= 1e-3 * self.bit_epsilon * q * (1.0 - q) else 32

  @property
  def _flip_probability(self) -> float:
    """q = 1 / (1 + e^eps'), written so that no eps' overflows (it underflows to 0 beyond eps' ~ 745)."""
    tail = math.exp(-self.bit_epsilon)
    return tail / (1.0 + tail)

  @property
  def flip_threshold(self) -> int:
    """ceil(q * 2^b) >= 1, q = 1 / (1 + e^{eps / (2kr)}) exactly: a bit flips iff a uniform b-bit integer is below it.

    The ceiling is taken in 60-digit decimal arithmetic, not from the float q: where q * 2^b lies just
    above an integer, the float q can land on that integer and the threshold came out one step low, a
    flip probability below the exact q and a per-bit loss above eps' (by about 1e-16 relative).
    Beyond eps' = ln(2^32 - 1) ~ 22.18 the threshold is 1 (q sampled as 2^-32), so the sampler's
    per-bit loss stays at ln(2^32 - 1) < eps' (:attr:`effective_bit_epsilon`): the statement at eps
    is conservative, never violated, and no q underflows to 0 to disable the noise.
    """
    bits = self.sampler_bits
    if self.bit_epsilon > 23.0:  # q * 2^32 < 1 (e^23 > 2^33): the smallest threshold
      return 1
    with decimal.localcontext(_DECIMAL):
      q = 1 / (1 + self._exact_bit_epsilon().exp())
      t = int((q * 2**bits).to_integral_value(rounding=decimal.ROUND_CEILING))
    return min(max(1, t), 2**bits)

  @property
  def keep_probability(self) -> float:
    """p = 1 - q, with q the dyadic flip probability actually sampled."""
    return 1.0 - self.flip_threshold / 2.0**self.sampler_bits

  @property
  def effective_bit_epsilon(self) -> float:
    """ln(p / q) of the sampler, <= eps' (exact per-bit privacy loss)."""
    p = self.keep_probability
    return math.log(p / (1.0 - p))

  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> jax.Array:
    """bool ``[d]``: the client's bits of A^i, each flipped w.p. q (exactly)."""
    key = _validate.prng_key("key", key)
    buckets, labels = check_client(self.shape, buckets, labels)
    d = self.shape.d
    truth = entry_indicator(client_entries(buckets, labels, self.shape.num_labels), d, jnp.bool_)
    flip = bernoulli_dyadic(key, self.flip_threshold, self.sampler_bits, d)
    return jnp.logical_xor(truth, flip)

  def analyze(self, message: jax.Array) -> jax.Array:
    return message.astype(jnp.int32)

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    del key  # no server-side randomness
    n = _validate.integer("num_clients", num_clients, minimum=1)
    p = self.keep_probability
    q = 1.0 - p
    total = summed_stats("stats", stats, (self.shape.num_buckets, self.shape.num_labels), n)
    return (total - n * q) / (p - q)

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    n = count_free_clients(self.shape, counts, num_clients)  # every bit has variance pq whatever A is
    p = self.keep_probability
    q = 1.0 - p
    v = n * p * q / (p - q) ** 2
    return np.full((self.shape.num_buckets, self.shape.num_labels), v, dtype=np.float64)

  #: How :meth:`max_error_bound` is obtained (the ``simulate`` CLI prints it).
  max_error_method = "chernoff-union"

  def max_error_bound(self, beta: Any, counts: Any = None, num_clients: Any = None) -> float | None:
    """Bound on max |error| over all d = s|Y| entries that holds w.p. >= 1 - beta, for any counts A.

    With F1 ~ Bin(A_j, q) flips of entry j's 1-bits and F2 ~ Bin(n - A_j, q) of its 0-bits
    (independent; q the sampled flip probability), the bit sum is A_j - F1 + F2, so

    .. math::

       (p - q)(\\hat a_j - A_j) = S_j = (F_2 - (n - A_j) q) - (F_1 - A_j q),

    a sum of n independent centred Bernoulli(q) terms, n - A_j with sign + and A_j with sign -.
    A centred Bernoulli(q) term X has E e^{lX} >= E e^{-lX} for l >= 0 when q <= 1/2
    (sinh(x)/x increases), so for every A_j each tail's Chernoff bound is at most that of
    Bin(n, q) - nq (A_j = 0 for the upper tail, A_j = n for the lower):

    .. math::

       \\Pr[|S_j| \\ge t] \\le 2 \\exp(-n\\,\\mathrm{KL}(q + t/n \\,\\|\\, q)).

    The bound is t / (p - q) with the least t (bisection, rounded up) that makes d times this
    <= beta (a union bound over the d entries), and never more than n(1 - q) / (p - q), which
    |error| cannot exceed. Unlike a normal approximation it holds at high epsilon, where each
    error is a sparse, skewed count (nq of order 1). ``counts`` is only checked. Returns
    ``None`` (no bound) when ``num_clients`` is not given.
    """
    beta = _validate.open_unit("beta", beta)
    if num_clients is None:
      return None
    n = count_free_clients(self.shape, counts, num_clients)
    p = self.keep_probability
    q = 1.0 - p
    d = self.shape.d
    log_target = math.log(beta) - math.log(2 * d)  # beta / (2d) underflowed to 0 at beta = 5e-324 (math domain error)

    def fails(a: float) -> bool:  # the union bound at t = n (a - q) still exceeds beta
      kl = float(special.rel_entr(a, q) + special.rel_entr(1.0 - a, 1.0 - q))
      return -n * kl > log_target

    lo, hi = q, 1.0
    if fails(hi):
      return n * (1.0 - q) / (p - q)
    for _ in range(200):  # invariant: fails(lo), not fails(hi)
      mid = 0.5 * (lo + hi)
      if mid in (lo, hi):
        break
      lo, hi = (mid, hi) if fails(mid) else (lo, mid)
    return min(n * (hi - q), n * (1.0 - q)) / (p - q)

  def account(self) -> MechanismAccount:
    """The worst pair: 2kr binary randomized responses at the sampler's exact per-bit epsilon."""
    return rr_account(self.effective_bit_epsilon, num_buckets=2, count=2 * self.shape.c)

  def privacy(self) -> PrivacyStatement:
    return PrivacyStatement(
        mechanism="local-randomized-response", relation=Relation.REPLACE_ONE,
        epsilon=self.epsilon, delta=0.0, count=1, method="closed-form",
        parameters={"bit_epsilon": self.bit_epsilon, "keep_probability": self.keep_probability,
                    "effective_epsilon": 2 * self.shape.c * self.effective_bit_epsilon,
                    "sampler_bits": self.sampler_bits,
                    "d": self.shape.d, "k": self.shape.k, "r": self.shape.r, "model": "local"})
