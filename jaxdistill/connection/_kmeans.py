"""k-means++ on public features, and query selection (Algorithm 1, step 1).

Only public data is clustered: the queries are public samples, chosen by a
function of D_pub and a PRNG key alone, so they cost no privacy. (If private
data influenced the queries, the reverse-k-NN sensitivity 2kr would no longer
be the whole story; spec/REVERSE_KNN.md §5, I1.)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdistill import _validate
from jaxdistill.connection._common import as_features, block_size as _block_size, warn_if_off_centre
from jaxdistill.connection._distances import nearest_columns, squared_distances

__all__ = ["KMeansResult", "kmeans", "QuerySelection", "select_queries"]


@dataclasses.dataclass(frozen=True)
class KMeansResult:
  """A k-means clustering of ``m`` points into ``s`` clusters.

  Attributes:
    centres: float32 ``[s, d]`` cluster centres.
    assignment: int32 ``[m]`` cluster of every point (its nearest centre;
      exact ties to the lower cluster index).
    inertia: float64, the sum of the (float32) squared distances to the
      assigned centres, summed in float64 on the host.
    inertia_history: ``[num_iterations]`` the objective at each Lloyd
      assignment step, a convergence trace summed in float32 inside the
      jitted loop and returned as float64 (non-increasing up to that
      rounding; its last entry may differ from ``inertia`` in the 7th digit).
    num_iterations: Lloyd iterations run.
    converged: True if the assignment stopped changing before
      ``max_iterations``.
    seed_indices: int32 ``[s]``, the points chosen by k-means++ seeding.
  """

  centres: np.ndarray
  assignment: np.ndarray
  inertia: float
  inertia_history: np.ndarray
  num_iterations: int
  converged: bool
  seed_indices: np.ndarray


#: Largest Lloyd iteration cap and k-means++ candidates per seeding step that :func:`kmeans` accepts. The
#: loop keeps a float32 trace of max_iterations entries (40 MB at 10^7); a large cap meaning "until convergence"
#: is common (10^6 was refused at the earlier 10^5).
MAX_ITERATIONS = 10_000_000
MAX_TRIALS = 1024


@functools.partial(jax.jit, static_argnames=("num_clusters", "num_trials"))
def _kmeans_pp(key: jax.Array, x: jax.Array, num_clusters: int, num_trials: int) -> jax.Array:
  """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; greedy trials as in scikit-learn).

  The first centre is uniform; each next centre is the best of
  ``num_trials`` candidates drawn with probability proportional to the
  squared distance to the nearest centre chosen so far (D^2 sampling), the
  best being the one that most lowers the potential sum_i D(x_i)^2.
  """
  m = x.shape[0]
  x2 = jnp.sum(x * x, axis=1)
  k_first, k_rest = jax.random.split(key)
  first = jax.random.randint(k_first, (), 0, m, dtype=jnp.int32)  # int32 with x64 on too, as ``chosen``
  mind = squared_distances(x, x[first][None, :], x2)[:, 0]
  chosen = jnp.zeros(num_clusters, jnp.int32).at[0].set(first)

  def body(t, state):
    mind, chosen = state
    total = jnp.sum(mind)
    # All points coincide with chosen centres (duplicates): sample uniformly.
    logits = jnp.where(total > 0, jnp.log(mind), 0.0)
    cand = jax.random.categorical(jax.random.fold_in(k_rest, t), logits, shape=(num_trials,))
    new = jnp.minimum(mind[:, None], squared_distances(x, x[cand], x2))  # [m, L]
    best = jnp.argmin(jnp.sum(new, axis=0))
    return new[:, best], chosen.at[t].set(cand[best].astype(jnp.int32))

  _, chosen = lax.fori_loop(1, num_clusters, body, (mind, chosen))
  return chosen


@functools.partial(jax.jit, static_argnames=("num_clusters", "max_iterations", "block_size"))
def _lloyd(x: jax.Array, init_centres: jax.Array, num_clusters: int, max_iterations: int,
           block_size: int):
  """Lloyd iterations until the assignment is stable; empty clusters are re-seeded.

  An empty cluster's centre moves to one of the points farthest from their
  centres (the e-th empty cluster to the e-th farthest point), as scikit-learn
  does; this never raises the objective.
  """
  m = x.shape[0]
  s = num_clusters

  def assign(centres):
    idx, dist = nearest_columns(x, centres, 1, block_size)
    return idx[:, 0], dist[:, 0]

  def update(assignment, dmin, centres):
    counts = jax.ops.segment_sum(jnp.ones(m, jnp.float32), assignment, s)
    sums = jax.ops.segment_sum(x, assignment, s)
    means = sums / jnp.maximum(counts, 1.0)[:, None]
    empty = counts == 0
    far = lax.top_k(dmin, min(s, m))[1]
    rank = jnp.clip(jnp.cumsum(empty) - 1, 0, far.shape[0] - 1)
    reseed = x[far[rank]]
    return jnp.where(empty[:, None], reseed, means)

  def cond(state):
    _, _, it, changed, _ = state
    return changed & (it < max_iterations)

  def body(state):
    centres, assignment, it, _, history = state
    new_assignment, dmin = assign(centres)
    history = history.at[it].set(jnp.sum(dmin.astype(jnp.float32)))
    changed = jnp.any(new_assignment != assignment)
    return update(new_assignment, dmin, centres), new_assignment, it + 1, changed, history

  init = (init_centres, jnp.full(m, -1, jnp.int32), jnp.int32(0), jnp.bool_(True),
          jnp.full(max_iterations, jnp.nan, jnp.float32))
  centres, assignment, it, changed, history = lax.while_loop(cond, body, init)
  final_assignment, dmin = assign(centres)
  return centres, final_assignment, dmin, it, ~changed, history


def kmeans(key: jax.Array, features: Any, num_clusters: int, *, max_iterations: int = 100,
           num_trials: int | None = None, block_size: int = 1024) -> KMeansResult:
  """k-means++ seeding followed by Lloyd iterations (jitted, blockwise distances).

  Minimises the within-cluster sum of squares

  .. math::

     \\min_{c_1..c_s} \\sum_{i=1}^{m} \\min_t \\|x_i - c_t\\|_2^2 .

  Seeding is greedy k-means++ (``num_trials`` D^2-sampled candidates per
  centre, default ``2 + floor(ln s)``); Lloyd's iterations then alternate
  nearest-centre assignment (streamed in blocks of ``block_size`` points) and
  centre = mean of its points, until no assignment changes or
  ``max_iterations``. Deterministic for a given key.

  References:
    Arthur & Vassilvitskii, "k-means++: The Advantages of Careful Seeding",
    SODA 2007.

  Args:
    key: PRNG key (seeding).
    features: float ``[m, d]`` points, finite, roughly centred: float32
      distances lose precision in proportion to ``||x||^2`` (see
      :mod:`jaxdistill.connection`, "Precision"), so subtract the mean of
      features far from the origin compared with their spread (a
      ``RuntimeWarning`` says when).
    num_clusters: s, with ``1 <= s <= m``.
    max_iterations: Lloyd iteration cap, in ``[1, MAX_ITERATIONS]`` (10^7).
    num_trials: candidates per seeding step, in ``[1, 1024]``.
    block_size: points per distance block, at most 2**24.

  Returns:
    A :class:`KMeansResult` (host arrays; ``inertia`` in float64).

  Raises:
    ValueError: bad features (not 2-D, NaN, inf), ``num_clusters`` outside
      ``[1, m]``, or bad iteration / trial / block counts.
  """
  key = _validate.prng_key("key", key)
  x = as_features("features", features)
  m = x.shape[0]
  s = _validate.integer("num_clusters", num_clusters, minimum=1)
  if s > m:
    raise ValueError(f"Expected num_clusters={s} <= the number of points m={m}.")
  return _kmeans(key, x, s, max_iterations, num_trials, block_size, name="features")


def _kmeans(key: jax.Array, x: jax.Array, s: int, max_iterations: Any, num_trials: Any, block_size: Any, *,
            name: str) -> KMeansResult:
  """:func:`kmeans` after its key, features and ``s`` are checked; warns about off-centre ``x`` as ``name``."""
  m = x.shape[0]
  # Caps: the jitted loop keeps a [max_iterations] trace and int32 counters; seeding draws num_trials candidates
  # per step ([num_trials, m] distances).
  max_iterations = _validate.integer("max_iterations", max_iterations, minimum=1, maximum=MAX_ITERATIONS)
  trials = 2 + int(math.log(s)) if num_trials is None else num_trials
  trials = _validate.integer("num_trials", trials, minimum=1, maximum=MAX_TRIALS)
  bs = min(_block_size(block_size), m)
  warn_if_off_centre(name, x)
  seeds = _kmeans_pp(key, x, s, trials)
  centres, assignment, dmin, it, converged, history = _lloyd(x, x[seeds], s, max_iterations, bs)
  it = int(it)
  return KMeansResult(
      centres=np.asarray(centres),
      assignment=np.asarray(assignment, np.int32),
      inertia=float(np.sum(np.asarray(dmin, np.float64))),
      inertia_history=np.asarray(history, np.float64)[:it],
      num_iterations=it,
      converged=bool(converged),
      seed_indices=np.asarray(seeds, np.int32))


@dataclasses.dataclass(frozen=True)
class QuerySelection:
  """Queries chosen from D_pub: one public sample per k-means cluster.

  Attributes:
    query_indices: int32 ``[s]`` distinct indices into D_pub; query t is the
      member of cluster t nearest to centre t.
    assignment: int32 ``[m_pub]`` the cluster (= query) of every public
      sample; every public sample later inherits its cluster's label.
    kmeans: the underlying :class:`KMeansResult`.
  """

  query_indices: np.ndarray
  assignment: np.ndarray
  kmeans: KMeansResult

  @property
  def num_queries(self) -> int:
    return int(self.query_indices.shape[0])


def _queries_from_clusters(x: np.ndarray, centres: np.ndarray, assignment: np.ndarray,
                           group: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Per cluster, the member nearest its centre (host, float64 distances).

  A cluster left empty (possible when Lloyd stopped at its cap) takes the
  public sample nearest its centre among those whose features differ from
  every query's so far, and that sample moves into it, so the queries'
  features are always distinct (``select_queries`` requires s distinct
  feature vectors) and each query lies in its own cluster. ``group``: each
  row's index among the distinct rows (computed here when not given).
  """
  s = centres.shape[0]
  assignment = assignment.copy()
  xd = x.astype(np.float64)
  cd = centres.astype(np.float64)
  dist = np.sum((xd - cd[assignment]) ** 2, axis=1)
  queries = np.full(s, -1, np.int64)
  order = np.lexsort((np.arange(x.shape[0]), dist, assignment))  # by cluster, distance, index
  first = np.searchsorted(assignment[order], np.arange(s))
  has = np.bincount(assignment, minlength=s) > 0
  queries[has] = order[first[has]]
  # A sample whose features equal a query's is taken with it: a copy filled in as another query never got a vote
  # (reverse k-NN breaks the tie towards the lower index), and its cluster took the label of an empty or pure-noise
  # vote row although its images equal a voted query's.
  if group is None:
    group = np.unique(x, axis=0, return_inverse=True)[1].reshape(-1)
  taken = np.isin(group, group[queries[has]])
  for t in np.flatnonzero(~has):
    d = np.sum((xd - cd[t]) ** 2, axis=1)
    d[taken] = np.inf
    j = int(np.argmin(d))
    queries[t], assignment[j] = j, t
    taken |= group == group[j]
  return queries.astype(np.int32), assignment.astype(np.int32)


def select_queries(key: jax.Array, public_features: Any, num_queries: int, *,
                   max_iterations: int = 100, num_trials: int | None = None,
                   block_size: int = 1024) -> QuerySelection:
  """Clusters D_pub's features with k-means++ and picks one public sample per cluster.

  Algorithm 1, step 1 (spec/REVERSE_KNN.md §1.2): the query of cluster t is
  the public sample of cluster t nearest its centre, and every public sample
  belongs to (and later inherits the label of) its cluster's query.

  Formal guarantees:
    The output is a function of ``public_features`` and ``key`` only. Pass
    features of D_pub, computed by a representation fitted on D_pub alone
    (:mod:`jaxdistill.representations`): then the queries carry no privacy
    cost and the reverse-k-NN sensitivity 2kr holds for the votes.

  Args:
    key: PRNG key (k-means++ seeding).
    public_features: float ``[m_pub, d]`` features of D_pub.
    num_queries: s, with ``1 <= s <= m_pub``, and at most the number of
      distinct rows of ``public_features``.
    max_iterations: Lloyd iteration cap.
    num_trials: k-means++ candidates per step (default ``2 + floor(ln s)``).
    block_size: points per distance block, at most 2**24.

  Returns:
    A :class:`QuerySelection`.

  Raises:
    ValueError: bad features, or ``num_queries`` outside ``[1, m_pub]`` or
      above the number of distinct feature vectors of D_pub.
  """
  key = _validate.prng_key("key", key)
  x = as_features("public_features", public_features)
  m = x.shape[0]
  s = _validate.integer("num_queries", num_queries, minimum=1)
  if s > m:
    raise ValueError(f"Expected num_queries={s} <= the number of public samples m_pub={m}.")
  group = np.unique(np.asarray(x), axis=0, return_inverse=True)[1].reshape(-1)  # public data only: no privacy cost
  distinct = int(group.max()) + 1
  if s > distinct:  # some queries would copy others' features and split (or never get) their votes
    raise ValueError(f"Expected num_queries={s} <= the number of distinct public feature vectors, {distinct} of "
                     f"m_pub={m}: queries with equal features would split the votes.")
  result = _kmeans(key, x, s, max_iterations, num_trials, block_size, name="public_features")
  queries, assignment = _queries_from_clusters(np.asarray(x), result.centres, result.assignment, group)
  return QuerySelection(queries, assignment, result)
