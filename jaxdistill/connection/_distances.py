"""Blockwise squared-L2 nearest-neighbour kernels (jitted, streamed, deterministic ties).

Distances use the expansion

.. math::

   \\|x - q\\|_2^2 = \\|x\\|_2^2 - 2\\,x^\\top q + \\|q\\|_2^2,

so each block is one matrix product. Rows are streamed in blocks under
``lax.map`` (or ``lax.scan`` when a running top-k is carried), so memory is
``O(block_size * s)`` whatever the number of rows: 60k records x 5k queries x
d never materialise.

Ties: ``lax.top_k`` returns the lower index first among equal values, and
the selection of ``nearest_columns`` (``_smallest``: rounds of minima, in two
levels for many columns) keeps that order, so every kernel here breaks exact
ties by the lower column index (or, for the running top-k over record
blocks, by the lower row index).
The results are bitwise independent of ``block_size`` whenever the products
are exact in float32 (e.g. small-integer features); otherwise a block size
may change float32 rounding, and with it the order of candidates whose
distances agree to float32 precision.

Block width: every block is ``block_size`` rows wide (the last one padded
with zero rows), and XLA rounds a row's products the same in every block of
one width, wherever the row sits and whatever the other rows hold (measured
on XLA:CPU, widths 37 to 8192). The width itself does change the rounding
(width 1 vs 2-100 vs 127-128 gave different float32 values for the same
row), so a caller whose rows must not depend on each other (the private
records of ``reverse_knn`` and ``knn_labeling``) passes its ``block_size``
unchanged, never ``min(block_size, n)``: one added or removed record would
then re-round every other record.

Precision: the expansion's rounding error scales with ``||x||^2 + ||q||^2``,
not with the distance, so it is not translation invariant. Features far from
the origin compared with their spread lose their distances: 4 well-separated
clusters of 8-dimensional points (centres a few units apart), shifted by
10^4 in every coordinate, left 75% of the points at a k-means centre other
than their nearest.
The library's representations are centred (PCA, the student embedding:
a PCA of its penultimate layer on D_pub), unit-norm (contrastive) or
bounded (pixels, HOG, SCAN); centre other features,
e.g. by subtracting D_pub's mean (public, so free), before the connection
rules or k-means. The public entry points warn when the public features
(D_pub, or the queries) sit that far off centre, or when a sample of them
loses its float32 nearest neighbours although the whole set is centred (tight
groups far from the origin on opposite sides; ``_common.warn_if_off_centre``).
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


# Columns per tile in `_smallest`, and the largest k selected by rounds of minima (larger k: `lax.top_k`).
# 32 was fastest on 2 CPU cores for s = 5,000 (d = 64 and 784, k = 1 and 10); see benchmarks/README.md,
# "Reverse k-NN connection".
_TILE = 32
_MAX_ROUNDS = 16
_FMAX = float(jnp.finfo(jnp.float32).max)


def _rounds(values: jax.Array, cols: jax.Array, k: int, none: int) -> tuple[jax.Array, jax.Array]:
  """The ``k`` smallest of each column of ``values [m, b]`` by (value, ``cols``), in that order.

  ``cols`` (int32, broadcastable to ``values``) names each entry; entries are
  distinct per column of ``values``, all ``< none``, and ``values`` holds no
  ``+inf`` in its ``k`` smallest. Each round takes the column minimum, the
  lowest name holding it, and masks that entry with ``+inf``. Every step is
  an elementwise operation or a reduction over the leading axis, so XLA
  vectorises it across the ``b`` columns; on XLA:CPU this is several times
  faster than ``lax.top_k`` along a short minor axis.

  Returns ``(values float32 [k, b], names int32 [k, b])``.
  """
  out_v, out_c = [], []
  for _ in range(k):
    m = jnp.min(values, axis=0)
    c = jnp.min(jnp.where(values == m, cols, none), axis=0)
    out_v.append(m)
    out_c.append(c)
    values = jnp.where(cols == c, jnp.inf, values)
  return jnp.stack(out_v), jnp.stack(out_c)


def _smallest(values: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The ``k`` smallest entries of each column of ``values [s, b]``, ordered by (value, row).

  Returns ``(value float32 [b, k], row int32 [b, k])``, the order of a stable
  sort (equal values: lower row first). ``values`` must be finite
  (``nearest_columns`` clamps overflow to the largest float32).

  For ``k <= _MAX_ROUNDS`` the selection is ``k`` rounds of minima over the
  leading axis (``_rounds``). When ``s >= 4 k _TILE`` it works in two levels:
  the rows are cut into tiles of ``_TILE`` (the last one padded with ``+inf``);
  the ``k`` tiles with the smallest minima (ties: lower tile) are kept, and
  the rounds run over their ``k * _TILE`` entries only. Every column's k
  smallest entries lie in those tiles: if an entry e of tile T were among
  them but T were not kept, each of the k kept tiles would hold an entry
  before e in (value, row) order (its minimum is below e's value, or equal
  with a lower tile, hence a lower row), so e would not be among the k
  smallest. Larger ``k`` uses ``lax.top_k`` on the transpose.
  """
  s, b = values.shape
  if k > _MAX_ROUNDS:
    neg, idx = lax.top_k(-values.T, k)
    return -neg, idx.astype(jnp.int32)
  if s < 4 * k * _TILE:
    v, r = _rounds(values, jnp.arange(s, dtype=jnp.int32)[:, None], k, s)
    return v.T, r.T
  num_tiles = -(-s // _TILE)
  tiles = jnp.pad(values, ((0, num_tiles * _TILE - s), (0, 0)), constant_values=jnp.inf)
  tiles = tiles.reshape(num_tiles, _TILE, b)
  _, kept = _rounds(jnp.min(tiles, axis=1), jnp.arange(num_tiles, dtype=jnp.int32)[:, None], k, num_tiles)
  cand = jnp.take_along_axis(tiles, kept[:, None, :], axis=0).reshape(k * _TILE, b)     # the kept tiles
  names = (kept[:, None, :] * _TILE + jnp.arange(_TILE, dtype=jnp.int32)[None, :, None]).reshape(k * _TILE, b)
  v, r = _rounds(cand, names, k, num_tiles * _TILE)
  return v.T, r.T


@functools.partial(jax.jit, static_argnames=("k", "block_size"))
def nearest_columns(x: jax.Array, q: jax.Array, k: int, block_size: int) -> tuple[jax.Array, jax.Array]:
  """For every row of ``x``, its ``k`` nearest rows of ``q`` (nearest first).

  Args:
    x: float32 ``[n, d]`` rows (private records, or public samples).
    q: float32 ``[s, d]`` columns (queries, or centres), ``k <= s``.
    k: neighbours per row (static).
    block_size: rows per streamed block (static); the last block is padded
      to this width, so a row's values do not depend on ``n``.

  Returns:
    ``(indices int32 [n, k], squared distances float32 [n, k])``, sorted by
    distance, exact ties by the lower column index.
  """
  n = x.shape[0]
  blocks, _ = _row_blocks(x, block_size)
  q2 = jnp.sum(q * q, axis=1)
  q_m2 = -2.0 * q  # exact scaling: (-2q) @ x^T == -2 (q @ x^T) bitwise

  def one_block(xb):
    # The ranking needs ||q||^2 - 2 x.q only; ||x||^2 is added for the reported distance. Queries on the
    # leading axis, so the selection vectorises across the block's rows. Clamping to the largest float32
    # keeps an overflowed product (+inf or nan) rankable.
    partial = q2[:, None] + jnp.matmul(q_m2, xb.T, precision=_HIGHEST)              # [s, block]
    value, idx = _smallest(jnp.where(partial < _FMAX, partial, _FMAX), k)
    dist = _canonical(jnp.sum(xb * xb, axis=1)[:, None] + value)
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
    block_size: rows of ``x`` per block (static); the last block is padded
      to this width, so a record's distances do not depend on ``n``.

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
    neg, pos = lax.top_k(-cand_d, k)
    # Candidate pos is carried entry pos (pos < k) or row b * block_size + pos - k of this block. Mapped here
    # rather than by gathering from an [s, k + block_size] index array, which XLA constant-folds (seconds of
    # compilation at s = 5,000, block 8192) when there is a single block.
    carried = jnp.take_along_axis(best_i, jnp.minimum(pos, k - 1), axis=1)
    return (-neg, jnp.where(pos < k, carried, b * block_size + pos - k)), None

  init = (jnp.full((s, k), jnp.inf, jnp.float32), jnp.full((s, k), -1, jnp.int32))
  (best_d, best_i), _ = lax.scan(step, init, (jnp.arange(num_blocks, dtype=jnp.int32), blocks))
  return best_i, _canonical(best_d + q2[:, None])
