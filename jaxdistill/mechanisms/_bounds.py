"""Accuracy bounds for BSVS estimates: Proposition 1, Theorem 1, Theorem 2.

All bounds are elementwise ``jnp`` kernels, so they broadcast over arrays and
work under ``jax.vmap``/``jax.jit`` (then in the caller's dtype, with no
argument checks: invalid traced values give NaN, the documented safe result).
Called with concrete values they validate every argument (``ValueError``
naming it) and compute in float64, returning a Python float or a float64
NumPy array.

Definitions (spec/REVERSE_KNN.md §1.4-1.7). An estimate is (alpha, beta)-
accurate for a set of m entries when Pr[max_j |hat a_j - a_j| > alpha] <= beta.
Per bucket m = |Y| (Proposition 1 as stated); for all s buckets at once
m = s|Y| (spec §5 I2). Every bound below is a union bound over the m entries
of an exact (Laplace, discrete Laplace) or Bernstein (Collision) tail.

Theorem 1 (labeling): if the label y* of bucket t beats every other label by
Gap_t = a_{t,y*} - max_{y != y*} a_{t,y} > 0, then argmax_y hat a_{t,y} = y*
unless some entry of the bucket has |error| >= Gap_t / 2 (ties counted as
wrong). Hence Pr[label wrong] <= |Y| Pr[|error| >= Gap_t / 2].

References:
  The reverse-k-NN paper, Li et al., "Fine-grained Private Knowledge
  Distillation", arXiv:2207.13253 (https://arxiv.org/abs/2207.13253):
  Proposition 1, Theorem 1, Theorem 2 (statements reconstructed in
  spec/REVERSE_KNN.md); Bernstein's inequality (Boucheron, Lugosi, Massart,
  "Concentration Inequalities", 2013, Thm. 2.10 / Cor. 2.11).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate

__all__ = [
    "laplace_alpha",
    "laplace_beta",
    "laplace_labeling_error",
    "discrete_laplace_alpha",
    "discrete_laplace_beta",
    "discrete_laplace_labeling_error",
    "collision_alpha",
    "collision_beta",
    "collision_labeling_error",
]


def _traced(x: Any) -> bool:
  return isinstance(x, jax.core.Tracer)


def _check(name: str, x: Any, *, low: float | None = None, low_open: bool = True,
           high: float | None = None, high_open: bool = False, integer: bool = False) -> Any:
  """Validates a concrete scalar or array (tracers pass through unchecked)."""
  if _traced(x):
    return x
  arr = _validate.real_array(name, x)
  bad = ~np.isfinite(arr)
  if bad.any():
    raise ValueError(f"Expected {name} to be finite, got {arr[bad].reshape(-1)[0]!r}.")
  if integer and not np.all(arr == np.round(arr)):
    raise ValueError(f"Expected {name} to be an integer, got {x!r}.")
  if low is not None:
    bad = arr <= low if low_open else arr < low
    if bad.any():
      op = ">" if low_open else ">="
      raise ValueError(f"Expected {name}={arr[bad].reshape(-1)[0]!r} {op} {low}.")
  if high is not None:
    bad = arr >= high if high_open else arr > high
    if bad.any():
      op = "<" if high_open else "<="
      raise ValueError(f"Expected {name}={arr[bad].reshape(-1)[0]!r} {op} {high}.")
  return x


def _run(kernel: Callable[..., jax.Array], fallback: Callable[..., np.ndarray], names: tuple[str, ...],
         *args: Any, suspect: Callable[..., np.ndarray] | None = None) -> Any:
  """Runs ``kernel`` traced (as is) or concretely in float64 on the host.

  Concretely, entries where the kernel's direct formula overflows or divides
  inf by inf (a huge ratio m / beta, alpha^2, e^{...}; XLA on the CPU also
  flushes subnormal inputs such as beta = 1e-320 to 0) are recomputed with
  ``fallback``, the same bound rearranged in log space in NumPy float64, as
  are entries flagged by ``suspect`` (an intermediate that overflows while
  the result stays finite) and entries with a subnormal argument (flushed
  to 0, the kernel may still return a finite but wrong value). Other entries keep the kernel's value bitwise. A
  result that still does not fit in float64 (the true value overflows) raises
  ``ValueError`` naming the arguments, as do arrays that do not broadcast.
  """
  if any(_traced(a) for a in args):
    return kernel(*args)
  host = [np.asarray(a, np.float64) for a in args]
  try:
    shape = np.broadcast_shapes(*(h.shape for h in host))
  except ValueError:
    got = ", ".join(f"{n} {h.shape}" for n, h in zip(names, host))
    raise ValueError(f"Expected {', '.join(names)} to broadcast to one shape; got shapes {got}.") from None
  with jax.enable_x64(True):
    out = kernel(*(jnp.asarray(a, jnp.float64) for a in args))
    out = np.asarray(out, dtype=np.float64)
  redo = ~np.isfinite(out)
  # XLA flushes a subnormal input to 0 and may still give a finite answer (scale 1e-310: alpha 0 instead of
  # 7e-311, a false bound): entries with any subnormal argument are recomputed in NumPy too.
  tiny = np.finfo(np.float64).tiny
  for h in host:
    redo = redo | np.broadcast_to((h != 0) & (np.abs(h) < tiny), shape)
  with np.errstate(all="ignore"):
    if suspect is not None:
      redo = redo | np.broadcast_to(suspect(*host), shape)
    if redo.any():
      out = np.where(redo, np.asarray(fallback(*np.broadcast_arrays(*host)), np.float64), out)
  if not np.isfinite(out).all():
    idx = np.unravel_index(int(np.argmax(~np.isfinite(out).reshape(-1))), shape) if shape else ()
    at = ", ".join(f"{n}={float(np.broadcast_to(h, shape)[idx])!r}" for n, h in zip(names, host))
    raise ValueError(f"Expected arguments whose bound fits in float64; it overflows at {at}.")
  return float(out) if out.ndim == 0 else out


def _log2m(m):
  """ln(2m) without overflowing 2m (NumPy)."""
  return np.log(2.0) + np.log(m)


# --- Laplace ------------------------------------------------------------------------


def _laplace_alpha(scale, beta, m):
  return scale * jnp.log(m / beta)


def _laplace_beta(scale, alpha, m):
  return jnp.minimum(1.0, m * jnp.exp(-alpha / scale))


def _laplace_labeling(gap, scale, num_labels):
  return jnp.where(gap > 0, jnp.minimum(1.0, num_labels * jnp.exp(-gap / (2.0 * scale))), 1.0)


# Log-space forms (NumPy, host), used where the direct kernels overflow; see _run.
def _laplace_alpha_log(scale, beta, m):
  return scale * (np.log(m) - np.log(beta))


def _laplace_beta_log(scale, alpha, m):
  return np.minimum(1.0, np.exp(np.log(m) - alpha / scale))


def _laplace_labeling_log(gap, scale, num_labels):
  return np.where(gap > 0, np.minimum(1.0, np.exp(np.log(num_labels) - gap / scale / 2.0)), 1.0)


def laplace_alpha(scale: Any, beta: Any, *, num_entries: Any = 1) -> Any:
  """Proposition 1: alpha such that Laplace(b) noise is (alpha, beta)-accurate.

  .. math:: \\Pr[\\max_{j \\le m} |N_j| > \\alpha] \\le m e^{-\\alpha/b} = \\beta
            \\iff \\alpha = b \\ln(m/\\beta).

  With b = 2kr/eps and m = |Y| this is the paper's (2kr ln(|Y|/beta)/eps,
  beta) per bucket; m = s|Y| covers all buckets at once.

  Args:
    scale: Laplace scale b > 0.
    beta: failure probability in (0, 1].
    num_entries: m >= 1 entries covered by the union bound.

  Returns:
    alpha (float or float64 array, broadcast over the arguments).

  Raises:
    ValueError: for b <= 0, beta outside (0, 1], m < 1, NaN.

  >>> round(laplace_alpha(2.0, 0.1, num_entries=10), 6)
  9.21034
  """
  _check("scale", scale, low=0)
  _check("beta", beta, low=0, high=1)
  _check("num_entries", num_entries, low=1, low_open=False, integer=True)
  return _run(_laplace_alpha, _laplace_alpha_log, ("scale", "beta", "num_entries"), scale, beta,
              num_entries)


def laplace_beta(scale: Any, alpha: Any, *, num_entries: Any = 1) -> Any:
  """Failure probability min(1, m e^{-alpha/b}) of Laplace(b) at accuracy alpha >= 0."""
  _check("scale", scale, low=0)
  _check("alpha", alpha, low=0, low_open=False)
  _check("num_entries", num_entries, low=1, low_open=False, integer=True)
  return _run(_laplace_beta, _laplace_beta_log, ("scale", "alpha", "num_entries"), scale, alpha, num_entries)


def laplace_labeling_error(gap: Any, scale: Any, *, num_labels: Any) -> Any:
  """Theorem 1 with Laplace(b): Pr[bucket t mislabelled] <= |Y| exp(-Gap_t/(2b)).

  .. math:: \\Pr[\\arg\\max_y \\hat a_{t,y} \\ne y^*] \\le
            |Y| \\Pr[|N| \\ge \\mathrm{Gap}_t/2] = |Y| e^{-\\mathrm{Gap}_t/(2b)},

  i.e. |Y| exp(-eps Gap_t / (4kr)) for b = 2kr/eps. Gap_t <= 0 gives 1.

  Args:
    gap: Gap_t (scalar or array; counts, so >= 0 in practice).
    scale: Laplace scale b > 0.
    num_labels: |Y| >= 1.
  """
  _check("gap", gap)
  _check("scale", scale, low=0)
  _check("num_labels", num_labels, low=1, low_open=False, integer=True)
  return _run(_laplace_labeling, _laplace_labeling_log, ("gap", "scale", "num_labels"), gap, scale,
              num_labels)


# --- discrete Laplace ---------------------------------------------------------------


def _dlap_tail(a, m):
  """Pr[|Z| >= m] for integer m >= 1: 2 e^{-a m} / (1 + e^{-a})."""
  return 2.0 * jnp.exp(-a * m) / (1.0 + jnp.exp(-a))


def _dlap_alpha(a, beta, m):
  need = jnp.ceil(jnp.log(2.0 * m / (beta * (1.0 + jnp.exp(-a)))) / a)
  return jnp.maximum(need, 1.0) - 1.0


def _dlap_beta(a, alpha, m):
  return jnp.minimum(1.0, m * _dlap_tail(a, jnp.floor(alpha) + 1.0))


def _dlap_labeling(gap, a, num_labels):
  half = jnp.ceil(gap / 2.0)
  return jnp.where(half >= 1, jnp.minimum(1.0, num_labels * _dlap_tail(a, half)), 1.0)


def _dlap_log_tail(a, m):
  """ln Pr[|Z| >= m] (NumPy): ln 2 - a m - ln(1 + e^{-a})."""
  return np.log(2.0) - a * m - np.log1p(np.exp(-a))


def _dlap_alpha_log(a, beta, m):
  need = np.ceil((_log2m(m) - np.log(beta) - np.log1p(np.exp(-a))) / a)
  return np.maximum(need, 1.0) - 1.0


def _dlap_beta_log(a, alpha, m):
  return np.minimum(1.0, np.exp(np.log(m) + _dlap_log_tail(a, np.floor(alpha) + 1.0)))


def _dlap_labeling_log(gap, a, num_labels):
  half = np.ceil(gap / 2.0)
  return np.where(half >= 1, np.minimum(1.0, np.exp(np.log(num_labels) + _dlap_log_tail(a, half))), 1.0)


def discrete_laplace_alpha(parameter: Any, beta: Any, *, num_entries: Any = 1) -> Any:
  """Proposition 1 from the exact discrete-Laplace tail: the least integer alpha.

  For Pr[Z = z] proportional to e^{-a|z|} on the integers,

  .. math:: \\Pr[|Z| > \\alpha] = \\Pr[|Z| \\ge \\lfloor\\alpha\\rfloor + 1]
            = \\frac{2 e^{-a(\\lfloor\\alpha\\rfloor + 1)}}{1 + e^{-a}},

  so alpha is the least integer >= 0 with m times this <= beta.

  Args:
    parameter: a > 0 (a = eps / Delta).
    beta: failure probability in (0, 1].
    num_entries: m >= 1 entries covered by the union bound.

  Returns:
    alpha, a whole number as float64.
  """
  _check("parameter", parameter, low=0)
  _check("beta", beta, low=0, high=1)
  _check("num_entries", num_entries, low=1, low_open=False, integer=True)
  return _run(_dlap_alpha, _dlap_alpha_log, ("parameter", "beta", "num_entries"), parameter, beta, num_entries)


def discrete_laplace_beta(parameter: Any, alpha: Any, *, num_entries: Any = 1) -> Any:
  """Failure probability min(1, m Pr[|Z| > alpha]) of discrete Laplace(a)."""
  _check("parameter", parameter, low=0)
  _check("alpha", alpha, low=0, low_open=False)
  _check("num_entries", num_entries, low=1, low_open=False, integer=True)
  return _run(_dlap_beta, _dlap_beta_log, ("parameter", "alpha", "num_entries"), parameter, alpha, num_entries)


def discrete_laplace_labeling_error(gap: Any, parameter: Any, *, num_labels: Any) -> Any:
  """Theorem 1 with discrete Laplace(a): |Y| Pr[|Z| >= ceil(Gap_t/2)].

  .. math:: \\Pr[\\text{wrong}] \\le |Y| \\frac{2 e^{-a \\lceil \\mathrm{Gap}_t/2 \\rceil}}
            {1 + e^{-a}} \\quad (\\mathrm{Gap}_t \\ge 1),

  since an integer error with |Z| >= Gap_t/2 has |Z| >= ceil(Gap_t/2).
  Gap_t <= 0 gives 1.

  Args:
    gap: Gap_t (scalar or array).
    parameter: a > 0.
    num_labels: |Y| >= 1.
  """
  _check("gap", gap)
  _check("parameter", parameter, low=0)
  _check("num_labels", num_labels, low=1, low_open=False, integer=True)
  return _run(_dlap_labeling, _dlap_labeling_log, ("gap", "parameter", "num_labels"), gap, parameter,
              num_labels)


# --- Collision (Theorem 2) ----------------------------------------------------------


def _bernstein_terms(p, q, n):
  gap = p - q
  variance = n * jnp.maximum(p * (1.0 - p), q * (1.0 - q)) / gap**2
  bound = jnp.maximum(p, 1.0 - q) / gap
  return variance, bound


def _collision_alpha(beta, p, q, n, m):
  v, b = _bernstein_terms(p, q, n)
  log_term = jnp.log(2.0 * m / beta)
  lin = log_term * b / 3.0
  return lin + jnp.sqrt(lin**2 + 2.0 * log_term * v)


def _collision_beta(alpha, p, q, n, m):
  v, b = _bernstein_terms(p, q, n)
  return jnp.minimum(1.0, 2.0 * m * jnp.exp(-alpha**2 / (2.0 * (v + b * alpha / 3.0))))


def _collision_labeling(gap, p, q, n, num_labels):
  return jnp.where(gap > 0, _collision_beta(jnp.maximum(gap, 0.0) / 2.0, p, q, n, num_labels), 1.0)


# In units of hits, t = alpha (p - q): V + M alpha/3 = (n w + c t/3) / (p - q)^2 with w = max(p(1-p), q(1-q))
# and c = max(p, 1 - q), so nothing is divided by (p - q)^2 (which underflows) and alpha^2 is never formed.
def _collision_alpha_log(beta, p, q, n, m):
  w = np.maximum(p * (1.0 - p), q * (1.0 - q))
  return bernstein_hits_alpha(_log2m(m) - np.log(beta), p, q, w, n)


def bernstein_hits_alpha(log_term, p, q, variance, count=1.0):
  """Bernstein's alpha, in estimate units, for a sum of hit indicators of rates p (present) and q (absent).

  With L = ``log_term`` (ln(2m / beta) for a union over m entries), hit variance V = ``count`` *
  ``variance`` and |hit - rate| <= c = max(p, 1 - q): t = cL/3 + sqrt((cL/3)^2 + 2LV) hits, alpha =
  t / (p - q). ``variance`` and ``count`` stay apart inside the square root, so n w never overflows.
  """
  return bernstein_sum_alpha(log_term, np.maximum(p, 1.0 - q), variance, count) / (p - q)


def bernstein_sum_alpha(log_term, term_bound, variance, count=1.0):
  """Bernstein's deviation for a sum of independent centred terms, each at most ``term_bound`` in absolute value.

  With L = ``log_term`` (ln(2m / beta) for a union over m entries) and V = ``count`` * ``variance`` the sum's
  variance, Pr[|sum| >= t] <= 2 exp(-t^2 / (2 (V + M t / 3))) = beta / m at t = ML/3 + sqrt((ML/3)^2 + 2LV).
  ``variance`` and ``count`` stay apart inside the square root, so their product never overflows.
  """
  h = log_term * term_bound / 3.0
  return h + np.hypot(h, np.sqrt(2.0 * log_term * variance) * np.sqrt(count))


def _collision_beta_log(alpha, p, q, n, m):
  t = alpha * (p - q)
  w = np.maximum(p * (1.0 - p), q * (1.0 - q))
  exponent = t * (t / (n * w + np.maximum(p, 1.0 - q) * t / 3.0)) / 2.0  # c >= 1/2: t / (...) <= 6
  return np.minimum(1.0, np.exp(_log2m(m) - exponent))


def _collision_labeling_log(gap, p, q, n, num_labels):
  return np.where(gap > 0, _collision_beta_log(np.maximum(gap, 0.0) / 2.0, p, q, n, num_labels), 1.0)


def _collision_suspect(x, p, q, n, m):
  """Where the direct Bernstein exponent may be wrong yet finite: x^2, V or 2m overflow, (p - q)^2 underflows."""
  gap2 = (p - q) ** 2
  v = n * np.maximum(p * (1.0 - p), q * (1.0 - q)) / gap2
  return ~np.isfinite(x * x) | ~np.isfinite(v) | (gap2 < np.finfo(np.float64).tiny) | ~np.isfinite(2.0 * m)


def _check_rates(p: Any, q: Any) -> None:
  _check("p", p, low=0, high=1)
  _check("q", q, low=0, high=1)
  if _traced(p) or _traced(q):
    return
  try:
    smaller = np.asarray(p, np.float64) <= np.asarray(q, np.float64)
  except ValueError:
    raise ValueError(f"Expected p and q to broadcast to one shape; got shapes {np.shape(p)} and "
                     f"{np.shape(q)}.") from None
  if np.any(smaller):
    raise ValueError(f"Expected p={p!r} > q={q!r}.")


def collision_alpha(beta: Any, *, p: Any, q: Any, num_clients: Any, num_entries: Any = 1) -> Any:
  """Theorem 2 with explicit constants: Bernstein plus a union bound.

  The error of entry j is a sum of n independent terms
  X_i = (hit_ij - E hit_ij)/(p - q) with |X_i| <= M = max(p, 1 - q)/(p - q)
  and total variance at most V = n max(p(1-p), q(1-q))/(p - q)^2
  (whatever the true counts). Bernstein's inequality
  Pr[|sum X_i| >= t] <= 2 exp(-t^2 / (2(V + M t/3))) and a union bound over m
  entries give

  .. math:: \\alpha = \\frac{LM}{3} + \\sqrt{\\Big(\\frac{LM}{3}\\Big)^2 + 2LV},
            \\qquad L = \\ln\\frac{2m}{\\beta}.

  For eps = O(1) and l = kr e^eps + 2kr - 1 this is
  O(sqrt(n kr ln(|Y|/beta))/eps) (Theorem 2, spec §1.7, §5 I6).

  Args:
    beta: failure probability in (0, 1].
    p: Pr[hit | entry present] = e^eps / Omega.
    q: Pr[hit | entry absent] = 1/l (< p).
    num_clients: n >= 1.
    num_entries: m >= 1 (|Y| per bucket, s|Y| for all buckets).
  """
  _check("beta", beta, low=0, high=1)
  _check_rates(p, q)
  _check("num_clients", num_clients, low=1, low_open=False, integer=True)
  _check("num_entries", num_entries, low=1, low_open=False, integer=True)
  return _run(_collision_alpha, _collision_alpha_log, ("beta", "p", "q", "num_clients", "num_entries"), beta, p, q,
              num_clients, num_entries)


def collision_beta(alpha: Any, *, p: Any, q: Any, num_clients: Any, num_entries: Any = 1) -> Any:
  """Bernstein failure probability of Collision at accuracy alpha >= 0 (see :func:`collision_alpha`)."""
  _check("alpha", alpha, low=0, low_open=False)
  _check_rates(p, q)
  _check("num_clients", num_clients, low=1, low_open=False, integer=True)
  _check("num_entries", num_entries, low=1, low_open=False, integer=True)
  return _run(_collision_beta, _collision_beta_log, ("alpha", "p", "q", "num_clients", "num_entries"), alpha, p, q,
              num_clients, num_entries, suspect=_collision_suspect)


def collision_labeling_error(gap: Any, *, p: Any, q: Any, num_clients: Any, num_labels: Any) -> Any:
  """Theorem 1 with Theorem 2: Pr[wrong] <= 2|Y| exp(-(G/2)^2 / (2(V + M G/6))).

  Args:
    gap: Gap_t (scalar or array); <= 0 gives 1.
    p, q: hit rates of the Collision mechanism.
    num_clients: n.
    num_labels: |Y|.
  """
  _check("gap", gap)
  _check_rates(p, q)
  _check("num_clients", num_clients, low=1, low_open=False, integer=True)
  _check("num_labels", num_labels, low=1, low_open=False, integer=True)
  return _run(_collision_labeling, _collision_labeling_log, ("gap", "p", "q", "num_clients", "num_labels"), gap, p,
              q, num_clients, num_labels, suspect=_collision_suspect)

