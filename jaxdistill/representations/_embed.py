"""Re-embedding with any model (e.g. a trained student's penultimate layer), and a name registry."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxdistill import _validate
from jaxdistill.representations._base import Representation, public_images, register, report_name, unit_rows
from jaxdistill.representations._classic import Hog, RawPixels, _check_hog, fit_pca
from jaxdistill.representations._contrastive import ContrastiveConfig, fit_contrastive
from jaxdistill.representations._scan import ScanConfig, fit_scan

__all__ = ["ModelEmbedding", "embed_with", "REPRESENTATIONS", "fit_representation"]

REPRESENTATIONS = ("raw", "pca", "hog", "hog-pca", "contrastive", "scan")


@dataclasses.dataclass(frozen=True)
class ModelEmbedding(Representation):
  """Features from a user model (see :func:`embed_with`).

  Attributes:
    model_fn: ``[B, H, W, C] -> [B, d]``.
    normalize: scale each feature row to unit L2 norm.
    jit: trace ``model_fn`` with ``jax.jit`` (it must then be a pure JAX
      function of the batch). Each call traces it afresh, so the features
      follow a model changed in place between calls; the batches of one
      call share one trace.
    image_shape: required ``(H, W, C)`` or None.
  """

  model_fn: Callable[[jax.Array], jax.Array]
  normalize: bool = False
  jit: bool = True
  image_shape: tuple[int, int, int] | None = None
  name: str = "model"

  @property
  def input_shape(self):
    return self.image_shape

  def features(self, x: jax.Array) -> jax.Array:
    z = jnp.asarray(self.model_fn(x))
    # A complex output lost its imaginary part in the float32 cast (a ComplexWarning, no error), as as_images
    # refuses on the input side; 0 features gave an empty representation.
    if z.dtype.kind not in "fiub" and not (z.dtype.kind == "V" and _validate.is_float_like(z.dtype)):
      raise _BadFeatures(f"Expected model_fn to return real features; got dtype {z.dtype}.")
    if z.ndim != 2 or z.shape[0] != x.shape[0] or z.shape[1] < 1:
      raise _BadFeatures(f"Expected model_fn to return [B, d] (d >= 1) for a batch of B={x.shape[0]}; "
                         f"got shape {tuple(z.shape)}.")
    z = z.astype(jnp.float32)
    return unit_rows(z) if self.normalize else z

  def _shares_jit(self) -> bool:
    return False

  def _runner(self):
    # A fresh jit for every call, never a cached trace: tracing reads the weights model_fn closes over and
    # bakes them in as constants, so the shared jit (keyed on model_fn, a static field) returned the first
    # call's features after the model was trained further in place, for this representation and for any
    # new one wrapping an equal model_fn (the same bound method).
    run = jax.jit(self.features) if self.jit else self.features

    def checked(x):
      try:
        return run(x)
      except _BadFeatures as err:  # raised while tracing: jit appended its traceback note to the message
        raise ValueError(_validate.first_line(err)) from None
    return checked


class _BadFeatures(ValueError):
  """``model_fn``'s output is not real ``[B, d]`` features (re-raised as a one-line ValueError)."""


register(ModelEmbedding, [], ["model_fn", "normalize", "jit", "image_shape", "name"])


def embed_with(model_fn: Callable[[jax.Array], jax.Array], *, normalize: bool = False,
               jit: bool = True, image_shape: tuple[int, int, int] | None = None,
               name: str = "model") -> ModelEmbedding:
  """A representation from any model, e.g. a trained student's penultimate layer.

  Algorithm 1's iterations t >= 2 re-select queries in the student's
  embedding space: ``rep = embed_with(lambda x: features(x))`` for a function
  ``features`` giving the student's penultimate layer (the labeling pipeline
  uses :meth:`jaxdistill.labeling.Student.embedding`, which also centres and
  PCA-reduces it on D_pub), then
  ``rep(public_images)`` and ``rep(private_images)`` feed
  :func:`jaxdistill.connection.select_queries` and
  :func:`jaxdistill.connection.reverse_knn`.

  Formal guarantees:
    Embedding adds no privacy cost beyond what trained ``model_fn``. If the
    student was trained on labels released by a DP mechanism, its embedding
    is post-processing of that release; the iterations' releases compose
    (T-fold), which the caller must account for (spec/REVERSE_KNN.md §5,
    I10).

  Args:
    model_fn: maps a batch float32 ``[B, H, W, C]`` to ``[B, d]``. With
      ``jit=True`` it is traced once per call of the representation (the
      batches of a call share one shape); for an ``nnx.Module`` ``m``, pass
      e.g. ``lambda x: m.features(x)``. The weights are read at each call,
      so training ``m`` further in place changes the features of the next
      call.
    normalize: unit-normalise the rows (cosine geometry); a bool.
    jit: compile ``model_fn`` with ``jax.jit``; a bool.
    image_shape: optional required ``(H, W, C)``.
    name: label for reports.

  Returns:
    A :class:`ModelEmbedding`; call it on images for float32 ``[N, d]``.

  Raises:
    ValueError: ``model_fn`` not callable, ``normalize`` or ``jit`` not a
      bool, a bad ``image_shape`` or ``name``; when called, ``model_fn`` returning non-real or empty features.
  """
  if not callable(model_fn):
    raise ValueError(f"Expected model_fn to be callable; got {type(model_fn).__name__}.")
  if image_shape is not None:
    try:
      dims = tuple(image_shape)
    except TypeError:
      raise ValueError(f"Expected image_shape=(H, W, C); got {image_shape!r}.") from None
    image_shape = tuple(_validate.integer("image_shape", v, minimum=1) for v in dims)
    if len(image_shape) != 3:
      raise ValueError(f"Expected image_shape=(H, W, C); got {image_shape}.")
  # Flags checked, not cast: bool("no") is True.
  return ModelEmbedding(model_fn, _validate.boolean("normalize", normalize), _validate.boolean("jit", jit),
                        image_shape, report_name(name))


def fit_representation(key: jax.Array, name: str, public: Any, **options) -> Representation:
  """Fits the representation called ``name`` on D_pub only.

  Names (:data:`REPRESENTATIONS`):

  * ``raw``: flattened pixels.
  * ``pca``: PCA of the pixels (``num_components``, default 50).
  * ``hog``: HOG (``cell_size``, ``block_size``, ``num_bins``).
  * ``hog-pca``: PCA (``num_components``, default 64) of HOG.
  * ``contrastive``: :func:`fit_contrastive`; options are
    :class:`ContrastiveConfig` fields, plus ``progress``.
  * ``scan``: :func:`fit_scan` (features: probabilities over
    ``num_clusters`` clusters); options are :class:`ScanConfig` fields,
    plus ``progress``.

  Formal guarantees:
    Only D_pub is used: ``public`` is a D_pub array / ImageData, or a
    LabelingSplits of which only ``.public`` is read.

  Args:
    key: PRNG key (used by learned representations only).
    name: one of :data:`REPRESENTATIONS`.
    public: D_pub images, ImageData or LabelingSplits.
    **options: per-representation options (above).

  Returns:
    A :class:`Representation`.

  Raises:
    ValueError: unknown name or option, bad images, HOG cells and blocks
      larger than the images.
  """
  key = _validate.prng_key("key", key)
  name = _validate.choice("name (a representation)", name, REPRESENTATIONS)
  x = public_images(public)

  def take(*allowed):
    unknown = sorted(set(options) - set(allowed))
    if unknown:
      takes = f"expected some of: {', '.join(allowed)}" if allowed else "it takes no options"
      raise ValueError(f"Unknown option(s) {', '.join(unknown)} for representation {name!r}; {takes}.")
    return dict(options)

  if name == "raw":
    take()
    return RawPixels()
  if name == "hog":
    rep = Hog(**take("cell_size", "block_size", "num_bins"))
    _check_hog(x.shape[1:], rep.cell_size, rep.block_size, rep.num_bins)  # as hog-pca's fit does, via base(x)
    return rep
  if name == "pca":
    opts = take("num_components")
    return fit_pca(x, opts.get("num_components", 50))
  if name == "hog-pca":
    opts = take("num_components", "cell_size", "block_size", "num_bins")
    p = opts.pop("num_components", 64)
    return fit_pca(x, p, base=Hog(**opts))
  config_class, fit = (ContrastiveConfig, fit_contrastive) if name == "contrastive" else (ScanConfig, fit_scan)
  opts = take(*[f.name for f in dataclasses.fields(config_class)], "progress")
  progress = opts.pop("progress", None)
  return fit(key, x, config_class(**opts), progress=progress)


