"""Exact binomial confidence bounds (Clopper-Pearson), one-sided, vectorised."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from jaxdistill import _validate

__all__ = ["clopper_pearson_lower", "clopper_pearson_upper"]


def _check(successes: Any, trials: Any, alpha: Any) -> tuple[np.ndarray, np.ndarray, float]:
  a = _validate.open_unit("alpha", alpha)
  k = _validate.real_array("successes", successes)
  n = _validate.real_array("trials", trials)
  if np.any(~np.isfinite(k)) or np.any(~np.isfinite(n)) or np.any(n < 1) or np.any(k < 0) \
      or np.any(k > n):
    raise ValueError(f"Expected 0 <= successes <= trials and trials >= 1; got {successes!r}, {trials!r}.")
  return k, n, a


def clopper_pearson_lower(successes: Any, trials: Any, alpha: Any) -> Any:
  """One-sided lower bound L with Pr[L > p] <= alpha for k ~ Bin(n, p).

  .. math:: L = \\mathrm{Beta}^{-1}(\\alpha;\\, k,\\, n - k + 1),\\quad L = 0 \\text{ if } k = 0.

  Exact (conservative) for every p, n. Counts may be real-valued (used to
  predict a bound from a rate); arrays broadcast.

  References:
    Clopper, Pearson (1934), Biometrika 26(4).
  """
  k, n, a = _check(successes, trials, alpha)
  out = np.where(k > 0, stats.beta.ppf(a, np.maximum(k, 1e-300), n - k + 1), 0.0)
  return float(out) if out.ndim == 0 else out


def clopper_pearson_upper(successes: Any, trials: Any, alpha: Any) -> Any:
  """One-sided upper bound U with Pr[U < p] <= alpha for k ~ Bin(n, p).

  .. math:: U = \\mathrm{Beta}^{-1}(1 - \\alpha;\\, k + 1,\\, n - k),\\quad U = 1 \\text{ if } k = n.
  """
  k, n, a = _check(successes, trials, alpha)
  out = np.where(k < n, stats.beta.isf(a, k + 1, np.maximum(n - k, 1e-300)), 1.0)
  return float(out) if out.ndim == 0 else out
