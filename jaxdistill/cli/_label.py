"""``jaxdistill label``: reverse k-NN private labeling end to end (the main job).

With no flags it labels the embedded MNIST digits (3,000 private, 1,000
public, 1,000 evaluation) with central discrete-Laplace votes at a total
epsilon of 1 and writes ``report.json`` and plots to ``runs/label-...``.
The report is written before the plots: a plot that cannot be drawn is
named in a warning and in the report's ``plot_errors``, and the command
exits 1 (0: report and plots written; 2: bad input).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import re
from typing import Any

from jaxdistill import _validate
from jaxdistill import labeling
from jaxdistill._keys import draw_secret_seed
from jaxdistill.cli._common import _entries, count, print_json, print_table
from jaxdistill.data import DATASETS
from jaxdistill.labeling import _config as label_config
from jaxdistill.labeling._components import PCA as PCA_REPRESENTATIONS


def add_parser(sub: argparse._SubParsersAction) -> None:
  d = labeling.LabelingConfig()
  st = d.student
  p = sub.add_parser("label", help="reverse k-NN private labeling of public data (Algorithm 1)",
                     description="Label a public set with private votes (reverse k-NN, Algorithm 1 of "
                                 "arXiv:2207.13253), train a student, and report accuracy and privacy.")
  p.add_argument("--dataset", default=d.dataset, choices=DATASETS, help="data set (default: %(default)s)")
  p.add_argument("--data-dir", default=None,
                 help="folder of IDX files (mnist, idx, emnist-*; fashion-mnist optional), "
                      "or tfds's data folder (tfds:*)")
  p.add_argument("--mechanism", default=d.mechanism, choices=labeling.MECHANISMS,
                 help="vote mechanism (default: %(default)s)")
  p.add_argument("--epsilon", type=float, default=None, help="TOTAL epsilon over T iterations "
                 f"(default: {labeling.DEFAULT_EPSILON:g}; --mechanism none takes none)")
  p.add_argument("--delta", type=float, default=None,
                 help="TOTAL delta (default: 0 for central/local, min(1e-6, 1/(10n)) for shuffle)")
  p.add_argument("--s", "--num-queries", dest="num_queries", type=count, default=d.num_queries,
                 help="number of queries s (default: %(default)s)")
  p.add_argument("--k", type=count, default=d.k,
                 help="each record's out-degree; records per query with knn-labeling (default: %(default)s)")
  p.add_argument("--connection", default=d.connection, choices=labeling.CONNECTIONS,
                 help="connection rule; only reverse-knn is per record (default: %(default)s)")
  p.add_argument("--T", "--iterations", dest="iterations", type=count, default=d.iterations,
                 help="iterations; t >= 2 re-selects queries with the student (default: %(default)s)")
  p.add_argument("--representation", default=d.representation, choices=labeling.REPRESENTATIONS,
                 help="representation fitted on D_pub for the first queries (default: %(default)s)")
  p.add_argument("--seed", type=count, default=d.seed, help="seed (default: %(default)s)")
  p.add_argument("--secret-noise", action="store_true",
                 help="draw the vote noise from a secret OS-random seed (never recorded) instead of --seed")
  p.add_argument("--out-dir", default=None,
                 help="output directory: release ledger, report.json, plots (default: runs/label-<settings>)")
  p.add_argument("--private-size", type=count, default=None,
                 help="|D_priv| (default: all training images; embedded: 3000)")
  p.add_argument("--public-size", type=count, default=None, help="|D_pub| (default: 5000; embedded: 1000)")
  p.add_argument("--eval-size", type=count, default=None, help="|D_eval| (default: 5000; embedded: 1000)")
  p.add_argument("--student-epochs", type=count, default=st.epochs, help="student epochs (default: %(default)s)")
  p.add_argument("--student-widths", type=_entries(count, "integers", "an integer"), default=st.widths,
                 help="student conv widths, e.g. 16,32 (default: 16,32)")
  p.add_argument("--student-targets", default=st.targets, choices=label_config.STUDENT_TARGETS,
                 help="train on argmax labels or on the noisy vote shares (default: %(default)s)")
  p.add_argument("--student-refine", type=count, default=st.refine_rounds, metavar="R",
                 help="self-training rounds on D_pub: retrain on the student's predictions times the vote "
                      "shares (post-processing, no privacy cost; default: %(default)s)")
  # None when not given, so that a flag given where it is ignored is refused even at its default value.
  p.add_argument("--central-noise", default=None, choices=label_config.CENTRAL_NOISES,
                 help=f"noise of --mechanism central (only with it; default: {d.central_noise})")
  p.add_argument("--shuffle-local", default=None, choices=label_config.SHUFFLE_LOCALS,
                 help=f"local randomizer of --mechanism shuffle-single (only with it; default: {d.shuffle_local})")
  p.add_argument("--pca-dim", type=count, default=None,
                 help=f"PCA components of --representation pca or hog-pca (only with them; default: {d.pca_dim})")
  p.add_argument("--encoder-width", type=count, default=None, metavar="W",
                 help="contrastive encoder width for --representation contrastive or scan (default: 16)")
  p.add_argument("--encoder-steps", type=count, default=None, metavar="N",
                 help="contrastive encoder training steps for --representation contrastive or scan (default: 2000)")
  p.add_argument("--no-baselines", action="store_true",
                 help="skip the noise-free pipeline (not private) and the supervised ceiling")
  p.add_argument("--ceiling-seeds", type=count, default=d.ceiling_seeds, metavar="N",
                 help="train the supervised ceiling with N student seeds and report them all and their mean "
                      "(the first is the reported ceiling; default: %(default)s; not with --no-baselines)")
  p.add_argument("--student-seeds", type=count, default=d.student_seeds, metavar="N",
                 help="train N students (seeds) on the final votes, with and without noise, and report them "
                      "all and their means (the first is the reported Acc_pc; post-processing, no privacy cost; "
                      "default: %(default)s)")
  p.add_argument("--no-progress", action="store_true", help="no progress bars")
  p.add_argument("--json", action="store_true", help="print the report as one JSON object")
  p.set_defaults(func=run_label)


#: Release settings the default folder's name spells out; the others are named only where they differ from
#: the defaults (see :func:`default_out_dir`).
_NAMED = ("dataset", "mechanism", "epsilon", "num_queries", "k", "iterations", "seed", "noise_seed")
#: How a release setting outside ``_NAMED`` reads in the default folder's name.
_TOKENS = {"delta": "delta{:g}", "private_size": "priv{}", "public_size": "pub{}", "eval_size": "eval{}",
           "pca_dim": "dim{}", "encoder_width": "width{}", "encoder_steps": "steps{}"}


def default_out_dir(config: labeling.LabelingConfig) -> str:
  """``runs/label-<settings>``: one folder per release fingerprint, so the ledger never meets other settings.

  The name spells out data set, mechanism, epsilon, s, k, T and seed; every other setting of the release
  fingerprint (delta, connection, representation, sizes, ...) is appended only where it differs from the
  default. Before, a second default run that changed only ``--delta`` or ``--representation`` landed in the
  first run's folder and was refused there. Student settings stay out: they do not change a release, so a
  run that changes only them re-uses the folder's releases (the earlier report moves to ``history/``).
  """
  eps = "inf" if math.isinf(config.epsilon) else f"{config.epsilon:g}"
  name = (f"label-{config.dataset}-{config.mechanism}-eps{eps}-s{config.num_queries}-k{config.k}"
          f"-T{config.iterations}-seed{config.seed}" + ("-secret-noise" if config.noise_seed is not None else ""))
  fingerprint = config.release_fingerprint()
  reference = labeling.LabelingConfig(**{n: getattr(config, n) for n in _NAMED}).release_fingerprint()
  for setting, value in fingerprint.items():
    if setting not in _NAMED and (setting not in reference or reference[setting] != value):
      name += "-" + _TOKENS.get(setting, "{}").format(value)
  return str(pathlib.Path("runs") / re.sub(r"[^A-Za-z0-9._+=-]", "_", name))


def config_from_args(args: argparse.Namespace) -> labeling.LabelingConfig:
  try:
    student = labeling.StudentConfig(widths=args.student_widths, epochs=args.student_epochs,
                                     targets=args.student_targets, refine_rounds=args.student_refine)
  except ValueError as err:  # its fields are the --student-* flags
    raise ValueError(f"student settings (--student-*): {_validate.first_line(err)}") from None
  if args.secret_noise and args.mechanism == "none":  # nothing to draw: only the default folder's name changed
    raise ValueError("Expected --secret-noise only with a mechanism that draws noise; got --mechanism none.")
  # Flags only one mechanism or representation reads: given elsewhere, even at the default value, they were
  # accepted and ignored (LabelingConfig refuses only another value than the default).
  for flag, value, allowed, given in (
      ("--central-noise", args.central_noise, ("--mechanism", ("central",)), args.mechanism),
      ("--shuffle-local", args.shuffle_local, ("--mechanism", ("shuffle-single",)), args.mechanism),
      ("--pca-dim", args.pca_dim, ("--representation", PCA_REPRESENTATIONS), args.representation)):
    if value is not None and given not in allowed[1]:
      raise ValueError(f"Expected {flag} only with {allowed[0]} {' or '.join(allowed[1])} (elsewhere it is "
                       f"ignored); got {allowed[0]} {given}.")
  d = labeling.LabelingConfig()
  cfg = labeling.LabelingConfig(
      dataset=args.dataset, data_dir=args.data_dir, mechanism=args.mechanism, epsilon=args.epsilon,
      delta=args.delta, num_queries=args.num_queries, k=args.k, connection=args.connection,
      iterations=args.iterations,
      representation=args.representation, seed=args.seed, private_size=args.private_size,
      public_size=args.public_size, eval_size=args.eval_size, student=student,
      central_noise=args.central_noise or d.central_noise, shuffle_local=args.shuffle_local or d.shuffle_local,
      pca_dim=d.pca_dim if args.pca_dim is None else args.pca_dim,
      encoder_width=args.encoder_width, encoder_steps=args.encoder_steps,
      baselines=not args.no_baselines, ceiling_seeds=args.ceiling_seeds, student_seeds=args.student_seeds,
      noise_seed=draw_secret_seed() if args.secret_noise else None)
  if args.out_dir is not None and not args.out_dir.strip():  # "" used to mean the default folder, silently
    raise ValueError(f"Expected --out-dir to be a folder path; got {args.out_dir!r}.")
  return cfg.replace(out_dir=args.out_dir or default_out_dir(cfg))


def _mean_row(draws: list[float], mean: float) -> list[list[Any]]:
  if len(draws) < 2:
    return []
  return [[f"  mean over {len(draws)} student seeds ({min(draws):.4f}-{max(draws):.4f})", "-", round(mean, 4)]]


def run_label(args: argparse.Namespace) -> int:
  # An IDX folder must exist; tfds creates its data folder when it downloads.
  if args.data_dir is not None and not args.dataset.startswith("tfds:") and not pathlib.Path(args.data_dir).is_dir():
    what = "it is a file" if pathlib.Path(args.data_dir).exists() else "it does not exist"
    raise ValueError(f"Expected --data-dir={args.data_dir!r} to be an existing folder; {what}.")
  config = config_from_args(args)
  result = labeling.run_labeling(config, progress=not args.no_progress)
  rep = result.report
  if args.json:
    print_json(rep)
    return 1 if rep.get("plot_errors") else 0
  res, priv = rep["results"], rep["privacy"]
  st = priv["statement"]
  print(f"Reverse k-NN labeling: {config.dataset}, |D_priv|={rep['data']['private_size']}, "
        f"|D_pub|={rep['data']['public_size']}, |D_eval|={rep['data']['eval_size']}, "
        f"s={config.num_queries}, k={config.k}, T={config.iterations}, representation={config.representation}")
  rows = [[f"{config.mechanism} (eps={st['epsilon']}, delta={st['delta']})", res["acc_pl"], res["acc_pc"]]]
  rows += _mean_row(res["acc_pc_draws"], res["acc_pc_mean"])
  if res["noise_free_acc_pc"] is not None and config.mechanism != "none":
    rows.append(["no noise (not private)", res["noise_free_acc_pl"], res["noise_free_acc_pc"]])
    rows += _mean_row(res["noise_free_acc_pc_draws"], res["noise_free_acc_pc_mean"])
  if res["supervised_ceiling_acc_pc"] is not None:
    rows.append(["supervised ceiling (true D_pub labels)", "-", res["supervised_ceiling_acc_pc"]])
    rows += _mean_row(res["supervised_ceiling_draws"], res["supervised_ceiling_mean"])
  print_table(["pipeline", "Acc_pl", "Acc_pc"], rows)
  print(f"privacy: ({st['epsilon']}, {st['delta']})-DP, {priv['neighbouring_relation']}")
  print(f"composition: {priv['composition']}")
  for w in priv["warnings"]:
    print(f"warning [{w['code']}]: {w['message']}")
  if rep["releases"]["reused"]:
    print(f"reused released votes of iterations {rep['releases']['reused']} from the ledger (no new budget spent)")
  for note in rep["releases"].get("notes", []):
    print(f"note: {note}")
  print(f"wall time {rep['timings_s']['total']:.1f} s; report: {pathlib.Path(config.out_dir) / 'report.json'}")
  if rep.get("plot_errors"):  # the report is complete; a script should notice the missing plot
    print(f"could not draw {', '.join(rep['plot_errors'])} (see the warning above)")
    return 1
  return 0
