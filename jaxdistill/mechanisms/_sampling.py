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
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

__all__ = ["dyadic_ceil", "uniform_words", "bernoulli_dyadic"]


def dyadic_ceil(prob: float, bits: int) -> int:
  """The integer t = ceil(prob * 2^bits): Pr[u < t] = t / 2^bits >= prob for u uniform on b bits."""
  if bits not in (16, 32):
    raise ValueError(f"Expected bits in (16, 32); got {bits!r}.")
  if not 0.0 <= prob <= 1.0:
    raise ValueError(f"Expected prob={prob!r} in [0, 1].")
  return min(int(math.ceil(prob * 2**bits)), 2**bits)


def uniform_words(key: jax.Array, num_words: int) -> jax.Array:
  """``uint32 [num_words]`` uniform words from ceil(num_words / 2) threefry hashes.

  Threefry keys hash the counters (0, i) for i = 0, 1, ... and keep both
  output words (words 2i and 2i + 1), so a shorter stream is a prefix of a
  longer one; other key implementations fall back to ``jax.random.bits``.
  """
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
    num: number of draws.
  """
  if bits == 32:
    if threshold >= 2**32:
      return jnp.ones((num,), jnp.bool_)
    return uniform_words(key, num) < np.uint32(threshold)
  if bits != 16:
    raise ValueError(f"Expected bits in (16, 32); got {bits!r}.")
  half = -(-num // 2)
  w = uniform_words(key, half)
  u = jnp.concatenate([w & np.uint32(0xFFFF), w >> np.uint32(16)])[:num]
  return u < np.uint32(threshold)
