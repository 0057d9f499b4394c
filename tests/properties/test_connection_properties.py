"""Properties of the connection rules over random small-integer data (Hypothesis).

Small-integer features make every float32 product exact, so the blockwise
kernels must agree bitwise with a float64 stable-argsort reference, and with
themselves at any block size, even with many exact ties (the coordinates are
drawn from a handful of values, and queries are duplicated on purpose).
Shapes come from a small fixed set: each new shape recompiles. So does each
k (the output is [n, k]), so k is drawn from a fixed set per shape, K_CHOICES:
1, s // 2 and s (plus 2 and 5 at s = 700), 12 (shape, k) pairs in all, each
compiled for at most the 3 block sizes and the dense reference. The shape
with s = 700 queries exercises the two-level (tiled) selection, which only
runs when s >= 4 * k * 32 (k = 1, 2, 5 there), and ``lax.top_k`` (k = 350,
700 > 16); with d = 2 and 5 or 17 coordinate values most of its 700 queries
tie with others.
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from jaxdistill import connection

SHAPES = [(1, 1, 1), (9, 4, 2), (33, 6, 3), (17, 700, 2)]   # (n, s, d)
BLOCKS = [1, 4, 64]
K_CHOICES = {s: sorted({1, 2, 5, s // 2, s}) if s > 100 else sorted({1, max(s // 2, 1), s}) for _, s, _ in SHAPES}


def reference(x, q):
  d = ((x[:, None, :].astype(np.float64) - q[None, :, :]) ** 2).sum(-1)
  return d, np.argsort(d, axis=1, kind="stable"), np.argsort(d.T, axis=1, kind="stable")


@st.composite
def problems(draw):
  n, s, d = draw(st.sampled_from(SHAPES))
  k = draw(st.sampled_from(K_CHOICES[s]))
  block = draw(st.sampled_from(BLOCKS))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  span = draw(st.sampled_from([2, 8])) if s > 100 else 2   # wider: ties further down the top k
  x = rng.integers(-span, span + 1, (n, d)).astype(np.float32)
  q = rng.integers(-span, span + 1, (s, d)).astype(np.float32)
  if draw(st.booleans()) and s > 1:
    q[s // 2:] = q[:s - s // 2]  # duplicated queries: exact ties
  return x, q, k, block


@given(problems())
def test_reverse_knn_blockwise_equals_dense_and_reference(problem):
  x, q, k, block = problem
  got = np.asarray(connection.reverse_knn(x, q, k, block_size=block))
  dense = np.asarray(connection.reverse_knn(x, q, k, block_size=len(x)))
  _, ref, _ = reference(x, q)
  np.testing.assert_array_equal(got, dense)
  np.testing.assert_array_equal(got, ref[:, :k])
  # Out-degree exactly k, distinct queries.
  assert got.shape == (len(x), k)
  assert all(len(set(r)) == k for r in got.tolist())


@given(problems())
def test_knn_labeling_in_degree_exactly_k(problem):
  x, q, k, block = problem
  k = min(k, len(x))
  conn = connection.knn_labeling(x, q, k, block_size=block)
  np.testing.assert_array_equal(conn.in_degrees, np.full(len(q), k))
  _, _, ref_cols = reference(x, q)
  for t in range(len(q)):
    np.testing.assert_array_equal(np.flatnonzero((conn.buckets == t).any(1)), np.sort(ref_cols[t, :k]))
  assert conn.out_degrees.max() <= len(q) == conn.privacy.shape_k
