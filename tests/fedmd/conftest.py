"""Tiny synthetic FedMD data (12x12 images) and tiny CNNs, so runner tests take seconds."""

import numpy as np
import pytest

from jaxdistill import fedmd
from jaxdistill.data import ImageData
from jaxdistill.models import CNNSpec

SHAPE = (12, 12, 1)
TINY_SPECS = (CNNSpec((2, 4), 0.2), CNNSpec((2, 2, 4), 0.2))


def synthetic(n, classes, seed):
  """Class c sets a white pixel block at a class-specific place on noise in [0, 0.5): learnable, not trivial."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, classes, n).astype(np.int32)
  x = rng.random((n,) + SHAPE).astype(np.float32) * 0.5
  for i, c in enumerate(y):
    r, q = divmod(int(c) % 16, 4)
    x[i, 3 * r:3 * r + 3, 3 * q:3 * q + 3, 0] = 1.0  # pixels stay in [0, 1], as ImageData requires
  return ImageData(x, y, classes, f"synthetic{seed}")


def tiny_data(num_parties=3, per_class=12, partition="iid", seed=0):
  public = synthetic(60, 10, seed)
  private_train = synthetic(300, 10, seed + 1)
  private_test = synthetic(200, 10, seed + 2)
  return fedmd.make_fedmd_data(public, private_train, private_test, num_parties=num_parties, seed=seed,
                               private_classes=(0, 1, 2, 3, 4, 5), private_per_class=per_class,
                               test_per_class=8, partition=partition)


def tiny_config(**kw):
  base = dict(method="nfdp", num_parties=3, specs=TINY_SPECS, width_multiplier=1.0, k=4, rounds=2,
              public_subset=24, pretrain_epochs=1, init_epochs=2, digest_epochs=1, revisit_epochs=1,
              private_batch_size=4, public_batch_size=16, vmap="off")
  base.update(kw)
  if "k" not in kw and not (base["method"] in ("nfdp", "local-sample")
                            or (base["method"] == "ldp" and base.get("ldp_delta") is None)):
    del base["k"]  # the small k only where the method reads it: FedMDConfig refuses it elsewhere
  for name in ("public_subset", "digest_epochs"):  # likewise: only the methods that collaborate read them, in rounds
    if name not in kw and (base["method"] not in ("nfdp", "np", "ldp") or base["rounds"] == 0):
      del base[name]
  return fedmd.FedMDConfig(**base)


@pytest.fixture(scope="session")
def data3():
  return tiny_data()
