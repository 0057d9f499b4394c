"""Negative-binomial noise shares with tiny shape r = 1/n, sampled exactly enough.

The multi-message shuffle protocol has every client draw NB(1/n, p) shares,
and their sum over n clients must be NB(1, p) *in law*, up to a total
variation far below delta. Float32 samplers cannot do this: an inverse-CDF
threshold or a gamma-Poisson draw in float32 has a granularity of about 1e-7
per draw, while Pr[X > 0] = 1 - (1-p)^{1/n} is about 1e-6 at n = 10^6, so
the per-client law is off by a relative 10% and the n-fold sum by far more
than delta.

This module samples by the compound-Poisson representation of the negative
binomial (Quenouille 1949): NB(r, p) is the sum of N ~ Poisson(r ln(1/(1-p)))
i.i.d. Logarithmic(p) variables, Pr[L = k] = p^k / (k ln(1/(1-p))), k >= 1.
Independent NB(r_s, p_s) variables on ``cells`` cells and S streams are
therefore one Poisson process: the total number of events is
E ~ Poisson(cells * sum_s lambda_s) with lambda_s = r_s ln(1/(1-p_s)); each
event independently picks a stream s with probability lambda_s / sum lambda,
a size L ~ Logarithmic(p_s) and a uniform cell. Every one of these discrete
choices is an inverse-CDF lookup of a **96-bit** uniform (three uint32 words)
against a table of survival thresholds round(2^96 Pr[X > k]) computed once on
the host with 50-digit decimal arithmetic, by exact multi-word integer
comparison (a binary search), so no floating point touches the sampled law.

Formal guarantees:
  Let K_E, K_L and K_C be the numbers of thresholds in the count, mark
  (stream, size) and cell tables, E_cap = K_E the cap on events, tail_E =
  Pr[Poisson > E_cap] and tail_L the Logarithmic mass beyond the tables (both
  at most 2^-100 by construction). One client's draw differs from the
  analysed law (exact independent NB(r_s, p_s) on every cell) in total
  variation by at most

  .. math::

     \\tau_c \\le \\mathrm{tail}_E + K_E 2^{-96}
                + E_{cap}\\,(\\mathrm{tail}_L + (K_L + K_C)\\, 2^{-96}),

  (each rounded threshold moves at most 2^-96 of mass; truncated tails are
  folded into the last outcome). For the shapes used here (K <= 10^5,
  E_cap <= 100) this is below 10^-21 per client, and n clients' views differ
  by at most n tau_c (subadditivity of TV over independent draws), which the
  mechanisms add to delta as (1 + e^eps) n tau_c.

References:
  Quenouille, "A relation between the logarithmic, Poisson, and negative
  binomial series", Biometrics 5 (1949); Ghazi, Kumar, Manurangsi, Pagh,
  ICML 2020 (negative-binomial shares for shuffle-model counting).
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

from jaxdistill import _validate

__all__ = ["sample_negative_binomial"]

_WORDS = 3
_BITS = 32 * _WORDS
_SCALE = 1 << _BITS
_TAIL = decimal.Decimal(2) ** -100  # truncated tails fold into the last outcome
_THRESHOLD_ERROR = 2.0**-96  # |round(2^96 S) / 2^96 - S| (+ 50-digit error), per threshold
_MAX_EVENTS = 1 << 16
_MAX_TABLE = 1 << 22
#: Smallest p the public sampler takes. The tables compute ln(1 - p) from 1 - p rounded to 50 digits (an
#: error of 5e-51), relative error 5e-51 / p <= 5e-31 < 2^-100 for p >= 1e-20; below, the Logarithmic
#: table's mass no longer reaches 1 - 2^-100 reliably (a "table too large" error or, when 1 - p rounds to 1,
#: a division by zero).
MIN_PROB = 1e-20


def _logarithmic_length(p: float) -> float:
  """About how many entries the Logarithmic(p) table needs for a 2^-100 tail (p in (0, 1))."""
  # Pr[L > K] <= p^{K+1} / ((K+1)(1-p) ln(1/(1-p))).
  return (-100 * math.log(2) + math.log1p(-p) + math.log(-math.log1p(-p))) / math.log(p)


def _check_prob(name: str, p: float) -> None:
  """Raises ``ValueError`` naming ``name`` unless the tables support p: MIN_PROB <= p, table <= _MAX_TABLE."""
  if p < MIN_PROB:
    raise ValueError(f"Expected {name}={p!r} >= {MIN_PROB:g}: the 50-digit tables resolve ln(1 - p) to 2^-100 "
                     f"only from there.")
  approx_len = _logarithmic_length(p)
  if approx_len > _MAX_TABLE:
    raise ValueError(f"Expected {name}={p!r} further from 1 (Logarithmic table of ~{approx_len:.3g} "
                     f"entries exceeds {_MAX_TABLE}).")


def _ctx() -> decimal.Context:
  return decimal.Context(prec=50)


def _words(values: list[int]) -> np.ndarray:
  """Integers in [0, 2^96) -> uint32 ``[K, 3]``, most significant word first."""
  out = np.zeros((len(values), _WORDS), np.uint32)
  for i, v in enumerate(values):
    v = min(max(v, 0), _SCALE - 1)
    for w in range(_WORDS):
      out[i, _WORDS - 1 - w] = (v >> (32 * w)) & 0xFFFFFFFF
  return out


def _thresholds(survival: list[decimal.Decimal]) -> np.ndarray:
  """round(2^96 S_k) as words; S must be non-increasing."""
  with decimal.localcontext(_ctx()):
    return _words([int((s * _SCALE).to_integral_value(rounding=decimal.ROUND_HALF_EVEN)) for s in survival])


@dataclasses.dataclass(frozen=True, eq=False)
class CompoundPoissonTables:
  """Host tables of one compound-Poisson sampler (see the module docstring).

  Attributes:
    count: uint32 ``[E_cap, 3]`` thresholds of Pr[E > k], k < E_cap.
    mark: uint32 ``[K_L, 3]`` thresholds of the joint (stream, size) index.
    mark_stream: int32 ``[K_L + 1]`` stream of each mark index.
    mark_size: int32 ``[K_L + 1]`` Logarithmic size of each mark index.
    cell: uint32 ``[cells - 1, 3]`` thresholds of the uniform cell.
    cells: number of cells.
    streams: number of streams S.
    rate: expected events per draw, cells * sum_s lambda_s (float64).
    tv_bound: tau_c, the total-variation bound of one draw (float64).
  """

  count: np.ndarray
  mark: np.ndarray
  mark_stream: np.ndarray
  mark_size: np.ndarray
  cell: np.ndarray
  cells: int
  streams: int
  rate: float
  tv_bound: float


@functools.lru_cache(maxsize=64)
def compound_poisson_tables(shapes: tuple[float, ...], probs: tuple[float, ...],
                            cells: int) -> CompoundPoissonTables:
  """Tables for independent NB(shapes[s], probs[s]) on each of ``cells`` cells.

  Args:
    shapes: r_s > 0 per stream (Python floats; used exactly).
    probs: p_s in (0, 1) per stream.
    cells: number of cells (>= 1).

  Raises:
    ValueError: if a table would exceed its size limit (expected events per
      draw too large, or p_s too close to 1).
  """
  with decimal.localcontext(_ctx()):
    D = decimal.Decimal
    lam = [D(r) * -(1 - D(p)).ln() for r, p in zip(shapes, probs)]
    total = sum(lam)
    rate = total * cells
    # Count: Pr[E > k] for k = 0..E_cap-1 with Pr[E > E_cap] <= 2^-100.
    pmf = (-rate).exp()
    cdf = pmf
    survival = []
    k = 0
    while 1 - cdf > _TAIL:
      survival.append(1 - cdf)
      k += 1
      pmf = pmf * rate / k
      cdf += pmf
      if k > _MAX_EVENTS:
        raise ValueError(f"Expected fewer events per draw; the rate {float(rate):.4g} is too large "
                         f"(more than {_MAX_EVENTS} events needed).")
    tail_e = max(D(0), 1 - cdf)
    count = _thresholds(survival)
    # Marks: (stream s, size j) with probability lambda_s / total * Log_{p_s}(j).
    mark_pmf, stream_of, size_of = [], [], []
    for s, (ls, p) in enumerate(zip(lam, probs)):
      # Table length needed for a 2^-100 tail: Pr[L > K] <= p^{K+1} / ((K+1)(1-p) ln(1/(1-p))).
      approx_len = _logarithmic_length(p)
      if approx_len > _MAX_TABLE:
        raise ValueError(f"Expected probs[{s}]={p} further from 1 (Logarithmic table of ~{approx_len:.3g} "
                         f"entries exceeds {_MAX_TABLE}).")
      dp = D(p)
      log_norm = -(1 - dp).ln()
      if log_norm == 0:  # 1 - p rounds to 1 in 50 digits: the divisions below would be 0 / 0
        raise ValueError(f"Expected probs[{s}]={p} >= {MIN_PROB:g} (1 - p rounds to 1 in the 50-digit tables).")
      weight = ls / total
      term = dp / log_norm  # Pr[L = 1]
      mass = D(0)
      j = 1
      while True:
        mark_pmf.append(weight * term)
        stream_of.append(s)
        size_of.append(j)
        mass += term
        if 1 - mass <= _TAIL:
          break
        term = term * dp * j / (j + 1)
        j += 1
        if len(mark_pmf) > _MAX_TABLE:
          if p < 0.5:  # the table is long because ln(1 - p) is too coarse, not because p is near 1
            raise ValueError(f"Expected probs[{s}]={p} >= {MIN_PROB:g} (Logarithmic table too large: "
                             f"ln(1 - p) is too coarse in 50 digits).")
          raise ValueError(f"Expected probs[{s}]={p} further from 1 (Logarithmic table too large).")
    tail_l = max(D(0), 1 - sum(mark_pmf))
    cum = D(0)
    mark_survival = []
    for q in mark_pmf[:-1]:
      cum += q
      mark_survival.append(max(D(0), 1 - cum))
    mark = _thresholds(mark_survival)
  if cells > _MAX_TABLE:
    raise ValueError(f"Expected cells={cells} <= {_MAX_TABLE}.")
  cell = _words([((cells - 1 - j) * _SCALE + cells // 2) // cells for j in range(cells - 1)])
  e_cap = len(survival)
  tv = (float(tail_e) + e_cap * _THRESHOLD_ERROR
        + e_cap * (float(tail_l) + (len(mark_survival) + cells - 1) * _THRESHOLD_ERROR))
  arrays = (count, mark, np.asarray(stream_of, np.int32), np.asarray(size_of, np.int32), cell)
  for a in arrays:  # cached and shared (ShuffleMultiMessage.tables() returns them): read-only, as _clone_window's
    a.setflags(write=False)
  return CompoundPoissonTables(*arrays, cells, len(shapes), float(rate), tv)


def _less(u: jax.Array, t: jax.Array) -> jax.Array:
  """u < t for 96-bit integers stored as ``[..., 3]`` uint32 (MSW first)."""
  u0, u1, u2 = u[..., 0], u[..., 1], u[..., 2]
  t0, t1, t2 = t[..., 0], t[..., 1], t[..., 2]
  return (u0 < t0) | ((u0 == t0) & ((u1 < t1) | ((u1 == t1) & (u2 < t2))))


def count_below(u: jax.Array, table: np.ndarray) -> jax.Array:
  """#{k : u < table[k]} for a non-increasing table, by binary search.

  With table[k] = round(2^96 Pr[X > k]) and u uniform on [0, 2^96), the
  result X has Pr[X > k] = table[k] / 2^96 exactly.

  Args:
    u: uint32 ``[..., 3]`` uniform words.
    table: uint32 ``[K, 3]`` non-increasing thresholds.

  Returns:
    int32 ``[...]`` in [0, K].
  """
  size = table.shape[0]
  lo = jnp.zeros(u.shape[:-1], jnp.int32)
  if size == 0:
    return lo
  tab = jnp.asarray(table)
  hi = jnp.full(u.shape[:-1], size, jnp.int32)

  def step(_, bounds):
    lo, hi = bounds
    mid = (lo + hi) // 2
    right = (mid < hi) & _less(u, tab[jnp.minimum(mid, size - 1)])
    return jnp.where(right, mid + 1, lo), jnp.where(right, hi, mid)

  # A loop (not unrolled) keeps compile times low for large tables.
  lo, _ = jax.lax.fori_loop(0, size.bit_length(), step, (lo, hi))
  return lo


def compound_poisson_events(key: jax.Array,
                            tables: CompoundPoissonTables) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The events of one draw: ``(cell, stream, size)``, each int32 ``[E_cap]``.

  Unused event slots (beyond the Poisson count) have size 0. The draw is
  ``sum over events of size`` at ``(cell, stream)``.
  """
  e_cap = tables.count.shape[0]
  words = jax.random.bits(key, (1 + 2 * e_cap, _WORDS), jnp.uint32)
  events = count_below(words[0], tables.count)
  mark = count_below(words[1:1 + e_cap], tables.mark)
  stream = jnp.asarray(tables.mark_stream)[mark]
  size = jnp.where(jnp.arange(e_cap) < events, jnp.asarray(tables.mark_size)[mark], 0)
  cell = count_below(words[1 + e_cap:], tables.cell)
  return cell, stream, size


def random_access_supported(keys: jax.Array) -> bool:
  """Whether :func:`bits_at` reproduces ``jax.random.bits`` for these keys (trace-time check).

  True for threefry keys (key data ``[..., 2]`` uint32) under JAX's default
  ``jax_threefry_partitionable`` layout.
  """
  data = jax.random.key_data(keys)
  return (data.shape[-1:] == (2,) and data.dtype == jnp.uint32
          and bool(jax.config.jax_threefry_partitionable))


def bits_at(key_data: jax.Array, index: jax.Array) -> jax.Array:
  """Words ``index`` of the stream ``jax.random.bits(key, shape, jnp.uint32).reshape(-1)``.

  With partitionable threefry, word m of any ``jax.random.bits`` draw is the
  XOR of the two output words of threefry-2x32 on the counter (0, m) (for
  m < 2^32), so single words can be computed without the rest of the draw.

  Args:
    key_data: uint32 ``[2]`` threefry key data (``jax.random.key_data(key)``).
    index: uint32 ``[...]`` flat word indices (< 2^32).

  Returns:
    uint32 ``[...]``.
  """
  flat = jnp.asarray(index, jnp.uint32).reshape(-1)
  m = flat.shape[0]
  out = threefry_2x32(key_data, jnp.concatenate([jnp.zeros_like(flat), flat]))
  return (out[:m] ^ out[m:]).reshape(jnp.shape(index))


def compound_poisson_event_counts(keys: jax.Array, tables: CompoundPoissonTables) -> jax.Array:
  """int32 ``[C]``: the number of events of each key's draw (as :func:`compound_poisson_events`).

  The count is #{k : u < t_k} for the draw's 96-bit uniform u (words 0-2 of
  its stream) and the thresholds t_k. Comparing the most significant words
  decides every comparison unless u's top word equals some t_k's (for a
  chunk of C draws, probability <= C E_cap 2^-32), so one word per draw is
  read and the full 96-bit search runs only for chunks where a tie occurs:
  the result is bitwise that of the full comparison. Needs
  :func:`random_access_supported` keys; not meant to be vmapped (the chunk
  decides with ``lax.cond``).
  """
  data = jax.random.key_data(keys)
  top = jax.vmap(bits_at, in_axes=(0, None))(data, jnp.zeros((1,), jnp.uint32))[:, 0]
  tops = jnp.asarray(tables.count[:, 0])
  below = jnp.sum(top[:, None] < tops[None, :], axis=1, dtype=jnp.int32)
  tied = jnp.any(top[:, None] == tops[None, :])

  def full():
    words = jax.vmap(bits_at, in_axes=(0, None))(data, jnp.arange(_WORDS, dtype=jnp.uint32))
    return count_below(words, tables.count)

  return jax.lax.cond(tied, full, lambda: below)


def compound_poisson_event_marks(key_data: jax.Array, slot: jax.Array,
                                 tables: CompoundPoissonTables) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(cell, stream, size)`` of event slot ``slot`` of each draw, by random access.

  Bitwise equal to row ``slot`` of :func:`compound_poisson_events` for the
  same key (whose words are ``jax.random.bits(key, (1 + 2 E_cap, 3))``: row 0
  the count, rows 1 .. E_cap the marks, the next E_cap rows the cells).

  Args:
    key_data: uint32 ``[B, 2]`` key data of the draw each slot belongs to.
    slot: int32 ``[B]`` event slots in [0, E_cap).
    tables: the sampler's tables.
  """
  e_cap = tables.count.shape[0]
  col = jnp.arange(_WORDS, dtype=jnp.uint32)
  row = slot.astype(jnp.uint32)
  mark_idx = _WORDS * (1 + row)[:, None] + col
  cell_idx = _WORDS * (1 + e_cap + row)[:, None] + col
  words = jax.vmap(bits_at)(key_data, jnp.concatenate([mark_idx, cell_idx], axis=1))
  mark = count_below(words[:, :_WORDS], tables.mark)
  cell = count_below(words[:, _WORDS:], tables.cell)
  return cell, jnp.asarray(tables.mark_stream)[mark], jnp.asarray(tables.mark_size)[mark]


def compound_poisson_sample(key: jax.Array, tables: CompoundPoissonTables) -> jax.Array:
  """One draw of independent NB(r_s, p_s) on every (cell, stream): int32 ``[cells, S]``.

  Pure, fixed shapes: jittable and vmappable over keys.
  """
  cells, streams = tables.cells, tables.streams
  cell, stream, size = compound_poisson_events(key, tables)
  flat = jnp.zeros(cells * streams, jnp.int32).at[cell * streams + stream].add(size)
  return flat.reshape(cells, streams)


#: Most draws one call of :func:`sample_negative_binomial` makes (int32 indexing; 8 GiB of int32 output).
MAX_DRAWS = 2**31 - 1


def sample_negative_binomial(key: jax.Array, r: Any, p: Any, shape: Any = ()) -> jax.Array:
  """Independent NB(r, p) draws, exact up to a stated total variation.

  .. math:: \\Pr[X = k] = \\frac{\\Gamma(k + r)}{k!\\,\\Gamma(r)} (1-p)^r p^k,\\qquad
            \\mathbb E X = \\frac{r p}{1 - p}.

  Designed for tiny shapes (r = 1/n with n up to 10^9; any r > 0 works while
  r ln(1/(1-p)) stays below about 10^4): see the module docstring for the
  method. Each draw is within total variation ``total_variation_bound(r, p)`` (in
  ``jaxdistill.mechanisms._nb_sampler``) of NB(r, p).

  Args:
    key: PRNG key.
    r: shape > 0.
    p: in [``MIN_PROB`` = 1e-20, 1), and not so close to 1 that the
      Logarithmic table exceeds 2^22 entries (about 1 - p >= 2e-5).
    shape: output shape (a tuple of ints), at most ``MAX_DRAWS`` = 2^31 - 1
      draws in all.

  Returns:
    int32 array of ``shape``.

  Raises:
    ValueError: on bad arguments, p outside the range above, or if
      r ln(1/(1-p)) is so large that a draw needs more than 2^16 Poisson events.

  >>> x = sample_negative_binomial(jax.random.key(0), 1e-6, 0.5, (4,))
  >>> x.shape, x.dtype
  ((4,), dtype('int32'))
  """
  key = _validate.prng_key("key", key)
  r = _validate.positive("r", r)
  p = _validate.open_unit("p", p)
  try:
    dims = shape if isinstance(shape, tuple) else tuple(shape)
    shape = tuple(_validate.integer("shape", s, minimum=0, maximum=MAX_DRAWS) for s in dims)
  except TypeError:
    raise ValueError(f"Expected shape to be a tuple of non-negative ints; got {shape!r}.") from None
  if math.prod(shape) > MAX_DRAWS:  # (2**40,) returned a lazy out-of-memory array; reading it aborted the process
    raise ValueError(f"Expected shape={shape} to hold at most {MAX_DRAWS} draws (int32 indexing); got "
                     f"{math.prod(shape)}.")
  return _sample_jit(key, _public_tables(r, p), shape)


def _public_tables(r: float, p: float) -> CompoundPoissonTables:
  """The one-stream tables of checked r and p; errors name r and p, not the tables' ``probs[0]``."""
  _check_prob("p", p)
  try:
    return compound_poisson_tables((r,), (p,), 1)
  except ValueError as err:
    raise ValueError(f"Expected r={r!r} and p={p!r} within the sampler's range: "
                     f"{_validate.first_line(err)}") from None


@functools.partial(jax.jit, static_argnums=(1, 2))
def _sample_jit(key, tables, shape):
  size = math.prod(shape)
  keys = jax.random.split(key, size)
  return jax.vmap(lambda k: compound_poisson_sample(k, tables)[0, 0])(keys).reshape(shape)


def total_variation_bound(r: Any, p: Any) -> float:
  """tau of one :func:`sample_negative_binomial` draw: its TV distance to NB(r, p)."""
  r = _validate.positive("r", r)
  p = _validate.open_unit("p", p)
  return _public_tables(r, p).tv_bound
