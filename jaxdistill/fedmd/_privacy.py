"""Privacy of FedMD-LDP (Gaussian noise on every release), matched to NFDP's delta.

FedMD-LDP adds ``N(0, sigma^2 I)`` to each of a party's ``T = Q x R``
released prediction vectors (Q public queries per round, R rounds). One
release has L2 sensitivity Delta = the diameter of the release range
(:func:`jaxdistill.fedmd.release_sensitivity`), valid for every
neighbouring relation; T Gaussian releases compose to one Gaussian with
noise ``sigma / sqrt(T)``:

.. math::

   \\delta_T(\\varepsilon) = \\Phi\\Big(\\frac{\\Delta}{2 s} - \\frac{\\varepsilon s}{\\Delta}\\Big)
      - e^{\\varepsilon}\\,\\Phi\\Big(-\\frac{\\Delta}{2 s} - \\frac{\\varepsilon s}{\\Delta}\\Big),
   \\qquad s = \\sigma / \\sqrt{T}

(the analytic Gaussian mechanism). The sigma used in a run comes from
``accounting.calibrate("gaussian", ...)`` (dp-accounting PLD); the tests check
it against this closed form.

What "matched to NFDP" means. NFDP's profile is flat, delta(eps) = p for all
eps >= 0, while the Gaussian's delta(eps) falls to 0 as eps grows. No single
(eps, delta) pair compares them, so we report, at NFDP's delta = p, the sigma
needed for several eps, plus eps = 0: the sigma whose Gaussian profile lies
below p at *every* eps >= 0, i.e. the least noise with which FedMD-LDP is at
least as private as NFDP in the profile sense:

.. math::

   \\delta_T(0) = 2\\Phi\\big(\\tfrac{\\Delta}{2s}\\big) - 1 = p
   \\iff s = \\frac{\\Delta}{2\\,\\Phi^{-1}((1 + p)/2)}.

References:
  Balle & Wang, "Improving the Gaussian Mechanism for Differential Privacy",
  ICML 2018, Theorem 8. https://arxiv.org/abs/1805.06530
  Sun & Lyu 2021, §5 (FedMD-LDP baseline). https://arxiv.org/abs/2009.05537
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Sequence

from scipy import special
from scipy import stats

from jaxdistill import _validate
from jaxdistill import accounting

__all__ = ["analytic_gaussian_delta", "gaussian_sigma_for_flat_delta", "ldp_sigma_table",
           "calibrate_ldp_sigma", "DEFAULT_LDP_EPSILONS", "MAX_LDP_EPSILON", "MAX_LDP_COUNT",
           "MAX_LDP_TABLE_ROWS"]

DEFAULT_LDP_EPSILONS = (0.0, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0)

#: The largest epsilon :func:`calibrate_ldp_sigma` takes. Measured on 2 busy cores (sensitivity 2): at 500 the
#: sigma it returns meets delta exactly (Balle & Wang's closed form: 9.9e-6 for 1e-5), in 5 s for 100,000
#: releases, 20 s for 50 and 5 min for 1 at delta 1e-14 (1.5 min at epsilon 100); near 700 dp-accounting prints
#: overflow warnings, and near 800 it overflows. (It was 100, which refused sweeps that calibrate fine.)
MAX_LDP_EPSILON = 500.0


#: Most releases T = Q x R of the closed forms here (the bound NFDP's accounting puts on its counts). A count of
#: 10^400 was an OverflowError in sqrt(T); the PLD calibration (epsilon > 0) allows at most 10^12.
MAX_LDP_COUNT = 10**18

#: Most epsilons (rows) of one :func:`ldp_sigma_table`: each epsilon > 0 is a PLD calibration of seconds to
#: minutes, and an endless iterable was read for ever.
MAX_LDP_TABLE_ROWS = 100


def check_ldp_epsilon(name: str, value: Any, *, allow_zero: bool = False) -> float:
  """``value`` as a float in (0, MAX_LDP_EPSILON] ([0, ...] with ``allow_zero``), or a ValueError naming ``name``."""
  eps = (_validate.nonnegative if allow_zero else _validate.positive)(name, value)
  if eps > MAX_LDP_EPSILON:
    raise ValueError(f"Expected {name}={eps!r} <= {MAX_LDP_EPSILON:g}, the largest epsilon the Gaussian's PLD "
                     "calibration is checked at (dp-accounting's arithmetic overflows near 700-800).")
  return eps


def analytic_gaussian_delta(epsilon: Any, *, sigma: Any, sensitivity: Any, count: Any = 1) -> float:
  """Exact delta(eps) of ``count`` Gaussian releases (Balle & Wang 2018, Thm 8), float64."""
  eps = _validate.nonnegative("epsilon", epsilon)
  sigma = _validate.positive("sigma", sigma)
  delta_2 = _validate.positive("sensitivity", sensitivity)
  count = _validate.integer("count", count, minimum=1, maximum=MAX_LDP_COUNT)
  s = sigma / math.sqrt(count)
  a = delta_2 / (2 * s)
  b = eps * s / delta_2
  if eps == 0:  # Phi(a) - Phi(-a) = erf(a / sqrt 2), without the cancellation below delta ~ 1e-15
    return float(special.erf(a / math.sqrt(2)))
  # e^eps Phi(-a - b) computed in log space to stay finite at large eps.
  tail = math.exp(eps + stats.norm.logcdf(-a - b))
  return float(max(0.0, stats.norm.cdf(a - b) - tail))


def gaussian_sigma_for_flat_delta(delta: Any, *, sensitivity: Any, count: Any = 1) -> float:
  """Least sigma with delta_T(eps) <= delta for *every* eps >= 0 (i.e. at eps = 0).

  .. math:: \\delta_T(0) = 2\\Phi(\\Delta / 2s) - 1 = \\mathrm{erf}(\\Delta / (2\\sqrt2 s)) \\le \\delta
            \\iff s \\ge \\frac{\\Delta}{2\\sqrt2\\,\\mathrm{erf}^{-1}(\\delta)},\\quad \\sigma = s\\sqrt{T}

  (``erfinv``, not ``ppf((1 + delta) / 2)``: below delta ~ 1e-15 the sum
  1 + delta rounds, which gave a sigma up to 46% too small, or inf).

  Raises:
    ValueError: ``delta`` not in (0, 1), ``sensitivity`` not a finite number
      > 0, ``count`` not an integer in [1, ``MAX_LDP_COUNT``], or a sigma
      beyond float64 (sensitivity 1e308 gave inf, a tiny one 0).
  """
  d = _validate.open_unit("delta", delta)
  delta_2 = _validate.positive("sensitivity", sensitivity)
  count = _validate.integer("count", count, minimum=1, maximum=MAX_LDP_COUNT)
  s = delta_2 / (2 * math.sqrt(2) * float(special.erfinv(d)))  # Python floats: inf, not a NumPy warning
  sigma = float(s * math.sqrt(count))
  if not 0.0 < sigma < math.inf:
    raise ValueError(f"Expected sensitivity={delta_2!r}, delta={d!r} and count={count} to give a sigma within "
                     f"float64's range; it is {sigma!r}.")
  return sigma


def calibrate_ldp_sigma(epsilon: Any, delta: Any, *, sensitivity: Any, count: Any,
                        relation: Any = accounting.Relation.ADD_OR_REMOVE) -> float:
  """Least sigma per release with T Gaussian releases (eps, delta)-DP (dp-accounting PLD).

  The PLD grid step is at most eps/1000: at small eps the default 1e-4 step
  is so pessimistic that no sigma verifies. ``epsilon`` is in
  (0, :data:`MAX_LDP_EPSILON`]; dp-accounting certifies ``delta`` down to
  about 1e-14, and a smaller one is refused with a ValueError saying so.
  There is no fixed floor on epsilon: far below delta the PLD certifies no
  sigma and that ValueError names target_epsilon and target_delta (measured:
  epsilon 3e-8 at delta 1e-5, 1e-9 at delta 1e-8; two PLD builds, about 35 s at
  epsilon 5e-324),
  while at delta 0.5 even epsilon 5e-324 calibrates, to 1.00006 times
  :func:`gaussian_sigma_for_flat_delta`'s sigma (private at every epsilon).
  """
  eps = check_ldp_epsilon("epsilon", epsilon)
  d = _validate.open_unit("delta", delta)
  sens = _validate.positive("sensitivity", sensitivity)
  count = _validate.integer("count", count, minimum=1)
  return _calibrated(eps, d, sens, count, accounting.Relation.parse(relation))


@functools.lru_cache(maxsize=512)
def _calibrated(eps: float, delta: float, sens: float, count: int, relation: accounting.Relation) -> float:
  # Calibration is deterministic; sweeps ask for the same (eps, delta, T) many times. Below eps ~ 2.5e-321 the
  # step eps / 1000 underflowed to 0, refused as "value_discretization_interval=0.0" (a parameter the caller never
  # passed): it is kept at the smallest positive float, the step eps = 3e-321 gets. The grid is coarsened to fit
  # accounting.MAX_GRID_POINTS anyway; at delta 0.5 such an eps calibrates (16 s on 2 busy cores).
  return accounting.calibrate("gaussian", target_epsilon=eps, target_delta=delta, relation=relation,
                              sensitivity=sens, count=count,
                              value_discretization_interval=max(min(1e-4, eps / 1000), math.ulp(0.0))).parameter


def ldp_sigma_table(delta: Any, *, sensitivity: Any, count: Any,
                    epsilons: Sequence[float] = DEFAULT_LDP_EPSILONS,
                    relation: Any = accounting.Relation.ADD_OR_REMOVE) -> list[dict]:
  """Sigma FedMD-LDP needs at NFDP's delta, for several epsilons.

  Args:
    delta: NFDP's flat delta p.
    sensitivity: L2 sensitivity of one release.
    count: T = Q x R releases per party.
    epsilons: target epsilons; 0 means "below p at every eps" (closed form).
    relation: recorded neighbouring relation.

  Returns:
    One dict per epsilon: ``epsilon``, ``delta``, ``sigma`` (per release),
    ``sigma_effective`` (sigma / sqrt(T)), ``log10_sigma``, ``method``
    (``pld-calibrated`` or ``closed-form``) and ``analytic_delta`` (the
    closed form at that sigma, a cross-check).

  Raises:
    ValueError: ``delta`` not in (0, 1); ``sensitivity`` not a finite number
      > 0; ``count`` not an integer in [1, ``MAX_LDP_COUNT``] (at most 10^12
      for epsilons > 0); ``epsilons`` not a non-empty iterable of at most
      ``MAX_LDP_TABLE_ROWS`` numbers in [0, ``MAX_LDP_EPSILON``]; a bad
      ``relation``. All are checked before the first row is computed.
  """
  d = _validate.open_unit("delta", delta)
  sensitivity = _validate.positive("sensitivity", sensitivity)
  count = _validate.integer("count", count, minimum=1, maximum=MAX_LDP_COUNT)
  relation = accounting.Relation.parse(relation)  # was checked only by a row with epsilon > 0
  rows = []
  for eps in _table_epsilons(epsilons):
    if eps == 0.0:
      sigma = gaussian_sigma_for_flat_delta(d, sensitivity=sensitivity, count=count)
      method = "closed-form"
    else:
      sigma = calibrate_ldp_sigma(eps, d, sensitivity=sensitivity, count=count, relation=relation)
      method = "pld-calibrated"
    rows.append({
        "epsilon": eps, "delta": d, "sigma": sigma, "sigma_effective": sigma / math.sqrt(count),
        "log10_sigma": math.log10(sigma), "method": method, "count": int(count),
        "sensitivity": float(sensitivity),
        "analytic_delta": analytic_gaussian_delta(eps, sigma=sigma, sensitivity=sensitivity, count=count),
    })
  return rows


def _table_epsilons(value: Any) -> list[float]:
  """``epsilons`` of :func:`ldp_sigma_table`, all checked, or a one-line ValueError naming them.

  None or 1.0 were TypeErrors, ``()`` an empty table, and ``"ab"`` was read as epsilons "a" and "b".
  """
  shown = f"{type(value).__name__} {_validate.shown(value)}"
  if not _validate.is_collection(value):
    raise ValueError(f"Expected epsilons to be a sequence of numbers in [0, {MAX_LDP_EPSILON:g}]; got {shown}.")
  try:
    items = list(itertools.islice(value, MAX_LDP_TABLE_ROWS + 1))
  except TypeError:  # a 0-d NumPy array is not iterable after all
    raise ValueError(f"Expected epsilons to be a sequence of numbers in [0, {MAX_LDP_EPSILON:g}]; got "
                     f"{shown}.") from None
  if not items:
    raise ValueError(f"Expected epsilons to hold at least one epsilon; got {shown}.")
  if len(items) > MAX_LDP_TABLE_ROWS:
    raise ValueError(f"Expected at most MAX_LDP_TABLE_ROWS = {MAX_LDP_TABLE_ROWS} epsilons (one calibration "
                     f"each); got more ({shown}).")
  return [check_ldp_epsilon(f"epsilons[{i}]", e, allow_zero=True) for i, e in enumerate(items)]
