"""PNG plots of a labeling run (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import numpy as np

from jaxdistill import _validate
from jaxdistill._files import atomic_write

__all__ = ["write_plots", "draw_plots", "PLOT_FILES"]

PLOT_FILES = ("accuracy.png", "labels.png")


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _save(fig: Any, path: pathlib.Path) -> None:
  """``fig`` as a PNG at ``path``, whole or not at all (temporary file, fsync, rename)."""
  atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))


def _privacy_title(report: dict) -> str:
  """What the report's total statement claims: ``eps=<epsilon> (total)``, or that there is no guarantee.

  Read from the statement, not the settings: a balanced connection rule (or ``mechanism="none"``) has
  epsilon = inf whatever epsilon the noise was calibrated for.
  """
  eps = float(report["privacy"]["statement"]["epsilon"])  # the report writes inf as "inf"
  return "no DP guarantee" if math.isinf(eps) else f"eps={eps:.6g} (total)"


def write_plots(result: Any, out_dir: pathlib.Path) -> list[str]:
  """Writes ``accuracy.png`` and ``labels.png``; returns their file names.

  * ``accuracy.png``: Acc_pl and Acc_pc per iteration, with the noise-free
    pipeline and the supervised ceiling beside them; its title states the
    report's total epsilon, or "no DP guarantee" where that is inf.
  * ``labels.png``: the confusion matrix of D_pub's final pseudo-labels, and
    each query's released vote total against its margin (top vote minus
    runner-up).

  Raises what drawing or saving raises (:func:`draw_plots` records it instead).
  """
  _accuracy_plot(result, out_dir)
  _labels_plot(result, out_dir)
  return list(PLOT_FILES)


def draw_plots(result: Any, out_dir: pathlib.Path) -> tuple[list[str], dict[str, str]]:
  """:func:`write_plots`, each plot on its own: ``(files written, {file: first line of its error})``.

  The pipeline draws after ``report.json`` is written: a plot that failed (a full disk, say) raised after the
  whole run and lost the report; now the other plot is still drawn and the failure is reported.
  """
  written, failed = [], {}
  for name, draw in zip(PLOT_FILES, (_accuracy_plot, _labels_plot)):
    try:
      draw(result, out_dir)
      written.append(name)
    except Exception as err:  # pylint: disable=broad-except  # after the report: nothing may lose it
      failed[name] = _validate.describe_error(err, limit=200)
  return written, failed


def _accuracy_plot(result: Any, out_dir: pathlib.Path) -> None:
  plt = _pyplot()
  cfg = result.config
  its = result.private.iterations
  ts = [it.iteration for it in its]
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(ts, [it.acc_pl for it in its], "o-", label=f"Acc_pl ({cfg.mechanism})")
  ax.plot(ts, [it.acc_pc for it in its], "s-", label=f"Acc_pc ({cfg.mechanism})")
  if result.noise_free is not None and result.noise_free is not result.private:
    nf = result.noise_free.iterations
    ax.plot(ts, [it.acc_pl for it in nf], "o--", color="gray", label="Acc_pl (no noise)")
    ax.plot(ts, [it.acc_pc for it in nf], "s--", color="black", label="Acc_pc (no noise)")
  if result.ceiling_acc is not None:
    ax.axhline(result.ceiling_acc, color="green", ls=":", label="supervised ceiling")
  ax.set(xlabel="iteration t", ylabel="accuracy", xticks=ts,
         title=f"{result.report['data']['dataset']}: s={cfg.num_queries}, k={cfg.k}, {_privacy_title(result.report)}")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  try:
    _save(fig, out_dir / PLOT_FILES[0])
  finally:
    plt.close(fig)


def _labels_plot(result: Any, out_dir: pathlib.Path) -> None:
  plt = _pyplot()
  its = result.private.iterations

  final = its[-1]
  labels = result.splits.public.labels
  c = int(result.splits.public.num_classes)
  conf = np.zeros((c, c), np.int64)
  np.add.at(conf, (labels, final.pseudo_labels), 1)
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  im = axes[0].imshow(conf, cmap="Blues")
  axes[0].set(xlabel="pseudo-label", ylabel="true label", title=f"D_pub pseudo-labels (Acc_pl={final.acc_pl:.3f})")
  fig.colorbar(im, ax=axes[0])
  srt = np.sort(final.votes, axis=1)
  axes[1].scatter(final.votes.sum(axis=1), srt[:, -1] - srt[:, -2], s=10)
  axes[1].set(xlabel="released vote total per query", ylabel="margin (top - runner-up)",
              title=f"released votes, t={final.iteration}")
  axes[1].grid(alpha=0.3)
  fig.tight_layout()
  try:
    _save(fig, out_dir / PLOT_FILES[1])
  finally:
    plt.close(fig)
