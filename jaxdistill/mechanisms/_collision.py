"""Local DP: the Collision mechanism (Wang et al. 2021) on the flattened A^i.

A client with a set S of at most c non-zero positions in a domain [D] draws a
fully random hash h: [D] -> [l] from its own key (the hash seed is public and
part of the message), maps its set to C = h(S), and outputs one value z in
[l], with every value of C e^eps times as likely as any other. The server
regenerates h from the seed and counts a *hit* at every position j with
h(j) = z. The kernels here serve :class:`Collision` (domain d = s|Y|,
c = kr) and the product mechanisms (Separation, Concatenation).
"""

from __future__ import annotations

import dataclasses
import decimal
import fractions
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import PrivacyStatement, Relation
from jaxdistill.mechanisms import _bounds
from jaxdistill.mechanisms._base import BsvsMechanism, entry_counts, summed_stats
from jaxdistill.mechanisms._bsvs import BsvsShape, check_client, check_shape, client_entries
from jaxdistill.mechanisms._sampling import uniform_below, uniform_index, uniform_words

__all__ = ["Collision", "CollisionMessage", "collision_rates", "default_bloom_length", "check_collision_rates"]

_MAX_BLOOM = 2**31 - 1
#: Largest epsilon of a Collision message. Past it (only reachable with an explicit bloom length; the default
#: one caps epsilon near 21) e^eps / Omega is 1/c to within 1e-44 relative; at eps = 300, c = 1 it rounded to
#: exactly 1 (a present position always hit: infinite privacy loss) and the rate search never ended.
MAX_EPSILON = 100.0
#: Decimal digits used to round p down: the gap between e^eps / Omega and 1/c is at least
#: e^-100 / (c l) > 1e-62 relative at MAX_EPSILON, c, l <= 2^31.
_RATE_DIGITS = 80


class CollisionMessage(NamedTuple):
  """One Collision message.

  Attributes:
    seed: the public hash seed (a PRNG key; the server regenerates h from it).
    output: int32 ``[]`` the reported value z in [0, l).
  """

  seed: jax.Array
  output: jax.Array


def default_bloom_length(epsilon: float, cardinality: int) -> int:
  """l = floor(c e^eps + 2c - 1) (ldplearn's ``bestOutputsize``; spec §1.7).

  Raises:
    ValueError: when l would exceed 2^31 - 1 (epsilon too large).
  """
  eps = _validate.positive("epsilon", epsilon)
  c = _validate.integer("cardinality", cardinality, minimum=1)
  if eps > math.log(_MAX_BLOOM / c):
    raise ValueError(f"Expected epsilon={eps!r} <= {math.log(_MAX_BLOOM / c):.3f}: the default "
                     f"bloom length c e^eps + 2c - 1 must fit in int32.")
  return int(math.floor(c * math.exp(eps) + 2 * c - 1))


def check_bloom_length(bloom_length: Any, cardinality: int) -> int:
  """Validates l: an integer with c + 1 <= l <= 2^31 - 1 (and so l >= 2)."""
  lo = max(2, cardinality + 1)
  return _validate.integer("bloom_length", bloom_length, minimum=lo, maximum=_MAX_BLOOM)


@functools.lru_cache(maxsize=256)
def collision_rates(epsilon: float, cardinality: int, bloom_length: int) -> tuple[float, float, float]:
  """``(p, q, Omega)``: hit rates of a present / absent position, and Omega.

  .. math:: \\Omega = c e^{\\varepsilon} + l - c,\\quad p = e^{\\varepsilon}/\\Omega,
            \\quad q = 1/l.

  p is the largest float64 not above e^eps / Omega (decided with 80-digit
  arithmetic), and it is exactly the probability the sampler draws (see
  :func:`collision_randomize`): rounding down can only lower the real
  privacy loss, ln(p (l - c) / (1 - c p)) <= eps.
  """
  with decimal.localcontext(decimal.Context(prec=_RATE_DIGITS)):
    e = decimal.Decimal(epsilon).exp()
    exact = e / (cardinality * e + bloom_length - cardinality)
  p = math.exp(epsilon) / (cardinality * math.exp(epsilon) + bloom_length - cardinality)
  while decimal.Decimal(p) > exact:
    p = math.nextafter(p, 0.0)
  while decimal.Decimal(math.nextafter(p, 1.0)) <= exact:
    p = math.nextafter(p, 1.0)
  omega = cardinality * math.exp(epsilon) + bloom_length - cardinality
  return p, 1.0 / bloom_length, omega


def check_collision_rates(epsilon: float, cardinality: int, bloom_length: int, *, name: str = "epsilon",
                          value: Any = None) -> None:
  """Raises ValueError naming ``name`` unless p - q >= 2^-30 q (epsilon too small for float64).

  Also unless epsilon <= :data:`MAX_EPSILON` (too large: p would round to 1/c).

  .. math:: \\frac{p - q}{q} = \\frac{(l - c)(e^{\\varepsilon} - 1)}{\\Omega} \\ge 2^{-30},

  about eps >= 2^-29 (1.9e-9) at the default l = 3c - 1 and e^eps - 1 >= 2^-30
  as l grows. q = fl(1/l) and p (one ulp below e^eps/Omega) are within 2^-52
  of their exact values relative to q, so under this bound the debiasing
  denominator p - q is known to a relative 2^-21 (5e-7); without it p - q
  can round to 0 or below (p = q gives NaN estimates, p < q flips them).

  Args:
    epsilon: the message's epsilon.
    cardinality: c.
    bloom_length: l.
    name: the parameter named in the error.
    value: its value for the message (default ``epsilon``).
  """
  if epsilon > MAX_EPSILON:
    what = f"{name}={epsilon!r}" if value is None else f"{name}={value!r} (a Collision epsilon of {epsilon!r})"
    raise ValueError(f"Expected {what} <= {MAX_EPSILON:g}: beyond it the hit rate e^eps/Omega is 1/c to "
                     "float64 precision, so a present position would always hit (no privacy at all).")
  p, q, _ = collision_rates(epsilon, cardinality, bloom_length)
  if not p - q >= 2.0**-30 * q:
    value = epsilon if value is None else value
    raise ValueError(f"Expected {name}={value!r} large enough that the Collision hit rates p = e^eps/Omega and "
                     f"q = 1/l differ by at least 2^-30 q in float64 (about eps >= 2^-29); got p={p!r}, q={q!r} "
                     f"at eps={epsilon!r}, l={bloom_length}.")


@functools.lru_cache(maxsize=256)
def _coin_thresholds(p: float, cardinality: int) -> np.ndarray:
  """uint32 ``[c + 1, W]``: the W-word integers m p 2^(32 W), m = 0..c (most significant word first).

  A float64 p is a dyadic rational, so with W words enough for its
  denominator these are integers and Pr[u < m p 2^(32 W)] = m p exactly
  for u uniform on W words.
  """
  frac = fractions.Fraction(p)
  width = max(1, -(-(frac.denominator.bit_length() - 1) // 32))
  out = np.zeros((cardinality + 1, width), np.uint32)
  for m in range(cardinality + 1):
    value = m * frac * 2 ** (32 * width)
    if value.denominator != 1 or not 0 <= value < 2 ** (32 * width):
      raise ValueError(f"Expected m p < 1 for m <= c={cardinality}; got p={p!r}.")
    v = int(value)
    for w in range(width):
      out[m, width - 1 - w] = (v >> (32 * w)) & 0xFFFFFFFF
  out.setflags(write=False)  # cached and shared
  return out


def _words_below(u: jax.Array, t: jax.Array) -> jax.Array:
  """u < t for multi-word integers ``[W]`` (most significant word first)."""
  less = jnp.bool_(False)
  equal = jnp.bool_(True)
  for w in range(u.shape[-1]):
    less = less | (equal & (u[w] < t[w]))
    equal = equal & (u[w] == t[w])
  return less


def hash_table(seed: jax.Array, domain: int, bloom_length: int) -> jax.Array:
  """int32 ``[domain]``: the fully random hash h(j), j in [domain], from ``seed``.

  Entries are i.i.d. exactly uniform on [0, l)
  (:func:`~jaxdistill.mechanisms._sampling.uniform_below`: digits of
  rejection-sampled words, a few threefry hashes for the whole table), so an
  absent position is hit with probability exactly q = 1/l.
  """
  return uniform_below(seed, bloom_length, domain)


def sample_collision_output(key: jax.Array, entries: jax.Array, *, domain: int, bloom_length: int,
                            p: float, cardinality: int) -> tuple[CollisionMessage, jax.Array]:
  """Samples z for a given hit probability p: ``(message, hash table int32 [domain])``.

  Exact sampler of Pr[z = v] = p for v in C = h(S) and (1 - |C| p)/(l - |C|)
  otherwise: with probability |C| p (a multi-word integer comparison, exact
  because a float64 p is dyadic) pick a uniform member of C, else a uniform
  member of [l] minus C (a uniform index in [0, l - |C|) mapped past the
  sorted members of C); both uniform draws are exact (rejection sampling).
  Cost: the hash table plus O(c log c). :func:`collision_sample` calls it
  with the mechanism's p; any other p (c p < 1) is sampled just as exactly,
  which is how the auditor's planted-bug tests build a Collision with a
  wrong p.
  """
  l = bloom_length
  k_hash, k_coin, k_in, k_out = jax.random.split(key, 4)
  table = hash_table(k_hash, domain, l)
  vals = jnp.where(entries >= 0, table[jnp.maximum(entries, 0)], l)
  srt = jnp.sort(vals)
  prev = jnp.concatenate([jnp.full((1,), -1, srt.dtype), srt[:-1]])
  distinct = (srt < l) & (srt != prev)
  size = distinct.sum()  # |C|
  members = jnp.sort(jnp.where(distinct, srt, l))  # C ascending, then sentinels l
  thresholds = jnp.asarray(_coin_thresholds(float(p), cardinality))
  inside = _words_below(uniform_words(k_coin, thresholds.shape[1]), thresholds[size])
  z_in = members[uniform_index(k_in, jnp.maximum(size, 1))]
  z_out = uniform_index(k_out, l - size)
  for j in range(members.shape[0]):  # static c: skip past each member of C in order
    z_out = z_out + (z_out >= members[j]).astype(z_out.dtype)
  z = jnp.where(inside, z_in, z_out).astype(jnp.int32)
  return CollisionMessage(k_hash, z), table


def collision_sample(key: jax.Array, entries: jax.Array, *, domain: int, bloom_length: int,
                     epsilon: float, cardinality: int) -> tuple[CollisionMessage, jax.Array]:
  """One Collision message for the set ``entries`` and its hash table: ``(message, int32 [domain])``.

  :func:`sample_collision_output` with p of :func:`collision_rates` (the
  float64 just below e^eps/Omega), the p the estimator and the privacy
  statement use.
  """
  p, _, _ = collision_rates(epsilon, cardinality, bloom_length)
  return sample_collision_output(key, entries, domain=domain, bloom_length=bloom_length, p=p,
                                 cardinality=cardinality)


def collision_randomize(key: jax.Array, entries: jax.Array, *, domain: int, bloom_length: int,
                        epsilon: float, cardinality: int) -> CollisionMessage:
  """One Collision message (hash seed, z) for the set ``entries`` (int32 ``[<= c]``, -1 pads).

  See :func:`collision_sample` for the sampler.
  """
  return collision_sample(key, entries, domain=domain, bloom_length=bloom_length, epsilon=epsilon,
                          cardinality=cardinality)[0]


def collision_hits(message: CollisionMessage, *, domain: int, bloom_length: int) -> jax.Array:
  """int32 ``[domain]``: hit_j = 1[h(j) = z], the hash regenerated from the seed."""
  return (hash_table(message.seed, domain, bloom_length) == message.output).astype(jnp.int32)


class CollisionRates:
  """``p``, ``q`` and ``Omega`` of a Collision message, for classes with
  ``epsilon``, ``cardinality`` and ``bloom_length`` (see :func:`collision_rates`)."""

  @property
  def omega(self) -> float:
    """Omega = c e^eps + l - c."""
    return collision_rates(self.epsilon, self.cardinality, self.bloom_length)[2]

  @property
  def p(self) -> float:
    """Pr[hit_j | j in S] = e^eps / Omega (the float64 just below it)."""
    return collision_rates(self.epsilon, self.cardinality, self.bloom_length)[0]

  @property
  def q(self) -> float:
    """Pr[hit_j | j not in S] = 1 / l."""
    return 1.0 / self.bloom_length


@dataclasses.dataclass(frozen=True)
class Collision(CollisionRates, BsvsMechanism):
  """The (d, c, eps, l)-Collision mechanism on the flattened A^i (d = s|Y|, c = kr).

  .. math::

     \\Pr[z = v] = \\begin{cases} e^{\\varepsilon}/\\Omega & v \\in C = h(S) \\\\
       \\dfrac{\\Omega - |C| e^{\\varepsilon}}{(l - |C|)\\,\\Omega} & \\text{otherwise,}
     \\end{cases}\\qquad \\Omega = c e^{\\varepsilon} + l - c,

     \\hat a_j = \\frac{\\sum_i \\mathrm{hit}_{ij} - n q}{p - q},\\quad
     \\mathrm{Var}[\\hat a_j] = \\frac{a_j p(1-p) + (n - a_j) q(1-q)}{(p-q)^2},

  with p = e^eps/Omega (hit rate of a present position, whatever |C|) and
  q = 1/l (an absent position's hash is independent of z). Both are the
  sampler's exact rates: p is the float64 just below e^eps/Omega, drawn by an
  exact integer comparison, and hash values and the uniform picks are
  rejection-sampled, so exactly uniform.

  Formal guarantees:
    eps-LDP (pure, delta = 0) for any two inputs (replace-one, local model):
    for every hash table every output probability lies in
    [1/Omega, e^eps/Omega]; the ratio e^eps is attained (tight).

  References:
    Wang et al., "Hiding Numerical Vectors in Local Private and Shuffled
    Messages", IJCAI 2021, and arXiv:2304.04410
    (https://arxiv.org/abs/2304.04410); the reverse-k-NN paper
    (arXiv:2207.13253), Definition 5 and Theorem 2 (spec §1.7, §2).

  Attributes:
    shape: BSVS sizes.
    epsilon: local epsilon of one message.
    bloom_length: l (default floor(kr e^eps + 2kr - 1)); needs kr + 1 <= l. With the default, epsilon
      must keep l in int32 (about 21); with an explicit l, epsilon <= ``MAX_EPSILON`` = 100.

  >>> Collision(BsvsShape(10, 10, 1), 1.0).bloom_length
  3
  """

  shape: BsvsShape
  epsilon: float
  bloom_length: int | None = None
  name: str = dataclasses.field(default="collision", init=False)

  def __post_init__(self):
    check_shape(self.shape)
    eps = _validate.positive("epsilon", self.epsilon)
    object.__setattr__(self, "epsilon", eps)
    c = self.shape.c
    l = default_bloom_length(eps, c) if self.bloom_length is None else self.bloom_length
    object.__setattr__(self, "bloom_length", check_bloom_length(l, c))
    check_collision_rates(eps, c, self.bloom_length)

  @property
  def cardinality(self) -> int:
    """c = kr, the largest number of non-zero entries per client."""
    return self.shape.c

  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> CollisionMessage:
    """The message (hash seed, z) of one client."""
    key = _validate.prng_key("key", key)
    buckets, labels = check_client(self.shape, buckets, labels)
    ent = client_entries(buckets, labels, self.shape.num_labels)
    return collision_randomize(key, ent, domain=self.shape.d, bloom_length=self.bloom_length,
                               epsilon=self.epsilon, cardinality=self.cardinality)

  def analyze(self, message: CollisionMessage) -> jax.Array:
    """int32 ``[d]`` hits: 1 where the regenerated hash maps to z."""
    return collision_hits(message, domain=self.shape.d, bloom_length=self.bloom_length)

  def chunk_statistics(self, keys: jax.Array, buckets: jax.Array, labels: jax.Array,
                       valid: jax.Array) -> jax.Array:
    """int32 ``[d]`` summed hits of a chunk; each hash table is built once, not twice.

    The same integers as the default path: the client's table is the one its
    message's seed regenerates on the server.
    """
    def one(key, b, lab):
      ent = client_entries(b, lab, self.shape.num_labels)
      msg, table = collision_sample(key, ent, domain=self.shape.d, bloom_length=self.bloom_length,
                                    epsilon=self.epsilon, cardinality=self.cardinality)
      return table == msg.output

    hits = jax.vmap(one)(keys, buckets, labels) & valid[:, None]
    return hits.sum(axis=0, dtype=jnp.int32)

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    del key  # no server-side randomness
    n = _validate.integer("num_clients", num_clients, minimum=1)
    hits = summed_stats("stats", stats, (self.shape.num_buckets, self.shape.num_labels), n)
    return (hits - n * self.q) / (self.p - self.q)

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    a, n = entry_counts(self.shape, counts, num_clients)
    p, q = self.p, self.q
    return (a * p * (1 - p) + (n - a) * q * (1 - q)) / (p - q) ** 2

  #: How :meth:`max_error_bound` is obtained (the ``simulate`` CLI prints it).
  max_error_method = "bernstein-union"

  def max_error_bound(self, beta: Any, counts: Any = None, num_clients: Any = None) -> float | None:
    """Bound on max |error| over all d = s|Y| entries that holds w.p. >= 1 - beta.

    Entry j's error is a sum of n independent centred terms (hit_ij - E hit_ij) / (p - q), one
    per client (each client's hash seed is its own), each at most M = max(p, 1 - q) / (p - q) in
    absolute value, with total variance V_j = (a_j p(1-p) + (n - a_j) q(1-q)) / (p - q)^2.
    Bernstein's inequality at failure beta / d per entry and a union bound give

    .. math::

       \\alpha_j = \\frac{LM}{3} + \\sqrt{\\Big(\\frac{LM}{3}\\Big)^2 + 2 L V_j},\\qquad
       L = \\ln\\frac{2d}{\\beta},

    and the bound is max_j alpha_j: a guarantee for the given counts (Theorem 2 with explicit
    constants, :func:`jaxdistill.mechanisms.collision_alpha`), where ``simulate`` used a normal
    approximation before. Without ``counts``, V_j takes its largest value over all counts
    (a_j = n if p(1-p) >= q(1-q), else 0), which is ``collision_alpha`` with m = d. Returns
    ``None`` (no bound) when ``num_clients`` is not given.
    """
    beta = _validate.open_unit("beta", beta)
    if num_clients is None:
      return None
    p, q = self.p, self.q
    if counts is None:
      n = _validate.integer("num_clients", num_clients, minimum=1)
      hit_var = np.float64(n * max(p * (1 - p), q * (1 - q)))
    else:
      a, n = entry_counts(self.shape, counts, num_clients)
      hit_var = np.max(a * (p * (1 - p)) + (n - a) * (q * (1 - q)))  # alpha_j grows with V_j
    return float(_bounds.bernstein_hits_alpha(math.log(2 * self.shape.d) - math.log(beta), p, q, float(hit_var)))

  def accuracy(self, beta: Any, num_clients: int, *, simultaneous: bool = False) -> float:
    """Theorem 2 (Bernstein + union bound): alpha with failure <= beta.

    ``simultaneous`` (a bool): over all s |Y| entries at once, else over one bucket's |Y| entries.
    """
    simultaneous = _validate.boolean("simultaneous", simultaneous)  # bool("no") is True
    entries = self.shape.num_labels * (self.shape.num_buckets if simultaneous else 1)
    return _bounds.collision_alpha(beta, p=self.p, q=self.q, num_clients=num_clients,
                                   num_entries=entries)

  def labeling_error(self, gap: Any, num_clients: int) -> Any:
    """Theorem 1 with Theorem 2: bound on Pr[label of bucket t wrong]."""
    return _bounds.collision_labeling_error(gap, p=self.p, q=self.q, num_clients=num_clients,
                                            num_labels=self.shape.num_labels)

  def privacy(self) -> PrivacyStatement:
    return PrivacyStatement(
        mechanism="local-collision", relation=Relation.REPLACE_ONE, epsilon=self.epsilon,
        delta=0.0, count=1, method="closed-form",
        parameters={"bloom_length": self.bloom_length, "p": self.p, "q": self.q,
                    "omega": self.omega, "cardinality": self.cardinality, "d": self.shape.d,
                    "k": self.shape.k, "r": self.shape.r, "model": "local"})
