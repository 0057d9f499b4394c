"""File helpers shared by the pipelines: nothing already saved is overwritten."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import tempfile
import warnings
from typing import Any, Callable, Iterator

from jaxdistill import _validate

_NUMBERED = re.compile(r"report-(\d+)(?:\.json|-.+)$")


@contextlib.contextmanager
def claimed_dir(name: str, value: Any, *, report: str | None = None, files: tuple[str, ...] = (),
                inner: tuple[str, ...] = ()) -> Iterator[pathlib.Path]:
  """Creates and checks output folder ``value``, holds it for one run, and tidies up after a failed one.

  1. ``_validate.output_dir`` creates the folder (and parents) and checks that the run's files can be
     written there, before any work starts.
  2. An exclusive advisory lock on the folder itself (POSIX ``flock`` on its descriptor) is held for the
     block: a second run, in this process or another, gets a one-line ``ValueError`` at once, since two
     runs writing one folder could release the same iteration twice or overwrite each other's checkpoints.
     The lock goes with the descriptor (a killed run leaves none behind) and needs no lock file. If the
     file system cannot lock (some NFS mounts, Windows), the run goes on with a ``RuntimeWarning``.
  3. If the block raises (an interrupt too), the folders that did not exist before this call (the folder,
     its parents, and the sub-folders ``inner``) are removed while the lock is still held, when they are
     empty, so a run that fails before writing anything leaves no empty folder behind.

  Args:
    name: the parameter's name for messages.
    value: the folder.
    report, files: as :func:`jaxdistill._validate.output_dir`.
    inner: sub-folders (relative) the block may create, removed with the folder when new and empty.

  Yields:
    The folder, as a path.
  """
  new = []
  if isinstance(value, (str, os.PathLike)) and str(value):
    for p in (value, *(os.path.join(value, i) for i in inner)):
      p = pathlib.Path(os.path.abspath(p))  # abspath collapses "..": "a/../old" is "old", not new
      new += [d for d in (p, *p.parents) if not d.exists() and d not in new]
  path = _validate.output_dir(name, value, report=report, files=files)
  with _locked(path, name):
    try:
      yield path
    except BaseException:
      for d in sorted(new, key=lambda d: len(d.parts), reverse=True):  # children first
        try:
          d.rmdir()  # only when empty
        except OSError:
          pass
      raise


@contextlib.contextmanager
def _locked(path: pathlib.Path, name: str) -> Iterator[None]:
  try:
    import fcntl  # pylint: disable=import-outside-toplevel
  except ImportError:  # pragma: no cover - not POSIX
    warnings.warn(f"{name}={str(path)!r} cannot be locked on this platform: concurrent runs into it are not "
                  "prevented.", RuntimeWarning, stacklevel=3)
    yield
    return
  gone = ValueError(f"Expected {name}={str(path)!r} to stay in place; it was removed or replaced while this run "
                    "started (by another run). Run again.")
  try:
    fd = os.open(path, os.O_RDONLY)
  except FileNotFoundError:
    raise gone from None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise ValueError(f"Expected {name}={str(path)!r} to be used by one run at a time; another run holds it now "
                       "(two runs writing one folder could release the same iteration twice or overwrite each "
                       "other's state). Wait for it to finish or use another folder.") from None
    except OSError as err:  # e.g. NFS's emulated flock on a read-only descriptor
      warnings.warn(f"{name}={str(path)!r} cannot be locked ({err.strerror or err}): concurrent runs into it are "
                    "not prevented.", RuntimeWarning, stacklevel=3)
    else:
      try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
      except OSError:
        same = False
      if not same:  # locked a folder that a failed run removed meanwhile: the path now names another one
        raise gone
    yield
  finally:
    os.close(fd)  # releases the lock


def written_temp(path: pathlib.Path, write: Callable[[Any], Any]) -> str:
  """A temporary file beside ``path`` that ``write(f)`` filled and fsync'd (removed again if writing fails)."""
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
  except BaseException:
    os.unlink(tmp)
    raise
  return tmp


def atomic_write(path: pathlib.Path, data: bytes | Callable[[Any], Any]) -> None:
  """Writes ``path`` whole or not at all: ``data`` (bytes, or ``write(f)`` filling a binary file).

  It goes to a temporary file beside ``path`` (fsync'd) that then replaces ``path`` (``os.replace``), so an
  interrupt or a full disk leaves the earlier file or none, never part of one (a truncated report after the
  earlier one moved to ``history/``).
  """
  write = data if callable(data) else (lambda f: f.write(data))
  tmp = written_temp(pathlib.Path(path), write)
  try:
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def keep_earlier_report(out: pathlib.Path, name: str = "report.json", *, plots: str | None = _validate.EARLIER_PLOTS
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
