"""``jaxdistill fedmd``: run FedMD-NFDP or a baseline; write report.json and PNG plots.

``--secret-randomness`` draws NFDP's samples and FedMD-LDP's noise from a
fresh OS-random seed (one for all runs of the command, as ``--seed`` is)
instead of ``--seed`` (which the report records). The seed is kept only in
the runs' checkpoints, so ``--resume`` continues with it.

A run into an ``--out`` that already holds a ``report.json`` keeps the earlier
report: it is moved to ``history/report-<N>.json`` (N one more than the
largest number there, so no saved report is ever overwritten), and the
earlier plots to ``history/report-<N>-<plot>.png``, before the new ones are
written.

The plots are drawn after ``report.json`` is written, so a plot that
cannot be drawn never loses the report. Such a plot is named on stderr, the
other plots are still drawn, and the command exits 1 (0: report and every
plot written; 2: bad input, nothing run): the report is complete, but a
script should notice the missing plot. ``--resume`` on the same ``--out``
then rewrites the report (the earlier one moves to ``history/``) and draws
the plots again without training.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import sys
import time

from jaxdistill import _keys, _validate
from jaxdistill._files import atomic_write, claimed_dir, keep_earlier_report
from jaxdistill.cli._common import _clean, _entries, count, fmt, print_table

# Literal copies of the library's choices, checked against it by tests/fedmd/test_cli.py. (They no longer
# keep ``jaxdistill --help`` from importing jax and flax: ``import jaxdistill`` loads every subpackage.)
METHODS = ("nfdp", "np", "ldp", "local", "local-sample", "centralized")
RELEASE_MODES = ("argmax", "softmax", "logits")
VMAP_MODES = ("auto", "on", "off")


def _spec(text: str):
  from jaxdistill.models import parse_spec  # pylint: disable=import-outside-toplevel
  return parse_spec(text)


# List flags: argparse refuses an empty or bad entry (exit 2), naming the flag and the entry.
_INTS = _entries(count, "integers", "an integer")
_TABLE = _entries(float, "numbers", "a number", allow_empty=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("fedmd", help="FedMD-NFDP and baselines (report.json + plots)",
                     description="Runs FedMD-NFDP or a baseline and writes report.json and PNG plots to --out. "
                     "An earlier report.json there is kept as history/report-<N>.json.")
  a = p.add_argument
  a("--method", default="nfdp", choices=METHODS, help="algorithm or baseline")
  a("--parties", type=count, default=10, help="number of parties N")
  a("--k", type=_INTS, default=None,
    help="sample size per party (default: 16); a comma list runs one run per value (only with nfdp and "
         "local-sample, the methods that sample)")
  a("--sampling", default=None, choices=["wor", "wr", "both"],
    help="without / with replacement (default: wor; only with nfdp and local-sample)")
  a("--resample-each-round", action="store_true", help="fresh sample every round (composed privacy)")
  a("--rounds", type=count, default=20,
    help="collaboration rounds R (0: local training only: no predictions released, no sigma table)")
  # --public-subset, --aggregation, --weighting and --digest-epochs: only the methods that collaborate read them.
  a("--public-subset", type=count, default=None,
    help=f"public images queried per round (default: {_DEFAULT_PUBLIC_SUBSET}; {_COLLAB})")
  a("--aggregation", default=None, choices=RELEASE_MODES, help=f"what parties release (default: argmax; {_COLLAB})")
  a("--weighting", type=_entries(float, "numbers", "a number", also=("equal", "size")), default=None,
    help="'equal' (default), 'size' or N comma-separated weights ('size' is refused for nfdp and ldp: under "
         f"add/remove the consensus would reveal each party's size; {_COLLAB})")
  a("--pretrain-epochs", type=count, default=2, help="public pre-training epochs (0: none)")
  a("--init-epochs", type=count, default=20, help="T1: epochs on the private view first")
  a("--digest-epochs", type=count, default=None,
    help=f"T2: epochs on the consensus per round (default: {_DEFAULT_DIGEST_EPOCHS}; {_COLLAB})")
  a("--revisit-epochs", type=count, default=None,
    help=f"T3: epochs on the private view per round (default: {_DEFAULT_REVISIT_EPOCHS}; only with --rounds >= 1)")
  a("--lr", type=float, default=1e-3, help="Adam learning rate")
  a("--private-batch-size", type=count, default=5, help="FedMD: 5")
  a("--public-batch-size", type=count, default=256)
  a("--width-multiplier", type=float, default=0.125, help="scales FedMD's conv widths (1 = paper)")
  a("--architectures", type=_entries(_spec, "CNN specs", "a CNN spec", sep=";", also=("fedmd",)), default="fedmd",
    help="'fedmd' (the ten FedMD CNNs, cycled) or ';'-separated specs like '128,256:0.2;64,128,256:0.2'")
  a("--ldp-epsilon", type=float, default=None, help="FedMD-LDP target epsilon (only with --method ldp; default: 1)")
  a("--ldp-delta", type=float, default=None,
    help="FedMD-LDP target delta, a public number (required with --method ldp; e.g. NFDP's p at the planned n; "
         "with --method nfdp, the delta its LDP sigma table is matched to)")
  a("--ldp-clip", type=float, default=None,
    help="L2 clip of logits releases under LDP (default: 10; only with --aggregation logits and --method nfdp "
         "or ldp)")
  a("--ldp-table-epsilons", type=_TABLE, default=None,
    help="epsilons of the report's FedMD-LDP sigma table at NFDP's delta (default: 0,0.1,0.5,1,2,4,8; '' for "
         "none; only with --method nfdp or ldp, the methods whose report has the table)")
  a("--partition", default="iid", help="iid, dirichlet or classes")
  a("--alpha", type=float, default=None,
    help=f"Dirichlet concentration (only with --partition dirichlet; default: {_DEFAULT_ALPHA:g})")
  a("--classes-per-party", type=count, default=None,
    help=f"classes each party holds (only with --partition classes; default: {_DEFAULT_CLASSES_PER_PARTY})")
  a("--public-dataset", default="mnist-embedded")
  a("--private-dataset", default="fashion-mnist")
  a("--data-dir", default=None, help="IDX folder of the private data set")
  a("--public-data-dir", default=None, help="IDX folder of the public data set (mnist, idx, emnist-*)")
  a("--private-classes", type=_INTS, default="0,1,2,3,4,5", help="source classes of the private task")
  a("--private-per-class", type=count, default=500, help="private training images per class (0: all)")
  a("--test-per-class", type=count, default=500, help="test images per class (0: all)")
  a("--public-size", type=count, default=0, help="keep this many public images (0: all)")
  a("--seed", type=count, default=0)
  a("--secret-randomness", action="store_true",
    help="draw the samples (nfdp, local-sample) and the LDP noise from a secret OS-random seed, kept only in "
         "the checkpoints under --out (never in the report), instead of --seed")
  a("--vmap", default="auto", choices=VMAP_MODES, help="vmapped same-architecture parties")
  a("--eval-every", type=count, default=None,
    help=f"evaluate every this many rounds, and after the last (default: {_DEFAULT_EVAL_EVERY}; only with --rounds "
         ">= 1)")
  a("--out", default="runs/fedmd",
    help="output folder (report.json, plots, checkpoints); an earlier report.json moves to history/report-<N>.json")
  a("--resume", action="store_true", help="continue from the checkpoints in --out")
  a("--stop-after-round", type=count, default=None, help="stop this session after this round (resume later)")
  a("--no-progress", action="store_true", help="no progress bars")
  p.set_defaults(func=run)


class _Stop(Exception):
  pass


def _check_checkpoint_dirs(out: pathlib.Path, names: list[str]) -> None:
  """Every run's checkpoint folder, before any data is loaded or any run trains.

  A file where a later run keeps its checkpoint folder used to stop the command after the earlier runs
  had trained. Checked without creating anything (a stopped command leaves no empty folder per run).
  """
  from jaxdistill import fedmd  # pylint: disable=import-outside-toplevel
  for name in names:
    for rel, folder in (("checkpoints", True), (f"checkpoints/{name}", True),
                        (f"checkpoints/{name}/{fedmd.CHECKPOINT_NAME}", False)):
      path = out / rel
      if folder and path.exists() and not path.is_dir():
        raise ValueError(f"Expected --out={str(out)!r} to hold no file named {rel!r}: run {name} keeps its "
                         "checkpoint in a folder of that name. Move the file away.")
      if not folder and path.is_dir():
        raise ValueError(f"Expected --out={str(out)!r} to hold no folder named {rel!r}: run {name} writes its "
                         "checkpoint file there. Move the folder away.")
      if folder and path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"Expected --out={str(out)!r} to hold a writable folder {rel!r}: run {name} writes its "
                         "checkpoint there.")


def _write_report(out: pathlib.Path, report: dict) -> pathlib.Path:
  """Writes ``out/report.json``, first moving an earlier one to ``history/report-<N>.json``.

  N is one more than the largest number already in ``history``, so no saved
  report is ever overwritten (even after one was deleted from there).
  """
  keep_earlier_report(out, plots=None)
  path = out / "report.json"
  atomic_write(path, json.dumps(_clean(report), indent=1).encode())  # whole or not at all
  return path


def _config(args: argparse.Namespace, k: int, wr: bool):
  from jaxdistill import fedmd  # pylint: disable=import-outside-toplevel
  specs = None if args.architectures == "fedmd" else args.architectures  # parsed by argparse (_entries)
  weighting = args.weighting
  return fedmd.FedMDConfig(
      method=args.method, num_parties=args.parties, specs=specs, width_multiplier=args.width_multiplier,
      k=k, with_replacement=wr, resample_each_round=args.resample_each_round, rounds=args.rounds,
      public_subset=args.public_subset, aggregation=args.aggregation, weighting=weighting,
      pretrain_epochs=args.pretrain_epochs, init_epochs=args.init_epochs, digest_epochs=args.digest_epochs,
      revisit_epochs=args.revisit_epochs, learning_rate=args.lr, private_batch_size=args.private_batch_size,
      public_batch_size=args.public_batch_size, ldp_epsilon=args.ldp_epsilon, ldp_delta=args.ldp_delta,
      ldp_clip=args.ldp_clip, vmap=args.vmap, eval_every=args.eval_every)


def _secret_seed(args: argparse.Namespace, out: pathlib.Path, names: list[str]) -> int | None:
  """The command's one secret seed (None: randomness from --seed): its checkpoints' on --resume, else fresh.

  One seed for all runs, as one --seed: the runs' samples stay paired across k (see runs_share_parties).
  """
  from jaxdistill import fedmd  # pylint: disable=import-outside-toplevel
  from jaxdistill._keys import draw_secret_seed  # pylint: disable=import-outside-toplevel
  kept = set()
  for name in names if args.resume else ():
    if (out / "checkpoints" / name / fedmd.CHECKPOINT_NAME).is_file():
      seed = fedmd.checkpoint_secret_seed(out / "checkpoints" / name)
      if (seed is not None) != args.secret_randomness:
        made = "with" if seed is not None else "without"
        raise ValueError(f"Expected --secret-randomness {'' if seed is not None else 'not '}to be given: the "
                         f"checkpoint of run {name} in {out / 'checkpoints'} was made {made} it.")
      kept.add(seed)
  if len(kept) > 1:
    raise ValueError(f"The checkpoints in {out / 'checkpoints'} hold different secret seeds: they come from "
                     "different commands; use another --out for one of them.")
  if kept:
    return kept.pop()
  return draw_secret_seed() if args.secret_randomness else None


#: Defaults of the flags that only some methods use (None in argparse, so that a flag given is told apart).
_DEFAULT_K, _DEFAULT_SAMPLING, _DEFAULT_LDP_EPSILON, _DEFAULT_LDP_CLIP = "16", "wor", 1.0, 10.0
_DEFAULT_LDP_TABLE_EPSILONS = "0,0.1,0.5,1,2,4,8"  # fedmd.DEFAULT_LDP_EPSILONS (tests/fedmd/test_cli.py checks)
#: The methods whose report has the FedMD-LDP sigma table (FedMDConfig.has_ldp_table; the tests check).
_TABLE_METHODS = ("nfdp", "ldp")
#: The methods that query the public set and release (FedMDConfig.collaborates; the tests check), and the defaults
#: of the flags only they read.
_COLLAB_METHODS = ("nfdp", "np", "ldp")
_DEFAULT_PUBLIC_SUBSET, _DEFAULT_AGGREGATION, _DEFAULT_WEIGHTING, _DEFAULT_DIGEST_EPOCHS = 5000, "argmax", "equal", 2
_COLLAB = "only with --method nfdp, np or ldp, the methods that collaborate"
#: Defaults of the partition flags (fedmd.load_fedmd_data's; the tests check).
_DEFAULT_ALPHA, _DEFAULT_CLASSES_PER_PARTY = 0.5, 2
#: Defaults of the flags only rounds read (FedMDConfig's; the tests check).
_DEFAULT_REVISIT_EPOCHS, _DEFAULT_EVAL_EVERY = 1, 1


def _which(methods: tuple[str, ...]) -> str:
  return " or ".join([", ".join(methods[:-1]), methods[-1]] if len(methods) > 1 else methods)


def _check_method_flags(args: argparse.Namespace) -> argparse.Namespace:
  """Refuses a flag the method ignores (``--method np --k 3`` ran NP without a word); fills in the defaults."""
  # ldp takes no --k either: under add/remove (the CLI's relation) it needs --ldp-delta, and its sigma table is
  # then matched to that delta, not to NFDP's k/n. The sigma table (and the delta it is matched to) exists only
  # in nfdp and ldp reports: --ldp-table-epsilons '' (no table) is what the other methods do anyway.
  table = bool(args.ldp_table_epsilons)  # None (not given) or () ('') ask for no table
  for flags, methods in ((("--k", "--sampling"), ("nfdp", "local-sample")), (("--ldp-epsilon",), ("ldp",)),
                         (("--ldp-delta", "--ldp-table-epsilons"), _TABLE_METHODS)):
    given = [f for f in flags if (table if f == "--ldp-table-epsilons" else
                                  getattr(args, f[2:].replace("-", "_")) is not None)]
    if given and args.method not in methods:
      raise ValueError(f"Expected {' and '.join(given)} only with --method {_which(methods)} (elsewhere "
                       f"{'they are' if len(given) > 1 else 'it is'} ignored); got --method {args.method}.")
  if args.method == "nfdp" and args.ldp_delta is not None and args.ldp_table_epsilons == ():
    raise ValueError("Expected --ldp-delta with --method nfdp only beside a sigma table (it is the table's delta); got "
                     "--ldp-table-epsilons ''.")
  # The clip bounds logits releases: ldp's noise and nfdp's sigma table scale with it; argmax and softmax rows have
  # a fixed sensitivity (sqrt 2), so the clip changed nothing there.
  aggregation = _DEFAULT_AGGREGATION if args.aggregation is None else args.aggregation
  if args.ldp_clip is not None and (args.method not in _TABLE_METHODS or aggregation != "logits"):
    raise ValueError("Expected --ldp-clip only with --aggregation logits and --method nfdp or ldp (elsewhere it is "
                     f"ignored); got --method {args.method} --aggregation {aggregation}.")
  # local, local-sample and centralized query no public data and release nothing.
  given = [f"--{f.replace('_', '-')}" for f in ("public_subset", "aggregation", "weighting", "digest_epochs")
           if getattr(args, f) is not None]
  if given and args.method not in _COLLAB_METHODS:
    raise ValueError(f"Expected {' and '.join(given)} only with --method {_which(_COLLAB_METHODS)}, the methods that "
                     f"collaborate (elsewhere {'they are' if len(given) > 1 else 'it is'} ignored); got --method "
                     f"{args.method}.")
  # A run of no rounds releases no public-set predictions: what shapes them, the sigma table matched to them, and
  # the rounds' training and evaluation went unread (ldp refuses --rounds 0 itself).
  if args.rounds == 0 and args.method != "ldp":
    from jaxdistill.fedmd._config import _ROUND_SETTINGS  # pylint: disable=import-outside-toplevel
    given = [f"--{f.replace('_', '-')}" for f in (*_ROUND_SETTINGS, "ldp_delta") if getattr(args, f) is not None]
    given += ["--ldp-table-epsilons"] if table else []
    given += ["--resample-each-round"] if args.resample_each_round else []  # one sample either way
    if given:
      raise ValueError(f"Expected {' and '.join(given)} only with --rounds >= 1 (a run of no rounds releases no "
                       f"predictions and trains no rounds: {'they are' if len(given) > 1 else 'it is'} ignored); got "
                       "--rounds 0.")
  # --alpha 0.5 with --partition iid (the default value, so the library could not tell) was accepted and ignored.
  for flag, partition in (("--alpha", "dirichlet"), ("--classes-per-party", "classes")):
    if getattr(args, flag[2:].replace("-", "_")) is not None and args.partition != partition:
      raise ValueError(f"Expected {flag} only with --partition {partition} (elsewhere it is ignored); got "
                       f"--partition {args.partition}.")
  for name, default in (("alpha", _DEFAULT_ALPHA), ("classes_per_party", _DEFAULT_CLASSES_PER_PARTY),
                        ("aggregation", _DEFAULT_AGGREGATION), ("public_subset", _DEFAULT_PUBLIC_SUBSET),
                        ("weighting", _DEFAULT_WEIGHTING), ("digest_epochs", _DEFAULT_DIGEST_EPOCHS),
                        ("k", _INTS(_DEFAULT_K)), ("sampling", _DEFAULT_SAMPLING),
                        ("ldp_epsilon", _DEFAULT_LDP_EPSILON), ("ldp_clip", _DEFAULT_LDP_CLIP),
                        ("revisit_epochs", _DEFAULT_REVISIT_EPOCHS), ("eval_every", _DEFAULT_EVAL_EVERY)):
    if getattr(args, name) is None:
      setattr(args, name, default)
  if args.ldp_table_epsilons is None:
    args.ldp_table_epsilons = (_TABLE(_DEFAULT_LDP_TABLE_EPSILONS) if args.method in _TABLE_METHODS and args.rounds
                               else ())
  return args


def run(args: argparse.Namespace) -> int:
  args = _check_method_flags(args)
  ks = list(args.k)  # parsed by argparse (_entries): at least one, every entry an integer
  samplings = {"wor": [False], "wr": [True], "both": [False, True]}[args.sampling]
  if len(set(ks)) != len(ks):  # the second run of a repeated k would find the first one's checkpoint
    raise ValueError(f"Expected distinct --k values; got {','.join(map(str, ks))}.")
  configs = [(k, wr, _config(args, k, wr)) for wr in samplings for k in ks]  # validates all first
  # k and the sampling name a run only where they are read (a local run was called local-k16-wor).
  names = [f"{args.method}-k{k}-{'wr' if wr else 'wor'}" if cfg.reads_k else args.method for k, wr, cfg in configs]
  table_eps = args.ldp_table_epsilons  # parsed by argparse (_entries)
  from jaxdistill.fedmd._privacy import check_ldp_epsilon  # pylint: disable=import-outside-toplevel
  table_eps = tuple(check_ldp_epsilon("--ldp-table-epsilons", e, allow_zero=True) for e in table_eps)  # before training
  if args.stop_after_round is not None:  # 0 or -5 stopped after round 1 but said "after round -5"
    stop = _validate.integer("--stop-after-round", args.stop_after_round, minimum=1)
    if isinstance(args.rounds, int) and args.rounds < stop:  # it ran to the end without a word (rounds=0 too)
      raise ValueError(f"Expected --stop-after-round={stop} <= --rounds={args.rounds}: a later round is never "
                       "reached, so the command would not stop.")
  plots = tuple(f"accuracy_per_round_{name}.png" for name in names) + ("accuracy_vs_k.png",)
  # One command at a time per --out; one failing before it writes anything (missing data, a bad run) leaves no
  # empty --out or checkpoint folder.
  with claimed_dir("--out", args.out, report="report.json", files=plots,
                   inner=tuple(f"checkpoints/{name}" for name in names)) as out:
    return _run_all(args, out, configs, names, table_eps)


def _run_all(args: argparse.Namespace, out: pathlib.Path, configs: list, names: list[str],
             table_eps: tuple[float, ...]) -> int:
  """Loads the data, checks every run, then trains them in turn; writes the report and plots."""
  import jax  # pylint: disable=import-outside-toplevel
  from jaxdistill import fedmd  # pylint: disable=import-outside-toplevel
  _check_checkpoint_dirs(out, names)
  secret_seed = _secret_seed(args, out, names)  # a --resume without the run's --secret-randomness: now
  data = fedmd.load_fedmd_data(
      num_parties=args.parties, seed=args.seed, public_dataset=args.public_dataset,
      private_dataset=args.private_dataset, data_dir=args.data_dir, public_data_dir=args.public_data_dir,
      private_classes=list(args.private_classes),
      private_per_class=args.private_per_class or None, test_per_class=args.test_per_class or None,
      partition=args.partition, alpha=args.alpha, classes_per_party=args.classes_per_party,
      public_size=args.public_size or None)
  # Every run's settings against the data, and every checkpoint, before the first run trains: a k larger
  # than a party, or a checkpoint left without --resume, used to stop the command after the earlier runs.
  for (_, _, cfg), name in zip(configs, names):
    fedmd.check_config(cfg, data, checkpoint_dir=out / "checkpoints" / name, resume=args.resume)
  if args.resume and not any((out / "checkpoints" / n / fedmd.CHECKPOINT_NAME).is_file() for n in names):
    # Resume-or-start, as `label` re-run on its --out: said, since a mistyped --out would otherwise start over quietly.
    sys.stderr.write(f"jaxdistill: --resume found no checkpoint under {out / 'checkpoints'}; starting from round 0\n")
  key = _keys.seed_key(args.seed)
  results, stopped, archived = [], None, False

  def stopper(r: int, info: dict) -> None:
    if args.stop_after_round is not None and r >= args.stop_after_round:
      raise _Stop(r)

  t0 = time.perf_counter()
  for (_, _, cfg), name in zip(configs, names):
    try:
      res = fedmd.run_fedmd(key, cfg, data, checkpoint_dir=out / "checkpoints" / name, resume=args.resume,
                            progress=not args.no_progress, on_round_end=stopper,
                            ldp_table_epsilons=table_eps, secret_seed=secret_seed)
    except _Stop as stop:
      stopped = (name, stop.args[0])
      break
    results.append((name, res))
    if not archived:  # an earlier report and its plots move to history/ once a new run has finished
      keep_earlier_report(out)
      archived = True
  if stopped:
    name, r = stopped
    # A resumed run already past --stop-after-round stops after its next round: say which one it was.
    passed = (f" (resumed from round {r - 1}, already at --stop-after-round={args.stop_after_round} or past it)"
              if r > args.stop_after_round else "")
    sys.stderr.write(f"jaxdistill: stopped after round {r} of run {name}{passed}; rerun with --resume\n")
    return 0
  # Quoted so that it re-runs as written (an --architectures '16,32;16,32,32' split the line at the ';').
  report = {"command": shlex.join(["jaxdistill", *getattr(args, "argv", sys.argv[1:])]),
            "wall_time_s": time.perf_counter() - t0, "backend": jax.default_backend(),
            "runs": [{"name": n, **r.to_report()} for n, r in results]}
  if len(results) > 1:  # only nfdp and local-sample take several --k or --sampling
    report["warnings"] = [{
        "code": "runs_share_parties",
        "message": (f"These {len(results)} runs use the same parties' records: each run's privacy statement "
                    "covers that run alone. Deploying several of them releases more, and their deltas add up "
                    "for the combined release (an upper bound). The runs draw from one key (--seed, or one "
                    "secret seed): a party's sample for a smaller k is the first k records of its sample for "
                    "a larger k, with or without replacement, and the two samplings of one k read the same "
                    "random words, so the runs are paired, not independent.")}]
  _write_report(out, report)  # before any plot: a plot that fails must not lose the report of all the training
  failed = _draw_plots(args, out, results)
  rows = []
  for n, r in results:
    rows.append([n, float(r.final_accuracy.mean()), float(r.final_accuracy.min()),
                 float(r.final_accuracy.max()), _largest_delta(r.privacy), r.timings["total_this_session"]])
  # The run's guarantee is its weakest party's: party 0's delta alone understated it for unequal parties.
  print_table(["run", "mean acc", "min", "max", "largest delta (party)", "seconds (this session)"], rows)
  if failed:
    print(f"wrote {out / 'report.json'}; {len(failed)} plot(s) could not be drawn (see stderr)")
    return 1
  print(f"wrote {out / 'report.json'} and plots")
  return 0


def _largest_delta(privacy: list) -> str:
  """The largest delta over the parties' privacy reports, and whose: ``0.2308 (1)``; ``-`` when none has one."""
  deltas = [p.get("exact", {}).get("delta_for_every_epsilon", p.get("calibrated_to", {}).get("delta"))
            for p in privacy]
  known = [(d, i) for i, d in enumerate(deltas) if isinstance(d, (int, float))]
  if not known:
    return "-"
  delta, party = max(known, key=lambda t: (t[0], -t[1]))  # ties: the first party
  return f"{fmt(delta)} ({party})"


def _draw_plots(args: argparse.Namespace, out: pathlib.Path, results: list) -> list[str]:
  """Draws every plot into ``out``, after the report is written; returns the files that could not be drawn.

  A plot that fails (matplotlib refused the bars of equal accuracies, which lost report.json after all the
  training, and every --resume failed the same way) is said on stderr and the others are still drawn.
  """
  from jaxdistill import fedmd  # pylint: disable=import-outside-toplevel
  plots = [(f"accuracy_per_round_{name}.png", fedmd.plot_accuracy_per_round, res) for name, res in results]
  if args.method in ("nfdp", "local-sample"):
    plots.append(("accuracy_vs_k.png", fedmd.plot_accuracy_vs_k, [r for _, r in results]))
  failed = []
  for file, plot, what in plots:
    try:
      plot(what, out / file)
    except Exception as err:  # pylint: disable=broad-except  # drawing is after the report: nothing may lose it
      failed.append(file)
      sys.stderr.write(f"jaxdistill: could not draw {file} ({_validate.describe_error(err, limit=200)}); "
                       f"{out / 'report.json'} is written; --resume draws the plots again\n")
  return failed
