"""The contract every BSVS mechanism follows, so one runner serves them all.

A mechanism is a frozen (hashable) dataclass holding its parameters and its
:class:`~jaxdistill.mechanisms.BsvsShape`. It splits into the pieces a real
deployment has:

* ``randomize(key, buckets, labels) -> message``: what one client computes
  and sends (local and shuffle models), or its exact contribution (central
  model). Pure, key first, fixed shapes: jittable and vmappable over clients.
* ``analyze(message) -> stats``: what the server extracts from one message,
  as an *integer* pytree. Statistics are summed over clients; integer sums
  are exact and order-free, which is what makes simulations bitwise
  reproducible for any chunk size or device count.
* ``estimate(key, stats, num_clients) -> [s, |Y|] float64``: the server's
  final estimate of A on the host (central noise is drawn here from ``key``).
* ``privacy() -> PrivacyStatement``: the guarantee, built from the same
  parameters the sampler uses.
* ``entry_variance(counts, num_clients) -> [s, |Y|] float64``: the
  closed-form variance of each estimated entry given the true counts.
* ``entry_bias(counts, num_clients) -> [s, |Y|] float64``: the closed-form
  bias E[estimate] - A (zero unless a mechanism documents otherwise), so the
  predicted error of a biased estimator is its MSE, not its variance.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import numpy as np

from jaxdistill.accounting import PrivacyStatement
from jaxdistill.mechanisms._bsvs import BsvsShape

__all__ = ["BsvsMechanism"]


class BsvsMechanism(abc.ABC):
  """Abstract base of BSVS mechanisms (subclasses are frozen dataclasses)."""

  shape: BsvsShape
  #: Short name used by the CLI and reports.
  name: str = "mechanism"

  @abc.abstractmethod
  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> Any:
    """One client's message from its ``buckets [k]`` and ``labels [r]`` (-1 pads)."""

  @abc.abstractmethod
  def analyze(self, message: Any) -> Any:
    """Integer statistics the server extracts from one message."""

  @abc.abstractmethod
  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    """float64 ``[s, |Y|]`` estimate of A from summed statistics."""

  @abc.abstractmethod
  def privacy(self) -> PrivacyStatement:
    """The mechanism's guarantee, from the same parameters as the sampler."""

  @abc.abstractmethod
  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    """Closed-form variance of each estimated entry, float64 ``[s, |Y|]``."""

  def entry_bias(self, counts: Any, num_clients: int) -> np.ndarray:
    """Closed-form bias E[estimate] - A of each entry (unbiased mechanisms: 0)."""
    del num_clients
    return np.zeros(np.shape(counts), np.float64)

  def entry_mse(self, counts: Any, num_clients: int) -> np.ndarray:
    """Closed-form mean squared error per entry: variance + bias^2."""
    bias = self.entry_bias(counts, num_clients)
    return np.asarray(self.entry_variance(counts, num_clients), np.float64) + bias * bias
