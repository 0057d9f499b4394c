"""Reverse k-NN and the k-NN labeling baseline against float64 NumPy references.

References are computed here, independently of jaxdistill: exact squared
distances in float64 and a *stable* argsort, which orders equal distances by
the lower index. Small-integer features make every float32 product exact, so
the blockwise kernels must match the reference bitwise, ties included.
"""

import re

import jax
import jax.numpy as jnp

import numpy as np
import pytest

from jaxdistill import connection, mechanisms
from jaxdistill.connection._common import as_features
from jaxdistill.connection._distances import nearest_columns
from tests._memory import aligned_copy


def dense_sq(x, q):
  x = np.asarray(x, np.float64)
  q = np.asarray(q, np.float64)
  return ((x[:, None, :] - q[None, :, :]) ** 2).sum(-1)


def reference_reverse_knn(x, q, k):
  return np.argsort(dense_sq(x, q), axis=1, kind="stable")[:, :k]


def reference_knn_labeling(x, q, k):
  return np.argsort(dense_sq(x, q).T, axis=1, kind="stable")[:, :k]


def int_features(rng, n, d, lo=-3, hi=3):
  return rng.integers(lo, hi + 1, (n, d)).astype(np.float32)


@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("block_size", [1, 7, 64, 10_000])
def test_reverse_knn_matches_dense_reference_with_ties(k, block_size):
  rng = np.random.default_rng(k * 100 + block_size)
  x = int_features(rng, 90, 4)
  q = int_features(rng, 6, 4)
  q = np.concatenate([q, q[:3]])  # duplicated queries: exact ties on purpose
  got = np.asarray(connection.reverse_knn(x, q, k, block_size=block_size))
  assert got.dtype == np.int32 and got.shape == (90, k)
  np.testing.assert_array_equal(got, reference_reverse_knn(x, q, k))


@pytest.mark.parametrize("k", [1, 2, 3, 17])
@pytest.mark.parametrize("s", [128, 300, 1000])
def test_two_level_selection_matches_reference_with_ties(k, s):
  # s >= 4 * k * 32 switches the kernel to the two-level (tiled) selection, when 128 <= s (k = 1),
  # 256 (k = 2), 384 (k = 3); k = 17 > 16 uses lax.top_k instead of rounds of minima. These shapes cover
  # every path, s not a multiple of the tile, and massive ties (few distinct query points in d = 2),
  # which the tiles and the rounds must break by the lower index.
  rng = np.random.default_rng(10 * k + s)
  for span in (2, 8):   # 25 or 289 distinct points: ties at the nearest, or further down the top k
    x = int_features(rng, 120, 2, lo=-span, hi=span)
    q = int_features(rng, s, 2, lo=-span, hi=span)
    for block_size in (16, 120):
      got = np.asarray(connection.reverse_knn(x, q, k, block_size=block_size))
      np.testing.assert_array_equal(got, reference_reverse_knn(x, q, k))
  # Queries far on one side of the records: every ranked value |q|^2 - 2 x.q is positive (>= 50 - 36), so a
  # padded tile entry of 0 (not +inf) would win and name a query index >= s; above, the values were mostly
  # negative and such a padding bug passed.
  x = int_features(rng, 120, 2, lo=-1, hi=1)
  q = int_features(rng, s, 2, lo=5, hi=9)
  got = np.asarray(connection.reverse_knn(x, q, k, block_size=16))
  assert got.min() >= 0 and got.max() < s
  np.testing.assert_array_equal(got, reference_reverse_knn(x, q, k))
  # Distinct real-valued distances: the same answer as the dense reference up to float32 near-ties.
  xr = rng.random((200, 8), dtype=np.float32)
  qr = rng.random((s, 8), dtype=np.float32)
  got = np.asarray(connection.reverse_knn(xr, qr, k, block_size=64))
  d = dense_sq(xr, qr)
  ref = reference_reverse_knn(xr, qr, k)
  np.testing.assert_allclose(np.take_along_axis(d, got, 1), np.take_along_axis(d, ref, 1), rtol=1e-5)
  assert np.mean(got == ref) > 0.99


def test_every_record_has_out_degree_exactly_k_distinct_queries():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(257, 8)).astype(np.float32)
  q = rng.normal(size=(11, 8)).astype(np.float32)
  for k in (1, 3, 11):
    b = np.asarray(connection.reverse_knn(x, q, k, block_size=32))
    assert b.shape == (257, k) and b.min() >= 0 and b.max() < 11
    assert all(len(set(row)) == k for row in b.tolist())
    # Nearest first: distances along each row are non-decreasing.
    d = np.take_along_axis(dense_sq(x, q), b, axis=1)
    assert np.all(np.diff(d, axis=1) >= -1e-5)


def test_overflowed_distances_still_give_k_distinct_queries():
  # Finite features whose squared norms overflow float32, so the ranked values are +inf (q = -x) or nan
  # (q = x: inf - inf). The public functions refuse such features (the connections would be meaningless);
  # the jitted kernel, which callers may reach with traced values, clamps both to the largest float32: all
  # queries tie, and each record gets the k lowest indices, on the flat (s = 40) and the two-level
  # (s = 400 >= 4 * 3 * 32) path alike.
  x = np.full((5, 2), 3e19, np.float32)
  for sign in (-1.0, 1.0):
    for s in (40, 400):
      q = np.full((s, 2), sign * 3e19, np.float32)
      got, _ = nearest_columns(jnp.asarray(x), jnp.asarray(q), 3, 2)
      np.testing.assert_array_equal(np.asarray(got), np.tile([0, 1, 2], (5, 1)))
      with pytest.raises(ValueError, match="Rescale the features"):
        connection.reverse_knn(x, q, 3, block_size=2)


def test_equidistant_record_goes_to_lower_query_index():
  # Record 0 sits exactly between queries 1 and 2 (and 0 and 3 are far).
  q = np.array([[10.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, 10.0]], np.float32)
  x = np.array([[0.0, 0.0], [0.0, 0.0], [0.5, 0.0]], np.float32)
  got = np.asarray(connection.reverse_knn(x, q, 2, block_size=1)).tolist()
  assert got == [[1, 2], [1, 2], [2, 1]]
  # Identical queries: the lower index wins every tie.
  got = np.asarray(connection.reverse_knn(x, np.zeros((4, 2), np.float32), 3)).tolist()
  assert got == [[0, 1, 2]] * 3


def test_reverse_knn_on_real_valued_data_is_exact_up_to_float32():
  rng = np.random.default_rng(1)
  x = rng.random((500, 32), dtype=np.float32)
  q = rng.random((40, 32), dtype=np.float32)
  got = np.asarray(connection.reverse_knn(x, q, 3, block_size=128))
  ref = reference_reverse_knn(x, q, 3)
  d = dense_sq(x, q)
  # Any disagreement must be a float32 near-tie: same distances to 1e-5 relative.
  np.testing.assert_allclose(np.take_along_axis(d, got, 1), np.take_along_axis(d, ref, 1), rtol=1e-5)
  assert np.mean(got == ref) > 0.99


def test_reverse_knn_feeds_make_bsvs_input():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(50, 3)).astype(np.float32)
  q = rng.normal(size=(8, 3)).astype(np.float32)
  conn = connection.reverse_knn_connection(x, q, 2)
  labels = rng.integers(0, 4, 50)
  inp, shape = conn.bsvs_input(labels, num_labels=4)
  assert shape.k == 2 and shape.num_buckets == 8
  counts = np.asarray(mechanisms.bsvs_counts(inp, shape))
  expected = np.zeros((8, 4), np.int64)
  np.add.at(expected, (conn.buckets.reshape(-1), np.repeat(labels, 2)), 1)
  np.testing.assert_array_equal(counts, expected)
  assert conn.privacy.sensitivity() == 4 and conn.privacy.dp_valid
  # Reverse k-NN's own k edges are all one record moves under add/remove: its shape serves either relation.
  inp2, shape2 = conn.bsvs_input(labels, num_labels=4, relation="add-remove")
  assert shape2 == shape and np.array_equal(np.asarray(inp2.buckets), np.asarray(inp.buckets))


@pytest.mark.parametrize("block_size", [1, 5, 1000])
def test_knn_labeling_in_degree_exactly_k_and_matches_reference(block_size):
  rng = np.random.default_rng(block_size)
  x = int_features(rng, 40, 3)
  x = np.concatenate([x, x[:10]])  # duplicated records: ties resolved by lower record index
  q = int_features(rng, 7, 3)
  k = 4
  conn = connection.knn_labeling(x, q, k, block_size=block_size)
  np.testing.assert_array_equal(conn.in_degrees, np.full(7, k))
  ref = reference_knn_labeling(x, q, k)
  for t in range(7):
    chosen = np.flatnonzero((conn.buckets == t).any(axis=1))
    np.testing.assert_array_equal(np.sort(chosen), np.sort(ref[t]))
  assert conn.diagnostics["max_out_degree"] == conn.out_degrees.max()
  assert conn.privacy.shape_k == 7 and conn.privacy.models == ("central",)


def test_knn_labeling_sensitivity_grows_with_s():
  """One record among every query's k nearest: replacing it changes all s rows (L1 = 2s > 2k)."""
  s, k = 6, 1
  q = np.stack([np.cos(np.arange(s)), np.sin(np.arange(s))], 1).astype(np.float32) * 10
  x = np.concatenate([np.zeros((1, 2)), q * 3.0]).astype(np.float32)  # record 0 at the centre
  labels = np.array([0] + [1] * s)

  def votes(feats):
    conn = connection.knn_labeling(feats, q, k)
    inp, shape = conn.bsvs_input(labels, num_labels=2)
    return np.asarray(mechanisms.bsvs_counts(inp, shape)), conn

  a, conn = votes(x)
  x2 = x.copy()
  x2[0] = [100.0, 100.0]  # replace record 0 (same label) by a far-away point
  a2, _ = votes(x2)
  change = np.abs(a - a2).sum()
  assert change == 2 * s > 2 * k
  # Removing record 0 moves as many votes (each list takes its next-nearest record), so an add/remove
  # mechanism with the declared k = s (sensitivity sr) would state half the loss: bsvs_input refuses it.
  a3 = np.asarray(mechanisms.bsvs_counts(*connection.knn_labeling(x[1:], q, k).bsvs_input(labels[1:],
                                                                                          num_labels=2)))
  assert np.abs(a - a3).sum() == 2 * s
  with pytest.raises(ValueError, match=r"Expected relation='replace-one' for rule='knn-labeling'; got "
                                       r"'add-remove'.*2sr = 12\*r votes") as err:
    conn.bsvs_input(labels, num_labels=2, relation="add-remove")
  assert "\n" not in str(err.value)
  assert change <= conn.privacy.sensitivity()
  assert conn.diagnostics["max_out_degree"] == s


def test_reverse_knn_replacing_a_record_changes_only_its_own_row():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(60, 4)).astype(np.float32)
  q = rng.normal(size=(9, 4)).astype(np.float32)
  k = 3
  base = np.asarray(connection.reverse_knn(x, q, k))
  labels = rng.integers(0, 3, 60)
  for i in range(0, 60, 7):
    x2 = x.copy()
    x2[i] = rng.normal(size=4) * 3
    new = np.asarray(connection.reverse_knn(x2, q, k))
    np.testing.assert_array_equal(np.delete(new, i, 0), np.delete(base, i, 0))
    y2 = labels.copy()
    y2[i] = (labels[i] + 1) % 3
    a = np.zeros((9, 3))
    a2 = np.zeros((9, 3))
    np.add.at(a, (base.reshape(-1), np.repeat(labels, k)), 1)
    np.add.at(a2, (new.reshape(-1), np.repeat(y2, k)), 1)
    assert np.abs(a - a2).sum() <= 2 * k


def test_any_floating_dtype_and_0d_jax_integers_are_accepted():
  # bfloat16 features were refused ("got dtype bfloat16"), and so was k = jnp.int32(2) (np.array(2) was not).
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.normal(size=(30, 4)), jnp.bfloat16)
  q = jnp.asarray(rng.normal(size=(6, 4)), jnp.bfloat16)
  expected = np.asarray(connection.reverse_knn(np.asarray(x, np.float32), np.asarray(q, np.float32), 2))
  np.testing.assert_array_equal(np.asarray(connection.reverse_knn(x, q, 2)), expected)
  np.testing.assert_array_equal(np.asarray(connection.reverse_knn(x, q, jnp.int32(2))), expected)
  np.testing.assert_array_equal(np.asarray(connection.reverse_knn(np.asarray(x, np.float16), q, 2)), expected)
  with pytest.raises(ValueError, match="Expected k to be an integer"):
    connection.reverse_knn(x, q, jnp.array(True))
  with pytest.raises(ValueError, match="hold real numbers; got dtype complex64"):
    connection.reverse_knn(np.ones((3, 4), np.complex64), q, 1)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16", "int64", "uint8", "bool"])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_host_features_convert_like_jnp_asarray_and_are_never_aliased(dtype, layout):
  # as_features casts host arrays with NumPy into an aligned buffer it owns (XLA:CPU then skips its own copy);
  # the float32 values must equal jnp.asarray's, whatever the dtype or memory layout, and changing the caller's
  # array afterwards must not reach the device array. jnp.asarray(arr, jnp.float32) uses a 64-byte-aligned float32
  # host array in place on CPU, so the C-layout case places the caller's array there: the old as_features (plain
  # jnp.asarray) returned an array that followed later changes to the caller's.
  rng = np.random.default_rng(11)
  base = rng.normal(scale=300.0, size=(40, 14))
  if dtype == "bool":
    base = base > 0
  elif np.dtype(dtype).kind in "iu":
    base = np.abs(base).round()
  base = base.astype(jnp.dtype(dtype))
  if layout == "C":
    arr = aligned_copy(base)
  elif layout == "F":
    arr = np.asfortranarray(base)
  else:
    arr = base[::2, ::2]
  expected = np.array(jnp.asarray(arr, dtype=jnp.float32), copy=True)
  out = as_features("x", arr)
  assert out.dtype == jnp.float32 and out.shape == arr.shape
  np.testing.assert_array_equal(np.asarray(out), expected)
  arr[...] = arr[::-1] if layout != "strided" else arr[::-1, ::-1]
  np.testing.assert_array_equal(np.asarray(out), expected)


@pytest.mark.parametrize("call, match", [
    (lambda x, q: connection.reverse_knn(x, q, 0), "k=0"),
    (lambda x, q: connection.reverse_knn(x, q, 6), "k=6"),
    (lambda x, q: connection.reverse_knn(x, q, 2.5), "k"),
    (lambda x, q: connection.reverse_knn(x[:, :2], q, 1), "private_features"),
    (lambda x, q: connection.reverse_knn(x, q[:, :1], 1), "private_features"),
    (lambda x, q: connection.reverse_knn(np.where(x > 0, np.nan, x), q, 1), "NaN"),
    (lambda x, q: connection.reverse_knn(x, np.full_like(q, np.inf), 1), "query_features"),
    (lambda x, q: connection.reverse_knn(x[0], q, 1), "private_features"),
    (lambda x, q: connection.reverse_knn(x, q, 1, block_size=0), "block_size"),
    # 1e30 raised a TypeError inside JAX and 2**63 an unrelated ValueError; each block is allocated in full.
    (lambda x, q: connection.reverse_knn(x, q, 2, block_size=1e30), r"block_size=\d+ <= 16777216"),
    (lambda x, q: connection.reverse_knn(x, q, 2, block_size=2**63), r"block_size=9223372036854775808 <= 16777216"),
    (lambda x, q: connection.reverse_knn(x, q, 2, block_size=2**24 + 1), r"block_size=16777217 <= 16777216"),
    (lambda x, q: connection.reverse_knn_connection(x, q, 2, block_size=2**63), r"block_size=\d+ <= 16777216"),
    (lambda x, q: connection.knn_labeling(x, q, 2, block_size=1e30), r"block_size=\d+ <= 16777216"),
    (lambda x, q: connection.connect("balanced-max-min", x, q, 2, block_size=2**63), r"block_size=\d+ <= 16777216"),
    (lambda x, q: connection.select_queries(jax.random.key(0), x, 2, block_size=2**63),
     r"block_size=\d+ <= 16777216"),
    (lambda x, q: connection.knn_labeling(x, q, 11), "k=11"),
    (lambda x, q: connection.knn_labeling(x, q[:, :2], 1), "private_features"),
    (lambda x, q: connection.connect("nearest", x, q, 1), "rule"),
    # Finite in float32, but squared distances would overflow to inf and every query would tie.
    (lambda x, q: connection.reverse_knn(x * np.float32(1e19), q, 1), "Rescale the features"),
    (lambda x, q: connection.knn_labeling(x, q * np.float32(1e19), 1), "query_features rows with squared norms"),
    # So small that squared distances underflow to 0 and every query ties (checked in test_kmeans.py).
    (lambda x, q: connection.reverse_knn(x * np.float32(1e-21), q, 1), "private_features with some entry of"),
    (lambda x, q: connection.knn_labeling(x, q * np.float32(1e-21), 1), "query_features with some entry of"),
])
def test_bad_input_raises_value_error_naming_the_parameter(call, match):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(10, 3)).astype(np.float32)
  q = rng.normal(size=(5, 3)).astype(np.float32)
  with pytest.raises(ValueError, match=match):
    call(x, q)


@pytest.mark.parametrize("rule", ["reverse-knn", "knn-labeling", "balanced-harmonic"])
def test_a_refusal_of_private_features_states_no_value_computed_from_them(rule):
  # The overflow and underflow refusals printed the largest squared norm (entry) of the private rows: a statistic
  # of private records in a message no DP statement covers. The public side keeps its value (it helps rescaling).
  rng = np.random.default_rng(0)
  x = rng.normal(size=(10, 3)).astype(np.float32)
  q = rng.normal(size=(5, 3)).astype(np.float32)
  big = x.copy()
  big[3] *= np.float32(1e19)
  with pytest.raises(ValueError, match=r"^Expected private_features rows with squared norms <= \S+, so that float32 "
                                       r"squared distances do not overflow; found a longer row\. Rescale") as err:
    connection.connect(rule, big, q, 1)
  assert not re.search(r"found \d", str(err.value))
  with pytest.raises(ValueError, match=r"do not underflow\. Rescale the features") as err:
    connection.connect(rule, x * np.float32(1e-21), q, 1)
  assert "the largest is" not in str(err.value)
  with pytest.raises(ValueError, match=r"query_features rows .*; found (inf|\d\S+)\. Rescale"):
    connection.connect(rule, x, q * np.float32(1e19), 1)
