"""Splitting a total (epsilon, delta) over T labeling iterations, composed exactly.

Each iteration t of Algorithm 1 releases one noisy vote matrix A_t. The
queries of iteration t depend on public data and on A_1..A_{t-1} only
(through the student), so the T releases are an *adaptive* composition.
The split (spec/REVERSE_KNN.md §5, I10: the paper does not specify it) is
equal across iterations and is composed as follows:

==================  =========================================================
mechanism           rule
==================  =========================================================
central (pure)      delta = 0: eps_t = eps/T, rounded down so that T*eps_t
                    <= eps exactly; pure epsilons add.
central (delta>0)   the least noise whose T-fold release is (eps, delta)-DP
                    by dp-accounting's PLD of the exact worst pair: T*Delta
                    unit shifts of a sensitivity-1 discrete Laplace (or
                    Laplace), Delta = 2kr (replace-one).
local-rr, -collision  eps_t = eps/T (rounded down), pure LDP epsilons add; every record
                    sends one message per iteration.
shuffle-single      T = 1: the target itself. 1 < T <= 100 with n given
                    (``num_clients``; ``run_labeling`` gives it):
                    delta_t = delta/(2T) and an eps_t such that the T-fold
                    composition of the clone reduction's pair PLD
                    (``accounting.clone_pld``) at the eps0 that
                    (eps_t, delta_t, n) calibrates is (eps', delta)-DP with
                    eps' within 0.1% below eps. At n = 60,000 and
                    (1, 1e-6) this gives eps0 6.00 instead of 5.28 at T = 2
                    and 5.14 instead of 3.59 at T = 5. Otherwise (n not
                    given, or T > 100): delta_t = delta/(2T) and the
                    largest eps_t such that the PLD of T worst-case
                    (eps_t, delta_t)-DP mechanisms
                    (``from_privacy_parameters``; optimal composition of
                    Kairouz, Oh, Viswanath) is (eps, delta)-DP.
shuffle-multi       T = 1: the target itself. 1 < T <= 100: delta_t =
                    delta/(2T) and an eps_t such that the T-fold
                    composition of the noise's own PLD (the one its
                    statement comes from: 2kr unit shifts of the per-entry
                    view) is (eps', delta (1 - 1e-3))-DP with eps' within
                    0.1% below eps; the 1e-3 share of delta is
                    kept for the sampler's total-variation term, which
                    ``build_mechanism`` checks once n is known. The
                    worst-case pairs' split leaves budget unused: at
                    (1, 0.01), T = 2, k = 2 its noise composes to epsilon
                    0.46 (tests/audit/test_shuffle_release_audit.py). This
                    gives eps_t 0.99 instead of 0.51 there, 0.69 instead
                    of 0.50 at (1, 1e-6), T = 2, k = 1, and 0.153 instead
                    of 0.056 at T = 20. T > 100 (each step calibrates the
                    noise, 1-10 s; plans take 3-5 steps): the pairs.
none                no privacy (eps = inf).
==================  =========================================================

Adaptivity is covered: for the central mechanisms and both shuffle
mechanisms the worst pair of every iteration is the same whatever the
queries (Delta = 2kr always and the same noise each time; the clone pair
depends on eps0 and n only), and the (eps, delta) pairs'
PLD is the worst case over all (eps_t, delta_t)-DP mechanisms, so these PLD
compositions hold adaptively; pure epsilons add adaptively.
"""

from __future__ import annotations

import dataclasses
import fractions
import functools
import math
from collections.abc import Callable
from typing import Any

from dp_accounting.pld import privacy_loss_distribution as pld_lib
import numpy as np

from jaxdistill import _validate
from jaxdistill import accounting
from jaxdistill.accounting import Relation
from jaxdistill.accounting._mechanisms import _lattice_pld, _pld_epsilon
from jaxdistill.accounting._multi_message import (MAX_CALIBRATION_EPSILON, MultiMessageNoise, calibrate_multi_message,
                                                  min_calibration_epsilon, multi_message_pld)
from jaxdistill.accounting._shuffle import _MAX_EPS0 as SHUFFLE_MAX_EPSILON
from jaxdistill.accounting._shuffle import MAX_NUMERIC_N
from jaxdistill.accounting._shuffle import _composed_epsilon as _clone_composed
from jaxdistill.mechanisms import bsvs_sensitivity
from jaxdistill.mechanisms._shuffle_single import _amplification as shuffle_single_amplification

__all__ = [
    "BudgetPlan", "plan_budget", "compose_pairs_epsilon", "MAX_EXACT_SHUFFLE_T", "MULTI_MESSAGE_TV_RESERVE",
]


@dataclasses.dataclass(frozen=True)
class BudgetPlan:
  """How the total budget is spent over T iterations.

  Attributes:
    mechanism: the labeling mechanism (``central``, ``local-rr``, ...).
    total_epsilon: the asked total epsilon.
    total_delta: the asked total delta.
    iterations: T.
    epsilon_per_iteration: the epsilon each iteration's mechanism is built with.
    delta_per_iteration: the delta each iteration's mechanism is built with.
    composed_epsilon: epsilon of the T-fold composition at ``composed_delta``
      (<= total_epsilon), as computed by ``method``.
    composed_delta: delta of the composition (<= total_delta).
    method: ``pure-sum``, ``pld`` (central, exact worst pair),
      ``pld-multi-message`` (shuffle-multi, the noise's own PLD composed),
      ``pld-clone`` (shuffle-single, the clone pair's PLD composed),
      ``pld-of-pairs`` (shuffle, worst-case pairs composed), or ``none``.
    noise_parameter: the central noise (discrete-Laplace a or Laplace scale b)
      when the plan fixed it; else None.
  """

  mechanism: str
  total_epsilon: float
  total_delta: float
  iterations: int
  epsilon_per_iteration: float
  delta_per_iteration: float
  composed_epsilon: float
  composed_delta: float
  method: str
  noise_parameter: float | None = None

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    for key, value in out.items():
      if isinstance(value, float) and math.isinf(value):
        out[key] = "inf"
    return out

  def describe(self) -> str:
    """One sentence for the report."""
    t = self.iterations
    if self.method == "none":
      return "No noise: the votes are exact and nothing is private (epsilon = inf)."
    if self.method == "pure-sum":
      return (f"Equal split: each of T={t} iterations is {self.epsilon_per_iteration:.6g}-DP (pure); "
              f"pure epsilons add, total {self.composed_epsilon:.6g}-DP.")
    if self.method == "pld":
      return (f"Central noise calibrated so that the T={t}-fold release is ({self.total_epsilon:.6g}, "
              f"{self.total_delta:.3g})-DP by dp-accounting's PLD of the exact worst pair (T*2kr unit shifts); "
              f"each iteration alone is {self.epsilon_per_iteration:.6g}-DP (pure); "
              f"composed: ({self.composed_epsilon:.6g}, {self.composed_delta:.3g}).")
    if self.method == "pld-multi-message":
      return (f"Each of T={t} iterations is ({self.epsilon_per_iteration:.6g}, {self.delta_per_iteration:.3g})-DP "
              f"alone; the T-fold composition of its noise's PLD (dp-accounting, the worst pair of 2kr unit shifts) "
              f"gives ({self.composed_epsilon:.6g}, {self.composed_delta:.3g}), of which delta * "
              f"{MULTI_MESSAGE_TV_RESERVE:g} covers the sampler's total variation.")
    if self.method == "pld-clone":
      return (f"Each of T={t} iterations is ({self.epsilon_per_iteration:.6g}, {self.delta_per_iteration:.3g})-DP "
              f"alone (n shuffled eps0-LDP messages); the T-fold composition of the clone reduction's pair PLD "
              f"(Feldman, McMillan, Talwar, Thm. 3.2; dp-accounting) gives ({self.composed_epsilon:.6g}, "
              f"{self.composed_delta:.3g}).")
    return (f"Each of T={t} iterations is ({self.epsilon_per_iteration:.6g}, {self.delta_per_iteration:.3g})-DP; "
            f"the PLD of T worst-case pairs (optimal composition) gives ({self.composed_epsilon:.6g}, "
            f"{self.composed_delta:.3g}).")


#: Largest ``count`` of :func:`compose_pairs_epsilon`, and the planner's bound on iterations (each one trains a
#: student). Its lattice PLD takes 5 ms there (0.1 s at 10^6).
MAX_PAIRS_COUNT = 10_000
#: Largest per-mechanism ``epsilon`` of :func:`compose_pairs_epsilon`: dp-accounting's construction of the pair
#: (used before the lattice) overflowed e^epsilon near 709, and a pair this loose protects nothing anyway.
MAX_PAIRS_EPSILON = 700.0


@functools.lru_cache(maxsize=128)
def _pairs_pld(eps: float, delta: float, count: int) -> pld_lib.PrivacyLossDistribution:
  """The T-fold PLD of the (eps, delta) dominating pair, exact on the lattice eps·Z.

  One release's loss is +inf (probability delta), +eps ((1 - delta) e^eps / (1 + e^eps)) or -eps
  ((1 - delta) / (1 + e^eps)). dp-accounting's ``from_privacy_parameters`` rounds eps up to its grid, and the
  T-fold epsilon drifted by up to T grid steps (eps = 0.0123456,
  delta = 1e-10, T = 5,000, target 1e-5: 4.0032 against the exact 3.7518).
  """
  log_keep = math.log1p(-delta) if delta < 1.0 else -math.inf
  log_den = float(np.logaddexp(0.0, eps))  # log(1 + e^eps)
  single = _lattice_pld(np.array([log_keep - log_den, -np.inf, log_keep + eps - log_den]), -1, eps, delta)
  return single if count == 1 else single.self_compose(count)


def compose_pairs_epsilon(epsilon: Any, delta: Any, count: Any, target_delta: Any) -> float:
  """Epsilon at ``target_delta`` of ``count`` adaptively composed (epsilon, delta)-DP mechanisms.

  .. math::

     \\delta_T(\\varepsilon') = 1 - (1-\\delta)^T\\Big(1 - \\sum_{l=0}^{T}\\binom{T}{l}
     \\frac{\\max(0,\\ e^{(T-l)\\varepsilon} - e^{\\varepsilon'} e^{l\\varepsilon})}{(1+e^{\\varepsilon})^T}\\Big)

  (the optimal composition theorem), evaluated through the PLD of the
  dominating pair, exact on the lattice epsilon·Z, less the FFT composition's
  round-off allowance ``count * FFT_ROUNDOFF_PER_RELEASE`` on ``target_delta``,
  and capped by basic composition (T epsilon when T delta <= ``target_delta``).
  No epsilon' brings delta_T below 1 - (1 - delta)^T: a ``target_delta``
  under that floor gives ``inf``, and ``target_delta = 1`` gives 0.

  ``epsilon`` is at most 700 (``MAX_PAIRS_EPSILON``) and ``count`` at most
  10,000 (``MAX_PAIRS_COUNT``). The planner calls this with T = the number of
  iterations.

  References:
    Kairouz, Oh, Viswanath, "The Composition Theorem for Differential
    Privacy", ICML 2015, Theorem 3.3 (https://arxiv.org/abs/1311.0776).
  """
  eps = _validate.nonnegative("epsilon", epsilon)
  if eps > MAX_PAIRS_EPSILON:  # an OverflowError inside the PLD before
    raise ValueError(f"Expected epsilon={eps!r} <= {MAX_PAIRS_EPSILON:g}: the composition's PLD evaluates "
                     "e^epsilon, which overflows float64 near 709.")
  d = _validate.probability("delta", delta)
  t = _validate.integer("count", count, minimum=1, maximum=MAX_PAIRS_COUNT)
  td = _validate.probability("target_delta", target_delta)
  if td >= 1.0:
    return 0.0  # every mechanism is (0, 1)-DP
  # delta_T(eps') >= 1 - (1 - delta)^T at every eps' (the sum above is >= 0), with equality from eps' = T eps on.
  floor = 1.0 if d == 1.0 else -math.expm1(t * math.log1p(-d))
  if floor > td:
    return math.inf
  basic = t * eps if t * d <= td else math.inf
  if eps == 0.0:  # a (0, delta) pair: no loss but the infinite one, so 0 once the floor is met (it is, above)
    return 0.0
  # The FFT composition's round-off allowance comes off the target, as in MechanismAccount.
  allowance = 0.0 if t == 1 else t * accounting.FFT_ROUNDOFF_PER_RELEASE
  if td <= allowance:
    return basic
  # Near a composed 709 to 745 dp-accounting's epsilon overflows (inf and a NumPy warning): basic composition then.
  return min(_pld_epsilon(_pairs_pld(eps, d, t), td - allowance, math.inf), basic)


def _equal_share(total: float, parts: int) -> float:
  """The largest float x with parts * x <= total in exact arithmetic.

  ``total / parts`` rounds to nearest, so ``parts * (total / parts)`` exceeded ``total`` in about a third of
  the splits (epsilon = 1, T = 44: by 2.8e-17): a pure split would compose to a hair more than asked. One step
  down always suffices, since rounding is off by at most half an ulp of x.
  """
  x = total / parts
  while fractions.Fraction(x) * parts > fractions.Fraction(total):
    x = math.nextafter(x, 0.0)
  return x


def _central_plan(eps: float, delta: float, t: int, k: int, r: int, noise: str) -> BudgetPlan:
  sens = bsvs_sensitivity(k, r, Relation.REPLACE_ONE)
  if delta == 0.0:
    eps_t = _equal_share(eps, t)
    param = eps_t / sens if noise == "discrete-laplace" else sens / eps_t
    composed = float(fractions.Fraction(eps_t) * t)  # <= eps: eps is a float and the exact sum is <= eps
    return BudgetPlan("central", eps, 0.0, t, eps_t, 0.0, composed, 0.0, "pure-sum", param)
  mech = "discrete-laplace" if noise == "discrete-laplace" else "laplace"
  # T iterations x Delta unit shifts of a sensitivity-1 noise: the exact worst pair.
  acct = accounting.calibrate(mech, target_epsilon=eps, target_delta=delta, relation=Relation.REPLACE_ONE,
                              sensitivity=1, count=t * sens)
  eps_t = acct.parameter * sens if mech == "discrete-laplace" else sens / acct.parameter
  return BudgetPlan("central", eps, delta, t, eps_t, 0.0, acct.epsilon(delta), delta, "pld", acct.parameter)


def _shuffle_plan(mechanism: str, eps: float, delta: float, t: int) -> BudgetPlan:
  if t == 1:
    return BudgetPlan(mechanism, eps, delta, 1, eps, delta, eps, delta, "pld-of-pairs")
  delta_t = delta / (2 * t)
  lo, hi = _equal_share(eps, t), eps  # eps/t each is always enough (basic composition); eps each never is for t > 1
  if compose_pairs_epsilon(lo, delta_t, t, delta) > eps:  # pragma: no cover - basic composition holds
    raise ValueError(f"Could not split epsilon={eps}, delta={delta} over T={t} iterations.")
  for _ in range(60):
    if hi - lo <= 1e-6 * lo:
      break
    mid = 0.5 * (lo + hi)
    if compose_pairs_epsilon(mid, delta_t, t, delta) <= eps:
      lo = mid
    else:
      hi = mid
  return BudgetPlan(mechanism, eps, delta, t, lo, delta_t, compose_pairs_epsilon(lo, delta_t, t, delta),
                    delta, "pld-of-pairs")


#: Most iterations for which a shuffle plan composes the mechanism's own PLD (shuffle-multi: the noise's;
#: shuffle-single: the clone pair's): each candidate eps_t calibrates the mechanism (0.1-10 s); beyond it the plan
#: composes worst-case pairs.
MAX_EXACT_SHUFFLE_T = 100
#: Share of the total delta that a shuffle-multi plan composed exactly keeps for the sampler's total-variation term
#: (1 + e^eps) T tv, checked by ``build_mechanism`` once n is known (tv is about 1e-18 at n = 10^6).
MULTI_MESSAGE_TV_RESERVE = 1e-3


@functools.lru_cache(maxsize=256)
def multi_message_plan_noise(epsilon: float, delta: float, k: int, r: int) -> MultiMessageNoise:
  """The noise ``ShuffleMultiMessage(shape, epsilon, delta, n)`` calibrates (dlap_fraction 0.5), cached."""
  return calibrate_multi_message(epsilon, delta, k=k, r=r)


@functools.lru_cache(maxsize=256)
def _multi_message_composed(eps_t: float, delta_t: float, t: int, k: int, r: int, target_delta: float) -> float:
  """Epsilon at ``target_delta`` of T releases of the noise calibrated at (eps_t, delta_t); inf if unavailable."""
  try:
    noise = multi_message_plan_noise(eps_t, delta_t, k, r)
    composed = multi_message_pld(noise, k=k, r=r).self_compose(t)
    # The FFT composition's round-off allowance comes off the target, as in compose_pairs_epsilon.
    return _pld_epsilon(composed, target_delta - t * accounting.FFT_ROUNDOFF_PER_RELEASE, math.inf)
  except (ValueError, OverflowError, MemoryError):  # a candidate the accounting cannot evaluate is not taken
    return math.inf


@functools.lru_cache(maxsize=256)
def clone_composed_epsilon(eps0: float, n: int, t: int, target_delta: float) -> float:
  """Epsilon at ``target_delta`` of T releases of n shuffled eps0-LDP messages (the clone pair's PLD composed).

  The FFT round-off allowance comes off the target; inf if the accounting cannot evaluate it. Cached: a
  ``pld-clone`` plan and ``build_mechanism``'s check of it ask the same question.
  """
  try:
    return _clone_composed(eps0, n, target_delta, t)
  except (ValueError, OverflowError, MemoryError):  # a candidate the accounting cannot evaluate is not taken
    return math.inf


def _single_message_composed(eps_t: float, delta_t: float, t: int, n: int, target_delta: float) -> float:
  """:func:`clone_composed_epsilon` at the eps0 that ``ShuffleSingleMessage(shape, eps_t, delta_t, n)`` calibrates."""
  try:
    eps0 = shuffle_single_amplification(eps_t, n, delta_t, "numeric").eps0
  except ValueError:
    return math.inf
  return clone_composed_epsilon(eps0, n, t, target_delta)


def _exact_split(pairs: BudgetPlan, composed: Callable[[float], float], floor: float, cap: float,
                 method: str) -> BudgetPlan:
  """``pairs`` improved: an eps_t whose mechanism's T-fold PLD meets the total within 0.1% (pairs if none is better).

  ``composed(eps_t)`` is the total epsilon of T releases of the mechanism built at (eps_t, delta_t) (inf if it
  cannot be evaluated); eps_t ranges over [max(pairs' share, floor), cap]. From the pairs' share (feasible), each
  step scales eps_t by the ratio of the total to the composed epsilon, or interpolates once an infeasible eps_t
  brackets the answer; it stops when the composed epsilon is within 0.1% of the total (or the bracket within
  0.01%). The eps_t kept is always one whose composition was evaluated and met the total. Each step calibrates
  the mechanism (0.1-10 s); plans take 3-8 steps.
  """
  eps, delta, t, delta_t = pairs.total_epsilon, pairs.total_delta, pairs.iterations, pairs.delta_per_iteration
  lo = max(pairs.epsilon_per_iteration, floor)
  if lo > cap:
    return pairs
  f_lo = composed(lo)
  if not f_lo <= eps:
    return pairs
  goal = eps * (1.0 - 5e-4)  # aim inside the accepted band [eps (1 - 1e-3), eps]
  hi, f_hi = cap, math.nan  # f_hi: nan while hi is only the cap, not evaluated
  for _ in range(30):
    if f_lo >= eps * (1.0 - 1e-3) or hi - lo <= 1e-4 * lo:
      break
    if math.isnan(f_hi):
      x = lo * goal / f_lo  # proportional
    elif math.isinf(f_hi):
      x = 0.5 * (lo + hi)
    else:
      x = lo + (goal - f_lo) * (hi - lo) / (f_hi - f_lo)  # linear interpolation to the goal
    x = min(max(x, lo * (1.0 + 1e-4)), hi)
    f = composed(x)
    if f <= eps:
      lo, f_lo = x, f
      if x == hi:  # the cap itself meets the total
        break
    else:
      hi, f_hi = x, f
  if lo <= pairs.epsilon_per_iteration:
    return pairs
  return BudgetPlan(pairs.mechanism, eps, delta, t, lo, delta_t, f_lo, delta, method)


def _multi_message_plan(pairs: BudgetPlan, k: int, r: int) -> BudgetPlan:
  """shuffle-multi: the T-fold composition of the calibrated noise's own PLD; delta * 1e-3 kept for the sampler."""
  target = pairs.total_delta * (1.0 - MULTI_MESSAGE_TV_RESERVE)
  return _exact_split(
      pairs, lambda e: _multi_message_composed(e, pairs.delta_per_iteration, pairs.iterations, k, r, target),
      min_calibration_epsilon(k=k, r=r), min(pairs.total_epsilon, MAX_CALIBRATION_EPSILON), "pld-multi-message")


def _single_message_plan(pairs: BudgetPlan, n: int) -> BudgetPlan:
  """shuffle-single: the T-fold composition of the clone pair's PLD at the eps0 calibrated from the share.

  eps_t may exceed the total epsilon: each release is (eps_t, delta/(2T))-DP, and at the total delta T releases
  can still compose to less (n = 1,500, (4, 1e-5), T = 2: eps_t = 4 composes to 3.79; the plan takes 4.08).
  """
  return _exact_split(
      pairs, lambda e: _single_message_composed(e, pairs.delta_per_iteration, pairs.iterations, n,
                                                pairs.total_delta),
      0.0, SHUFFLE_MAX_EPSILON, "pld-clone")


def plan_budget(mechanism: str, epsilon: Any, delta: Any, iterations: Any, *, k: Any, r: Any = 1,
                central_noise: str = "discrete-laplace", num_clients: Any = None) -> BudgetPlan:
  """Per-iteration budgets whose T-fold adaptive composition meets (epsilon, delta).

  Args:
    mechanism: one of :data:`jaxdistill.labeling.MECHANISMS`.
    epsilon: total epsilon > 0 (``inf`` allowed only for ``none``, which ignores it).
    delta: total delta in [0, 1) (> 0 for shuffle; checked for ``none`` too).
    iterations: T in [1, ``MAX_PAIRS_COUNT`` (10,000)], the bound of the
      shuffle composition's PLD (a plan for more iterations than
      :class:`LabelingConfig` runs, 100, is allowed).
    k: reverse k-NN out-degree (central sensitivity 2kr).
    r: labels per record (1).
    central_noise: ``discrete-laplace`` or ``laplace`` (another value than
      the default only with ``central``).
    num_clients: n, the number of shuffled messages per iteration (one per
      record), in [1, 10^12]. ``shuffle-single`` over 1 < T <= 100 needs it
      to compose the clone pair's PLD (its amplification depends on n);
      without it that plan composes worst-case pairs. Other mechanisms
      ignore it.

  Returns:
    A :class:`BudgetPlan`.

  Raises:
    ValueError: on bad arguments.
  """
  from jaxdistill.labeling._config import CENTRAL_NOISES, MECHANISMS  # pylint: disable=import-outside-toplevel
  mech = _validate.choice("mechanism", mechanism, MECHANISMS)
  # T = 10^9 hung (central) or named compose_pairs_epsilon's count (shuffle); 10^4 plans in about 1 s (central)
  # and 30 s (shuffle-multi).
  t = _validate.integer("iterations", iterations, minimum=1, maximum=MAX_PAIRS_COUNT)
  # The sensitivity 2kr is divided into floats: a k or r beyond 2^31 - 1 (more edges than any run holds) overflowed.
  k = _validate.integer("k", k, minimum=1, maximum=2**31 - 1)
  r = _validate.integer("r", r, minimum=1, maximum=2**31 - 1)
  noise = _validate.choice("central_noise", central_noise, CENTRAL_NOISES)
  if mech != "central" and noise != CENTRAL_NOISES[0]:  # as LabelingConfig: another value was ignored
    raise ValueError(f"Expected central_noise={noise!r} only with mechanism=central (elsewhere it is ignored); got "
                     f"mechanism={mech}.")
  n = None if num_clients is None else _validate.integer("num_clients", num_clients, minimum=1,
                                                         maximum=MAX_NUMERIC_N)
  # Checked for every mechanism, none included: a NaN or negative budget is a caller's bug whatever is run.
  eps = _validate.positive("epsilon", epsilon, allow_inf=mech == "none")
  d = _validate.probability("delta", delta)
  if d >= 1:
    raise ValueError(f"Expected delta={d!r} < 1.")
  if mech == "none":
    return BudgetPlan("none", math.inf, 0.0, t, math.inf, 0.0, math.inf, 0.0, "none")
  if mech == "central":
    return _central_plan(eps, d, t, k, r, noise)
  if mech.startswith("local"):
    eps_t = _equal_share(eps, t)
    # total_delta is the asked one (BudgetPlan's contract; it read 0.0); pure epsilons compose at delta 0.
    return BudgetPlan(mech, eps, d, t, eps_t, 0.0, float(fractions.Fraction(eps_t) * t), 0.0, "pure-sum")
  if d <= 0:
    raise ValueError(f"Expected delta={d!r} > 0 for mechanism={mech}.")
  if t > 1 and eps > MAX_PAIRS_EPSILON:  # the split searches per-iteration epsilons up to eps
    raise ValueError(f"Expected epsilon={eps!r} <= {MAX_PAIRS_EPSILON:g} for mechanism={mech} over "
                     f"iterations={t}: the composition's PLD evaluates e^epsilon, which overflows float64 near 709.")
  pairs = _shuffle_plan(mech, eps, d, t)
  if 1 < t <= MAX_EXACT_SHUFFLE_T:
    if mech == "shuffle-multi":
      return _multi_message_plan(pairs, k, r)
    if n is not None:
      return _single_message_plan(pairs, n)
  return pairs
