"""One client-batch runner for every BSVS mechanism, streaming clients in chunks.

Client i's randomness is ``fold_in(clients_key, i)`` and the server sums
integer statistics, so the result depends only on (key, clients, mechanism):
not on the chunk size, the order of chunks, or the number of devices. Clients
come either from a materialised :class:`BsvsInput` or from a generator with
``client(index)`` (e.g. :class:`SyntheticWorkload`), in which case memory is
independent of n.

Layout of the computation (P devices, chunks of C clients):

.. code-block:: text

   clients 0 .. n-1  ->  chunks of C (the last one padded and masked)
   device p scans its contiguous block of ceil(#chunks / P) chunks:
     per chunk: mechanism.chunk_statistics(keys, buckets, labels, valid), by
                default vmap over C clients of analyze(randomize(fold_in(key, i), x_i))
                summed to one integer pytree (memory O(C * d)); mechanisms with
                sparse messages override it with a scatter-add (same integers)
   integer totals are psum-ed across the 1-D device mesh (exact, order-free)

Several hosts (``jax.distributed``; cannot be tested on one machine, so this
is documentation, not a tested claim): call ``jax.distributed.initialize()``
on every process, then call :func:`simulate` with the same key, mechanism and
workload on every process. ``jax.devices()`` is then the global device list,
the mesh spans all hosts, each device scans only its own block of chunks, and
the ``psum`` of the integer totals crosses hosts. With a generator source
(:class:`SyntheticWorkload`) nothing but the key travels: each process
generates only the clients of its addressable devices. With real client data,
build the :class:`BsvsInput` as a global array sharded along clients, each
process feeding its addressable shard, e.g. with
``jax.make_array_from_process_local_data(NamedSharding(client_mesh(), P(CLIENT_AXIS)), local_rows)``,
with a row count that is a multiple of (devices x chunk size) so no
re-layout is needed.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdistill import _validate
from jaxdistill.mechanisms import BsvsInput, BsvsMechanism, client_entries
from jaxdistill.mechanisms._base import check_clients_fit
from jaxdistill.mechanisms._bsvs import entry_histogram, entry_indicator, input_num_clients, repeated_in_rows

__all__ = ["SimulationResult", "simulate", "client_statistics", "client_mesh", "default_chunk_size",
           "CLIENT_AXIS", "MAX_CLIENTS", "CPU_CHUNK_SIZE", "ACCELERATOR_CHUNK_VALUES", "MAX_ACCELERATOR_CHUNK"]

#: Name of the mesh axis clients are sharded along.
CLIENT_AXIS = "clients"

#: Largest n: client indices are uint32 and integer statistics are int32 sums.
MAX_CLIENTS = 2**31 - 1

#: Default chunk on CPU devices: of 4,096 to 262,144 clients, 4,096 was the fastest for rr and Collision at
#: n = 10^6 on 2 cores, and 1.5x slower than the best (16,384) for the multi-message shuffle
#: (``benchmarks/profile_stages.py``; larger chunks slowed all three).
CPU_CHUNK_SIZE = 4096

#: Default chunk on an accelerator: the largest power of two whose chunk x width values (the mechanism's and
#: the client source's, see :func:`default_chunk_size`) stay within this, between :data:`CPU_CHUNK_SIZE` and
#: :data:`MAX_ACCELERATOR_CHUNK`.
ACCELERATOR_CHUNK_VALUES = 2**25

#: Largest default chunk on an accelerator.
MAX_ACCELERATOR_CHUNK = 2**18


@dataclasses.dataclass(frozen=True)
class SimulationResult:
  """Output of :func:`simulate`.

  Attributes:
    estimate: float64 ``[s, |Y|]`` estimate of A.
    stats: the summed integer statistics (host numpy pytree).
    num_clients: n.
    wall_seconds: wall time of the run (compilation included).
    num_devices: devices the clients were sharded over.
    chunk_size: clients per vmapped chunk actually used.
    counts: the exact aggregate A, int ``[s, |Y|]``, when asked for
      (``with_counts=True``), else None.
  """

  estimate: np.ndarray
  stats: Any
  num_clients: int
  wall_seconds: float
  num_devices: int = 1
  chunk_size: int = 0
  counts: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class _WithCounts(BsvsMechanism):
  """Wraps a mechanism so one pass also sums the exact A (same keys, same messages)."""

  inner: BsvsMechanism

  @property
  def shape(self):  # type: ignore[override]
    return self.inner.shape

  def randomize(self, key, buckets, labels):
    return self.inner.randomize(key, buckets, labels), client_entries(buckets, labels,
                                                                      self.shape.num_labels)

  def analyze(self, message):
    msg, entries = message
    return self.inner.analyze(msg), entry_indicator(entries, self.shape.d)

  def estimate(self, key, stats, num_clients):
    return self.inner.estimate(key, stats[0], num_clients)

  def privacy(self):
    return self.inner.privacy()

  def entry_variance(self, counts, num_clients):
    return self.inner.entry_variance(counts, num_clients)

  def chunk_statistics(self, keys, buckets, labels, valid):
    # The inner mechanism's (possibly fused) chunk path, plus the exact A of the chunk.
    stats = self.inner.chunk_statistics(keys, buckets, labels, valid)
    return stats, entry_histogram(buckets, labels, valid, self.shape.num_buckets,
                                  self.shape.num_labels)


# A source maps (source_args, global client indices [C], local row indices [C])
# to (buckets [C, k], labels [C, r]). Module-level functions keep jit caches warm.
SourceFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _from_arrays(args: BsvsInput, global_idx: jax.Array, local_idx: jax.Array):
  del global_idx  # rows are sharded: a device only sees its own block
  return args.buckets[local_idx], args.labels[local_idx]


def _from_generator(args: Any, global_idx: jax.Array, local_idx: jax.Array):
  del local_idx
  return jax.vmap(args.client)(global_idx)


def _source(clients: Any) -> tuple[int, SourceFn, bool]:
  """``(n, source_fn, sharded_rows)`` of a client source."""
  if isinstance(clients, BsvsInput):
    return input_num_clients(clients), _from_arrays, True
  if hasattr(clients, "client") and hasattr(clients, "num_clients"):
    # Validated raw: int() turned 2.5 into 2, True into 1 and '7' into 7, and NaN failed deep inside.
    raw = clients.num_clients
    raw = np.asarray(raw) if isinstance(raw, jax.Array) else raw
    n = _validate.integer("num_clients", raw)
    _check_generator(clients)
    return n, _from_generator, False
  raise ValueError(f"Expected clients to be a BsvsInput or a workload with client(index); got {type(clients)}.")


_LEAF_TYPES = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def _check_generator(clients: Any) -> None:
  """A generator travels into the jitted run as an argument, so it must be a pytree of arrays.

  A plain class (not registered with :mod:`jax.tree_util`, e.g. by
  ``jax.tree_util.register_dataclass`` as :class:`SyntheticWorkload` is) is one opaque leaf that
  JAX cannot trace: it failed inside ``jit`` with a TypeError. A PRNG key among its leaves must be
  threefry2x32: an ``rbg`` key's draws under ``vmap`` differ from its unbatched ones, so the clients
  (and the result) changed with the chunk size and the device count.
  """
  leaves = jax.tree_util.tree_leaves_with_path(clients)
  if len(leaves) == 1 and leaves[0][1] is clients:  # not registered: the object is its own (only) leaf
    raise ValueError(f"Expected a generator registered as a JAX pytree (jax.tree_util.register_dataclass, as "
                     f"SyntheticWorkload is); got {type(clients).__name__}, a class JAX sees as one opaque leaf.")
  for path, leaf in leaves:
    name = "clients" + jax.tree_util.keystr(path)
    if not isinstance(leaf, _LEAF_TYPES):
      raise ValueError(f"Expected the generator's data fields to hold arrays or numbers (others belong in its "
                       f"static fields); got {name} of type {type(leaf).__name__}.")
    if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key):
      batched = leaf.ndim > 0
      _validate.prng_key(name, leaf.reshape(-1) if batched else leaf, batched=batched, threefry=True)


def client_mesh(devices: Any = None) -> Mesh:
  """A 1-D :class:`jax.sharding.Mesh` with axis :data:`CLIENT_AXIS`.

  Args:
    devices: ``None`` (all of ``jax.devices()``, i.e. every host's devices
      under ``jax.distributed``), an int (the first that many devices), a
      sequence of devices, or a 1-D ``Mesh`` (returned as is).

  Raises:
    ValueError: a count outside [1, len(jax.devices())], an empty sequence, a
      sequence naming a device twice, or a mesh that is not 1-D.
  """
  if isinstance(devices, Mesh):
    if len(devices.axis_names) != 1:
      raise ValueError(f"Expected a 1-D mesh; got axes {devices.axis_names}.")
    return devices if devices.axis_names == (CLIENT_AXIS,) else Mesh(devices.devices, (CLIENT_AXIS,))
  available = jax.devices()
  if devices is None:
    devs = available
  elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
    count = _validate.integer("devices", devices, minimum=1, maximum=len(available))
    devs = available[:count]
  else:
    devs = list(devices) if isinstance(devices, (list, tuple, np.ndarray)) else None
    if devs is None or not all(isinstance(d, jax.Device) for d in devs):
      raise ValueError(f"Expected devices to be None, a count, a sequence of jax devices or a 1-D Mesh; "
                       f"got {devices!r}.")
    if not devs:
      raise ValueError("Expected devices to name at least one device; got an empty sequence.")
    if len(set(devs)) != len(devs):
      raise ValueError(f"Expected devices to be distinct; got {devs!r}.")
  return Mesh(np.array(devs), (CLIENT_AXIS,))


@functools.partial(jax.jit, static_argnames=("mechanism", "source_fn", "sharded_rows",
                                             "chunks_per_device", "chunk_size", "mesh"))
def _run(clients_key, source_args, num_clients, mechanism, source_fn, sharded_rows,
         chunks_per_device, chunk_size, mesh):
  """Summed integer statistics; see the module docstring for the layout."""

  def per_device(key, args, n):
    first_chunk = jax.lax.axis_index(CLIENT_AXIS).astype(jnp.uint32) * chunks_per_device
    lane = jnp.arange(chunk_size, dtype=jnp.uint32)

    def chunk_stats(j):
      global_idx = (first_chunk + j) * chunk_size + lane
      valid = global_idx < n
      safe_idx = jnp.where(valid, global_idx, 0)
      buckets, labels = source_fn(args, safe_idx, j * chunk_size + lane)
      if sharded_rows:  # arrays: checked on the host before the run
        bad = jnp.int32(0)
      else:  # checked in the generator's own dtype, before the cast below
        bad = jnp.sum(valid & _bad_rows(buckets, labels, mechanism.shape.num_buckets, mechanism.shape.num_labels),
                      dtype=jnp.int32)
      # Checked rows lie in [-1, size) with size < 2^31, so the cast is exact; mechanisms see int32 rows.
      buckets, labels = buckets.astype(jnp.int32), labels.astype(jnp.int32)
      keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, safe_idx)
      return mechanism.chunk_statistics(keys, buckets, labels, valid), bad

    def body(carry, _):
      total, j = carry
      total = jax.tree.map(lambda t, s: t + s.astype(t.dtype), total, chunk_stats(j))
      return (total, j + 1), None

    shapes = jax.eval_shape(chunk_stats, jnp.uint32(0))
    zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    # The chunk counter rides in the carry (no [num_chunks] index array: O(1) in n).
    (total, _), _ = jax.lax.scan(body, (zero, jnp.uint32(0)), None, length=chunks_per_device)
    return jax.lax.psum(total, CLIENT_AXIS)

  args_spec = P(CLIENT_AXIS) if sharded_rows else P()
  return jax.shard_map(per_device, mesh=mesh, in_specs=(P(), args_spec, P()), out_specs=P(),
                       check_vma=False)(clients_key, source_args, num_clients)


def _bad_rows(buckets: jax.Array, labels: jax.Array, num_buckets: int, num_labels: int) -> jax.Array:
  """bool ``[C]``: rows with an index outside [-1, size) or a repeated non-padding index.

  Arrays are checked on the host before the run (check_clients_fit); a generator's clients exist
  only inside it, so they are counted here and the run raises if any is bad. The tests run in the
  rows' own integer dtype and skip a bound the dtype cannot cross: ``a < -1`` in an unsigned dtype
  (which has no -1 padding) wrapped -1 to 2^32 - 1 and refused every valid uint32 row.
  """
  def bad(a, size):
    info = jnp.iinfo(a.dtype)
    out = repeated_in_rows(a)
    if info.min < -1:
      out = out | jnp.any(a < -1, axis=1)
    if size <= info.max:
      out = out | jnp.any(a >= size, axis=1)
    return out
  return bad(buckets, num_buckets) | bad(labels, num_labels)


def _checked(total: tuple[Any, jax.Array], n: int, mechanism: BsvsMechanism) -> Any:
  """The statistics, or a ValueError if some generated client did not fit the mechanism's shape."""
  stats, bad = total
  bad = int(bad)
  if bad:
    shape = mechanism.shape
    raise ValueError(f"Expected every client's buckets in [0, num_buckets={shape.num_buckets}) and labels in "
                     f"[0, num_labels={shape.num_labels}), distinct (-1 pads); the generator gave {bad} of {n} "
                     "clients outside that, which the mechanism's noise and privacy statement do not cover.")
  return stats


def _platform(mesh: Mesh) -> str:
  """The platform of the mesh's first device ("cpu", "gpu", "tpu", ...)."""
  return str(mesh.devices.flat[0].platform)


def default_chunk_size(mechanism: BsvsMechanism, clients: Any = None, devices: Any = None) -> int:
  """Clients per chunk when :func:`simulate` is given ``chunk_size=None``; the result does not depend on it.

  On CPU devices, :data:`CPU_CHUNK_SIZE` (4,096). On a GPU or TPU the
  runner's per-chunk cost is mostly fixed (kernel launches, and the host
  round trip of the multi-message shuffle's ``while_loop`` and ``cond``),
  so larger chunks are faster: the largest power of two ``C`` with
  ``C x width <= ACCELERATOR_CHUNK_VALUES`` (2^25), clipped to
  [4,096, 2^18]. The width is the values one client holds at once:
  ``mechanism.chunk_width()`` plus the source's, which is k + r for a
  :class:`~jaxdistill.mechanisms.BsvsInput`, ``clients.chunk_width()`` for a
  generator that defines it (:class:`~jaxdistill.mechanisms.SyntheticWorkload`:
  s, plus |Y| when r > 1), and d = s|Y| for any other generator. XLA:CPU's
  buffer assignment put 4 to 21 bytes per value
  (``tests/simulation/test_chunk_size.py``), so about 0.7 GB at most.

  Measured at n = 10^6, s = 40, |Y| = 10, k = 1 on an NVIDIA H200
  (``benchmarks/README.md``): this gives 65,536 for rr and Collision (1.6x
  and 2.2x faster than 4,096) and 2^18 for the multi-message shuffle (14x
  faster). TPUs take the same rule, unmeasured.

  Args:
    mechanism: the :class:`BsvsMechanism` to run.
    clients: the client source (``None``: counted as arrays, k + r).
    devices: as :func:`client_mesh`; the first device's platform decides.

  Raises:
    ValueError: not a mechanism, or a bad ``devices``.
  """
  if not isinstance(mechanism, BsvsMechanism):
    raise ValueError(f"Expected mechanism to be a BsvsMechanism; got {type(mechanism).__name__}.")
  mesh = client_mesh(devices)
  if _platform(mesh) == "cpu":
    return CPU_CHUNK_SIZE
  shape = mechanism.shape
  if clients is None or isinstance(clients, BsvsInput):
    source = shape.k + shape.r
  elif callable(getattr(clients, "chunk_width", None)):
    source = int(clients.chunk_width())
  else:
    source = shape.d
  width = max(int(mechanism.chunk_width()) + source, 1)
  fit = 1 << max((ACCELERATOR_CHUNK_VALUES // width).bit_length() - 1, 0)
  return int(min(max(fit, CPU_CHUNK_SIZE), MAX_ACCELERATOR_CHUNK))


def _plan(n: int, chunk_size: int, num_devices: int) -> tuple[int, int]:
  """``(chunk, chunks_per_device)``: as few chunks as ``chunk_size`` allows, then the least padding.

  With P devices, each scans ``m = ceil(ceil(n / c0) / P)`` chunks, where ``c0 = min(chunk_size,
  ceil(n / P))``: the scan length that chunks of ``c0`` need. The chunk is then the smallest that
  covers n in P * m chunks, ``chunk = ceil(n / (P m)) <= c0``, so the rows past n (padding, masked)
  number ``P m chunk - n < P m``: fewer than one per chunk on average (all-padding chunks remain
  possible only when the chunk is smaller than P m). When n is a multiple of P * chunk_size the
  chunk is chunk_size. The result does not depend on the plan (module docstring).
  """
  c0 = min(chunk_size, -(-n // num_devices))
  per_device = -(-(-(-n // c0)) // num_devices)
  return -(-n // (num_devices * per_device)), per_device


def _pad_rows(inp: BsvsInput, rows: int) -> BsvsInput:
  extra = rows - inp.num_clients
  if extra == 0:
    return inp
  return BsvsInput(*(jnp.pad(a, ((0, extra), (0, 0)), constant_values=-1) for a in inp))


def _on_mesh(tree: Any, mesh: Mesh, spec: P) -> Any:
  """``tree`` with its JAX arrays placed on ``mesh`` as ``spec`` says (other leaves left to ``jit``).

  An array committed to devices outside the mesh (``device_put`` on another device, or sharded over
  all devices when the run uses fewer) made ``jit`` refuse the run ("incompatible devices"). Moving
  it changes where rows live, not their values, so the result stays the same.
  """
  sharding = NamedSharding(mesh, spec)
  return jax.tree.map(lambda x: jax.device_put(x, sharding) if isinstance(x, jax.Array) else x, tree)


def _prepare(mechanism: Any, clients: Any, chunk_size: Any, devices: Any):
  if not isinstance(mechanism, BsvsMechanism):
    raise ValueError(f"Expected mechanism to be a BsvsMechanism; got {type(mechanism).__name__}.")
  n, source_fn, sharded_rows = _source(clients)
  _validate.integer("num_clients", n, minimum=1, maximum=MAX_CLIENTS)
  check_clients_fit(mechanism, clients, n)
  mesh = client_mesh(devices)
  if chunk_size is None:
    chunk_size = default_chunk_size(mechanism, clients, mesh)
  chunk_size = _validate.integer("chunk_size", chunk_size, minimum=1)
  chunk, per_device = _plan(n, chunk_size, mesh.size)
  if sharded_rows:
    clients = _pad_rows(clients, chunk * per_device * mesh.size)
  clients = _on_mesh(clients, mesh, P(CLIENT_AXIS) if sharded_rows else P())
  return n, source_fn, sharded_rows, clients, chunk, per_device, mesh


def client_statistics(key: jax.Array, mechanism: BsvsMechanism, clients: Any, *,
                      chunk_size: int | None = None, devices: Any = None) -> Any:
  """Summed integer statistics of all clients' messages (no final estimate).

  .. math:: S = \\sum_{i=0}^{n-1} \\mathrm{analyze}(\\mathrm{randomize}(
            \\mathrm{fold\\_in}(key, i), x_i))

  Args:
    key: the clients key (client i uses ``fold_in(key, i)``).
    mechanism: any :class:`BsvsMechanism`.
    clients: a :class:`BsvsInput` (``buckets [n, k]``, ``labels [n, r]``
      integer arrays) or a generator: a JAX pytree (e.g. a dataclass
      registered with ``jax.tree_util.register_dataclass``, as
      :class:`SyntheticWorkload` is) with ``num_clients`` and a jittable
      ``client(index)`` that maps a uint32 index to integer rows
      ``(buckets [k], labels [r])`` (-1 pads in a signed dtype; an unsigned
      one has no padding); any PRNG key in it must be threefry2x32.
    chunk_size: clients per vmapped chunk (memory O(chunk_size x width)
      per device, the width as in :func:`default_chunk_size`: d for most
      mechanisms); it does not change the result. ``None``:
      :func:`default_chunk_size` (4,096 on CPU, larger on a GPU or TPU).
    devices: see :func:`client_mesh` (default: all devices); it does not
      change the result.

  Returns:
    The mechanism's statistics pytree summed over clients (device arrays,
    replicated). Sums are in the statistics' own integer dtype (int32 unless
    x64 is enabled): per-client statistics times n must stay below 2^31.

  Raises:
    ValueError: not a mechanism, an unknown client source (a generator that
      is not a pytree, or holds an ``rbg`` key; arrays that are not NumPy or
      JAX arrays), n outside [1, 2^31 - 1], chunk_size < 1, or a bad
      ``devices``; generator rows that are not 1-D integer arrays; clients
      that do not fit the mechanism (more than its k buckets or r labels per
      client, indices outside its s buckets or |Y| labels, or, for a shuffle
      mechanism, n other than its ``num_clients``), because the noise and
      the privacy statement were built for that shape. A generator's indices
      are checked in the same pass (its clients exist only inside it), so
      that error comes after the pass, before any estimate.
  """
  key = _validate.prng_key("key", key, threefry=True)
  n, source_fn, sharded_rows, clients, chunk, per_device, mesh = _prepare(
      mechanism, clients, chunk_size, devices)
  key = _on_mesh(key, mesh, P())
  return _checked(_run(key, clients, jnp.uint32(n), mechanism, source_fn, sharded_rows, per_device, chunk,
                       mesh), n, mechanism)


def simulate(key: jax.Array, mechanism: BsvsMechanism, clients: Any, *,
             chunk_size: int | None = None, devices: Any = None,
             with_counts: bool = False) -> SimulationResult:
  """Runs ``mechanism`` over all clients and returns the server's estimate.

  The clients stream through ``lax.scan`` in vmapped chunks, so memory is
  O(chunk_size x d) per device whatever n is (with a generator source); the
  chunks are sharded over a 1-D device mesh and the integer totals summed
  with ``psum``. See the module docstring for several hosts.

  Args:
    key: PRNG key; split into a clients key (client i uses
      ``fold_in(clients_key, i)``) and a server key (central noise). The
      key determines all the noise: anyone who knows it can recompute the
      noise and subtract it. A key from a recorded seed suits experiments;
      for a real release use a secret one (:func:`secret_key`).
    mechanism: any :class:`BsvsMechanism`.
    clients: a :class:`BsvsInput` or a generator such as
      :class:`SyntheticWorkload` (see :func:`client_statistics`). Arrays
      committed to other devices are moved onto the mesh.
    chunk_size: clients per vmapped chunk (see :func:`client_statistics`;
      ``None`` picks :func:`default_chunk_size`).
    devices: ``None`` (all devices), a count, a device list, or a 1-D mesh.
    with_counts: also sum the exact aggregate A in the same pass
      (``result.counts``; the mechanism's messages are unchanged).

  Returns:
    A :class:`SimulationResult`. The same key gives bitwise-identical
    statistics and estimate for any ``chunk_size`` and any number of devices
    (a threefry2x32 key, the default; an ``rbg`` or ``unsafe_rbg`` key, whose
    vmapped and sharded draws differ, is refused).

  Raises:
    ValueError: as :func:`client_statistics`.

  >>> from jaxdistill import mechanisms as M
  >>> w = M.synthetic_workload(jax.random.key(0), num_clients=1000, num_buckets=4, num_labels=2, k=1)
  >>> simulate(jax.random.key(1), M.RandomizedResponse(w.shape, 1.0), w).estimate.shape
  (4, 2)
  """
  key = _validate.prng_key("key", key, threefry=True)
  start = time.perf_counter()
  clients_key, server_key = jax.random.split(key)
  n, source_fn, sharded_rows, clients, chunk, per_device, mesh = _prepare(
      mechanism, clients, chunk_size, devices)
  clients_key = _on_mesh(clients_key, mesh, P())
  run_mech = _WithCounts(mechanism) if _validate.boolean("with_counts", with_counts) else mechanism
  stats = _checked(_run(clients_key, clients, jnp.uint32(n), run_mech, source_fn, sharded_rows, per_device,
                        chunk, mesh), n, mechanism)
  stats = jax.tree.map(np.asarray, jax.block_until_ready(stats))
  counts = None
  if with_counts:
    stats, dense = stats
    counts = dense.reshape(mechanism.shape.num_buckets, mechanism.shape.num_labels)
  est = mechanism.estimate(server_key, stats, n)
  return SimulationResult(np.asarray(est, np.float64), stats, n, time.perf_counter() - start,
                          mesh.size, chunk, counts)
