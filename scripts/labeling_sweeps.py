"""Reproduces the SHAPES of the reverse-k-NN paper's figures with ``jaxdistill.labeling``.

Sweeps (arXiv:2207.13253, §5; spec/REVERSE_KNN.md §1.12):

* ``s``: accuracy against the number of queries s (Figs. 2-4; central DP).
* ``k``: accuracy against k in 1..10 (central DP).
* ``eps-central``: accuracy against epsilon, central discrete Laplace.
* ``eps-local``: accuracy against epsilon, local Collision and randomized
  response with s = |Y| = 10, k = 1 (Fig. 5).
* ``budget``: accuracy against central epsilon for every s in ``--s-grid``
  (which granularity the budget can pay for; not a figure of the paper).

``--tuning-split`` replaces the paper's split by one drawn from the TRAINING
images only (private = the rest of them, public and held-out = 5,000 each by
default), so settings can be chosen without touching the evaluation split;
``--ceiling`` adds the supervised ceiling (the same student on D_pub's true
labels) to every table.

Every point is one run of Algorithm 1 (T iterations, the student trained on
the pseudo-labels) plus, where it differs, the same run without noise. The
first representation is fitted once per sweep on D_pub (it does not depend
on the swept value; ``scan`` is fitted once per s, its number of clusters).
Results go to ``<out>/<dataset>_<sweep>[_tuning][_<tag>].{csv,md,png}``; the
markdown file starts with the exact command that produced it.

Example (the embedded digits, a few minutes on 2 CPU cores)::

  PYTHONPATH=. python scripts/labeling_sweeps.py --dataset mnist-embedded --sweep s --values 5,10,20,40,80,160
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import pathlib
import shlex
import sys
import time

import numpy as np

from jaxdistill import data
from jaxdistill import labeling

SWEEPS = ("s", "k", "eps-central", "eps-local", "budget")
DEFAULT_VALUES = {
    "s": "5,10,20,40,80,160,320",
    "k": "1,2,3,4,5,6,7,8,9,10",
    "eps-central": "0.01,0.02,0.05,0.1,0.2,0.5,1",
    "eps-local": "0.2,0.4,0.8,1.6,3.2,6.4",
    "budget": "0.1,0.3,1",
}


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--dataset", default="mnist-embedded")
  p.add_argument("--data-dir", default=None)
  p.add_argument("--sweep", required=True, choices=SWEEPS)
  p.add_argument("--values", default=None, help="comma-separated values of the swept parameter")
  p.add_argument("--epsilon", type=float, default=0.1, help="total epsilon when not swept")
  p.add_argument("--s", type=int, default=40, help="number of queries when not swept")
  p.add_argument("--k", type=int, default=1, help="k when not swept")
  p.add_argument("--T", type=int, default=1, help="iterations")
  p.add_argument("--representation", default="hog-pca")
  p.add_argument("--encoder-width", type=int, default=None, help="contrastive encoder width (contrastive, scan)")
  p.add_argument("--encoder-steps", type=int, default=None, help="contrastive encoder steps (contrastive, scan)")
  p.add_argument("--seeds", default="0", help="comma-separated seeds (mean and spread reported)")
  p.add_argument("--private-size", type=int, default=None)
  p.add_argument("--public-size", type=int, default=None)
  p.add_argument("--eval-size", type=int, default=None)
  p.add_argument("--student-epochs", type=int, default=15)
  p.add_argument("--student-widths", default="16,32")
  p.add_argument("--student-targets", default="hard", choices=("hard", "soft"))
  p.add_argument("--student-refine", type=int, default=0, help="self-training rounds (post-processing)")
  p.add_argument("--s-grid", default="200,400,1000", help="budget sweep: the numbers of queries s")
  p.add_argument("--tuning-split", action="store_true",
                 help="draw D_priv / D_pub / held-out from the training images only (for tuning)")
  p.add_argument("--ceiling", action="store_true", help="also train the supervised ceiling (once per seed)")
  p.add_argument("--ceiling-seeds", type=int, default=1,
                 help="with --ceiling: train the supervised student with this many seeds (the first is the "
                      "ceiling; the others show its spread)")
  p.add_argument("--student-seeds", type=int, default=1,
                 help="train this many students (other seeds) on each release and on its noise-free twin; "
                      "post-processing, no privacy cost. The table adds their mean and, with --ceiling, the gap "
                      "of the means to the ceiling's mean over --ceiling-seeds")
  p.add_argument("--out", default="results/labeling")
  p.add_argument("--tag", default="", help="appended to the output file names (e.g. the representation)")
  args = p.parse_args(argv)
  if args.ceiling_seeds != 1 and not args.ceiling:
    p.error("--ceiling-seeds needs --ceiling")
  if args.student_seeds < 1:
    p.error(f"--student-seeds must be >= 1, got {args.student_seeds}")
  if args.ceiling_seeds < 1:
    p.error(f"--ceiling-seeds must be >= 1, got {args.ceiling_seeds}")
  return args


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = parse(argv)
  values = [float(v) for v in (args.values or DEFAULT_VALUES[args.sweep]).split(",")]
  seeds = [int(v) for v in args.seeds.split(",")]
  student = labeling.StudentConfig(widths=tuple(int(w) for w in args.student_widths.split(",")),
                                   epochs=args.student_epochs, targets=args.student_targets,
                                   refine_rounds=args.student_refine)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = (f"{args.dataset.replace(':', '_')}_{args.sweep}" + ("_tuning" if args.tuning_split else "")
          + (f"_{args.tag}" if args.tag else ""))
  rows = []
  spread = []  # supervised ceilings with the other student seeds (--ceiling-seeds)
  start = time.perf_counter()
  machine = f"{os.cpu_count()} CPUs, 1-minute load average {os.getloadavg()[0]:.1f} at the start"
  for seed in seeds:
    base = labeling.LabelingConfig(
        dataset=args.dataset, data_dir=args.data_dir, mechanism="central", epsilon=args.epsilon,
        num_queries=args.s, k=args.k, iterations=args.T, representation=args.representation, seed=seed,
        encoder_width=args.encoder_width, encoder_steps=args.encoder_steps,
        private_size=args.private_size, public_size=args.public_size, eval_size=args.eval_size,
        student=student, student_seeds=args.student_seeds, baselines=False)
    # Any s and representation load the same split; s = 1 passes the s <= |D_pub| check at any size.
    splits = (tuning_splits(base) if args.tuning_split
              else labeling.load_splits(base.replace(num_queries=1, representation="raw", encoder_width=None,
                                                 encoder_steps=None)))
    reps = {}  # the first representation, fitted once (scan: once per s, its number of clusters)
    ceiling = ceiling_mean = None
    noise_free_cache = {}

    def run(cfg):
      rep_key = cfg.num_queries if cfg.representation == "scan" else None
      if rep_key not in reps:
        reps[rep_key] = labeling.fit_first_representation(cfg, splits.public.images)
      t0 = time.perf_counter()
      res = labeling.run_labeling(cfg, splits=splits, representation=reps[rep_key])
      return res, time.perf_counter() - t0

    for v in values:
      if args.sweep == "s":
        cfgs = [("central", base.replace(num_queries=int(v)))]
      elif args.sweep == "k":
        cfgs = [("central", base.replace(k=int(v)))]
      elif args.sweep == "eps-central":
        cfgs = [("central", base.replace(epsilon=v))]
      elif args.sweep == "budget":
        cfgs = [(f"central s={int(g)}", base.replace(epsilon=v, num_queries=int(g))) for g in args.s_grid.split(",")]
      else:
        local = base.replace(num_queries=splits.public.num_classes, k=1, epsilon=v)
        cfgs = [("local-collision", local.replace(mechanism="local-collision")),
                ("local-rr", local.replace(mechanism="local-rr"))]
      for mech, cfg in cfgs:
        nf_key = (cfg.num_queries, cfg.k)
        if nf_key not in noise_free_cache:
          # The first noise-free run also trains the supervised ceiling (same student and key as
          # `jaxdistill label`; it does not depend on s, k or epsilon).
          with_ceiling = args.ceiling and ceiling is None
          nf, _ = run(cfg.replace(mechanism="none", epsilon=math.inf, delta=None, baselines=with_ceiling,
                                  ceiling_seeds=args.ceiling_seeds if with_ceiling else 1))
          noise_free_cache[nf_key] = (nf.private.final.acc_pl, nf.private.final.acc_pc,
                                      float(np.mean(nf.private.final.acc_pc_draws)))
          if with_ceiling:
            ceiling, draws = nf.ceiling_acc, list(nf.ceiling_draws[1:])
            ceiling_mean = float(np.mean(nf.ceiling_draws))
            print(f"seed={seed} supervised ceiling {ceiling:.4f}" +
                  (f"; with {len(draws)} other student seeds {min(draws):.4f}-{max(draws):.4f}" if draws else ""),
                  flush=True)
            spread += draws
        res, secs = run(cfg)
        acc_pl, acc_pc = res.private.final.acc_pl, res.private.final.acc_pc
        nf_pl, nf_pc, nf_pc_mean = noise_free_cache[nf_key]
        pc_mean = float(np.mean(res.private.final.acc_pc_draws))
        # acc_pc and ceiling are the first student seed's (the pipeline's key, as `jaxdistill label`); the
        # *_mean columns average over --student-seeds (Acc_pc) and --ceiling-seeds (ceiling).
        rows.append({"seed": seed, "value": v, "mechanism": mech, "epsilon": cfg.epsilon, "s": cfg.num_queries,
                     "k": cfg.k, "T": cfg.iterations, "acc_pl": acc_pl, "acc_pc": acc_pc,
                     "noise_free_acc_pl": nf_pl, "noise_free_acc_pc": nf_pc, "ceiling": ceiling,
                     "student_seeds": args.student_seeds, "acc_pc_mean": pc_mean,
                     "noise_free_acc_pc_mean": nf_pc_mean, "ceiling_mean": ceiling_mean,
                     "seconds": round(secs, 1)})
        print(f"seed={seed} {args.sweep}={v:g} {mech}: Acc_pl={acc_pl:.4f} Acc_pc={acc_pc:.4f} "
              f"(no noise {nf_pl:.4f}/{nf_pc:.4f})"
              + (f" mean of {args.student_seeds} students {pc_mean:.4f} (no noise {nf_pc_mean:.4f})"
                 if args.student_seeds > 1 else "") + f" {secs:.0f}s", flush=True)
  wall = time.perf_counter() - start
  with open(out / f"{stem}.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
  command = "PYTHONPATH=. python scripts/labeling_sweeps.py " + " ".join(shlex.quote(a) for a in argv)
  write_markdown(out / f"{stem}.md", rows, args, command, wall, splits, spread, machine)
  plot(out / f"{stem}.png", rows, args)
  print(f"wrote {out / stem}.{{csv,md,png}} in {wall:.0f}s")
  return 0


def tuning_splits(config: labeling.LabelingConfig):
  """D_priv / D_pub / held-out drawn from the training images only (seed 12345), never the test images."""
  train, _ = data.load_dataset(config.dataset, config.data_dir)
  public_size = config.public_size or 5000
  eval_size = config.eval_size or 5000
  perm = np.random.default_rng(12345).permutation(len(train))
  private = perm[public_size + eval_size:]
  if config.private_size is not None:
    private = private[:config.private_size]
  return data.LabelingSplits(train.take(np.sort(private)), train.take(perm[:public_size]),
                             train.take(perm[public_size:public_size + eval_size]))


def aggregate(rows, key):
  groups = {}
  for r in rows:
    groups.setdefault((r["mechanism"], r["value"]), []).append(r[key])
  return {g: (float(np.mean(v)), float(np.std(v)), len(v)) for g, v in groups.items()}


def write_markdown(path, rows, args, command, wall, splits, spread=(), machine=""):
  lines = [f"# {args.dataset}: accuracy against {args.sweep}", "",
           "Command:", "", "```bash", command, "```", "",
           f"|D_priv| = {len(splits.private)}, |D_pub| = {len(splits.public)}, "
           f"|D_eval| = {len(splits.evaluation)}; "
           f"representation = {args.representation}; T = {args.T}; student widths {args.student_widths}, "
           f"{args.student_epochs} epochs, {args.student_targets} targets; seeds {args.seeds}; "
           f"wall time {wall:.0f} s ({machine}).",
           "Epsilon is the total over T; central = discrete Laplace, replace-one, sensitivity 2k.", "",
           ("Split: drawn from the TRAINING images only (`--tuning-split`); the evaluation column is "
            "held-out training images." if args.tuning_split
            else "Split: a seeded random three-way split of the 5,000 embedded digits (they have no test split)."
            if args.dataset == "mnist-embedded" else "Split: the paper's protocol."), ""]
  with_ceiling = any(r.get("ceiling") is not None for r in rows)
  if with_ceiling:
    per_seed = sorted({(r["seed"], r["ceiling"]) for r in rows})
    lines += ["Supervised ceiling (the same student on D_pub's true labels): " +
              ", ".join(f"seed {sd}: {c:.4f}" for sd, c in per_seed) +
              f"; mean {np.mean([c for _, c in per_seed]):.4f}. The column 'Acc_pc − ceiling' is Acc_pc minus the "
              "ceiling of the same seed, in points." +
              (f" The same student with {len(spread)} other seeds: mean {np.mean(spread):.4f}, sd "
               f"{np.std(spread, ddof=1):.4f}, range {min(spread):.4f}-{max(spread):.4f}." if len(spread) > 1 else ""),
              ""]
  many = args.student_seeds > 1
  if many:
    lines += [f"Each release (and its noise-free twin) trains {args.student_seeds} students with other seeds "
              "(post-processing, no privacy cost). Acc_pc is the first student's (the pipeline's key); the "
              "mean columns average all of them" +
              (f", and 'mean − ceiling mean' compares them with the mean of the {args.ceiling_seeds} "
               "ceiling students (at T = 1, student i and ceiling student i share a key)." if with_ceiling else ".")
              + " The ± of a mean column is its spread over the data seeds, not over the students.", ""]
  def cell(values, spec, sd_spec):  # the mean over the data seeds, and their spread when there are several
    return f"{np.mean(values):{spec}}" + (f" ± {np.std(values):{sd_spec}}" if len(values) > 1 else "")

  def mean_of(key):
    return lambda group: cell([r[key] for r in group], ".4f", ".4f")

  def gap_of(key, ceiling_key):  # in points
    return lambda group: cell([100 * (r[key] - r[ceiling_key]) for r in group], "+.2f", ".2f")

  columns = [("Acc_pl", mean_of("acc_pl")), ("Acc_pc", mean_of("acc_pc")),
             ("Acc_pl (no noise)", mean_of("noise_free_acc_pl")), ("Acc_pc (no noise)", mean_of("noise_free_acc_pc"))]
  if with_ceiling:
    columns.append(("Acc_pc − ceiling", gap_of("acc_pc", "ceiling")))
  if many:
    columns += [("Acc_pc, mean of students", mean_of("acc_pc_mean")),
                ("Acc_pc (no noise), mean", mean_of("noise_free_acc_pc_mean"))]
    if with_ceiling:
      columns.append(("mean − ceiling mean", gap_of("acc_pc_mean", "ceiling_mean")))
  column = "total eps" if args.sweep == "budget" else args.sweep
  lines += [f"| mechanism | {column} | " + " | ".join(name for name, _ in columns) + " |",
            "|---|---|" + "---|" * len(columns)]
  groups = {}
  for r in rows:
    groups.setdefault((r["mechanism"], r["value"]), []).append(r)
  order = {m: i for i, m in enumerate(dict.fromkeys(r["mechanism"] for r in rows))}  # first appearance
  for (mech, v) in sorted(groups, key=lambda g: (order[g[0]], g[1])):
    lines.append(f"| {mech} | {v:g} | " + " | ".join(f(groups[(mech, v)]) for _, f in columns) + " |")
  path.write_text("\n".join(lines) + "\n")


def plot(path, rows, args):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(6, 4))
  # With --student-seeds N the Acc_pc curves and the ceiling are means over the students.
  many = args.student_seeds > 1
  pc_key, nf_pc_key, ceiling_key = ("acc_pc_mean", "noise_free_acc_pc_mean", "ceiling_mean") if many else (
      "acc_pc", "noise_free_acc_pc", "ceiling")
  of = f" (mean of {args.student_seeds} students)" if many else ""
  if args.sweep == "budget":  # one colour per s: Acc_pc with noise (solid) and without (dashed)
    pc, nf_pc = aggregate(rows, pc_key), aggregate(rows, nf_pc_key)
    for i, mech in enumerate(dict.fromkeys(r["mechanism"] for r in rows)):
      xs = sorted(v for m, v in pc if m == mech)
      ax.errorbar(xs, [pc[(mech, x)][0] for x in xs], yerr=[pc[(mech, x)][1] for x in xs], fmt="s-", color=f"C{i}",
                  capsize=2, label=f"Acc_pc {mech}{of}")
      ax.plot(xs, [nf_pc[(mech, x)][0] for x in xs], "--", color=f"C{i}", label=f"Acc_pc no noise {mech}")
  else:
    for key, style in (("acc_pl", "o-"), (pc_key, "s-")):
      agg = aggregate(rows, key)
      for mech in sorted({g[0] for g in agg}):
        xs = sorted(v for m, v in agg if m == mech)
        ax.errorbar(xs, [agg[(mech, x)][0] for x in xs], yerr=[agg[(mech, x)][1] for x in xs], fmt=style,
                    capsize=2, label=f"{key.replace('acc_', 'Acc_').replace('_mean', '')} {mech}"
                    + (of if key == pc_key else ""))
    nf = aggregate(rows, "noise_free_acc_pl")
    mech0 = sorted({g[0] for g in nf})[0]
    xs = sorted(v for m, v in nf if m == mech0)
    ax.plot(xs, [nf[(mech0, x)][0] for x in xs], "k--", label="Acc_pl no noise")
  if any(r.get("ceiling") is not None for r in rows):
    ceiling = float(np.mean([r[ceiling_key] for r in rows]))
    ax.axhline(ceiling, color="k", lw=1, label="supervised ceiling" + (" (mean)" if many else ""))
    ax.axhline(ceiling - 0.03, color="k", lw=1, ls=":", label="ceiling - 3 points")
  if args.sweep in ("s", "eps-central", "eps-local", "budget"):
    ax.set_xscale("log")
  label = {"s": "number of queries s", "k": "k", "eps-central": "total epsilon (central)",
           "eps-local": "epsilon (local, s = |Y|, k = 1)", "budget": "total epsilon (central)"}[args.sweep]
  ax.set(xlabel=label, ylabel="accuracy", title=f"{args.dataset}: accuracy vs {args.sweep}")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


if __name__ == "__main__":
  sys.exit(main())
