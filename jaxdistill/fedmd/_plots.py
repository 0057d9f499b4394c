"""PNG plots of FedMD runs (matplotlib, Agg backend)."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterable

import numpy as np

from jaxdistill import _validate
from jaxdistill.fedmd._config import FedMDConfig

__all__ = ["plot_accuracy_per_round", "plot_accuracy_vs_k"]


def _plt():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _output_path(path: Any) -> pathlib.Path:
  """``path`` as the file the plot is written to, checked before drawing (a ValueError naming ``path``).

  matplotlib appends ``.png`` to a path without a suffix (so the file written was not the path returned)
  and writes ``folder.png`` for a folder; a missing parent was a ``FileNotFoundError`` after drawing.
  """
  out = _validate.as_path("path", path, "file")
  if out.is_dir():
    raise ValueError(f"Expected path={str(out)!r} to be a file path; it is a folder.")
  parent = out.parent
  if not parent.is_dir():
    raise ValueError(f"Expected path={str(out)!r} in an existing folder; {str(parent)!r} is not one.")
  from matplotlib.backend_bases import FigureCanvasBase  # pylint: disable=import-outside-toplevel
  formats = FigureCanvasBase.get_supported_filetypes()
  if out.suffix[1:].lower() not in formats:
    known = ", ".join("." + f for f in sorted(formats))
    raise ValueError(f"Expected path={str(out)!r} to end in an image suffix matplotlib writes ({known}).")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ValueError(f"Expected path={str(out)!r} in a writable folder; cannot write {str(parent)!r}.")
  return out


def _accuracy(name: str, result: Any) -> np.ndarray:
  """``result.accuracy`` as a non-empty ``[E, N]`` float64 array, after checking ``result`` is a FedMD result.

  Anything else failed deep inside matplotlib (an AttributeError or an empty figure) after the folder checks.
  """
  if not isinstance(getattr(result, "config", None), FedMDConfig) or not hasattr(result, "accuracy"):
    raise ValueError(f"Expected {name} to be a FedMDResult (from run_fedmd); got {type(result).__name__}.")
  try:
    acc = np.asarray(result.accuracy, dtype=np.float64)
  except (TypeError, ValueError):
    acc = np.zeros(0)
  if acc.ndim != 2 or acc.size == 0:
    raise ValueError(f"Expected {name}.accuracy to be a non-empty [rounds, parties] array; got shape {acc.shape}.")
  return acc


def plot_accuracy_per_round(result: Any, path: Any, *, title: str | None = None) -> pathlib.Path:
  """Test accuracy of every party after each evaluated round (thin lines) and their mean (bold).

  Args:
    result: a :class:`~jaxdistill.fedmd.FedMDResult`.
    path: the image file, in an existing folder, with a suffix matplotlib
      writes (``.png``, ``.pdf``, ``.svg``, ...).
    title: the plot's title (None: method, N, k and sampling).

  Returns:
    ``path`` as a :class:`pathlib.Path`: the file written.

  Raises:
    ValueError: ``result`` is not a FedMD result; ``path`` is a folder,
      lies in a missing or unwritable folder, or has no image suffix.
  """
  acc = _accuracy("result", result)
  plt = _plt()
  out = _output_path(path)
  rounds = list(result.eval_rounds)
  fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
  for i in range(acc.shape[1]):
    ax.plot(rounds, acc[:, i], lw=0.8, alpha=0.6, label=f"party {i}" if acc.shape[1] <= 10 else None)
  ax.plot(rounds, acc.mean(axis=1), color="black", lw=2.2, label="mean (argmax over all outputs)")
  priv = getattr(result, "accuracy_private", None)
  if priv is not None:
    ax.plot(rounds, np.asarray(priv).mean(axis=1), color="black", lw=1.6, ls="--",
            label="mean (private classes only)")
  ax.set_xlabel("round (0 = before collaboration)")
  ax.set_ylabel("private-task test accuracy")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  cfg = result.config
  ax.set_title(title or f"FedMD-{cfg.method.upper()}  N={cfg.num_parties} k={cfg.k} "
               f"{'WR' if cfg.with_replacement else 'WOR'} {cfg.aggregation}", fontsize=10)
  ax.legend(fontsize=7, ncol=2, loc="lower right")
  fig.tight_layout()
  fig.savefig(out)
  plt.close(fig)
  return out


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 40 else f"a {type(value).__name__}"


def _line_key(cfg: FedMDConfig) -> tuple:
  return (cfg.method, cfg.num_parties, cfg.with_replacement, cfg.resample_each_round)


def _line_label(key: tuple, varies: set[int]) -> str:
  """A line's label: its sampling, and its method, N or resampling where the lines differ in them."""
  method, parties, wr, resampled = key
  parts = [method] if 0 in varies else []
  parts += [f"N={parties}"] if 1 in varies else []
  parts.append("with replacement" if wr else "without replacement")
  parts += (["resampled each round"] if resampled else ["sample reused"]) if 3 in varies else []
  return ", ".join(parts)


def plot_accuracy_vs_k(results: Iterable[Any], path: Any, *, baselines: dict | None = None,
                       title: str | None = None) -> pathlib.Path:
  """Final mean accuracy (bars: min-max over parties) against k, one line per method, N and sampling.

  Results of different methods, numbers of parties N, samplings (WR / WOR)
  or resampling schedules are drawn as separate lines, labelled by what
  differs between them (by WR / WOR alone when only the sampling does).
  Each line holds at most one result per k.

  Args:
    results: one or more results of ``method`` ``"nfdp"`` or
      ``"local-sample"`` (the methods that sample k records), any mix of k,
      sampling, method and N.
    path: the image file, as in :func:`plot_accuracy_per_round`.
    baselines: optional ``{label: accuracy}`` (finite numbers) drawn as
      horizontal lines.
    title: the plot's title (None: the methods plotted, e.g. "FedMD-NFDP:
      accuracy against k").

  Returns:
    ``path`` as a :class:`pathlib.Path`: the file written.

  Raises:
    ValueError: ``results`` is empty or holds anything but results of a
      method that samples k records; two results would give one line two
      points at the same k; a baseline is not a finite number; a bad
      ``path`` (see :func:`plot_accuracy_per_round`).
  """
  # [] drew an empty plot; one result (not in a list) was a TypeError. Any iterable (dict values, a generator,
  # which was read twice and under-plotted) is taken as a list.
  given = results
  try:
    results = [] if isinstance(results, (str, bytes)) else list(results)
  except TypeError:
    results = []
  if not results:
    raise ValueError(f"Expected results to be a non-empty list of FedMD results; got {_short(given)}.")
  lines: dict[tuple, dict[int, int]] = {}  # (method, N, WR, resampled) -> {k: index in results}
  for i, r in enumerate(results):
    _accuracy(f"results[{i}]", r)
    if r.config.method not in ("nfdp", "local-sample"):  # k is unused (np, local, centralized) or a default (ldp)
      raise ValueError(f"Expected results[{i}] of a method that samples k records ('nfdp' or 'local-sample'); "
                       f"got method={r.config.method!r}.")
    # Results of other methods or N were merged into one "without replacement" line, joined at a shared k.
    line = lines.setdefault(_line_key(r.config), {})
    if r.config.k in line:
      j = line[r.config.k]
      raise ValueError(f"Expected one result per k on each line (method, N, sampling); results[{j}] and "
                       f"results[{i}] are both {_line_label(_line_key(r.config), {0, 1, 3})} at k={r.config.k}.")
    line[r.config.k] = i
  if baselines is not None and not isinstance(baselines, dict):
    raise ValueError(f"Expected baselines to be a dict {{label: accuracy}} or None; got {type(baselines).__name__}.")
  baselines = {str(label): _validate.finite(f"baselines[{label!r}]", v) for label, v in (baselines or {}).items()}
  plt = _plt()
  out = _output_path(path)
  fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
  varies = {i for i in range(4) if len({key[i] for key in lines}) > 1}
  for key in sorted(lines, key=lambda key: (key[2], key[0], key[1], key[3])):  # WOR lines first, as before
    rs = [results[i] for _, i in sorted(lines[key].items())]
    ks = [r.config.k for r in rs]
    mean = np.array([np.mean(r.final_accuracy) for r in rs])
    # The mean of equal floats can round above their max (ten copies of 1/6 average to 0.16666666666666669):
    # a negative bar length, which matplotlib refuses.
    lo = np.maximum(mean - np.array([np.min(r.final_accuracy) for r in rs]), 0.0)
    hi = np.maximum(np.array([np.max(r.final_accuracy) for r in rs]) - mean, 0.0)
    # yerr as one (2, n) array: a list of two arrays made matplotlib 3.9 call math.isfinite on a 1-element array.
    ax.errorbar(ks, mean, yerr=np.stack([lo, hi]), marker="s" if key[2] else "o", capsize=3,
                label=_line_label(key, varies))
  for j, (label, value) in enumerate(baselines.items()):
    ax.axhline(value, ls="--", lw=1, color=f"C{len(lines) + j}", label=label)  # colours after the lines
  ks = sorted({r.config.k for r in results})
  ax.set_xscale("log")
  ax.minorticks_off()
  ax.set_xticks(ks)
  ax.set_xticklabels([str(k) for k in ks])
  ax.set_xlabel("k (records sampled per party)")
  ax.set_ylabel("final test accuracy (mean; bars: min-max)")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  # The title said FedMD-NFDP for local-sample results too (no collaboration, no NFDP round at all).
  names = {"nfdp": "FedMD-NFDP", "local-sample": "local training on the sample"}
  methods = " and ".join(names[m] for m in ("nfdp", "local-sample") if any(key[0] == m for key in lines))
  ax.set_title(title or f"{methods}: accuracy against k", fontsize=10)
  fig.tight_layout()
  fig.savefig(out)
  plt.close(fig)
  return out
