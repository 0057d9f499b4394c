"""Validation of feature matrices at the public boundary of the connection rules."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate


def as_features(name: str, value: Any, *, dim: int | None = None, dim_name: str = "",
                min_rows: int = 1, private: bool = False) -> jax.Array:
  """Returns ``value`` as a finite float32 ``[n, d]`` device array, or raises naming ``name``.

  Args:
    name: the parameter name used in error messages.
    value: array-like ``[n, d]`` of real numbers: any floating dtype
      (bfloat16 included), integers or booleans.
    dim: the required number of columns (``None`` = any).
    dim_name: the parameter whose width ``dim`` came from (for the message).
    min_rows: the least acceptable number of rows.
    private: the rows are private records: a refusal states no value computed from them (the largest
      squared norm or entry printed a private record's statistic, covered by no DP statement).

  Raises:
    ValueError: not 2-D, wrong width, too few rows, not real, NaN or inf, rows so long that
      float32 squared distances would overflow, or entries all so small (below
      :data:`MIN_LARGEST_ENTRY` in absolute value, not all zero) that they underflow.
  """
  if isinstance(value, jax.Array):
    arr = value
  else:
    try:
      arr = np.asarray(value)
    except Exception as err:  # pylint: disable=broad-except
      raise ValueError(f"Expected {name} to be an array of real numbers; "
                       f"got {type(value).__name__}.") from err
  # Any floating dtype, bfloat16 and the other ml_dtypes included (NumPy files those under kind "V").
  if np.dtype(arr.dtype).kind not in "fiub" and not jnp.issubdtype(arr.dtype, jnp.floating):
    raise ValueError(f"Expected {name} to hold real numbers; got dtype {arr.dtype}.")
  if arr.ndim != 2:
    raise ValueError(f"Expected {name} of shape [n, d]; got shape {tuple(arr.shape)}.")
  if arr.shape[0] < min_rows:
    raise ValueError(f"Expected {name} to have at least {min_rows} rows; got {arr.shape[0]}.")
  if arr.shape[1] < 1:
    raise ValueError(f"Expected {name} to have at least one column; got shape {tuple(arr.shape)}.")
  if dim is not None and arr.shape[1] != dim:
    raise ValueError(f"Expected {name} to have d={dim} columns like {dim_name}; got {arr.shape[1]}.")
  # Not jnp.asarray(arr, jnp.float32): it would share a 64-byte-aligned float32 host array with the caller.
  out = _validate.owned_device_array(arr, np.float32)
  # One reduction checks both: a NaN or inf entry makes its row's squared norm non-finite too.
  largest, top = np.asarray(_norm_stats(out), np.float64).tolist()  # one device-to-host copy
  if not largest <= _MAX_SQUARED_NORM:
    if not bool(jnp.isfinite(out).all()):
      bad = "NaN" if bool(jnp.isnan(out).any()) else "inf (or a value too large for float32)"
      raise ValueError(f"Expected finite {name}; found {bad}.")
    found = "found a longer row" if private else f"found {largest:.3g}"
    raise ValueError(f"Expected {name} rows with squared norms <= {_MAX_SQUARED_NORM:.3g}, so that float32 squared "
                     f"distances do not overflow; {found}. Rescale the features.")
  if 0 < top < MIN_LARGEST_ENTRY:
    found = "" if private else f"; the largest is {top:.3g}"
    raise ValueError(f"Expected {name} with some entry of absolute value >= {MIN_LARGEST_ENTRY:g} (or all zero), "
                     f"so that float32 squared distances do not underflow{found}. Rescale the "
                     f"features (e.g. divide by their largest absolute value).")
  return out


@jax.jit
def _norm_stats(x: jax.Array) -> jax.Array:
  """``[max_i ||x_i||^2, max |x_ij|]`` in one fused pass (NaN when any entry is NaN, inf when any is infinite)."""
  return jnp.stack([jnp.max(jnp.sum(jnp.square(x), axis=1)), jnp.max(jnp.abs(x))])


#: Features whose entries are all below this in absolute value (and not all zero) are refused: their squared
#: distances come near float32's smallest normal number (1.2e-38), below which XLA:CPU flushes them to zero.
#: Features scaled by 1e-21 made every distance 0, so k-means put all points into one cluster, with no warning.
MIN_LARGEST_ENTRY = 1e-15


#: float32's largest value / 4: ||x||^2 + ||q||^2 + 2|x.q| stays finite when both norms are below it.
_MAX_SQUARED_NORM = float(np.finfo(np.float32).max) / 4


#: ||mean||^2 / mean ||x - mean||^2 of public features above which :func:`warn_if_off_centre` warns. Measured
#: (20,000 Gaussian records, 200 Gaussian queries, d = 2 and 64, both shifted alike): at a ratio of 10^3, 0.2% of
#: the records' float32 nearest queries differ from the float64 ones; at 10^4, 2-4%; at 10^6, 65-77%.
OFF_CENTRE_RATIO = 1e3


#: Most public rows whose nearest other row :func:`warn_if_off_centre` recomputes in float64 (evenly spaced, so
#: the sample is deterministic), and most rows it searches among (all of them up to this many, else evenly spaced).
PRECISION_SAMPLE = 512
PRECISION_CANDIDATES = 8192
#: A sampled row counts as lost when its float32 nearest other row is farther than its float64 one by more than
#: this fraction of the sample's typical spacing: the 90th percentile of the sampled rows' float64 nearest-neighbour
#: distances (a high quantile, so that clumps of near-copies, e.g. a saturated softmax, do not set it). Smaller
#: excesses are near-ties (equidistant neighbours whose coordinates float32 rounded) or neighbours far closer than
#: the set's spacing; SCAN's probabilities lost 1-2% of their neighbours by excesses under 2 * 10^-7, against
#: spacings of 10^-3, which moves no record to a meaningfully farther query.
PRECISION_MARGIN = 1e-3
#: Fraction of lost sampled rows above which :func:`warn_if_off_centre` warns (3 or more of 512). A set losing
#: 0.1% of its neighbours crosses it in 1.5% of samples (binomial). Measured (512 of 1,000-2,000 rows): centred
#: Gaussian data (d = 2 to 784), exact duplicates, SCAN probabilities (mean top probability 0.77), the library's
#: pixels and HOG features: 0; Gaussian data (d = 8) shifted to ratio 961: 0; to ratio 10^4: 25%; to 9 * 10^4:
#: 49%; two groups at +-30 / +-100 / +-300 / +-1000 / +-3000 in every coordinate (d = 8, unit spread, overall mean
#: near 0: the ratio test is quiet): 0 / 24% / 47% / 75% / 100% (rows or their half-way points; the rows alone:
#: 0.4% / 6% / 43% / 96% from +-100). At +-3000, 90.6% of 5,000 such records lost their nearest of 200 queries.
#: Pairs of queries 1 apart at +-3000 (each query's nearest other query never in doubt; 45% of the records between
#: them misplaced): the rows alone 0, with their half-way points 50%. Embedded MNIST and 5,000 Fashion-MNIST images
#: as pixels, HOG or PCA-50, and a softmax of mean top probability 0.84: 0. A softmax sharpened until 90% of the
#: samples sit within 10^-6 of another (float32 resolves about 10^-7 at unit norm) lost 2.7%, and warns.
PRECISION_LOSS = 0.005


def float32_neighbour_loss(x: jax.Array) -> tuple[float, int]:
  """The fraction of sampled rows of ``x`` for which float32 picks a meaningfully farther nearest row than float64.

  For up to :data:`PRECISION_SAMPLE` evenly spaced rows ``x_i`` (every row
  when there are fewer), the nearest other row ``j`` (``j != i``) among up to
  :data:`PRECISION_CANDIDATES` rows of ``x`` is chosen twice: by the float32
  ranking value the kernels use, ``||x_j||^2 - 2 x_i.x_j`` (one float32
  matmul, on the host), and by float64 distances of the centred rows. Both
  choices are then measured in float64 as ``d = sum((x_i - x_j)^2)``, and row
  i counts as lost when ``d(float32 choice) - d(float64 choice)`` exceeds
  :data:`PRECISION_MARGIN` times the 90th percentile over the sample of
  ``d(float64 choice)``. The same is done for the point ``p_i`` a fraction
  ``1/2 - 2 PRECISION_MARGIN`` of the way from ``x_i`` to its float64 nearest
  other row (its nearest row among all of them, ``x_i`` itself included), and
  row i also counts as lost when ``p_i`` is: rows in tight, well-separated
  pairs far from the origin never doubt their own nearest row, while the
  records between a pair are placed by the rounding. As ``p_i`` sits where
  records are hardest to place, the fraction is an upper estimate of the
  records lost. An exact duplicate of ``x_i`` is at distance 0
  whichever copy is chosen, so duplicates never count. (The float64 choice
  is itself exact only down to about 10^-13 of the centred rows' squared
  norms.) Costs two
  ``[sample, candidates, d]`` products in float32 and two in float64 (about
  0.04 s for 512 of 1,000 rows and 0.23 s for 512 of 5,000 at d = 784 on 2
  CPU cores, measured 2026-12-07). Above
  :data:`PRECISION_CANDIDATES` rows the search runs among an evenly spaced
  subset, whose neighbours are farther apart, so the loss may be
  underestimated there.

  Returns ``(fraction lost, rows sampled)``; ``(0.0, 0)`` for fewer than 3 rows (a row's only other row is its
  nearest whatever the precision).
  """
  m = x.shape[0]
  if m < 3:
    return 0.0, 0
  cand = np.unique(np.linspace(0, m - 1, min(m, PRECISION_CANDIDATES)).round().astype(np.int64))
  pos = np.unique(np.linspace(0, cand.shape[0] - 1, min(cand.shape[0], PRECISION_SAMPLE)).round().astype(np.int64))
  xc = np.asarray(x if cand.shape[0] == m else x[jnp.asarray(cand)], np.float32)  # gathered on the device
  # The kernels' ranking value for "record" x_i against "query" x_j, in float32 (host BLAS: no compilation).
  sq32, minus2 = np.sum(xc * xc, axis=1)[None, :], (np.float32(-2.0) * xc).T
  rank32 = sq32 + xc[pos] @ minus2
  x64 = np.asarray(xc, np.float64)
  mean64 = x64.mean(axis=0)
  c64 = x64 - mean64
  sq64 = np.sum(c64 * c64, axis=1)[None, :]
  rank64 = sq64 - 2.0 * (c64[pos] @ c64.T)
  rows = np.arange(pos.shape[0])
  rank32[rows, pos] = np.inf  # the row itself is not its own neighbour
  rank64[rows, pos] = np.inf
  own = x64[pos]
  near = x64[np.argmin(rank64, axis=1)]
  d32 = np.sum((own - x64[np.argmin(rank32, axis=1)]) ** 2, axis=1)
  d64 = np.sum((own - near) ** 2, axis=1)
  margin = PRECISION_MARGIN * np.quantile(d64, 0.9)
  lost = d32 - d64 > margin
  # A point 2 PRECISION_MARGIN short of half way from the row to its nearest other row: its float64 nearest row is
  # the row itself, ahead by 4 PRECISION_MARGIN of their squared distance, so float32 misplaces it once rounding
  # reaches the margin. Rows in well-separated tight pairs far from the origin never doubt their own nearest row
  # while the records between a pair are placed by the rounding (45% of them at +-3000, d = 8): only such points
  # show it. They sit where records are hardest to place, so the fraction is an upper estimate of records lost.
  probe = (own + (0.5 - 2 * PRECISION_MARGIN) * (near - own)).astype(np.float32)
  prank32 = sq32 + probe @ minus2
  p64 = np.asarray(probe, np.float64)  # the probe as a float32 record holds it
  prank64 = sq64 - 2.0 * ((p64 - mean64) @ c64.T)
  pd32 = np.sum((p64 - x64[np.argmin(prank32, axis=1)]) ** 2, axis=1)
  pd64 = np.sum((p64 - x64[np.argmin(prank64, axis=1)]) ** 2, axis=1)
  lost |= pd32 - pd64 > margin
  return float(np.mean(lost)), int(pos.shape[0])


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _caller_stacklevel() -> int:
  """``warnings.warn``'s stacklevel, from the function calling this, of the first frame outside jaxdistill.

  A fixed stacklevel pointed into the library when a public function reached the check through another one
  (``reverse_knn_connection``, ``connect``), and the default filter then showed the warning once per process.
  """
  frame, level = sys._getframe(1), 1  # pylint: disable=protected-access
  while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
    frame, level = frame.f_back, level + 1
  return level


def warn_if_off_centre(name: str, x: jax.Array) -> None:
  """Warns (RuntimeWarning) when float32 distances on the public ``x`` lose nearest neighbours.

  The squared distances ``||x||^2 - 2 x.q + ||q||^2`` are rounded in
  proportion to ``||x||^2``, not to the distance, so features far from the
  origin compared with their spread change nearest neighbours. Two checks,
  one warning at most:

  * ``||mean||^2 > OFF_CENTRE_RATIO * mean ||x - mean||^2`` (the whole set
    sits off centre: subtracting D_pub's mean fixes it);
  * otherwise, a direct measurement (:func:`float32_neighbour_loss`): for more
    than :data:`PRECISION_LOSS` (0.5%) of up to 512 sampled rows, float32
    picks a nearest row (of the row, or of a point just short of half way to
    its nearest other row) that float64 finds farther, by more than
    :data:`PRECISION_MARGIN` of the typical neighbour distance. It catches
    what the ratio misses, e.g. tight groups far from the origin on opposite
    sides (mean near 0), also of two queries each.

  Call it on public features only (D_pub, queries): the warning must reveal
  nothing about private records. It points at the first line outside
  jaxdistill that led here.
  """
  if x.shape[0] < 2:
    return
  mean = jnp.mean(x, axis=0)
  offset = float(jnp.sum(jnp.square(mean)))
  spread = float(jnp.mean(jnp.sum(jnp.square(x - mean), axis=1)))
  if spread > 0 and offset > OFF_CENTRE_RATIO * spread:
    warnings.warn(
        f"{name} sit far from the origin compared with their spread (||mean||^2 / mean ||x - mean||^2 = "
        f"{offset / spread:.3g} > {OFF_CENTRE_RATIO:g}): float32 distances lose precision in proportion to "
        f"||x||^2, so nearest neighbours may change. Subtract D_pub's mean from every feature set first "
        f"(public, so free).", RuntimeWarning, stacklevel=_caller_stacklevel())
    return
  lost, sampled = float32_neighbour_loss(x)
  if lost > PRECISION_LOSS:
    warnings.warn(
        f"{name} lose nearest neighbours to float32 rounding: for {lost:.1%} of {sampled} sampled rows "
        f"(> {PRECISION_LOSS:.1%}) the float32 nearest row (of the row, or of a point just short of half way to "
        f"its nearest other row) is farther in float64, by more than {PRECISION_MARGIN:g} of the typical "
        f"neighbour distance. Distances between neighbours are tiny next to "
        f"||x||^2 (e.g. tight groups far from the origin, which the overall mean does not show): centre or "
        f"rescale the features so that they are not, e.g. PCA-whiten them on D_pub (public, so free).",
        RuntimeWarning, stacklevel=_caller_stacklevel())


#: Largest streaming block (rows per block): every block is allocated in full (padded), and a block's row
#: indices are int32 on the device (1e30 failed inside JAX with a TypeError).
MAX_BLOCK_SIZE = 2**24


def block_size(value: Any) -> int:
  """Validates a streaming block size (rows per block): an integer in ``[1, MAX_BLOCK_SIZE]`` (2**24)."""
  return _validate.integer("block_size", value, minimum=1, maximum=MAX_BLOCK_SIZE)
