"""The representation contract, image validation, and the public-data-only input rule.

A representation maps images float32 ``[N, H, W, C]`` in [0, 1] to features
float32 ``[N, d]``. Fitted representations are frozen dataclasses registered
as pytrees (arrays are leaves, configuration is static), so one jitted
``features`` function serves every call; ``__call__`` streams the images in
fixed-size batches (the last one padded) and returns host float32 arrays.

Privacy rule: every ``fit_*`` function takes D_pub only. It accepts either a
public image array, an :class:`~jaxdistill.data.ImageData` of D_pub (its
labels are ignored), or a :class:`~jaxdistill.data.LabelingSplits`, from
which it takes ``splits.public`` and never touches ``splits.private``. No fit
function has a parameter for private images or for labels, so private data
cannot reach representation learning through this API; the fitted
representation is then applied to private records (by each client, locally)
as a fixed public function, which costs no privacy.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate

__all__ = ["Representation", "as_images", "check_trained", "public_images", "register", "unit_rows"]


def as_images(name: str, images: Any, *, shape: tuple[int, ...] | None = None) -> np.ndarray:
  """Returns ``images`` as float32 ``[N, H, W, C]`` in [0, 1], or raises naming ``name``.

  Accepts integer and float arrays (bfloat16 and the other ml_dtypes floats too) and
  :class:`~jaxdistill.data.ImageData` (its ``images``); complex, text, bool and object arrays are refused.

  Args:
    name: parameter name for messages.
    images: the images.
    shape: required ``(H, W, C)`` (a fitted representation's input shape).

  Raises:
    ValueError: not real numbers, not 4-D, empty, 0 pixels or channels, wrong ``(H, W, C)``,
      NaN/inf, or values outside [0, 1].
  """
  if hasattr(images, "images") and hasattr(images, "labels"):
    images = images.images
  try:
    arr = np.asarray(images)
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"Expected {name} to be an image array; got {type(images).__name__}.") from err
  # bfloat16 etc. are kind 'V'. Complex is "float-like" to ml_dtypes.finfo: it passed, losing its imaginary part.
  if arr.dtype.kind not in "fiu" and not (arr.dtype.kind == "V" and _validate.is_float_like(arr.dtype)):
    raise ValueError(f"Expected {name} to hold real numbers; got dtype {arr.dtype}.")
  if arr.ndim != 4:
    raise ValueError(f"Expected {name} of shape [N, H, W, C]; got shape {arr.shape}.")
  if arr.shape[0] < 1:
    raise ValueError(f"Expected {name} to hold at least one image; got shape {arr.shape}.")
  if 0 in arr.shape[1:]:  # NumPy's "zero-size array to reduction operation minimum" named nothing
    raise ValueError(f"Expected {name} of at least 1x1 pixels and 1 channel; got shape {arr.shape}.")
  if shape is not None and tuple(arr.shape[1:]) != tuple(shape):
    raise ValueError(f"Expected {name} of shape [N, {', '.join(map(str, shape))}] (the shape the "
                     f"representation was fitted on); got {arr.shape}.")
  arr = arr.astype(np.float32, copy=False)
  if not np.isfinite(arr).all():
    raise ValueError(f"Expected finite {name}; found NaN or inf.")
  lo, hi = float(arr.min()), float(arr.max())
  if lo < 0.0 or hi > 1.0:
    raise ValueError(f"Expected {name} in [0, 1]; got range [{lo:g}, {hi:g}].")
  return arr


def report_name(value: Any) -> str:
  """A representation's name for reports and messages: a non-empty string (3 or ['a'] were stored as given)."""
  if not isinstance(value, str) or not value.strip():
    raise ValueError(f"Expected name to be a non-empty string; got {_validate.shown(value)}.")
  return value


def public_images(public: Any) -> np.ndarray:
  """D_pub's images from an array, an ImageData, or a LabelingSplits (``.public`` only).

  Raises:
    ValueError: as :func:`as_images`, naming ``public``.
  """
  if hasattr(public, "public") and hasattr(public, "private"):
    public = public.public  # LabelingSplits: the private part is never read.
  return as_images("public", public)


@jax.jit
def _apply(rep: "Representation", x: jax.Array) -> jax.Array:
  return rep.features(x)


class Representation:
  """Base class: ``features(x)`` is pure JAX; ``__call__`` validates, batches and returns host arrays.

  Subclasses are frozen dataclasses registered with
  ``jax.tree_util.register_dataclass`` and implement :meth:`features` and
  :attr:`input_shape` (``None`` = any ``(H, W, C)``).
  """

  name: str = "representation"

  @property
  def input_shape(self) -> tuple[int, int, int] | None:
    return None

  def features(self, x: jax.Array) -> jax.Array:
    """float32 ``[B, d]`` features of a batch ``[B, H, W, C]`` (traceable)."""
    raise NotImplementedError

  def _shares_jit(self) -> bool:
    """Whether the shared jit may trace :meth:`features`; False where a cached trace would go stale.

    A representation that holds such a part (a :class:`ModelEmbedding` base) answers False too, and its
    :meth:`_runner` must reach that part's own runner.
    """
    return True

  def _runner(self):
    """The function ``__call__`` applies to each batch; fetched once per call."""
    return functools.partial(_apply, self)

  def __call__(self, images: Any, *, batch_size: int = 2048) -> np.ndarray:
    """Features of ``images``: float32 ``[N, d]`` (host).

    Args:
      images: float ``[N, H, W, C]`` in [0, 1], or an ImageData.
      batch_size: images per jitted call (smaller inputs use the next power
        of two >= N; the last batch is zero-padded, so there is one
        compilation per power of two up to ``batch_size``, not one per N).

    Raises:
      ValueError: bad images (see :func:`as_images`) or batch size.
    """
    return np.concatenate(list(self._feature_batches(images, batch_size=batch_size)))

  def _feature_batches(self, images: Any, *, batch_size: int = 2048) -> Iterator[np.ndarray]:
    """``__call__``'s features batch by batch (for a progress bar), from one :meth:`_runner` (one compilation).

    Each batch is checked before it is yielded; concatenated they are ``self(images, batch_size=batch_size)``.
    """
    x = as_images("images", images, shape=self.input_shape)
    n = x.shape[0]
    # Batches of min(batch_size, next power of two >= N) images: few distinct
    # shapes, hence few compilations, whatever N is.
    bs = min(_validate.integer("batch_size", batch_size, minimum=1), 1 << (n - 1).bit_length())
    run = self._runner()
    for start in range(0, n, bs):
      chunk = x[start:start + bs]
      size = chunk.shape[0]
      if size < bs:
        chunk = np.concatenate([chunk, np.zeros((bs - size,) + chunk.shape[1:], np.float32)])
      feats = np.asarray(run(jnp.asarray(chunk)), np.float32)[:size]
      if not np.isfinite(feats).all():
        raise ValueError(f"Representation {self.name!r} produced NaN or inf features.")
      yield feats


def register(cls, data_fields: list[str], meta_fields: list[str]):
  """Registers a frozen dataclass representation as a pytree and returns it."""
  return jax.tree_util.register_dataclass(cls, data_fields=data_fields, meta_fields=meta_fields)


def unit_rows(z: jax.Array) -> jax.Array:
  """Scales each row of ``z [B, d]`` to unit L2 norm (zero rows stay zero).

  A row whose squared norm is 0 is swapped for a row of ones before the norm
  and zeroed after it, so its gradient is 0 rather than NaN: the derivative of
  sqrt at 0 is infinite, and ``0 * inf`` made every parameter NaN when one
  blank image reached a contrastive batch. Other rows take exactly the
  operations (values and gradients) of ``z / max(||z||, 1e-12)``.
  """
  nonzero = jnp.sum(z * z, axis=1, keepdims=True) > 0
  safe = jnp.where(nonzero, z, 1.0)
  return jnp.where(nonzero, safe / jnp.maximum(jnp.linalg.norm(safe, axis=1, keepdims=True), 1e-12), 0.0)


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree) if jnp.issubdtype(a.dtype, jnp.inexact)]
  return jnp.stack(leaves).all() if leaves else jnp.bool_(True)


def check_trained(what: str, params: Any, steps: int, learning_rate: float, weight_decay: float, *,
                  prefix: str = "", finite: bool = True) -> None:
  """Raises a ValueError naming the step size if training left NaN or inf parameters (one device sync).

  Args:
    what: the training stage, for the message (``"Contrastive"``).
    params: the trained parameters (pytree).
    steps: optimisation steps run.
    learning_rate: the AdamW peak learning rate used.
    weight_decay: the AdamW weight decay used.
    prefix: how the caller reaches these settings (``"contrastive."`` inside a ScanConfig).
    finite: False if the caller already found a non-finite result (a loss) of these parameters.

  Raises:
    ValueError: non-finite parameters (or ``finite=False``). AdamW multiplies the weights by
      ``1 - learning_rate * weight_decay`` every step, so when that product reaches 1 the message names
      ``weight_decay`` too.
  """
  if finite and bool(_all_finite(params)):
    return
  lr, wd = f"{prefix}learning_rate (now {learning_rate:g})", f"{prefix}weight_decay (now {weight_decay:g})"
  if learning_rate * weight_decay >= 1.0:
    fix = (f"lower {lr} or {wd}: AdamW scales the weights by 1 - learning_rate * weight_decay "
           f"= {1.0 - learning_rate * weight_decay:.3g} every step")
  else:
    fix = f"lower {lr}"
  raise ValueError(f"{what} training diverged (NaN or inf parameters after {steps} step{'s' * (steps != 1)}); "
                   f"{fix}.")
