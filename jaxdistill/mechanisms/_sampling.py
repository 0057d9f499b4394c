"""Exact, bit-economical Bernoulli sampling for per-client randomizers.

A float comparison ``uniform() < p`` samples a probability rounded to the
float grid, not p, so the privacy statement and the sampler silently
disagree (by ~1e-8 with float32). Here probabilities are *dyadic*: a
mechanism rounds its probability to a multiple of 2^-b in the safe
direction (:func:`dyadic_ceil`), states its guarantee for that exact value,
and :func:`bernoulli_dyadic` compares b-bit integers, which is exact.

It is also cheaper: ``jax.random.bits`` (partitionable threefry) spends one
threefry hash per 32-bit word, while :func:`uniform_words` keeps both output
words of each hash, and b = 16 packs two draws per word, so one hash feeds
four Bernoulli draws instead of one. The stream is a pure function of the
key (threefry-2x32 in counter mode), so it is identical under ``vmap``, for
any chunk size and on any device.

Uniform integers get the same treatment: :func:`uniform_below` (a static
bound, many values: hash tables) and :func:`uniform_index` (a traced bound,
one value) are exactly uniform by rejection sampling, where
``jax.random.randint`` is only approximately so, and
:func:`uniform_below` packs several values into each 32-bit word.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

from jaxdistill import _validate

_SPARE_TAIL = 2.0**-40  # spare fields: a while_loop fallback runs w.p. <= 2^-40 per call
# Fallback round r draws from fold_in(key, 2^31 + r). fold_in(key, j) hashes the counter (0, j), which is
# also the counter of words 2j and 2j + 1 of uniform_words(key): with j = r the fallback key would be two
# words the first draw already used as values. A stream shorter than 2^32 words never reaches 2^31.
_ROUND_BASE = 0x80000000


def _round_key(key: jax.Array, round_: jax.Array) -> jax.Array:
  """The key of fallback round ``round_`` >= 1 (never a word of ``uniform_words(key, .)``)."""
  return jax.random.fold_in(key, jnp.uint32(_ROUND_BASE) + round_)

__all__ = ["dyadic_ceil", "uniform_words", "bernoulli_dyadic", "uniform_below", "uniform_index"]

#: The sample widths b of :func:`dyadic_ceil` and :func:`bernoulli_dyadic`: the sampler compares b-bit
#: integers cut from 32-bit words, two per word at b = 16 and one at b = 32; no other width is implemented.
SAMPLER_BITS = (16, 32)

#: Most draws of one :func:`bernoulli_dyadic` call (2^31 - 1, the largest flattened BSVS domain): the result is
#: a ``bool [num]`` array, and num = 2^40 at threshold 2^32 asked the device for a TiB (a deep
#: ``RESOURCE_EXHAUSTED`` error) while other thresholds failed naming ``num_words``, not ``num``.
MAX_DRAWS = 2**31 - 1


def _check_bits(bits: object) -> int:
  """``bits`` as 16 or 32 (``SAMPLER_BITS``), or a one-line ValueError naming it."""
  b = _validate.integer("bits", bits)  # a bool, a string or an array of widths is named here
  if b not in SAMPLER_BITS:
    raise ValueError(f"Expected bits to be 16 or 32 (the sample widths implemented); got bits={b}.")
  return b


def dyadic_ceil(prob: float, bits: int) -> int:
  """The integer t = ceil(prob * 2^bits): Pr[u < t] = t / 2^bits >= prob for u uniform on b bits.

  Raises:
    ValueError: ``bits`` not the integer 16 or 32 (``SAMPLER_BITS``); ``prob``
      outside [0, 1], NaN, infinite, or not a real number (a bool, a string, None).
  """
  bits = _check_bits(bits)
  _validate.probability("prob", prob)  # checks only: t is computed from prob as given, exactly
  num, den = _exact_ratio(prob)
  # In Python integers: prob * 2^bits in the argument's own dtype overflowed (float16 to inf, int8/int16/int32 to
  # NumPy's OverflowError), and 0 * inf was NaN.
  return min(-((-num << bits) // den), 2**bits)


def _exact_ratio(value: Any) -> tuple[int, int]:
  """``value`` (a real number checked by the caller) as an exact integer ratio."""
  if isinstance(value, np.ndarray):
    value = value[()]
  if isinstance(value, np.integer):
    return int(value), 1
  try:
    return value.as_integer_ratio()  # int, float, Fraction, Decimal, NumPy floats (long double included)
  except AttributeError:
    return float(value).as_integer_ratio()  # e.g. a 0-d JAX array: float32 and float64 convert exactly


def uniform_words(key: jax.Array, num_words: int) -> jax.Array:
  """``uint32 [num_words]`` uniform words from ceil(num_words / 2) threefry hashes.

  Threefry keys hash the counters (0, i) for i = 0, 1, ... and keep both
  output words (words 2i and 2i + 1), so a shorter stream is a prefix of a
  longer one; other key implementations fall back to ``jax.random.bits``.
  """
  # The checks read only static metadata (dtype, shape), so they cost nothing under jit or vmap.
  key = _validate.prng_key("key", key)
  num_words = _validate.integer("num_words", num_words, minimum=0, maximum=2**32 - 2)
  data = jax.random.key_data(key)
  if data.shape != (2,) or data.dtype != jnp.uint32:
    return jax.random.bits(key, (num_words,), jnp.uint32)
  m = -(-num_words // 2)
  # threefry_2x32 pairs the first half of its input (high words) with the second (low words).
  count = jnp.concatenate([jnp.zeros(m, jnp.uint32), jnp.arange(m, dtype=jnp.uint32)])
  out = threefry_2x32(data, count)
  return jnp.stack([out[:m], out[m:]], axis=1).reshape(-1)[:num_words]


def bernoulli_dyadic(key: jax.Array, threshold: int, bits: int, num: int) -> jax.Array:
  """``bool [num]`` i.i.d. with Pr[True] = threshold / 2^bits exactly.

  Args:
    key: PRNG key.
    threshold: integer in [0, 2^bits] (from :func:`dyadic_ceil`).
    bits: 16 (two draws per 32-bit word) or 32.
    num: number of draws, in [0, ``MAX_DRAWS``] (2^31 - 1).

  Raises:
    ValueError: ``key`` not a PRNG key, ``bits`` not the integer 16 or 32,
      ``threshold`` not an integer in [0, 2^bits], or ``num`` not an integer
      in [0, ``MAX_DRAWS``].
  """
  key = _validate.prng_key("key", key)
  bits = _check_bits(bits)
  threshold = _validate.integer("threshold", threshold, minimum=0, maximum=2**bits)
  num = _validate.integer("num", num, minimum=0, maximum=MAX_DRAWS)
  if bits == 32:
    if threshold >= 2**32:
      return jnp.ones((num,), jnp.bool_)
    return uniform_words(key, num) < np.uint32(threshold)
  half = -(-num // 2)
  w = uniform_words(key, half)
  u = jnp.concatenate([w & np.uint32(0xFFFF), w >> np.uint32(16)])[:num]
  return u < np.uint32(threshold)


# -- exact uniform integers --------------------------------------------------------------
_PACK_LIMIT = 2**26  # pack digits while bound^g <= 2^26: a word is rejected w.p. < 2^-6


@functools.lru_cache(maxsize=256)
def uniform_plan(bound: int, num: int) -> tuple[int, int, int, int, int]:
  """``(g, L, accept, words, spare)`` of :func:`uniform_below` (host integers).

  Each accepted 32-bit word u < accept = floor(2^32 / L) L carries the
  g base-``bound`` digits of u mod L, L = bound^g <= 2^26 (or g = 1, L =
  bound for bounds above 2^26); ``words`` = ceil(num / g) accepted words are
  needed and ``spare`` extra words make a shortfall (a second round) happen
  with probability at most 2^-40.
  """
  if not 1 <= bound <= 2**31 - 1:
    raise ValueError(f"Expected bound={bound!r} in [1, 2^31 - 1].")
  if bound == 1 or num == 0:  # nothing random to draw (and 1^g never exceeds the pack limit)
    return 1, 1, 2**32, 0, 0
  g = 1
  while bound ** (g + 1) <= _PACK_LIMIT:
    g += 1
  big = bound**g
  accept = (2**32 // big) * big
  words = -(-num // g)
  reject = 1.0 - accept / 2.0**32
  spare = 0
  if reject > 0.0:
    from scipy import stats  # host-side, once per (bound, num)
    spare = max(1, int(words * reject))
    while stats.binom.sf(spare, words + spare, reject) > _SPARE_TAIL:
      spare += 1 + spare // 16
  return g, big, accept, words, spare


def _accepted_into(words: jax.Array, vals: jax.Array, filled: jax.Array, accept: int,
                   big: int) -> tuple[jax.Array, jax.Array]:
  """Writes the accepted words' values (u mod L, in stream order) into ``vals[filled:]``."""
  need = vals.shape[0]
  ok = jnp.ones(words.shape, jnp.bool_) if accept >= 2**32 else words < np.uint32(accept)
  value = words % np.uint32(big)
  csum = jnp.cumsum(ok.astype(jnp.int32))
  pos = jnp.where(ok, filled + csum - 1, need)  # past the end: dropped
  return vals.at[pos].set(value, mode="drop"), jnp.minimum(filled + csum[-1], need)


def uniform_below(key: jax.Array, bound: int, num: int) -> jax.Array:
  """``int32 [num]`` i.i.d. exactly uniform on {0, ..., bound - 1}.

  Exact for every bound (not only powers of two), with few random bits: the
  stream :func:`uniform_words` is cut into 32-bit words, a word u is accepted
  iff u < floor(2^32 / L) L with L = bound^g (rejection sampling: u mod L is
  then exactly uniform on [0, L)), and each accepted word yields its g
  base-``bound`` digits, which are i.i.d. uniform. With bound = 3 one word
  carries 16 values (a 2^-7 rejection rate), so 400 values cost 17 threefry
  hashes (25 words + 9 spare) instead of the 800 of ``jax.random.randint`` (which draws 64 bits
  per value and is only approximately uniform: ~bound / 2^64 off for small
  bounds, and biased for bounds above 2^16, where its 32-bit products
  overflow). A fixed number of spare words covers rejections except with
  probability <= 2^-40; a ``lax.while_loop`` then draws further words from
  ``fold_in(key, 2^31 + 1), fold_in(key, 2^31 + 2), ...``, so the result is exact, not
  truncated. The values are a pure function of the key: identical under
  ``vmap``, for any batch, on any device.

  Args:
    key: PRNG key.
    bound: static Python int in [1, 2^31 - 1].
    num: static number of values in [0, :data:`MAX_DRAWS`].
  """
  key = _validate.prng_key("key", key)
  bound = _validate.integer("bound", bound, minimum=1, maximum=2**31 - 1)
  # As bernoulli_dyadic: past it the error named num_words (never passed), after eager mode had allocated the
  # values (16 GiB at num = 2^32), or a jitted argument overflowed int32 (an OverflowError).
  num = _validate.integer("num", num, minimum=0, maximum=MAX_DRAWS)
  return _uniform_below(key, bound, num, uniform_plan(bound, num))


def _uniform_below(key: jax.Array, bound: int, num: int, plan: tuple[int, int, int, int, int]) -> jax.Array:
  """:func:`uniform_below` for a given plan (tests pass ``spare = 0`` to force extra rounds)."""
  g, big, accept, need, spare = plan
  if bound == 1 or num == 0:
    return jnp.zeros((num,), jnp.int32)
  vals = jnp.zeros((need,), jnp.uint32)
  vals, filled = _accepted_into(uniform_words(key, need + spare), vals, jnp.int32(0), accept, big)
  if accept < 2**32:  # rejection possible: draw more words until `need` are accepted
    block = max(spare, 8)

    def more(state):
      vals, filled, round_ = state
      vals, filled = _accepted_into(uniform_words(_round_key(key, round_), block), vals,
                                    filled, accept, big)
      return vals, filled, round_ + 1

    vals, _, _ = jax.lax.while_loop(lambda st: st[1] < need, more, (vals, filled, jnp.uint32(1)))
  if g == 1:
    return vals[:num].astype(jnp.int32)
  digits = []
  rest = vals
  for _ in range(g):  # constant divisor: compiled to a multiply-shift
    quot = rest // np.uint32(bound)
    digits.append(rest - quot * np.uint32(bound))
    rest = quot
  # Value t * words + f is digit t of accepted word f (any fixed bijection keeps them i.i.d.).
  return jnp.concatenate(digits)[:num].astype(jnp.int32)


def uniform_index(key: jax.Array, bound: jax.Array) -> jax.Array:
  """``int32 []`` exactly uniform on {0, ..., bound - 1} for a traced ``bound`` in [1, 2^31 - 1].

  Rejection sampling on 32-bit words: u is accepted iff u < 2^32 - (2^32 mod
  bound), and then u mod bound is exactly uniform. Two words of the key's
  stream are tried (both rejected with probability < (bound / 2^32)^2); a
  ``lax.while_loop`` draws more from ``fold_in(key, 2^31 + 1), ...`` if needed.

  Raises:
    ValueError: ``key`` not a PRNG key; ``bound`` not 0-d; a concrete (not traced) ``bound``
      outside [1, 2^31 - 1] (a traced one is the caller's to keep in range).
  """
  key = _validate.prng_key("key", key)
  if jnp.ndim(bound) != 0:  # static under jit and vmap: an array of bounds shared one word for all its draws
    raise ValueError(f"Expected bound to be one integer (0-d); got shape {tuple(jnp.shape(bound))}.")
  if not isinstance(bound, jax.core.Tracer):
    bounds = np.asarray(bound)
    if (bounds.dtype.kind not in "iu" or bounds.size == 0 or bounds.min() < 1
        or bounds.max() > 2**31 - 1):
      raise ValueError(f"Expected an integer bound in [1, 2^31 - 1]; got {bound!r}.")
  b = jnp.asarray(bound).astype(jnp.uint32)
  slack = (np.uint32(0xFFFFFFFF) % b + np.uint32(1)) % b  # 2^32 mod bound
  top = np.uint32(0xFFFFFFFF) - slack  # accept u <= top

  def pick(words):
    ok = words <= top
    first = jnp.argmax(ok)
    return (words[first] % b).astype(jnp.int32), ok.any()

  value, found = pick(uniform_words(key, 2))

  def more(state):
    _, _, round_ = state
    value, found = pick(uniform_words(_round_key(key, round_), 2))
    return value, found, round_ + 1

  value, _, _ = jax.lax.while_loop(lambda st: ~st[1], more, (value, found, jnp.uint32(1)))
  return value
