"""Training utilities for flax nnx classifiers, single and vmapped (stacked).

A model is handled functionally: :func:`create` splits an ``nnx.Module``
into a static :class:`Classifier` (graph definition + optax optimiser) and a
:class:`TrainState` pytree (parameters, other state such as batch
statistics, optimiser state). Training is a pure function of
``(key, state, data)``: the same per-model step runs either once per model
or under ``jax.vmap`` over *stacked* states (leading axis = model), so
several models of one architecture train as one batch.

Execution: one jitted step per batch, dispatched from a Python loop over the
epoch's batches (the batch is gathered on the host, so one compiled step
serves every data set size). XLA:CPU runs convolutions inside a
``lax.scan``/``while`` body about 10x slower than the same step dispatched
from Python (jax 0.10.2), and dispatch costs ~1 ms. On CPU the vmapped
stack is *slower* than a loop (grouped convolutions; see
``benchmarks/fedmd_vmap.py``); on accelerators it is the fast path.

One epoch over ``size`` valid records draws a uniform permutation from the
epoch key and cuts it into ``ceil(n / batch_size)`` batches; positions past
``size`` point at a valid record with weight 0 in the loss and are masked
out of the batch statistics, so records beyond ``size`` (padding of a
ragged stack) are never read at all. A model whose epoch has fewer batches
than its neighbours in the stack skips the extra steps (parameters, batch
statistics and optimiser state are left exactly unchanged). Model i of a
stack uses exactly the keys :func:`fit` would give it.

Losses (``loss=``):

* ``cross_entropy``: targets ``[n] int`` (hard labels) or ``[n, C] float``
  (soft labels, each row a distribution).

  .. math:: \\ell(z, y) = -\\sum_c y_c \\log \\mathrm{softmax}(z)_c

* ``mae`` / ``mse``: logit matching, targets ``[n, C] float``
  (FedMD's Digest in logits mode uses MAE).

  .. math:: \\ell(z, y) = \\tfrac1C \\sum_c |z_c - y_c| \\quad / \\quad \\tfrac1C \\sum_c (z_c - y_c)^2

plus ``model.regularization()`` if the model defines it.

Models follow the protocol
``model(x, *, train, key, mask) -> logits [B, C]`` (see
:class:`jaxdistill.models.FedMDCNN`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxdistill import _validate

__all__ = [
    "Classifier",
    "TrainState",
    "DivergedError",
    "LOSSES",
    "create",
    "stack_states",
    "unstack_state",
    "fit",
    "fit_stacked",
    "predict_logits",
    "predict_logits_stacked",
    "predict_proba",
    "accuracy",
]

LOSSES = ("cross_entropy", "mae", "mse")

#: Largest ``|target|`` that :func:`fit` accepts for ``loss="mse"``: far beyond any logit, far below the
#: float32 overflow of the squared errors (near 1.8e19).
MAX_MSE_TARGET = 1e15


class DivergedError(ValueError):
  """Training left NaN or inf parameters or batch statistics (raised by :func:`fit` / :func:`fit_stacked`).

  A ``ValueError`` like every other bad setting. A caller that chose the
  optimiser from its own settings (a ``learning_rate`` in its config) can
  catch this one and name them.

  Attributes:
    epochs: the epochs the failing call ran.
    models: the diverged models' indices in the stack (:func:`fit_stacked`); ``()`` for :func:`fit`.
  """

  def __init__(self, message: str, *, epochs: int, models: tuple[int, ...] = ()):
    super().__init__(message)
    self.epochs = epochs
    self.models = models


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training, as one pytree.

  Attributes:
    params: ``nnx.State`` of the ``nnx.Param`` variables.
    rest: ``nnx.State`` of every other variable (batch statistics).
    opt_state: optax state of ``params``.
    step: ``[] int32`` number of optimiser updates applied.

  A *stacked* state has a leading model axis ``[m, ...]`` on every leaf.
  """

  params: Any
  rest: Any
  opt_state: Any
  step: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class Classifier:
  """The static half of a model: graph definition and optimiser.

  Hashable by identity, so it can be a static argument of ``jax.jit``:
  create it once per architecture and reuse it.

  Attributes:
    graphdef: ``nnx.GraphDef`` of the module.
    tx: the optax optimiser.
  """

  graphdef: Any
  tx: optax.GradientTransformation

  def module(self, state: TrainState) -> nnx.Module:
    """The ``nnx.Module`` holding ``state`` (unstacked)."""
    return nnx.merge(self.graphdef, state.params, state.rest)


def create(model: nnx.Module, tx: optax.GradientTransformation) -> tuple[Classifier, TrainState]:
  """Splits ``model`` into a :class:`Classifier` and its :class:`TrainState`.

  >>> from jaxdistill.models import FedMDCNN, CNNSpec
  >>> clf, st = create(FedMDCNN(CNNSpec((4, 8), 0.2), 16, rngs=nnx.Rngs(params=0)), optax.adam(1e-3))
  >>> int(st.step)
  0

  Raises:
    ValueError: ``model`` is not an ``nnx.Module`` or ``tx`` not an optax
      optimiser (an object with ``init`` and ``update``).
  """
  if not isinstance(model, nnx.Module):
    raise ValueError(f"Expected model to be an nnx.Module; got {type(model).__name__}.")
  if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
    raise ValueError(f"Expected tx to be an optax GradientTransformation (init and update); got "
                     f"{type(tx).__name__}.")
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return Classifier(graphdef, tx), TrainState(params, rest, tx.init(params), jnp.zeros((), jnp.int32))


@jax.jit
def _stack(states):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


@jax.jit
def _take(stacked, index):
  return jax.tree.map(lambda x: x[index], stacked)


def stack_states(states: Sequence[TrainState]) -> TrainState:
  """Stacks same-architecture states along a new leading model axis.

  Raises:
    ValueError: ``states`` is not a non-empty list or tuple of
      :class:`TrainState` (from :func:`create`).
  """
  if not isinstance(states, (list, tuple)):
    raise ValueError(f"Expected states to be a list or tuple of TrainStates; got {type(states).__name__}.")
  if not states:
    raise ValueError("Expected at least one state to stack.")
  for i, state in enumerate(states):
    if not isinstance(state, TrainState):
      raise ValueError(f"Expected states[{i}] to be a TrainState (from models.create); got "
                       f"{type(state).__name__}.")
  return _stack(list(states))


def unstack_state(stacked: TrainState, index: int) -> TrainState:
  """Model ``index`` of a stacked state of ``m`` models.

  Raises:
    ValueError: ``index`` is not an integer in ``[-m, m - 1]`` (a bad index
      would otherwise be clamped to the last model or truncated). A traced
      index (under ``jax.jit``) is passed through unchecked.
  """
  if isinstance(index, jax.core.Tracer):
    return _take(stacked, index)
  leaves = jax.tree.leaves(stacked)
  if not leaves or any(np.ndim(x) == 0 for x in leaves):
    raise ValueError("Expected stacked to be a stacked state (a leading model axis on every leaf).")
  m = int(np.shape(leaves[0])[0])
  if isinstance(index, jax.Array):
    index = np.asarray(index)
  index = _validate.integer("index", index, minimum=-m, maximum=m - 1)
  return _take(stacked, jnp.int32(index % m))


def _per_example_loss(loss: str, logits: jax.Array, targets: jax.Array) -> jax.Array:
  if loss == "cross_entropy":
    if jnp.issubdtype(targets.dtype, jnp.integer):
      return optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return optax.softmax_cross_entropy(logits, targets)
  diff = logits - targets
  if loss == "mae":
    return jnp.mean(jnp.abs(diff), axis=-1)
  return jnp.mean(jnp.square(diff), axis=-1)


def _train_step(clf: Classifier, loss: str, state: TrainState, x: jax.Array, y: jax.Array,
                weight: jax.Array, key: jax.Array) -> TrainState:
  mask = weight > 0

  def loss_fn(params, rest):
    # Fresh Variable objects at this trace level (nnx refuses to mutate a
    # Variable created under an outer trace).
    model = nnx.merge(clf.graphdef, params, jax.tree.map(lambda v: v, rest))
    logits = model(x, train=True, key=key, mask=mask)
    per = _per_example_loss(loss, logits, y)
    value = jnp.sum(jnp.where(mask, per, 0.0) * weight) / jnp.maximum(jnp.sum(weight), 1.0)
    reg = getattr(model, "regularization", None)
    if reg is not None:
      value = value + reg()
    _, _, rest = nnx.split(model, nnx.Param, ...)
    return value, rest

  grads, rest = jax.grad(loss_fn, has_aux=True)(state.params, state.rest)
  updates, opt_state = clf.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return TrainState(params, rest, opt_state, state.step + 1)


def _epoch_plan(key: jax.Array, n: int, b: int, size: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Batches of one epoch: ``order [steps, b] int32``, ``weight [steps, b]``, ``keys [steps]``."""
  steps = -(-n // b)
  pad = steps * b - n
  pkey, dkey = jax.random.split(key)
  perm = jax.random.permutation(pkey, n)
  # Valid records first, in uniformly random order; padding rows after.
  order = perm[jnp.argsort(perm >= size, stable=True)]
  order = jnp.concatenate([order, jnp.zeros((pad,), order.dtype)])
  valid = jnp.arange(steps * b) < size
  # Padding positions point at a valid record (weight 0): rows beyond ``size``
  # are never gathered, so their content (even NaN) cannot reach any step.
  order = jnp.where(valid, order, order[0]).reshape(steps, b)
  weight = valid.astype(jnp.float32).reshape(steps, b)
  return order, weight, jax.random.split(dkey, steps)


def _masked_step(clf: Classifier, loss: str, state: TrainState, x: jax.Array, y: jax.Array,
                 weight: jax.Array, key: jax.Array) -> TrainState:
  new = _train_step(clf, loss, state, x, y, weight, key)
  active = jnp.any(weight > 0)
  # A model with no valid row in this batch (ragged stacks) is left exactly unchanged.
  return jax.tree.map(lambda a, c: jnp.where(active, a, c), new, state)


@functools.partial(jax.jit, static_argnames=("n", "b"))
def _plan_jit(key, size, *, n, b):
  return _epoch_plan(key, n, b, size)


@functools.partial(jax.jit, static_argnames=("n", "b"))
def _plan_stacked_jit(keys, sizes, *, n, b):
  return jax.vmap(lambda k, s: _epoch_plan(k, n, b, s))(keys, sizes)


# Steps take the gathered batch, not the data set: one compiled step serves
# every data set size (the gather is a cheap host-side numpy take).
# Keys travel as raw key data (host numpy) so a step costs one dispatch; ``impl`` (static) is the caller's key
# type: wrapped as JAX's default one, a threefry key under JAX_DEFAULT_PRNG_IMPL=rbg (what the CLI's seed keys are)
# failed with a TypeError, and rbg data of a matching shape would have been read as another type.
@functools.partial(jax.jit, static_argnames=("clf", "loss", "impl"), donate_argnums=(0,))
def _step_jit(state, x, y, weight, key_data, *, clf, loss, impl):
  return _masked_step(clf, loss, state, x, y, weight, jax.random.wrap_key_data(key_data, impl=impl))


@functools.partial(jax.jit, static_argnames=("clf", "loss", "impl"), donate_argnums=(0,))
def _step_stacked_jit(states, x, y, weight, key_data, *, clf, loss, impl):
  keys = jax.vmap(lambda d: jax.random.wrap_key_data(d, impl=impl))(key_data)
  return jax.vmap(functools.partial(_masked_step, clf, loss))(states, x, y, weight, keys)


def _copy(tree: Any) -> Any:
  # The step functions donate their state buffers; never donate the caller's.
  return jax.tree.map(jnp.copy, tree)


#: Most epochs one call of :func:`fit` / :func:`fit_stacked` runs (their keys are split up front).
MAX_EPOCHS = 1_000_000

#: Largest ``chunk`` of :func:`predict_logits` and friends: every chunk is padded to ``chunk`` images, so a
#: larger one only allocates padding (and 1e30 or 2**63 failed inside JAX with a TypeError).
MAX_CHUNK = 65_536


def _check_model(clf: Any, state: Any, state_name: str = "state") -> None:
  """ValueError unless ``clf`` is a :class:`Classifier` and ``state`` a :class:`TrainState` (from :func:`create`)."""
  if not isinstance(clf, Classifier):
    raise ValueError(f"Expected clf to be a Classifier (from models.create); got {type(clf).__name__}.")
  if not isinstance(state, TrainState):
    raise ValueError(f"Expected {state_name} to be a TrainState (from models.create); got {type(state).__name__}.")


def _float_leaves(tree: Any) -> list:
  return [a for a in jax.tree.leaves(tree) if jnp.issubdtype(a.dtype, jnp.inexact)]


@functools.partial(jax.jit, static_argnames=("lead",))
def _finite(tree: Any, *, lead: int) -> jax.Array:
  """Whether every float leaf of ``tree`` is finite: ``[]`` bool, or ``[m]`` per model (``lead=1``)."""
  per_leaf = [jnp.all(jnp.isfinite(a).reshape(a.shape[:lead] + (-1,)), axis=-1) for a in _float_leaves(tree)]
  return jnp.stack(per_leaf).all(axis=0) if per_leaf else jnp.ones((), bool)


@functools.partial(jax.jit, static_argnames=("lead",))
def _kept_finite(before: Any, after: Any, *, lead: int) -> jax.Array:
  """Whether no float element finite in ``before`` is NaN or inf in ``after`` (same structure), per model.

  Elements that were not finite before (a model's intended ``-inf`` logit mask kept in a variable) are not
  divergence, and are left alone.
  """
  per_leaf = [~jnp.any((jnp.isfinite(b) & ~jnp.isfinite(a)).reshape(a.shape[:lead] + (-1,)), axis=-1)
              for b, a in zip(_float_leaves(before), _float_leaves(after))]
  return jnp.stack(per_leaf).all(axis=0) if per_leaf else jnp.ones((), bool)


def _check_start(state: TrainState, stacked: bool) -> None:
  """ValueError if the parameters or batch statistics are NaN or inf before training (one device sync).

  Training from them can only give NaN; other variables may hold intended non-finite values (masks).
  """
  ok = np.asarray(_finite((state.params, nnx.filter_state(state.rest, nnx.BatchStat)), lead=int(stacked))).reshape(-1)
  if not ok.all():
    name = "states" if stacked else "state"
    which = f" (models {[int(i) for i in np.flatnonzero(~ok)]})" if stacked else ""
    raise ValueError(f"Expected {name} with finite parameters and batch statistics{which}; found NaN or inf "
                     "before training.")


def _learning_rate(state: TrainState, index: int | None) -> str:
  """`` (now X)`` when the optimiser's state records its learning rate (``optax.inject_hyperparams``), else ``""``."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]:
    if path and getattr(path[-1], "key", None) == "learning_rate":
      value = np.asarray(leaf if index is None else leaf[index])
      if value.size == 1:
        return f" (now {float(value):g})"
  return ""


def _check_trained(before: TrainState, after: TrainState, epochs: int, loss: str, stacked: bool) -> None:
  """DivergedError if training turned finite parameters or model variables into NaN or inf (one device sync).

  ``before`` is the caller's state, checked by :func:`_check_start` before training.
  """
  ok = np.asarray(_kept_finite((before.params, before.rest), (after.params, after.rest), lead=int(stacked)))
  if ok.all():
    return
  ok = np.broadcast_to(ok, np.shape(after.step)[:int(stacked)])
  bad = tuple(int(i) for i in np.flatnonzero(~ok.reshape(-1)))
  who = f"Training of models {list(bad)} of {ok.size}" if stacked else "Training"
  hint = " or check the targets (finite, moderate scale)" if loss != "cross_entropy" else ""
  rate = _learning_rate(after, bad[0] if stacked else None)
  raise DivergedError(f"{who} diverged (NaN or inf parameters or batch statistics after {epochs} "
                      f"epoch{'s' * (epochs != 1)}); lower the learning rate of clf.tx{rate}{hint}.",
                      epochs=epochs, models=bad if stacked else ())


def _real(name: str, value: Any) -> np.ndarray:
  """``value`` as an array of integers or floats (no copy), or a ValueError naming ``name``.

  Text, bools and complex numbers are refused: float32 conversion parsed text and dropped imaginary parts.
  """
  arr = np.asarray(value)
  if arr.dtype.kind not in "fiu" and not (arr.dtype.kind == "V" and _validate.is_float_like(arr.dtype)):
    # bfloat16 (and JAX's other extension floats) report kind 'V' and were refused.
    raise ValueError(f"Expected {name} to hold real numbers; got dtype {arr.dtype}.")
  return arr


def _check_fit(images: Any, targets: Any, loss: str, batch_size: Any, epochs: Any,
               lead: int) -> tuple[np.ndarray, np.ndarray, str, int, int]:
  loss = _validate.choice("loss", loss, LOSSES)
  batch_size = _validate.integer("batch_size", batch_size, minimum=1)
  epochs = _validate.integer("epochs", epochs, minimum=0, maximum=MAX_EPOCHS)
  images = _real("images", images).astype(np.float32, copy=False)
  targets = _real("targets", targets)
  if images.ndim != 4 + lead:
    raise ValueError(f"Expected images of rank {4 + lead} ([{'m, ' * lead}n, H, W, C]); "
                     f"got shape {images.shape}.")
  if targets.shape[:lead + 1] != images.shape[:lead + 1] or targets.ndim not in (lead + 1, lead + 2):
    raise ValueError(f"Expected targets of shape {images.shape[:lead + 1]} (labels) or "
                     f"{images.shape[:lead + 1]} + (C,) (soft targets); got {targets.shape}.")
  if targets.ndim == lead + 1:
    if loss != "cross_entropy":
      raise ValueError(f"Expected soft targets [n, C] for loss={loss!r}; got integer labels.")
    if not np.issubdtype(targets.dtype, np.integer):
      raise ValueError(f"Expected integer labels; got dtype {targets.dtype}.")
    # Kept in their own dtype: _check_values range-checks them before the cast to int32 (cast first, label
    # 2**32 + 1 trained as 1).
  else:
    targets = targets.astype(np.float32)
  if images.shape[lead] < 1:
    raise ValueError("Expected at least one training record.")
  return images, targets, loss, batch_size, epochs


def _stacked_count(states: TrainState) -> int:
  """m of a stacked state; ValueError for a state of one model (no leading model axis)."""
  step = jax.tree.leaves(states.step)[0]
  if jnp.ndim(step) != 1:
    raise ValueError(f"Expected a stacked state (stack_states; a leading model axis); got a step counter of shape "
                     f"{jnp.shape(step)}.")
  return int(step.shape[0])


def _output_classes(clf: Classifier, state: TrainState, image_shape: tuple[int, ...], stacked: bool) -> int:
  """C of the model's logits for one image of ``image_shape`` (shapes only); ValueError if it rejects it."""
  one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:] if stacked else a.shape, a.dtype), state)
  try:
    out = jax.eval_shape(lambda st, x: _forward_jit(st, x, clf=clf), one,
                         jax.ShapeDtypeStruct((1, *image_shape), jnp.float32))
  except (TypeError, ValueError) as err:
    raise ValueError(f"Expected images the model accepts; its forward pass fails on images of shape "
                     f"{image_shape} ({_validate.describe_error(err, limit=120)}).") from None
  return int(out.shape[-1])


def _check_values(clf: Classifier, state: TrainState, images: np.ndarray, targets: np.ndarray, loss: str,
                  lead: int, stacked: bool, valid: np.ndarray | None) -> np.ndarray:
  """Data the model can train on: an image shape it accepts, finite pixels, targets for its classes.

  ``valid`` masks the rows that train (``images.shape[:lead + 1]``; None: all), so padding is not checked.
  Returns the targets as trained: labels as int32 (range-checked first, in their own dtype), soft targets as
  given (float32).
  """
  classes = _output_classes(clf, state, tuple(images.shape[lead + 1:]), stacked)
  masked = valid is not None and not valid.all()
  # Padding past size/sizes may hold anything: only the training rows are checked (copied only if needed).
  if not np.isfinite(images).all() and not (masked and np.isfinite(images[valid]).all()):
    raise ValueError("Expected finite images; found NaN or inf.")
  y = targets[valid] if masked else targets
  if targets.ndim == lead + 1:
    if y.size and (y.min() < 0 or y.max() >= classes):
      raise ValueError(f"Expected labels in [0, {classes}) (the model's classes); found values in "
                       f"[{y.min()}, {y.max()}].")
    return targets.astype(np.int32)
  if targets.shape[-1] != classes:
    raise ValueError(f"Expected soft targets with {classes} columns (the model's classes); got shape "
                     f"{targets.shape}.")
  if not np.isfinite(y).all():
    raise ValueError("Expected finite targets; found NaN or inf.")
  if loss == "mse" and y.size and np.abs(y).max() > MAX_MSE_TARGET:
    # Larger targets overflow the squared errors in float32: the parameters would turn NaN.
    raise ValueError(f"Expected targets for loss='mse' within +-{MAX_MSE_TARGET:g} (logits); found |targets| up to "
                     f"{np.abs(y).max():.3g}.")
  if loss == "cross_entropy" and y.size and (y.min() < 0 or np.abs(y.sum(-1) - 1.0).max() > 1e-3):
    raise ValueError("Expected soft targets for loss='cross_entropy' to be probability rows (nonnegative, "
                     f"summing to 1); found entries down to {y.min():.3g} and row sums in "
                     f"[{y.sum(-1).min():.4g}, {y.sum(-1).max():.4g}].")
  return targets


def fit(key: jax.Array, clf: Classifier, state: TrainState, images: Any, targets: Any, *,
        epochs: int, batch_size: int, loss: str = "cross_entropy", size: Any = None) -> TrainState:
  """Trains one model for ``epochs`` epochs (Adam or whatever ``clf.tx`` is).

  Args:
    key: PRNG key (shuffling and dropout).
    clf: the model's :class:`Classifier`.
    state: its :class:`TrainState`.
    images: ``[n, H, W, C] float32``.
    targets: ``[n] int`` labels or ``[n, C] float32`` soft targets / logits.
    epochs: E, in ``[0, 1_000_000]``.
    batch_size: B >= 1 (capped at n).
    loss: one of :data:`LOSSES`.
    size: use only the first ``size`` records (default n).

  Returns:
    The trained state.

  Raises:
    ValueError: ``clf`` / ``state`` not from :func:`create`; bad shapes, an
      unknown loss or a bad size; images the model does not accept or with
      NaN/inf pixels; labels outside the model's classes; soft targets of
      another width, non-finite, (for ``cross_entropy``) not probability
      rows, or (for ``mse``) beyond +-:data:`MAX_MSE_TARGET`. Only the
      records that train (the first ``size``) are checked. A ``state`` with
      NaN or inf parameters is refused before training (it cannot recover).
    DivergedError: a ``ValueError``: training left NaN or inf parameters or
      batch statistics (too large a learning rate), checked once per call.
  """
  key = _validate.prng_key("key", key)
  _check_model(clf, state)
  images, targets, loss, batch_size, epochs = _check_fit(images, targets, loss, batch_size, epochs, 0)
  n = images.shape[0]
  size = n if size is None else _validate.integer("size", size, minimum=1, maximum=n)
  targets = _check_values(clf, state, images, targets, loss, 0, False, np.arange(n) < size)
  if epochs == 0:
    return state
  _check_start(state, stacked=False)
  b = min(batch_size, n)
  trained = _copy(state)
  impl = jax.random.key_impl(key)
  for ekey in jax.random.split(key, epochs):
    order, weight, skeys = _plan_jit(ekey, jnp.int32(size), n=n, b=b)
    order, weight, skeys = np.asarray(order), np.asarray(weight), np.asarray(jax.random.key_data(skeys))
    # A Python loop over jitted steps (see the module docstring, "Execution").
    for s in range(order.shape[0]):
      trained = _step_jit(trained, images[order[s]], targets[order[s]], weight[s], skeys[s], clf=clf, loss=loss,
                          impl=impl)
  _check_trained(state, trained, epochs, loss, stacked=False)
  return trained


def fit_stacked(keys: jax.Array, clf: Classifier, states: TrainState, images: Any, targets: Any, *,
                epochs: int, batch_size: int, loss: str = "cross_entropy", sizes: Any = None,
                shared: bool = False) -> TrainState:
  """Trains m same-architecture models at once under ``jax.vmap``.

  Model i gets key ``keys[i]`` and its own data ``images[i][:sizes[i]]``
  (or, with ``shared=True``, the same ``images`` for all). It runs the same
  steps as calling :func:`fit` on each model in turn. Vmapped convolutions
  may sum in another order, so the parameters agree up to float rounding,
  with one exception under Adam: a parameter whose exact gradient is 0 (the
  FedMD CNN's convolution biases, which BatchNorm cancels) gets a
  rounding-noise gradient that Adam scales to a step of about the learning
  rate, so those biases drift apart (measured). BatchNorm removes them again
  in training mode; in eval mode its running mean lags them slightly.

  Args:
    keys: ``[m]`` threefry2x32 PRNG keys (rbg keys are refused: their draws change under vmap).
    clf: the shared :class:`Classifier`.
    states: stacked :class:`TrainState` (leading axis m).
    images: ``[m, n, H, W, C]`` or, if ``shared``, ``[n, H, W, C]``.
    targets: ``[m, n]`` / ``[m, n, C]`` or, if ``shared``, ``[n]`` / ``[n, C]``.
    epochs: E, in ``[0, 1_000_000]``.
    batch_size: B >= 1.
    loss: one of :data:`LOSSES`.
    sizes: ``[m] int`` valid records per model (ragged data padded to n);
      default n for all.
    shared: whether all models train on the same data (a bool).

  Returns:
    The stacked trained states.

  Raises:
    ValueError: as :func:`fit` (model i's rows past ``sizes[i]`` are padding
      and are not checked); mismatched m, sizes or keys; a non-bool ``shared``.
    DivergedError: as :func:`fit`; its ``models`` lists the diverged models.
  """
  keys = _validate.prng_key("keys", keys, batched=True, threefry=True)  # rbg batch orders change under vmap
  _check_model(clf, states, "states")
  shared = _validate.boolean("shared", shared)
  images, targets, loss, batch_size, epochs = _check_fit(images, targets, loss, batch_size, epochs,
                                                         0 if shared else 1)
  m = _stacked_count(states)
  n = images.shape[0 if shared else 1]
  if not shared and images.shape[0] != m:
    raise ValueError(f"Expected data for m={m} models; got images of shape {images.shape}.")
  if sizes is None:
    sizes = np.full(m, n)
  raw = np.asarray(sizes)
  if raw.shape != (m,):
    raise ValueError(f"Expected sizes of shape ({m},) in [1, {n}]; got shape {raw.shape}.")
  # Each entry as fit()'s size: an integer (NaN or 2.5 would be cast to int silently).
  sizes = np.array([_validate.integer(f"sizes[{i}]", v, minimum=1, maximum=n) for i, v in enumerate(raw.tolist())],
                   dtype=np.int64)
  keys = jnp.asarray(keys)
  if keys.shape[0] != m:
    raise ValueError(f"Expected {m} keys; got {keys.shape[0]}.")
  record = np.arange(n)
  targets = _check_values(clf, states, images, targets, loss, 0 if shared else 1, True,
                          record < sizes.max() if shared else record[None, :] < sizes[:, None])
  if epochs == 0:
    return states
  _check_start(states, stacked=True)
  b = min(batch_size, n)
  sizes = jnp.asarray(sizes, jnp.int32)
  trained = _copy(states)
  # Model i's epoch keys are split(keys[i], epochs), exactly as in fit().
  ekeys = jax.vmap(lambda k: jax.random.split(k, epochs))(keys)
  rows = np.arange(m)[:, None]
  impl = jax.random.key_impl(keys)
  for e in range(epochs):
    order, weight, skeys = _plan_stacked_jit(ekeys[:, e], sizes, n=n, b=b)
    order, weight, skeys = np.asarray(order), np.asarray(weight), np.asarray(jax.random.key_data(skeys))
    for s in range(order.shape[1]):
      idx = order[:, s]
      x = images[idx] if shared else images[rows, idx]
      y = targets[idx] if shared else targets[rows, idx]
      trained = _step_stacked_jit(trained, x, y, weight[:, s], skeys[:, s], clf=clf, loss=loss, impl=impl)
  _check_trained(states, trained, epochs, loss, stacked=True)
  return trained


@functools.partial(jax.jit, static_argnames=("clf",))
def _forward_jit(state, x, *, clf):
  return nnx.merge(clf.graphdef, state.params, state.rest)(x, train=False)


@functools.partial(jax.jit, static_argnames=("clf", "shared"))
def _forward_stacked_jit(states, x, *, clf, shared):
  fn = lambda st, xb: nnx.merge(clf.graphdef, st.params, st.rest)(xb, train=False)
  return jax.vmap(fn, in_axes=(0, None if shared else 0))(states, x)


def _chunks(n: int, c: int) -> list[tuple[int, int]]:
  return [(i, min(i + c, n)) for i in range(0, n, c)]


def _pad_to(x: jax.Array, c: int, axis: int) -> jax.Array:
  pad = c - x.shape[axis]
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def _predict_images(images: Any) -> jax.Array:
  """``images`` as float32, or a ValueError naming ``images`` (text, complex, bool or object data, or no array).

  ``jnp.asarray(images, jnp.float32)`` parsed numeric text and dropped imaginary parts; a tracer is checked by
  its dtype alone.
  """
  arr = images
  if not isinstance(arr, jax.Array):
    try:
      arr = np.asarray(arr)
    except (TypeError, ValueError):  # ragged nesting
      raise ValueError(f"Expected images to be an array of real numbers; got {type(images).__name__}.") from None
  dtype = np.dtype(arr.dtype)
  if dtype.kind not in "fiu" and not (dtype.kind == "V" and _validate.is_float_like(dtype)):
    raise ValueError(f"Expected images to hold real numbers; got {type(images).__name__} of dtype {dtype}.")
  return _validate.owned_device_array(arr, np.float32)  # never the caller's host memory (see there)


def _check_predict(clf: Classifier, state: TrainState, images: jax.Array, *, stacked: bool) -> None:
  if isinstance(images, jax.core.Tracer):
    return
  _output_classes(clf, state, tuple(images.shape[-3:]), stacked)
  if not bool(jnp.isfinite(images).all()):
    raise ValueError("Expected finite images; found NaN or inf.")


def predict_logits(clf: Classifier, state: TrainState, images: Any, *, chunk: int = 512) -> jax.Array:
  """Eval-mode logits ``[n, C] float32`` of ``images: [n, H, W, C]``, in chunks.

  Args:
    clf: the model's :class:`Classifier`.
    state: its :class:`TrainState`.
    images: real numbers (integer or float dtype).
    chunk: images per forward pass, in ``[1, MAX_CHUNK]`` (65,536); every chunk is padded to this size.

  Raises:
    ValueError: images not of a real dtype (text, complex, bool, objects), of another rank or shape than the
      model takes, or with NaN/inf pixels; a bad ``chunk``.
  """
  _check_model(clf, state)
  c = _validate.integer("chunk", chunk, minimum=1, maximum=MAX_CHUNK)
  images = _predict_images(images)
  if images.ndim != 4 or images.shape[0] < 1:
    raise ValueError(f"Expected images of shape [n >= 1, H, W, C]; got {images.shape}.")
  _check_predict(clf, state, images, stacked=False)
  n = images.shape[0]
  # Every chunk is padded to c rows, so one compiled forward serves every n.
  out = [_forward_jit(state, _pad_to(images[a:b], c, 0), clf=clf)[:b - a] for a, b in _chunks(n, c)]
  return jnp.concatenate(out)


def predict_logits_stacked(clf: Classifier, states: TrainState, images: Any, *, shared: bool = True,
                           chunk: int = 512) -> jax.Array:
  """Eval-mode logits ``[m, n, C]`` of m stacked models (vmapped).

  Args:
    clf: shared classifier.
    states: stacked states (leading axis m).
    images: ``[n, H, W, C]`` if ``shared`` else ``[m, n, H, W, C]`` (real numbers).
    shared: whether all models see the same images (a bool).
    chunk: images per forward pass, in ``[1, MAX_CHUNK]`` (65,536).

  Raises:
    ValueError: as :func:`predict_logits`; a non-bool ``shared``; images for another number of models.
  """
  _check_model(clf, states, "states")
  shared = _validate.boolean("shared", shared)
  c = _validate.integer("chunk", chunk, minimum=1, maximum=MAX_CHUNK)
  images = _predict_images(images)
  if images.ndim != (4 if shared else 5):
    raise ValueError(f"Expected images of rank {4 if shared else 5}; got shape {images.shape}.")
  m = _stacked_count(states)
  if not shared and images.shape[0] != m:
    raise ValueError(f"Expected images for m={m} stacked models (shared=False); got shape {images.shape}.")
  _check_predict(clf, states, images, stacked=True)
  axis = 0 if shared else 1
  n = images.shape[axis]
  if n == 0:
    raise ValueError(f"Expected at least one image; got shape {images.shape}.")
  out = []
  for a, b in _chunks(n, c):
    x = images[a:b] if shared else images[:, a:b]
    out.append(_forward_stacked_jit(states, _pad_to(x, c, axis), clf=clf, shared=shared)[:, :b - a])
  return jnp.concatenate(out, axis=1)


def predict_proba(clf: Classifier, state: TrainState, images: Any, *, chunk: int = 512) -> jax.Array:
  """Eval-mode class probabilities ``[n, C] float32``.

  Raises:
    ValueError: as :func:`predict_logits`.
  """
  return jax.nn.softmax(predict_logits(clf, state, images, chunk=chunk), axis=-1)


def accuracy(logits: Any, labels: Any) -> float:
  """Top-1 accuracy (float64 on the host) of ``logits: [..., n, C]`` against ``labels: [n]``.

  For stacked logits ``[m, n, C]`` returns the mean over models (per-model
  values: ``np.mean(np.argmax(logits, -1) == labels, axis=-1)``).

  Raises:
    ValueError: on mismatched shapes, empty input (no examples, classes or
      models), NaN or inf logits, or labels outside the logits' classes.
  """
  logits = _real("logits", logits)
  labels = np.asarray(labels)
  if labels.ndim != 1 or logits.ndim < 2 or logits.shape[-2] != labels.shape[0]:
    raise ValueError(f"Expected logits [..., n, C] and labels [n]; got {logits.shape} and {labels.shape}.")
  if logits.size == 0:
    raise ValueError(f"Expected at least one example and one class; got logits of shape {logits.shape}.")
  if not np.isfinite(logits).all():
    raise ValueError("Expected finite logits; found NaN or inf.")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"Expected integer labels; got dtype {labels.dtype}.")
  if labels.size and (labels.min() < 0 or labels.max() >= logits.shape[-1]):
    raise ValueError(f"Expected labels in [0, {logits.shape[-1]}) (the logits' classes); found values in "
                     f"[{labels.min()}, {labels.max()}].")
  return float(np.mean(np.argmax(logits, axis=-1) == labels, dtype=np.float64))
