"""``jaxdistill fedmd``: report.json + plots, stop/resume, one-line errors (exit 2)."""

import dataclasses
import inspect
import json
import os
import shlex
import subprocess

import pytest

from jaxdistill import data, fedmd, models
from jaxdistill.cli import _fedmd
from jaxdistill.cli.main import main

HAVE_FASHION = data.find_fashion_mnist() is not None
needs_fashion = pytest.mark.skipif(
    not HAVE_FASHION and os.environ.get("JAXDISTILL_REQUIRE_FASHION_MNIST") != "1",
    reason="dataset-fashion-mnist not installed")

TINY = ["fedmd", "--parties", "2", "--rounds", "1", "--public-subset", "32", "--private-per-class", "8",
        "--test-per-class", "8", "--public-size", "64", "--architectures", "2,4:0.2", "--ldp-table-epsilons", "0",
        "--width-multiplier", "1", "--pretrain-epochs", "0", "--init-epochs", "1", "--private-batch-size", "4",
        "--public-batch-size", "16", "--no-progress"]
# The same for a method that does not collaborate (no public subset, no sigma table: it refuses both).
SOLO = [x for i, x in enumerate(TINY) if x not in ("--public-subset", "--ldp-table-epsilons")
        and TINY[i - 1] not in ("--public-subset", "--ldp-table-epsilons")]


def _config_of(method):
  # ldp without ldp_delta needs replace-one; np, local and centralized make no privacy statement and take none.
  return fedmd.FedMDConfig(method=method, relation="replace-one" if method == "ldp" else "add-remove")


def test_cli_choices_match_the_library():
  assert _fedmd.METHODS == fedmd.METHODS
  assert _fedmd.RELEASE_MODES == fedmd.RELEASE_MODES
  assert _fedmd.VMAP_MODES == fedmd.VMAP_MODES
  assert _fedmd._TABLE_METHODS == tuple(  # pylint: disable=protected-access
      m for m in fedmd.METHODS if _config_of(m).has_ldp_table)
  # The CLI passes its defaults of the settings only some methods read to every method: FedMDConfig lets only
  # its own defaults through there (another k for np is refused), so the two must be the same numbers.
  default = {f.name: f.default for f in dataclasses.fields(fedmd.FedMDConfig)}
  assert (_fedmd._INTS(_fedmd._DEFAULT_K), _fedmd._DEFAULT_SAMPLING == "wr",  # pylint: disable=protected-access
          _fedmd._DEFAULT_LDP_EPSILON, _fedmd._DEFAULT_LDP_CLIP) == (  # pylint: disable=protected-access
              (default["k"],), default["with_replacement"], default["ldp_epsilon"], default["ldp_clip"])
  assert (_fedmd._DEFAULT_REVISIT_EPOCHS, _fedmd._DEFAULT_EVAL_EVERY) == (  # pylint: disable=protected-access
      default["revisit_epochs"], default["eval_every"])
  loader = inspect.signature(fedmd.load_fedmd_data).parameters
  assert (_fedmd._DEFAULT_ALPHA, _fedmd._DEFAULT_CLASSES_PER_PARTY) == (  # pylint: disable=protected-access
      loader["alpha"].default, loader["classes_per_party"].default)
  assert (_fedmd._DEFAULT_PUBLIC_SUBSET, _fedmd._DEFAULT_AGGREGATION,  # pylint: disable=protected-access
          _fedmd._DEFAULT_WEIGHTING, _fedmd._DEFAULT_DIGEST_EPOCHS) == (  # pylint: disable=protected-access
              default["public_subset"], default["aggregation"], default["weighting"], default["digest_epochs"])
  assert _fedmd._COLLAB_METHODS == tuple(  # pylint: disable=protected-access
      m for m in fedmd.METHODS if _config_of(m).collaborates)


@needs_fashion
def test_report_and_plots(tmp_path, capsys):
  out = tmp_path / "run"
  assert main(TINY + ["--k", "2,3", "--sampling", "both", "--out", str(out)]) == 0
  assert "report.json" in capsys.readouterr().out
  rep = json.loads((out / "report.json").read_text())
  assert rep["command"] == shlex.join(["jaxdistill"] + TINY + ["--k", "2,3", "--sampling", "both", "--out", str(out)])
  assert [r["name"] for r in rep["runs"]] == ["nfdp-k2-wor", "nfdp-k3-wor", "nfdp-k2-wr", "nfdp-k3-wr"]
  assert [w["code"] for w in rep["warnings"]] == ["runs_share_parties"]
  run = rep["runs"][1]
  n = run["data"]["party_sizes"][0]
  assert run["privacy"][0]["exact"]["delta_for_every_epsilon"] == pytest.approx(3 / n)
  assert run["accuracy"]["eval_rounds"] == [0, 1]
  assert len(run["accuracy"]["per_round_per_party"][0]) == 2
  assert run["ldp_sigma_table"]["rows"][0]["epsilon"] == 0.0
  assert "samples" not in run  # sampled record indices stay in the checkpoint, not the shared report
  pngs = sorted(p.name for p in out.glob("*.png"))
  assert "accuracy_vs_k.png" in pngs and "accuracy_per_round_nfdp-k3-wr.png" in pngs
  assert all((out / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


@needs_fashion
def test_stop_and_resume(tmp_path, capsys):
  out = tmp_path / "run"
  args = TINY[:] + ["--k", "2", "--out", str(out)]
  args[args.index("--rounds") + 1] = "2"
  # --resume on a fresh --out starts the run, and says so (a mistyped --out used to start over quietly).
  assert main(args + ["--resume", "--stop-after-round", "1"]) == 0
  err = capsys.readouterr().err
  assert "--resume found no checkpoint under" in err and "rerun with --resume" in err
  assert not (out / "report.json").exists()
  assert main(args) == 2  # a checkpoint exists: refuse to release everything again
  assert "resume" in capsys.readouterr().err
  assert main(args + ["--resume"]) == 0
  assert "found no checkpoint" not in capsys.readouterr().err
  rep = json.loads((out / "report.json").read_text())
  assert rep["runs"][0]["resumed_from_round"] == 1
  assert rep["runs"][0]["accuracy"]["eval_rounds"] == [0, 1, 2]


@needs_fashion
def test_secret_randomness_is_kept_for_resume_and_never_reported(tmp_path, capsys, monkeypatch):
  drawn = iter([111_222_333_444, 555_666_777_888])  # the second would be a new secret: it must not be used
  monkeypatch.setattr("jaxdistill._keys.secrets.randbits", lambda bits: next(drawn))
  out = tmp_path / "run"
  args = TINY[:] + ["--k", "2,3", "--out", str(out)]
  args[args.index("--rounds") + 1] = "2"
  assert main(args + ["--secret-randomness", "--stop-after-round", "1"]) == 0  # stops in run k2
  ckpt = out / "checkpoints"
  assert fedmd.checkpoint_secret_seed(ckpt / "nfdp-k2-wor") == 111_222_333_444
  assert fedmd.checkpoint_secret_seed(ckpt / "nfdp-k3-wor") is None  # not started
  capsys.readouterr()
  assert main(args + ["--resume"]) == 2  # the run's samples came from the secret: refuse the public key
  assert "--secret-randomness" in capsys.readouterr().err
  assert main(args + ["--resume", "--secret-randomness"]) == 0
  # Resumed with the kept secret, and the run started after the resume uses it too (one seed per command).
  assert fedmd.checkpoint_secret_seed(ckpt / "nfdp-k2-wor") == 111_222_333_444
  assert fedmd.checkpoint_secret_seed(ckpt / "nfdp-k3-wor") == 111_222_333_444
  text = (out / "report.json").read_text()
  assert "111222333444" not in text and "555666777888" not in text
  rep = json.loads(text)
  assert [r["resumed_from_round"] for r in rep["runs"]] == [1, None]
  for r in rep["runs"]:
    assert r["privacy"][0]["randomness"].startswith("secret seed")
    assert "randomness_from_run_key" not in {w["code"] for w in r["privacy"][0]["warnings"]}
  assert "paired, not independent" in rep["warnings"][0]["message"]
  # And the reverse: a run made from --seed is not resumed with a secret.
  assert main(args + ["--out", str(tmp_path / "public"), "--stop-after-round", "1"]) == 0
  capsys.readouterr()
  assert main(args + ["--out", str(tmp_path / "public"), "--resume", "--secret-randomness"]) == 2
  assert "not to be given" in capsys.readouterr().err


@pytest.mark.parametrize("extra,needle", [
    (["--parties", "0"], "num_parties"),
    (["--aggregation", "median"], "aggregation"),
    (["--method", "fedavg"], "method"),
    (["--weighting", "heavy"], "weighting"),
    (["--architectures", "1,2"], "spec"),
    (["--partition", "writers"], "partition"),
    # Ignored without a word: the parties were split iid.
    (["--alpha", "0.1"], "Expected --alpha only with --partition dirichlet (elsewhere it is ignored); got "
                         "--partition iid."),
    (["--partition", "dirichlet", "--classes-per-party", "3"], "--classes-per-party only with --partition classes"),
    # At its default value too (the library cannot tell a default given from one not given):
    (["--alpha", "0.5"], "Expected --alpha only with --partition dirichlet"),
    (["--partition", "iid", "--classes-per-party", "2"], "Expected --classes-per-party only with --partition classes"),
    (["--method", "np", "--k", "3,16"], "--k"),
    # Flags the method ignores ran it without a word (NP with --k 3; NFDP with --ldp-epsilon 2).
    (["--method", "local", "--k", "3", "--sampling", "wr"],
     "Expected --k and --sampling only with --method nfdp or local-sample (elsewhere they are ignored); got "
     "--method local."),
    (["--method", "centralized", "--sampling", "wor"], "Expected --sampling only with --method nfdp or local-sample"),
    (["--method", "ldp", "--ldp-delta", "1e-3", "--k", "4"], "Expected --k only with --method nfdp or local-sample"),
    (["--ldp-epsilon", "2"], "Expected --ldp-epsilon only with --method ldp (elsewhere it is ignored); got --method "
                             "nfdp."),
    # Only nfdp and ldp reports have the LDP sigma table and its delta (TINY asks for a table).
    (["--method", "local"], "Expected --ldp-table-epsilons only with --method nfdp or ldp (elsewhere it is "
                            "ignored); got --method local."),
    (["--method", "centralized", "--ldp-delta", "1e-3"],
     "Expected --ldp-delta and --ldp-table-epsilons only with --method nfdp or ldp (elsewhere they are ignored); got "
     "--method centralized."),
    (["--method", "np", "--ldp-table-epsilons", "", "--ldp-delta", "1e-3"], "Expected --ldp-delta only with --method "
                                                                           "nfdp or ldp"),
    (["--ldp-table-epsilons", "", "--ldp-delta", "1e-3"], "Expected --ldp-delta with --method nfdp only beside a "
                                                         "sigma table (it is the table's delta); got "
                                                         "--ldp-table-epsilons ''."),
    # The clip bounds logits releases only: argmax and softmax rows have a fixed sensitivity.
    (["--ldp-clip", "4"], "Expected --ldp-clip only with --aggregation logits and --method nfdp or ldp (elsewhere it "
                          "is ignored); got --method nfdp --aggregation argmax."),
    (["--method", "local", "--ldp-table-epsilons", "", "--aggregation", "logits", "--ldp-clip", "4"],
     "got --method local --aggregation logits."),
    # local, local-sample and centralized query no public data and release nothing (TINY sets --public-subset).
    (["--method", "local", "--ldp-table-epsilons", "", "--digest-epochs", "3"],
     "Expected --public-subset and --digest-epochs only with --method nfdp, np or ldp, the methods that collaborate "
     "(elsewhere they are ignored); got --method local."),
    (["--method", "centralized", "--ldp-table-epsilons", "", "--aggregation", "softmax", "--weighting", "1,2"],
     "Expected --public-subset and --aggregation and --weighting only with --method nfdp, np or ldp"),
    # A run of no rounds releases no predictions: what shapes them and the table matched to them went unread.
    (["--rounds", "0", "--ldp-table-epsilons", "", "--digest-epochs", "3"],
     "Expected --public-subset and --digest-epochs only with --rounds >= 1 (a run of no rounds releases no "
     "predictions and trains no rounds: they are ignored); got --rounds 0."),
    (["--rounds", "0", "--public-subset", "5000", "--ldp-table-epsilons", "0,1", "--ldp-delta", "1e-3"],
     "Expected --public-subset and --ldp-delta and --ldp-table-epsilons only with --rounds >= 1"),
    (["--rounds", "0", "--ldp-table-epsilons", "", "--resample-each-round"],
     "Expected --public-subset and --resample-each-round only with --rounds >= 1"),
    # No round trains or evaluates either (the report said revisit_epochs 50 for a run that revisited nothing).
    (["--rounds", "0", "--ldp-table-epsilons", "", "--revisit-epochs", "1", "--eval-every", "3"],
     "Expected --public-subset and --revisit-epochs and --eval-every only with --rounds >= 1"),
    (["--k", "x"], "--k"),
    (["--stop-after-round", "0"], "--stop-after-round=0 >= 1"),
    (["--stop-after-round", "-5"], "--stop-after-round=-5 >= 1"),
    (["--stop-after-round", "2"], "--stop-after-round=2 <= --rounds=1"),  # ran to the end without a word
    # Widths beyond MAX_WIDTH: a TypeError or an XLA out-of-memory traceback before the check.
    (["--width-multiplier", "1e30"], "width_multiplier=1e+30 to keep every conv width <= 8192"),
    (["--architectures", "100000,4:0.2"], "widths=100000 <= 8192"),
])
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, extra, needle):
  assert main(TINY + ["--out", str(tmp_path)] + extra) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_a_command_that_fails_on_its_data_leaves_no_empty_out(capsys, tmp_path):
  (tmp_path / "empty-idx").mkdir()
  out = tmp_path / "new" / "run"
  assert main(TINY + ["--k", "2,3", "--data-dir", str(tmp_path / "empty-idx"), "--out", str(out)]) == 2
  assert "Missing IDX file" in capsys.readouterr().err
  assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("extra,needle", [
    # The public set's folder went unchecked (mnist-embedded reads none); the two unknown-name errors were alike.
    (["--public-data-dir", "/nonexistent"], "public set (public_dataset='mnist-embedded', public_data_dir="),
    (["--public-dataset", "nosuch"], "public set (public_dataset='nosuch'"),
    (["--private-dataset", "nosuch"], "private set (private_dataset='nosuch'"),
])
def test_data_errors_say_which_set(capsys, tmp_path, extra, needle):
  out = tmp_path / "new"
  assert main(TINY + ["--out", str(out)] + extra) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and needle in err, err
  assert not out.exists()


def test_unwritable_out_fails_before_loading_data(capsys, tmp_path):
  (tmp_path / "afile").write_text("x")
  assert main(TINY + ["--out", str(tmp_path / "afile" / "o")]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "--out=" in err and "writable folder" in err


@needs_fashion
def test_k_larger_than_n_without_replacement(capsys, tmp_path):
  assert main(TINY + ["--out", str(tmp_path), "--k", "1000"]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "k=1000" in err


@pytest.mark.parametrize("eps,needle", [("-1", "--ldp-table-epsilons=-1.0 >= 0"), ("0,nan", "--ldp-table-epsilons"),
                                        ("inf", "--ldp-table-epsilons"),
                                        ("1e30", "--ldp-table-epsilons=1e+30 <= 500")])  # was an OverflowError
def test_bad_table_epsilons_fail_before_loading_data(capsys, tmp_path, monkeypatch, eps, needle):
  def no_data(*args, **kwargs):
    raise AssertionError("loaded data (and would train) before validating --ldp-table-epsilons")
  monkeypatch.setattr(fedmd, "load_fedmd_data", no_data)
  assert main(TINY + ["--out", str(tmp_path), f"--ldp-table-epsilons={eps}"]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


@needs_fashion
def test_second_run_keeps_the_first_report(tmp_path):
  out = tmp_path / "run"
  args = TINY + ["--k", "2", "--out", str(out)]
  assert main(args) == 0
  first = (out / "report.json").read_text()
  first_plot = (out / "accuracy_per_round_nfdp-k2-wor.png").read_bytes()
  # Two architectures: the ';' split the recorded command in a shell (it was joined with spaces, unquoted).
  args_np = SOLO + ["--method", "local", "--architectures", "2,4:0.2;2,4,4:0.2", "--out", str(out)]
  assert main(args_np) == 0
  assert (out / "history" / "report-1.json").read_text() == first
  # Its plots move beside it (they used to be overwritten; the kept report named them).
  assert (out / "history" / "report-1-accuracy_per_round_nfdp-k2-wor.png").read_bytes() == first_plot
  assert not (out / "accuracy_per_round_nfdp-k2-wor.png").exists()
  # k and the sampling name only runs that read them (this one was called local-k16-wor).
  second = json.loads((out / "report.json").read_text())
  assert second["runs"][0]["name"] == "local"
  config = second["runs"][0]["config"]  # the settings local does not read are null (k 16 was recorded)
  assert config["k"] is config["with_replacement"] is config["public_subset"] is config["relation"] is None
  # A shell reads the recorded command back as the same arguments.
  echoed = subprocess.run(["bash", "-c", "printf '%s\\n' " + second["command"]], capture_output=True, text=True,
                          check=True).stdout
  assert echoed.splitlines() == ["jaxdistill", *args_np]
  assert (out / "accuracy_per_round_local.png").is_file() and (out / "checkpoints" / "local").is_dir()


def test_report_history_never_overwrites(tmp_path):
  history = tmp_path / "history"
  history.mkdir()
  (history / "report-3.json").write_text("three")  # report-1 and -2 were deleted: a count would give 2
  (history / "report-x.json").write_text("not numbered")
  (tmp_path / "report.json").write_text("four")
  _fedmd._write_report(tmp_path, {"run": 5})  # pylint: disable=protected-access
  assert (history / "report-3.json").read_text() == "three"
  assert (history / "report-4.json").read_text() == "four"
  _fedmd._write_report(tmp_path, {"run": 6})  # pylint: disable=protected-access
  assert json.loads((history / "report-5.json").read_text()) == {"run": 5}
  assert json.loads((tmp_path / "report.json").read_text()) == {"run": 6}
  assert "history/report-<N>.json" in " ".join(_fedmd.__doc__.split())


def test_an_interrupted_report_write_leaves_no_partial_report(tmp_path, monkeypatch):
  # report.json was written in place after the earlier one moved to history/: an interrupt left a truncated one.
  from jaxdistill import _files  # pylint: disable=import-outside-toplevel
  (tmp_path / "report.json").write_text('{"run": 1}')

  def interrupted(fd):
    raise KeyboardInterrupt("interrupted before the new report was on disk")

  monkeypatch.setattr(_files.os, "fsync", interrupted)
  with pytest.raises(KeyboardInterrupt):
    _fedmd._write_report(tmp_path, {"run": 2})  # pylint: disable=protected-access
  assert sorted(p.name for p in tmp_path.iterdir()) == ["history"]  # no partial report, no temporary file
  assert json.loads((tmp_path / "history" / "report-1.json").read_text()) == {"run": 1}


def test_a_history_file_in_out_fails_before_loading_data(capsys, tmp_path, monkeypatch):
  def no_data(*args, **kwargs):
    raise AssertionError("loaded data (and would train) before checking --out")
  monkeypatch.setattr(fedmd, "load_fedmd_data", no_data)
  (tmp_path / "history").write_text("not a folder")
  assert main(TINY + ["--out", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "no file named 'history'" in err


@pytest.mark.parametrize("extra, needle", [
    (["--k", "2,2"], "distinct --k values"),  # the second k=2 run found the first one's checkpoint
    (["--k", "02,2"], "distinct --k values"),
])
def test_repeated_k_is_refused_before_loading_data(extra, needle, capsys, tmp_path, monkeypatch):
  def no_data(*args, **kwargs):
    raise AssertionError("loaded data (and would train) before checking --k")
  monkeypatch.setattr(fedmd, "load_fedmd_data", no_data)
  assert main(TINY + extra + ["--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and needle in err


def test_a_folder_named_like_a_plot_is_refused_before_loading_data(capsys, tmp_path, monkeypatch):
  # The plots are written after all the training, and a folder in their place lost the report.
  def no_data(*args, **kwargs):
    raise AssertionError("loaded data (and would train) before checking --out")
  monkeypatch.setattr(fedmd, "load_fedmd_data", no_data)
  for plot in ("accuracy_vs_k.png", "accuracy_per_round_nfdp-k3-wor.png"):
    out = tmp_path / plot.split(".")[0]
    (out / plot).mkdir(parents=True)
    assert main(TINY + ["--k", "2,3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"no folder named '{plot}'" in err


def test_public_data_dir_reaches_the_loader(capsys, tmp_path, monkeypatch):
  seen = {}

  def spy(**kwargs):
    seen.update(kwargs)
    raise ValueError("stop here")
  monkeypatch.setattr(fedmd, "load_fedmd_data", spy)
  assert main(TINY + ["--public-dataset", "mnist", "--public-data-dir", str(tmp_path), "--out",
                      str(tmp_path / "o")]) == 2
  assert seen["public_dataset"] == "mnist" and seen["public_data_dir"] == str(tmp_path)
  assert "stop here" in capsys.readouterr().err


@needs_fashion
def test_every_k_is_checked_against_the_parties_before_any_run(capsys, tmp_path, monkeypatch):
  # k = 2 used to train to the end before k = 1000 (larger than a party) stopped the command: no report.
  def no_training(*args, **kwargs):
    raise AssertionError("a run trained before every k was checked")
  monkeypatch.setattr(fedmd, "run_fedmd", no_training)
  assert main(TINY + ["--k", "2,1000", "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "k=1000 <=" in err


@needs_fashion
def test_an_rbg_default_prng_still_gives_a_threefry_key(tmp_path, monkeypatch):
  # The run's key followed JAX_DEFAULT_PRNG_IMPL; it is the threefry key of --seed whatever the default (a run
  # keyed from seed 0, whatever --seed said, passed before the key's data was checked too).
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  class Stop(BaseException):  # not an Exception: past the CLI's error handling
    pass

  impls, keys = [], []

  def spy(key, *args, **kwargs):
    impls.append(str(jax.random.key_impl(key)))
    keys.append(np.asarray(jax.random.key_data(key)))
    raise Stop
  monkeypatch.setattr(fedmd, "run_fedmd", spy)
  old = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", "rbg")
  try:
    with pytest.raises(Stop):
      main(TINY + ["--k", "2", "--seed", "7", "--out", str(tmp_path / "run")])
  finally:
    jax.config.update("jax_default_prng_impl", old)
  want = jax.random.key(7, impl="threefry2x32")
  assert impls == [str(jax.random.key_impl(want))]
  np.testing.assert_array_equal(keys[0], np.asarray(jax.random.key_data(want)))


@pytest.mark.parametrize("flag,value,needle", [
    # Empty entries were skipped: --k 1,,2 ran k=1 and k=2; --k , said "Expected at least one --k".
    ("--k", "1,,2", "entry 2 of '1,,2' is empty"),
    ("--k", ",", "entry 1 of ',' is empty"),
    ("--k", "2,", "entry 2 of '2,' is empty"),
    ("--k", "", "expected comma-separated integers; got ''"),
    # A bad entry was reported as the whole text ("Expected --k to be comma-separated integers; got '1,x'").
    ("--k", "1,x", "entry 2 of '1,x' is 'x', not an integer"),
    ("--k", "1.5", "'1.5' is not an integer"),
    ("--private-classes", "0,,1", "entry 2 of '0,,1' is empty"),
    ("--private-classes", "0,a", "entry 2 of '0,a' is 'a', not an integer"),
    ("--weighting", "1,,1", "entry 2 of '1,,1' is empty"),
    ("--weighting", "1,x", "entry 2 of '1,x' is 'x', not a number"),
    ("--weighting", "heavy", "expected equal, size or comma-separated numbers; 'heavy' is not a number"),
    ("--ldp-table-epsilons", "0,,1", "entry 2 of '0,,1' is empty"),
    ("--ldp-table-epsilons", "0,one", "entry 2 of '0,one' is 'one', not a number"),
    ("--architectures", "2,4:0.2;;4,8:0.2", "entry 2 of '2,4:0.2;;4,8:0.2' is empty"),
    ("--architectures", "2,4:0.2;x", "entry 2 of '2,4:0.2;x' is 'x', not a CNN spec"),
])
def test_bad_list_entries_are_refused_by_argparse(flag, value, needle, capsys, tmp_path, monkeypatch):
  def no_data(*args, **kwargs):
    raise AssertionError(f"loaded data (and would train) with {flag} {value!r}")
  monkeypatch.setattr(fedmd, "load_fedmd_data", no_data)
  assert main(TINY + [flag, value, "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(f"jaxdistill fedmd: argument {flag}: expected ") and needle in err, err
  assert len(err.splitlines()) == 1 and not (tmp_path / "o").exists()


def test_list_flags_parse_every_entry(tmp_path):
  from jaxdistill.cli.main import build_parser  # pylint: disable=import-outside-toplevel
  args = build_parser().parse_args(TINY + ["--k", "2, 3", "--private-classes", "4,5", "--weighting", "1,2.5",
                                           "--ldp-table-epsilons", "", "--out", str(tmp_path)])
  assert args.k == (2, 3) and args.private_classes == (4, 5) and args.weighting == (1.0, 2.5)
  assert args.ldp_table_epsilons == () and args.architectures == (models.parse_spec("2,4:0.2"),)
  defaults = _fedmd._check_method_flags(build_parser().parse_args(["fedmd"]))  # pylint: disable=protected-access
  assert defaults.sampling == "wor" and defaults.ldp_epsilon == 1.0
  assert defaults.k == (16,) and defaults.private_classes == (0, 1, 2, 3, 4, 5) and defaults.weighting == "equal"
  assert defaults.ldp_table_epsilons == fedmd.DEFAULT_LDP_EPSILONS == (0.0, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
  assert defaults.architectures == "fedmd" and defaults.ldp_clip == fedmd.FedMDConfig().ldp_clip == 10.0


@pytest.mark.parametrize("extra,table,clip", [
    (["--method", "np"], (), 10.0),  # no table for a method without one, and no error
    (["--method", "local", "--ldp-table-epsilons", ""], (), 10.0),  # '' (none) is what it does anyway
    (["--method", "np", "--public-subset", "7", "--aggregation", "softmax", "--weighting", "size", "--digest-epochs",
      "3"], (), 10.0),  # np collaborates: it reads these four
    (["--method", "ldp", "--ldp-delta", "1e-3", "--aggregation", "logits", "--ldp-clip", "4"],
     fedmd.DEFAULT_LDP_EPSILONS, 4.0),
    (["--aggregation", "logits", "--ldp-clip", "4", "--ldp-delta", "1e-3", "--ldp-table-epsilons", "0,2"], (0.0, 2.0),
     4.0),
])
def test_method_flags_are_accepted_where_the_method_uses_them(extra, table, clip):
  from jaxdistill.cli.main import build_parser  # pylint: disable=import-outside-toplevel
  args = _fedmd._check_method_flags(build_parser().parse_args(["fedmd"] + extra))  # pylint: disable=protected-access
  assert args.ldp_table_epsilons == table and args.ldp_clip == clip
  cfg = _fedmd._config(args, 16, False)  # pylint: disable=protected-access
  assert cfg.ldp_clip == clip and cfg.ldp_delta == (1e-3 if "--ldp-delta" in extra else None)
  if "--public-subset" in extra:
    assert (cfg.public_subset, cfg.aggregation, cfg.weighting, cfg.digest_epochs) == (7, "softmax", "size", 3)


def test_the_table_states_the_largest_delta_over_the_parties():
  # The run's guarantee is its weakest party's: the largest delta, first party on ties.
  privacy = [{"exact": {"delta_for_every_epsilon": 0.1}}, {"exact": {"delta_for_every_epsilon": 0.3}},
             {"calibrated_to": {"delta": 0.2}}, {"exact": {"delta_for_every_epsilon": 0.3}}]
  largest = _fedmd._largest_delta  # pylint: disable=protected-access
  assert largest(privacy) == "0.3 (1)"
  assert largest([{"calibrated_to": {"delta": 1e-5}}, {}]) == "1e-05 (0)"
  assert largest([{}, {}]) == "-"


def test_every_training_flag_reaches_its_config_field(tmp_path):
  from jaxdistill.cli.main import build_parser  # pylint: disable=import-outside-toplevel
  args = build_parser().parse_args(TINY + [
      "--rounds", "7", "--digest-epochs", "3", "--revisit-epochs", "5", "--init-epochs", "11",
      "--pretrain-epochs", "13", "--private-batch-size", "17", "--public-batch-size", "19", "--public-subset", "23",
      "--lr", "0.25", "--eval-every", "2", "--method", "ldp", "--ldp-epsilon", "1.5", "--ldp-delta", "1e-5",
      "--ldp-clip", "4", "--aggregation", "logits", "--out", str(tmp_path)])
  args = _fedmd._check_method_flags(args)  # pylint: disable=protected-access
  cfg = _fedmd._config(args, 16, False)  # pylint: disable=protected-access; ldp with --ldp-delta reads no k
  got = {f: getattr(cfg, f) for f in ("k", "rounds", "digest_epochs", "revisit_epochs", "init_epochs",
                                      "pretrain_epochs", "private_batch_size", "public_batch_size", "public_subset",
                                      "learning_rate", "eval_every", "method", "ldp_epsilon", "ldp_delta",
                                      "ldp_clip", "aggregation", "num_parties", "with_replacement")}
  assert got == {"k": 16, "rounds": 7, "digest_epochs": 3, "revisit_epochs": 5, "init_epochs": 11,
                 "pretrain_epochs": 13, "private_batch_size": 17, "public_batch_size": 19, "public_subset": 23,
                 "learning_rate": 0.25, "eval_every": 2, "method": "ldp", "ldp_epsilon": 1.5, "ldp_delta": 1e-5,
                 "ldp_clip": 4.0, "aggregation": "logits", "num_parties": 2, "with_replacement": False}
  # The k and sampling of each run (the --k and --sampling entries) reach a method that samples.
  args = build_parser().parse_args(TINY + ["--method", "nfdp", "--k", "3", "--sampling", "wr", "--out", str(tmp_path)])
  cfg = _fedmd._config(_fedmd._check_method_flags(args), 3, True)  # pylint: disable=protected-access
  assert (cfg.method, cfg.k, cfg.with_replacement) == ("nfdp", 3, True)
