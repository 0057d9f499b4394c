"""One client-batch runner for every BSVS mechanism, streaming clients in chunks.

Client i's randomness is ``fold_in(clients_key, i)`` and the server sums
integer statistics, so the result depends only on (key, clients, mechanism):
not on the chunk size, the order of chunks, or (with sharding) the number of
devices. Clients come either from a materialised :class:`BsvsInput` or from
a generator with ``client(index)`` (e.g. :class:`SyntheticWorkload`), in
which case memory is independent of n.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.mechanisms import BsvsInput, BsvsMechanism

__all__ = ["SimulationResult", "simulate", "client_statistics"]


@dataclasses.dataclass(frozen=True)
class SimulationResult:
  """Output of :func:`simulate`.

  Attributes:
    estimate: float64 ``[s, |Y|]`` estimate of A.
    stats: the summed integer statistics (host numpy pytree).
    num_clients: n.
    wall_seconds: wall time of the run (compilation included).
  """

  estimate: np.ndarray
  stats: Any
  num_clients: int
  wall_seconds: float


def _from_arrays(args: BsvsInput, idx: jax.Array) -> tuple[jax.Array, jax.Array]:
  return args.buckets[idx], args.labels[idx]


def _from_generator(args: Any, idx: jax.Array) -> tuple[jax.Array, jax.Array]:
  return args.client(idx)


def _source(clients: Any) -> tuple[int, Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]], Any]:
  """``(n, source_fn, source_args)``; module-level source_fns keep jit caches warm."""
  if isinstance(clients, BsvsInput):
    return clients.num_clients, _from_arrays, clients
  if hasattr(clients, "client") and hasattr(clients, "num_clients"):
    # Generators are pytrees (their key is data), so they travel as arguments.
    return int(clients.num_clients), _from_generator, clients
  raise ValueError(f"Expected clients to be a BsvsInput or a workload with client(index); got {type(clients)}.")


@functools.partial(jax.jit, static_argnames=("mechanism", "source_fn", "num_chunks", "chunk_size"))
def _run(clients_key, source_args, num_clients, mechanism, source_fn, num_chunks, chunk_size):

  def one(i, valid):
    buckets, labels = source_fn(source_args, i)
    stats = mechanism.analyze(mechanism.randomize(jax.random.fold_in(clients_key, i), buckets, labels))
    return jax.tree.map(lambda x: jnp.where(valid, x, jnp.zeros_like(x)), stats)

  def body(total, chunk):
    idx = chunk * chunk_size + jnp.arange(chunk_size, dtype=jnp.uint32)
    valid = idx < num_clients
    stats = jax.vmap(one)(jnp.where(valid, idx, 0), valid)
    return jax.tree.map(lambda t, s: t + s.sum(axis=0, dtype=t.dtype), total, stats), None

  shapes = jax.eval_shape(lambda: one(jnp.uint32(0), True))
  zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  total, _ = jax.lax.scan(body, zero, jnp.arange(num_chunks, dtype=jnp.uint32))
  return total


def client_statistics(key: jax.Array, mechanism: BsvsMechanism, clients: Any, *,
                      chunk_size: int = 4096) -> Any:
  """Summed integer statistics of all clients' messages (no final estimate)."""
  if not isinstance(mechanism, BsvsMechanism):
    raise ValueError(f"Expected a BsvsMechanism; got {type(mechanism)}.")
  n, source_fn, args = _source(clients)
  chunk_size = _validate.integer("chunk_size", chunk_size, minimum=1)
  chunk = min(chunk_size, n)
  num_chunks = -(-n // chunk)
  return _run(key, args, jnp.uint32(n), mechanism, source_fn, num_chunks, chunk)


def simulate(key: jax.Array, mechanism: BsvsMechanism, clients: Any, *,
             chunk_size: int = 4096) -> SimulationResult:
  """Runs ``mechanism`` over all clients and returns the server's estimate.

  Args:
    key: PRNG key; split into a clients key (client i uses
      ``fold_in(clients_key, i)``) and a server key (central noise).
    mechanism: any :class:`BsvsMechanism`.
    clients: a :class:`BsvsInput` or a generator such as
      :class:`SyntheticWorkload`.
    chunk_size: clients per vmapped chunk; memory is O(chunk_size * d).

  Returns:
    A :class:`SimulationResult`. The same key gives bitwise-identical
    statistics and estimate for any ``chunk_size``.
  """
  start = time.perf_counter()
  clients_key, server_key = jax.random.split(key)
  n, _, _ = _source(clients)
  stats = client_statistics(clients_key, mechanism, clients, chunk_size=chunk_size)
  stats = jax.tree.map(np.asarray, jax.block_until_ready(stats))
  est = mechanism.estimate(server_key, stats, n)
  return SimulationResult(np.asarray(est, np.float64), stats, n, time.perf_counter() - start)
