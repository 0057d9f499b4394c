"""The streaming runner: exact sums, chunk invariance, generator == arrays."""

import dataclasses
import math
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import accounting
from jaxdistill import mechanisms as M
from jaxdistill import simulation
from tests.simulation import _toy


def test_statistics_equal_a_plain_loop():
  w = M.synthetic_workload(jax.random.key(0), num_clients=37, num_buckets=5, num_labels=3, k=2)
  inp = w.materialize()
  mech = M.RandomizedResponse(w.shape, 1.0)
  key = jax.random.key(9)
  got = np.asarray(simulation.client_statistics(key, mech, inp, chunk_size=8))
  one = jax.jit(lambda k, b, lab: mech.analyze(mech.randomize(k, b, lab)))
  want = sum(np.asarray(one(jax.random.fold_in(key, i), inp.buckets[i], inp.labels[i])) for i in range(37))
  np.testing.assert_array_equal(got, want)


# (tests/simulation/test_sharding.py covers more chunk sizes and device counts.)
@pytest.mark.parametrize("chunk", [7, 1000])
def test_bitwise_identical_for_any_chunk_size(chunk):
  w = M.synthetic_workload(jax.random.key(0), num_clients=500, num_buckets=6, num_labels=3, k=1)
  mech = M.RandomizedResponse(w.shape, 0.7)
  ref = simulation.simulate(jax.random.key(4), mech, w.materialize(), chunk_size=500)
  got = simulation.simulate(jax.random.key(4), mech, w, chunk_size=chunk)
  np.testing.assert_array_equal(got.estimate, ref.estimate)
  assert got.estimate.dtype == np.float64


def test_x64_mode_draws_the_same_workload_and_releases():
  # The synthetic workload drew with JAX's default dtypes, 64-bit with x64 on: another workload for the same key
  # (rr's max error 307 became 245 on the simulate CLI's example). Every draw is 32-bit now, and the mechanisms
  # sample from uint32 words, so with x64 on or off one seed gives the same inputs and the same releases
  # (checked for a central, a bitwise local and a hashing local mechanism: each run compiles twice).
  shape = M.BsvsShape(num_buckets=6, num_labels=3, k=2, r=2)

  def run(name):
    w = M.synthetic_workload(jax.random.key(0), num_clients=300, num_buckets=6, num_labels=3, k=2, r=2)
    mech = simulation.build_mechanism(name, shape, epsilon=2.0, delta=1e-6, num_clients=300)
    out = simulation.simulate(jax.random.key(4), mech, w, chunk_size=128)
    inp = w.materialize()
    return [np.asarray(inp.buckets), np.asarray(inp.labels), np.asarray(out.estimate)]

  names = ("discrete-laplace", "rr", "collision")
  want = {name: run(name) for name in names}
  with jax.enable_x64(True):
    got = {name: run(name) for name in names}
  for name in names:
    for g, w in zip(got[name], want[name]):
      np.testing.assert_array_equal(g, w, err_msg=name)


def test_rejects_unknown_clients():
  mech = M.RandomizedResponse(M.BsvsShape(2, 2, 1), 1.0)
  with pytest.raises(ValueError, match="clients"):
    simulation.simulate(jax.random.key(0), mech, [1, 2, 3])


@pytest.mark.parametrize("name", ["gaussian", "", "RR", 3, None, ["rr"]])
def test_unknown_mechanism_name_is_named_with_the_known_names(name):
  # The error said "Expected mechanism ...", naming no parameter of mechanism_spec or build_mechanism.
  known = ", ".join(simulation.mechanism_names())
  want = rf"^Expected name \(a mechanism name\) to be one of {re.escape(known)}; got {re.escape(repr(name))}\.$"
  with pytest.raises(ValueError, match=want):
    simulation.mechanism_spec(name)
  with pytest.raises(ValueError, match=want):
    simulation.build_mechanism(name, M.BsvsShape(10, 5, 1), epsilon=1.0)


def test_bad_arguments_name_themselves():
  mech = M.RandomizedResponse(M.BsvsShape(2, 2, 1), 1.0)
  inp, _ = M.make_bsvs_input([[0], [1]], [[0], [1]], num_buckets=2, num_labels=2)
  for fn in (simulation.simulate, simulation.client_statistics):
    with pytest.raises(ValueError, match="mechanism"):
      fn(jax.random.key(0), "rr", inp)
    with pytest.raises(ValueError, match="chunk_size=0"):
      fn(jax.random.key(0), mech, inp, chunk_size=0)
  from jaxdistill import audit
  with pytest.raises(ValueError, match="mechanism"):
    audit.local_randomizer("rr")


MISFITS = [  # (mechanism shape, workload sizes, the error's text): each would drop votes or break the sensitivity
    (M.BsvsShape(2, 2, 1), dict(num_buckets=3, num_labels=2, k=1), "num_buckets <= the mechanism's num_buckets=2"),
    (M.BsvsShape(3, 2, 1), dict(num_buckets=3, num_labels=3, k=1), "num_labels <= the mechanism's num_labels=2"),
    (M.BsvsShape(3, 2, 1), dict(num_buckets=3, num_labels=2, k=2), "k <= the mechanism's k=1"),
    (M.BsvsShape(3, 3, 1), dict(num_buckets=3, num_labels=3, k=1, r=2), "r <= the mechanism's r=1"),
]


@pytest.mark.parametrize("shape, sizes, match", MISFITS)
@pytest.mark.parametrize("make", [M.CentralLaplace, M.RandomizedResponse, M.Collision])
def test_clients_must_fit_the_mechanism(make, shape, sizes, match):
  mech = make(shape, 1.0)
  w = M.synthetic_workload(jax.random.key(0), num_clients=20, **sizes)
  with pytest.raises(ValueError, match=match):
    simulation.simulate(jax.random.key(1), mech, w)
  # Materialised rows: a wider row than the bound (k, r) or an index outside the mechanism's range.
  inp = w.materialize()
  refused = r"Expected (at most [kr]=1 (buckets|labels) per client|clients\.(buckets|labels) in)"
  with pytest.raises(ValueError, match=refused):
    simulation.client_statistics(jax.random.key(1), mech, inp)


def test_clients_may_use_fewer_buckets_and_labels_than_the_mechanism():
  w = M.synthetic_workload(jax.random.key(0), num_clients=30, num_buckets=3, num_labels=2, k=1)
  mech = M.CentralLaplace(M.BsvsShape(5, 4, 2), 1.0)  # a superset domain and a looser bound: still correct
  res = simulation.simulate(jax.random.key(1), mech, w, with_counts=True)
  assert res.estimate.shape == (5, 4) and res.counts.sum() == 30 and res.counts[3:].sum() == 0


def test_out_of_range_rows_are_refused():
  mech = M.RandomizedResponse(M.BsvsShape(3, 2, 1), 1.0)
  for buckets, labels, match in (([[0], [3]], [[0], [1]], r"buckets in \[0, num_buckets=3\) .* \[0, 3\]"),
                                 ([[0], [1]], [[0], [2]], r"labels in \[0, num_labels=2\) .* \[0, 2\]"),
                                 ([[0], [-2]], [[0], [1]], r"buckets in .* \[-2, 0\]")):
    inp = M.BsvsInput(np.asarray(buckets, np.int32), np.asarray(labels, np.int32))
    with pytest.raises(ValueError, match=match):
      simulation.simulate(jax.random.key(0), mech, inp)
  # A float index was cast without a word: bucket 1.5 counted as bucket 2 (or 1).
  inp = M.BsvsInput(np.asarray([[0.0], [1.5]]), np.asarray([[0], [1]], np.int32))
  with pytest.raises(ValueError, match=r"integer clients\.buckets; got dtype float"):
    simulation.simulate(jax.random.key(0), mech, inp)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Generated:
  """Client i holds bucket i mod 4 and one fixed label (or label 0 and a repeated bucket)."""

  label: int = dataclasses.field(metadata=dict(static=True))
  repeat: bool = dataclasses.field(default=False, metadata=dict(static=True))
  num_clients: int = dataclasses.field(default=10, metadata=dict(static=True))

  def client(self, i):
    b = (i % 4).astype(np.int32)
    buckets = jax.numpy.stack([b, b]) if self.repeat else jax.numpy.stack([b, jax.numpy.int32(-1)])
    return buckets, jax.numpy.full((1,), self.label, np.int32)


@pytest.mark.parametrize("label,repeat,with_counts", [(3, False, False), (2, False, True), (-2, False, False),
                                                      (0, True, True)])
def test_generated_clients_outside_the_shape_are_refused(label, repeat, with_counts):
  # Only a generator's widths were checked: label 3 with |Y| = 2 went to entry t * 2 + 3, another
  # bucket's cell, and a repeated bucket counted twice, without a word.
  mech = M.RandomizedResponse(M.BsvsShape(4, 2, 2), 1.0)
  with pytest.raises(ValueError, match=r"labels in \[0, num_labels=2\), distinct .* gave 10 of 10 clients"):
    simulation.simulate(jax.random.key(0), mech, _Generated(label, repeat), with_counts=with_counts)
  with pytest.raises(ValueError, match="gave 10 of 10"):
    simulation.client_statistics(jax.random.key(0), mech, _Generated(label, repeat))
  good = simulation.simulate(jax.random.key(0), mech, _Generated(1), with_counts=True)
  np.testing.assert_array_equal(good.counts, [[0, 3], [0, 3], [0, 2], [0, 2]])


# The calibrated noise of ShuffleMultiMessage(BsvsShape(3, 2, 2, 2), 1, 1e-6, 3), given so that
# building it checks one PLD (0.5 s) instead of calibrating twice (~20-50 s on 2 cores).
_NOISE_K2_R2 = accounting.MultiMessageNoise(0.9394130628134758, 16.163283921183428, 0.7788007830714049)


@pytest.mark.parametrize("make", [M.CentralDiscreteLaplace, M.RandomizedResponse,
                                  lambda s, e: M.ShuffleMultiMessage(s, e, 1e-6, 3, noise=_NOISE_K2_R2)])
def test_repeated_buckets_or_labels_are_refused(make):
  # A client listing bucket 0 twice would move one vote entry by 2, and every unit-shift account
  # (central PLD, multi-message delta) assumes a record changes distinct entries by 1 each.
  mech = make(M.BsvsShape(3, 2, 2, 2), 1.0)
  ok = M.BsvsInput(np.asarray([[0, 1], [2, -1], [-1, -1]], np.int32), np.asarray([[0, 1], [1, -1], [0, -1]], np.int32))
  simulation.client_statistics(jax.random.key(0), mech, ok)  # padding may repeat
  for buckets, labels, name in (([[0, 1], [2, 2], [1, -1]], [[0, 1], [1, -1], [0, -1]], "buckets"),
                                ([[0, 1], [2, -1], [1, -1]], [[0, 1], [1, 1], [0, -1]], "labels")):
    inp = M.BsvsInput(np.asarray(buckets, np.int32), np.asarray(labels, np.int32))
    with pytest.raises(ValueError, match=rf"distinct clients\.{name} within a client .* client 1 has"):
      simulation.client_statistics(jax.random.key(0), mech, inp)


@pytest.mark.parametrize("make", [lambda s, n: M.ShuffleSingleMessage(s, 1.0, 1e-6, n),
                                  lambda s, n: M.ShuffleMultiMessage(s, 1.0, 1e-6, n)], ids=["single", "multi"])
def test_shuffle_mechanisms_need_their_own_number_of_clients(make):
  w = M.synthetic_workload(jax.random.key(0), num_clients=300, num_buckets=3, num_labels=2, k=1)
  simulation.simulate(jax.random.key(1), make(w.shape, 300), w)  # fits
  for n in (100, 1000):  # fewer clients: weaker amplification / less noise than claimed
    with pytest.raises(ValueError, match=f"Expected {n} clients, the num_clients"):
      simulation.simulate(jax.random.key(1), make(w.shape, n), w)
  with pytest.raises(ValueError, match="Expected 1000 clients"):
    M.shuffle_multi_message_protocol(jax.random.key(1), M.ShuffleMultiMessage(w.shape, 1.0, 1e-6, 1000),
                                     w.materialize())


def _temp_bytes(mech, clients, chunk):
  from jaxdistill.simulation import _runner
  n, fn, rows, src, ch, per_dev, mesh = _runner._prepare(mech, clients, chunk, None)
  low = _runner._run.lower(jax.random.key(0), src, np.uint32(n), mech, fn, rows, per_dev, ch, mesh)
  return low.compile().memory_analysis().temp_size_in_bytes


def test_working_memory_is_independent_of_n():
  # XLA's buffer assignment for a generator source: the temporaries depend on the
  # chunk size, not on n (2^10 vs 10^9 clients compile to the same working set).
  # Deterministic; it fails if the runner ever materialises per-client arrays.
  # Both n are multiples of the chunk 256, so the plan keeps chunks of exactly 256
  # (for 10^3 it would shrink them to 250 to avoid padding, a smaller working set).
  shape = M.BsvsShape(8, 4, 2)
  mech = M.RandomizedResponse(shape, 1.0)
  small = M.synthetic_workload(jax.random.key(0), num_clients=2**10, num_buckets=8, num_labels=4, k=2)
  huge = M.synthetic_workload(jax.random.key(0), num_clients=10**9, num_buckets=8, num_labels=4, k=2)
  t_small, t_huge = _temp_bytes(mech, small, 256), _temp_bytes(mech, huge, 256)
  assert t_small == t_huge
  assert t_huge < 256 * shape.d * 4 * 16  # a few [chunk, d] int32 buffers at most


def test_measure_subprocess_reads_the_childs_own_peak():
  big = simulation.measure_subprocess(
      [sys.executable, "-c", "import numpy as np; a = np.ones(40_000_000); print(a.sum())"])
  small = simulation.measure_subprocess([sys.executable, "-c", "print(1)"])
  assert big.returncode == 0 and big.stdout.strip() == "40000000.0"
  assert big.peak_rss_bytes > 320e6  # 40e6 float64 = 320 MB were touched
  assert small.peak_rss_bytes < 100e6
  assert small.wall_seconds > 0
  assert simulation.peak_rss_bytes() > 0
  failed = simulation.measure_subprocess([sys.executable, "-c", "import sys; sys.exit(3)"])
  assert failed.returncode == 3


def test_with_counts_matches_bsvs_counts_and_leaves_the_estimate_unchanged():
  # Same sizes as test_bitwise_identical_for_any_chunk_size[7], so the plain run reuses its compilation.
  w = M.synthetic_workload(jax.random.key(0), num_clients=500, num_buckets=6, num_labels=3, k=1)
  inp = w.materialize()
  mech = M.RandomizedResponse(w.shape, 0.7)
  plain = simulation.simulate(jax.random.key(3), mech, inp, chunk_size=7)
  both = simulation.simulate(jax.random.key(3), mech, inp, chunk_size=7, with_counts=True)
  np.testing.assert_array_equal(both.counts, np.asarray(M.bsvs_counts(inp, w.shape)))
  np.testing.assert_array_equal(both.estimate, plain.estimate)
  assert plain.counts is None


@pytest.mark.parametrize("devices,needle", [(0, "devices=0"), (2, "devices=2"), ([], "at least one"),
                                            ("cpu", "got 'cpu'"), (["x"], "sequence of jax devices")])
def test_rejects_bad_devices(devices, needle):
  mech = M.RandomizedResponse(M.BsvsShape(2, 2, 1), 1.0)
  w = M.synthetic_workload(jax.random.key(0), num_clients=10, num_buckets=2, num_labels=2, k=1)
  with pytest.raises(ValueError, match=needle):
    simulation.simulate(jax.random.key(0), mech, w, devices=devices)
  with pytest.raises(ValueError, match="with_counts"):  # a truthy 'no' computed the counts
    simulation.simulate(jax.random.key(0), mech, w, with_counts="no")


def test_rejects_bad_chunk_size_and_too_many_clients():
  mech = M.RandomizedResponse(M.BsvsShape(2, 2, 1), 1.0)
  w = M.synthetic_workload(jax.random.key(0), num_clients=10, num_buckets=2, num_labels=2, k=1)
  with pytest.raises(ValueError, match="chunk_size=0"):
    simulation.simulate(jax.random.key(0), mech, w, chunk_size=0)
  # More clients than int32 counts hold: refused when the workload is built (simulate refused it before).
  with pytest.raises(ValueError, match="num_clients=2147483648 <= 2147483647"):
    M.synthetic_workload(jax.random.key(0), num_clients=2**31, num_buckets=2, num_labels=2, k=1)
  # simulate checks any workload itself (a SyntheticWorkload built directly skips the factory's check).
  huge = M.SyntheticWorkload(jax.random.key(0), M.BsvsShape(2, 2, 1), 2**31, 0.8, 1.0)
  with pytest.raises(ValueError, match="num_clients"):
    simulation.simulate(jax.random.key(0), mech, huge)


# --- mechanisms: the chunk_statistics fast path and any chunking give the definition ------
# The families' representatives (laplace, collision, separation, shuffle-multi) run the
# same comparison across 1 and 8 devices in test_sharding.py; rr is the mechanism of the
# chunk-size tests above; the rest run here, on one device (cheaper: no subprocess).
IN_PROCESS = ("discrete-laplace", "concatenation", "shuffle-single")


def _case(name):
  spec = simulation.mechanism_spec(name)
  return {"n": 301, "s": 5, "y": 3, "k": 2, "epsilon": 1.0, "seed": 7, "mechanism": name,
          "delta": 1e-6 if spec.needs_delta else None}


@pytest.fixture(scope="module")
def shared_clients():
  # One workload for every mechanism below (same sizes: materialised once).
  _, work = _toy.build(_case("rr"))
  return work.materialize()


def test_every_registered_mechanism_is_covered():
  from tests.simulation.test_sharding import REPRESENTATIVES
  covered = set(IN_PROCESS) | set(REPRESENTATIVES) | {"rr", "concatenation-literal"}
  assert covered == set(simulation.mechanism_names())
  # concatenation-literal differs from concatenation only in the host-side estimate.
  for method in ("randomize", "analyze", "chunk_statistics"):
    assert getattr(M.ConcatenationLiteral, method) is getattr(M.Concatenation, method)


@pytest.mark.parametrize("name", IN_PROCESS)
def test_fast_path_and_any_chunking_give_the_definition_bitwise(name, shared_clients):
  # A: the mechanism's own chunk_statistics (a scatter-add fast path where it overrides the
  # hook), all 301 clients in one chunk. B: the contract's default, vmap of
  # analyze(randomize(fold_in(key, i), x_i)) summed, in chunks of 13 (the last one padded).
  # Same integers, so the same estimate, bit for bit.
  mech, _ = _toy.build(_case(name))
  key = jax.random.key(11)
  fast = simulation.simulate(key, mech, shared_clients, chunk_size=4096, with_counts=True)
  slow = simulation.simulate(key, _toy.DefaultPath(mech), shared_clients, chunk_size=13,
                             with_counts=True)
  assert fast.chunk_size == 301 and slow.chunk_size == 13
  leaves_fast, leaves_slow = jax.tree.leaves(fast.stats), jax.tree.leaves(slow.stats)
  assert len(leaves_fast) == len(leaves_slow) >= 1
  for a, b in zip(leaves_fast, leaves_slow):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(fast.estimate, slow.estimate)
  np.testing.assert_array_equal(fast.counts, slow.counts)
  assert np.abs(np.asarray(leaves_fast[0])).sum() > 0  # not vacuous


def test_shuffle_fast_path_with_many_event_rounds(monkeypatch, shared_clients):
  # The multi-message fast path evaluates a chunk's noise events B at a time in a
  # while_loop; with B = 16 (instead of ~mean + 6 sd) a chunk of 301 clients (~450
  # events at n = 301) takes ~30 rounds. Same integers as the default path.
  from jaxdistill.mechanisms import _shuffle_multi
  from jaxdistill.mechanisms._base import BsvsMechanism
  monkeypatch.setattr(_shuffle_multi, "_event_buffer", lambda chunk, rate: 16)
  mech, _ = _toy.build(_case("shuffle-multi"))
  n = shared_clients.num_clients
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(2), np.arange(n, dtype=np.uint32))
  valid = np.arange(n) < n - 5
  fast = jax.jit(mech.chunk_statistics)(keys, shared_clients.buckets, shared_clients.labels, valid)
  slow = jax.jit(lambda *a: BsvsMechanism.chunk_statistics(mech, *a))(
      keys, shared_clients.buckets, shared_clients.labels, valid)
  np.testing.assert_array_equal(np.asarray(fast), np.asarray(slow))
  from jaxdistill.mechanisms._nb_sampler import compound_poisson_event_counts
  events = np.asarray(compound_poisson_event_counts(keys, mech.tables()))[valid].sum()
  assert events > 16 * 10  # more than 10 rounds were needed


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_non_threefry_keys_are_refused(impl):
  # rbg's vmapped draws differ from its unbatched ones, so "same key -> same numbers whatever
  # the chunk size or device count" failed silently for such keys.
  w = M.synthetic_workload(jax.random.key(0), num_clients=20, num_buckets=4, num_labels=2, k=1)
  mech = M.RandomizedResponse(w.shape, 1.0)
  key = jax.random.key(5, impl=impl)
  for run in (simulation.simulate, simulation.client_statistics):
    with pytest.raises(ValueError, match=f"threefry2x32 key.*got a {impl} key"):
      run(key, mech, w)
  simulation.simulate(jax.random.key(5, impl="threefry2x32"), mech, w)  # the default impl passes


def test_secret_key_and_cli_keys_are_threefry_under_an_rbg_default(capsys):
  # JAX_DEFAULT_PRNG_IMPL=rbg made the CLI's numbers change with --chunk-size; it now makes
  # threefry keys explicitly, as secret_key does.
  from tests.test_cli import run_json
  argv = ["simulate", "--mechanism", "rr", "--clients", "60", "--buckets", "6", "--labels", "3", "--k", "2",
          "--epsilon", "1", "--json", "--chunk-size"]
  old = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", "rbg")
  try:
    assert jax.random.key_impl(simulation.secret_key(3)) == jax.random.key_impl(jax.random.key(0, impl="threefry2x32"))
    errors = [run_json(capsys, [*argv, cs])["error"] for cs in ("7", "60")]
  finally:
    jax.config.update("jax_default_prng_impl", old)
  assert errors[0] == errors[1]


@pytest.mark.parametrize("count", [2.5, True, "7", float("nan"), float("inf")])
def test_generator_num_clients_is_validated_not_cast(count):
  # int() made 2.5 -> 2, True -> 1 and '7' -> 7 silently, and NaN/inf failed deep inside.
  class Clients:
    num_clients = count

    def client(self, index):
      return jnp.array([index % 4], jnp.int32), jnp.array([index % 2], jnp.int32)

  mech = M.RandomizedResponse(M.BsvsShape(4, 2, 1), 1.0)
  with pytest.raises(ValueError, match="Expected num_clients to be an integer"):
    simulation.simulate(jax.random.key(0), mech, Clients())


@pytest.mark.parametrize("argv", ["echo hi", b"ls"])
def test_measure_subprocess_refuses_a_command_string(argv):
  # A string was split into characters: "echo hi" ran the program "e".
  with pytest.raises(ValueError, match="Expected argv to be a list of arguments"):
    simulation.measure_subprocess(argv)


@pytest.mark.parametrize("argv, needle", [
    (5, r"^Expected a non-empty argv: .*got int 5\.$"),  # a TypeError
    (None, r"^Expected a non-empty argv: .*got NoneType None\.$"),
    ([], r"^Expected a non-empty argv: .*got list \[\]\.$"),
    (iter(["true"]), r"^Expected a non-empty argv: .*got list_iterator"),
    ({"true": 1}, r"^Expected a non-empty argv: .*got dict"),  # ran its keys
    ([5], r"^Expected argv\[0\] to be a str without NUL characters; got int 5\.$"),  # a TypeError in Popen
    (["true", None], r"^Expected argv\[1\] to be a str .*got NoneType None\.$"),
    (["true", b"x"], r"^Expected argv\[1\] to be a str .*got bytes b'x'\.$"),
    (["tr\0ue"], r"^Expected argv\[0\] to be a str without NUL characters"),  # "embedded null byte"
    ([""], r"^Expected argv\[0\] to name a program; got the empty string ''\.$"),  # a child's traceback
    (["", "-c", "1"], r"^Expected argv\[0\] to name a program"),
])
def test_measure_subprocess_names_an_argv_that_is_not_a_sequence_of_str(argv, needle):
  with pytest.raises(ValueError, match=needle):
    simulation.measure_subprocess(argv)


@pytest.mark.parametrize("timeout, needle", [
    (0, r"timeout=0\.0 > 0"), (-1, r"timeout=-1\.0 > 0"),  # the child was killed at once: a TimeoutExpired
    (math.nan, r"timeout to be finite, got nan"), (math.inf, r"timeout to be finite, got inf"),  # no limit
    (True, r"timeout to be a real number, got True"),  # one second
    ("5", r"timeout to be a real number, got '5'"),  # a TypeError
    (10**400, r"timeout to be a real number within float64's range"),  # an OverflowError
])
def test_measure_subprocess_names_a_timeout_that_is_not_a_positive_finite_number(timeout, needle):
  with pytest.raises(ValueError, match=rf"^Expected {needle}"):
    simulation.measure_subprocess([sys.executable, "-c", "pass"], timeout=timeout)


@pytest.mark.parametrize("env", [{"A": 5}, 5, "A=b", [("A", "b")]])
def test_measure_subprocess_names_an_env_that_is_not_a_mapping_of_str(env):
  # {"A": 5} and 5 were TypeErrors, "A=b" dict()'s "dictionary update sequence element" error.
  with pytest.raises(ValueError, match=r"^Expected env to be a mapping of str to str \(or None\)"):
    simulation.measure_subprocess([sys.executable, "-c", "pass"], env=env)


def test_measure_subprocess_takes_paths_and_a_finite_timeout(tmp_path):
  script = tmp_path / "hello.py"
  script.write_text("print('hi')")
  run = simulation.measure_subprocess([sys.executable, script], env={"PATH": "/usr/bin:/bin"}, timeout=60)
  assert run.returncode == 0 and run.stdout == "hi\n"


def test_client_mesh_refuses_duplicate_devices():
  # A repeated device used to pass here and fail later inside JAX.
  dev = jax.devices()[0]
  with pytest.raises(ValueError, match="Expected devices to be distinct"):
    simulation.client_mesh([dev, dev])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Rows:
  """Client i's rows as ``kind`` says; ``shape`` is what the generator declares (None: nothing)."""

  kind: str = dataclasses.field(metadata=dict(static=True))
  shape: object = dataclasses.field(default=None, metadata=dict(static=True))
  num_clients: int = dataclasses.field(default=10, metadata=dict(static=True))

  def client(self, i):
    label = (i % 2).astype(jnp.int32)[None]
    if self.kind == "two_buckets":
      return jnp.stack([i % 4, (i + 1) % 4]).astype(jnp.int32), label
    if self.kind == "float_bucket":
      return jnp.full((1,), 1.7, jnp.float32), label
    if self.kind == "scalars":
      return (i % 4).astype(jnp.int32), (i % 2).astype(jnp.int32)
    if self.kind == "no_buckets":
      return jnp.zeros((0,), jnp.int32), label
    if self.kind == "triple":
      return (i % 4)[None], label, label
    dtype = jnp.dtype(self.kind)  # i is uint32: i % 4 stays uint32 unless cast
    return (i % 4).astype(dtype)[None], (i % 2).astype(dtype)[None]


@pytest.mark.parametrize("make", [M.CentralDiscreteLaplace, M.RandomizedResponse])
def test_generator_rows_are_measured_whatever_shape_declares(make):
  # A generator declaring BsvsShape(4, 2, k=1) but returning 2 buckets per client was accepted: its
  # declared shape was trusted, so each client added 2 entries under noise calibrated to k = 1.
  mech = make(M.BsvsShape(4, 2, 1), 1.0)
  for declared in (M.BsvsShape(4, 2, 1), None):
    with pytest.raises(ValueError, match=r"Expected the workload's k <= the mechanism's k=1; got 2\."):
      simulation.simulate(jax.random.key(0), mech, _Rows("two_buckets", declared), with_counts=True)


@pytest.mark.parametrize("kind, match", [
    ("float_bucket", r"return integer buckets; got dtype float32"),
    ("scalars", r"return buckets of shape \[k\] with k >= 1 \(-1 pads\); got shape \(\)"),
    ("no_buckets", r"return buckets of shape \[k\] with k >= 1 \(-1 pads\); got shape \(0,\)"),
    ("triple", r"return a pair \(buckets \[k\], labels \[r\]\)"),
])
def test_generator_rows_must_be_one_dimensional_integers(kind, match):
  # A float bucket 1.7 was truncated to bucket 1 and counted; scalar rows raised an IndexError from the
  # width check.
  mech = M.RandomizedResponse(M.BsvsShape(4, 2, 1), 1.0)
  with pytest.raises(ValueError, match=match):
    simulation.simulate(jax.random.key(0), mech, _Rows(kind), with_counts=True)


@pytest.mark.parametrize("dtype", ["uint32", "uint8", "int8"])
def test_unsigned_and_narrow_generator_rows_count_like_int32(dtype):
  # uint32 rows (i % 4 on the uint32 index) were all refused as "outside" the shape: the padding test
  # a < -1 wrapped -1 to 2^32 - 1 in uint32, so every value was below it.
  mech = M.RandomizedResponse(M.BsvsShape(4, 2, 1), 1.0)
  want = simulation.simulate(jax.random.key(0), mech, _Rows("int32"), with_counts=True)
  got = simulation.simulate(jax.random.key(0), mech, _Rows(dtype), with_counts=True)
  np.testing.assert_array_equal(got.counts, [[3, 0], [0, 3], [2, 0], [0, 2]])
  np.testing.assert_array_equal(got.counts, want.counts)
  np.testing.assert_array_equal(got.estimate, want.estimate)
  # Out of range in an unsigned dtype is still refused (bucket 3 >= s = 3).
  with pytest.raises(ValueError, match="gave 2 of 10 clients"):
    simulation.simulate(jax.random.key(0), M.RandomizedResponse(M.BsvsShape(3, 2, 1), 1.0), _Rows(dtype))


def test_a_plain_class_generator_is_refused_up_front():
  # Generators travel into the jitted run as pytree arguments; a plain class raised JAX's "Error
  # interpreting argument ... as an abstract array" TypeError from inside simulate.
  class Plain:
    num_clients = 4

    def client(self, i):
      return (i % 4).astype(jnp.int32)[None], jnp.zeros((1,), jnp.int32)

  mech = M.RandomizedResponse(M.BsvsShape(4, 2, 1), 1.0)
  for run in (simulation.simulate, simulation.client_statistics):
    with pytest.raises(ValueError, match="registered as a JAX pytree .* got Plain, a class"):
      run(jax.random.key(0), mech, Plain())


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_a_generator_holding_a_non_threefry_key_is_refused(impl):
  # A SyntheticWorkload built around an rbg key drew other clients for each chunk size: simulate's
  # counts and estimate changed with chunk_size (500, 64 and 7 gave three different results).
  w = M.SyntheticWorkload(jax.random.key(0, impl=impl), M.BsvsShape(6, 3, 1), 50)
  mech = M.CentralDiscreteLaplace(w.shape, 1.0)
  with pytest.raises(ValueError, match=f"Expected clients.key to be a threefry2x32 key.*got a {impl} key"):
    simulation.simulate(jax.random.key(4), mech, w)


@pytest.mark.parametrize("buckets, match", [
    ([[0], [1]], r"Expected clients\.buckets to be a NumPy or JAX array; got list\."),
    (np.zeros((2, 0), np.int32), r"clients\.buckets with at least one column \(k >= 1, -1 pads\); got shape \(2, 0\)"),
    (np.array(1, np.int32), r"clients\.buckets of shape \[n, \.\.\.\]; got a 0-d array"),
])
def test_malformed_bsvs_inputs_name_the_field(buckets, match):
  # Nested lists raised AttributeError ('list' object has no attribute 'shape'), zero columns NumPy's
  # "zero-size array to reduction operation min", a 0-d array an IndexError.
  mech = M.RandomizedResponse(M.BsvsShape(4, 2, 1), 1.0)
  inp = M.BsvsInput(buckets, np.zeros((2, 1), np.int32))
  for run in (simulation.simulate, simulation.client_statistics):
    with pytest.raises(ValueError, match=match):
      run(jax.random.key(0), mech, inp)
  with pytest.raises(ValueError, match=match):
    M.bsvs_counts(inp, mech.shape)


def test_the_shuffle_protocol_names_a_list_input():
  # shuffle_multi_message_protocol read inputs.num_clients first: nested lists gave an AttributeError.
  mech = M.ShuffleMultiMessage(M.BsvsShape(3, 2, 2, 2), 1.0, 1e-6, 3, noise=_NOISE_K2_R2)
  inp = M.BsvsInput([[0, 1], [1, 2], [0, -1]], np.zeros((3, 2), np.int32))
  with pytest.raises(ValueError, match=r"Expected clients\.buckets to be a NumPy or JAX array; got list\."):
    M.shuffle_multi_message_protocol(jax.random.key(0), mech, inp)


@pytest.mark.parametrize("n, chunk_size, devices", [(16389, 4096, 4), (9, 2, 4), (81, 10, 8), (301, 13, 1),
                                                    (10**9, 256, 1), (7, 4096, 8), (2**31 - 1, 4096, 3)])
def test_plan_pads_less_than_one_row_per_chunk(n, chunk_size, devices):
  # n = 4 * 4096 + 5 on 4 devices ran 8 chunks of 4096, 3 of them all padding (2 on one device),
  # about twice the needed work, though the docstring promised at most one padded chunk per device.
  from jaxdistill.simulation import _runner
  chunk, per_device = _runner._plan(n, chunk_size, devices)
  slots = devices * per_device
  assert 1 <= chunk <= chunk_size and slots * chunk >= n
  assert slots * chunk - n < slots  # padding: fewer rows than chunks
  c0 = min(chunk_size, -(-n // devices))
  assert per_device == -(-(-(-n // c0)) // devices)  # the scan length chunk_size asks for, unchanged
  if n % (devices * chunk_size) == 0:
    assert chunk == chunk_size
