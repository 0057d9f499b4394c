"""``jaxdistill privacy ...``: NFDP and shuffle-amplification reports."""

from __future__ import annotations

import argparse

from jaxdistill import accounting
from jaxdistill.cli._common import count, print_json, print_table

def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("privacy", help="privacy reports (NFDP, shuffle amplification)")
  psub = p.add_subparsers(dest="privacy_command", required=True, parser_class=type(p))

  n = psub.add_parser("nfdp", help="exact privacy of NFDP sampling beside the paper's pair")
  n.add_argument("--n", type=count, required=True, help="records held by the party")
  n.add_argument("--k", type=count, required=True, help="sample size")
  n.add_argument("--with-replacement", action="store_true", help="Theorem 2 (default: Theorem 1, WOR)")
  n.add_argument("--relation", default="add-remove",
                 choices=[r.value for r in accounting.Relation], help="neighbouring relation")
  n.add_argument("--epsilon", type=float, default=None, help="exact delta at this epsilon (default: paper's)")
  n.add_argument("--rounds", type=count, default=1, help="rounds R the release spans")
  n.add_argument("--resample-each-round", action="store_true", help="fresh sample every round")
  n.add_argument("--json", action="store_true", help="print one JSON object")
  n.set_defaults(func=run_nfdp)

  r = psub.add_parser("nfdp-paper", help="NFDP table for the FedMD-NFDP paper's settings")
  r.add_argument("--json", action="store_true")
  r.set_defaults(func=run_nfdp_paper)

  s = psub.add_parser("shuffle", help="single-message shuffle amplification (FMT21)")
  s.add_argument("--n", type=count, required=True, help="number of shuffled messages")
  s.add_argument("--delta", type=float, required=True, help="central delta")
  g = s.add_mutually_exclusive_group(required=True)
  g.add_argument("--eps0", type=float, help="local epsilon -> central epsilon")
  g.add_argument("--target-epsilon", type=float, help="central epsilon -> largest local eps0")
  s.add_argument("--method", default="numeric", choices=["closed-form", "numeric"])
  s.add_argument("--releases", type=count, default=1,
                 help=f"T shuffled releases stated together (numeric; clone pair's PLD composed; "
                      f"at most {accounting.MAX_SHUFFLE_RELEASES})")
  s.add_argument("--json", action="store_true")
  s.set_defaults(func=run_shuffle)


def run_nfdp(args: argparse.Namespace) -> int:
  rep = accounting.nfdp_privacy(args.n, args.k, with_replacement=args.with_replacement,
                                relation=args.relation, rounds=args.rounds,
                                resample_each_round=args.resample_each_round)
  out = rep.to_dict(args.epsilon)
  if args.json:
    print_json(out)
    return 0
  print(f"NFDP sampling: n={rep.n}, k={rep.k}, {'with' if rep.with_replacement else 'without'} "
        f"replacement, relation={rep.relation.value}, rounds={rep.rounds}"
        f"{' (resampled each round)' if rep.resample_each_round else ''}")
  print_table(["quantity", "epsilon", "delta"], [
      ["paper (Thm 2)" if rep.with_replacement else "paper (Thm 1)", rep.paper_epsilon, rep.paper_delta],
      ["exact at asked epsilon", out["exact"]["epsilon"], out["exact"]["delta"]],
      ["exact, any epsilon >= 0", 0.0, rep.flat_delta],
      ["exact, delta below flat", float("inf"), "< " + f"{rep.flat_delta:.4g}"],
  ])
  print(f"1/n = {rep.one_over_n:.4g}; records exposed ~ {rep.records_exposed:.4g}")
  for w in rep.warnings:
    print(f"warning [{w.code}]: {w.message}")
  return 0


def run_nfdp_paper(args: argparse.Namespace) -> int:
  rows = accounting.nfdp_paper_rows()
  if args.json:
    print_json({"relation": "add-remove", "rows": rows})
    return 0
  print("FedMD-NFDP privacy at the paper's settings (relation add-remove; the exact profile is flat:")
  print("delta(eps) = exact delta for every eps >= 0, and eps = inf below it).")
  print_table(
      ["data", "N", "n/party", "k", "sampling", "paper eps", "paper delta", "exact delta", "1/n", "exposed"],
      [[r["dataset"], r["parties"], r["n"], r["k"], "WR" if r["with_replacement"] else "WOR",
        r["paper_epsilon"], r["paper_delta"], r["exact_flat_delta"], r["one_over_n"],
        r["records_exposed"]] for r in rows])
  exposed = sum("delta_at_least_1_over_n" in r["warnings"] for r in rows)
  print(f"{exposed} of {len(rows)} rows have delta >= 1/n: there each party's sampled records are exposed "
        "verbatim.")
  return 0


def run_shuffle(args: argparse.Namespace) -> int:
  if args.eps0 is not None:
    res = accounting.shuffle_epsilon(args.eps0, args.n, args.delta, method=args.method, releases=args.releases)
    out = {"direction": "local-to-central", **res.to_dict()}
  else:
    res = accounting.shuffle_local_epsilon(args.target_epsilon, args.n, args.delta, method=args.method,
                                           releases=args.releases)
    out = {"direction": "central-to-local", "target_epsilon": args.target_epsilon, **res.to_dict()}
  if args.json:
    print_json(out)
    return 0
  print(f"Shuffle amplification (single message, replace-one), method={res.method}")
  if res.releases == 1:
    print_table(["n", "local eps0", "central epsilon", "delta"], [[res.n, res.eps0, res.epsilon, res.delta]])
    return 0
  print(f"{res.releases} releases of n fresh messages each, stated together (adaptive ones included): the clone "
        "pair's PLD composed")
  print_table(["n", "releases", "local eps0", "central epsilon (all releases)", "delta"],
              [[res.n, res.releases, res.eps0, res.epsilon, res.delta]])
  return 0
