"""Sharding over devices: bitwise-identical results for any device count and chunk size.

The device counts run in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
(the flag only works if set before jax is imported, so it cannot be set in
the pytest process). The subprocess compares 1, 2 and 8 devices and several
chunk sizes on two test mechanisms (array and generator sources, pytree
statistics; this process recomputes their reference), and one library
mechanism per family (``REPRESENTATIVES``: central, local hashing, product,
shuffle), each once with its own ``chunk_statistics`` fast path on one
device and once with the contract's default path on 8 devices in chunks of
13. Every compilation costs a second or two, so the other registered
mechanisms run the same fast-vs-default, chunk-size comparison on one
device in test_runner.py.
"""

import functools
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxdistill import simulation
from tests.simulation import _toy

ROOT = pathlib.Path(__file__).resolve().parents[2]
N = 301  # not a multiple of any chunk size or device count used


#: One library mechanism per family, with its client source in the subprocess.
REPRESENTATIVES = {"laplace": "arrays", "collision": "arrays", "separation": "arrays",
                   "shuffle-multi": "generator"}


def _cases():
  base = {"n": N, "s": 5, "y": 3, "k": 2, "epsilon": 1.0}
  cases = [
      # (devices, chunk size[, "default"]) runs; the first is the reference. Each run
      # compiles once (~1-2 s), so they cover every device count and several chunk
      # sizes without the full product.
      {**base, "name": "toy-arrays", "mechanism": "toy", "source": "arrays", "seed": 1,
       # None = the default, all devices (8 in the subprocess).
       "runs": [[1, 4096], [1, 7], [2, 64], [None, 7]]},
      {**base, "name": "toy-generator", "mechanism": "toy", "source": "generator", "seed": 2,
       "runs": [[1, 4096], [2, 1], [8, 50]]},
      # Sources committed to devices outside the run's mesh: rows (or a generator's key) on device 7, or rows
      # sharded over all 8 devices (the several-hosts recipe) while the run uses 1 or 2. jit refused these
      # ("Received incompatible devices for jitted computation"); the runner now moves them onto its mesh.
      {**base, "name": "toy-committed-last", "mechanism": "toy", "source": "arrays", "seed": 3, "commit": "last",
       "runs": [[1, 4096], [2, 7]]},
      {**base, "name": "toy-committed-generator", "mechanism": "toy", "source": "generator", "seed": 4,
       "commit": "last", "runs": [[2, 50]]},
      {**base, "n": 304, "name": "toy-committed-all", "mechanism": "toy", "source": "arrays", "seed": 5,
       "commit": "all", "runs": [[2, 7], [1, 4096]]},
  ]
  for i, (name, source) in enumerate(REPRESENTATIVES.items()):
    spec = simulation.mechanism_spec(name)
    # "default": the run uses tests.simulation._toy.DefaultPath (the contract's default
    # chunk_statistics), so it also checks the mechanism's fast path, bitwise.
    cases.append({**base, "name": name, "mechanism": name, "source": source, "seed": 10 + i,
                  "delta": 1e-6 if spec.needs_delta else None,
                  "runs": [[1, 4096], [8, 13, "default"]]})
  return cases


@functools.lru_cache(maxsize=1)
def _subprocess_runs():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
             PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, "-m", "tests.simulation._device_script", json.dumps(_cases())],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_subprocess_sees_eight_devices_and_uses_them_by_default():
  out = _subprocess_runs()
  assert out["num_devices"] == 8
  assert out["cases"]["toy-arrays"]["None/7"]["num_devices"] == 8


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_bitwise_identical_across_devices_and_chunks(case):
  runs = _subprocess_runs()["cases"][case["name"]]
  assert len(runs) == len(case["runs"])
  ref_key = "{}/{}".format(*case["runs"][0])
  for label, run in runs.items():
    dev = label.split("/")[0]
    assert run["default_path"] == label.endswith("/default")
    assert run["num_devices"] == (8 if dev == "None" else int(dev))
    assert run["stats"] == runs[ref_key]["stats"], label
    assert run["estimate"] == runs[ref_key]["estimate"], label
    assert run["counts"] == runs[ref_key]["counts"], label
  if case["mechanism"] != "toy":
    return
  # ... and equal to this process's own single-device run.
  mech, work = _toy.build(case)
  source = work.materialize() if case["source"] == "arrays" else work
  here = simulation.simulate(jax.random.key(case["seed"]), mech, source, with_counts=True)
  assert [np.asarray(x).reshape(-1).tolist() for x in jax.tree.leaves(here.stats)] == \
      runs[ref_key]["stats"]
  assert [float(v).hex() for v in here.estimate.reshape(-1)] == runs[ref_key]["estimate"]


def test_toy_statistics_equal_a_plain_loop():
  # The sharded runner's sum is the definition: sum_i analyze(randomize(fold_in(key, i), x_i)).
  mech, work = _toy.build({"n": 11, "s": 5, "y": 3, "k": 2, "seed": 3, "mechanism": "toy"})
  inp = work.materialize()
  key = jax.random.key(5)
  got = simulation.client_statistics(key, mech, inp, chunk_size=4)
  one = jax.jit(lambda k, b, lab: mech.analyze(mech.randomize(k, b, lab)))
  want = None
  for i in range(11):
    s = one(jax.random.fold_in(key, i), inp.buckets[i], inp.labels[i])
    want = s if want is None else jax.tree.map(lambda a, b: a + b, want, s)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
