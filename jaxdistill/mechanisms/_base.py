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

One optional hook serves speed, not semantics:

* ``chunk_statistics(keys, buckets, labels, valid) -> stats``: the summed
  statistics of a chunk of clients, i.e. the runner's inner step. The default
  vmaps ``analyze(randomize(...))`` over the chunk and sums. A mechanism may
  override it with a cheaper computation of the *same integers* (scatter-add
  sparse events instead of summing dense per-client arrays, build a hash
  table once instead of twice), subject to the rules in its docstring;
  ``tests/simulation/test_runner.py`` checks every override against the
  default, bitwise.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import PrivacyStatement
from jaxdistill.mechanisms._bsvs import BsvsInput, BsvsShape, check_input_fits

__all__ = ["BsvsMechanism"]


class BsvsMechanism(abc.ABC):
  """Abstract base of BSVS mechanisms (subclasses are frozen dataclasses)."""

  shape: BsvsShape
  #: Short name used by the CLI and reports.
  name: str = "mechanism"

  @abc.abstractmethod
  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> Any:
    """One client's message from its ``buckets [k]`` and ``labels [r]`` (-1 pads).

    Every implementation first checks ``key`` (a ``ValueError`` for anything but a PRNG key or legacy
    ``uint32`` key data, as :func:`jax.random.key` makes), then calls
    :func:`~jaxdistill.mechanisms._bsvs.check_client`:
    a ``ValueError`` for a client wider than the shape's k or r (also under ``jit``),
    and for concrete inputs, an index out of range or listed twice; host inputs
    are then copied to int32 device arrays, never shared with the caller.
    """

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

  def chunk_statistics(self, keys: jax.Array, buckets: jax.Array, labels: jax.Array,
                       valid: jax.Array) -> Any:
    """Summed statistics of one chunk of C clients (what the runner adds up).

    .. math:: S = \\sum_{i < C,\\ \\mathrm{valid}_i}
              \\mathrm{analyze}(\\mathrm{randomize}(\\mathrm{keys}_i,
              \\mathrm{buckets}_i, \\mathrm{labels}_i))

    The default computes exactly this (vmap over the chunk, mask, sum). An
    override must return the same integers bitwise for every chunk, which
    holds when (1) client i's randomness comes only from ``keys[i]``, drawn
    as the default would draw it, and (2) sums are integer (exact and
    order-free). Then results stay independent of the chunk size and the
    device count. Overrides must be jittable with fixed shapes; data-dependent
    work (e.g. a number of events) goes into ``lax.while_loop`` rounds of a
    fixed size.

    Args:
      keys: ``[C]`` PRNG keys, client i's key at row i.
      buckets: int32 ``[C, k]`` (-1 pads).
      labels: int32 ``[C, r]`` (-1 pads).
      valid: bool ``[C]``; rows with False (padding past n) contribute nothing.

    Returns:
      The statistics pytree of :meth:`analyze`, summed over valid rows (same
      shapes and dtypes as one client's statistics).
    """
    def one(key, b, lab, ok):
      stats = self.analyze(self.randomize(key, b, lab))
      return jax.tree.map(lambda x: jnp.where(ok, x, jnp.zeros_like(x)), stats)

    stats = jax.vmap(one)(keys, buckets, labels, valid)
    return jax.tree.map(lambda x: x.sum(axis=0, dtype=x.dtype), stats)

  def chunk_width(self) -> int:
    """Values per client that :meth:`chunk_statistics` holds at once: its memory is O(C x this).

    The default path materialises every client's statistics, so ``d = s|Y|``
    (a conservative figure for mechanisms whose messages are narrower).
    Sparse overrides return less; the runner sizes its default chunk by it
    on accelerators (:func:`jaxdistill.simulation.default_chunk_size`).
    """
    return self.shape.d

  def entry_bias(self, counts: Any, num_clients: int) -> np.ndarray:
    """Closed-form bias E[estimate] - A of each entry (unbiased mechanisms: 0), float64 ``[s, |Y|]``.

    ``counts`` (None, or A) and ``num_clients`` are checked as :meth:`entry_variance` checks them: the zeros
    used to take any shape, NaN or 'abc' from ``counts``.
    """
    count_free_clients(self.shape, counts, num_clients)
    return np.zeros((self.shape.num_buckets, self.shape.num_labels), np.float64)

  def entry_mse(self, counts: Any, num_clients: int) -> np.ndarray:
    """Closed-form mean squared error per entry: variance + bias^2."""
    bias = self.entry_bias(counts, num_clients)
    return np.asarray(self.entry_variance(counts, num_clients), np.float64) + bias * bias


def entry_counts(shape: BsvsShape, counts: Any, num_clients: Any) -> tuple[np.ndarray, int]:
  """The closed forms' inputs, checked: A as float64 ``[s, |Y|]`` with entries in [0, n], and n >= 1.

  A client adds at most 1 to an entry (its buckets and labels are distinct),
  so an entry above n, a negative one, or n < 1 cannot come from real votes
  and would give a negative or NaN variance.
  """
  n = _validate.integer("num_clients", num_clients, minimum=1)
  a = _validate.real_array("counts", counts)
  if a.size != shape.num_buckets * shape.num_labels:
    raise ValueError(f"Expected counts with s*|Y| = {shape.num_buckets}*{shape.num_labels} entries; got shape "
                     f"{a.shape}.")
  a = a.reshape(shape.num_buckets, shape.num_labels)
  if not (np.isfinite(a).all() and (a >= 0).all() and (a <= n).all()):
    raise ValueError(f"Expected counts in [0, num_clients={n}]; found values in [{a.min()}, {a.max()}].")
  return a, n


def count_free_clients(shape: BsvsShape, counts: Any, num_clients: Any) -> int:
  """n, checked, for a variance that does not depend on A: ``counts`` may be None, else it is checked too.

  Such mechanisms used to ignore ``counts`` unread, so ``"abc"`` or NaN passed as counts.
  """
  if counts is None:
    return _validate.integer("num_clients", num_clients, minimum=1)
  return entry_counts(shape, counts, num_clients)[1]


def summed_stats(name: str, stats: Any, dims: tuple[int, ...], num_clients: Any) -> np.ndarray:
  """Statistics summed over n clients, each adding 0 or 1 per entry: float64 ``dims``, or a ValueError.

  A local mechanism's server statistics (bits set, hash hits) are such sums, so each entry lies in
  [0, n]. NaN, a negative count, a bool array, or an array of another shape (a transposed ``[|Y|, s]``
  was silently reshaped) cannot be one. Fractions pass: the estimators are linear, and their expected
  statistics give the expected estimate. Accepted shapes: ``dims`` itself, or flat ``[prod(dims)]``.
  """
  n = _validate.integer("num_clients", num_clients, minimum=1)
  a = _validate.real_array(name, stats)
  size = int(np.prod(dims))
  if a.shape not in (tuple(dims), (size,)):
    raise ValueError(f"Expected {name} of shape {list(dims)} (or flat [{size}]); got shape {list(a.shape)}.")
  bad = ~np.isfinite(a) | (a < 0) | (a > n)
  if bad.any():
    raise ValueError(f"Expected {name} to hold counts in [0, num_clients={n}]; found "
                     f"{float(a[bad].reshape(-1)[0])!r}.")
  return a.reshape(dims)


def check_clients_fit(mechanism: BsvsMechanism, clients: Any, n: int) -> None:
  """The clients must fit the shape (and n) the mechanism's noise and privacy statement were built for.

  Otherwise the run would silently drop entries (buckets >= s, labels >= |Y|)
  or report a guarantee that does not hold (more than k buckets per client
  raise the sensitivity; a shuffle mechanism's amplification or noise split
  is computed for its own ``num_clients``).

  A generator's rows are what ``clients.client(index)`` returns, so their
  widths and dtypes come from :func:`jax.eval_shape` of it, whatever its
  ``shape`` attribute declares: a declared k = 1 with rows of 2 buckets added
  2 entries per client under noise calibrated to 1. The rows must be 1-D
  integer arrays (a float bucket 1.7 was truncated to 1; a scalar has no
  width); their values are checked during the run (``-1`` pads for signed
  dtypes).
  """
  shape = mechanism.shape
  calibrated_n = getattr(mechanism, "num_clients", None)
  if calibrated_n is not None and n != calibrated_n:
    raise ValueError(f"Expected {calibrated_n} clients, the num_clients {type(mechanism).__name__} was built for "
                     f"(its privacy statement holds for exactly that many); got {n}.")
  if isinstance(clients, BsvsInput):
    check_input_fits(clients, shape, n)
    return
  declared = getattr(clients, "shape", None)
  pairs = []
  if isinstance(declared, BsvsShape):  # the workload's own bounds: an early, named refusal
    pairs += [("num_buckets", declared.num_buckets, shape.num_buckets),
              ("num_labels", declared.num_labels, shape.num_labels)]
  out = jax.eval_shape(clients.client, jax.ShapeDtypeStruct((), jnp.uint32))
  if not (isinstance(out, (tuple, list)) and len(out) == 2
          and all(isinstance(o, jax.ShapeDtypeStruct) for o in out)):
    raise ValueError(f"Expected clients.client(index) to return a pair (buckets [k], labels [r]); got "
                     f"{jax.tree.structure(out)}.")
  for name, row, bound_name, bound in (("buckets", out[0], "k", shape.k), ("labels", out[1], "r", shape.r)):
    if row.ndim != 1 or row.shape[0] < 1:
      raise ValueError(f"Expected clients.client(index) to return {name} of shape [{bound_name}] with "
                       f"{bound_name} >= 1 (-1 pads); got shape {tuple(row.shape)}.")
    if not jnp.issubdtype(row.dtype, jnp.integer):
      raise ValueError(f"Expected clients.client(index) to return integer {name}; got dtype {row.dtype}.")
    pairs.append((bound_name, row.shape[0], bound))
  for name, got, bound in pairs:
    if got > bound:
      raise ValueError(f"Expected the workload's {name} <= the mechanism's {name}={bound}; got {got}.")
