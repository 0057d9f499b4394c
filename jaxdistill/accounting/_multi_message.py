"""Exact privacy of the multi-message shuffle protocol for BSVS (computed, not quoted).

The protocol (adapting Ghazi, Kumar, Manurangsi, Pagh, ICML 2020; spec
REVERSE_KNN.md §1.9 and §4) runs independently on every entry j of the
flattened domain d = s|Y|. Each of the n clients sends its real messages
(one ``(j, +)`` per non-zero entry of A^i) plus Z1 ~ NB(1/n, p) copies of
``(j, +)``, Z2 ~ NB(1/n, p) copies of ``(j, -)`` and Z3 ~ NB(rho/n, p')
"flooding" copies of *both* ``(j, +)`` and ``(j, -)``. The shuffled multiset
of messages is exactly the vector of per-entry counts, and by infinite
divisibility of the negative binomial (sum_i NB(r_i, p) = NB(sum_i r_i, p))
the analyzer sees, independently for every entry,

.. math::

   V(x) = (x + G_1 + F,\\; G_2 + F), \\qquad G_1, G_2 \\sim \\mathrm{NB}(1, p),
   \\quad F \\sim \\mathrm{NB}(\\rho, p'),

where x = a_j is the true count. ``#(j,+) - #(j,-) = x + G1 - G2`` is x plus
discrete Laplace noise DLap(p) (Pr[z] = (1-p)/(1+p) p^{|z|}); F cancels in the
estimate but hides the individual counts, which is where delta comes from.

**A lossless reduction of the 2-D view.** With g(k) = (1-p)p^k,
Pr[V(0) = (u, v)] = (1-p)^2 p^{|u-v|} W(min(u, v)) for W(m) = sum_{f<=m}
Pr[F=f] p^{2(m-f)}, so the likelihood ratio Pr[V(0)=(u,v)] / Pr[V(1)=(u,v)]
depends on (u, v) only through T = min(u, v) if u <= v and T = ``*`` if
u > v. Grouping outcomes with equal likelihood ratio leaves every
hockey-stick divergence unchanged, and the grouped pair has a closed form:
with H = F + G' and G' ~ NB(1, p^2) (geometric),

.. math::

   P_0 = V(x):   \\Pr[*] = \\tfrac{p}{1+p},\\quad \\Pr[m] = \\tfrac{\\Pr[H=m]}{1+p}\\ (m \\ge 0);\\qquad
   P_1 = V(x+1): \\Pr[*] = \\tfrac{1}{1+p},\\quad \\Pr[m] = \\tfrac{p\\,\\Pr[H=m-1]}{1+p}\\ (m \\ge 1).

The privacy loss ln(P_0/P_1) is -a on ``*`` (p = e^{-a}) and
a + ln(Pr[H=m]/Pr[H=m-1]) on m; the outcome m = 0 is impossible under
V(x+1) (no "+" message beyond the known counts was sent), an infinite loss
of mass (1-p)(1-p')^rho. :func:`multi_message_pld` builds the PLD of this
pair with dp-accounting's ``from_two_probability_mass_functions``
(pessimistic), or, with ``lattice_size``, directly from the truncated 2-D
lattice pmfs (slow; the tests check both give the same numbers and check
both against brute-force enumeration of the whole view at n = 2 clients).

**Truncation.** Outcomes m > M (both sides) are moved onto two extra
outcomes that only one side can produce. The true pair is a post-processing
of the truncated pair (map each tail outcome back to a draw from the
conditional tail), so every profile computed here is an upper bound; M is
chosen so that the moved mass is below ``tail_mass`` (default 1e-30).

**Composition over entries (replace-one, n fixed).** Replacing one record
removes at most kr ones from A and adds at most kr ones, on different
entries, and entries carry independent noise, so the worst neighbouring pair
is the composition of kr pairs (V(x), V(x+1)) and kr pairs (V(x+1), V(x)).
Dropping a coordinate is post-processing, so fewer changes are never worse,
and the composed pair is symmetric: both directions of the hockey stick
share the distribution (P0||P1)^kr (x) (P1||P0)^kr. This direct composition
of 2kr unit shifts is exact (up to dp-accounting's pessimistic
discretisation). It replaces the seed's scaling of a sensitivity-2 histogram
protocol by group privacy, which would inflate delta to about kr e^eps delta
(spec §5, I3); and the noise is discrete Laplace, not Laplace (I3).
Add/remove neighbours are not covered: adding a client also adds its noise
shares (the total noise becomes NB((n+1)/n, p)), a different pair.

**Calibration** (:func:`calibrate_multi_message`): the DLap part gets the
share ``dlap_fraction`` of epsilon as pure DP over the 2kr shifts,
a = dlap_fraction * eps / (2kr) (the default 1/2 reproduces the paper's
Laplace(4kr/eps)-like accuracy); for each flooding rate b (p' = e^{-b}) on a
fixed grid of multiples of (1 - dlap_fraction) eps / (2kr) we find the least
rho meeting (eps, delta) by bisection -- delta(eps) is non-increasing in rho
because the view with rho + rho' is a post-processing of the view with rho
(add the same independent NB(rho', p') to both coordinates) -- and keep the
b with the fewest expected flooding messages. Communication per client is

.. math::

   \\mathbb E[\\#\\text{messages}] = kr + \\frac{2 d p}{n(1-p)} + \\frac{2 d \\rho p'}{n(1-p')}.

References:
  Ghazi, Kumar, Manurangsi, Pagh, "Private Counting from Anonymous Messages:
  Near-Optimal Accuracy with Vanishing Communication Overhead", ICML 2020
  (PMLR 119:3505-3514), the binary-sum and histogram protocols.
  Balle, Barthe, Gaboardi (2018), Thm. 1 (hockey-stick divergence).
  Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the Dots", 2022
  (https://arxiv.org/abs/2207.04380), pessimistic PLDs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from jaxdistill import _validate
from jaxdistill.accounting._mechanisms import MAX_GRID_POINTS, _check_vdi, _self_compose
from jaxdistill.accounting._relation import PrivacyStatement, Relation
from jaxdistill.accounting._shuffle import _MAX_EPS0

__all__ = [
    "MultiMessageNoise",
    "multi_message_pld",
    "multi_message_delta",
    "multi_message_epsilon",
    "multi_message_expected_messages",
    "calibrate_multi_message",
    "min_calibration_epsilon",
]

#: Mass moved onto the pessimistic tail outcomes when truncating the view.
DEFAULT_TAIL_MASS = 1e-30
#: Flooding rates tried by the calibration, as multiples of (1 - f) eps / (2kr).
DEFAULT_FLOOD_MULTIPLIERS = (0.5, 1.0, 2.0, 4.0)
#: Largest target epsilon of the calibration (the single-message cap, ``_shuffle._MAX_EPS0``). It keeps
#: a = f eps/(2kr) < 30, so p = e^{-a} > 2^-44 and 1 - p, p^2 stay resolvable in float64; at
#: a > 37 (p < 2^-53) dp-accounting's PLD construction breaks down (an IndexError at eps = 150).
MAX_CALIBRATION_EPSILON = _MAX_EPS0
#: Most outcomes of the truncated 1-D view the accounting builds a PLD from. The PLD construction loops
#: over outcomes in Python: 1.4e5 outcomes (target eps = 1e-3) take about 95 s to calibrate, 1.4e6
#: (eps = 1e-4) more than 5 minutes and several GiB, and eps = 1e-6 exhausted 24 GiB of memory.
MAX_VIEW_OUTCOMES = 2**18
#: Largest k, r (each), num_clients, d and c: counts that must become float64 (Python ints past ~1.8e308
#: cannot, an OverflowError); 10^18 is far beyond any domain or client count the protocol is run with.
MAX_COUNT = 10**18
#: Largest k r (unit shifts per record, each direction): the accounting self-composes the view's PLD
#: k r times, so this bounds its work (k and r are each at most ``MAX_COUNT``). The composed grid's size
#: depends on the noise as much as on k r: at p = e^-0.25, rho = 40, p' = e^-0.5 (step 1e-4) k r = 1e3, 1e4,
#: 3e4, 1e5 took 2 s, 8 s, 14 s, 43 s and 0.5, 1.1, 1.7, 3.8 GiB (2.4e7 points), and 1e6 a MemoryError;
#: p = e^-0.01, rho = 10, p' = e^-0.5 at 1e6 took 28 s and 2.2 GiB, p = e^-0.001, rho = 200, p' = 1/2 7 s
#: and 0.5 GiB. So the bound stays; a composition whose FFT would exceed ``MAX_FFT_POINTS`` is refused before it
#: runs (the first example at 1e6: 1.8e8 points, refused in 0.1 s), and a MemoryError is still a ValueError.
MAX_SHIFTS = 10**6
#: Exceptions dp-accounting raises while building or composing a PLD too large or too extreme for it.
_PLD_ERRORS = (MemoryError, IndexError, OverflowError, ZeroDivisionError, FloatingPointError, ValueError)
#: Largest ``lattice_size`` of :func:`multi_message_pld` (the optional 2-D check): its box has
#: (lattice_size + 1)^2 outcomes, each a Python dict entry on both sides. At p = e^-0.25, rho = 40,
#: p' = e^-0.5 sizes 36, 512, 1024, 2048 and 4096 took 0.03 s, 1.6 s, 5.5 s, 30 s and 160 s (7.4 GiB);
#: the library and its tests use 36, and 10^6 allocated until memory ran out.
MAX_LATTICE_SIZE = 4096
#: Smallest relative precision ``rtol`` of the calibrated rho: float64 resolves relative steps of
#: 2^-52 ~ 2.2e-16 (rtol = 1e-17 looped forever once the bracket's ends were adjacent floats).
MIN_RTOL = 1e-15


@dataclasses.dataclass(frozen=True)
class MultiMessageNoise:
  """Central noise parameters of the multi-message protocol (per entry).

  Each client draws NB(1/n, p) for each of its two geometric shares and
  NB(rho/n, p') for its flooding share; summed over n clients these are
  NB(1, p) (geometric) and NB(rho, p').

  Attributes:
    p: discrete-Laplace parameter in (0, 1); the estimate's noise is DLap(p),
      variance 2p/(1-p)^2.
    rho: total flooding shape > 0.
    p_flood: flooding parameter p' in (0, 1); F ~ NB(rho, p'), mean
      rho p'/(1-p').
  """

  p: float
  rho: float
  p_flood: float

  def __post_init__(self):
    object.__setattr__(self, "p", _validate.open_unit("p", self.p))
    object.__setattr__(self, "rho", _validate.positive("rho", self.rho))
    object.__setattr__(self, "p_flood", _validate.open_unit("p_flood", self.p_flood))

  @property
  def dlap_a(self) -> float:
    """a = -ln p (the discrete Laplace is exp(-a|z|)-shaped)."""
    return -math.log(self.p)

  @property
  def flood_b(self) -> float:
    """b = -ln p'."""
    return -math.log(self.p_flood)

  @property
  def entry_variance(self) -> float:
    """Variance of DLap(p), 2p/(1-p)^2: the estimate's per-entry variance."""
    return 2.0 * self.p / (1.0 - self.p) ** 2

  def to_dict(self) -> dict[str, float]:
    return {"p": self.p, "rho": self.rho, "p_flood": self.p_flood,
            "dlap_a": self.dlap_a, "flood_b": self.flood_b}


def _shifts(k: Any, r: Any) -> int:
  """k r, each of k and r an integer in [1, ``MAX_COUNT``] and their product at most ``MAX_SHIFTS``."""
  k = _validate.integer("k", k, minimum=1, maximum=MAX_COUNT)
  r = _validate.integer("r", r, minimum=1, maximum=MAX_COUNT)
  if k * r > MAX_SHIFTS:
    raise ValueError(f"Expected k * r = {k} * {r} = {k * r} <= {MAX_SHIFTS}: the accounting composes that many "
                     "unit shifts per record.")
  return k * r


#: Smallest ``tail_mass`` :func:`multi_message_pld` takes (its half stays a normal float64).
MIN_TAIL_MASS = 1e-300


def _check_noise(noise: Any) -> "MultiMessageNoise":
  if not isinstance(noise, MultiMessageNoise):
    raise ValueError(f"Expected noise to be a MultiMessageNoise; got {type(noise).__name__} {noise!r:.80}.")
  return noise


def _geometric_window(a: float, tail_mass: float) -> int:
  """Least j with Pr[G' > j] = p^{2(j+1)} <= tail_mass / 2 for G' ~ Geom(p^2), p = e^{-a}."""
  return max(0, int(math.ceil(math.log(tail_mass / 2) / (-2.0 * a))) - 1)


def min_calibration_epsilon(*, k: Any = 1, r: Any = 1, dlap_fraction: Any = 0.5) -> float:
  """Smallest target epsilon :func:`calibrate_multi_message` accepts for these settings.

  The discrete-Laplace part p = e^{-a}, a = dlap_fraction * eps / (2kr), alone
  needs about ln(2 / tail_mass) / (2a) outcomes; the bound keeps that at half
  of 2^18 outcomes (``MAX_VIEW_OUTCOMES``), leaving the other half to the flooding part.
  About 1.06e-3 at k = r = 1 and dlap_fraction = 1/2.

  >>> round(min_calibration_epsilon(), 5)
  0.00106
  """
  shifts = _shifts(k, r)
  fraction = _validate.open_unit("dlap_fraction", dlap_fraction)
  a = math.log(2.0 / DEFAULT_TAIL_MASS) / (2.0 * (MAX_VIEW_OUTCOMES // 2))
  least = 2.0 * shifts * a / fraction
  if not math.isfinite(least):  # dlap_fraction=5e-324 returned inf
    raise ValueError(f"Expected dlap_fraction={fraction!r} large enough for a finite epsilon; 2kr a / dlap_fraction "
                     "overflows.")
  return least


def _check_flood_mean(noise: MultiMessageNoise, tail_mass: float) -> None:
  """Refuses a flooding F ~ NB(rho, p') whose mean rho p'/(1-p') alone exceeds ``MAX_VIEW_OUTCOMES``.

  The truncation window holds all but ``tail_mass`` of F, so it is at least the mean; such a view would be
  refused anyway, and SciPy's ``nbinom.isf`` never returns at rho = 1e25 (p' = 1/2), so check first.
  """
  mean = noise.rho * noise.p_flood / (1.0 - noise.p_flood)
  if not mean < MAX_VIEW_OUTCOMES:
    raise ValueError(f"Expected noise={noise} whose view fits in {MAX_VIEW_OUTCOMES} outcomes at tail mass "
                     f"{tail_mass:g}; its flooding alone has mean rho*p_flood/(1-p_flood) = {mean:.3g} "
                     f"(rho={noise.rho!r}). Use a smaller rho or p_flood.")


def _grid_step(p0: dict, p1: dict, vdi: float) -> float:
  """``vdi``, coarsened to 2 x loss range / MAX_GRID_POINTS where a finer step would exceed that many points.

  As :class:`~jaxdistill.accounting.MechanismAccount` does: a pessimistic PLD on a coarser grid is still an
  upper bound. (A finer step was refused, although 1e-6 computed fine before; 1e-300 was a MemoryError.)
  """
  losses = [p1[o] - p0[o] for o in p0 if o in p1 and math.isfinite(p0[o]) and math.isfinite(p1[o])]
  width = max(losses) - min(losses) if losses else 0.0
  return max(vdi, 2.0 * width / MAX_GRID_POINTS)


def _h_log_pmf(noise: MultiMessageNoise, tail_mass: float) -> tuple[np.ndarray, float]:
  """log Pr[H = m] for m = 0..M and Pr[H > M], H = F + G', G' ~ Geom(p^2).

  M is the smallest window such that Pr[F > M_F] + Pr[G' > M_G] <= tail_mass
  with M = M_F + M_G; the returned tail is the exact Pr[H > M]
  = Pr[F > M] + p^2 Pr[H = M] / (1 - p^2).
  """
  p, rho, pf = noise.p, noise.rho, noise.p_flood
  _check_flood_mean(noise, tail_mass)
  f_dist = stats.nbinom(rho, 1.0 - pf)  # scipy: pmf C(k+rho-1,k) (1-pf)^rho pf^k
  m_g = _geometric_window(noise.dlap_a, tail_mass)
  m_f = f_dist.isf(tail_mass / 2)
  if not m_f + m_g < MAX_VIEW_OUTCOMES:  # also catches an infinite or NaN isf
    raise ValueError(f"Expected noise={noise} whose view fits in {MAX_VIEW_OUTCOMES} outcomes at tail mass "
                     f"{tail_mass:g}; it needs about {m_f + m_g:.3g} (discrete-Laplace part {m_g}, flooding "
                     f"part {m_f:.3g}). Use a larger epsilon (larger a = -ln p) or less flooding.")
  m_f = int(m_f)
  while f_dist.sf(m_f) > tail_mass / 2:  # guard against isf rounding
    m_f += 1
  log_p2 = 2.0 * math.log(p)
  big_m = m_f + m_g
  m = np.arange(big_m + 1)
  log_f = f_dist.logpmf(m)
  # Pr[H=m] = (1-p^2) p^{2m} sum_{f<=m} Pr[F=f] p^{-2f}, accumulated in log space.
  acc = np.logaddexp.accumulate(log_f - log_p2 * m)
  log_h = math.log1p(-p * p) + log_p2 * m + acc
  tail = float(f_dist.sf(big_m)) + p * p * math.exp(log_h[-1]) / (1.0 - p * p)
  return log_h, tail


def _reduced_log_pmfs(noise: MultiMessageNoise, tail_mass: float) -> tuple[dict, dict]:
  """Log-pmfs of the grouped view (T under V(x), T under V(x+1)), truncated."""
  p = noise.p
  log_h, tail = _h_log_pmf(noise, tail_mass)
  big_m = len(log_h) - 1
  l1p = math.log1p(p)
  lp = math.log(p)
  p0 = {"*": lp - l1p}
  p1 = {"*": -l1p}
  for m, lh in enumerate(log_h.tolist()):
    p0[m] = lh - l1p
    if m >= 1:
      p1[m] = lp + log_h[m - 1] - l1p
  # Pessimistic tails: P0 mass on m > M, P1 mass on m > M (= p Pr[H >= M]/(1+p)),
  # each on an outcome only its own side produces.
  t0 = tail / (1.0 + p)
  t1 = p * (math.exp(log_h[big_m]) + tail) / (1.0 + p)
  p0["tail:x"] = math.log(t0) if t0 > 0 else -math.inf
  p1["tail:x+1"] = math.log(t1) if t1 > 0 else -math.inf
  return p0, p1


def _lattice_log_pmfs(noise: MultiMessageNoise, size: int) -> tuple[dict, dict]:
  """Log-pmfs of the 2-D view (U, V) in [0, size]^2 under V(x) and V(x+1).

  Pr[V(0) = (u, v)] = (1-p)^2 p^{|u-v|} W(min(u, v)) with
  W(m) = sum_{f <= m} Pr[F=f] p^{2(m-f)} = Pr[H=m] / (1-p^2). Mass outside the
  box goes onto one-sided tail outcomes (bounded by Pr[U > size] + Pr[V > size]).
  """
  p, rho, pf = noise.p, noise.rho, noise.p_flood
  f_dist = stats.nbinom(rho, 1.0 - pf)
  m = np.arange(size + 2)
  log_f = f_dist.logpmf(m)
  log_w = 2 * math.log(p) * m + np.logaddexp.accumulate(log_f - 2 * math.log(p) * m)
  u, v = np.meshgrid(np.arange(size + 1), np.arange(size + 1), indexing="ij")
  log_p0 = 2 * math.log1p(-p) + np.abs(u - v) * math.log(p) + log_w[np.minimum(u, v)]
  # V(x+1) at (u, v) = V(x) at (u-1, v); impossible at u = 0.
  um = np.maximum(u - 1, 0)
  log_p1 = np.where(u >= 1, 2 * math.log1p(-p) + np.abs(um - v) * math.log(p) + log_w[np.minimum(um, v)],
                    -np.inf)

  def sf_coordinate(level: int) -> float:
    """Pr[G + F > level] for G ~ Geom(p): sum_{f<=level} Pr[F=f] p^{level-f+1} + Pr[F > level]."""
    f = np.arange(level + 1)
    return float(np.sum(np.exp(f_dist.logpmf(f) + (level - f + 1) * math.log(p)))) + float(f_dist.sf(level))

  t0 = 2 * sf_coordinate(size)
  t1 = sf_coordinate(size - 1) + sf_coordinate(size)
  p0 = {(int(a), int(b)): float(c) for a, b, c in zip(u.ravel(), v.ravel(), log_p0.ravel())}
  p1 = {(int(a), int(b)): float(c) for a, b, c in zip(u.ravel(), v.ravel(), log_p1.ravel())}
  # A box wide enough holds all but an underflowing mass: log(0) was a bare "math domain error" at size 4096.
  p0["tail:x"] = math.log(t0) if t0 > 0 else -math.inf
  p1["tail:x+1"] = math.log(t1) if t1 > 0 else -math.inf
  return p0, p1


@functools.lru_cache(maxsize=128)
def _cached_pld(noise: MultiMessageNoise, shifts: int, vdi: float, tail_mass: float,
                lattice_size: int | None) -> pld_lib.PrivacyLossDistribution:
  if lattice_size is None:
    p0, p1 = _reduced_log_pmfs(noise, tail_mass)
  else:
    try:
      p0, p1 = _lattice_log_pmfs(noise, lattice_size)
    except MemoryError:  # lattice_size = 10^6 was a bare numpy _ArrayMemoryError (a 10^12-point lattice)
      raise ValueError(f"Expected lattice_size={lattice_size} small enough for its (lattice_size + 1)^2 "
                       "outcomes to fit in memory.") from None
  vdi = _grid_step(p0, p1, vdi)
  # The composed grid grows with k r and the noise's loss: k r = 10^6 at p = e^-0.25 raised a bare
  # MemoryError (std::bad_alloc) from the FFT, and a view with much infinite loss an IndexError once its
  # finite mass was all truncated. (numpy's _ArrayMemoryError is a MemoryError.)
  try:
    # dp-accounting: privacy loss ln(upper/lower) under ``upper``.
    up = pld_lib.from_two_probability_mass_functions(p1, p0, pessimistic_estimate=True,
                                                     value_discretization_interval=vdi, symmetric=False)
    down = pld_lib.from_two_probability_mass_functions(p0, p1, pessimistic_estimate=True,
                                                       value_discretization_interval=vdi, symmetric=False)
    if shifts > 1:  # refused before it runs when its FFT would exceed MAX_FFT_POINTS
      up, down = _self_compose(up, shifts), _self_compose(down, shifts)
    return up.compose(down)
  except _PLD_ERRORS as err:
    raise ValueError(f"dp-accounting could not compose the PLD of k*r={shifts} unit shifts each way for "
                     f"noise={noise} at grid step {vdi:.3g} ({_validate.describe_error(err, limit=120)}); "
                     "use a smaller k*r or a coarser value_discretization_interval.") from None


def multi_message_pld(noise: MultiMessageNoise, *, k: Any = 1, r: Any = 1,
                      value_discretization_interval: Any = 1e-4, tail_mass: Any = DEFAULT_TAIL_MASS,
                      lattice_size: Any = None) -> pld_lib.PrivacyLossDistribution:
  """Pessimistic PLD of the whole shuffled view under replace-one (kr up + kr down shifts).

  Args:
    noise: the central noise parameters.
    k: buckets per record (k r <= ``MAX_SHIFTS``).
    r: labels per record.
    value_discretization_interval: dp-accounting grid step, in (0,
      ``MAX_GRID_INTERVAL``]; one so fine that one release's loss range would
      take more than ``MAX_GRID_POINTS`` points is coarsened to fit (the PLD
      stays an upper bound).
    tail_mass: mass moved onto pessimistic tail outcomes (reduced view only), in
      [``MIN_TAIL_MASS`` = 1e-300, 1).
    lattice_size: if given, an integer in [2, ``MAX_LATTICE_SIZE``] (4096):
      build each entry's pair from the 2-D lattice [0, lattice_size]^2
      instead of the lossless 1-D reduction (for checks; the box's outside
      mass is added pessimistically).

  Returns:
    A ``PrivacyLossDistribution`` whose ``get_delta_for_epsilon`` and
    ``get_epsilon_for_delta`` are upper bounds for the protocol.
  """
  _check_noise(noise)
  shifts = _shifts(k, r)
  vdi = _check_vdi(value_discretization_interval)
  tail = _validate.open_unit("tail_mass", tail_mass)
  if tail < MIN_TAIL_MASS:  # 5e-324 failed with "math domain error" (tail_mass / 2 underflows to 0)
    raise ValueError(f"Expected tail_mass={tail!r} >= {MIN_TAIL_MASS:g}: the truncation windows use tail_mass / 2 "
                     "and its logarithm.")
  size = None if lattice_size is None else _validate.integer("lattice_size", lattice_size, minimum=2,
                                                               maximum=MAX_LATTICE_SIZE)
  return _cached_pld(noise, shifts, vdi, tail, size)


def multi_message_delta(noise: MultiMessageNoise, epsilon: Any, *, k: Any = 1, r: Any = 1,
                        value_discretization_interval: Any = 1e-4) -> float:
  """delta(eps) (upper bound) of the protocol under replace-one.

  >>> n = MultiMessageNoise(p=math.exp(-0.25), rho=40.0, p_flood=math.exp(-0.5))
  >>> multi_message_delta(n, 1.0) < 1e-6
  True
  """
  eps = _validate.nonnegative("epsilon", epsilon)
  pld = multi_message_pld(noise, k=k, r=r, value_discretization_interval=value_discretization_interval)
  return float(min(1.0, pld.get_delta_for_epsilon(eps)))


def multi_message_epsilon(noise: MultiMessageNoise, delta: Any, *, k: Any = 1, r: Any = 1,
                          value_discretization_interval: Any = 1e-4) -> float:
  """Smallest epsilon (upper bound) at which the protocol is (eps, delta)-DP, replace-one."""
  d = _validate.open_unit("delta", delta)
  pld = multi_message_pld(noise, k=k, r=r, value_discretization_interval=value_discretization_interval)
  return float(pld.get_epsilon_for_delta(d))


def multi_message_expected_messages(noise: MultiMessageNoise, *, num_clients: Any, d: Any,
                                    c: Any) -> float:
  """Expected messages per client: c + 2dp/(n(1-p)) + 2d rho p'/(n(1-p')).

  Args:
    noise: central noise parameters.
    num_clients: n, in [1, ``MAX_COUNT``].
    d: flattened domain size s|Y|, in [1, ``MAX_COUNT``].
    c: real messages per client (kr for a full client), in [0, ``MAX_COUNT``].
  """
  noise = _check_noise(noise)
  n = _validate.integer("num_clients", num_clients, minimum=1, maximum=MAX_COUNT)
  d = _validate.integer("d", d, minimum=1, maximum=MAX_COUNT)
  c = _validate.integer("c", c, minimum=0, maximum=MAX_COUNT)
  p, rho, pf = noise.p, noise.rho, noise.p_flood
  expected = c + 2.0 * d * p / (n * (1.0 - p)) + 2.0 * d * rho * pf / (n * (1.0 - pf))
  if not math.isfinite(expected):  # rho=1e308 returned inf
    raise ValueError(f"Expected noise={noise} with a finite expected message count; 2d rho p_flood / (n (1 - p_flood)) "
                     f"overflows (rho={rho!r}).")
  return expected


#: Below this delta(eps), a doubling of rho that does not halve it means the PLD is at its float64 floor
#: (about 5e-16: rounding in dp-accounting's sums). Far above the floor, delta falls geometrically in rho.
_FLOOR_ZONE = 1e-13


def _stalled(history: list[float]) -> bool:
  """True when the last two doublings of rho each failed to halve delta(eps), inside ``_FLOOR_ZONE``.

  delta(eps) is non-increasing in rho and, once below ``_FLOOR_ZONE``, decays
  like e^{-c rho}: a doubling squares it. Two doublings in a row that do not
  halve it are float64 rounding, and more rho will not reach a smaller
  target; without this check each flood multiplier went on doubling rho to the
  view's outcome cap (about 60 s for delta = 1e-300).
  """
  if len(history) < 3:
    return False
  a, b, c = history[-3:]
  return c < _FLOOR_ZONE and b > 0.5 * a and c > 0.5 * b


def _least_rho(p: float, pf: float, eps: float, delta: float, shifts: int, vdi: float,
               rtol: float) -> float:
  """Least rho (to relative ``rtol``, from above) with delta(eps) <= delta."""

  def delta_at(rho: float) -> float:
    noise = MultiMessageNoise(p, rho, pf)
    return _cached_pld(noise, shifts, vdi, DEFAULT_TAIL_MASS, None).get_delta_for_epsilon(eps)

  def ok(rho: float) -> bool:
    return delta_at(rho) <= delta

  lo, hi = 0.0, 1.0
  history = [delta_at(hi)]
  while history[-1] > delta:
    lo, hi = hi, 2.0 * hi
    if hi > 2.0**24:
      raise ValueError(
          f"No flooding rho <= 2^24 meets epsilon={eps}, delta={delta} with p={p}, p_flood={pf}; "
          f"delta may be below what the PLD can certify (~1e-15).")
    history.append(delta_at(hi))
    if _stalled(history):
      raise ValueError(
          f"No flooding rho meets epsilon={eps}, delta={delta} with p={p}, p_flood={pf}: the PLD's "
          f"delta(epsilon) stopped falling at {history[-1]:.3g} (rho={hi:g}), its float64 floor; "
          f"delta is below what the PLD can certify.")
  if lo == 0.0:
    lo = hi / 2.0
    while ok(lo) and lo > 1e-6:
      hi, lo = lo, lo / 2.0
  while hi / lo > 1.0 + rtol:
    mid = math.sqrt(lo * hi)
    if mid in (lo, hi):  # adjacent floats: no finer bracket exists
      break
    if ok(mid):
      hi = mid
    else:
      lo = mid
  return hi


@functools.lru_cache(maxsize=64)
def _calibrate(eps: float, delta: float, shifts: int, fraction: float, multipliers: tuple[float, ...],
               rtol: float, vdi: float) -> MultiMessageNoise:
  a = fraction * eps / (2 * shifts)
  p = math.exp(-a)
  base_b = (1.0 - fraction) * eps / (2 * shifts)
  best = None
  failures = []
  for mult in multipliers:
    pf = math.exp(-mult * base_b)
    # Coarse pass (1% on rho) to choose b; the chosen b is refined below. A b for which no
    # rho <= 2^24 suffices (a large b at a large eps needs rho ~ ln(1/delta) e^b) is skipped.
    try:
      rho = _least_rho(p, pf, eps, delta, shifts, vdi, max(rtol, 1e-2))
    except ValueError as err:
      failures.append(str(err))
      continue
    cost = rho * pf / (1.0 - pf)
    if best is None or cost < best[0]:
      best = (cost, pf)
  if best is None:
    more = f" (and {len(failures) - 1} more like it)" if len(failures) > 1 else ""
    # The failures name noise=..., which the caller never passed: say which of their settings drives it.
    hint = (f" The flooding gets (1 - dlap_fraction) = {1.0 - fraction:.3g} of epsilon: lower dlap_fraction="
            f"{fraction!r}." if fraction > 0.5 else "")
    raise ValueError(f"No flood multiplier in {multipliers} calibrates epsilon={eps}, delta={delta} with "
                     f"dlap_fraction={fraction!r}: {failures[0]}{more}{hint}")
  pf = best[1]
  rho = _least_rho(p, pf, eps, delta, shifts, vdi, rtol)
  return MultiMessageNoise(p, rho, pf)


def _check_flood_multipliers(value: Any) -> tuple[float, ...]:
  """``value`` as a non-empty tuple of finite floats > 0; errors name ``flood_multipliers`` and the bad entry.

  An entry's error said "Expected flood_multipliers=-1.0 > 0" (the entry's value under the sequence's name), and
  a string was read character by character ("Expected flood_multipliers to be a real number, got 'a'").
  """
  try:
    if not _validate.is_collection(value):
      raise TypeError
    entries = list(value)
  except TypeError:  # also a 0-d array, which has __iter__ but no entries
    raise ValueError(f"Expected flood_multipliers to be a sequence of positive numbers; got "
                     f"{_validate.shown(value)}.") from None
  mults = tuple(_validate.positive(f"flood_multipliers[{i}]", m) for i, m in enumerate(entries))
  if not mults:
    raise ValueError(f"Expected flood_multipliers to hold at least one multiplier; got {_validate.shown(value)}.")
  return mults


def calibrate_multi_message(target_epsilon: Any, target_delta: Any, *, k: Any = 1, r: Any = 1,
                            dlap_fraction: Any = 0.5,
                            flood_multipliers: Any = DEFAULT_FLOOD_MULTIPLIERS, rtol: Any = 1e-3,
                            value_discretization_interval: Any = 1e-4) -> MultiMessageNoise:
  """Noise parameters (p, rho, p') meeting (target_epsilon, target_delta), replace-one.

  The search (see the module docstring): a = dlap_fraction * eps / (2kr) fixes
  p = e^{-a}; for each b = m (1 - dlap_fraction) eps / (2kr), m in
  ``flood_multipliers``, the least rho with delta(eps) <= target is found by
  bisection (delta is non-increasing in rho), and the b with the fewest
  expected flooding messages (proportional to rho p'/(1-p')) is kept and its
  rho refined to relative ``rtol``. A b whose least rho exceeds 2^24 (at
  large eps the largest multipliers need rho ~ ln(1/delta) e^b) is skipped.
  The returned rho is the verified end of the final bracket: the result
  meets the target, and rho / (1 + rtol) does not.

  Args:
    target_epsilon: in [:func:`min_calibration_epsilon`, 60].
    target_delta: in (0, 1).
    k: buckets per record (k r <= ``MAX_SHIFTS``).
    r: labels per record.
    dlap_fraction: share of epsilon spent on the discrete Laplace part, in
      (0, 1). Larger means less estimation noise and more flooding.
    flood_multipliers: positive multipliers m of (1 - f) eps / (2kr) tried for
      b, each with p' = e^{-b} in (0, 1) in float64.
    rtol: relative precision of rho, in [``MIN_RTOL`` = 1e-15, 0.1].
    value_discretization_interval: dp-accounting grid step, in (0,
      ``MAX_GRID_INTERVAL``].

  Returns:
    The calibrated :class:`MultiMessageNoise`.

  Raises:
    ValueError: on bad arguments (target_epsilon below
      :func:`min_calibration_epsilon`), or when no rho reaches the target for
      any multiplier (delta below what a pessimistic PLD certifies in
      float64: about 5e-16 at kr = 1, 2.5e-15 at kr = 3; the search stops
      once two doublings of rho fail to halve delta(eps) below 1e-13), or a
      view larger than 2^18 outcomes).

  >>> noise = calibrate_multi_message(1.0, 1e-6)
  >>> round(noise.dlap_a, 6), multi_message_delta(noise, 1.0) <= 1e-6
  (0.25, True)
  """
  eps = _validate.positive("target_epsilon", target_epsilon)
  if eps > MAX_CALIBRATION_EPSILON:
    raise ValueError(f"Expected target_epsilon={eps!r} <= {MAX_CALIBRATION_EPSILON:g}: the calibration "
                     f"supports epsilon in (0, {MAX_CALIBRATION_EPSILON:g}] (beyond it the noise parameter "
                     f"p = e^(-f eps/(2kr)) is too small for the PLD in float64).")
  delta = _validate.open_unit("target_delta", target_delta)
  shifts = _shifts(k, r)
  fraction = _validate.open_unit("dlap_fraction", dlap_fraction)
  least = min_calibration_epsilon(k=k, r=r, dlap_fraction=fraction)
  if eps < least:
    raise ValueError(f"Expected target_epsilon={eps!r} >= {least:.3g}, the smallest epsilon the calibration "
                     f"supports at k={k}, r={r}, dlap_fraction={fraction:g}: below it the exact view needs more "
                     f"than {MAX_VIEW_OUTCOMES} outcomes (minutes to hours of accounting and many GiB).")
  mults = _check_flood_multipliers(flood_multipliers)
  base_b = (1.0 - fraction) * eps / (2 * shifts)  # as in _calibrate
  for i, mult in enumerate(mults):
    # A multiplier whose p_flood rounded to 0 or 1 was refused under the name p_flood, not the caller's.
    if not 0.0 < math.exp(-mult * base_b) < 1.0:
      raise ValueError(f"Expected flood_multipliers[{i}]={mult!r} to give a flooding probability "
                       f"p' = e^(-m (1 - dlap_fraction) eps/(2kr)) in (0, 1); it gives {math.exp(-mult * base_b)!r} "
                       f"at target_epsilon={eps!r}, dlap_fraction={fraction!r}, k*r={shifts}.")
  rtol = _validate.relative_tolerance("rtol", rtol, minimum=MIN_RTOL)
  vdi = _check_vdi(value_discretization_interval)
  return _calibrate(eps, delta, shifts, fraction, mults, rtol, vdi)


def multi_message_statement(noise: MultiMessageNoise, epsilon: float, *, k: int, r: int,
                            extra_delta: float = 0.0, parameters: dict | None = None,
                            value_discretization_interval: float = 1e-4) -> PrivacyStatement:
  """PrivacyStatement at ``epsilon`` (delta from the PLD plus ``extra_delta``)."""
  delta = multi_message_delta(noise, epsilon, k=k, r=r,
                              value_discretization_interval=value_discretization_interval)
  params = {**noise.to_dict(), "shifts": 2 * k * r, "value_discretization_interval":
            value_discretization_interval, **(parameters or {})}
  return PrivacyStatement(mechanism="shuffle-multi-message", relation=Relation.REPLACE_ONE,
                          epsilon=float(epsilon), delta=min(1.0, delta + extra_delta), count=1,
                          method="pld", parameters=params)
