"""Adapters from the BSVS mechanism contract to the auditor's inputs."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np

from jaxdistill import _validate
from jaxdistill.mechanisms import BsvsMechanism

__all__ = ["local_randomizer", "replicate_estimates"]


@functools.lru_cache(maxsize=64)
def local_randomizer(mechanism: BsvsMechanism) -> Callable[[jax.Array, Any], Any]:
  """``(key, (buckets [k], labels [r])) -> message`` of one client (one object per mechanism).

  The same function object is returned for equal mechanisms, so
  :func:`audit_privacy` compiles once per mechanism.
  """
  if not isinstance(mechanism, BsvsMechanism):
    raise ValueError(f"Expected mechanism to be a BsvsMechanism; got {type(mechanism).__name__}.")

  def randomize(key, x):
    buckets, labels = x
    return mechanism.randomize(key, buckets, labels)

  return randomize


def replicate_estimates(key: jax.Array, mechanism: BsvsMechanism, clients: Any, num_runs: int, *,
                        chunk_size: int = 4096) -> np.ndarray:
  """``[num_runs, s, |Y|]`` float64 estimates from independent runs (run i uses ``fold_in(key, i)``).

  Feed them to :func:`check_unbiased` / :func:`check_variance` with the true
  counts and ``mechanism.entry_variance(counts, n)``.
  """
  key = _validate.prng_key("key", key)
  from jaxdistill.simulation import simulate  # the runner imports nothing from audit

  runs = _validate.integer("num_runs", num_runs, minimum=2)
  return np.stack([simulate(jax.random.fold_in(key, i), mechanism, clients,
                            chunk_size=chunk_size).estimate for i in range(runs)])
