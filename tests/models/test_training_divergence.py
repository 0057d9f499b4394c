"""fit / fit_stacked / predict refuse what is not a model from create(), and report diverged training."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxdistill import models as M

SHAPE = (8, 8, 1)
SPEC = M.CNNSpec((2, 4), 0.0)


@functools.cache
def make(learning_rate):
  """One classifier per step size (Adam that records it), shared by the tests: one compilation each."""
  tx = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)
  return M.create(M.FedMDCNN(SPEC, 4, input_shape=SHAPE, rngs=nnx.Rngs(params=0)), tx)


def data(n=16):
  rng = np.random.default_rng(0)
  return rng.random((n,) + SHAPE, dtype=np.float32), (np.arange(n) % 4).astype(np.int32)


def test_what_is_not_from_create_is_refused_naming_the_argument():
  # Both used to fail with AttributeError ('NoneType' object has no attribute 'graphdef' / 'params').
  x, y = data()
  clf, st = make(1e-3)
  with pytest.raises(ValueError, match=r"Expected clf to be a Classifier .*; got NoneType"):
    M.fit(jax.random.key(0), None, st, x, y, epochs=1, batch_size=4)
  with pytest.raises(ValueError, match=r"Expected state to be a TrainState .*; got dict"):
    M.fit(jax.random.key(0), clf, {}, x, y, epochs=1, batch_size=4)
  with pytest.raises(ValueError, match=r"Expected states to be a TrainState .*; got NoneType"):
    M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, None, x, y, epochs=1, batch_size=4, shared=True)
  with pytest.raises(ValueError, match=r"Expected clf to be a Classifier .*; got str"):
    M.predict_logits("clf", st, x)
  with pytest.raises(ValueError, match=r"Expected states to be a TrainState .*; got NoneType"):
    M.predict_logits_stacked(clf, None, x)


def test_diverged_training_raises_instead_of_returning_nan_weights():
  # Adam at 1e30 used to return NaN / inf weights (or inf batch statistics, which made every logit 0) silently.
  x, y = data()
  clf, st = make(1e30)
  with pytest.raises(M.DivergedError, match=r"^Training diverged \(NaN or inf parameters or batch statistics after 2 "
                                            r"epochs\); lower the learning rate of clf\.tx \(now 1e\+30\)\.$") as err:
    M.fit(jax.random.key(0), clf, st, x, y, epochs=2, batch_size=4)
  assert isinstance(err.value, ValueError) and err.value.epochs == 2 and err.value.models == ()
  with pytest.raises(M.DivergedError, match=r"^Training of models \[0, 1\] of 2 diverged .* after 1 epoch\); "
                                            r"lower the learning rate of clf\.tx \(now 1e\+30\)\.$") as err:
    M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, M.stack_states([st, st]), x, y, epochs=1,
                  batch_size=4, shared=True)
  assert err.value.models == (0, 1)


def test_a_state_that_is_already_non_finite_is_named_as_such():
  x, y = data()
  clf, st = make(1e30)
  bad = st.replace(params=jax.tree.map(lambda a: a * np.nan, st.params))
  with pytest.raises(ValueError, match=r"Expected state with finite parameters .*; found NaN or inf before training"):
    M.fit(jax.random.key(0), clf, bad, x, y, epochs=1, batch_size=4)


def test_mse_targets_beyond_float32_squares_are_refused_before_training():
  # 1e38 logit targets overflowed the squared error: the returned parameters were NaN and so were the logits.
  x, _ = data()
  clf, st = make(1e-3)
  with pytest.raises(ValueError, match=r"targets for loss='mse' within \+-1e\+15 .*found \|targets\| up to 1e\+38"):
    M.fit(jax.random.key(0), clf, st, x, np.full((16, 4), 1e38, np.float32), epochs=1, batch_size=4, loss="mse")
  # Checked before training, so epochs=0 shows what is accepted without compiling a step.
  M.fit(jax.random.key(0), clf, st, x, np.full((16, 4), 1e38, np.float32), epochs=0, batch_size=4, loss="mae")
  M.fit(jax.random.key(0), clf, st, x, np.full((16, 4), M.MAX_MSE_TARGET, np.float32), epochs=0, batch_size=4,
        loss="mse")


class _Mask(nnx.Variable):
  pass


class _MaskedNet(nnx.Module):
  """A linear model with an additive -inf logit mask held in a (non-parameter) variable: a common idiom."""

  def __init__(self, rngs):
    self.lin = nnx.Linear(16, 4, rngs=rngs)
    self.mask = _Mask(jnp.array([0.0, 0.0, -jnp.inf, -jnp.inf]))

  def __call__(self, x, train=False, key=None, mask=None):
    return self.lin(x.reshape(x.shape[0], -1)) + self.mask[...]


def test_intended_non_finite_variables_are_not_divergence():
  # The -inf mask made every fit end in "found NaN or inf before training", after training all its epochs.
  rng = np.random.default_rng(0)
  x, y = rng.random((32, 4, 4, 1), dtype=np.float32), (np.arange(32) % 2).astype(np.int32)
  clf, st = M.create(_MaskedNet(nnx.Rngs(0)), optax.adam(1e-2))
  trained = M.fit(jax.random.key(0), clf, st, x, y, epochs=2, batch_size=8)
  assert all(np.isfinite(a).all() for a in jax.tree.leaves(trained.params))
  logits = np.asarray(M.predict_logits(clf, trained, x))
  assert np.isfinite(logits[:, :2]).all() and (logits[:, 2:] == -np.inf).all()
  stacked = M.fit_stacked(jax.random.split(jax.random.key(1), 2), clf, M.stack_states([st, st]), x, y, epochs=1,
                          batch_size=8, shared=True)
  assert all(np.isfinite(a).all() for a in jax.tree.leaves(stacked.params))


def test_non_finite_batch_statistics_are_refused_before_training():
  x, y = data()
  clf, st = make(1e-3)
  # Only the batch statistics (BatchNorm's running mean and variance) are NaN: every parameter is finite.
  rest = jax.tree.map(lambda a: a * np.nan if jnp.issubdtype(a.dtype, jnp.floating) else a, st.rest)
  assert jax.tree.leaves(nnx.filter_state(st.rest, nnx.BatchStat))
  with pytest.raises(ValueError, match=r"Expected states with finite parameters and batch statistics \(models \[1\]\); "
                                       r"found NaN or inf before training\.$"):
    M.fit_stacked(jax.random.split(jax.random.key(0), 2), clf, M.stack_states([st, st.replace(rest=rest)]), x, y,
                  epochs=1, batch_size=4, shared=True)
