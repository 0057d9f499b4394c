"""k-means++ and query selection: objective, consistency, reproducibility, queries."""

import warnings

import jax
import numpy as np
import pytest

from jaxdistill import connection


def blobs(rng, centres, per, scale):
  x = np.concatenate([c + scale * rng.normal(size=(per, len(c))) for c in centres])
  return x.astype(np.float32), np.repeat(np.arange(len(centres)), per)


def is_perfect_clustering(assignment, truth, k=8):
  """The contingency table of (found, true) labels is a permutation matrix: a bijection."""
  table = np.zeros((k, k), np.int64)
  np.add.at(table, (np.asarray(assignment), np.asarray(truth)), 1)
  hit = table > 0
  return bool(np.all(hit.sum(0) == 1) and np.all(hit.sum(1) == 1))


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  return rng.normal(size=(400, 5)).astype(np.float32)


def test_objective_is_non_increasing_and_matches_the_assignment(data):
  res = connection.kmeans(jax.random.key(0), data, 8)
  h = res.inertia_history
  assert res.converged and len(h) == res.num_iterations >= 2
  # Lloyd never raises the objective; 1e-5 relative slack for float32 sums.
  assert np.all(np.diff(h) <= 1e-5 * h[:-1])
  x = data.astype(np.float64)
  d = ((x[:, None] - res.centres.astype(np.float64)[None]) ** 2).sum(-1)
  np.testing.assert_allclose(res.inertia, d[np.arange(400), res.assignment].sum(), rtol=1e-5)


def test_assignment_and_centres_are_consistent(data):
  res = connection.kmeans(jax.random.key(1), data, 8)
  x = data.astype(np.float64)
  d = ((x[:, None] - res.centres.astype(np.float64)[None]) ** 2).sum(-1)
  # Every point sits with a nearest centre (float32 slack only matters for near-ties).
  chosen = d[np.arange(len(x)), res.assignment]
  assert np.all(chosen <= d.min(axis=1) + 1e-4)
  # Converged: every centre is the mean of its members, and none is empty.
  assert res.converged
  for t in range(8):
    members = x[res.assignment == t]
    assert len(members) > 0
    np.testing.assert_allclose(res.centres[t], members.mean(0), atol=1e-5)


def test_seeded_reproducibility_and_key_dependence(data):
  a = connection.kmeans(jax.random.key(5), data, 8)
  b = connection.kmeans(jax.random.key(5), data, 8)
  c = connection.kmeans(jax.random.key(6), data, 8)
  np.testing.assert_array_equal(a.assignment, b.assignment)
  np.testing.assert_array_equal(a.centres, b.centres)
  np.testing.assert_array_equal(a.seed_indices, b.seed_indices)
  assert not np.array_equal(a.seed_indices, c.seed_indices)
  assert len(set(a.seed_indices.tolist())) == 8  # D^2 sampling never re-picks a chosen point


def test_recovers_well_separated_clusters():
  rng = np.random.default_rng(1)
  centres = rng.normal(size=(8, 5)) * 50
  x, truth = blobs(rng, centres, 50, 1.0)  # same shape as `data`: no recompilation
  res = connection.kmeans(jax.random.key(0), x, 8)
  # A perfect clustering: each found cluster is exactly one true cluster.
  assert is_perfect_clustering(res.assignment, truth)
  # The check can fail: everything in one cluster, and two true clusters merged (one centre
  # empty), both give exactly 8 distinct (found, true) pairs; and one misassigned point.
  assert not is_perfect_clustering(np.zeros_like(truth), truth)
  assert not is_perfect_clustering(np.where(truth == 7, 6, truth), truth)
  one_moved = truth.copy()
  one_moved[0] = (truth[0] + 1) % 8
  assert not is_perfect_clustering(one_moved, truth)


def test_features_too_small_for_float32_distances_are_refused():
  # Scaled by 1e-21, the squared distances fell below float32's normal range and XLA:CPU flushed them to 0:
  # every point tied, and k-means put all 400 into cluster 0 (inertia 0), with no error or warning.
  rng = np.random.default_rng(1)
  x, truth = blobs(rng, rng.normal(size=(8, 5)) * 50, 50, 1.0)
  for scale in (1e-21, 1e-18):  # entries up to ~150, so 1.5e-19 and 1.5e-16 at most
    with pytest.raises(ValueError, match=r"features with some entry of absolute value >= 1e-15 \(or all zero\)"):
      connection.kmeans(jax.random.key(0), x * np.float32(scale), 8)
    with pytest.raises(ValueError, match="public_features with some entry"):
      connection.select_queries(jax.random.key(0), x * np.float32(scale), 8)
  # Just above the floor the distances are still normal floats: the clusters are found.
  assert is_perfect_clustering(connection.kmeans(jax.random.key(0), x * np.float32(1e-14), 8).assignment, truth)
  # All-zero features are not too small, only degenerate: every point in one cluster.
  zero = connection.kmeans(jax.random.key(0), np.zeros((10, 2), np.float32), 2)
  assert np.array_equal(np.unique(zero.assignment), [0])


def test_select_queries_picks_distinct_members_nearest_their_centres(data):
  sel = connection.select_queries(jax.random.key(2), data, 8)
  q, a = sel.query_indices, sel.assignment
  assert q.dtype == np.int32 and a.dtype == np.int32 and q.shape == (8,) and a.shape == (400,)
  assert len(set(q.tolist())) == 8
  np.testing.assert_array_equal(a[q], np.arange(8))
  x = data.astype(np.float64)
  c = sel.kmeans.centres.astype(np.float64)
  for t in range(8):
    members = np.flatnonzero(a == t)
    dm = ((x[members] - c[t]) ** 2).sum(1)
    assert ((x[q[t]] - c[t]) ** 2).sum() == pytest.approx(dm.min(), rel=1e-9)


def test_more_queries_than_distinct_public_points_is_refused():
  # Only 3 distinct points but s = 5: the two extra queries were copies of others (distinct indices, equal
  # features). With k = 1 a copy never got a vote (ties go to the lower index), and its cluster took the label of
  # an empty or pure-noise vote row, though its images equal a voted query's.
  x = np.repeat(np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]], np.float32), 4, axis=0)
  with pytest.raises(ValueError, match=r"^Expected num_queries=5 <= the number of distinct public feature vectors, 3 "
                                       r"of m_pub=12: queries with equal features would split the votes\.$"):
    connection.select_queries(jax.random.key(0), x, 5)
  sel = connection.select_queries(jax.random.key(0), x, 3)
  assert len({x[q].tobytes() for q in sel.query_indices}) == 3
  np.testing.assert_array_equal(sel.assignment[sel.query_indices], np.arange(3))


def test_an_empty_cluster_takes_a_sample_whose_features_differ_from_every_query():
  # Cluster 2 is empty; the sample nearest its centre not yet a query was index 1, a copy of query 0.
  from jaxdistill.connection import _kmeans  # pylint: disable=import-outside-toplevel
  x = np.array([[0.0, 0.0], [0.0, 0.0], [5.0, 0.0], [0.0, 5.0]], np.float32)
  centres = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 0.1]], np.float32)
  pick = _kmeans._queries_from_clusters  # pylint: disable=protected-access
  queries, assignment = pick(x, centres, np.array([0, 0, 1, 1]))
  assert queries.tolist() == [0, 2, 3] and assignment.tolist() == [0, 0, 1, 2]


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_queries=401), "num_queries=401"),
    (dict(num_queries=0), "num_queries=0"),
    (dict(num_queries=3, max_iterations=0), "max_iterations"),
    (dict(num_queries=3, num_trials=0), "num_trials"),
])
def test_select_queries_bad_input(data, kwargs, match):
  with pytest.raises(ValueError, match=match):
    connection.select_queries(jax.random.key(0), data, **kwargs)


def test_select_queries_rejects_nan_and_bad_shapes(data):
  bad = data.copy()
  bad[3, 1] = np.nan
  with pytest.raises(ValueError, match="public_features.*NaN|NaN"):
    connection.select_queries(jax.random.key(0), bad, 3)
  with pytest.raises(ValueError, match="public_features"):
    connection.select_queries(jax.random.key(0), data[:, 0], 3)
  with pytest.raises(ValueError, match="num_clusters=500"):
    connection.kmeans(jax.random.key(0), data, 500)


@pytest.mark.parametrize("kw,needle", [
    (dict(max_iterations=2**31), "max_iterations=2147483648 <= 10000000"),  # OverflowError inside jax before
    (dict(num_trials=2**31), "num_trials=2147483648 <= 1024"),             # a JaxRuntimeError before
])
def test_kmeans_counts_beyond_their_caps_are_refused_by_name(kw, needle):
  x = np.random.default_rng(0).random((20, 3)).astype(np.float32)
  with pytest.raises(ValueError, match=needle):
    connection.kmeans(jax.random.key(0), x, 3, **kw)


def test_a_large_iteration_cap_means_until_convergence():
  # 10^6 ("until convergence") was refused by the earlier cap of 10^5; the result is the default cap's.
  x = np.random.default_rng(0).random((20, 3)).astype(np.float32)
  big = connection.kmeans(jax.random.key(0), x, 3, max_iterations=10**6)
  small = connection.kmeans(jax.random.key(0), x, 3)
  assert big.converged and small.converged and np.array_equal(big.assignment, small.assignment)


def test_kmeans_pp_draws_the_second_seed_with_probability_proportional_to_d_squared():
  # Three points on a line; one candidate per step (num_trials=1), so seeding is plain k-means++: the first
  # seed is uniform, the second is j w.p. D(j)^2 / sum_k D(k)^2 (D = distance to the first). Under a D (not D^2)
  # rule the pair (0, 1) is 9x likelier: 1/3 * 1/11 vs 1/3 * 1/101.
  from jaxdistill.connection._kmeans import _kmeans_pp  # pylint: disable=import-outside-toplevel
  x = np.array([[-4.0], [-3.0], [7.0]], np.float32)
  n = 20_000
  keys = jax.random.split(jax.random.key(0), n)
  seeds = np.asarray(jax.vmap(lambda k: _kmeans_pp(k, jax.numpy.asarray(x), 2, 1))(keys))
  # The public API seeds the same way.
  np.testing.assert_array_equal(connection.kmeans(keys[3], x, 2, num_trials=1).seed_indices, seeds[3])
  d2 = (x[:, 0, None].astype(np.float64) - x[None, :, 0]) ** 2
  expected = d2 / d2.sum(1, keepdims=True) / 3  # P(first = i, second = j)
  counts = np.zeros((3, 3))
  np.add.at(counts, (seeds[:, 0], seeds[:, 1]), 1)
  # 5 sd (+1 for the empty diagonal) on 9 cells: false-failure rate < 1e-5 under the normal approximation.
  sd = np.sqrt(n * expected * (1 - expected))
  assert np.all(np.abs(counts - n * expected) <= 5 * sd + 1), (counts, n * expected)


def test_kmeans_pp_keeps_the_candidate_that_most_lowers_the_potential():
  # With 1,024 candidates on 6 points every point of D^2 weight >= 0.19 is drawn (miss probability < 1e-90),
  # so the greedy second seed is the point j minimising sum_i min(D(x_i, first)^2, D(x_i, x_j)^2), unique here.
  from jaxdistill.connection._kmeans import _kmeans_pp  # pylint: disable=import-outside-toplevel
  pts = np.array([-5.0, -4.0, -2.0, 1.0, 2.5, 6.0])
  x = pts[:, None].astype(np.float32)
  d2 = (pts[:, None] - pts[None]) ** 2
  firsts = set()
  for i in range(24):
    first, second = np.asarray(_kmeans_pp(jax.random.key(i), jax.numpy.asarray(x), 2, 1024))
    potential = np.minimum(d2[first][:, None], d2).sum(0)
    potential[first] = np.inf
    assert second == np.argmin(potential), (first, second, potential)
    firsts.add(int(first))
  assert len(firsts) >= 4  # the check ran from several first seeds


def test_select_queries_do_not_depend_on_the_block_size(data):
  # Blocks that do not divide m = 400 (7, 64: the last block padded), single rows, and one block.
  want = connection.select_queries(jax.random.key(4), data, 8, block_size=400)
  for bs in (1, 7, 64, 1024):
    got = connection.select_queries(jax.random.key(4), data, 8, block_size=bs)
    np.testing.assert_array_equal(got.query_indices, want.query_indices)
    np.testing.assert_array_equal(got.assignment, want.assignment)
    np.testing.assert_array_equal(got.kmeans.centres, want.kmeans.centres)


def test_select_queries_under_x64_are_the_same_and_quiet(data):
  # With jax_enable_x64 on, k-means++ set its int32 seed list from an int64 draw: JAX's FutureWarning "scatter
  # inputs have incompatible types" (a future error). The draw is int32 now, and x64 changes nothing.
  want = connection.select_queries(jax.random.key(4), data, 8)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with jax.enable_x64(True):
      got = connection.select_queries(jax.random.key(4), data, 8)
  np.testing.assert_array_equal(got.query_indices, want.query_indices)
  np.testing.assert_array_equal(got.assignment, want.assignment)


def test_lloyd_reseeds_each_empty_cluster_at_a_different_farthest_point():
  # One Lloyd step from centres 0.5, 10.5, 100, 200 on the line: {0, 1, 2} -> 0.5, {10, 11, 30} -> 10.5, and the
  # last two clusters are empty. They move to the farthest point from its centre (30, distance 19.5) and the
  # second farthest (2, distance 1.5), in that order; the others to their means 1 and 17.
  from jaxdistill.connection._kmeans import _lloyd  # pylint: disable=import-outside-toplevel
  x = jax.numpy.asarray([[0.0], [1.0], [2.0], [10.0], [11.0], [30.0]], jax.numpy.float32)
  init = jax.numpy.asarray([[0.5], [10.5], [100.0], [200.0]], jax.numpy.float32)
  centres, assignment, *_ = _lloyd(x, init, 4, 1, 4)
  np.testing.assert_allclose(np.asarray(centres)[:, 0], [1.0, 17.0, 30.0, 2.0], rtol=1e-6)
  np.testing.assert_array_equal(assignment, [0, 0, 3, 1, 1, 2])  # re-assigned to the moved centres
