"""Run in a subprocess with 8 host devices (XLA_FLAGS set before jax is imported).

Prints one JSON object: for every case and every (devices, chunk_size), the
summed statistics and the estimate as nested lists (exact integers; floats
via float.hex so equality is bitwise). A run ``[devices, chunk, "default"]``
wraps the mechanism in ``_toy.DefaultPath`` (the contract's default
``chunk_statistics`` instead of the mechanism's fast path). A case's
``commit`` places the source's arrays on devices first (see :func:`commit`).
"""

import json
import sys

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxdistill import mechanisms as M
from jaxdistill import simulation
from tests.simulation import _toy


def encode(x):
  x = np.asarray(x)
  if x.dtype.kind == "f":
    return [float(v).hex() for v in x.reshape(-1)]
  return x.reshape(-1).tolist()


def commit(source, where):
  """``source`` as is (None), committed to the last device ("last"), or sharded along clients over all ("all")."""
  if where is None:
    return source
  if where == "last":
    return jax.device_put(source, jax.devices()[-1])
  sharding = NamedSharding(simulation.client_mesh(), P(simulation.CLIENT_AXIS))
  return M.BsvsInput(*(jax.device_put(a, sharding) for a in source))


def main():
  cases = json.loads(sys.argv[1])
  out = {"num_devices": len(jax.devices()), "cases": {}}
  for case in cases:
    mech, work = _toy.build(case)
    source = commit(work.materialize() if case["source"] == "arrays" else work, case.get("commit"))
    runs = {}
    for dev, chunk, *path in case["runs"]:
      default = path == ["default"]
      run_mech = _toy.DefaultPath(mech) if default else mech
      res = simulation.simulate(jax.random.key(case["seed"]), run_mech, source, chunk_size=chunk,
                                devices=dev, with_counts=True)
      runs["/".join(map(str, [dev, chunk, *path]))] = {
          "stats": [encode(leaf) for leaf in jax.tree.leaves(res.stats)],
          "estimate": encode(res.estimate), "counts": encode(res.counts),
          "num_devices": res.num_devices, "default_path": default}
    out["cases"][case["name"]] = runs
  print(json.dumps(out))


if __name__ == "__main__":
  main()
