"""Test configuration: Hypothesis profiles and shared helpers.

Profiles (select with ``HYPOTHESIS_PROFILE=thorough`` or
``pytest --hypothesis-profile=thorough``):

* ``ci`` (default): derandomized (fixed seed), bounded ``max_examples``, no
  deadline (the first call of a jitted function compiles). Used by ``.ci/run``.
* ``thorough``: many more examples, still reproducible, for release checks. Tests marked
  ``@pytest.mark.thorough`` (larger cases of a claim whose small cases run in every profile) run only
  under it; the ``ci`` profile reports them as skipped.
"""

import gc
import os

import jax
import pytest
from hypothesis import HealthCheck, settings

from tests import _fast_threefry

# Faster XLA:CPU compiles of jax.random draws, every bit unchanged: see tests/_fast_threefry.py.
_fast_threefry.install()

#: The thorough profile's examples: how pytest_collection_modifyitems tells it is active.
THOROUGH_EXAMPLES = 600

settings.register_profile(
    "ci", max_examples=25, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "thorough", max_examples=THOROUGH_EXAMPLES, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  # Runs after Hypothesis's plugin has loaded the profile --hypothesis-profile names.
  if settings().max_examples >= THOROUGH_EXAMPLES:
    return
  skip = pytest.mark.skip(reason="a release check: runs under the thorough Hypothesis profile")
  for item in items:
    if item.get_closest_marker("thorough") is not None:
      item.add_marker(skip)


def _mapped_regions() -> int:
  """Memory mappings of this process (0 where /proc is missing)."""
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0


def _map_limit() -> int:
  try:
    with open("/proc/sys/vm/max_map_count", "rb") as f:
      return int(f.read())
  except (OSError, ValueError):
    return 65530


#: Every executable XLA:CPU compiles keeps memory mappings while JAX caches it, and a worker that ran 32 test files
#: (2026-12-06) passed vm.max_map_count = 65,530: its next compile segfaulted in LLVM (two files alone reach
#: 27,000). After a test file, a worker past half the limit drops JAX's caches, which frees them.
MAPS_CLEAR_AT = _map_limit() // 2


@pytest.fixture(autouse=True, scope="module")
def _bounded_memory_mappings():
  yield
  if _mapped_regions() > MAPS_CLEAR_AT:
    jax.clear_caches()
    gc.collect()
