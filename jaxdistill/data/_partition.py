"""Splits and client partitions, all driven by an explicit seed."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdistill import _validate
from jaxdistill.data._loading import ImageData
from jaxdistill.data._overlap import first_copies, shared_images

__all__ = ["LabelingSplits", "paper_splits", "partition_clients"]

#: Largest Dirichlet concentration partition_clients takes (alpha = 1e100 already gives equal shares).
MAX_ALPHA = 1e100


@dataclasses.dataclass(frozen=True)
class LabelingSplits:
  """D_priv (labelled, private), D_pub (labels hidden from the algorithm), D_eval."""

  private: ImageData
  public: ImageData
  evaluation: ImageData


def paper_splits(train: ImageData, test: ImageData | None, *, seed: int,
                 public_size: int = 5000, eval_size: int = 5000,
                 private_size: int | None = None) -> LabelingSplits:
  """The reverse-k-NN paper's MNIST protocol, with configurable sizes.

  With a test split (MNIST / Fashion-MNIST): D_priv = the training images
  (optionally subsampled to ``private_size``), D_pub = ``public_size`` test
  images, evaluation = ``eval_size`` other test images. Test images that
  are also training images (equal pixels) are left out of D_pub and D_eval
  first: a public copy of a private record is released whole; a test image
  that occurs more than once enters the pool once (copies in D_pub and D_eval
  would evaluate the student on its own training images). Without a test
  split (the embedded 5,000 digits), all three are disjoint random parts of
  ``train``: an image that occurs more than once in ``train`` is kept out of
  D_pub and D_eval, and D_priv is a uniform draw from the other images,
  copies included (with ``private_size`` smaller than them, some copies of
  an image may be left out). Data without such copies (MNIST, Fashion-MNIST)
  is split as if these rules did not exist.

  SVHN and CIFAR-10 (tfds) get the same protocol (their test splits hold
  26,032 and 10,000 images). The paper's own splits for them are not
  reproduced: they do not add up (spec §5 I9: CIFAR-10's 30,000 public plus
  29,000 private images from a 50,000-image training set; SVHN's 26k + 1k
  from a 26,032-image test set).

  Raises:
    ValueError: ``train`` or ``test`` not an :class:`ImageData` (a bare
      array's ``take`` flattened it), an empty ``train``, a ``test`` whose
      image shape or number of classes differs from ``train``'s, or sizes
      that do not fit the data (for ``test``: its images outside ``train``).
  """
  for name, value in (("train", train), ("test", test)):
    if not (isinstance(value, ImageData) or (name == "test" and value is None)):
      raise ValueError(f"Expected {name} to be a jaxdistill.data.ImageData{' or None' * (name == 'test')}; "
                       f"got {type(value).__name__}.")
  if len(train) < 1:
    raise ValueError("Expected train to hold at least one image (the private records); got 0.")
  if test is not None:
    if test.images.shape[1:] != train.images.shape[1:]:
      raise ValueError(f"Expected test images of train's shape {train.images.shape[1:]}; "
                       f"got {test.images.shape[1:]}.")
    if test.num_classes != train.num_classes:
      raise ValueError(f"Expected test with train's num_classes={train.num_classes}; got {test.num_classes}.")
  rng = np.random.default_rng(_validate.integer("seed", seed, minimum=0, maximum=_validate.MAX_SEED))
  public_size = _validate.integer("public_size", public_size, minimum=1)
  eval_size = _validate.integer("eval_size", eval_size, minimum=1)
  if test is not None:
    if public_size + eval_size > len(test):
      raise ValueError(f"Expected public_size + eval_size = {public_size + eval_size} <= {len(test)} "
                       "test images.")
    # D_pub and D_eval held any test image that is also a training image (a D_priv record, released whole in
    # D_pub). Without such images the pool is every index, so the draw is the same as before.
    # Likewise, copies of one test image in both D_pub and D_eval: one copy per image enters the pool.
    shared = shared_images(test.images, train.images)
    later = first_copies(test.images) != np.arange(len(test))
    pool = np.flatnonzero(~shared & ~later)
    if public_size + eval_size > pool.size:
      raise ValueError(f"Expected test to hold public_size + eval_size = {public_size + eval_size} distinct images "
                       f"outside train; {int(shared.sum())} of its {len(test)} images are also training images (they "
                       f"would put D_priv records in D_pub or D_eval) and {int((later & ~shared).sum())} repeat "
                       f"another test image, leaving {pool.size}.")
    perm = pool[rng.permutation(pool.size)]
    public, evaluation = test.take(perm[:public_size]), test.take(perm[public_size:public_size + eval_size])
    priv_idx = rng.permutation(len(train))
    if private_size is not None:
      private_size = _validate.integer("private_size", private_size, minimum=1, maximum=len(train))
      priv_idx = priv_idx[:private_size]
    return LabelingSplits(train.take(np.sort(priv_idx)), public, evaluation)
  rest = len(train) - public_size - eval_size
  if private_size is None:
    if rest < 1:
      raise ValueError(f"Expected public_size + eval_size = {public_size + eval_size} < {len(train)} images, "
                       "leaving at least one private record.")
    private_size = rest
  private_size = _validate.integer("private_size", private_size, minimum=1)
  if private_size > rest:
    raise ValueError(f"Expected private_size + public_size + eval_size = "
                     f"{private_size + public_size + eval_size} <= {len(train)} images.")
  perm = rng.permutation(len(train))
  first = first_copies(train.images)
  copied = first != np.arange(len(train))
  copied[first[copied]] = True  # every image with a copy, the first one too
  if copied.any():
    # Copies of one image go to D_priv together (a copy in D_pub would release that record whole): D_pub and D_eval
    # are drawn from the images that occur once, in the permutation's order.
    once = int((~copied).sum())
    if public_size + eval_size > once:
      raise ValueError(f"Expected train to hold public_size + eval_size = {public_size + eval_size} images that "
                       f"occur once; {len(train) - once} of its {len(train)} images have copies in train (a copy in "
                       f"D_pub or D_eval would put a D_priv record there), leaving {once}.")
    # D_priv is then a uniform draw from the rest (a second permutation: the once-only images left over come late
    # in the first one). Copies moved behind every once-only image were left out of a D_priv smaller than the rest.
    chosen = perm[~copied[perm]][:public_size + eval_size]
    taken = np.zeros(len(train), bool)
    taken[chosen] = True
    rest_idx = np.flatnonzero(~taken)
    perm = np.concatenate([chosen, rest_idx[rng.permutation(rest_idx.size)]])
  a, b = public_size, public_size + eval_size
  return LabelingSplits(train.take(perm[b:b + private_size]), train.take(perm[:a]), train.take(perm[a:b]))


#: Defaults of :func:`partition_clients`'s ``alpha`` and ``classes_per_client``: another value is refused with a
#: scheme that does not use it.
DEFAULT_ALPHA = 0.5
DEFAULT_CLASSES_PER_CLIENT = 2


def refuse_unused_settings(scheme_name: str, scheme: str, *, alpha: tuple[str, float],
                           classes: tuple[str, int]) -> None:
  """Refuses an alpha or a classes-per-client other than its default with a scheme that does not use it.

  Such a value was ignored without a word (``alpha=0.1`` with ``scheme="iid"`` split iid). ``alpha`` and
  ``classes`` are (parameter name, validated value) pairs, so each caller's error names its own parameters.
  """
  for (name, value), default, uses in ((alpha, DEFAULT_ALPHA, "dirichlet"),
                                       (classes, DEFAULT_CLASSES_PER_CLIENT, "classes")):
    if value != default and scheme != uses:
      raise ValueError(f"Expected {name}={value!r} only with {scheme_name}={uses!r} (elsewhere it is ignored); "
                       f"got {scheme_name}={scheme!r}.")


def partition_clients(labels: np.ndarray, num_clients: int, *, seed: int, scheme: str = "iid",
                      alpha: float = DEFAULT_ALPHA,
                      classes_per_client: int = DEFAULT_CLASSES_PER_CLIENT) -> list[np.ndarray]:
  """Indices of each client's records.

  Args:
    labels: int ``[N]`` labels (class indices >= 0) of the records to split.
    num_clients: m >= 1 (``len(labels)`` clients of one record each is the
      reverse-k-NN paper's setting).
    seed: RNG seed.
    scheme: ``iid`` (random equal split), ``dirichlet`` (each class is split
      over the clients in proportions ~ Dir(alpha, ..., alpha)), or
      ``classes`` (client i holds classes i, ..., i + classes_per_client - 1
      modulo C, each class split evenly among its holders; with fewer than
      C / classes_per_client clients, each class nobody holds goes whole to
      one random client, which then holds more).
    alpha: Dirichlet concentration in (0, 1e100]; another value than the
      default (0.5) only with ``dirichlet``.
    classes_per_client: for ``classes``; another value than the default (2)
      only with it.

  Returns:
    A list of ``num_clients`` sorted int64 index arrays that partition
    ``range(N)``.

  Raises:
    ValueError: ``labels`` not a 1-D array of integers >= 0, or a bad count,
      seed, scheme, alpha or classes_per_client (or one set for a scheme
      that does not use it).
  """
  try:
    labels = np.asarray(labels)
  except ValueError as err:  # ragged nested lists
    raise ValueError(f"Expected labels to be 1-D integers [N]; got {_validate.first_line(err)}") from None
  if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
    raise ValueError(f"Expected labels to be 1-D integers [N]; got shape {labels.shape}, dtype {labels.dtype}.")
  if labels.size and labels.min() < 0:  # -1 was split as a class of its own (dirichlet, classes) or ignored (iid)
    raise ValueError(f"Expected labels to be class indices >= 0; got labels with smallest value {labels.min()}.")
  n = labels.shape[0]
  m = _validate.integer("num_clients", num_clients, minimum=1, maximum=max(n, 1))
  scheme = _validate.choice("scheme", scheme, ("iid", "dirichlet", "classes"))
  rng = np.random.default_rng(_validate.integer("seed", seed, minimum=0, maximum=_validate.MAX_SEED))
  # Checked whatever the scheme: a bad value the scheme does not use (alpha=-1 with scheme="iid") was ignored.
  a = _validate.positive("alpha", alpha)
  if a > MAX_ALPHA:  # m * alpha overflowed: rng.dirichlet gave all zeros and the last client got everything
    raise ValueError(f"Expected alpha={a!r} <= {MAX_ALPHA:g} (beyond it the proportions are equal to float "
                     "precision; use scheme='iid').")
  cpc = _validate.integer("classes_per_client", classes_per_client, minimum=1)
  refuse_unused_settings("scheme", scheme, alpha=("alpha", a), classes=("classes_per_client", cpc))
  if scheme == "iid":
    return [np.sort(p) for p in np.array_split(rng.permutation(n), m)]
  if n == 0:  # one client with no records, as iid gives ("classes" blamed classes_per_client=2 <= 0 classes)
    return [np.zeros(0, np.int64)]
  classes = np.unique(labels)
  owners: list[list[np.ndarray]] = [[] for _ in range(m)]
  if scheme == "dirichlet":
    for c in classes:
      idx = rng.permutation(np.flatnonzero(labels == c))
      props = rng.dirichlet(np.full(m, a))
      cuts = (np.cumsum(props)[:-1] * len(idx)).astype(int)
      for i, part in enumerate(np.split(idx, cuts)):
        owners[i].append(part)
  else:
    cpc = _validate.integer("classes_per_client", cpc, minimum=1, maximum=len(classes))
    # Client i holds classes (i, i+1, ..., i+cpc-1) mod C; each class is split
    # evenly among its holders.
    holders = {c: [i for i in range(m) if any(classes[(i + j) % len(classes)] == c for j in range(cpc))]
               for c in classes}
    for c in classes:
      idx = rng.permutation(np.flatnonzero(labels == c))
      hs = holders[c] or [int(rng.integers(m))]
      for h, part in zip(hs, np.array_split(idx, len(hs))):
        owners[h].append(part)
  return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in owners]
