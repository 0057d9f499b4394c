"""Central DP: a trusted curator adds Laplace or discrete-Laplace noise to A.

In the central model every client sends its exact contribution A^i (the
indicator of its at most kr entries) to a trusted curator, who releases
A + N with i.i.d. noise on each of the d = s|Y| entries. The noise is drawn
from the server key in :meth:`estimate`, on the host, in float64.

Sensitivity (spec/REVERSE_KNN.md §1.4 and §5 I1): one record's entries are
distinct, so replacing a record changes at most 2kr entries of A, each by
exactly 1 (kr under add/remove). The scalar L1 sensitivity is therefore
Delta = 2kr (kr), and Laplace(Delta/eps) is eps-DP. The *exact* privacy loss
distribution of a worst neighbouring pair is tighter than one shift by Delta:
it is the Delta-fold composition of a sensitivity-1 mechanism with the same
noise, which :meth:`CentralLaplace.account` hands to dp-accounting.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import MechanismAccount, PrivacyStatement, PrivacyWarning, Relation
from jaxdistill.accounting import discrete_laplace as discrete_laplace_account
from jaxdistill.accounting import laplace as laplace_account
from jaxdistill.mechanisms import _bounds
from jaxdistill.mechanisms._base import BsvsMechanism, count_free_clients
from jaxdistill.mechanisms._bsvs import (BsvsShape, bsvs_sensitivity, check_client, check_shape, client_entries,
                                        entry_histogram, entry_indicator)

__all__ = ["CentralLaplace", "CentralDiscreteLaplace"]

#: Largest and smallest Laplace scale b = Delta/eps (see CentralLaplace._check_noise_fits).
_MAX_LAPLACE_SCALE = 2.0**400
_MIN_LAPLACE_SCALE = 2.0**-400
#: -ln(U) <= 54 ln(2) for the 53-bit uniforms U >= 2^-54 of :func:`host_uniform`.
_DLAP_MAX_LOG_U = 54 * math.log(2)


def host_uniform(key: jax.Array, shape: tuple[int, ...]) -> np.ndarray:
  """float64 uniforms in the open interval (0, 1) with 53 random bits each.

  Two 32-bit words per draw come from ``jax.random.bits(key)`` (so the
  randomness is a pure function of the key); they are combined on the host
  into ``(m + 0.5) / 2^53`` with m uniform on [0, 2^53).

  Args:
    key: a PRNG key, or an array of keys ``[*batch]`` (independent draws per
      key, the same values as one call per key).
    shape: the draw's shape.

  Returns:
    float64 ``[*batch, *shape]``.
  """
  batch = tuple(jnp.shape(key))
  draw = lambda k: jax.random.bits(k, (2,) + tuple(shape), jnp.uint32)
  words = draw(key) if not batch else jax.vmap(draw)(jnp.reshape(key, (-1,)))
  words = np.moveaxis(np.asarray(words).astype(np.uint64).reshape(batch + (2,) + tuple(shape)),
                      len(batch), 0)
  mantissa = (words[0] >> np.uint64(5)) * np.uint64(1 << 26) + (words[1] >> np.uint64(6))
  return (mantissa.astype(np.float64) + 0.5) / float(1 << 53)


#: Largest |count| :func:`_counts` accepts: A plus discrete-Laplace noise (|G1 - G2| < 2^62) stays in int64.
_MAX_COUNT = 2**62


def _server_key(key: Any) -> jax.Array:
  """``key`` as a typed PRNG key or an array ``[*batch]`` of them, or ``ValueError`` naming ``key``.

  Typed keys pass unchanged (any batch shape); legacy ``jax.random.PRNGKey``
  data is wrapped as elsewhere in the library (:func:`_validate.prng_key`):
  ``uint32 [2]`` is one key, ``uint32 [m, 2]`` a batch of m.
  """
  dtype = getattr(key, "dtype", None)
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    return key
  return _validate.prng_key("key", key, batched=np.ndim(key) >= 2)


def _counts(stats: Any, shape: BsvsShape) -> np.ndarray:
  """The summed statistics A as int64 ``[s, |Y|]``, or ``ValueError`` naming ``stats``.

  A is a count of clients' votes: a NaN, an infinity or a fraction (once silently cast to -2^63 or
  truncated) cannot be one, nor a value whose sum with the noise would overflow int64.
  """
  try:
    arr = None if isinstance(stats, (str, bytes, bool, np.bool_)) else np.asarray(stats)
  except (TypeError, ValueError):
    arr = None
  if arr is not None and arr.dtype.kind in "iu":
    big = (arr >= _MAX_COUNT) | (arr <= -_MAX_COUNT)
    if big.any():
      raise ValueError(f"Expected stats to hold counts with |A| < 2^62; found {int(arr[big].reshape(-1)[0])}.")
    out = arr.astype(np.int64)
  else:
    f = _validate.real_array("stats", stats)
    bad = ~np.isfinite(f) | (f != np.round(f)) | (np.abs(f) >= _MAX_COUNT)
    if bad.any():
      raise ValueError(f"Expected stats to hold integer counts (finite, whole, |A| < 2^62): found "
                       f"{float(f[bad].reshape(-1)[0])!r}.")
    out = f.astype(np.int64)
  if out.shape not in ((shape.num_buckets, shape.num_labels), (shape.d,)):  # a transposed [|Y|, s] was reshaped
    raise ValueError(f"Expected stats of shape [s, |Y|] = [{shape.num_buckets}, {shape.num_labels}] (or flat "
                     f"[{shape.d}]); got shape {list(out.shape)}.")
  return out.reshape(shape.num_buckets, shape.num_labels)


class _Central(BsvsMechanism):
  """What the two central mechanisms share: validation, sensitivity and the exact contribution.

  Subclasses are frozen dataclasses with fields ``shape``, ``epsilon`` and
  ``relation`` and implement ``accuracy(beta, *, simultaneous)``.
  """

  shape: BsvsShape
  epsilon: float
  relation: Relation

  def __post_init__(self):
    check_shape(self.shape)
    object.__setattr__(self, "epsilon", _validate.positive("epsilon", self.epsilon))
    object.__setattr__(self, "relation", Relation.parse(self.relation))
    self._check_noise_fits()

  def _check_noise_fits(self) -> None:
    """Raises ValueError naming epsilon when the noise would overflow its dtype (epsilon too small)."""

  @property
  def sensitivity(self) -> int:
    """L1 sensitivity Delta: 2kr (replace-one) or kr (add/remove)."""
    return bsvs_sensitivity(self.shape.k, self.shape.r, self.relation)

  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> jax.Array:
    """int32 ``[d]``: the client's exact contribution (sent to the curator)."""
    _validate.prng_key("key", key)  # unused (no client noise in the central model), checked like every mechanism's
    buckets, labels = check_client(self.shape, buckets, labels)
    return entry_indicator(client_entries(buckets, labels, self.shape.num_labels), self.shape.d)

  def analyze(self, message: jax.Array) -> jax.Array:
    return message.astype(jnp.int32)

  def chunk_statistics(self, keys: jax.Array, buckets: jax.Array, labels: jax.Array,
                       valid: jax.Array) -> jax.Array:
    """int32 ``[d]``: the chunk's exact counts by a scatter-add of its entries (no dense rows)."""
    del keys
    return entry_histogram(buckets, labels, valid, self.shape.num_buckets, self.shape.num_labels)

  def chunk_width(self) -> int:
    """kr: the chunk path scatter-adds each client's at most kr entries."""
    return self.shape.k * self.shape.r

  def _union_entries(self, simultaneous: bool) -> int:
    """Entries under the union bound: |Y| per bucket, s|Y| over all buckets."""
    simultaneous = _validate.boolean("simultaneous", simultaneous)  # "no" selected the union over all s|Y|
    return self.shape.num_labels * (self.shape.num_buckets if simultaneous else 1)

  def max_error_bound(self, beta: Any, counts: Any = None, num_clients: Any = None) -> float:
    """Bound on max |error| over all s|Y| entries with probability >= 1 - beta.

    Proposition 1 over all entries at once: ``accuracy(beta, simultaneous=True)``
    (Laplace: b ln(s|Y|/beta); discrete Laplace: the least integer alpha from
    the exact tail). The error depends on neither the counts nor n.
    """
    if num_clients is not None:  # unused, but checked as RR's are: counts='abc' and n = -5 were accepted
      count_free_clients(self.shape, counts, num_clients)
    # One beta, one bound: accuracy() maps arrays, and float() of its array was a TypeError.
    return float(self.accuracy(_validate.open_unit("beta", beta), simultaneous=True))


@dataclasses.dataclass(frozen=True)
class CentralLaplace(_Central):
  """Central Laplace mechanism on the BSVS counts: A + Lap(Delta/eps) per entry.

  .. math::

     \\hat A_{t,y} = A_{t,y} + N_{t,y},\\quad N_{t,y} \\sim \\mathrm{Lap}(b),\\quad
     b = \\Delta/\\varepsilon,\\quad \\Delta = 2kr \\text{ (replace-one)},\\ kr
     \\text{ (add/remove)};\\qquad \\mathrm{Var}[\\hat A_{t,y}] = 2b^2.

  Formal guarantees:
    eps-DP (pure, delta = 0) under ``relation`` (record level, central model),
    for real-valued noise. The float64 output is subject to Mironov's (2012)
    floating-point attack, which :meth:`privacy` states as a warning; the
    discrete Laplace is the library's default for a release.
    A worst neighbouring pair shifts Delta distinct entries by 1 each, so the
    exact privacy loss distribution is the Delta-fold composition of
    Laplace(b) with sensitivity 1 (:meth:`account`); its pure epsilon is
    Delta/b = eps, and its delta(eps') for eps' < eps is smaller than that of a
    single shift by Delta.

  References:
    Dwork, McSherry, Nissim, Smith (2006); the reverse-k-NN paper
    (arXiv:2207.13253, https://arxiv.org/abs/2207.13253), Proposition 1 and
    Theorem 1 (reconstructed in spec/REVERSE_KNN.md §1.4-1.5).

  Attributes:
    shape: BSVS sizes.
    epsilon: central epsilon.
    relation: neighbouring relation (``replace-one``, the paper's, by default).

  >>> mech = CentralLaplace(BsvsShape(4, 3, 1), 1.0)
  >>> mech.scale
  2.0
  """

  shape: BsvsShape
  epsilon: float
  relation: Relation = Relation.REPLACE_ONE
  name: str = dataclasses.field(default="laplace", init=False)

  @property
  def scale(self) -> float:
    """Laplace scale b = Delta / eps."""
    return self.sensitivity / self.epsilon

  def _check_noise_fits(self) -> None:
    """Requires 2^-400 <= b = Delta/eps <= 2^400, i.e. Delta 2^-400 <= eps <= Delta 2^400.

    With 53-bit uniforms |N| <= 54 ln(2) b < 38b, so the noise, the
    variance 2b^2 <= 2^801 and sums of many squared errors stay far below the
    float64 maximum 2^1024 (b^2 alone overflows for b > 2^512). At the other
    end b^2 >= 2^-800 stays a normal float64: at eps = 1e300 the squared
    errors underflowed (a predicted and measured RMS of 0 beside a non-zero
    maximum error), and at eps = 1e308 XLA flushed the subnormal b to 0, so
    the max-error bound said 0 while every error exceeded it.
    """
    if not self.scale <= _MAX_LAPLACE_SCALE:
      raise ValueError(f"Expected epsilon={self.epsilon!r} >= Delta * 2^-400 = {self.sensitivity * 2.0**-400:.3g}: "
                       f"the Laplace scale b = Delta/eps = {self.scale:.3g} must stay <= 2^400 so that the noise "
                       f"and its variance 2b^2 fit in float64.")
    if not self.scale >= _MIN_LAPLACE_SCALE:
      raise ValueError(f"Expected epsilon={self.epsilon!r} <= Delta * 2^400 = {self.sensitivity * 2.0**400:.3g}: "
                       f"the Laplace scale b = Delta/eps = {self.scale:.3g} must stay >= 2^-400 so that the noise "
                       f"and its squares stay normal float64 numbers.")

  def noise(self, key: jax.Array) -> np.ndarray:
    """float64 ``[*batch, s, |Y|]`` i.i.d. Laplace(b) noise, b * (E1 - E2), E ~ Exp(1).

    ``key`` may be an array of keys ``[*batch]`` (one independent draw each).
    """
    u = host_uniform(_server_key(key), (2, self.shape.num_buckets, self.shape.num_labels))
    return self.scale * (np.log(u[..., 1, :, :]) - np.log(u[..., 0, :, :]))

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    """A + noise, float64 ``[s, |Y|]`` (``[*batch, s, |Y|]`` for a batch of keys)."""
    _validate.integer("num_clients", num_clients, minimum=1)  # unused, but 'abc', None and -5 were accepted
    return _counts(stats, self.shape).astype(np.float64) + self.noise(key)

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    count_free_clients(self.shape, counts, num_clients)
    return np.full((self.shape.num_buckets, self.shape.num_labels), 2.0 * self.scale**2, np.float64)

  def account(self) -> MechanismAccount:
    """Tight account: Delta-fold composition of Laplace(b), sensitivity 1."""
    return laplace_account(self.scale, sensitivity=1, relation=self.relation, count=self.sensitivity)

  def accuracy(self, beta: Any, *, simultaneous: bool = False) -> float:
    """Proposition 1: alpha with Pr[max_y |err_{t,y}| > alpha] <= beta.

    Per bucket (union over |Y|), or over all s buckets at once (union over
    s|Y|, spec §5 I2) when ``simultaneous``.
    """
    return _bounds.laplace_alpha(self.scale, beta, num_entries=self._union_entries(simultaneous))

  def labeling_error(self, gap: Any) -> Any:
    """Theorem 1: bound on Pr[argmax_y hat a_{t,y} != y*] given Gap_t."""
    return _bounds.laplace_labeling_error(gap, self.scale, num_labels=self.shape.num_labels)

  def privacy(self) -> PrivacyStatement:
    warn = PrivacyWarning(
        "float_laplace_output",
        "eps-DP holds for real-valued Laplace noise; this release is float64 A + b(ln U1 - ln U2), whose set "
        "of reachable values depends on A (Mironov 2012), so the float output is not covered exactly. Use the "
        "discrete Laplace (the default) for a release.", {"scale": self.scale})
    return PrivacyStatement(
        mechanism="central-laplace", relation=self.relation, epsilon=self.epsilon, delta=0.0,
        count=1, method="closed-form",
        parameters={"scale": self.scale, "sensitivity": self.sensitivity, "d": self.shape.d,
                    "k": self.shape.k, "r": self.shape.r, "model": "central"},
        warnings=(warn,))


@dataclasses.dataclass(frozen=True)
class CentralDiscreteLaplace(_Central):
  """Central discrete Laplace (two-sided geometric) on the integer counts.

  The library default for released counts: the output stays an integer,
  so no float output leaks the input (Mironov 2012).

  .. math::

     \\Pr[N = z] = \\frac{1 - e^{-a}}{1 + e^{-a}} e^{-a|z|},\\ z \\in \\mathbb{Z},\\quad
     a = \\varepsilon/\\Delta;\\qquad \\mathrm{Var}[N] = \\frac{2e^{-a}}{(1 - e^{-a})^2}.

  N is sampled as G1 - G2 with G ~ Geometric(1 - e^{-a}) on {0, 1, ...},
  G = floor(-ln(U)/a) with 53-bit uniforms U >= 2^-54 (tail beyond
  54 ln(2)/a = 37.4/a cut, mass e^{-37.4} < 1e-16).

  Formal guarantees:
    The ideal mechanism is eps-DP (pure, delta = 0) under ``relation``; the
    exact privacy loss distribution of a worst pair is the Delta-fold
    composition of a sensitivity-1 discrete Laplace with parameter a
    (:meth:`account`), i.e. a binomial: loss a(2K - Delta),
    K ~ Bin(Delta, 1/(1 + e^{-a})).

    The float64 sampler is not exactly that law: U lives on a grid of
    2^-53, the support stops at 37.4/a, and near the end of it adjacent
    probabilities are counts of 1-3 grid points, so their ratio is not e^a.
    ``float_sampler_tv(a)`` (in ``jaxdistill.mechanisms._central``) bounds its total variation from the ideal law
    per entry, and only the Delta entries a neighbour changes matter, so
    the release is (eps, (1 + e^eps) Delta tv)-DP, about 1e-12 at eps = 0.1
    (:meth:`privacy` reports it as a warning; exact enumeration of the
    sampler's law gives about 1e-15 per unit shift).

  References:
    Ghosh, Roughgarden, Sundararajan (2009), geometric mechanism; the
    reverse-k-NN paper (arXiv:2207.13253), Proposition 1 and Theorem 1.

  Attributes:
    shape: BSVS sizes.
    epsilon: central epsilon.
    relation: neighbouring relation.
  """

  shape: BsvsShape
  epsilon: float
  relation: Relation = Relation.REPLACE_ONE
  name: str = dataclasses.field(default="discrete-laplace", init=False)

  @property
  def parameter(self) -> float:
    """a = eps / Delta (pmf proportional to exp(-a|z|))."""
    return self.epsilon / self.sensitivity

  def _check_noise_fits(self) -> None:
    """Requires 54 ln(2) / a < 2^62, i.e. a = eps/Delta > 54 ln(2) 2^-62 (about 8.1e-18).

    G = floor(-ln(U)/a) <= 54 ln(2)/a (U >= 2^-54), so G < 2^62 fits int64
    and so do G1 - G2 and A + G1 - G2 (|.| < 2^63); beyond it the cast wraps
    to about -2^63.
    """
    # a > 0 first: an epsilon that a = eps/Delta rounds to 0 (5e-324) raised ZeroDivisionError here.
    if not (self.parameter > 0 and _DLAP_MAX_LOG_U / self.parameter < 2.0**62):
      raise ValueError(f"Expected epsilon={self.epsilon!r} > Delta * 54 ln(2) * 2^-62 = "
                       f"{self.sensitivity * _DLAP_MAX_LOG_U * 2.0**-62:.3g}: the geometric draws "
                       f"floor(-ln(U)/a) <= 54 ln(2)/a (a = eps/Delta = {self.parameter!r}) must stay below "
                       f"2^62 to fit in int64.")

  def noise(self, key: jax.Array) -> np.ndarray:
    """int64 ``[*batch, s, |Y|]`` i.i.d. discrete Laplace(a) noise (batch: an array of keys)."""
    u = host_uniform(_server_key(key), (2, self.shape.num_buckets, self.shape.num_labels))
    g = np.floor(-np.log(u) / self.parameter).astype(np.int64)
    return g[..., 0, :, :] - g[..., 1, :, :]

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    """A + noise, float64 ``[s, |Y|]`` (``[*batch, s, |Y|]`` for a batch of keys)."""
    _validate.integer("num_clients", num_clients, minimum=1)  # unused, but 'abc', None and -5 were accepted
    return (_counts(stats, self.shape) + self.noise(key)).astype(np.float64)

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    count_free_clients(self.shape, counts, num_clients)
    x = math.exp(-self.parameter)
    v = 2.0 * x / math.expm1(-self.parameter) ** 2  # 1 - e^{-a} without cancellation for tiny a
    return np.full((self.shape.num_buckets, self.shape.num_labels), v, np.float64)

  def account(self) -> MechanismAccount:
    """Tight account: Delta-fold composition of discrete Laplace(a), sensitivity 1."""
    return discrete_laplace_account(self.parameter, sensitivity=1, relation=self.relation,
                                    count=self.sensitivity)

  def accuracy(self, beta: Any, *, simultaneous: bool = False) -> float:
    """Proposition 1 (exact discrete tail): integer alpha with failure <= beta."""
    return _bounds.discrete_laplace_alpha(self.parameter, beta,
                                          num_entries=self._union_entries(simultaneous))

  def labeling_error(self, gap: Any) -> Any:
    """Theorem 1 (discrete tail): bound on Pr[label of bucket t wrong]."""
    return _bounds.discrete_laplace_labeling_error(gap, self.parameter,
                                                   num_labels=self.shape.num_labels)

  def privacy(self) -> PrivacyStatement:
    tv = float_sampler_tv(self.parameter)
    # (1 + e^eps) * Delta * tv, in log space: e^eps overflows float64 from eps ~ 709.8 (delta is capped at 1).
    log_delta = (self.epsilon + math.log1p(math.exp(-self.epsilon)) + math.log(self.sensitivity * tv)
                 if tv > 0 else -math.inf)
    float_delta = 1.0 if log_delta >= 0.0 else math.exp(log_delta)
    warn = PrivacyWarning(
        "float_sampler_delta",
        f"delta = 0 holds for the ideal discrete Laplace; the float64 sampler deviates from it by at most "
        f"{tv:.2g} in total variation per entry, so each release is ({self.epsilon:.6g}, {float_delta:.2g})-DP "
        "(T releases: T times that delta).",
        {"total_variation_per_entry": tv, "delta_per_release": float_delta})
    return PrivacyStatement(
        mechanism="central-discrete-laplace", relation=self.relation, epsilon=self.epsilon,
        delta=0.0, count=1, method="closed-form",
        parameters={"parameter": self.parameter, "sensitivity": self.sensitivity,
                    "d": self.shape.d, "k": self.shape.k, "r": self.shape.r, "model": "central"},
        warnings=(warn,))


def float_sampler_tv(parameter: Any) -> float:
  """Total variation between the float64 discrete-Laplace sampler and the ideal law, one entry.

  G = floor(-ln(U)/a) with U = (m + 1/2)/2^53. Assuming ``log`` errs by at
  most one ulp, the computed -ln(U)/a has relative error at most 2^-51, so
  Pr[G >= g] is within e^{-ag} a g 1.01 * 2^-51 + 2^-53 of e^{-ag} (the
  second term is the grid of U) for g <= g_max = floor(54 ln 2 / a), and
  the ideal mass beyond g_max is below 2^-54. Summing, with
  sum_g a g e^{-ag} <= 1/a,

  .. math::

     \\mathrm{TV}(G) \\le \\frac{1.01 \\cdot 2^{-51}}{a} + (g_{max} + 1)\\,2^{-53} + 2^{-54},
     \\qquad \\mathrm{TV}(N = G_1 - G_2) \\le 2\\,\\mathrm{TV}(G).

  If two ideal releases are (eps, 0)-indistinguishable and each real one is
  within tv of its ideal, the real pair is (eps, (1 + e^eps) tv)-DP.

  Args:
    parameter: a > 0.

  Returns:
    The bound on TV(N), float64.
  """
  a = _validate.positive("parameter", parameter)
  g_max = math.floor(54 * math.log(2) / a)
  tv_g = 1.01 * 2.0**-51 / a + (g_max + 1) * 2.0**-53 + 2.0**-54
  return float(2 * tv_g)
