"""Statistical privacy auditing: a lower confidence bound on epsilon (and delta) from samples.

If a mechanism M is (eps, delta)-DP, then for neighbours x0, x1 and *every*
event E,

.. math::

   \\Pr[M(x_a) \\in E] \\le e^{\\varepsilon} \\Pr[M(x_b) \\in E] + \\delta
   \\quad\\Longrightarrow\\quad
   \\varepsilon \\ge \\ln \\frac{P_a(E) - \\delta}{P_b(E)},\\qquad
   \\delta \\ge P_a(E) - e^{\\varepsilon} P_b(E)

for both directions (a, b) in {(0, 1), (1, 0)}. The auditor samples M(x0)
and M(x1), reduces each output to a scalar statistic, picks a few events on
a *selection* split, and on the independent *estimation* split replaces
P_a(E) by its Clopper-Pearson lower bound and P_b(E) by its upper bound, each
at level alpha / (2m) for m (event, direction) pairs. By the union bound,
all 2m one-sided bounds hold simultaneously with probability >= 1 - alpha, so

.. math:: \\Pr[\\hat\\varepsilon_{lo} > \\varepsilon] \\le \\alpha,\\qquad
          \\Pr[\\hat\\delta_{lo}(\\varepsilon) > \\delta(\\varepsilon)] \\le \\alpha,

where eps is any epsilon for which M is (eps, delta)-DP on this pair (in
particular the true one) and delta(eps) its exact privacy profile. The
selection split only chooses the events; as it is independent of the
estimation split the guarantee does not depend on how well it chooses. An
*alarm* is raised when the lower bound exceeds the claimed epsilon at the
claimed delta (equivalently, when the delta lower bound at the claimed
epsilon exceeds the claimed delta): a false alarm on a correct claim has
probability at most alpha.

Events: for an integer (or boolean) statistic, bins -- single values and
unions of values ranked by their selection likelihood ratio (the optimal
events for a finite output space are such super-level sets); for a real
statistic, threshold events {T > t} and {T <= t} at quantiles of the pooled
selection sample (optimal when the likelihood ratio is monotone in T, as for
location mechanisms). A lower bound is only as good as the statistic: it
cannot exceed the privacy of the statistic's own distribution.

Sampling is vectorised: ``mechanism(key, x)`` is vmapped over keys inside one
jitted batch function, and only the scalar statistic per sample reaches the
host, so 10^6 samples cost a few seconds.

References:
  Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine
  Learning: How Private is Private SGD?", NeurIPS 2020, arXiv:2006.07709
  (Clopper-Pearson lower bounds on epsilon from event frequencies);
  Ding et al., "Detecting Violations of Differential Privacy", CCS 2018,
  arXiv:1805.10277 (event selection on a separate split);
  Clopper, Pearson (1934).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.audit._bounds import clopper_pearson_lower, clopper_pearson_upper

__all__ = ["AuditEvent", "PrivacyAudit", "sample_statistic", "audit_privacy"]

_MAX_THRESHOLDS = 256
_MAX_BINS = 4096


@functools.partial(jax.jit, static_argnames=("mechanism", "statistic"))
def _vmapped_batch(keys, x, mechanism, statistic):
  return jax.vmap(lambda k: statistic(mechanism(k, x)))(keys)


_sample_keys = jax.jit(jax.vmap(jax.random.fold_in, in_axes=(None, 0)))


def _identity(output):
  return output


def _event_mask(desc: str, fn: Callable, values: np.ndarray) -> np.ndarray:
  """``fn(values)`` as a bool array shaped like ``values``, or a ValueError (it was counted unchecked)."""
  mask = np.asarray(fn(values))
  if mask.dtype != np.bool_ or mask.shape != values.shape:
    raise ValueError(f"Expected {desc} to return a boolean array of shape {values.shape}, one per sample; got "
                     f"dtype {mask.dtype} and shape {mask.shape}.")
  return mask


def _check_functions(mechanism: Any, statistic: Any, batched: Any) -> bool:
  """``batched`` checked as a bool ("no" and 1 were taken as true); a non-callable mechanism or statistic refused."""
  batched = _validate.boolean("batched", batched)
  if not callable(mechanism):
    raise ValueError(f"Expected mechanism to be a function (key, x) -> output; got {type(mechanism).__name__}.")
  if statistic is not None and not callable(statistic):
    raise ValueError(f"Expected statistic to be None or a function output -> scalar; got "
                     f"{type(statistic).__name__}.")
  return batched


def _check_neighbours(x0: Any, x1: Any, batched: bool) -> None:
  """x0 and x1 as :func:`audit_privacy` takes them, or a one-line ValueError naming them.

  Unbatched, both are arguments of the jitted batch function, so every leaf must be a JAX value (a number or a
  numeric array): ``x0="a"`` was JAX's two-line TypeError. Either way x1 must have x0's structure and leaf
  shapes (neighbours of one input): ``x0=[1.0, 2.0]`` against ``x1=1.0`` reached the mechanism and failed inside
  it (``'list' + BatchTracer``).
  """
  flat = []
  for name, x in (("x0", x0), ("x1", x1)):
    leaves, tree = jax.tree_util.tree_flatten(x)
    shapes = []
    for leaf in leaves:
      if batched:  # a host mechanism may take any Python value: only the shapes of arrays are compared
        shapes.append(tuple(leaf.shape) if isinstance(leaf, (np.ndarray, jax.Array)) else ())
        continue
      try:
        shapes.append(tuple(jax.typeof(leaf).shape))
      except (TypeError, OverflowError, ValueError) as err:
        where = "" if leaf is x else f", whose leaf {_validate.shown(leaf)} is not a JAX value"
        raise ValueError(f"Expected {name} to be a number, an array or a pytree of them (the input the mechanism is "
                         f"jitted on); got {_validate.shown(x)}{where} ({_validate.first_line(err)}).") from None
    flat.append((tree, shapes))
  (tree0, shapes0), (tree1, shapes1) = flat
  if tree0 != tree1:
    raise ValueError(f"Expected x0 and x1 to have the same structure (neighbouring inputs); got "
                     f"{_validate.shown(x0)} and {_validate.shown(x1)}, of structures {_validate.shown(tree0)} and "
                     f"{_validate.shown(tree1)}.")
  for i, (shape0, shape1) in enumerate(zip(shapes0, shapes1)):
    if shape0 != shape1:
      raise ValueError(f"Expected x0 and x1 to have the same shapes (neighbouring inputs); their leaf {i} has shape "
                       f"{shape0} in x0 and {shape1} in x1.")


def sample_statistic(key: jax.Array, mechanism: Callable, x: Any, num_samples: int, *,
                     statistic: Callable | None = None, batch_size: int = 65536,
                     batched: bool = False) -> np.ndarray:
  """Draws ``statistic(mechanism(key_j, x))`` for ``num_samples`` independent keys.

  Args:
    key: threefry2x32 PRNG key (an rbg key is refused: its samples would change with batch_size).
    mechanism: ``(key, x) -> output``, jittable and vmappable over keys; or,
      with ``batched=True``, ``(keys [m], x) -> outputs`` (any Python code,
      e.g. a host-side NumPy release).
    x: the input (any pytree), the same for every sample.
    num_samples: number of samples, in ``[1, 2**32]`` (sample keys fold in a uint32).
    statistic: ``output -> scalar`` (jittable; with ``batched=True`` it maps
      the batch of outputs to ``[m]``). Default: the output itself, which must
      then be a scalar.
    batch_size: samples per jitted batch (memory ~ batch_size x output size).
      Sample j always uses the key ``fold_in(key, j)``, so the samples do
      not depend on it.
    batched: see ``mechanism``.

  Returns:
    ``[num_samples]`` int64 (integer or boolean statistics) or float64.
    The last batch is padded to the batch size, min(``batch_size``,
    ``num_samples``), so one compilation serves every call with the same
    ``mechanism``/``statistic`` objects, shapes and batch size (a
    ``num_samples`` below ``batch_size`` compiles its own).

  Raises:
    ValueError: bad sizes, a statistic that is not one scalar per sample, or
      NaN statistics.
  """
  key = _validate.prng_key("key", key, threefry=True)
  # Sample j's key folds in j as a uint32: beyond 2^32 samples the keys (and the samples) would repeat.
  num = _validate.integer("num_samples", num_samples, minimum=1, maximum=2**32)
  batch = min(_validate.integer("batch_size", batch_size, minimum=1), num)
  batched = _check_functions(mechanism, statistic, batched)
  stat = _identity if statistic is None else statistic
  parts = []
  for b in range(-(-num // batch)):
    # Sample j's key is fold_in(key, j), whatever batch it falls in: batch_size changes memory, not samples.
    keys = _sample_keys(key, jnp.arange(b * batch, (b + 1) * batch, dtype=jnp.uint32))
    if batched:
      vals = stat(mechanism(keys, x))
    else:
      vals = _vmapped_batch(keys, x, mechanism, stat)
    vals = np.asarray(vals)
    if vals.shape != (batch,):
      raise ValueError(f"Expected the statistic to give one scalar per sample ([{batch}]); "
                       f"got shape {vals.shape}.")
    if vals.dtype.kind == "c":  # the float64 cast below kept the real part with only a ComplexWarning
      raise ValueError(f"Expected a real statistic; got dtype {vals.dtype} (complex values would lose their "
                       "imaginary part).")
    parts.append(vals)
  out = np.concatenate(parts)[:num]
  if out.dtype.kind in "biu":
    return out.astype(np.int64)
  out = out.astype(np.float64)
  if np.isnan(out).any():
    raise ValueError("Expected statistics without NaN; the mechanism or statistic produced NaN.")
  return out


@dataclasses.dataclass(frozen=True)
class AuditEvent:
  """One (event, direction) pair evaluated on the estimation split.

  Attributes:
    description: the event, e.g. ``"T > 0.5"`` or ``"T in {1}"``.
    top: which input's probability is bounded below (0 or 1); the other one
      is bounded above.
    count_top: occurrences among M(x_top)'s estimation samples.
    count_bottom: occurrences among the other input's estimation samples.
    trials: estimation samples per input.
    p_top_lower: Clopper-Pearson lower bound on P_top(E).
    p_bottom_upper: Clopper-Pearson upper bound on P_bottom(E).
    epsilon_lower: ln((p_top_lower - delta) / p_bottom_upper), >= 0.
    delta_lower: p_top_lower - e^eps * p_bottom_upper at the claimed
      epsilon (>= 0), or None when no epsilon was claimed.
  """

  description: str
  top: int
  count_top: int
  count_bottom: int
  trials: int
  p_top_lower: float
  p_bottom_upper: float
  epsilon_lower: float
  delta_lower: float | None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PrivacyAudit:
  """Result of :func:`audit_privacy`.

  Attributes:
    epsilon_lower: lower confidence bound on epsilon at ``claimed_delta``:
      Pr[epsilon_lower > true epsilon] <= alpha.
    delta_lower: lower confidence bound on delta at ``claimed_epsilon`` (None
      when no epsilon was claimed).
    claimed_epsilon: the epsilon under test (None: only estimate).
    claimed_delta: the delta the epsilon bound is computed at.
    alpha: the false-alarm probability (family-wise over all events).
    alarm: ``epsilon_lower > claimed_epsilon`` (equivalently
      ``delta_lower > claimed_delta``).
    num_samples: samples drawn per input (selection + estimation).
    num_selection: samples per input used to choose the events.
    events: the evaluated (event, direction) pairs, best first.
    kind: ``"bins"``, ``"thresholds"`` or ``"given"``.
  """

  epsilon_lower: float
  delta_lower: float | None
  claimed_epsilon: float | None
  claimed_delta: float
  alpha: float
  alarm: bool
  num_samples: int
  num_selection: int
  events: tuple[AuditEvent, ...]
  kind: str

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["events"] = [e.to_dict() for e in self.events]
    return out


# An event is (description, membership function on a statistic array).
_Event = tuple[str, Callable[[np.ndarray], np.ndarray]]


def _threshold_events(sel0: np.ndarray, sel1: np.ndarray) -> list[_Event]:
  pooled = np.concatenate([sel0, sel1])
  uniq = np.unique(pooled)
  if len(uniq) < 2:
    return []
  # Cuts at sample values, with no arithmetic: midpoints overflowed (1e308 + 1.5e308 = inf, int64 5e18 + 6e18
  # wrapped negative) or met +inf, and every event came out empty or certain: a mechanism of infinite epsilon
  # passed. On the selection split "T > u" splits as "T > the midpoint after u" did.
  if len(uniq) <= _MAX_THRESHOLDS + 1:
    cuts = uniq[:-1]
  else:
    cuts = np.unique(np.quantile(pooled, np.linspace(0, 1, _MAX_THRESHOLDS + 2)[1:-1], method="inverted_cdf"))
  events: list[_Event] = []
  for t in cuts:  # NumPy scalars, so int64 cuts stay exact
    events.append((f"T > {t:.6g}", lambda v, t=t: v > t))
    events.append((f"T <= {t:.6g}", lambda v, t=t: v <= t))
  return events


def _bin_events(sel0: np.ndarray, sel1: np.ndarray) -> list[_Event]:
  uniq = np.unique(np.concatenate([sel0, sel1]))
  if len(uniq) > _MAX_BINS:
    raise ValueError(f"Expected at most {_MAX_BINS} distinct statistic values for bin events; "
                     f"got {len(uniq)} (use a coarser statistic or events='thresholds').")
  # Occurrences of each distinct value (uniq is sorted and holds every value): O(m log u).
  c0, c1 = (np.bincount(np.searchsorted(uniq, sel), minlength=len(uniq)).astype(np.float64)
            for sel in (sel0, sel1))
  # Sets of positions into uniq, so that the values keep their dtype (int() sent 0.25 and 0.75 to
  # the bin {0}, which no sample matched).
  sets: list[tuple[int, ...]] = [(i,) for i in range(len(uniq))]
  # Super-level sets of the (smoothed) selection likelihood ratio, both ways.
  for num, den in ((c0, c1), (c1, c0)):
    order = np.argsort(-((num + 0.5) / (den + 0.5)), kind="stable")
    for j in range(2, len(uniq)):
      sets.append(tuple(sorted(int(i) for i in order[:j])))
  events: list[_Event] = []
  for idx in dict.fromkeys(sets):
    arr = uniq[list(idx)]
    shown = ", ".join(f"{u:.6g}" if isinstance(u, float) else str(u) for u in arr[:8].tolist())
    shown += ", ..." if len(arr) > 8 else ""
    events.append((f"T in {{{shown}}}", lambda v, arr=arr: np.isin(v, arr)))
  return events


def _bounds(k_top, k_bot, trials, level, delta, epsilon):
  lo = clopper_pearson_lower(k_top, trials, level)
  hi = clopper_pearson_upper(k_bot, trials, level)
  gap = np.asarray(lo, np.float64) - delta
  with np.errstate(divide="ignore", invalid="ignore"):
    eps = np.where(gap > 0, np.log(np.maximum(gap, 1e-300) / hi), 0.0)
  eps = np.maximum(eps, 0.0)
  if epsilon is None:
    dl = None
  else:  # e^eps overflows from eps ~ 709.8: lo - inf * hi = -inf (hi > 0), clamped to 0
    hi = np.asarray(hi, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
      scaled = np.where(hi > 0, np.exp(np.float64(epsilon)) * hi, 0.0)
    dl = np.maximum(np.asarray(lo, np.float64) - scaled, 0.0)
  return np.asarray(lo, np.float64), np.asarray(hi, np.float64), eps, dl


# audit_privacy's defaults for choosing events on a selection split (refused with given events).
_NUM_EVENTS = 3
_SELECTION_FRACTION = 0.2


def audit_privacy(key: jax.Array, mechanism: Callable, x0: Any, x1: Any, *, num_samples: int,
                  alpha: float = 0.05, claimed_epsilon: float | None = None,
                  claimed_delta: float = 0.0, statistic: Callable | None = None,
                  events: str | Sequence[Callable[[np.ndarray], np.ndarray]] = "auto",
                  num_events: int = _NUM_EVENTS, selection_fraction: float = _SELECTION_FRACTION,
                  batch_size: int = 65536, batched: bool = False) -> PrivacyAudit:
  """Lower confidence bounds on epsilon and delta for one pair of neighbours.

  Args:
    key: threefry2x32 PRNG key (selection and estimation samples use independent keys).
    mechanism: ``(key, x) -> output`` (vmappable over keys), or with
      ``batched=True`` ``(keys [m], x) -> outputs`` (see
      :func:`sample_statistic`). Pass the same function object to reuse
      its compilation across calls.
    x0: one input: a pytree of numbers and numeric arrays (with
      ``batched=True`` any Python values the mechanism takes).
    x1: a neighbouring input (same structure and shapes).
    num_samples: samples per input (>= 10), selection and estimation
      together; each split at most 2^32 (about 5.4e9 in all at the default
      selection fraction).
    alpha: false-alarm probability in (0, 1): Pr[epsilon_lower > true
      epsilon] <= alpha, family-wise over events and directions.
    claimed_epsilon: the claim to test (>= 0), or None to only estimate.
    claimed_delta: the claimed delta in [0, 1); the epsilon bound is
      computed at this delta.
    statistic: ``output -> scalar``; default the output itself.
    events: ``"auto"`` (bins for integer statistics, thresholds for real
      ones), ``"bins"``, ``"thresholds"``, or a sequence of host functions
      ``stat [m] -> bool [m]`` fixed in advance (then no selection split
      is taken and every event is tested in both directions).
    num_events: (event, direction) pairs chosen on the selection split
      (another value than 3 only when the audit chooses the events).
    selection_fraction: share of the samples used to choose events, in
      (0, 1) (another value than 0.2 only when the audit chooses them).
    batch_size: samples per jitted batch.
    batched: see ``mechanism``.

  Returns:
    A :class:`PrivacyAudit`.

  Raises:
    ValueError: bad arguments (among them x0 or x1 not JAX values, or of different structures or leaf
      shapes), or NaN statistics.

  >>> import jax, jax.numpy as jnp
  >>> lap = lambda k, x: x + jax.random.laplace(k) / 1.0   # eps = 1 for |x0 - x1| <= 1
  >>> r = audit_privacy(jax.random.key(0), lap, jnp.float32(0), jnp.float32(1),
  ...                   num_samples=20000, claimed_epsilon=1.0, alpha=0.01)
  >>> r.alarm, 0.0 <= r.epsilon_lower <= 1.0
  (False, True)
  """
  key = _validate.prng_key("key", key, threefry=True)
  batched = _check_functions(mechanism, statistic, batched)
  check_input = getattr(mechanism, "check_input", None)  # set by local_randomizer
  if check_input is not None:
    check_input("x0", x0)
    check_input("x1", x1)
  _check_neighbours(x0, x1, batched)
  n = _validate.integer("num_samples", num_samples, minimum=10)
  a = _validate.open_unit("alpha", alpha)
  eps_c = None if claimed_epsilon is None else _validate.nonnegative("claimed_epsilon", claimed_epsilon)
  delta_c = _validate.probability("claimed_delta", claimed_delta)
  if delta_c >= 1.0:
    raise ValueError(f"Expected claimed_delta={delta_c!r} < 1.")
  m = _validate.integer("num_events", num_events, minimum=1)
  given = not isinstance(events, str)
  if not given:
    kind = _validate.choice("events", events, ("auto", "bins", "thresholds"))
  else:
    given_events = events
    try:
      events = list(events)
    except TypeError:
      events = []
    if not events or not all(callable(e) for e in events):
      hint = " (wrap a single function in a list: events=[fn])" if callable(given_events) else ""
      raise ValueError(f"Expected events to be 'auto', 'bins', 'thresholds' or a non-empty sequence of functions; "
                       f"got {given_events!r:.80}{hint}.")
  frac = _validate.finite("selection_fraction", selection_fraction)
  if not 0.0 < frac < 1.0:
    raise ValueError(f"Expected selection_fraction={frac!r} in (0, 1).")
  if given and (m != _NUM_EVENTS or frac != _SELECTION_FRACTION):  # given events skip the selection split
    raise ValueError(f"Expected num_events={_NUM_EVENTS} and selection_fraction={_SELECTION_FRACTION} (the defaults) "
                     f"with events given: they choose events on a selection split, which given events skip; "
                     f"got num_events={m}, selection_fraction={frac!r}.")
  frac = 0.0 if given else frac
  num_sel = int(round(frac * n))
  num_est = n - num_sel
  if num_est < 1 or (not given and num_sel < 1):  # the message named num_samples alone, not the fraction that split it
    raise ValueError(f"Expected num_samples={n} and selection_fraction={frac!r} to leave at least one sample in "
                     f"each split; got {num_sel} selection and {num_est} estimation samples.")
  if max(num_sel, num_est) > 2**32:  # sample_statistic's limit, which named a split's size, not num_samples
    raise ValueError(f"Expected num_samples={n} at most {int(2**32 / max(1.0 - frac, frac))} (2^32 samples per "
                     f"split, selection_fraction={frac!r}).")
  k_sel0, k_sel1, k_est0, k_est1 = jax.random.split(key, 4)

  def draw(k, x, count):
    return sample_statistic(k, mechanism, x, count, statistic=statistic, batch_size=batch_size,
                            batched=batched)

  est = (draw(k_est0, x0, num_est), draw(k_est1, x1, num_est))
  if given:
    kind = "given"
    chosen = [(f"event {i}", fn, top) for i, fn in enumerate(events) for top in (0, 1)]
  else:
    sel = (draw(k_sel0, x0, num_sel), draw(k_sel1, x1, num_sel))
    if kind == "auto":
      kind = "bins" if est[0].dtype.kind == "i" else "thresholds"
    candidates = _bin_events(*sel) if kind == "bins" else _threshold_events(*sel)
    if not candidates:
      candidates = [("T is anything", lambda v: np.ones(v.shape, bool))]
    # Score every (event, direction) by the bound it would give at the
    # estimation size if the selection frequencies were the truth.
    freq = np.array([[np.count_nonzero(fn(s)) / num_sel for s in sel] for _, fn in candidates])
    level = a / (2 * m)
    scores = []
    for top in (0, 1):
      _, _, eps, _ = _bounds(freq[:, top] * num_est, freq[:, 1 - top] * num_est, num_est, level,
                             delta_c, None)
      scores.append(eps + 1e-9 * freq[:, top])  # ties: prefer frequent events
    scores = np.stack(scores, axis=1)
    order = np.argsort(-scores, axis=None, kind="stable")[:m]
    chosen = [(candidates[i // 2][0], candidates[i // 2][1], int(i % 2)) for i in order]
  level = a / (2 * len(chosen))
  results = []
  for desc, fn, top in chosen:
    k_top = int(np.count_nonzero(_event_mask(desc, fn, est[top])))
    k_bot = int(np.count_nonzero(_event_mask(desc, fn, est[1 - top])))
    lo, hi, eps, dl = _bounds(k_top, k_bot, num_est, level, delta_c, eps_c)
    results.append(AuditEvent(desc, top, k_top, k_bot, num_est, float(lo), float(hi), float(eps),
                              None if dl is None else float(dl)))
  results.sort(key=lambda e: -e.epsilon_lower)
  eps_lo = max(e.epsilon_lower for e in results)
  delta_lo = None if eps_c is None else max(e.delta_lower for e in results)
  alarm = eps_c is not None and eps_lo > eps_c
  return PrivacyAudit(eps_lo, delta_lo, eps_c, delta_c, a, bool(alarm), n, num_sel,
                      tuple(results), kind)
