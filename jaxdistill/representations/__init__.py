"""Representations phi: images float32 [N, H, W, C] in [0, 1] -> features float32 [N, d].

Fitted on D_pub alone (the fit functions take public images only):

* :func:`raw_pixels`, :func:`hog` (Dalal-Triggs HOG in JAX), :func:`fit_pca`
  (jitted eigh; over pixels or any base representation);
* :func:`fit_contrastive`: a small CNN trained with flax nnx + optax, SimCLR
  NT-Xent with HOG-neighbour positives;
* :func:`fit_scan`: SCAN-style end-to-end clustering on top of the
  contrastive backbone; its features are cluster probabilities;
* :func:`embed_with`: any model, e.g. a trained student's penultimate layer,
  for Algorithm 1's iterations t >= 2;
* :func:`fit_representation`: the same by name (:data:`REPRESENTATIONS`).

Every representation is callable: ``rep(images) -> np.ndarray [N, d]``.
"""

from jaxdistill.representations._base import Representation
from jaxdistill.representations._base import as_images
from jaxdistill.representations._base import public_images
from jaxdistill.representations._classic import Hog
from jaxdistill.representations._classic import Pca
from jaxdistill.representations._classic import RawPixels
from jaxdistill.representations._classic import fit_pca
from jaxdistill.representations._classic import hog
from jaxdistill.representations._classic import raw_pixels
from jaxdistill.representations._contrastive import ContrastiveConfig
from jaxdistill.representations._contrastive import ContrastiveEncoder
from jaxdistill.representations._contrastive import augment
from jaxdistill.representations._contrastive import fit_contrastive
from jaxdistill.representations._embed import REPRESENTATIONS
from jaxdistill.representations._embed import ModelEmbedding
from jaxdistill.representations._embed import embed_with
from jaxdistill.representations._embed import fit_representation
from jaxdistill.representations._scan import ScanClusterer
from jaxdistill.representations._scan import ScanConfig
from jaxdistill.representations._scan import fit_scan

__all__ = [
    "Representation", "as_images", "public_images", "Hog", "Pca", "RawPixels", "fit_pca", "hog",
    "raw_pixels", "ContrastiveConfig", "ContrastiveEncoder", "augment", "fit_contrastive",
    "REPRESENTATIONS", "ModelEmbedding", "embed_with", "fit_representation", "ScanClusterer", "ScanConfig",
    "fit_scan",
]
