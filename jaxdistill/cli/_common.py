"""Shared CLI plumbing: one-line errors, JSON output, plain tables."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Sequence


class CliError(Exception):
  """An error reported as one line on stderr with exit status 2."""


class Parser(argparse.ArgumentParser):
  """ArgumentParser whose errors are one line, not usage plus a message."""

  def error(self, message: str) -> None:  # type: ignore[override]
    raise CliError(f"{self.prog}: {message}")


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
