"""Reverse k-NN connection: jaxdistill vs faiss, scikit-learn and a float32 NumPy matmul of the same size.

Times, in one run on the same machine and data, the reverse k-NN connection
(each of n private records to its k nearest of s queries, exact L2):

* jaxdistill.connection.reverse_knn (jitted blockwise matmul with the queries on the leading
  axis, then k rounds of minima vectorised across the block's records, in two levels: the k best
  tiles of 32 queries by their minima, then the k best entries inside them),
* faiss IndexFlatL2 (exact), add + search,
* scikit-learn NearestNeighbors(algorithm="brute"), fit + kneighbors (it
  upcasts float32 chunks to float64 for its distance products),
* NumPy float32 matmul x @ q.T of the same size into a preallocated output
  (the FLOPs of the distance computation, with no selection),
* with ``--device-matmul``, the same product as a jitted ``jnp.matmul`` at
  ``precision=HIGHEST`` (as jaxdistill computes it) on JAX's default device,
  inputs already there and the output left there: the roofline on a GPU/TPU,

and prints each time and its ratio to faiss. It also checks that
jaxdistill's neighbours equal faiss's, up to ties: where the indices differ,
the two neighbours' exact (float64) distances must agree to ``TIE_GAP``
(1e-4) relative, the float32 rounding of an expanded distance at d = 784.

Usage (needs the ``bench`` extra: ``pip install '.[bench]'``):

  python benchmarks/bench_connection.py                      # 60k x 5k, d = 784 and 64, k = 1 and 10
  python benchmarks/bench_connection.py --n 6000 --s 500     # quick
  python benchmarks/bench_connection.py --block-size 128 1024 --device-matmul   # on a GPU
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # time this checkout, not an installed copy
  sys.path.insert(0, str(ROOT))

from jaxdistill import connection  # pylint: disable=wrong-import-position

#: Largest relative gap between the exact (float64) distances of two different neighbours that still counts as a
#: float32 tie. The expanded distance |x|^2 + |q|^2 - 2 x.q sums d products in float32, so its rounding can reach
#: about d 2^-24 (4.7e-5 at d = 784) of |x|^2 + |q|^2. Observed: at most 2e-6 against faiss on one CPU, 1.9e-5
#: between an H200 and the CPU backend (benchmarks/README.md).
TIE_GAP = 1e-4


@jax.jit
def device_matmul(x, q):
  """The distance FLOPs as jaxdistill computes them (float32, precision=HIGHEST), on the default device."""
  return jnp.matmul(x, q.T, precision=jax.lax.Precision.HIGHEST)


def random_features(rng, n, s, d):
  """float32 records ``[n, d]`` and queries ``[s, d]``: uniform (pixel-like) for d >= 256, else Gaussian."""
  if d >= 256:
    return rng.random((n, d), dtype=np.float32), rng.random((s, d), dtype=np.float32)
  return rng.standard_normal((n, d), dtype=np.float32), rng.standard_normal((s, d), dtype=np.float32)


def check_against_faiss(x, q, ours, theirs):
  """Fraction of identical neighbours, and the worst relative distance gap where they differ."""
  same = float(np.mean(ours == theirs))
  rows, cols = np.nonzero(ours != theirs)
  if rows.size == 0:
    return same, 0.0
  xr = x[rows].astype(np.float64)
  d_ours = np.sum((xr - q[ours[rows, cols]].astype(np.float64)) ** 2, axis=1)
  d_theirs = np.sum((xr - q[theirs[rows, cols]].astype(np.float64)) ** 2, axis=1)
  gap = np.abs(d_ours - d_theirs) / np.maximum(np.abs(d_theirs), 1e-12)
  return same, float(gap.max())


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=60_000, help="private records")
  p.add_argument("--s", type=int, default=5_000, help="queries")
  p.add_argument("--d", type=int, nargs="+", default=[784, 64])
  p.add_argument("--k", type=int, nargs="+", default=[1, 10])
  p.add_argument("--block-size", type=int, nargs="+", default=[128],
                 help="jaxdistill block sizes to time (the first is the default)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--skip-sklearn", action="store_true")
  p.add_argument("--device-matmul", action="store_true",
                 help="also time the float32 product on JAX's default device (the roofline on a GPU/TPU)")
  args = p.parse_args()

  import faiss  # pylint: disable=import-outside-toplevel
  from sklearn.neighbors import NearestNeighbors  # pylint: disable=import-outside-toplevel

  print(f"machine: {platform.machine()} {os.cpu_count()} CPUs | jax {jax.__version__} "
        f"{jax.devices()[0].platform} | faiss {faiss.__version__} threads={faiss.omp_get_max_threads()} "
        f"| numpy {np.__version__}")
  rng = np.random.default_rng(0)
  rows = []
  for d in args.d:
    x, q = random_features(rng, args.n, args.s, d)
    for k in args.k:
      def run_faiss():
        index = faiss.IndexFlatL2(d)
        index.add(q)
        return index.search(x, k)[1]

      def run_sklearn():
        return NearestNeighbors(n_neighbors=k, algorithm="brute").fit(q).kneighbors(
            x, return_distance=False)

      def run_jax(bs):
        return np.asarray(connection.reverse_knn(x, q, k, block_size=bs))

      product = np.empty((args.n, args.s), np.float32)  # allocated once: time the FLOPs, not the page faults

      def run_matmul():
        return np.matmul(x, q.T, out=product)

      x_dev, q_dev = (jax.device_put(x), jax.device_put(q)) if args.device_matmul else (None, None)

      def run_device_matmul():
        return device_matmul(x_dev, q_dev).block_until_ready()

      t_compile = {}
      for bs in args.block_size:
        t0 = time.perf_counter()
        run_jax(bs)  # compile
        t_compile[bs] = time.perf_counter() - t0
      # Interleaved repeats: on a shared machine every contender sees the same load.
      if args.device_matmul:
        run_device_matmul()  # compile
      times = {name: [] for name in ["faiss", "sklearn", "matmul", "device_matmul"] + list(args.block_size)}
      outs = {}
      for _ in range(args.repeats):
        for name, fn in [("faiss", run_faiss), ("matmul", run_matmul)] + (
            [] if args.skip_sklearn else [("sklearn", run_sklearn)]) + (
            [("device_matmul", run_device_matmul)] if args.device_matmul else []) + [
                (bs, functools.partial(run_jax, bs)) for bs in args.block_size]:
          t0 = time.perf_counter()
          outs[name] = fn()
          times[name].append(time.perf_counter() - t0)
      best = {name: (min(v) if v else float("nan")) for name, v in times.items()}
      for bs in args.block_size:
        same, gap = check_against_faiss(x, q, outs[bs], outs["faiss"])
        rows.append((d, k, bs, best[bs], t_compile[bs], best["faiss"], best["sklearn"], best["matmul"],
                     same, gap, best["device_matmul"]))
        print(f"d={d:4d} k={k:3d} block={bs:5d}: jaxdistill {best[bs]:6.2f} s (first call "
              f"{t_compile[bs]:.2f} s) | faiss {best['faiss']:6.2f} s | sklearn {best['sklearn']:6.2f} s | "
              f"numpy matmul {best['matmul']:6.2f} s | same as faiss {same:.5f}, worst gap {gap:.1e}",
              flush=True)
      outs = product = x_dev = q_dev = None  # free the [n, s] buffers before the next (d, k)

  print(f"\nn = {args.n} records, s = {args.s} queries, best of {args.repeats} interleaved runs; "
        "ratios are time / faiss time (lower is faster).\n")
  dev = f"{jax.devices()[0].platform} matmul" if args.device_matmul else ""
  print("| d | k | block | jaxdistill (s) | faiss (s) | sklearn brute (s) | NumPy matmul (s) | "
        + (f"{dev} (s) | " if dev else "")
        + "jaxdistill / faiss | sklearn / faiss | matmul / faiss | jaxdistill / matmul | "
        + (f"jaxdistill / {dev} | " if dev else "") + "same as faiss |")
  print("|---" * (12 + 2 * bool(dev)) + "|")
  for d, k, bs, t_jax, _, t_faiss, t_sk, t_mm, same, gap, t_dev in rows:
    print(f"| {d} | {k} | {bs} | {t_jax:.3g} | {t_faiss:.3g} | {t_sk:.3g} | {t_mm:.3g} | "
          + (f"{t_dev:.3g} | " if dev else "")
          + f"{t_jax / t_faiss:.2f} | {t_sk / t_faiss:.2f} | {t_mm / t_faiss:.2f} | {t_jax / t_mm:.2f} | "
          + (f"{t_jax / t_dev:.1f} | " if dev else "")
          + f"{same:.5f} (ties: gap {gap:.0e}) |")
  bad = [r for r in rows if r[9] > TIE_GAP]
  if bad:
    raise SystemExit(f"jaxdistill disagrees with faiss beyond float32 ties: {bad}")


if __name__ == "__main__":
  jnp.zeros(1).block_until_ready()
  main()
