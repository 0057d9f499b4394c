"""Connection rules: which queries each private record votes for (Algorithm 1, step 2).

Three families, all returned in the BSVS form (``buckets`` int32 ``[n, c]``,
-1 pads) that :func:`jaxdistill.mechanisms.make_bsvs_input` consumes:

* **reverse k-NN** (the paper's rule): record i connects to its k nearest
  queries. Per record: T_i depends on x_i and the public queries only, so
  out-degree = k and the replace-one L1 sensitivity of A is 2kr in every DP
  model (central, local, shuffle).
* **k-NN labeling** (the baseline): query t connects to its k nearest
  records. A record may be among the k nearest of up to s queries, and
  replacing one record can displace another record from a query's list. The
  only valid declared out-degree is s (sensitivity 2sr, central model only).
* **balanced rules** (Appendix C, max-min and harmonic mean of the query
  scores under out-degree <= k): they couple the records, so no DP guarantee
  is claimed (spec/REVERSE_KNN.md §5, I8).

Every rule ships a :class:`ConnectionPrivacy` saying what it does and does
not guarantee, built from the same parameters as the connection itself.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdistill import _validate
from jaxdistill.accounting import PrivacyWarning, Relation
from jaxdistill.connection._common import as_features, block_size as _block_size, warn_if_off_centre
from jaxdistill.connection._distances import nearest_columns, nearest_rows, squared_distances
from jaxdistill.mechanisms._bsvs import repeated_in_rows

__all__ = [
    "RULES",
    "OBJECTIVES",
    "ConnectionPrivacy",
    "Connection",
    "connection_privacy",
    "reverse_knn",
    "reverse_knn_connection",
    "knn_labeling",
    "balanced_connection",
    "balanced_scores",
    "connect",
]

RULES = ("reverse-knn", "knn-labeling", "balanced-max-min", "balanced-harmonic")
OBJECTIVES = ("max-min", "harmonic")

_MODELS_ALL = ("central", "local", "shuffle")


@dataclasses.dataclass(frozen=True)
class ConnectionPrivacy:
  """What a connection rule guarantees for the BSVS votes built on it.

  Attributes:
    rule: one of :data:`RULES`.
    per_record: True if record i's edges depend on x_i and the public queries
      only (no other record can change them).
    dp_valid: True if a BSVS mechanism calibrated with ``shape_k`` gives the
      DP guarantee it states, in the models listed in ``models``.
    shape_k: the out-degree bound to declare as ``k`` in
      :class:`~jaxdistill.mechanisms.BsvsShape` of a *replace-one* mechanism
      (L1 sensitivity 2 * shape_k * r). Under add/remove, k-NN labeling still
      moves 2sr votes (an added record displaces one member of every list),
      twice what an add/remove mechanism with k = s assumes: take the
      sensitivity from :meth:`sensitivity` with ``relation="add-remove"``.
    models: DP models in which the guarantee holds (``()`` when none).
    relation: the neighbouring relation of the guarantee.
    guarantee: one sentence saying what holds.
    warnings: caveats a report must show next to the privacy numbers.
  """

  rule: str
  per_record: bool
  dp_valid: bool
  shape_k: int
  models: tuple[str, ...]
  relation: Relation
  guarantee: str
  warnings: tuple[PrivacyWarning, ...] = ()

  def sensitivity(self, r: int = 1, relation: Any = Relation.REPLACE_ONE) -> int | None:
    """L1 sensitivity of A under ``relation``, or None if no valid bound is claimed.

    Replace-one: 2 * shape_k * r for every valid rule. Add/remove (one
    record added or removed): k r for reverse k-NN (the record's own k
    edges), but still 2 s r for k-NN labeling, where the record may enter all
    s lists and push one member out of each.
    """
    r = _validate.integer("r", r, minimum=1)
    rel = Relation.parse(relation, "relation")
    if not self.dp_valid:
      return None
    if rel is Relation.REPLACE_ONE or not self.per_record:
      return 2 * self.shape_k * r
    return self.shape_k * r

  def to_dict(self) -> dict[str, Any]:
    return {"rule": self.rule, "per_record": self.per_record, "dp_valid": self.dp_valid,
            "shape_k": self.shape_k, "models": list(self.models), "relation": self.relation.value,
            "guarantee": self.guarantee, "warnings": [w.to_dict() for w in self.warnings]}


def connection_privacy(rule: str, *, k: int, num_queries: int) -> ConnectionPrivacy:
  """The privacy statement of a connection rule with parameters (k, s).

  Formal guarantees:
    * ``reverse-knn``: T_i is a function of (x_i, Q) with ||T_i||_1 = k, so
      replacing one record changes A = sum_i T_i y_i^T by at most 2kr in L1,
      and a local randomizer can compute T_i on the client. Valid in the
      central, local and shuffle models, provided the queries Q were chosen
      from public data only.
    * ``knn-labeling``: row t of A is the label histogram of query t's k
      nearest records; replacing one record swaps at most one member of each
      of the s lists, so the L1 sensitivity is 2sr (declare k = s). A
      client cannot compute its own edges (they depend on all records), so
      only the central model applies.
    * ``balanced-*``: no DP guarantee. The edges solve a joint optimisation
      over all records, so changing one record can re-route other records'
      edges; the 2kr bound fails (spec/REVERSE_KNN.md §5, I8) and the only
      generic bound, 2nkr (every record re-routed), makes the noise useless.

  References:
    Li et al., "Fine-grained Private Knowledge Distillation",
    arXiv:2207.13253, Algorithm 1 and Appendix C
    (https://arxiv.org/abs/2207.13253).

  Args:
    rule: one of :data:`RULES`.
    k: out-degree (reverse k-NN, balanced) or in-degree (k-NN labeling).
    num_queries: s.

  Raises:
    ValueError: unknown rule or bad k / s.
  """
  rule = _validate.choice("rule", rule, RULES)
  s = _validate.integer("num_queries", num_queries, minimum=1)
  k = _validate.integer("k", k, minimum=1)
  if rule != "knn-labeling" and k > s:  # each record takes k distinct queries (k-NN labeling: k records per query)
    raise ValueError(f"Expected k={k} <= num_queries={s}.")
  if rule == "reverse-knn":
    return ConnectionPrivacy(
        rule, per_record=True, dp_valid=True, shape_k=k, models=_MODELS_ALL,
        relation=Relation.REPLACE_ONE,
        guarantee=(f"Each record connects to exactly k={k} queries chosen from its own features and "
                   f"the public queries, so A has replace-one L1 sensitivity 2kr={2 * k}*r in the "
                   "central, local and shuffle models (queries must come from public data only)."))
  if rule == "knn-labeling":
    warn = PrivacyWarning(
        "knn_labeling_sensitivity_grows_with_s",
        f"k-NN labeling lets one record join up to s={s} queries' lists, so the declared out-degree "
        f"is s and the L1 sensitivity is 2sr={2 * s}*r: the noise grows with s, not with k={k}.",
        {"k": k, "num_queries": s, "declared_out_degree": s})
    central = PrivacyWarning(
        "knn_labeling_central_only",
        "A record's k-NN-labeling edges depend on the other records, so clients cannot compute "
        "them locally: only the central model applies.", {})
    return ConnectionPrivacy(
        rule, per_record=False, dp_valid=True, shape_k=s, models=("central",),
        relation=Relation.REPLACE_ONE,
        guarantee=(f"Each query takes its k={k} nearest records; replacing one record changes each "
                   f"of the s={s} rows of A by at most 2r, so the central L1 sensitivity is "
                   f"2sr={2 * s}*r."),
        warnings=(warn, central))
  warn = PrivacyWarning(
      "balanced_connection_no_dp",
      "Balanced connection rules (Appendix C) couple the records: changing one record can change "
      "other records' edges, so the reverse-k-NN sensitivity 2kr does not hold and no DP "
      "guarantee is claimed without a new analysis (spec §5, I8).",
      {"k": k, "num_queries": s})
  return ConnectionPrivacy(
      rule, per_record=False, dp_valid=False, shape_k=k, models=(), relation=Relation.REPLACE_ONE,
      guarantee=(f"Out-degree <= k={k} per record holds, but no sensitivity bound below the trivial "
                 "2nkr is known: no differential-privacy guarantee."),
      warnings=(warn,))


@dataclasses.dataclass(frozen=True)
class Connection:
  """Private records' edges to the queries, in BSVS form, with their privacy statement.

  Attributes:
    buckets: int32 ``[n, c]`` query indices per record, -1 pads (``c`` = k
      for reverse k-NN and balanced rules, the max out-degree for k-NN
      labeling).
    num_queries: s.
    privacy: the rule's :class:`ConnectionPrivacy` (``privacy.shape_k`` is the
      k to declare in :class:`~jaxdistill.mechanisms.BsvsShape`).
    diagnostics: numbers describing the result (JSON-serialisable).
  """

  buckets: np.ndarray
  num_queries: int
  privacy: ConnectionPrivacy
  diagnostics: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def rule(self) -> str:
    return self.privacy.rule

  @property
  def out_degrees(self) -> np.ndarray:
    """int64 ``[n]`` edges per record."""
    return np.sum(self.buckets >= 0, axis=1)

  @property
  def in_degrees(self) -> np.ndarray:
    """int64 ``[s]`` edges per query."""
    b = self.buckets[self.buckets >= 0]
    return np.bincount(b, minlength=self.num_queries)

  def bsvs_input(self, labels: Any, *, num_labels: int, r: int | None = None,
                 relation: Any = Relation.REPLACE_ONE):
    """``make_bsvs_input(buckets, labels, num_buckets=s, num_labels, k=privacy.shape_k, r)``.

    The shape is the one a mechanism under ``relation`` (the mechanism's own
    neighbouring relation: say which one you will build) must be calibrated
    with, so that its privacy statement holds for these votes. For k-NN
    labeling this pads ``buckets`` to s columns (``n * s`` int32).

    Raises:
      ValueError: a rule without a DP guarantee (the balanced rules: no
        shape makes a mechanism's statement true for their votes; call
        :func:`~jaxdistill.mechanisms.make_bsvs_input` directly to study
        them without one), or k-NN labeling under add/remove (an added
        record moves 2sr votes, which no shape with k <= s declares under
        add/remove; a replace-one mechanism's 2sr covers it).
    """
    from jaxdistill.mechanisms import make_bsvs_input  # pylint: disable=import-outside-toplevel
    rel = Relation.parse(relation, "relation")
    if not self.privacy.dp_valid:
      raise ValueError(f"Expected a connection rule with a DP guarantee; rule={self.rule!r} has none (one record "
                       "can re-route others' edges), so no BSVS mechanism's privacy statement would hold for "
                       "these votes. Call make_bsvs_input directly to study them without a guarantee.")
    if rel is not Relation.REPLACE_ONE and not self.privacy.per_record:
      raise ValueError(f"Expected relation='replace-one' for rule={self.rule!r}; got {rel.value!r}: one added or "
                       f"removed record moves up to 2sr = {2 * self.num_queries}*r votes, more than an {rel.value} "
                       "mechanism with k <= s assumes. Build a replace-one mechanism: its 2sr calibration also "
                       "covers adding or removing a record.")
    return make_bsvs_input(self.buckets, labels, num_buckets=self.num_queries, num_labels=num_labels,
                           k=self.privacy.shape_k, r=r)


def _check_pair(private_features: Any, query_features: Any, k: int, *, k_at_most: str):
  """Validates the features and ``1 <= k <= s`` (``k_at_most="s"``) or ``<= n`` (``"n"``)."""
  q = as_features("query_features", query_features)
  x = as_features("private_features", private_features, private=True, dim=q.shape[1], dim_name="query_features")
  k = _validate.integer("k", k, minimum=1)
  if k_at_most == "s" and k > q.shape[0]:
    raise ValueError(f"Expected k={k} <= num_queries s={q.shape[0]}.")
  if k_at_most == "n" and k > x.shape[0]:
    raise ValueError(f"Expected k={k} <= the number of private records n={x.shape[0]}.")
  warn_if_off_centre("query_features", q)  # decided from the (public) queries alone
  return x, q, k


def reverse_knn(private_features: Any, query_features: Any, k: int, *,
                block_size: int = 128) -> jax.Array:
  """Reverse k-NN: every private record's k nearest queries in L2.

  .. math::

     T_i = \\operatorname{top\\text{-}k}_{t \\in [s]} \\; -\\|\\phi(x_i) - \\phi(q_t)\\|_2^2 ,
     \\qquad \\|T_i\\|_1 = k .

  Distances are streamed over blocks of ``block_size`` records (one matmul
  per block, then the k smallest per record: k rounds of minima over the
  queries, for ``s >= 128 k`` first over the minima of tiles of 32 queries
  to keep the k best tiles, then inside them; ``lax.top_k`` for k > 16),
  so 60k records x 5k queries never build the full distance matrix. Each
  row lists its queries nearest first; exact ties go to the lower query
  index, so the result is deterministic.

  Formal guarantees:
    Record i's row depends only on its own features, the queries and
    ``block_size``, and has exactly k distinct entries: the BSVS input has
    out-degree k, and the replace-one L1 sensitivity of the vote matrix is
    2kr, add/remove kr (:func:`connection_privacy` with
    ``rule="reverse-knn"``), provided the queries come from public data only.
    This holds bitwise, near-ties included: every block is ``block_size``
    records wide (a last or only block is padded, even when n < block_size),
    and at a fixed width XLA rounded a record's float32 distances the same
    whatever n was and wherever the record sat (measured on XLA:CPU, and on
    an NVIDIA H200 GPU by ``benchmarks/accelerator_checks.py``: permuting,
    subsetting or replacing the other records left every row unchanged).
    Across backends the rows can differ at float32 near-ties (CPU against
    that GPU: at most 14 of 20,000 rows), so a run is reproducible on one
    backend, not across them.

  References:
    Li et al., arXiv:2207.13253, Algorithm 1 step 2
    (https://arxiv.org/abs/2207.13253).

  Args:
    private_features: float ``[n, d]`` features of the private records.
    query_features: float ``[s, d]`` features of the queries.
    k: connections per record, ``1 <= k <= s``.
    block_size: records per block (128 was fastest on 2 CPU cores at d = 64
      and d = 784, see ``benchmarks/README.md``;
      the neighbours do not depend on it, up to float32 rounding of
      near-ties). Always allocated in full (``block_size x s`` distances),
      also for fewer records; at most 2**24.

  Returns:
    int32 ``[n, k]`` query indices (the ``buckets`` of
    :func:`~jaxdistill.mechanisms.make_bsvs_input`).

  Raises:
    ValueError: k outside ``[1, s]``, mismatched feature widths, NaN or inf
      features, non-2-D features, bad block size.

  >>> import numpy as np
  >>> reverse_knn(np.array([[0.0], [2.9]]), np.array([[0.0], [1.0], [3.0]]), 2).tolist()
  [[0, 1], [2, 1]]
  """
  x, q, k = _check_pair(private_features, query_features, k, k_at_most="s")
  # Never min(block_size, n): float32 rounding of the matmul depends on the block's width, so a width that
  # followed n would let one added or removed record re-round, and re-order the near-ties of, every other row.
  idx, _ = nearest_columns(x, q, k, _block_size(block_size))
  return idx


def reverse_knn_connection(private_features: Any, query_features: Any, k: int, *,
                           block_size: int = 128) -> Connection:
  """:func:`reverse_knn` wrapped as a :class:`Connection` with its privacy statement."""
  buckets = np.asarray(reverse_knn(private_features, query_features, k, block_size=block_size))
  s = int(np.shape(query_features)[0])
  return Connection(buckets, s, connection_privacy("reverse-knn", k=k, num_queries=s),
                    {"out_degree": int(k)})


def _record_lists(query_rows: np.ndarray, n: int) -> np.ndarray:
  """Inverts query -> records lists ``[s, k]`` into record -> queries ``[n, max_deg]`` (-1 pads).

  Each record's queries appear in increasing query index.
  """
  s, k = query_rows.shape
  rec = query_rows.reshape(-1).astype(np.int64)
  qry = np.repeat(np.arange(s, dtype=np.int64), k)
  order = np.lexsort((qry, rec))
  rec, qry = rec[order], qry[order]
  deg = np.bincount(rec, minlength=n)
  width = max(int(deg.max(initial=0)), 1)
  start = np.concatenate([[0], np.cumsum(deg)[:-1]])
  pos = np.arange(rec.shape[0]) - start[rec]
  out = np.full((n, width), -1, np.int32)
  out[rec, pos] = qry
  return out


def knn_labeling(private_features: Any, query_features: Any, k: int, *,
                 block_size: int = 8192) -> Connection:
  """The k-NN labeling baseline: every query connects to its k nearest private records.

  Query t votes with the labels of its k nearest records (in-degree exactly
  k, ties to the lower record index), streamed over record blocks with a
  running top-k. Returned in BSVS form: record i lists the queries that
  chose it (0 to s of them, in increasing query index).

  Formal guarantees:
    Central model only, replace-one L1 sensitivity 2sr: the declared
    out-degree ``privacy.shape_k`` is s, because a record may be among the
    k nearest of every query, and replacing it displaces at most one member
    of each query's list (which may belong to another record); adding or
    removing one record also changes each list by at most one member (2sr,
    :meth:`ConnectionPrivacy.sensitivity`). These bounds hold bitwise, for
    near-ties too: every block is ``block_size`` records wide (padded, even
    when n < block_size), so each record's float32 distances do not depend on
    n (measured on XLA:CPU). The observed maximum out-degree
    (``diagnostics["max_out_degree"]``) depends on the data and must NOT be
    used for calibration. See :func:`connection_privacy`.

  Args:
    private_features: float ``[n, d]`` features of the private records.
    query_features: float ``[s, d]`` features of the queries.
    k: records per query, ``1 <= k <= n``.
    block_size: records per block, always allocated in full (``s x
      block_size`` distances; on 2 CPU cores a block of the default 8192 at
      s = 1,000, d = 64 took about 0.07 s, however few the records); at
      most 2**24.

  Returns:
    A :class:`Connection` with ``buckets`` int32 ``[n, max_out_degree]``.

  Raises:
    ValueError: k outside ``[1, n]``, mismatched widths, NaN or inf features.
  """
  x, q, k = _check_pair(private_features, query_features, k, k_at_most="n")
  n, s = x.shape[0], q.shape[0]
  # Full-width blocks even when n < block_size (see reverse_knn): a record's distances must not depend on n.
  rows, _ = nearest_rows(x, q, k, _block_size(block_size))
  buckets = _record_lists(np.asarray(rows), n)
  deg = np.sum(buckets >= 0, axis=1)
  return Connection(buckets, s, connection_privacy("knn-labeling", k=k, num_queries=s),
                    {"in_degree": int(k), "max_out_degree": int(deg.max(initial=0)),
                     "declared_out_degree": s, "records_without_edges": int(np.sum(deg == 0))})


def balanced_scores(buckets: Any, private_features: Any, query_features: Any, *,
                    bandwidth: float) -> np.ndarray:
  """Score(q_t) = sum over the records connected to q_t of sim(q_t, x): float64 ``[s]``.

  With sim(q, x) = 1 / (1 + ||q - x||^2 / bandwidth) (spec §1.11, Score RECON).
  Small inputs (computes the dense ``[n, s]`` similarity on the host).
  """
  q = np.asarray(as_features("query_features", query_features), np.float64)
  x = np.asarray(as_features("private_features", private_features, private=True, dim=q.shape[1],
                             dim_name="query_features"), np.float64)
  h = _validate.positive("bandwidth", bandwidth)
  b = np.asarray(buckets)
  if b.ndim != 2 or b.shape[0] != x.shape[0] or not np.issubdtype(b.dtype, np.integer):
    raise ValueError(f"Expected buckets of int shape [n={x.shape[0]}, k]; got {b.dtype} of shape {b.shape}.")
  if b.size and (b.min() < -1 or b.max() >= q.shape[0]):
    raise ValueError(f"Expected buckets in [0, s={q.shape[0]}) or -1 (padding); found values in "
                     f"[{b.min()}, {b.max()}].")
  dup = repeated_in_rows(b)
  if dup.any():  # an edge listed twice would count its similarity twice
    row = int(np.flatnonzero(dup)[0])
    raise ValueError(f"Expected distinct buckets per record (padding -1 aside); record {row} has {b[row].tolist()}.")
  d2 = np.sum(x * x, 1)[:, None] + np.sum(q * q, 1)[None, :] - 2.0 * x @ q.T
  sim = 1.0 / (1.0 + np.maximum(d2, 0.0) / h)
  rows = np.repeat(np.arange(b.shape[0]), b.shape[1])
  cols = b.reshape(-1)
  keep = cols >= 0
  # np.asarray: bincount returns int64 zeros when no record has an edge (empty weights).
  return np.asarray(np.bincount(cols[keep], weights=sim[rows[keep], cols[keep]], minlength=q.shape[0]), np.float64)


def _default_bandwidth(q: jax.Array) -> float:
  """Median over queries of the squared distance to the nearest other query (public data only)."""
  s = q.shape[0]
  if s == 1:
    return 1.0
  d = np.asarray(squared_distances(q, q), np.float64)
  np.fill_diagonal(d, np.inf)
  h = float(np.median(d.min(axis=1)))
  return h if h > 0 else 1.0


@functools.partial(jax.jit, static_argnames=("objective", "num_queries", "max_moves"))
def _balance(cand: jax.Array, sim: jax.Array, active: jax.Array, objective: str, num_queries: int,
             max_moves: int):
  """Single-edge-move local search for the max-min or harmonic objective.

  State: ``active [n, L]`` marks which of record i's L candidate queries it is
  connected to (k per row, kept fixed). A move re-routes one edge of one
  record, (x, q') -> (x, q), keeping every out-degree at k.

  * max-min, and harmonic while some query has score 0: raise the lowest
    query t* (lowest index among ties) by the move that maximises
    min(S[t*] + w(x, t*), S[q'] - w(x, q')) subject to both exceeding the
    old S[t*]. Each move lifts the sorted score vector lexicographically,
    so the search terminates.
  * harmonic with all scores > 0: steepest descent on F = sum_t 1 / S[t];
    a move is taken only if it lowers F by more than 1e-6 F (float32
    safety), so F strictly decreases.

  Returns ``(active, scores, moves, stuck, initial scores)``.
  """
  s = num_queries

  def scores(act):
    return jax.ops.segment_sum(jnp.where(act, sim, 0.0).reshape(-1), cand.reshape(-1), s)

  def raise_min(act, S):
    t = jnp.argmin(S)
    low = S[t]
    new_w = jnp.where((cand == t) & ~act, sim, -jnp.inf).max(axis=1)           # [n]
    new_l = jnp.argmax(jnp.where((cand == t) & ~act, sim, -jnp.inf), axis=1)
    left = jnp.where(act, S[cand] - sim, -jnp.inf)                               # donor after removal
    drop_l = jnp.argmax(left, axis=1)
    donor = left.max(axis=1)
    ok = (new_w > 0) & (donor > low)
    value = jnp.where(ok, jnp.minimum(low + new_w, donor), -jnp.inf)
    x = jnp.argmax(value)
    return ok[x], x, new_l[x], drop_l[x]

  def harmonic_step(act, S):
    inv = 1.0 / S
    gain_new = jnp.where(~act, 1.0 / (S[cand] + sim) - inv[cand], jnp.inf)      # <= 0
    after = S[cand] - sim
    loss_drop = jnp.where(act & (after > 0), 1.0 / jnp.where(after > 0, after, 1.0) - inv[cand],
                          jnp.inf)                                               # >= 0
    new_l = jnp.argmin(gain_new, axis=1)
    drop_l = jnp.argmin(loss_drop, axis=1)
    total = gain_new.min(axis=1) + loss_drop.min(axis=1)
    x = jnp.argmin(total)
    ok = total[x] < -1e-6 * jnp.sum(inv)
    return ok, x, new_l[x], drop_l[x]

  def body(state):
    act, S, moves, _ = state
    if objective == "max-min":
      ok, x, l_new, l_drop = raise_min(act, S)
    else:
      ok, x, l_new, l_drop = lax.cond(jnp.min(S) > 0, harmonic_step, raise_min, act, S)
    w_new, w_drop = sim[x, l_new], sim[x, l_drop]
    q_new, q_drop = cand[x, l_new], cand[x, l_drop]
    act2 = act.at[x, l_new].set(True).at[x, l_drop].set(False)
    S2 = S.at[q_new].add(w_new).at[q_drop].add(-w_drop)
    return (jnp.where(ok, act2, act), jnp.where(ok, S2, S), moves + ok.astype(jnp.int32), ~ok)

  def cond(state):
    _, _, moves, stuck = state
    return ~stuck & (moves < max_moves)

  S0 = scores(active)
  act, S, moves, stuck = lax.while_loop(cond, body, (active, S0, jnp.int32(0), jnp.bool_(False)))
  return act, scores(act), moves, stuck, S0


def balanced_connection(private_features: Any, query_features: Any, k: int, *,
                        objective: str = "max-min", num_candidates: int | None = None,
                        bandwidth: float | None = None, max_moves: int | None = None,
                        block_size: int = 1024) -> Connection:
  """Appendix C's balanced connections: max-min or harmonic mean of the query scores.

  With sim(q, x) = 1 / (1 + ||q - x||^2 / h) > 0 and
  Score(q) = sum_{x : (q, x) in E} sim(q, x), choose edges E with every
  record's out-degree <= k to maximise

  .. math::

     \\text{(b) max-min: } \\min_q \\mathrm{Score}(q), \\qquad
     \\text{(c) harmonic: } \\frac{|Q|}{\\sum_q 1 / \\mathrm{Score}(q)} .

  (Objective (a), the arithmetic mean, is maximised by :func:`reverse_knn`.)
  Since sim > 0, adding an edge never lowers either objective, so every
  record keeps exactly k edges. The problem is combinatorial; this is an
  LP-free local search: start from reverse k-NN, restrict each record to its
  ``num_candidates`` nearest queries, and repeatedly re-route one edge
  (x, q') -> (x, q). For max-min the lowest query is raised while every
  other query stays above its old score (the sorted score vector rises
  lexicographically); for the harmonic mean, first every zero-score query
  gets an edge that way, then steepest descent on sum_q 1/Score(q). Both stop
  at a local optimum (no improving single move) or after ``max_moves``.
  Each move costs O(n L) (one pass over the candidate table), so this is an
  analysis tool rather than a fast path: on Fashion-MNIST (n = 60k, s = 40,
  k = 1, L = 32, PCA-50 features) each rule converged after about 16k-18k
  moves, in about 400 s on two shared cores.

  Formal guarantees:
    None for privacy. The edges are a joint optimisation over all records:
    changing one record can re-route other records' edges, so the
    reverse-k-NN sensitivity 2kr does not hold and no DP guarantee is
    claimed without a new analysis (spec/REVERSE_KNN.md §5, I8). The result's
    ``privacy.dp_valid`` is False and carries a ``balanced_connection_no_dp``
    warning. What does hold: out-degree exactly k for every record, distinct
    queries per record, and Score never worse than reverse k-NN's in the
    chosen objective.

  References:
    Li et al., arXiv:2207.13253, Appendix C (https://arxiv.org/abs/2207.13253).

  Args:
    private_features: float ``[n, d]``.
    query_features: float ``[s, d]``.
    k: out-degree, ``1 <= k <= s``.
    objective: ``"max-min"`` or ``"harmonic"``.
    num_candidates: L, queries each record may connect to (its L nearest);
      default ``min(s, max(32, 4k))``; ``k <= L <= s``.
    bandwidth: h > 0 of the similarity; default: the median over queries of
      the squared distance to the nearest other query (public data only).
    max_moves: cap on edge moves, at most ``2**31 - 1`` (default ``n * k``, capped there).
    block_size: records per block of the candidate search, at most 2**24.

  Returns:
    A :class:`Connection` with ``buckets`` int32 ``[n, k]`` (each row nearest
    first) and diagnostics (objective before/after, moves, converged).

  Raises:
    ValueError: bad k, objective, num_candidates, bandwidth, max_moves or
      features.
  """
  x, q, k = _check_pair(private_features, query_features, k, k_at_most="s")
  n, s = x.shape[0], q.shape[0]
  objective = _validate.choice("objective", objective, OBJECTIVES)
  L = min(s, max(32, 4 * k)) if num_candidates is None else num_candidates
  L = _validate.integer("num_candidates", L, minimum=k, maximum=s)
  h = _default_bandwidth(q) if bandwidth is None else _validate.positive("bandwidth", bandwidth)
  moves_cap = min(n * k, 2**31 - 1) if max_moves is None else max_moves
  moves_cap = _validate.integer("max_moves", moves_cap, minimum=0, maximum=2**31 - 1)  # an int32 loop counter
  bs = min(_block_size(block_size), n)
  cand, dist = nearest_columns(x, q, L, bs)
  sim = 1.0 / (1.0 + dist / h)
  active = jnp.arange(L)[None, :] < k  # reverse k-NN: the k nearest candidates
  act, S, moves, stuck, S0 = _balance(cand, sim, jnp.broadcast_to(active, cand.shape), objective, s,
                                      moves_cap)
  S0 = np.asarray(S0, np.float64)
  # Exactly k active slots per row; keep them in candidate (= distance) order.
  slot = lax.top_k(act.astype(jnp.int32) * (L - jnp.arange(L))[None, :], k)[1]
  buckets = np.asarray(jnp.take_along_axis(cand, slot, axis=1), np.int32)
  S = np.asarray(S, np.float64)

  def summary(v):
    harm = float(s / np.sum(1.0 / v)) if np.all(v > 0) else 0.0
    return {"min_score": float(v.min()), "harmonic_mean_score": harm, "mean_score": float(v.mean())}

  rule = "balanced-max-min" if objective == "max-min" else "balanced-harmonic"
  return Connection(buckets, s, connection_privacy(rule, k=k, num_queries=s),
                    {"objective": objective, "num_candidates": L, "bandwidth": h,
                     "moves": int(moves), "converged": bool(stuck),
                     "before": summary(S0), "after": summary(S)})


def connect(rule: str, private_features: Any, query_features: Any, k: int, **options) -> Connection:
  """Dispatches to a connection rule by name (one of :data:`RULES`).

  ``options`` go to :func:`reverse_knn_connection`, :func:`knn_labeling` or
  :func:`balanced_connection`.
  """
  rule = _validate.choice("rule", rule, RULES)
  target = {"reverse-knn": reverse_knn_connection, "knn-labeling": knn_labeling}.get(rule, balanced_connection)
  accepted = set(inspect.signature(target).parameters) - {"private_features", "query_features", "k", "objective"}
  unknown = sorted(set(options) - accepted)
  if unknown:  # a TypeError from the rule's signature before (the objective comes from the rule's name)
    raise ValueError(f"Expected options of rule={rule!r} among {sorted(accepted)}; got {unknown}.")
  if target is balanced_connection:
    objective = "max-min" if rule == "balanced-max-min" else "harmonic"
    return balanced_connection(private_features, query_features, k, objective=objective, **options)
  return target(private_features, query_features, k, **options)
