"""Boundary validation helpers name the parameter and the value."""

import errno
import math
from fractions import Fraction
import os
import pathlib

import numpy as np
import pytest

from jaxdistill import _validate as v
from jaxdistill import fedmd, labeling, models, representations
from jaxdistill import _files
from jaxdistill._files import claimed_dir
from tests._memory import aligned_copy


@pytest.mark.parametrize("value", [3.5, float("nan"), True, "3", None, math.inf])
def test_integer_rejects(value):
  with pytest.raises(ValueError, match="count"):
    v.integer("count", value)


def test_integer_accepts_whole_numbers():
  assert v.integer("k", 3.0) == 3 and v.integer("k", np.int64(4)) == 4
  assert v.integer("k", np.array(5)) == 5
  with pytest.raises(ValueError, match=r"k=0 >= 1"):
    v.integer("k", 0, minimum=1)


@pytest.mark.parametrize("value", [10**5000, -(10**5000)], ids=["1e5000", "-1e5000"])
def test_integer_out_of_range_by_an_unprintable_int_says_so_in_one_line(value):
  # 10^5000 raised Python's own "Exceeds the limit (4300 digits) for integer string conversion" while the message
  # was formatted.
  with pytest.raises(ValueError, match=r"^Expected count=an integer of 16610 bits (<= 10|>= 1)\.$"):
    v.integer("count", value, minimum=1, maximum=10)
  with pytest.raises(ValueError, match=r"^Expected count=1" + "0" * 400 + r" <= 10\.$"):
    v.integer("count", 10**400, maximum=10)  # printable: the digits are shown as before


def test_integer_takes_0d_jax_arrays_like_0d_numpy_arrays():
  # jnp.int32(2) was refused while np.array(2) was accepted.
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  assert v.integer("k", jnp.int32(2)) == 2 and v.integer("k", jnp.array(7, jnp.uint8)) == 7
  assert v.integer("k", jnp.array(3.0)) == v.integer("k", np.array(3.0)) == 3
  with pytest.raises(ValueError, match=r"k=0 >= 1"):
    v.integer("k", jnp.int32(0), minimum=1)
  for bad in (jnp.array(True), jnp.array(2.5), jnp.array([1, 2])):  # booleans stay refused, as np.array(True)
    with pytest.raises(ValueError, match="Expected k to be an integer") as err:
      v.integer("k", bad)
    assert "\n" not in str(err.value)
  with pytest.raises(ValueError, match="Expected k to be a concrete integer"):
    jax.jit(lambda k: v.integer("k", k))(3)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), math.inf, "a", "1", False])
def test_positive_rejects(value):
  with pytest.raises(ValueError, match="epsilon"):
    v.positive("epsilon", value)


@pytest.mark.parametrize("value", [10**400, -(10**400), Fraction(10**400, 3), 10**5000],
                         ids=["1e400", "-1e400", "fraction", "1e5000"])
def test_numbers_beyond_float64_are_named_not_overflow_errors(value):
  # float(10**400) raises OverflowError, which finite() did not catch (nor _is_plus_inf under allow_inf).
  checks = [v.finite, v.positive, v.nonnegative, v.probability, v.open_unit,
            lambda name, x: v.positive(name, x, allow_inf=True), v.real_array]
  if isinstance(value, Fraction):  # a whole Fraction goes through float() in integer(); an int never does
    checks.append(v.integer)
  for check in checks:
    with pytest.raises(ValueError, match=r"^Expected epsilon") as err:
      check("epsilon", value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200  # one short line, however long the number


def test_positive_allows_inf_on_request():
  assert v.positive("epsilon", math.inf, allow_inf=True) == math.inf
  assert v.nonnegative("epsilon", np.float64("inf"), allow_inf=True) == math.inf
  for text in ("inf", b"inf"):  # text passed for a number is a caller's bug, as elsewhere
    with pytest.raises(ValueError, match="epsilon"):
      v.positive("epsilon", text, allow_inf=True)
    with pytest.raises(ValueError, match="epsilon"):
      v.nonnegative("epsilon", text, allow_inf=True)
  with pytest.raises(ValueError, match="epsilon"):
    v.positive("epsilon", True, allow_inf=True)


def test_minus_zero_is_returned_as_zero():
  # nfdp_privacy(300, 3).statement(epsilon=-0.0) recorded epsilon=-0.0 in its report.
  from jaxdistill import accounting  # pylint: disable=import-outside-toplevel
  for check in (v.nonnegative, v.probability):
    out = check("x", -0.0)
    assert out == 0.0 and math.copysign(1.0, out) == 1.0
  assert math.copysign(1.0, accounting.nfdp_privacy(300, 3).statement(epsilon=-0.0).epsilon) == 1.0


@pytest.mark.parametrize("value", [0.0, 1.0, 1.5, -0.1, float("nan")])
def test_open_unit_rejects(value):
  with pytest.raises(ValueError, match="delta"):
    v.open_unit("delta", value)


def test_choice():
  assert v.choice("method", "numeric", ("numeric", "closed-form")) == "numeric"
  with pytest.raises(ValueError, match="method"):
    v.choice("method", "exact", ("numeric", "closed-form"))


@pytest.mark.parametrize("value", [1, 0, "yes", "False", None, 1.0])
def test_boolean_rejects_truthy_non_bools(value):
  with pytest.raises(ValueError, match="with_replacement"):
    v.boolean("with_replacement", value)


def test_boolean_accepts_python_and_numpy_bools():
  assert v.boolean("flag", True) is True and v.boolean("flag", np.bool_(False)) is False


def test_output_dir_creates_nested_folders(tmp_path):
  path = v.output_dir("out_dir", tmp_path / "a" / "b")
  assert path.is_dir() and path == tmp_path / "a" / "b"
  assert list(path.iterdir()) == []  # the write probe leaves nothing behind
  assert v.output_dir("out_dir", str(path)) == path  # an existing folder is fine


def test_output_dir_rejects_files_and_paths_under_files(tmp_path):
  afile = tmp_path / "report.json"
  afile.write_text("{}")
  with pytest.raises(ValueError, match=r"out_dir=.*report\.json' to be a folder; it is a file"):
    v.output_dir("out_dir", afile)
  with pytest.raises(ValueError, match=r"out_dir=.*report\.json/sub' to be a writable folder"):
    v.output_dir("out_dir", afile / "sub")
  assert afile.read_text() == "{}"  # nothing overwritten


@pytest.mark.parametrize("value", [None, "", 3])
def test_output_dir_rejects_non_paths(value):
  with pytest.raises(ValueError, match="out_dir"):
    v.output_dir("out_dir", value)


@pytest.mark.parametrize("value", ["1", b"1", ["0.5", 0.5], True, [True, False], 1j, [1, None], {"a": 1}])
def test_real_array_rejects_text_bools_and_complex(value):
  with pytest.raises(ValueError, match="weights"):
    v.real_array("weights", value)


def test_real_array_accepts_numbers_and_keeps_their_values():
  import fractions  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  np.testing.assert_array_equal(v.real_array("x", [1, 2**80]), np.array([1.0, 2.0**80]))
  assert v.real_array("x", fractions.Fraction(1, 4)) == 0.25
  out = v.real_array("x", jnp.array([0.5, 2.0], jnp.bfloat16))
  assert out.dtype == np.float64 and out.tolist() == [0.5, 2.0]
  assert np.isnan(v.real_array("x", math.nan))  # no range check: callers state their own


def test_output_dir_with_a_report_refuses_what_would_block_it_later(tmp_path):
  (tmp_path / "a").mkdir()
  (tmp_path / "a" / "history").write_text("not a folder")
  with pytest.raises(ValueError, match="no file named 'history'"):
    v.output_dir("out_dir", tmp_path / "a", report="report.json")
  v.output_dir("out_dir", tmp_path / "a")  # without a report the folder itself is fine
  (tmp_path / "b" / "report.json").mkdir(parents=True)
  with pytest.raises(ValueError, match="no folder named 'report.json'"):
    v.output_dir("out_dir", tmp_path / "b", report="report.json")
  (tmp_path / "c" / "history").mkdir(parents=True)
  assert v.output_dir("out_dir", tmp_path / "c", report="report.json") == tmp_path / "c"


def test_output_dir_with_a_report_refuses_a_history_folder_it_cannot_write(tmp_path, monkeypatch):
  # Another user's history/ let the run finish, then the move of the old report failed and the new report was
  # never written. (As root a chmod cannot stop the write, so the probe is made to fail the way it would.)
  (tmp_path / "history").mkdir()
  real = v.tempfile.TemporaryFile

  def probe(*args, dir=None, **kwargs):  # pylint: disable=redefined-builtin
    if pathlib.Path(dir).name == "history":
      raise PermissionError(13, "Permission denied")
    return real(*args, dir=dir, **kwargs)

  monkeypatch.setattr(v.tempfile, "TemporaryFile", probe)
  # Nothing to move yet (no earlier report or plot): history/ is not used, so it need not be writable.
  assert v.output_dir("out_dir", tmp_path, report="report.json") == tmp_path
  for earlier in ("report.json", "accuracy.png"):
    (tmp_path / earlier).write_text("{}")
    with pytest.raises(ValueError, match=r"out_dir=.* to hold a writable 'history' folder .*Permission denied"):
      v.output_dir("out_dir", tmp_path, report="report.json")
    (tmp_path / earlier).unlink()
  (tmp_path / "report.json").write_text("{}")
  assert v.output_dir("out_dir", tmp_path) == tmp_path  # without a report history/ is not used


@pytest.mark.parametrize("err, line, described", [
    (ValueError("bad k\nmore detail"), "bad k", "ValueError: bad k"),
    (RuntimeError("\n  \n  download failed  \nretry"), "download failed", "RuntimeError: download failed"),
    (TypeError(), "", "TypeError"),            # "".splitlines()[0] would raise IndexError
    (KeyError(""), "''", "KeyError: ''"),
])
def test_error_summaries_are_one_line_and_never_fail(err, line, described):
  assert v.first_line(err) == line
  assert v.describe_error(err) == described
  assert v.describe_error(ValueError("x" * 200), limit=120) == "ValueError: " + "x" * 120


def test_cli_prints_the_first_non_blank_line_of_an_error(capsys, monkeypatch):
  import argparse  # pylint: disable=import-outside-toplevel
  from jaxdistill.cli import main as cli_main  # pylint: disable=import-outside-toplevel

  def fail(args):
    raise ValueError("\nthe real message\nand a second line")

  parser = cli_main.build_parser()
  monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
  monkeypatch.setattr(parser, "parse_args", lambda argv: argparse.Namespace(func=fail))
  assert cli_main.main(["label"]) == 2
  assert capsys.readouterr().err == "jaxdistill: error: the real message\n"


def test_claimed_dir_tidies_up_only_new_empty_folders_after_a_failure(tmp_path):
  with claimed_dir("out_dir", tmp_path / "ok" / "a") as out:
    assert out == tmp_path / "ok" / "a" and out.is_dir()
  assert (tmp_path / "ok" / "a").is_dir()  # success: nothing removed
  (tmp_path / "old").mkdir()
  with pytest.raises(KeyboardInterrupt):  # interrupted runs too
    with claimed_dir("out_dir", tmp_path / "old" / "x" / "y", inner=("ckpt/a", "ckpt/b")) as out:
      (out / "ckpt" / "a").mkdir(parents=True)
      (out / "ckpt" / "b").mkdir()
      (out / "ckpt" / "b" / "state.npz").write_text("{}")
      raise KeyboardInterrupt
  assert (tmp_path / "old" / "x" / "y" / "ckpt" / "b" / "state.npz").exists()  # new but not empty: kept
  assert not (tmp_path / "old" / "x" / "y" / "ckpt" / "a").exists()  # new and empty: removed
  with pytest.raises(RuntimeError):
    with claimed_dir("out_dir", tmp_path / "old" / "p" / "q"):
      raise RuntimeError
  assert not (tmp_path / "old" / "p").exists() and (tmp_path / "old").is_dir()  # children first; old kept
  # "new/../keep" names the existing (empty) folder "keep", not a new one (Path.absolute keeps the "..").
  (tmp_path / "keep").mkdir()
  with pytest.raises(RuntimeError):
    with claimed_dir("out_dir", tmp_path / "new" / ".." / "keep"):
      raise RuntimeError
  assert (tmp_path / "keep").is_dir()


def test_claimed_dir_admits_one_run_and_frees_on_exit_or_error(tmp_path):
  with claimed_dir("out_dir", tmp_path):
    with pytest.raises(ValueError, match=r"out_dir=.* to be used by one run at a time"):
      with claimed_dir("out_dir", tmp_path):  # a second descriptor, as another process would hold
        pass
  with pytest.raises(KeyError):
    with claimed_dir("out_dir", tmp_path):
      raise KeyError("boom")
  with claimed_dir("out_dir", tmp_path):  # freed after both
    pass
  assert not list(tmp_path.iterdir())  # no lock file left behind


def test_claimed_dir_never_removes_a_folder_another_run_claimed(tmp_path, monkeypatch):
  # Run B sees no folder, but run A creates and claims it before B locks it: B is refused and must leave
  # A's (still empty) folder alone.
  real = _files._validate.output_dir
  other = []

  def a_wins_the_race(name, value, **kw):
    path = real(name, value, **kw)
    other.append(_files._locked(path, name))  # pylint: disable=protected-access
    other[0].__enter__()
    return path

  monkeypatch.setattr(_files._validate, "output_dir", a_wins_the_race)
  with pytest.raises(ValueError, match="one run at a time"):
    with claimed_dir("out_dir", tmp_path / "out"):
      pass
  assert (tmp_path / "out").is_dir()
  other[0].__exit__(None, None, None)


def test_claimed_dir_refuses_a_folder_replaced_while_it_started(tmp_path, monkeypatch):
  # A failed run removed the folder between B's open and B's lock, and another run made a new one there:
  # B's lock would hold a deleted folder, so B is refused (os.open then fails, or the inode differs).
  real_open = os.open

  def replaced(path, flags, *args):
    fd = real_open(path, flags, *args)
    if str(path).endswith("out"):
      os.rmdir(path)
      os.mkdir(path)
    return fd

  monkeypatch.setattr(_files.os, "open", replaced)
  with pytest.raises(ValueError, match="removed or replaced while this run started"):
    with claimed_dir("out_dir", tmp_path / "out"):
      pass


def test_claimed_dir_runs_unlocked_with_a_warning_where_flock_fails(tmp_path, monkeypatch):
  import fcntl  # pylint: disable=import-outside-toplevel

  def nfs_like(fd, op):
    raise OSError(errno.EBADF, "Bad file descriptor")

  monkeypatch.setattr(fcntl, "flock", nfs_like)
  with pytest.warns(RuntimeWarning, match="cannot be locked"):
    with claimed_dir("out_dir", tmp_path / "nfs") as out:
      assert out.is_dir()


def test_real_array_refusing_a_dtype_says_so_in_one_line():
  # The message embedded the array's repr, several lines for a boolean matrix.
  with pytest.raises(ValueError, match=r"Expected x to hold real numbers; got dtype bool \(array") as err:
    v.real_array("x", np.ones((6, 4), bool))
  assert "\n" not in str(err.value)


def test_scalar_checks_refusing_an_array_say_so_in_one_line():
  # integer, finite, boolean, choice and path checks embedded the array's multi-line repr.
  arr = np.ones((6, 4))
  for call in (lambda: v.integer("k", arr), lambda: v.finite("eps", arr), lambda: v.boolean("flag", arr),
               lambda: v.choice("mode", arr, ("a", "b")), lambda: v.prng_key("key", [[1, 2], [3, 4]])):
    with pytest.raises(ValueError) as err:
      call()
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


@pytest.mark.parametrize("src, dtype", [("float32", "float32"), ("float64", "float32"), ("int32", "int32"),
                                        ("int64", "int32"), ("uint8", "float32"), ("int32", "float32")])
@pytest.mark.parametrize("layout", ["C", "strided", "F"])
def test_owned_device_array_has_jnp_asarrays_values_and_never_the_callers_memory(src, dtype, layout):
  # jnp.asarray(arr, dtype) hands XLA:CPU a 64-byte-aligned host array of that dtype in place; owned_device_array
  # must not, whatever the caller's alignment, dtype or layout.
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(3)
  host = aligned_copy((rng.normal(scale=50.0, size=(33, 7)) if src.startswith("float")
                        else rng.integers(0, 200, size=(33, 7))).astype(src))
  arr = {"C": host, "strided": host[::2], "F": np.asfortranarray(host)}[layout]
  expected = np.array(jnp.asarray(arr, dtype), copy=True)
  out = v.owned_device_array(arr, dtype)
  assert out.dtype == np.dtype(dtype) and out.shape == arr.shape
  np.testing.assert_array_equal(np.asarray(out), expected)
  lo, hi = arr.ctypes.data, arr.ctypes.data + arr.nbytes
  assert not lo <= out.unsafe_buffer_pointer() < hi
  arr[...] = 1
  np.testing.assert_array_equal(np.asarray(out), expected)


def test_owned_device_array_only_casts_jax_arrays_and_tracers():
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  x = jnp.array([[1.5, -2.0]], jnp.float32)
  np.testing.assert_array_equal(np.asarray(v.owned_device_array(x, np.float32)), [[1.5, -2.0]])
  assert v.owned_device_array(x, np.int32).dtype == jnp.int32
  traced = jax.jit(lambda a: v.owned_device_array(a, np.int32))(jnp.array([3, -1], jnp.int16))
  assert traced.dtype == jnp.int32 and np.asarray(traced).tolist() == [3, -1]


@pytest.mark.parametrize("value", [1.5, 1.0000001, -0.1, float("nan"), math.inf, True, "0.5"])
def test_probability_rejects_values_outside_the_closed_unit_interval(value):
  with pytest.raises(ValueError, match="purity"):
    v.probability("purity", value)


def test_probability_and_nonnegative_accept_their_closed_ends():
  assert v.probability("p", 0) == 0.0 and v.probability("p", 1) == 1.0 and v.probability("p", 0.25) == 0.25
  assert v.nonnegative("noise", 0) == 0.0 and v.nonnegative("noise", 2.5) == 2.5
  for bad in (-1e-12, -3.0, float("nan"), math.inf):
    with pytest.raises(ValueError, match="noise"):
      v.nonnegative("noise", bad)


def test_integer_bounds_are_inclusive():
  assert v.integer("k", 10, minimum=10, maximum=10) == 10
  assert v.integer("seed", v.MAX_SEED, minimum=0, maximum=v.MAX_SEED) == 2**32 - 1
  with pytest.raises(ValueError, match=r"k=11 <= 10"):
    v.integer("k", 11, maximum=10)
  with pytest.raises(ValueError, match=r"k=9 >= 10"):
    v.integer("k", 9, minimum=10)


@pytest.mark.parametrize("build, match", [
    # Accepted before, they failed only after a release (1e308 diverged in the first epoch) or trained silently to
    # chance level (100); learning_rate * weight_decay >= 1 collapsed the encoder to one feature vector; a dropout
    # above 1 - 2^-33 dropped every activation (its 32-bit keep threshold rounded to 0).
    (lambda: labeling.StudentConfig(learning_rate=1e308), r"learning_rate=1e\+308 <= 10"),
    (lambda: labeling.StudentConfig(learning_rate=100), r"learning_rate=100\.0 <= 10"),
    (lambda: fedmd.FedMDConfig(learning_rate=11.0), r"learning_rate=11\.0 <= 10"),
    (lambda: representations.ContrastiveConfig(learning_rate=1.0, weight_decay=1.0),
     r"learning_rate \* weight_decay < 1; got 1\.0 \* 1\.0 = 1"),
    (lambda: representations.ScanConfig(learning_rate=0.5, weight_decay=4.0),
     r"learning_rate \* weight_decay < 1; got 0\.5 \* 4\.0 = 2"),
    (lambda: labeling.StudentConfig(dropout=1 - 1e-12), r"dropout=0\.999999999999 < 1 with"),
    (lambda: models.CNNSpec((4, 8), 1 - 1e-12), r"keep probability 1 - dropout of at least"),
])
def test_training_settings_that_cannot_train_are_refused_up_front(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def test_training_settings_at_the_edges_are_accepted():
  assert labeling.StudentConfig(learning_rate=10.0, dropout=1 - 2**-30).learning_rate == 10.0
  assert models.CNNSpec((4, 8), 0.999).dropout == 0.999
  assert representations.ContrastiveConfig(learning_rate=0.5, weight_decay=1.9).weight_decay == 1.9
