"""The suite's threefry compile workaround (tests/_fast_threefry.py) leaves every random bit unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import _fast_threefry

pytestmark = pytest.mark.skipif(not _fast_threefry.INSTALLED, reason=f"workaround off: {_fast_threefry.REASON}")

# Shapes of (key1, key2, x1, x2): rank 2 and 4, and the broadcasts vmap produces (batched keys against shared
# counters); rank 0/1 takes JAX's own path unchanged.
SHAPES = [((), (), (800, 10), (800, 10)), ((), (), (3, 3, 16, 32), (3, 3, 16, 32)),
          ((6, 1), (6, 1), (1, 7), (1, 7)), ((2, 3, 1), (2, 3, 1), (2, 3, 5), (2, 3, 5)), ((), (), (9,), (9,))]


def _primitive():
  from jax._src.random import threefry2x32 as tf  # pylint: disable=import-outside-toplevel
  return tf


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s[2])) + "-keys" + "x".join(map(str, s[0])))
def test_flattened_lowering_gives_the_stock_hash_bit_for_bit(shapes):
  tf = _primitive()
  rng = np.random.default_rng(len(shapes[2]))
  args = [jnp.asarray(rng.integers(0, 2 ** 32, size=s, dtype=np.uint64).astype(np.uint32)) for s in shapes]
  got = jax.jit(lambda *a: tf.threefry2x32_p.bind(*a))(*args)
  # JAX's own computation, traced as plain integer ops on the original shapes (not through the primitive).
  stock = tf._threefry2x32_lowering  # pylint: disable=protected-access
  want = jax.jit(lambda *a: stock(*a, use_rolled_loops=True))(*args)
  for g, w in zip(got, want):
    assert g.shape == w.shape == np.broadcast_shapes(*shapes)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_known_answer_vectors_on_a_matrix():
  # Random123's threefry2x32 (20 rounds) known-answer vectors, as in JAX's own random tests.
  tf = _primitive()
  for key, count, out in [((0, 0), (0, 0), (0x6b200159, 0x99ba4efe)),
                          ((0x13198a2e, 0x03707344), (0x243f6a88, 0x85a308d3), (0xc4923a9c, 0x483df7a0))]:
    k1, k2 = (jnp.uint32(v) for v in key)
    x1, x2 = (jnp.full((4, 3), v, jnp.uint32) for v in count)
    y1, y2 = jax.jit(lambda *a: tf.threefry2x32_p.bind(*a))(k1, k2, x1, x2)
    assert np.all(np.asarray(y1) == out[0]) and np.all(np.asarray(y2) == out[1])


def test_public_draws_still_equal_their_flat_draws():
  # With JAX's threefry (either jax_threefry_partitionable setting) a draw of shape S is the draw of prod(S)
  # values reshaped; it still holds with the workaround, for plain and vmapped draws.
  key = jax.random.key(7)
  np.testing.assert_array_equal(jax.random.bits(key, (40, 6)), jax.random.bits(key, (240,)).reshape(40, 6))
  keys = jax.random.split(key, 5)
  batched = jax.vmap(lambda k: jax.random.uniform(k, (3, 4)))(keys)
  for i in range(5):
    np.testing.assert_array_equal(batched[i], jax.random.uniform(keys[i], (12,)).reshape(3, 4))
