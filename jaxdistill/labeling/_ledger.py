"""The release ledger: released votes are saved at once and never paid for twice.

A vote release spends privacy budget the moment the noisy matrix exists. If
a run is interrupted after that (while training the student, say) and is
started again, drawing fresh noise would release a *second* noisy view of
the same private data, silently doubling the cost. The ledger prevents it:

* right after iteration t's votes are computed, ``release-iter{t}.npz`` is
  written to the output directory (atomically, and never over an existing
  release: temporary file, fsync, then a hard link that fails if the name
  is taken, so of two writers without a lock only one releases). It holds
  the noisy votes ``[s, |Y|] float64``, the query indices and the public
  samples' cluster assignment it was computed for, and a JSON record of
  what was released (mechanism, parameters, privacy statement, iteration,
  seed, the run's release fingerprint, a keyed hash of the data);
* ``ledger.json`` indexes the releases and records every run that used the
  directory (which iterations it released, which it reused); it is re-read
  and merged before every write;
* a later run with the same output directory *reuses* a stored release
  instead of drawing noise again, and refuses (``ValueError``) to release
  anything when the stored releases were made with other settings or other
  data, which would also spend budget again, or (``check``; the pipeline
  compares the recorded privacy calibration and budget split) differ from
  what the run would release.

Reuse is post-processing of a release already paid for, so it costs nothing.

The data check compares HMAC-SHA256(key, sha256 of the data), the key being
32 random bytes in ``.ledger-key`` beside the releases. A plain hash of
D_priv in a release file would be a deterministic, non-private function of
the private data (anyone holding the file and a candidate data set could
test which one was used); keyed, the file alone reveals nothing. The output
directory as a whole (key, baselines in ``report.json``) is the curator's
working state: publish the votes, not the directory.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import json
import os
import pathlib
import secrets
import zipfile
from typing import Any, Callable

import numpy as np

from jaxdistill import _validate
from jaxdistill._files import atomic_write as _atomic_write, written_temp as _written_temp

__all__ = ["StoredRelease", "ReleaseLedger", "data_fingerprint"]

_VERSION = 1


def data_fingerprint(*arrays: np.ndarray) -> str:
  """sha256 over the arrays' shapes, dtypes and bytes (which data a release is about).

  Raises:
    ValueError: an array that is not numeric (bool, integer, float or complex): the bytes of an object array
      are pointers, so equal data would hash differently from run to run.
  """
  h = hashlib.sha256()
  for i, a in enumerate(arrays):
    a = np.ascontiguousarray(a)
    if a.dtype.kind not in "biufc":
      raise ValueError(f"Expected arrays[{i}] to be a numeric array; got dtype {a.dtype}.")
    h.update(str((a.shape, a.dtype.str)).encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _publish(path: pathlib.Path, write) -> bool:
  """Writes ``path`` whole (temporary file, fsync) without ever replacing an existing one; False if one exists.

  ``os.link(tmp, path)`` fails when ``path`` exists, so of two writers racing for one name exactly one wins,
  even without a lock (flock can fail on NFS). Where hard links are not supported, an exclusive create
  (``O_EXCL``) claims the name first and the written file then replaces that empty claim.
  """
  tmp = _written_temp(path, write)
  try:
    try:
      os.link(tmp, path)
    except FileExistsError:
      return False
    except OSError:  # no hard links here (some network or FAT file systems)
      try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
      except FileExistsError:
        return False
      os.replace(tmp, path)  # over our own empty claim only
    return True
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


@dataclasses.dataclass(frozen=True)
class StoredRelease:
  """One released iteration, as stored.

  Attributes:
    iteration: t (1-based).
    votes: float64 ``[s, |Y|]`` noisy votes.
    queries: int64 ``[s]`` indices into D_pub of the queries.
    assignment: int64 ``[|D_pub|]`` cluster (query) of every public sample.
    record: JSON record of the release (mechanism, parameters, privacy, ...).
    path: file it was read from or written to.
  """

  iteration: int
  votes: np.ndarray
  queries: np.ndarray
  assignment: np.ndarray
  record: dict
  path: str


class ReleaseLedger:
  """Releases of one output directory (see the module docstring).

  Args:
    out_dir: the run's output directory (created if missing).
    fingerprint: the settings releases depend on
      (:meth:`LabelingConfig.release_fingerprint`).
    data_hash: :func:`data_fingerprint` of the private and public data.
    check: optional ``check(record) -> str | None`` run on every stored
      release's record: a description of how the release differs from what
      this run would release (its privacy calibration, say), or None when
      it fits.

  Raises:
    ValueError: if the directory holds releases made with other settings or
      other data, or that ``check`` describes as different (reusing them
      would be wrong, releasing again would spend budget again).
  """

  def __init__(self, out_dir: Any, fingerprint: dict, data_hash: str,
               check: Callable[[dict], str | None] | None = None):
    out_dir = _validate.as_path("out_dir", out_dir)
    if not isinstance(fingerprint, dict):
      raise ValueError(f"Expected fingerprint to be a dict of settings; got {type(fingerprint).__name__}.")
    if not isinstance(data_hash, str) or not data_hash:
      raise ValueError(f"Expected data_hash to be a non-empty str (data_fingerprint's digest); got {data_hash!r}.")
    try:
      self.fingerprint = json.loads(json.dumps(fingerprint))
    except (TypeError, ValueError) as err:
      raise ValueError(f"Expected fingerprint to hold JSON values only (it is stored in every release); {err}.") \
          from None
    if check is not None and not callable(check):
      raise ValueError(f"Expected check to be callable or None; got {type(check).__name__}.")
    self.check = check
    self.dir = pathlib.Path(out_dir)
    if self.dir.exists() and not self.dir.is_dir():
      raise ValueError(f"Expected out_dir={str(self.dir)!r} to be a directory; it is a file.")
    self.dir.mkdir(parents=True, exist_ok=True)
    self.index_path = self.dir / "ledger.json"
    self.index = self._read_index()
    self._unsaved_key: bytes | None = None  # a new directory's key, saved with its first release
    self._plain_hash = str(data_hash)
    self.data_hash = hmac.new(self._key(), self._plain_hash.encode(), hashlib.sha256).hexdigest()
    # The id tells this run's entry apart when ledger.json is re-read and merged before every write.
    self.run = {"id": secrets.token_hex(8), "started": _now(), "released": [], "reused": []}
    self.index["runs"].append(self.run)
    for path in sorted(self.dir.glob("release-iter*.npz")):
      self._check_compatible(self._load(path).record, path)

  # -- files -----------------------------------------------------------------------
  def _key(self) -> bytes:
    """The directory's data-hash key: read, or drawn for a directory without releases.

    A drawn key is written by :meth:`record` just before the first release, so a run refused before it
    releases anything (a bad setting found after the ledger opened) leaves no file behind.
    """
    path = self.dir / ".ledger-key"
    if not path.exists():
      if any(self.dir.glob("release-iter*.npz")) or self.index["releases"]:
        raise ValueError(f"Output directory {str(self.dir)!r} holds releases but not their key {path.name}, so "
                         "the data they were made from cannot be checked. Restore it or use another --out-dir.")
      self._unsaved_key = secrets.token_bytes(32)
      return self._unsaved_key
    try:
      key = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as err:
      raise ValueError(f"{path} cannot be read as a hex key ({err}); restore it or use another --out-dir.") from None
    if len(key) < 16:
      raise ValueError(f"{path} holds a key of {len(key)} bytes; expected 32. Restore it or use another --out-dir.")
    return key

  def _read_index(self) -> dict:
    if self.index_path.exists():
      try:
        index = json.loads(self.index_path.read_text())
      except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{self.index_path} is not valid JSON ({err}); move it away to continue.") from None
      if not isinstance(index, dict) or index.get("version") != _VERSION:
        version = index.get("version") if isinstance(index, dict) else None
        raise ValueError(f"{self.index_path} has ledger version {version!r}; expected {_VERSION}.")
      if not (isinstance(index.get("releases"), list) and isinstance(index.get("runs"), list)
              and all(isinstance(e, dict) for e in index["releases"] + index["runs"])):
        raise ValueError(f"{self.index_path} lacks the 'releases' and 'runs' lists (of JSON objects) of a ledger; "
                         "move it away to continue.")
      bad = [e.get("iteration") for e in index["releases"] if not _is_iteration(e.get("iteration"))]
      if bad:
        raise ValueError(f"{self.index_path} lists a release of iteration {bad[0]!r}; expected an int >= 1. It is "
                         "damaged: inspect or move it away to continue.")
      return index
    return {"version": _VERSION, "releases": [], "runs": []}

  def _write_index(self) -> None:
    """Writes ledger.json, merged with what is on disk now: another ledger on this directory may have written it.

    Releases indexed there and runs of others are kept; this run's entry (by id) and releases are added. (Two
    writers interleaving read and write can still drop an index entry; :meth:`lookup` then re-indexes the
    release from its file, which is the record.)
    """
    disk = self._read_index()
    indexed = {e.get("iteration") for e in disk["releases"]}
    releases = disk["releases"] + [e for e in self.index["releases"] if e.get("iteration") not in indexed]
    runs = [self.run if r.get("id") == self.run["id"] else r for r in disk["runs"]]
    if self.run not in runs:
      runs.append(self.run)
    self.index = {**disk, "releases": releases, "runs": runs}
    text = json.dumps(self.index, indent=2, sort_keys=False).encode()
    _atomic_write(self.index_path, lambda f: f.write(text))

  def path(self, iteration: int) -> pathlib.Path:
    return self.dir / f"release-iter{iteration}.npz"

  @staticmethod
  def _load(path: pathlib.Path) -> StoredRelease:
    try:
      with np.load(path, allow_pickle=False) as z:
        record = json.loads(str(z["record"]))
        votes, queries, assignment = z["votes"], z["queries"], z["assignment"]
        if not isinstance(record, dict):
          raise ValueError("its record is not a JSON object")
        if votes.ndim != 2 or queries.ndim != 1 or assignment.ndim != 1:
          raise ValueError(f"votes {votes.shape}, queries {queries.shape}, assignment {assignment.shape}; expected "
                           "[s, |Y|], [s] and [|D_pub|]")
        if queries.dtype.kind not in "iu" or assignment.dtype.kind not in "iu":
          raise ValueError(f"queries {queries.dtype} and assignment {assignment.dtype}; expected integers")
        return StoredRelease(int(record["iteration"]), np.asarray(votes, np.float64),
                             np.asarray(queries, np.int64), np.asarray(assignment, np.int64),
                             record, str(path))
    except (OSError, EOFError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as err:
      raise ValueError(f"Stored release {path} cannot be read ({type(err).__name__}: {err}); it may hold a release "
                       "already paid for, so it is not overwritten: inspect or move it.") from None

  def _check_compatible(self, record: dict, path: pathlib.Path) -> None:
    if not isinstance(record.get("fingerprint"), dict):
      raise ValueError(f"Stored release {path} has no settings record (its 'fingerprint' is "
                       f"{type(record.get('fingerprint')).__name__}, not a JSON object); it may hold a release "
                       "already paid for, so it is not overwritten: inspect or move it.")
    if record["fingerprint"] != self.fingerprint:
      old, new = record["fingerprint"], self.fingerprint
      diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
      shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:4])
      raise ValueError(f"Output directory {str(self.dir)!r} holds a release ({path.name}) made with other "
                       f"settings ({shown}); releasing again would spend budget again. Use another --out-dir.")
    if record.get("data_hash") != self.data_hash:
      raise ValueError(f"Output directory {str(self.dir)!r} holds a release ({path.name}) about other data "
                       "(data hash differs). Use another --out-dir.")
    difference = self.check(record) if self.check is not None else None
    if difference:
      raise ValueError(f"Output directory {str(self.dir)!r} holds a release ({path.name}) that differs from what "
                       f"this run would release ({difference}); its votes were drawn as recorded, so this run's "
                       "statement would not describe them. Use another --out-dir.")

  # -- API -------------------------------------------------------------------------
  def peek(self, iteration: int) -> StoredRelease | None:
    """The stored release of ``iteration`` (read and checked as by :meth:`lookup`) or None, not recorded as reused."""
    iteration = _iteration(iteration)
    path = self.path(iteration)
    if not path.exists():
      if any(e.get("iteration") == iteration for e in self.index["releases"]):
        raise ValueError(f"The ledger {self.index_path} records a release of iteration {iteration} but "
                         f"{path.name} is missing; releasing it again would spend budget again. Restore the "
                         "file or use another --out-dir.")
      files = list(self.dir.glob("release-iter*.npz"))
      later = [p.name for p in files if _file_iteration(p) > iteration]
      if later:
        raise ValueError(f"Output directory {str(self.dir)!r} holds {sorted(later)[0]} but not {path.name}: "
                         f"iteration {iteration} was released before and its file is missing; releasing it "
                         "again would spend budget again. Restore the file or use another --out-dir.")
      # The history of runs and the key also outlive the releases: `rm out/*` keeps .ledger-key, and an edited
      # ledger.json may keep its runs. Either way a second, independent noisy view of the same votes was drawn.
      if any(isinstance(r, dict) and r.get("id") != self.run["id"] and isinstance(r.get("released"), list)
             and iteration in r["released"] for r in self.index["runs"]):
        raise ValueError(f"The ledger {self.index_path} records that an earlier run released iteration "
                         f"{iteration}, but {path.name} is missing; releasing it again would spend budget again. "
                         "Restore the file or use another --out-dir.")
      if self._unsaved_key is None and not self.index["releases"] and not files:
        raise ValueError(f"Output directory {str(self.dir)!r} holds .ledger-key, which is written only with a "
                         "first release, but no release file or ledger entry: its releases were deleted, and "
                         "releasing again would spend budget again. Restore them or use another --out-dir (if "
                         "no release was ever made, e.g. a crash right after the key was written, delete "
                         ".ledger-key).")
      return None
    stored = self._load(path)
    if stored.iteration != iteration:
      raise ValueError(f"{path.name} holds the release of iteration {stored.iteration}, not {iteration} (renamed?); "
                       "inspect or move it.")
    self._check_compatible(stored.record, path)
    return stored

  def lookup(self, iteration: int) -> StoredRelease | None:
    """The stored release of ``iteration``, recorded as reused, or None (then the caller may release).

    A caller that checks the release further before using it calls :meth:`peek`, then :meth:`mark_reused`.
    """
    stored = self.peek(iteration)
    if stored is not None:
      self.mark_reused(stored)
    return stored

  def mark_reused(self, stored: StoredRelease) -> None:
    """Records in ledger.json that this run reuses ``stored`` (a release :meth:`peek` returned)."""
    if not isinstance(stored, StoredRelease):
      raise ValueError(f"Expected stored to be a StoredRelease (from peek); got {type(stored).__name__}.")
    iteration, path = stored.iteration, pathlib.Path(stored.path)
    if not any(e.get("iteration") == iteration for e in self.index["releases"]):
      # Written but not indexed (interrupted between the two writes): index it now.
      self.index["releases"].append({**_summary(stored.record, path), "indexed": "recovered"})
    if iteration not in self.run["reused"]:
      self.run["reused"].append(iteration)
    self._write_index()

  def record(self, iteration: int, votes: np.ndarray, queries: np.ndarray, assignment: np.ndarray,
             record: dict) -> StoredRelease:
    """Saves a fresh release at once (never overwrites one).

    Raises:
      ValueError: a bad iteration (an int >= 1), votes that are not a finite
        ``[s, |Y|]`` array, queries or assignment that are not 1-D integer
        arrays, a record that is not a JSON-serialisable dict, or a release
        of this iteration already on disk.
    """
    iteration = _iteration(iteration)
    votes = np.asarray(votes)
    if votes.dtype.kind not in "iuf" or votes.ndim != 2 or not np.isfinite(votes).all():
      raise ValueError(f"Expected votes to be a finite real [s, |Y|] array; got {votes.dtype} of shape "
                       f"{votes.shape}{' with NaN or inf' if votes.dtype.kind == 'f' and votes.ndim == 2 else ''}.")
    for name, value in (("queries", queries), ("assignment", assignment)):
      value = np.asarray(value)
      if value.ndim != 1 or value.dtype.kind not in "iu":
        raise ValueError(f"Expected {name} to be a 1-D integer array; got {value.dtype} of shape {value.shape}.")
    if not isinstance(record, dict):
      raise ValueError(f"Expected record to be a dict; got {type(record).__name__}.")
    path = self.path(iteration)
    exists = f"Release {path} already exists; refusing to overwrite a release already paid for."
    if path.exists():
      raise ValueError(exists)
    full = {**record, "iteration": iteration, "fingerprint": self.fingerprint, "data_hash": self.data_hash,
            "released_at": _now()}
    try:
      text = json.dumps(full)
    except (TypeError, ValueError) as err:
      raise ValueError(f"Expected record to hold JSON values only; {err}.") from None
    arrays = {"votes": np.asarray(votes, np.float64), "queries": np.asarray(queries, np.int64),
              "assignment": np.asarray(assignment, np.int64), "record": np.asarray(text)}
    if self._unsaved_key is not None:  # the key first: a release must never be on disk without it
      key = self._unsaved_key.hex().encode()
      self._unsaved_key = None
      if not _publish(self.dir / ".ledger-key", lambda f: f.write(key)):
        # Another ledger on this directory saved its key first: adopt it (never replace it: its releases'
        # data hashes are keyed with it).
        self.data_hash = hmac.new(self._key(), self._plain_hash.encode(), hashlib.sha256).hexdigest()
        full["data_hash"] = self.data_hash
        arrays["record"] = np.asarray(json.dumps(full))
    # Never os.replace: a release another ledger published since the check above must not be overwritten.
    if not _publish(path, lambda f: np.savez(f, **arrays)):
      raise ValueError(exists)
    self.index["releases"].append(_summary(full, path))
    self.run["released"].append(iteration)
    self._write_index()
    return StoredRelease(iteration, arrays["votes"], arrays["queries"], arrays["assignment"], full, str(path))

  def finish(self, **info: Any) -> None:
    """Marks the current run finished (with optional summary numbers)."""
    self.run["finished"] = _now()
    self.run.update(info)
    self._write_index()

  def releases(self) -> list[dict]:
    """Index entries of every release in the directory."""
    return list(self.index["releases"])


def _is_iteration(value: Any) -> bool:
  return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer)) and value >= 1


def _iteration(value: Any) -> int:
  """An iteration t as an int >= 1 (``"3"`` or ``True`` would name a file the index then cannot match)."""
  if not _is_iteration(value):
    raise ValueError(f"Expected iteration to be an int >= 1; got {value!r}.")
  return int(value)


def _file_iteration(path: pathlib.Path) -> int:
  """t of ``release-iter{t}.npz`` (-1 for another name)."""
  digits = path.stem[len("release-iter"):]
  return int(digits) if digits.isdigit() else -1


def _summary(record: dict, path: pathlib.Path) -> dict:
  return {"iteration": record["iteration"], "file": path.name, "mechanism": record.get("mechanism"),
          "privacy": record.get("privacy"), "seed": record.get("seed"),
          "released_at": record.get("released_at")}
