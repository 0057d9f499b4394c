"""Functional training: learning, hard/soft targets, vmapped stacks equal the loop, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxdistill import models as M
from tests._memory import aligned_copy

SHAPE = (8, 8, 1)
SPEC = M.CNNSpec((3, 6), 0.2)


def toy(n, seed=0, classes=4):
  """Class c lights up quadrant c of an 8x8 image (plus noise): linearly separable."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, classes, n).astype(np.int32)
  x = rng.normal(0, 0.3, (n,) + SHAPE).astype(np.float32)
  for i, c in enumerate(y):
    r, q = divmod(int(c), 2)
    x[i, 4 * r:4 * r + 4, 4 * q:4 * q + 4, 0] += 2.0
  return x, y


def make(seed=0, tx=None, spec=SPEC, classes=4):
  model = M.FedMDCNN(spec, classes, input_shape=SHAPE, rngs=nnx.Rngs(params=seed))
  return M.create(model, tx or optax.adam(1e-2))


def leaves_close(a, b, **tol):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), **tol)


def test_learns_hard_labels_and_soft_targets():
  x, y = toy(256)
  xt, yt = toy(256, seed=1)
  clf, st = make()
  before = M.accuracy(M.predict_logits(clf, st, xt), yt)
  hard = M.fit(jax.random.key(0), clf, st, x, y, epochs=6, batch_size=32)
  assert M.accuracy(M.predict_logits(clf, hard, xt), yt) > 0.9 > before + 0.3
  soft = M.fit(jax.random.key(0), clf, st, x, np.eye(4, dtype=np.float32)[y] * 0.9 + 0.025, epochs=6,
               batch_size=32)
  assert M.accuracy(M.predict_logits(clf, soft, xt), yt) > 0.9
  # Logit matching (FedMD's MAE digest) pulls logits toward the targets.
  target = np.asarray(M.predict_logits(clf, hard, x))
  mae_before = np.abs(np.asarray(M.predict_logits(clf, st, x)) - target).mean()
  matched = M.fit(jax.random.key(2), clf, st, x, target, epochs=6, batch_size=32, loss="mae")
  assert np.abs(np.asarray(M.predict_logits(clf, matched, x)) - target).mean() < 0.5 * mae_before


def test_pure_in_the_key_and_the_input_state_is_untouched():
  x, y = toy(64)
  clf, st = make()
  copy = jax.tree.map(np.array, st)
  a = M.fit(jax.random.key(3), clf, st, x, y, epochs=2, batch_size=16)
  b = M.fit(jax.random.key(3), clf, st, x, y, epochs=2, batch_size=16)
  c = M.fit(jax.random.key(4), clf, st, x, y, epochs=2, batch_size=16)
  leaves_close(a, b, rtol=0, atol=0)
  assert any(not np.array_equal(u, v) for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(c.params)))
  leaves_close(st, copy, rtol=0, atol=0)  # donation never consumes the caller's state
  assert int(a.step) == 2 * 4


def test_records_beyond_size_are_never_read():
  x, y = toy(40)
  clf, st = make()
  a = M.fit(jax.random.key(0), clf, st, x, y, epochs=3, batch_size=16, size=30)
  xp, yp = x.copy(), y.copy()
  xp[30:] = np.nan
  yp[30:] = 3
  b = M.fit(jax.random.key(0), clf, st, xp, yp, epochs=3, batch_size=16, size=30)
  leaves_close(a, b, rtol=0, atol=0)
  assert int(a.step) == 3 * 2  # ceil(30 / 16) steps per epoch


def test_a_padded_batch_takes_the_sgd_step_of_its_valid_records_alone():
  # size=10 of n=12 records in one batch of 12: two padding rows (weight 0, masked out of the batch statistics).
  # One SGD step must be exactly the step on the 10 valid records: p - lr * grad(mean cross-entropy + l2 penalty),
  # with batch statistics from those 10 records only. Dropout 0, so the step is deterministic.
  spec, lr = M.CNNSpec((3, 6), 0.0), 0.1
  x, y = toy(12, seed=5)
  clf, st = make(tx=optax.sgd(lr), spec=spec)
  got = M.fit(jax.random.key(0), clf, st, x, y, epochs=1, batch_size=12, size=10)
  assert int(got.step) == 1
  model = clf.module(st)

  def loss(m):
    logits = m(jnp.asarray(x[:10]), train=True)
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(10), y[:10]]) + m.regularization()

  grads = nnx.grad(loss)(model)  # also updates model's batch statistics from the 10 records
  want = jax.tree.map(lambda p, g: p - lr * g, st.params, grads)
  leaves_close(got.params, want, rtol=1e-4, atol=1e-6)
  leaves_close(got.rest, nnx.state(model, nnx.BatchStat), rtol=1e-4, atol=1e-6)


def test_each_epoch_visits_every_record_once_in_a_random_order():
  # Two records, batches of one, SGD, no dropout: an epoch is the step on record 0 then record 1 (or the
  # reverse), both computed here with one-record fits. Over 24 keys both orders must occur (a fixed order:
  # probability 2^-23 under a uniform shuffle).
  spec = M.CNNSpec((3, 6), 0.0)
  x, y = toy(2, seed=6)
  clf, st = make(tx=optax.sgd(0.1), spec=spec)
  one = lambda state, i: M.fit(jax.random.key(0), clf, state, x[i:i + 1], y[i:i + 1], epochs=1, batch_size=1)
  orders = [one(one(st, 0), 1), one(one(st, 1), 0)]
  same = lambda a, b: all(np.allclose(u, v, rtol=1e-5, atol=1e-7)
                          for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
  assert not same(*orders)
  seen = []
  for i in range(24):
    got = M.fit(jax.random.key(i), clf, st, x, y, epochs=1, batch_size=1)
    match = [same(got, o) for o in orders]
    assert sum(match) == 1 and int(got.step) == 2
    seen.append(match[0])
  assert 0 < sum(seen) < 24


def test_keys_of_a_non_default_type_train_and_stay_that_type():
  # The steps rewrapped raw key data as JAX's default key type: an rbg key here (or a threefry key, what the
  # CLI's seeds give, under JAX_DEFAULT_PRNG_IMPL=rbg) failed with "invalid PRNG key data" inside jit.
  x, y = toy(40)
  clf, st = make(tx=optax.sgd(0.05))  # SGD: see the next test on Adam and vmap
  key = jax.random.key(3, impl="rbg")
  a = M.fit(key, clf, st, x, y, epochs=2, batch_size=16)
  b = M.fit(key, clf, st, x, y, epochs=2, batch_size=16)
  leaves_close(a, b, rtol=0, atol=0)
  assert int(a.step) == 2 * 3
  # fit_stacked promises the steps of a lone fit per model, which rbg cannot keep: its draws (batch orders,
  # dropout masks) change under vmap. It used to take rbg keys and train on other batches than fit.
  with pytest.raises(ValueError, match=r"Expected keys to be a threefry2x32 key.*got a rbg key"):
    M.fit_stacked(jax.random.split(key, 2), clf, M.stack_states([st, st]), x, y, epochs=1, batch_size=16,
                  shared=True)


@pytest.mark.parametrize("shared", [False, True])
def test_vmapped_stack_equals_the_per_model_loop(shared):
  # SGD, not Adam: Adam divides by sqrt(v) + eps, so coordinates whose gradient is ~0 move by
  # ~lr in a direction set by float rounding; with SGD the two paths differ only by the
  # summation order of vmapped convolutions (~1e-6 relative).
  m = 3
  pairs = [make(seed=i, tx=optax.sgd(0.05)) for i in range(m)]
  clf = pairs[0][0]
  clf = M.Classifier(clf.graphdef, optax.sgd(0.05))
  states = [p[1] for p in pairs]
  keys = jax.random.split(jax.random.key(7), m)
  if shared:
    x, y = toy(48)
    sizes = None
    xs, ys, sz = [x] * m, [y] * m, [None] * m
  else:
    data = [toy(48, seed=10 + i) for i in range(m)]
    x = np.stack([d[0] for d in data])
    y = np.stack([d[1] for d in data])
    sizes = np.array([48, 30, 17])  # ragged: padded rows beyond each size
    xs, ys, sz = list(x), list(y), list(sizes)
  stacked = M.fit_stacked(keys, clf, M.stack_states(states), x, y, epochs=2, batch_size=16, sizes=sizes,
                          shared=shared)
  for i in range(m):
    single = M.fit(keys[i], clf, states[i], xs[i], ys[i], epochs=2, batch_size=16,
                   size=None if sz[i] is None else int(sz[i]))
    got = M.unstack_state(stacked, i)
    leaves_close(got.params, single.params, rtol=1e-4, atol=1e-5)
    leaves_close(got.rest, single.rest, rtol=1e-4, atol=1e-5)
    assert int(got.step) == int(single.step)
  # Predictions of the stack equal per-model predictions.
  xt, _ = toy(20, seed=99)
  logits = M.predict_logits_stacked(clf, stacked, xt, chunk=8)
  for i in range(m):
    np.testing.assert_allclose(logits[i], M.predict_logits(clf, M.unstack_state(stacked, i), xt, chunk=8),
                               rtol=1e-4, atol=1e-4)


def test_predict_chunks_and_proba():
  x, _ = toy(37)
  clf, st = make()
  a = M.predict_logits(clf, st, x, chunk=10)
  b = M.predict_logits(clf, st, x, chunk=64)
  assert a.shape == (37, 4)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(M.predict_proba(clf, st, x).sum(-1), 1.0, rtol=1e-5)
  assert M.accuracy(np.eye(3)[[0, 1, 2, 1]], np.array([0, 1, 1, 1])) == 0.75


@pytest.mark.parametrize("kwargs,needle", [
    (dict(loss="hinge"), "loss"),
    (dict(loss="mae"), "soft targets"),
    (dict(batch_size=0), "batch_size"),
    (dict(epochs=-1), "epochs"),
    (dict(size=0), "size"),
    (dict(size=99), "size"),
    (dict(epochs=2**63), r"epochs=9223372036854775808 <= 1000000"),  # a TypeError inside threefry before
])
def test_bad_input_names_the_parameter(kwargs, needle):
  x, y = toy(16)
  clf, st = make()
  args = dict(epochs=1, batch_size=4)
  args.update(kwargs)
  with pytest.raises(ValueError, match=needle):
    M.fit(jax.random.key(0), clf, st, x, y, **args)


def test_bad_shapes():
  x, y = toy(16)
  clf, st = make()
  with pytest.raises(ValueError, match="targets"):
    M.fit(jax.random.key(0), clf, st, x, y[:8], epochs=1, batch_size=4)
  with pytest.raises(ValueError, match="rank"):
    M.fit(jax.random.key(0), clf, st, x[0], y, epochs=1, batch_size=4)
  with pytest.raises(ValueError, match="sizes"):
    M.fit_stacked(jax.random.split(jax.random.key(0), 1), clf, M.stack_states([st]), x[None], y[None],
                  epochs=1, batch_size=4, sizes=[17])
  # NaN used to become int32(NaN) = -2^31 (that model silently never trained), 2.5 became 2.
  two = M.stack_states([st, st])
  for bad, needle in (([np.nan, 8], r"sizes\[0\] to be an integer"), ([8, 2.5], r"sizes\[1\] to be an integer"),
                      ([8, 0], r"sizes\[1\]=0 >= 1"), ([8], r"shape \(2,\)")):
    with pytest.raises(ValueError, match=needle):
      M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, two, np.stack([x, x]), np.stack([y, y]),
                    epochs=1, batch_size=4, sizes=bad)


def test_bad_values_are_refused_before_training():
  x, y = toy(16)
  clf, st = make()

  def fit(xx, yy, loss="cross_entropy"):
    return M.fit(jax.random.key(0), clf, st, xx, yy, epochs=1, batch_size=4, loss=loss)

  bad_x = x.copy()
  bad_x[3, 2, 2, 0] = np.nan
  with pytest.raises(ValueError, match="finite images"):
    fit(bad_x, y)
  with pytest.raises(ValueError, match=r"labels in \[0, 4\) \(the model's classes\); found values in \[0, 4\]"):
    fit(x, np.where(np.arange(16) == 5, 4, y))  # one label past the model's 4 classes
  with pytest.raises(ValueError, match=r"found values in \[-1, 3\]"):
    fit(x, np.where(np.arange(16) == 5, -1, y))
  # Checked in their own dtype: cast to int32 first, 2**32 + 1 trained as label 1 and -2**32 + 2 as 2.
  y64 = y.astype(np.int64)
  for wide_label, needle in ((2**32 + 1, r"\[0, 4294967297\]"), (-2**32 + 2, r"\[-4294967294, 3\]")):
    with pytest.raises(ValueError, match=needle):
      fit(x, np.where(np.arange(16) == 5, wide_label, y64))
    with pytest.raises(ValueError, match=needle):
      M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, M.stack_states([st, st]), np.stack([x, x]),
                    np.stack([y64, np.where(np.arange(16) == 5, wide_label, y64)]), epochs=1, batch_size=4)
  ys = np.stack([y64, np.where(np.arange(16) == 15, 2**40, y64)])  # padding may hold anything
  M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, M.stack_states([st, st]), np.stack([x, x]), ys,
                epochs=1, batch_size=4, sizes=[16, 12])
  soft = np.eye(4, dtype=np.float32)[y]
  with pytest.raises(ValueError, match="4 columns"):
    fit(x, soft[:, :3])
  with pytest.raises(ValueError, match="probability rows"):
    fit(x, 2.0 * soft)
  with pytest.raises(ValueError, match="finite targets"):
    fit(x, np.where(soft > 0, np.nan, soft), loss="mse")
  fit(x, 2.0 * soft, loss="mse")  # regression targets (logits) need not be distributions
  wide = np.zeros((16, 10, 10, 1), np.float32)
  with pytest.raises(ValueError, match=r"model accepts; its forward pass fails on images of shape \(10, 10, 1\)"):
    fit(wide, y)


def test_stacked_padding_is_not_checked_but_records_are():
  x, y = toy(16)
  clf, st = make()
  states = M.stack_states([st, st])
  xs, ys = np.stack([x, x]), np.stack([y, y])
  xs[1, 12:] = np.nan  # model 1's padding (sizes[1] = 12)
  ys[1, 12:] = -1
  M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, states, xs, ys, epochs=1, batch_size=4,
                sizes=[16, 12])
  xs[1, 11] = np.nan  # a record model 1 trains on
  with pytest.raises(ValueError, match="finite images"):
    M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, states, xs, ys, epochs=1, batch_size=4,
                  sizes=[16, 12])


def test_predict_and_accuracy_refuse_bad_input():
  x, y = toy(8)
  clf, st = make()
  with pytest.raises(ValueError, match="finite images"):
    M.predict_logits(clf, st, np.full_like(x, np.nan))
  with pytest.raises(ValueError, match="model accepts"):
    M.predict_logits(clf, st, np.zeros((2, 10, 10, 1), np.float32))
  with pytest.raises(ValueError, match="model accepts"):
    M.predict_logits_stacked(clf, M.stack_states([st, st]), np.zeros((2, 10, 10, 1), np.float32))
  # These raised a 3-line vmap error, numpy's "Need at least one array to concatenate", and an IndexError.
  two = M.stack_states([st, st])
  with pytest.raises(ValueError, match=r"images for m=2 stacked models .* got shape \(3, 8"):
    M.predict_logits_stacked(clf, two, np.stack([x, x, x]), shared=False)
  with pytest.raises(ValueError, match="at least one image"):
    M.predict_logits_stacked(clf, two, x[:0])
  with pytest.raises(ValueError, match="stacked state"):
    M.fit_stacked(jax.random.split(jax.random.key(0), 1), clf, st, x[None], y[None], epochs=1, batch_size=4)
  logits = np.asarray(M.predict_logits(clf, st, x))
  with pytest.raises(ValueError, match=r"labels in \[0, 4\)"):
    M.accuracy(logits, np.full(8, 4))
  with pytest.raises(ValueError, match="integer labels"):
    M.accuracy(logits, y.astype(np.float32))


def test_accuracy_refuses_non_finite_and_empty_input():
  y = np.array([0, 1, 1])
  for bad in (np.nan, np.inf, -np.inf):
    logits = np.eye(3)[[0, 1, 1]]
    logits[2, 0] = bad
    with pytest.raises(ValueError, match="finite logits"):
      M.accuracy(logits, y)  # NaN used to score as a correct argmax (1.0)
  with pytest.raises(ValueError, match="at least one example"):
    M.accuracy(np.zeros((0, 3)), np.zeros(0, np.int32))  # used to return nan
  with pytest.raises(ValueError, match="at least one example"):
    M.accuracy(np.zeros((0, 4, 3)), np.zeros(4, np.int32))


def test_unstack_state_validates_the_index():
  states = [make(seed=i)[1] for i in range(3)]
  stacked = M.stack_states(states)
  for index, want in [(0, 0), (2, 2), (-1, 2), (-3, 0), (np.int64(1), 1), (jnp.int32(1), 1), (1.0, 1)]:
    leaves_close(M.unstack_state(stacked, index).params, states[want].params, rtol=0, atol=0)
  for index, needle in [(3, "index=3 <= 2"), (5, "index=5 <= 2"), (-4, "index=-4 >= -3"), (1.7, "index"),
                        ("1", "index"), (True, "index"), (None, "index")]:
    with pytest.raises(ValueError, match=needle):
      M.unstack_state(stacked, index)


def test_fit_and_accuracy_refuse_what_is_not_real_numbers():
  # float32 conversion parsed text and dropped imaginary parts; accuracy raised a TypeError on text logits.
  x, y = toy(16)
  clf, st = make()
  for bad, needle in ((x.astype(np.complex64), "images to hold real numbers"),
                      (x.astype(str), "images to hold real numbers"),
                      (x > 0.5, "images to hold real numbers")):
    with pytest.raises(ValueError, match=needle):
      M.fit(jax.random.key(0), clf, st, bad, y, epochs=1, batch_size=4)
  with pytest.raises(ValueError, match="targets to hold real numbers"):
    M.fit(jax.random.key(0), clf, st, x, y.astype(str), epochs=1, batch_size=4)
  with pytest.raises(ValueError, match="logits to hold real numbers"):
    M.accuracy(np.array([["1", "0"]]), np.array([0]))
  # bfloat16 reports NumPy kind 'V' and was refused with the text above; it is a real float type.
  logits = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]], jnp.bfloat16)
  assert M.accuracy(logits, np.array([0, 1, 1])) == pytest.approx(2 / 3)
  M.fit(jax.random.key(0), clf, st, jnp.asarray(x, jnp.bfloat16), y, epochs=0, batch_size=4)


def test_predict_refuses_images_that_are_not_real_numbers_and_bad_options():
  # jnp.asarray(images, float32) parsed numeric text and dropped imaginary parts; None and "abc" failed inside JAX.
  x, _ = toy(8)
  clf, st = make()
  two = M.stack_states([st, st])
  calls = (lambda b, **kw: M.predict_logits(clf, st, b, **kw), lambda b, **kw: M.predict_proba(clf, st, b, **kw),
           lambda b, **kw: M.predict_logits_stacked(clf, two, b, **kw))
  for bad in (x.astype(np.complex64) + 5j, x.astype(str), x > 0.5, None, "abc"):
    for call in calls:
      with pytest.raises(ValueError, match="Expected images to hold real numbers"):
        call(bad)
  # 1e30 and 2**63 failed inside JAX with a TypeError; every chunk is padded to `chunk` rows.
  for chunk, needle in ((1e30, "chunk=1000000000000000019884624838656 <= 65536"),
                        (2**63, "chunk=9223372036854775808 <= 65536"), (0, "chunk=0 >= 1"), (2.5, "chunk")):
    for call in calls:
      with pytest.raises(ValueError, match=needle):
        call(x, chunk=chunk)
  # "no" was truthy, so it meant shared=True; fit_stacked's shared=0 was blamed on the images' rank.
  for bad in ("no", 0, 1, None):
    with pytest.raises(ValueError, match="shared to be a bool"):
      M.predict_logits_stacked(clf, two, x, shared=bad)
    with pytest.raises(ValueError, match="shared to be a bool"):
      M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, two, x, np.zeros(8, np.int32), epochs=1,
                    batch_size=4, shared=bad)


def test_create_and_stack_states_refuse_what_is_not_a_model():
  # create(None, tx) built a Classifier of a None graph; create(model, None) raised an AttributeError.
  model = M.FedMDCNN(SPEC, 4, input_shape=SHAPE, rngs=nnx.Rngs(params=0))
  with pytest.raises(ValueError, match="model to be an nnx.Module; got NoneType"):
    M.create(None, optax.adam(1e-2))
  for tx in (None, "adam", 1e-2):
    with pytest.raises(ValueError, match="tx to be an optax GradientTransformation"):
      M.create(model, tx)
  _, st = M.create(model, optax.adam(1e-2))
  # "ab" raised a TypeError inside JAX; (-1,) was stacked into a "state" of one integer.
  for bad, needle in (("ab", "states to be a list or tuple"), (st, "states to be a list or tuple"),
                      ((-1,), r"states\[0\] to be a TrainState"), ([st, None], r"states\[1\] to be a TrainState"),
                      ([], "at least one state")):
    with pytest.raises(ValueError, match=needle):
      M.stack_states(bad)


def test_prediction_images_never_share_the_callers_memory():
  # jnp.asarray(images, jnp.float32) used a 64-byte-aligned float32 host array in place on CPU, and forward
  # passes run asynchronously: changing the images just after predict_logits could change its logits.
  from jaxdistill.models._training import _predict_images  # pylint: disable=import-outside-toplevel
  x, _ = toy(24, seed=2)
  images = aligned_copy(x)
  converted = _predict_images(images)
  images[...] = 0.0
  np.testing.assert_array_equal(np.asarray(converted), x)
