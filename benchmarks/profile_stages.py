"""Where the time goes: reverse k-NN by stage, and the mechanisms' simulation by chunk size.

Two questions the GPU tables in ``benchmarks/README.md`` left open, answered
on whatever backend JAX runs on:

1. ``connection.reverse_knn`` took 15x to 42x the bare float32 product on an
   H200. This times its stages separately at 60,000 records x 5,000 queries:
   the input checks (conversion, copy to the device, the finiteness and
   overflow reduction), the queries' off-centre precision check (a float64
   measurement on the host), the jitted blockwise kernel with its inputs
   already on the device, the copy of the result to the host, and the bare
   product (``precision=HIGHEST``) as the roofline. Features are uniform
   in [0, 1) at every d (``bench_connection.py`` uses Gaussian features
   below d = 256; the recorded GPU table was made with these).
2. The multi-message shuffle was slower on that GPU than on 2 CPU cores at
   the benchmark's chunk of 4,096 clients. This times
   ``simulation.client_statistics`` for randomized response, Collision and
   the multi-message shuffle at 10^6 clients and several chunk sizes, then
   at the library's default (``simulation.default_chunk_size``), and
   checks that every chunk size gives bitwise the same statistics (as the
   runner promises).

Every time is the best of ``--repeats`` runs after one compiling run, whose
time is printed separately.

Usage:

  python benchmarks/profile_stages.py                       # both parts, the sizes above
  python benchmarks/profile_stages.py --n 6000 --s 500 --clients 100000   # quick
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # time this checkout, not an installed copy
  sys.path.insert(0, str(ROOT))

# pylint: disable=wrong-import-position
from jaxdistill import connection, mechanisms, simulation
from jaxdistill.connection import _common, _distances


def timed(fn, repeats):
  """``(first call's seconds, best of the next repeats)``; fn must block until its result is ready."""
  start = time.perf_counter()
  fn()
  first = time.perf_counter() - start
  best = np.inf
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return first, best


@jax.jit
def device_matmul(x, q):
  return jnp.matmul(x, q.T, precision=jax.lax.Precision.HIGHEST)


def connection_stages(args):
  rng = np.random.default_rng(0)
  print(f"\n== reverse k-NN by stage: n = {args.n}, s = {args.s}, block {args.block_size}, "
        f"backend {jax.default_backend()} ==")
  print("| d | k | whole call | input checks (x and q) | off-centre check (q) | kernel, inputs on device | "
        "result to host | bare product | kernel / product | whole / product |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for d in args.d:
    x = rng.random((args.n, d), dtype=np.float32)
    q = rng.random((args.s, d), dtype=np.float32)
    xd = _common.as_features("x", x)
    qd = _common.as_features("q", q)
    for k in args.k:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = timed(lambda: np.asarray(connection.reverse_knn(x, q, k, block_size=args.block_size)),
                      args.repeats)
        checks = timed(lambda: (_common.as_features("q", q), _common.as_features("x", x))[1].block_until_ready(),
                       args.repeats)
        centre = timed(lambda: _common.warn_if_off_centre("q", qd), args.repeats)
      kern = timed(lambda: _distances.nearest_columns(xd, qd, k, args.block_size)[0].block_until_ready(),
                   args.repeats)
      idx = _distances.nearest_columns(xd, qd, k, args.block_size)[0].block_until_ready()
      fetch = timed(lambda: np.asarray(idx + 0), args.repeats)  # a new array each time: no cached host copy
      prod = timed(lambda: device_matmul(xd, qd).block_until_ready(), args.repeats)
      print(f"| {d} | {k} | {whole[1]:.4f} (first {whole[0]:.2f}) | {checks[1]:.4f} | {centre[1]:.4f} | "
            f"{kern[1]:.4f} (first {kern[0]:.2f}) | {fetch[1]:.4f} | {prod[1]:.4f} | "
            f"{kern[1] / prod[1]:.1f} | {whole[1] / prod[1]:.1f} |", flush=True)


def mechanism_chunks(args):
  shape = mechanisms.BsvsShape(args.buckets, args.labels, 1)
  clients = mechanisms.synthetic_workload(jax.random.key(args.seed), num_clients=args.clients,
                                          num_buckets=args.buckets, num_labels=args.labels, k=1)
  print(f"\n== client_statistics by chunk size: n = {args.clients}, s = {args.buckets}, |Y| = {args.labels}, "
        f"k = 1, eps = 1 (shuffle delta 1e-6), backend {jax.default_backend()} ==")
  print("| mechanism | chunk | seconds, best of repeats | first run (compile) | same statistics as the first chunk |")
  print("|---|---|---|---|---|")
  for name in args.mechanisms:
    mech = simulation.build_mechanism(name, shape, epsilon=1.0, delta=1e-6, num_clients=args.clients)
    reference = None
    for chunk in [*args.chunk_sizes, None]:  # None: the library's default_chunk_size
      def run(chunk=chunk):
        return jax.block_until_ready(simulation.client_statistics(jax.random.key(7), mech, clients,
                                                                  chunk_size=chunk))
      first, best = timed(run, args.repeats)
      stats = np.asarray(jax.tree_util.tree_leaves(run())[0])
      if reference is None:
        reference = stats
      same = "yes" if np.array_equal(stats, reference) else "NO"
      label = chunk if chunk is not None else f"default ({simulation.default_chunk_size(mech, clients)})"
      print(f"| {name} | {label} | {best:.4f} | {first:.2f} | {same} |", flush=True)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--part", choices=["both", "connection", "mechanisms"], default="both")
  p.add_argument("--n", type=int, default=60_000)
  p.add_argument("--s", type=int, default=5_000)
  p.add_argument("--d", type=int, nargs="+", default=[784, 64])
  p.add_argument("--k", type=int, nargs="+", default=[1, 10])
  p.add_argument("--block-size", type=int, default=128)
  p.add_argument("--clients", type=int, default=1_000_000)
  p.add_argument("--buckets", type=int, default=40)
  p.add_argument("--labels", type=int, default=10)
  p.add_argument("--mechanisms", nargs="+", default=["shuffle-multi", "rr", "collision"])
  p.add_argument("--chunk-sizes", type=int, nargs="+", default=[4096, 16384, 65536, 262144])
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args()
  print(f"jax {jax.__version__}, devices {jax.devices()}")
  if args.part in ("both", "mechanisms"):
    mechanism_chunks(args)
  if args.part in ("both", "connection"):
    connection_stages(args)


if __name__ == "__main__":
  main()
