"""Hand-crafted and linear representations: raw pixels, HOG, PCA (fit on D_pub only)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdistill import _validate
from jaxdistill.representations._base import Representation, public_images, register, report_name

__all__ = ["raw_pixels", "hog", "RawPixels", "Hog", "Pca", "fit_pca"]

_HIGHEST = lax.Precision.HIGHEST


def _raw(x: jax.Array) -> jax.Array:
  return x.reshape(x.shape[0], -1)


def _hog(x: jax.Array, cell_size: int, block_size: int, num_bins: int) -> jax.Array:
  """HOG of a batch ``[B, H, W, C]`` -> ``[B, (H/c - b + 1)(W/c - b + 1) b^2 bins]``."""
  p = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
  gx = p[:, 1:-1, 2:, :] - p[:, 1:-1, :-2, :]
  gy = p[:, 2:, 1:-1, :] - p[:, :-2, 1:-1, :]
  mag_c = jnp.sqrt(gx * gx + gy * gy)
  # Colour: per pixel, the channel with the largest gradient (Dalal & Triggs).
  ch = jnp.argmax(mag_c, axis=-1)[..., None]
  gx = jnp.take_along_axis(gx, ch, -1)[..., 0]
  gy = jnp.take_along_axis(gy, ch, -1)[..., 0]
  mag = jnp.take_along_axis(mag_c, ch, -1)[..., 0]
  angle = jnp.mod(jnp.arctan2(gy, gx), jnp.pi)  # unsigned, [0, pi)
  pos = angle * (num_bins / jnp.pi) - 0.5        # bin centres at (j + 1/2) pi / bins
  lo = jnp.floor(pos)
  frac = pos - lo
  lo_bin = jnp.mod(lo, num_bins).astype(jnp.int32)
  hi_bin = jnp.mod(lo_bin + 1, num_bins)
  # one_hot in the images' dtype: its default is float64 with x64 on, which ran float32 images in float64.
  votes = (jax.nn.one_hot(lo_bin, num_bins, dtype=mag.dtype) * (mag * (1.0 - frac))[..., None]
           + jax.nn.one_hot(hi_bin, num_bins, dtype=mag.dtype) * (mag * frac)[..., None])
  b, h, w = mag.shape
  ch_, cw_ = h // cell_size, w // cell_size
  cells = votes[:, :ch_ * cell_size, :cw_ * cell_size].reshape(
      b, ch_, cell_size, cw_, cell_size, num_bins).sum(axis=(2, 4))
  bh, bw = ch_ - block_size + 1, cw_ - block_size + 1
  blocks = jnp.concatenate([cells[:, i:i + bh, j:j + bw] for i in range(block_size)
                            for j in range(block_size)], axis=-1)      # [B, bh, bw, b^2 bins]
  eps = 1e-6
  v = blocks / jnp.sqrt(jnp.sum(blocks * blocks, -1, keepdims=True) + eps)
  v = jnp.minimum(v, 0.2)                                              # L2-Hys
  v = v / jnp.sqrt(jnp.sum(v * v, -1, keepdims=True) + eps)
  return v.reshape(b, -1)


#: Most HOG orientation bins: bins narrower than a fifth of a degree. Every pixel votes into a one-hot vector
#: of this length, so memory grows with it (2**63 raised an OverflowError inside JAX).
MAX_HOG_BINS = 1024
#: Largest ``cell_size`` / ``block_size``: int32, the device's index type (an image must still hold one block).
MAX_HOG_SIZE = 2**31 - 1


def _check_hog(images_shape: tuple[int, ...], cell_size: Any, block_size: Any, num_bins: Any):
  c = _validate.integer("cell_size", cell_size, minimum=1, maximum=MAX_HOG_SIZE)
  bl = _validate.integer("block_size", block_size, minimum=1, maximum=MAX_HOG_SIZE)
  nb = _validate.integer("num_bins", num_bins, minimum=2, maximum=MAX_HOG_BINS)
  if images_shape is not None:
    h, w = images_shape[0], images_shape[1]
    if h // c < bl or w // c < bl:
      raise ValueError(f"Expected images of at least cell_size * block_size = {c * bl} pixels per "
                       f"side; got {h}x{w}.")
  return c, bl, nb


def raw_pixels(images: Any) -> np.ndarray:
  """Raw pixels, flattened: float32 ``[N, H * W * C]``.

  Args:
    images: float ``[N, H, W, C]`` in [0, 1] (or an ImageData).

  Raises:
    ValueError: bad images.
  """
  return RawPixels()(images)


def hog(images: Any, *, cell_size: int = 4, block_size: int = 2, num_bins: int = 9) -> np.ndarray:
  """Histograms of oriented gradients (Dalal & Triggs 2005), in JAX: float32 ``[N, d]``.

  Centred-difference gradients (edge-replicated border; for colour images the
  channel with the largest gradient per pixel), unsigned orientation
  theta in [0, pi) voted into ``num_bins`` bins with linear interpolation
  between the two nearest bin centres, weighted by the gradient magnitude,
  and summed over ``cell_size x cell_size`` cells. Blocks of
  ``block_size x block_size`` cells (stride one cell) are L2-Hys normalised:

  .. math::

     v \\leftarrow \\frac{v}{\\sqrt{\\|v\\|_2^2 + 10^{-6}}},\\quad
     v \\leftarrow \\min(v, 0.2),\\quad
     v \\leftarrow \\frac{v}{\\sqrt{\\|v\\|_2^2 + 10^{-6}}} .

  d = (H/c - b + 1)(W/c - b + 1) b^2 num_bins; 1,296 for 28x28 with the
  defaults. No fitting, hence no privacy cost.

  References:
    Dalal & Triggs, "Histograms of Oriented Gradients for Human Detection",
    CVPR 2005.

  Args:
    images: float ``[N, H, W, C]`` in [0, 1] (or an ImageData).
    cell_size: pixels per cell side.
    block_size: cells per block side.
    num_bins: orientation bins over [0, pi), in ``[2, MAX_HOG_BINS]`` (1024).

  Raises:
    ValueError: bad images, parameters that are not whole numbers >= 1 (``num_bins`` >= 2) within their caps,
      or that do not fit the image size.
  """
  return Hog(cell_size, block_size, num_bins)(images)  # __call__ validates the images


@dataclasses.dataclass(frozen=True)
class RawPixels(Representation):
  """Flattened pixels (``name = "raw"``)."""

  name: str = "raw"

  def features(self, x: jax.Array) -> jax.Array:
    return _raw(x)


register(RawPixels, [], ["name"])


@dataclasses.dataclass(frozen=True)
class Hog(Representation):
  """HOG features; see :func:`hog` for the definition.

  Attributes:
    cell_size: pixels per cell side.
    block_size: cells per block side.
    num_bins: orientation bins, in ``[2, MAX_HOG_BINS]`` (1024).
  """

  cell_size: int = 4
  block_size: int = 2
  num_bins: int = 9
  name: str = "hog"

  def __post_init__(self):
    # Stored as validated: whole floats (4.0) become ints, which array shapes need (a float used to pass
    # the check and fail inside JAX's reshape, or hit Hog(4)'s jit cache and work, depending on history).
    c, bl, nb = _check_hog(None, self.cell_size, self.block_size, self.num_bins)
    for field, value in (("cell_size", c), ("block_size", bl), ("num_bins", nb)):
      object.__setattr__(self, field, value)

  def features(self, x: jax.Array) -> jax.Array:
    _check_hog(x.shape[1:], self.cell_size, self.block_size, self.num_bins)
    return _hog(x, self.cell_size, self.block_size, self.num_bins)


register(Hog, [], ["cell_size", "block_size", "num_bins", "name"])


@dataclasses.dataclass(frozen=True)
class Pca(Representation):
  """A PCA projection of a base representation, fitted on D_pub (:func:`fit_pca`).

  ``features(x) = (base(x) - mean) @ components``. Over a :class:`ModelEmbedding` base (or a Pca of one),
  each call takes the base features from the base's own runner (current weights; no trace with
  ``jit=False``) and jits only the projection.

  Attributes:
    mean: float32 ``[D]`` mean of the base features over D_pub.
    components: float32 ``[D, p]`` orthonormal principal directions
      (descending variance; sign fixed so each column's largest-magnitude
      entry is positive).
    explained_variance: float32 ``[p]`` variances along the components.
    base: the representation PCA is applied to (raw pixels by default).
    image_shape: ``(H, W, C)`` it was fitted on.
  """

  mean: jax.Array
  components: jax.Array
  explained_variance: jax.Array
  base: Representation
  image_shape: tuple[int, int, int]
  name: str = "pca"

  @property
  def input_shape(self) -> tuple[int, int, int]:
    return self.image_shape

  @property
  def num_components(self) -> int:
    return int(self.components.shape[1])

  def features(self, x: jax.Array) -> jax.Array:
    return _project(self.base.features(x), self.mean, self.components)

  def _shares_jit(self) -> bool:
    return self.base._shares_jit()  # pylint: disable=protected-access

  def _runner(self):
    if self._shares_jit():
      return super()._runner()
    # The base's own runner, then the projection jitted alone: through the shared jit, a model embedding's base
    # (model_fn a static field) kept the first trace's weights after training in place, and jit=False was traced.
    run = self.base._runner()  # pylint: disable=protected-access
    return lambda x: _project_jit(run(x), self.mean, self.components)


register(Pca, ["mean", "components", "explained_variance", "base"], ["image_shape", "name"])


def _project(f: jax.Array, mean: jax.Array, components: jax.Array) -> jax.Array:
  return jnp.matmul(f - mean, components, precision=_HIGHEST)


_project_jit = jax.jit(_project)


@functools.partial(jax.jit, static_argnames=("num_components",))
def _pca_fit(f: jax.Array, num_components: int):
  m = f.shape[0]
  mean = jnp.mean(f, axis=0)
  c = f - mean
  cov = jnp.matmul(c.T, c, precision=_HIGHEST) / max(m - 1, 1)
  evals, evecs = jnp.linalg.eigh(cov)                       # ascending
  evals = evals[::-1][:num_components]
  evecs = evecs[:, ::-1][:, :num_components]
  pivot = jnp.argmax(jnp.abs(evecs), axis=0)
  signs = jnp.sign(evecs[pivot, jnp.arange(num_components)])
  return mean, evecs * jnp.where(signs == 0, 1.0, signs), jnp.maximum(evals, 0.0)


def fit_pca(public: Any, num_components: int = 50, *, base: Representation | None = None,
            name: str | None = None) -> Pca:
  """Principal component analysis fitted on D_pub only (jitted ``eigh`` of the covariance).

  .. math::

     \\Sigma = \\frac{1}{m - 1} \\sum_{i=1}^{m} (f_i - \\mu)(f_i - \\mu)^\\top,
     \\qquad \\text{features}(x) = V_p^\\top (f(x) - \\mu),

  with f = ``base`` (raw pixels by default) and V_p the top-p eigenvectors.

  Formal guarantees:
    A function of D_pub alone: ``public`` is an array or ImageData of D_pub,
    or a LabelingSplits from which only ``.public`` is read. Applying the
    fitted projection to private records costs no privacy.

  Args:
    public: D_pub images float ``[m, H, W, C]`` in [0, 1], an ImageData, or a
      LabelingSplits.
    num_components: p, ``1 <= p <= min(m, D)``.
    base: representation to project (default raw pixels), e.g. ``Hog()``.
    name: label for reports (default ``"pca"`` or ``"<base>-pca"``).

  Returns:
    A fitted :class:`Pca`.

  Raises:
    ValueError: bad images, ``num_components`` or ``name``.
  """
  if name is not None:
    name = report_name(name)
  x = public_images(public)
  base = RawPixels() if base is None else base
  if not isinstance(base, Representation):
    raise ValueError(f"Expected base to be a Representation; got {type(base).__name__}.")
  f = jnp.asarray(base(x))
  p = _validate.integer("num_components", num_components, minimum=1,
                        maximum=min(f.shape[0], f.shape[1]))
  mean, comps, var = _pca_fit(f, p)
  # Finite features above ~1e18 overflow the float32 covariance and eigh returns NaN: the Pca held NaN and
  # only its first use failed, naming neither fit_pca nor the base.
  if not all(bool(jnp.isfinite(a).all()) for a in (mean, comps, var)):
    raise ValueError(f"fit_pca: the float32 covariance of the features of base {base.name!r} overflowed (largest "
                     f"|feature| {float(jnp.max(jnp.abs(f))):.3g}); rescale the base's features.")
  if name is None:
    name = "pca" if isinstance(base, RawPixels) else f"{base.name}-pca"
  return Pca(mean, comps, var, base, tuple(x.shape[1:]), name)
