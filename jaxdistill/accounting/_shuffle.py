"""Privacy amplification by shuffling (single-message shuffle model).

n clients each send one message from an eps0-LDP randomizer; a shuffler
permutes them uniformly. Feldman, McMillan & Talwar ("Hiding Among the
Clones", FOCS 2021, arXiv:2012.12803) bound the central (eps, delta) of the
shuffled multiset under replace-one neighbours (n fixed).

Closed form (their Theorem 3.1, as printed): if eps0 <= ln(n / (16 ln(2/delta))),

.. math::

   \\varepsilon \\le \\ln\\Big(1 + \\frac{1-e^{-\\varepsilon_0}}{1+e^{-\\varepsilon_0}}
   (a + c)\\Big), \\qquad a = 8\\sqrt{e^{\\varepsilon_0}\\ln(4/\\delta)/n},\\quad
   c = 8 e^{\\varepsilon_0}/n.

The authors' reference code (spec REVERSE_KNN.md §3 and I7) is more
conservative on both counts: it requires eps0 <= ln(n / (16 ln(4/delta))) and
returns

.. math::

   \\varepsilon = \\ln\\Big(1 + \\frac{1-e^{-\\varepsilon_0}}{1+e^{-\\varepsilon_0-\\varepsilon_1}}
   (a + c)\\Big), \\qquad \\varepsilon_1 = \\ln(1 + a + c),

which is never below the printed value (e^{-eps0-eps1} < e^{-eps0}). We do not
know which one the proof supports, so :func:`fmt_closed_form_epsilon` takes the
code's value and its validity check. The code's value is 0.6% larger at
(eps0, n, delta) = (4, 10^5, 10^-6) (0.5378 against the printed 0.5346), and
up to about 50% larger for eps0 near 0 and small n (45% at n = 200,
delta = 1e-3; 50% at n = 100, delta = 1e-2), never twice as large. The
numeric bound below needs neither.

Numeric bound (their clone reduction, Thm. 3.2 and Appendix E): the shuffled
output is a post-processing of (C, A) with C ~ Bin(n-1, e^{-eps0}),
A | C=c ~ Bin(c, 1/2) and one extra message that lands on A with probability
alpha = e^{eps0}/(e^{eps0}+1) on one side and 1 - alpha on the other:

.. math::

   P_c = \\alpha\\,B_c + (1-\\alpha)(B_c + 1), \\qquad
   Q_c = (1-\\alpha)\\,B_c + \\alpha(B_c + 1),\\qquad B_c\\sim\\mathrm{Bin}(c,1/2).

So delta(eps) <= sum_c Pr[C=c] max(H_{e^eps}(P_c||Q_c), H_{e^eps}(Q_c||P_c)).
The likelihood ratio P_c/Q_c is monotone in the count, so each hockey-stick
divergence is one pair of binomial CDFs at a closed-form cutoff; we evaluate
every c in a window that holds all but a negligible mass of C (the tails
are binned, as below), vectorised, and bisect over eps. Unlike the reference
implementation's block-maximum shortcut, each c is summed exactly, up to
``MAX_CLONE_POINTS`` values of c (n up to about 2e8 at eps0 = 4). Wider
windows are cut into that many bins, each evaluated at its smallest c; the
divergence does not increase with c, so that is still an upper bound.

Several releases (T iterations of a labeling run): :func:`clone_pld` gives the
same pair as a pessimistic dp-accounting PLD, whose T-fold composition bounds
the T shuffled releases far more tightly than composing T worst-case
(eps, delta) pairs; ``shuffle_epsilon(..., releases=T)`` and
``shuffle_local_epsilon(..., releases=T)`` state that composition directly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
import numpy as np
from scipy import special, stats

from jaxdistill import _validate
from jaxdistill.accounting._mechanisms import (FFT_ROUNDOFF_PER_RELEASE, _check_vdi, _lattice_step, _pld_epsilon,
                                              _self_compose)
from jaxdistill.accounting._relation import PrivacyStatement, Relation

__all__ = [
    "fmt_closed_form_valid",
    "fmt_closed_form_epsilon",
    "clone_delta",
    "clone_pld",
    "shuffle_epsilon",
    "shuffle_local_epsilon",
    "ShuffleAmplification",
]

_METHODS = ("closed-form", "numeric")
#: Most values of the clone count C that :func:`clone_delta` evaluates one by one (wider windows are binned).
MAX_CLONE_POINTS = 2**15
#: Bins of the coarse first pass the bisections ask before the default window (see _clone_delta_at_most).
_COARSE_POINTS = 2**10
#: Halvings of the bisection's upper end, with its lower end still at 0, before it asks whether eps = 0 holds.
_HALVINGS_BEFORE_ZERO = 10
#: Largest eps0 (and target epsilon) the shuffle accounting supports. At eps0 = 60 a message is a
#: clone with probability e^{-60} ~ 9e-27, so shuffling no longer amplifies (epsilon = eps0 up to
#: about n e^{-60}), and e^{eps} (eps < eps0) stays far from the float64 overflow at eps > 709.
_MAX_EPS0 = 60.0
#: Smallest eps0 (and target epsilon): below it e^{-eps0} is 1 to float64 precision, the clone pair's
#: two distributions coincide in floating point and the cutoffs divide by 0.
_MIN_EPS0 = 1e-9
#: Largest n the numeric (clone-reduction) accounting takes: SciPy's binomial CDFs at larger n take
#: minutes (41 s at n = 1e13 here) and lose precision past 2^53. The closed form takes any n up to MAX_N.
MAX_NUMERIC_N = 10**12
#: Largest n at all (n is a count of messages; 2^63 and beyond broke NumPy's integer conversions).
MAX_N = 10**18
#: Most releases ``shuffle_epsilon`` and ``shuffle_local_epsilon`` compose (the clone pair's PLD, by FFT; 1,000
#: releases take about a second even at n = 1, where the composed losses span the widest range).
MAX_SHUFFLE_RELEASES = 1000
#: Smallest relative bisection tolerance ``tol``: float64 resolves relative steps of 2^-52 ~ 2.2e-16, so a
#: finer tolerance can never be met (tol = 1e-17 looped forever once lo and hi were adjacent floats).
MIN_TOL = 1e-15


def _check_tol(value: Any) -> float:
  return _validate.relative_tolerance("tol", value, minimum=MIN_TOL)


def _check_eps0_cap(name: str, value: float) -> float:
  if value > _MAX_EPS0:
    raise ValueError(f"Expected {name}={value!r} <= {_MAX_EPS0:g}: the shuffle accounting supports local and "
                     f"central epsilons in (0, {_MAX_EPS0:g}] (beyond it a clone has probability "
                     f"e^-eps0 < 1e-26, so shuffling gives no amplification).")
  return value


def _check_eps_floor(name: str, value: float) -> float:
  if value < _MIN_EPS0:
    raise ValueError(f"Expected {name}={value!r} >= {_MIN_EPS0:g}: below it e^-{name} is 1 to float64 precision "
                     "and the shuffle accounting cannot tell a message from a clone.")
  return value


def _check(eps0: Any, n: Any, delta: Any) -> tuple[float, int, float]:
  return (_check_eps_floor("eps0", _validate.positive("eps0", eps0)),
          _validate.integer("n", n, minimum=1, maximum=MAX_N), _validate.open_unit("delta", delta))


def _check_numeric_n(n: int, name: str = "n") -> int:
  if n > MAX_NUMERIC_N:
    raise ValueError(f"Expected {name}={n} <= {MAX_NUMERIC_N:.0e} for the numeric clone-reduction accounting (SciPy's "
                     "binomial takes minutes beyond it); use method='closed-form' (FMT21 Theorem 3.1).")
  return n


def _log_inv(c: float, delta: float) -> float:
  """ln(c / delta), also where c / delta overflows (delta below about 1e-308)."""
  q = c / delta
  return math.log(q) if math.isfinite(q) else math.log(c) - math.log(delta)


def _eps0_max(n: int, delta: float) -> float:
  """Largest eps0 where the closed form applies: ln(n / (16 ln(4/delta))), the authors' code's check.

  Theorem 3.1 as printed asks for ln(2/delta) instead, a weaker condition (spec I7).
  """
  return math.log(n / (16.0 * _log_inv(4.0, delta)))


def fmt_closed_form_valid(eps0: Any, n: Any, delta: Any) -> bool:
  """Whether the closed form's condition eps0 <= ln(n / (16 ln(4/delta))) holds (see :func:`_eps0_max`)."""
  eps0, n, delta = _check(eps0, n, delta)
  return eps0 <= _eps0_max(n, delta)


def fmt_closed_form_epsilon(eps0: Any, n: Any, delta: Any) -> float:
  """Central epsilon of n shuffled eps0-LDP messages, FMT21 Theorem 3.1 as the authors' code computes it.

  The code's value ln(1 + (1 - e^{-eps0}) / (1 + e^{-eps0-eps1}) (a + c)), eps1 = ln(1 + a + c), is never
  below the printed theorem's ln(1 + (1 - e^{-eps0}) / (1 + e^{-eps0}) (a + c)); both are in the module
  docstring (spec I7: take the larger).

  Args:
    eps0: local epsilon > 0.
    n: number of messages (>= 1).
    delta: target central delta in (0, 1).

  Returns:
    epsilon (float64).

  Raises:
    ValueError: if eps0 > ln(n / (16 ln(4/delta))), where the closed form does
      not apply (use ``method="numeric"``).

  References:
    Feldman, McMillan, Talwar, "Hiding Among the Clones", FOCS 2021,
    Theorem 3.1. https://arxiv.org/abs/2012.12803

  >>> round(fmt_closed_form_epsilon(4.0, 10**5, 1e-6), 4)
  0.5378
  """
  eps0, n, delta = _check(eps0, n, delta)
  limit = _eps0_max(n, delta)
  if eps0 > limit:
    raise ValueError(
        f"Expected eps0={eps0!r} <= ln(n/(16 ln(4/delta)))={limit:.6g} for the closed form "
        f"(FMT21 Thm 3.1, the authors' code's check); use method='numeric'.")
  e0 = math.exp(eps0)
  inner = 8.0 * math.sqrt(e0 * _log_inv(4.0, delta) / n) + 8.0 * e0 / n  # a + c
  eps1 = math.log1p(inner)
  return float(math.log1p(-math.expm1(-eps0) / (1.0 + math.exp(-eps0 - eps1)) * inner))


def _hockey_cutoffs(eps: float, eps0: float) -> tuple[float, float, float]:
  """alpha and the cutoff fractions beta (for P||Q) and beta' (for Q||P).

  With r = B(a-1)/B(a) = a/(c+1-a), the ratio P/Q = (alpha + (1-alpha) r) /
  ((1-alpha) + alpha r) is decreasing in r, hence in a. P/Q > e^eps iff
  a < beta (c+1), and Q/P > e^eps iff a > beta' (c+1).
  """
  alpha = 1.0 / (1.0 + math.exp(-eps0))
  g = math.exp(eps)
  r_p = (alpha - (1 - alpha) * g) / (alpha * g - (1 - alpha))
  beta = r_p / (1 + r_p)
  gi = 1.0 / g
  r_q = (alpha - (1 - alpha) * gi) / (alpha * gi - (1 - alpha))
  beta_q = r_q / (1 + r_q)
  return alpha, beta, beta_q


def clone_delta(eps: Any, eps0: Any, n: Any, *, max_points: Any = MAX_CLONE_POINTS) -> float:
  """delta(eps) of the clone-reduction pair: an upper bound for shuffling.

  Args:
    eps: central epsilon >= 0.
    eps0: local epsilon in (0, 60].
    n: number of messages.
    max_points: most values of C evaluated. A wider window (its width grows
      like sqrt(n e^{-eps0}): about 2e6 values at n = 1e12, eps0 = 4) is cut
      into this many bins of consecutive c, each weighted by its whole mass
      and evaluated at its smallest c. The divergence given C = c does not
      increase with c (the pair at c + 1 is the pair at c plus an
      independent Bernoulli(1/2) message, a post-processing), so the binned
      sum is still an upper bound. Windows that fit are summed exactly.
      With the default, ``shuffle_epsilon(4, 10**12, 1e-6)`` takes 6 s on
      2 cores (more than 5 minutes summed exactly). The cost grows with
      C ~ n e^{-eps0} and as eps nears 0: at n = 10**12 and eps0 = 0.3 one
      call at eps = 3e-8 takes about 20 s (SciPy's binomial CDF in the bulk
      of C). The bisections of :func:`shuffle_epsilon` ask a 32 times
      coarser window first and stop at 0 when eps = 0 already holds, so
      ``shuffle_epsilon(0.3, 10**12, 1e-6)`` takes seconds (it took more
      than 5 minutes before).

  Returns:
    delta (float64) such that shuffling n eps0-LDP messages is (eps, delta)-DP.
    C's mass outside the window of exactly evaluated values is binned, each
    bin evaluated at its smallest c, so no mass is left out and the result
    stays an upper bound at any delta.
  """
  eps = _validate.nonnegative("eps", eps)
  eps0 = _check_eps0_cap("eps0", _check_eps_floor("eps0", _validate.positive("eps0", eps0)))
  n = _check_numeric_n(_validate.integer("n", n, minimum=1, maximum=MAX_N))
  max_points = _validate.integer("max_points", max_points, minimum=2)
  if eps >= eps0:
    return 0.0
  return _window_delta(eps, eps0, *_clone_window(n, eps0, max_points))


def _window_delta(eps: float, eps0: float, c: np.ndarray, weight: np.ndarray, missing: float) -> float:
  """The (binned) sum of clone_delta over the values ``c`` of C with masses ``weight``."""
  if eps >= eps0:
    return 0.0
  alpha, beta, beta_q = _hockey_cutoffs(eps, eps0)
  g = math.exp(eps)

  def below(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P(A' <= m) and Q(A' <= m), A' the count including the extra message."""
    f_m = stats.binom.cdf(m, c, 0.5)
    f_m1 = stats.binom.cdf(m - 1, c, 0.5)
    return alpha * f_m + (1 - alpha) * f_m1, (1 - alpha) * f_m + alpha * f_m1

  # H(P||Q) = P(A' <= m) - e^eps Q(A' <= m) with m = floor(beta (c + 1)).
  p_le, q_le = below(np.floor(beta * (c + 1)))
  h_pq = np.clip(p_le - g * q_le, 0.0, None)
  # H(Q||P) = Q(A' > m) - e^eps P(A' > m) with m = floor(beta' (c + 1)), from survival functions: as
  # 1 - CDF, an upper tail of 1e-20 rounded to +-1e-16, which decided every delta below 1e-15.
  m2 = np.floor(beta_q * (c + 1))
  s_m, s_m1 = stats.binom.sf(m2, c, 0.5), stats.binom.sf(m2 - 1, c, 0.5)
  p_gt, q_gt = alpha * s_m + (1 - alpha) * s_m1, (1 - alpha) * s_m + alpha * s_m1
  h_qp = np.clip(q_gt - g * p_gt, 0.0, None)
  d_pq = float(np.sum(weight * h_pq))
  d_qp = float(np.sum(weight * h_qp))
  return min(1.0, max(d_pq, d_qp) + missing)


def _clone_delta_at_most(eps: float, eps0: float, n: int, delta: float) -> bool:
  """Whether clone_delta(eps, eps0, n) <= delta: the bisections' one question.

  Asks a coarse window first (:data:`_COARSE_POINTS` bins, each a union of
  consecutive values or bins of the default window, evaluated at its smallest
  c). The divergence given C = c does not increase with c, so the coarse sum
  is at least the default one: when it is <= delta the answer is yes without
  the default window's 32 times more binomial CDFs, and otherwise the
  default window decides. The answer is that of clone_delta, up to the
  rounding of the two sums.
  """
  coarse = _coarse_window(n, eps0, MAX_CLONE_POINTS)
  if coarse is not None and _window_delta(eps, eps0, *coarse) <= delta:
    return True
  return clone_delta(eps, eps0, n) <= delta


@functools.lru_cache(maxsize=64)
def _coarse_window(n: int, eps0: float, max_points: int) -> tuple[np.ndarray, np.ndarray, float] | None:
  """:func:`_clone_window` merged into about :data:`_COARSE_POINTS` bins; None when it is small already.

  The bins below the window stay as they are: merged into the window's first bin, they would have it
  evaluated at c = 0, and the coarse sum would decide nothing.
  """
  tail_c, tail_w, c, weight = _window_parts(n, eps0, max_points)
  if c.size <= 4 * _COARSE_POINTS:
    return None
  starts = np.arange(0, c.size, -(-c.size // _COARSE_POINTS))
  c_coarse = np.concatenate([tail_c, c[starts]])
  w_coarse = np.concatenate([tail_w, np.add.reduceat(weight, starts)])
  c_coarse.flags.writeable = False
  w_coarse.flags.writeable = False
  return c_coarse, w_coarse, 0.0


#: Left ends of the bins below :func:`_clone_window`'s window: C's quantiles 10^-30, 10^-45, ..., 10^-300 (and 0).
_TAIL_QUANTILES = tuple(10.0**-e for e in range(30, 301, 15))


@functools.lru_cache(maxsize=64)
def _clone_window(n: int, eps0: float, max_points: int) -> tuple[np.ndarray, np.ndarray, float]:
  """Values of C ~ Bin(n - 1, e^{-eps0}) to evaluate, their weights, and the mass left out (0.0).

  Every c in a window holding all but ~2e-15 of C's mass (this halves the work at n = 1e6 compared
  with a 1e-30 window), or, for a window wider than ``max_points``, the left ends of that many bins
  of consecutive c and the bins' masses. The mass outside is not dropped: the mass above the window
  joins its last value, and below it a few bins whose left ends are C's quantiles 1e-30, 1e-45, ...,
  1e-300 and 0 hold the rest, each evaluated at its smallest c. The divergence does not increase with
  c, so both keep the sum an upper bound, and no mass is left out. (Counting the ~2e-15 outside as a
  loss of 1 made any delta below it unreachable: the numeric method returned eps0 at delta = 1e-16
  where the closed form gives 0.01, at n = 1e8 and eps0 = 2.) It depends on neither eps nor delta, so
  the bisections over eps reuse it (cached; the arrays are read-only).
  """
  tail_c, tail_w, c, weight = _window_parts(n, eps0, max_points)
  c, weight = np.concatenate([tail_c, c]), np.concatenate([tail_w, weight])
  c.flags.writeable = False
  weight.flags.writeable = False
  return c, weight, 0.0


@functools.lru_cache(maxsize=64)
def _window_parts(n: int, eps0: float, max_points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(c, weight) of the bins below the window, then of the window with the mass above it (:func:`_clone_window`)."""
  c_dist = stats.binom(n - 1, math.exp(-eps0))
  with warnings.catch_warnings():
    # Boost's quantile search warns "unable to bracket root" for p = e^-eps0 below about 1e-12 (eps0 in 29..37
    # at n = 1e5) and returns a neighbouring integer; the quantiles only place the bins, whose masses come
    # from the CDFs.
    warnings.filterwarnings("ignore", message=".*do_inverse_discrete_quantile", category=RuntimeWarning)
    lo = int(max(0, c_dist.ppf(1e-15) - 1))
    hi = int(min(n - 1, c_dist.isf(1e-15) + 1))
    tail = np.array([c_dist.ppf(q) for q in _TAIL_QUANTILES])
  if hi - lo + 1 <= max_points:
    c = np.arange(lo, hi + 1, dtype=np.float64)
    weight = c_dist.pmf(c)
  else:
    edges = np.unique(np.linspace(lo, hi + 1, max_points + 1).round().astype(np.int64))  # bin j: [e_j, e_j+1)
    # Pr[e_j <= C < e_j+1] from the CDF below the median and from the survival function above it, so
    # that neither side subtracts two numbers close to 1.
    below = c_dist.cdf(edges - 1)
    above = c_dist.sf(edges - 1)
    upper = edges[:-1] >= c_dist.median()
    c = edges[:-1].astype(np.float64)
    weight = np.clip(np.where(upper, above[:-1] - above[1:], below[1:] - below[:-1]), 0.0, None)
  weight[-1] += c_dist.sf(hi)  # C > hi, evaluated at hi
  # Below lo: bins [t_j, t_j+1) starting at 0 and at the tail quantiles, the last ending at lo.
  if lo > 0:
    starts = np.unique(np.concatenate([[0], tail[np.isfinite(tail) & (tail > 0) & (tail < lo)]])).astype(np.int64)
    ends = np.append(starts[1:], lo)
    tail_c = starts.astype(np.float64)
    tail_w = np.clip(c_dist.cdf(ends - 1) - c_dist.cdf(starts - 1), 0.0, None)
  else:
    tail_c, tail_w = np.zeros(0), np.zeros(0)
  for a in (tail_c, tail_w, c, weight):
    a.flags.writeable = False
  return tail_c, tail_w, c, weight


def _numeric_epsilon(eps0: float, n: int, delta: float, tol: float) -> float:
  """Smallest eps (to ``tol``) with clone_delta(eps) <= delta, by bisection.

  Returns 0.0 when clone_delta(0) <= delta: the pair is already within total
  variation delta (e.g. n = 10**12, eps0 = 0.3, delta = 1e-6), so (0, delta)-DP
  holds. That is checked once the bracket's upper end has halved
  :data:`_HALVINGS_BEFORE_ZERO` times with its lower end still at 0, so
  other answers cost one call at eps = 0 at most, and usually none.
  """
  lo, hi = 0.0, eps0
  if eps0 <= _eps0_max(n, delta):
    hi = min(hi, fmt_closed_form_epsilon(eps0, n, delta) * 1.0001 + 1e-12)
  if not _clone_delta_at_most(hi, eps0, n, delta):
    hi = eps0  # eps0 is always valid: clone_delta(eps0) == 0.
  zero_checked_below = hi / 2**_HALVINGS_BEFORE_ZERO
  while hi - lo > tol * max(hi, 1e-12):
    if lo == 0.0 and hi <= zero_checked_below:
      if _clone_delta_at_most(0.0, eps0, n, delta):
        return 0.0
      zero_checked_below = -1.0
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):  # adjacent floats: no finer bracket exists
      break
    if _clone_delta_at_most(mid, eps0, n, delta):
      hi = mid
    else:
      lo = mid
  return float(hi)


#: Most (c, a') outcomes :func:`clone_pld` evaluates (float64, a few arrays of this size per chunk); more clone
#: values C are merged into coarser bins (still an upper bound, as in :func:`clone_delta`).
MAX_CLONE_PLD_POINTS = 2**24
#: Outcomes per vectorised chunk of :func:`clone_pld` (bounds its memory to a few hundred MiB).
_CLONE_PLD_CHUNK = 2**21
#: Half-width of the window of A' given C = c, in standard deviations of Bin(c, 1/2) (the mass outside, about
#: 1e-19 a side, is computed exactly and counted as an infinite loss).
_CLONE_PLD_SDS = 9.0


def clone_pld(eps0: Any, n: Any, *, value_discretization_interval: Any = 1e-4) -> pld_lib.PrivacyLossDistribution:
  """Pessimistic PLD of the clone-reduction pair: composes over T releases.

  The pair is the one :func:`clone_delta` sums (module docstring): outcomes
  (c, a'), Pr[C = c] the same on both sides, and given C = c

  .. math::

     L(c, a') = \\ln\\frac{P_c(a')}{Q_c(a')}
              = \\ln\\frac{\\alpha + (1-\\alpha)\\rho}{(1-\\alpha) + \\alpha\\rho},
     \\qquad \\rho = \\frac{a'}{c + 1 - a'},

  in [-eps0, eps0]. The pair is symmetric (a' -> c + 1 - a' maps P_c onto
  Q_c), so one PMF serves both neighbouring directions. Since the shuffled
  output of every neighbouring pair is a post-processing of this pair
  (Feldman, McMillan, Talwar, Thm. 3.2), it dominates each release's
  hockey-stick divergences at every order, and T releases (adaptive
  included: the pair does not depend on the data) are dominated by its
  T-fold composition. ``clone_pld(eps0, n).self_compose(T)`` is therefore
  an upper bound on T shuffled releases, as tight as the clone reduction
  itself; composing worst-case (eps_t, delta_t) pairs instead leaves budget
  unused (at n = 60,000, (1, 1e-6) over T = 5: eps0 3.59 by pairs against
  5.14 composed here).

  Every loss is rounded up to the grid ``value_discretization_interval``
  (pessimistic). The values of C are :func:`clone_delta`'s window (binned
  beyond ``MAX_CLONE_POINTS``) and A' given c is evaluated within 9
  standard deviations of c/2; when that exceeds :data:`MAX_CLONE_PLD_POINTS`
  outcomes, consecutive values of C are merged into bins evaluated at their
  smallest c (the pair at c + 1 is the pair at c plus one independent
  Bernoulli(1/2) message, so the merged pair dominates the exact one: a
  post-processing maps it onto the exact one). All mass left out (C outside
  the window, A' outside its window) is an infinite loss.

  Args:
    eps0: local epsilon in (0, 60].
    n: number of messages (<= ``MAX_NUMERIC_N``).
    value_discretization_interval: the loss grid, in (0, 100]; coarsened so
      that [-eps0, eps0] takes at most 2 * 10^6 points.

  Returns:
    A symmetric dp-accounting ``PrivacyLossDistribution`` (pessimistic).

  >>> pld = clone_pld(4.0, 10**5)
  >>> bool(abs(pld.get_delta_for_epsilon(0.2) - clone_delta(0.2, 4.0, 10**5)) < 1e-7)
  True
  """
  eps0 = _check_eps0_cap("eps0", _check_eps_floor("eps0", _validate.positive("eps0", eps0)))
  n = _check_numeric_n(_validate.integer("n", n, minimum=1, maximum=MAX_N))
  unit = max(_check_vdi(value_discretization_interval), eps0 / 10**6)
  return _clone_pld(eps0, n, unit)


def _log_binom_half(a: np.ndarray, c: np.ndarray) -> np.ndarray:
  """ln Pr[Bin(c, 1/2) = a] (-inf outside 0..c): SciPy's ``binom.logpmf`` formula without its argument checks."""
  inside = (a >= 0.0) & (a <= c)
  a = np.where(inside, a, 0.0)
  log_b = special.gammaln(c + 1.0) - (special.gammaln(a + 1.0) + special.gammaln(c - a + 1.0)) - c * math.log(2.0)
  return np.where(inside, log_b, -np.inf)


@functools.lru_cache(maxsize=64)
def _clone_pld(eps0: float, n: int, unit: float) -> pld_lib.PrivacyLossDistribution:
  c, weight, missing = _clone_window(n, eps0, MAX_CLONE_POINTS)
  half = np.ceil(_CLONE_PLD_SDS * 0.5 * np.sqrt(c)) + 2.0  # A' window: centre -/+ half, within [0, c + 1]
  total = float(np.sum(np.minimum(c + 2.0, 2.0 * half + 1.0)))
  if total > MAX_CLONE_PLD_POINTS:  # merge consecutive bins of C (each evaluated at its smallest c)
    starts = np.arange(0, c.size, math.ceil(total / MAX_CLONE_PLD_POINTS))
    c, weight, half = c[starts], np.add.reduceat(weight, starts), half[starts]
  log_a, log_1a = -math.log1p(math.exp(-eps0)), -math.log1p(math.exp(eps0))  # log alpha, log (1 - alpha)
  alpha, beta = math.exp(log_a), math.exp(log_1a)
  top = int(math.ceil(eps0 / unit))
  probs = np.zeros(2 * top + 1)
  infinity = missing
  widths = np.minimum(c + 2.0, 2.0 * half + 1.0)
  ends = np.cumsum(widths)
  first = 0
  while first < c.size:  # chunks of whole rows, about _CLONE_PLD_CHUNK outcomes each
    last = max(first + 1, int(np.searchsorted(ends, ends[first] - widths[first] + _CLONE_PLD_CHUNK, "right")))
    cc, ww, hh = c[first:last], weight[first:last], half[first:last]
    lo = np.maximum(0.0, np.floor((cc + 1.0) / 2.0) - hh)
    hi = np.minimum(cc + 1.0, np.floor((cc + 1.0) / 2.0) + hh)
    # Columns a' - 1 = lo - 1, ..., hi of each row (padding repeats hi, masked out): B_c at a' and at a' - 1.
    a = np.minimum(lo[:, None] + np.arange(-1.0, np.max(hi - lo) + 1.0)[None, :], hi[:, None])
    valid = (lo[:, None] + np.arange(a.shape[1] - 1)[None, :]) <= hi[:, None]
    log_all = _log_binom_half(a, cc[:, None])
    log_b, log_b1 = log_all[:, 1:], log_all[:, :-1]
    mass = np.where(valid, ww[:, None] * np.exp(np.logaddexp(log_a + log_b, log_1a + log_b1)), 0.0)
    # The loss in closed form (docstring), numerator and denominator multiplied by c + 1 - a': finite at a' = 0 and
    # a' = c + 1, and free of the log-pmfs' cancellation (gammaln(c + 1) is 1.8e7 at c = 1.35e6, so each log-pmf
    # carries an absolute error near 1e-8, enough to move a loss across a grid point).
    b = a[:, 1:]
    rest = cc[:, None] + 1.0 - b  # c + 1 - a'
    loss = np.log(alpha * rest + beta * b) - np.log(beta * rest + alpha * b)
    index = np.clip(np.ceil(loss / unit), -top, top).astype(np.int64)  # rounded up: pessimistic
    probs += np.bincount((index + top)[valid], weights=mass[valid], minlength=probs.size)
    # P's mass of A' outside [lo, hi]: alpha B_c + (1 - alpha) B_c shifted by one, from the CDF and survival.
    binom = stats.binom(cc, 0.5)
    below = alpha * binom.cdf(lo - 1.0) + beta * binom.cdf(lo - 2.0)
    above = alpha * binom.sf(hi) + beta * binom.sf(hi - 1.0)
    infinity += float(np.sum(ww * (below + above)))
    first = last
  pmf = pld_pmf.DensePLDPmf(discretization=_lattice_step(unit), lower_loss=-top, probs=probs,
                            infinity_mass=min(1.0, infinity), pessimistic_estimate=True)
  return pld_lib.PrivacyLossDistribution(pmf)


@dataclasses.dataclass(frozen=True)
class ShuffleAmplification:
  """Result of an amplification computation.

  Attributes:
    eps0: local epsilon of each message.
    n: number of shuffled messages.
    delta: central delta.
    epsilon: central epsilon (upper bound).
    method: ``closed-form`` (FMT21 Thm 3.1) or ``numeric`` (clone reduction).
    fell_back: True if ``closed-form`` was asked but eps0 was outside its
      validity range and ``on_invalid="numeric"`` switched methods.
    releases: number of shuffled releases (each of n fresh messages) that
      ``epsilon`` and ``delta`` cover together; above 1 the method is
      ``pld-clone`` (the clone pair's PLD composed, :func:`clone_pld`).
  """

  eps0: float
  n: int
  delta: float
  epsilon: float
  method: str
  fell_back: bool = False
  releases: int = 1

  def statement(self) -> PrivacyStatement:
    return PrivacyStatement(
        mechanism="shuffle-single-message", relation=Relation.REPLACE_ONE,
        epsilon=self.epsilon, delta=self.delta, count=self.releases, method=self.method,
        parameters={"eps0": self.eps0, "n": self.n, "fell_back": self.fell_back})

  def to_dict(self) -> dict[str, Any]:
    return {"eps0": self.eps0, "n": self.n, "delta": self.delta, "epsilon": self.epsilon,
            "method": self.method, "fell_back": self.fell_back, "relation": "replace-one",
            "releases": self.releases}


def _check_releases(releases: Any, method: str, delta: float) -> int:
  releases = _validate.integer("releases", releases, minimum=1, maximum=MAX_SHUFFLE_RELEASES)
  if releases > 1 and method != "numeric":
    raise ValueError(f"Expected method='numeric' for releases={releases}: the closed form (FMT21 Thm 3.1) bounds "
                     "one release; several compose through the clone pair's PLD.")
  if releases > 1 and delta <= 2 * releases * FFT_ROUNDOFF_PER_RELEASE:
    raise ValueError(f"Expected delta={delta!r} > {2 * releases * FFT_ROUNDOFF_PER_RELEASE:.3g} for "
                     f"releases={releases}: the FFT composition's round-off allowance (releases * "
                     "FFT_ROUNDOFF_PER_RELEASE) comes off delta.")
  return releases


def _composed_epsilon(eps0: float, n: int, delta: float, releases: int) -> float:
  """Epsilon at ``delta`` of ``releases`` shuffled releases: :func:`clone_pld` composed, less the FFT allowance.

  The loss grid is 1e-4, finer for eps0 < 0.1 (eps0 / 1000: a 1e-4 step per release would swamp the small
  epsilons those give). Never above ``releases * eps0``: each shuffled release is a post-processing of n
  eps0-LDP messages, so eps0-DP, and pure epsilons add up. That bound is taken where delta is below the
  composition's infinite-loss mass, and where dp-accounting's evaluation overflows (:func:`_pld_epsilon`; a
  composed loss of 709-745: eps0 = 5, n = 1, 145 releases gave inf with NumPy's overflow warning). Raises
  ValueError when the FFT would exceed ``MAX_FFT_POINTS``.
  """
  composed = _self_compose(clone_pld(eps0, n, value_discretization_interval=min(1e-4, eps0 / 1000)), releases)
  return min(_pld_epsilon(composed, delta - releases * FFT_ROUNDOFF_PER_RELEASE, math.inf), releases * eps0)


def shuffle_epsilon(eps0: Any, n: Any, delta: Any, *, method: str = "numeric",
                    on_invalid: str = "raise", tol: float = 1e-4, releases: Any = 1) -> ShuffleAmplification:
  """Central epsilon of n shuffled eps0-LDP messages (replace-one, n fixed).

  Args:
    eps0: local epsilon in (0, 60].
    n: number of messages.
    delta: central delta in (0, 1).
    method: ``numeric`` (tighter; clone reduction) or ``closed-form``.
    on_invalid: for ``closed-form`` outside its validity range: ``raise``
      (default) or ``numeric`` (fall back explicitly; recorded in the result).
    tol: relative bisection tolerance for ``numeric``, in [``MIN_TOL`` = 1e-15, 0.1].
    releases: T in [1, ``MAX_SHUFFLE_RELEASES``]: T shuffled releases (n fresh
      messages each, adaptive choices allowed) stated together at ``delta``.
      Above 1 it needs ``numeric`` and composes :func:`clone_pld` T times
      (method ``pld-clone``; ``tol`` is then unused; never above T eps0,
      each release being eps0-DP): far tighter than composing T
      single-release (eps, delta / T) pairs (at n = 10^5, eps0 = 4,
      delta = 10^-6, ten releases: 0.58 against 2.0).

  Returns:
    A :class:`ShuffleAmplification`. Its ``epsilon`` is 0.0 under
    ``numeric`` when clone_delta(0) <= delta: the shuffled messages are then
    already (0, delta)-DP (e.g. n = 10**12, eps0 = 0.3, delta = 1e-6).

  >>> r = shuffle_epsilon(4.0, 10**5, 1e-6)
  >>> 0.16 < r.epsilon < 0.18
  True
  >>> r = shuffle_epsilon(4.0, 10**5, 1e-6, releases=10)
  >>> r.method, round(r.epsilon, 2)
  ('pld-clone', 0.58)
  """
  eps0, n, delta = _check(eps0, n, delta)
  _check_eps0_cap("eps0", eps0)
  method = _validate.choice("method", method, _METHODS)
  on_invalid = _validate.choice("on_invalid", on_invalid, ("raise", "numeric"))
  tol = _check_tol(tol)
  releases = _check_releases(releases, method, delta)
  if releases > 1:
    return ShuffleAmplification(eps0, _check_numeric_n(n), delta, _composed_epsilon(eps0, n, delta, releases),
                                "pld-clone", releases=releases)
  if method == "closed-form":
    if eps0 <= _eps0_max(n, delta) or on_invalid == "raise":
      return ShuffleAmplification(eps0, n, delta, fmt_closed_form_epsilon(eps0, n, delta), "closed-form")
    return ShuffleAmplification(eps0, n, delta, _numeric_epsilon(eps0, _check_numeric_n(n), delta, tol), "numeric",
                                True)
  return ShuffleAmplification(eps0, n, delta, _numeric_epsilon(eps0, _check_numeric_n(n), delta, tol), "numeric")


def shuffle_local_epsilon(target_epsilon: Any, n: Any, delta: Any, *, method: str = "numeric",
                          tol: float = 1e-4, releases: Any = 1) -> ShuffleAmplification:
  """Largest local eps0 whose n shuffled messages meet (target_epsilon, delta).

  The central epsilon is increasing in eps0, so this bisects on eps0. For
  ``closed-form`` the search is capped at ln(n / (16 ln(4/delta))), the
  closed form's validity limit: if even that meets the target, the cap is
  returned (the closed form cannot certify more; ``numeric`` may).

  Args:
    target_epsilon: central epsilon in (0, 60].
    n: number of messages.
    delta: central delta in (0, 1).
    method: ``numeric`` or ``closed-form``.
    tol: relative tolerance on eps0, in [``MIN_TOL`` = 1e-15, 0.1].
    releases: T in [1, ``MAX_SHUFFLE_RELEASES``]; above 1 (``numeric`` only) the
      largest eps0 whose T releases, composed through :func:`clone_pld`,
      meet the target together (as :func:`shuffle_epsilon` with
      ``releases``; each bisection step builds and composes one PLD: 0.15 s
      at n = 10^5 and eps0 = 4, 0.6 s at eps0 = 0.5, 0.6-0.8 s at n = 10^6;
      a whole inverse takes 5 s at n = 10^5 and 13 s at n = 10^6, T = 10).

  Returns:
    A :class:`ShuffleAmplification` whose ``eps0`` is the answer and whose
    ``epsilon`` (<= target) is the forward value at that eps0.

  Raises:
    ValueError: if no eps0 > 0 meets the target under the chosen method (e.g.
      the closed form's validity range is empty for this n and delta).
  """
  target = _check_eps0_cap("target_epsilon", _check_eps_floor(
      "target_epsilon", _validate.positive("target_epsilon", target_epsilon)))
  n = _validate.integer("n", n, minimum=1, maximum=MAX_N)
  delta = _validate.open_unit("delta", delta)
  method = _validate.choice("method", method, _METHODS)
  tol = _check_tol(tol)
  releases = _check_releases(releases, method, delta)
  if method == "numeric":
    _check_numeric_n(n)
  if releases > 1:
    return _composed_local_epsilon(target, n, delta, releases, tol)

  def forward(e0: float) -> float:
    if method == "closed-form":
      return fmt_closed_form_epsilon(e0, n, delta)
    return _numeric_epsilon(e0, n, delta, tol / 10)

  if method == "closed-form":
    cap = _eps0_max(n, delta)
    if cap <= 0:
      raise ValueError(
          f"The closed form needs eps0 <= ln(n/(16 ln(4/delta)))={cap:.4g} <= 0 for n={n}, "
          f"delta={delta}; use method='numeric'.")
    if forward(cap) <= target:
      return ShuffleAmplification(cap, n, delta, forward(cap), method)
    lo, hi = 0.0, cap  # forward(0+) -> 0 < target; forward(cap) > target.
  else:
    # eps(eps0) <= target  <=>  clone_delta(target; eps0) <= delta, so bisect on
    # eps0 with one delta evaluation per step. Shuffling never hurts
    # (clone_delta(eps0; eps0) = 0), so eps0 = target is valid; double until not.
    def meets(e0: float) -> bool:
      return _clone_delta_at_most(target, e0, n, delta)

    lo, hi = target, min(2 * target, _MAX_EPS0)
    while meets(hi):
      lo, hi = hi, 2 * hi
      if hi > _MAX_EPS0:
        return ShuffleAmplification(lo, n, delta, min(forward(lo), target), method)
    lo = _largest_meeting(meets, lo, hi, tol)
    # clone_delta(target; lo) <= delta was verified, so (target, delta) holds;
    # the forward value is only reported, so a coarser bisection suffices.
    achieved = _numeric_epsilon(lo, n, delta, 1e-3)
    return ShuffleAmplification(lo, n, delta, min(achieved, target), method)
  while hi - lo > tol * max(lo, 1e-9):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):  # adjacent floats: no finer bracket exists
      break
    if forward(mid) <= target:
      lo = mid
    else:
      hi = mid
  if lo <= 0:
    raise ValueError(f"No eps0 > 0 meets target_epsilon={target} with n={n}, delta={delta}.")
  return ShuffleAmplification(lo, n, delta, forward(lo), method)


def _composed_local_epsilon(target: float, n: int, delta: float, releases: int, tol: float) -> ShuffleAmplification:
  """Largest eps0 (to ``tol``) whose ``releases`` composed clone pairs meet (target, delta), by bisection.

  eps0 = target / releases meets it (:func:`_composed_epsilon` never exceeds releases * eps0) but for float
  rounding, so the search starts there (or at the smallest eps0 the accounting takes), halving while it does not;
  every answer returned has been evaluated and meets the target.
  """
  evaluated: dict[float, float] = {}  # eps0 -> composed epsilon, so the answer's figure is not composed again

  def meets(e0: float) -> bool:
    evaluated[e0] = _composed_epsilon(e0, n, delta, releases)
    return evaluated[e0] <= target

  lo = max(target / releases, _MIN_EPS0)
  while not meets(lo):
    if lo / 2 < _MIN_EPS0:
      raise ValueError(f"No eps0 >= {_MIN_EPS0:g} meets target_epsilon={target} over releases={releases} with "
                       f"n={n}, delta={delta}: eps0={lo:g} composes to epsilon={evaluated[lo]:g}.")
    lo /= 2
  hi = min(2 * lo, _MAX_EPS0)
  while meets(hi):
    if hi >= _MAX_EPS0:
      lo = hi
      break
    lo, hi = hi, min(2 * hi, _MAX_EPS0)
  lo = _largest_meeting(meets, lo, hi, tol)
  return ShuffleAmplification(lo, n, delta, evaluated[lo], "pld-clone", releases=releases)


def _largest_meeting(meets: Callable[[float], bool], lo: float, hi: float, tol: float) -> float:
  """Bisect a bracket (``meets(lo)``, not ``meets(hi)``) to a relative width ``tol``; the largest point that met."""
  while hi - lo > tol * lo:
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):  # adjacent floats: no finer bracket exists
      break
    if meets(mid):
      lo = mid
    else:
      hi = mid
  return lo
