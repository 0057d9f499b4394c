"""Query selection and connection rules: which queries each private record votes for.

* :func:`select_queries` / :func:`kmeans`: k-means++ on D_pub's features; the
  query of each cluster is its public sample nearest the centre.
* :func:`reverse_knn`: every private record to its k nearest queries (the
  paper's rule; out-degree exactly k, sensitivity 2kr in every DP model).
* :func:`knn_labeling`: every query to its k nearest records (baseline;
  sensitivity 2sr, central model only).
* :func:`balanced_connection`: Appendix C's max-min and harmonic-mean rules
  (no DP guarantee: they couple records).

Each rule returns BSVS buckets ready for
:func:`jaxdistill.mechanisms.make_bsvs_input`, and :func:`connection_privacy`
says what each rule does and does not guarantee.

Precision: distances are float32, ``||x||^2 - 2 x.q + ||q||^2`` (one matrix
product per block), whose rounding grows with ``||x||^2``, not with the
distance. Centre features that sit far from the origin compared with their
spread (subtract D_pub's mean: public, so free); the library's own
representations are centred, unit-norm or bounded. :func:`kmeans`,
:func:`select_queries` and the connection rules issue a ``RuntimeWarning``
about the public features (D_pub, or the queries; never the private records)
when ``||mean||^2`` exceeds 1000 times their mean ``||x - mean||^2`` (at that
ratio 0.2% of Gaussian records already changed nearest query), or else when
for more than 0.5% of up to 512 sampled rows float32 picks a nearest row
(of the row, or of a point just short of half way to its nearest other row)
that float64 finds farther by more than 0.1% of the typical neighbour
distance (tight groups far from the origin on opposite sides, whose overall
mean is near 0, even of two queries each).
"""

from jaxdistill.connection._kmeans import KMeansResult
from jaxdistill.connection._kmeans import QuerySelection
from jaxdistill.connection._kmeans import kmeans
from jaxdistill.connection._kmeans import select_queries
from jaxdistill.connection._rules import OBJECTIVES
from jaxdistill.connection._rules import RULES
from jaxdistill.connection._rules import Connection
from jaxdistill.connection._rules import ConnectionPrivacy
from jaxdistill.connection._rules import balanced_connection
from jaxdistill.connection._rules import balanced_scores
from jaxdistill.connection._rules import connect
from jaxdistill.connection._rules import connection_privacy
from jaxdistill.connection._rules import knn_labeling
from jaxdistill.connection._rules import reverse_knn
from jaxdistill.connection._rules import reverse_knn_connection

__all__ = [
    "KMeansResult", "QuerySelection", "kmeans", "select_queries", "OBJECTIVES", "RULES",
    "Connection", "ConnectionPrivacy", "balanced_connection", "balanced_scores", "connect",
    "connection_privacy", "knn_labeling", "reverse_knn", "reverse_knn_connection",
]
