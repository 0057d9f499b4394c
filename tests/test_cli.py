"""The CLI: JSON contracts, readable tables, one-line errors with exit status 2."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from jaxdistill.cli.main import main


def run_json(capsys, argv):
  assert main(argv) == 0
  out = capsys.readouterr().out.strip().splitlines()
  assert len(out) == 1, "--json prints exactly one JSON object"
  return json.loads(out[0])


def test_nfdp_json(capsys):
  obj = run_json(capsys, ["privacy", "nfdp", "--n", "300", "--k", "16", "--json"])
  assert obj["paper"]["delta"] == pytest.approx(16 / 300)
  assert obj["exact"]["delta"] == pytest.approx(16 / 300)
  assert obj["relation"] == "add-remove"
  assert {w["code"] for w in obj["warnings"]} >= {"delta_at_least_1_over_n", "paper_epsilon_vacuous"}


def test_nfdp_json_with_epsilon_and_relation(capsys):
  obj = run_json(capsys, ["privacy", "nfdp", "--n", "300", "--k", "3", "--with-replacement",
                          "--relation", "add-one", "--epsilon", "5", "--json"])
  assert obj["exact"]["epsilon"] == 5.0
  assert obj["exact"]["delta"] == pytest.approx(1 - (300 / 301)**3)
  assert obj["paper"]["epsilon"] == pytest.approx(3 * math.log(301 / 300))


def test_nfdp_table(capsys):
  assert main(["privacy", "nfdp", "--n", "2880", "--k", "3"]) == 0
  out = capsys.readouterr().out
  assert "paper (Thm 1)" in out and "warning [delta_at_least_1_over_n]" in out


def test_nfdp_paper_table(capsys):
  obj = run_json(capsys, ["privacy", "nfdp-paper", "--json"])
  ns = sorted({r["n"] for r in obj["rows"]})
  assert ns == [300, 2880, 3000, 28800]
  assert all("delta_at_least_1_over_n" in r["warnings"] for r in obj["rows"])


def fmt_closed_form(e0, n, d):
  """Feldman, McMillan, Talwar (2021) closed form as the authors' code computes it (spec §3, I7), written out."""
  a, c = 8 * math.sqrt(math.exp(e0) * math.log(4 / d) / n), 8 * math.exp(e0) / n
  return math.log(1 + (1 - math.exp(-e0)) / (1 + math.exp(-e0) / (1 + a + c)) * (a + c))


def test_shuffle_json_both_directions(capsys):
  fwd = run_json(capsys, ["privacy", "shuffle", "--n", "100000", "--delta", "1e-6", "--eps0", "4",
                          "--method", "closed-form", "--json"])
  assert fwd["method"] == "closed-form"
  assert fwd["epsilon"] == pytest.approx(fmt_closed_form(4.0, 1e5, 1e-6), rel=1e-12)  # 0.53780
  inv = run_json(capsys, ["privacy", "shuffle", "--n", "100000", "--delta", "1e-6",
                          "--target-epsilon", "0.5", "--method", "closed-form", "--json"])
  assert inv["direction"] == "central-to-local" and 3.0 < inv["eps0"] < 4.0
  # The local epsilon found meets the target under the closed form.
  assert fmt_closed_form(inv["eps0"], 1e5, 1e-6) <= 0.5


def test_shuffle_releases_both_directions(capsys):
  # Ten releases stated together: the clone pair's PLD composed (the library's figure, which its tests check).
  from jaxdistill import accounting  # pylint: disable=import-outside-toplevel
  fwd = run_json(capsys, ["privacy", "shuffle", "--n", "1e5", "--delta", "1e-6", "--eps0", "4", "--releases", "10",
                          "--json"])
  assert (fwd["method"], fwd["releases"]) == ("pld-clone", 10) and 0.57 < fwd["epsilon"] < 0.59
  assert fwd["epsilon"] == accounting.shuffle_epsilon(4.0, 10**5, 1e-6, releases=10).epsilon
  # The inverse, at a smaller n (each of its ~20 steps builds a PLD), finds the forward's eps0 back.
  small = accounting.shuffle_epsilon(2.0, 2_000, 1e-6, releases=3).epsilon
  inv = run_json(capsys, ["privacy", "shuffle", "--n", "2000", "--delta", "1e-6", "--target-epsilon", str(small),
                          "--releases", "3", "--json"])
  assert inv["eps0"] == pytest.approx(2.0, rel=1e-3) and inv["epsilon"] <= small and inv["releases"] == 3
  assert main(["privacy", "shuffle", "--n", "1e5", "--delta", "1e-6", "--eps0", "4", "--releases", "10"]) == 0
  out = capsys.readouterr().out
  assert "method=pld-clone" in out and "central epsilon (all releases)" in out and "0.5804" in out


@pytest.mark.parametrize("argv,needle", [
    (["privacy", "shuffle", "--n", "1e5", "--delta", "1e-6", "--eps0", "4", "--releases", "2", "--method",
      "closed-form"], "method='numeric' for releases=2"),
    (["privacy", "shuffle", "--n", "1e5", "--delta", "1e-6", "--eps0", "4", "--releases", "0"], "releases=0"),
    (["privacy", "nfdp", "--n", "300", "--k", "301"], "k=301"),
    (["privacy", "nfdp", "--n", "0", "--k", "1"], "n=0"),
    (["privacy", "nfdp", "--n", "x", "--k", "1"], "--n"),
    (["privacy", "nfdp", "--n", "10", "--k", "1", "--epsilon", "-1"], "epsilon"),
    (["privacy", "nfdp", "--n", "10", "--k", "1", "--epsilon", "nan"], "epsilon"),
    (["privacy", "shuffle", "--n", "100", "--delta", "2", "--eps0", "1"], "delta"),
    (["privacy", "shuffle", "--n", "100", "--delta", "1e-6", "--eps0", "0"], "eps0"),
    (["privacy", "shuffle", "--n", "100", "--delta", "1e-6"], "eps0"),
    (["privacy", "shuffle", "--n", "1000", "--delta", "1e-6", "--eps0", "9", "--method", "closed-form"], "eps0"),
    # Too large for float arithmetic (an OverflowError the CLI's backstop reported): refused by name.
    (["privacy", "nfdp", "--n", str(10**30), "--k", "3"], "<= 1000000000000000000"),
    (["privacy", "nfdp", "--n", str(10**400), "--k", "3"], "--n: expected an integer below 1e300"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, needle):
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_every_integer_flag_takes_scientific_notation(capsys):
  # `privacy` refused --n 1e5, which `simulate --clients` accepts: every integer flag now shares one parser.
  from jaxdistill.cli import _fedmd, _label, _privacy, _simulate  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli._common import count  # pylint: disable=import-outside-toplevel
  plain = run_json(capsys, ["privacy", "shuffle", "--n", "100000", "--delta", "1e-6", "--eps0", "4", "--json"])
  assert run_json(capsys, ["privacy", "shuffle", "--n", "1e5", "--delta", "1e-6", "--eps0", "4", "--json"]) == plain
  assert run_json(capsys, ["privacy", "nfdp", "--n", "3_000", "--k", "3E1", "--json"]) == run_json(
      capsys, ["privacy", "nfdp", "--n", "3000", "--k", "30", "--json"])
  for module in (_fedmd, _label, _privacy, _simulate):
    source = open(module.__file__, encoding="utf-8").read()  # pylint: disable=consider-using-with
    assert "type=int" not in source and "_entries(int," not in source, module.__name__
  assert [count(t) for t in ("7", " 7 ", "-3", "1e30", "2.0e3", "1_000")] == [7, 7, -3, 10**30, 2000, 1000]


@pytest.mark.parametrize("value,needle", [
    ("1.5", "expected an integer, got '1.5'"),
    ("nan", "expected an integer, got 'nan'"),
    ("inf", "expected an integer, got 'inf'"),
    ("0x10", "expected an integer, got '0x10'"),
    ("1e100000000", "expected an integer below 1e300, got '1e100000000'"),  # not a 100-million-digit int
])
def test_integer_flags_refuse_non_integers_in_one_line(capsys, value, needle):
  assert main(["privacy", "shuffle", "--n", value, "--delta", "1e-6", "--eps0", "4"]) == 2
  err = capsys.readouterr().err.strip()
  assert err == f"jaxdistill privacy shuffle: argument --n: {needle}"


@pytest.mark.parametrize("value,needle", [
    ("-1e-3", "delta=-0.001 in (0, 1)"), ("-1E+2", "delta=-100.0 in (0, 1)"), ("-inf", "delta"),
    ("-nan", "delta"), ("-.5", "delta=-0.5 in (0, 1)"),
])
def test_negative_numbers_in_any_form_are_values_not_options(capsys, value, needle):
  # argparse took "-1e-3" for an option: "argument --delta: expected one argument", naming no value.
  assert main(["privacy", "shuffle", "--n", "100", "--delta", value, "--eps0", "1"]) == 2
  err = capsys.readouterr().err.strip()
  assert needle in err and "expected one argument" not in err and len(err.splitlines()) == 1


def test_out_of_memory_is_one_line_exit_1_and_other_runtime_errors_keep_their_traceback(capsys, monkeypatch):
  import jax  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli import _privacy  # pylint: disable=import-outside-toplevel

  def fail(args):
    raise jax.errors.JaxRuntimeError(message)

  monkeypatch.setattr(_privacy, "run_nfdp", fail)
  message = "RESOURCE_EXHAUSTED: Out of memory allocating 360000000000 bytes.\nmore XLA detail"
  assert main(["privacy", "nfdp", "--n", "10", "--k", "1"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "out of memory (RESOURCE_EXHAUSTED" in err and "--student-widths" in err
  message = "INTERNAL: something else"
  with pytest.raises(jax.errors.JaxRuntimeError, match="something else"):
    main(["privacy", "nfdp", "--n", "10", "--k", "1"])


def test_console_entry_point_has_no_traceback():
  proc = subprocess.run([sys.executable, "-m", "jaxdistill.cli.main", "privacy", "nfdp", "--n", "5",
                         "--k", "9"], capture_output=True, text=True, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_a_reader_that_leaves_early_is_no_traceback():
  # `jaxdistill privacy nfdp-paper | head -1` ended in a BrokenPipeError traceback. Here the pipe's read end is
  # closed before the command starts, so its first write fails, every time.
  read, write = os.pipe()
  os.close(read)
  try:
    proc = subprocess.run([sys.executable, "-m", "jaxdistill", "privacy", "nfdp-paper"], stdout=write,
                          stderr=subprocess.PIPE, text=True, check=False)
  finally:
    os.close(write)
  assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr[-2000:]
  assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports a command killed by it


def test_out_of_memory_in_simulate_names_chunk_size(capsys, monkeypatch):
  # The hint named the distillation flags (--student-widths ...), which simulate does not have.
  import jax  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli import _simulate  # pylint: disable=import-outside-toplevel

  def fail(args):
    raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes.")

  monkeypatch.setattr(_simulate, "run_simulate", fail)
  argv = ["simulate", "--mechanism", "rr", "--clients", "10", "--buckets", "2", "--labels", "2", "--k", "1",
          "--epsilon", "1"]
  assert main(argv) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "--chunk-size" in err and "--student-widths" not in err


@pytest.mark.parametrize("value,needle", [
    ("16,,32", "entry 2 of '16,,32' is empty"),
    ("16,", "entry 2 of '16,' is empty"),
    (",", "entry 1 of ',' is empty"),
    ("16,x", "entry 2 of '16,x' is 'x', not an integer"),  # was "got '16,x'", naming no entry
])
def test_label_list_flag_entries_are_refused_by_argparse(capsys, value, needle):
  assert main(["label", "--student-widths", value]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("jaxdistill label: argument --student-widths: expected comma-separated integers; ")
  assert needle in err and len(err.splitlines()) == 1


def test_entries_is_one_parser_for_every_list_flag():
  import argparse  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli._common import _entries  # pylint: disable=import-outside-toplevel
  ints = _entries(int, "integers", "an integer")
  assert ints("1, 2,3") == (1, 2, 3) and ints("7") == (7,)
  for text, message in [("1,,2", "entry 2 of '1,,2' is empty"), (" ", "got ' '"), ("1,x", "'x', not an integer")]:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
      ints(text)
  assert _entries(float, "numbers", "a number", allow_empty=True)("") == ()
  words = _entries(float, "numbers", "a number", also=("equal", "size"))
  assert words("size") == "size" and words("1,2") == (1.0, 2.0)

  def spec(text):
    raise ValueError(f"bad spec {text}\nsecond line")
  with pytest.raises(argparse.ArgumentTypeError, match=r"^expected ';'-separated specs; 'q' is not a spec "
                                                       r"\(bad spec q\)$"):
    _entries(spec, "specs", "a spec", sep=";")("q")


def test_nfdp_rounds_and_resampling_reach_the_report(capsys):
  # Theorem 1 (WOR, add-remove): one sample reused for R rounds keeps delta = k/n; a fresh sample every round
  # composes R flat (0, k/n) profiles: delta = 1 - (1 - k/n)^R.
  base = ["privacy", "nfdp", "--n", "300", "--k", "3", "--rounds", "4", "--json"]
  reused = run_json(capsys, base)
  assert reused["rounds"] == 4 and reused["resample_each_round"] is False
  assert reused["exact"]["delta"] == pytest.approx(3 / 300, rel=1e-12)
  fresh = run_json(capsys, base + ["--resample-each-round"])
  assert fresh["rounds"] == 4 and fresh["resample_each_round"] is True
  assert fresh["exact"]["delta"] == pytest.approx(1 - (1 - 3 / 300)**4, rel=1e-12)


def test_shuffle_table_prints_each_quantity_in_its_column(capsys):
  assert main(["privacy", "shuffle", "--n", "100000", "--delta", "1e-6", "--eps0", "4", "--method",
               "closed-form"]) == 0
  lines = capsys.readouterr().out.splitlines()
  header = lines[1].split("  ")
  header = [h.strip() for h in header if h.strip()]
  assert header == ["n", "local eps0", "central epsilon", "delta"]
  row = lines[3].split()
  assert row[0] == "100000" and float(row[1]) == 4.0 and float(row[3]) == 1e-6
  assert float(row[2]) == pytest.approx(fmt_closed_form(4.0, 1e5, 1e-6), rel=1e-3)  # printed with 4 digits


def test_integer_flags_take_exponents_up_to_1e300():
  import argparse  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli._common import count  # pylint: disable=import-outside-toplevel
  assert count("1e300") == 10**300 and count("9.5e300") == 95 * 10**299 and count("0e999") == 0
  with pytest.raises(argparse.ArgumentTypeError, match="below 1e300"):
    count("1e301")
