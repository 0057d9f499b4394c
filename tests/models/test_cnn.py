"""FedMD's CNN family: shapes, FLOPs by hand, dropout law, masked batch statistics."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdistill import models as M


def test_ten_fedmd_specs_match_the_reference_code():
  # FedMD conf: 5 two-layer and 5 three-layer nets with these widths and dropouts.
  got = [(s.widths, s.dropout) for s in M.FEDMD_SPECS]
  assert got == [((128, 256), .2), ((128, 384), .2), ((128, 512), .2), ((256, 256), .3), ((256, 512), .4),
                 ((64, 128, 256), .2), ((64, 128, 192), .2), ((128, 192, 256), .2), ((128, 128, 128), .3),
                 ((128, 128, 192), .3)]


def test_forward_flops_by_hand():
  # 2-layer (128, 256) on 28x28x1, C = 16:
  #   conv1 3x3 same, 28x28 out: 2*28*28*9*1*128; conv2 3x3 s2 valid, 13x13 out: 2*13*13*9*128*256;
  #   dense 13*13*256 -> 16: 2*13*13*256*16.
  want = 2 * 28 * 28 * 9 * 128 + 2 * 13 * 13 * 9 * 128 * 256 + 2 * 13 * 13 * 256 * 16
  assert M.forward_flops(M.CNNSpec((128, 256), .2)) == want
  # 3-layer (64, 128, 256): conv1 28x28; conv2 2x2 s2 valid -> 14x14; pool 2 s2 -> 7x7;
  #   conv3 3x3 s2 valid -> 3x3; dense 3*3*256 -> 16.
  want3 = (2 * 28 * 28 * 9 * 64 + 2 * 14 * 14 * 4 * 64 * 128 + 2 * 3 * 3 * 9 * 128 * 256
           + 2 * 3 * 3 * 256 * 16)
  assert M.forward_flops(M.CNNSpec((64, 128, 256), .2)) == want3
  # The width multiplier cuts the dominant conv2 term by about w^2.
  full = M.forward_flops(M.FEDMD_SPECS[0])
  assert M.forward_flops(M.FEDMD_SPECS[0].scaled(0.25)) < full / 12


@pytest.mark.parametrize("spec,shape", [
    (M.CNNSpec((4, 8), .2), (28, 28, 1)), (M.CNNSpec((4, 8, 8), .3), (28, 28, 1)),
    (M.CNNSpec((4, 8), .2), (32, 32, 3)), (M.CNNSpec((4, 8, 8), .2), (32, 32, 3)),
])
def test_shapes_and_parameter_count(spec, shape):
  m = M.FedMDCNN(spec, 16, input_shape=shape, rngs=nnx.Rngs(params=0))
  x = jnp.zeros((3,) + shape)
  assert m(x, train=False).shape == (3, 16)
  assert m(x, train=True, key=jax.random.key(1)).shape == (3, 16)
  # The head is bias-free (FedMD: Dense(use_bias=False)).
  assert m.head.bias is None


def test_scaled_and_parse_spec():
  s = M.parse_spec("128,256:0.2")
  assert s == M.CNNSpec((128, 256), 0.2)
  assert s.scaled(0.125).widths == (16, 32)
  assert M.CNNSpec((3, 5), 0.).scaled(0.01).widths == (1, 1)
  assert s.name == "cnn2-128-256-d0.2"


@pytest.mark.parametrize("text", ["128,256", "128:0.2", "a,b:0.1", "1,2,3,4:0.1", "4,8:1.0", "4,8:-0.1"])
def test_bad_specs(text):
  with pytest.raises(ValueError):
    M.parse_spec(text)


@pytest.mark.parametrize("make,needle", [
    (lambda: M.parse_spec(None), "CNN spec like"),                       # AttributeError before
    (lambda: M.CNNSpec(4, 0.2), "widths to be a sequence of integers"),  # TypeError before
    (lambda: M.CNNSpec("48", 0.2), "widths to be a sequence of integers"),
    (lambda: M.FedMDCNN(None, 3, rngs=nnx.Rngs(0)), "spec to be a CNNSpec"),
    (lambda: M.FedMDCNN(M.CNNSpec((2, 4), 0.2), 3, input_shape=None, rngs=nnx.Rngs(0)), "input_shape"),
    (lambda: M.FedMDCNN(M.CNNSpec((2, 4), 0.2), 3, input_shape=(12, 12, 0), rngs=nnx.Rngs(0)),
     r"input_shape=0 >= 1"),                                              # ZeroDivisionError before
    (lambda: M.FedMDCNN(M.CNNSpec((2, 4), 0.2), 3, input_shape=(12.7, 12, 1), rngs=nnx.Rngs(0)),
     "input_shape to be an integer, got 12.7"),                           # silently 12 before
    (lambda: M.FedMDCNN(M.CNNSpec((2, 4), 0.2), 2**63, input_shape=(12, 12, 1), rngs=nnx.Rngs(0)),
     r"num_classes=9223372036854775808 <= 2147483647"),                   # TypeError inside JAX before
    # forward_flops counted -1 classes, took 0, 2.5 and True, and raised AttributeError / IndexError.
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], num_classes=-1), r"num_classes=-1 >= 1"),
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], num_classes=0), r"num_classes=0 >= 1"),
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], num_classes=2.5), "num_classes to be an integer"),
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], num_classes=True), "num_classes to be an integer"),
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], num_classes=float("nan")), "num_classes to be an integer"),
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], num_classes=2**63), r"num_classes=9223372036854775808 <= "),
    (lambda: M.forward_flops(None), "spec to be a CNNSpec"),
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], input_shape=()), r"input_shape=\(H, W, C\)"),
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], input_shape=(28, 28, 0)), r"input_shape=0 >= 1"),
    (lambda: M.forward_flops(M.FEDMD_SPECS[0], input_shape=(28, 28.5, 1)), "input_shape to be an integer"),
    # rngs None or a seed: AttributeError inside nnx; images of another size: XLA's dot_general TypeError.
    (lambda: M.FedMDCNN(M.CNNSpec((2, 4), 0.2), 3, rngs=None), r"^Expected rngs to be an nnx.Rngs .*got None\.$"),
    (lambda: M.FedMDCNN(M.CNNSpec((2, 4), 0.2), 3, rngs=0), r"^Expected rngs to be an nnx.Rngs .*got 0\.$"),
    (lambda: M.FedMDCNN(M.CNNSpec((2, 4), 0.2), 3, input_shape=(12, 12, 1), rngs=nnx.Rngs(0))(
        jnp.zeros((2, 10, 10, 1))), r"^Expected x of shape \[B, 12, 12, 1\] \(the model's input_shape\); got "
                                    r"\(2, 10, 10, 1\)\.$"),
])
def test_bad_model_arguments_name_the_parameter(make, needle):
  with pytest.raises(ValueError, match=needle):
    make()


def test_widths_and_input_shape_may_be_arrays():
  assert M.CNNSpec(np.array([4, 8]), 0.2) == M.CNNSpec((4, 8), 0.2)
  m = M.FedMDCNN(M.CNNSpec((2, 4), 0.2), 3, input_shape=np.array([12, 12, 1]), rngs=nnx.Rngs(0))
  assert m.input_shape == (12, 12, 1) and all(type(s) is int for s in m.input_shape)


def test_dropout_keeps_each_unit_with_probability_one_minus_rate():
  spec = M.CNNSpec((4, 8), 0.3)
  m = M.FedMDCNN(spec, 16, rngs=nnx.Rngs(params=0))
  from jaxdistill.models._cnn import _dropout
  x = jnp.ones((200, 10, 10, 8))
  y = np.asarray(_dropout(jax.random.key(0), x, 0.3))
  kept = (y != 0).mean()
  # 160,000 Bernoulli(0.7) draws: sd = sqrt(.7*.3/160000) = 1.15e-3; 6 sd => false failure ~2e-9.
  assert abs(kept - 0.7) < 6 * math.sqrt(0.21 / y.size)
  np.testing.assert_allclose(y[y != 0], 1 / 0.7, rtol=1e-6)
  # Same key, same mask; other key, other mask. Independent masks differ on each unit
  # w.p. 2 * .7 * .3 = .42; a share <= .3 of 160,000 has probability < exp(-160000 KL(.3 || .42))
  # = e^-4911 (Chernoff), so this never fails falsely.
  np.testing.assert_array_equal(y, np.asarray(_dropout(jax.random.key(0), x, 0.3)))
  assert (y != np.asarray(_dropout(jax.random.key(1), x, 0.3))).mean() > 0.3
  # Neighbouring units are not correlated (the hash mixes the index): lag-1 agreement of
  # i.i.d. units has mean .7^2 + .3^2 = .58. The 159,999 agreement indicators are 1-dependent
  # (lag-1 covariance .7^3 + .3^3 - .58^2), so sd = 1.39e-3 and 0.01 is 7.2 sd (normal rate
  # 7e-13). Rigorously: the even- and odd-indexed indicators are each i.i.d. Bernoulli(.58)
  # (80,000 and 79,999 of them) and one of them must be off by >= 0.01, so the exact
  # binomial tails bound the false-failure rate by 2e-8.
  flat = (y.reshape(-1) != 0)
  agree = (flat[1:] == flat[:-1]).mean()
  assert abs(agree - 0.58) < 0.01
  # Eval mode is deterministic and needs no key; train mode needs one.
  z = jnp.asarray(np.random.default_rng(0).random((2, 28, 28, 1)), jnp.float32)
  np.testing.assert_array_equal(m(z, train=False), m(z, train=False))
  with pytest.raises(ValueError, match="dropout key"):
    m(z, train=True)


def test_masked_rows_do_not_touch_batch_statistics():
  spec = M.CNNSpec((4, 8), 0.0)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.random((6, 28, 28, 1)), jnp.float32)
  junk = jnp.full((3, 28, 28, 1), 1e3, jnp.float32)
  a = M.FedMDCNN(spec, 16, rngs=nnx.Rngs(params=0))
  b = M.FedMDCNN(spec, 16, rngs=nnx.Rngs(params=0))
  out_a = a(x, train=True)
  out_b = b(jnp.concatenate([x, junk]), train=True, mask=jnp.arange(9) < 6)
  np.testing.assert_allclose(out_a, out_b[:6], rtol=1e-4, atol=1e-5)
  for na, nb in zip(a.norms, b.norms):
    np.testing.assert_allclose(na.mean[...], nb.mean[...], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(na.var[...], nb.var[...], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("widths", [(4, 8), (3, 4, 5)])
def test_x64_mode_trains_in_float32_quietly_and_as_without_it(widths):
  # With jax_enable_x64 on (as accounting notebooks often set it), flax's count_include_pad=False average pool
  # divided by float64 window counts, and the next block's batch statistics wrote float64 into the float32
  # running averages: JAX's FutureWarning "scatter inputs have incompatible types" (a future error); a float64
  # batch did the same from the first block. The model now runs in float32 either way, as with x64 off.
  spec = M.CNNSpec(widths, 0.2)
  x = np.random.default_rng(0).random((6, 28, 28, 1))  # float64
  mask = np.arange(6) < 5

  def train_step():
    m = M.FedMDCNN(spec, 10, rngs=nnx.Rngs(params=1))
    logits = m(jnp.asarray(x), train=True, key=jax.random.key(2), mask=jnp.asarray(mask))
    return [np.asarray(a) for a in [logits] + jax.tree.leaves(nnx.state(m, nnx.BatchStat))]

  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with jax.enable_x64(True):
      got = train_step()
  want = train_step()
  assert len(got) == 1 + 2 * len(widths) and all(a.dtype == np.float32 for a in got)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def _np_conv(x, kernel, bias, stride, same):
  """Cross-correlation of ``x [B, H, W, C]`` with ``kernel [k, k, C, O]`` (SAME: stride 1, pad (k-1)/2)."""
  k = kernel.shape[0]
  if same:
    x = np.pad(x, ((0, 0), ((k - 1) // 2, k // 2), ((k - 1) // 2, k // 2), (0, 0)))
  oh, ow = (x.shape[1] - k) // stride + 1, (x.shape[2] - k) // stride + 1
  out = sum(np.einsum("bhwc,co->bhwo", x[:, a:a + stride * (oh - 1) + 1:stride, b:b + stride * (ow - 1) + 1:stride],
                      kernel[a, b]) for a in range(k) for b in range(k))
  return out + bias


def _np_forward(m, x):
  """Eval-mode FedMD CNN in float64 NumPy, from the layer definitions (Keras BN epsilon 1e-3; SAME average pooling
  over the in-image pixels only, as Keras' AveragePooling2D(padding='same'))."""
  h = np.asarray(x, np.float64)
  get = lambda v: np.asarray(v[...], np.float64)
  for conv, norm, (_, stride, padding, pool) in zip(m.convs, m.norms, m.layout):
    h = _np_conv(h, get(conv.kernel), get(conv.bias), stride, padding == "SAME")
    h = (h - get(norm.mean)) / np.sqrt(get(norm.var) + 1e-3) * get(norm.scale) + get(norm.bias)
    h = np.maximum(h, 0.0)
    if pool == "same1":  # window [i, i + 1] x [j, j + 1], cut at the bottom and right edges
      p = np.pad(h, ((0, 0), (0, 1), (0, 1), (0, 0)))
      c = np.pad(np.ones(h.shape[1:3]), ((0, 1), (0, 1)))
      win = lambda a: a[..., :-1, :-1, :] + a[..., 1:, :-1, :] + a[..., :-1, 1:, :] + a[..., 1:, 1:, :]
      h = win(p) / win(c[..., None])
    elif pool == "valid2":
      b, hh, ww, ch = h.shape
      h = h[:, :hh // 2 * 2, :ww // 2 * 2].reshape(b, hh // 2, 2, ww // 2, 2, ch).mean(axis=(2, 4))
  return h.reshape(h.shape[0], -1) @ get(m.head.kernel)


@pytest.mark.parametrize("spec, shape", [(M.CNNSpec((3, 5), 0.2), (9, 9, 2)),
                                         (M.CNNSpec((3, 4, 5), 0.2), (28, 28, 1))])
def test_eval_forward_matches_a_numpy_reference(spec, shape):
  m = M.FedMDCNN(spec, 7, input_shape=shape, rngs=nnx.Rngs(params=0))
  rng = np.random.default_rng(0)
  for layer in (*m.convs, *m.norms):  # every parameter and statistic non-trivial
    for name in ("bias", "scale", "mean", "var"):
      v = getattr(layer, name, None)
      if v is not None:
        value = rng.uniform(0.5, 1.5, v.shape) if name in ("scale", "var") else rng.normal(0, 0.3, v.shape)
        v[...] = jnp.asarray(value, jnp.float32)
  x = rng.random((3,) + shape).astype(np.float32)
  np.testing.assert_allclose(m(jnp.asarray(x), train=False), _np_forward(m, x), rtol=1e-4, atol=1e-5)


def test_batch_statistics_follow_keras_momentum():
  # Keras BatchNormalization (FedMD): running = 0.99 * running + 0.01 * batch moment (biased variance).
  m = M.FedMDCNN(M.CNNSpec((3, 5), 0.0), 4, input_shape=(8, 8, 1), rngs=nnx.Rngs(params=0))
  x = np.random.default_rng(1).random((6, 8, 8, 1)).astype(np.float32)
  h = _np_conv(x.astype(np.float64), np.asarray(m.convs[0].kernel[...], np.float64),
               np.asarray(m.convs[0].bias[...], np.float64), 1, True)
  m(jnp.asarray(x), train=True)
  np.testing.assert_allclose(m.norms[0].mean[...], 0.01 * h.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(m.norms[0].var[...], 0.99 + 0.01 * h.var(axis=(0, 1, 2)), rtol=1e-5)
