"""Peak-memory measurement: this process, or one command in its own subprocess.

Peak resident set size is the high-water mark of the memory a process
actually touched: arrays, JAX/XLA buffers, the interpreter and its imported
libraries. It can only grow during a process's life, so comparing several
contenders fairly needs one fresh process per contender.

Linux pitfall, handled here: a child's ``ru_maxrss`` (from ``wait4`` or from
its own ``getrusage``) starts from its parent's high-water mark, because the
forked copy counts the parent's resident pages until ``exec``. A command
started straight from a big process (a pytest run, a benchmark driver holding
arrays) would report the parent's peak. So :func:`peak_rss_bytes` reads the
current address space's own high-water mark (``VmHWM`` in
``/proc/self/status``), and :func:`measure_subprocess` starts the command
through a small trampoline interpreter, so the command's ``ru_maxrss`` is
floored only by the trampoline's few MB.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence

from jaxdistill import _validate

__all__ = ["peak_rss_bytes", "MeasuredRun", "measure_subprocess"]

# ru_maxrss is in KiB on Linux and in bytes on macOS.
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024


def peak_rss_bytes() -> int:
  """Peak resident set size of this process's address space so far, in bytes.

  ``VmHWM`` from ``/proc/self/status`` where it exists (Linux: not inflated by
  the parent's memory before ``exec``), else ``ru_maxrss``.
  """
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * _RSS_UNIT


# Runs argv[2:], waits for it with wait4 and writes its own ru_maxrss (KiB or
# bytes, as the platform reports it) to the file argv[1]; exits with its status.
_TRAMPOLINE = (
    "import os, sys\n"
    "pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status) % 256)\n")


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
  """One command run in its own process.

  Attributes:
    returncode: exit status (a command killed by signal k reports 256 - k).
    stdout: its standard output (text).
    stderr: its standard error (text).
    wall_seconds: wall time from start to exit (interpreter start-up and
      imports included).
    peak_rss_bytes: that process's own peak resident set size (floored by
      the trampoline's few MB; -1 if the command could not be started).
  """

  returncode: int
  stdout: str
  stderr: str
  wall_seconds: float
  peak_rss_bytes: int


def measure_subprocess(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                       timeout: float | None = None) -> MeasuredRun:
  """Runs ``argv`` in a fresh process and returns its exit status, output, wall time and peak RSS.

  Args:
    argv: the command, e.g. ``[sys.executable, "script.py", "--flag"]``: a
      non-empty sequence of ``str`` (or ``os.PathLike``) arguments.
    env: environment, a mapping of ``str`` to ``str`` (default: this process's).
    timeout: seconds before the child is killed, a finite number > 0
      (``None``: no limit).

  Raises:
    ValueError: an empty ``argv`` or program name ``argv[0]``, a ``str``/``bytes`` (one command line would be split into
      characters: pass a list of arguments), an argument that is not a ``str`` or holds a NUL
      character, an ``env`` that is not a mapping of ``str`` to ``str``, or a ``timeout``
      that is not a finite number > 0 (0 or -1 killed the child at once, ``"5"`` was a
      TypeError, NaN and inf meant no limit).
    subprocess.TimeoutExpired: the child ran past ``timeout`` (it is killed
      and reaped first).
  """
  if isinstance(argv, (str, bytes, bytearray)):
    raise ValueError(f"Expected argv to be a list of arguments, e.g. [sys.executable, 'script.py']; got a "
                     f"{type(argv).__name__} {str(argv)[:60]!r}.")
  if not isinstance(argv, Sequence) or not argv:  # 5 was a TypeError; an iterator or a dict ran its keys
    raise ValueError(f"Expected a non-empty argv: a list of arguments, e.g. [sys.executable, 'script.py']; got "
                     f"{type(argv).__name__} {_validate.shown(argv)}.")
  for i, arg in enumerate(argv):  # [5] or [None] were TypeErrors from the trampoline's Popen
    if not isinstance(arg, (str, os.PathLike)) or not isinstance(os.fspath(arg), str) or "\0" in os.fspath(arg):
      raise ValueError(f"Expected argv[{i}] to be a str without NUL characters; got {type(arg).__name__} "
                       f"{_validate.shown(arg)}.")
  if not os.fspath(argv[0]):  # posix_spawnp refused it inside the child: returncode 1 and a traceback in stderr
    raise ValueError("Expected argv[0] to name a program; got the empty string ''.")
  if env is not None and (not isinstance(env, Mapping) or not all(
      isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
    raise ValueError(f"Expected env to be a mapping of str to str (or None); got {type(env).__name__} "
                     f"{_validate.shown(env)}.")
  if timeout is not None:
    timeout = _validate.positive("timeout", timeout)
  with tempfile.TemporaryDirectory() as tmp:
    peak_file = os.path.join(tmp, "peak")
    out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
    cmd = [sys.executable, "-S", "-c", _TRAMPOLINE, peak_file, *argv]
    with open(out_path, "w") as out, open(err_path, "w") as err:
      start = time.perf_counter()
      proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=None if env is None else dict(env),
                              start_new_session=True)
      try:
        code = proc.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the trampoline and the command
        proc.wait()
        raise
      wall = time.perf_counter() - start
    with open(out_path) as f:
      stdout = f.read()
    with open(err_path) as f:
      stderr = f.read()
    try:
      with open(peak_file) as f:
        peak = int(f.read()) * _RSS_UNIT
    except (OSError, ValueError):
      peak = -1  # the trampoline itself failed (e.g. the command does not exist)
  return MeasuredRun(code, stdout, stderr, wall, peak)
