"""Test-suite compile-time workaround: hash threefry counters as one flat vector on CPU.

Every ``jax.random`` draw hashes its counters with the ``threefry2x32``
primitive, which JAX lowers on CPU as a rolled loop of elementwise integer
ops. XLA:CPU compiles that loop several times slower on an array of rank 2
or more than on the same elements as one vector (measured with JAX 0.10.2:
4.1 s against 0.6 s for 8,000 counters shaped ``(800, 10)`` against
``(8000,)``). Model initialisers, augmentations and vmapped per-client draws
all hash multi-dimensional arrays, so the suite pays this on many first
calls.

:func:`install` re-registers the primitive's CPU lowering so that it
broadcasts the keys and counters to their common shape, flattens them, runs
JAX's own lowering on the vector and reshapes the two outputs back. The hash
is elementwise, so every bit is unchanged (``tests/test_fast_threefry.py``
checks this against JAX's unpatched computation and the Random123
known-answer vectors). The library does not install it: it is a test-process
setting only, like the Hypothesis profile. CLI subprocesses and notebook
kernels started by tests run stock JAX.

Set ``JAXDISTILL_STOCK_THREEFRY=1`` to run the suite without it. If this
JAX's internals differ from what the workaround expects, it stays off.
"""

import math
import os

import numpy as np

INSTALLED = False
#: Why the workaround is off, when it is ("" when installed).
REASON = "not installed yet"


def _flat_rule(original):
  from jax import lax  # pylint: disable=import-outside-toplevel

  def rule(key1, key2, x1, x2):
    shape = np.broadcast_shapes(*(np.shape(a) for a in (key1, key2, x1, x2)))
    if len(shape) <= 1:
      return original(key1, key2, x1, x2, use_rolled_loops=True)
    n = math.prod(shape)
    flat = [lax.broadcast_in_dim(a, shape, tuple(range(len(shape) - np.ndim(a), len(shape)))).reshape(n)
            for a in (key1, key2, x1, x2)]
    y1, y2 = original(*flat, use_rolled_loops=True)
    return y1.reshape(shape), y2.reshape(shape)

  return rule


def install() -> bool:
  """Registers the flattened CPU lowering of ``threefry2x32``; returns whether it is in place."""
  global INSTALLED, REASON  # pylint: disable=global-statement
  if INSTALLED:
    return True
  if os.environ.get("JAXDISTILL_STOCK_THREEFRY", "") not in ("", "0"):
    REASON = "JAXDISTILL_STOCK_THREEFRY is set"
    return False
  try:
    from jax._src.interpreters import mlir  # pylint: disable=import-outside-toplevel
    from jax._src.random import threefry2x32 as tf  # pylint: disable=import-outside-toplevel
    original = tf._threefry2x32_lowering  # pylint: disable=protected-access
    primitive = tf.threefry2x32_p
  except (ImportError, AttributeError) as e:  # another JAX layout: leave stock JAX alone
    REASON = f"this JAX has no threefry2x32 lowering where expected ({e})"
    return False
  mlir.register_lowering(primitive, mlir.lower_fun(_flat_rule(original), multiple_results=True), platform="cpu")
  INSTALLED, REASON = True, ""
  return True
