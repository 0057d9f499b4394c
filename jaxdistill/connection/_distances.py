"""Blockwise squared-L2 nearest-neighbour kernels (jitted, streamed, deterministic ties).

Distances use the expansion

.. math::

   \\|x - q\\|_2^2 = \\|x\\|_2^2 - 2\\,x^\\top q + \\|q\\|_2^2,

so each block is one matrix product. Rows are streamed in blocks under
``lax.map`` (or ``lax.scan`` when a running top-k is carried), so memory is
``O(block_size * s)`` whatever the number of rows: 60k records x 5k queries x
d never materialise.

Ties: ``lax.top_k`` and ``argmin`` return the lower index first among equal
values, and the two-level selection of ``nearest_columns`` (``_smallest``)
keeps that order, so every kernel here breaks exact ties by the lower column
index (or, for the running top-k over record blocks, by the lower row index).
The results are bitwise independent of ``block_size`` whenever the products
are exact in float32 (e.g. small-integer features); otherwise a block size
may change float32 rounding, and with it the order of candidates whose
distances agree to float32 precision.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

_HIGHEST = lax.Precision.HIGHEST


def _row_blocks(x: jax.Array, block_size: int) -> tuple[jax.Array, int]:
  """Pads ``x [n, d]`` with zero rows to ``[num_blocks, block_size, d]``."""
  n, d = x.shape
  num_blocks = -(-n // block_size)
  pad = num_blocks * block_size - n
  return jnp.pad(x, ((0, pad), (0, 0))).reshape(num_blocks, block_size, d), num_blocks


def _canonical(dist: jax.Array) -> jax.Array:
  """Clamps rounding below zero (and -0.0) to +0.0, so equal distances compare equal."""
  return jnp.where(dist > 0, dist, 0.0)


def squared_distances(x: jax.Array, q: jax.Array, x2: jax.Array | None = None) -> jax.Array:
  """Dense ``||x_i - q_j||^2``: float32 ``[n, s]`` (small ``s``, or small inputs).

  ``x2``: the row norms ``||x_i||^2`` when the caller already has them.
  """
  if x2 is None:
    x2 = jnp.sum(x * x, axis=1)
  q2 = jnp.sum(q * q, axis=1)
  return _canonical(x2[:, None] + q2[None, :] - 2.0 * jnp.matmul(x, q.T, precision=_HIGHEST))


# Columns per tile in `_smallest`. 64 was fastest on 2 CPU cores for s = 5,000 (d = 64 and 784, k = 1 and 10);
# see benchmarks/README.md, "Reverse k-NN connection".
_TILE = 64


def _smallest(values: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The ``k`` smallest entries of each row of ``values [b, s]``, ordered by (value, column).

  Returns ``(-value float32 [b, k], column int32 [b, k])``, as
  ``lax.top_k(-values, k)`` does (equal values: lower column first). When
  ``s >= 4 k _TILE`` it selects in two levels: the columns are cut into tiles of ``_TILE`` (the last one may
  be shorter); the ``k`` tiles with the smallest minima (ties: lower tile)
  are kept, in column order, and ``top_k`` runs over their ``k * _TILE``
  entries only. Every row's k smallest entries lie in those tiles: if an
  entry e of tile T were among them but T were not kept, each of the k kept
  tiles would hold an entry before e in (value, column) order (its minimum
  is below e's value, or equal with a lower tile, hence a lower column), so e
  would not be among the k smallest. For ``k = 1`` both levels are
  ``argmin`` (first occurrence). On XLA:CPU a flat ``top_k`` over 5,000
  columns costs about three times the distance matmul at d = 64; the two
  levels cost a fraction of it. ``values`` is read in place (no padded
  copy), so the distances, and the matmul that makes them, are the same as
  for the flat ``top_k``.
  """
  b, s = values.shape
  if s < 4 * k * _TILE:
    neg, idx = lax.top_k(-values, k)
    return neg, idx.astype(jnp.int32)
  full = s // _TILE
  minima = jnp.min(values[:, :full * _TILE].reshape(b, full, _TILE), axis=2)        # [b, full]
  if s % _TILE:
    minima = jnp.concatenate([minima, jnp.min(values[:, full * _TILE:], axis=1, keepdims=True)], axis=1)
  offsets = jnp.arange(_TILE, dtype=jnp.int32)
  if k == 1:
    tile = jnp.argmin(minima, axis=1).astype(jnp.int32)           # first (lowest) tile among equal minima
    cols = tile[:, None] * _TILE + offsets                          # [b, _TILE]
  else:
    _, kept = lax.top_k(-minima, k)
    kept = jnp.sort(kept.astype(jnp.int32), axis=1)                # column order, so ties go to the lower column
    cols = (kept[:, :, None] * _TILE + offsets).reshape(b, k * _TILE)
  cand = jnp.where(cols < s, jnp.take_along_axis(values, jnp.minimum(cols, s - 1), axis=1), jnp.inf)
  if k == 1:
    pos = jnp.argmin(cand, axis=1)                                  # first column among equal values
    return -jnp.take_along_axis(minima, tile[:, None], axis=1), jnp.take_along_axis(cols, pos[:, None], axis=1)
  neg, pos = lax.top_k(-cand, k)
  return neg, jnp.take_along_axis(cols, pos, axis=1)


@functools.partial(jax.jit, static_argnames=("k", "block_size"))
def nearest_columns(x: jax.Array, q: jax.Array, k: int, block_size: int) -> tuple[jax.Array, jax.Array]:
  """For every row of ``x``, its ``k`` nearest rows of ``q`` (nearest first).

  Args:
    x: float32 ``[n, d]`` rows (private records, or public samples).
    q: float32 ``[s, d]`` columns (queries, or centres), ``k <= s``.
    k: neighbours per row (static).
    block_size: rows per streamed block (static).

  Returns:
    ``(indices int32 [n, k], squared distances float32 [n, k])``, sorted by
    distance, exact ties by the lower column index.
  """
  n = x.shape[0]
  blocks, _ = _row_blocks(x, block_size)
  q2 = jnp.sum(q * q, axis=1)
  q_m2 = -2.0 * q  # exact scaling: x @ (-2q)^T == -2 (x @ q^T) bitwise

  def one_block(xb):
    # The ranking needs ||q||^2 - 2 x.q only; ||x||^2 is added for the reported distance.
    partial = q2[None, :] + jnp.matmul(xb, q_m2.T, precision=_HIGHEST)
    neg, idx = _smallest(partial, k)
    dist = _canonical(jnp.sum(xb * xb, axis=1)[:, None] - neg)
    return idx, dist

  idx, dist = lax.map(one_block, blocks)
  return idx.reshape(-1, k)[:n], dist.reshape(-1, k)[:n]


@functools.partial(jax.jit, static_argnames=("k", "block_size"))
def nearest_rows(x: jax.Array, q: jax.Array, k: int, block_size: int) -> tuple[jax.Array, jax.Array]:
  """For every row of ``q``, its ``k`` nearest rows of ``x``, streaming over blocks of ``x``.

  A running top-k per query is carried through ``lax.scan``: block b's
  candidates are appended after the carried ones, so among equal distances
  the lower row index (earlier block, or earlier position) wins.

  Args:
    x: float32 ``[n, d]`` rows (private records), ``k <= n``.
    q: float32 ``[s, d]`` queries.
    k: neighbours per query (static).
    block_size: rows of ``x`` per block (static).

  Returns:
    ``(indices int32 [s, k], squared distances float32 [s, k])``.
  """
  n = x.shape[0]
  s = q.shape[0]
  blocks, num_blocks = _row_blocks(x, block_size)
  q2 = jnp.sum(q * q, axis=1)
  q_m2 = -2.0 * q

  def step(carry, inputs):
    best_d, best_i = carry
    b, xb = inputs
    rows = b * block_size + jnp.arange(block_size, dtype=jnp.int32)
    # Ranking over records for a fixed query needs ||x||^2 - 2 x.q.
    partial = jnp.sum(xb * xb, axis=1)[None, :] + jnp.matmul(q_m2, xb.T, precision=_HIGHEST)
    partial = jnp.where(rows[None, :] < n, partial, jnp.inf)  # padding rows never win
    cand_d = jnp.concatenate([best_d, partial], axis=1)
    cand_i = jnp.concatenate([best_i, jnp.broadcast_to(rows, (s, block_size))], axis=1)
    neg, pos = lax.top_k(-cand_d, k)
    return (-neg, jnp.take_along_axis(cand_i, pos, axis=1)), None

  init = (jnp.full((s, k), jnp.inf, jnp.float32), jnp.full((s, k), -1, jnp.int32))
  (best_d, best_i), _ = lax.scan(step, init, (jnp.arange(num_blocks, dtype=jnp.int32), blocks))
  return best_i, _canonical(best_d + q2[:, None])
