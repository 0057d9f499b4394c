"""dp-accounting wrappers: noise mechanisms self-composed T times.

Each factory returns a :class:`MechanismAccount`, a frozen description of one
mechanism (parameter, sensitivity, neighbouring relation, number of
compositions) that answers epsilon-for-delta and delta-for-epsilon in float64
through dp-accounting's privacy loss distributions (PLDs), and exposes the
matching ``DpEvent`` for use with any dp-accounting accountant.

Every reported epsilon and delta is an upper bound:

================  =======================================  ==========================================
mechanism         parameter                                 PLD
================  =======================================  ==========================================
Laplace           scale b (density ∝ exp(-|z|/b))           ``from_laplace_mechanism`` (pessimistic grid)
discrete Laplace  a (pmf ∝ exp(-a|z|), integers)            exact, on the lattice a·Z
Gaussian          sigma                                     one Gaussian of ratio sqrt(T) Delta/sigma (grid)
k-ary RR          local epsilon0, K buckets                 exact, on the lattice eps0·Z
================  =======================================  ==========================================

Lattice mechanisms: every privacy loss of discrete Laplace is a(|z - Delta| - |z|), an integer multiple of
a, and every loss of randomized response is -eps0, 0 or +eps0. Their PLDs are built directly on that
lattice (step a or eps0, nudged up by a relative 2^-50 so that float products never round a loss down),
so no loss is rounded and T-fold compositions do not drift (discrete Laplace moves its far tail, at most
1e-30 of probability per release, up to a higher loss). A discrete Laplace whose lattice is both finer than
half of ``value_discretization_interval`` and longer than ``_LATTICE_EXACT_POINTS`` points (a = 1/Delta with
Delta in the millions: 2 Delta + 1 points) is coarsened instead: each loss is rounded up to a multiple of m·a,
m the largest integer with m·a <= the interval, which is dp-accounting's pessimistic grid rounding (drift up to
T steps) at the cost of a grid. On the Laplace grid each release's loss is rounded up by less than one step, so
the T-fold epsilon can exceed the exact one by up to T steps: with the default step 1e-4 and T = 10^6, up to
100. Randomized response with eps0 = 0.01 over 10^6 releases gave epsilon(1e-6) = 146.2 on the grid,
against the exact 96.7 (binomial), which the lattice reproduces. T Gaussian releases are exactly one Gaussian
of sensitivity-to-noise ratio mu = sqrt(T) Delta / sigma, whose PLD is built once on the grid and never
composed (as dp-accounting's PLDAccountant does), so it does not drift either: the one-release grid composed
10^5 times had given epsilon(1e-4) = 0.1004 for sigma = 11508.4, Delta = sqrt(2), where the exact value is
0.0946.

The ``sensitivity`` is measured under the stated ``relation`` (for a BSVS
count under replace-one it is 2kr, under add/remove kr): the neighbouring
relation is always explicit and is recorded in every result. Randomized
response is a local randomizer whose neighbours are any two inputs, so it is
accounted under replace-one only.

Memory: a T-fold PLD is a grid over the composed privacy loss. With little
noise and large T that range explodes (the default dp-accounting calibration
bracket was seen to use more than 24 GB at T = 10^5), so every PLD here is
built on a grid of at most ``MAX_GRID_POINTS`` points, coarsening the
discretisation interval when needed (still a valid upper bound), and
:func:`calibrate` searches explicit brackets derived in closed form.
dp-accounting picks the FFT length of a T-fold composition from its own tail
bound; a composition longer than ``MAX_FFT_POINTS`` is refused (a ValueError)
before it runs, and a sparse PMF is made dense first where dp-accounting would
size its composition as ``size ** T`` (which never finished at T = 10^8).

Round-off: the T-fold FFT composition is not exact. Its error was measured
at up to 4e-17 per release, enough to make deltas below about 1e-10 too small
(even negative) at T = 10^5. The Gaussian, which is not composed, is never
reported below its exact closed form (Balle & Wang 2018, Theorem 8, for one
Gaussian of ratio sqrt(T) Delta / sigma); the other accounts add
``count * FFT_ROUNDOFF_PER_RELEASE`` to every composed delta.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import dp_accounting
from dp_accounting import dp_event as dpe
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
import numpy as np
from scipy import special

from jaxdistill import _validate
from jaxdistill.accounting._relation import PrivacyStatement, Relation

__all__ = [
    "MechanismAccount",
    "laplace",
    "discrete_laplace",
    "gaussian",
    "randomized_response",
    "calibrate",
    "MAX_GRID_POINTS",
    "MAX_RR_EPSILON0",
    "MAX_GRID_INTERVAL",
    "MAX_COUNT",
    "MAX_DISCRETE_SENSITIVITY",
    "GAUSSIAN_SCALE_RANGE",
    "MAX_FFT_POINTS",
    "FFT_ROUNDOFF_PER_RELEASE",
    "MAX_LATTICE_LOSS",
    "MAX_LATTICE_INDEX",
]

#: Largest PLD grid built (float64: 8 bytes a point, a few copies during FFT).
MAX_GRID_POINTS = 20_000_000

#: Largest local epsilon of randomized response: e^eps0 overflows float64 from about 709.8.
MAX_RR_EPSILON0 = 700.0

#: Coarsest PLD grid step (in nats of privacy loss). dp-accounting's connect-the-dots PLD divides by
#: e^step - 1, which overflows float64 from a step of about 709.8 (an OverflowError, seen with
#: ``value_discretization_interval=1e30`` and with Laplace sensitivity/scale = 1e10, whose grid cap
#: coarsens the step to 1000). Steps up to 700 were checked to give valid upper bounds; 100 leaves margin.
#: The step used is the larger of the requested one and (loss range) / ``MAX_GRID_POINTS``, so an
#: account whose single-release loss is this large (Laplace sensitivity/scale or Gaussian
#: (Delta/sigma)^2 / 2 beyond about 1e9 nats, in total over T) is refused. Discrete Laplace and randomized
#: response are built on their own lattice instead (see the module docstring and ``MAX_LATTICE_LOSS``).
MAX_GRID_INTERVAL = 100.0

#: Largest composed privacy loss T * (loss unit) * sensitivity of a lattice account (discrete Laplace,
#: randomized response): the lattice's losses are index * step in float64, which must stay finite.
MAX_LATTICE_LOSS = 1e300

#: Largest count * sensitivity of a lattice account: dp-accounting indexes the composed lattice in int64
#: (count = 10^12 with sensitivity 10^7 overflowed a C long).
MAX_LATTICE_INDEX = 2**62

#: Most self-composed releases T (T * loss must stay a float; larger T leaves the grid range anyway).
MAX_COUNT = 10**12

#: Largest discrete-Laplace sensitivity: dp-accounting enumerates every integer outcome in a window
#: about as wide as the sensitivity (10^7 took 2.4 GB and 25 s; 2^40 a MemoryError; 2^63 an OverflowError).
#: (It was 10^6, which refused 2 x 10^6, computed in 2 s.)
MAX_DISCRETE_SENSITIVITY = 10**7

#: Range of the Gaussian's sigma and sensitivity. dp-accounting squares them: sigma = 1e300 overflowed
#: (an OverflowError) and sigma = sensitivity = 1e-300 underflowed to a NaN.
GAUSSIAN_SCALE_RANGE = (1e-100, 1e100)

#: Largest FFT dp-accounting may run to self-compose a PLD (complex128, a few copies: about 4 GiB). Its length
#: comes from dp-accounting's own Chernoff tail bound, not from ``MAX_GRID_POINTS``: randomized response with
#: eps0 = 0.01 over 10^8 releases asked for 1.06e9 points (15.8 GiB) and was killed for memory.
MAX_FFT_POINTS = 2**26

#: Round-off allowance of an FFT self-composition, per release: every delta of the Laplace, discrete-Laplace
#: and randomized-response accounts (one release included) is raised by ``count * FFT_ROUNDOFF_PER_RELEASE`` (and
#: every epsilon is read at delta minus it; the Gaussian uses its exact closed form instead). The composed PLD's
#: round-off made deltas below ~1e-10 too small at T = 10^5 (Gaussian delta(25) 3.72e-11 against the exact
#: 4.12e-11; Laplace delta(750) negative); the largest error measured was 4e-17 per release, this allows
#: 64 * 2^-53 = 7.1e-15 (an empirical allowance, not a proof; the Gaussian is also checked in closed form).
FFT_ROUNDOFF_PER_RELEASE = 64 * 2.0**-53

_MECHANISMS = ("laplace", "discrete-laplace", "gaussian", "randomized-response")
#: What :attr:`MechanismAccount.parameter` is for each mechanism, as its errors name it.
_PARAMETER_MEANING = {"laplace": "Laplace scale b", "discrete-laplace": "discrete-Laplace decay a",
                      "gaussian": "Gaussian sigma", "randomized-response": "randomized-response epsilon0"}

#: Exceptions dp-accounting raises for parameters outside its numerical range; re-raised as ValueError.
_DP_ACCOUNTING_ERRORS = (OverflowError, IndexError, ZeroDivisionError, FloatingPointError, MemoryError, ValueError)


@dataclasses.dataclass(frozen=True)
class MechanismAccount:
  """A noise mechanism, self-composed ``count`` times, with its accounting.

  Attributes:
    mechanism: one of ``laplace``, ``discrete-laplace``, ``gaussian``,
      ``randomized-response``.
    parameter: Laplace scale b, discrete-Laplace a, Gaussian sigma, or the
      randomized-response local epsilon0.
    sensitivity: L1 (Laplace, discrete Laplace) or L2 (Gaussian) sensitivity
      under ``relation``; 1 for randomized response.
    relation: the neighbouring relation.
    count: number of self-composed releases T.
    num_buckets: K for randomized response, else None.
    value_discretization_interval: requested PLD grid step, in (0, ``MAX_GRID_INTERVAL``]. Randomized
      response never uses it (its PLD is exact on its loss lattice); discrete Laplace only to coarsen a
      lattice finer than half of it and longer than ``_LATTICE_EXACT_POINTS`` points.

  Raises:
    ValueError: at construction, for an unknown mechanism, a parameter or
      sensitivity that is not a finite number > 0, a relation that is not a
      :class:`Relation` (or its string value), and the ranges where
      dp-accounting's PLD breaks down: a grid step (after coarsening, see
      :meth:`grid_interval`) above ``MAX_GRID_INTERVAL`` (Laplace, Gaussian), a
      composed loss above ``MAX_LATTICE_LOSS`` or count * sensitivity above
      ``MAX_LATTICE_INDEX`` (discrete Laplace, randomized response), count above
      ``MAX_COUNT``, a Gaussian sigma or sensitivity outside
      ``GAUSSIAN_SCALE_RANGE``, a discrete-Laplace sensitivity that is not an
      integer in [1, ``MAX_DISCRETE_SENSITIVITY``], and for randomized
      response a relation other than replace-one, a sensitivity other than 1,
      num_buckets not an integer >= 2, or an eps0 above ``MAX_RR_EPSILON0`` or
      so small that the keep probability rounds to uniform.
  """

  mechanism: str
  parameter: float
  sensitivity: float
  relation: Relation
  count: int = 1
  num_buckets: int | None = None
  value_discretization_interval: float = 1e-4

  def __post_init__(self):
    mech = _validate.choice("mechanism", self.mechanism, _MECHANISMS)
    rr = mech == "randomized-response"
    # Errors name the field and what it means for this mechanism ("Expected scale=-1.0 > 0" named no field).
    pname = f"parameter (the {_PARAMETER_MEANING[mech]})"
    param = _validate.positive(pname, self.parameter)
    if mech == "discrete-laplace":
      sens = _validate.integer("sensitivity", self.sensitivity, minimum=1, maximum=MAX_DISCRETE_SENSITIVITY)
    else:
      sens = _validate.positive("sensitivity", self.sensitivity)
    rel = Relation.parse(self.relation)
    count = _validate.integer("count", self.count, minimum=1, maximum=MAX_COUNT)
    vdi = _check_vdi(self.value_discretization_interval)
    buckets = self.num_buckets
    if rr:
      if rel is not Relation.REPLACE_ONE:
        raise ValueError(f"Expected relation=replace-one for randomized response (a local randomizer); "
                         f"got {rel.value}.")
      if sens != 1.0:
        raise ValueError(f"Expected sensitivity=1 for randomized response; got sensitivity={sens!r}.")
      buckets = _validate.integer("num_buckets", buckets, minimum=2, maximum=MAX_COUNT)
      if param > MAX_RR_EPSILON0:
        raise ValueError(f"Expected {pname}={param!r} <= {MAX_RR_EPSILON0:g} (e^eps0 overflows float64 from "
                         "~709.8).")
      if not _rr_noise(param, buckets) < 1.0:
        raise ValueError(f"Expected {pname}={param!r} large enough that randomized response over "
                         f"num_buckets={buckets} keeps its input more often than uniform in float64 "
                         f"(K/(e^eps0 + K - 1) < 1; about eps0 > K * 1.1e-16).")
    elif buckets is not None:
      raise ValueError(f"Expected num_buckets=None for the {mech} mechanism; got {buckets!r}.")
    if mech == "gaussian":
      low, high = GAUSSIAN_SCALE_RANGE
      for name, value in ((pname, param), ("sensitivity", sens)):
        if not low <= value <= high:
          raise ValueError(f"Expected {name}={value!r} in [{low:g}, {high:g}] for the Gaussian mechanism "
                           "(dp-accounting squares it).")
    object.__setattr__(self, "mechanism", mech)
    object.__setattr__(self, "parameter", param)
    object.__setattr__(self, "sensitivity", sens)
    object.__setattr__(self, "relation", rel)
    object.__setattr__(self, "count", count)
    object.__setattr__(self, "num_buckets", buckets)
    object.__setattr__(self, "value_discretization_interval", vdi)
    if self._on_lattice():
      if count * sens > MAX_LATTICE_INDEX:
        raise ValueError(f"Expected count * sensitivity <= 2^62 for the {mech} mechanism (its composed lattice "
                         f"is indexed in int64); got count={count}, sensitivity={sens!r}.")
      if not count * self._max_loss() <= MAX_LATTICE_LOSS:
        raise ValueError(
            f"Expected a composed privacy loss count * parameter * sensitivity <= {MAX_LATTICE_LOSS:g} for the "
            f"{mech} mechanism; got {pname}={param!r}, sensitivity={sens!r}, count={count}. Use more noise or "
            "fewer releases.")
      return
    step = self.grid_interval()
    if not step <= MAX_GRID_INTERVAL:  # also NaN / inf from an overflowing loss
      raise ValueError(
          f"Expected a privacy loss small enough for a PLD grid step <= {MAX_GRID_INTERVAL:g}; the {mech} "
          f"mechanism with {pname}={param!r}, sensitivity={sens!r}, count={count} has single-release loss "
          f"{self._max_loss():.3g} and needs a step of {step:.3g}. Use more noise or fewer releases.")

  # -- privacy loss of one release -------------------------------------------------
  def _max_loss(self) -> float:
    """Largest |privacy loss| of one release (Gaussian: at 10 sigma)."""
    if self.mechanism == "laplace":
      return self.sensitivity / self.parameter
    if self.mechanism == "discrete-laplace":
      return self.parameter * self.sensitivity
    if self.mechanism == "gaussian":
      r = self.sensitivity / self.parameter
      return r * r / 2 + 10 * r
    return self.parameter

  def _mean_loss(self) -> float:
    """KL divergence of one release (mean privacy loss), for grid sizing."""
    m = self._max_loss()
    if self.mechanism == "gaussian":
      r = self.sensitivity / self.parameter
      return r * r / 2
    # Laplace-like: KL = m - 1 + e^{-m} <= m^2 / 2.
    return m - 1 + math.exp(-m) if m > 1e-6 else m * m / 2

  def _on_lattice(self) -> bool:
    """Discrete Laplace and randomized response: every privacy loss is an integer multiple of one unit."""
    return self.mechanism in ("discrete-laplace", "randomized-response")

  def grid_interval(self) -> float:
    """Discretisation interval actually used.

    On a grid (Laplace, Gaussian): the requested one, coarsened to fit ``MAX_GRID_POINTS`` (the Gaussian's grid
    spans the loss of the one Gaussian its T releases make). For discrete
    Laplace and randomized response: the loss unit (a or eps0) times 1 + 2^-50, or for a long discrete-Laplace
    lattice finer than half the requested interval, the multiple of a coarsened to (:func:`_lattice_multiple`).
    """
    if self._on_lattice():
      return _lattice_step(self.parameter * _lattice_multiple(self))
    if self.mechanism == "gaussian":  # one Gaussian of ratio mu: its loss lies within mu^2/2 +- 10 mu
      mu = self._gaussian_mu()
      return max(self.value_discretization_interval, (mu * mu + 20 * mu) / MAX_GRID_POINTS)
    t = self.count
    m = self._max_loss()
    width = min(2 * t * m, t * self._mean_loss() + 40 * math.sqrt(t) * m + 2 * m)
    return max(self.value_discretization_interval, width / MAX_GRID_POINTS)

  def pld(self) -> pld_lib.PrivacyLossDistribution:
    """The T-fold privacy loss distribution (pessimistic)."""
    try:
      return _cached_pld(self)
    except _CompositionTooLarge as err:
      # Randomized response's lattice ignores the interval: a coarser one would not help.
      coarser = "" if self.mechanism == "randomized-response" else " or a coarser value_discretization_interval"
      raise ValueError(f"Expected a {self.mechanism} account whose composition dp-accounting can run in memory; "
                       f"parameter={self.parameter!r}, sensitivity={self.sensitivity!r} over count={self.count} "
                       f"releases at grid step {self.grid_interval():.3g} {err}; use fewer "
                       f"releases{coarser}.") from None
    except _DP_ACCOUNTING_ERRORS as err:  # belt and braces: the ranges checked at construction should hold
      raise ValueError(
          f"dp-accounting could not build the PLD of the {self.mechanism} mechanism with "
          f"parameter={self.parameter!r}, sensitivity={self.sensitivity!r}, count={self.count}, grid step "
          f"{self.grid_interval():.3g} ({_validate.describe_error(err, limit=120)}).") from None

  def dp_event(self) -> dpe.DpEvent:
    """The dp-accounting event of the T-fold mechanism.

    The event's sensitivity is the shift of one worst neighbouring pair under
    ``relation`` (2kr for a BSVS count under replace-one), so compose a
    Laplace, discrete-Laplace or Gaussian event in an accountant built with
    ``ADD_OR_REMOVE_ONE``: dp-accounting's ``REPLACE_ONE`` reads a Gaussian
    event's sensitivity as a clip norm and doubles the shift, and it refuses
    (discrete) Laplace events. A randomized-response event is the opposite:
    dp-accounting composes it only under ``REPLACE_ONE`` (its own relation).
    Its T releases come as a ``ComposedDpEvent`` of T copies, not a
    ``SelfComposedDpEvent``: dp-accounting 0.6.0's ``PLDAccountant`` ignores
    the count of a self-composed randomized-response event and would report
    the epsilon of one release.
    """
    if self.mechanism == "laplace":
      ev = dpe.LaplaceDpEvent(noise_multiplier=self.parameter / self.sensitivity)
    elif self.mechanism == "discrete-laplace":
      ev = dpe.DiscreteLaplaceDpEvent(noise_parameter=self.parameter,
                                      sensitivity=int(self.sensitivity))
    elif self.mechanism == "gaussian":
      ev = dpe.GaussianDpEvent(noise_multiplier=self.parameter / self.sensitivity)
    else:
      ev = dpe.RandomizedResponseDpEvent(noise_parameter=_rr_noise(self.parameter, self.num_buckets),
                                         num_buckets=self.num_buckets)
      if self.count > 1:
        # dp-accounting 0.6.0's PLDAccountant drops the count of a self-composed randomized-response
        # event (it composes one release): list the T releases so that every accountant counts them.
        return dpe.ComposedDpEvent([ev] * self.count)
    return ev if self.count == 1 else dpe.SelfComposedDpEvent(ev, self.count)

  def pure_epsilon(self) -> float:
    """Exact epsilon at delta = 0: T times the largest privacy loss (inf for Gaussian)."""
    if self.mechanism == "gaussian":
      return math.inf
    return float(self.count * self._max_loss())

  def epsilon(self, delta: Any) -> float:
    """Smallest epsilon (upper bound) such that the T-fold release is (eps, delta)-DP.

    At ``delta = 0`` this is the exact pure-DP epsilon (:meth:`pure_epsilon`);
    the PLD's truncated tails cannot certify delta = 0. At ``delta > 0`` it is
    the PLD's epsilon, capped at the pure epsilon: a pessimistic grid rounds
    every loss up by up to one step, so near the pure epsilon the PLD alone
    would report more than the exact bound. Past a composed loss of about 745
    (where e^-loss underflows) dp-accounting returns the lattice point above
    the exact epsilon: still an upper bound. Between about 709 and 745 its
    evaluation overflows (:func:`_pld_epsilon`); the Gaussian then returns its
    exact closed form, the others their pure epsilon.
    """
    d = _validate.probability("delta", delta)
    if d == 0.0:
      return self.pure_epsilon()
    if self.mechanism == "gaussian":
      # Never below the exact closed form: the PLD's float evaluation rounds (when the Gaussian was composed
      # T times, FFT round-off gave 25.515 against 25.671 at T = 10^5, delta = 1e-11). Elsewhere the pessimistic
      # PLD is the larger, by at most one grid step.
      exact = _gaussian_epsilon(d, self._gaussian_mu())
      return max(exact, _pld_epsilon(self.pld(), d, exact))
    allowance = self._roundoff()
    if d <= allowance:  # below the round-off allowance the PLD certifies nothing: the pure epsilon
      return self.pure_epsilon()
    return min(_pld_epsilon(self.pld(), d - allowance, math.inf), self.pure_epsilon())

  def delta(self, epsilon: Any) -> float:
    """delta (upper bound) of the T-fold release at ``epsilon`` (0 from the pure epsilon on)."""
    e = _validate.nonnegative("epsilon", epsilon)
    if e >= self.pure_epsilon():
      return 0.0
    # FFT round-off can make the PLD's delta negative or too small: it is raised by the allowance (and the
    # Gaussian's is never below its exact value). The pessimistic grid can put a hair above 1.
    d = max(float(self.pld().get_delta_for_epsilon(e)), 0.0)
    if self.mechanism == "gaussian":
      d = max(d, _gaussian_delta(e, self._gaussian_mu()))
    else:
      d += self._roundoff()
    return min(d, 1.0)

  def _roundoff(self) -> float:
    """The round-off allowance on delta: ``count * FFT_ROUNDOFF_PER_RELEASE``, one release included.

    One release is not composed, but dp-accounting's float64 evaluation of its PLD still rounds: without an
    allowance one Laplace(1) release's epsilon at delta = 1.39e-15 came out 2 ulps below the exact
    1 + 2 ln(1 - delta), where the true delta is 1.075 times the one asked for. Not applied to the Gaussian,
    whose epsilon and delta are never below its exact closed form.
    """
    return self.count * FFT_ROUNDOFF_PER_RELEASE

  def _gaussian_mu(self) -> float:
    """mu = sqrt(T) Delta / sigma: T Gaussian releases are one Gaussian of this sensitivity-to-noise ratio."""
    return math.sqrt(self.count) * (self.sensitivity / self.parameter)

  def statement(self, *, delta: Any = None, epsilon: Any = None) -> PrivacyStatement:
    """A :class:`PrivacyStatement` at the given delta (or epsilon)."""
    if (delta is None) == (epsilon is None):
      raise ValueError("Expected exactly one of delta or epsilon.")
    if delta is not None:
      d = _validate.probability("delta", delta)
      e = self.epsilon(d)
    else:
      e = _validate.nonnegative("epsilon", epsilon)
      d = self.delta(e)
    params = {"parameter": self.parameter, "sensitivity": self.sensitivity,
              "value_discretization_interval": self.grid_interval()}
    if self.num_buckets is not None:
      params["num_buckets"] = self.num_buckets
    return PrivacyStatement(mechanism=self.mechanism, relation=self.relation, epsilon=e, delta=d,
                            count=self.count, method="pld", parameters=params)


def _rr_noise(epsilon0: float, num_buckets: int | None) -> float:
  """dp-accounting's noise_parameter: with prob 1 - p keep, else uniform over K.

  ``K / (e^eps0 + K - 1)``, finite and > 0 for eps0 <= :data:`MAX_RR_EPSILON0`.
  """
  k = num_buckets
  return k / (math.exp(epsilon0) + k - 1)


#: Relative slack on the closed-form Gaussian delta (float64 log-space evaluation; far below any PLD step).
_GAUSSIAN_SLACK = 1e-9


def _pld_epsilon(pld: pld_lib.PrivacyLossDistribution, delta: float, overflow: float) -> float:
  """``pld.get_epsilon_for_delta(delta)``, or ``overflow`` where dp-accounting's evaluation overflows.

  It accumulates mass_lower = sum of p e^-loss from the largest loss down and stops where
  ln((mass_upper - delta) / mass_lower) >= loss. Where mass_lower is subnormal (a loss between about 709 and 745)
  the ratio overflows: it returned inf with NumPy's "overflow encountered in scalar divide" (a Gaussian of
  sigma 7.45e-3, sensitivity 0.04, 48 releases: inf at delta = 1/6 where the exact epsilon is 726, and 745 and
  709 at sigma 1.3% either side).
  """
  try:
    with np.errstate(over="raise"):
      return float(pld.get_epsilon_for_delta(delta))
  except FloatingPointError:
    return overflow


def _gaussian_delta(epsilon: float, mu: float) -> float:
  """Exact delta(eps) of a Gaussian with sensitivity/sigma = mu (Balle & Wang 2018, Theorem 8), rounded up.

  .. math:: \\delta = \\Phi(\\mu/2 - \\varepsilon/\\mu) - e^{\\varepsilon}\\,\\Phi(-\\mu/2 - \\varepsilon/\\mu),

  in log space: log Phi by ``scipy.special.log_ndtr`` and the difference by ``expm1``.
  """
  a = float(special.log_ndtr(mu / 2 - epsilon / mu))
  b = epsilon + float(special.log_ndtr(-mu / 2 - epsilon / mu))
  if a == -math.inf:
    return 0.0
  # delta = e^a (1 - e^-(a - b)) grows with a - b, and a and b carry a few ulps of error each (log_ndtr, the
  # sum with eps), which matters where the two terms nearly cancel: a - b is raised by that much.
  gap = max(a - b, 0.0) + 64 * 2.0**-53 * (abs(a) + abs(b))
  return min(1.0, math.exp(a) * -math.expm1(-gap) * (1 + _GAUSSIAN_SLACK))


def _exact_gaussian_sigma(epsilon: float, delta: float, scale: float) -> tuple[float, float]:
  """(below, sigma): the least sigma whose Gaussian of ratio ``scale`` / sigma meets (eps, delta) by
  :func:`_gaussian_delta`, to adjacent floats of mu, and a sigma just below it that does not meet it."""
  lo, hi = 0.0, 1.0  # mu: delta(lo) <= delta < delta(hi)
  for _ in range(2100):
    if _gaussian_delta(epsilon, hi) > delta:
      break
    lo, hi = hi, 2 * hi
  for _ in range(2200):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    lo, hi = (mid, hi) if _gaussian_delta(epsilon, mid) <= delta else (lo, mid)
  return scale / hi, scale / lo


def _exact_laplace_scale(epsilon: float, delta: float, sensitivity: float) -> tuple[float, float]:
  """(below, b): the least Laplace scale b whose ONE release meets (eps, delta) > 0, and a b just below it.

  Laplace's tight curve (the privacy loss of Lap(0, b) against Lap(Delta, b), eps0 = Delta / b) is
  delta(eps) = 1 - e^{(eps - eps0) / 2} for eps <= eps0, so the least scale is
  b = Delta / (eps - 2 ln(1 - delta)). ``below`` is 1e-9 smaller: its exact epsilon exceeds eps, and the PLD's
  epsilon is never below the exact one, so it fails without a PLD.
  """
  b = sensitivity / (epsilon - 2.0 * math.log1p(-delta))
  return b * (1.0 - 1e-9), b


def _gaussian_epsilon(delta: float, mu: float) -> float:
  """Least eps >= 0 (rounded up) with :func:`_gaussian_delta` (eps, mu) <= delta; bisection."""
  if _gaussian_delta(0.0, mu) <= delta:
    return 0.0
  lo, hi = 0.0, max(1.0, mu * mu)
  while _gaussian_delta(hi, mu) > delta:
    lo, hi = hi, 2 * hi
  for _ in range(200):  # invariant: delta(lo) > delta >= delta(hi)
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    lo, hi = (lo, mid) if _gaussian_delta(mid, mu) <= delta else (mid, hi)
  return hi


def _self_compose(single: pld_lib.PrivacyLossDistribution, count: int) -> pld_lib.PrivacyLossDistribution:
  """``single.self_compose(count)``, without dp-accounting's two failure modes at large counts.

  dp-accounting sizes a sparse PMF's composition as ``size ** count`` in Python integers (44 ** 10^8 never
  finished) and picks its FFT length from its own tail bound, which can exceed memory. Here a PMF whose
  sparse composition dp-accounting would do (size ** count <= 1000) goes its way unchanged; any other is made
  dense first (what dp-accounting does next anyway), and an FFT longer than :data:`MAX_FFT_POINTS` is refused.

  dp-accounting's tail bound (a Chernoff bound through ``scipy.special.logsumexp``) divides by the PMF's
  probability at one end, which overflows where that is subnormal; dp-accounting then skips that order, as it
  should, but NumPy printed "overflow encountered in divide" 80 times (a multi-message noise of p = 1e-300 and
  k = 2: its finite losses lie between 2,747 and 2,762). Overflow is silenced here: the composition itself
  convolves probabilities, which cannot overflow.
  """
  with np.errstate(over="ignore"):
    # pylint: disable=protected-access
    remove, add = single._pmf_remove, single._pmf_add
    if all(isinstance(p, pld_pmf.SparsePLDPmf) and count * math.log(max(p.size, 2)) <= math.log(1000)
           for p in (remove, add)):
      return single.self_compose(count)
    dense = {id(p): p.to_dense_pmf() for p in (remove, add)}
    for p in dense.values():
      low, high = pld_common.compute_self_convolve_bounds(p._probs, count, _TAIL_MASS_TRUNCATION)
      if high - low + 1 > MAX_FFT_POINTS:
        raise _CompositionTooLarge(
            f"need an FFT of {high - low + 1:.3g} points (> MAX_FFT_POINTS = {MAX_FFT_POINTS})")
    composed = pld_lib.PrivacyLossDistribution(dense[id(remove)], None if add is remove else dense[id(add)])
    return composed.self_compose(count, tail_mass_truncation=_TAIL_MASS_TRUNCATION)


class _CompositionTooLarge(ValueError):
  """A self-composition whose FFT would exceed :data:`MAX_FFT_POINTS` (reworded by ``MechanismAccount.pld``)."""


#: dp-accounting's default tail truncation of a self-composition.
_TAIL_MASS_TRUNCATION = 1e-15


def _lattice_step(unit: float) -> float:
  """The lattice step for loss unit ``unit``: nudged up so that ``index * step >= index * unit`` in float64.

  A product of floats is rounded to nearest (relative error <= 2^-53), so a step ``2^-50`` above the unit
  keeps every positive lattice loss at or above its exact value: the PLD stays an upper bound.
  """
  return unit * (1.0 + 2.0**-50)


def _lattice_pld(log_probs: np.ndarray, lower: int, unit: float, infinity_mass: float = 0.0,
                 multiple: int = 1) -> pld_lib.PrivacyLossDistribution:
  """A symmetric PLD whose loss ``(lower + i) * unit`` has probability ``exp(log_probs[i])``; exact, no rounding.

  Symmetric: discrete Laplace (z -> Delta - z), randomized response (swap x and x') and the dominating
  pair of an (eps, delta)-DP mechanism map one neighbouring direction onto the other, so one PMF serves
  both. ``infinity_mass`` is the probability of an infinite loss (delta, for the dominating pair). With
  ``multiple`` m > 1, each loss index i is rounded up to m·ceil(i / m) and the PMF lives on the coarser
  lattice m·unit (pessimistic: no loss goes down).
  """
  probs = np.exp(log_probs)
  if multiple > 1:
    index = -((-(lower + np.arange(probs.size))) // multiple)  # ceil((lower + i) / m)
    lower, unit = int(index[0]), unit * multiple
    probs = np.bincount(index - lower, weights=probs)
  pmf = pld_pmf.DensePLDPmf(discretization=_lattice_step(unit), lower_loss=lower, probs=probs,
                            infinity_mass=infinity_mass, pessimistic_estimate=True)
  return pld_lib.PrivacyLossDistribution(pmf)


def _rr_single(acct: MechanismAccount) -> pld_lib.PrivacyLossDistribution:
  """One K-ary randomized response's exact PLD, on the lattice eps0·{-1, 0, 1}.

  For neighbouring inputs x != x', the output under x is x (loss +eps0) with probability
  a = e^eps0 / (e^eps0 + K - 1), x' (loss -eps0) with b = 1 / (e^eps0 + K - 1), and one of the K - 2
  others (loss 0) with (K - 2) b. The probabilities come from log-probabilities (dp-accounting's
  ``from_randomized_response`` forms 1 - p + p/K with cancellation near p = 1: K = 10^12 gave an epsilon
  7e-4 too small, relative), and the losses sit exactly on the lattice (its grid rounded eps0 = 0.01 up to
  101 steps of 1e-4, and the T-fold epsilon drifted: 146.2 against the exact 96.7 at T = 10^6).
  """
  k = acct.num_buckets
  log_z = float(np.logaddexp(acct.parameter, math.log(k - 1)))
  log_rest = math.log(k - 2) - log_z if k > 2 else -math.inf
  return _lattice_pld(np.array([-log_z, log_rest, acct.parameter - log_z]), -1, acct.parameter)


def _discrete_laplace_single(acct: MechanismAccount) -> pld_lib.PrivacyLossDistribution:
  """One discrete Laplace's PLD for a shift of Delta, on the lattice a·{-Delta, ..., Delta}.

  With P the noise pmf tanh(a/2) e^{-a|z|} and Q its shift by Delta, the loss at z is
  a(|z - Delta| - |z|): +a Delta for z <= 0 (probability 1/(1 + e^-a)), -a Delta for z >= Delta
  (e^{-a Delta}/(1 + e^-a)), and a(Delta - 2z) for 0 < z < Delta (tanh(a/2) e^{-az}). The far tail
  z > z_cut, of probability e^{-a(z_cut + 1)}/(1 + e^-a) <= ``_LATTICE_TAIL``, is moved up to z_cut's loss
  (pessimistic: delta grows by at most that mass per release), so the PMF has at most
  2 min(Delta, ln(1/_LATTICE_TAIL)/a) + 1 points, not 2 Delta + 1 (a = 0.5, Delta = 10^7: 93, not 2e7).
  """
  a, delta = acct.parameter, int(acct.sensitivity)
  log_den = float(np.logaddexp(0.0, -a))  # log(1 + e^-a)
  z_cut = _discrete_laplace_cut(a, delta)
  lower = delta - 2 * z_cut  # the lowest loss index kept
  log_probs = np.full(delta - lower + 1, -np.inf)
  log_probs[-1] = -log_den  # z <= 0: loss +a Delta
  if z_cut == delta:  # nothing cut: z >= Delta has loss -a Delta
    log_probs[0] = -a * delta - log_den
    z = np.arange(1, delta)
  else:  # z >= z_cut (tail included) sits at z_cut's loss; its mass is e^{-a z_cut}/(1 + e^-a)
    if z_cut > 0:
      log_probs[0] = -a * z_cut - log_den
    else:  # everything beyond z <= 0 moves up to +a Delta
      log_probs[-1] = 0.0
    z = np.arange(1, z_cut)
  if z.size:
    log_probs[delta - 2 * z - lower] = math.log(math.tanh(a / 2)) - a * z
  return _lattice_pld(log_probs, lower, a, multiple=_lattice_multiple(acct))


def _discrete_laplace_cut(a: float, delta: int) -> int:
  """z_cut: the least z whose tail beyond, e^{-a(z + 1)}/(1 + e^-a), is at most ``_LATTICE_TAIL`` (at most Delta)."""
  log_den = float(np.logaddexp(0.0, -a))
  z = (-math.log(_LATTICE_TAIL) - log_den) / a
  if not z < delta + 1:  # at a = 1e-308 the quotient is inf, which ceil refused (OverflowError)
    return delta
  return min(delta, max(0, math.ceil(z) - 1))


def _lattice_multiple(acct: MechanismAccount) -> int:
  """m such that the PLD lives on the lattice m·(loss unit): 1 (exact) unless the lattice is long and fine.

  A discrete Laplace PMF has 2 z_cut + 1 points, up to 2 Delta + 1 (2e7 for a = 1e-7, Delta = 10^7: its 10-fold
  composition was refused after 22 s, where a grid of step 1e-4 needs 2e4 points). Past
  ``_LATTICE_EXACT_POINTS`` points and below half the requested interval, the unit is multiplied by
  m = floor(interval / unit), so the coarse step m·unit lies in (interval / 2, interval].
  """
  if acct.mechanism != "discrete-laplace":
    return 1
  a, vdi = acct.parameter, acct.value_discretization_interval
  if 2 * _discrete_laplace_cut(a, int(acct.sensitivity)) + 1 <= _LATTICE_EXACT_POINTS or 2 * a > vdi:
    return 1
  return max(1, math.floor(vdi / a))


#: Largest probability a discrete-Laplace lattice PMF moves up from its far tail (per release).
_LATTICE_TAIL = 1e-30
#: Longest discrete-Laplace lattice PMF kept exact when its unit is below half the requested interval.
_LATTICE_EXACT_POINTS = 4097


@functools.lru_cache(maxsize=256)
def _cached_pld(acct: MechanismAccount) -> pld_lib.PrivacyLossDistribution:
  vdi = acct.grid_interval()
  if acct.mechanism == "laplace":
    single = pld_lib.from_laplace_mechanism(acct.parameter, sensitivity=acct.sensitivity,
                                            value_discretization_interval=vdi)
  elif acct.mechanism == "discrete-laplace":
    single = _discrete_laplace_single(acct)
  elif acct.mechanism == "gaussian":
    # T releases are one Gaussian of ratio mu = sqrt(T) Delta / sigma (their losses add to N(mu^2/2, mu^2)):
    # built once, never composed, so the grid's rounding is paid once, not T times. ``sensitivity`` is already
    # the shift under ``relation``: dp-accounting's REPLACE_ONE would shift by twice its sensitivity (a clip
    # norm), and for a single Gaussian its add and remove PLDs agree.
    return pld_lib.from_gaussian_mechanism(1.0, sensitivity=acct._gaussian_mu(),  # pylint: disable=protected-access
                                           value_discretization_interval=vdi,
                                           neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
  else:
    single = _rr_single(acct)
  return single if acct.count == 1 else _self_compose(single, acct.count)


def _check_vdi(vdi: Any) -> float:
  vdi = _validate.positive("value_discretization_interval", vdi)
  if vdi > MAX_GRID_INTERVAL:
    raise ValueError(f"Expected value_discretization_interval={vdi!r} <= {MAX_GRID_INTERVAL:g} (dp-accounting's "
                     "PLD overflows from a step of about 709.8).")
  return vdi


def _common(relation: Any, count: Any, vdi: Any) -> tuple[Relation, int, float]:
  rel = Relation.parse(relation)
  count = _validate.integer("count", count, minimum=1, maximum=MAX_COUNT)
  vdi = _check_vdi(vdi)
  return rel, count, vdi


def laplace(scale: Any, *, sensitivity: Any, relation: Any, count: Any = 1,
            value_discretization_interval: Any = 1e-4) -> MechanismAccount:
  """Laplace mechanism f(D) + Lap(b), T-fold.

  .. math:: \\text{pure DP: } \\varepsilon = T\\Delta_1 / b; \\quad
            \\text{PLD gives the tight } \\delta(\\varepsilon).

  Args:
    scale: b > 0.
    sensitivity: L1 sensitivity Delta_1 > 0 under ``relation``.
    relation: neighbouring relation (recorded; it fixes what Delta_1 means).
    count: T >= 1 releases.
    value_discretization_interval: PLD grid step.

  References:
    Dwork, McSherry, Nissim, Smith (2006); Koskela et al. / Doroshenko et al.
    "Connect the Dots" (2022) for the PLD.
  """
  rel, count, vdi = _common(relation, count, value_discretization_interval)
  return MechanismAccount("laplace", _validate.positive("scale", scale),
                          _validate.positive("sensitivity", sensitivity), rel, count, None, vdi)


def discrete_laplace(parameter: Any, *, sensitivity: Any, relation: Any, count: Any = 1,
                     value_discretization_interval: Any = 1e-4) -> MechanismAccount:
  """Discrete Laplace (two-sided geometric) f(D) + Z, Pr[Z=z] ∝ exp(-a|z|), T-fold.

  .. math:: \\text{pure DP: } \\varepsilon = T a \\Delta_1.

  Args:
    parameter: a > 0.
    sensitivity: integer L1 sensitivity under ``relation``.
    relation: neighbouring relation.
    count: T >= 1.
    value_discretization_interval: used only when the lattice a·Z is finer than half of it and longer than
      ``_LATTICE_EXACT_POINTS`` points (Delta in the thousands, a tiny): then losses are rounded up to the
      lattice m·a with m = floor(interval / a). Otherwise unused: the PLD is exact on a·Z.
  """
  rel, count, vdi = _common(relation, count, value_discretization_interval)
  sens = _validate.integer("sensitivity", sensitivity, minimum=1, maximum=MAX_DISCRETE_SENSITIVITY)
  return MechanismAccount("discrete-laplace", _validate.positive("parameter", parameter), sens,
                          rel, count, None, vdi)


def gaussian(sigma: Any, *, sensitivity: Any, relation: Any, count: Any = 1,
             value_discretization_interval: Any = 1e-4) -> MechanismAccount:
  """Gaussian mechanism f(D) + N(0, sigma^2 I), T-fold.

  T-fold composition equals one Gaussian with sigma / sqrt(T): the analytic
  Gaussian of Balle & Wang 2018 (Theorem 8) gives delta(eps) in closed form,
  and the account reports the larger of it and the PLD's value, the PLD of
  that one Gaussian on a pessimistic grid (one step of rounding, however
  large T).

  Args:
    sigma: noise standard deviation > 0.
    sensitivity: L2 sensitivity Delta_2 > 0 under ``relation``.
    relation: neighbouring relation.
    count: T >= 1.
    value_discretization_interval: PLD grid step.
  """
  rel, count, vdi = _common(relation, count, value_discretization_interval)
  return MechanismAccount("gaussian", _validate.positive("sigma", sigma),
                          _validate.positive("sensitivity", sensitivity), rel, count, None, vdi)


def randomized_response(epsilon0: Any, *, num_buckets: Any, relation: Any = Relation.REPLACE_ONE,
                        count: Any = 1, value_discretization_interval: Any = 1e-4) -> MechanismAccount:
  """K-ary randomized response: keep the input w.p. e^eps0/(e^eps0 + K - 1), T-fold.

  Each release is eps0-LDP for any two inputs, so the relation is
  replace-one (a local randomizer has no add/remove neighbour).

  Args:
    epsilon0: local epsilon > 0 of one release.
    num_buckets: K >= 2.
    relation: must be replace-one.
    count: T >= 1 (e.g. the d bits of a flattened BSVS vector).
    value_discretization_interval: validated, not used (the PLD is exact on the lattice eps0·Z).

  Raises:
    ValueError: for any relation other than replace-one, or ``epsilon0``
      above :data:`MAX_RR_EPSILON0`.
  """
  rel, count, vdi = _common(relation, count, value_discretization_interval)
  if rel is not Relation.REPLACE_ONE:
    raise ValueError(f"Expected relation=replace-one for randomized response (a local randomizer); got {rel.value}.")
  k = _validate.integer("num_buckets", num_buckets, minimum=2)
  eps0 = _validate.positive("epsilon0", epsilon0)
  if eps0 > MAX_RR_EPSILON0:
    raise ValueError(f"Expected epsilon0={eps0!r} <= {MAX_RR_EPSILON0:g} (e^eps0 overflows float64 from ~709.8).")
  return MechanismAccount("randomized-response", eps0, 1.0, rel, count, k, vdi)


def _factory(mechanism: str, parameter: float, sensitivity: Any, relation: Relation, count: int,
             num_buckets: Any, vdi: float) -> MechanismAccount:
  if mechanism == "laplace":
    return laplace(parameter, sensitivity=sensitivity, relation=relation, count=count,
                   value_discretization_interval=vdi)
  if mechanism == "discrete-laplace":
    return discrete_laplace(parameter, sensitivity=sensitivity, relation=relation, count=count,
                            value_discretization_interval=vdi)
  if mechanism == "gaussian":
    return gaussian(parameter, sensitivity=sensitivity, relation=relation, count=count,
                    value_discretization_interval=vdi)
  return randomized_response(parameter, num_buckets=num_buckets, relation=relation, count=count,
                             value_discretization_interval=vdi)


def calibrate(mechanism: str, *, target_epsilon: Any, target_delta: Any, relation: Any,
              sensitivity: Any = 1, count: Any = 1, num_buckets: Any = None,
              rtol: float = 1e-3, value_discretization_interval: Any = 1e-4) -> MechanismAccount:
  """Least noise such that T releases meet (target_epsilon, target_delta).

  The search is a bisection in log-space over an explicit bracket
  ``[lo, hi]`` derived in closed form, so it never asks dp-accounting for a
  PLD wider than :data:`MAX_GRID_POINTS`:

  * pure DP: ``hi`` is private by construction (Laplace b = T Delta/eps,
    discrete Laplace a = eps/(T Delta), RR eps0 = eps/T) and is verified
    with the accountant; ``lo`` moves down (up for a, eps0) by factors of 4
    until the accountant says it is *not* private enough;
  * Gaussian: ``lo`` is just below the exact least sigma of Balle & Wang's
    closed form (Theorem 8), which the accountant's epsilon is never below,
    so it needs no PLD; ``hi`` is the first of that sigma times 1 + rtol/16,
    1 + rtol/4, 1 + rtol, 1.01, 1.05, 1.25, 2 that the accountant verifies
    (usually the first: one PLD instead of about 14). One Laplace release
    with delta > 0 starts the same way from its exact least scale,
    b = Delta / (eps - 2 ln(1 - delta)).

  The returned account is the verified end of the final bracket: its
  epsilon at ``target_delta`` is <= ``target_epsilon``.

  Args:
    mechanism: ``laplace``, ``discrete-laplace``, ``gaussian`` or
      ``randomized-response``.
    target_epsilon: > 0.
    target_delta: in (0, 1) (0 allowed for the pure-DP mechanisms).
    relation: neighbouring relation.
    sensitivity: sensitivity under ``relation``; for RR only the default 1
      (its loss is eps0 whatever the change).
    count: T >= 1.
    num_buckets: K for randomized response (None for the others).
    rtol: relative width of the final bracket, in (0, 0.1].
    value_discretization_interval: PLD grid step.

  Returns:
    The calibrated :class:`MechanismAccount` (its ``parameter`` is the noise).

  Raises:
    ValueError: on bad arguments, or when no noise level in the search range
      meets the target (e.g. randomized response needs more than the target
      allows), or a randomized-response target above T times
      :data:`MAX_RR_EPSILON0`. A randomized-response search stops at eps0 =
      :data:`MAX_RR_EPSILON0` and returns it if it already meets the target.
  """
  mech = _validate.choice("mechanism", mechanism, _MECHANISMS)
  eps = _validate.positive("target_epsilon", target_epsilon)
  delta = _validate.probability("target_delta", target_delta)
  if delta >= 1.0:
    raise ValueError(f"Expected target_delta={delta!r} < 1.")
  if mech == "gaussian" and delta <= 0:
    raise ValueError(f"Expected target_delta={delta!r} > 0 for the Gaussian mechanism.")
  rel, count, vdi = _common(relation, count, value_discretization_interval)
  rtol = _validate.relative_tolerance("rtol", rtol)
  # Each reads only its own: RR's loss is fixed by eps0 and K whatever the data's change (sensitivity=3 returned
  # the sensitivity-1 eps0), and K is RR's alone (MechanismAccount refuses it for the others).
  sens = _validate.positive("sensitivity", sensitivity)
  if mech == "randomized-response" and sens != 1:
    raise ValueError(f"Expected sensitivity=1 (the default) for randomized-response, whose privacy loss eps0 "
                     f"does not scale with a sensitivity; got sensitivity={sens!r}.")
  if mech != "randomized-response" and num_buckets is not None:
    raise ValueError(f"Expected num_buckets=None for the {mech} mechanism (only randomized-response reads it); "
                     f"got num_buckets={num_buckets!r}.")
  if mech == "gaussian" and not GAUSSIAN_SCALE_RANGE[0] <= sens <= GAUSSIAN_SCALE_RANGE[1]:
    # Checked by its own name: the check below, at sigma = sensitivity, named the sigma (not a parameter here).
    raise ValueError(f"Expected sensitivity={sens!r} in [{GAUSSIAN_SCALE_RANGE[0]:g}, {GAUSSIAN_SCALE_RANGE[1]:g}] "
                     "for the Gaussian mechanism (dp-accounting squares it).")
  # What the noise does not change (an integer sensitivity within its cap, num_buckets, the relation RR takes) is
  # checked here, at a noise of loss 1 per release, so it is refused by its own name, not as a "starting noise
  # outside what the accounting supports".
  benign = {"laplace": sens, "discrete-laplace": 1.0 / sens, "gaussian": sens, "randomized-response": 1.0}[mech]
  _factory(mech, benign, sensitivity, rel, 1, num_buckets, vdi)

  # "noise" grows with privacy for b and sigma, shrinks for a and eps0.
  increasing = mech in ("laplace", "gaussian")
  if mech == "laplace":
    safe = count * sens / eps
  elif mech == "discrete-laplace":
    safe = eps / (count * sens)
  elif mech == "gaussian":
    try:
      # At huge eps it fails (caught here) or gives a sigma that start() refuses: NumPy's warnings on the way are noise.
      with np.errstate(all="ignore"):
        safe = 1.05 * math.sqrt(count) * sens * dp_accounting.get_sigma_gaussian(eps, delta)
    except _DP_ACCOUNTING_ERRORS as err:
      raise ValueError(f"Could not calibrate the Gaussian at target_epsilon={eps!r}, target_delta={delta!r}: "
                       f"dp-accounting's analytic sigma fails ({_validate.describe_error(err, limit=80)}).") from None
  else:
    safe = eps / count

  cap = MAX_RR_EPSILON0 if mech == "randomized-response" else math.inf
  if safe > cap:
    raise ValueError(f"Expected target_epsilon={eps!r} <= {cap * count:g} for randomized response with "
                     f"count={count} (eps0 is at most {cap:g}).")

  def ok(x: float) -> bool:
    try:
      acct = _factory(mech, x, sens, rel, count, num_buckets, vdi)
    except ValueError:
      # Outside the range the accounting supports (see MechanismAccount): never verified, so never returned.
      # The calls on ``safe`` below go through ``start`` instead, which names the target.
      return False
    return acct.epsilon(delta) <= eps

  def start(x: float) -> MechanismAccount:
    try:
      return _factory(mech, x, sens, rel, count, num_buckets, vdi)
    except ValueError as err:
      raise ValueError(f"Could not calibrate {mech} at target_epsilon={eps!r}, target_delta={delta!r}, "
                       f"count={count}: its starting noise {x!r} is outside what the accounting supports "
                       f"({_validate.first_line(err)})") from None

  # Floating point may put T * (pure loss) an ulp above eps: step the pure-DP end towards more noise. (For the
  # Gaussian, start() only checks that the analytic sigma is in the supported range, by name: the search
  # below starts from the exact closed form.)
  for _ in range(8):
    if start(safe).pure_epsilon() <= eps or mech == "gaussian":
      break
    safe = math.nextafter(safe, math.inf if increasing else 0.0)

  unverified = ValueError(
      f"Could not verify a private starting point for {mech} at target_epsilon={eps!r}, target_delta={delta!r}: "
      "dp-accounting's PLD (its tail truncation) certifies no delta this small (measured for the Gaussian at "
      "epsilon 1: 1e-23 works, 1e-25 does not), nor at this delta an epsilon this small (FedMD-LDP's calibration: "
      "3e-8 at delta 1e-5 does not work); ask for a larger target_delta or target_epsilon.")
  if mech == "gaussian" or (mech == "laplace" and count == 1 and delta > 0):
    # The exact least sigma (Balle & Wang's closed form) is a lower end that needs no PLD: the account's epsilon
    # is never below the closed form, so any smaller sigma fails. The PLD (one build per check: about 10 s at
    # mu = 20, where a bracket from 0.25 x the analytic sigma took 14 builds) then checks a few upper ends.
    # One Laplace release has a closed form too (about 11 builds of up to 16 s each: 235 s at eps = 1000).
    if mech == "gaussian":
      lo, hi = _exact_gaussian_sigma(eps, delta, math.sqrt(count) * sens)
    else:
      lo, hi = _exact_laplace_scale(eps, delta, sens)
    factors = (1 + rtol / 16, 1 + rtol / 4, 1 + rtol, 1.01, 1.05, 1.25, 2.0)
    for i, factor in enumerate(factors):
      # Once the first fails, the largest is tried: if it fails too none will (more noise, less loss), and the
      # refusal comes after 2 PLD builds instead of 7 (140 s for FedMD-LDP at epsilon 5e-324, delta 1e-5).
      if i == 1 and not ok(hi * factors[-1]):
        raise unverified
      if ok(hi * factor):
        hi *= factor
        break
      lo = hi * factor
    else:
      raise unverified
  else:
    if not ok(safe):  # private by construction; kept as a check
      raise unverified
    step = 0.25 if increasing else 4.0
    hi, lo = safe, min(safe * step, cap)
    for _ in range(60):
      if not ok(lo):
        break
      if lo >= cap:  # the largest supported eps0 already meets the target
        return _factory(mech, cap, sens, rel, count, num_buckets, vdi)
      hi, lo = lo, min(lo * step, cap)
    else:
      raise ValueError(f"Could not bracket the {mech} noise for target_epsilon={eps}, target_delta={delta}.")
  # Bisection in log space; ``hi`` is always the verified private end.
  for _ in range(200):
    if abs(math.log(hi / lo)) <= math.log1p(rtol):
      break
    mid = math.sqrt(hi * lo)
    if ok(mid):
      hi = mid
    else:
      lo = mid
  return _factory(mech, hi, sens, rel, count, num_buckets, vdi)
