"""NumPy arrays at the alignment at which XLA:CPU reads a host array in place (no copy).

``jnp.asarray(arr, dtype)`` and jitted functions use such an array's memory
directly, and JAX dispatches asynchronously, so the tests that check that
jaxdistill copies host inputs place them there.
"""

import numpy as np


def aligned_copy(arr, alignment=64):
  """A C-contiguous copy of ``arr`` whose data starts at a multiple of ``alignment`` bytes."""
  arr = np.asarray(arr)
  raw = np.empty(arr.nbytes + alignment, np.uint8)
  start = -raw.ctypes.data % alignment
  out = raw[start:start + arr.nbytes].view(arr.dtype).reshape(arr.shape)
  out[...] = arr
  return out
