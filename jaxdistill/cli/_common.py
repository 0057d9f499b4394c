"""Shared CLI plumbing: one-line errors, JSON output, plain tables."""

from __future__ import annotations

import argparse
import decimal
import json
import math
import re
import sys
from typing import Any, Callable, Sequence

from jaxdistill import _validate


class CliError(Exception):
  """An error reported as one line on stderr with exit status 2."""


#: What argparse takes as a negative number, not an option: its own pattern (-1, -.5, -1.5) misses exponents and
#: words, so ``--epsilon -1e-3`` failed with "expected one argument" instead of naming the bad value.
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
  """ArgumentParser whose errors are one line, not usage plus a message, and that reads ``-1e-3`` as a value."""

  def __init__(self, *args: Any, **kwargs: Any) -> None:
    super().__init__(*args, **kwargs)
    self._negative_number_matcher = _NEGATIVE_NUMBER  # no jaxdistill option looks like a number

  def error(self, message: str) -> None:  # type: ignore[override]
    raise CliError(f"{self.prog}: {message}")


#: Largest decimal exponent an integer flag takes: ``1e400`` is refused, not expanded into a 400-digit int (every
#: integer flag's own range is far below; ``1e100000000`` would take memory and minutes to build).
_MAX_COUNT_EXPONENT = 300


def count(text: str) -> int:
  """An argparse ``type=`` for an integer flag, which may be written ``1000000``, ``1_000_000`` or ``1e6``.

  Exact: ``1e30`` is 10**30 (not int(float('1e30'))). ``1.5``, ``nan``, ``inf`` and ``1e400`` are refused by
  argparse as one line naming the flag; each flag's own range is checked where its value is used.
  """
  try:
    value = decimal.Decimal(text.strip())
  except decimal.InvalidOperation:
    raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
  if not value.is_finite() or value != value.to_integral_value():
    raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
  if value and value.adjusted() > _MAX_COUNT_EXPONENT:
    raise argparse.ArgumentTypeError(f"expected an integer below 1e{_MAX_COUNT_EXPONENT}, got {text!r}")
  return int(value)


count.__name__ = "integer"  # argparse names the type by it in its own messages


def _entries(convert: Callable[[str], Any], kind: str, one: str, *, sep: str = ",", allow_empty: bool = False,
             also: Sequence[str] = ()) -> Callable[[str], Any]:
  """An argparse ``type=`` for a ``sep``-separated list: every entry converted by ``convert``, as a tuple.

  The one parser of every list flag, so a bad list is refused by argparse (exit 2, "argument --k: ...") naming
  the entry: an empty entry (``1,,2``, ``,``) or one ``convert`` refuses (``1,x``). The flags used to skip
  empty entries silently and name only the whole text.

  Args:
    convert: one entry's text (stripped) to its value; raises ValueError (or ArgumentTypeError) if bad.
    kind: what the entries are, plural ("integers"), and ``one``: one of them ("an integer").
    sep: the separator.
    allow_empty: blank text is the empty tuple (a flag whose '' means "none").
    also: words accepted as the whole text and returned unchanged (``--weighting``'s ``equal``).
  """
  listed = f"{'comma' if sep == ',' else repr(sep)}-separated {kind}"
  words = f"{', '.join(also)} or {listed}" if also else listed

  def parse(text: str) -> Any:
    if text in also:
      return text
    if not text.strip():
      if allow_empty:
        return ()
      raise argparse.ArgumentTypeError(f"expected {words}; got {text!r}")
    out = []
    parts = text.split(sep)
    for i, part in enumerate(parts, 1):
      entry = part.strip()
      if not entry:
        raise argparse.ArgumentTypeError(f"expected {words}; entry {i} of {text!r} is empty")
      try:
        out.append(convert(entry))
      except (ValueError, ArithmeticError, argparse.ArgumentTypeError) as err:
        why = "" if convert in (int, float, count) else f" ({_validate.first_line(err)})"
        where = f"entry {i} of {text!r} is {entry!r}," if len(parts) > 1 else f"{entry!r} is"
        raise argparse.ArgumentTypeError(f"expected {words}; {where} not {one}{why}") from None
    return tuple(out)

  parse.__name__ = kind  # argparse names the type by it in its own messages
  return parse


def _clean(x: Any) -> Any:
  if isinstance(x, float) and not math.isfinite(x):
    return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
  if isinstance(x, dict):
    return {k: _clean(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_clean(v) for v in x]
  return x


def print_json(obj: Any) -> None:
  """Prints one JSON object on stdout (infinities as the string "inf")."""
  sys.stdout.write(json.dumps(_clean(obj), sort_keys=False) + "\n")


def fmt(x: Any) -> str:
  if isinstance(x, bool):
    return "yes" if x else "no"
  if isinstance(x, float):
    if math.isinf(x):
      return "inf"
    return f"{x:.4g}"
  return str(x)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  """Prints a plain aligned text table."""
  cells = [[fmt(c) for c in r] for r in rows]
  widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
  line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
  print(line)
  print("  ".join("-" * w for w in widths))
  for r in cells:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
