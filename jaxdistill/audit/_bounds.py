"""Exact binomial confidence bounds (Clopper-Pearson), one-sided, vectorised.

Both bounds are roots of a binomial tail equation, written with the regularised incomplete beta
function I_x(a, b) (SciPy's ``betainc``; ``betaincc`` is 1 - I):

.. math:: P[\\mathrm{Bin}(n, p) \\ge k] = I_p(k,\\, n - k + 1),\\qquad
          P[\\mathrm{Bin}(n, p) \\le k] = 1 - I_p(k + 1,\\, n - k).

SciPy's inverse (``beta.ppf`` / ``beta.isf``) loses the root for large n (lower(1000, 1e9, 0.05)
was 1.9e-6, above k / n = 1e-6), so each quantile is checked against the forward function and,
where it is on the anti-conservative side of the root or off by more than ``_RTOL`` min(p, 1 - p),
replaced by a bisection on the float64 grid.
"""

from __future__ import annotations

from typing import Any, Callable
import warnings

import numpy as np
from scipy import special
from scipy import stats

from jaxdistill import _validate

__all__ = ["clopper_pearson_lower", "clopper_pearson_upper"]

#: Largest number of trials: float64 counts are exact up to 2^53, and SciPy's incomplete beta gives
#: NaN for larger parameters (e.g. I_x(1e20, 1e25) near its median).
MAX_TRIALS = 2.0**53

#: A quantile p from SciPy is kept if it is on the conservative side of the root and within
#: _RTOL min(p, 1 - p) of it.
_RTOL = 1e-9


def _check(successes: Any, trials: Any, alpha: Any) -> tuple[np.ndarray, np.ndarray, float]:
  a = _validate.open_unit("alpha", alpha)
  k = _validate.real_array("successes", successes)
  n = _validate.real_array("trials", trials)
  try:
    k, n = np.broadcast_arrays(k, n)
  except ValueError:
    raise ValueError(f"Expected successes and trials to broadcast together; got shapes {k.shape} and {n.shape}.") \
        from None
  if np.any(~np.isfinite(k)) or np.any(~np.isfinite(n)) or np.any(n < 1) or np.any(k < 0) \
      or np.any(k > n):
    raise ValueError(f"Expected 0 <= successes <= trials and trials >= 1; got {successes!r}, {trials!r}.")
  if np.any(n > MAX_TRIALS):
    raise ValueError(f"Expected trials <= 2**53 (float64 counts are exact up to it); got trials={float(np.max(n))!r}.")
  return k, n, a


def _bisect(below: Callable[[np.ndarray], np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
  """Adjacent floats lo < hi in [0, 1] with ``below(lo)`` true and ``below(hi)`` false.

  ``below`` must be true at 0, false at 1 and monotone in between. Non-negative float64 values are
  ordered as their bit patterns, so bisecting the int64 view ends in at most 63 steps at neighbours.
  """
  lo = np.zeros(size).view(np.int64)
  hi = np.ones(size).view(np.int64)
  while np.any(hi - lo > 1):
    mid = lo + (hi - lo) // 2
    ok = below(mid.view(np.float64))
    lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
  return lo.view(np.float64), hi.view(np.float64)


def _finite(name: str, value: np.ndarray, trials: np.ndarray) -> np.ndarray:
  if not np.all(np.isfinite(value)):
    raise ValueError(f"The incomplete beta function failed (non-finite) for trials={float(np.max(trials))!r}; "
                     f"cannot compute the Clopper-Pearson {name} bound.")
  return value


def clopper_pearson_lower(successes: Any, trials: Any, alpha: Any) -> Any:
  """One-sided lower bound L with Pr[L > p] <= alpha for k ~ Bin(n, p).

  .. math:: L = \\mathrm{Beta}^{-1}(\\alpha;\\, k,\\, n - k + 1),\\quad L = 0 \\text{ if } k = 0,

  i.e. the root of P[Bin(n, L) >= k] = I_L(k, n - k + 1) = alpha. Where SciPy's quantile has
  I_L > alpha or misses the root by more than 1e-9 min(L, 1 - L), L is the largest float64 with
  I_L(k, n - k + 1) <= alpha
  (bisection). For alpha <= 1/2, L <= k / n (the median of Beta(k, n - k + 1) is <= k / n), which
  is enforced against rounding. Requires 1 <= n <= 2^53.

  Exact (conservative) for every p, n. Counts may be real-valued (used to
  predict a bound from a rate); arrays broadcast. A subnormal count
  (0 < k < 2.2e-308) gives L = 0: I_x(k, b) >= x^k (1 - x)^(b - 1) is within 1e-304 of 1, above
  alpha, even at the smallest positive float64 x, so no positive float64 is below the root.

  References:
    Clopper, Pearson (1934), Biometrika 26(4).
  """
  k, n, a = _check(successes, trials, alpha)
  out = np.zeros(k.shape)
  # A subnormal k keeps L = 0 (see above): SciPy's Beta(k, b) quantile raised boost's OverflowError for it
  # (B(k, b) ~ 1/k overflows).
  pos = k >= np.finfo(np.float64).tiny
  kp, bp = k[pos], n[pos] - k[pos] + 1
  with np.errstate(all="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # SciPy warns where its inverse fails; checked below
    q = stats.beta.ppf(a, kp, bp)
    # Keep q iff I(q) <= alpha <= I(q + r m), m = min(q, 1 - q): q is on the conservative side of
    # the root and within r m of it (a tolerance relative to q alone exceeded 1 - q near p = 1).
    good = (special.betainc(kp, bp, q) <= a) \
        & (special.betainc(kp, bp, np.minimum(q + _RTOL * np.minimum(q, 1 - q), 1.0)) >= a)
  if not np.all(good):
    kb, bb = kp[~good], bp[~good]
    lo, _ = _bisect(lambda x: _finite("lower", special.betainc(kb, bb, x), n) <= a, kb.size)
    q[~good] = lo
  out[pos] = np.minimum(q, k[pos] / n[pos]) if a <= 0.5 else q
  return float(out) if out.ndim == 0 else out


def clopper_pearson_upper(successes: Any, trials: Any, alpha: Any) -> Any:
  """One-sided upper bound U with Pr[U < p] <= alpha for k ~ Bin(n, p).

  .. math:: U = \\mathrm{Beta}^{-1}(1 - \\alpha;\\, k + 1,\\, n - k),\\quad U = 1 \\text{ if } k = n,

  i.e. the root of P[Bin(n, U) <= k] = 1 - I_U(k + 1, n - k) = alpha. Where SciPy's quantile
  has 1 - I_U > alpha or misses the root by more than 1e-9 min(U, 1 - U), U is the smallest float64 with
  1 - I_U(k + 1, n - k) <= alpha (bisection). For alpha <= 1/2, U >= k / n, enforced against
  rounding. Requires 1 <= n <= 2^53.
  """
  k, n, a = _check(successes, trials, alpha)
  out = np.ones(k.shape)
  part = k < n
  ap, bp = k[part] + 1, n[part] - k[part]
  with np.errstate(all="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # SciPy warns where its inverse fails; checked below
    q = stats.beta.isf(a, ap, bp)
    # Keep q iff S(q - r m) >= alpha >= S(q), m = min(q, 1 - q), for the survival function S = 1 - I:
    # q is on the conservative side of the root and within r m of it.
    good = (special.betaincc(ap, bp, np.maximum(q - _RTOL * np.minimum(q, 1 - q), 0.0)) >= a) \
        & (special.betaincc(ap, bp, q) <= a)
  if not np.all(good):
    ab, bb = ap[~good], bp[~good]
    _, hi = _bisect(lambda x: _finite("upper", special.betaincc(ab, bb, x), n) > a, ab.size)
    q[~good] = hi
  out[part] = np.maximum(q, k[part] / n[part]) if a <= 0.5 else q
  return float(out) if out.ndim == 0 else out
