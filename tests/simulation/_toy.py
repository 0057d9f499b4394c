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


def build(case):
  """(mechanism, workload) of a JSON-able case description."""
  work = M.synthetic_workload(jax.random.key(case["seed"] + 1000), num_clients=case["n"],
                              num_buckets=case["s"], num_labels=case["y"], k=case["k"],
                              r=case.get("r", 1))
  if case["mechanism"] == "toy":
    return ToyPytree(work.shape), work
  mech = simulation.build_mechanism(case["mechanism"], work.shape, epsilon=case["epsilon"],
                                    delta=case.get("delta"), num_clients=case["n"])
  return mech, work
