"""Bad input to FedMD's public boundary: one-line ValueErrors naming the parameter, nothing lost."""

import dataclasses
import json
import pathlib
import re
import types

import jax
import numpy as np
import pytest

from jaxdistill import accounting, fedmd
from jaxdistill.cli.main import main
from jaxdistill.data import ImageData
from jaxdistill.data._overlap import shared_images

from tests.fedmd.conftest import synthetic, tiny_config, tiny_data

# Runs without training (predictions, releases and checkpoints only) and without the LDP sigma table (several
# PLD searches): what is checked here happens before or between the training steps.
FAST = dict(rounds=2, pretrain_epochs=0, init_epochs=0, digest_epochs=0, revisit_epochs=0)

# The shapes of tiny_config's runs (k 4, batches 4 and 16, 24 public queries), so the CLI tests reuse their compiled
# steps.
TINY_CLI = ["fedmd", "--parties", "2", "--k", "4", "--public-subset", "24", "--architectures", "2,4:0.2",
            "--ldp-table-epsilons", "", "--width-multiplier", "1", "--pretrain-epochs", "0", "--init-epochs", "0",
            "--digest-epochs", "0", "--revisit-epochs", "0", "--private-batch-size", "4", "--public-batch-size",
            "16", "--vmap", "off", "--no-progress"]


class Interrupt(Exception):
  pass


def stop_at(round_):
  def stop(r, info):
    if r >= round_:
      raise Interrupt()
  return stop


def no_training(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("trained before refusing the input")
  monkeypatch.setattr(fedmd._runner, "_fit_group", refuse)  # pylint: disable=protected-access


def interrupted_checkpoint(data, folder, **kw):
  """A checkpoint after round 1 of a 2-round run."""
  with pytest.raises(Interrupt):
    fedmd.run_fedmd(jax.random.key(0), tiny_config(**FAST), data, checkpoint_dir=folder, ldp_table_epsilons=(),
                    on_round_end=stop_at(1), **kw)
  return folder


@pytest.fixture(scope="module")
def checkpoint(data3, tmp_path_factory):
  """Round 1 of 2 (key 0, tiny_config(**FAST), record_releases=False); the tests below only fail to resume it."""
  return interrupted_checkpoint(data3, tmp_path_factory.mktemp("ckpt"))


@pytest.mark.parametrize("recorded", [True, False])
def test_resume_refuses_another_record_releases(data3, checkpoint, tmp_path, monkeypatch, recorded):
  # Before: resuming without recording dropped the saved releases (from the result and the next checkpoint);
  # resuming with it after a run without returned releases whose row 0 was a later round than public_subsets'.
  folder = interrupted_checkpoint(data3, tmp_path, record_releases=True) if recorded else checkpoint
  no_training(monkeypatch)
  with pytest.raises(ValueError, match=rf"made with record_releases={recorded} and this call passes "
                                       rf"record_releases={not recorded}.*Pass record_releases={recorded}\.") as err:
    fedmd.run_fedmd(jax.random.key(0), tiny_config(**FAST), data3, checkpoint_dir=folder, resume=True,
                    record_releases=not recorded, ldp_table_epsilons=())
  assert "\n" not in str(err.value)


def test_resume_refuses_other_data_and_names_what_differs(data3, checkpoint, monkeypatch):
  no_training(monkeypatch)
  key, cfg = jax.random.key(0), tiny_config(**FAST)

  def resume(k, c, d):
    with pytest.raises(ValueError, match="belongs to a different run") as err:
      fedmd.run_fedmd(k, c, d, checkpoint_dir=checkpoint, resume=True, ldp_table_epsilons=())
    msg = str(err.value)
    assert "\n" not in msg and not re.search(r"[0-9a-f]{32}", msg)  # never a hash of private data
    return msg

  # Other private pixels with the same description (names, sizes, classes): resumed silently before.
  p = data3.parties[1]
  moved = dataclasses.replace(data3, parties=(data3.parties[0], ImageData(1.0 - p.images, p.labels, p.num_classes,
                                                                          p.name)) + data3.parties[2:])
  assert moved.description == data3.description
  assert "the private data of party 1" in resume(key, cfg, moved)
  test = dataclasses.replace(data3, test=data3.test.take(np.arange(len(data3.test))[::-1]))
  assert "the test data's content" in resume(key, cfg, test)
  # Other settings are named with their old and new values (before: "configuration, data or seed differ").
  msg = resume(key, dataclasses.replace(cfg, k=5, rounds=3), data3)
  assert "k 4 -> 5" in msg and "rounds 2 -> 3" in msg
  assert "the key (CLI: --seed)" in resume(jax.random.key(1), cfg, data3)
  other = tiny_data(seed=3)
  assert "data seed 0 -> 3" in resume(key, cfg, other)


def test_the_data_hashes_stay_out_of_the_report(data3, tmp_path):
  res = fedmd.run_fedmd(jax.random.key(0), tiny_config(**dict(FAST, rounds=1)), data3,
                        checkpoint_dir=tmp_path, ldp_table_epsilons=())
  hashes = fedmd._runner._data_hashes(data3)  # pylint: disable=protected-access
  report = json.dumps(res.to_report(), default=str)
  assert all(h not in report for h in hashes["parties"] + [hashes["public"], hashes["test"]])


def test_the_data_hash_tells_the_same_bytes_in_other_shapes_apart():
  # sha256 of the pixel and label bytes alone: 2x4 images hashed as their 4x2 reshape, so a resume (or the
  # pre-training memo) took a checkpoint of one for the other.
  pixels = (np.arange(16) / 16).astype(np.float32)
  a = ImageData(pixels.reshape(2, 2, 4, 1), np.array([0, 1], np.int32), 2)
  b = ImageData(pixels.reshape(2, 4, 2, 1), np.array([0, 1], np.int32), 2)
  c = ImageData(pixels.reshape(2, 2, 4, 1), np.array([0, 1], np.int32), 2, "another name")
  digest = fedmd._runner._content_hash  # pylint: disable=protected-access
  assert digest(a) != digest(b) and digest(a) == digest(c)


def test_a_public_set_holding_private_records_is_refused():
  # FedMD's offline default (public MNIST digits, private Fashion-MNIST) and conftest's data are disjoint.
  private_train, private_test = synthetic(300, 10, 1), synthetic(200, 10, 2)
  for public in (private_train, ImageData(np.concatenate([synthetic(59, 10, 0).images, private_train.images[:1]]),
                                          np.arange(60) % 10, 10, "one-shared")):
    with pytest.raises(ValueError, match=r"Expected a public set disjoint from the parties' private records; "
                                         r"\d+ private images") as err:
      fedmd.make_fedmd_data(public, private_train, private_test, num_parties=2, seed=0, private_per_class=None,
                            test_per_class=8)
    assert "\n" not in str(err.value)


def test_test_images_held_by_the_parties_are_left_out():
  # The same set passed as private_train and private_test was taken: 21 of 48 kept test images were training
  # records, so the accuracies were partly training accuracies. Such images are now left out before the test
  # draw (as make_splits does), and the description counts them.
  public, private_train = synthetic(60, 10, 0), synthetic(300, 10, 1)
  d = fedmd.make_fedmd_data(public, private_train, private_train, num_parties=2, seed=0, private_per_class=12,
                            test_per_class=4)
  records = np.concatenate([p.images for p in d.parties])
  assert not shared_images(d.test.images, records).any() and len(d.test) == 6 * 4
  assert d.description["test_images_left_out_as_party_records"] == 6 * 12
  # One party record (a private class's, so that every one is kept) among 199 fresh test images.
  i = int(np.flatnonzero(private_train.labels < 6)[0])
  fresh = synthetic(199, 10, 2)
  one_shared = ImageData(np.concatenate([fresh.images, private_train.images[i:i + 1]]),
                         np.concatenate([fresh.labels, private_train.labels[i:i + 1]]), 10, "one-shared")
  d = fedmd.make_fedmd_data(public, private_train, one_shared, num_parties=2, seed=0, private_per_class=None,
                            test_per_class=None)
  assert not shared_images(d.test.images, np.concatenate([p.images for p in d.parties])).any()
  assert d.description["test_images_left_out_as_party_records"] == 1
  assert len(d.test) == int(np.sum(fresh.labels < 6))
  # Without such images nothing changes: the same draw, and no new key in the description (a checkpoint's
  # fingerprint includes it).
  d = fedmd.make_fedmd_data(public, private_train, synthetic(200, 10, 2), num_parties=2, seed=0,
                            private_per_class=12, test_per_class=4)
  assert "test_images_left_out_as_party_records" not in d.description


def test_public_size_changes_the_public_set_only():
  # The public subsample was drawn from the stream that then selects the private classes, the test images and
  # the partition: public_size=30 gave other parties and another test set than the full public set, for one seed.
  public, private_train, private_test = synthetic(60, 10, 0), synthetic(300, 10, 1), synthetic(200, 10, 2)
  args = dict(num_parties=3, seed=4, private_per_class=12, test_per_class=4)
  full = fedmd.make_fedmd_data(public, private_train, private_test, **args)
  for size in (30, 45):
    part = fedmd.make_fedmd_data(public, private_train, private_test, public_size=size, **args)
    assert len(part.public) == size
    for a, b in zip(full.parties, part.parties, strict=True):
      np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(full.test.images, part.test.images)
    kept = {x.tobytes() for x in public.images}
    assert all(x.tobytes() in kept for x in part.public.images)


@pytest.mark.parametrize("kw,needle", [
    (dict(private_test=ImageData(np.zeros((200, 6, 6, 1), np.float32), np.arange(200) % 10, 10, "t")),
     r"Expected private_test images of the private training images' shape \(12, 12, 1\); got \(6, 6, 1\)"),
    (dict(partition="classes", classes_per_party=9), r"Expected classes_per_party=9 <= 6\."),
    (dict(partition="classes", classes_per_party=0), r"Expected classes_per_party=0 >= 1\."),
    # Checked whatever the partition: iid ignored both silently.
    (dict(classes_per_party=0), r"Expected classes_per_party=0 >= 1\."),
    (dict(alpha=float("nan")), r"Expected alpha to be finite, got nan\."),
    # A valid value the partition does not use was ignored: alpha=0.1 split iid (the report said alpha None).
    (dict(alpha=0.1), r"Expected alpha=0\.1 only with partition='dirichlet' \(elsewhere it is ignored\); got "
                      r"partition='iid'\."),
    (dict(partition="dirichlet", classes_per_party=3),
     r"Expected classes_per_party=3 only with partition='classes' \(elsewhere it is ignored\); got "
     r"partition='dirichlet'\."),
    # int(c) truncated 0.7 to 0 and took True as 1; "012" was read as 0, 1, 2; 5 and None were TypeErrors, and
    # public=None an AttributeError.
    (dict(private_classes=(0.7, 1.2, 2.9)), r"Expected private_classes\[0\] to be an integer, got 0\.7\."),
    (dict(private_classes=(True, False)), r"Expected private_classes\[0\] to be an integer, got True\."),
    (dict(private_classes=(0, "1")), r"Expected private_classes\[1\] to be an integer, got '1'\."),
    (dict(private_classes="012"), r"Expected private_classes to be a list or tuple of class indices; got '012'\."),
    (dict(private_classes=5), r"Expected private_classes to be a list or tuple of class indices; got 5\."),
    (dict(private_classes=None), r"Expected private_classes to be a list or tuple of class indices; got None\."),
    (dict(private_classes=(0, 10)), r"Expected private_classes\[1\]=10 <= 9\."),
    (dict(private_classes=(1, 1)), r"Expected distinct private classes; got \[1, 1\]\."),
    (dict(public=None), r"Expected public to be an ImageData \(jaxdistill.data\); got NoneType\."),
    (dict(private_train=[1, 2]), r"Expected private_train to be an ImageData \(jaxdistill.data\); got list\."),
    (dict(private_test="test"), r"Expected private_test to be an ImageData \(jaxdistill.data\); got str\."),
])
def test_make_fedmd_data_names_its_parameters(kw, needle):
  args = dict(public=synthetic(60, 10, 0), private_train=synthetic(300, 10, 1), private_test=synthetic(200, 10, 2),
              num_parties=3, seed=0, private_per_class=12, test_per_class=8)
  args.update(kw)
  with pytest.raises(ValueError, match=needle) as err:
    fedmd.make_fedmd_data(**args)
  assert "\n" not in str(err.value)


def test_load_fedmd_data_refuses_an_unused_partition_setting_before_reading_data():
  # "nosuch" would fail when read: the alpha error comes first.
  with pytest.raises(ValueError, match=r"Expected alpha=2\.0 only with partition='dirichlet'"):
    fedmd.load_fedmd_data(private_dataset="nosuch", partition="classes", alpha=2.0)
  with pytest.raises(ValueError, match=r"private set \(private_dataset='nosuch'"):
    fedmd.load_fedmd_data(private_dataset="nosuch", partition="dirichlet", alpha=2.0)


def test_make_fedmd_data_takes_classes_as_a_list_tuple_range_or_array():
  args = dict(public=synthetic(60, 10, 0), private_train=synthetic(300, 10, 1), private_test=synthetic(200, 10, 2),
              num_parties=3, seed=0, private_per_class=12, test_per_class=8)
  for given in ([2, 0, 5], (2, 0, 5), np.array([2, 0, 5], np.int64)):
    assert fedmd.make_fedmd_data(private_classes=given, **args).description["private_classes"] == [2, 0, 5]
  assert fedmd.make_fedmd_data(private_classes=range(3), **args).description["private_classes"] == [0, 1, 2]


@pytest.mark.parametrize("specs", [1.5, -1, True])
def test_config_specs_that_are_not_a_sequence_are_named(specs):
  # Were a TypeError ("'float' object is not iterable").
  with pytest.raises(ValueError, match=r"^Expected specs to be a non-empty tuple of CNNSpec; got "):
    fedmd.FedMDConfig(specs=specs)


@pytest.mark.parametrize("weighting,needle", [
    # float() took text and bools as weights.
    (("1", "2"), r"Expected weighting\[0\] to be a real number, got '1'\."),
    ((True, False), r"Expected weighting\[0\] to be a real number, got True\."),
    ((1.0, np.bool_(True)), r"Expected weighting\[1\] to be a real number, got (np\.)?True_?\)?\."),
    ((1.0, float("nan")), r"Expected weighting\[1\] to be finite, got nan\."),
    ((1.0, None), r"Expected weighting\[1\] to be a real number, got None\."),
    ({"a": 1, "b": 2}, r"Expected weighting to be 'equal', 'size' or N numbers; got \{'a': 1, 'b': 2\}\."),
    (3, r"Expected weighting to be 'equal', 'size' or N numbers; got 3\."),
    # Named no parameter ("Expected 2 finite nonnegative weights ...").
    ((1.0, -1.0), r"Expected weighting to be num_parties=2 finite nonnegative weights, not all zero; "
                  r"got \(1\.0, -1\.0\)\."),
    ((1.0, 2.0, 3.0), r"Expected weighting to be num_parties=2 finite nonnegative weights, not all zero; "
                      r"got \(1\.0, 2\.0, 3\.0\)\."),
])
def test_config_weights_are_real_numbers_as_given(weighting, needle):
  with pytest.raises(ValueError, match=needle) as err:
    fedmd.FedMDConfig(num_parties=2, weighting=weighting)
  assert "\n" not in str(err.value)
  for good in ((1, 2.5), [1, 2.5], np.array([1.0, 2.5])):
    assert fedmd.FedMDConfig(num_parties=2, weighting=good).weighting == (1.0, 2.5)


def _fake_result(**config):
  return types.SimpleNamespace(accuracy=np.full((2, 3), 0.5), accuracy_private=None, eval_rounds=[0, 1],
                               config=tiny_config(**config), final_accuracy=np.full(3, 0.5))


def test_plots_write_the_path_they_return(tmp_path):
  res = _fake_result()
  plots = (lambda p: fedmd.plot_accuracy_per_round(res, p), lambda p: fedmd.plot_accuracy_vs_k([res], p))
  for plot in plots:
    for path, needle in ((tmp_path, "it is a folder"),  # wrote tmp_path.png and returned the folder
                         (tmp_path / "plot", "to end in an image suffix"),  # wrote plot.png, returned plot
                         (tmp_path / "missing" / "p.png", "in an existing folder")):  # FileNotFoundError
      with pytest.raises(ValueError, match=re.escape(f"Expected path={str(path)!r} ") + ".*" + needle) as err:
        plot(path)
      assert "\n" not in str(err.value)
  assert not list(tmp_path.parent.glob(f"{tmp_path.name}.*")) and not list(tmp_path.iterdir())
  for i, plot in enumerate(plots):
    out = plot(str(tmp_path / f"p{i}.png"))
    assert out == tmp_path / f"p{i}.png" and out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("call,needle", [
    # [] drew an empty plot; a lone result was a TypeError; an np run was plotted against a k it never used.
    (lambda p: fedmd.plot_accuracy_vs_k([], p), r"Expected results to be a non-empty list of FedMD results; got \[\]"),
    (lambda p: fedmd.plot_accuracy_vs_k(_fake_result(), p), "Expected results to be a non-empty list"),
    (lambda p: fedmd.plot_accuracy_vs_k([_fake_result(), None], p),
     r"Expected results\[1\] to be a FedMDResult \(from run_fedmd\); got NoneType"),
    (lambda p: fedmd.plot_accuracy_vs_k([_fake_result(method="np")], p),
     r"Expected results\[0\] of a method that samples k records .*got method='np'"),
    (lambda p: fedmd.plot_accuracy_vs_k([_fake_result()], p, baselines={"NP": float("nan")}),
     r"Expected baselines\['NP'\] to be finite"),
    (lambda p: fedmd.plot_accuracy_vs_k([_fake_result()], p, baselines=[0.5]), "Expected baselines to be a dict"),
    (lambda p: fedmd.plot_accuracy_per_round({"accuracy": [[0.5]]}, p),  # AttributeError: 'dict' ... 'accuracy'
     "Expected result to be a FedMDResult"),
    (lambda p: fedmd.plot_accuracy_per_round(types.SimpleNamespace(**{**vars(_fake_result()), "accuracy": []}), p),
     r"Expected result.accuracy to be a non-empty \[rounds, parties\] array; got shape \(0,\)"),
])
def test_plots_refuse_what_they_cannot_draw(tmp_path, call, needle):
  with pytest.raises(ValueError, match=needle) as err:
    call(tmp_path / "p.png")
  assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


def test_plot_accuracy_vs_k_takes_any_iterable_of_results(tmp_path):
  # dict values were refused (not a Sequence); a generator was read twice (lines, then ticks).
  by_k = {k: _fake_result(k=k) for k in (2, 4)}
  assert fedmd.plot_accuracy_vs_k(by_k.values(), tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
  assert fedmd.plot_accuracy_vs_k((r for r in by_k.values()), tmp_path / "b.png").is_file()


def test_plot_accuracy_vs_k_draws_parties_of_equal_accuracy(tmp_path):
  # Ten parties at exactly 1/6 (one class each, no collaboration): their mean rounds above their max, and the
  # negative bar length made matplotlib raise "'yerr' must not contain negative values".
  acc = np.full(10, 1 / 6)
  assert acc.mean() > acc.max()  # the float64 rounding this test is about
  res = types.SimpleNamespace(**{**vars(_fake_result(num_parties=10, method="local-sample")),
                                 "accuracy": np.tile(acc, (2, 1)), "final_accuracy": acc})
  assert fedmd.plot_accuracy_vs_k([res], tmp_path / "k.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_accuracy_vs_k_draws_one_line_per_method_n_and_sampling(tmp_path, monkeypatch):
  # Results of other methods and N were merged into one "without replacement" line, joined vertically at a k.
  import matplotlib.axes  # pylint: disable=import-outside-toplevel
  drawn = []
  def spy(self, x, y, *args, **kwargs):
    drawn.append((kwargs.get("label"), list(x), [round(float(v), 6) for v in y]))
    return original(self, x, y, *args, **kwargs)
  original = matplotlib.axes.Axes.errorbar
  monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
  def res(method, k, n, acc, wr=False):
    r = _fake_result(method=method, k=k, num_parties=n, with_replacement=wr)
    return types.SimpleNamespace(**{**vars(r), "accuracy": np.full((2, n), acc), "final_accuracy": np.full(n, acc)})
  results = [res("nfdp", 16, 3, 0.4), res("local-sample", 3, 3, 0.6), res("nfdp", 3, 3, 0.1),
             res("local-sample", 16, 2, 0.5), res("nfdp", 3, 3, 0.2, wr=True)]
  fedmd.plot_accuracy_vs_k(results, tmp_path / "k.png")
  assert sorted(drawn) == sorted([
      ("nfdp, N=3, without replacement", [3, 16], [0.1, 0.4]),
      ("local-sample, N=3, without replacement", [3], [0.6]),
      ("local-sample, N=2, without replacement", [16], [0.5]),
      ("nfdp, N=3, with replacement", [3], [0.2])])
  drawn.clear()
  fedmd.plot_accuracy_vs_k([res("nfdp", 3, 3, 0.1), res("nfdp", 3, 3, 0.2, wr=True)], tmp_path / "k2.png")
  assert sorted(drawn) == [("with replacement", [3], [0.2]), ("without replacement", [3], [0.1])]  # as before
  # Two results for one point of one line: refused, not joined vertically.
  with pytest.raises(ValueError, match=r"Expected one result per k on each line \(method, N, sampling\); "
                                       r"results\[0\] and results\[1\] are both nfdp, N=3, without replacement, "
                                       r"sample reused at k=3\.") as err:
    fedmd.plot_accuracy_vs_k([res("nfdp", 3, 3, 0.1), res("nfdp", 3, 3, 0.3)], tmp_path / "k3.png")
  assert "\n" not in str(err.value) and not (tmp_path / "k3.png").exists()


def test_plot_accuracy_vs_k_bars_span_each_points_parties_min_to_max(tmp_path, monkeypatch):
  import matplotlib.axes  # pylint: disable=import-outside-toplevel
  bars = []
  original = matplotlib.axes.Axes.errorbar
  def spy(self, x, y, *args, **kwargs):
    bars.append(np.asarray(kwargs["yerr"], dtype=np.float64))
    return original(self, x, y, *args, **kwargs)
  monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
  acc = np.array([0.2, 0.5, 0.5])  # mean 0.4: 0.2 below, 0.1 above
  res = types.SimpleNamespace(**{**vars(_fake_result(method="nfdp", k=3)), "accuracy": np.tile(acc, (2, 1)),
                                 "final_accuracy": acc})
  fedmd.plot_accuracy_vs_k([res], tmp_path / "k.png")
  assert len(bars) == 1 and bars[0].shape == (2, 1)
  np.testing.assert_allclose(bars[0][:, 0], [0.2, 0.1], atol=1e-12)


def test_plot_accuracy_vs_k_titles_the_methods_it_draws(tmp_path, monkeypatch):
  # Every plot was titled "FedMD-NFDP", local-sample results (no collaboration) included.
  import matplotlib.axes  # pylint: disable=import-outside-toplevel
  titles = []
  original = matplotlib.axes.Axes.set_title
  monkeypatch.setattr(matplotlib.axes.Axes, "set_title",
                      lambda self, label, *a, **kw: titles.append(label) or original(self, label, *a, **kw))
  nfdp, local = _fake_result(method="nfdp", k=3), _fake_result(method="local-sample", k=3)
  for results in ([nfdp], [local], [local, nfdp]):
    fedmd.plot_accuracy_vs_k(results, tmp_path / "k.png")
  fedmd.plot_accuracy_vs_k([local], tmp_path / "k.png", title="mine")
  assert titles == ["FedMD-NFDP: accuracy against k", "local training on the sample: accuracy against k",
                    "FedMD-NFDP and local training on the sample: accuracy against k", "mine"]


def test_cli_writes_the_report_before_the_plots_and_survives_a_failing_plot(capsys, tmp_path, monkeypatch):
  # A plot that raised (matplotlib refusing the bars of equal accuracies) lost report.json after all the training,
  # and --resume failed the same way every time.
  fake_data(monkeypatch)
  out = tmp_path / "o"
  def fail(results, path, **kwargs):
    assert (out / "report.json").is_file(), "a plot was drawn before the report was written"
    raise ValueError("'yerr' must not contain negative values")
  monkeypatch.setattr(fedmd, "plot_accuracy_vs_k", fail)
  args = TINY_CLI + ["--rounds", "1", "--init-epochs", "1", "--k", "2,4", "--out", str(out)]  # trains: T1 = 1
  assert main(args) == 1
  captured = capsys.readouterr()
  assert ("jaxdistill: could not draw accuracy_vs_k.png (ValueError: 'yerr' must not contain negative values); "
          f"{out / 'report.json'} is written") in captured.err
  assert "1 plot(s) could not be drawn" in captured.out
  report = json.loads((out / "report.json").read_text())
  assert [r["name"] for r in report["runs"]] == ["nfdp-k2-wor", "nfdp-k4-wor"]
  assert (out / "accuracy_per_round_nfdp-k4-wor.png").is_file()  # the other plots are still drawn
  assert not (out / "accuracy_vs_k.png").exists()
  # --resume redraws the plots from the checkpoints, without training again.
  monkeypatch.undo()
  fake_data(monkeypatch)
  def no_training(*args, **kwargs):
    raise AssertionError("trained again on --resume of finished runs")
  monkeypatch.setattr(fedmd._runner, "_fit_group", no_training)  # pylint: disable=protected-access
  assert main(args + ["--resume"]) == 0
  assert (out / "accuracy_vs_k.png").read_bytes()[:4] == b"\x89PNG"
  assert json.loads((out / "report.json").read_text())["runs"][0]["name"] == "nfdp-k2-wor"
  assert (out / "history" / "report-1.json").is_file()


@pytest.mark.parametrize("call,needle", [
    (lambda d, ck: fedmd.run_fedmd(jax.random.key(0), tiny_config(), None), "Expected data to be a FedMDData"),
    (lambda d, ck: fedmd.run_fedmd(jax.random.key(0), tiny_config().to_dict(), d),
     "Expected config to be a FedMDConfig; got dict"),
    (lambda d, ck: fedmd.check_config(tiny_config(), None), "Expected data to be a FedMDData"),
    (lambda d, ck: fedmd.run_fedmd(jax.random.key(0), tiny_config(**FAST), d, checkpoint_dir=ck, resume="no"),
     "Expected resume to be a bool, got 'no'"),  # resumed before
    (lambda d, ck: fedmd.run_fedmd(jax.random.key(0), tiny_config(), d, record_releases="no"),
     "Expected record_releases to be a bool, got 'no'"),  # recorded before
    (lambda d, ck: fedmd.run_fedmd(jax.random.key(0), tiny_config(), d, progress="no"),
     "Expected progress to be a bool, got 'no'"),
    (lambda d, ck: fedmd.check_config(tiny_config(**FAST), d, checkpoint_dir=ck, resume="no"),
     "Expected resume to be a bool, got 'no'"),
])
def test_run_fedmd_checks_types_and_flags(data3, checkpoint, monkeypatch, call, needle):
  no_training(monkeypatch)
  with pytest.raises(ValueError, match=re.escape(needle)) as err:
    call(data3, checkpoint)
  assert "\n" not in str(err.value)


def test_the_ldp_side_table_never_blocks_an_nfdp_run(data3):
  # n = 24 per party, k = 500 with replacement: p = 1 - (23/24)^500 = 1 - 6e-10, beyond the accountant. The
  # run used to fail with the side table's "certifies no delta this small ... target_delta=0.99999".
  cfg = tiny_config(**dict(FAST, k=500, with_replacement=True, rounds=1))
  res = fedmd.run_fedmd(jax.random.key(0), cfg, data3, ldp_table_epsilons=(0.0, 1.0))
  table = res.ldp_sigma_table
  assert [r["epsilon"] for r in table["rows"]] == [0.0] and table["skipped_epsilons"] == [1.0]
  assert "No row for epsilon 1 at delta = 0.99999" in table["note"] and "no privacy guarantee" in table["note"]
  assert res.privacy[0]["exact"]["delta_for_every_epsilon"] > 0.9999


@pytest.mark.parametrize("kw,needle", [
    # LDP samples nothing: it said "Expected k=1000 <= n=24 for sampling without replacement".
    (dict(k=1000), r"Expected k=1000 <= n=24 for sampling without replacement \(method='ldp' samples no "
                   r"records: k only sets its default ldp_delta.*Pass ldp_delta \(CLI: --ldp-delta\)"),
    (dict(k=500, with_replacement=True), r"at its default ldp_delta, NFDP's p = 0.99999\d+ for n=24, k=500, WR "
                                         r"\(method='ldp' samples no records"),
    # Refused by rule: p = 0.5 calibrates, and p = 1 - 6e-10 now does too (sigma 0.835, after 44 s of PLDs).
    (dict(k=12), r"at its default ldp_delta, NFDP's p = 0.5 for n=24, k=12, WOR \(method='ldp' samples no records: "
                 r"k only sets this default\): a delta of 0.5 or more is no guarantee\. Pass ldp_delta"),
])
def test_ldp_k_errors_say_that_k_only_sets_the_delta(data3, monkeypatch, kw, needle):
  no_training(monkeypatch)
  with pytest.raises(ValueError, match=needle) as err:
    fedmd.run_fedmd(jax.random.key(0), tiny_config(method="ldp", rounds=1, relation="replace-one", **kw), data3,
                    ldp_table_epsilons=())
  assert "\n" not in str(err.value)


def fake_data(monkeypatch):
  monkeypatch.setattr(fedmd, "load_fedmd_data", lambda **kw: tiny_data(num_parties=2))


def no_data(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("loaded data (and would train) before checking the command")
  monkeypatch.setattr(fedmd, "load_fedmd_data", refuse)


def _without(args, *flags):
  """args less each flag in flags and its value."""
  return [x for i, x in enumerate(args) if x not in flags and (i == 0 or args[i - 1] not in flags)]


@pytest.mark.parametrize("extra,needle", [
    (["--rounds", "0", "--stop-after-round", "1"], "Expected --stop-after-round=1 <= --rounds=0"),
])
def test_cli_bad_input_before_loading_data(capsys, tmp_path, monkeypatch, extra, needle):
  no_data(monkeypatch)
  # A run of no rounds refuses the flags that only rounds read (tests/fedmd/test_cli.py).
  args = _without(TINY_CLI, "--public-subset", "--digest-epochs", "--revisit-epochs")
  assert main(args + ["--out", str(tmp_path / "o")] + extra) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and needle in err


def test_cli_checks_every_checkpoint_folder_before_the_first_run(capsys, tmp_path, monkeypatch):
  # Before: run k2 trained, then run k4 failed on the file where its checkpoint folder goes.
  no_data(monkeypatch)
  out = tmp_path / "o"
  (out / "checkpoints").mkdir(parents=True)
  (out / "checkpoints" / "nfdp-k4-wor").write_text("not a folder")
  assert main(TINY_CLI + ["--rounds", "1", "--k", "2,4", "--out", str(out)]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1
  assert f"Expected --out={str(out)!r} to hold no file named 'checkpoints/nfdp-k4-wor'" in err


def test_cli_stop_after_round_on_resume_reports_the_round_reached(capsys, tmp_path, monkeypatch):
  fake_data(monkeypatch)
  args = TINY_CLI + ["--rounds", "3", "--out", str(tmp_path / "o"), "--stop-after-round", "1"]
  assert main(args) == 0
  assert "stopped after round 1" in capsys.readouterr().err
  assert main(args + ["--resume"]) == 0  # said "stopped after round 1" with the checkpoint at round 2
  err = capsys.readouterr().err
  assert "stopped after round 2 of run nfdp-k4-wor (resumed from round 1, already at --stop-after-round=1" in err
  path = tmp_path / "o" / "checkpoints" / "nfdp-k4-wor" / fedmd.CHECKPOINT_NAME
  meta, _ = fedmd._runner._read_checkpoint(path, meta_only=True)  # pylint: disable=protected-access
  assert meta["round"] == 2


def test_a_with_replacement_k_too_large_for_memory_is_refused_before_training(data3, monkeypatch):
  # k = 1e8 with replacement passed check_config and ended in a MemoryError (53.6 GiB of sampled images) after the
  # pre-training. The samples' size is now compared with the host's memory first.
  def no_training(*args, **kwargs):
    raise AssertionError("trained before refusing k")
  monkeypatch.setattr(fedmd._runner, "_fit_group", no_training)  # pylint: disable=protected-access
  # pylint: disable-next=protected-access
  monkeypatch.setattr(fedmd._runner, "_host_memory_bytes", lambda: 2**30, raising=False)
  per_record = int(np.prod(data3.input_shape)) * data3.parties[0].images.itemsize
  fits = 2**30 // (3 * per_record)  # three parties' samples of k images each
  cfg = tiny_config(**dict(FAST, k=fits + 1, with_replacement=True))
  needle = (rf"Expected k={fits + 1} with replacement to give samples that fit in memory: 3 parties x {fits + 1} "
            rf"records x {per_record} bytes = 1 GiB > 1 GiB on this host\.")
  for call in (lambda: fedmd.check_config(cfg, data3), lambda: fedmd.run_fedmd(jax.random.key(0), cfg, data3)):
    with pytest.raises(ValueError, match=needle) as err:
      call()
    assert "\n" not in str(err.value)
  fedmd.check_config(tiny_config(**dict(FAST, k=fits, with_replacement=True)), data3)  # the largest that fits
  fedmd.check_config(tiny_config(**dict(FAST, k=4, with_replacement=False)), data3)  # WOR: k <= n is in memory


def test_the_report_and_add_one_say_what_they_do_not_cover():
  # report.json holds every party's exact size (n is private under add/remove) and accuracies of models trained on
  # private data; relation="add-one" reports k/(n+1), which covers only a record the party does not hold.
  flat = lambda text: " ".join(text.replace("*", "").split())  # noqa: E731  (no *emphasis*)
  readme = flat((pathlib.Path(__file__).parents[2] / "README.md").read_text())
  for text in (fedmd.FedMDResult.to_report.__doc__, fedmd.run_fedmd.__doc__, readme):
    assert "experimenter's record, not a DP release" in flat(text)
  for text in (fedmd.FedMDConfig.__doc__, accounting.nfdp_inclusion_probability.__doc__,
               accounting.nfdp_privacy.__doc__):
    assert all(words in flat(text) for words in ("k/(n+1)", "k/n", "add-remove", "not hold"))
  # The figure the docs give for a held record x: the add-one pair (D minus x, D) is add-one at n - 1 records.
  n, k = 6, 2
  held = accounting.nfdp_privacy(n - 1, k, relation="add-one").flat_delta
  assert held == pytest.approx(k / n) == pytest.approx(accounting.nfdp_privacy(n, k).flat_delta)
  reported = accounting.nfdp_privacy(n, k, relation="add-one").flat_delta
  assert reported == pytest.approx(k / (n + 1)) and reported < held
