"""FedMD-NFDP accuracy table (like Table 2 of Sun & Lyu 2021) with each row's privacy profile.

Sweeps, in one process (compiled steps and public pre-training are shared
between runs):

* NFDP against k (3, 16, 64) and sampling (WOR, WR) at N = 10, IID, argmax;
* NFDP against N (5, 10) at k = 16;
* release modes argmax / softmax / logits at N = 10, k = 16;
* IID and non-IID partitions (FedMD-style class subsets: each party holds 2
  of the 6 private classes; Dirichlet splits can leave a party with fewer
  than k records, which WOR sampling cannot serve);
* baselines FedMD-NP, centralized, local (all data), local (k-sample) and
  FedMD-LDP (Gaussian, eps = 1 at NFDP's delta p = k/n for the nominal party
  size n = private records / N, one public delta for every party), IID and
  non-IID.

Writes ``table.md``, ``table.csv``, ``summary.json``, ``accuracy_vs_k.png``, and
for the main row (NFDP, N = 10, IID, k = 16, WOR, argmax) ``ldp_sigma.csv`` and
``accuracy_per_round.png``, into ``--out`` (default ``results/fedmd``).

    python scripts/fedmd_table.py                 # the reduced CPU settings below (~40 min on 2 cores)
    python scripts/fedmd_table.py --quick         # smoke test (a few minutes on 2 cores: compiling dominates)
    python scripts/fedmd_table.py --rounds 20 --public-subset 5000 --width-multiplier 1   # paper-sized (GPU)
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # this checkout's jaxdistill

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxdistill import accounting, fedmd  # noqa: E402


def profile(res: fedmd.FedMDResult) -> str:
  """One-line privacy profile of party 0."""
  p = res.privacy[0]
  m = res.config.method
  if m in ("nfdp", "local-sample"):
    d = p["exact"]["delta_for_every_epsilon"]
    paper = p["paper"]
    return (f"flat: delta(eps)={d:.3g} for all eps>=0 (paper ({paper['epsilon']:.3g}, {paper['delta']:.3g})); "
            f"{p['records_exposed']:.3g} records exposed, 1/n={p['one_over_n']:.2g}")
  if m == "ldp":
    return (f"Gaussian sigma={p['sigma']:.3g} per release, T={p['count']}: "
            f"({p['calibrated_to']['epsilon']:g}, {p['calibrated_to']['delta']:.3g})-DP releases; model not private")
  return "none"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="results/fedmd")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--public-subset", type=int, default=1000)
  ap.add_argument("--width-multiplier", type=float, default=0.125)
  ap.add_argument("--private-per-class", type=int, default=500)
  ap.add_argument("--test-per-class", type=int, default=500)
  ap.add_argument("--pretrain-epochs", type=int, default=1)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--quick", action="store_true", help="tiny smoke test")
  a = ap.parse_args()
  if a.quick:  # it sets these itself: given beside it they were silently overridden
    quick = {"rounds": 1, "public_subset": 64, "private_per_class": 40, "test_per_class": 20,
             "width_multiplier": 0.0625}
    given = [f"--{k.replace('_', '-')}" for k in quick if getattr(a, k) != ap.get_default(k)]
    if given:
      ap.error(f"--quick sets {', '.join(given)} itself; drop them or --quick.")
    for k, v in quick.items():
      setattr(a, k, v)
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  base = dict(rounds=a.rounds, width_multiplier=a.width_multiplier, pretrain_epochs=a.pretrain_epochs)
  if a.quick:
    base.update(init_epochs=2)
  datasets: dict[tuple[int, str], fedmd.FedMDData] = {}

  def data(n_parties: int, partition: str) -> fedmd.FedMDData:
    if (n_parties, partition) not in datasets:
      datasets[(n_parties, partition)] = fedmd.load_fedmd_data(
          num_parties=n_parties, seed=a.seed, private_per_class=a.private_per_class,
          test_per_class=a.test_per_class, partition=partition, classes_per_party=2)
    return datasets[(n_parties, partition)]

  ks = (3, 16) if a.quick else (3, 16, 64)
  plan = []  # (group, N, partition, config kwargs)
  for wr in (False, True):
    for k in ks:
      plan.append(("k and sampling", 10, "iid", dict(method="nfdp", k=k, with_replacement=wr)))
  for wr in (False, True):
    plan.append(("number of parties", 5, "iid", dict(method="nfdp", k=16, with_replacement=wr)))
  for mode in ("softmax", "logits"):
    plan.append(("release mode", 10, "iid", dict(method="nfdp", k=16, aggregation=mode)))
  for part in ("iid", "classes"):
    if part == "classes":
      plan.append(("non-IID", 10, part, dict(method="nfdp", k=16)))
      plan.append(("non-IID", 10, part, dict(method="nfdp", k=3)))
    for method in ("np", "ldp", "local", "local-sample"):
      plan.append((f"baselines {part}", 10, part, dict(method=method, k=16, ldp_epsilon=1.0)))
  plan.append(("baselines iid", 5, "iid", dict(method="np", k=16)))
  plan.append(("baselines iid", 5, "iid", dict(method="local", k=16)))
  plan.append(("baselines iid", 10, "iid", dict(method="centralized", k=16, private_batch_size=32)))

  rows, results, t_all = [], [], time.perf_counter()
  key = jax.random.key(a.seed)
  for i, (group, n_parties, part, kw) in enumerate(plan):
    d = data(n_parties, part)
    if kw.get("method") == "ldp":  # one public delta: NFDP's p at the nominal size, not each party's own n_i
      nominal = sum(d.party_sizes) // n_parties
      kw = dict(kw, ldp_delta=accounting.nfdp_inclusion_probability(nominal, kw["k"]))
    if kw["method"] in ("nfdp", "np", "ldp"):  # only the methods that collaborate query the public set
      kw = dict(kw, public_subset=a.public_subset)
    cfg = fedmd.FedMDConfig(num_parties=n_parties, **base, **kw)
    t = time.perf_counter()
    # The sigma table is the same for every NFDP row of one (n, k): compute it for the main row only.
    main_row = (kw.get("method") == "nfdp" and n_parties == 10 and part == "iid" and kw.get("k") == 16
                and kw.get("aggregation", "argmax") == "argmax" and not kw.get("with_replacement"))
    eps = None if main_row else ()
    res = fedmd.run_fedmd(key, cfg, d, ldp_table_epsilons=eps)
    secs = time.perf_counter() - t
    acc = res.final_accuracy
    row = {"group": group, "method": cfg.method, "N": n_parties, "n_per_party": int(np.mean(d.party_sizes)),
           "partition": part, "k": cfg.k if cfg.method in ("nfdp", "local-sample", "ldp") else "",
           "sampling": ("WR" if cfg.with_replacement else "WOR") if cfg.method in ("nfdp", "local-sample") else "",
           "aggregation": cfg.aggregation if cfg.collaborates else "",
           "acc_mean": float(acc.mean()), "acc_min": float(acc.min()), "acc_max": float(acc.max()),
           "acc_round0_mean": float(res.accuracy[0].mean()),
           "acc6_mean": float(res.accuracy_private[-1].mean()),
           "privacy": profile(res), "seconds": secs}
    rows.append(row)
    results.append(res)
    print(f"[{i + 1}/{len(plan)}] {group:18s} {cfg.method:12s} N={n_parties:2d} {part:9s} k={row['k']!s:3s} "
          f"{row['sampling']:3s} {row['aggregation']:7s} acc={row['acc_mean']:.3f} "
          f"({row['acc_min']:.3f}-{row['acc_max']:.3f}) 6-way={row['acc6_mean']:.3f} {secs:.0f}s", flush=True)
    if res.ldp_sigma_table and res.ldp_sigma_table["rows"]:
      with open(out / "ldp_sigma.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epsilon", "delta", "sigma_per_release", "log10_sigma", "sigma_effective", "releases_T",
                    "sensitivity", "method", "analytic_delta_at_sigma"])
        for r in res.ldp_sigma_table["rows"]:
          w.writerow([r["epsilon"], f"{r['delta']:.6g}", f"{r['sigma']:.6g}", f"{r['log10_sigma']:.3f}",
                      f"{r['sigma_effective']:.6g}", r["count"], f"{r['sensitivity']:.6g}", r["method"],
                      f"{r['analytic_delta']:.6g}"])
      (out / "ldp_sigma_matched_to.txt").write_text(res.ldp_sigma_table["matched_to"] + "\n")
      fedmd.plot_accuracy_per_round(res, out / "accuracy_per_round.png")
  total = time.perf_counter() - t_all

  with open(out / "table.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    for r in rows:
      w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
  nfdp_k = [r for r, row in zip(results, rows) if row["group"] == "k and sampling"]
  base_lines = {f"{row['method']} (N=10, iid)": row["acc_mean"] for row in rows
                if row["group"] == "baselines iid" and row["N"] == 10 and row["method"] in ("np", "centralized",
                                                                                           "local")}
  fedmd.plot_accuracy_vs_k(nfdp_k, out / "accuracy_vs_k.png", baselines=base_lines)
  cmd = "python scripts/fedmd_table.py " + " ".join(sys.argv[1:])
  lines = [
      "# FedMD-NFDP: accuracy against N, k, sampling, release mode and partition, with privacy profiles", "",
      f"Command: `{cmd.strip()}` (backend {jax.default_backend()}, total {total / 60:.1f} min).", "",
      (f"Settings: public = 5,000 embedded MNIST digits (pre-training {a.pretrain_epochs} epoch(s) on their labels), "
       f"private = Fashion-MNIST classes 0-5 ({a.private_per_class}/class, labels 10-15 of 16 outputs), "
       f"test = {a.test_per_class}/class; FedMD's ten CNNs at width x{base['width_multiplier']}; "
       f"R = {a.rounds} rounds, public subset {a.public_subset}/round, "
       f"T1/T2/T3 = {base.get('init_epochs', 20)}/2/1 epochs, Adam 1e-3, "
       f"seed {a.seed}. Accuracy: final test accuracy of each party's model, argmax over all 16 outputs as in "
       "FedMD, mean (min-max over parties); '6-way' restricts the argmax to the 6 private classes; "
       "'round 0' is before collaboration. Private batch size 5 (FedMD's), 32 for the centralized row "
       "(pooled data). Privacy: party 0, relation add/remove."), "",
      ("| group | method | N | n/party | partition | k | sampling | release | accuracy mean (min-max) "
       "| 6-way mean | round-0 mean | privacy profile |"),
      "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(f"| {r['group']} | {r['method']} | {r['N']} | {r['n_per_party']} | {r['partition']} | "
                 f"{r['k']} | {r['sampling']} | {r['aggregation']} | {r['acc_mean']:.3f} "
                 f"({r['acc_min']:.3f}-{r['acc_max']:.3f}) | {r['acc6_mean']:.3f} | {r['acc_round0_mean']:.3f} | "
                 f"{r['privacy']} |")
  (out / "table.md").write_text("\n".join(lines) + "\n")
  (out / "summary.json").write_text(json.dumps({"command": cmd.strip(), "total_seconds": total,
                                                "settings": vars(a), "rows": rows}, indent=1))
  print(f"wrote {out}/table.md ({total / 60:.1f} min)")


if __name__ == "__main__":
  main()
