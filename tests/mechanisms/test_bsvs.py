"""BSVS inputs: validation, exact aggregation, sensitivity, synthetic workloads."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import accounting
from jaxdistill import mechanisms as M
from jaxdistill import simulation
from jaxdistill.mechanisms._bsvs import check_client
from tests._memory import aligned_copy


def dense_reference(buckets, labels, s, y):
  a = np.zeros((s, y), np.int64)
  for bs, ls in zip(buckets, labels):
    for b in bs:
      for lab in ls:
        if b >= 0 and lab >= 0:
          a[b, lab] += 1
  return a


def test_counts_match_dense_reference():
  rng = np.random.default_rng(0)
  n, s, y, k, r = 300, 7, 5, 3, 2
  buckets = np.stack([rng.choice(s, k, replace=False) for _ in range(n)])
  labels = np.stack([rng.choice(y, r, replace=False) for _ in range(n)])
  buckets[::7, -1] = -1  # some clients connect to fewer than k buckets
  inp, shape = M.make_bsvs_input(buckets, labels, num_buckets=s, num_labels=y)
  np.testing.assert_array_equal(np.asarray(M.bsvs_counts(inp, shape)), dense_reference(buckets, labels, s, y))
  assert shape.d == s * y and shape.c == k * r


@pytest.mark.parametrize("kwargs,name", [
    (dict(buckets=[[0, 1]], labels=[[0]], num_buckets=1, num_labels=2), "k"),
    (dict(buckets=[[0]], labels=[[5]], num_buckets=2, num_labels=2), "labels"),
    (dict(buckets=[[0], [1]], labels=[[0]], num_buckets=2, num_labels=2), "label rows"),
    (dict(buckets=[[0.0], [np.nan]], labels=[[0], [1]], num_buckets=2, num_labels=2), "buckets"),
    (dict(buckets=[[1, 1]], labels=[[0]], num_buckets=3, num_labels=2), "distinct"),
    (dict(buckets=[[0]], labels=[[0]], num_buckets=2, num_labels=2, r=0), "r"),
    (dict(buckets=[[-3]], labels=[[0]], num_buckets=2, num_labels=2), "buckets"),
    (dict(buckets=np.zeros((2, 1, 2), int), labels=[0, 1], num_buckets=4, num_labels=2), r"buckets \[n, k\]"),
    (dict(buckets=np.zeros(0, int), labels=np.zeros(0, int), num_buckets=2, num_labels=2), "at least one client"),
    # Ragged rows gave NumPy's "inhomogeneous shape" message, which named neither argument.
    (dict(buckets=[[0, 1], [2]], labels=[[0], [2]], num_buckets=4, num_labels=3),
     r"buckets to be a rectangular \[n, k\] array; got ragged rows"),
    (dict(buckets=[[0], [2]], labels=[[0, 1], [2]], num_buckets=4, num_labels=3),
     r"labels to be a rectangular \[n, r\] array; got ragged rows"),
])
def test_bad_input(kwargs, name):
  with pytest.raises(ValueError, match=name):
    M.make_bsvs_input(**kwargs)


def test_counts_refuse_inputs_that_do_not_fit_the_shape():
  # bsvs_counts counted a label >= |Y| in the next bucket's row, dropped a bucket >= s and counted a
  # repeated bucket twice, silently.
  inp, shape = M.make_bsvs_input([[0], [1]], [[2], [0]], num_buckets=2, num_labels=3)
  np.testing.assert_array_equal(np.asarray(M.bsvs_counts(inp, shape)), [[0, 0, 1], [1, 0, 0]])
  for inputs, small, match in (
      (inp, M.BsvsShape(2, 2, 1), r"labels in \[0, num_labels=2\)"),
      (M.BsvsInput(jax.numpy.array([[5]]), jax.numpy.array([[0]])), M.BsvsShape(2, 2, 1), "num_buckets=2"),
      (M.BsvsInput(jax.numpy.array([[0, 0]]), jax.numpy.array([[1]])), M.BsvsShape(2, 2, 2), "distinct"),
      (M.BsvsInput(jax.numpy.array([[0, 1]]), jax.numpy.array([[1]])), M.BsvsShape(2, 2, 1), "at most k=1"),
      ((np.array([[0]]), np.array([[0]])), shape, "BsvsInput")):
    with pytest.raises(ValueError, match=match):
      M.bsvs_counts(inputs, small)
  with pytest.raises(ValueError, match="shape"):
    M.bsvs_counts(inp, (2, 3, 1))


def three_clients_statistics(mech):
  """The summed statistics of 3 clients (one bucket and one label each) under ``mech`` (s = 3, |Y| = 2)."""
  inp, _ = M.make_bsvs_input([[0], [2], [1]], [[1], [0], [0]], num_buckets=3, num_labels=2, k=1)
  keys = jax.random.split(jax.random.key(0), 3)
  return mech.chunk_statistics(keys, inp.buckets, inp.labels, jax.numpy.ones(3, bool))


@pytest.mark.parametrize("make", [M.RandomizedResponse, M.Collision, M.Separation, M.Concatenation,
                                  M.ConcatenationLiteral, M.CentralLaplace, M.CentralDiscreteLaplace])
def test_estimates_refuse_a_bad_num_clients(make):
  # num_clients is the debiasing n: -5, 0 or 2.5 gave a finite, meaningless estimate. The central estimates do
  # not read it, but took 'abc', None and -5 where every other mechanism refuses them.
  mech = make(M.BsvsShape(3, 2, 1), 1.0)
  stats = three_clients_statistics(mech)
  assert np.isfinite(mech.estimate(jax.random.key(1), stats, 3)).all()
  for bad in (-5, 0, 2.5, None):
    with pytest.raises(ValueError, match="num_clients"):
      mech.estimate(jax.random.key(1), stats, bad)


def test_domain_must_fit_int32_indices():
  # Flattened entries t * |Y| + y are int32 on the device: a larger domain would wrap around.
  assert M.BsvsShape(2**16, 2**15 - 1, 1).d == 2**31 - 2**16
  with pytest.raises(ValueError, match="num_buckets \\* num_labels = 65536 \\* 32768"):
    M.BsvsShape(2**16, 2**15, 1)


def test_sensitivity():
  assert M.bsvs_sensitivity(3, 2, "replace-one") == 12
  assert M.bsvs_sensitivity(3, 2, "add-remove") == 6
  with pytest.raises(ValueError, match="k"):
    M.bsvs_sensitivity(0)


def test_synthetic_workload_is_valid_and_chunk_invariant():
  w = M.synthetic_workload(jax.random.key(3), num_clients=777, num_buckets=12, num_labels=4, k=3, r=2)
  a = w.materialize(chunk_size=100)
  b = w.materialize(chunk_size=777)
  np.testing.assert_array_equal(np.asarray(a.buckets), np.asarray(b.buckets))
  # Every client has k distinct buckets and r distinct labels in range.
  _, shape = M.make_bsvs_input(np.asarray(a.buckets), np.asarray(a.labels), num_buckets=12, num_labels=4)
  assert shape == w.shape
  assert (np.asarray(a.buckets) >= 0).all() and (np.asarray(a.labels) >= 0).all()
  for bad in (0, -3, 2.5):  # was ZeroDivisionError / a JAX reshape TypeError
    with pytest.raises(ValueError, match="chunk_size"):
      w.materialize(chunk_size=bad)


@pytest.mark.parametrize("build", [
    lambda shape: M.RandomizedResponse(shape, 1.0),
    lambda shape: M.CentralLaplace(shape, 1.0),
    lambda shape: M.CentralDiscreteLaplace(shape, 1.0),
    lambda shape: M.Collision(shape, 1.0),
    lambda shape: M.Separation(shape, 1.0),
    lambda shape: M.Concatenation(shape, 1.0),
    lambda shape: M.ConcatenationLiteral(shape, 1.0),
    lambda shape: M.ShuffleMultiMessage(shape, 1.0, 1e-6, 100),
    lambda shape: M.ShuffleSingleMessage(shape, 1.0, 1e-6, 100),
])
def test_every_mechanism_names_a_bad_shape(build):
  # A tuple where a BsvsShape belongs: a ValueError naming ``shape``, not an AttributeError.
  with pytest.raises(ValueError, match="shape"):
    build((4, 3, 1))


@pytest.mark.parametrize("make", [M.RandomizedResponse, M.Collision, M.Separation, M.Concatenation,
                                  M.ConcatenationLiteral])
def test_closed_forms_refuse_counts_no_votes_could_give(make):
  # A negative n gave a negative variance; counts above n (a client adds at most 1 to an entry) or of
  # the wrong size gave nonsense or a bare numpy reshape error.
  mech = make(M.BsvsShape(3, 2, 1), 1.0)
  counts = np.array([[2, 0], [0, 1], [1, 0]])
  assert (mech.entry_variance(counts, 4) > 0).all()
  for bad_n in (-4, 0, 2.5, None):
    with pytest.raises(ValueError, match="num_clients"):
      mech.entry_variance(counts, bad_n)
  # RandomizedResponse's variance does not depend on the counts; they are checked all the same.
  for bad, needle in ((counts * 10, r"counts in \[0, num_clients=4\]"), (-counts, "counts in"),
                      (counts[:2], "s\\*\\|Y\\| = 3\\*2 entries")):
    with pytest.raises(ValueError, match=needle):
      mech.entry_variance(bad, 4)


#: Mechanisms whose closed-form variance does not depend on the counts A.
COUNT_FREE = [
    lambda shape: M.RandomizedResponse(shape, 1.0),
    lambda shape: M.CentralLaplace(shape, 1.0),
    lambda shape: M.CentralDiscreteLaplace(shape, 1.0),
    lambda shape: M.ShuffleMultiMessage(shape, 1.0, 1e-6, 100),
]


@pytest.mark.parametrize("build", COUNT_FREE + [lambda shape: M.Collision(shape, 1.0)])  # the unbiased ones
def test_the_zero_bias_of_unbiased_mechanisms_checks_its_arguments(build):
  # BsvsMechanism.entry_bias returned zeros of whatever shape counts had: 'abc' and -1 clients gave array(0.),
  # 7 NaN counts 7 zeros.
  mech = build(M.BsvsShape(3, 2, 1))
  counts = np.array([[2, 0], [0, 1], [1, 0]])
  for given in (counts, counts.ravel(), None):
    bias = mech.entry_bias(given, 4)
    assert bias.shape == (3, 2) and bias.dtype == np.float64 and not bias.any()
  for bad, n, needle in (("abc", -1, "num_clients"), ("abc", 4, "counts"), (np.full(7, np.nan), 4, r"3\*2 entries"),
                         (counts, "x", "num_clients"), (counts * 10, 4, r"counts in \[0, num_clients=4\]")):
    with pytest.raises(ValueError, match=needle):
      mech.entry_bias(bad, n)


@pytest.mark.parametrize("build", COUNT_FREE)
def test_count_free_variances_still_check_the_counts_they_are_given(build):
  # These variances do not depend on A, and counts went unread: "abc" or NaN passed. None still means
  # "not given"; anything else is checked as the other closed forms check it.
  mech = build(M.BsvsShape(3, 2, 1))
  counts = np.array([[2, 0], [0, 1], [1, 0]])
  ref = mech.entry_variance(None, 4)
  np.testing.assert_array_equal(mech.entry_variance(counts, 4), ref)
  for bad, needle in (("abc", "counts"), (np.full((3, 2), np.nan), r"counts in \[0, num_clients=4\]"),
                      (counts * 10, r"counts in \[0, num_clients=4\]"), (counts[:2], "s\\*\\|Y\\| = 3\\*2 entries")):
    with pytest.raises(ValueError, match=needle):
      mech.entry_variance(bad, 4)


@pytest.mark.parametrize("make", [M.RandomizedResponse, M.Collision])
def test_local_estimates_refuse_statistics_no_clients_could_send(make):
  # NaN gave a NaN estimate, -5 a finite one, a bool array was counted as 0/1, a transposed [|Y|, s]
  # array was reshaped into scrambled entries, and a wrong size raised NumPy's reshape error.
  mech = make(M.BsvsShape(3, 2, 1), 1.0)
  key = jax.random.key(0)
  stats = np.array([[2, 0], [0, 1], [1, 0]])
  ref = mech.estimate(key, stats, 4)
  np.testing.assert_array_equal(mech.estimate(key, stats.reshape(-1), 4), ref)  # flat [s |Y|] is the same
  half = mech.estimate(key, np.full((3, 2), 0.5), 4) - mech.estimate(key, np.zeros((3, 2)), 4)
  np.testing.assert_allclose(mech.estimate(key, stats + 0.5, 4), ref + half, rtol=1e-12)  # fractions pass
  for bad, needle in ((np.full((3, 2), np.nan), r"stats to hold counts in \[0, num_clients=4\]; found nan"),
                      (-stats - 1, r"found -3.0"), (stats * 10, r"found 20.0"),
                      (stats.T, r"stats of shape \[3, 2\] \(or flat \[6\]\); got shape \[2, 3\]"),
                      (np.arange(5), r"got shape \[5\]"), (stats > 0, "stats to hold real numbers")):
    with pytest.raises(ValueError, match=needle):
      mech.estimate(key, bad, 4)


@pytest.mark.parametrize("make", [M.Separation, M.Concatenation, M.ConcatenationLiteral])
def test_product_estimates_refuse_statistics_no_clients_could_send(make):
  mech = make(M.BsvsShape(3, 2, 1), 1.0)
  stats = three_clients_statistics(mech)
  assert np.isfinite(mech.estimate(None, stats, 3)).all()
  co = np.asarray(stats.cooccurrence)
  for bad, needle in ((stats._replace(cooccurrence=co.T), r"stats.cooccurrence of shape \[3, 2\]"),
                      (stats._replace(bucket_hits=np.full(3, np.nan)), r"stats.bucket_hits to hold counts"),
                      (stats._replace(label_hits=np.array([-1, 0])), r"stats.label_hits to hold counts"),
                      (co, "stats to be ProductStats")):
    with pytest.raises(ValueError, match=needle):
      mech.estimate(None, bad, 3)


def test_repeated_in_rows_matches_a_set_count_on_numpy_and_jax():
  # The one check behind every "distinct buckets/labels" refusal (inputs, simulation, balanced rules).
  from jaxdistill.mechanisms._bsvs import repeated_in_rows  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  a = rng.integers(-1, 4, size=(500, 3))  # many rows with a repeat, many with -1 twice (padding: no repeat)
  want = np.array([len([v for v in row if v >= 0]) != len({v for v in row if v >= 0}) for row in a.tolist()])
  assert 0 < want.sum() < len(want)
  got_np = repeated_in_rows(a)
  assert isinstance(got_np, np.ndarray)
  np.testing.assert_array_equal(got_np, want)
  np.testing.assert_array_equal(np.asarray(jax.jit(repeated_in_rows)(jax.numpy.asarray(a))), want)


def test_shape_keeps_whole_float_sizes_as_ints():
  # BsvsShape(4.0, 3, 2) passed validation but kept 4.0, which reached array shapes: central noise,
  # randomized response and synthetic workloads raised a JAX TypeError. The sizes are now Python ints.
  shape = M.BsvsShape(4.0, np.int64(3), 2.0, np.float32(1.0))
  ref = M.BsvsShape(4, 3, 2, 1)
  assert shape == ref and hash(shape) == hash(ref)
  assert all(type(v) is int for v in (shape.num_buckets, shape.num_labels, shape.k, shape.r, shape.d, shape.c))
  key = jax.random.key(0)
  np.testing.assert_array_equal(M.CentralLaplace(shape, 1.0).noise(key), M.CentralLaplace(ref, 1.0).noise(key))
  b, lab = jax.numpy.array([0, 2]), jax.numpy.array([1])
  np.testing.assert_array_equal(M.RandomizedResponse(shape, 1.0).randomize(key, b, lab),
                                M.RandomizedResponse(ref, 1.0).randomize(key, b, lab))
  w = M.synthetic_workload(key, num_clients=5.0, num_buckets=4.0, num_labels=3.0, k=2.0).materialize()
  w_ref = M.synthetic_workload(key, num_clients=5, num_buckets=4, num_labels=3, k=2).materialize()
  np.testing.assert_array_equal(w.buckets, w_ref.buckets)
  np.testing.assert_array_equal(w.labels, w_ref.labels)


def test_synthetic_workload_refuses_more_clients_than_int32_counts_hold():
  # The aggregate is int32 and client i folds in i as a uint32: 2^31 clients wrapped silently before.
  with pytest.raises(ValueError, match="num_clients=2147483648 <= 2147483647"):
    M.synthetic_workload(jax.random.key(0), num_clients=2**31, num_buckets=4, num_labels=3, k=1)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int16, jnp.uint8, jnp.uint16])
def test_narrow_integer_inputs_count_like_int32(dtype):
  # t * |Y| + y was computed in the inputs' dtype: with int16, 299 * 200 + 199 wrapped negative (the vote
  # vanished) and 16384 * 4 wrapped to 0 (a client added 2 to entry (0, 0)), with no error.
  info = jnp.iinfo(dtype)
  shape = M.BsvsShape(400, 200, 2) if info.max > 255 else M.BsvsShape(120, 100, 2)  # s|Y| past the dtype
  assert shape.num_buckets * shape.num_labels > info.max
  s, y = shape.num_buckets, shape.num_labels
  b = np.array([[s - 1, 0], [s // 2, s - 2], [10, 3]])
  lab = np.array([[y - 1], [0], [5]])
  wide = M.BsvsInput(jnp.asarray(b, jnp.int32), jnp.asarray(lab, jnp.int32))
  narrow = M.BsvsInput(jnp.asarray(b, dtype), jnp.asarray(lab, dtype))
  expected = np.zeros((s, y), np.int64)
  for row, ys in zip(b, lab):
    for t in row:
      expected[t, ys[0]] += 1
  np.testing.assert_array_equal(np.asarray(M.bsvs_counts(narrow, shape)), expected)
  np.testing.assert_array_equal(np.asarray(M.bsvs_counts(wide, shape)), expected)
  mech = M.CentralDiscreteLaplace(shape, 1.0)
  key = jax.random.key(0)
  np.testing.assert_array_equal(simulation.simulate(key, mech, narrow).estimate,
                                simulation.simulate(key, mech, wide).estimate)


def test_synthetic_workload_needs_a_threefry_key():
  # An rbg key's vmapped draws differ from its unbatched ones: the workload's clients (and simulate's
  # counts and estimate) changed with the chunk size, e.g. 55, 59 or 55 votes in entry (0, 0) for chunks
  # of 500, 64 and 7.
  for impl in ("rbg", "unsafe_rbg"):
    with pytest.raises(ValueError, match=f"Expected key to be a threefry2x32 key.*got a {impl} key"):
      M.synthetic_workload(jax.random.key(0, impl=impl), num_clients=50, num_buckets=6, num_labels=3, k=1)
    direct = M.SyntheticWorkload(jax.random.key(0, impl=impl), M.BsvsShape(6, 3, 1), 50)
    with pytest.raises(ValueError, match="threefry2x32"):
      direct.materialize(chunk_size=7)


@pytest.mark.parametrize("buckets,needle", [
    (np.array([[1], [2**64 - 1]], np.uint64), r"found \[18446744073709551615\]"),  # was cast to -1: padding
    (np.array([[1], [2**63]], np.uint64), r"found \[9223372036854775808\]"),  # was named as -2^63
    (np.array([[1.0], [np.inf]]), "to hold integers; found inf"),
])
def test_make_bsvs_input_checks_indices_before_its_int64_cast(buckets, needle):
  # A uint64 bucket 2^64 - 1 became -1 in the int64 cast before the range check: the client's vote was dropped
  # as padding without a word (bsvs_counts and simulate refuse the same array).
  with pytest.raises(ValueError, match=needle):
    M.make_bsvs_input(buckets, [[0], [1]], num_buckets=3, num_labels=2)
  inp, _ = M.make_bsvs_input(np.array([[1], [2]], np.uint64), [[0], [1]], num_buckets=3, num_labels=2)
  np.testing.assert_array_equal(np.asarray(inp.buckets), [[1], [2]])  # in range: as given


@pytest.mark.parametrize("bad, low, high", [(2**32 + 1, 0, 2**32 + 1), (2**32 - 1, 0, 2**32 - 1),
                                            (-(2**32) + 1, -(2**32) + 1, 1)])
def test_wide_integer_inputs_are_checked_before_the_int32_cast(bad, low, high):
  # An int64 bucket was range-checked after JAX's int32 cast: 2^32 + 1 was counted in bucket 1, and
  # 2^32 - 1 became -1 (padding) and its vote vanished, without an error.
  shape = M.BsvsShape(4, 2, 1)
  inp = M.BsvsInput(np.array([[0], [bad], [1]], np.int64), np.array([[0], [1], [1]], np.int64))
  match = rf"clients\.buckets in \[0, num_buckets=4\) or -1 \(padding\); found values in \[{low}, {high}\]"
  with pytest.raises(ValueError, match=match):
    M.bsvs_counts(inp, shape)
  with pytest.raises(ValueError, match=match):
    simulation.simulate(jax.random.key(0), M.CentralDiscreteLaplace(shape, 1.0), inp, with_counts=True)
  ok = M.BsvsInput(np.array([[0], [3], [-1]], np.int64), np.array([[0], [1], [1]], np.int64))  # in range: fine
  np.testing.assert_array_equal(np.asarray(M.bsvs_counts(ok, shape)), [[1, 0], [0, 0], [0, 0], [0, 1]])


def test_client_entries_maps_buckets_and_labels_of_different_lengths():
  # k = 2 buckets, r = 1 label (the one-hot case): entries t * |Y| + y, -1 pads stay -1.
  out = M.client_entries(jnp.array([0, 2, -1]), jnp.array([1]), 3)
  assert out.dtype == jnp.int32 and out.tolist() == [1, 7, -1]
  assert M.client_entries(np.array([1]), np.array([0, 2]), 3.0).tolist() == [3, 5]  # a whole float is the int


@pytest.mark.parametrize("num_labels, needle", [
    (3.5, r"num_labels to be an integer, got 3\.5"),  # was entries 2, 5: truncated silently
    (True, r"num_labels to be an integer, got True"),  # was |Y| = 1
    (0, r"num_labels=0 >= 1"),  # every bucket mapped onto its label
    (-1, r"num_labels=-1 >= 1"),
    (2**31, r"num_labels=2147483648 <= 2147483647"),  # a deep OverflowError from jit
    (float("nan"), r"num_labels to be an integer, got nan"),  # was entries [0, 0]
    ("3", r"num_labels to be an integer, got '3'"),  # a TypeError
    (None, r"num_labels to be an integer, got None"),
])
def test_client_entries_refuses_a_bad_num_labels_by_name(num_labels, needle):
  with pytest.raises(ValueError, match=needle) as err:
    M.client_entries(jnp.array([0, 1]), jnp.array([2]), num_labels)
  assert "\n" not in str(err.value)


@pytest.mark.parametrize("buckets, labels, needle", [
    (np.zeros((2, 2), np.int32), np.array([1]), r"buckets to be a 1-D integer array; got shape \(2, 2\)"),  # flattened
    (np.array([0, 1]), np.array(1), r"labels to be a 1-D integer array; got shape \(\)"),  # an IndexError
    (np.array([0.5]), np.array([1]), r"buckets to be a 1-D integer array; got shape \(1,\), dtype float"),  # 0.5 -> 0
    (np.array([0]), np.array([True]), r"labels to be a 1-D integer array; got shape \(1,\), dtype bool"),
    (None, np.array([1]), r"buckets to be a 1-D integer array; got NoneType None"),
])
def test_client_entries_refuses_buckets_or_labels_that_are_not_integer_vectors(buckets, labels, needle):
  with pytest.raises(ValueError, match=needle) as err:
    M.client_entries(buckets, labels, 3)
  assert "\n" not in str(err.value)


@pytest.mark.parametrize("buckets, labels, num_labels, needle", [
    # int32 wrap: 2^30 * 2 + 1 = 2^31 + 1 became -2147483647, read as padding (a vote dropped).
    (np.array([2**30]), np.array([1]), 2, r"entry t \* num_labels \+ y <= 2\^31 - 1 .* bucket 1073741824 with "
     r"num_labels=2 gives 2147483649"),
    # 1 * 3 + 3 = 6 is entry (2, 0): a vote for label 3 of bucket 1 was counted for label 0 of bucket 2.
    (np.array([1]), np.array([3]), 3, r"labels in \[0, 3\) or -1 \(padding\); found \[3\]"),
    (np.array([-2, 0]), np.array([0]), 3, r"buckets >= 0 or -1 \(padding\); found \[-2\]"),  # was a silent pad
    (np.array([0]), np.array([-5]), 3, r"labels in \[0, 3\) or -1 \(padding\); found \[-5\]"),
    # int64 2^32 + 1 was cast to int32 (1) before the check: entry 1 * 2 + 1 = 3, a vote moved to bucket 1.
    (np.array([2**32 + 1]), np.array([1]), 2, r"bucket 4294967297 with num_labels=2 gives 8589934595"),
    (np.array([2**64 - 1], np.uint64), np.array([0]), 2, r"bucket 18446744073709551615 with num_labels=2"),
    (np.array([0]), np.array([2**32], np.int64), 3, r"labels in \[0, 3\) or -1 \(padding\); found \[4294967296\]"),
])
def test_client_entries_refuses_concrete_entries_that_alias_or_wrap(buckets, labels, num_labels, needle):
  with pytest.raises(ValueError, match=needle) as err:
    M.client_entries(buckets, labels, num_labels)
  assert "\n" not in str(err.value)


def test_client_entries_keeps_the_largest_entry_that_fits_int32():
  # The boundary: (2^30 - 1) * 2 + 1 = 2^31 - 1 is the largest int32, kept exactly.
  assert M.client_entries(np.array([2**30 - 1]), np.array([1]), 2).tolist() == [2**31 - 1]


def test_client_entries_checks_cost_nothing_under_vmap():
  # Only static metadata is read: vmapped over clients (as entry_histogram does) the per-client rows are 1-D.
  out = jax.jit(jax.vmap(M.client_entries, in_axes=(0, 0, None)), static_argnums=2)(
      jnp.array([[0, 1], [2, -1]]), jnp.array([[1], [0]]), 3)
  assert out.tolist() == [[1, 4], [6, -1]]


_LITTLE_NOISE = accounting.MultiMessageNoise(math.exp(-1.0), 2.0, 0.3)


@functools.lru_cache(maxsize=None)
def _every_mechanism(shape):
  return [M.RandomizedResponse(shape=shape, epsilon=1.0), M.Collision(shape=shape, epsilon=1.0),
          M.CentralLaplace(shape=shape, epsilon=1.0), M.CentralDiscreteLaplace(shape=shape, epsilon=1.0),
          M.Separation(shape=shape, epsilon=1.0), M.Concatenation(shape=shape, epsilon=1.0),
          M.ConcatenationLiteral(shape=shape, epsilon=1.0),
          M.ShuffleMultiMessage(shape, 2.0, 0.99, 1000, noise=_LITTLE_NOISE),  # quick to account, same randomize
          M.ShuffleSingleMessage(shape=shape, epsilon=1.0, delta=1e-6, num_clients=1000)]


@pytest.mark.parametrize("buckets, labels, needle", [
    # 3 buckets under k = 2: RR and the central mechanisms added 3 entries under noise calibrated to 2.
    (np.array([0, 1, 2]), np.array([0]), r"at most k=2 buckets per client.* shape \(3,\)"),
    (np.array([0]), np.array([0, 1]), r"at most r=1 labels per client.* shape \(2,\)"),
    # bucket 4 of 4 was dropped without a word
    (np.array([0, 4]), np.array([0]),
     r"clients.buckets in \[0, num_buckets=4\) or -1 \(padding\); found values in \[0, 4\]"),
    # a repeated bucket counted 2 in the multi-message shuffle
    (np.array([1, 1]), np.array([0]), r"distinct clients.buckets within a client .* \[1, 1\]"),
    (np.array([2**32 + 1]), np.array([0]),
     r"clients.buckets in \[0, num_buckets=4\) .* found values in \[4294967297, 4294967297\]"),
    (np.array([0.5]), np.array([0]), r"buckets to be a 1-D integer array"),
])
def test_every_mechanisms_randomize_refuses_a_client_that_does_not_fit_its_shape(buckets, labels, needle):
  shape = M.BsvsShape(num_buckets=4, num_labels=3, k=2, r=1)
  for mech in _every_mechanism(shape):
    with pytest.raises(ValueError, match=needle) as err:
      mech.randomize(jax.random.key(0), buckets, labels)
    assert "\n" not in str(err.value), type(mech).__name__


@pytest.mark.parametrize("key, needle", [
    (0, r"got int 0\.$"),
    ("a", r"got str 'a'\.$"),
    (np.zeros(3, np.uint32), r"got an array of dtype uint32 and shape \(3,\), which is not legacy key data either\.$"),
    (jax.random.split(jax.random.key(0), 2), r"^Expected key to be a single PRNG key; got a batch of shape \(2,\)\.$"),
])
def test_every_mechanisms_randomize_refuses_what_is_not_one_prng_key(key, needle):
  # Randomized response named the key; the Collision family raised JAX's TypeError ("invalid PRNG key data"),
  # the central mechanisms ignored it, and a batch of keys reached the samplers.
  shape = M.BsvsShape(num_buckets=4, num_labels=3, k=2, r=1)
  for mech in _every_mechanism(shape):
    with pytest.raises(ValueError, match=r"Expected key to be a") as err:
      mech.randomize(key, np.array([0]), np.array([1]))
    assert re.search(needle, str(err.value)) and "\n" not in str(err.value), (type(mech).__name__, str(err.value))


def test_randomize_takes_legacy_key_data_as_the_same_key():
  shape = M.BsvsShape(num_buckets=4, num_labels=3, k=2, r=1)
  legacy = jax.random.PRNGKey(3)  # legacy uint32 key data: the same messages as the typed key
  bits = lambda a: jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a
  for mech in _every_mechanism(shape)[:2]:  # one of each sampler family (14 s for all nine, run op by op)
    got = mech.randomize(legacy, np.array([0]), np.array([1]))
    want = mech.randomize(jax.random.wrap_key_data(legacy), np.array([0]), np.array([1]))
    same = jax.tree.map(lambda a, b: bool(np.array_equal(bits(a), bits(b))), got, want)
    assert jax.tree.all(same), type(mech).__name__


def test_randomize_width_check_also_runs_under_jit_and_fitting_clients_pass():
  shape = M.BsvsShape(num_buckets=4, num_labels=3, k=2, r=1)
  for buckets, labels in [([3, -1], [2]), ([-1, -1], [-1]), ([0], [0]), (np.array([1, 3], np.uint64), [1])]:
    check_client(shape, buckets, labels)  # fits: no error (each randomize calls exactly this)
  for mech in _every_mechanism(shape):
    with pytest.raises(ValueError, match=r"at most k=2 buckets"):
      jax.jit(mech.randomize)(jax.random.key(0), jnp.array([0, 1, 2]), jnp.array([0]))


def test_check_client_hands_randomize_copies_never_the_callers_arrays():
  # Every randomize works on what check_client returns: int32 device copies of host inputs, so a caller
  # overwriting its (64-byte-aligned int32) buckets right after the call cannot change a message still being
  # computed (jitted code reads such an array in place on CPU).
  shape = M.BsvsShape(num_buckets=4, num_labels=3, k=2, r=1)
  buckets = aligned_copy(np.array([0, 2], np.int32))
  b2, l2 = check_client(shape, buckets, np.array([2], np.int64))
  assert b2.dtype == l2.dtype == np.int32 and np.asarray(l2).tolist() == [2]
  buckets[:] = [3, 1]
  assert np.asarray(b2).tolist() == [0, 2]
  traced = jax.jit(lambda b, lab: check_client(shape, b, lab))(jnp.array([1, -1], jnp.int16), jnp.array([0]))
  assert [t.dtype for t in traced] == [jnp.int32, jnp.int32] and np.asarray(traced[0]).tolist() == [1, -1]
  # Concrete arrays closed over by a jitted function are checked on the host, not sliced into tracers.
  b, lab = jnp.array([2, 0]), jnp.array([1])
  closed = jax.jit(lambda: check_client(shape, b, lab))()
  assert np.asarray(closed[0]).tolist() == [2, 0]
  repeated = jnp.array([1, 1])
  with pytest.raises(ValueError, match=r"distinct clients.buckets"):
    jax.jit(lambda: check_client(shape, repeated, lab))()
