"""Same-architecture FedMD parties: one vmapped batch (stacked parameters) versus a loop.

Runs the same FedMD-NFDP configuration twice per mode -- the first run
compiles, the second is timed -- with N parties that all share one
architecture, and prints per-phase wall times and loop/vmap ratios measured
in the same process (ratios > 1 mean vmap is faster).

    python benchmarks/fedmd_vmap.py                       # defaults below
    python benchmarks/fedmd_vmap.py --parties 10 --width-multiplier 0.125 --public-subset 1000

Synthetic 28x28 data (the real image shape; smaller sets, fewer rounds and epochs than the real run:
1,000 public images, 100 private images per class, 300 test images (50 for each of the 6 private classes),
R = 2), so it needs no data set.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # this checkout's jaxdistill

import jax
import numpy as np

from jaxdistill import fedmd
from jaxdistill.data import ImageData
from jaxdistill.models import FEDMD_SPECS, parse_spec


def synthetic(n: int, classes: int, seed: int) -> ImageData:
  rng = np.random.default_rng(seed)
  return ImageData(rng.random((n, 28, 28, 1), dtype=np.float32), rng.integers(0, classes, n).astype(np.int32),
                   classes, f"synthetic{seed}")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--parties", type=int, default=10)
  p.add_argument("--spec", default=None, help="architecture (default: FedMD's first, 128,256:0.2)")
  p.add_argument("--width-multiplier", type=float, default=0.125)
  p.add_argument("--k", type=int, default=16)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--public-subset", type=int, default=1000)
  p.add_argument("--per-class", type=int, default=100)
  p.add_argument("--json", action="store_true")
  a = p.parse_args()
  spec = parse_spec(a.spec) if a.spec else FEDMD_SPECS[0]
  data = fedmd.make_fedmd_data(synthetic(a.public_subset, 10, 0), synthetic(20 * a.per_class, 10, 1),
                               synthetic(1000, 10, 2), num_parties=a.parties, seed=0,
                               private_per_class=a.per_class, test_per_class=50)  # a pool of 1,000: 50 per class
  rows = {}
  for mode in ("on", "off"):
    cfg = fedmd.FedMDConfig(num_parties=a.parties, specs=(spec,), width_multiplier=a.width_multiplier, k=a.k,
                            rounds=a.rounds, public_subset=a.public_subset, pretrain_epochs=1, init_epochs=5,
                            vmap=mode)
    t = time.perf_counter()
    fedmd.run_fedmd(jax.random.key(0), cfg, data, ldp_table_epsilons=())
    first = time.perf_counter() - t
    res = fedmd.run_fedmd(jax.random.key(1), cfg, data, ldp_table_epsilons=())
    tm = {k: v for k, v in res.timings.items() if isinstance(v, float)}
    tm["first_run_incl_compile"] = first
    rows[mode] = tm
  phases = ["pretrain", "init_train", "predict", "digest", "revisit", "evaluate", "total_this_session",
            "first_run_incl_compile"]
  out = {"backend": jax.default_backend(), "parties": a.parties, "spec": spec.scaled(a.width_multiplier).name,
         "k": a.k, "rounds": a.rounds, "public_subset": a.public_subset,
         "seconds": {m: {ph: rows[m][ph] for ph in phases} for m in rows},
         "loop_over_vmap": {ph: rows["off"][ph] / max(rows["on"][ph], 1e-9) for ph in phases}}
  if a.json:
    print(json.dumps(out))
    return
  print(f"backend={out['backend']} N={a.parties} same architecture {out['spec']} k={a.k} R={a.rounds} "
        f"public subset={a.public_subset}")
  print(f"{'phase':26s} {'vmap (s)':>10s} {'loop (s)':>10s} {'loop/vmap':>10s}")
  for ph in phases:
    print(f"{ph:26s} {rows['on'][ph]:10.2f} {rows['off'][ph]:10.2f} {out['loop_over_vmap'][ph]:10.2f}")


if __name__ == "__main__":
  main()
