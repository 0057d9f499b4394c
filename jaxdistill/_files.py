"""File helpers shared by the pipelines: nothing already saved is overwritten."""

from __future__ import annotations

import pathlib


def keep_earlier_report(out: pathlib.Path, name: str = "report.json") -> pathlib.Path | None:
  """Moves ``out/name`` (if any) to ``out/history/report-<N>.json``; returns where it went.

  N is one past the largest number already in ``history`` (not the count of
  files), so a report deleted from there never makes a later one overwrite
  another.
  """
  path = out / name
  if not path.exists():
    return None
  history = out / "history"
  history.mkdir(exist_ok=True)
  numbers = [int(p.stem[len("report-"):]) for p in history.glob("report-*.json") if p.stem[len("report-"):].isdigit()]
  target = history / f"report-{max(numbers, default=0) + 1}.json"
  path.replace(target)
  return target
