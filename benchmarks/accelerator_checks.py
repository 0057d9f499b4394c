"""Does JAX's default device (a GPU or TPU) give the numbers XLA:CPU gives? Checks, not timings.

Two of the library's guarantees were measured on XLA:CPU only; this script
re-checks them on whatever ``jax.devices()[0]`` is, against the CPU backend
in the same process:

1. **Simulation is bitwise reproducible.** ``simulation.client_statistics``
   (the summed integer statistics of every client's messages) must be
   identical on the accelerator at several chunk sizes and on the CPU: each
   client's randomness is ``fold_in(key, i)`` (threefry) and the sums are
   integers, so nothing may depend on the backend or the chunking.
2. **A record's reverse k-NN row depends on its own features only** (the
   premise of the sensitivity 2kr in ``connection_privacy("reverse-knn")``).
   On the accelerator, each record's row must be the same bitwise when the
   other records are permuted, cut to a subset, or one of them replaced (a
   neighbouring data set). Against the CPU backend the rows may differ only
   at float32 near-ties (the two backends round the products differently);
   the script reports how many differ and the worst relative gap between
   the two choices' exact (float64) distances, and fails above
   ``bench_connection.TIE_GAP`` (1e-4).

Exit status 1 if a check fails. Usage:

  python benchmarks/accelerator_checks.py                        # random data
  JAXDISTILL_FASHION_MNIST=dir python benchmarks/accelerator_checks.py --fashion-mnist
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # check this checkout, not an installed copy
  sys.path.insert(0, str(ROOT))

from bench_connection import TIE_GAP, check_against_faiss, random_features  # pylint: disable=wrong-import-position
from jaxdistill import connection, data, mechanisms, simulation  # pylint: disable=wrong-import-position


def _same_tree(a, b) -> bool:
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(leaves_a) == len(leaves_b) and all(
      np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b))


def check_simulation(args, cpu) -> list[str]:
  failures = []
  shape = mechanisms.BsvsShape(args.buckets, args.labels, 1, 1)
  work = mechanisms.synthetic_workload(jax.random.key(1, impl="threefry2x32"), num_clients=args.clients,
                                       num_buckets=args.buckets, num_labels=args.labels, k=1)
  key = jax.random.key(2, impl="threefry2x32")
  print(f"\n## Simulation: client_statistics, n = {args.clients:,}, s = {args.buckets}, |Y| = {args.labels}")
  print("| mechanism | default device, chunk sizes | identical to each other | identical to CPU | seconds (CPU) |")
  print("|---|---|---|---|---|")
  for name in args.mechanisms.split(","):
    mech = simulation.build_mechanism(name, shape, epsilon=1.0, delta=1e-6, num_clients=args.clients)
    outs = [jax.device_get(simulation.client_statistics(key, mech, work, chunk_size=c))
            for c in args.chunk_sizes]
    t0 = time.perf_counter()
    ref = jax.device_get(simulation.client_statistics(key, mech, work, chunk_size=4096, devices=[cpu]))
    t_cpu = time.perf_counter() - t0
    same_chunks = all(_same_tree(outs[0], o) for o in outs[1:])
    same_cpu = _same_tree(outs[0], ref)
    print(f"| {name} | {', '.join(map(str, args.chunk_sizes))} | {same_chunks} | {same_cpu} | {t_cpu:.2f} |")
    if not (same_chunks and same_cpu):
      failures.append(f"simulation {name}: chunks identical {same_chunks}, CPU identical {same_cpu}")
  return failures


def _features(args, d, rng):
  if args.fashion_mnist:
    images = data.load_idx_dir(data.find_fashion_mnist(), "train").images.reshape(-1, 784)
    x, q = images[:args.n], images[-args.s:]
    if d < 784:  # a fixed random projection: real neighbourhood structure at a small d
      proj = rng.standard_normal((784, d)).astype(np.float32) / np.sqrt(784)
      x, q = x @ proj, q @ proj
    return np.ascontiguousarray(x, np.float32), np.ascontiguousarray(q, np.float32)
  return random_features(rng, args.n, args.s, d)


def check_reverse_knn(args, cpu) -> list[str]:
  failures = []
  rng = np.random.default_rng(0)
  src = "Fashion-MNIST (train images; d < 784 by a fixed random projection)" if args.fashion_mnist else "random"
  print(f"\n## Reverse k-NN rows, n = {args.n:,}, s = {args.s:,}, {src}")
  print("| d | k | block | permuted | subset | one record replaced | rows differing from CPU | worst gap there |")
  print("|---|---|---|---|---|---|---|---|")
  for d in args.d:
    x, q = _features(args, d, rng)
    perm = rng.permutation(args.n)
    inv = np.argsort(perm)
    sub = np.sort(rng.choice(args.n, size=args.n // 3 + 7, replace=False))  # not a multiple of any block
    x_nb = x.copy()
    x_nb[args.n // 2] = q[0] + 0.5 * (x[0] - q[0])  # replace one record by a point near query 0
    others = np.arange(args.n) != args.n // 2
    for k in args.k:
      for bs in args.block_sizes:
        def rknn(features, _k=k, _bs=bs):
          return np.asarray(connection.reverse_knn(features, q, _k, block_size=_bs))
        full = rknn(x)
        permuted = np.array_equal(rknn(x[perm])[inv], full)
        subset = np.array_equal(rknn(x[sub]), full[sub])
        neighbour = np.array_equal(rknn(x_nb)[others], full[others])
        with jax.default_device(cpu):
          on_cpu = rknn(x)
        rows = np.unique(np.nonzero(full != on_cpu)[0]).size
        _, gap = check_against_faiss(x, q, full, on_cpu)  # worst relative gap of the exact distances where they differ
        print(f"| {d} | {k} | {bs} | {permuted} | {subset} | {neighbour} | {rows} of {args.n:,} | {gap:.1e} |")
        if not (permuted and subset and neighbour):
          failures.append(f"reverse_knn d={d} k={k} block={bs}: a row depends on other records")
        if gap > TIE_GAP:
          failures.append(f"reverse_knn d={d} k={k} block={bs}: differs from CPU beyond float32 ties ({gap:.1e})")
  return failures


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=1_000_000)
  p.add_argument("--buckets", type=int, default=40)
  p.add_argument("--labels", type=int, default=10)
  p.add_argument("--mechanisms", default="rr,collision,shuffle-multi,shuffle-single,discrete-laplace")
  p.add_argument("--chunk-sizes", type=int, nargs="+", default=[1000, 4096, 65536])
  p.add_argument("--n", type=int, default=30_000, help="private records for the reverse k-NN checks")
  p.add_argument("--s", type=int, default=2_000, help="queries")
  p.add_argument("--d", type=int, nargs="+", default=[784, 64])
  p.add_argument("--k", type=int, nargs="+", default=[1, 10])
  p.add_argument("--block-sizes", type=int, nargs="+", default=[128, 1024])
  p.add_argument("--fashion-mnist", action="store_true", help="real images instead of random features")
  args = p.parse_args()
  cpu = jax.devices("cpu")[0]
  dev = jax.devices()[0]
  print(f"jax {jax.__version__}; default device {dev.platform} ({dev.device_kind}); against {cpu.device_kind}")
  if dev.platform == "cpu":
    print("The default device is the CPU: every check below compares the CPU with itself.")
  failures = check_simulation(args, cpu) + check_reverse_knn(args, cpu)
  print("\n" + ("FAILED:\n  " + "\n  ".join(failures) if failures else "All checks passed."))
  raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
  main()
