"""Validation of feature matrices at the public boundary of the connection rules."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate


def as_features(name: str, value: Any, *, dim: int | None = None, dim_name: str = "",
                min_rows: int = 1) -> jax.Array:
  """Returns ``value`` as a finite float32 ``[n, d]`` device array, or raises naming ``name``.

  Args:
    name: the parameter name used in error messages.
    value: array-like ``[n, d]`` of real numbers.
    dim: the required number of columns (``None`` = any).
    dim_name: the parameter whose width ``dim`` came from (for the message).
    min_rows: the least acceptable number of rows.

  Raises:
    ValueError: not 2-D, wrong width, too few rows, not real, NaN or inf, or rows so long that
      float32 squared distances would overflow.
  """
  if isinstance(value, jax.Array):
    arr = value
    kind = np.dtype(arr.dtype).kind
  else:
    try:
      arr = np.asarray(value)
    except Exception as err:  # pylint: disable=broad-except
      raise ValueError(f"Expected {name} to be an array of real numbers; "
                       f"got {type(value).__name__}.") from err
    kind = arr.dtype.kind
  if kind not in "fiub":
    raise ValueError(f"Expected {name} to hold real numbers; got dtype {arr.dtype}.")
  if arr.ndim != 2:
    raise ValueError(f"Expected {name} of shape [n, d]; got shape {tuple(arr.shape)}.")
  if arr.shape[0] < min_rows:
    raise ValueError(f"Expected {name} to have at least {min_rows} rows; got {arr.shape[0]}.")
  if arr.shape[1] < 1:
    raise ValueError(f"Expected {name} to have at least one column; got shape {tuple(arr.shape)}.")
  if dim is not None and arr.shape[1] != dim:
    raise ValueError(f"Expected {name} to have d={dim} columns like {dim_name}; got {arr.shape[1]}.")
  out = jnp.asarray(arr, dtype=jnp.float32)
  # One reduction checks both: a NaN or inf entry makes its row's squared norm non-finite too.
  largest = float(jnp.max(jnp.sum(jnp.square(out), axis=1)))
  if not largest <= _MAX_SQUARED_NORM:
    if not bool(jnp.isfinite(out).all()):
      bad = "NaN" if bool(jnp.isnan(out).any()) else "inf (or a value too large for float32)"
      raise ValueError(f"Expected finite {name}; found {bad}.")
    raise ValueError(f"Expected {name} rows with squared norms <= {_MAX_SQUARED_NORM:.3g}, so that float32 squared "
                     f"distances do not overflow; found {largest:.3g}. Rescale the features.")
  return out


#: float32's largest value / 4: ||x||^2 + ||q||^2 + 2|x.q| stays finite when both norms are below it.
_MAX_SQUARED_NORM = float(np.finfo(np.float32).max) / 4


#: ||mean||^2 / mean ||x - mean||^2 of public features above which :func:`warn_if_off_centre` warns. Measured
#: (20,000 Gaussian records, 200 Gaussian queries, d = 2 and 64, both shifted alike): at a ratio of 10^3, 0.2% of
#: the records' float32 nearest queries differ from the float64 ones; at 10^4, 2-4%; at 10^6, 65-77%.
OFF_CENTRE_RATIO = 1e3


def warn_if_off_centre(name: str, x: jax.Array, *, stacklevel: int) -> None:
  """Warns (RuntimeWarning) when float32 distances on the public ``x`` lose precision to its offset.

  The squared distances ``||x||^2 - 2 x.q + ||q||^2`` are rounded in
  proportion to ``||x||^2``, not to the distance, so features far from the
  origin compared with their spread change nearest neighbours. Call it on
  public features only (D_pub, queries): the warning must reveal nothing
  about private records.
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
        f"(public, so free).", RuntimeWarning, stacklevel=stacklevel + 1)


def block_size(value: Any) -> int:
  """Validates a streaming block size (rows per block)."""
  return _validate.integer("block_size", value, minimum=1)
