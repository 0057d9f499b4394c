"""The declared sensitivities of the connection rules, checked by exhaustive enumeration.

Replace-one neighbours of a small data set are enumerated completely: every
record is replaced by every point of a small integer grid and every label set
of size r. The vote matrix A = sum_i T_i y_i^T is built here with NumPy from
the rules' buckets (independently of :mod:`jaxdistill.mechanisms`), and the
largest L1 change of A is compared with the number each rule declares,
``connection_privacy(...).sensitivity(r)``:

* reverse k-NN declares 2kr: the enumerated maximum must EQUAL 2kr (an
  upper bound that is also attained, so it is neither violated nor loose);
* k-NN labeling declares 2sr: the enumerated maximum must not exceed it.

The grid and the duplicated query make exact distance ties common, so the
tie rules are part of what is checked.
"""

import itertools

import numpy as np
import pytest

from jaxdistill import connection

GRID = np.array(list(itertools.product(range(-2, 3), repeat=2)), np.float32)  # 25 candidate points
QUERIES = np.array([[-2, -2], [2, 2], [2, -2], [0, 1], [0, 1]], np.float32)   # s = 5, one duplicate
RECORDS = np.array([[0, 0], [1, 1], [-1, 2], [2, -1], [0, 1], [-2, 0]], np.float32)
NUM_LABELS = 4


def votes(buckets, label_sets):
  """A [s, |Y|] from buckets [n, c] (-1 pads) and each record's label set."""
  a = np.zeros((len(QUERIES), NUM_LABELS), np.int64)
  for row, labels in zip(np.asarray(buckets), label_sets):
    for t in row[row >= 0]:
      for y in labels:
        a[t, y] += 1
  return a


def max_replace_one_change(buckets_of, r):
  """max over records i, points x' and r-label sets y' of ||A(D) - A(D')||_1."""
  label_choices = list(itertools.combinations(range(NUM_LABELS), r))
  base_labels = [label_choices[i % len(label_choices)] for i in range(len(RECORDS))]
  base = votes(buckets_of(RECORDS), base_labels)
  worst = 0
  for i in range(len(RECORDS)):
    for point in GRID:
      x2 = RECORDS.copy()
      x2[i] = point
      b2 = buckets_of(x2)
      for labels in label_choices:
        y2 = list(base_labels)
        y2[i] = labels
        worst = max(worst, int(np.abs(votes(b2, y2) - base).sum()))
  return worst


@pytest.mark.parametrize("r", [1, 2])
@pytest.mark.parametrize("k", [1, 2])
def test_reverse_knn_sensitivity_is_exactly_2kr(k, r):
  worst = max_replace_one_change(lambda x: connection.reverse_knn(x, QUERIES, k), r)
  assert worst == 2 * k * r
  declared = connection.connection_privacy("reverse-knn", k=k, num_queries=len(QUERIES))
  assert declared.sensitivity(r) == worst


@pytest.mark.parametrize("r", [1, 2])
@pytest.mark.parametrize("k", [1, 3])
def test_knn_labeling_changes_stay_within_2sr(k, r):
  worst = max_replace_one_change(lambda x: connection.knn_labeling(x, QUERIES, k).buckets, r)
  s = len(QUERIES)
  declared = connection.connection_privacy("knn-labeling", k=k, num_queries=s)
  assert declared.sensitivity(r) == 2 * s * r
  assert worst <= 2 * s * r
  # One replacement can move more than 2kr votes: the out-degree to declare is s, not k.
  assert worst > 2 * k * r
