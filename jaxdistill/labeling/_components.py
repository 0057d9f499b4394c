"""The pipeline's view of representations and connection rules.

The pipeline needs three operations, delegated to
:mod:`jaxdistill.representations` and :mod:`jaxdistill.connection`:

* ``fit_representation(key, name, public_images, dim, num_queries=s, encoder=...) -> embed``
  (fitted on D_pub only; ``embed(images) -> float32 [N, d]``);
* ``select_queries(key, public_emb, s) -> (queries [s], assignment [m])``:
  k-means++ on D_pub, queries = the public samples nearest the centres;
* ``connect(rule, private_emb, query_emb, k) -> Connection`` (buckets and the
  rule's privacy statement).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from jaxdistill import connection
from jaxdistill import representations

Embed = Callable[[np.ndarray], np.ndarray]

#: Representations :func:`fit_representation` knows (``pca`` and ``hog-pca`` use ``dim`` components).
REPRESENTATIONS = representations.REPRESENTATIONS
#: Connection rules (reverse k-NN is the paper's and the only per-record one).
RULES = connection.RULES
#: Representations with a PCA of ``dim`` components (``LabelingConfig.pca_dim``); the others ignore ``dim``.
PCA = ("pca", "hog-pca")
#: Learned representations: they have a contrastive encoder (``encoder`` options) and a progress callback.
LEARNED = ("contrastive", "scan")


def default_encoder(name: str) -> "representations.ContrastiveConfig | None":
  """The contrastive encoder config ``name`` fits when no encoder option is given (None: not a learned one)."""
  if name == "contrastive":
    return representations.ContrastiveConfig()
  if name == "scan":
    return representations.ScanConfig().contrastive
  return None


def _encoder_config(name: str, encoder: dict | None) -> dict:
  """Options that change the contrastive encoder of ``contrastive`` (its config) or ``scan`` (its backbone)."""
  if not encoder:
    return {}
  if name == "contrastive":
    return dict(encoder)
  if name == "scan":
    base = representations.ScanConfig().contrastive
    return {"contrastive": dataclasses.replace(base, **encoder)}
  raise ValueError(f"Encoder options {', '.join(sorted(encoder))} apply to the learned representations "
                   f"({', '.join(LEARNED)}) only; got representation={name!r}.")


def fit_representation(key: jax.Array, name: str, public_images: np.ndarray, dim: int,
                       progress: Callable[[int, float], None] | None = None, num_queries: int | None = None,
                       encoder: dict | None = None) -> Embed:
  """``dim``: components of ``pca`` / ``hog-pca``; ``num_queries``: clusters of ``scan`` (s);
  ``encoder``: :class:`~jaxdistill.representations.ContrastiveConfig` fields (``width``, ``steps``) of the
  contrastive encoder (``scan``: of its backbone).

  A D_pub smaller than the learned representations' defaults, which the pipeline's settings cannot change, is
  met by capping them: the contrastive batch (256 anchors) at m public images, as ``fit_scan`` already caps
  its own, and SCAN's 20 mined neighbours at m - 1. Larger D_pub sets are unaffected.
  """
  opts = {"num_components": dim} if name in PCA else {}
  opts.update(_encoder_config(name, encoder))
  m = int(np.shape(public_images)[0])
  if name == "contrastive" and m >= 2 and representations.ContrastiveConfig().batch_size > m:
    opts["batch_size"] = m
  if name == "scan" and m >= 2 and representations.ScanConfig().num_neighbours >= m:
    opts["num_neighbours"] = m - 1
  if name == "scan" and num_queries is not None:
    opts["num_clusters"] = num_queries
  if progress is not None and name in LEARNED:
    opts["progress"] = progress
  try:
    return representations.fit_representation(key, name, public_images, **opts)
  except ValueError as e:  # name the setting the caller gave (LabelingConfig.pca_dim, CLI --pca-dim)
    if "num_components" in opts and "num_components" in str(e):
      raise ValueError(f"pca_dim={dim} does not fit the {name} representation of D_pub: {e}") from None
    raise


def fit_steps(name: str, encoder: dict | None = None) -> int:
  """Optimisation steps of a learned representation's fit (for progress bars); 0 if not learned."""
  if name == "contrastive":
    return dataclasses.replace(representations.ContrastiveConfig(), **(encoder or {})).steps
  if name == "scan":
    cfg = representations.ScanConfig(**_encoder_config(name, encoder))
    return cfg.contrastive.steps + cfg.steps
  return 0


def select_queries(key: jax.Array, public_emb: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
  sel = connection.select_queries(key, public_emb, s)
  return np.asarray(sel.query_indices, np.int64), np.asarray(sel.assignment, np.int64)


def connect(rule: str, private_emb: np.ndarray, query_emb: np.ndarray, k: int) -> connection.Connection:
  return connection.connect(rule, private_emb, query_emb, k)


def connection_privacy(rule: str, k: int, s: int) -> connection.ConnectionPrivacy:
  return connection.connection_privacy(rule, k=k, num_queries=s)
