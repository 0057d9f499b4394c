"""Benchmark: jaxdistill vs vectorised NumPy vs a per-record Python loop, in one run.

For each mechanism (randomized response, Collision, multi-message shuffle) and
each contender, one fresh subprocess draws every client's message, the server
aggregates and estimates A; the driver reads the subprocess's own wall time
for that work and its own peak resident memory, and prints ratios measured in
the same run. Contenders:

* ``jaxdistill``: :func:`jaxdistill.simulation.simulate` on the mechanism
  built from the registry (compilation reported separately: the first run
  includes it, the second reuses it), on 1 device and on ``--host-devices``
  CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count``);
* ``numpy``: the same randomizer and estimator at message level, vectorised
  over chunks of clients (chunked so its memory is bounded like ours);
* ``loop``: a per-record Python loop in the style of the paper authors'
  code (one record at a time, Python-level randomness), timed on
  ``--loop-clients`` records and extrapolated linearly to n (it is linear in
  n; the table says so).

* ``numpy-events`` (multi-message shuffle only): the same noise drawn the
  way jaxdistill draws it, as per-client compound-Poisson events (Poisson
  event count per client, Logarithmic sizes, uniform cells), vectorised over
  all clients; ``numpy`` draws the per-cell negative binomials naively.

All contenders read the same clients (generated once by the driver and saved
as .npy) and the same parameters, read from the library mechanism
(:func:`rr_parameters`, :func:`collision_parameters`,
:func:`shuffle_parameters`: RR's dyadic flip threshold; Collision's l, p, q
and Omega; the multi-message shuffle's calibrated (p, rho, p') and n). Each
reports the RMS error of its estimate against the true A beside the
closed-form prediction sqrt(mean MSE) of the library mechanism (for the
loops, on the clients they ran), so a wrong baseline shows up as a wrong
error. Finally jaxdistill runs ``--big-clients`` clients of each mechanism
from the chunked generator (nothing materialised) to show that peak memory
does not grow with n.

Usage (from the repository root)::

  python benchmarks/bench_mechanisms.py                       # the README table
  python benchmarks/bench_mechanisms.py --clients 100000 --big-clients 0   # quick
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import random
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

MECHANISMS = ("rr", "collision", "shuffle-multi")


# ---------------------------------------------------------------------------
# Parameters shared by all contenders, read from the library mechanism.
# ---------------------------------------------------------------------------
def rr_parameters(mech) -> dict:
  """Dyadic flip threshold of :class:`RandomizedResponse` (what its sampler uses)."""
  return {"flip_threshold": int(mech.flip_threshold), "bits": int(mech.sampler_bits),
          "q": 1.0 - float(mech.keep_probability)}


def collision_parameters(mech) -> dict:
  """Collision's exact (c, l, p, q, Omega), as its sampler and estimator use them.

  p = e^eps / Omega as the library stores it (the float64 just below, which
  its sampler draws exactly), q = 1 / l.
  """
  return {"c": int(mech.cardinality), "l": int(mech.bloom_length), "p": float(mech.p),
          "q": float(mech.q), "omega": float(mech.omega)}


def shuffle_parameters(mech) -> dict:
  """The multi-message shuffle's calibrated noise and its population n.

  Per client and entry: Z1, Z2 ~ NB(1/n, p) noise shares and Z3 ~ NB(rho/n, p')
  flooding; the client sends x + Z1 + Z3 "+" and Z2 + Z3 "-" messages.
  """
  noise = mech.noise
  return {"p": float(noise.p), "rho": float(noise.rho), "p_flood": float(noise.p_flood),
          "n": int(mech.num_clients), "expected_messages": float(mech.expected_messages()),
          "epsilon": float(mech.privacy().epsilon), "delta": float(mech.privacy().delta)}


# ---------------------------------------------------------------------------
# NumPy (vectorised, chunked) and per-record loop baselines.
# ---------------------------------------------------------------------------
def _entries(buckets: np.ndarray, labels: np.ndarray, num_labels: int) -> np.ndarray:
  ent = buckets[:, :, None] * num_labels + labels[:, None, :]
  valid = (buckets[:, :, None] >= 0) & (labels[:, None, :] >= 0)
  return np.where(valid, ent, -1).reshape(len(buckets), -1)


def numpy_rr(buckets, labels, shape, prm, rng, chunk=16384):
  d, y = shape["s"] * shape["y"], shape["y"]
  total = np.zeros(d, np.int64)
  dtype, hi = (np.uint16, 2**16) if prm["bits"] == 16 else (np.uint32, 2**32)
  for s in range(0, len(buckets), chunk):
    ent = _entries(buckets[s:s + chunk], labels[s:s + chunk], y)
    bits = rng.integers(0, hi, size=(len(ent), d), dtype=dtype) < prm["flip_threshold"]
    rows = np.repeat(np.arange(len(ent)), ent.shape[1])
    cols = ent.reshape(-1)
    keep = cols >= 0
    bits[rows[keep], cols[keep]] ^= True
    total += bits.sum(axis=0)
  p, q = 1 - prm["q"], prm["q"]
  return (total - len(buckets) * q) / (p - q)


def loop_rr(buckets, labels, shape, prm, rng):
  """Per record and per bit, like the authors' ``rr_mechanism`` (Python-level coin per bit)."""
  d, y = shape["s"] * shape["y"], shape["y"]
  p, q = 1 - prm["q"], prm["q"]
  total = np.zeros(d)
  rnd = random.Random(int(rng.integers(2**63)))
  for b_row, l_row in zip(buckets.tolist(), labels.tolist()):
    truth = [0] * d
    for b in b_row:
      for lab in l_row:
        if b >= 0 and lab >= 0:
          truth[b * y + lab] = 1
    observed = [v if rnd.random() < p else 1 - v for v in truth]
    total += (np.array(observed) - q) / (p - q)
  return total


def numpy_collision(buckets, labels, shape, prm, rng, chunk=16384):
  d, y, length, p = shape["s"] * shape["y"], shape["y"], prm["l"], prm["p"]
  hdtype = np.uint8 if length <= 256 else np.int32
  total = np.zeros(d, np.int64)
  for s in range(0, len(buckets), chunk):
    ent = _entries(buckets[s:s + chunk], labels[s:s + chunk], y)
    m = len(ent)
    h = rng.integers(0, length, size=(m, d), dtype=hdtype)       # the public hash of each message
    hv = np.take_along_axis(h, np.maximum(ent, 0), axis=1).astype(np.int64)
    member = np.zeros((m, length), bool)
    member[np.repeat(np.arange(m), ent.shape[1])[ent.reshape(-1) >= 0], hv[ent >= 0]] = True
    size = member.sum(axis=1, keepdims=True)
    p_out = (1.0 - size * p) / (length - size)                   # the rest, uniform off C
    cdf = np.cumsum(np.where(member, p, p_out), axis=1)
    z = (cdf < rng.random((m, 1)) * cdf[:, -1:]).sum(axis=1)     # inverse CDF
    total += (h == z[:, None].astype(hdtype)).sum(axis=0)
  return (total - len(buckets) * prm["q"]) / (p - prm["q"])


def loop_collision(buckets, labels, shape, prm, rng):
  """Per record like the authors' ``collision_mechanism`` (faster: one hash call per record)."""
  d, y, length, p = shape["s"] * shape["y"], shape["y"], prm["l"], prm["p"]
  total = np.zeros(d)
  rnd = random.Random(int(rng.integers(2**63)))
  for b_row, l_row in zip(buckets.tolist(), labels.tolist()):
    items = [b * y + lab for b in b_row for lab in l_row if b >= 0 and lab >= 0]
    seed = rnd.randrange(2**31)
    h = np.random.default_rng(seed).integers(0, length, d)
    cset = set(int(h[j]) for j in items)
    u, acc, z = rnd.random(), 0.0, length - 1
    for v in range(length):
      acc += p if v in cset else (1.0 - len(cset) * p) / (length - len(cset))
      if acc > u:
        z = v
        break
    total += ((h == z) - prm["q"]) / (p - prm["q"])
  return total


def _nb_table(r: float, p: float) -> np.ndarray:
  """CDF of NB(r, p) (mean r p / (1 - p)) on 0..K, K where the tail is < 1e-300."""
  k_max = int(math.ceil(700 / -math.log(p))) + 10
  k = np.arange(k_max + 1, dtype=np.float64)
  from scipy.special import gammaln
  logpmf = gammaln(k + r) - gammaln(k + 1) - gammaln(r) + r * math.log1p(-p) + k * math.log(p)
  return np.cumsum(np.exp(logpmf))


def _nb_from_uniform(u: np.ndarray, cdf: np.ndarray) -> np.ndarray:
  """Exact inverse-CDF NB draws; cells with u < cdf[0] (almost all) are 0 without a search."""
  out = np.zeros(u.shape, np.int64)
  hit = u >= cdf[0]
  out[hit] = np.searchsorted(cdf, u[hit], side="right")
  return out


def numpy_shuffle(buckets, labels, shape, prm, rng, chunk=4096):
  """Message level: per client and bucket, x + Z1 + Z3 '+' and Z2 + Z3 '-' messages.

  Every one of the 3d negative binomials of a client is drawn (inverse CDF
  of a float64 uniform; almost all are 0). The analyzer's count is invariant
  under the shuffler's permutation, so no permutation is materialised (as in
  jaxdistill's runner, which sums statistics).
  """
  n = prm["n"]
  d, y = shape["s"] * shape["y"], shape["y"]
  cdf_noise = _nb_table(1.0 / n, prm["p"])
  cdf_flood = _nb_table(prm["rho"] / n, prm["p_flood"])
  plus = np.zeros(d, np.int64)
  minus = np.zeros(d, np.int64)
  messages = 0
  for s in range(0, len(buckets), chunk):
    ent = _entries(buckets[s:s + chunk], labels[s:s + chunk], y)
    m = len(ent)
    z1 = _nb_from_uniform(rng.random((m, d)), cdf_noise)
    z2 = _nb_from_uniform(rng.random((m, d)), cdf_noise)
    z3 = _nb_from_uniform(rng.random((m, d)), cdf_flood)
    x = np.zeros((m, d), np.int64)
    rows = np.repeat(np.arange(m), ent.shape[1])[ent.reshape(-1) >= 0]
    x[rows, ent[ent >= 0]] = 1
    plus += (x + z1 + z3).sum(axis=0)
    minus += (z2 + z3).sum(axis=0)
    messages += int((x + z1 + z2 + 2 * z3).sum())
  return (plus - minus).astype(np.float64), messages / len(buckets)


def numpy_shuffle_events(buckets, labels, shape, prm, rng, chunk=65536):
  """The same noise as compound-Poisson events, the algorithm jaxdistill uses, vectorised.

  Independent NB(r_s, p_s) on each of d cells and 3 streams (Z1, Z2, Z3) are
  one Poisson process: client i draws E_i ~ Poisson(d sum_s lambda_s),
  lambda_s = r_s ln(1/(1 - p_s)), and each event a stream s (probability
  lambda_s / sum lambda), a size L ~ Logarithmic(p_s) and a uniform cell
  (Quenouille 1949). Message level: a client's messages are its events.
  """
  n = prm["n"]
  d, y = shape["s"] * shape["y"], shape["y"]
  probs = np.array([prm["p"], prm["p"], prm["p_flood"]])
  lam = np.array([1.0 / n, 1.0 / n, prm["rho"] / n]) * -np.log1p(-probs)
  plus = np.zeros(d, np.int64)
  minus = np.zeros(d, np.int64)
  messages = 0
  for s in range(0, len(buckets), chunk):
    ent = _entries(buckets[s:s + chunk], labels[s:s + chunk], y)
    real = np.bincount(ent[ent >= 0], minlength=d)
    events = rng.poisson(d * lam.sum(), size=len(ent))          # per client
    total = int(events.sum())
    stream = rng.choice(3, size=total, p=lam / lam.sum())
    size = np.empty(total, np.int64)
    for j in range(3):
      pick = stream == j
      size[pick] = rng.logseries(probs[j], size=int(pick.sum()))
    cell = rng.integers(0, d, size=total)
    plus += real + np.bincount(cell, weights=np.where(stream != 1, size, 0), minlength=d).astype(np.int64)
    minus += np.bincount(cell, weights=np.where(stream != 0, size, 0), minlength=d).astype(np.int64)
    messages += int(real.sum() + size.sum() + size[stream == 2].sum())
  return (plus - minus).astype(np.float64), messages / len(buckets)


def loop_shuffle(buckets, labels, shape, prm, rng):
  """Per record and per bucket, NumPy scalar draws (the protocol's natural loop)."""
  n = prm["n"]
  d, y = shape["s"] * shape["y"], shape["y"]
  r_noise, q_noise = 1.0 / n, 1 - prm["p"]
  r_flood, q_flood = prm["rho"] / n, 1 - prm["p_flood"]
  total = np.zeros(d)
  messages = 0
  for b_row, l_row in zip(buckets.tolist(), labels.tolist()):
    items = {b * y + lab for b in b_row for lab in l_row if b >= 0 and lab >= 0}
    for j in range(d):
      z1 = rng.negative_binomial(r_noise, q_noise)
      z2 = rng.negative_binomial(r_noise, q_noise)
      z3 = rng.negative_binomial(r_flood, q_flood)
      x = 1 if j in items else 0
      total[j] += (x + z1 + z3) - (z2 + z3)
      messages += x + z1 + z2 + 2 * z3
  return total, messages / len(buckets)


# ---------------------------------------------------------------------------
# Workers (one per subprocess) and the driver.
# ---------------------------------------------------------------------------
def _shape(args) -> dict:
  """Sizes of the problem (``n`` is the full population even when a loop times a subsample)."""
  return {"s": args.buckets, "y": args.labels, "k": args.k, "r": 1, "n": args.clients}


def _rms(est, truth) -> float:
  return float(np.sqrt(np.mean((np.asarray(est, np.float64).reshape(-1) - truth.reshape(-1))**2)))


def _truth(buckets: np.ndarray, labels: np.ndarray, shape: dict) -> np.ndarray:
  """The exact A of these clients, float64 ``[s * |Y|]`` (independent of the library)."""
  ent = _entries(buckets, labels, shape["y"])
  return np.bincount(ent[ent >= 0], minlength=shape["s"] * shape["y"]).astype(np.float64)


def _build(args, mechanism=None, clients=None):
  from jaxdistill import mechanisms as M
  from jaxdistill import simulation

  shape = M.BsvsShape(args.buckets, args.labels, args.k)
  return simulation.build_mechanism(mechanism or args.mechanism, shape, epsilon=args.epsilon,
                                    delta=args.delta, num_clients=clients or args.clients)


def worker_jax(args) -> dict:
  import jax
  from jaxdistill import mechanisms as M
  from jaxdistill import simulation

  mech = _build(args)
  if args.source == "generator":
    clients = M.synthetic_workload(jax.random.key(args.seed), num_clients=args.clients,
                                   num_buckets=args.buckets, num_labels=args.labels, k=args.k)
  else:
    b = np.load(os.path.join(args.inputs, "buckets.npy"))
    lab = np.load(os.path.join(args.inputs, "labels.npy"))
    clients = M.BsvsInput(jax.numpy.asarray(b), jax.numpy.asarray(lab))
  times, cpu = [], []
  for rep in range(1 if args.source == "generator" else 1 + args.repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    res = simulation.simulate(jax.random.key(100 + rep), mech, clients, chunk_size=args.chunk_size or None,
                              with_counts=args.source == "generator")
    times.append(time.perf_counter() - start)  # simulate returns host float64: the work is done
    cpu.append(time.process_time() - start_cpu)
  out = {"seconds_first": times[0], "devices": res.num_devices}
  if args.source == "generator":
    out["seconds"] = times[0]
  else:  # the first run compiles; the rest reuse it
    out.update(_summary(times[1:], cpu[1:]))
  if args.source == "generator":
    out["rms"] = _rms(res.estimate, res.counts)
    out["predicted_rms"] = _predicted_rms(mech, res.counts, args.clients)
  else:
    out["rms"] = _rms(res.estimate, np.load(os.path.join(args.inputs, "truth.npy")))
  return out


_BASELINES = {
    "numpy": {"rr": numpy_rr, "collision": numpy_collision, "shuffle-multi": numpy_shuffle},
    "numpy-events": {"shuffle-multi": numpy_shuffle_events},
    "loop": {"rr": loop_rr, "collision": loop_collision, "shuffle-multi": loop_shuffle},
}


def _loop_clients(args, mechanism=None) -> int:
  """Records the per-record loop runs for ``mechanism`` (default ``args.mechanism``)."""
  name = mechanism or args.mechanism
  return min(args.loop_clients_shuffle if name == "shuffle-multi" else args.loop_clients,
             args.clients)


def _summary(times: list, cpu: list) -> dict:
  """Median and best wall time of the repeats, and the median CPU time (all threads of the process)."""
  return {"seconds": float(np.median(times)), "seconds_min": float(min(times)),
          "cpu_seconds": float(np.median(cpu)), "repeats": len(times)}


def worker_baseline(args) -> dict:
  b = np.load(os.path.join(args.inputs, "buckets.npy"))
  lab = np.load(os.path.join(args.inputs, "labels.npy"))
  prm = json.loads(args.params)
  shape = _shape(args)
  rng = np.random.default_rng(args.seed)
  n = len(b)
  fn = _BASELINES[args.worker][args.mechanism]
  m = _loop_clients(args) if args.worker == "loop" else n
  times, cpu = [], []
  for _ in range(1 if args.worker == "loop" else args.repeats):  # the loop is extrapolated from one run
    start, start_cpu = time.perf_counter(), time.process_time()
    out = fn(b[:m], lab[:m], shape, prm, rng)
    times.append((time.perf_counter() - start) * n / m)
    cpu.append((time.process_time() - start_cpu) * n / m)
  est, per_client = out if isinstance(out, tuple) else (out, None)
  result = {**_summary(times, cpu), "measured_clients": m, "measured_seconds": times[0] * m / n,
            "rms": _rms(est, _truth(b[:m], lab[:m], shape))}  # against the clients it ran (last repeat)
  if per_client is not None:
    result["messages_per_client"] = per_client
  return result


def _worker_cmd(args, worker, mechanism, inputs, params, source="arrays", clients=None) -> list:
  return [sys.executable, os.path.abspath(__file__), "--worker", worker, "--mechanism", mechanism,
          "--inputs", inputs, "--params", json.dumps(params), "--source", source,
          "--clients", str(clients or args.clients), "--buckets", str(args.buckets),
          "--labels", str(args.labels), "--k", str(args.k), "--epsilon", str(args.epsilon),
          "--delta", str(args.delta), "--seed", str(args.seed), "--chunk-size", str(args.chunk_size),
          "--loop-clients", str(args.loop_clients),
          "--loop-clients-shuffle", str(args.loop_clients_shuffle), "--repeats", str(args.repeats)]


def _run(cmd, env_extra=None, timeout=3600) -> dict:
  from jaxdistill.simulation import measure_subprocess

  env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.update(env_extra or {})
  run = measure_subprocess(cmd, env=env, timeout=timeout)
  if run.returncode != 0:
    return {"error": (run.stderr.strip().splitlines() or ["failed"])[-1]}
  out = json.loads(run.stdout.strip().splitlines()[-1])
  out["peak_rss_mb"] = run.peak_rss_bytes / 2**20
  out["process_seconds"] = run.wall_seconds
  return out


def _predicted_rms(mech, truth: np.ndarray, clients: int) -> float:
  """sqrt of the mean closed-form MSE per entry of the library mechanism."""
  counts = truth.reshape(mech.shape.num_buckets, mech.shape.num_labels)
  return float(np.sqrt(np.mean(mech.entry_mse(counts, clients))))


def driver(args) -> dict:
  import jax
  from jaxdistill import mechanisms as M

  work = M.synthetic_workload(jax.random.key(args.seed), num_clients=args.clients,
                              num_buckets=args.buckets, num_labels=args.labels, k=args.k)
  inp = work.materialize()
  b, lab = np.asarray(inp.buckets), np.asarray(inp.labels)
  del inp
  shape = _shape(args)
  truth = _truth(b, lab, shape)
  report = {"clients": args.clients, "buckets": args.buckets, "labels": args.labels, "k": args.k,
            "epsilon": args.epsilon, "delta": args.delta, "loop_clients": args.loop_clients,
            "host_devices": args.host_devices, "cpu_count": os.cpu_count(),
            "jax_device": f"{jax.devices()[0].platform} ({jax.devices()[0].device_kind})",
            "load_average": os.getloadavg(), "rows": []}
  print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
        f"({os.cpu_count()} CPUs); jax {jax.__version__}, default device {report['jax_device']}")
  with tempfile.TemporaryDirectory() as tmp:
    np.save(os.path.join(tmp, "buckets.npy"), b)
    np.save(os.path.join(tmp, "labels.npy"), lab)
    np.save(os.path.join(tmp, "truth.npy"), truth)
    for name in args.mechanisms.split(","):
      mech = _build(args, name)
      params = {"rr": rr_parameters, "collision": collision_parameters,
                "shuffle-multi": shuffle_parameters}[name](mech)
      m = _loop_clients(args, name)
      row = {"mechanism": name, "params": params,
             "predicted_rms": _predicted_rms(mech, truth, args.clients),
             "predicted_rms_loop": _predicted_rms(mech, _truth(b[:m], lab[:m], shape), m),
             "loop_clients": m}
      row["jaxdistill"] = _run(_worker_cmd(args, "jax", name, tmp, params))
      if args.host_devices > 1:
        flag = f"--xla_force_host_platform_device_count={args.host_devices}"
        row[f"jaxdistill_{args.host_devices}dev"] = _run(
            _worker_cmd(args, "jax", name, tmp, params),
            {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()})
      for worker in ("numpy", "numpy-events", "loop"):
        if name in _BASELINES[worker]:
          row[worker] = _run(_worker_cmd(args, worker, name, tmp, params))
      report["rows"].append(row)
      _print_row(row, args)
  if args.big_clients:
    report["big"] = {}
    print("\n== peak memory vs n (jaxdistill, clients generated chunk by chunk; wall time includes "
          "compilation and summing the true A in the same pass)")
    print(f"{'mechanism':<16}{'clients':>12}{'seconds':>10}{'peak MiB':>10}{'RMS err':>10}{'predicted':>11}")
    for name in args.big_mechanisms.split(","):
      for n in sorted({args.clients, args.big_clients}):
        r = _run(_worker_cmd(args, "jax", name, "-", {}, source="generator", clients=n))
        report["big"][f"{name}/{n}"] = r
        if "error" in r:
          print(f"{name:<16}{n:>12,}  {r['error']}")
        else:
          print(f"{name:<16}{n:>12,}{r['seconds']:>10.1f}{r['peak_rss_mb']:>10.0f}{r['rms']:>10.4g}"
                f"{r['predicted_rms']:>11.4g}")
  print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
  return report


def _print_row(row: dict, args) -> None:
  name = row["mechanism"]
  ref = row.get("jaxdistill", {})
  prm = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row["params"].items())
  print(f"\n== {name}: n={args.clients:,}, s={args.buckets}, |Y|={args.labels}, k={args.k}, "
        f"eps={args.epsilon}; {prm}")
  print(f"predicted RMS error (closed form): {row['predicted_rms']:.4g} at n; "
        f"{row['predicted_rms_loop']:.4g} on the loop's {row['loop_clients']:,} clients")
  print(f"seconds: median of {args.repeats} runs (best in brackets); CPU s: median CPU time of the process, "
        f"all threads (NumPy uses one core; XLA:CPU all of them)")
  print(f"{'contender':<22}{'seconds':>17}{'1st run':>9}{'CPU s':>9}{'peak MiB':>10}{'RMS err':>10}"
        f"{'time / jaxdistill':>19}{'CPU / jaxdistill':>18}")

  def ratio(key, r):
    return f"{r[key] / ref[key]:.3g}x" if ref.get(key, 0) > 0 and key in r else "n/a"

  for label in [k for k in row if isinstance(row[k], dict) and k != "params"]:
    r = row[label]
    if "error" in r:
      print(f"{label:<22}{r['error']}")
      continue
    first = f"{r['seconds_first']:.3g}" if "seconds_first" in r else ""
    note = " (extrapolated from %d clients; RMS on those)" % r["measured_clients"] \
        if r.get("measured_clients", args.clients) < args.clients else ""
    if "messages_per_client" in r:
      note += f" [{r['messages_per_client']:.3f} messages/client]"
    if r.get("repeats", args.repeats) != args.repeats:
      note += f" [{r['repeats']} run]"
    secs = f"{r['seconds']:.3g} ({r['seconds_min']:.3g})"
    print(f"{label:<22}{secs:>17}{first:>9}{r['cpu_seconds']:>9.3g}{r['peak_rss_mb']:>10.0f}{r['rms']:>10.4g}"
          f"{ratio('seconds', r):>19}{ratio('cpu_seconds', r):>18}{note}")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--clients", type=lambda s: int(float(s)), default=1_000_000)
  p.add_argument("--buckets", type=int, default=40)
  p.add_argument("--labels", type=int, default=10)
  p.add_argument("--k", type=int, default=1)
  p.add_argument("--epsilon", type=float, default=1.0)
  p.add_argument("--delta", type=float, default=1e-6)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--chunk-size", type=int, default=0,
                 help="clients per chunk for jaxdistill (default 0: simulation.default_chunk_size, 4096 on CPU)")
  p.add_argument("--repeats", type=int, default=5,
                 help="timed runs per contender (after jaxdistill's compiling run; the loops run once)")
  p.add_argument("--loop-clients", type=int, default=20_000)
  p.add_argument("--loop-clients-shuffle", type=int, default=1_000,
                 help="loop subsample for the shuffle (d negative-binomial draws x 3 per client)")
  p.add_argument("--big-clients", type=lambda s: int(float(s)), default=10_000_000)
  p.add_argument("--big-mechanisms", default=",".join(MECHANISMS),
                 help="mechanisms run at --clients and --big-clients from the generator")
  p.add_argument("--host-devices", type=int, default=os.cpu_count() or 1)
  p.add_argument("--mechanisms", default=",".join(MECHANISMS))
  p.add_argument("--json", default=None, help="also write the report to this file")
  # Worker mode (internal).
  p.add_argument("--worker", choices=["jax", "numpy", "numpy-events", "loop"], default=None)
  p.add_argument("--mechanism", default="rr")
  p.add_argument("--inputs", default="-")
  p.add_argument("--params", default="{}")
  p.add_argument("--source", default="arrays", choices=["arrays", "generator"])
  args = p.parse_args(argv)
  if args.worker == "jax":
    print(json.dumps(worker_jax(args)))
    return 0
  if args.worker is not None:
    print(json.dumps(worker_baseline(args)))
    return 0
  report = driver(args)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
