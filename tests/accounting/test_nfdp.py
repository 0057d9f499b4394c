"""NFDP closed forms, warnings, composition across rounds and with other PLDs."""

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from jaxdistill import accounting


def test_theorem_formulas_independently():
  # Theorems 1 and 2 written out directly (spec/NFDP.md §1).
  n, k = 2880, 3
  assert accounting.nfdp_paper_guarantee(n, k) == pytest.approx(
      (math.log((n + 1) / (n + 1 - k)), k / n), rel=1e-14)
  assert accounting.nfdp_paper_guarantee(n, k, with_replacement=True) == pytest.approx(
      (k * math.log((n + 1) / n), 1 - ((n - 1) / n)**k), rel=1e-12)


@pytest.mark.parametrize("n,k", [(2880, 3), (2880, 16), (300, 3), (300, 16), (28800, 3), (3000, 16)])
def test_wr_is_slightly_more_private_by_about_k_choose_2_over_n2(n, k):
  wor = accounting.nfdp_privacy(n, k).flat_delta
  wr = accounting.nfdp_privacy(n, k, with_replacement=True).flat_delta
  assert wr < wor
  # 1-(1-1/n)^k = k/n - C(k,2)/n^2 + O(k^3/n^3).
  assert wor - wr == pytest.approx(math.comb(k, 2) / n**2, rel=3 * k / n)


def test_spec_paper_settings_table():
  # spec/NFDP.md §1.2, rounded as printed there.
  cases = [(2880, 3, False, 1.04e-3), (2880, 16, False, 5.56e-3), (2880, 16, True, 5.54e-3),
           (300, 3, False, 1.00e-2), (300, 3, True, 9.97e-3), (300, 16, False, 5.33e-2),
           (300, 16, True, 5.20e-2), (28800, 3, False, 1.04e-4)]
  for n, k, wr, delta in cases:
    rep = accounting.nfdp_privacy(n, k, with_replacement=wr)
    assert rep.flat_delta == pytest.approx(delta, rel=5e-3)
    assert rep.paper_pair_holds()
  # Paper's epsilon at CIFAR N=10, k=16: 5.46e-2 (WOR) and 5.32e-2 (WR).
  assert accounting.nfdp_paper_guarantee(300, 16)[0] == pytest.approx(5.46e-2, rel=2e-3)
  assert accounting.nfdp_paper_guarantee(300, 16, with_replacement=True)[0] == pytest.approx(5.32e-2, rel=2e-3)


def test_warning_when_delta_at_least_one_over_n():
  rep = accounting.nfdp_privacy(300, 16)
  codes = {w.code: w for w in rep.warnings}
  assert "delta_at_least_1_over_n" in codes and "paper_epsilon_vacuous" in codes
  w = codes["delta_at_least_1_over_n"].to_dict()
  assert w["details"]["records_exposed"] == pytest.approx(16.0)
  assert w["details"]["one_over_n"] == pytest.approx(1 / 300)
  # WR exposes the expected number of distinct records n(1-(1-1/n)^k).
  wr = accounting.nfdp_privacy(300, 16, with_replacement=True)
  assert wr.records_exposed == pytest.approx(300 * (1 - (299 / 300)**16), rel=1e-12)


def test_no_one_over_n_warning_when_delta_is_small():
  # Under add/remove or replace-one p >= 1/n for every k >= 1. Only add-one,
  # where the record joins n others, gets below: k = 1 gives p = 1/(n + 1) < 1/n.
  rep = accounting.nfdp_privacy(10, 1, with_replacement=True, relation="add-one")
  assert rep.flat_delta == pytest.approx(1 / 11)
  assert "delta_at_least_1_over_n" not in {w.code for w in rep.warnings}


def test_composition_across_rounds():
  n, k = 2880, 3
  reused = accounting.nfdp_privacy(n, k, rounds=20)
  fresh = accounting.nfdp_privacy(n, k, rounds=20, resample_each_round=True)
  assert reused.flat_delta == pytest.approx(k / n)
  assert fresh.flat_delta == pytest.approx(1 - (1 - k / n)**20, rel=1e-12)
  assert fresh.flat_delta == pytest.approx(0.0206, rel=1e-2)  # spec §1.2: 0.0206 at p ~ 1.04e-3
  warning, = (w for w in fresh.warnings if w.code == "resampled_each_round")
  assert "does not hold for these 20 rounds" in warning.message
  assert warning.details["paper_delta"] == fresh.paper_delta == pytest.approx(k / n)
  assert fresh.flat_delta > 6 * fresh.paper_delta  # 0.0206 against 1.04e-3: the warning's claim is true
  assert not fresh.paper_pair_holds()
  # dp-accounting's PLD composition of R flat profiles agrees.
  pld = reused.to_pld()
  composed = pld.self_compose(20)
  assert composed.get_delta_for_epsilon(0.5) == pytest.approx(fresh.flat_delta, rel=1e-9)


def test_resampling_warning_claims_the_paper_pair_fails_only_when_it_does():
  # Add-one with k = n: the paper's delta is 1, which 2 fresh samples (delta 0.972) cannot break.
  trivial = accounting.nfdp_privacy(5, 5, rounds=2, resample_each_round=True, relation="add-one")
  broken = accounting.nfdp_privacy(5, 4, rounds=2, resample_each_round=True, relation="add-one")
  for rep, holds in ((trivial, True), (broken, False)):
    warning, = (w for w in rep.warnings if w.code == "resampled_each_round")
    assert rep.paper_pair_holds() is holds
    assert (rep.flat_delta > rep.paper_delta) is not holds
    assert ("does not hold" in warning.message) is not holds


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 3.0])
def test_composition_with_gaussian_through_pld(eps):
  # Exact: delta(eps) = p + (1 - p) delta_G(eps) (mass p reveals everything).
  rep = accounting.nfdp_privacy(300, 3)
  g = pld_lib.from_gaussian_mechanism(2.0, value_discretization_interval=1e-4)
  both = rep.to_pld().compose(g)
  want = rep.flat_delta + (1 - rep.flat_delta) * g.get_delta_for_epsilon(eps)
  assert both.get_delta_for_epsilon(eps) == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_flat_profile_pld_is_flat():
  rep = accounting.nfdp_privacy(2880, 3)
  pld = rep.to_pld()
  for eps in (0.0, 0.01, 1.0, 10.0):
    assert pld.get_delta_for_epsilon(eps) == pytest.approx(rep.flat_delta, rel=1e-12)
  assert pld.get_epsilon_for_delta(rep.flat_delta * 0.99) == math.inf


@pytest.mark.parametrize("kwargs,name", [
    (dict(n=0, k=1), "n"), (dict(n=5, k=0), "k"), (dict(n=5, k=6), "k"),
    (dict(n=5, k=5), "k"),  # add-remove needs k <= n - 1 WOR
    (dict(n=5.5, k=1), "n"), (dict(n=float("nan"), k=1), "n"), (dict(n="5", k=1), "n"),
    (dict(n=5, k=2, rounds=0), "rounds"), (dict(n=5, k=2, relation="swap"), "relation"),
])
def test_bad_input(kwargs, name):
  with pytest.raises(ValueError, match=name):
    accounting.nfdp_privacy(**kwargs)


def test_statement_records_relation_and_warnings():
  st = accounting.nfdp_privacy(300, 3, relation="replace-one").statement(epsilon=0.5)
  d = st.to_dict()
  assert d["relation"] == "replace-one" and d["delta"] == pytest.approx(0.01)
  assert any(w["code"] == "delta_at_least_1_over_n" for w in d["warnings"])


@pytest.mark.parametrize("fn", [accounting.nfdp_paper_guarantee, accounting.nfdp_inclusion_probability,
                                accounting.nfdp_privacy])
def test_with_replacement_must_be_a_bool(fn):
  # A truthy string must not silently switch to Theorem 2's sampler.
  with pytest.raises(ValueError, match="with_replacement"):
    fn(300, 3, with_replacement="no")


@pytest.mark.parametrize("n,k", [(10**400, 3), (10**19, 3)])
def test_n_beyond_the_cap_is_refused_not_reported_as_delta_zero(n, k):
  # n = 10^400 returned (0.0, 0.0): k/n underflowed, a false claim that no record is exposed.
  for fn in (accounting.nfdp_paper_guarantee, accounting.nfdp_inclusion_probability, accounting.nfdp_privacy):
    with pytest.raises(ValueError, match=r"n=\d+ <= 1000000000000000000"):
      fn(n, k)


def test_largest_n_gives_a_positive_delta_and_epsilon():
  n, k = 10**18, 3
  eps, delta = accounting.nfdp_paper_guarantee(n, k)
  assert delta == pytest.approx(3e-18, rel=1e-12, abs=0)
  # ln((n+1)/(n+1-k)) = k/(n+1-k) - ...; the ratio itself rounds to 1 in float64.
  assert eps == pytest.approx(k / (n + 1 - k), rel=1e-12, abs=0)
  assert accounting.nfdp_privacy(n, k).flat_delta == pytest.approx(3e-18, rel=1e-12, abs=0)


@pytest.mark.parametrize("call,name", [
    (lambda: accounting.nfdp_paper_guarantee(10, 10**400, with_replacement=True), "k"),
    (lambda: accounting.nfdp_privacy(10, 10**400, with_replacement=True), "k"),
    (lambda: accounting.nfdp_privacy(10, 3, rounds=10**400, resample_each_round=True), "rounds"),
])
def test_huge_integers_are_refused_by_name(call, name):
  # These raised OverflowError("int too large to convert to float").
  with pytest.raises(ValueError, match=rf"{name}=\d+ <= 1000000000000000000"):
    call()


@pytest.mark.parametrize("bad", [0.0, -1.0, "x", float("nan"), float("inf")])
def test_to_pld_grid_step_is_validated(bad):
  # 0.0 raised ZeroDivisionError, "x" TypeError, NaN an unnamed ValueError, -1.0 was accepted.
  with pytest.raises(ValueError, match="value_discretization_interval"):
    accounting.nfdp_privacy(10, 3).to_pld(bad)


@pytest.mark.parametrize("field,value", [
    ("flat_delta", 2.0), ("paper_delta", -0.1), ("inclusion_probability", float("nan")),
    ("paper_epsilon", -1.0), ("n", 0), ("rounds", 2.5), ("relation", "swap"), ("with_replacement", "no")])
def test_hand_built_report_is_validated(field, value):
  good = accounting.nfdp_privacy(10, 3)
  fields = {f: getattr(good, f) for f in good.__dataclass_fields__}
  accounting.NfdpPrivacy(**fields)  # the report nfdp_privacy builds passes
  with pytest.raises(ValueError, match=field):
    accounting.NfdpPrivacy(**{**fields, field: value})
