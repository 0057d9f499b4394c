"""``jaxdistill label``: a tiny end-to-end run, and one-line exit-2 errors for bad input."""

import gzip
import json
import struct

import numpy as np
import pytest

from jaxdistill import labeling
from jaxdistill.cli.main import main


def write_idx(directory, prefix, images, labels):
  directory.mkdir(parents=True, exist_ok=True)
  with gzip.open(directory / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
    f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, *images.shape) + images.astype(np.uint8).tobytes())
  with gzip.open(directory / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
    f.write(struct.pack(">BBBBI", 0, 0, 8, 1, labels.shape[0]) + labels.astype(np.uint8).tobytes())


def run_cli(args, capsys):
  code = main(args)
  out, err = capsys.readouterr()
  return code, out, err


@pytest.mark.parametrize("args,match", [
    (["--s", "2000"], "num_queries"),
    (["--k", "5", "--s", "3"], "k=5"),
    (["--epsilon", "-1"], "epsilon"),
    (["--mechanism", "gaussian"], "mechanism"),
    (["--dataset", "mnist", "--data-dir", "/nonexistent/jaxdistill-data"], "does not exist"),
    (["--dataset", "mnist"], "data_dir"),
    (["--dataset", "emnist-letters"], "'emnist-letters' needs data_dir"),
    (["--out-dir", ""], "--out-dir to be a folder path; got ''"),  # used to mean the default folder
    (["--dataset", "mnist", "--data-dir", __file__], "existing folder; it is a file"),
    (["--T", "0"], "iterations"),
    (["--student-widths", "100000,8"], "widths=100000 <= 8192"),  # was an XLA out-of-memory traceback
    (["--student-refine", "-1"], "refine_rounds"),
    # Checked with the settings, before any release (was an OverflowError after the votes were released):
    (["--student-epochs", "2147483648"], "student settings (--student-*): Expected epochs=2147483648 <= 1000000"),
    (["--T", "101"], "iterations=101 <= 100"),  # 10^9 hung in the budget plan
    (["--student-seeds", "1001"], "student_seeds=1001 <= 1000"),
    (["--encoder-width", "32"], "learned representation"),  # default representation: hog-pca
    (["--representation", "contrastive", "--encoder-steps", "0"], "encoder_steps=0"),
    # Ignored there, yet in the release fingerprint (they were accepted); at the default value they were accepted
    # and ignored, although the help says "only with it":
    (["--representation", "hog", "--pca-dim", "3"], "Expected --pca-dim only with --representation pca or hog-pca "
                                                    "(elsewhere it is ignored); got --representation hog."),
    (["--representation", "scan", "--pca-dim", "50"], "Expected --pca-dim only with --representation pca or "
                                                      "hog-pca"),
    (["--mechanism", "local-rr", "--central-noise", "laplace"], "Expected --central-noise only with --mechanism "
                                                                "central (elsewhere it is ignored); got --mechanism "
                                                                "local-rr."),
    (["--mechanism", "shuffle-single", "--central-noise", "discrete-laplace"], "--central-noise only with"),
    (["--mechanism", "central", "--shuffle-local", "collision"], "Expected --shuffle-local only with --mechanism "
                                                                 "shuffle-single"),
    # No ceiling is trained without the baselines (it was accepted and ignored):
    (["--no-baselines", "--ceiling-seeds", "3"], "Expected ceiling_seeds=3 only with baselines=True (the supervised "
                                                 "ceiling is one of the baselines; elsewhere it is ignored); got "
                                                 "baselines=False."),
    # Recorded in the settings beside an (inf, 1) statement (they were accepted and meant nothing):
    (["--mechanism", "none", "--epsilon", "2"], "no delta with mechanism=none: it releases the exact votes"),
    (["--mechanism", "none", "--delta", "1e-6"], "got delta=1e-06"),
    # It drew nothing: only the default folder's name said secret-noise.
    (["--mechanism", "none", "--secret-noise"], "Expected --secret-noise only with a mechanism that draws noise; "
                                                "got --mechanism none."),
    (["--epsilon", "-1e-3"], "epsilon=-0.001 > 0"),  # was "argument --epsilon: expected one argument"
    (["--connection", "balanced-harmonic", "--mechanism", "local-rr"], "mechanism=central or none with connection"),
])
def test_bad_input_is_one_line_exit_2(args, match, capsys, tmp_path):
  code, out, err = run_cli(["label", "--no-progress", "--out-dir", str(tmp_path / "o"), *args], capsys)
  assert code == 2
  assert err.count("\n") == 1 and match in err
  assert "Traceback" not in err


@pytest.mark.parametrize("mechanism", ["central", "none"])
def test_unwritable_out_dir_fails_before_any_work(mechanism, capsys, tmp_path, monkeypatch):
  from jaxdistill.labeling import _pipeline  # pylint: disable=import-outside-toplevel

  def no_work(config):
    raise AssertionError("data were loaded before out_dir was checked")

  monkeypatch.setattr(_pipeline, "load_splits", no_work)
  (tmp_path / "afile").write_text("x")
  for out_dir, match in ((tmp_path / "afile", "it is a file"), (tmp_path / "afile" / "o", "writable folder")):
    eps = ["--epsilon", "1"] if mechanism != "none" else []  # none takes no epsilon
    code, _, err = run_cli(["label", "--no-progress", "--mechanism", mechanism, *eps,
                            "--out-dir", str(out_dir)], capsys)
    assert code == 2 and err.count("\n") == 1 and match in err and "out_dir" in err, err
  assert (tmp_path / "afile").read_text() == "x"


def test_a_run_that_fails_on_its_data_leaves_no_empty_out_dir(capsys, tmp_path):
  # The out dir is made before the data load (so a bad folder fails first); a load that then failed
  # left it behind, empty. A folder that existed before, or holds anything, stays.
  (tmp_path / "empty-idx").mkdir()
  bad = ["label", "--no-progress", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "empty-idx")]
  code, _, err = run_cli(bad + ["--out-dir", str(tmp_path / "new" / "o")], capsys)
  assert code == 2 and "Missing IDX file" in err
  assert not (tmp_path / "new").exists()
  (tmp_path / "kept").mkdir()
  (tmp_path / "kept" / "notes.txt").write_text("mine")
  code, _, _ = run_cli(bad + ["--out-dir", str(tmp_path / "kept")], capsys)
  assert code == 2 and (tmp_path / "kept" / "notes.txt").read_text() == "mine"
  (tmp_path / "existing").mkdir()
  code, _, _ = run_cli(bad + ["--out-dir", str(tmp_path / "existing")], capsys)
  assert code == 2 and (tmp_path / "existing").is_dir()


def test_a_run_refused_after_its_ledger_opened_leaves_no_folder(capsys, tmp_path):
  # The ledger opens before the representation is fitted; its key file used to be written then, so a
  # setting refused at the fit left a new out dir holding only .ledger-key. The key now waits for a release.
  out = tmp_path / "new" / "o"
  code, _, err = run_cli(["label", "--no-progress", "--private-size", "300", "--public-size", "100",
                          "--eval-size", "100", "--s", "10", "--pca-dim", "100000", "--out-dir", str(out)], capsys)
  assert code == 2 and err.count("\n") == 1, err
  # It names the flag's setting (pca_dim), not only the library parameter it feeds (num_components).
  assert "pca_dim=100000 does not fit the hog-pca representation" in err and "num_components=100000" in err, err
  assert not (tmp_path / "new").exists()


def test_a_folder_named_like_a_plot_is_refused_before_any_work(capsys, tmp_path, monkeypatch):
  # The plots are written after the release and the training; a folder in their place lost the report.
  from jaxdistill.labeling import _pipeline  # pylint: disable=import-outside-toplevel

  def no_work(config):
    raise AssertionError("data were loaded before out_dir was checked")

  monkeypatch.setattr(_pipeline, "load_splits", no_work)
  (tmp_path / "o" / "labels.png").mkdir(parents=True)
  code, _, err = run_cli(["label", "--no-progress", "--out-dir", str(tmp_path / "o")], capsys)
  assert code == 2 and err.count("\n") == 1 and "no folder named 'labels.png'" in err


@pytest.mark.parametrize("train_shape, train_classes, match", [
    # (Training labels past the test split's classes are no longer refused here: both IDX splits now
    # take the larger class count, tests/test_data.py::test_idx_splits_share_one_class_count.)
    ((60, 32, 32), 10, ("the train split's images are (32, 32, 1) (H, W, C) but the test split's are (28, 28, 1)",)),
])
def test_idx_bad_private_data(tmp_path, capsys, train_shape, train_classes, match):
  rng = np.random.default_rng(0)
  write_idx(tmp_path / "idx", "train", rng.integers(0, 255, train_shape), np.arange(60) % train_classes)
  write_idx(tmp_path / "idx", "t10k", rng.integers(0, 255, (40, 28, 28)), np.arange(40) % 10)
  code, _, err = run_cli(["label", "--dataset", "idx", "--data-dir", str(tmp_path / "idx"), "--public-size", "20",
                          "--eval-size", "20", "--s", "5", "--no-progress", "--out-dir", str(tmp_path / "o")],
                         capsys)
  assert code == 2 and err.count("\n") == 1
  assert all(m in err for m in match)


def test_tiny_run_writes_report_and_plots(tmp_path, capsys):
  out_dir = tmp_path / "run"
  args = ["label", "--private-size", "600", "--public-size", "200", "--eval-size", "200", "--s", "10",
          "--epsilon", "5", "--student-epochs", "1", "--student-widths", "4,8", "--no-progress",
          "--out-dir", str(out_dir)]
  code, out, err = run_cli(args + ["--ceiling-seeds", "2", "--student-seeds", "2"], capsys)
  assert code == 0, err
  rep = json.loads((out_dir / "report.json").read_text())
  assert rep["settings"]["num_queries"] == 10 and rep["settings"]["mechanism"] == "central"
  assert rep["settings"]["ceiling_seeds"] == 2 and len(rep["results"]["supervised_ceiling_draws"]) == 2
  assert rep["settings"]["student_seeds"] == 2 and len(rep["results"]["acc_pc_draws"]) == 2
  assert len(rep["results"]["noise_free_acc_pc_draws"]) == 2
  assert out.count("mean over 2 student seeds") == 3  # private, noise-free and ceiling rows
  assert rep["privacy"]["statement"]["epsilon"] == pytest.approx(5.0)
  assert {"accuracy.png", "labels.png"} <= {p.name for p in out_dir.iterdir()}
  assert "Acc_pl" in out and "supervised ceiling" in out
  # The same command again reuses the release instead of paying for it twice (baselines are not
  # part of a release's settings; leaving them out keeps the test short).
  first_plots = {name: (out_dir / name).read_bytes() for name in ("accuracy.png", "labels.png")}
  code, out, _ = run_cli(args + ["--no-baselines"], capsys)
  assert code == 0 and "reused released votes of iterations [1]" in out
  # The first run's plots moved to history/ beside its report (they used to be overwritten).
  assert json.loads((out_dir / "history" / "report-1.json").read_text())["plots"] == ["accuracy.png", "labels.png"]
  for name, content in first_plots.items():
    assert (out_dir / "history" / f"report-1-{name}").read_bytes() == content
  ledger = json.loads((out_dir / "ledger.json").read_text())
  assert len(ledger["releases"]) == 1 and len(ledger["runs"]) == 2
  # A plot that cannot be saved (a full disk) loses neither the report nor the other plot, and the command exits 1:
  # the plots were drawn first, and the OSError lost report.json after the whole run.
  import errno  # pylint: disable=import-outside-toplevel
  import matplotlib.figure  # pylint: disable=import-outside-toplevel
  save = matplotlib.figure.Figure.savefig

  def full_disk(self, target, *more, **kwargs):
    if any(ax.get_title().startswith("released votes") for ax in self.axes):  # labels.png
      raise OSError(errno.ENOSPC, "No space left on device")
    return save(self, target, *more, **kwargs)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    with pytest.warns(RuntimeWarning, match=r"Could not draw labels\.png \(OSError: \[Errno 28\] No space left"):
      code, out, _ = run_cli(args + ["--no-baselines"], capsys)
  assert code == 1 and "could not draw labels.png" in out
  rep = json.loads((out_dir / "report.json").read_text())
  assert rep["plots"] == ["accuracy.png"]
  assert rep["plot_errors"] == {"labels.png": "OSError: [Errno 28] No space left on device"}
  assert (out_dir / "accuracy.png").exists() and not (out_dir / "labels.png").exists()
  assert (out_dir / "history" / "report-2.json").exists() and not (out_dir / "history" / "report-3.json").exists()


def test_seed_secret_noise_and_release_flags_reach_the_configuration(tmp_path):
  # Each flag the release depends on must reach LabelingConfig: a dropped --secret-noise would derive the vote
  # noise from the recorded --seed (anyone could subtract it), a dropped --seed would reuse seed 0's noise.
  from jaxdistill.cli import _label  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli.main import build_parser  # pylint: disable=import-outside-toplevel
  base = ["label", "--seed", "7", "--s", "30", "--k", "2", "--T", "2", "--epsilon", "3"]
  plain = _label.config_from_args(build_parser().parse_args(base))
  assert (plain.seed, plain.num_queries, plain.k, plain.iterations, plain.epsilon) == (7, 30, 2, 2, 3.0)
  assert plain.noise_seed is None and plain.out_dir.endswith("seed7")
  secret = _label.config_from_args(build_parser().parse_args(
      base + ["--secret-noise", "--mechanism", "shuffle-single", "--delta", "1e-7", "--out-dir", str(tmp_path)]))
  assert secret.seed == 7 and secret.mechanism == "shuffle-single" and secret.delta == 1e-7
  assert secret.out_dir == str(tmp_path)
  assert isinstance(secret.noise_seed, int) and secret.noise_seed != 7
  assert _label.default_out_dir(secret).endswith("-seed7-secret-noise-delta1e-07")


@pytest.mark.parametrize("base", [["--mechanism", "central"], ["--mechanism", "shuffle-multi"],
                                  ["--mechanism", "shuffle-single", "--secret-noise"]])
def test_default_out_dir_differs_exactly_when_the_release_fingerprint_does(base):
  # The default folder named only dataset, mechanism, eps, s, k, T and seed: a second default run changing only
  # --delta, --representation, --connection, a size or a noise/encoder setting landed in the first run's folder,
  # whose ledger then refused it. Folders must coincide exactly when the releases' fingerprints do.
  from jaxdistill.cli import _label  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli.main import build_parser  # pylint: disable=import-outside-toplevel
  shuffle = base[1].startswith("shuffle")
  variants = [[], ["--delta", "1e-7" if shuffle else "0"], ["--representation", "pca"],
              ["--representation", "pca", "--pca-dim", "20"], ["--representation", "contrastive"],
              ["--representation", "contrastive", "--encoder-width", "32"],
              ["--representation", "contrastive", "--encoder-steps", "2000"],  # the default, spelled out
              ["--private-size", "2000"], ["--private-size", "3000"], ["--public-size", "500"], ["--eval-size", "900"],
              ["--student-epochs", "2"], ["--student-targets", "soft"], ["--no-baselines"]]
  if not shuffle:
    variants += [["--connection", "knn-labeling"], ["--connection", "balanced-harmonic"],
                 ["--central-noise", "laplace"], ["--central-noise", "discrete-laplace"]]
  if base[1] == "shuffle-single":
    variants += [["--shuffle-local", "rr"], ["--shuffle-local", "collision"]]
  configs = [_label.config_from_args(build_parser().parse_args(["label", *base, *v])) for v in variants]
  fingerprints = [json.dumps(c.release_fingerprint(), sort_keys=True) for c in configs]
  assert len(set(fingerprints)) >= 8  # the variants do change the releases
  for a, fa in zip(configs, fingerprints):
    for b, fb in zip(configs, fingerprints):
      assert (a.out_dir == b.out_dir) == (fa == fb), (a.out_dir, b.out_dir)
  assert configs[0].out_dir.startswith("runs/label-mnist-embedded-")  # the README's default folder keeps its name
  assert all(c.out_dir.startswith(configs[0].out_dir) for c in configs)


def test_mechanism_and_representation_flags_reach_the_configuration_where_read():
  # --central-noise, --shuffle-local and --pca-dim default to None in argparse (so that one given where it is
  # ignored is refused even at its default value); not given, the library's defaults fill them in.
  from jaxdistill.cli import _label  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli.main import build_parser  # pylint: disable=import-outside-toplevel
  d = labeling.LabelingConfig()
  plain = _label.config_from_args(build_parser().parse_args(["label"]))
  assert (plain.central_noise, plain.shuffle_local, plain.pca_dim) == (d.central_noise, d.shuffle_local, d.pca_dim)
  central = _label.config_from_args(build_parser().parse_args(
      ["label", "--central-noise", "laplace", "--representation", "pca", "--pca-dim", "7"]))
  assert (central.central_noise, central.representation, central.pca_dim) == ("laplace", "pca", 7)
  single = _label.config_from_args(build_parser().parse_args(
      ["label", "--mechanism", "shuffle-single", "--shuffle-local", "rr"]))
  assert single.shuffle_local == "rr" != d.shuffle_local
