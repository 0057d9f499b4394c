"""Local DP for the low-privacy regime: Separation and Concatenation.

Both estimate A = sum_i T_i y_i^T from Collision messages about the two
factors instead of the s|Y| products (spec/REVERSE_KNN.md §1.8):

* **Separation**: Collision(eps/2, c = k) on T_i over the s buckets and an
  independent Collision(eps/2, c = r) on y_i over the |Y| labels; the outer
  product of the two debiased vectors is unbiased (independent factors).
* **Concatenation**: one Collision(eps, c = k + r) on [T_i; y_i] (length
  s + |Y|). The paper's estimator, the outer product of the two debiased
  halves, is *biased*: both halves come from one output z, and
  E[t_a y_b] = -q/(p - q) for a true entry (spec §5 I5; verified here by
  exact enumeration, tests/mechanisms/test_product.py). The library ships it
  only as :class:`ConcatenationLiteral`; :class:`Concatenation` uses the
  unique unbiased estimator that is a function of (hit_a, hit_b).

Statistics are integers: the co-occurrence counts sum_i hit_ia hit_ib
(int32 ``[s, |Y|]``) and the marginal hit counts, so simulations are bitwise
reproducible; the float64 estimate is formed on the host.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import PrivacyStatement, PrivacyWarning, Relation
from jaxdistill.mechanisms import _bounds
from jaxdistill.mechanisms._base import BsvsMechanism, entry_counts, summed_stats
from jaxdistill.mechanisms._bsvs import BsvsShape, check_client, check_shape
from jaxdistill.mechanisms._collision import (_MAX_BLOOM, CollisionMessage, CollisionRates, check_bloom_length,
                                              check_collision_rates, collision_hits, collision_randomize,
                                              collision_rates, default_bloom_length)

__all__ = ["ProductStats", "SeparationMessage", "Separation", "Concatenation",
           "ConcatenationLiteral"]


class ProductStats(NamedTuple):
  """Integer statistics of a product mechanism (per client, or summed).

  Attributes:
    cooccurrence: int32 ``[s, |Y|]``, hit_a * hit_b for bucket a, label b.
    bucket_hits: int32 ``[s]``.
    label_hits: int32 ``[|Y|]``.
  """

  cooccurrence: jax.Array
  bucket_hits: jax.Array
  label_hits: jax.Array


class SeparationMessage(NamedTuple):
  """Two independent Collision messages: about T_i and about y_i."""

  buckets: CollisionMessage
  labels: CollisionMessage


def _product_stats(bucket_hits: jax.Array, label_hits: jax.Array) -> ProductStats:
  co = bucket_hits[:, None] * label_hits[None, :]
  return ProductStats(co.astype(jnp.int32), bucket_hits.astype(jnp.int32),
                      label_hits.astype(jnp.int32))


def _centered_products(stats: Any, shape: BsvsShape, num_clients: int, q1: float, q2: float) -> np.ndarray:
  """sum_i (hit_ia - q1)(hit_ib - q2), float64 ``[s, |Y|]``, from summed statistics (checked: in [0, n])."""
  num_clients = _validate.integer("num_clients", num_clients, minimum=1)
  if not all(hasattr(stats, f) for f in ("cooccurrence", "bucket_hits", "label_hits")):
    raise ValueError(f"Expected stats to be ProductStats (cooccurrence, bucket_hits, label_hits); got "
                     f"{type(stats).__name__}.")
  s, y = shape.num_buckets, shape.num_labels
  co = summed_stats("stats.cooccurrence", stats.cooccurrence, (s, y), num_clients)
  hb = summed_stats("stats.bucket_hits", stats.bucket_hits, (s,), num_clients)
  hl = summed_stats("stats.label_hits", stats.label_hits, (y,), num_clients)
  return co - q2 * hb[:, None] - q1 * hl[None, :] + num_clients * q1 * q2


def _membership_counts(counts: Any, shape: BsvsShape, num_clients: int):
  """Clients by (bucket a held, label b held): n11, n10, n01, n00, each ``[s, |Y|]``.

  Assumes every client holds exactly k buckets and r labels (as reverse k-NN
  with one-hot labels does), so #clients holding bucket a = row sum / r and
  #clients holding label b = column sum / k. Counts that no such clients can
  give (a negative membership, or integer counts whose row sums are not
  multiples of r or column sums of k: e.g. padded clients, which the
  estimators take) are refused, since the variance would be wrong (it was
  understated by up to 24% for clients holding one bucket of k = 2).
  """
  a, num_clients = entry_counts(shape, counts, num_clients)
  rows, cols = a.sum(axis=1, keepdims=True), a.sum(axis=0, keepdims=True)
  with_bucket, with_label = rows / shape.r, cols / shape.k
  n11 = a
  n10 = with_bucket - a
  n01 = with_label - a
  n00 = num_clients - n11 - n10 - n01
  integral = bool(np.all(a == np.round(a)))
  if (min(float(n10.min()), float(n01.min()), float(n00.min())) < -1e-9
      or (integral and (np.any(rows % shape.r) or np.any(cols % shape.k)))):
    raise ValueError(f"Expected counts of {num_clients} clients that each hold exactly k={shape.k} buckets and "
                     f"r={shape.r} labels (this variance's closed form assumes it); these counts cannot come from "
                     "such clients (padded clients?), so the variance would be wrong.")
  return n11, n10, n01, n00


def _bernstein_max_error(mech: BsvsMechanism, beta: Any, counts: Any, num_clients: Any,
                         term_values: np.ndarray, means: tuple[float, ...]) -> float | None:
  """Bernstein + union bound on max |error| over the d = s|Y| entries of a product estimator, w.p. >= 1 - beta.

  Entry j's estimate is a sum of n independent per-client terms g_i (each client randomizes alone), taking
  values in ``term_values`` with mean E g_i in ``means``. Each centred term is at most
  M = max |g - e| over those, and the sum's variance V_j is the closed-form ``entry_variance`` (which
  assumes every client holds exactly k buckets and r labels, as the ``simulate`` workload does), so
  |error_j| <= |bias_j| + ML/3 + sqrt((ML/3)^2 + 2 L V_j) with L = ln(2d / beta) for every j at once.
  ``None`` without ``counts`` and ``num_clients`` (the variance needs them).
  """
  beta = _validate.open_unit("beta", beta)
  if counts is None or num_clients is None:
    return None
  term_bound = float(np.max(np.abs(np.subtract.outer(np.asarray(term_values, np.float64), np.asarray(means)))))
  variance = np.maximum(np.asarray(mech.entry_variance(counts, num_clients), np.float64), 0.0)
  bias = np.abs(np.asarray(mech.entry_bias(counts, num_clients), np.float64))
  log_term = math.log(2 * mech.shape.d) - math.log(beta)
  return float(np.max(bias + _bounds.bernstein_sum_alpha(log_term, term_bound, variance)))


@dataclasses.dataclass(frozen=True)
class Separation(BsvsMechanism):
  """Separation: independent Collision(eps/2) messages on T_i and on y_i.

  .. math::

     \\hat A = \\sum_i \\check t_i \\check y_i^{\\top},\\quad
     \\check t_{ia} = \\frac{\\mathrm{hit}_{ia} - q_1}{p_1 - q_1},\\
     \\check y_{ib} = \\frac{\\mathrm{hit}_{ib} - q_2}{p_2 - q_2},

  with Collision(eps/2, c = k, l1) over s buckets and Collision(eps/2, c = r,
  l2) over |Y| labels (default bloom lengths). The factors are independent,
  so E[t y] = T y (unbiased) and per client
  Var[t_a y_b] = (v_a + T_a^2)(w_b + y_b^2) - T_a^2 y_b^2, where v, w are the
  factors' variances (spec §5 I5: "Var[ab] = Var[a]Var[b]" only holds when
  both true values are 0).

  Formal guarantees:
    eps-LDP (pure, delta = 0; replace-one, local model): basic composition
    of two eps/2-LDP messages.

  References:
    The reverse-k-NN paper (arXiv:2207.13253, https://arxiv.org/abs/2207.13253),
    §"low privacy regime" (Separation), spec §1.8.

  Attributes:
    shape: BSVS sizes.
    epsilon: total local epsilon (eps/2 per factor).
  """

  shape: BsvsShape
  epsilon: float
  name: str = dataclasses.field(default="separation", init=False)

  def __post_init__(self):
    check_shape(self.shape)
    eps = _validate.positive("epsilon", self.epsilon)
    object.__setattr__(self, "epsilon", eps)
    if not eps / 2 > 0:  # 5e-324 / 2 rounds to 0, which default_bloom_length named as "epsilon=0.0"
      raise ValueError(f"Expected epsilon={eps!r} large enough that each factor's epsilon / 2 is a positive float64 "
                       "(and its Collision hit rates differ: about epsilon >= 2^-28).")
    c_max = max(self.shape.k, self.shape.r)
    if eps / 2 > math.log(_MAX_BLOOM / c_max):  # named here: default_bloom_length would name eps / 2
      raise ValueError(f"Expected epsilon={eps!r} <= {2 * math.log(_MAX_BLOOM / c_max):.3f}: each factor spends "
                       f"epsilon / 2, and its default bloom length c e^(epsilon/2) + 2c - 1 (c = {c_max}) must fit "
                       f"in int32.")
    for c in (self.shape.k, self.shape.r):
      l = check_bloom_length(default_bloom_length(eps / 2, c), c)
      check_collision_rates(eps / 2, c, l, value=eps)

  @property
  def bucket_bloom_length(self) -> int:
    """l1 = floor(k e^{eps/2} + 2k - 1)."""
    return default_bloom_length(self.epsilon / 2, self.shape.k)

  @property
  def label_bloom_length(self) -> int:
    """l2 = floor(r e^{eps/2} + 2r - 1)."""
    return default_bloom_length(self.epsilon / 2, self.shape.r)

  @property
  def bucket_rates(self) -> tuple[float, float]:
    """(p1, q1) of the bucket factor."""
    p, q, _ = collision_rates(self.epsilon / 2, self.shape.k, self.bucket_bloom_length)
    return p, q

  @property
  def label_rates(self) -> tuple[float, float]:
    """(p2, q2) of the label factor."""
    p, q, _ = collision_rates(self.epsilon / 2, self.shape.r, self.label_bloom_length)
    return p, q

  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> SeparationMessage:
    key = _validate.prng_key("key", key)
    buckets, labels = check_client(self.shape, buckets, labels)
    k_bucket, k_label = jax.random.split(key)
    half = self.epsilon / 2
    mb = collision_randomize(k_bucket, buckets, domain=self.shape.num_buckets,
                             bloom_length=self.bucket_bloom_length, epsilon=half,
                             cardinality=self.shape.k)
    ml = collision_randomize(k_label, labels, domain=self.shape.num_labels,
                             bloom_length=self.label_bloom_length, epsilon=half,
                             cardinality=self.shape.r)
    return SeparationMessage(mb, ml)

  def analyze(self, message: SeparationMessage) -> ProductStats:
    hb = collision_hits(message.buckets, domain=self.shape.num_buckets,
                        bloom_length=self.bucket_bloom_length)
    hl = collision_hits(message.labels, domain=self.shape.num_labels,
                        bloom_length=self.label_bloom_length)
    return _product_stats(hb, hl)

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    del key
    (p1, q1), (p2, q2) = self.bucket_rates, self.label_rates
    return _centered_products(stats, self.shape, num_clients, q1, q2) / ((p1 - q1) * (p2 - q2))

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    """Closed form; assumes every client holds exactly k buckets and r labels (other counts: ValueError)."""
    (p1, q1), (p2, q2) = self.bucket_rates, self.label_rates
    v0, v1 = q1 * (1 - q1) / (p1 - q1) ** 2, p1 * (1 - p1) / (p1 - q1) ** 2
    w0, w1 = q2 * (1 - q2) / (p2 - q2) ** 2, p2 * (1 - p2) / (p2 - q2) ** 2
    n11, n10, n01, n00 = _membership_counts(counts, self.shape, num_clients)
    return (n11 * ((v1 + 1) * (w1 + 1) - 1) + n10 * (v1 + 1) * w0 + n01 * v0 * (w1 + 1)
            + n00 * v0 * w0)

  #: How :meth:`max_error_bound` is obtained (the ``simulate`` CLI prints it).
  max_error_method = "bernstein-union"

  def max_error_bound(self, beta: Any, counts: Any = None, num_clients: Any = None) -> float | None:
    """Bound on max |error| over all s|Y| entries that holds w.p. >= 1 - beta (Bernstein + union).

    A client's term is t_a y_b with t_a in {1 - q1, -q1}/(p1 - q1) and y_b in {1 - q2, -q2}/(p2 - q2), of
    mean 1[a, b held] in {0, 1}; see :func:`_bernstein_max_error`. ``None`` without counts and num_clients.
    """
    (p1, q1), (p2, q2) = self.bucket_rates, self.label_rates
    t = np.array([1 - q1, -q1]) / (p1 - q1)
    y = np.array([1 - q2, -q2]) / (p2 - q2)
    return _bernstein_max_error(self, beta, counts, num_clients, np.outer(t, y).ravel(), (0.0, 1.0))

  def privacy(self) -> PrivacyStatement:
    (p1, q1), (p2, q2) = self.bucket_rates, self.label_rates
    return PrivacyStatement(
        mechanism="local-separation", relation=Relation.REPLACE_ONE, epsilon=self.epsilon,
        delta=0.0, count=1, method="closed-form",
        parameters={"factor_epsilon": self.epsilon / 2,
                    "bucket_bloom_length": self.bucket_bloom_length,
                    "label_bloom_length": self.label_bloom_length, "p1": p1, "q1": q1,
                    "p2": p2, "q2": q2, "k": self.shape.k, "r": self.shape.r, "model": "local"})


@dataclasses.dataclass(frozen=True)
class _Concatenated(CollisionRates, BsvsMechanism):
  """Shared sampler and statistics of the two Concatenation estimators."""

  shape: BsvsShape
  epsilon: float

  def __post_init__(self):
    check_shape(self.shape)
    eps = _validate.positive("epsilon", self.epsilon)
    object.__setattr__(self, "epsilon", eps)
    l = check_bloom_length(default_bloom_length(eps, self.cardinality), self.cardinality)
    check_collision_rates(eps, self.cardinality, l)

  @property
  def cardinality(self) -> int:
    """c = k + r positions of [T_i; y_i]."""
    return self.shape.k + self.shape.r

  @property
  def domain(self) -> int:
    """s + |Y| (buckets first, then labels)."""
    return self.shape.num_buckets + self.shape.num_labels

  @property
  def bloom_length(self) -> int:
    """l = floor((k + r) e^eps + 2(k + r) - 1)."""
    return default_bloom_length(self.epsilon, self.cardinality)

  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> CollisionMessage:
    key = _validate.prng_key("key", key)
    buckets, labels = check_client(self.shape, buckets, labels)
    s = self.shape.num_buckets
    ent = jnp.concatenate([buckets, jnp.where(labels >= 0, labels + s, -1)]).astype(jnp.int32)
    return collision_randomize(key, ent, domain=self.domain, bloom_length=self.bloom_length,
                               epsilon=self.epsilon, cardinality=self.cardinality)

  def analyze(self, message: CollisionMessage) -> ProductStats:
    hits = collision_hits(message, domain=self.domain, bloom_length=self.bloom_length)
    s = self.shape.num_buckets
    return _product_stats(hits[:s], hits[s:])

  def _moments(self, counts: Any, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """sum_i E[(hit_a - q)^2 (hit_b - q)^2] and sum_i 1[a, b in S_i] = A."""
    p, q = self.p, self.q
    n11, n10, n01, n00 = _membership_counts(counts, self.shape, num_clients)

    def fourth(pa: float, pb: float, both: float) -> float:
      p10, p01 = pa - both, pb - both
      p00 = 1 - pa - pb + both
      return both * (1 - q)**4 + (p10 + p01) * (1 - q)**2 * q**2 + p00 * q**4

    m4 = (n11 * fourth(p, p, p * q) + n10 * fourth(p, q, p * q) + n01 * fourth(q, p, p * q)
          + n00 * fourth(q, q, q * q))
    return m4, n11

  def privacy(self) -> PrivacyStatement:
    return PrivacyStatement(
        mechanism=f"local-{self.name}", relation=Relation.REPLACE_ONE, epsilon=self.epsilon,
        delta=0.0, count=1, method="closed-form",
        parameters={"bloom_length": self.bloom_length, "p": self.p, "q": self.q,
                    "cardinality": self.cardinality, "k": self.shape.k, "r": self.shape.r,
                    "model": "local"},
        warnings=self._warnings())

  def _warnings(self) -> tuple[PrivacyWarning, ...]:
    return ()


@dataclasses.dataclass(frozen=True)
class Concatenation(_Concatenated):
  """Concatenation with an unbiased estimator: one Collision(eps, c = k + r) on [T_i; y_i].

  With hit_a = 1[h(a) = z] and a fully random hash, for a bucket a and a
  label b (a != b in the concatenated domain):

  .. math::

     E[\\mathrm{hit}_a] = q + (p - q)\\,1[a \\in S],\\qquad
     E[\\mathrm{hit}_a \\mathrm{hit}_b] = q^2 + (pq - q^2)\\,1[a \\in S \\lor b \\in S],

  and 1[a]1[b] = 1[a] + 1[b] - 1[a or b] gives the unbiased per-client estimate

  .. math::

     g_{ab} = \\frac{\\mathrm{hit}_a - q}{p - q} + \\frac{\\mathrm{hit}_b - q}{p - q}
       - \\frac{\\mathrm{hit}_a \\mathrm{hit}_b - q^2}{q(p - q)}
     = -\\frac{(\\mathrm{hit}_a - q)(\\mathrm{hit}_b - q)}{q(p - q)},

  i.e. the paper's product estimate rescaled by -(p - q)/q. The law of
  (hit_a, hit_b) depends only on (1[a in S], 1[b in S]) and its four pmfs are
  linearly independent, so this is the *only* unbiased estimator that is a
  function of (hit_a, hit_b). It is costly: a co-hit needs h(a) = h(b)
  (probability 1/l), so the pairing of a and b is seen through a keyhole and
  the per-client variance is about l times that of a marginal. Prefer
  :class:`Separation` or flat :class:`Collision` for accuracy (see
  benchmarks/concatenation_bias.py); this class exists so that the paper's
  protocol is available without a silent bias.

  Formal guarantees:
    eps-LDP (pure, delta = 0; replace-one, local model), as Collision.

  References:
    The reverse-k-NN paper (arXiv:2207.13253), §"low privacy regime"; spec
    §1.8 and §5 I5.

  Attributes:
    shape: BSVS sizes.
    epsilon: local epsilon.
  """

  name: str = dataclasses.field(default="concatenation", init=False)

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    del key
    p, q = self.p, self.q
    return -_centered_products(stats, self.shape, num_clients, q, q) / (q * (p - q))

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    """Closed form; assumes every client holds exactly k buckets and r labels (other counts: ValueError)."""
    p, q = self.p, self.q
    m4, n11 = self._moments(counts, num_clients)
    return m4 / (q * (p - q)) ** 2 - n11

  #: How :meth:`max_error_bound` is obtained (the ``simulate`` CLI prints it).
  max_error_method = "bernstein-union"

  def max_error_bound(self, beta: Any, counts: Any = None, num_clients: Any = None) -> float | None:
    """Bound on max |error| over all s|Y| entries that holds w.p. >= 1 - beta (Bernstein + union).

    A client's term -(hit_a - q)(hit_b - q)/(q(p - q)) is -(1 - q)^2/(q(p - q)) (both hit), (1 - q)/(p - q)
    (one) or -q/(p - q) (neither), of mean 1[a, b held]. The rare, large co-hit term makes the error's tail
    far heavier than a normal's: the normal union bound ``simulate`` used was exceeded in 26 of 200 runs at
    n = 3,000, s = 10, |Y| = 5, eps = 6 (claimed: at most 10). See :func:`_bernstein_max_error`.
    """
    p, q = self.p, self.q
    values = np.array([-(1 - q) ** 2 / q, 1 - q, -q]) / (p - q)
    return _bernstein_max_error(self, beta, counts, num_clients, values, (0.0, 1.0))


@dataclasses.dataclass(frozen=True)
class ConcatenationLiteral(_Concatenated):
  """The paper's Concatenation estimator, kept literally: BIASED (spec §5 I5).

  Â = sum_i t_i y_i^T with t, y the two debiased halves of one
  Collision(eps, c = k + r) message on [T_i; y_i]. Both halves come from the
  same output z, so for a true entry (a in T_i, b in y_i) both hit only when
  h(a) = h(b):

  .. math::

     E[\\check t_a \\check y_b] = \\frac{pq - 2pq + q^2}{(p - q)^2}
       = -\\frac{q}{p - q}\\quad(\\text{not } 1),\\qquad
     E[\\hat A] = -\\frac{q}{p - q} A.

  The signal is inverted and shrunk (e.g. -0.31 at eps = 2, k = r = 1), and
  the bias grows linearly with n. Use :class:`Concatenation` (unbiased) or
  :class:`Separation`. The privacy statement carries a ``biased-estimator``
  warning.

  Formal guarantees:
    eps-LDP (pure, delta = 0; replace-one, local model), as Collision. The
    bias is an accuracy defect, not a privacy one.

  References:
    The reverse-k-NN paper (arXiv:2207.13253), §"low privacy regime"
    (Concatenation, Fig. 6); spec §5 I5.

  Attributes:
    shape: BSVS sizes.
    epsilon: local epsilon.
  """

  name: str = dataclasses.field(default="concatenation-literal", init=False)

  @property
  def bias_factor(self) -> float:
    """E[Â] = bias_factor * A with bias_factor = -q/(p - q)."""
    return -self.q / (self.p - self.q)

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    del key
    p, q = self.p, self.q
    return _centered_products(stats, self.shape, num_clients, q, q) / (p - q) ** 2

  def entry_bias(self, counts: Any, num_clients: int) -> np.ndarray:
    """E[Â] - A = (bias_factor - 1) * A."""
    a, _ = entry_counts(self.shape, counts, num_clients)
    return (self.bias_factor - 1.0) * a

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    """Variance (not MSE) of the literal estimate; its mean is bias_factor * A."""
    p, q = self.p, self.q
    m4, n11 = self._moments(counts, num_clients)
    return m4 / (p - q) ** 4 - n11 * self.bias_factor**2

  #: How :meth:`max_error_bound` is obtained (the ``simulate`` CLI prints it).
  max_error_method = "bernstein-union"

  def max_error_bound(self, beta: Any, counts: Any = None, num_clients: Any = None) -> float | None:
    """Bound on max |error| (bias included) over all s|Y| entries, w.p. >= 1 - beta (Bernstein + union).

    A client's term (hit_a - q)(hit_b - q)/(p - q)^2 is (1 - q)^2, -q(1 - q) or q^2 over (p - q)^2, of mean
    ``bias_factor`` * 1[a, b held]; the bound adds |bias_j|. See :func:`_bernstein_max_error`.
    """
    p, q = self.p, self.q
    values = np.array([(1 - q) ** 2, -q * (1 - q), q * q]) / (p - q) ** 2
    return _bernstein_max_error(self, beta, counts, num_clients, values, (0.0, self.bias_factor))

  def _warnings(self) -> tuple[PrivacyWarning, ...]:
    return (PrivacyWarning(
        code="biased-estimator",
        message=(f"The literal Concatenation estimate is biased: E[estimate] = "
                 f"{self.bias_factor:.4g} * A (= -q/(p-q) * A), not A; use 'concatenation' "
                 f"(unbiased) or 'separation'."),
        details={"bias_factor": self.bias_factor, "p": self.p, "q": self.q}),)
