"""SCAN-style clustering of D_pub: a representation whose features are cluster probabilities.

Van Gansbeke et al.'s SCAN ("Learning to Classify Images without Labels",
arXiv:2005.12320) trains a clustering head on top of a self-supervised
backbone so that every image and its nearest neighbours (mined in the
self-supervised feature space) get the same cluster, while an entropy term
keeps all clusters in use. The reverse k-NN paper uses such end-to-end
clusterings (DTI, SCAN) when s = |Y| is small (its Fig. 5, local DP).

Here the backbone is :func:`fit_contrastive`'s encoder, the neighbours are
mined in its output space (the projection, or the backbone's features with
``output="backbone"``), and the output features are the head's softmax
probabilities ``[N, num_clusters]``. The pipeline uses them unchanged
(k-means++ with s = ``num_clusters`` centres, queries nearest the centres,
reverse k-NN in L2). Once the head is confident, its cells are the head's
argmax clusters: in a fit at the default settings on Fashion-MNIST training
images (mean largest probability 0.95) they gave the same noise-free labels. With a barely trained
head (mean largest probability 0.46) only 77% of the samples were in their
argmax cluster's cell.

Like SCAN's reference implementation, several heads (10 by default) are
trained on the one backbone, and the head with the lowest SCAN loss over all
of D_pub (no labels needed) is kept. On a split of the Fashion-MNIST training
images (s = 10, four keys) the kept head's cluster-majority accuracy averaged
0.655 with 10 heads (0.657 with 5), against 0.613 (0.618) for a head drawn at
random; a single head's quality moves with the key by about +-5 points.
SCAN's third step (self-labelling) is not implemented.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxdistill import _validate
from jaxdistill.representations._base import Representation, check_trained, public_images, register
from jaxdistill.representations._contrastive import (MAX_COUNT, MAX_STEPS, ContrastiveConfig, _Encoder,
                                                     _check_progress, _fit_contrastive, _neighbours, augment,
                                                     backbone)

__all__ = ["ScanConfig", "ScanClusterer", "fit_scan"]

#: Largest accepted entropy weight. SCAN uses 5. Far above 1e6 the consistency term no longer matters; near 1e37
#: the entropy term's gradient (up to lambda * (ln 1e8 + 1) in size) can overflow float32, and from about
#: 1.5e38 (with 10 clusters) the loss itself does, so training ended in NaN and was blamed on the learning rate.
MAX_ENTROPY_WEIGHT = 1e6
#: Most clusters (the head's width; the pipeline sets it to s, at most the public images).
MAX_CLUSTERS = 1_000_000
#: Most clustering heads (each is a ``feature_dim x num_clusters`` layer trained at every step).
MAX_HEADS = 1000


@dataclasses.dataclass(frozen=True)
class ScanConfig:
  """Hyperparameters of :func:`fit_scan` (all safe to log).

  The defaults are SCAN's (20 neighbours, entropy weight 5, 10 heads) with
  1,500 steps; they were measured on a split of the Fashion-MNIST training
  images only (``results/labeling/fashion_mnist_targets.md``).

  Attributes:
    num_clusters: clusters (the head's width); the pipeline sets it to s.
      In ``[2, MAX_CLUSTERS]`` (10**6).
    steps: optimisation steps of the clustering stage, at most
      ``MAX_STEPS`` (10**7).
    batch_size: anchors per step (two views each: anchor, neighbour); a D_pub
      smaller than this uses all of D_pub every step. At most 2**31 - 1.
    learning_rate: peak AdamW learning rate (cosine decay to 0).
    weight_decay: AdamW weight decay.
    entropy_weight: lambda, the weight of the entropy of the mean cluster
      probabilities (higher: more even cluster sizes), at most
      ``MAX_ENTROPY_WEIGHT`` = 1e6.
    num_neighbours: neighbours per public image, mined in the contrastive
      projection space, to draw positives from (at most 2**31 - 1).
    num_heads: clustering heads trained together on the one backbone (their
      losses are summed); the head with the lowest SCAN loss over all of
      D_pub is kept. At most ``MAX_HEADS`` (1000).
    contrastive: the backbone's :class:`ContrastiveConfig` (its augmentation
      settings are reused here).
  """

  num_clusters: int = 10
  steps: int = 1500
  batch_size: int = 512
  learning_rate: float = 1e-3
  weight_decay: float = 1e-4
  entropy_weight: float = 5.0
  num_neighbours: int = 20
  num_heads: int = 10
  contrastive: ContrastiveConfig = dataclasses.field(default_factory=ContrastiveConfig)

  def __post_init__(self):
    # The validated Python ints are kept: a whole float (3.0) would otherwise reach layer and array shapes.
    # Capped so that a typo (2**63 steps) fails here, not by running forever or inside JAX.
    object.__setattr__(self, "num_clusters", _validate.integer("num_clusters", self.num_clusters, minimum=2,
                                                               maximum=MAX_CLUSTERS))
    for name, cap in (("steps", MAX_STEPS), ("batch_size", MAX_COUNT), ("num_neighbours", MAX_COUNT),
                      ("num_heads", MAX_HEADS)):
      object.__setattr__(self, name, _validate.integer(name, getattr(self, name), minimum=1, maximum=cap))
    # The validated Python floats are kept too: a jnp.float32(1e-3) passed the checks, then made the config
    # unhashable as a static jit argument, failing with JAX's multi-line message after the contrastive stage.
    object.__setattr__(self, "weight_decay", _validate.nonnegative("weight_decay", self.weight_decay))
    object.__setattr__(self, "learning_rate", _validate.learning_rate(self.learning_rate,
                                                                      weight_decay=self.weight_decay))
    entropy_weight = _validate.nonnegative("entropy_weight", self.entropy_weight)
    if entropy_weight > MAX_ENTROPY_WEIGHT:
      raise ValueError(f"Expected entropy_weight <= {MAX_ENTROPY_WEIGHT:g} (SCAN uses 5; far larger weights "
                       f"can overflow the loss's float32 gradients); got {entropy_weight!r}.")
    object.__setattr__(self, "entropy_weight", entropy_weight)
    if not isinstance(self.contrastive, ContrastiveConfig):
      raise ValueError(f"Expected contrastive to be a ContrastiveConfig; got {type(self.contrastive).__name__}.")


class _ScanNet(nnx.Module):
  """The contrastive encoder's backbone and a linear head (``num_heads * num_clusters`` logits while training)."""

  def __init__(self, encoder: _Encoder, feature_dim: int, num_clusters: int, *, rngs: nnx.Rngs):
    # Only the backbone's layers: the contrastive projection head plays no part in SCAN's clustering.
    self.conv1, self.conv2, self.dense = encoder.conv1, encoder.conv2, encoder.dense
    self.head = nnx.Linear(feature_dim, num_clusters, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.head(jax.nn.relu(backbone(self, x)))


@dataclasses.dataclass(frozen=True)
class ScanClusterer(Representation):
  """A trained SCAN-style clusterer (from :func:`fit_scan`); features are cluster probabilities.

  Attributes:
    params: the network's ``nnx.Param`` state (backbone and head).
    graphdef: the network's static structure.
    config: the :class:`ScanConfig` it was trained with.
    image_shape: ``(H, W, C)`` of D_pub.
    loss_history: the kept head's clustering loss (consistency - lambda *
      entropy) on its training batch every ``log_every`` steps (first and
      last included), as Python floats.
    head_losses: every head's SCAN loss over all of D_pub (each image with
      all its mined neighbours, no augmentation) after training.
    head: the index of the kept head, ``argmin(head_losses)`` (lowest index
      among equal losses).
  """

  params: Any
  graphdef: Any
  config: ScanConfig
  image_shape: tuple[int, int, int]
  loss_history: tuple[float, ...] = ()
  head_losses: tuple[float, ...] = ()
  head: int = 0
  name: str = "scan"

  @property
  def input_shape(self) -> tuple[int, int, int]:
    return self.image_shape

  def features(self, x: jax.Array) -> jax.Array:
    return jax.nn.softmax(nnx.merge(self.graphdef, self.params)(x), axis=-1)

  def clusters(self, images: Any) -> np.ndarray:
    """The argmax cluster of each image, int64 ``[N]``."""
    return np.argmax(self(images), axis=1).astype(np.int64)


register(ScanClusterer, ["params"], ["graphdef", "config", "image_shape", "loss_history", "head_losses", "head",
                                     "name"])


def _scan_loss(probs: jax.Array, batch: int, entropy_weight: float) -> jax.Array:
  """SCAN's loss for ``probs [2B, s]``: rows i and i + B are an image and one of its neighbours."""
  anchor, neighbour = probs[:batch], probs[batch:]
  consistency = -jnp.mean(jnp.log(jnp.sum(anchor * neighbour, axis=1) + 1e-8))
  mean = jnp.mean(anchor, axis=0)
  entropy = -jnp.sum(mean * jnp.log(mean + 1e-8))
  return consistency - entropy_weight * entropy


def _heads_loss(logits: jax.Array, batch: int, num_heads: int, entropy_weight: float) -> jax.Array:
  """Each head's SCAN loss, float32 ``[num_heads]``, for logits ``[2B, num_heads * s]`` (head h: block h)."""
  probs = jax.nn.softmax(logits.reshape(logits.shape[0], num_heads, -1), axis=-1)
  return jax.vmap(lambda p: _scan_loss(p, batch, entropy_weight), in_axes=1)(probs)


def _dataset_loss(probs: np.ndarray, neighbours: np.ndarray, entropy_weight: float) -> float:
  """SCAN's loss over a whole data set (float64): every image paired with every one of its mined neighbours.

  ``probs [m, s]`` are the cluster probabilities, ``neighbours [m, K]`` the
  mined neighbour indices; the consistency term averages over all m K pairs
  and the entropy is that of the mean of all m rows.
  """
  p = np.asarray(probs, np.float64)
  # One neighbour column at a time: p[neighbours] whole would be an [m, K, s] float64 array (10 GB at
  # m = 60,000, K = 20, s = 1,000).
  agree = np.stack([np.einsum("is,is->i", p, p[neighbours[:, k]]) for k in range(neighbours.shape[1])], axis=1)
  consistency = -np.mean(np.log(agree + 1e-8))
  mean = p.mean(axis=0)
  return float(consistency + entropy_weight * np.sum(mean * np.log(mean + 1e-8)))


@functools.partial(jax.jit, static_argnames=("graphdef", "batch", "cfg"))
def _train_step(params, opt_state, step_key, data, neighbours, learning_rate, *, graphdef, batch: int,
                cfg: ScanConfig):
  """One AdamW step on SCAN's loss for a batch of anchors, each with one random mined neighbour."""
  m = data.shape[0]
  k_batch, k_nbr, k_views = jax.random.split(step_key, 3)
  anchors = jax.random.choice(k_batch, m, (batch,), replace=False)
  nbr = neighbours[anchors, jax.random.randint(k_nbr, (batch,), 0, neighbours.shape[1], jnp.int32)]
  c = cfg.contrastive
  view = functools.partial(augment, max_shift=c.max_shift, noise=c.noise, flip=c.flip)
  views = jax.vmap(view)(jax.random.split(k_views, 2 * batch), data[jnp.concatenate([anchors, nbr])])

  def loss_fn(p):
    losses = _heads_loss(nnx.merge(graphdef, p)(views), batch, cfg.num_heads, cfg.entropy_weight)
    return jnp.sum(losses), losses

  (_, losses), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  opt = optax.adamw(learning_rate, weight_decay=cfg.weight_decay)
  updates, opt_state = opt.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, losses


def fit_scan(key: jax.Array, public: Any, config: ScanConfig | None = None, *,
             progress: Callable[[int, float], None] | None = None, log_every: int = 100) -> ScanClusterer:
  """Clusters D_pub end to end (SCAN-style) and returns the cluster probabilities as a representation.

  First :func:`fit_contrastive` (``config.contrastive``) trains the backbone;
  each public image's ``num_neighbours`` nearest public images are mined in
  its output space (``config.contrastive.output``: the projection by
  default). Then a linear head of width s = ``num_clusters`` on
  the backbone, and the backbone with it, minimise SCAN's loss over batches
  of anchors a with a random mined neighbour n, both augmented:

  .. math::

     \\mathcal{L} = -\\frac{1}{B} \\sum_{a} \\log \\langle p(a), p(n_a) \\rangle
       \\; - \\; \\lambda \\, H\\Big(\\frac{1}{B} \\sum_a p(a)\\Big),
     \\qquad p = \\operatorname{softmax}(\\text{head}(\\text{backbone}(\\cdot))),

  with AdamW and a cosine learning-rate decay to 0. ``num_heads`` heads are
  trained at once (the sum of their losses); afterwards each head's loss is
  evaluated over all of D_pub (every image with each of its mined
  neighbours, no augmentation) and the lowest-loss head is kept, as in
  SCAN's reference implementation. The choice uses no labels.

  Formal guarantees:
    A function of (key, D_pub) only, like :func:`fit_contrastive`: ``public``
    is a D_pub array / ImageData (labels ignored) or a LabelingSplits, of
    which only ``.public`` is read. It adds no privacy cost; the clusterer
    is applied to private records as a fixed public function.

  References:
    Van Gansbeke et al., "SCAN: Learning to Classify Images without Labels",
    ECCV 2020, arXiv:2005.12320 (steps 1-2; step 3, self-labelling, is not
    implemented).

  Args:
    key: PRNG key (the backbone's fit, the head's initialisation, batches,
      augmentations).
    public: D_pub images float ``[m, H, W, C]`` in [0, 1], ImageData, or
      LabelingSplits.
    config: hyperparameters (default :class:`ScanConfig`). Both stages'
      batch sizes are capped at m.
    progress: optional callback ``progress(steps_done, loss)``, counting the
      contrastive steps first, then the clustering steps (whose loss is the
      mean over the heads).
    log_every: steps between loss records.

  Returns:
    A :class:`ScanClusterer`: call it on images for float32 ``[N, num_clusters]``
    probabilities; ``.clusters(images)`` gives the argmax clusters.

  Raises:
    ValueError: bad images or config, a non-callable ``progress``,
      ``num_clusters > m``, or fewer than ``num_neighbours + 1`` public
      images; either stage's training diverged
      (NaN or inf parameters or head losses), naming its ``learning_rate``
      (``contrastive.learning_rate`` for the backbone) and, when their
      product reaches 1, ``weight_decay``.
  """
  key = _validate.prng_key("key", key)
  x = public_images(public)
  cfg = ScanConfig() if config is None else config
  if not isinstance(cfg, ScanConfig):
    raise ValueError(f"Expected config to be a ScanConfig; got {type(cfg).__name__}.")
  _check_progress(progress)
  m = x.shape[0]
  if cfg.num_clusters > m:
    raise ValueError(f"Expected num_clusters={cfg.num_clusters} <= the number of public images m={m}.")
  if cfg.num_neighbours >= m:
    raise ValueError(f"Expected num_neighbours={cfg.num_neighbours} < the number of public images m={m}.")
  log_every = _validate.integer("log_every", log_every, minimum=1)
  k_backbone, k_head, k_train = jax.random.split(key, 3)
  con = cfg.contrastive
  encoder = _fit_contrastive(k_backbone, x, dataclasses.replace(con, batch_size=min(con.batch_size, m)),
                             progress, log_every, prefix="contrastive.")
  neighbours = jnp.asarray(_neighbours(encoder(x), cfg.num_neighbours))
  s, heads = cfg.num_clusters, cfg.num_heads
  net = _ScanNet(nnx.merge(encoder.graphdef, encoder.params), con.feature_dim, heads * s,
                 rngs=nnx.Rngs(params=k_head))
  graphdef, params = nnx.split(net, nnx.Param)
  opt_state = optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay).init(params)
  data = jnp.asarray(x)
  batch = min(cfg.batch_size, m)
  schedule = optax.cosine_decay_schedule(cfg.learning_rate, cfg.steps)
  history = []
  for i in range(cfg.steps):
    params, opt_state, losses = _train_step(params, opt_state, jax.random.fold_in(k_train, i), data, neighbours,
                                            jnp.float32(schedule(i)), graphdef=graphdef, batch=batch, cfg=cfg)
    if i % log_every == 0 or i == cfg.steps - 1:
      history.append(np.asarray(losses, np.float64))
      if progress is not None:
        progress(con.steps + i + 1, float(np.mean(history[-1])))
  # Keep the head with the lowest loss over all of D_pub.
  per_head = jax.jit(lambda p, z: jax.nn.softmax(nnx.merge(graphdef, p)(z).reshape(z.shape[0], heads, s), axis=-1))
  probs = np.concatenate([np.asarray(per_head(params, data[i:i + 1024])) for i in range(0, m, 1024)])
  nbrs = np.asarray(neighbours)
  head_losses = tuple(_dataset_loss(probs[:, h], nbrs, cfg.entropy_weight) for h in range(heads))
  # NaN or inf weights, or finite ones so large that the logits overflow (softmax NaN), mean training diverged;
  # argmin would keep a NaN head.
  check_trained("SCAN", params, cfg.steps, cfg.learning_rate, cfg.weight_decay,
                finite=bool(np.isfinite(head_losses).all()))
  head = int(np.argmin(head_losses))
  model = nnx.merge(graphdef, params)
  kernel, bias = model.head.kernel[...], model.head.bias[...]
  model.head = nnx.Linear(con.feature_dim, s, rngs=nnx.Rngs(params=0))
  model.head.kernel = nnx.Param(kernel[:, head * s:(head + 1) * s])
  model.head.bias = nnx.Param(bias[head * s:(head + 1) * s])
  graphdef, params = nnx.split(model, nnx.Param)
  return ScanClusterer(params, graphdef, cfg, tuple(int(v) for v in x.shape[1:]),
                       tuple(float(h[head]) for h in history), head_losses, head)
