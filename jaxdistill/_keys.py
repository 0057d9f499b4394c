"""Secret seeds: PRNG keys that a run's recorded seed does not determine.

A reproducible run derives all its randomness from a seed recorded in its
report, so anyone who reads the report can recompute the noise (labeling) or
which records were sampled (FedMD-NFDP) and undo the privacy. A secret seed
replaces the root of those draws only; everything else stays a function of
the recorded seed.
"""

from __future__ import annotations

import secrets

import jax
import numpy as np

from jaxdistill import _validate

#: Secret seeds are 64-bit: all of them enter the key (see :func:`secret_key`).
MAX_SECRET_SEED = 2**64 - 1


def draw_secret_seed() -> int:
  """A fresh 63-bit seed from the operating system's CSPRNG."""
  return secrets.randbits(63)


def check_secret_seed(name: str, value: object) -> int | None:
  """``None`` or an integer in [0, 2**64), else a ValueError naming ``name`` (never echoing the value)."""
  if value is None:
    return None
  try:
    return _validate.integer(name, value, minimum=0, maximum=MAX_SECRET_SEED)
  except ValueError:
    raise ValueError(f"Expected {name} to be None or an integer in [0, 2**64); got a {type(value).__name__} "
                     "that is not (value not shown: a secret seed is secret).") from None


def seed_key(seed: int) -> jax.Array:
  """``jax.random.key(seed)`` as a threefry2x32 key whatever JAX's default implementation.

  The library's recorded-seed roots (the CLI, the labeling pipeline) use it: under
  ``JAX_DEFAULT_PRNG_IMPL=rbg`` a default key changed the numbers and was refused by
  :func:`jaxdistill.simulation.simulate` midway through a labeling run.
  """
  return jax.random.key(seed, impl="threefry2x32")


def secret_key(seed: int | None = None) -> jax.Array:
  """A PRNG key for a real release: from ``seed`` (a secret in [0, 2**64)), or fresh OS randomness.

  All 64 bits of the seed enter the key (``jax.random.key`` keeps only 32
  without x64). A key made from a recorded seed lets anyone recompute the
  noise and subtract it; this one is as secret as ``seed``. It is a threefry2x32
  key whatever JAX's default implementation, as :func:`jaxdistill.simulation.simulate`
  and the auditor require.

  >>> import jax
  >>> secret_key().dtype == jax.random.key(0).dtype
  True
  """
  seed = draw_secret_seed() if seed is None else check_secret_seed("seed", seed)
  return jax.random.fold_in(seed_key(seed & 0xFFFFFFFF), (seed >> 32) & 0xFFFFFFFF)


def fold_in_digest(key: jax.Array, digest: bytes) -> jax.Array:
  """``key`` folded with the first 64 bits of ``digest`` (two 32-bit words, little-endian).

  Ties a secret key to what one release is about (a sha256 of its settings and data): one secret seed
  used for two different releases then draws independent noise, while the same release drawn again
  gets the same noise.
  """
  for word in np.frombuffer(digest[:8], dtype="<u4"):
    key = jax.random.fold_in(key, int(word))
  return key
