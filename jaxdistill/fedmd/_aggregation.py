"""What a party releases on each public query, and how the server aggregates it.

Release modes (``g`` applied to a party's logits ``z`` on one public image):

=========  ===============================  ======================================
mode       released ``Y = g(z)``              L2 diameter of the release range
=========  ===============================  ======================================
argmax     one-hot of ``argmax_c z_c``        sqrt(2)
softmax    ``softmax(z)``                     sqrt(2) (probability simplex)
logits     ``z`` (clipped to norm ``clip``    2 * clip (only when clipped; raw
           for FedMD-LDP)                     logits are unbounded)
=========  ===============================  ======================================

Server aggregation, equal or weighted:

.. math::

   \\bar Y(x) = \\frac{\\sum_i w_i Y_i(x)}{\\sum_i w_i}, \\qquad w_i = 1 \\text{ (equal)}.

With argmax releases, ``Ybar`` is the (weighted) vote share of each class.

References:
  Sun & Lyu 2021, Algorithm 1 and §5 (argmax / softmax / logits);
  Li & Wang 2019 (FedMD), §3. https://arxiv.org/abs/2009.05537
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate

__all__ = ["RELEASE_MODES", "release", "aggregate", "clip_rows", "project_to_simplex",
           "release_sensitivity"]

RELEASE_MODES = ("argmax", "softmax", "logits")


def release(logits: Any, mode: str) -> jax.Array:
  """The released vectors ``[..., q, C] float32`` for logits ``[..., q, C]``.

  Raises:
    ValueError: on an unknown mode, logits of rank < 2, or (for concrete
      input) NaN or inf logits, which argmax would turn into a vote for
      class 0 and softmax into NaN rows.
  """
  mode = _validate.choice("mode", mode, RELEASE_MODES)
  if np.ndim(logits) < 2:
    raise ValueError(f"Expected logits of shape [..., q, C]; got {np.shape(logits)}.")
  # Real numbers only, as clip_rows and aggregate: text parsed, complex lost its imaginary part.
  z = jnp.asarray(_check_rows("logits", logits), jnp.float32)
  if mode == "argmax":
    return jax.nn.one_hot(jnp.argmax(z, axis=-1), z.shape[-1], dtype=jnp.float32)
  if mode == "softmax":
    return jax.nn.softmax(z, axis=-1)
  return z


def aggregate(released: Any, weights: Any = None) -> jax.Array:
  """Server consensus ``[q, C] float32`` of ``released: [m, q, C]``.

  Args:
    released: the m parties' releases.
    weights: ``[m]`` nonnegative weights, not all zero; None for equal.

  Raises:
    ValueError: on bad shapes or weights.

  >>> y = jnp.array([[[1., 0.]], [[0., 1.]], [[0., 1.]]])   # 3 parties' one-hot votes
  >>> aggregate(y, [2, 1, 1]).tolist()
  [[0.5, 0.5]]
  """
  y = jnp.asarray(_check_rows("released", released), jnp.float32)
  if y.ndim != 3:
    raise ValueError(f"Expected released of shape [m, q, C]; got {y.shape}.")
  m = y.shape[0]
  if m == 0:
    raise ValueError("Expected released from at least one party; got shape (0, ...).")
  if weights is None:
    return jnp.mean(y, axis=0)
  w = _validate.real_array("weights", weights)
  if w.shape != (m,) or not np.all(np.isfinite(w)) or w.min() < 0 or w.max() <= 0:
    raise ValueError(f"Expected weights to be {m} finite nonnegative numbers (one per party), not all zero; "
                     f"got {np.asarray(weights).tolist()}.")
  w = w / w.max()  # the sum of weights near the float64 maximum would overflow: w / inf = 0
  w = jnp.asarray(w / w.sum(), jnp.float32)
  return jnp.tensordot(w, y, axes=1)


def _check_rows(name: str, x: Any) -> Any:
  """Concrete ``[..., C]`` input must be finite with C >= 1 (tracers pass through unchecked)."""
  if isinstance(x, jax.core.Tracer):
    return x
  if isinstance(x, jax.Array):  # the runner's per-round arrays: checked on the device, no host copy
    if x.dtype == jnp.bool_ or not (jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.floating)):
      raise ValueError(f"Expected {name} to hold real numbers; got dtype {x.dtype}.")
    x = x.astype(jnp.float32)
  else:
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused just below
      x = _validate.real_array(name, x).astype(np.float32)  # refuses text such as "1"
  if x.ndim == 0 or x.shape[-1] == 0:
    raise ValueError(f"Expected {name} of shape [..., C] with C >= 1; got shape {x.shape}.")
  xp = jnp if isinstance(x, jax.Array) else np
  if not bool(xp.all(xp.isfinite(x))):
    raise ValueError(f"Expected finite {name}; found NaN or inf.")
  return x


#: Range of clip norms for float32 rows: below MIN_CLIP a clipped row's entries would be subnormal (XLA:CPU
#: flushes them to 0); above the float32 maximum a clip bounds nothing.
MIN_CLIP = 1e-30
MAX_CLIP = float(np.finfo(np.float32).max)

#: Longest row :func:`clip_rows` takes: its float32 rounding margin, (C + 8) * 2^-24 of the clip, stays below
#: 1/16 (a release has one entry per class).
MAX_ROW = 2**20


def check_clip(name: str, value: Any) -> float:
  """``value`` as a float in [MIN_CLIP, MAX_CLIP], or a ValueError naming ``name``."""
  c = _validate.positive(name, value)
  if not MIN_CLIP <= c <= MAX_CLIP:
    raise ValueError(f"Expected {name}={c!r} in [{MIN_CLIP:g}, {MAX_CLIP:.4g}]: the released rows are float32.")
  return c


def clip_rows(x: Any, clip: float) -> jax.Array:
  """Scales each row ``[..., C]`` down to L2 norm at most ``clip``.

  A row longer than ``clip * (1 - (C + 8) * 2**-24)`` is scaled to that
  length (a shrink of about 1.4e-6 of ``clip`` for C = 16): the float32
  norm and division round, and without this margin about half the clipped
  rows came out a few float32 ulps longer than ``clip``, so two releases
  could lie further apart than :func:`release_sensitivity`, the diameter
  the FedMD-LDP noise is calibrated to. With it, every returned row's exact
  norm (of its float32 entries) is at most ``clip``: a computed sum of C
  squares is within a factor ``1 +- C * 2**-24`` (to first order) of the
  exact one, and the square root, division and product add one rounding
  each. Shorter rows come back unchanged.

  Raises:
    ValueError: ``clip`` outside [MIN_CLIP, MAX_CLIP]; a scalar, an empty
      last axis or one longer than MAX_ROW (2^20), or (for concrete input)
      NaN or inf entries.
  """
  clip = check_clip("clip", clip)
  x = jnp.asarray(_check_rows("x", x), jnp.float32)
  if x.shape[-1] > MAX_ROW:
    raise ValueError(f"Expected x of shape [..., C] with C <= {MAX_ROW}; got shape {x.shape}.")
  # The target length, rounded down to float32 (float32(clip) itself may round up past clip).
  goal = clip * (1.0 - (x.shape[-1] + 8) * 2.0**-24)
  target = np.float32(goal)
  if float(target) > goal:
    target = np.nextafter(target, np.float32(0))
  # Scale each row by an exact power of two to max|x| in [0.5, 1) before the norm: squares of entries above
  # ~1.8e19 overflow float32, and dividing by max|x| itself became a multiply by 1/max|x|, which float32 flushes
  # to 0 above 2^126, so such rows came back unclipped. A clipped row is then (x / |x|) * target, never
  # x * (target / |x|), whose factor underflowed to 0 for |x| / clip > 2^126.
  _, e = jnp.frexp(jnp.max(jnp.abs(x), axis=-1, keepdims=True))
  u = jnp.ldexp(x, -e)
  n = jnp.linalg.norm(u, axis=-1, keepdims=True)  # in [0.5, sqrt(C)) unless the row is 0
  # Against the target, not clip: a row whose computed norm is just under clip may be just over it.
  too_long = jnp.ldexp(n, e) > target  # inf when |x| > float32 max: still too long
  return jnp.where(too_long, u / jnp.where(n > 0, n, 1.0) * target, x)


def project_to_simplex(y: Any) -> jax.Array:
  """Euclidean projection of each row ``[..., C]`` onto the probability simplex.

  Used to post-process FedMD-LDP's noisy consensus into valid soft targets
  (post-processing costs no privacy).

  .. math:: \\Pi(y) = \\max(y - \\tau, 0),\\ \\tau \\text{ such that the result sums to } 1.

  References:
    Duchi, Shalev-Shwartz, Singer, Chandra, "Efficient projections onto the
    l1-ball", ICML 2008, Fig. 1.

  Raises:
    ValueError: a scalar, an empty last axis, or (for concrete input) NaN or
      inf entries, which would otherwise come back as NaN rows.
  """
  y = jnp.asarray(_check_rows("y", y), jnp.float32)
  # The projection is shift-invariant (tau moves with the shift). From the row maximum, u[0] - css[0] = 1 is
  # exact: at |y| ~ 2^25 float32 rounded u - 1 to u, rho became 0 and whole rows came back 0 or inf.
  y = y - jnp.max(y, axis=-1, keepdims=True)
  c = y.shape[-1]
  u = -jnp.sort(-y, axis=-1)
  css = jnp.cumsum(u, axis=-1) - 1.0
  ind = jnp.arange(1, c + 1, dtype=y.dtype)
  cond = u - css / ind > 0
  rho = jnp.sum(cond, axis=-1, keepdims=True)
  tau = jnp.take_along_axis(css, rho - 1, axis=-1) / rho.astype(y.dtype)
  return jnp.maximum(y - tau, 0.0)


def release_sensitivity(mode: str, clip: float | None = None) -> float:
  """L2 diameter of the release range: the Gaussian sensitivity of one release.

  Any change of a party's data (add, remove or replace a record) can move
  its release anywhere in the range, so the diameter bounds the change
  under every neighbouring relation.

  Raises:
    ValueError: for ``logits`` without a clip norm (unbounded range), a clip
      outside [MIN_CLIP, MAX_CLIP], or any clip with ``argmax`` or
      ``softmax`` (whose rows are never clipped).
  """
  mode = _validate.choice("mode", mode, RELEASE_MODES)
  clip = None if clip is None else check_clip("clip", clip)
  if mode in ("argmax", "softmax"):
    if clip is not None:  # it was validated, then ignored
      raise ValueError(f"Expected clip=None for mode={mode!r}: its rows have the fixed sensitivity sqrt(2) and are "
                       f"never clipped; got clip={clip!r}.")
    return math.sqrt(2.0)
  if clip is None:
    raise ValueError("Expected a clip norm for logits releases: raw logits have unbounded sensitivity.")
  return 2.0 * clip
