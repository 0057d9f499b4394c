"""Release modes and server aggregation against hand-computed values."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import fedmd

# Two parties, two public queries, three classes.
LOGITS = np.array([[[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]],
                   [[0.0, 3.0, 1.0], [1.0, 0.0, 0.0]]], np.float32)


def softmax_by_hand(z):
  e = [math.exp(v) for v in z]
  return [v / sum(e) for v in e]


def test_argmax_votes_equal_and_weighted():
  rel = np.asarray(fedmd.release(LOGITS, "argmax"))
  np.testing.assert_array_equal(rel, [[[1, 0, 0], [0, 0, 1]], [[0, 1, 0], [1, 0, 0]]])
  np.testing.assert_allclose(fedmd.aggregate(rel), [[.5, .5, 0], [.5, 0, .5]])
  # Weights 3:1 -> vote shares 3/4, 1/4.
  np.testing.assert_allclose(fedmd.aggregate(rel, [3, 1]), [[.75, .25, 0], [.25, 0, .75]])


def test_softmax_equal_and_weighted():
  rel = np.asarray(fedmd.release(LOGITS, "softmax"))
  for i in range(2):
    for q in range(2):
      np.testing.assert_allclose(rel[i, q], softmax_by_hand(LOGITS[i, q].tolist()), rtol=1e-6)
  want = [[(a + b) / 2 for a, b in zip(softmax_by_hand([2, 1, 0]), softmax_by_hand([0, 3, 1]))],
          [(a + b) / 2 for a, b in zip(softmax_by_hand([0, 0, 5]), softmax_by_hand([1, 0, 0]))]]
  np.testing.assert_allclose(fedmd.aggregate(rel), want, rtol=1e-6)
  w = [[(1 * a + 4 * b) / 5 for a, b in zip(softmax_by_hand([2, 1, 0]), softmax_by_hand([0, 3, 1]))]]
  np.testing.assert_allclose(fedmd.aggregate(rel, [1, 4])[0:1], w, rtol=1e-6)


def test_logits_equal_and_weighted():
  rel = np.asarray(fedmd.release(LOGITS, "logits"))
  np.testing.assert_array_equal(rel, LOGITS)
  np.testing.assert_allclose(fedmd.aggregate(rel), [[1, 2, .5], [.5, 0, 2.5]])
  # A zero weight drops a party.
  np.testing.assert_allclose(fedmd.aggregate(rel, [0, 2]), LOGITS[1])


@pytest.mark.parametrize("weights", [[1], [1, -1], [0, 0], [1, float("nan")], [[1, 2]], ["1", "1"], [True, True]])
def test_bad_weights(weights):
  with pytest.raises(ValueError, match="^Expected weights"):
    fedmd.aggregate(LOGITS, weights)


@pytest.mark.parametrize("mode", ["median", 3, None, ["argmax"]])
def test_unknown_mode_is_named_with_the_allowed_values(mode):
  # The error named "aggregation" (FedMDConfig's field), which release and release_sensitivity have no parameter of.
  for call in (lambda: fedmd.release(LOGITS, mode), lambda: fedmd.release_sensitivity(mode)):
    with pytest.raises(ValueError, match=r"^Expected mode to be one of argmax, softmax, logits; got "
                                         + re.escape(repr(mode)) + r"\.$"):
      call()


def test_unknown_mode_and_bad_shapes():
  with pytest.raises(ValueError, match="mode"):
    fedmd.release(LOGITS, "median")
  with pytest.raises(ValueError, match="shape"):
    fedmd.aggregate(LOGITS[0])


@pytest.mark.parametrize("y,want", [
    ([0.5, 0.5], [0.5, 0.5]), ([2.0, 0.0], [1.0, 0.0]), ([1.0, 1.0, 1.0], [1 / 3] * 3),
    ([0.6, 0.6, -1.0], [0.5, 0.5, 0.0]), ([-5.0, -5.0, -5.0, -2.0], [0.0, 0.0, 0.0, 1.0]),
    # All coordinates stay positive, so tau = (sum - 1)/C = -0.4/3 and x = y + 0.4/3.
    ([0.2, 0.3, 0.1], [0.2 + 0.4 / 3, 0.3 + 0.4 / 3, 0.1 + 0.4 / 3]),
])
def test_simplex_projection(y, want):
  got = np.asarray(fedmd.project_to_simplex(np.array(y, np.float32)))
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert got.min() >= 0 and got.sum() == pytest.approx(1, abs=1e-6)


@pytest.mark.parametrize("bad,match", [
    ([[np.nan, 1.0]], "finite"), ([[np.inf, 0.0]], "finite"), (1.0, "shape"), (np.zeros((2, 0)), "shape"),
    ([["0.5", "0.5"]], "real numbers"), ([[1e39, 0.0]], "finite")])
def test_row_operations_reject_bad_rows(bad, match):
  with pytest.raises(ValueError, match=match) as err:
    fedmd.project_to_simplex(bad)
  assert " y " in str(err.value) or " y;" in str(err.value)  # names the parameter
  with pytest.raises(ValueError, match=match) as err:
    fedmd.clip_rows(bad, 1.0)
  assert " x " in str(err.value) or " x;" in str(err.value)


def test_row_operations_trace_under_jit():
  y = np.array([[2.0, 0.0], [0.6, 0.6]], np.float32)
  np.testing.assert_allclose(jax.jit(fedmd.project_to_simplex)(y), fedmd.project_to_simplex(y), atol=1e-7)
  np.testing.assert_allclose(jax.jit(lambda x: fedmd.clip_rows(x, 1.0))(y), fedmd.clip_rows(y, 1.0), atol=1e-7)


def test_clip_rows_and_sensitivity():
  x = np.array([[3.0, 4.0], [0.3, 0.4]], np.float32)
  np.testing.assert_allclose(fedmd.clip_rows(x, 1.0), [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)
  assert fedmd.release_sensitivity("softmax") == pytest.approx(math.sqrt(2))
  assert fedmd.release_sensitivity("argmax") == pytest.approx(math.sqrt(2))
  assert fedmd.release_sensitivity("logits", 3.0) == 6.0
  with pytest.raises(ValueError, match="clip"):
    fedmd.release_sensitivity("logits")
  for mode in ("softmax", "argmax", "logits"):  # a bad clip is refused whatever the mode (softmax ignored it)
    with pytest.raises(ValueError, match=r"clip=-5"):
      fedmd.release_sensitivity(mode, -5)
  for mode in ("softmax", "argmax"):  # a good clip too: their rows are never clipped (3.0 was ignored)
    with pytest.raises(ValueError, match=rf"Expected clip=None for mode='{mode}': .*got clip=3.0\.$"):
      fedmd.release_sensitivity(mode, 3.0)


@pytest.mark.parametrize("scale", [1.0, 2.0**25, 5e7, 1e30])
def test_simplex_projection_and_clipping_at_large_magnitudes(scale):
  # float32: from |y| ~ 2^25, u - 1 rounded to u and rows came back 0 or inf (an LDP consensus with a
  # huge sigma); squares above ~1.8e19 overflowed the norm and clip_rows zeroed the row. Both are
  # scale-free: the projection of (s, s, 0) is (1/2, 1/2, 0), and a clipped row keeps its direction.
  y = np.array([[scale, scale, 0.0], [scale, -scale, 0.0]], np.float32)
  got = np.asarray(fedmd.project_to_simplex(y))
  np.testing.assert_allclose(got, [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]], atol=1e-6)
  c = 0.1 / math.sqrt(2)  # every row's norm is scale * sqrt(2) > 0.1
  np.testing.assert_allclose(fedmd.clip_rows(y, 0.1), [[c, c, 0.0], [c, -c, 0.0]], rtol=1e-5)
  noisy = np.random.default_rng(0).normal(size=(200, 10)).astype(np.float32) * np.float32(scale)
  proj = np.asarray(fedmd.project_to_simplex(noisy))
  assert np.isfinite(proj).all() and proj.min() >= 0
  np.testing.assert_allclose(proj.sum(axis=1), 1.0, atol=1e-5)


def test_aggregate_with_huge_weights_or_no_party():
  # Weights summing past the float64 maximum gave w / inf = 0: an all-zero consensus, silently.
  y = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[0.0, 1.0]]], np.float32)
  np.testing.assert_allclose(fedmd.aggregate(y, (1e308, 1e308, 1e308)), [[1 / 3, 2 / 3]], rtol=1e-6)
  with pytest.raises(ValueError, match="at least one party"):
    fedmd.aggregate(np.zeros((0, 2, 3), np.float32))


def test_aggregate_refuses_nan_releases_and_non_numeric_weights():
  with pytest.raises(ValueError, match="finite released"):
    fedmd.aggregate(np.full((2, 3, 4), np.nan, np.float32))
  with pytest.raises(ValueError, match="Expected weights to be a number or an array of numbers; got 'heavy'"):
    fedmd.aggregate(np.ones((2, 3, 4), np.float32), "heavy")


@pytest.mark.parametrize("mode", fedmd.RELEASE_MODES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_release_refuses_non_finite_logits(mode, bad):
  # argmax used to turn a NaN row into a vote for class 0, and softmax into a NaN row.
  z = LOGITS.copy()
  z[1, 0, 1] = bad
  with pytest.raises(ValueError, match="finite logits") as err:
    fedmd.release(z, mode)
  assert "\n" not in str(err.value)
  assert fedmd.release(LOGITS, mode).shape == LOGITS.shape  # finite logits still pass


@pytest.mark.parametrize("row,clip", [
    ([1e38, 1e38], 1.0),        # came back unclipped (norm 1.4e38): 1/max|x| flushed to 0 above 2^126
    ([3e38, -3e38], 10.0),      # norm beyond the float32 maximum
    ([1e20, 1e20], 1e-20),      # came back zeroed: the factor clip/|x| underflowed
    ([1e-20, 0.0], 1e-25),
    ([3.0, 4.0], 1.0),
])
def test_clip_rows_bounds_the_norm_at_any_float32_magnitude(row, clip):
  # The L2 sensitivity of FedMD-LDP's logits releases is 2 * clip: a row longer than clip breaks the guarantee.
  x = np.array([row], np.float32)
  got = np.asarray(fedmd.clip_rows(x, clip), np.float64)
  norm = np.linalg.norm(got)
  assert norm <= clip * (1 + 1e-6) and norm >= clip * (1 - 1e-6)  # every row here is longer than clip
  want = np.asarray(row, np.float64) / np.linalg.norm(np.asarray(row, np.float64) / 1e30) / 1e30 * clip
  np.testing.assert_allclose(got[0], want, rtol=1e-6)  # same direction


@pytest.mark.parametrize("clip", [0.0, 1e-31, 1e39, float("inf")])
def test_clip_outside_the_float32_range_is_refused(clip):
  with pytest.raises(ValueError, match="clip"):
    fedmd.clip_rows(np.ones((1, 2), np.float32), clip)
  with pytest.raises(ValueError, match="ldp_clip"):
    fedmd.FedMDConfig(method="ldp", aggregation="logits", ldp_clip=clip)


@pytest.mark.parametrize("bad", [[["1", "2"]], np.array([[1 + 2j, 0.0]]), [[True, False]],
                                 jnp.array([[True, False]]), jnp.array([[1 + 2j, 0.0]])])  # device arrays too
def test_release_refuses_what_is_not_real_numbers(bad):
  # Text was parsed and complex numbers lost their imaginary part, unlike clip_rows and aggregate.
  with pytest.raises(ValueError, match="logits to hold real numbers"):
    fedmd.release(bad, "softmax")


@pytest.mark.parametrize("classes", [1, 2, 3, 16, 100, 1000])
@pytest.mark.parametrize("clip", [1e-30, 1e-3, 1.0, 3.7, 10.0, 1e20, float(np.finfo(np.float32).max)])
def test_clipped_rows_are_within_the_clip_in_exact_arithmetic(classes, clip):
  # About half the clipped rows had a float32 norm a few ulps above clip (10.0000016 for clip 10), so two
  # releases could lie further apart than release_sensitivity (2 * clip), the LDP noise's calibration.
  rng = np.random.default_rng(classes)
  rows = 4000 if classes <= 100 else 400
  direction = rng.standard_normal((rows, classes))
  sparse = rng.random((rows, classes)) < 0.3  # rows with many zeros, and a few 1-hot ones
  direction = np.where(sparse & (np.arange(rows) % 2 == 0)[:, None], 0.0, direction)
  direction[:5] = 0.0
  direction[:5, 0] = 1.0
  # Lengths around clip (just above and below) and far from it, up to the float32 range's ends.
  length = np.concatenate([clip * (1 + rng.uniform(-1e-5, 1e-5, rows // 2)),
                           10.0 ** rng.uniform(-37, 38, rows - rows // 2)])
  size = np.linalg.norm(direction, axis=1)
  scale = np.where(size > 0, length / np.where(size > 0, size, 1.0), 0.0)  # an all-zero row stays 0
  x = np.clip(direction * scale[:, None], -3e38, 3e38).astype(np.float32)
  got = np.asarray(fedmd.clip_rows(x, clip))
  norms = np.linalg.norm(got.astype(np.float64), axis=1)  # exact enough: float64 holds float32 squares
  assert np.all(np.isfinite(got))
  assert norms.max() <= clip, f"a clipped row has norm {norms.max()!r} > clip={clip!r}"
  # Rows within the clip come back unchanged; longer ones are shortened to just under it.
  before = np.linalg.norm(x.astype(np.float64), axis=1)
  short = before <= clip * (1 - 1e-4)
  np.testing.assert_array_equal(got[short], x[short])
  assert np.all(norms[before >= clip] >= clip * (1 - 1e-4))


def test_clip_rows_refuses_rows_too_long_for_its_float32_margin():
  with pytest.raises(ValueError, match=r"C <= 1048576; got shape \(1, 1048577\)"):
    fedmd.clip_rows(np.ones((1, 2**20 + 1), np.float32), 1.0)
