"""Shuffle DP, multi-message: real messages plus negative-binomial noise and flooding.

Adapts the histogram protocol of Ghazi, Kumar, Manurangsi, Pagh (ICML 2020)
to BSVS at the *message* level (spec REVERSE_KNN.md §1.9, §4). For every
entry j of the flattened domain d = s|Y|, client i sends

* its real messages: one ``(j, +)`` per non-zero entry of A^i (at most kr);
* Z1 ~ NB(1/n, p) copies of ``(j, +)`` and Z2 ~ NB(1/n, p) copies of ``(j, -)``;
* Z3 ~ NB(rho/n, p') flooding copies of *both* ``(j, +)`` and ``(j, -)``.

A shuffler permutes all messages uniformly; the analyzer counts them:

.. math::

   \\hat a_j = \\#(j,+) - \\#(j,-) = a_j + \\mathrm{DLap}(p),\\qquad
   \\mathrm{Var}[\\hat a_j] = \\frac{2p}{(1-p)^2},

because n shares NB(1/n, p) sum to NB(1, p) (geometric; with float shares,
at least NB(1, p): see :meth:`ShuffleMultiMessage.share_shapes`), the difference of
two geometrics is discrete Laplace, and flooding cancels. The guarantee is
*computed* (the paper's constants were not recovered): see
:mod:`jaxdistill.accounting` (``multi_message_pld``) for the exact
per-entry view, its PLD and the calibration.

In the streaming simulation a client's message is its per-entry message
counts ``int32 [d, 2]`` (column 0: ``+``, column 1: ``-``), which is exactly
the multiset of its messages; :func:`shuffle_multi_message_protocol`
materialises every message as an ``(index, sign)`` pair, applies a real
uniformly random permutation and runs the analyzer on the shuffled list.
"""

from __future__ import annotations

import copy
import dataclasses
import fractions
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import PrivacyStatement
from jaxdistill.accounting._multi_message import (
    MAX_CALIBRATION_EPSILON,
    MultiMessageNoise,
    calibrate_multi_message,
    min_calibration_epsilon,
    multi_message_delta,
    multi_message_expected_messages,
    multi_message_statement,
)
from jaxdistill.mechanisms import _bounds
from jaxdistill.mechanisms._base import BsvsMechanism, check_clients_fit, count_free_clients
from jaxdistill.mechanisms._bsvs import (BsvsInput, BsvsShape, check_client, check_shape, client_entries,
                                         entry_histogram, input_num_clients)
from jaxdistill.mechanisms._nb_sampler import (
    MIN_PROB,
    CompoundPoissonTables,
    compound_poisson_event_counts,
    compound_poisson_event_marks,
    compound_poisson_events,
    compound_poisson_tables,
    random_access_supported,
)

__all__ = ["ShuffleMultiMessage", "MultiMessageTranscript", "shuffle_multi_message_protocol"]


@dataclasses.dataclass(frozen=True)
class ShuffleMultiMessage(BsvsMechanism):
  """Multi-message shuffle protocol on the flattened A^i (d = s|Y| entries).

  .. math::

     \\#(j,+) = a_j + \\sum_i (Z_{1,ij} + Z_{3,ij}),\\quad
     \\#(j,-) = \\sum_i (Z_{2,ij} + Z_{3,ij}),\\quad
     Z_1, Z_2 \\sim \\mathrm{NB}(1/n, p),\\ Z_3 \\sim \\mathrm{NB}(\\rho/n, p').

  Expected messages per client: kr + 2dp/(n(1-p)) + 2d rho p'/(n(1-p')).

  Formal guarantees:
    (epsilon, delta)-DP of the shuffled multiset under replace-one (n fixed,
    every one of the ``num_clients`` clients participating), where delta is
    the pessimistic PLD of kr up- and kr down-shifts of the exact per-entry
    view (x + G1 + F, G2 + F) (no group privacy; spec §5 I3), plus
    (1 + e^eps) times the sampler's total-variation bound (about 1e-18 at
    n = 10^6; see :func:`jaxdistill.mechanisms.sample_negative_binomial`).
    The noise parameters are calibrated to the target unless given.

  References:
    Ghazi, Kumar, Manurangsi, Pagh, "Private Counting from Anonymous
    Messages: Near-Optimal Accuracy with Vanishing Communication Overhead",
    ICML 2020 (PMLR 119:3505-3514), the binary-summation randomizer and its
    histogram extension (their constants were not recovered, spec §4; the
    guarantee here is computed); the reverse-k-NN paper
    (https://arxiv.org/abs/2207.13253), "Shuffle DP".

  Attributes:
    shape: BSVS sizes.
    epsilon: target central epsilon.
    delta: target central delta.
    num_clients: n, the number of clients that split the noise.
    dlap_fraction: share of epsilon spent on the discrete Laplace part
      (calibration only, so another value than 1/2 only with
      ``noise=None``); 1/2 gives the paper's accuracy.
    noise: the central noise parameters; calibrated when ``None``. Given
      parameters must meet (epsilon, delta) or construction raises.

  Raises:
    ValueError: bad epsilon (outside (0, 60], or so large that (1 + e^eps)
      times the sampler's total variation exceeds delta), delta, num_clients,
      dlap_fraction, or noise that does not meet (epsilon, delta).
  """

  shape: BsvsShape
  epsilon: float
  delta: float
  num_clients: int
  dlap_fraction: float = 0.5
  noise: MultiMessageNoise | None = None
  name: str = dataclasses.field(default="shuffle-multi", init=False)

  def __post_init__(self):
    check_shape(self.shape)
    eps = _validate.positive("epsilon", self.epsilon)
    if eps > MAX_CALIBRATION_EPSILON:
      raise ValueError(f"Expected epsilon={eps!r} <= {MAX_CALIBRATION_EPSILON:g}, the largest epsilon the "
                       f"multi-message accounting supports.")
    delta = _validate.open_unit("delta", self.delta)
    n = _validate.integer("num_clients", self.num_clients, minimum=1)
    frac = _validate.open_unit("dlap_fraction", self.dlap_fraction)
    for name, value in (("epsilon", eps), ("delta", delta), ("num_clients", n), ("dlap_fraction", frac)):
      object.__setattr__(self, name, value)
    calibrated = self.noise is None
    if not calibrated and frac != 0.5:  # given noise skips the calibration: the statement recorded a split never made
      raise ValueError(f"Expected dlap_fraction=0.5 (the default) with noise given: it only splits epsilon for the "
                       f"calibration, which given noise skips; got dlap_fraction={frac!r}.")
    least = min_calibration_epsilon(k=self.shape.k, r=self.shape.r, dlap_fraction=frac)
    if calibrated and eps < least:
      raise ValueError(f"Expected epsilon={eps!r} >= {least:.3g}, the smallest epsilon the multi-message "
                       f"calibration supports at k={self.shape.k}, r={self.shape.r}, dlap_fraction={frac:g} "
                       f"(below it the exact accounting needs minutes to hours and many GiB).")
    if calibrated:
      calibrate = functools.partial(calibrate_multi_message, eps, k=self.shape.k, r=self.shape.r,
                                    dlap_fraction=frac)
      object.__setattr__(self, "noise", calibrate(delta))
    elif not isinstance(self.noise, MultiMessageNoise):
      raise ValueError(f"Expected noise to be a MultiMessageNoise or None; got {type(self.noise)}.")
    for name, prob in (("p", self.noise.p), ("p_flood", self.noise.p_flood)):
      if prob < MIN_PROB:  # not a num_clients problem: the message below would mislead
        raise ValueError(f"Expected noise.{name}={prob!r} >= {MIN_PROB:g}: the sampler's 50-digit tables resolve "
                         f"ln(1 - p) only from there.")
    try:
      self.tables()  # fail here, not inside a jit trace
    except ValueError as err:
      # Only the events-per-draw limit is a num_clients problem; the cell limit and a p near 1 were reported as
      # one too, and no number of clients fixes them.
      if "fewer events per draw" in str(err):
        raise ValueError(f"Expected more num_clients than {n} for d={self.shape.d} and noise={self.noise}: "
                         f"one client's noise shares are too large to sample ({err})") from None
      if "cells=" in str(err):
        raise ValueError(f"Expected num_buckets * num_labels = d = {self.shape.d} small enough for the "
                         f"multi-message sampler's tables ({err})") from None
      raise ValueError(f"Expected noise.p={self.noise.p!r} and noise.p_flood={self.noise.p_flood!r} that the "
                       f"multi-message sampler's tables can resolve ({err})") from None
    if calibrated and self.privacy().delta > delta:
      # The sampler's TV term (~1e-18) did not fit in the calibration's slack: recalibrate.
      extra = self.privacy().delta - multi_message_delta(self.noise, eps, k=self.shape.k, r=self.shape.r)
      if 2 * extra >= delta:
        tv = self.sampler_tv_bound()
        raise ValueError(f"Expected epsilon={eps!r} small enough that the sampler's total-variation term "
                         f"(1 + e^eps) tv = {(1.0 + math.exp(eps)) * tv:.3g} (tv = {tv:.3g}) leaves room in "
                         f"delta={delta}; with num_clients={n} that needs epsilon below about ln(delta / (2 tv)) = "
                         f"{math.log(delta / (2 * tv)):.3g}.")
      object.__setattr__(self, "noise", calibrate(delta - 2 * extra))
    achieved = self.privacy().delta
    if achieved > delta:
      raise ValueError(f"Expected noise={self.noise} to meet (epsilon={eps}, delta={delta}); "
                       f"its delta at epsilon is {achieved:.4g}.")

  # -- sampler ---------------------------------------------------------------------
  def share_shapes(self) -> tuple[float, float]:
    """One client's NB shapes ``(a, b)``: the geometric streams' and the flooding stream's.

    The n shares sum to NB(n a, p) and NB(n b, p_flood). ``a`` and ``b`` are the smallest float64
    with n a >= 1 and n b >= rho exactly: fl(1/n) and fl(rho/n) alone can fall short (n = 3,000:
    n fl(1/n) = 1 - 3.3e-17), and less noise than analysed is not covered by the statement. A surplus
    (at most an ulp per client) is independent extra noise on the counts, NB(n a - 1, p) on each of
    #(j, +) and #(j, -), a post-processing of the analysed view.
    """
    return _share(1.0, self.num_clients), _share(self.noise.rho, self.num_clients)

  def tables(self) -> CompoundPoissonTables:
    """Host tables of the three noise streams (Z1, Z2, Z3) over the d entries."""
    a, b = self.share_shapes()
    nz = self.noise
    return compound_poisson_tables((a, a, b), (nz.p, nz.p, nz.p_flood), self.shape.d)

  def sampler_tv_bound(self) -> float:
    """Total variation between all n clients' sampled messages and the law of :meth:`share_shapes`.

    That law is the analysed one plus independent surplus noise (a post-processing), so this bound is
    all the statement adds to delta.
    """
    return self.num_clients * self.tables().tv_bound

  def randomize(self, key: jax.Array, buckets: jax.Array, labels: jax.Array) -> jax.Array:
    """int32 ``[d, 2]``: the client's number of ``(j, +)`` and ``(j, -)`` messages."""
    key = _validate.prng_key("key", key)
    buckets, labels = check_client(self.shape, buckets, labels)
    d = self.shape.d
    ent = client_entries(buckets, labels, self.shape.num_labels)
    cell, stream, size = compound_poisson_events(key, self.tables())  # streams: Z1, Z2, Z3
    # Flattened [d, 2] counts: slot 2j is (j, +), 2j + 1 is (j, -); slot 2d drops padding.
    slots = jnp.concatenate([jnp.where(ent >= 0, 2 * ent, 2 * d),  # real messages
                             jnp.where(stream == 1, 2 * cell + 1, 2 * cell),  # Z1 -> +, Z2 -> -
                             jnp.where(stream == 2, 2 * cell + 1, 2 * d)])  # Z3 also -> -
    values = jnp.concatenate([jnp.ones_like(ent), size, size])
    return jnp.zeros(2 * d + 1, jnp.int32).at[slots].add(values)[:2 * d].reshape(d, 2)

  def analyze(self, message: jax.Array) -> jax.Array:
    """The counts pass through; the runner sums them over clients."""
    return message.astype(jnp.int32)

  def chunk_statistics(self, keys: jax.Array, buckets: jax.Array, labels: jax.Array,
                       valid: jax.Array) -> jax.Array:
    """int32 ``[d, 2]`` summed counts of a chunk, by scatter-adding its few noise events.

    A client's noise is a handful of compound-Poisson events (about
    ``tables().rate`` per client, ~0.016 at n = 10^6, d = 400), so instead of
    C dense ``[d, 2]`` arrays this draws every client's event count (3 words
    of its key's stream), lists the chunk's events, and evaluates only those,
    ``B`` at a time in a ``while_loop``; each event's words are read from the
    same positions of the client's stream as :meth:`randomize` reads them
    (:func:`~jaxdistill.mechanisms._nb_sampler.bits_at`), so the sums are
    bitwise those of the default path. Keys without random access (non-threefry
    implementations) take the default path.
    """
    if not random_access_supported(keys):
      return super().chunk_statistics(keys, buckets, labels, valid)
    tables = self.tables()
    d, size = self.shape.d, keys.shape[0]
    real = entry_histogram(buckets, labels, valid, self.shape.num_buckets, self.shape.num_labels)
    # Flattened [d, 2] counts: slot 2j is (j, +), 2j + 1 is (j, -); slot 2d is dropped.
    acc = jnp.zeros(2 * d + 1, jnp.int32).at[0:2 * d:2].set(real)
    events = jnp.where(valid, compound_poisson_event_counts(keys, tables), 0)
    ends = jnp.cumsum(events)
    starts = ends - events
    total = ends[-1]
    data = jax.random.key_data(keys)
    rounds = _event_buffer(size, tables.rate)

    def body(state):
      base, acc = state
      slot = base + jnp.arange(rounds, dtype=jnp.int32)
      live = slot < total
      client = jnp.minimum(jnp.searchsorted(ends, slot, side="right"), size - 1)
      cell, stream, count = compound_poisson_event_marks(data[client], slot - starts[client], tables)
      count = jnp.where(live, count, 0)
      plus = jnp.where(stream == 1, 2 * d, 2 * cell)  # Z1 and Z3 add (j, +)
      minus = jnp.where(stream == 0, 2 * d, 2 * cell + 1)  # Z2 and Z3 add (j, -)
      return base + rounds, acc.at[jnp.concatenate([plus, minus])].add(jnp.concatenate([count, count]))

    _, acc = jax.lax.while_loop(lambda st: st[0] < total, body, (jnp.int32(0), acc))
    return acc[:2 * d].reshape(d, 2)

  def chunk_width(self) -> int:
    """kr + 1 + E_cap + ceil(16 rate) where the event path runs, else 2d.

    Per client, the event path holds its kr entries, its event count, one
    comparison with each of the E_cap count thresholds, and its share of the
    chunk's event buffer (about ``rate`` events of a dozen words each). It
    needs random access to threefry keys (JAX's default
    ``jax_threefry_partitionable`` layout); otherwise every client's dense
    ``[d, 2]`` counts are materialised.
    """
    if not jax.config.jax_threefry_partitionable:
      return 2 * self.shape.d
    tables = self.tables()
    return self.shape.k * self.shape.r + 1 + int(tables.count.shape[0]) + math.ceil(16 * tables.rate)

  def estimate(self, key: jax.Array, stats: Any, num_clients: int) -> np.ndarray:
    """#(j,+) - #(j,-), float64 ``[s, |Y|]`` (unbiased for any number of clients)."""
    del key  # no server-side randomness
    _validate.integer("num_clients", num_clients, minimum=1)  # unused, but 'abc' was accepted
    d = self.shape.d
    # Checked as the other mechanisms' statistics are: a transposed [2, d] was reshaped, fractions truncated
    # and booleans taken as counts, silently.
    arr = None if isinstance(stats, (str, bytes, bool, np.bool_)) else np.asarray(stats)
    if arr is None or arr.dtype.kind not in "iu":
      f = _validate.real_array("stats", stats)
      bad = ~np.isfinite(f) | (f != np.round(f)) | (f < 0) | (f >= 2.0**62)
      if bad.any():
        raise ValueError(f"Expected stats to hold message counts (finite, whole, in [0, 2^62)): found "
                         f"{float(f[bad].reshape(-1)[0])!r}.")
      arr = f.astype(np.int64)
    if arr.shape not in ((d, 2), (2 * d,)):
      raise ValueError(f"Expected stats of shape [d, 2] = [{d}, 2] (#(j,+), #(j,-); or flat [{2 * d}]); got shape "
                       f"{list(arr.shape)}.")
    counts = arr.astype(np.int64).reshape(d, 2)
    if np.any(counts < 0):
      # Message counts are int32 sums: an entry with more than 2^31 - 1 messages (n near 2^31 with the
      # flooding on top) wraps around to a negative count, and the difference would be off by 2^32.
      raise ValueError(f"Expected non-negative message counts; {int(np.sum(counts < 0))} are negative, an "
                       f"int32 overflow (more than 2^31 - 1 messages on one entry). Simulate fewer clients.")
    diff = (counts[:, 0] - counts[:, 1]).astype(np.float64)
    return diff.reshape(self.shape.num_buckets, self.shape.num_labels)

  def entry_variance(self, counts: Any, num_clients: int) -> np.ndarray:
    """2 (m/n) p/(1-p)^2 with m participating clients (2p/(1-p)^2 when m = n)."""
    m = count_free_clients(self.shape, counts, num_clients)
    v = (m / self.num_clients) * self.noise.entry_variance
    return np.full((self.shape.num_buckets, self.shape.num_labels), v, dtype=np.float64)

  def max_error_bound(self, beta: Any, counts: Any = None, num_clients: Any = None) -> float | None:
    """Bound on max |error| over all d entries w.p. >= 1 - beta, when all n clients take part.

    The flooding shares cancel in #(j,+) - #(j,-), so entry j's error is
    G1 - G2 with G1, G2 i.i.d. NB(m/n, p). With m = n each is geometric,
    Pr[G = g] = (1 - p) p^g, and their difference is exactly discrete
    Laplace with parameter a = -ln p; the union bound over the d entries
    then gives the least integer alpha with d Pr[|Z| > alpha] <= beta
    (:func:`discrete_laplace_alpha`). The errors are heavier-tailed than a
    normal with the same variance, so a normal approximation would be too
    small. Returns ``None`` (no exact bound) when m != n.
    """
    if num_clients is not None:
      m = count_free_clients(self.shape, counts, num_clients)  # counts unused, but checked as RR's are
      if m != self.num_clients:
        return None
    return float(_bounds.discrete_laplace_alpha(-math.log(self.noise.p), beta,
                                                num_entries=self.shape.d))

  def expected_messages(self) -> float:
    """Expected messages per client with kr real messages."""
    return multi_message_expected_messages(self.noise, num_clients=self.num_clients, d=self.shape.d,
                                           c=self.shape.c)

  def privacy(self) -> PrivacyStatement:
    # A copy: the cached statement is shared by every equal mechanism, and its parameters (a dict) and warnings'
    # details could be edited by a caller, changing every later report.
    return copy.deepcopy(_statement(self.noise, self.epsilon, self.shape, self.num_clients, self.delta,
                                    self.dlap_fraction, self.sampler_tv_bound()))


def _event_buffer(chunk: int, rate: float) -> int:
  """Events evaluated per round: a power of two above the chunk's mean + 6 sd (>= 16)."""
  mean = chunk * rate
  want = max(16.0, mean + 6.0 * math.sqrt(mean) + 1.0)
  return 1 << int(math.ceil(math.log2(want)))


def _share(total: float, n: int) -> float:
  """The smallest float64 a >= fl(total / n) with n a >= total, decided exactly."""
  a = total / n
  while n * fractions.Fraction(a) < fractions.Fraction(total):
    a = math.nextafter(a, math.inf)
  return a


@functools.lru_cache(maxsize=64)
def _statement(noise: MultiMessageNoise, eps: float, shape: BsvsShape, n: int, target_delta: float,
               fraction: float, tv: float) -> PrivacyStatement:
  extra = (1.0 + math.exp(eps)) * tv
  params = {"target_delta": target_delta, "dlap_fraction": fraction, "num_clients": n, "d": shape.d,
            "k": shape.k, "r": shape.r, "model": "shuffle",
            "expected_messages_per_client": multi_message_expected_messages(noise, num_clients=n, d=shape.d,
                                                                            c=shape.c),
            "sampler_tv_bound": tv, "pld_delta": multi_message_delta(noise, eps, k=shape.k, r=shape.r)}
  return multi_message_statement(noise, eps, k=shape.k, r=shape.r, extra_delta=extra, parameters=params)


class MultiMessageTranscript(NamedTuple):
  """What the message-level protocol saw.

  Attributes:
    messages: int32 ``[M, 2]`` shuffled messages, rows ``(index, sign)`` with
      index in [0, d) and sign +1 or -1.
    counts: int64 ``[d, 2]`` the analyzer's counts of ``(j, +)`` and ``(j, -)``.
    estimate: float64 ``[s, |Y|]`` the analyzer's estimate.
    messages_per_client: int64 ``[n]`` messages sent by each client.
  """

  messages: np.ndarray
  counts: np.ndarray
  estimate: np.ndarray
  messages_per_client: np.ndarray


def shuffle_multi_message_protocol(key: jax.Array, mechanism: ShuffleMultiMessage,
                                   inputs: BsvsInput) -> MultiMessageTranscript:
  """Runs the protocol message by message: randomize, materialise, shuffle, analyze.

  Client i draws its messages with ``fold_in(clients_key, i)`` where
  ``clients_key, server_key = split(key)`` (the same keys as
  :func:`jaxdistill.simulation.simulate`); every message becomes an
  ``(index, sign)`` row; the rows of all clients are permuted by
  ``jax.random.permutation(fold_in(server_key, 0), M)``; the analyzer counts
  the shuffled rows. The analyzer is a function of the multiset only, so the
  counts equal the streamed statistics of ``simulate(key, ...)`` exactly.
  Memory is O(total messages): use it for checks and demonstrations, and
  ``simulate`` for scale.

  Args:
    key: PRNG key.
    mechanism: a :class:`ShuffleMultiMessage`.
    inputs: the clients' :class:`BsvsInput` (n rows).

  Returns:
    A :class:`MultiMessageTranscript`.
  """
  key = _validate.prng_key("key", key)
  if not isinstance(mechanism, ShuffleMultiMessage):
    raise ValueError(f"Expected mechanism to be a ShuffleMultiMessage; got {type(mechanism)}.")
  if not isinstance(inputs, BsvsInput):
    raise ValueError(f"Expected inputs to be a BsvsInput; got {type(inputs)}.")
  n, d = input_num_clients(inputs), mechanism.shape.d
  check_clients_fit(mechanism, inputs, n)
  clients_key, server_key = jax.random.split(key)
  idx = jnp.arange(n, dtype=jnp.uint32)
  per_client = np.asarray(_client_messages(clients_key, mechanism, idx, inputs.buckets, inputs.labels))
  # Materialise: client i sends per_client[i, j, 0] rows (j, +1) and per_client[i, j, 1] rows (j, -1).
  index = np.tile(np.repeat(np.arange(d), 2)[None, :], (n, 1)).reshape(-1)
  sign = np.tile(np.array([1, -1]), n * d)
  reps = per_client.reshape(-1)
  rows = np.stack([np.repeat(index, reps), np.repeat(sign, reps)], axis=1).astype(np.int32)
  perm = np.asarray(jax.random.permutation(jax.random.fold_in(server_key, 0), rows.shape[0]))
  shuffled = rows[perm]
  # Analyzer: a histogram of the shuffled (index, sign) rows.
  counts = np.zeros((d, 2), np.int64)
  np.add.at(counts, (shuffled[:, 0], (shuffled[:, 1] < 0).astype(np.int64)), 1)
  est = mechanism.estimate(server_key, counts, n)
  return MultiMessageTranscript(shuffled, counts, est, per_client.reshape(n, -1).sum(axis=1).astype(np.int64))


@functools.partial(jax.jit, static_argnums=1)
def _client_messages(clients_key, mechanism, idx, buckets, labels):
  return jax.vmap(lambda i, b, lab: mechanism.randomize(jax.random.fold_in(clients_key, i), b, lab))(
      idx, buckets, labels)
