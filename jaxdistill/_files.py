"""File helpers shared by the pipelines: nothing already saved is overwritten."""

from __future__ import annotations

import pathlib
import re

_NUMBERED = re.compile(r"report-(\d+)(?:\.json|-.+)$")


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
