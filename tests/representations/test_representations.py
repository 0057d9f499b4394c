"""Representations: definitions against independent references, public-only fitting, errors."""

import dataclasses
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdistill import data, representations as R
from jaxdistill.representations import _classic, _scan
from jaxdistill.representations._base import unit_rows
from jaxdistill.representations._contrastive import _neighbours


@pytest.fixture(scope="module")
def mnist():
  d = data.load_embedded_mnist()  # sorted by class: take a fixed random 600 (all ten classes)
  return d.take(np.sort(np.random.default_rng(0).permutation(len(d))[:600]))


def reference_hog(img, cell=4, block=2, bins=9):
  """Plain-Python HOG of one grey image [H, W] (loops; independent of the JAX version)."""
  img = np.asarray(img, np.float64)
  h, w = img.shape
  p = np.pad(img, 1, mode="edge")
  hist = np.zeros((h // cell, w // cell, bins))
  for i in range(h // cell * cell):
    for j in range(w // cell * cell):
      gx = p[i + 1, j + 2] - p[i + 1, j]
      gy = p[i + 2, j + 1] - p[i, j + 1]
      mag = np.hypot(gx, gy)
      ang = np.arctan2(gy, gx) % np.pi
      pos = ang / (np.pi / bins) - 0.5
      lo = int(np.floor(pos))
      frac = pos - lo
      hist[i // cell, j // cell, lo % bins] += mag * (1 - frac)
      hist[i // cell, j // cell, (lo + 1) % bins] += mag * frac
  out = []
  for bi in range(h // cell - block + 1):
    for bj in range(w // cell - block + 1):
      v = np.concatenate([hist[bi + a, bj + b] for a in range(block) for b in range(block)])
      v = v / np.sqrt(np.sum(v * v) + 1e-6)
      v = np.minimum(v, 0.2)
      out.append(v / np.sqrt(np.sum(v * v) + 1e-6))
  return np.concatenate(out)


def test_raw_pixels_is_the_flattened_image(mnist):
  f = R.raw_pixels(mnist.images[:5])
  assert f.dtype == np.float32 and f.shape == (5, 784)
  np.testing.assert_array_equal(f, mnist.images[:5].reshape(5, -1))


@pytest.mark.parametrize("cell, block, bins", [(4, 2, 9), (7, 2, 6)])
def test_hog_matches_loop_reference(mnist, cell, block, bins):
  x = mnist.images[:4]
  f = R.hog(x, cell_size=cell, block_size=block, num_bins=bins)
  nb = 28 // cell - block + 1
  assert f.shape == (4, nb * nb * block * block * bins)
  ref = np.stack([reference_hog(x[i, ..., 0], cell, block, bins) for i in range(4)])
  # The public float32 path: rounding after two normalisations of near-empty blocks (measured: at most 4.5e-6
  # over the first 100 embedded digits at (4, 2, 9), 3.8e-7 at (7, 2, 9)).
  np.testing.assert_allclose(f, ref, atol=1e-5)
  # The same kernel in float64 is the reference to rounding (measured 6.5e-15): every difference above is
  # float32's, none the algorithm's.
  with jax.enable_x64(True):
    f64 = np.asarray(_classic._hog(jnp.asarray(x, jnp.float64), cell, block, bins))
  assert f64.dtype == np.float64
  np.testing.assert_allclose(f64, ref, rtol=0, atol=1e-10)


def test_hog_keeps_whole_float_sizes_as_ints(mnist):
  # Whole floats passed validation but were stored as floats and reached reshape (a JAX TypeError), unless
  # the int settings had compiled first and the float call hit their jit cache. Sizes no other test uses,
  # floats first, so the float call is the first compile.
  x = mnist.images[:3]
  floats = R.Hog(cell_size=5.0, block_size=3.0, num_bins=7.0)
  assert all(type(getattr(floats, f)) is int for f in ("cell_size", "block_size", "num_bins"))
  f = floats(x)
  np.testing.assert_array_equal(f, R.Hog(cell_size=5, block_size=3, num_bins=7)(x))
  np.testing.assert_array_equal(R.hog(x, cell_size=5.0, block_size=3.0, num_bins=7.0), f)
  for i in range(3):
    np.testing.assert_allclose(f[i], reference_hog(x[i, ..., 0], 5, 3, 7), atol=1e-4)


def test_hog_is_invariant_to_brightness_offset(mnist):
  x = mnist.images[:4] * 0.8
  np.testing.assert_allclose(R.hog(x + 0.1), R.hog(x), atol=1e-5)


def test_hog_colour_uses_strongest_channel(mnist):
  grey = mnist.images[:4]
  colour = np.concatenate([grey, 0.5 * grey, np.zeros_like(grey)], axis=-1)
  np.testing.assert_allclose(R.hog(colour), R.hog(grey), atol=1e-5)


def test_pca_matches_numpy_svd_and_whitens_public_data(mnist):
  # Each column equals the float64 eigenvector of D_pub's covariance (descending eigenvalues), its sign chosen so
  # that its largest-magnitude entry is positive; the mean is D_pub's. (Measured: agreement to 2e-6.)
  x = mnist.images[:200]
  pca = R.fit_pca(x, 10)
  f = pca(x).astype(np.float64)
  flat = x.reshape(200, -1).astype(np.float64)
  centred = flat - flat.mean(0)
  sv = np.linalg.svd(centred, compute_uv=False)
  np.testing.assert_allclose(pca.explained_variance, sv[:10] ** 2 / 199, rtol=2e-3)
  comps = np.asarray(pca.components, np.float64)
  np.testing.assert_allclose(comps.T @ comps, np.eye(10), atol=1e-4)
  np.testing.assert_allclose(f.mean(0), 0.0, atol=1e-4)
  np.testing.assert_allclose(np.cov(f.T), np.diag(pca.explained_variance), atol=2e-3 * sv[0] ** 2 / 199)
  evals, evecs = np.linalg.eigh(centred.T @ centred / 199)
  evals, evecs = evals[::-1][:10], evecs[:, ::-1][:, :10]
  evecs = evecs * np.sign(evecs[np.abs(evecs).argmax(0), np.arange(10)])
  assert np.all(comps[np.abs(comps).argmax(0), np.arange(10)] > 0)
  np.testing.assert_allclose(comps, evecs, atol=1e-4)
  np.testing.assert_allclose(pca.explained_variance, evals, rtol=1e-4)
  np.testing.assert_allclose(pca.mean, flat.mean(0), atol=1e-6)


def test_fit_functions_read_only_the_public_split(mnist):
  """A LabelingSplits whose private part is poisoned (NaN) fits exactly as its public part does."""
  public = mnist.take(np.arange(200))
  poisoned = data.ImageData(np.zeros((50, 28, 28, 1), np.float32), np.zeros(50, np.int32), 10)
  poisoned.images[...] = np.nan  # after construction, which refuses NaN pixels
  splits = data.LabelingSplits(private=poisoned, public=public, evaluation=public)
  a = R.fit_pca(splits, 5)
  b = R.fit_pca(public.images, 5)
  np.testing.assert_array_equal(np.asarray(a.components), np.asarray(b.components))
  cfg = R.ContrastiveConfig(width=8, feature_dim=64, projection_dim=32, steps=3, batch_size=64)
  e1 = R.fit_contrastive(jax.random.key(0), splits, cfg)
  e2 = R.fit_contrastive(jax.random.key(0), public.images, cfg)
  for u, v in zip(jax.tree.leaves(e1.params), jax.tree.leaves(e2.params)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  scan_cfg = R.ScanConfig(num_clusters=4, steps=3, batch_size=64, num_neighbours=5, contrastive=cfg)
  s1 = R.fit_scan(jax.random.key(0), splits, scan_cfg)
  s2 = R.fit_scan(jax.random.key(0), public.images, scan_cfg)
  for u, v in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  # No fit function offers a parameter for private data or labels.
  for fn in (R.fit_pca, R.fit_contrastive, R.fit_scan, R.fit_representation):
    names = set(inspect.signature(fn).parameters)
    assert not {n for n in names if "private" in n or "label" in n}, (fn.__name__, names)


def test_contrastive_encoder_learns_and_is_reproducible(mnist):
  cfg = R.ContrastiveConfig(width=8, feature_dim=64, projection_dim=32, steps=120, batch_size=64)
  x = mnist.images
  enc = R.fit_contrastive(jax.random.key(1), x, cfg, log_every=20)
  again = R.fit_contrastive(jax.random.key(1), x, cfg, log_every=20)
  assert enc.loss_history == again.loss_history
  other = R.fit_contrastive(jax.random.key(2), x, dataclasses.replace(cfg, steps=1))
  f = enc(x)
  assert f.shape == (600, 32) and f.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(f, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(f, again(x))
  # Training lowers the NT-Xent loss well below its starting value ~ln(2B - 1) = 4.85.
  assert enc.loss_history[-1] < 0.8 * enc.loss_history[0]

  def loo_1nn_accuracy(feats):  # leave-one-out 1-NN label agreement (labels: evaluation only)
    d = ((feats[:, None] - feats[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    return np.mean(mnist.labels[np.argmin(d, 1)] == mnist.labels)

  # The trained encoder's neighbourhoods are more label-consistent than an
  # (almost) untrained network's. Fixed seeds: deterministic.
  assert loo_1nn_accuracy(f) > loo_1nn_accuracy(other(x)) + 0.05


def test_nt_xent_matches_its_formula():
  # L = -1/(2B) sum_i log(exp(z_i.z_i+ / tau) / sum_{j != i} exp(z_i.z_j / tau)), z unit rows, i+ = i +- B.
  from jaxdistill.representations._contrastive import _nt_xent  # pylint: disable=import-outside-toplevel
  z = np.random.default_rng(0).normal(size=(8, 5))
  u = z / np.linalg.norm(z, axis=1, keepdims=True)
  for tau in (0.1, 0.5):
    s = u @ u.T / tau
    want = 0.0
    for i in range(8):
      others = np.exp(np.delete(s[i], i)).sum()
      want -= (s[i, (i + 4) % 8] - np.log(others)) / 8
    np.testing.assert_allclose(float(_nt_xent(jnp.asarray(z, jnp.float32), tau)), want, rtol=1e-5)


def test_contrastive_training_survives_a_blank_image(mnist):
  # A blank image with zero biases embeds to an exact zero row. The norm's gradient at 0 is 0 * inf:
  # before unit_rows guarded it, every parameter became NaN after the first step, silently.
  x = mnist.images[:64].copy()
  x[5] = 0.0
  cfg = R.ContrastiveConfig(width=4, feature_dim=16, projection_dim=8, steps=3, batch_size=64, noise=0.0)
  enc = R.fit_contrastive(jax.random.key(0), x, cfg, log_every=1)
  assert np.isfinite(enc.loss_history).all() and len(enc.loss_history) == 3
  assert np.isfinite(enc(x)).all()
  z = jnp.asarray(np.random.default_rng(1).normal(size=(6, 5)), jnp.float32).at[2].set(0.0)
  grad = jax.grad(lambda v: jnp.sum(jnp.sin(unit_rows(v))))(z)
  assert np.isfinite(grad).all() and not np.asarray(grad[2]).any()
  # Other rows: the same values and gradients as z / ||z||.
  ref = jax.grad(lambda v: jnp.sum(jnp.sin(v / jnp.linalg.norm(v, axis=1, keepdims=True))))(z[jnp.array([0, 1, 3])])
  np.testing.assert_allclose(grad[jnp.array([0, 1, 3])], ref, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(unit_rows(z)[2], 0.0)


def test_configs_keep_whole_float_sizes_as_ints(mnist):
  # Whole floats pass validation; they used to be kept as floats and reached layer and array shapes
  # (a JAX TypeError inside fit_contrastive). Now they are stored as ints: the same fit as with ints.
  x = mnist.images[:32]
  ints = dict(width=4, feature_dim=16, projection_dim=8, steps=2, batch_size=16, num_neighbours=1, max_shift=1)
  floats = {name: float(v) for name, v in ints.items()}
  cfg_f = R.ContrastiveConfig(**floats)
  cfg_i = R.ContrastiveConfig(**ints)
  assert cfg_f == cfg_i and hash(cfg_f) == hash(cfg_i)
  assert all(type(getattr(cfg_f, name)) is int for name in ints)
  a = R.fit_contrastive(jax.random.key(0), x, cfg_f)
  b = R.fit_contrastive(jax.random.key(0), x, cfg_i)
  for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  scan_ints = dict(num_clusters=3, steps=2, batch_size=16, num_neighbours=2, num_heads=2)
  scan_f = R.ScanConfig(**{name: float(v) for name, v in scan_ints.items()}, contrastive=cfg_f)
  scan_i = R.ScanConfig(**scan_ints, contrastive=cfg_i)
  assert scan_f == scan_i and all(type(getattr(scan_f, name)) is int for name in scan_ints)
  s1 = R.fit_scan(jax.random.key(0), x, scan_f)
  s2 = R.fit_scan(jax.random.key(0), x, scan_i)
  for u, v in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.filterwarnings("ignore:query_features sit far")  # a one-step encoder's features: not the point here
def test_configs_keep_validated_floats(mnist):
  # Float fields were checked but the caller's objects kept: a jnp.float32 temperature or learning rate made the
  # config unhashable, a static jit argument, and fit_scan failed with JAX's multi-line message only after its
  # whole contrastive stage.
  x = mnist.images[:16]
  floats = dict(learning_rate=jnp.float32(0.5), weight_decay=np.float32(1e-4), temperature=jnp.array(0.25),
                neighbour_fraction=np.float64(0.5), noise=jnp.float32(0.03))
  con = R.ContrastiveConfig(width=2, feature_dim=4, projection_dim=2, steps=1, batch_size=4, flip=np.bool_(True),
                            **floats)
  assert all(type(getattr(con, name)) is float for name in floats) and type(con.flip) is bool
  assert con == R.ContrastiveConfig(width=2, feature_dim=4, projection_dim=2, steps=1, batch_size=4,
                                    **{name: float(v) for name, v in floats.items()})
  scan_floats = dict(learning_rate=jnp.float32(1e-3), weight_decay=jnp.float32(0.0), entropy_weight=np.float32(5))
  sc = R.ScanConfig(num_clusters=2, steps=1, batch_size=4, num_neighbours=2, num_heads=1, contrastive=con,
                    **scan_floats)
  assert all(type(getattr(sc, name)) is float for name in scan_floats)
  hash(sc)  # a static jit argument
  assert R.fit_scan(jax.random.key(0), x, sc)(x).shape == (16, 2)


SMALL_CONTRASTIVE = R.ContrastiveConfig(width=8, feature_dim=64, projection_dim=32, steps=120, batch_size=64)


def test_scan_clusterer_outputs_probabilities_and_is_reproducible(mnist):
  cfg = R.ScanConfig(num_clusters=10, steps=150, batch_size=128, num_neighbours=10, contrastive=SMALL_CONTRASTIVE)
  x = mnist.images
  calls = []
  sc = R.fit_scan(jax.random.key(0), x, cfg, progress=lambda i, loss: calls.append(i), log_every=50)
  again = R.fit_scan(jax.random.key(0), x, cfg, log_every=50)
  p = sc(x)
  assert p.shape == (600, 10) and p.dtype == np.float32 and sc.name == "scan"
  assert np.all(p >= 0)
  np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-5)
  np.testing.assert_array_equal(p, again(x))
  assert sc.loss_history == again.loss_history
  np.testing.assert_array_equal(sc.clusters(x), np.argmax(p, axis=1))
  # Progress counts the backbone's contrastive steps, then the clustering steps.
  assert calls[0] == 1 and calls[-1] == SMALL_CONTRASTIVE.steps + cfg.steps
  assert SMALL_CONTRASTIVE.steps + 1 in calls
  # The entropy term (weight 5) keeps every cluster in use: deterministic at these seeds.
  assert len(np.unique(sc.clusters(x))) == 10


def test_scan_training_makes_neighbours_share_a_cluster(mnist):
  """SCAN's objective, measured: an image and its mined neighbours land in the same cluster."""
  x = mnist.images
  # One head, so the comparison measures training, not the choice among heads.
  base = R.ScanConfig(num_clusters=10, steps=150, batch_size=128, num_neighbours=10, num_heads=1,
                      contrastive=SMALL_CONTRASTIVE)
  trained = R.fit_scan(jax.random.key(3), x, base)
  untrained = R.fit_scan(jax.random.key(3), x, dataclasses.replace(base, steps=1))
  encoder = R.fit_contrastive(jax.random.split(jax.random.key(3), 3)[0], x, SMALL_CONTRASTIVE)
  nbrs = _neighbours(encoder(x), 10)
  # The mined neighbours are the 10 most similar other images (checked against a dense argsort).
  f = encoder(x)
  sims = f @ f.T
  np.fill_diagonal(sims, -np.inf)
  np.testing.assert_array_equal(np.sort(nbrs, 1), np.sort(np.argsort(-sims, 1, kind="stable")[:, :10], 1))

  def agreement(clusterer):
    """(share of image-neighbour pairs in one cluster, the share expected by chance from the cluster sizes)."""
    c = clusterer.clusters(x)
    sizes = np.bincount(c, minlength=10) / len(c)
    return np.mean(c[nbrs] == c[:, None]), float(np.sum(sizes ** 2))

  (agree, chance), (agree0, chance0) = agreement(trained), agreement(untrained)
  kappa, kappa0 = (agree - chance) / (1 - chance), (agree0 - chance0) / (1 - chance0)
  # Measured at these seeds (deterministic): trained agreement 0.707 with chance 0.115 (kappa 0.669);
  # after one step 0.663 with chance 0.328 (kappa 0.499: a few large clusters). The entropy term
  # balances the clusters (10 even clusters: chance 0.1) and the consistency term raises kappa.
  assert chance <= 0.2 and chance0 >= 0.25
  assert kappa >= 0.6 and kappa >= kappa0 + 0.1
  assert trained.loss_history[-1] < trained.loss_history[0]


def test_scan_dataset_loss_matches_a_pairwise_loop():
  rng = np.random.default_rng(0)
  probs = rng.dirichlet(np.ones(4), size=9)
  nbrs = np.stack([rng.choice(np.delete(np.arange(9), i), 3, replace=False) for i in range(9)])
  pairs = [np.log(probs[i] @ probs[j] + 1e-8) for i in range(9) for j in nbrs[i]]
  mean = probs.mean(axis=0)
  expected = -sum(pairs) / len(pairs) - 2.5 * -sum(m * np.log(m + 1e-8) for m in mean)
  assert _scan._dataset_loss(probs, nbrs, 2.5) == pytest.approx(expected, rel=1e-12)


def test_scan_trains_at_the_largest_entropy_weight(mnist):
  # ScanConfig refuses weights above MAX_ENTROPY_WEIGHT (test_bad_parameters_raise_value_error); the cap itself
  # trains: fit_scan raises on NaN or inf parameters or head losses, and the features are probabilities.
  con = R.ContrastiveConfig(width=4, feature_dim=16, projection_dim=8, steps=3, batch_size=64)
  cfg = R.ScanConfig(num_clusters=10, steps=40, batch_size=64, num_neighbours=5, num_heads=2,
                     entropy_weight=_scan.MAX_ENTROPY_WEIGHT, contrastive=con)
  sc = R.fit_scan(jax.random.key(0), mnist.images[:300], cfg)
  probs = np.asarray(sc(mnist.images[:300]), np.float64)
  assert np.isfinite(sc.head_losses).all()
  np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-5)


def test_scan_keeps_the_head_with_the_lowest_dataset_loss(mnist, monkeypatch):
  """num_heads heads train together; the clusterer is the one whose SCAN loss over all of D_pub is lowest."""
  x = mnist.images
  cfg = R.ScanConfig(num_clusters=10, steps=150, batch_size=128, num_neighbours=10, num_heads=3,
                     contrastive=SMALL_CONTRASTIVE)
  # fit_scan returns only the kept head: record the last training step's network, all heads included.
  trained, train_step = {}, _scan._train_step

  def recording_step(*args, **kwargs):
    out = train_step(*args, **kwargs)
    trained.update(params=out[0], graphdef=kwargs["graphdef"])
    return out

  monkeypatch.setattr(_scan, "_train_step", recording_step)
  sc = R.fit_scan(jax.random.key(1), x, cfg, log_every=50)
  assert len(sc.head_losses) == 3 and len(set(sc.head_losses)) == 3
  assert sc.head == int(np.argmin(sc.head_losses))
  assert sc.head != 0  # at this key the kept head is not the first block of logits, so the slicing is exercised
  assert len(sc.loss_history) == 4                   # steps 0, 50, 100 and the last
  # Every head's loss, recomputed: head h is block h of the trained network's logits.
  encoder = R.fit_contrastive(jax.random.split(jax.random.key(1), 3)[0], x, SMALL_CONTRASTIVE)
  nbrs = _neighbours(encoder(x), 10)
  logits = np.asarray(nnx.merge(trained["graphdef"], trained["params"])(x), np.float64).reshape(600, 3, 10)
  probs = np.exp(logits - logits.max(axis=2, keepdims=True))
  probs /= probs.sum(axis=2, keepdims=True)
  want = [_scan._dataset_loss(probs[:, h], nbrs, cfg.entropy_weight) for h in range(3)]
  np.testing.assert_allclose(sc.head_losses, want, rtol=0, atol=1e-5)
  # The kept network is that head: its probabilities are the head's block and give back its recorded loss.
  np.testing.assert_allclose(sc(x), probs[:, sc.head], rtol=0, atol=1e-5)
  assert _scan._dataset_loss(sc(x), nbrs, cfg.entropy_weight) == pytest.approx(sc.head_losses[sc.head], abs=1e-5)
  assert sc(x).shape == (600, 10)
  # Its parameters are the backbone and that head: the contrastive projection head plays no part.
  assert {path[0].key for path, _ in jax.tree_util.tree_flatten_with_path(sc.params)[0]} == {
      "conv1", "conv2", "dense", "head"}
  # One head: nothing to choose.
  single = R.fit_scan(jax.random.key(0), x, dataclasses.replace(cfg, num_heads=1, steps=2))
  assert single.head == 0 and len(single.head_losses) == 1


def test_scan_heads_loss_reads_head_h_from_block_h_of_the_logits():
  # Head h owns logits columns [h s, (h + 1) s), as fit_scan slices the kept head; rows i and i + B pair up.
  rng = np.random.default_rng(0)
  batch, heads, s, lam = 4, 3, 5, 2.0
  logits = rng.normal(size=(2 * batch, heads * s)).astype(np.float32)
  got = np.asarray(_scan._heads_loss(jnp.asarray(logits), batch, heads, lam), np.float64)
  want = []
  for h in range(heads):
    z = logits[:, h * s:(h + 1) * s].astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    consistency = -np.mean(np.log(np.sum(p[:batch] * p[batch:], axis=1) + 1e-8))
    mean = p[:batch].mean(axis=0)
    want.append(consistency - lam * -np.sum(mean * np.log(mean + 1e-8)))
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_scan_loss_history_is_the_kept_heads(monkeypatch):
  x = np.random.default_rng(0).random((32, 8, 8, 1), dtype=np.float32)
  con = R.ContrastiveConfig(width=4, feature_dim=16, projection_dim=8, steps=2, batch_size=16)
  cfg = R.ScanConfig(num_clusters=3, steps=3, batch_size=8, num_neighbours=3, num_heads=3, contrastive=con)
  losses, train_step = [], _scan._train_step

  def recording_step(*args, **kwargs):
    out = train_step(*args, **kwargs)
    losses.append(np.asarray(out[2], np.float64))
    return out

  monkeypatch.setattr(_scan, "_train_step", recording_step)
  sc = R.fit_scan(jax.random.key(3), x, cfg, log_every=1)
  assert sc.head != 0  # at this key: the history must follow the kept head, not the first
  assert sc.loss_history == tuple(float(step[sc.head]) for step in losses)


def test_embed_with_wraps_any_model(mnist):
  w = jnp.asarray(np.random.default_rng(0).normal(size=(784, 6)), jnp.float32)
  rep = R.embed_with(lambda z: z.reshape(z.shape[0], -1) @ w, normalize=True)
  f = rep(mnist.images[:70], batch_size=32)  # 70 = 2 full batches + 1 padded batch
  expected = mnist.images[:70].reshape(70, -1) @ np.asarray(w)
  expected /= np.linalg.norm(expected, axis=1, keepdims=True)
  np.testing.assert_allclose(f, expected, rtol=1e-4, atol=1e-5)
  # A flax nnx module (e.g. a student's penultimate layer) closed over by the function.
  layer = nnx.Linear(784, 4, rngs=nnx.Rngs(0))
  student = R.embed_with(lambda z: layer(z.reshape(z.shape[0], -1)))
  np.testing.assert_allclose(student(mnist.images[:5]),
                             np.asarray(layer(mnist.images[:5].reshape(5, -1))), rtol=1e-5, atol=1e-6)
  host = R.embed_with(lambda z: np.asarray(z).reshape(len(z), -1)[:, :3], jit=False)
  np.testing.assert_array_equal(host(mnist.images[:4]), mnist.images[:4].reshape(4, -1)[:, :3])
  with pytest.raises(ValueError, match="model_fn"):
    R.embed_with(lambda z: z)(mnist.images[:2])
  with pytest.raises(ValueError, match="model_fn"):
    R.embed_with(3)
  for flag in ("normalize", "jit"):
    with pytest.raises(ValueError, match=f"Expected {flag} to be a bool, got 'no'"):
      R.embed_with(lambda z: z, **{flag: "no"})  # bool("no") is True: it used to normalise / jit


class _Linear:
  """A model with a mutable weight, features by a bound method."""

  def __init__(self, w):
    self.w = w

  def features(self, z):
    return z.reshape(z.shape[0], -1) @ self.w


def test_embed_with_reads_the_weights_at_each_call(mnist):
  # A trace keeps the weights model_fn closes over as constants. The shared jit cache (keyed on model_fn)
  # returned the first call's features after the model had changed in place: for the same representation
  # (the documented lambda over an nnx module), and for a new one of an equal bound method.
  x = mnist.images[:6]
  flat = x.reshape(6, -1)
  layer = nnx.Linear(784, 3, rngs=nnx.Rngs(1))
  rep = R.embed_with(lambda z: layer(z.reshape(z.shape[0], -1)))
  before = rep(x)
  layer.kernel[...] = layer.kernel[...] + 1.0  # an in-place update, as an nnx optimizer step makes
  after = rep(x)
  np.testing.assert_allclose(after, np.asarray(layer(jnp.asarray(flat))), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(after - before, np.broadcast_to(flat.sum(1, keepdims=True), (6, 3)), rtol=1e-4)
  m = _Linear(jnp.ones((784, 2), jnp.float32))
  np.testing.assert_allclose(R.embed_with(m.features)(x), np.repeat(flat.sum(1, keepdims=True), 2, 1), rtol=1e-5)
  m.w = 10.0 * jnp.ones((784, 2), jnp.float32)
  for jit in (True, False):
    np.testing.assert_allclose(R.embed_with(m.features, jit=jit)(x), np.repeat(10.0 * flat.sum(1, keepdims=True), 2, 1),
                               rtol=1e-5)


def test_one_call_traces_the_model_once_for_all_its_batches(mnist):
  # Each call jits model_fn afresh (above); its batches must share that one trace, or the pipeline's
  # batch-by-batch student embedding of D_priv would compile once per batch (1.6 s each for the student CNN).
  traces = []

  def model_fn(z):
    traces.append(z.shape)
    return z.reshape(z.shape[0], -1)[:, :4]

  rep = R.embed_with(model_fn)
  x = mnist.images[:7]
  whole = rep(x, batch_size=2)
  assert traces == [(2, 28, 28, 1)]  # four batches of 2 (the last one padded), one trace
  parts = list(rep._feature_batches(x, batch_size=2))  # pylint: disable=protected-access
  assert [p.shape for p in parts] == [(2, 4), (2, 4), (2, 4), (1, 4)] and len(traces) == 2
  np.testing.assert_array_equal(np.concatenate(parts), whole)
  np.testing.assert_array_equal(whole, x.reshape(7, -1)[:, :4])


def test_pca_whose_float32_covariance_overflows_is_refused_by_fit_pca():
  # Finite base features of 1e20 overflowed the covariance: fit_pca returned NaN components without a word
  # and only the first use failed ("produced NaN or inf features"), naming neither fit_pca nor the base.
  x = np.random.default_rng(0).random((50, 8, 8, 1)).astype(np.float32)
  big = R.embed_with(lambda z: z.reshape(z.shape[0], -1) * 1e20, name="big")
  with pytest.raises(ValueError, match=r"fit_pca: .*base 'big' overflowed \(largest \|feature\| 1e\+20\)"):
    R.fit_pca(x, 3, base=big)
  fine = R.fit_pca(x, 3, base=R.embed_with(lambda z: z.reshape(z.shape[0], -1) * 1e15, name="fine"))
  assert np.isfinite(np.asarray(fine(x))).all()


def test_pca_over_a_model_embedding_reads_the_weights_at_each_call(mnist):
  # Pca's features went through the shared jit, where its base's model_fn is a static field: the first trace's
  # weights (constants in it) served every later call, so a Pca fitted after training in place was off its
  # own definition.
  x = mnist.images[:50]
  m = _Linear(jnp.ones((784, 8), jnp.float32))
  R.fit_pca(x, 3, base=R.embed_with(m.features))(x)  # the first trace, with the old weights
  m.w = jnp.asarray(np.random.default_rng(1).normal(size=(784, 8)), jnp.float32)  # trained further in place
  emb = R.embed_with(m.features)
  pca = R.fit_pca(x, 3, base=emb)
  expected = (x.reshape(50, -1) @ np.asarray(m.w) - np.asarray(pca.mean)) @ np.asarray(pca.components)
  np.testing.assert_allclose(pca(x), expected, rtol=1e-4, atol=1e-3 * np.abs(expected).max())
  np.testing.assert_allclose(pca(x).var(0, ddof=1), pca.explained_variance, rtol=1e-3)
  traces = []

  def model_fn(z):
    traces.append(z.shape)
    return z.reshape(z.shape[0], -1)[:, 400:404] @ np.asarray(m.w)[:4, :4]

  nested = R.fit_pca(x, 2, base=R.fit_pca(x, 3, base=R.embed_with(model_fn)))
  traces.clear()
  assert nested(x, batch_size=16).shape == (50, 2) and traces == [(16, 28, 28, 1)]  # one trace per call


def test_pca_over_a_host_model_embedding_is_not_traced(mnist):
  # A jit=False base (a NumPy model) was traced anyway inside Pca's shared jit: TracerArrayConversionError.
  x = mnist.images[:50]
  emb = R.embed_with(lambda b: np.asarray(b).reshape(len(b), -1)[:, 400:410] * 2.0, jit=False)
  pca = R.fit_pca(x, 3, base=emb)
  expected = (x.reshape(50, -1)[:, 400:410] * 2.0 - np.asarray(pca.mean)) @ np.asarray(pca.components)
  np.testing.assert_allclose(pca(x), expected, rtol=1e-5, atol=1e-5)


def test_fit_representation_by_name(mnist):
  x = mnist.images[:200]
  key = jax.random.key(0)
  assert R.fit_representation(key, "raw", x)(x).shape == (200, 784)
  assert R.fit_representation(key, "hog", x, cell_size=7)(x).shape == (200, 324)
  assert R.fit_representation(key, "pca", x, num_components=8)(x).shape == (200, 8)
  hp = R.fit_representation(key, "hog-pca", x, num_components=12, cell_size=7)
  assert hp(x).shape == (200, 12) and hp.name == "hog-pca"
  sc = R.fit_representation(key, "scan", x, num_clusters=7, steps=2, batch_size=32, num_neighbours=5,
                            contrastive=dataclasses.replace(SMALL_CONTRASTIVE, steps=2))
  assert sc(x).shape == (200, 7) and isinstance(sc, R.ScanClusterer)
  with pytest.raises(ValueError, match="representation"):
    R.fit_representation(key, "sift", x)
  with pytest.raises(ValueError, match="cell"):
    R.fit_representation(key, "pca", x, cell=3)


@pytest.mark.parametrize("name", ["sift", "", "PCA", 3, None, ["raw"]])
def test_unknown_representation_name_is_named_with_the_known_ones(name):
  # The error said "Expected representation ...", naming no parameter of fit_representation.
  x = np.zeros((4, 8, 8, 1), np.float32)
  want = (rf"^Expected name \(a representation\) to be one of {re.escape(', '.join(R.REPRESENTATIONS))}; "
          rf"got {re.escape(repr(name))}\.$")
  with pytest.raises(ValueError, match=want):
    R.fit_representation(jax.random.key(0), name, x)
  from jaxdistill.labeling import _components  # the labeling pipeline's wrapper forwards the name
  with pytest.raises(ValueError, match=want):
    _components.fit_representation(jax.random.key(0), name, x, 4)


@pytest.mark.parametrize("name,options,match", [
    ("raw", {"bogus": 1}, r"^Unknown option\(s\) bogus for representation 'raw'; it takes no options\.$"),
    ("pca", {"cell": 3, "bins": 2}, r"^Unknown option\(s\) bins, cell for representation 'pca'; expected some of: "
                                    r"num_components\.$"),
    ("pca", {"num_components": "a"}, r"^Expected num_components to be an integer, got 'a'\.$"),
    ("hog", {"cell_size": -1}, r"^Expected cell_size=-1 >= 1\.$"),
    # A progress that is not callable failed with a TypeError after the first log_every steps.
    ("contrastive", {"progress": 3}, r"^Expected progress to be None or a callable .*; got int\.$"),
    ("scan", {"progress": "bar"}, r"^Expected progress to be None or a callable .*; got str\.$"),
])
def test_bad_representation_options_are_named(name, options, match):
  with pytest.raises(ValueError, match=match):
    R.fit_representation(jax.random.key(0), name, np.zeros((300, 8, 8, 1), np.float32), **options)


@pytest.mark.parametrize("images, match", [
    (np.zeros((5, 28, 28)), r"\[N, H, W, C\]"),
    (np.full((2, 28, 28, 1), np.nan), "NaN"),
    (np.full((2, 28, 28, 1), 255.0), r"\[0, 1\]"),
    (np.zeros((0, 28, 28, 1)), "at least one"),
    (np.array([["a"]]), "real numbers"),
    # 0 pixels or channels: NumPy's "zero-size array to reduction operation minimum", naming nothing
    (np.zeros((2, 0, 28, 1)), r"images of at least 1x1 pixels and 1 channel; got shape \(2, 0, 28, 1\)\.$"),
    (np.zeros((2, 28, 28, 0)), r"images of at least 1x1 pixels and 1 channel; got shape \(2, 28, 28, 0\)\.$"),
])
def test_bad_images_raise_value_error(images, match):
  with pytest.raises(ValueError, match=match):
    R.raw_pixels(images)


def test_bad_parameters_raise_value_error(mnist):
  x = mnist.images[:200]
  pca = R.fit_pca(x, 4)
  with pytest.raises(ValueError, match="images of shape"):
    pca(np.zeros((2, 14, 14, 1), np.float32))
  with pytest.raises(ValueError, match="num_components"):
    R.fit_pca(x, 201)
  with pytest.raises(ValueError, match="cell_size"):
    R.hog(x, cell_size=0)
  with pytest.raises(ValueError, match="at least"):
    R.hog(x, cell_size=20)
  with pytest.raises(ValueError, match="temperature"):
    R.ContrastiveConfig(temperature=0.0)
  with pytest.raises(ValueError, match=r"temperature >= 0.001; got 1e-45"):
    R.ContrastiveConfig(temperature=1e-45)  # 1 / tau overflows float32: the loss was NaN
  with pytest.raises(ValueError, match=r"at least 8x8 pixels for HOG neighbours .* use neighbour_fraction=0"):
    R.fit_contrastive(jax.random.key(0), x[:64, :6, :6], R.ContrastiveConfig(batch_size=8, steps=1))
  with pytest.raises(ValueError, match="batch_size=1 >= 2"):
    R.ContrastiveConfig(batch_size=1)  # one anchor: NT-Xent is 0 and nothing trained
  with pytest.raises(ValueError, match=r"num_neighbours=9 only with neighbour_fraction > 0 .*got neighbour_fraction=0"):
    R.ContrastiveConfig(neighbour_fraction=0, num_neighbours=9)  # plain SimCLR mines no neighbours: ignored
  assert R.ContrastiveConfig(neighbour_fraction=0.1, num_neighbours=9).num_neighbours == 9
  with pytest.raises(ValueError, match="flip"):
    R.ContrastiveConfig(flip=1)
  img = x[0]
  for kwargs, needle in ((dict(max_shift=-1), "max_shift=-1 >= 0"), (dict(max_shift=1.5), "max_shift"),
                         (dict(noise=-0.5), "noise"), (dict(noise=float("nan")), "noise"),
                         (dict(flip="no"), "flip")):
    with pytest.raises(ValueError, match=needle):
      R.augment(jax.random.key(0), img, **kwargs)
  with pytest.raises(ValueError, match=r"image of shape \[H, W, C\]; got shape \(1, 28, 28, 1\)"):
    R.augment(jax.random.key(0), x[:1])
  with pytest.raises(ValueError, match="batch_size"):
    R.fit_contrastive(jax.random.key(0), x, R.ContrastiveConfig(batch_size=256))
  with pytest.raises(ValueError, match="public"):
    R.fit_pca(np.zeros((3, 4)), 1)
  with pytest.raises(ValueError, match="num_clusters"):
    R.ScanConfig(num_clusters=1)
  with pytest.raises(ValueError, match="entropy_weight"):
    R.ScanConfig(entropy_weight=-1.0)
  for too_big in (1e6 * (1 + 1e-9), 3e38):  # 3e38: the loss overflowed float32 and the error blamed learning_rate
    with pytest.raises(ValueError, match=r"entropy_weight <= 1e\+06.*got " + re.escape(repr(too_big))):
      R.ScanConfig(entropy_weight=too_big)
  with pytest.raises(ValueError, match="num_heads"):
    R.ScanConfig(num_heads=0)
  with pytest.raises(ValueError, match="contrastive"):
    R.ScanConfig(contrastive={"steps": 3})
  with pytest.raises(ValueError, match="num_clusters=201"):
    R.fit_scan(jax.random.key(0), x, R.ScanConfig(num_clusters=201))
  with pytest.raises(ValueError, match="num_neighbours=200"):
    R.fit_scan(jax.random.key(0), x, R.ScanConfig(num_neighbours=200))
  with pytest.raises(ValueError, match="ScanConfig"):
    R.fit_scan(jax.random.key(0), x, SMALL_CONTRASTIVE)


def test_bfloat16_images_are_accepted_like_float16():
  # bfloat16 is NumPy kind 'V': as_images refused it as "not real numbers" while float16 passed.
  x = np.linspace(0, 1, 2 * 4 * 4, dtype=np.float32).reshape(2, 4, 4, 1)
  want = R.raw_pixels(x.astype(np.float16))
  got = R.raw_pixels(jnp.asarray(x, jnp.bfloat16))
  assert got.shape == want.shape == (2, 16)
  np.testing.assert_allclose(got, want, atol=1e-2)


def test_embed_with_refuses_a_non_iterable_image_shape():
  # image_shape=28 gave TypeError "'int' object is not iterable".
  for bad in (28, 2.5):
    with pytest.raises(ValueError, match=r"Expected image_shape=\(H, W, C\); got " + re.escape(repr(bad))):
      R.embed_with(lambda z: z.reshape(z.shape[0], -1), image_shape=bad)
  with pytest.raises(ValueError, match=r"image_shape=\(H, W, C\); got \(8, 8\)"):
    R.embed_with(lambda z: z.reshape(z.shape[0], -1), image_shape=(8, 8))


def test_embed_with_refuses_a_model_that_returns_complex_or_no_features_and_names_that_are_not_strings():
  # A complex output lost its imaginary part in a float32 cast (a ComplexWarning), 0 features gave an empty
  # representation, and any object was kept as the name that reports and messages print.
  x = np.full((2, 4, 4, 1), 0.5, np.float32)
  for fn, needle in ((lambda z: z.reshape(2, -1) * (1 + 1j), r"real features; got dtype complex64\.$"),
                     (lambda z: z.reshape(2, -1)[:, :0], r"\[B, d\] \(d >= 1\) for a batch of B=2; got shape "
                                                         r"\(2, 0\)\.$")):
    with pytest.raises(ValueError, match=needle):
      R.embed_with(fn)(x)
  assert R.embed_with(lambda z: z.reshape(2, -1) > 0.4)(x).dtype == np.float32  # bools are real
  for bad in (3, ["a"], ""):
    for make in (lambda n: R.embed_with(lambda z: z.reshape(z.shape[0], -1), name=n),
                 lambda n: R.fit_pca(np.repeat(x, 3, axis=0), 1, name=n)):
      with pytest.raises(ValueError, match=r"^Expected name to be a non-empty string; got "):
        make(bad)


def test_embed_with_refuses_images_of_another_shape_than_image_shape():
  rep = R.embed_with(lambda z: z.reshape(z.shape[0], -1), image_shape=(4, 4, 1))
  assert rep.input_shape == (4, 4, 1) and rep(np.zeros((2, 4, 4, 1), np.float32)).shape == (2, 16)
  with pytest.raises(ValueError, match=r"shape \[N, 4, 4, 1\]"):
    rep(np.zeros((2, 5, 5, 1), np.float32))


def test_fit_representation_checks_hog_options_against_the_images():
  # fit_representation("hog", 8x8 images, cell_size=8) returned a Hog that failed on the images it was fitted on.
  x = np.full((4, 8, 8, 1), 0.5, np.float32)
  for name, extra in (("hog", {}), ("hog-pca", {"num_components": 2})):
    with pytest.raises(ValueError, match="cell_size \\* block_size = 16 pixels per side; got 8x8"):
      R.fit_representation(jax.random.key(0), name, x, cell_size=8, **extra)
  assert R.fit_representation(jax.random.key(0), "hog", x, cell_size=4).cell_size == 4


def test_augment_takes_a_nested_list_image():
  # A nested list passed the rank check, then image.shape raised AttributeError.
  img = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4, 1)
  key = jax.random.key(0)
  np.testing.assert_array_equal(R.augment(key, img.tolist()), R.augment(key, img))
  for bad in ([[["a"]]], [[[0.5]], [[0.5, 1.0]]], [[[None]]]):
    with pytest.raises(ValueError, match=r"image to be an array of numbers \[H, W, C\]; got list"):
      R.augment(key, bad)


def test_augment_refuses_concrete_images_outside_the_unit_range():
  # A 0-255 image was clipped to black and white, and NaN passed through, silently.
  img = np.zeros((8, 8, 1), np.float32)
  img[2:6, 2:6] = 0.5
  key = jax.random.key(0)
  with pytest.raises(ValueError, match=r"image in \[0, 1\]; got range \[0, 127\] \(divide 8-bit images by 255\)"):
    R.augment(key, (img * 255).astype(np.uint8))
  bad = img.copy()
  bad[0, 0, 0] = np.nan
  with pytest.raises(ValueError, match="finite image"):
    R.augment(key, bad)
  # Traced images (the encoder's vmapped views) are not read; their values were checked on the way in.
  views = jax.vmap(R.augment)(jax.random.split(key, 2), np.stack([img, img]))
  assert views.shape == (2, 8, 8, 1) and float(views.max()) <= 1.0


def test_scan_small_image_error_names_the_contrastive_field():
  # From fit_scan the advice was "use neighbour_fraction=0", a field ScanConfig does not have.
  x = np.full((6, 4, 4, 1), 0.5, np.float32)
  cfg = R.ScanConfig(num_clusters=2, num_neighbours=2, steps=1,
                     contrastive=R.ContrastiveConfig(steps=1, batch_size=2))
  needle = r"\(contrastive\.neighbour_fraction=0\.5\).*use contrastive\.neighbour_fraction=0\."
  with pytest.raises(ValueError, match=needle):
    R.fit_scan(jax.random.key(0), x, cfg)


def test_images_that_are_not_real_numbers_are_refused_by_every_entry_point():
  # Complex images passed as_images (ml_dtypes.finfo takes complex as "float-like") and lost their imaginary part.
  x = np.full((4, 8, 8, 1), 0.5, np.float32)
  tiny = R.ContrastiveConfig(width=2, feature_dim=4, projection_dim=2, steps=1, batch_size=2, neighbour_fraction=0)
  rep = R.embed_with(lambda z: z.reshape(z.shape[0], -1))
  for bad in (x.astype(np.complex64) + 3j, jnp.asarray(x, jnp.complex64), x.astype(str), x.astype(object)):
    for call in (lambda b: R.raw_pixels(b), lambda b: R.hog(b), lambda b: R.Hog()(b), lambda b: rep(b),
                 lambda b: R.as_images("images", b)):
      with pytest.raises(ValueError, match="images to hold real numbers"):
        call(bad)
    for call in (lambda b: R.public_images(b), lambda b: R.fit_pca(b, 2),
                 lambda b: R.fit_contrastive(jax.random.key(0), b, tiny),
                 lambda b: R.fit_scan(jax.random.key(0), b, R.ScanConfig(num_clusters=2, contrastive=tiny)),
                 lambda b: R.fit_representation(jax.random.key(0), "raw", b)):
      with pytest.raises(ValueError, match="public to hold real numbers"):
        call(bad)
  for bad in (x[0].astype(np.complex64) + 3j, jnp.asarray(x[0], jnp.complex64)):
    with pytest.raises(ValueError, match="image"):
      R.augment(jax.random.key(0), bad)


@pytest.mark.parametrize("make, needle", [
    # Accepted, then the fit ran forever (steps) or failed inside JAX (the sizes).
    (lambda: R.ContrastiveConfig(steps=2**63), r"steps=9223372036854775808 <= 10000000"),
    (lambda: R.ContrastiveConfig(width=2**63), r"width=9223372036854775808 <= 8192"),
    (lambda: R.ContrastiveConfig(feature_dim=8193), r"feature_dim=8193 <= 8192"),
    (lambda: R.ContrastiveConfig(projection_dim=2**40), r"projection_dim=1099511627776 <= 8192"),
    (lambda: R.ContrastiveConfig(batch_size=2**63), r"batch_size=9223372036854775808 <= 2147483647"),
    (lambda: R.ContrastiveConfig(num_neighbours=2**63), r"num_neighbours=9223372036854775808 <= 2147483647"),
    (lambda: R.ContrastiveConfig(max_shift=257), r"max_shift=257 <= 256"),
    (lambda: R.ScanConfig(steps=2**63), r"steps=9223372036854775808 <= 10000000"),
    (lambda: R.ScanConfig(num_clusters=2**63), r"num_clusters=9223372036854775808 <= 1000000"),
    (lambda: R.ScanConfig(num_heads=1001), r"num_heads=1001 <= 1000"),
    (lambda: R.ScanConfig(batch_size=2**63), r"batch_size=9223372036854775808 <= 2147483647"),
    (lambda: R.ScanConfig(num_neighbours=2**31), r"num_neighbours=2147483648 <= 2147483647"),
    (lambda: R.Hog(num_bins=2**63), r"num_bins=9223372036854775808 <= 1024"),
    (lambda: R.Hog(cell_size=2**63), r"cell_size=9223372036854775808 <= 2147483647"),
    (lambda: R.Hog(block_size=2**63), r"block_size=9223372036854775808 <= 2147483647"),
    (lambda: R.hog(np.zeros((1, 8, 8, 1)), num_bins=2**63), r"num_bins=9223372036854775808 <= 1024"),  # Overflow
    (lambda: R.augment(jax.random.key(0), np.zeros((4, 4, 1)), max_shift=2**63), r"max_shift=\d+ <= 256"),
    (lambda: R.augment(jax.random.key(0), np.zeros((4, 4, 1)), max_shift=1e30), r"max_shift=\d+ <= 256"),
])
def test_sizes_beyond_their_caps_are_refused_up_front(make, needle):
  with pytest.raises(ValueError, match=needle):
    make()


def test_x64_mode_draws_the_same_views_hog_and_first_losses(mnist):
  # With x64 on, augment's shift, flip and noise, the contrastive and SCAN batches' neighbour picks and HOG's
  # one-hot votes took JAX's 64-bit defaults: other views and another training run for the same key (features
  # 0.43 apart after 30 contrastive steps). Those draws are 32-bit now. The optimiser still computes Adam's bias
  # correction in float64 with x64 on (optax), so trained weights may differ in the last bits: the contrastive
  # loss before any update is compared exactly, SCAN's (after one contrastive step) to 1e-5.
  imgs = mnist.images[:64]
  cfg = R.ContrastiveConfig(width=2, feature_dim=4, projection_dim=4, steps=1, batch_size=16,
                            neighbour_fraction=0.5)
  scan_cfg = R.ScanConfig(num_clusters=3, steps=1, batch_size=16, num_neighbours=5, contrastive=cfg)

  def run():
    views = jax.vmap(R.augment)(jax.random.split(jax.random.key(3), 64), jnp.asarray(imgs))
    con = R.fit_contrastive(jax.random.key(0), imgs, cfg)
    scan = R.fit_scan(jax.random.key(0), imgs, scan_cfg)
    return np.asarray(views), R.hog(imgs), con.loss_history[0], scan.loss_history[0]

  want = run()
  with jax.enable_x64(True):
    got = run()
  for g, w in zip(got[:3], want[:3]):
    np.testing.assert_array_equal(g, w)
  np.testing.assert_allclose(got[3], want[3], rtol=1e-5)
