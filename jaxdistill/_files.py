"""File helpers shared by the pipelines: nothing already saved is overwritten."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
from typing import Any, Iterator

_NUMBERED = re.compile(r"report-(\d+)(?:\.json|-.+)$")


@contextlib.contextmanager
def locked_dir(directory: pathlib.Path, what: str) -> Iterator[None]:
  """Holds an exclusive advisory lock on the folder itself (POSIX ``flock`` on its descriptor) for the block.

  A second holder, in this process or another, gets a one-line ``ValueError`` at once instead of waiting.
  The lock goes with the descriptor, so a killed run never leaves a stale one, and no lock file is
  created. Without ``fcntl`` (Windows) the block runs unlocked.

  Args:
    directory: an existing folder.
    what: the folder's role for the message (``"out_dir"``).
  """
  try:
    import fcntl  # pylint: disable=import-outside-toplevel
  except ImportError:  # pragma: no cover - not POSIX
    fcntl = None
  fd = os.open(directory, os.O_RDONLY) if fcntl is not None else None
  try:
    if fd is not None:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        raise ValueError(f"Expected {what}={str(directory)!r} to be used by one run at a time; another run holds "
                         "it now. Two runs releasing into one folder could spend the budget twice: wait for "
                         "the other to finish or use another folder.") from None
    yield
  finally:
    if fd is not None:
      os.close(fd)  # releases the lock


@contextlib.contextmanager
def removing_new_empty_dirs(*paths: Any) -> Iterator[None]:
  """On an exception, removes the folders among ``paths`` (and their parents) that did not exist before and are
  still empty, so a run that fails (bad data, interrupted) leaves no empty output folder behind.

  A folder holding anything (a ledger, a checkpoint, a report) stays. Paths that are not ``str`` or
  ``os.PathLike`` are ignored (the caller validates them).
  """
  new: list[pathlib.Path] = []
  for p in paths:
    if isinstance(p, (str, os.PathLike)) and str(p):
      p = pathlib.Path(p).absolute()
      new += [d for d in (p, *p.parents) if not d.exists() and d not in new]
  try:
    yield
  except BaseException:
    for d in sorted(new, key=lambda d: len(d.parts), reverse=True):  # children first
      try:
        d.rmdir()  # only when empty
      except OSError:
        pass
    raise


def keep_earlier_report(out: pathlib.Path, name: str = "report.json", *, plots: str | None = "*.png"
                        ) -> pathlib.Path | None:
  """Moves an earlier run's outputs to ``out/history/``; returns where its report went.

  ``out/name`` becomes ``history/report-<N>.json`` and every top-level file
  of ``out`` matching ``plots`` (the earlier run's plots) becomes
  ``history/report-<N>-<file name>``, so a new run never overwrites them.
  N is one past the largest number already in ``history`` (not the count of
  files), so a report deleted from there never makes a later one overwrite
  another. ``plots=None`` moves the report only.
  """
  path = out / name
  earlier = sorted(p for p in out.glob(plots) if p.is_file()) if plots else []
  if not path.exists() and not earlier:
    return None
  history = out / "history"
  history.mkdir(exist_ok=True)
  numbers = [int(m.group(1)) for p in history.iterdir() if (m := _NUMBERED.match(p.name))]
  number = max(numbers, default=0) + 1
  for plot in earlier:
    plot.replace(history / f"report-{number}-{plot.name}")
  if not path.exists():
    return None
  target = history / f"report-{number}.json"
  path.replace(target)
  return target
