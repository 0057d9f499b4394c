"""Exact privacy profiles of mechanisms with finite output spaces.

The (epsilon, delta)-DP guarantee of a mechanism M on one pair of neighbours
(D, D') is exactly its *privacy profile*

.. math::

   \\delta(\\varepsilon) = \\max\\{H_{e^\\varepsilon}(P \\| Q),\\;
                             H_{e^\\varepsilon}(Q \\| P)\\},\\qquad
   H_{\\gamma}(P \\| Q) = \\sum_o \\max(0, P(o) - \\gamma Q(o)),

with P = M(D) and Q = M(D') (Balle, Barthe, Gaboardi 2018, Thm. 1; the
hockey-stick divergence). For a finite output space both sides are finite
sums, so the profile is exact up to float64 rounding. The tests use these
routines as the oracle for every closed form in the library, and later issues
use them to certify mechanisms by enumeration at tiny sizes.

All numbers are float64 on the host.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from jaxdistill import _validate

__all__ = [
    "hockey_stick_divergence",
    "privacy_profile",
    "epsilon_for_delta",
    "worst_case_profile",
    "align_pmfs",
]

_NORMALIZATION_TOL = 1e-9

#: Most float64 entries of one (epsilons x outcomes) block of the hockey-stick sums: a larger product is summed
#: in blocks of epsilons (each row is the same sum as before). 10^5 epsilons on 10^5 outcomes asked for one
#: 74.5 GiB array (a MemoryError); a block is 128 MiB.
MAX_BLOCK_ENTRIES = 2**24


def align_pmfs(p: Any, q: Any) -> tuple[np.ndarray, np.ndarray]:
  """Returns two aligned float64 arrays from arrays or ``{outcome: prob}`` maps.

  Mappings may have different keys; a key missing from one side has mass 0
  there.

  Raises:
    ValueError: if the shapes differ, or a mass is negative or not finite, or a
      distribution sums to more than 1 (beyond 1e-9).
  """
  if isinstance(p, Mapping) or isinstance(q, Mapping):
    if not (isinstance(p, Mapping) and isinstance(q, Mapping)):
      raise ValueError("Expected p and q to be both arrays or both mappings.")
    keys = list(dict.fromkeys(list(p.keys()) + list(q.keys())))
    pa = np.array([_validate.finite(f"p[{k!r}]", p.get(k, 0.0)) for k in keys], dtype=np.float64)
    qa = np.array([_validate.finite(f"q[{k!r}]", q.get(k, 0.0)) for k in keys], dtype=np.float64)
  else:
    pa = _validate.real_array("p", p).reshape(-1)
    qa = _validate.real_array("q", q).reshape(-1)
    if np.shape(p) != np.shape(q):
      raise ValueError(f"Expected p and q of the same shape; got {np.shape(p)} and {np.shape(q)}.")
  for name, arr in (("p", pa), ("q", qa)):
    if not np.all(np.isfinite(arr)):
      raise ValueError(f"Expected {name} to hold finite probabilities; found {arr[~np.isfinite(arr)][:3]}.")
    if np.any(arr < 0):
      raise ValueError(f"Expected {name} to hold probabilities >= 0; found {arr[arr < 0][:3]}.")
    total = math.fsum(arr)
    if total > 1.0 + _NORMALIZATION_TOL:
      raise ValueError(f"Expected {name} to sum to at most 1; it sums to {total!r}.")
  return pa, qa


def _one_direction(p: np.ndarray, q: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
  """H_{e^eps}(p || q) for each of ``epsilons``, in blocks of at most ``MAX_BLOCK_ENTRIES`` entries."""
  rows = max(1, MAX_BLOCK_ENTRIES // max(len(q), 1))
  if len(epsilons) <= rows:
    return _one_block(p, q, epsilons)
  return np.concatenate([_one_block(p, q, epsilons[i:i + rows]) for i in range(0, len(epsilons), rows)])


def _one_block(p: np.ndarray, q: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
  # e^eps overflows to inf from eps ~ 709.8 (and eps = inf is allowed): inf * 0 would be NaN, so
  # outcomes with q = 0 contribute p exactly and the product is formed only where q > 0.
  with np.errstate(over="ignore"):
    gamma = np.exp(epsilons)[:, None]
  gq = np.multiply(gamma, q[None, :], out=np.zeros((len(epsilons), len(q))), where=q[None, :] > 0)
  return np.clip(p[None, :] - gq, 0.0, None).sum(axis=1)


def _epsilons(name: str, value: Any) -> np.ndarray:
  """``value`` as a float64 array of epsilons >= 0 (``inf`` allowed), or raises naming ``name``."""
  eps = _validate.real_array(name, value)
  bad = eps[np.isnan(eps) | (eps < 0)]
  if bad.size:  # the first bad value, not the whole input (a list of 10^5 epsilons was one 600 kB line)
    among = f" (among {eps.size} values)" if eps.ndim else ""
    raise ValueError(f"Expected {name} >= 0; got {float(bad[0])!r}{among}.")
  return eps


def hockey_stick_divergence(p: Any, q: Any, epsilon: Any) -> Any:
  """Hockey-stick divergence H_{e^eps}(P || Q) = sum_o max(0, P(o) - e^eps Q(o)).

  Args:
    p: pmf of P, an array or a ``{outcome: probability}`` mapping.
    q: pmf of Q, aligned with ``p`` (same shape, or a mapping).
    epsilon: scalar or array of epsilons >= 0 (``inf`` allowed).

  Returns:
    A float, or a float64 array with the shape of ``epsilon``.

  >>> hockey_stick_divergence([0.5, 0.5], [0.25, 0.75], 0.0)
  0.25
  """
  pa, qa = align_pmfs(p, q)
  eps = _epsilons("epsilon", epsilon)
  out = _one_direction(pa, qa, eps.reshape(-1)).reshape(eps.shape)
  return float(out) if out.ndim == 0 else out


def privacy_profile(p: Any, q: Any, epsilons: Any) -> Any:
  """Exact privacy profile delta(eps) = max(H(P||Q), H(Q||P)) of one pair.

  Args:
    p: pmf of M(D).
    q: pmf of M(D'), for neighbours D, D'.
    epsilons: scalar or array of epsilons >= 0.

  Returns:
    delta(eps) as a float or float64 array.

  >>> import math
  >>> e = math.exp(1.0)
  >>> round(privacy_profile([e / (1 + e), 1 / (1 + e)], [1 / (1 + e), e / (1 + e)], 1.0), 12)
  0.0
  """
  pa, qa = align_pmfs(p, q)
  eps = _epsilons("epsilons", epsilons)
  flat = eps.reshape(-1)
  out = np.maximum(_one_direction(pa, qa, flat), _one_direction(qa, pa, flat)).reshape(eps.shape)
  return float(out) if out.ndim == 0 else out


def _epsilon_one_direction(p: np.ndarray, q: np.ndarray, delta: float) -> float:
  """Smallest eps >= 0 with H_{e^eps}(p||q) <= delta, solved exactly per segment."""
  support = p > 0
  p, q = p[support], q[support]
  inf_mass = math.fsum(p[q == 0])
  if inf_mass > delta:
    return math.inf
  finite = q > 0
  pf, qf = p[finite], q[finite]
  losses = np.log(pf) - np.log(qf)
  order = np.argsort(-losses, kind="stable")
  losses, pf, qf = losses[order], pf[order], qf[order]
  # For eps in [L_{j+1}, L_j): H(eps) = P_j - e^eps Q_j with the top-j outcomes.
  cum_p = inf_mass + np.cumsum(pf)
  cum_q = np.cumsum(qf)
  h0 = inf_mass + float(np.clip(pf - qf, 0, None).sum())
  if h0 <= delta:
    return 0.0
  # Walk the segments from the largest loss down. At the top breakpoint H equals
  # inf_mass <= delta, and each step checks H at the segment's lower end, so the
  # first segment whose lower end exceeds delta holds the crossing.
  for j in range(int(np.sum(losses > 0))):
    lower = max(float(losses[j + 1]), 0.0) if j + 1 < len(losses) else 0.0
    if cum_p[j] - math.exp(lower) * cum_q[j] > delta:
      eps = math.log((cum_p[j] - delta) / cum_q[j])
      return float(min(max(eps, lower), float(losses[j])))
  return 0.0


def epsilon_for_delta(p: Any, q: Any, delta: Any) -> float:
  """Smallest eps >= 0 with privacy_profile(p, q, eps) <= delta, exactly.

  The profile is piecewise of the form P_j - e^eps Q_j between consecutive
  privacy-loss values, so the inverse is solved in closed form per segment.
  Returns ``inf`` when mass that only one side can produce exceeds delta.

  Args:
    p: pmf of M(D).
    q: pmf of M(D').
    delta: target in [0, 1].
  """
  d = _validate.probability("delta", delta)
  pa, qa = align_pmfs(p, q)
  return max(_epsilon_one_direction(pa, qa, d), _epsilon_one_direction(qa, pa, d))


def worst_case_profile(pairs: Iterable[tuple[Any, Any]], epsilons: Any) -> Any:
  """delta(eps) maximised over several neighbouring pairs (p, q).

  Args:
    pairs: a non-empty iterable of ``(pmf of M(D), pmf of M(D'))`` for every
      neighbouring pair of interest (each pair aligned as in :func:`align_pmfs`).
    epsilons: scalar or array of epsilons >= 0 (``inf`` allowed).

  Raises:
    ValueError: ``pairs`` not an iterable of pairs (None, a number, a string,
      a mapping), empty, or an item that is not two pmfs (named ``pairs[i]``,
      with what :func:`align_pmfs` found wrong); ``epsilons`` negative, NaN
      or not real numbers.
  """
  eps = _epsilons("epsilons", epsilons)
  if not _validate.is_collection(pairs):  # None or 5: a TypeError
    raise ValueError(f"Expected pairs to be an iterable of (p, q) pmf pairs; got {type(pairs).__name__}.")
  best = np.zeros(eps.shape, dtype=np.float64)
  seen = False
  for i, pair in enumerate(pairs):
    items = tuple(pair) if _validate.is_collection(pair) else None
    if items is None or len(items) != 2:  # was "not enough values to unpack (expected 2, got 1)"
      got = type(pair).__name__ if items is None else f"{len(items)} item(s)"
      raise ValueError(f"Expected pairs[{i}] to be a pair (p, q) of pmfs; got {got}.")
    try:
      best = np.maximum(best, privacy_profile(items[0], items[1], eps))
    except ValueError as err:
      raise ValueError(f"Expected pairs[{i}] to be a pair of pmfs: {_validate.first_line(err)}") from None
    seen = True
  if not seen:
    raise ValueError("Expected at least one neighbouring pair in pairs.")
  return float(best) if best.ndim == 0 else best

