"""Adapters from the BSVS mechanism contract to the auditor's inputs."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np

from jaxdistill import _validate
from jaxdistill.mechanisms import BsvsMechanism

__all__ = ["MAX_RUNS", "local_randomizer", "replicate_estimates"]

#: Most runs :func:`replicate_estimates` takes. Each run is a whole simulation, run one after another in Python
#: (num_runs = 10^12 was accepted and would have looped for hours before failing for memory); a statistical check
#: needs hundreds to thousands.
MAX_RUNS = 10**6


def local_randomizer(mechanism: BsvsMechanism) -> Callable[[jax.Array, Any], Any]:
  """``(key, (buckets [k], labels [r])) -> message`` of one client (one object per mechanism).

  The same function object is returned for equal mechanisms, so
  :func:`audit_privacy` compiles once per mechanism. Its ``check_input(name,
  x)`` attribute, which :func:`audit_privacy` calls on both neighbours,
  refuses a client the mechanism cannot take: the kernel would silently drop
  a bucket outside its s, and the audit would be of another input.

  A mechanism that is not hashable (a subclass that is not a frozen
  dataclass) is not cached: each call returns a new function, which
  :func:`audit_privacy` compiles again.
  """
  if not isinstance(mechanism, BsvsMechanism):
    raise ValueError(f"Expected mechanism to be a BsvsMechanism; got {type(mechanism).__name__}.")
  try:
    hash(mechanism)
  except TypeError:
    return _build_randomizer(mechanism)
  return _cached_randomizer(mechanism)


def _build_randomizer(mechanism: BsvsMechanism) -> Callable[[jax.Array, Any], Any]:
  shape = mechanism.shape

  def randomize(key, x):
    buckets, labels = x
    return mechanism.randomize(key, buckets, labels)

  def check_input(name: str, x: Any) -> None:
    try:
      buckets, labels = (np.asarray(v) for v in x)
    except (TypeError, ValueError) as err:
      raise ValueError(f"Expected {name} to be a pair (buckets [k], labels [r]); got {x!r}.") from err
    for part, arr, bound, size in (("buckets", buckets, shape.k, shape.num_buckets),
                                   ("labels", labels, shape.r, shape.num_labels)):
      if arr.ndim != 1 or arr.shape[0] > bound or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"Expected {name}'s {part} to be at most {bound} integers; got {arr.tolist()!r} "
                         f"(dtype {arr.dtype}).")
      real = arr[arr >= 0]
      if (arr < -1).any() or (arr >= size).any() or len(np.unique(real)) != len(real):
        raise ValueError(f"Expected {name}'s {part} to be distinct values in [0, {size}) or -1 (padding); got "
                         f"{arr.tolist()}.")

  randomize.check_input = check_input
  return randomize


_cached_randomizer = functools.lru_cache(maxsize=64)(_build_randomizer)


def replicate_estimates(key: jax.Array, mechanism: BsvsMechanism, clients: Any, num_runs: int, *,
                        chunk_size: int | None = None) -> np.ndarray:
  """``[num_runs, s, |Y|]`` float64 estimates from independent runs (run i uses ``fold_in(key, i)``).

  Feed them to :func:`check_unbiased` / :func:`check_variance` with the true
  counts and ``mechanism.entry_variance(counts, n)``. ``chunk_size`` is the
  runner's (``None``: :func:`jaxdistill.simulation.default_chunk_size`); it
  does not change the estimates.

  Raises:
    ValueError: ``key`` not a PRNG key, or ``num_runs`` not an integer in [2, ``MAX_RUNS``] (10^6).
  """
  key = _validate.prng_key("key", key)
  from jaxdistill.simulation import simulate  # the runner imports nothing from audit

  runs = _validate.integer("num_runs", num_runs, minimum=2, maximum=MAX_RUNS)
  return np.stack([simulate(jax.random.fold_in(key, i), mechanism, clients,
                            chunk_size=chunk_size).estimate for i in range(runs)])
