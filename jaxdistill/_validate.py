"""Argument checks for the public boundary.

Every public function validates its Python-level arguments here before any
JAX or dp-accounting code runs, so bad input fails with a one-line
``ValueError`` that names the parameter and the offending value
(``Expected epsilon=-1.0 > 0.``), never with a deep traceback or a silent NaN.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import pathlib
import sys
import tempfile
from typing import Any, Iterable, Mapping

import numpy as np

__all__ = [
    "integer",
    "positive",
    "nonnegative",
    "finite",
    "real_array",
    "owned_device_array",
    "probability",
    "open_unit",
    "choice",
    "boolean",
    "output_dir",
    "prng_key",
    "first_line",
    "describe_error",
]


def _is_bool(value: Any) -> bool:
  return isinstance(value, (bool, np.bool_))


def _is_jax_array(value: Any) -> bool:
  """True for a ``jax.Array`` (without importing jax: a program that never imported it holds none)."""
  jax = sys.modules.get("jax")
  return jax is not None and isinstance(value, jax.Array)


#: Largest seed: with 64-bit types off (JAX's default) ``jax.random.key(seed)``
#: keeps only the low 32 bits, so seed 2**32 would silently repeat seed 0.
MAX_SEED = 2**32 - 1

#: Top-level files of an output folder that move to ``history/`` with an earlier report
#: (``jaxdistill._files.keep_earlier_report``'s default).
EARLIER_PLOTS = "*.png"


def shown(value: Any) -> str:
  """``repr(value)`` cut to one short line (an int of 10**5000 has no repr at all: too many digits)."""
  if isinstance(value, int) and not _is_bool(value) and value.bit_length() > 200:
    return f"an integer of {value.bit_length()} bits"
  try:
    text = repr(value)
  except ValueError:  # a huge int inside another object
    return f"a {type(value).__name__}"
  text = " ".join(text.split())
  return text if len(text) <= 80 else text[:77] + "..."


def integer(name: str, value: Any, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
  """Returns ``value`` as a Python int, or raises naming ``name``.

  Floats are accepted only when they are whole numbers (``3.0``); ``3.5``,
  NaN, booleans and strings are rejected. 0-d NumPy and JAX arrays count as
  their single value (``jnp.int32(2)`` like ``np.array(2)``; a boolean one
  is still rejected).
  """
  if _is_bool(value):
    raise ValueError(f"Expected {name} to be an integer, got {shown(value)}.")
  if isinstance(value, numbers.Integral):
    out = int(value)
  elif isinstance(value, numbers.Real) and math.isfinite(_to_float(name, value)) and float(value).is_integer():
    out = int(value)
  elif isinstance(value, np.ndarray) and value.ndim == 0:
    return integer(name, value.item(), minimum=minimum, maximum=maximum)
  elif _is_jax_array(value) and value.ndim == 0:
    try:
      host = np.asarray(value)
    except Exception:  # pylint: disable=broad-except
      raise ValueError(f"Expected {name} to be a concrete integer, got {shown(value)} (traced?).") from None
    return integer(name, host, minimum=minimum, maximum=maximum)
  else:
    raise ValueError(f"Expected {name} to be an integer, got {shown(value)}.")
  if minimum is not None and out < minimum:
    raise ValueError(f"Expected {name}={_digits(out)} >= {minimum}.")
  if maximum is not None and out > maximum:
    raise ValueError(f"Expected {name}={_digits(out)} <= {maximum}.")
  return out


def _digits(value: int) -> str:
  """``str(value)``, or its size where Python refuses to print it (10^5000: past the 4300-digit limit, a ValueError)."""
  try:
    return str(value)
  except ValueError:
    return f"an integer of {value.bit_length()} bits"


def finite(name: str, value: Any) -> float:
  """Returns ``value`` as a finite float, or raises naming ``name``.

  Strings are rejected even when they parse (``"1"``): a caller passing text
  where a number belongs has a bug worth surfacing.
  """
  if _is_bool(value) or isinstance(value, (str, bytes)):
    raise ValueError(f"Expected {name} to be a real number, got {shown(value)}.")
  out = _to_float(name, value)
  if not math.isfinite(out):
    raise ValueError(f"Expected {name} to be finite, got {out!r}.")
  return out


def _to_float(name: str, value: Any) -> float:
  """``float(value)``, or a one-line ValueError naming ``name``: not a number, or beyond float64 (|x| >= 2^1024)."""
  try:
    return float(value)
  except OverflowError:  # an int or Fraction of 10**400: too large for any float, so not a usable epsilon
    raise ValueError(f"Expected {name} to be a real number within float64's range (|x| < 1.8e308), got "
                     f"{shown(value)}.") from None
  except (TypeError, ValueError):
    raise ValueError(f"Expected {name} to be a real number, got {shown(value)}.") from None


#: Alignment (bytes) at which XLA:CPU uses a host buffer in place instead of copying it.
_HOST_ALIGNMENT = 64


def owned_device_array(arr: Any, dtype: Any) -> Any:
  """``arr`` as a JAX array of ``dtype`` that never shares the caller's host memory.

  A JAX array (or tracer) is only cast. A host (NumPy) ``arr`` is cast
  (NumPy's cast, the values of ``jnp.asarray(arr, dtype)``) and copied once
  into a 64-byte-aligned buffer owned by this call, which ``jax.device_put``
  then hands to XLA:CPU in place (on an accelerator: one host-to-device
  transfer). Two reasons:

  * ``jnp.asarray(arr, dtype)`` (an explicit dtype; jax 0.10.2) and
    ``jax.device_put`` use a 64-byte-aligned host array of that dtype in place
    on CPU, and JAX dispatches asynchronously, so a caller changing its array
    just after a call could change a result still being computed
    (``reverse_knn`` on a 60,000 x 784 float32 array that the caller then
    overwrote: 54,707 of its rows changed);
  * it is faster: ``jnp.asarray`` of a 60,000 x 784 float32 array took
    0.10-0.14 s on 2 CPU cores, this 0.02-0.03 s.
  """
  import jax  # pylint: disable=import-outside-toplevel
  if isinstance(arr, jax.Array):
    return arr.astype(dtype)
  dtype = np.dtype(dtype)
  nbytes = arr.size * dtype.itemsize
  raw = np.empty(nbytes + _HOST_ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % _HOST_ALIGNMENT
  buf = raw[start:start + nbytes].view(dtype).reshape(arr.shape)
  np.copyto(buf, arr, casting="unsafe")
  return jax.device_put(buf)


def real_array(name: str, value: Any) -> np.ndarray:
  """Returns ``value`` as a float64 NumPy array of real numbers, or raises naming ``name``.

  Like :func:`finite` it refuses text, even text that parses (``"1"``,
  ``["0.5", 0.5]``), and booleans; complex numbers are refused rather than
  silently losing their imaginary part. Values are not range-checked here
  (NaN and inf pass): the caller states its own range.
  """
  if _is_bool(value) or isinstance(value, (str, bytes)):
    raise ValueError(f"Expected {name} to be a number or an array of numbers; got {shown(value)}.")
  try:
    arr = np.asarray(value)
  except (TypeError, ValueError):
    raise ValueError(f"Expected {name} to be a number or an array of numbers; got {shown(value)}.") from None
  if arr.dtype.kind == "O":
    flat = arr.reshape(-1)
    if not all(isinstance(v, numbers.Real) and not _is_bool(v) for v in flat):
      raise ValueError(f"Expected {name} to hold only real numbers; got {shown(value)}.")
  elif arr.dtype.kind in "USbcmM" or (arr.dtype.kind == "V" and not is_float_like(arr.dtype)):
    raise ValueError(f"Expected {name} to hold real numbers; got dtype {arr.dtype} ({shown(value)}).")
  try:
    return arr.astype(np.float64)
  except (TypeError, ValueError, OverflowError):
    raise ValueError(f"Expected {name} to hold real numbers; got {shown(value)}.") from None


def is_collection(value: Any) -> bool:
  """Whether ``value`` is an iterable of entries: not text (read character by character) nor a mapping (its keys)."""
  return isinstance(value, Iterable) and not isinstance(value, (str, bytes, bytearray, Mapping))


def is_float_like(dtype: np.dtype) -> bool:
  """True for the extension float types JAX uses (bfloat16, float8 ...), which NumPy reports as kind 'V'."""
  try:
    import ml_dtypes  # pylint: disable=import-outside-toplevel
  except ImportError:  # pragma: no cover - a dependency of jax
    return False
  try:
    ml_dtypes.finfo(dtype)
  except (TypeError, ValueError):
    return False
  return True


def _is_plus_inf(value: Any) -> bool:
  """True for a numeric +inf (not the string ``"inf"``, not a bool)."""
  if _is_bool(value) or isinstance(value, (str, bytes)):
    return False
  try:
    return float(value) == math.inf
  except (TypeError, ValueError, OverflowError):  # 10**400 is finite: finite() then names it
    return False


def positive(name: str, value: Any, *, allow_inf: bool = False) -> float:
  """Returns ``value`` as a float > 0 (optionally +inf), or raises."""
  if allow_inf and _is_plus_inf(value):
    return math.inf
  out = finite(name, value)
  if not out > 0:
    raise ValueError(f"Expected {name}={out!r} > 0.")
  return out


#: Largest relative tolerance a calibration or bisection takes: its answer is within a factor 1 + tol of the exact
#: one, on the safe side (tol = 1e308 gave a shuffle epsilon 3.5x the least one, without a word).
MAX_RELATIVE_TOL = 0.1


def relative_tolerance(name: str, value: Any, *, minimum: float = 0.0) -> float:
  """Returns ``value`` as a float in [``minimum``, ``MAX_RELATIVE_TOL``] (and > 0), or raises."""
  out = positive(name, value)
  if out < minimum:
    raise ValueError(f"Expected {name}={out!r} >= {minimum:g}: float64 cannot resolve a finer relative step.")
  if out > MAX_RELATIVE_TOL:
    raise ValueError(f"Expected {name}={out!r} <= {MAX_RELATIVE_TOL:g}: a relative tolerance (the answer is within a "
                     f"factor 1 + {name} of the exact one).")
  return out


#: Largest learning rate the trainers take (Adam / AdamW steps): 100 trained the student to chance level and
#: 1e308 diverged only after a vote release had been spent.
MAX_LEARNING_RATE = 10.0


def learning_rate(value: Any, *, weight_decay: float | None = None) -> float:
  """Returns ``value`` as a learning rate in (0, ``MAX_LEARNING_RATE``], or raises naming ``learning_rate``.

  With AdamW's ``weight_decay``, also ``learning_rate * weight_decay < 1``: from 1 on each step scales the
  weights by 1 - lr * wd <= 0, and the encoder collapsed to one feature vector without a word.
  """
  out = positive("learning_rate", value)
  if out > MAX_LEARNING_RATE:
    raise ValueError(f"Expected learning_rate={out!r} <= {MAX_LEARNING_RATE:g}: Adam steps this large diverge or "
                     "leave a model at chance level.")
  if weight_decay is not None and out * weight_decay >= 1.0:
    raise ValueError(f"Expected learning_rate * weight_decay < 1; got {out!r} * {weight_decay!r} = "
                     f"{out * weight_decay:.3g}: each AdamW step would scale the weights by 1 - lr * wd <= 0.")
  return out


def nonnegative(name: str, value: Any, *, allow_inf: bool = False) -> float:
  """Returns ``value`` as a float >= 0 (optionally +inf), or raises."""
  if allow_inf and _is_plus_inf(value):
    return math.inf
  out = finite(name, value)
  if not out >= 0:
    raise ValueError(f"Expected {name}={out!r} >= 0.")
  return out + 0.0  # -0.0 becomes 0.0 (reports recorded epsilon=-0.0)


def probability(name: str, value: Any) -> float:
  """Returns ``value`` as a float in the closed interval [0, 1]."""
  out = finite(name, value) + 0.0  # -0.0 becomes 0.0
  if not 0.0 <= out <= 1.0:
    raise ValueError(f"Expected {name}={out!r} in [0, 1].")
  return out


def open_unit(name: str, value: Any) -> float:
  """Returns ``value`` as a float in the open interval (0, 1) (a delta)."""
  out = finite(name, value)
  if not 0.0 < out < 1.0:
    raise ValueError(f"Expected {name}={out!r} in (0, 1).")
  return out


def boolean(name: str, value: Any) -> bool:
  """Returns ``value`` as a Python bool, or raises naming ``name``.

  Only ``True``/``False`` (or NumPy bools) pass: a truthy ``1`` or ``"no"``
  is rejected, since flags such as ``with_replacement`` change the privacy
  analysis and must be explicit.
  """
  if not _is_bool(value):
    raise ValueError(f"Expected {name} to be a bool, got {shown(value)}.")
  return bool(value)


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
  """Returns ``value`` if it is one of ``options``, else raises."""
  if not isinstance(value, str) or value not in options:
    raise ValueError(f"Expected {name} to be one of {', '.join(options)}; got {shown(value)}.")
  return value


def as_path(name: str, value: Any, kind: str = "folder") -> pathlib.Path:
  """``value`` (a non-empty ``str`` or ``os.PathLike``) as a path, or raises naming ``name``.

  ``True``, ``0`` or ``None`` would otherwise become paths named "True", "0" or "None".
  """
  if not isinstance(value, (str, os.PathLike)) or not str(value):
    raise ValueError(f"Expected {name} to be a {kind} path; got {shown(value)}.")
  return pathlib.Path(value)


def output_dir(name: str, value: Any, *, report: str | None = None, files: tuple[str, ...] = ()) -> pathlib.Path:
  """Creates folder ``value`` (and its parents) if needed and checks that files can be written in it.

  Called before any work starts, so a bad output folder fails at once
  instead of after the run, when its results would be lost.

  Args:
    name: the parameter's name for the error message.
    value: the folder.
    report: the report file the run will write there. An earlier one moves
      to ``history/`` (``jaxdistill._files.keep_earlier_report``), so a
      file named ``history``, or a folder named like the report, is refused
      now rather than after the run.
    files: other files the run will write there (plots): a folder of one
      of these names is refused now too.
  """
  path = as_path(name, value)
  if path.exists() and not path.is_dir():
    raise ValueError(f"Expected {name}={str(path)!r} to be a folder; it is a file.")
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as err:
    reason = err.strerror or str(err)
    raise ValueError(f"Expected {name}={str(path)!r} to be a writable folder; cannot create or write it "
                     f"({reason}).") from None
  if report is not None:
    history = path / "history"
    if history.exists() and not history.is_dir():
      raise ValueError(f"Expected {name}={str(path)!r} to hold no file named 'history': earlier reports are kept "
                       f"in a folder of that name.")
    # Another user's history/ would fail the move after the run, losing its report. Only what is there now
    # moves (an earlier report and its plots), so an unwritable history/ in a folder without them is never used.
    earlier = (path / report).exists() or any(p.is_file() for p in path.glob(EARLIER_PLOTS))
    if history.is_dir() and earlier:
      try:
        with tempfile.TemporaryFile(dir=history):
          pass
      except OSError as err:
        raise ValueError(f"Expected {name}={str(path)!r} to hold a writable 'history' folder (earlier reports "
                         f"move there); cannot write it ({err.strerror or err}).") from None
  for file, what in ([(report, "the report")] if report is not None else []) + [(f, "a plot") for f in files]:
    if (path / file).is_dir():
      raise ValueError(f"Expected {name}={str(path)!r} to hold no folder named {file!r}: {what} is written there.")
  return path


def prng_key(name: str, value: Any, *, batched: bool = False, threefry: bool = False) -> Any:
  """Returns ``value`` as a typed PRNG key, or raises.

  Accepts a key from ``jax.random.key(seed)`` and, for code written against
  the legacy API, the raw ``uint32`` data of ``jax.random.PRNGKey(seed)``
  (wrapped with :func:`jax.random.wrap_key_data`, so both give the same
  numbers). An integer seed is refused: the caller owns the key.

  Args:
    name: the parameter's name for the error message.
    value: the key (a tracer is fine: only its dtype and shape are read).
    batched: expect a 1-D batch of keys instead of a single key.
    threefry: refuse a key of another implementation (``rbg``, ``unsafe_rbg``): callers that
      promise the same numbers whatever the chunking, batching or device count need threefry,
      whose draws under ``vmap`` and sharding equal the unbatched ones; rbg's do not.
  """
  import jax  # pylint: disable=import-outside-toplevel

  dtype = getattr(value, "dtype", None)
  shape = getattr(value, "shape", None)
  what = f"an array of dtype {dtype} and shape {tuple(shape)}" if dtype is not None and shape is not None else (
      f"{type(value).__name__} {shown(value)}")
  hint = f"Expected {name} to be a PRNG key from jax.random.key(seed)"
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    key = value
  elif dtype is not None and np.dtype(dtype) == np.uint32 and shape is not None and len(shape) >= 1:
    try:
      key = jax.random.wrap_key_data(value)  # legacy PRNGKey data
    except (TypeError, ValueError):
      raise ValueError(f"{hint}; got {what}, which is not legacy key data either.") from None
  else:
    raise ValueError(f"{hint}; got {what}.")
  if batched and key.ndim != 1:
    raise ValueError(f"Expected {name} to be a 1-D batch of PRNG keys; got key shape {tuple(key.shape)}.")
  if not batched and key.ndim != 0:
    raise ValueError(f"Expected {name} to be a single PRNG key; got a batch of shape {tuple(key.shape)}.")
  if threefry:
    impl = _impl_name(jax.random.key_impl(key))
    if impl != _threefry_name():
      raise ValueError(f"Expected {name} to be a threefry2x32 key (jax.random.key(seed, impl='threefry2x32')); "
                       f"got a {impl} key, whose draws change with the chunking, batching or device count, "
                       f"and the same numbers for the same key need threefry.")
  return key


@functools.lru_cache(maxsize=1)
def _threefry_name() -> str:
  import jax  # pylint: disable=import-outside-toplevel
  return _impl_name(jax.random.key_impl(jax.random.key(0, impl="threefry2x32")))


def _impl_name(impl: Any) -> str:
  """A PRNG implementation's name: ``jax.random.key_impl`` gives a str or, in some JAX versions, a spec."""
  return str(getattr(impl, "name", None) or impl)


def first_line(err: BaseException) -> str:
  """The first non-blank line of an error's message ("" if it has none), for one-line errors."""
  for line in str(err).splitlines():
    if line.strip():
      return line.strip()
  return ""


def describe_error(err: BaseException, *, limit: int | None = None) -> str:
  """``"TypeName: first line"`` (the line cut to ``limit`` characters), or ``"TypeName"`` if it has none."""
  line = first_line(err)[:limit]
  return f"{type(err).__name__}: {line}" if line else type(err).__name__
