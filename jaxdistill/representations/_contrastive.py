"""A contrastive CNN encoder learned on D_pub alone (flax nnx + optax).

SimCLR-style training (NT-Xent over two augmented views) with mined
positives: with probability ``neighbour_fraction`` the second view is an
augmented copy of one of the anchor's ``num_neighbours`` nearest public
neighbours in HOG space instead of the anchor itself (the idea of NNCLR,
Dwibedi et al. 2021, with a fixed HOG neighbourhood). The neighbours make
the encoder pull together public images that HOG already finds similar,
while the augmentations (small shifts, horizontal flips, pixel noise) make
it invariant to nuisances HOG is sensitive to.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxdistill import _validate
from jaxdistill.representations._base import Representation, check_trained, public_images, register, unit_rows
from jaxdistill.representations._classic import Hog

__all__ = ["ContrastiveConfig", "ContrastiveEncoder", "fit_contrastive", "augment"]

MIN_TEMPERATURE = 1e-3
#: Most optimisation steps of :func:`fit_contrastive` / :func:`~jaxdistill.representations.fit_scan` (2**63 was
#: accepted and the fit ran forever).
MAX_STEPS = 10_000_000
#: Widest layer (``width``, ``feature_dim``, ``projection_dim``), as :data:`jaxdistill.models.MAX_WIDTH`.
MAX_WIDTH = 8192
#: Largest ``max_shift`` (pixels): far beyond the images here (a shift past the image's size leaves it blank);
#: every view is padded by it on each side.
MAX_SHIFT = 256
#: Largest batch or neighbour count: int32, the device's index type.
MAX_COUNT = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class ContrastiveConfig:
  """Hyperparameters of :func:`fit_contrastive` (all safe to log).

  Attributes:
    width: channels of the first convolution (the second has 2 x width); each of the three sizes is at most
      ``MAX_WIDTH`` (8192).
    feature_dim: backbone feature size.
    projection_dim: projection-head output size (the default output).
    steps: optimisation steps, at most ``MAX_STEPS`` (10**7).
    batch_size: anchors per step (2 x batch_size views), in ``[2, 2**31 - 1]``.
    learning_rate: peak AdamW learning rate (cosine decay to 0).
    weight_decay: AdamW weight decay.
    temperature: NT-Xent temperature tau, at least ``MIN_TEMPERATURE`` = 1e-3.
    neighbour_fraction: probability that the positive is a HOG neighbour
      rather than the anchor itself (0 = plain SimCLR).
    num_neighbours: HOG neighbours per public image to draw positives from (at most 2**31 - 1;
      another value than the default (5) only with ``neighbour_fraction > 0``).
    max_shift: largest random translation, in pixels, at most ``MAX_SHIFT`` (256).
    noise: standard deviation of the additive pixel noise.
    flip: random horizontal flips.
    output: ``"projection"`` (unit-norm head output; best cluster purity in
      our measurements) or ``"backbone"`` (unit-norm backbone features).
  """

  width: int = 16
  feature_dim: int = 256
  projection_dim: int = 64
  steps: int = 2000
  batch_size: int = 256
  learning_rate: float = 2e-3
  weight_decay: float = 1e-4
  temperature: float = 0.2
  neighbour_fraction: float = 0.5
  num_neighbours: int = 5
  max_shift: int = 2
  noise: float = 0.03
  flip: bool = True
  output: str = "projection"

  def __post_init__(self):
    # The validated Python ints are kept: a whole float (2.0) would otherwise reach layer and array shapes.
    # Capped so that a typo (2**63 steps) fails here, not by running forever or inside JAX.
    for name, cap in (("width", MAX_WIDTH), ("feature_dim", MAX_WIDTH), ("projection_dim", MAX_WIDTH),
                      ("steps", MAX_STEPS), ("num_neighbours", MAX_COUNT)):
      object.__setattr__(self, name, _validate.integer(name, getattr(self, name), minimum=1, maximum=cap))
    # One anchor leaves NT-Xent only its positive: the loss is 0 and nothing trains.
    object.__setattr__(self, "batch_size", _validate.integer("batch_size", self.batch_size, minimum=2,
                                                             maximum=MAX_COUNT))
    object.__setattr__(self, "max_shift", _validate.integer("max_shift", self.max_shift, minimum=0,
                                                            maximum=MAX_SHIFT))
    # The validated Python floats and bool are kept too: a jnp.float32(0.2) passed the checks, then made the
    # config unhashable as a static jit argument, failing inside training with JAX's multi-line message.
    object.__setattr__(self, "weight_decay", _validate.nonnegative("weight_decay", self.weight_decay))
    object.__setattr__(self, "learning_rate", _validate.learning_rate(self.learning_rate,
                                                                      weight_decay=self.weight_decay))
    temperature = _validate.positive("temperature", self.temperature)
    if temperature < MIN_TEMPERATURE:
      # Logits are cosines / tau; far below this 1 / tau overflows float32 and the loss is NaN.
      raise ValueError(f"Expected temperature >= {MIN_TEMPERATURE}; got {temperature!r}.")
    object.__setattr__(self, "temperature", temperature)
    object.__setattr__(self, "neighbour_fraction",
                       _validate.probability("neighbour_fraction", self.neighbour_fraction))
    if self.neighbour_fraction == 0 and self.num_neighbours != 5:  # no neighbours are mined: it was ignored
      raise ValueError(f"Expected num_neighbours={self.num_neighbours} only with neighbour_fraction > 0 (plain "
                       "SimCLR draws no neighbour positives; elsewhere it is ignored); got neighbour_fraction=0.")
    object.__setattr__(self, "noise", _validate.nonnegative("noise", self.noise))
    object.__setattr__(self, "flip", _validate.boolean("flip", self.flip))
    _validate.choice("output", self.output, ("projection", "backbone"))


def backbone(layers: nnx.Module, x: jax.Array) -> jax.Array:
  """The encoder's backbone features, from any module holding its ``conv1``, ``conv2`` and ``dense`` layers."""
  x = jax.nn.relu(layers.conv1(x))
  x = jax.nn.relu(layers.conv2(x))
  return layers.dense(x.reshape(x.shape[0], -1))


class _Encoder(nnx.Module):
  """conv(3x3, stride 2) -> conv(3x3, stride 2) -> dense backbone; MLP projection head."""

  def __init__(self, image_shape: tuple[int, int, int], width: int, feature_dim: int,
               projection_dim: int, *, rngs: nnx.Rngs):
    h, w, c = image_shape
    flat = math.ceil(math.ceil(h / 2) / 2) * math.ceil(math.ceil(w / 2) / 2) * 2 * width
    self.conv1 = nnx.Conv(c, width, (3, 3), strides=2, rngs=rngs)
    self.conv2 = nnx.Conv(width, 2 * width, (3, 3), strides=2, rngs=rngs)
    self.dense = nnx.Linear(flat, feature_dim, rngs=rngs)
    self.head1 = nnx.Linear(feature_dim, feature_dim, rngs=rngs)
    self.head2 = nnx.Linear(feature_dim, projection_dim, rngs=rngs)

  def backbone(self, x: jax.Array) -> jax.Array:
    return backbone(self, x)

  def __call__(self, x: jax.Array) -> jax.Array:
    h = self.backbone(x)
    return self.head2(jax.nn.relu(self.head1(jax.nn.relu(h))))


def augment(key: jax.Array, image: jax.Array, *, max_shift: int = 2, noise: float = 0.03,
            flip: bool = True) -> jax.Array:
  """One random view of ``image [H, W, C]``: shift (zero fill), optional flip, noise, clip to [0, 1].

  Raises:
    ValueError: an image that is not an array of numbers or of another rank, a concrete image with NaN, inf or
      values outside [0, 1] (a traced one is not read), a negative or fractional
      ``max_shift`` or one above ``MAX_SHIFT`` (256), a negative or non-finite ``noise``, a non-boolean ``flip``.
  """
  key = _validate.prng_key("key", key)
  max_shift = _validate.integer("max_shift", max_shift, minimum=0, maximum=MAX_SHIFT)
  noise = _validate.nonnegative("noise", noise)
  flip = _validate.boolean("flip", flip)
  if not isinstance(image, jax.Array):  # array-likes too (a nested list had no .shape)
    try:
      arr = np.asarray(image)
    except (TypeError, ValueError):
      arr = np.asarray(None)
    if arr.dtype.kind not in "biuf" and not (arr.dtype.kind == "V" and _validate.is_float_like(arr.dtype)):
      raise ValueError(f"Expected image to be an array of numbers [H, W, C]; got {type(image).__name__}.")
    image = jnp.asarray(arr)
  kind = np.dtype(image.dtype).kind
  if kind not in "biuf" and not (kind == "V" and _validate.is_float_like(image.dtype)):  # a complex jax.Array
    raise ValueError(f"Expected image to hold real numbers [H, W, C]; got dtype {image.dtype}.")
  if image.ndim != 3:
    raise ValueError(f"Expected image of shape [H, W, C]; got shape {image.shape}.")
  if not isinstance(image, jax.core.Tracer):  # under vmap/jit the caller's images were checked (as_images)
    vals = np.asarray(image, np.float64)
    if not np.isfinite(vals).all():
      raise ValueError("Expected a finite image; found NaN or inf.")
    if vals.size and (vals.min() < 0 or vals.max() > 1):
      # A 0-255 image was clipped to black and white, silently.
      raise ValueError(f"Expected image in [0, 1]; got range [{vals.min():g}, {vals.max():g}] (divide 8-bit "
                       f"images by 255).")
  k_shift, k_flip, k_noise = jax.random.split(key, 3)
  h, w, c = image.shape
  y = image
  if max_shift > 0:
    padded = jnp.pad(image, ((max_shift, max_shift), (max_shift, max_shift), (0, 0)))
    off = jax.random.randint(k_shift, (2,), 0, 2 * max_shift + 1, jnp.int32)
    y = jax.lax.dynamic_slice(padded, (off[0], off[1], jnp.int32(0)), (h, w, c))
  if flip:
    y = jnp.where(jax.random.bernoulli(k_flip, jnp.float32(0.5)), y[:, ::-1], y)
  if noise > 0:
    # float32 draws, the default with x64 off (with it on the default is float64: other noise for the same key).
    y = y + noise * jax.random.normal(k_noise, y.shape, jnp.float32)
  return jnp.clip(y, 0.0, 1.0)


def _nt_xent(z: jax.Array, temperature: float) -> jax.Array:
  """NT-Xent loss of 2B embeddings, where rows i and i + B are positives."""
  z = unit_rows(z)
  b = z.shape[0] // 2
  logits = jnp.matmul(z, z.T) / temperature - 1e9 * jnp.eye(2 * b, dtype=z.dtype)
  target = jnp.concatenate([jnp.arange(b, 2 * b), jnp.arange(b)])
  return optax.softmax_cross_entropy_with_integer_labels(logits, target).mean()


@dataclasses.dataclass(frozen=True)
class ContrastiveEncoder(Representation):
  """A trained contrastive encoder (from :func:`fit_contrastive`).

  Attributes:
    params: the network's ``nnx.Param`` state (pytree of arrays).
    graphdef: the network's static structure.
    config: the :class:`ContrastiveConfig` it was trained with.
    image_shape: ``(H, W, C)`` of D_pub.
    loss_history: NT-Xent loss every ``log_every`` steps (first and last
      included), as Python floats.
  """

  params: Any
  graphdef: Any
  config: ContrastiveConfig
  image_shape: tuple[int, int, int]
  loss_history: tuple[float, ...] = ()
  name: str = "contrastive"

  @property
  def input_shape(self) -> tuple[int, int, int]:
    return self.image_shape

  def features(self, x: jax.Array) -> jax.Array:
    model = nnx.merge(self.graphdef, self.params)
    z = model(x) if self.config.output == "projection" else model.backbone(x)
    return unit_rows(z)


register(ContrastiveEncoder, ["params"], ["graphdef", "config", "image_shape", "loss_history", "name"])


def _hog_neighbours(x: np.ndarray, num_neighbours: int) -> np.ndarray:
  """int32 ``[m, K]``: each public image's K nearest other public images in HOG space."""
  return _neighbours(Hog()(x), num_neighbours)


def _neighbours(f: np.ndarray, num_neighbours: int) -> np.ndarray:
  """int32 ``[m, K]``: each row's K nearest other rows of ``f [m, d]`` in L2, nearest first."""
  from jaxdistill.connection import reverse_knn  # pylint: disable=import-outside-toplevel
  m = f.shape[0]
  k = min(num_neighbours + 1, m)
  nn = np.asarray(reverse_knn(f, f, k))
  out = np.empty((m, k - 1), np.int32)
  for i in range(m):  # drop the image itself (normally first; duplicates may reorder)
    row = nn[i][nn[i] != i]
    out[i] = row[:k - 1]
  return out


def _optimizer(learning_rate: Any, weight_decay: float) -> optax.GradientTransformation:
  return optax.adamw(learning_rate, weight_decay=weight_decay)


def _learning_rate(cfg: ContrastiveConfig, step: int) -> float:
  """Cosine decay from ``learning_rate`` to 0 over ``steps`` (computed on the host)."""
  return 0.5 * cfg.learning_rate * (1.0 + math.cos(math.pi * step / cfg.steps))


def _step_statics(cfg: ContrastiveConfig) -> ContrastiveConfig:
  """``cfg`` with ``steps`` and ``learning_rate`` neutralised: runs of any length share one compilation."""
  return dataclasses.replace(cfg, steps=1, learning_rate=1.0)


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg"))
def _train_step(params, opt_state, step_key, data, neighbours, learning_rate, *, graphdef,
                cfg: ContrastiveConfig):
  """One AdamW step on NT-Xent for a batch of anchors and (neighbour) positives."""
  m = data.shape[0]
  k_batch, k_nbr, k_pick, k_views = jax.random.split(step_key, 4)
  anchors = jax.random.choice(k_batch, m, (cfg.batch_size,), replace=False)
  # Explicit 32-bit draws: the default dtypes are 64-bit with x64 on, which trained a different encoder.
  nbr = neighbours[anchors, jax.random.randint(k_nbr, (cfg.batch_size,), 0, neighbours.shape[1], jnp.int32)]
  use_nbr = jax.random.bernoulli(k_pick, jnp.float32(cfg.neighbour_fraction), (cfg.batch_size,))
  positives = jnp.where(use_nbr, nbr, anchors)
  view = functools.partial(augment, max_shift=cfg.max_shift, noise=cfg.noise, flip=cfg.flip)
  views = jax.vmap(view)(jax.random.split(k_views, 2 * cfg.batch_size),
                         data[jnp.concatenate([anchors, positives])])

  def loss_fn(p):
    return _nt_xent(nnx.merge(graphdef, p)(views), cfg.temperature)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = _optimizer(learning_rate, cfg.weight_decay).update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def fit_contrastive(key: jax.Array, public: Any, config: ContrastiveConfig | None = None, *,
                    progress: Callable[[int, float], None] | None = None,
                    log_every: int = 100) -> ContrastiveEncoder:
  """Trains a small contrastive CNN encoder on D_pub only.

  Each step draws ``batch_size`` anchors a_i, a positive p_i (a_i itself, or
  with probability ``neighbour_fraction`` one of its HOG neighbours within
  D_pub), two augmented views, and minimises NT-Xent:

  .. math::

     \\mathcal{L} = -\\frac{1}{2B} \\sum_{i=1}^{2B}
       \\log \\frac{\\exp(z_i^\\top z_{i^+} / \\tau)}{\\sum_{j \\ne i} \\exp(z_i^\\top z_j / \\tau)},
     \\qquad z = g(f(\\text{view})) / \\|g(f(\\text{view}))\\|_2 ,

  with AdamW and a cosine learning-rate decay to 0. The output features are
  unit-norm, so the L2 distances used by k-means and reverse k-NN rank like
  cosine similarities.

  Formal guarantees:
    A function of (key, D_pub) only: ``public`` is a D_pub array /
    ImageData (labels ignored) or a LabelingSplits, of which only
    ``.public`` is read; no parameter accepts private images or labels.
    Public data carries no privacy cost, and the trained encoder is applied
    to private records as a fixed public function.

  References:
    Chen et al., "A Simple Framework for Contrastive Learning of Visual
    Representations" (SimCLR), arXiv:2002.05709; Dwibedi et al., "With a
    Little Help from My Friends" (NNCLR), arXiv:2104.14548.

  Args:
    key: PRNG key (initialisation, batches, augmentations).
    public: D_pub images float ``[m, H, W, C]`` in [0, 1], ImageData, or
      LabelingSplits.
    config: hyperparameters (default :class:`ContrastiveConfig`).
    progress: optional callback ``progress(steps_done, loss)`` every
      ``log_every`` steps (e.g. to drive a progress bar).
    log_every: steps between loss records.

  Returns:
    A :class:`ContrastiveEncoder` (call it on images for float32 ``[N, d]``).

  Raises:
    ValueError: bad images or config, a non-callable ``progress``, or
      ``batch_size > m``; training that diverged (NaN or inf parameters),
      naming ``learning_rate`` (and ``weight_decay`` when their product
      reaches 1).
  """
  return _fit_contrastive(key, public, config, progress, log_every, prefix="")


def _check_progress(progress: Any) -> None:
  """A progress callback must be None or callable: a non-callable one failed with a TypeError after training."""
  if progress is not None and not callable(progress):
    raise ValueError(f"Expected progress to be None or a callable progress(steps_done, loss); got "
                     f"{type(progress).__name__}.")


def _fit_contrastive(key: jax.Array, public: Any, config: ContrastiveConfig | None,
                     progress: Callable[[int, float], None] | None, log_every: int, *,
                     prefix: str) -> ContrastiveEncoder:
  """:func:`fit_contrastive`; errors name config fields as ``prefix + field`` (``"contrastive."`` from fit_scan)."""
  key = _validate.prng_key("key", key)
  x = public_images(public)
  cfg = ContrastiveConfig() if config is None else config
  if not isinstance(cfg, ContrastiveConfig):
    raise ValueError(f"Expected config to be a ContrastiveConfig; got {type(cfg).__name__}.")
  _check_progress(progress)
  m = x.shape[0]
  if cfg.batch_size > m:
    raise ValueError(f"Expected batch_size={cfg.batch_size} <= the number of public images m={m}.")
  log_every = _validate.integer("log_every", log_every, minimum=1)
  image_shape = tuple(int(v) for v in x.shape[1:])
  k_init, k_train = jax.random.split(key)
  model = _Encoder(image_shape, cfg.width, cfg.feature_dim, cfg.projection_dim,
                   rngs=nnx.Rngs(params=k_init))
  graphdef, params = nnx.split(model, nnx.Param)
  if cfg.neighbour_fraction > 0 and m > 1:
    hog = Hog()
    hog_min = hog.cell_size * hog.block_size
    if min(image_shape[:2]) < hog_min:  # HOG's own error named its cell_size, which the caller never chose
      raise ValueError(f"Expected images of at least {hog_min}x{hog_min} pixels for HOG neighbours "
                       f"({prefix}neighbour_fraction={cfg.neighbour_fraction}); got "
                       f"{image_shape[0]}x{image_shape[1]}: use {prefix}neighbour_fraction=0.")
    neighbours = jnp.asarray(_hog_neighbours(x, min(cfg.num_neighbours, m - 1)))
  else:
    neighbours = jnp.arange(m, dtype=jnp.int32)[:, None]
  opt_state = _optimizer(cfg.learning_rate, cfg.weight_decay).init(params)
  data = jnp.asarray(x)
  statics = _step_statics(cfg)
  history = []
  for i in range(cfg.steps):
    params, opt_state, loss = _train_step(params, opt_state, jax.random.fold_in(k_train, i), data,
                                          neighbours, jnp.float32(_learning_rate(cfg, i)),
                                          graphdef=graphdef, cfg=statics)
    if i % log_every == 0 or i == cfg.steps - 1:
      history.append(float(loss))
      if progress is not None:
        progress(i + 1, history[-1])
  check_trained("Contrastive", params, cfg.steps, cfg.learning_rate, cfg.weight_decay, prefix=prefix)
  return ContrastiveEncoder(params, graphdef, cfg, image_shape, tuple(history))
