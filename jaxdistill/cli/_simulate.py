"""``jaxdistill simulate ...``: run a BSVS mechanism over a synthetic workload.

Draws a realistic workload (:func:`jaxdistill.mechanisms.synthetic_workload`,
generated chunk by chunk so memory does not grow with n), runs the mechanism
with :func:`jaxdistill.simulation.simulate` (which also sums the true A in the
same pass), and prints the estimate's error beside its closed-form
prediction, the privacy statement, wall time and peak memory.

Working memory grows with ``--chunk-size`` times d = s|Y|: measured at about
9 bytes x chunk x d for ``rr`` and ``collision`` on CPU (JAX 0.10.2; d = 5e4
and 1e5, chunks 512 to 4096), a rule of thumb rather than a promise. An
out-of-memory error says to lower ``--chunk-size``. Its default,
:func:`jaxdistill.simulation.default_chunk_size`, is 4,096 on CPU and, on a
GPU or TPU, the largest power of two that keeps chunk x width within 2^25
values, clipped to [4,096, 2^18] (width: the values one client holds at once,
``mechanism.chunk_width()`` plus the workload's; see that function).
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import numpy as np
from scipy import stats as sps

from jaxdistill import _keys, _validate
from jaxdistill import mechanisms
from jaxdistill import simulation
from jaxdistill.cli._common import count, print_json, print_table

#: Probability that the printed max-error bound is exceeded.
MAX_ERROR_BETA = 0.05


def add_parser(sub: argparse._SubParsersAction) -> None:
  names = simulation.mechanism_names()
  p = sub.add_parser("simulate", help="simulate a BSVS mechanism over many clients",
                     description="Run a BSVS mechanism over a synthetic workload; print the error "
                                 "beside its closed-form prediction, the privacy statement, wall "
                                 "time and peak memory. Mechanisms: " + ", ".join(
                                     f"{s.name} ({s.summary})" for s in map(
                                         simulation.mechanism_spec, names)))
  p.add_argument("--mechanism", required=True, choices=names, help="mechanism name")
  p.add_argument("--clients", type=count, required=True, help="number of clients n (1e6 is fine)")
  p.add_argument("--buckets", type=count, required=True, help="number of buckets s")
  p.add_argument("--labels", type=count, required=True, help="number of labels |Y|")
  p.add_argument("--k", type=count, required=True, help="buckets per client")
  p.add_argument("--r", type=count, default=1, help="labels per client (default 1)")
  p.add_argument("--epsilon", type=float, required=True, help="epsilon (local for local mechanisms)")
  p.add_argument("--delta", type=float, default=None, help="delta (shuffle mechanisms)")
  p.add_argument("--seed", type=count, default=0, help="PRNG seed (default 0)")
  p.add_argument("--chunk-size", type=count, default=None,
                 help="clients per vmapped chunk (default: at most 4096 on CPU, evened out over the chunks; larger "
                      "on a GPU or TPU, see simulation.default_chunk_size); working memory grows with it, measured at about 9 bytes x "
                      "chunk x s|Y| for rr and collision on CPU (lower it if out of memory)")
  p.add_argument("--devices", type=count, default=None, help="devices to shard over (default all)")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.set_defaults(func=run_simulate)


NOTE = ("synthetic workload; the noise is derived from --seed, so this is a reproducible simulation, not a "
        "private release (for one, pass the key jaxdistill.simulation.secret_key() to simulate())")


def max_error_prediction(mech: Any, counts: np.ndarray, n: int,
                         beta: float = MAX_ERROR_BETA) -> tuple[float, str]:
  """A level-(1 - beta) bound on max |error| over all s|Y| entries, and how it was obtained.

  A mechanism may provide ``max_error_bound(beta, counts, num_clients)``
  returning a bound that holds with probability >= 1 - beta, or ``None``
  (central Laplace and discrete Laplace: Proposition 1 over all entries; the
  multi-message shuffle: its exact discrete-Laplace error; randomized response,
  also inside ``shuffle-single``: a Chernoff bound on each entry's binomial
  error, valid for any counts; ``collision``, also inside ``shuffle-single``:
  Bernstein's inequality per entry; ``separation``, ``concatenation`` and
  ``concatenation-literal``: Bernstein's inequality on their bounded
  per-client terms), named by its ``max_error_method`` (default
  ``exact-tail-union``). Otherwise (the multi-message shuffle with m != n
  clients) each entry's error is taken as normal with its closed-form
  variance and a union bound over the d entries gives
  ``max_j |bias_j| + sigma_j * z_{beta / (2 d)}``: an approximation, not a
  guarantee, which can fail where an entry's error is a sparse skewed count
  (it did for randomized response at high epsilon, and for concatenation), and
  which the CLI prints with "≈".
  """
  hook = getattr(mech, "max_error_bound", None)
  if callable(hook):
    bound = hook(beta, counts, n)
    if bound is not None:
      return float(bound), str(getattr(mech, "max_error_method", "exact-tail-union"))
  sigma = np.sqrt(np.asarray(mech.entry_variance(counts, n), np.float64))
  bias = np.abs(np.asarray(mech.entry_bias(counts, n), np.float64))
  z = sps.norm.isf(beta / (2 * sigma.size))
  return float(np.max(bias + sigma * z)), "normal-union"


def run_simulate(args: argparse.Namespace) -> int:
  shape = mechanisms.BsvsShape(args.buckets, args.labels, args.k, args.r)
  n = _validate.integer("clients", args.clients, minimum=1, maximum=simulation.MAX_CLIENTS)
  seed = _validate.integer("seed", args.seed, minimum=0, maximum=_validate.MAX_SEED)
  delta, delta_note = args.delta, None
  if delta is not None and not simulation.mechanism_spec(args.mechanism).needs_delta:
    # A pure epsilon-DP mechanism has no use for it. It was echoed beside the statement's delta 0 without a word,
    # and then refused, which broke sweeps passing one --delta to every mechanism (label accepts it too).
    d = _validate.probability("--delta", delta)
    if d >= 1:
      raise ValueError(f"Expected --delta={d!r} < 1.")
    delta = None
    if d > 0:
      delta_note = (f"--delta {d:g} is unused: {args.mechanism} is pure epsilon-DP, so its statement has delta 0, "
                    "which implies every delta.")
  mech = simulation.build_mechanism(args.mechanism, shape, epsilon=args.epsilon, delta=delta, num_clients=n)
  privacy = mech.privacy()  # before the run: a bad calibration fails fast
  # threefry explicitly: under JAX_DEFAULT_PRNG_IMPL=rbg the numbers would change with --chunk-size.
  key_work, key_run = jax.random.split(_keys.seed_key(seed))
  work = mechanisms.synthetic_workload(key_work, num_clients=n, num_buckets=shape.num_buckets,
                                       num_labels=shape.num_labels, k=shape.k, r=shape.r)
  res = simulation.simulate(key_run, mech, work, chunk_size=args.chunk_size, devices=args.devices,
                            with_counts=True)
  counts = np.asarray(res.counts, np.float64)
  err = res.estimate - counts
  mse = np.asarray(mech.entry_mse(counts, n), np.float64)
  biased = bool(np.any(mech.entry_bias(counts, n) != 0))
  bound, method = max_error_prediction(mech, counts, n)
  out = {
      "mechanism": args.mechanism, "clients": n, "buckets": shape.num_buckets,
      "labels": shape.num_labels, "k": shape.k, "r": shape.r, "epsilon": args.epsilon,
      "delta": args.delta, "seed": seed, "chunk_size": res.chunk_size, "devices": res.num_devices,
      "error": {"max_abs": float(np.abs(err).max()), "rms": float(np.sqrt(np.mean(err**2)))},
      "predicted": {"rms": float(np.sqrt(mse.mean())), "rms_includes_bias": biased,
                    "max_abs_bound": bound,
                    "max_abs_bound_beta": MAX_ERROR_BETA, "max_abs_bound_method": method},
      "privacy": privacy.to_dict(),
      "note": NOTE,
      **({"delta_note": delta_note} if delta_note else {}),
      "wall_seconds": res.wall_seconds,
      "peak_rss_bytes": simulation.peak_rss_bytes(),
  }
  if args.json:
    print_json(out)
    return 0
  print(f"jaxdistill simulate: {args.mechanism}, n={n}, s={shape.num_buckets}, |Y|={shape.num_labels}, "
        f"k={shape.k}, r={shape.r}, seed={seed}, {res.num_devices} device(s), chunk {res.chunk_size}")
  print_table(["error per entry", "measured", "predicted"], [
      ["RMS", out["error"]["rms"],
       f"{out['predicted']['rms']:.4g} (closed-form {'MSE, incl. bias' if biased else 'variance'})"],
      ["max |error|", out["error"]["max_abs"],
       f"≈ {bound:.4g} at level {1 - MAX_ERROR_BETA:g} ({method}: an approximation, no guarantee)"
       if method == "normal-union" else f"<= {bound:.4g} w.p. {1 - MAX_ERROR_BETA:g} ({method})"],
  ])
  pr = out["privacy"]
  print(f"privacy: ({pr['epsilon']}, {pr['delta']})-DP, {pr['relation']}, {pr['mechanism']} "
        f"[{pr['method']}]")
  for w in privacy.warnings:
    print(f"warning [{w.code}]: {w.message}")
  print(f"note: {NOTE}")
  if delta_note:
    print(f"note: {delta_note}")
  print(f"wall time {res.wall_seconds:.3f} s (compilation included); "
        f"peak memory {out['peak_rss_bytes'] / 2**20:.0f} MiB (process RSS)")
  return 0
