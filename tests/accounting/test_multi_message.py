"""Input checks of the multi-message shuffle accounting (its numbers: tests/mechanisms/test_shuffle_multi.py)."""

import math
import re
import warnings

import numpy as np
import pytest

from jaxdistill import accounting

NOISE = accounting.MultiMessageNoise(0.5, 1.0, 0.5)


def test_rtol_below_float64_resolution_is_refused():
  # Once the rho bracket's ends were adjacent floats the bisection never ended.
  with pytest.raises(ValueError, match=r"rtol=1e-17 >= 1e-15"):
    accounting.calibrate_multi_message(1.0, 1e-6, rtol=1e-17, flood_multipliers=(1.0,))


def test_finest_rtol_terminates_and_meets_the_target():
  noise = accounting.calibrate_multi_message(1.0, 1e-6, rtol=1e-15, flood_multipliers=(1.0,))
  coarse = accounting.calibrate_multi_message(1.0, 1e-6, flood_multipliers=(1.0,))
  assert noise.rho == pytest.approx(coarse.rho, rel=2e-3)
  assert accounting.multi_message_delta(noise, 1.0) <= 1e-6


def test_delta_below_the_float64_floor_is_refused_once_delta_stops_falling():
  # delta = 1e-300 used to double rho up to the view's outcome cap for every flood multiplier (61 s for the
  # four defaults) before refusing. Here p = p' = e^-0.5 (a = b = 0.5 at eps = 2, multiplier 1).
  with pytest.raises(ValueError, match=r"stopped falling at \S+ \(rho=\d+\)") as err:
    accounting.calibrate_multi_message(2.0, 1e-300, flood_multipliers=(1.0,))
  rho = float(re.search(r"\(rho=(\d+)\)", str(err.value)).group(1))
  # The refusal is warranted: 4 and 16 times that flooding still leave delta(2) near 5e-16 (float64 rounding),
  # hundreds of orders of magnitude above the target.
  for more in (4, 16):
    noise = accounting.MultiMessageNoise(math.exp(-0.5), more * rho, math.exp(-0.5))
    assert 1e-17 < accounting.multi_message_delta(noise, 2.0) < 1e-14
  # A target just above the floor is still reached: the stall check refuses only what doubling cannot reach.
  noise = accounting.calibrate_multi_message(2.0, 5e-16, flood_multipliers=(1.0,))
  assert accounting.multi_message_delta(noise, 2.0) <= 5e-16


@pytest.mark.parametrize("rho", [1e25, 1e30, 1e300])
def test_flooding_beyond_the_view_cap_is_refused_before_scipy(rho):
  # SciPy's nbinom.isf never returned for these (the flooding's mean alone is rho).
  noise = accounting.MultiMessageNoise(0.5, rho, 0.5)
  with pytest.raises(ValueError, match=r"outcomes at tail mass.*rho="):
    accounting.multi_message_delta(noise, 1.0)
  with pytest.raises(ValueError, match=r"rho="):
    accounting.multi_message_epsilon(noise, 1e-6)


@pytest.mark.parametrize("call,name", [
    (lambda: accounting.multi_message_expected_messages(NOISE, num_clients=1, d=10**400, c=1), "d"),
    (lambda: accounting.multi_message_expected_messages(NOISE, num_clients=10**400, d=10, c=1), "num_clients"),
    (lambda: accounting.multi_message_expected_messages(NOISE, num_clients=1, d=10, c=10**400), "c"),
    (lambda: accounting.min_calibration_epsilon(k=10**400), "k"),
    (lambda: accounting.min_calibration_epsilon(r=10**400), "r"),
])
def test_huge_integers_are_refused_by_name(call, name):
  # These raised OverflowError("int too large to convert to float").
  with pytest.raises(ValueError, match=rf"\b{name}=\d+ <= 1000000000000000000"):
    call()


def test_largest_counts_are_still_computed():
  d = 10**18
  got = accounting.multi_message_expected_messages(NOISE, num_clients=1, d=d, c=0)
  assert got == pytest.approx(2.0 * d * 0.5 / 0.5 + 2.0 * d * 1.0 * 0.5 / 0.5, rel=1e-12)


def test_noise_must_be_a_multi_message_noise():
  # None raised AttributeError.
  with pytest.raises(ValueError, match="noise"):
    accounting.multi_message_expected_messages(None, num_clients=1, d=10, c=1)
  with pytest.raises(ValueError, match="noise"):
    accounting.multi_message_delta(None, 1.0)


def test_grid_step_too_fine_for_the_grid_cap_is_coarsened(monkeypatch):
  # 1e-300 raised MemoryError inside dp-accounting; then any step finer than the cap allows was refused, although
  # 1e-6 computed fine. It is coarsened to fit, as MechanismAccount does: still an upper bound. (The cap is made
  # small here so the coarsened grid is cheap.)
  from jaxdistill.accounting import _multi_message  # pylint: disable=import-outside-toplevel
  fine = accounting.multi_message_delta(NOISE, 1.0, value_discretization_interval=1e-6)
  monkeypatch.setattr(_multi_message, "MAX_GRID_POINTS", 20_000)
  _multi_message._cached_pld.cache_clear()  # pylint: disable=protected-access
  try:
    capped = [accounting.multi_message_delta(NOISE, 1.0, value_discretization_interval=v) for v in (1e-300, 1e-12)]
  finally:
    _multi_message._cached_pld.cache_clear()  # pylint: disable=protected-access
  # Both steps coarsen to the same grid; a pessimistic PLD on it bounds the fine one from above, and not loosely.
  assert capped[0] == capped[1] and fine * (1 - 1e-9) <= capped[0] <= 1.5 * fine


def test_fine_grid_step_inside_the_cap_still_works():
  coarse = accounting.multi_message_delta(NOISE, 1.0)
  fine = accounting.multi_message_delta(NOISE, 1.0, value_discretization_interval=1e-6)
  assert 0 < fine <= coarse + 1e-12 and math.isclose(fine, coarse, rel_tol=1e-3)


def _clear_caches():
  from jaxdistill.accounting import _multi_message  # pylint: disable=import-outside-toplevel
  _multi_message._cached_pld.cache_clear()  # pylint: disable=protected-access
  _multi_message._calibrate.cache_clear()  # pylint: disable=protected-access


@pytest.mark.parametrize("call", [
    lambda: accounting.multi_message_pld(NOISE, k=2, r=3),
    lambda: accounting.multi_message_delta(NOISE, 1.0, k=2, r=3),
    lambda: accounting.multi_message_epsilon(NOISE, 1e-6, k=2, r=3),
    lambda: accounting.calibrate_multi_message(10.0, 1e-6, k=2, r=3, flood_multipliers=(1.0,)),
], ids=["pld", "delta", "epsilon", "calibrate"])
@pytest.mark.parametrize("error", ["numpy", "bad_alloc"])
def test_composition_out_of_memory_is_a_value_error_naming_kr(monkeypatch, call, error):
  # k*r = 10^6 (allowed by MAX_SHIFTS) raised a bare MemoryError (std::bad_alloc) from dp-accounting's FFT. Here
  # the self-composition fails as it would, without allocating: numpy's _ArrayMemoryError, or pocketfft's.
  from dp_accounting.pld import privacy_loss_distribution as pld_lib  # pylint: disable=import-outside-toplevel
  try:  # pylint: disable=import-outside-toplevel
    from numpy._core._exceptions import _ArrayMemoryError  # numpy 2
  except ImportError:
    from numpy.core._exceptions import _ArrayMemoryError  # numpy 1.26, which pyproject allows

  def self_compose(self, num_times, tail_mass_truncation=1e-15):
    del self, num_times, tail_mass_truncation
    if error == "numpy":
      raise _ArrayMemoryError((2**40,), np.dtype(np.float64))
    raise MemoryError("std::bad_alloc")

  monkeypatch.setattr(pld_lib.PrivacyLossDistribution, "self_compose", self_compose)
  _clear_caches()
  try:
    with pytest.raises(ValueError, match=r"k\*r=6 unit shifts.*MemoryError") as err:
      call()
  finally:
    _clear_caches()
  assert "\n" not in str(err.value)


def test_composition_too_large_for_memory_is_refused_before_it_runs():
  # p = e^-0.25, rho = 40, p' = e^-0.5 at k*r = 10^6 (allowed by MAX_SHIFTS) was a MemoryError after the FFT
  # had allocated (or the out-of-memory killer, without a ulimit). Its FFT length is now predicted first:
  # 1.8e8 points against MAX_FFT_POINTS = 2^26.
  noise = accounting.MultiMessageNoise(math.exp(-0.25), 40.0, math.exp(-0.5))
  with pytest.raises(ValueError, match=r"k\*r=1000000 unit shifts.*need an FFT of .* points") as err:
    accounting.multi_message_delta(noise, 1.0, k=10**6, r=1)
  assert "\n" not in str(err.value)


def test_composition_whose_finite_loss_is_all_truncated_is_a_value_error():
  # A view whose loss is infinite with probability ~0.63 per shift: after 100 shifts dp-accounting truncated all
  # of the finite mass and raised a bare IndexError.
  noise = accounting.MultiMessageNoise(math.exp(-10.0), 1.0, math.exp(-1.0))
  with pytest.raises(ValueError, match=r"k\*r=100 unit shifts.*IndexError"):
    accounting.multi_message_delta(noise, 1.0, k=100)


def test_composition_whose_end_probability_is_subnormal_warns_nothing():
  # p = 1e-300 (G is 0 but with probability 1e-300): dp-accounting's tail bound divided by the PMF's subnormal
  # end probability, and NumPy printed "overflow encountered in divide" 80 times before the right answer (also
  # at the default grid step, 1e-4, where the PMF has 10^7 points and the call takes 90 s).
  noise = accounting.MultiMessageNoise(1e-300, 1e-3, 0.5)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    delta = accounting.multi_message_delta(noise, 1.0, k=2, value_discretization_interval=3e-3)
    epsilon = accounting.multi_message_epsilon(noise, 1e-6, k=2, value_discretization_interval=3e-3)
  # F ~ NB(1e-3, 1/2) is 0 with probability 2^-0.001: then an entry shows its votes bare (infinite loss).
  assert 0.5**1e-3 < delta <= 1.0 and epsilon == math.inf


@pytest.mark.parametrize("size", [10**6, 10**12, 4097])  # 4097 = MAX_LATTICE_SIZE + 1
def test_lattice_larger_than_the_cap_is_refused_by_name(size):
  # lattice_size = 10^6 (10^12 outcomes) raised numpy's bare _ArrayMemoryError, and 10^5 (10^10 outcomes, each a
  # Python dict entry) allocated until memory ran out. Sizes above MAX_LATTICE_SIZE are refused before any work.
  with pytest.raises(ValueError, match=rf"^Expected lattice_size={size} <= 4096\.$"):
    accounting.multi_message_pld(NOISE, lattice_size=size)


@pytest.mark.parametrize("size, needle", [(1, r"lattice_size=1 >= 2"), (2.5, r"lattice_size to be an integer"),
                                          (True, r"lattice_size to be an integer, got True")])
def test_lattice_size_below_two_or_not_an_integer_is_refused(size, needle):
  with pytest.raises(ValueError, match=needle):
    accounting.multi_message_pld(NOISE, lattice_size=size)


def test_lattice_whose_outside_mass_underflows_matches_the_reduction():
  # p = p' = 0.01: the mass outside a 200-wide box underflows to 0, and log(0) was a bare "math domain error"
  # (also at lattice_size = 4096 with p = e^-0.25, rho = 40, p' = e^-0.5). A zero tail is an impossible outcome.
  noise = accounting.MultiMessageNoise(0.01, 1.0, 0.01)
  lattice, reduced = accounting.multi_message_pld(noise, lattice_size=200), accounting.multi_message_pld(noise)
  for eps in (0.5, 1.0, 3.0, 5.0):
    assert lattice.get_delta_for_epsilon(eps) == pytest.approx(reduced.get_delta_for_epsilon(eps), rel=1e-9)


@pytest.mark.parametrize("call", [
    lambda v: accounting.multi_message_pld(NOISE, value_discretization_interval=v),
    lambda v: accounting.multi_message_delta(NOISE, 1.0, value_discretization_interval=v),
    lambda v: accounting.multi_message_epsilon(NOISE, 1e-6, value_discretization_interval=v),
    lambda v: accounting.calibrate_multi_message(1.0, 1e-6, flood_multipliers=(1.0,), value_discretization_interval=v),
], ids=["pld", "delta", "epsilon", "calibrate"])
def test_grid_step_above_the_mechanisms_cap_is_refused(call):
  # 1e300 was accepted (delta(1) = 0.808 at p = e^-0.25, rho = 40, p' = e^-0.5: valid but useless), while
  # MechanismAccount refuses steps above MAX_GRID_INTERVAL = 100.
  for step in (1e300, 100.5):
    with pytest.raises(ValueError, match=r"value_discretization_interval=\S+ <= 100"):
      call(step)


def test_grid_step_at_the_cap_still_works():
  noise = accounting.MultiMessageNoise(math.exp(-0.25), 40.0, math.exp(-0.5))
  assert 0 < accounting.multi_message_delta(noise, 1.0, value_discretization_interval=100.0) < 1


@pytest.mark.parametrize("mult,p_flood", [(1e300, "0.0"), (1e-300, "1.0")])
def test_flood_multiplier_without_a_valid_p_flood_is_refused_by_name(mult, p_flood):
  # The error blamed "p_flood", which is not a parameter of calibrate_multi_message.
  with pytest.raises(ValueError, match=rf"^Expected flood_multipliers\[1\]={mult!r} to give a flooding probability "
                                       rf".* in \(0, 1\); it gives {p_flood} at target_epsilon=1\.0, "
                                       rf"dlap_fraction=0\.5, k\*r=1\.$".replace("+", r"\+")):
    accounting.calibrate_multi_message(1.0, 1e-6, flood_multipliers=(1.0, mult))


@pytest.mark.parametrize("value,match", [
    # A string was read character by character: "Expected flood_multipliers to be a real number, got 'a'."
    ("abc", r"^Expected flood_multipliers to be a sequence of positive numbers; got 'abc'\.$"),
    ({"a": 1}, r"^Expected flood_multipliers to be a sequence of positive numbers; got \{'a': 1\}\.$"),
    (5, r"^Expected flood_multipliers to be a sequence of positive numbers; got 5\.$"),
    (np.array(2.0), r"^Expected flood_multipliers to be a sequence of positive numbers; got array\(2\.\)\.$"),
    # An entry was named as the whole sequence: "Expected flood_multipliers=-1.0 > 0."
    ((1.0, -1.0), r"^Expected flood_multipliers\[1\]=-1\.0 > 0\.$"),
    ([1.0, float("nan")], r"^Expected flood_multipliers\[1\] to be finite, got nan\.$"),
    ([[1, 2]], r"^Expected flood_multipliers\[0\] to be a real number, got \[1, 2\]\.$"),
    ((True,), r"^Expected flood_multipliers\[0\] to be a real number, got True\.$"),
    # "Expected at least one flood multiplier." named no parameter.
    ((), r"^Expected flood_multipliers to hold at least one multiplier; got \(\)\.$"),
])
def test_bad_flood_multipliers_are_named_with_the_entry(value, match):
  with pytest.raises(ValueError, match=match):
    accounting.calibrate_multi_message(1.0, 1e-6, flood_multipliers=value)
