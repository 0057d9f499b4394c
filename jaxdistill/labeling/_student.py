"""The student: a flax nnx CNN trained with optax on the privately labelled D_pub.

The model is :class:`jaxdistill.models.FedMDCNN` (a 2- or 3-layer
Conv-BN-ReLU-Dropout network with a dense head), trained by
:func:`jaxdistill.models.fit` with Adam on hard labels or soft targets.
Its *penultimate-layer embedding* (the flattened input of the dense head)
re-selects the queries at iterations t >= 2; it is reduced by a PCA fitted on
D_pub only, so the embedding never looks at private data.

Training sees only D_pub and labels derived from released votes: it is
post-processing and costs no privacy.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxdistill import models
from jaxdistill.labeling._config import StudentConfig

__all__ = ["Student", "train_student"]


_CLASSIFIERS: dict = {}


class _Identity(nnx.Module):
  def __call__(self, x: jax.Array) -> jax.Array:
    return x


@functools.partial(jax.jit, static_argnames=("clf",))
def _features(state: models.TrainState, x: jax.Array, *, clf: models.Classifier) -> jax.Array:
  module = nnx.merge(clf.graphdef, state.params, state.rest)
  # The dense head's input is the penultimate layer: run the model with the head removed.
  module.head = _Identity()
  return module(x, train=False)


@dataclasses.dataclass(frozen=True)
class Student:
  """A trained student.

  Attributes:
    classifier: the static :class:`jaxdistill.models.Classifier`.
    state: its trained :class:`jaxdistill.models.TrainState`.
    config: the :class:`StudentConfig` it was trained with.
  """

  classifier: models.Classifier
  state: models.TrainState
  config: StudentConfig

  def logits(self, images: np.ndarray) -> np.ndarray:
    """float32 ``[n, C]`` eval-mode logits."""
    return np.asarray(models.predict_logits(self.classifier, self.state, images))

  def accuracy(self, images: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy, float64."""
    return models.accuracy(self.logits(images), labels)

  def penultimate(self, images: np.ndarray, *, chunk: int = 512, project: Any = None,
                  progress: Any = None) -> np.ndarray:
    """float32 ``[n, F]`` features feeding the dense head (eval mode).

    ``project`` (optional) maps each chunk's features, so that a projection
    of n records never materialises the full ``[n, F]`` matrix;
    ``progress(count)`` is called after each chunk.
    """
    images = np.asarray(images, np.float32)
    out = []
    for a in range(0, images.shape[0], chunk):
      xb = images[a:a + chunk]
      pad = chunk - xb.shape[0]
      xb = np.pad(xb, ((0, pad), (0, 0), (0, 0), (0, 0))) if pad else xb
      feats = np.asarray(_features(self.state, jnp.asarray(xb), clf=self.classifier))[:chunk - pad]
      out.append(feats if project is None else project(feats))
      if progress is not None:
        progress(feats.shape[0])
    return np.concatenate(out)

  def embedding(self, key: jax.Array, public_images: np.ndarray) -> Any:
    """An ``embed(images) -> float32 [n, embedding_dim]`` fitted on D_pub only.

    A PCA of the penultimate features of ``public_images`` (randomized range
    finder with 4 power iterations, Halko, Martinsson, Tropp 2011, Alg. 4.4),
    whose randomness comes from ``key``.
    """
    feats = self.penultimate(public_images)
    mean = feats.mean(0)
    dim = min(self.config.embedding_dim, feats.shape[0], feats.shape[1])
    comps = _pca_components(key, feats - mean, dim)
    return lambda imgs, progress=None: self.penultimate(imgs, project=lambda f: (f - mean) @ comps,
                                                        progress=progress)


def _pca_components(key: jax.Array, x: np.ndarray, dim: int, power_iterations: int = 4) -> np.ndarray:
  """float32 ``[F, dim]`` top principal directions of the centred ``x: [n, F]``."""
  x = np.asarray(x, np.float64)
  width = min(dim + 10, *x.shape)
  q = np.asarray(jax.random.normal(key, (x.shape[1], width)), np.float64)
  q, _ = np.linalg.qr(x @ q)
  for _ in range(power_iterations):
    q, _ = np.linalg.qr(x.T @ q)
    q, _ = np.linalg.qr(x @ q)
  _, _, vt = np.linalg.svd(q.T @ x, full_matrices=False)
  return vt[:dim].T.astype(np.float32)


def train_student(key: jax.Array, config: StudentConfig, images: np.ndarray, targets: np.ndarray,
                  num_classes: int, *, progress: Any = None) -> Student:
  """Trains a fresh student on ``images`` with ``targets``.

  Args:
    key: PRNG key (initialisation, shuffling, dropout).
    config: :class:`StudentConfig`.
    images: float32 ``[n, H, W, C]``.
    targets: int ``[n]`` labels or float32 ``[n, C]`` soft targets.
    num_classes: C.
    progress: optional callable invoked once per epoch (a progress bar's ``update``).

  Returns:
    The trained :class:`Student`.
  """
  init_key, fit_key = jax.random.split(key)
  seed = int(jax.random.randint(init_key, (), 0, 2**31 - 1))
  spec = models.CNNSpec(config.widths, config.dropout)
  model = models.FedMDCNN(spec, num_classes, input_shape=tuple(images.shape[1:]), rngs=nnx.Rngs(params=seed))
  clf, state = models.create(model, optax.adam(config.learning_rate))
  # jit caches key on the Classifier's identity: reuse one per architecture so
  # that every student of a run shares compiled steps.
  signature = (spec, num_classes, tuple(images.shape[1:]), config.learning_rate)
  clf = _CLASSIFIERS.setdefault(signature, clf)
  images = jnp.asarray(images, jnp.float32)
  targets = jnp.asarray(targets)
  for epoch_key in jax.random.split(fit_key, config.epochs):
    state = models.fit(epoch_key, clf, state, images, targets, epochs=1, batch_size=config.batch_size)
    if progress is not None:
      progress(1)
  return Student(clf, state, config)
