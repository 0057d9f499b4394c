"""Bucketized Sparse Vector Summation (BSVS): the clients' sparse inputs.

Client i holds T_i in {0,1}^s with ||T_i||_1 <= k (the buckets = queries its
record connects to) and y_i in {0,1}^{|Y|} with ||y_i||_1 <= r (one-hot
label, r = 1, or r-hot). Its contribution is A^i = T_i y_i^T, and the goal is
A = sum_i A^i under central, local or shuffle DP (spec/REVERSE_KNN.md §1.3,
the paper's Definition 4).

Inputs stay sparse: ``buckets`` int32 ``[n, k]`` and ``labels`` int32
``[n, r]`` with ``-1`` padding, so a client's non-zero entries of the
flattened A^i (domain d = s|Y|, at most c = kr of them) are
``bucket * |Y| + label``. Nothing ever materialises a dense n x s x |Y|
tensor; the aggregate is a scatter-add into ``[s, |Y|]``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import Relation

__all__ = [
    "BsvsShape",
    "BsvsInput",
    "make_bsvs_input",
    "client_entries",
    "bsvs_counts",
    "bsvs_sensitivity",
    "SyntheticWorkload",
    "synthetic_workload",
]


_MAX_DOMAIN = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class BsvsShape:
  """Static sizes of a BSVS problem.

  Attributes:
    num_buckets: s, the number of queries.
    num_labels: |Y|.
    k: at most k buckets per client (reverse k-NN out-degree).
    r: at most r labels per client (1 for multi-class).
  """

  num_buckets: int
  num_labels: int
  k: int
  r: int = 1

  def __post_init__(self):
    s = _validate.integer("num_buckets", self.num_buckets, minimum=1)
    y = _validate.integer("num_labels", self.num_labels, minimum=1)
    k = _validate.integer("k", self.k, minimum=1)
    r = _validate.integer("r", self.r, minimum=1)
    # Keep the validated Python ints: a whole float (4.0) or a NumPy integer would otherwise reach array shapes.
    for name, value in (("num_buckets", s), ("num_labels", y), ("k", k), ("r", r)):
      object.__setattr__(self, name, value)
    if k > s:
      raise ValueError(f"Expected k={k} <= num_buckets={s}.")
    if r > y:
      raise ValueError(f"Expected r={r} <= num_labels={y}.")
    if s * y > _MAX_DOMAIN:  # flattened indices t * |Y| + y are int32 on the device
      raise ValueError(f"Expected num_buckets * num_labels = {s} * {y} = {s * y} <= {_MAX_DOMAIN} (flattened "
                       f"indices are int32).")

  @property
  def d(self) -> int:
    """Flattened domain size s * |Y|."""
    return self.num_buckets * self.num_labels

  @property
  def c(self) -> int:
    """Largest number of non-zero entries per client, k * r."""
    return self.k * self.r


class BsvsInput(NamedTuple):
  """n clients' sparse BSVS vectors (a pytree; shard or slice along axis 0).

  Attributes:
    buckets: int32 ``[n, k]`` distinct bucket indices per client, -1 = padding.
    labels: int32 ``[n, r]`` distinct label indices per client, -1 = padding.
  """

  buckets: jax.Array
  labels: jax.Array

  @property
  def num_clients(self) -> int:
    return int(self.buckets.shape[0])


def make_bsvs_input(buckets: Any, labels: Any, *, num_buckets: int, num_labels: int,
                    k: int | None = None, r: int | None = None) -> tuple[BsvsInput, BsvsShape]:
  """Validates clients' buckets and labels on the host and packs them.

  Args:
    buckets: int ``[n, k]`` (or ``[n]`` for k = 1) bucket indices, -1 pads.
    labels: int ``[n, r]`` (or ``[n]`` for r = 1) label indices, -1 pads.
    num_buckets: s.
    num_labels: |Y|.
    k: declared out-degree bound (default: ``buckets.shape[1]``).
    r: declared label bound (default: ``labels.shape[1]``).

  Returns:
    ``(BsvsInput, BsvsShape)``.

  Raises:
    ValueError: mismatched shapes, indices out of range, duplicated indices
      within a client, NaN or non-integer values, k > s, r < 1.
  """
  arrays = {}
  for name, value, width in (("buckets", buckets, "k"), ("labels", labels, "r")):
    try:  # ragged rows gave NumPy's "inhomogeneous shape" message, which names neither
      arrays[name] = np.asarray(value)
    except ValueError:
      raise ValueError(f"Expected {name} to be a rectangular [n, {width}] array; got ragged rows (pad short rows "
                       "with -1).") from None
  b, lab = arrays["buckets"], arrays["labels"]
  for name, arr in (("buckets", b), ("labels", lab)):
    if arr.dtype.kind == "f":
      if not np.isfinite(arr).all():  # inf was cast to -2^63 and named so
        raise ValueError(f"Expected {name} to hold integers; found {'NaN' if np.isnan(arr).any() else 'inf'}.")
      if not np.all(arr == np.round(arr)):
        raise ValueError(f"Expected {name} to hold integers; found non-integers.")
    elif arr.dtype.kind not in "iu":
      raise ValueError(f"Expected {name} to hold integers; got dtype {arr.dtype}.")
  if b.ndim not in (1, 2) or lab.ndim not in (1, 2):
    raise ValueError(f"Expected buckets [n, k] (or [n]) and labels [n, r] (or [n]); got {np.shape(buckets)} and "
                     f"{np.shape(labels)}.")
  if b.shape[0] != lab.shape[0]:
    raise ValueError(f"Expected as many label rows as bucket rows; got {b.shape[0]} and {lab.shape[0]}.")
  if b.shape[0] < 1:
    raise ValueError("Expected at least one client (n >= 1).")
  b = b.reshape(b.shape[0], -1)
  lab = lab.reshape(lab.shape[0], -1)
  shape = BsvsShape(num_buckets, num_labels, b.shape[1] if k is None else k,
                    lab.shape[1] if r is None else r)
  if b.shape[1] > shape.k:
    raise ValueError(f"Expected at most k={shape.k} buckets per client; got {b.shape[1]} columns.")
  if lab.shape[1] > shape.r:
    raise ValueError(f"Expected at most r={shape.r} labels per client; got {lab.shape[1]} columns.")
  checked = []
  for name, arr, hi in (("buckets", b, shape.num_buckets), ("labels", lab, shape.num_labels)):
    # In the input's own dtype, then cast: a uint64 2^64 - 1 cast to int64 first became -1, padding (a vote dropped).
    _check_index_range(name, arr, hi)
    arr = arr.astype(np.int64)
    checked.append(arr)
    dup = repeated_in_rows(arr)
    if dup.any():
      row = int(np.flatnonzero(dup)[0])
      raise ValueError(f"Expected distinct {name} within a client; client {row} has {arr[row].tolist()}.")
  b, lab = checked
  pad_b = np.full((b.shape[0], shape.k - b.shape[1]), -1, np.int64)
  pad_l = np.full((lab.shape[0], shape.r - lab.shape[1]), -1, np.int64)
  inp = BsvsInput(jnp.asarray(np.concatenate([b, pad_b], 1), jnp.int32),
                  jnp.asarray(np.concatenate([lab, pad_l], 1), jnp.int32))
  return inp, shape


def check_shape(shape: Any) -> BsvsShape:
  """Returns ``shape`` if it is a :class:`BsvsShape`, else raises ``ValueError`` naming it."""
  if not isinstance(shape, BsvsShape):
    raise ValueError(f"Expected shape to be a BsvsShape; got {type(shape).__name__}.")
  return shape


def _index_vector(name: str, value: Any) -> jax.Array | np.ndarray:
  """``value`` as a 1-D integer array, or a ValueError naming ``name``.

  A JAX array (or tracer) is returned as is; anything else as a NumPy array
  of its own integer dtype, so the range checks see its values before any
  int32 conversion (``jnp.asarray`` turned int64 2^32 + 1 into 1).
  """
  if isinstance(value, jax.Array):
    arr = value
  else:
    try:
      arr = np.asarray(value)
    except (TypeError, ValueError):
      arr = None
    if arr is None or arr.dtype == object:
      raise ValueError(f"Expected {name} to be a 1-D integer array; got {type(value).__name__} "
                       f"{_validate.shown(value)}.")
  if arr.ndim != 1 or not jnp.issubdtype(arr.dtype, jnp.integer):
    raise ValueError(f"Expected {name} to be a 1-D integer array; got shape {tuple(arr.shape)}, dtype {arr.dtype}.")
  return arr


def _check_index_range(name: str, arr: np.ndarray, hi: int | None) -> None:
  """ValueError unless every entry of ``arr`` is in [0, hi) (``hi=None``: [0, inf)) or -1 (padding)."""
  bad = (arr < -1) if hi is None else (arr < -1) | (arr >= hi)
  if bad.any():
    where = ">= 0" if hi is None else f"in [0, {hi})"
    raise ValueError(f"Expected {name} {where} or -1 (padding); found {arr[bad][:3].tolist()}.")


def _check_entry_range(buckets: np.ndarray, labels: np.ndarray, num_labels: int) -> None:
  """ValueError if concrete ``labels`` leave [-1, num_labels) or an entry passes 2^31 - 1."""
  _check_index_range("buckets", buckets, None)
  _check_index_range("labels", labels, num_labels)
  top_b, top_l = (int(a.max()) if a.size else -1 for a in (buckets, labels))  # any integer dtype, uint64 too
  if top_b >= 0 and top_l >= 0 and top_b * num_labels + top_l > _MAX_DOMAIN:
    raise ValueError(f"Expected every entry t * num_labels + y <= 2^31 - 1 (int32); bucket {top_b} with "
                     f"num_labels={num_labels} gives {top_b * num_labels + top_l}.")


def client_entries(buckets: jax.Array, labels: jax.Array, num_labels: int) -> jax.Array:
  """Flattened non-zero positions of one client's A^i: ``int32 [k * r]``, -1 pads.

  Entry (t, y) of A^i maps to ``t * num_labels + y``, computed in int32 whatever the
  inputs' integer type (int16 wrapped: 299 * 200 + 199 dropped a vote, 16384 * 4 moved
  one onto entry 0).

  Args:
    buckets: integer ``[k]`` bucket indices, -1 pads.
    labels: integer ``[r]`` label indices, -1 pads (k and r may differ).
    num_labels: |Y|, an integer in [1, 2^31 - 1] (``_MAX_DOMAIN``).

  Raises:
    ValueError: ``num_labels`` not an integer in that range (3.5, True, 0, -1 and 2^31 gave
      wrong entries or a deep OverflowError), or ``buckets``/``labels`` not a 1-D integer
      array (a 2-D one was flattened into wrong entries; only dtype and shape are read, so
      the check costs nothing under ``jit`` or ``vmap``). For concrete (not traced) inputs
      also a value below -1 (it was a silent pad), a label >= ``num_labels`` (it would
      alias entry (t + 1, 0)) or an entry past 2^31 - 1 (it would wrap in int32), read in
      the inputs' own dtype. Traced inputs are not read: the mechanisms' inputs come from
      :func:`make_bsvs_input`, whose :class:`BsvsShape` checks both.
  """
  num_labels = _validate.integer("num_labels", num_labels, minimum=1, maximum=_MAX_DOMAIN)
  buckets, labels = _index_vector("buckets", buckets), _index_vector("labels", labels)
  if not isinstance(buckets, jax.core.Tracer) and not isinstance(labels, jax.core.Tracer):
    _check_entry_range(np.asarray(buckets), np.asarray(labels), num_labels)  # in the inputs' own dtypes
  # Host inputs are copied (int32), never shared with the caller.
  buckets, labels = (_validate.owned_device_array(a, np.int32) for a in (buckets, labels))
  ent = buckets[:, None] * num_labels + labels[None, :]
  valid = (buckets[:, None] >= 0) & (labels[None, :] >= 0)
  return jnp.where(valid, ent, -1).reshape(-1).astype(jnp.int32)


def entry_indicator(entries: jax.Array, d: int, dtype: Any = jnp.int32) -> jax.Array:
  """``[d]`` indicator (in ``dtype``) of one client's entries (int32 ``[<= c]``, -1 pads dropped).

  The entries of :func:`client_entries` are distinct, so this is A^i flattened.
  """
  return jnp.zeros(d + 1, dtype).at[jnp.where(entries >= 0, entries, d)].set(jnp.ones((), dtype))[:d]


def entry_histogram(buckets: jax.Array, labels: jax.Array, valid: jax.Array | None,
                    num_buckets: int, num_labels: int) -> jax.Array:
  """int32 ``[d]``: how many (valid) clients hold each flattened entry of A.

  A scatter-add of the at most kr entries per client, O(n kr) work, never a
  dense ``[n, d]`` array.

  Args:
    buckets: int32 ``[n, k]`` (-1 pads).
    labels: int32 ``[n, r]`` (-1 pads).
    valid: bool ``[n]`` (rows with False are skipped) or None (all rows).
    num_buckets: s.
    num_labels: |Y|.
  """
  ent = jax.vmap(client_entries, in_axes=(0, 0, None))(buckets, labels, num_labels)
  d = num_buckets * num_labels
  keep = ent >= 0 if valid is None else (ent >= 0) & valid[:, None]
  # Padding and invalid rows go to a dropped overflow slot d.
  flat = jnp.zeros(d + 1, jnp.int32).at[jnp.where(keep, ent, d).reshape(-1)].add(1)
  return flat[:d]


def repeated_in_rows(a: Any) -> Any:
  """bool ``[rows]``: rows of a 2-D integer array holding some index twice (-1 is padding, never a repeat).

  A client (or record) that lists a bucket or label twice moves one vote entry by 2, which the unit-shift
  sensitivity of every account does not cover. NumPy in, NumPy out (host checks); a JAX array, also
  under ``jit``, gives a JAX array.
  """
  xp = np if isinstance(a, np.ndarray) else jnp
  srt = xp.sort(a, axis=1)
  return ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any(axis=1)


def check_client(shape: BsvsShape, buckets: Any, labels: Any) -> tuple[jax.Array, jax.Array]:
  """The per-client check of every mechanism's ``randomize``: one client must fit the declared ``shape``.

  Widths are static, so they are checked always (free under ``jit`` and
  ``vmap``): more than k buckets or r labels per client would add entries
  the noise is not calibrated to. Concrete (not traced) inputs then go
  through :func:`check_input_fits` as a one-client input, which reads them in
  their own dtype: buckets in [0, s) and labels in [0, |Y|), or -1
  (padding), and no index listed twice (a repeat moves one entry by 2 in the
  multi-message shuffle, beyond the unit-shift sensitivity). The runner
  checks whole inputs that way before tracing them; this is for direct
  calls, where ``RandomizedResponse.randomize`` took 2 buckets under k = 1
  and bucket 5 of 4 without a word.

  Returns ``(buckets, labels)`` as int32 JAX arrays: traced inputs as they
  are (cast), host inputs copied, never sharing the caller's memory (see
  :func:`jaxdistill._validate.owned_device_array`).
  """
  arrs = (_index_vector("buckets", buckets), _index_vector("labels", labels))
  for name, arr, bound_name, bound in (("buckets", arrs[0], "k", shape.k), ("labels", arrs[1], "r", shape.r)):
    if arr.shape[0] > bound:
      raise ValueError(f"Expected at most {bound_name}={bound} {name} per client, the declared bound (the noise is "
                       f"calibrated to it); got {name} of shape {tuple(arr.shape)}.")
  if not any(isinstance(a, jax.core.Tracer) for a in arrs):  # range and repeats, read in the inputs' own dtypes
    # On the host: a concrete JAX array closed over by a jitted function is sliced into a tracer there.
    check_input_fits(BsvsInput(*(np.asarray(a)[None, :] for a in arrs)), shape, 1)
  b, lab = (_validate.owned_device_array(a, np.int32) for a in arrs)
  return b, lab


def input_num_clients(clients: BsvsInput) -> int:
  """n of a :class:`BsvsInput` whose fields are arrays (NumPy or JAX) with a client axis, else a ``ValueError``.

  Nested lists or a 0-d array have no client axis: ``num_clients`` raised an AttributeError or an
  IndexError instead of naming the field.
  """
  for name, arr in (("buckets", clients.buckets), ("labels", clients.labels)):
    if not isinstance(arr, (np.ndarray, jax.Array)):
      raise ValueError(f"Expected clients.{name} to be a NumPy or JAX array; got {type(arr).__name__}.")
    if arr.ndim < 1:
      raise ValueError(f"Expected clients.{name} of shape [n, ...]; got a 0-d array.")
  return clients.num_clients


def check_input_fits(clients: BsvsInput, shape: BsvsShape, n: int | None = None) -> None:
  """Raises ``ValueError`` unless ``clients`` fit ``shape`` (and number ``n`` when given).

  Buckets >= s or labels >= |Y| would be dropped or counted in another
  cell, more than k buckets (r labels) per client or a repeated one would
  break the sensitivity the noise is calibrated to. Runs on the host (not
  under ``jit``). A host (NumPy) array is checked in its own dtype, before
  JAX casts it: without x64 an int64 bucket 2**32 + 1 becomes 1 and 2**32 - 1
  becomes -1 (padding), so checking after the cast counted the first in
  bucket 1 and dropped the second's vote.
  """
  n_rows = input_num_clients(clients)
  n = n_rows if n is None else n
  for name, arr, bound_name, bound, size_name, size in (
      ("buckets", clients.buckets, "k", shape.k, "num_buckets", shape.num_buckets),
      ("labels", clients.labels, "r", shape.r, "num_labels", shape.num_labels)):
    if arr.ndim != 2 or arr.shape[0] != n:
      raise ValueError(f"Expected clients.{name} of shape [n={n}, ...]; got {tuple(arr.shape)}.")
    if not jnp.issubdtype(arr.dtype, jnp.integer):  # 1.5 would be cast to a bucket without a word
      raise ValueError(f"Expected integer clients.{name}; got dtype {arr.dtype}.")
    if arr.shape[1] > bound:
      raise ValueError(f"Expected at most {bound_name}={bound} {name} per client, the declared bound (the noise "
                       f"is calibrated to it); got clients.{name} of shape {tuple(arr.shape)}.")
    if arr.shape[1] < 1:
      raise ValueError(f"Expected clients.{name} with at least one column ({bound_name} >= 1, -1 pads); got "
                       f"shape {tuple(arr.shape)}.")
    if n == 0:
      continue
    xp = jnp if isinstance(arr, jax.Array) else np  # a device array already holds its device dtype
    low, high = int(xp.min(arr)), int(xp.max(arr))
    if low < -1 or high >= size:
      raise ValueError(f"Expected clients.{name} in [0, {size_name}={size}) or -1 (padding); found values in "
                       f"[{low}, {high}].")
    dup = repeated_in_rows(arr)
    if bool(xp.any(dup)):
      row = int(xp.argmax(dup))
      raise ValueError(f"Expected distinct clients.{name} within a client (padding -1 aside); client {row} has "
                       f"{np.asarray(arr[row]).tolist()}.")


@functools.partial(jax.jit, static_argnames=("num_buckets", "num_labels"))
def _counts(buckets, labels, num_buckets, num_labels):
  flat = entry_histogram(buckets, labels, None, num_buckets, num_labels)
  return flat.reshape(num_buckets, num_labels)


def bsvs_counts(inputs: BsvsInput, shape: BsvsShape) -> jax.Array:
  """The exact aggregate A = sum_i T_i y_i^T, ``int32 [s, |Y|]``.

  Raises:
    ValueError: if ``inputs`` do not fit ``shape``: buckets >= s or labels >= |Y|, more
      than k buckets (r labels) per client, a repeated one, or ragged shapes.
  """
  shape = check_shape(shape)
  if not isinstance(inputs, BsvsInput):
    raise ValueError(f"Expected inputs to be a BsvsInput (make_bsvs_input); got {type(inputs).__name__}.")
  check_input_fits(inputs, shape)
  return _counts(inputs.buckets, inputs.labels, shape.num_buckets, shape.num_labels)


def bsvs_sensitivity(k: int, r: int = 1, relation: Any = Relation.REPLACE_ONE) -> int:
  """L1 sensitivity of A: 2kr under replace-one, kr under add/remove.

  Replacing a record removes up to kr ones and adds up to kr (spec §5, I1);
  adding or removing one record changes at most kr entries by one.
  """
  k = _validate.integer("k", k, minimum=1)
  r = _validate.integer("r", r, minimum=1)
  rel = Relation.parse(relation)
  return 2 * k * r if rel is Relation.REPLACE_ONE else k * r


@functools.partial(jax.tree_util.register_dataclass, data_fields=["key", "purity", "zipf"],
                   meta_fields=["shape", "num_clients"])
@dataclasses.dataclass(frozen=True)
class SyntheticWorkload:
  """A realistic BSVS workload, generated per client from its index.

  Bucket popularity follows a Zipf law (reverse k-NN in-degrees are skewed);
  each client connects to k distinct buckets (Gumbel top-k on the
  popularity logits) and carries the dominant label of its first bucket with
  probability ``purity`` (cluster purity), else a uniform label; r > 1 adds
  r - 1 further distinct random labels.

  Client i's input depends only on ``(key, i)``, so a runner can generate
  clients chunk by chunk: memory stays independent of n.

  Attributes:
    key: threefry2x32 PRNG key of the workload.
    shape: the BSVS sizes.
    num_clients: n.
    purity: probability the label matches the bucket's dominant label.
    zipf: popularity exponent (0 = uniform).
  """

  key: jax.Array
  shape: BsvsShape
  num_clients: int
  purity: float = 0.8
  zipf: float = 1.0

  def chunk_width(self) -> int:
    """Values per client that generating a chunk holds at once: s Gumbel draws (plus |Y| when r > 1).

    :func:`jaxdistill.simulation.default_chunk_size` adds it to the
    mechanism's width to size a chunk on an accelerator.
    """
    return self.shape.num_buckets + (self.shape.num_labels if self.shape.r > 1 else 0)

  def _tables(self) -> tuple[jax.Array, jax.Array]:
    k_pop, k_dom = jax.random.split(jax.random.fold_in(self.key, 0))
    ranks = jax.random.permutation(k_pop, self.shape.num_buckets) + 1
    logits = -self.zipf * jnp.log(ranks.astype(jnp.float32))
    dominant = jax.random.randint(k_dom, (self.shape.num_buckets,), 0, self.shape.num_labels, jnp.int32)
    return logits, dominant

  def client(self, index: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(buckets int32 [k], labels int32 [r])`` of client ``index`` (jittable)."""
    logits, dominant = self._tables()
    k_pick, k_lab, k_noise, k_extra = jax.random.split(
        jax.random.fold_in(jax.random.fold_in(self.key, 1), index), 4)
    # Explicit 32-bit dtypes: the defaults are 64-bit with x64 on, which drew a different workload.
    gumbel = jax.random.gumbel(k_pick, (self.shape.num_buckets,), jnp.float32)
    _, buckets = jax.lax.top_k(logits + gumbel, self.shape.k)
    other = jax.random.randint(k_noise, (), 0, self.shape.num_labels, jnp.int32)
    keep = jax.random.uniform(k_lab, (), jnp.float32) < self.purity
    y0 = jnp.where(keep, dominant[buckets[0]], other)
    if self.shape.r == 1:
      labels = y0[None]
    else:
      extra = jax.random.gumbel(k_extra, (self.shape.num_labels,), jnp.float32).at[y0].set(jnp.inf)
      _, labels = jax.lax.top_k(extra, self.shape.r)
    return buckets.astype(jnp.int32), labels.astype(jnp.int32)

  def materialize(self, chunk_size: int = 65536) -> BsvsInput:
    """All clients as a :class:`BsvsInput` (n x (k + r) int32 on the device), the same for any ``chunk_size``.

    Raises:
      ValueError: ``chunk_size`` < 1, or a key that is not threefry2x32 (a
        workload built directly, not by :func:`synthetic_workload`).
    """
    _validate.prng_key("key", self.key, threefry=True)
    n = self.num_clients
    chunk = min(_validate.integer("chunk_size", chunk_size, minimum=1), n)
    b, lab = _materialize(self, -(-n // chunk), chunk)
    return BsvsInput(b.reshape(-1, self.shape.k)[:n], lab.reshape(-1, self.shape.r)[:n])


@functools.partial(jax.jit, static_argnames=("num_chunks", "chunk"))
def _materialize(workload: SyntheticWorkload, num_chunks: int, chunk: int):
  # Jitted at module level: one compilation per (sizes, chunking), whatever the key.
  idx = jnp.arange(num_chunks * chunk, dtype=jnp.uint32).reshape(num_chunks, chunk)
  return jax.lax.map(jax.vmap(workload.client), idx)


def synthetic_workload(key: jax.Array, *, num_clients: int, num_buckets: int, num_labels: int,
                       k: int, r: int = 1, purity: float = 0.8,
                       zipf: float = 1.0) -> SyntheticWorkload:
  """Builds a :class:`SyntheticWorkload` (validated); ``.materialize()`` for arrays.

  Args:
    key: threefry2x32 PRNG key (an ``rbg`` or ``unsafe_rbg`` key is refused: the
      clients it draws would change with the chunk size).
    num_clients: n, at most ``2**31 - 1`` (the aggregate's counts are int32).
    num_buckets: s.
    num_labels: |Y|.
    k: buckets per client (exactly k).
    r: labels per client (exactly r).
    purity: probability the label matches the bucket's dominant label.
    zipf: popularity exponent (0 = uniform).
  """
  # threefry only: an rbg key's draws under vmap differ from its unbatched ones, so the clients (and every
  # result built on them) changed with materialize's or simulate's chunk size.
  key = _validate.prng_key("key", key, threefry=True)
  shape = BsvsShape(num_buckets, num_labels, k, r)
  # Client i's draw folds in i (uint32) and the aggregate counts are int32: beyond 2^31 - 1 clients the counts
  # would wrap (and past 2^32 the clients repeat).
  n = _validate.integer("num_clients", num_clients, minimum=1, maximum=_MAX_DOMAIN)
  purity = _validate.probability("purity", purity)
  zipf = _validate.nonnegative("zipf", zipf)
  return SyntheticWorkload(key, shape, n, purity, zipf)
