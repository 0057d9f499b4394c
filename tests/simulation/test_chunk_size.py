"""The runner's default chunk: 4,096 on CPU, sized by memory on an accelerator, never a different result."""

import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxdistill import mechanisms as M
from jaxdistill import simulation
from jaxdistill.simulation import _runner

ROOT = pathlib.Path(__file__).resolve().parents[2]
N = 2**15
SHAPE = M.BsvsShape(100, 20, 2)  # d = 2000: the per-client d terms dominate the fixed ones


def _mech(name, shape=SHAPE, n=N):
  return simulation.build_mechanism(name, shape, epsilon=1.0, delta=1e-6, num_clients=n)


def _workload(shape=SHAPE, n=N):
  return M.synthetic_workload(jax.random.key(0), num_clients=n, num_buckets=shape.num_buckets,
                              num_labels=shape.num_labels, k=shape.k, r=shape.r)


# The chunk paths with their own code, with a generated source, and the two narrow ones with arrays too (where
# the source adds only k + r). discrete-laplace and shuffle-single reuse these (checked below); separation and
# concatenation take the default path, as rr does, with narrower messages (4.2 to 4.5 bytes per value of d
# measured; not run here, to spare CI the compilations).
CASES = [("laplace", "generator"), ("rr", "generator"), ("collision", "generator"), ("shuffle-multi", "generator"),
         ("laplace", "arrays"), ("shuffle-multi", "arrays")]

# Runs in a child process with stock JAX: this suite's threefry lowering (tests/_fast_threefry.py) broadcasts
# keys to every counter, which doubles the generator's working set compared with what users run.
_MEASURE = """
import json, sys
import jax
from jaxdistill import mechanisms as M, simulation
from tests.simulation.test_runner import _temp_bytes  # n = 2^15 is a multiple of both chunks: kept as given
n, shape = 2**15, M.BsvsShape(100, 20, 2)
work = M.synthetic_workload(jax.random.key(0), num_clients=n, num_buckets=100, num_labels=20, k=2)
out = {}
for name, source in json.loads(sys.argv[1]):
  mech = simulation.build_mechanism(name, shape, epsilon=1.0, delta=1e-6, num_clients=n)
  clients = work if source == "generator" else work.materialize()
  out[name + "/" + source] = (_temp_bytes(mech, clients, 2048) - _temp_bytes(mech, clients, 512)) / 1536
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def bytes_per_client():
  run = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(CASES)], capture_output=True, text=True,
                       timeout=600, check=False, cwd=ROOT)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name, source", CASES)
def test_chunk_width_bounds_the_compiled_working_set(bytes_per_client, name, source):
  # XLA:CPU's buffer assignment (deterministic): the temporaries' growth per added client, between chunks of
  # 512 and 2,048, must be within 2 to 24 bytes per value of the width default_chunk_size sizes chunks by
  # (measured 4 to 21): below, the chunk it picks could exceed its memory budget; far above 2 bytes, the
  # width would be padded and the chunk needlessly small.
  mech, work = _mech(name), _workload()
  width = mech.chunk_width() + (work.chunk_width() if source == "generator" else SHAPE.k + SHAPE.r)
  per_client = bytes_per_client[f"{name}/{source}"]
  assert 2 * width <= per_client <= 24 * width, (per_client, width)


def test_chunk_widths_follow_the_chunk_path_they_run():
  # Mechanisms sharing a chunk path share its width; the narrow paths are far narrower than d.
  assert _mech("discrete-laplace").chunk_width() == _mech("laplace").chunk_width() == SHAPE.k * SHAPE.r
  assert _mech("shuffle-single").chunk_width() == _mech("shuffle-single").local_mechanism.chunk_width()
  assert _mech("concatenation-literal").chunk_width() == _mech("concatenation").chunk_width() == SHAPE.d
  assert _mech("rr").chunk_width() == SHAPE.d
  assert 2 * SHAPE.k < _mech("shuffle-multi").chunk_width() < SHAPE.d // 10
  assert _workload().chunk_width() == SHAPE.num_buckets
  wide = M.BsvsShape(30, 12, 1, 3)
  assert _workload(wide).chunk_width() == 30 + 12  # r > 1 draws |Y| more Gumbels


@pytest.mark.parametrize("name", simulation.mechanism_names())
def test_the_default_on_cpu_is_the_cpu_chunk(name):
  assert simulation.default_chunk_size(_mech(name), _workload()) == simulation.CPU_CHUNK_SIZE == 4096


def _expected(width):
  """Largest power of two C with C * width <= 2^25, clipped to [4096, 2^18], by doubling."""
  c = 1
  while 2 * c * width <= 2**25:
    c *= 2
  return min(max(c, 4096), 2**18)


class _PlainGenerator:
  """A generator without chunk_width: counted as d per client."""
  num_clients = 10


@pytest.mark.parametrize("name, source, width", [
    ("rr", "generator", 400 + 40), ("rr", "arrays", 400 + 2), ("laplace", "arrays", 1 + 2),
    ("laplace", "none", 1 + 2), ("laplace", "plain", 1 + 400), ("collision", "wide", 50_000 + 2)])
def test_the_default_on_an_accelerator_fits_the_memory_budget(monkeypatch, name, source, width):
  monkeypatch.setattr(_runner, "_platform", lambda mesh: "gpu")
  shape = M.BsvsShape(5000, 10, 1) if source == "wide" else M.BsvsShape(40, 10, 1)
  mech = _mech(name, shape, 10**6)
  work = _workload(shape, 10**6)
  clients = {"generator": work, "arrays": M.BsvsInput(np.zeros((3, 1), np.int32), np.zeros((3, 1), np.int32)),
             "none": None, "plain": _PlainGenerator(), "wide": M.BsvsInput(np.zeros((3, 1), np.int32),
                                                                         np.zeros((3, 1), np.int32))}[source]
  got = simulation.default_chunk_size(mech, clients)
  assert got == _expected(width)
  assert {"rr": 65536, "laplace": 2**18 if source != "plain" else 65536, "collision": 4096}[name] == got


def test_the_shuffle_gets_the_largest_chunk_on_an_accelerator(monkeypatch):
  # At the benchmark's s = 40, |Y| = 10, n = 10^6 (14x faster at 2^18 than at 4,096 on an H200).
  monkeypatch.setattr(_runner, "_platform", lambda mesh: "gpu")
  shape = M.BsvsShape(40, 10, 1)
  assert simulation.default_chunk_size(_mech("shuffle-multi", shape, 10**6), _workload(shape, 10**6)) == 2**18


@pytest.mark.parametrize("name", ["laplace", "rr", "shuffle-multi"])
def test_an_accelerator_sized_chunk_gives_the_same_numbers(monkeypatch, name):
  # The default only picks the chunk: with the accelerator's choice (one chunk of all 20,000 clients) the
  # statistics and estimate are bitwise those of explicit chunks of 4,096 (5 chunks of 4,000).
  shape = M.BsvsShape(10, 4, 1)
  mech, work = _mech(name, shape, 20_000), _workload(shape, 20_000)
  small = simulation.simulate(jax.random.key(3), mech, work, chunk_size=4096)
  monkeypatch.setattr(_runner, "_platform", lambda mesh: "gpu")
  big = simulation.simulate(jax.random.key(3), mech, work)
  assert (small.chunk_size, big.chunk_size) == (4000, 20_000)
  for a, b in zip(jax.tree.leaves(small.stats), jax.tree.leaves(big.stats)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(small.estimate, big.estimate)


def test_default_chunk_size_names_bad_arguments():
  with pytest.raises(ValueError, match="Expected mechanism to be a BsvsMechanism"):
    simulation.default_chunk_size("rr")
  with pytest.raises(ValueError, match="devices"):
    simulation.default_chunk_size(_mech("rr"), None, 0)
