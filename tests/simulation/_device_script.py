"""Run in a subprocess with 8 host devices (XLA_FLAGS set before jax is imported).

Prints one JSON object: for every case and every (devices, chunk_size), the
summed statistics and the estimate as nested lists (exact integers; floats
via float.hex so equality is bitwise).
"""

import json
import sys

import jax
import numpy as np

from jaxdistill import mechanisms as M
from jaxdistill import simulation
from tests.simulation import _toy


def encode(x):
  x = np.asarray(x)
  if x.dtype.kind == "f":
    return [float(v).hex() for v in x.reshape(-1)]
  return x.reshape(-1).tolist()


def main():
  cases = json.loads(sys.argv[1])
  out = {"num_devices": len(jax.devices()), "cases": {}}
  for case in cases:
    mech, work = _toy.build(case)
    source = work.materialize() if case["source"] == "arrays" else work
    runs = {}
    for dev, chunk in case["runs"]:
      if True:
        res = simulation.simulate(jax.random.key(case["seed"]), mech, source, chunk_size=chunk,
                                  devices=dev, with_counts=True)
        runs[f"{dev}/{chunk}"] = {
            "stats": [encode(leaf) for leaf in jax.tree.leaves(res.stats)],
            "estimate": encode(res.estimate), "counts": encode(res.counts),
            "num_devices": res.num_devices}
    out["cases"][case["name"]] = runs
  print(json.dumps(out))


if __name__ == "__main__":
  main()
