"""The exact toolkit: hockey-stick divergence, profiles and their inverse."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxdistill import accounting


def rr_pmfs(eps0, k):
  """k-ary randomized response on inputs 0 and 1."""
  keep = math.exp(eps0) / (math.exp(eps0) + k - 1)
  other = 1 / (math.exp(eps0) + k - 1)
  p = np.full(k, other)
  q = np.full(k, other)
  p[0], q[1] = keep, keep
  return p, q


def test_hockey_stick_by_hand():
  # max(0, .5-.25) + max(0, .5-.75) = .25 at gamma = 1; at gamma = 2: 0 + 0.
  assert accounting.hockey_stick_divergence([0.5, 0.5], [0.25, 0.75], 0.0) == 0.25
  assert accounting.hockey_stick_divergence([0.5, 0.5], [0.25, 0.75], math.log(2)) == pytest.approx(0.0)
  # Mapping form with disjoint supports: all of p's mass counts at any epsilon.
  assert accounting.hockey_stick_divergence({"a": 1.0}, {"b": 1.0}, 10.0) == 1.0


@pytest.mark.parametrize("eps", [709.0, 710.0, 800.0, math.inf])
def test_huge_and_infinite_epsilon_count_only_mass_where_q_is_zero(eps):
  # e^eps overflows from ~709.8: the divergence must stay the mass of p where q = 0 (not NaN).
  with np.errstate(all="raise"):
    assert accounting.hockey_stick_divergence([0.5, 0.5], [1.0, 0.0], eps) == 0.5
    assert accounting.privacy_profile([0.5, 0.5, 0.0], [0.5, 0.5, 0.0], eps) == 0.0
    np.testing.assert_array_equal(accounting.worst_case_profile([([0.5, 0.5], [1.0, 0.0])], [1.0, eps]),
                                  [0.5, 0.5])


@given(st.floats(0.05, 5), st.integers(2, 6), st.floats(0, 6))
def test_pure_dp_rr_profile(eps0, k, eps):
  # RR is eps0-DP: delta(eps) = 0 for eps >= eps0, and > 0 below it.
  p, q = rr_pmfs(eps0, k)
  d = accounting.privacy_profile(p, q, eps)
  keep = math.exp(eps0) / (math.exp(eps0) + k - 1)
  other = 1 / (math.exp(eps0) + k - 1)
  assert d == pytest.approx(max(0.0, keep - math.exp(eps) * other), abs=1e-14)


@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=8),
       st.lists(st.floats(0.0, 1.0), min_size=2, max_size=8), st.floats(0, 1))
def test_epsilon_for_delta_inverts_profile(a, b, delta):
  n = min(len(a), len(b))
  p = np.array(a[:n]) + 1e-3
  q = np.array(b[:n]) + 1e-3
  p, q = p / p.sum(), q / q.sum()
  eps = accounting.epsilon_for_delta(p, q, delta)
  assert math.isfinite(eps)
  # delta(eps) <= delta at the answer, and > delta just below it (minimality).
  assert accounting.privacy_profile(p, q, eps) <= delta + 1e-12
  if eps > 1e-9:
    assert accounting.privacy_profile(p, q, eps * (1 - 1e-6) - 1e-12) > delta - 1e-12


def test_epsilon_for_delta_infinite_when_support_differs():
  assert accounting.epsilon_for_delta({"x": 0.3, "y": 0.7}, {"y": 1.0}, 0.29) == math.inf
  assert accounting.epsilon_for_delta({"x": 0.3, "y": 0.7}, {"y": 1.0}, 0.3) == pytest.approx(0.0)


@pytest.mark.parametrize("bad", [[-0.1, 1.1], [float("nan"), 1.0], [0.7, 0.7]])
def test_bad_pmfs_rejected(bad):
  with pytest.raises(ValueError, match="p"):
    accounting.hockey_stick_divergence(bad, [0.5, 0.5], 0.0)


@pytest.mark.parametrize("p,q,name", [(["0.5", "0.5"], [0.5, 0.5], "p"), ([0.5, 0.5], [True, False], "q"),
                                      ({"a": "1"}, {"a": 1.0}, "p"), ({"a": 1.0}, {"a": None}, "q")])
def test_pmfs_given_as_text_or_bools_are_refused(p, q, name):
  with pytest.raises(ValueError, match=f"Expected {name}"):
    accounting.hockey_stick_divergence(p, q, 0.0)


def test_shape_mismatch_and_bad_epsilon():
  with pytest.raises(ValueError, match="shape"):
    accounting.privacy_profile([1.0], [0.5, 0.5], 0.0)
  with pytest.raises(ValueError, match="epsilon"):
    accounting.privacy_profile([1.0], [1.0], -1.0)
  with pytest.raises(ValueError, match="delta"):
    accounting.epsilon_for_delta([1.0], [1.0], 1.5)


@pytest.mark.parametrize("fn,name", [(accounting.hockey_stick_divergence, "epsilon"),
                                     (accounting.privacy_profile, "epsilons")])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), "one", [0.0, -0.5], "1", ["0.5"], True])
def test_bad_epsilons_name_the_parameter(fn, name, bad):
  with pytest.raises(ValueError, match=f"Expected {name} "):
    fn([0.5, 0.5], [0.25, 0.75], bad)


@pytest.mark.parametrize("pairs, needle", [
    (None, r"^Expected pairs to be an iterable of \(p, q\) pmf pairs; got NoneType\.$"),  # a TypeError
    (5, r"^Expected pairs to be an iterable of \(p, q\) pmf pairs; got int\.$"),  # a TypeError
    ("ab", r"^Expected pairs to be an iterable .*got str\.$"),  # "not enough values to unpack"
    ({"a": 1}, r"^Expected pairs to be an iterable .*got dict\.$"),
    ([([0.5, 0.5],)], r"^Expected pairs\[0\] to be a pair \(p, q\) of pmfs; got 1 item\(s\)\.$"),
    ([([1.0], [1.0]), ([0.5], [0.5], [1.0])], r"^Expected pairs\[1\] to be a pair .*got 3 item\(s\)\.$"),
    ([([1.0], [1.0]), None], r"^Expected pairs\[1\] to be a pair .*got NoneType\.$"),
    ([([float("nan")], [1.0])], r"^Expected pairs\[0\] to be a pair of pmfs: Expected p to hold finite"),
    ([], r"^Expected at least one neighbouring pair in pairs\.$"),
])
def test_worst_case_profile_names_bad_pairs(pairs, needle):
  with pytest.raises(ValueError, match=needle):
    accounting.worst_case_profile(pairs, [0.0, 1.0])


def test_a_bad_epsilon_is_shown_alone_not_with_the_whole_input():
  # The message held repr(epsilons): a list of 10^5 epsilons made one line of 600 kB.
  with pytest.raises(ValueError, match=r"^Expected epsilons >= 0; got -1\.0 \(among 100000 values\)\.$"):
    accounting.worst_case_profile([([1.0], [1.0])], [0.0] * 99_999 + [-1.0])
  with pytest.raises(ValueError, match=r"^Expected epsilon >= 0; got nan\.$"):
    accounting.hockey_stick_divergence([1.0], [1.0], math.nan)


def test_many_epsilons_on_many_outcomes_are_summed_in_blocks(monkeypatch):
  # 10^5 epsilons x 10^5 outcomes asked for one (epsilons x outcomes) array of 74.5 GiB: a MemoryError. The sums
  # are now formed in blocks of at most MAX_BLOCK_ENTRIES entries, each row the same sum as in one block.
  from jaxdistill.accounting import _exact  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  p, q = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7))
  eps = np.concatenate([rng.exponential(0.5, 40), [0.0, math.inf]])
  whole = accounting.worst_case_profile([(p, q), (q[::-1], p[::-1])], eps)
  shapes = []
  one_block = _exact._one_block  # pylint: disable=protected-access
  monkeypatch.setattr(_exact, "_one_block", lambda p_, q_, e_: shapes.append(len(e_)) or one_block(p_, q_, e_))
  monkeypatch.setattr(_exact, "MAX_BLOCK_ENTRIES", 7 * 5 + 3)  # 5 epsilons of 7 outcomes per block
  np.testing.assert_array_equal(accounting.worst_case_profile([(p, q), (q[::-1], p[::-1])], eps), whole)
  assert max(shapes) == 5 and sum(shapes) == 4 * len(eps)  # 2 pairs x 2 directions
