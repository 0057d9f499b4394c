"""Cluster purity and noise-free reverse-1-NN label accuracy per representation and s.

For each representation (fitted on D_pub only) and each number of queries s:

* purity: k-means (jaxdistill.connection.select_queries) clusters D_pub into
  s clusters; purity = sum over clusters of the majority true-label count,
  divided by |D_pub| (the labels are used for evaluation only);
* Acc_pl: every private record votes with its true label for its nearest
  query (reverse 1-NN, no noise); each query takes the argmax label; every
  public sample inherits its cluster's query label; Acc_pl = fraction of
  D_pub labelled correctly (the issue's reference: PCA-50 gives about 0.69
  at s = 40 and 0.77 at s = 200);
* query acc: fraction of queries whose voted label is their own true label.

Mean (and standard deviation) over k-means seeds. Data: Fashion-MNIST with
the paper's protocol (D_priv = 60k training images, D_pub = 5k test images).

Usage:
  python benchmarks/representation_quality.py                    # Fashion-MNIST
  python benchmarks/representation_quality.py --dataset mnist-embedded --s 10 40
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # measure this checkout, not an installed copy
  sys.path.insert(0, str(ROOT))

from jaxdistill import connection, data, representations  # pylint: disable=wrong-import-position


def noise_free_labeling(public_feats, private_feats, private_labels, public_labels, selection,
                        num_labels):
  """(purity, Acc_pl, query accuracy) of one query selection, reverse 1-NN votes without noise."""
  s = selection.num_queries
  a = selection.assignment
  purity = sum(np.bincount(public_labels[a == t]).max() for t in range(s)) / len(public_labels)
  buckets = np.asarray(connection.reverse_knn(private_feats, public_feats[selection.query_indices], 1))
  votes = np.zeros((s, num_labels), np.int64)
  np.add.at(votes, (buckets[:, 0], private_labels), 1)
  query_label = votes.argmax(axis=1)
  acc_pl = float(np.mean(query_label[a] == public_labels))
  query_acc = float(np.mean(query_label == public_labels[selection.query_indices]))
  return float(purity), acc_pl, query_acc


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--dataset", default="fashion-mnist")
  p.add_argument("--data-dir", default=None)
  p.add_argument("--representations", nargs="+", default=list(representations.REPRESENTATIONS))
  p.add_argument("--s", nargs="+", type=int, default=[40, 100, 200, 500])
  p.add_argument("--seeds", type=int, default=3, help="k-means seeds per (representation, s)")
  p.add_argument("--steps", type=int, default=None, help="contrastive training steps (default: config)")
  p.add_argument("--public-size", type=int, default=None,
                 help="|D_pub| (default: 5000 test images; 2000 for a set without a test split)")
  args = p.parse_args()

  train, test = data.load_dataset(args.dataset, args.data_dir)
  eval_size = 5000 if test is not None else 500
  public_size = args.public_size or (5000 if test is not None else 2000)
  splits = data.paper_splits(train, test, seed=0, public_size=public_size, eval_size=eval_size)
  print(f"dataset={args.dataset} |D_priv|={len(splits.private)} |D_pub|={len(splits.public)} "
        f"devices={jax.devices()}")
  key = jax.random.key(0)
  rows = []
  for name in args.representations:
    opts = {"steps": args.steps} if (name == "contrastive" and args.steps) else {}
    t0 = time.perf_counter()
    rep = representations.fit_representation(key, name, splits, **opts)  # reads splits.public only
    jax.block_until_ready(rep)  # its parameters may still be computing (asynchronous dispatch)
    fit_s = time.perf_counter() - t0  # includes compilation
    t0 = time.perf_counter()
    fpub = np.asarray(rep(splits.public.images))
    fpriv = np.asarray(rep(splits.private.images))
    embed_s = time.perf_counter() - t0
    for s in args.s:
      res = []
      for seed in range(args.seeds):
        sel = connection.select_queries(jax.random.fold_in(key, seed), fpub, s)
        res.append(noise_free_labeling(fpub, fpriv, splits.private.labels, splits.public.labels, sel,
                                       splits.public.num_classes))
      res = np.asarray(res)
      rows.append((rep.name, fpub.shape[1], s, res.mean(0), res.std(0), fit_s, embed_s))
      print(f"  {rep.name:12s} d={fpub.shape[1]:5d} s={s:4d} purity={res[:, 0].mean():.4f} "
            f"Acc_pl={res[:, 1].mean():.4f} query_acc={res[:, 2].mean():.4f} "
            f"(fit {fit_s:.1f} s, embed {embed_s:.1f} s)", flush=True)

  print("\n| representation | d | s | purity | Acc_pl (reverse 1-NN, no noise) | query label acc | "
        "fit time (s) |")
  print("|---|---|---|---|---|---|---|")
  for name, d, s, mean, std, fit_s, _ in rows:
    print(f"| {name} | {d} | {s} | {mean[0]:.3f} ± {std[0]:.3f} | {mean[1]:.3f} ± {std[1]:.3f} | "
          f"{mean[2]:.3f} ± {std[2]:.3f} | {fit_s:.1f} |")


if __name__ == "__main__":
  main()
