"""Key-first public functions: a bad key fails at the boundary; a legacy PRNGKey gives the typed key's numbers."""

import jax
import numpy as np
import pytest

from jaxdistill import _keys
from jaxdistill import _validate as v
from jaxdistill import connection, fedmd, labeling, mechanisms, representations, simulation

_X = np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)
_IMAGES = np.random.default_rng(1).random((16, 28, 28, 1)).astype(np.float32)
_SHAPE = mechanisms.BsvsShape(3, 2, 1)


def _workload():
  return mechanisms.synthetic_workload(jax.random.key(5), num_clients=12, num_buckets=3, num_labels=2, k=1)


# One cheap call per public key-first function; each returns something comparable.
CALLS = {
    "connection.kmeans": lambda k: connection.kmeans(k, _X, 3).centres,
    "connection.select_queries": lambda k: connection.select_queries(k, _X, 3).query_indices,
    "mechanisms.synthetic_workload": lambda k: mechanisms.synthetic_workload(
        k, num_clients=12, num_buckets=3, num_labels=2, k=1).materialize()[0],
    "mechanisms.sample_negative_binomial": lambda k: mechanisms.sample_negative_binomial(k, 2.0, 0.5, (3,)),
    "simulation.simulate": lambda k: simulation.simulate(
        k, mechanisms.CentralLaplace(_SHAPE, 1.0), _workload()).estimate,
    "simulation.client_statistics": lambda k: simulation.client_statistics(
        k, mechanisms.RandomizedResponse(_SHAPE, 1.0), _workload()),
    "fedmd.nfdp_sample": lambda k: fedmd.nfdp_sample(k, 10, 3),
    "representations.augment": lambda k: representations.augment(k, _IMAGES[0]),
    "representations.fit_representation": lambda k: representations.fit_representation(
        k, "pca", _IMAGES, num_components=3)(_IMAGES),
    "labeling.train_student": lambda k: labeling.train_student(
        k, labeling.StudentConfig(epochs=1, widths=(2, 2), batch_size=8), _IMAGES,
        np.arange(16) % 2, 2).accuracy(_IMAGES, np.arange(16) % 2),
}


def _leaves(x):
  return [np.asarray(a) for a in jax.tree.leaves(x)]


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("bad", [0, None, 1.5, np.zeros(2, np.int32)], ids=["int", "None", "float", "int32"])
def test_bad_key_is_a_value_error_naming_key(name, bad):
  with pytest.raises(ValueError, match=r"Expected key to be a PRNG key from jax.random.key\(seed\)"):
    CALLS[name](bad)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_legacy_key_gives_the_typed_keys_numbers(name):
  typed = _leaves(CALLS[name](jax.random.key(3)))
  legacy = _leaves(CALLS[name](jax.random.PRNGKey(3)))
  assert len(typed) == len(legacy) and all(np.array_equal(a, b) for a, b in zip(typed, legacy))


def test_prng_key_validator():
  key = jax.random.key(7)
  assert v.prng_key("key", key) is key
  assert np.array_equal(jax.random.key_data(v.prng_key("key", jax.random.PRNGKey(7))), jax.random.key_data(key))
  with pytest.raises(ValueError, match="single PRNG key; got a batch of shape \\(2,\\)"):
    v.prng_key("key", jax.random.split(key))
  with pytest.raises(ValueError, match="not legacy key data either"):
    v.prng_key("key", np.zeros(3, np.uint32))
  assert v.prng_key("keys", jax.random.split(jax.random.PRNGKey(0), 4), batched=True).shape == (4,)
  with pytest.raises(ValueError, match="1-D batch"):
    v.prng_key("keys", key, batched=True)
  # Inside jit the check reads only dtype and shape, and the numbers are the legacy key's.
  draw = jax.jit(lambda k: jax.random.normal(v.prng_key("key", k)))
  assert float(draw(jax.random.PRNGKey(1))) == float(jax.random.normal(jax.random.PRNGKey(1)))


def test_secret_key_is_fresh_or_a_function_of_all_64_bits_of_its_seed():
  draws = [np.asarray(jax.random.key_data(simulation.secret_key())) for _ in range(4)]
  # Fresh 63-bit seeds: two equal keys have probability ~2^-63.
  assert len({d.tobytes() for d in draws}) == 4
  same = [np.asarray(jax.random.key_data(simulation.secret_key(2**40 + 5))) for _ in range(2)]
  np.testing.assert_array_equal(*same)
  low = np.asarray(jax.random.key_data(simulation.secret_key(5)))
  assert not np.array_equal(low, same[0])  # the high 32 bits enter the key
  # 64 fresh seeds all below 2**32 has probability 2**-(31*64) for 63-bit seeds.
  seeds = [_keys.draw_secret_seed() for _ in range(64)]
  assert all(0 <= s < 2**63 for s in seeds) and max(seeds) >= 2**32
  # Seeds that differ in one bit (any of the 64) give different keys: no bit is dropped on the way to the key.
  base = 0x0123456789ABCDEF
  flipped = {np.asarray(jax.random.key_data(simulation.secret_key(base ^ (1 << b)))).tobytes() for b in range(64)}
  flipped.add(np.asarray(jax.random.key_data(simulation.secret_key(base))).tobytes())
  assert len(flipped) == 65
  top = [np.asarray(jax.random.key_data(simulation.secret_key(2**64 - 1))) for _ in range(2)]
  np.testing.assert_array_equal(*top)  # the largest seed is accepted, and is a function of its bits
  est = [simulation.simulate(simulation.secret_key(s), mechanisms.CentralLaplace(_SHAPE, 1.0), _workload()).estimate
         for s in (7, 7, 8)]
  np.testing.assert_array_equal(est[0], est[1])
  assert not np.array_equal(est[0], est[2])
  for bad in (-1, 2**64, 1.5, "7", True):
    with pytest.raises(ValueError, match="seed") as err:
      simulation.secret_key(bad)
    assert str(bad) not in str(err.value)  # a mistyped secret is still a secret
