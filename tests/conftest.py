"""Test configuration: Hypothesis profiles and shared helpers.

Profiles (select with ``HYPOTHESIS_PROFILE=thorough`` or
``pytest --hypothesis-profile=thorough``):

* ``ci`` (default): derandomized (fixed seed), bounded ``max_examples``, no
  deadline (the first call of a jitted function compiles). Used by ``.ci/run``.
* ``thorough``: many more examples, still reproducible, for release checks.
"""

import os

from hypothesis import HealthCheck, settings

from tests import _fast_threefry

# Faster XLA:CPU compiles of jax.random draws, every bit unchanged: see tests/_fast_threefry.py.
_fast_threefry.install()

settings.register_profile(
    "ci", max_examples=25, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "thorough", max_examples=600, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
