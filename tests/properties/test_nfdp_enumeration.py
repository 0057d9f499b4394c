"""NFDP's privacy claims checked by exact enumeration of every possible sample.

For small n we list every k-subset (WOR), every multiset or every ordered
k-sequence (WR) with its exact probability, for a dataset and its neighbour,
and compute the hockey-stick divergence both ways with the exact toolkit.
This is an oracle independent of the closed forms in ``_nfdp.py``: it must
reproduce them to 1e-12 and never violate the paper's (epsilon, delta).
"""

import itertools
import math
from collections import Counter

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from jaxdistill import accounting

RELATIONS = ["add-one", "remove-one", "add-remove", "replace-one"]


def sample_pmf(records, k, with_replacement, ordered):
  """Exact pmf of the released sample (as records' values) from ``records``."""
  m = len(records)
  pmf = Counter()
  if not with_replacement:
    total = math.comb(m, k)
    for idx in itertools.combinations(range(m), k):
      pmf[tuple(sorted(records[i] for i in idx))] += 1.0 / total
  elif ordered:
    for idx in itertools.product(range(m), repeat=k):
      pmf[tuple(records[i] for i in idx)] += 1.0 / m**k
  else:
    for idx in itertools.combinations_with_replacement(range(m), k):
      counts = Counter(idx).values()
      ways = math.factorial(k)
      for c in counts:
        ways //= math.factorial(c)
      pmf[tuple(sorted(records[i] for i in idx))] += ways / m**k
  return dict(pmf)


def neighbour_pairs(records, relation, new_record):
  """(D, D') pairs for ``relation``; add-remove yields both directions."""
  if relation in ("add-one", "add-remove"):
    yield records, records + [new_record]
  if relation in ("remove-one", "add-remove"):
    yield records, records[:-1]
  if relation == "replace-one":
    yield records, records[:-1] + [new_record]


def exact_delta(records, k, wr, relation, eps, ordered=False):
  pairs = [(sample_pmf(d, k, wr, ordered), sample_pmf(d2, k, wr, ordered))
           for d, d2 in neighbour_pairs(records, relation, new_record=max(records) + 1)]
  return accounting.worst_case_profile(pairs, eps), pairs


@st.composite
def settings_(draw):
  n = draw(st.integers(2, 8))
  wr = draw(st.booleans())
  relation = draw(st.sampled_from(RELATIONS))
  k_max = n if (wr or relation in ("add-one", "replace-one")) else n - 1
  k = draw(st.integers(1, k_max))
  paper_eps, _ = accounting.nfdp_paper_guarantee(n, k, with_replacement=wr)
  eps = draw(st.sampled_from([0.0, paper_eps / 2, paper_eps, 2 * paper_eps, 5.0]) | st.floats(0, 8))
  ordered = wr and draw(st.booleans()) and n**k <= 4096
  return n, k, wr, relation, eps, ordered


@given(settings_())
def test_enumeration_reproduces_flat_profile_and_paper_pairs(setting):
  n, k, wr, relation, eps, ordered = setting
  records = list(range(n))  # distinct records: the worst case
  delta, _ = exact_delta(records, k, wr, relation, eps, ordered)
  report = accounting.nfdp_privacy(n, k, with_replacement=wr, relation=relation)
  # Closed form reproduced to 1e-12 (float64 sums of at most a few thousand terms).
  assert abs(delta - report.delta_for_epsilon(eps)) <= 1e-12
  # The paper's pair is never violated.
  paper_eps, paper_delta = accounting.nfdp_paper_guarantee(n, k, with_replacement=wr)
  delta_at_paper, _ = exact_delta(records, k, wr, relation, paper_eps, ordered)
  assert delta_at_paper <= paper_delta + 1e-12


@given(settings_())
def test_epsilon_is_infinite_below_the_flat_delta(setting):
  n, k, wr, relation, _, ordered = setting
  records = list(range(n))
  _, pairs = exact_delta(records, k, wr, relation, 0.0, ordered)
  report = accounting.nfdp_privacy(n, k, with_replacement=wr, relation=relation)
  p = report.flat_delta
  worst_below = max(accounting.epsilon_for_delta(a, b, p * (1 - 1e-9)) for a, b in pairs)
  worst_at = max(accounting.epsilon_for_delta(a, b, min(1.0, p * (1 + 1e-9))) for a, b in pairs)
  assert worst_below == math.inf and report.epsilon_for_delta(p * (1 - 1e-9)) == math.inf
  assert worst_at == 0.0 and report.epsilon_for_delta(p) == 0.0


@given(st.lists(st.integers(0, 2), min_size=3, max_size=7), st.integers(1, 3), st.booleans(),
       st.sampled_from(RELATIONS), st.floats(0, 3))
def test_duplicated_records_are_never_worse(records, k, wr, relation, eps):
  n = len(records)
  assume(wr or k <= n - 1)
  delta, _ = exact_delta(records, k, wr, relation, eps)
  report = accounting.nfdp_privacy(n, k, with_replacement=wr, relation=relation)
  assert delta <= report.delta_for_epsilon(eps) + 1e-12


@pytest.mark.parametrize("n,k,wr", [(4, 2, False), (6, 3, False), (8, 3, False),
                                    (4, 2, True), (6, 3, True), (8, 3, True)])
def test_spec_table_values(n, k, wr):
  # spec/NFDP.md §1.1 table (add / remove / replace), computed there by enumeration.
  expected = {
      (4, 2, False): (0.400, 0.500, 0.500), (6, 3, False): (3 / 7, 0.500, 0.500),
      (8, 3, False): (1 / 3, 0.375, 0.375), (4, 2, True): (0.360, 0.4375, 0.4375),
      (6, 3, True): (1 - (6 / 7)**3, 1 - (5 / 6)**3, 1 - (5 / 6)**3),
      (8, 3, True): (1 - (8 / 9)**3, 1 - (7 / 8)**3, 1 - (7 / 8)**3),
  }[(n, k, wr)]
  for rel, want in zip(["add-one", "remove-one", "replace-one"], expected):
    got, _ = exact_delta(list(range(n)), k, wr, rel, 0.7)
    assert got == pytest.approx(want, abs=1e-12)


def test_directional_detail_wor_remove():
  # spec §1.1: n=6, k=3, WOR, remove: H(D||D') = 0.5 at every eps, H(D'||D) = 0.5, 0.125, 0.
  p = sample_pmf(list(range(6)), 3, False, False)
  q = sample_pmf(list(range(5)), 3, False, False)
  paper_eps, _ = accounting.nfdp_paper_guarantee(6, 3)
  for eps in (0.0, paper_eps, 1.0):
    assert accounting.hockey_stick_divergence(p, q, eps) == pytest.approx(0.5, abs=1e-12)
  assert accounting.hockey_stick_divergence(q, p, 0.0) == pytest.approx(0.5, abs=1e-12)
  assert accounting.hockey_stick_divergence(q, p, paper_eps) == pytest.approx(0.125, abs=1e-12)
  assert accounting.hockey_stick_divergence(q, p, 1.0) == pytest.approx(0.0, abs=1e-12)
