"""Mechanism names (as the CLI and benchmarks spell them) -> library classes.

Each entry names a class of :mod:`jaxdistill.mechanisms` and how to build it
from the common parameters (shape, epsilon, delta, n). Adding a mechanism is
one :class:`MechanismSpec` line in ``_SPECS``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxdistill import _validate
from jaxdistill import mechanisms as _mechanisms
from jaxdistill.mechanisms import BsvsMechanism, BsvsShape
from jaxdistill.mechanisms._bsvs import check_shape

__all__ = ["MechanismSpec", "mechanism_names", "mechanism_spec", "build_mechanism"]


# build(cls, shape, epsilon, delta, num_clients) -> mechanism
Builder = Callable[[type, BsvsShape, float, Any, int], BsvsMechanism]


@dataclasses.dataclass(frozen=True)
class MechanismSpec:
  """How to build one named mechanism.

  Attributes:
    name: the CLI name, e.g. ``"collision"``.
    cls: the :class:`~jaxdistill.mechanisms.BsvsMechanism` subclass.
    model: ``"central"``, ``"local"`` or ``"shuffle"``.
    needs_delta: whether the guarantee is (epsilon, delta) with delta > 0
      given by the caller (shuffle protocols).
    build: ``(cls, shape, epsilon, delta, num_clients) -> mechanism``.
    summary: one line for ``--help``.
  """

  name: str
  cls: type
  model: str
  needs_delta: bool
  build: Builder
  summary: str = ""


def _plain(cls, shape, epsilon, delta, num_clients):
  del delta, num_clients
  return cls(shape, epsilon)


def _shuffle(cls, shape, epsilon, delta, num_clients):
  return cls(shape, epsilon, delta, num_clients)


def _shuffle_rr(cls, shape, epsilon, delta, num_clients):
  return cls(shape, epsilon, delta, num_clients, local="rr")


_SPECS = (
    MechanismSpec("laplace", _mechanisms.CentralLaplace, "central", False, _plain,
                  "central Laplace on A (sensitivity 2kr, replace-one)"),
    MechanismSpec("discrete-laplace", _mechanisms.CentralDiscreteLaplace, "central", False, _plain,
                  "central discrete Laplace on the integer counts"),
    MechanismSpec("rr", _mechanisms.RandomizedResponse, "local", False, _plain,
                  "local randomized response on every bit, eps' = eps / (2kr)"),
    MechanismSpec("collision", _mechanisms.Collision, "local", False, _plain,
                  "local Collision mechanism (hashing into l outputs)"),
    MechanismSpec("separation", _mechanisms.Separation, "local", False, _plain,
                  "local Collision on buckets and on labels, eps/2 each"),
    MechanismSpec("concatenation", _mechanisms.Concatenation, "local", False, _plain,
                  "local Collision on [T; y], unbiased estimator"),
    MechanismSpec("concatenation-literal", _mechanisms.ConcatenationLiteral, "local", False, _plain,
                  "the paper's Concatenation estimator (biased; for comparison)"),
    MechanismSpec("shuffle-multi", _mechanisms.ShuffleMultiMessage, "shuffle", True, _shuffle,
                  "multi-message shuffle with distributed discrete-Laplace noise"),
    MechanismSpec("shuffle-single", _mechanisms.ShuffleSingleMessage, "shuffle", True, _shuffle_rr,
                  "single-message shuffle of an eps0-LDP randomized response"),
)
_REGISTRY = {s.name: s for s in _SPECS}


def mechanism_names() -> tuple[str, ...]:
  """Every registered name."""
  return tuple(_REGISTRY)


def mechanism_spec(name: str) -> MechanismSpec:
  """The :class:`MechanismSpec` of ``name``; raises ``ValueError`` if unknown."""
  return _REGISTRY[_validate.choice("name (a mechanism name)", name, mechanism_names())]


def build_mechanism(name: str, shape: BsvsShape, *, epsilon: Any, delta: Any = None,
                    num_clients: Any = None) -> BsvsMechanism:
  """Builds the mechanism registered as ``name``.

  Args:
    name: one of :func:`mechanism_names`.
    shape: BSVS sizes.
    epsilon: target epsilon > 0 (local epsilon for local mechanisms, central
      epsilon for central and shuffle ones).
    delta: target delta in (0, 1); required by shuffle mechanisms, ignored
      by pure ones.
    num_clients: n >= 1; required by shuffle mechanisms (their noise is
      calibrated to n).

  Returns:
    A :class:`~jaxdistill.mechanisms.BsvsMechanism`.

  Raises:
    ValueError: an unknown name, bad epsilon/delta/num_clients, or a missing
      delta or n for a shuffle mechanism.
  """
  spec = mechanism_spec(name)
  check_shape(shape)
  eps = _validate.positive("epsilon", epsilon)
  if spec.needs_delta:
    if delta is None:
      raise ValueError(f"Expected delta for mechanism {name!r} (an (epsilon, delta) guarantee).")
    delta = _validate.open_unit("delta", delta)
    if num_clients is None:
      raise ValueError(f"Expected num_clients for mechanism {name!r}.")
  elif delta is not None:
    delta = _validate.probability("delta", delta)
  if num_clients is not None:
    num_clients = _validate.integer("num_clients", num_clients, minimum=1)
  return spec.build(spec.cls, shape, eps, delta, num_clients)
