"""Small mechanisms defined by the tests, and case builders shared with subprocesses."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import accounting
from jaxdistill import mechanisms as M
from jaxdistill import simulation


@dataclasses.dataclass(frozen=True)
class ToyPytree(M.BsvsMechanism):
  """A test mechanism with a pytree message and pytree integer statistics.

  Each client sends its true entries plus one uniform "decoy" entry and a
  Bernoulli(1/3) coin; the statistics are a dict of two [d] histograms and a
  scalar coin count. It exists to exercise the runner, not privacy.
  """

  shape: M.BsvsShape
  name: str = dataclasses.field(default="toy", init=False)

  def randomize(self, key, buckets, labels):
    k_decoy, k_coin = jax.random.split(key)
    ent = M.client_entries(buckets, labels, self.shape.num_labels)
    decoy = jax.random.randint(k_decoy, (), 0, self.shape.d)
    return {"entries": ent, "decoy": decoy, "coin": jax.random.bernoulli(k_coin, 1 / 3)}

  def analyze(self, message):
    d = self.shape.d
    ent = message["entries"]
    real = jnp.zeros(d + 1, jnp.int32).at[jnp.where(ent >= 0, ent, d)].add(1)[:d]
    return {"real": real, "decoy": jax.nn.one_hot(message["decoy"], d, dtype=jnp.int32),
            "coin": message["coin"].astype(jnp.int32)}

  def estimate(self, key, stats, num_clients):
    noise = np.asarray(jax.random.normal(key, (self.shape.d,)), np.float64)  # server-side noise
    est = np.asarray(stats["real"], np.float64) + noise
    return est.reshape(self.shape.num_buckets, self.shape.num_labels)

  def entry_variance(self, counts, num_clients):
    return np.ones((self.shape.num_buckets, self.shape.num_labels))

  def privacy(self):
    return accounting.PrivacyStatement(mechanism="toy", relation=accounting.Relation.REPLACE_ONE,
                                       epsilon=float("inf"), delta=1.0)


@dataclasses.dataclass(frozen=True)
class DefaultPath(M.BsvsMechanism):
  """Wraps a mechanism but keeps the contract's *default* ``chunk_statistics``.

  Running the wrapper gives the statistics as the definition states them
  (vmap of analyze(randomize(...)) per chunk), whatever fast path the inner
  mechanism overrides ``chunk_statistics`` with.
  """

  inner: M.BsvsMechanism

  @property
  def shape(self):  # type: ignore[override]
    return self.inner.shape

  def randomize(self, key, buckets, labels):
    return self.inner.randomize(key, buckets, labels)

  def analyze(self, message):
    return self.inner.analyze(message)

  def estimate(self, key, stats, num_clients):
    return self.inner.estimate(key, stats, num_clients)

  def privacy(self):
    return self.inner.privacy()

  def entry_variance(self, counts, num_clients):
    return self.inner.entry_variance(counts, num_clients)


# The calibrated noise of ShuffleMultiMessage(eps = 1, delta = 1e-6, k = 2, r = 1), given
# explicitly so that building the mechanism checks one PLD instead of calibrating (~7 s).
SHUFFLE_NOISE = accounting.MultiMessageNoise(0.8824969025845955, 17.06269273787, 0.7788007830714049)


def build(case):
  """(mechanism, workload) of a JSON-able case description."""
  work = M.synthetic_workload(jax.random.key(case["seed"] + 1000), num_clients=case["n"],
                              num_buckets=case["s"], num_labels=case["y"], k=case["k"],
                              r=case.get("r", 1))
  if case["mechanism"] == "toy":
    return ToyPytree(work.shape), work
  if case["mechanism"] == "shuffle-multi" and (case["epsilon"], case.get("delta"), case["k"],
                                               case.get("r", 1)) == (1.0, 1e-6, 2, 1):
    return M.ShuffleMultiMessage(work.shape, 1.0, 1e-6, case["n"], noise=SHUFFLE_NOISE), work
  mech = simulation.build_mechanism(case["mechanism"], work.shape, epsilon=case["epsilon"],
                                    delta=case.get("delta"), num_clients=case["n"])
  return mech, work
