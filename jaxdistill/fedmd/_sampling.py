"""NFDP's sampler: k of a party's n records, once, with or without replacement.

The sampler and its privacy description are built from the same three
numbers ``(n, k, with_replacement)``:

* without replacement (WOR): a uniform k-subset; every record is in the
  sample with probability p = k/n;
* with replacement (WR): k i.i.d. uniform draws; record j appears
  ``Binomial(k, 1/n)`` times and is in the sample with probability
  p = 1 - (1 - 1/n)^k.

Released quantities that depend on the private data only through the sample
have the flat privacy profile delta(eps) = p for every eps >= 0 (see
:func:`jaxdistill.accounting.nfdp_privacy`).

:class:`SampleOracle` is the *only* handle the FedMD runner has on a party's
private records in NFDP mode: it hands out samples and counts the draws, and
the privacy report is computed from that count (one draw reused for all
rounds, or a fresh draw per round, composed).

References:
  Sun & Lyu, "Federated Model Distillation with Noise-Free Differential
  Privacy", IJCAI 2021, Algorithm 1, Theorems 1-2. https://arxiv.org/abs/2009.05537
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill import accounting
from jaxdistill.data import ImageData

__all__ = ["MAX_K", "MAX_WOR_N", "NfdpSampler", "SampleOracle", "nfdp_sample"]


#: Largest party size: the sample's indices are int32.
_MAX_N = 2**31 - 1

#: Largest sample size k, with or without replacement (2^31 - 1). Without replacement k <= n <= 2^31 - 1
#: already; with replacement k had no bound: the sample is a [k] int32 array, and at k = 3e9 or 1e12 JAX aborted
#: the whole process (``Check failed: buffer_.IsConcrete()``, SIGABRT) instead of raising. A k this large also
#: needs k images in memory; :func:`jaxdistill.fedmd.check_config` compares that with the host's memory.
MAX_K = 2**31 - 1


#: Largest party size n that is *sampled* without replacement: ``jax.random.choice(replace=False)`` permutes all n
#: indices whatever k is (k = 1: n = 2^24 took 23 s and 1.1 GiB, 2^26 126 s and 3.6 GiB; 2^31 would need about
#: 110 GiB, and the out-of-memory killer ended the process before any error). The accounting
#: (:meth:`NfdpSampler.privacy`) has no such limit; sample with replacement beyond it.
MAX_WOR_N = 2**26


def check_sampling_size(n: int, with_replacement: bool) -> None:
  """Refuses to sample without replacement from more than :data:`MAX_WOR_N` records (one-line ValueError)."""
  if not with_replacement and n > MAX_WOR_N:
    raise ValueError(f"Expected n={n} <= MAX_WOR_N = 2^26 to sample without replacement: the sampler permutes all "
                     "n indices (2^26 took 126 s and 3.6 GiB); use with_replacement=True (CLI: --with-replacement).")


def _check(n: Any, k: Any, with_replacement: Any) -> tuple[int, int, bool]:
  n = _validate.integer("n", n, minimum=1, maximum=_MAX_N)
  k = _validate.integer("k", k, minimum=1, maximum=MAX_K)
  with_replacement = _validate.boolean("with_replacement", with_replacement)
  if not with_replacement and k > n:
    raise ValueError(f"Expected k={k} <= n={n} for sampling without replacement.")
  return n, k, with_replacement


@functools.partial(jax.jit, static_argnames=("n", "k", "with_replacement"))
def _sample(key: jax.Array, *, n: int, k: int, with_replacement: bool) -> jax.Array:
  if with_replacement:
    return jax.random.randint(key, (k,), 0, n, dtype=jnp.int32)
  return jax.random.choice(key, n, (k,), replace=False).astype(jnp.int32)


def nfdp_sample(key: jax.Array, n: int, k: int, *, with_replacement: bool = False) -> jax.Array:
  """Indices ``[k] int32`` of NFDP's sample from a party with n records.

  .. math::

     \\text{WOR: } S \\sim \\mathrm{Unif}\\binom{[n]}{k}, \\qquad
     \\text{WR: } S = (s_1, \\dots, s_k),\\ s_j \\overset{iid}{\\sim} \\mathrm{Unif}[n].

  Formal guarantees:
    Anything computed from the records ``S`` (and independent randomness)
    is (eps, p)-DP for every eps >= 0 under add/remove-one, with p = k/n
    (WOR) or 1 - (1 - 1/n)^k (WR), and for no smaller delta at any eps.

  References:
    Sun & Lyu 2021, Theorems 1-2 (arXiv:2009.05537); spec/NFDP.md §1.1 for
    the exact flat profile.

  Args:
    key: PRNG key.
    n: number of records (>= 1).
    k: sample size (1 <= k <= :data:`MAX_K` = 2^31 - 1; <= n without
      replacement).
    with_replacement: WR if True, else WOR.

  Returns:
    ``[k] int32`` indices into the party's records (WOR: distinct).

  Raises:
    ValueError: if k > n without replacement, n, k < 1, n, k > 2^31 - 1, or
      n > :data:`MAX_WOR_N` without replacement.

  >>> idx = nfdp_sample(jax.random.key(0), 10, 3)
  >>> idx.shape, len(set(idx.tolist()))
  ((3,), 3)
  """
  key = _validate.prng_key("key", key)
  n, k, with_replacement = _check(n, k, with_replacement)
  check_sampling_size(n, with_replacement)
  return _sample(key, n=n, k=k, with_replacement=with_replacement)


@dataclasses.dataclass(frozen=True)
class NfdpSampler:
  """NFDP's sampler with its privacy description, from the same parameters.

  Attributes:
    n: the party's number of records (1 <= n <= 2^31 - 1).
    k: sample size (1 <= k <= :data:`MAX_K` = 2^31 - 1; <= n without
      replacement).
    with_replacement: WR or WOR.
  """

  n: int
  k: int
  with_replacement: bool = False

  def __post_init__(self):
    n, k, wr = _check(self.n, self.k, self.with_replacement)
    object.__setattr__(self, "n", n)
    object.__setattr__(self, "k", k)
    object.__setattr__(self, "with_replacement", wr)

  def sample(self, key: jax.Array) -> jax.Array:
    """``[k] int32`` indices (see :func:`nfdp_sample`; parameters checked at construction)."""
    key = _validate.prng_key("key", key)
    check_sampling_size(self.n, self.with_replacement)
    return _sample(key, n=self.n, k=self.k, with_replacement=self.with_replacement)

  def privacy(self, *, rounds: int = 1, resample_each_round: bool = False,
              relation: Any = accounting.Relation.ADD_OR_REMOVE) -> accounting.NfdpPrivacy:
    """The exact privacy of releases computed from this sampler's output(s)."""
    return accounting.nfdp_privacy(self.n, self.k, with_replacement=self.with_replacement,
                                   relation=relation, rounds=rounds,
                                   resample_each_round=resample_each_round)


def _integer_array(name: str, value: Any) -> np.ndarray:
  """``value`` as an int64 array of indices, or a one-line ValueError naming ``name``.

  Indices 0.5 and 1.2 were truncated to 0 and 1 silently, NaN gave NumPy's "cannot convert float NaN to
  integer", None a TypeError and 10^30 an OverflowError.
  """
  try:
    arr = np.asarray(value)
  except (TypeError, ValueError):
    raise ValueError(f"Expected {name} to be an array of integer indices; got {type(value).__name__}.") from None
  if arr.dtype.kind not in "iu" or (arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max):
    shown = f"{arr.reshape(-1)[:4].tolist()!r:.80}"
    raise ValueError(f"Expected {name} to be an array of integer indices; got dtype {arr.dtype} "
                     f"({shown}{'...' if arr.size > 4 else ''}).")
  return arr.astype(np.int64)


class SampleOracle:
  """A party's private records behind NFDP's sampler: the only access path.

  ``draw(key)`` returns the sampled records and records the indices; the
  records themselves are never returned otherwise. :meth:`privacy` accounts
  for the draws actually made: one draw reused for R rounds gives
  delta = p, d fresh draws give 1 - (1 - p)^d.

  Args:
    records: the party's private :class:`ImageData` (n records).
    sampler: an :class:`NfdpSampler` with ``sampler.n == len(records)``.

  Raises:
    ValueError: ``records`` not an :class:`ImageData` (a bare array's ``take``
      flattens it), ``sampler`` not an :class:`NfdpSampler`, or sizes that differ.
  """

  def __init__(self, records: ImageData, sampler: NfdpSampler):
    # A str sampler was an AttributeError, records=None a TypeError, and an ndarray was accepted.
    if not isinstance(records, ImageData):
      raise ValueError(f"Expected records to be a jaxdistill.data.ImageData; got {type(records).__name__}.")
    if not isinstance(sampler, NfdpSampler):
      raise ValueError(f"Expected sampler to be an NfdpSampler; got {type(sampler).__name__}.")
    if sampler.n != len(records):
      raise ValueError(f"Expected sampler.n={sampler.n} to equal the party's {len(records)} records.")
    self._records = records
    self.sampler = sampler
    self.draws: list[np.ndarray] = []

  @property
  def n(self) -> int:
    return self.sampler.n

  def draw(self, key: jax.Array) -> ImageData:
    """Draws a fresh sample, records it, and returns its records."""
    idx = np.asarray(self.sampler.sample(key))
    self.draws.append(idx)
    return self._records.take(idx)

  def replay(self, indices: Any) -> ImageData:
    """Re-materialises a sample drawn earlier (e.g. restored from a checkpoint).

    Costs no privacy: the indices must already be among the recorded draws
    (or are restored as such by :meth:`restore`).
    """
    idx = _integer_array("indices", indices)
    if not any(d.shape == idx.shape and np.array_equal(d, idx) for d in self.draws):
      raise ValueError("replay() only re-materialises a sample that was already drawn.")
    return self._records.take(idx)

  def restore(self, draws: list[Any]) -> None:
    """Restores the draw history from a checkpoint (no new draws).

    Args:
      draws: a sequence of samples, each k integer indices in [0, n).

    Raises:
      ValueError: an oracle that has drawn already, or ``draws`` not a
        sequence of such samples (nothing is restored then).
    """
    if self.draws:
      raise ValueError("restore() needs an oracle that has not drawn yet.")
    if not _validate.is_collection(draws):
      raise ValueError(f"Expected draws to be a sequence of samples (index arrays); got {type(draws).__name__}.")
    checked = []
    for i, d in enumerate(draws):
      d = _integer_array(f"draws[{i}]", d)
      if d.shape != (self.sampler.k,) or d.min() < 0 or d.max() >= self.n:
        raise ValueError(f"Checkpointed sample of shape {d.shape} does not fit n={self.n}, k={self.sampler.k}.")
      if not self.sampler.with_replacement and len(np.unique(d)) != d.size:
        raise ValueError("Checkpointed WOR sample has repeated indices.")
      checked.append(d)
    self.draws.extend(checked)

  def privacy(self, *, rounds: int, relation: Any = accounting.Relation.ADD_OR_REMOVE) -> accounting.NfdpPrivacy:
    """Exact privacy of everything released over ``rounds`` rounds, from the draws made.

    Raises:
      ValueError: if more than one draw was made but fewer than ``rounds``
        (a schedule this report does not describe).
    """
    rounds = _validate.integer("rounds", rounds, minimum=1)  # rounds=None with 2 draws was "Made 2 draws over ..."
    d = len(self.draws)
    if d <= 1:
      return self.sampler.privacy(rounds=rounds, resample_each_round=False, relation=relation)
    if d != rounds:
      raise ValueError(f"Made {d} draws over rounds={rounds}: expected 1 (reused) or one per round.")
    return self.sampler.privacy(rounds=rounds, resample_each_round=True, relation=relation)
