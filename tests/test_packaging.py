"""pyproject's lower bounds are the versions CI tests: .ci/minimum-versions.txt pins each one, and .ci/run uses it.

Until 2026-12-05 the bounds were never installed: with ``jax>=0.4.30`` a user who had jax 0.4.30 got an
AttributeError from ``python -m jaxdistill label`` (no ``jax.errors.JaxRuntimeError``), and dp-accounting 0.4.4
has no ``RandomizedResponseDpEvent``.
"""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).parent.parent
PINS = ROOT / ".ci" / "minimum-versions.txt"


def _name(name):
  return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503 normalisation


def lower_bounds():
  """{name: version} for every runtime and ``test`` requirement, each of which must read name>=version."""
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  bounds = {}
  for req in project["dependencies"] + project["optional-dependencies"]["test"]:
    match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)>=([0-9]+(?:\.[0-9]+)*)", req)
    assert match, f"{req!r} should read name>=version, a lower bound that CI can pin and test"
    bounds[_name(match[1])] = match[2]
  return bounds


def pinned_versions():
  pins = {}
  for line in PINS.read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if line:
      name, sep, version = line.partition("==")
      assert sep, f"{line!r} in {PINS.name} should read name==version"
      assert _name(name) not in pins, f"{name} is pinned twice"
      pins[_name(name)] = version.strip()
  return pins


def test_every_lower_bound_is_pinned_and_nothing_else():
  assert pinned_versions() == lower_bounds()


def test_jax_and_jaxlib_floors_match():
  bounds = lower_bounds()
  assert bounds["jax"] == bounds["jaxlib"]


def test_ci_installs_the_pins_in_its_own_environment_and_runs_tests_there():
  lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  install = [i for i, line in enumerate(lines) if "-c .ci/minimum-versions.txt" in line and "'.[test]'" in line]
  assert install, ".ci/run should install '.[test]' under -c .ci/minimum-versions.txt"
  venv = [i for i, line in enumerate(lines) if line.startswith("python3 -m venv .ci-venv-min")]
  assert venv and venv[0] < install[0], "the pinned install should go into a fresh .ci-venv-min"
  assert any("python -m pytest" in line for line in lines[install[0] + 1:]), "and run pytest there"
