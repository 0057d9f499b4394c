"""``jaxdistill simulate``: JSON contract, error vs prediction, one-line errors, registry."""

import subprocess
import sys

import pytest

from jaxdistill import mechanisms as M
from jaxdistill import simulation
from jaxdistill.cli.main import main
from tests.test_cli import run_json

SMALL = ["--clients", "3000", "--buckets", "10", "--labels", "5", "--k", "1", "--epsilon", "2"]


def _delta_args(name):
  return ["--delta", "1e-6"] if simulation.mechanism_spec(name).needs_delta else []


def test_rr_json_contract(capsys):
  obj = run_json(capsys, ["simulate", "--mechanism", "rr", *SMALL, "--seed", "3", "--json"])
  assert obj["mechanism"] == "rr" and obj["clients"] == 3000 and obj["devices"] == 1
  assert obj["privacy"]["epsilon"] == 2.0 and obj["privacy"]["delta"] == 0.0
  assert obj["privacy"]["relation"] == "replace-one"
  # Closed form, computed here from the definition: Var = n p q / (p - q)^2 with
  # q = 1 / (1 + e^{eps/2}) (k = r = 1) rounded up to a multiple of 2^-16, the same
  # for all 50 entries.
  import math
  p = 1 - math.ceil(2**16 / (1 + math.exp(1.0))) / 2**16
  assert obj["predicted"]["rms"] == pytest.approx(math.sqrt(3000 * p * (1 - p)) / (2 * p - 1))
  assert obj["predicted"]["max_abs_bound_method"] == "chernoff-union"
  assert obj["wall_seconds"] > 0 and obj["peak_rss_bytes"] > 10**7
  assert "derived from --seed" in obj["note"]  # the noise is recomputable from the printed seed


@pytest.mark.parametrize("name", simulation.mechanism_names())
def test_measured_error_matches_the_prediction(capsys, name):
  # RMS over d = 50 entries of the error vs sqrt(mean closed-form variance): the
  # ratio's relative sd is <= 0.3 even for Laplace-tailed errors, so [0.5, 2]
  # fails with probability < 1e-3 per mechanism (fixed seed: deterministic).
  obj = run_json(capsys, ["simulate", "--mechanism", name, *SMALL, *_delta_args(name), "--json"])
  ratio = obj["error"]["rms"] / obj["predicted"]["rms"]
  assert 0.5 < ratio < 2.0, obj
  assert obj["error"]["max_abs"] >= obj["error"]["rms"]
  assert obj["predicted"]["max_abs_bound"] > obj["predicted"]["rms"]


def test_a_pure_mechanism_takes_a_delta_and_says_it_is_unused(capsys):
  # It was echoed beside the statement's delta 0 without a word, then refused, which broke sweeps passing one
  # --delta to every mechanism. A pure epsilon-DP statement implies every delta.
  obj = run_json(capsys, ["simulate", "--mechanism", "rr", *SMALL, "--delta", "0.5", "--json"])
  assert obj["privacy"]["delta"] == 0.0 and obj["delta"] == 0.5
  assert obj["delta_note"].startswith("--delta 0.5 is unused: rr is pure epsilon-DP")
  obj = run_json(capsys, ["simulate", "--mechanism", "rr", *SMALL, "--delta", "0", "--json"])
  assert obj["privacy"]["delta"] == 0.0 and "delta_note" not in obj


def test_table_output(capsys):
  # Default chunk size and n as in test_rr_json_contract: the compiled runner is reused.
  assert main(["simulate", "--mechanism", "rr", *SMALL, "--devices", "1"]) == 0
  out = capsys.readouterr().out
  for needle in ("RMS", "max |error|", "closed-form variance", "privacy: (2.0, 0.0)-DP, replace-one",
                 "wall time", "peak memory", "chunk 3000", "not a private release"):
    assert needle in out, needle


def _without(args, *flags):
  out, skip = [], False
  for a in args:
    if skip:
      skip = False
      continue
    if a in flags:
      skip = True
      continue
    out.append(a)
  return out


@pytest.mark.parametrize("extra,needle", [
    (["--epsilon", "0"], "epsilon=0.0"),
    (["--epsilon", "-1"], "epsilon=-1.0"),
    (["--epsilon", "nan"], "epsilon"),
    (["--epsilon", "inf"], "epsilon"),
    (["--k", "11"], "k=11"),
    (["--clients", "0"], "clients=0"),
    (["--clients", "1.5"], "--clients"),
    (["--clients", "nan"], "--clients"),
    (["--labels", "0"], "num_labels=0"),
    (["--chunk-size", "0"], "chunk_size=0"),
    (["--devices", "99"], "devices=99"),
    (["--r", "6"], "r=6"),
    (["--seed", str(2**63)], "seed=9223372036854775808 <= 4294967295"),  # was an OverflowError traceback
    (["--delta", "1"], "--delta=1.0 < 1"),
    (["--delta", "-0.1"], "--delta"),
])
def test_bad_input_is_one_line_exit_2(capsys, extra, needle):
  flags = {a for a in extra if a.startswith("--")}
  argv = ["simulate", "--mechanism", "rr", *_without(SMALL, *flags), *extra]
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err, err


def test_host_memory_exhaustion_is_one_line_exit_1(capsys, monkeypatch):
  # NumPy's MemoryError (simulate's float64 [s, |Y|] host arrays, at --buckets 20000 --labels 10000 under a 6 GB
  # limit) printed a full traceback; JAX's RESOURCE_EXHAUSTED was already one line.
  def no_memory(*args, **kwargs):
    raise MemoryError("Unable to allocate 1.49 GiB for an array with shape (200000000,) and data type float64")
  monkeypatch.setattr(simulation, "simulate", no_memory)
  assert main(["simulate", "--mechanism", "laplace", *SMALL]) == 1
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
  assert "out of host memory" in err and "--buckets x --labels" in err


def test_unknown_mechanism_is_one_line_exit_2(capsys):
  assert main(["simulate", "--mechanism", "gaussian", *SMALL]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "invalid choice" in err


def test_an_uncalibratable_shuffle_says_why_once(capsys):
  # Every flood multiplier failed for its own reason, and all four dumps were joined into one ~1,600-char line.
  assert main(["simulate", "--mechanism", "shuffle-multi", *SMALL, "--delta", "1e-300"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and len(err) < 600 and "No flood multiplier" in err and "more like it" in err, err


def test_shuffle_mechanisms_need_delta(capsys):
  for name in ("shuffle-multi", "shuffle-single"):
    assert main(["simulate", "--mechanism", name, *SMALL]) == 2
    assert "delta" in capsys.readouterr().err
    assert main(["simulate", "--mechanism", name, *SMALL, "--delta", "1.5"]) == 2
    assert "delta=1.5" in capsys.readouterr().err


def test_registry_names_and_errors():
  assert set(simulation.mechanism_names()) >= {
      "laplace", "discrete-laplace", "rr", "collision", "separation", "concatenation",
      "shuffle-multi", "shuffle-single"}
  # SMALL's shape and epsilon: the shuffle mechanisms' calibrations (seconds each) are then the ones
  # test_measured_error_matches_the_prediction makes, cached when this file runs in one process in order.
  shape = M.BsvsShape(10, 5, 1)
  rr = simulation.build_mechanism("rr", shape, epsilon=1.5)
  assert isinstance(rr, M.RandomizedResponse) and rr.epsilon == 1.5 and rr.shape == shape
  with pytest.raises(ValueError, match="mechanism"):
    simulation.build_mechanism("gaussian", shape, epsilon=1.0)
  with pytest.raises(ValueError, match="epsilon"):
    simulation.build_mechanism("rr", shape, epsilon=0.0)
  with pytest.raises(ValueError, match="shape"):
    simulation.build_mechanism("rr", (4, 3, 2), epsilon=1.0)
  for name in simulation.mechanism_names():
    spec = simulation.mechanism_spec(name)
    kw = {"delta": 1e-6, "num_clients": 3000} if spec.needs_delta else {}
    mech = simulation.build_mechanism(name, shape, epsilon=2.0, **kw)
    assert isinstance(mech, spec.cls) and mech.name == name


def test_console_entry_point_has_no_traceback():
  proc = subprocess.run([sys.executable, "-m", "jaxdistill", "simulate", "--mechanism", "rr",
                         *_without(SMALL, "--epsilon"), "--epsilon", "-2"],
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def exceedances(mech, clients, counts, n, bound, *, runs):
  """In how many of ``runs`` independent runs (seeds 0..runs-1) of the real mechanism max |error| > bound."""
  import jax
  import numpy as np
  exceed = 0
  for seed in range(runs):
    key_stats, key_est = jax.random.split(jax.random.key(seed))
    est = mech.estimate(key_est, simulation.client_statistics(key_stats, mech, clients), n)
    exceed += int(np.abs(est - counts).max() > bound)
  return exceed


@pytest.mark.parametrize("name", ["laplace", "discrete-laplace", "shuffle-multi"])
def test_max_error_bound_is_exact_tail_and_holds(name):
  # Central and multi-message shuffle errors are (discrete) Laplace: heavier-tailed than a
  # normal of the same variance, so `simulate` must use their exact tails, not the normal
  # union bound (which the measured maximum exceeded in most runs). 300 independent runs
  # of the real mechanism, d = 8 entries, beta = 0.05: the union bound makes the true
  # exceedance rate <= 0.05, and Pr[Binomial(300, 0.05) > 30] < 1e-3 (false-failure rate).
  import jax
  import numpy as np
  from jaxdistill.cli._simulate import max_error_prediction

  shape = M.BsvsShape(4, 2, 1)
  n = 64
  mech = simulation.build_mechanism(name, shape, epsilon=1.0, delta=1e-4, num_clients=n)
  work = M.synthetic_workload(jax.random.key(1), num_clients=n, num_buckets=4, num_labels=2, k=1)
  clients = work.materialize()
  counts = np.asarray(M.bsvs_counts(clients, shape), np.float64)
  bound, method = max_error_prediction(mech, counts, n, beta=0.05)
  assert method == "exact-tail-union"
  sigma = np.sqrt(mech.entry_variance(counts, n).max())
  from scipy import stats
  assert bound >= sigma * stats.norm.isf(0.05 / 16) - 1  # never below the normal approximation
  assert exceedances(mech, clients, counts, n, bound, runs=300) <= 30
  # m != n clients: no exact bound for the shuffle's NB(m/n, p) differences -> normal fallback.
  if name == "shuffle-multi":
    assert max_error_prediction(mech, counts, n - 1)[1] == "normal-union"


def _bound_on_500_clients(name, epsilon):
  """n = 500 clients of a fixed synthetic workload (s = 20, |Y| = 10, k = 1), and simulate's level-0.95 bound."""
  import jax
  import numpy as np
  from jaxdistill.cli._simulate import max_error_prediction

  n, shape = 500, M.BsvsShape(20, 10, 1)
  mech = simulation.build_mechanism(name, shape, epsilon=epsilon)
  work = M.synthetic_workload(jax.random.key(1), num_clients=n, num_buckets=20, num_labels=10, k=1)
  clients = work.materialize()
  counts = np.asarray(M.bsvs_counts(clients, shape), np.float64)
  return (n, mech, clients, counts, *max_error_prediction(mech, counts, n, beta=0.05))


@pytest.mark.parametrize("epsilon", [12.0, 16.0])
def test_rr_max_error_bound_holds_at_high_epsilon(epsilon):
  # At high epsilon each randomized-response error is a sparse skewed count (n q ~ 0.2-3 flips
  # per entry), and the normal union bound was exceeded in most runs (eps 16: in ~100% of these,
  # d = 200). The Chernoff bound must hold: 100 independent runs of the real mechanism, beta =
  # 0.05, so the true exceedance rate is <= 0.05 and Pr[Binomial(100, 0.05) > 13] < 5e-4
  # (false-failure rate per epsilon; fixed seeds make it deterministic).
  n, mech, clients, counts, bound, method = _bound_on_500_clients("rr", epsilon)
  q = 1 - mech.keep_probability
  assert bound <= n * (1 - q) / (1 - 2 * q)  # never above the sure bound on |error|
  assert exceedances(mech, clients, counts, n, bound, runs=100) <= 13
  assert method == "chernoff-union"


@pytest.mark.parametrize("epsilon", [2.0, 16.0])
def test_collision_max_error_bound_is_bernstein_and_holds(epsilon):
  # simulate's bound for collision was a normal approximation (no guarantee). It is now Bernstein's
  # inequality per entry with the entry's exact variance, and a union bound: 100 independent runs
  # of the real mechanism at beta = 0.05, so the true exceedance rate is <= 0.05 and
  # Pr[Binomial(100, 0.05) > 13] < 5e-4 (false-failure rate per epsilon; fixed seeds).
  n, mech, clients, counts, bound, method = _bound_on_500_clients("collision", epsilon)
  assert method == "bernstein-union"
  # Without counts: the worst case over all counts, which is Theorem 2's alpha over the d = 200 entries.
  anywhere = mech.max_error_bound(0.05, None, n)
  assert anywhere == pytest.approx(M.collision_alpha(0.05, p=mech.p, q=mech.q, num_clients=n, num_entries=200),
                                   rel=1e-12)
  assert bound <= anywhere
  assert exceedances(mech, clients, counts, n, bound, runs=100) <= 13


@pytest.mark.parametrize("name", ["separation", "concatenation", "concatenation-literal"])
def test_product_max_error_bound_is_bernstein_and_holds(name):
  # simulate's bound for the product mechanisms was a normal approximation. Concatenation's rare co-hit terms
  # are large, and the normal union bound was exceeded in 26 of 200 runs at n = 3,000, s = 10, |Y| = 5, eps = 6
  # (at most 10 claimed), and by 18x at eps = 12 here. Bernstein's inequality on the bounded per-client terms,
  # with the closed-form variance, is a guarantee: 100 independent runs of the real mechanism at beta = 0.05,
  # so Pr[Binomial(100, 0.05) > 13] < 5e-4 (false-failure rate per mechanism; fixed seeds).
  import numpy as np
  from scipy import stats
  n, mech, clients, counts, bound, method = _bound_on_500_clients(name, 6.0)
  assert method == "bernstein-union"
  sigma = np.sqrt(np.asarray(mech.entry_variance(counts, n), np.float64))
  bias = np.abs(np.asarray(mech.entry_bias(counts, n), np.float64))
  assert bound >= np.max(bias + sigma * stats.norm.isf(0.05 / (2 * sigma.size)))  # never below the normal one
  assert exceedances(mech, clients, counts, n, bound, runs=100) <= 13
  assert mech.max_error_bound(0.05, None, n) is None  # the variance needs the counts


def test_shuffle_single_uses_its_local_mechanisms_max_error_bound():
  import numpy as np
  from jaxdistill.cli._simulate import max_error_prediction

  shape, n = M.BsvsShape(4, 2, 1), 3000
  for local, method in (("rr", "chernoff-union"), ("collision", "bernstein-union")):
    mech = M.ShuffleSingleMessage(shape, 1.0, 1e-6, n, local=local)
    counts = np.zeros((4, 2))
    bound, got = max_error_prediction(mech, counts, n, beta=0.05)
    assert got == method
    assert bound == mech.local_mechanism.max_error_bound(0.05, counts, n)


def test_the_workload_and_the_noise_come_from_two_keys_split_from_the_seed_whatever_the_chunk_size(capsys):
  # The workload and the mechanism's randomness must use independent keys (split from --seed), and
  # --chunk-size must not change the numbers (threefry draws are the same under any chunking).
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  argv = ["simulate", "--mechanism", "rr", *SMALL, "--seed", "5", "--json"]
  default = run_json(capsys, argv)
  chunked = run_json(capsys, argv + ["--chunk-size", "512"])
  assert chunked["chunk_size"] <= 512 < default["chunk_size"]  # the chunk really differs
  assert chunked["error"] == default["error"]
  key_work, key_run = jax.random.split(jax.random.key(5, impl="threefry2x32"))
  work = M.synthetic_workload(key_work, num_clients=3000, num_buckets=10, num_labels=5, k=1, r=1)
  mech = simulation.build_mechanism("rr", M.BsvsShape(10, 5, 1, 1), epsilon=2.0)
  res = simulation.simulate(key_run, mech, work, with_counts=True)
  err = np.asarray(res.estimate) - np.asarray(res.counts, np.float64)
  assert default["error"]["max_abs"] == pytest.approx(float(np.abs(err).max()), rel=1e-12)
  assert default["error"]["rms"] == pytest.approx(float(np.sqrt(np.mean(err**2))), rel=1e-12)
