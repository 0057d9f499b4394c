"""FedMD's family of small CNNs (2- and 3-layer), in flax nnx.

Each party of FedMD (Li & Wang 2019) and FedMD-NFDP (Sun & Lyu 2021) owns a
different small CNN built from one block,

.. math::

   \\mathrm{Conv}(n_\\ell) \\to \\mathrm{BatchNorm} \\to \\mathrm{ReLU}
   \\to \\mathrm{Dropout}(p) \\to [\\mathrm{AvgPool}],

stacked two or three times and followed by a bias-free dense layer with an
L2 penalty of 1e-3 on its kernel. Layer by layer (FedMD's
``Neural_Networks.py``):

=====  =====================================================================
2-layer Conv(n1, 3x3, s1, same)-BN-ReLU-Drop-AvgPool(2, s1, same);
        Conv(n2, 3x3, s2, valid)-BN-ReLU-Drop; Flatten; Dense(C, no bias)
3-layer Conv(n1, 3x3, s1, same)-BN-ReLU-Drop-AvgPool(2, s1, same);
        Conv(n2, 2x2, s2, valid)-BN-ReLU-Drop-AvgPool(2, s2, valid);
        Conv(n3, 3x3, s2, valid)-BN-ReLU-Drop; Flatten; Dense(C, no bias)
=====  =====================================================================

The ten party configurations ``(n1, n2[, n3], dropout)`` of FedMD are
:data:`FEDMD_SPECS`. A ``width_multiplier`` scales every width so that CPU
runs are feasible: the second convolution dominates the cost (about
``3042 n1 n2`` FLOPs per 28x28 image for the 2-layer net), so a multiplier w
cuts the cost by about w^2 (see :func:`forward_flops`).

Models follow the protocol the trainers in :mod:`jaxdistill.models` use::

   model(x, *, train: bool, key: jax.Array | None, mask: [B] bool | None) -> logits [B, C]
   model.regularization() -> scalar float32

References:
  Li & Wang, "FedMD: Heterogenous Federated Learning via Model
  Distillation", 2019, §3 and the reference code. https://arxiv.org/abs/1910.03581
  Sun & Lyu, "Federated Model Distillation with Noise-Free Differential
  Privacy", IJCAI 2021, §5. https://arxiv.org/abs/2009.05537
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdistill import _validate

__all__ = ["CNNSpec", "FEDMD_SPECS", "FedMDCNN", "forward_flops", "parse_spec"]


#: The widest conv layer a :class:`CNNSpec` may have: 16x FedMD's widest (512). Wider asks for
#: gigabytes per layer; an absurd width (a typo, ``--width-multiplier 1e6``) is refused by name up front
#: instead of failing inside XLA.
MAX_WIDTH = 8192

#: Most classes (``num_classes``) a :class:`FedMDCNN` may have: labels are int32 on the device (2**63 failed
#: inside JAX with a TypeError).
MAX_CLASSES = 2**31 - 1


def _items(name: str, value: Any) -> tuple:
  """``value`` as a tuple (a list, tuple or 1-D array), or a ValueError naming ``name``."""
  if isinstance(value, (str, bytes)):
    raise ValueError(f"Expected {name} to be a sequence of integers; got {value!r}.")
  try:
    return tuple(value)
  except TypeError:
    raise ValueError(f"Expected {name} to be a sequence of integers; got {value!r}.") from None


def check_dropout(value: Any) -> float:
  """A dropout rate in [0, 1) whose keep threshold round((1 - rate) 2^32) is at least 1, or a ValueError.

  A rate above 1 - 2^-33 (1 - 1e-12, say) rounded the threshold to 0: every activation was dropped, as at
  rate 1, and the model trained to chance level without a word.
  """
  rate = _validate.probability("dropout", value)
  if rate >= 1.0 or round((1.0 - rate) * 2.0**32) < 1:
    raise ValueError(f"Expected dropout={rate!r} < 1 with a keep probability 1 - dropout of at least 2^-33: the "
                     "dropout mask's 32-bit threshold rounds a smaller one to 0 and drops every activation.")
  return rate


@dataclasses.dataclass(frozen=True)
class CNNSpec:
  """One FedMD CNN: conv widths (2 or 3 layers) and dropout rate.

  Attributes:
    widths: ``(n1, n2)`` or ``(n1, n2, n3)`` output channels, each in
      [1, :data:`MAX_WIDTH`].
    dropout: dropout rate in [0, 1).
  """

  widths: tuple[int, ...]
  dropout: float

  def __post_init__(self):
    widths = _items("widths", self.widths)
    widths = tuple(_validate.integer("widths", w, minimum=1, maximum=MAX_WIDTH) for w in widths)
    if len(widths) not in (2, 3):
      raise ValueError(f"Expected 2 or 3 conv widths; got widths={self.widths!r}.")
    object.__setattr__(self, "widths", widths)
    object.__setattr__(self, "dropout", check_dropout(self.dropout))

  @property
  def name(self) -> str:
    return f"cnn{len(self.widths)}-" + "-".join(str(w) for w in self.widths) + f"-d{self.dropout:g}"

  def scaled(self, width_multiplier: Any) -> "CNNSpec":
    """The same architecture with every width times ``width_multiplier`` (rounded, >= 1)."""
    m = _validate.positive("width_multiplier", width_multiplier)
    if max(self.widths) * m >= MAX_WIDTH + 0.5:
      raise ValueError(f"Expected width_multiplier={width_multiplier!r} to keep every conv width <= {MAX_WIDTH}; "
                       f"it scales {self.name}'s width {max(self.widths)} to {max(self.widths) * m:.4g}.")
    return CNNSpec(tuple(max(1, int(round(w * m))) for w in self.widths), self.dropout)


#: FedMD's ten parties (``conf/*.json`` of the reference code): 5 two-layer
#: and 5 three-layer CNNs.
FEDMD_SPECS: tuple[CNNSpec, ...] = (
    CNNSpec((128, 256), 0.2), CNNSpec((128, 384), 0.2), CNNSpec((128, 512), 0.2),
    CNNSpec((256, 256), 0.3), CNNSpec((256, 512), 0.4), CNNSpec((64, 128, 256), 0.2),
    CNNSpec((64, 128, 192), 0.2), CNNSpec((128, 192, 256), 0.2), CNNSpec((128, 128, 128), 0.3),
    CNNSpec((128, 128, 192), 0.3),
)


def parse_spec(text: str) -> CNNSpec:
  """Parses ``"n1,n2[,n3]:dropout"`` (e.g. ``"128,256:0.2"``) into a :class:`CNNSpec`.

  Raises:
    ValueError: on malformed text.
  """
  if not isinstance(text, str):
    raise ValueError(f"Expected a CNN spec like '128,256:0.2'; got {text!r}.")
  try:
    widths, rate = text.split(":")
    return CNNSpec(tuple(int(w) for w in widths.split(",")), float(rate))
  except (ValueError, TypeError) as err:
    raise ValueError(f"Expected a CNN spec like '128,256:0.2'; got {text!r} ({err}).") from None


def _out(size: int, kernel: int, stride: int, padding: str) -> int:
  if padding == "SAME":
    return -(-size // stride)
  return (size - kernel) // stride + 1


def _layout(spec: CNNSpec) -> list[tuple[int, int, str, str | None]]:
  """(kernel, stride, padding, pool) per conv; pool in {None, 'same1', 'valid2'}."""
  if len(spec.widths) == 2:
    return [(3, 1, "SAME", "same1"), (3, 2, "VALID", None)]
  return [(3, 1, "SAME", "same1"), (2, 2, "VALID", "valid2"), (3, 2, "VALID", None)]


def _spatial(spec: CNNSpec, input_shape: Sequence[int]) -> list[tuple[int, int]]:
  """Spatial size after each conv (before its pool) and the final flattened size."""
  h, w = int(input_shape[0]), int(input_shape[1])
  sizes = []
  for kernel, stride, padding, pool in _layout(spec):
    h, w = _out(h, kernel, stride, padding), _out(w, kernel, stride, padding)
    if h < 1 or w < 1:
      raise ValueError(f"Input shape {tuple(input_shape)} is too small for {spec.name}.")
    sizes.append((h, w))
    if pool == "valid2":
      h, w = _out(h, 2, 2, "VALID"), _out(w, 2, 2, "VALID")
  sizes.append((h, w))
  return sizes


def _check_cnn(spec: Any, num_classes: Any, input_shape: Any) -> tuple[CNNSpec, int, tuple[int, int, int]]:
  """The arguments :class:`FedMDCNN` and :func:`forward_flops` share, validated."""
  if not isinstance(spec, CNNSpec):
    raise ValueError(f"Expected spec to be a CNNSpec; got {spec!r}.")
  num_classes = _validate.integer("num_classes", num_classes, minimum=1, maximum=MAX_CLASSES)
  items = _items("input_shape", input_shape)
  if len(items) != 3:
    raise ValueError(f"Expected input_shape=(H, W, C); got {input_shape!r}.")
  # Whole numbers >= 1 (12.7 was truncated to 12; a 0 raised ZeroDivisionError further down).
  return spec, num_classes, tuple(_validate.integer("input_shape", s, minimum=1) for s in items)


def forward_flops(spec: CNNSpec, *, num_classes: int = 16, input_shape: Sequence[int] = (28, 28, 1)) -> int:
  """Multiply-add FLOPs (2 per MAC) of one forward pass of one image.

  Counts convolutions and the dense layer (BN, ReLU, pooling are lower order).

  Args:
    spec: the :class:`CNNSpec`.
    num_classes: C, an integer in ``[1, MAX_CLASSES]``.
    input_shape: ``(H, W, channels)`` of one image, whole numbers >= 1.

  Raises:
    ValueError: as :class:`FedMDCNN` for these arguments: ``spec`` not a
      :class:`CNNSpec`, a bad ``num_classes``, an ``input_shape`` that is
      not three whole numbers >= 1 or is too small for the spec.

  >>> forward_flops(FEDMD_SPECS[0])   # (128, 256): about 103 MFLOPs
  102871040
  """
  spec, num_classes, input_shape = _check_cnn(spec, num_classes, input_shape)
  sizes = _spatial(spec, input_shape)
  cin = input_shape[2]
  total = 0
  for (kernel, _, _, _), (h, w), cout in zip(_layout(spec), sizes, spec.widths):
    total += 2 * h * w * kernel * kernel * cin * cout
    cin = cout
  fh, fw = sizes[-1]
  total += 2 * fh * fw * cin * num_classes
  return int(total)


def _mix32(h: jax.Array) -> jax.Array:
  """A 32-bit integer finaliser with full avalanche (the "lowbias32" constants)."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x7FEB352D)
  h = h ^ (h >> 15)
  h = h * jnp.uint32(0x846CA68B)
  return h ^ (h >> 16)


def _dropout(key: jax.Array, x: jax.Array, rate: float) -> jax.Array:
  """Inverted dropout: keep each entry w.p. 1 - rate (to 2^-32), scale kept ones by 1/(1 - rate).

  The mask comes from a counter-based hash of the element index, keyed by
  two 32-bit words drawn from ``key``. Drawing one threefry word per
  element instead made a training step of the FedMD CNNs about 8x slower
  on CPU (XLA does not vectorise threefry inside the fused conv block);
  dropout masks only regularise, so nothing about privacy depends on them.
  """
  s1, s2 = jax.random.bits(key, (2,), jnp.uint32)
  idx = jax.lax.iota(jnp.uint32, x.size).reshape(x.shape)
  bits = _mix32(_mix32(idx * jnp.uint32(0x9E3779B1) + s1) ^ s2)
  threshold = min(int(round((1.0 - rate) * 2.0**32)), 2**32 - 1)
  keep = bits < jnp.uint32(threshold)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


class FedMDCNN(nnx.Module):
  """A FedMD party model: 2 or 3 Conv-BN-ReLU-Dropout(-AvgPool) blocks and a dense head.

  Dropout holds no RNG state: the training key is passed at call time, so
  the model state is just parameters and batch statistics (easy to stack,
  vmap and checkpoint). Dropout masks come from a keyed counter-based hash
  (see ``_dropout``) rather than ``nnx.Dropout``'s threefry uniforms, which
  dominated the cost of a CPU training step.

  Args:
    spec: widths and dropout.
    num_classes: C, the output size (FedMD: 10 public + 6 private = 16), at most :data:`MAX_CLASSES`.
    input_shape: ``(H, W, channels)`` of one image.
    l2: L2 penalty on the dense kernel (Keras ``kernel_regularizer``).
    rngs: initialisation keys.

  >>> m = FedMDCNN(CNNSpec((4, 8), 0.2), 16, rngs=nnx.Rngs(params=1))
  >>> m(jnp.zeros((2, 28, 28, 1)), train=False).shape
  (2, 16)
  """

  def __init__(self, spec: CNNSpec, num_classes: int, *, input_shape: Sequence[int] = (28, 28, 1),
               l2: float = 1e-3, rngs: nnx.Rngs):
    spec, num_classes, input_shape = _check_cnn(spec, num_classes, input_shape)
    if not isinstance(rngs, nnx.Rngs):  # None or a seed failed inside nnx with an AttributeError
      raise ValueError(f"Expected rngs to be an nnx.Rngs (e.g. nnx.Rngs(params=0)); got {_validate.shown(rngs)}.")
    self.spec = spec
    self.num_classes = num_classes
    self.l2 = _validate.nonnegative("l2", l2)
    self.input_shape = input_shape
    sizes = _spatial(spec, self.input_shape)
    self.layout = _layout(spec)
    cin = self.input_shape[2]
    convs, norms = [], []
    for (kernel, stride, padding, _), cout in zip(self.layout, spec.widths):
      convs.append(nnx.Conv(cin, cout, (kernel, kernel), (stride, stride), padding=padding, rngs=rngs))
      # Keras defaults (FedMD): momentum 0.99, epsilon 1e-3.
      norms.append(nnx.BatchNorm(cout, momentum=0.99, epsilon=1e-3, rngs=rngs))
      cin = cout
    self.convs = nnx.List(convs)
    self.norms = nnx.List(norms)
    fh, fw = sizes[-1]
    self.head = nnx.Linear(fh * fw * cin, self.num_classes, use_bias=False, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False, key: jax.Array | None = None,
               mask: jax.Array | None = None) -> jax.Array:
    """Logits ``[B, C]`` of images ``x: [B, H, W, channels] float32``.

    Args:
      x: images, cast to float32 (the parameters' dtype): with x64 on, a
        float64 batch would otherwise run in float64 and write float64
        batch statistics into the float32 running averages (JAX warns that
        this will become an error).
      train: batch statistics and dropout on (needs ``key`` when dropout > 0).
      key: dropout key.
      mask: ``[B] bool``; rows with False are padding and are left out of
        the batch statistics.

    Raises:
      ValueError: ``x`` not of shape ``[B, *input_shape]``.
    """
    x = jnp.asarray(x, jnp.float32)
    if x.ndim != 4 or tuple(x.shape[1:]) != self.input_shape:  # the convolutions take any size; XLA's
      # dot_general error at the dense head named neither x nor the shape the model was built for
      raise ValueError(f"Expected x of shape [B, {', '.join(map(str, self.input_shape))}] (the model's "
                       f"input_shape); got {tuple(x.shape)}.")
    bn_mask = None if mask is None else mask[:, None, None, None]
    keys = [None] * len(self.layout)
    if train and self.spec.dropout > 0:
      if key is None:
        raise ValueError("Expected a dropout key when train=True and dropout > 0.")
      keys = list(jax.random.split(key, len(self.layout)))
    for conv, norm, (_, _, _, pool), k in zip(self.convs, self.norms, self.layout, keys):
      x = conv(x)
      x = norm(x, use_running_average=not train, mask=bn_mask)
      x = jax.nn.relu(x)
      if k is not None:
        x = _dropout(k, x, self.spec.dropout)
      if pool == "same1":
        # flax divides by the window counts in the default float dtype: float64 with x64 on, which the next
        # block's batch statistics would then write into their float32 running averages.
        x = nnx.avg_pool(x, (2, 2), strides=(1, 1), padding="SAME", count_include_pad=False).astype(jnp.float32)
      elif pool == "valid2":
        x = nnx.avg_pool(x, (2, 2), strides=(2, 2), padding="VALID")
    return self.head(x.reshape(x.shape[0], -1))

  def regularization(self) -> jax.Array:
    """``l2 * sum(W_dense^2)``, added to the training loss."""
    return self.l2 * jnp.sum(jnp.square(self.head.kernel[...]))
