"""Shuffle DP, single message: one eps0-LDP message per client, amplified by shuffling.

Each client sends one message from an eps0-LDP local randomizer (randomized
response or Collision on its A^i); a shuffler permutes the n messages. By
Feldman, McMillan, Talwar (FOCS 2021) the shuffled multiset is
(epsilon, delta)-DP for an epsilon much smaller than eps0. This mechanism
inverts that bound: given a central target (epsilon, delta) and n, it runs
the local randomizer at the largest eps0 whose shuffled output meets the
target (:func:`jaxdistill.accounting.shuffle_local_epsilon`; numeric clone
reduction by default, the closed form of Theorem 3.1 optionally).

Notes (spec REVERSE_KNN.md §5):

* I4: the validity condition of the closed form, eps0 <= ln(n / (16 ln(4/delta))),
  concerns the *local* eps0, not the central epsilon; the numeric method has
  no such condition.
* I7: the printed Theorem 3.1 and the authors' code differ slightly (ln(2/delta)
  against ln(4/delta) in the check, and a smaller epsilon); ``closed-form`` takes
  the code's stricter check and larger epsilon, and the default numeric method
  needs neither.
* I11: the guarantee is per record with one record per client (n = |D_priv|).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import PrivacyStatement, Relation, ShuffleAmplification, shuffle_local_epsilon
from jaxdistill.accounting._shuffle import _MAX_EPS0, MAX_N, _check_eps_floor, _check_numeric_n
from jaxdistill.mechanisms._base import BsvsMechanism
from jaxdistill.mechanisms._bsvs import BsvsShape, check_shape
from jaxdistill.mechanisms._collision import Collision
from jaxdistill.mechanisms._randomized_response import RandomizedResponse

__all__ = ["ShuffleSingleMessage", "LOCAL_RANDOMIZERS"]

#: Local randomizers ``ShuffleSingleMessage`` can wrap.
LOCAL_RANDOMIZERS = ("rr", "collision")


@functools.lru_cache(maxsize=64)
def _amplification(eps: float, n: int, delta: float, method: str) -> ShuffleAmplification:
  return shuffle_local_epsilon(eps, n, delta, method=method)


def _local_mechanism(local: str, shape: BsvsShape, eps0: float) -> BsvsMechanism:
  return (RandomizedResponse if local == "rr" else Collision)(shape, eps0)


@dataclasses.dataclass(frozen=True)
class ShuffleSingleMessage(BsvsMechanism):
  """One eps0-LDP message per client, shuffled; eps0 calibrated to a central target.

  .. math::

     \\varepsilon_0 = \\max\\{e_0 : \\text{n shuffled } e_0\\text{-LDP messages are }
                      (\\varepsilon, \\delta)\\text{-DP}\\}.

  The message, statistics, estimate and variance are those of the wrapped
  local mechanism at eps0 (``local_mechanism``).

  Formal guarantees:
    (epsilon, delta)-DP of the shuffled multiset of the n messages under
    replace-one (n fixed; one record per client), with epsilon <= the target
    as certified by the chosen amplification bound; each message alone is
    eps0-LDP.

  References:
    Feldman, McMillan, Talwar, "Hiding Among the Clones: A Simple and Nearly
    Optimal Analysis of Privacy Amplification by Shuffling", FOCS 2021,
    Theorem 3.1 and the numerical bound of Appendix E
    (https://arxiv.org/abs/2012.12803); the reverse-k-NN paper
    (arXiv:2207.13253), "Shuffle DP".

  Attributes:
    shape: BSVS sizes.
    epsilon: target central epsilon.
    delta: target central delta.
    num_clients: n, the number of shuffled messages.
    local: ``rr`` (:class:`RandomizedResponse`) or ``collision``.
    method: ``numeric`` (clone reduction, default) or ``closed-form``.
    eps0: the calibrated local epsilon (derived).
    amplification: the :class:`ShuffleAmplification` behind eps0 (derived).
    local_mechanism: the wrapped local mechanism at eps0 (derived).

  Raises:
    ValueError: bad epsilon (outside (0, 60]), delta, num_clients, local or
      method, or no eps0 > 0 meets the target under ``closed-form``.
  """

  shape: BsvsShape
  epsilon: float
  delta: float
  num_clients: int
  local: str = "rr"
  method: str = "numeric"
  name: str = dataclasses.field(default="shuffle-single", init=False)
  eps0: float = dataclasses.field(init=False, compare=False, repr=True)
  amplification: ShuffleAmplification = dataclasses.field(init=False, compare=False, repr=False)
  local_mechanism: BsvsMechanism = dataclasses.field(init=False, compare=False, repr=False)

  def __post_init__(self):
    check_shape(self.shape)
    eps = _validate.positive("epsilon", self.epsilon)
    if eps > _MAX_EPS0:  # e^-eps0 < 1e-26: no amplification left to calibrate (accounting._shuffle)
      raise ValueError(f"Expected epsilon={eps!r} <= {_MAX_EPS0:g}, the largest central epsilon the shuffle "
                       f"accounting supports.")
    delta = _validate.open_unit("delta", self.delta)
    n = _validate.integer("num_clients", self.num_clients, minimum=1, maximum=MAX_N)
    local = _validate.choice("local", self.local, LOCAL_RANDOMIZERS)
    method = _validate.choice("method", self.method, ("numeric", "closed-form"))
    # The accounting's own limits, checked under this class's names (it calls them target_epsilon and n).
    _check_eps_floor("epsilon", eps)
    if method == "numeric":
      _check_numeric_n(n, "num_clients")
    amp = _amplification(eps, n, delta, method)
    try:
      mech = _local_mechanism(local, self.shape, amp.eps0)
    except ValueError as err:  # it names "epsilon", which here is eps0, not the caller's epsilon
      raise ValueError(f"The calibrated local eps0={amp.eps0!r} (from epsilon={eps!r}, delta={delta!r}, "
                       f"num_clients={n}) does not fit local={local!r}: {_validate.first_line(err)}") from None
    for name, value in (("epsilon", eps), ("delta", delta), ("num_clients", n), ("eps0", amp.eps0),
                        ("amplification", amp), ("local_mechanism", mech)):
      object.__setattr__(self, name, value)

  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> Any:
    return self.local_mechanism.randomize(key, buckets, labels)

  def analyze(self, message: Any) -> Any:
    return self.local_mechanism.analyze(message)

  def chunk_statistics(self, keys: jax.Array, buckets: jax.Array, labels: jax.Array,
                       valid: jax.Array) -> Any:
    return self.local_mechanism.chunk_statistics(keys, buckets, labels, valid)

  def chunk_width(self) -> int:
    return self.local_mechanism.chunk_width()

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    return self.local_mechanism.estimate(key, stats, num_clients)

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    return self.local_mechanism.entry_variance(counts, num_clients)

  @property
  def max_error_method(self) -> str:
    return getattr(self.local_mechanism, "max_error_method", "exact-tail-union")

  def max_error_bound(self, beta: Any, counts: Any = None, num_clients: Any = None) -> float | None:
    """The wrapped local mechanism's bound (randomized response: Chernoff + union), or ``None``."""
    hook = getattr(self.local_mechanism, "max_error_bound", None)
    return hook(beta, counts, num_clients) if callable(hook) else None

  def privacy(self) -> PrivacyStatement:
    amp = self.amplification
    return PrivacyStatement(
        mechanism="shuffle-single-message", relation=Relation.REPLACE_ONE, epsilon=amp.epsilon,
        delta=amp.delta, count=1, method=amp.method,
        parameters={"eps0": amp.eps0, "n": amp.n, "local": self.local,
                    "local_mechanism": self.local_mechanism.name, "target_epsilon": self.epsilon,
                    "fell_back": amp.fell_back, "d": self.shape.d, "k": self.shape.k, "r": self.shape.r,
                    "model": "shuffle"})
