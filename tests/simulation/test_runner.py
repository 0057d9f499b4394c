"""The streaming runner: exact sums, chunk invariance, generator == arrays."""

import jax
import numpy as np
import pytest

from jaxdistill import mechanisms as M
from jaxdistill import simulation


def test_statistics_equal_a_plain_loop():
  w = M.synthetic_workload(jax.random.key(0), num_clients=37, num_buckets=5, num_labels=3, k=2)
  inp = w.materialize()
  mech = M.RandomizedResponse(w.shape, 1.0)
  key = jax.random.key(9)
  got = np.asarray(simulation.client_statistics(key, mech, inp, chunk_size=8))
  want = sum(np.asarray(mech.analyze(mech.randomize(jax.random.fold_in(key, i), inp.buckets[i], inp.labels[i])))
             for i in range(37))
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_bitwise_identical_for_any_chunk_size(chunk):
  w = M.synthetic_workload(jax.random.key(0), num_clients=500, num_buckets=6, num_labels=3, k=1)
  mech = M.RandomizedResponse(w.shape, 0.7)
  ref = simulation.simulate(jax.random.key(4), mech, w.materialize(), chunk_size=500)
  got = simulation.simulate(jax.random.key(4), mech, w, chunk_size=chunk)
  np.testing.assert_array_equal(got.estimate, ref.estimate)
  assert got.estimate.dtype == np.float64


def test_rejects_unknown_clients():
  mech = M.RandomizedResponse(M.BsvsShape(2, 2, 1), 1.0)
  with pytest.raises(ValueError, match="clients"):
    simulation.simulate(jax.random.key(0), mech, [1, 2, 3])
