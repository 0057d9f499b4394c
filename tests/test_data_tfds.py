"""The tensorflow-datasets route (Colab), run offline on tfds's mock data.

Skipped unless tensorflow-datasets is installed (``pip install '.[tfds]'``);
``.ci/run`` installs it, so CI runs these. ``tfds.testing.mock_data`` with
``MockPolicy.USE_CODE`` builds random examples from each builder's own
feature spec (its image shape, dtype and label range) without the network,
so these tests check how jaxdistill reads tfds -- batching, order, scaling,
channels, class counts, errors, and the CLI on 32x32 RGB data -- not the real
pixels, which only a download can give.
"""

import json
import os
import tempfile

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tfds = pytest.importorskip("tensorflow_datasets")
tf = pytest.importorskip("tensorflow")

from jaxdistill import data  # pylint: disable=wrong-import-position
from jaxdistill.cli.main import main  # pylint: disable=wrong-import-position
from jaxdistill.fedmd import load_fedmd_data  # pylint: disable=wrong-import-position


@pytest.fixture(autouse=True)
def tfds_scratch_in_tmp_path(tmp_path, monkeypatch):
  """tfds leaves an empty ``tempfile.mkdtemp("tfds")`` folder behind for every builder whose data is not
  prepared (``DatasetInfo.initialize_from_bucket``; GCS is disabled, so nothing is written into it). Keep
  those in the test's own folder instead of the machine's /tmp."""
  scratch = tmp_path / "tempfile"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))


def mock(num_examples):
  return tfds.testing.mock_data(num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE)


def reference(name, split):
  """tfds's own unbatched reading of the split, one example at a time (not jaxdistill's code)."""
  examples = list(tfds.as_numpy(tfds.load(name, split=split, as_supervised=True)))
  return np.stack([x for x, _ in examples]), np.array([y for _, y in examples])


@pytest.mark.parametrize("name, shape, classes", [
    ("mnist", (28, 28, 1), 10), ("fashion_mnist", (28, 28, 1), 10),
    ("svhn_cropped", (32, 32, 3), 10), ("cifar10", (32, 32, 3), 10), ("cifar100", (32, 32, 3), 100)])
def test_load_tfds_reads_every_example_in_order_and_scales_bytes(name, shape, classes):
  with mock(23):
    ref_images, ref_labels = reference(name, "train")
    # batch_size 7 does not divide 23: the last batch is short.
    got = data.load_tfds(name, "train", batch_size=7)
  assert got.images.shape == (23, *shape) and got.images.dtype == np.float32
  assert ref_images.dtype == np.uint8 and ref_images.shape == (23, *shape)
  np.testing.assert_array_equal(got.images, ref_images.astype(np.float32) / np.float32(255))
  np.testing.assert_array_equal(got.labels, ref_labels)
  assert got.labels.dtype == np.int32
  assert got.num_classes == classes and got.name == f"tfds:{name}"


def fixed_examples(labels, shape=(28, 28, 1)):
  """A mock whose split holds these labels (tfds's own mock draws labels over all declared classes)."""
  labels = np.asarray(labels, np.int64)
  images = np.random.default_rng(0).integers(0, 256, (len(labels), *shape), dtype=np.uint8)

  def as_dataset_fn(self, split, **kwargs):  # pylint: disable=unused-argument
    return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})

  return images, tfds.testing.mock_data(as_dataset_fn=as_dataset_fn)


# "emnist:3.1.0" (byclass) and "emnist/letters:3.*.*" are EMNIST too: matching the name's prefix left them transposed.
@pytest.mark.parametrize("name", ["emnist/letters", "emnist/digits", "emnist:3.1.0", "emnist/letters:3.*.*"])
def test_emnist_is_transposed_upright_like_mnist(name):
  # tfds (like the EMNIST release) stores every image transposed; jaxdistill turns it back.
  labels = np.arange(9) + 1  # letters are 1..26
  images, mocked = fixed_examples(labels)
  with mocked:
    got = data.load_tfds(name, "train", batch_size=4)
  np.testing.assert_array_equal(got.images, np.swapaxes(images, 1, 2).astype(np.float32) / np.float32(255))
  np.testing.assert_array_equal(got.labels, labels)


@pytest.mark.parametrize("name, classes", [("emnist/letters", 27), ("emnist/letters:3.1.0", 27),
                                           ("emnist/digits", 10), ("emnist/balanced", 47), ("emnist", 62)])
def test_emnist_has_the_class_count_of_the_idx_route(name, classes):
  # tfds declares 37 classes for emnist/letters (labels 1..26): the votes and the student got 10 empty classes
  # that the IDX route (27) does not have.
  from jaxdistill.data._loading import _KNOWN_CLASSES  # pylint: disable=import-outside-toplevel
  config = name.split(":")[0].split("/")[1] if "/" in name else "byclass"
  assert _KNOWN_CLASSES[f"emnist-{config}"] == classes
  _, mocked = fixed_examples([1, 9, 3])
  with mocked:
    assert data.load_tfds(name, "train").num_classes == classes


def test_emnist_letters_label_beyond_its_classes_is_refused():
  _, mocked = fixed_examples([1, 30, 3])
  with mocked, pytest.raises(ValueError, match=r"expected labels in \[0, 27\) \(EMNIST letters\); got labels in "
                                                r"\[1, 30\]"):
    data.load_tfds("emnist/letters", "test")


def test_load_tfds_does_not_depend_on_batch_size():
  with mock(19):
    a = data.load_tfds("cifar10", "test", batch_size=1)
    b = data.load_tfds("cifar10", "test")
  np.testing.assert_array_equal(a.images, b.images)
  np.testing.assert_array_equal(a.labels, b.labels)


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "no_such_data_set"}, "tfds cannot find data set 'no_such_data_set'"),
    ({"name": "mnist", "batch_size": 0}, "batch_size"),
    ({"name": ""}, "name"),
    ({"name": "celeb_a"}, "'celeb_a' has no class-label feature 'label'"),  # attributes, no class label
    ({"name": "imdb_reviews"}, "'imdb_reviews' has no image feature 'image'"),  # text
])
def test_load_tfds_bad_input_is_a_one_line_value_error(kwargs, match):
  with mock(5), pytest.raises(ValueError, match=match) as info:
    data.load_tfds(**kwargs)
  assert "\n" not in str(info.value)


def test_a_failed_download_is_a_one_line_value_error(monkeypatch):
  # The mock accepts any split, so a failing download is simulated: tfds's own errors run over many lines.
  def failing_load(*args, **kwargs):
    raise RuntimeError("Failed to download mnist\nRetry after checking your network.")

  monkeypatch.setattr(tfds, "load", failing_load)
  with mock(5), pytest.raises(ValueError, match="tfds cannot load 'mnist', split 'test' "
                                                "[(]RuntimeError: Failed to download mnist[)]") as info:
    data.load_tfds("mnist", "test")
  assert "\n" not in str(info.value)


def test_load_dataset_gives_train_and_test_through_tfds():
  with mock(12):
    train, test = data.load_dataset("tfds:svhn_cropped")
  assert len(train) == 12 and len(test) == 12
  assert train.images.shape[1:] == (32, 32, 3) and train.name == "tfds:svhn_cropped"


def test_label_cli_runs_end_to_end_on_rgb_tfds_data(tmp_path, capsys, monkeypatch):
  out = tmp_path / "run"
  # tfds's mock yields the same examples for train and test, and paper_splits leaves test images that are
  # training images out of D_pub and D_eval (here: all of them). The test split is read inverted.
  from jaxdistill.data import _loading  # pylint: disable=import-outside-toplevel
  read = _loading.load_tfds
  def load_tfds(name, split, **kwargs):
    d = read(name, split, **kwargs)
    return d if split == "train" else data.ImageData(1.0 - d.images, d.labels, d.num_classes, d.name)
  monkeypatch.setattr(_loading, "load_tfds", load_tfds)
  with mock(400):
    code = main(["label", "--dataset", "tfds:cifar10", "--private-size", "200", "--public-size", "100",
                 "--eval-size", "100", "--s", "10", "--student-epochs", "1", "--representation", "hog-pca",
                 "--pca-dim", "8", "--no-progress", "--out-dir", str(out),
                 "--data-dir", str(tmp_path / "tfds-data")])  # tfds's folder need not exist yet
  _, err = capsys.readouterr()
  assert code == 0, err
  report = json.loads((out / "report.json").read_text())
  assert report["data"]["dataset"] == "tfds:cifar10" and report["data"]["image_shape"] == [32, 32, 3]
  assert (report["data"]["private_size"], report["data"]["public_size"]) == (200, 100)
  res = report["results"]
  for key in ("acc_pl", "acc_pc", "noise_free_acc_pl", "noise_free_acc_pc", "supervised_ceiling_acc_pc"):
    assert 0.0 <= res[key] <= 1.0, (key, res[key])
  assert report["privacy"]["budget"]["total_epsilon"] == 1.0


def test_fedmd_data_from_tfds_uses_fedmd_cifar100_classes():
  fine = (0, 2, 20, 63, 71, 82)  # FedMD's CIFAR-100 subset
  with mock(3000):  # ~30 examples per CIFAR-100 class
    d = load_fedmd_data(num_parties=3, public_dataset="tfds:cifar10", private_dataset="tfds:cifar100",
                        private_classes=fine, private_per_class=12, test_per_class=6, public_size=50)
    _, ref_labels = reference("cifar100", "train")
  assert d.input_shape == (32, 32, 3) and d.num_public_classes == 10 and d.num_classes == 16
  assert sum(d.party_sizes) == 6 * 12 and len(d.test) == 6 * 6
  labels = np.concatenate([p.labels for p in d.parties])
  np.testing.assert_array_equal(np.bincount(labels, minlength=16), [0] * 10 + [12] * 6)
  assert all(np.sum(ref_labels == c) >= 12 for c in fine)
