"""Appendix C's balanced rules: degree bound, objective gains, and the I8 privacy failure."""

import numpy as np
import pytest

from jaxdistill import connection, mechanisms


def skewed_example(seed=0, n=120, s=8, d=2):
  """Records crowd around query 0; the other queries are far from most records."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(s, d)).astype(np.float32) * 4
  x = (q[0] + rng.normal(size=(n, d))).astype(np.float32)
  return x, q


def scores_of(conn, x, q):
  return connection.balanced_scores(conn.buckets, x, q, bandwidth=conn.diagnostics["bandwidth"])


def independent_scores(buckets, x, q, h):
  """Score(q_t) = sum of 1 / (1 + ||q_t - x||^2 / h) over the records linked to q_t (reference)."""
  out = np.zeros(len(q))
  for i, row in enumerate(np.asarray(buckets)):
    for t in row:
      if t >= 0:
        out[t] += 1.0 / (1.0 + float(np.sum((x[i].astype(np.float64) - q[t]) ** 2)) / h)
  return out


@pytest.mark.parametrize("objective", ["max-min", "harmonic"])
@pytest.mark.parametrize("k", [1, 3])
def test_degree_bound_and_objective_improves_over_reverse_knn(objective, k):
  x, q = skewed_example()
  conn = connection.balanced_connection(x, q, k, objective=objective)  # L = s = 8 candidates
  b = conn.buckets
  assert b.shape == (120, k) and b.min() >= 0
  assert all(len(set(row)) == k for row in b.tolist())  # degree exactly k <= k, distinct queries
  h = conn.diagnostics["bandwidth"]
  after = independent_scores(b, x, q, h)
  before = independent_scores(connection.reverse_knn(x, q, k), x, q, h)
  np.testing.assert_allclose(scores_of(conn, x, q), after, rtol=1e-9)
  assert conn.diagnostics["converged"]
  if objective == "max-min":
    assert after.min() > before.min() + 1e-3
  else:
    harmonic = lambda v: len(v) / np.sum(1.0 / v) if np.all(v > 0) else 0.0
    assert harmonic(after) > harmonic(before) + 1e-3
  # Reverse k-NN maximises the arithmetic mean, so the balanced rule cannot beat it there.
  assert after.mean() <= before.mean() + 1e-9


def test_max_min_local_optimum_no_single_move_helps():
  x, q = skewed_example(seed=1)
  conn = connection.balanced_connection(x, q, 1, objective="max-min")
  h = conn.diagnostics["bandwidth"]
  base = independent_scores(conn.buckets, x, q, h)
  low = base.min()
  t_low = int(np.argmin(base))
  # No record can move its single edge to the lowest query while keeping its donor above the min.
  for i in range(len(x)):
    src = int(conn.buckets[i, 0])
    if src == t_low:
      continue
    w_src = 1.0 / (1.0 + np.sum((x[i].astype(np.float64) - q[src]) ** 2) / h)
    assert base[src] - w_src <= low + 1e-4


def test_balanced_rule_couples_records_and_breaks_the_2kr_sensitivity():
  """Demonstration of spec I8: changing record 0 re-routes record j != 0 under max-min."""
  q = np.array([[0.0], [10.0]], np.float32)
  x = np.array([[1.0], [2.0], [3.0]], np.float32)
  labels = np.array([0, 1, 2])
  k = 1
  opts = dict(objective="max-min", bandwidth=1.0)
  before = connection.balanced_connection(x, q, k, **opts)
  x2 = x.copy()
  x2[0] = [9.5]  # only record 0 changes
  after = connection.balanced_connection(x2, q, k, **opts)
  others_changed = np.any(before.buckets[1:] != after.buckets[1:])
  assert others_changed, (before.buckets.tolist(), after.buckets.tolist())
  # Reverse k-NN on the same pair changes record 0's edge only.
  r1 = np.asarray(connection.reverse_knn(x, q, k))
  r2 = np.asarray(connection.reverse_knn(x2, q, k))
  np.testing.assert_array_equal(r1[1:], r2[1:])

  def votes(conn):
    inp, shape = mechanisms.make_bsvs_input(conn.buckets, labels, num_buckets=2, num_labels=3)
    return np.asarray(mechanisms.bsvs_counts(inp, shape))

  change = np.abs(votes(before) - votes(after)).sum()
  assert change > mechanisms.bsvs_sensitivity(k)  # more than 2kr: the reverse-k-NN bound fails
  assert not before.privacy.dp_valid and before.privacy.sensitivity() is None
  assert before.privacy.warnings[0].code == "balanced_connection_no_dp"
  # bsvs_input gave these votes the shape of a 2kr mechanism, whose statement would then be false.
  with pytest.raises(ValueError, match=r"rule='balanced-max-min' has none") as err:
    before.bsvs_input(labels, num_labels=3)
  assert "\n" not in str(err.value)


def test_privacy_statements_say_what_each_rule_guarantees():
  r = connection.connection_privacy("reverse-knn", k=3, num_queries=40)
  assert r.dp_valid and r.per_record and r.shape_k == 3 and r.sensitivity(r=2) == 12
  assert set(r.models) == {"central", "local", "shuffle"} and not r.warnings
  kl = connection.connection_privacy("knn-labeling", k=3, num_queries=40)
  assert kl.dp_valid and not kl.per_record and kl.shape_k == 40 and kl.sensitivity() == 80
  assert kl.models == ("central",)
  assert "knn_labeling_sensitivity_grows_with_s" in {w.code for w in kl.warnings}
  for rule in ("balanced-max-min", "balanced-harmonic"):
    b = connection.connection_privacy(rule, k=3, num_queries=40)
    assert not b.dp_valid and b.models == () and b.sensitivity() is None
    d = b.to_dict()
    assert d["warnings"][0]["code"] == "balanced_connection_no_dp" and "I8" in d["warnings"][0]["message"]
    # A record takes k distinct queries, so k > s is a set-up the rule refuses: its statement did not.
    with pytest.raises(ValueError, match=r"^Expected k=41 <= num_queries=40\.$"):
      connection.connection_privacy(rule, k=41, num_queries=40)
  assert connection.connection_privacy("knn-labeling", k=41, num_queries=40).shape_k == 40  # k records per query


def test_connect_dispatches_by_name():
  x, q = skewed_example()
  for rule in connection.RULES:
    conn = connection.connect(rule, x, q, 1)
    assert conn.rule == rule and conn.num_queries == 8


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=0), "k=0"),
    (dict(k=9), "k=9"),
    (dict(k=1, objective="mean"), "objective"),
    (dict(k=2, num_candidates=1), "num_candidates"),
    (dict(k=1, num_candidates=9), "num_candidates"),
    (dict(k=1, bandwidth=0.0), "bandwidth"),
    (dict(k=1, max_moves=-1), "max_moves"),
])
def test_balanced_bad_input(kwargs, match):
  x, q = skewed_example(n=20, s=8)
  with pytest.raises(ValueError, match=match):
    connection.balanced_connection(x, q, **kwargs)


def test_balanced_scores_refuse_buckets_outside_the_queries():
  x = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
  for buckets, match in ((np.full((6, 1), 5), r"buckets in \[0, s=2\) or -1 \(padding\); found values in \[5, 5\]"),
                         (np.full((6, 1), -2), r"found values in \[-2, -2\]"),
                         (np.zeros((5, 1), np.int32), r"int shape \[n=6, k\]"),
                         (np.zeros((6, 1), np.float32), "int shape"),
                         (np.array([[0, 1], [1, 1], [0, -1], [0, 1], [1, 0], [0, 1]]),
                          r"distinct buckets per record .* record 1 has \[1, 1\]")):
    with pytest.raises(ValueError, match=match):
      connection.balanced_scores(buckets, x, x[:2], bandwidth=1.0)
  scores = connection.balanced_scores(np.array([[0], [1], [-1], [0], [1], [0]]), x, x[:2], bandwidth=1.0)
  assert scores.shape == (2,) and scores[0] > 0 and scores[1] > 0  # padding (-1) is skipped
  # Two padding entries in a row are not duplicates.
  assert connection.balanced_scores(np.array([[0, -1, -1]] * 6), x, x[:2], bandwidth=1.0)[1] == 0.0


def test_balanced_scores_are_float64_even_without_edges():
  # With no edge at all np.bincount returned int64 zeros.
  rng = np.random.default_rng(0)
  x, q = rng.normal(size=(6, 3)), rng.normal(size=(4, 3))
  for buckets in (np.zeros((6, 0), np.int32), np.full((6, 2), -1, np.int32), np.zeros((6, 1), np.int32)):
    scores = connection.balanced_scores(buckets, x, q, bandwidth=1.0)
    assert scores.dtype == np.float64 and scores.shape == (4,)
  assert not connection.balanced_scores(np.full((6, 2), -1), x, q, bandwidth=1.0).any()


def test_max_moves_beyond_the_int32_counter_is_refused_by_name():
  x = np.random.default_rng(0).random((20, 3)).astype(np.float32)
  with pytest.raises(ValueError, match="max_moves=2147483648 <= 2147483647"):  # an OverflowError before
    connection.balanced_connection(x, x[:4], 1, max_moves=2**31)


def test_connect_names_options_the_rule_does_not_take():
  # A TypeError from the rule's signature before; the balanced rules take their objective from the rule's name.
  x = np.random.default_rng(0).random((20, 3)).astype(np.float32)
  for rule, bad in (("reverse-knn", "objective"), ("knn-labeling", "max_moves"), ("balanced-harmonic", "objective")):
    with pytest.raises(ValueError, match=rf"options of rule='{rule}' among .*; got \['{bad}'\]"):
      connection.connect(rule, x, x[:4], 1, **{bad: 1})
  got = connection.connect("balanced-max-min", x, x[:4], 1, max_moves=0)
  want = connection.connect("reverse-knn", x, x[:4], 1)
  np.testing.assert_array_equal(got.buckets, want.buckets)  # no moves: the reverse 1-NN start
