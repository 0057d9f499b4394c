"""The pipeline's view of representations and connection rules (INTERIM adapters).

The pipeline needs four operations; this module is the only place that says
how they are done, so swapping implementations is one line each:

* ``fit_representation(key, name, public_images, dim) -> embed`` (fitted on
  D_pub only; ``embed(images) -> float32 [N, d]``);
* ``select_queries(key, public_emb, s) -> (queries [s], assignment [m])``:
  k-means++ on D_pub, queries = the public samples nearest the centres;
* ``reverse_knn(private_emb, query_emb, k) -> int32 [n, k]``.

TODO(h4): replace by jaxdistill.representations / jaxdistill.connection.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdistill import _validate

Embed = Callable[[np.ndarray], np.ndarray]


def _flat(images: np.ndarray) -> np.ndarray:
  return np.asarray(images, np.float32).reshape(images.shape[0], -1)


def fit_representation(key: jax.Array, name: str, public_images: np.ndarray, dim: int) -> Embed:
  del key
  if name == "raw":
    return _flat
  if name == "pca":
    x = _flat(public_images)
    mean = x.mean(0)
    _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
    comps = vt[:dim].T.astype(np.float32)
    return lambda imgs: (_flat(imgs) - mean) @ comps
  raise ValueError(f"Representation {name!r} is not available in this build.")


@functools.partial(jax.jit, static_argnames=("k",))
def _topk_block(x, q, q_sq, k):
  d = q_sq[None, :] - 2.0 * x @ q.T  # ||x||^2 is constant per row
  _, idx = jax.lax.top_k(-d, k)
  return idx.astype(jnp.int32)


def nearest(x: np.ndarray, q: np.ndarray, k: int, block: int = 8192) -> np.ndarray:
  """int32 ``[n, k]``: indices of the k rows of q nearest each row of x (L2)."""
  qj = jnp.asarray(q, jnp.float32)
  q_sq = jnp.sum(qj * qj, axis=1)
  out = []
  for a in range(0, x.shape[0], block):
    xb = np.asarray(x[a:a + block], np.float32)
    pad = block - xb.shape[0] if x.shape[0] > block else 0
    xb = np.pad(xb, ((0, pad), (0, 0)))
    out.append(np.asarray(_topk_block(jnp.asarray(xb), qj, q_sq, k))[:xb.shape[0] - pad])
  return np.concatenate(out)


def select_queries(key: jax.Array, public_emb: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
  from sklearn.cluster import KMeans  # pylint: disable=import-outside-toplevel
  s = _validate.integer("num_queries", s, minimum=1, maximum=public_emb.shape[0])
  seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
  km = KMeans(s, init="k-means++", n_init=1, random_state=seed).fit(public_emb)
  centres = km.cluster_centers_.astype(np.float32)
  assignment = km.labels_.astype(np.int64)
  queries = nearest(centres, public_emb, 1)[:, 0].astype(np.int64)
  return queries, assignment


def reverse_knn(private_emb: np.ndarray, query_emb: np.ndarray, k: int) -> np.ndarray:
  return nearest(private_emb, query_emb, k)
