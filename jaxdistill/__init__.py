"""jaxdistill: private federated knowledge distillation in JAX.

Public subpackages:

* :mod:`jaxdistill.audit` -- statistical privacy auditor (lower confidence
  bounds on epsilon and delta, with alarms) and estimator checks.
* :mod:`jaxdistill.accounting` -- exact privacy profiles, dp-accounting
  wrappers, shuffle amplification and the FedMD-NFDP sampling guarantee.
* :mod:`jaxdistill.connection` -- k-means++ query selection and connection
  rules (reverse k-NN, k-NN labeling, balanced) with their privacy statements.
* :mod:`jaxdistill.data` -- real image data offline (embedded MNIST, IDX
  folders, tfds), splits and client partitions.
* :mod:`jaxdistill.fedmd` -- FedMD-NFDP and its baselines (NP, LDP, local,
  centralized) with per-party privacy reports and resumable checkpoints.
* :mod:`jaxdistill.labeling` -- reverse k-NN private labeling end to end
  (Algorithm 1): queries, votes, pseudo-labels, student, release ledger.
* :mod:`jaxdistill.mechanisms` -- BSVS inputs and mechanisms (central,
  local, shuffle) as pure JAX functions.
* :mod:`jaxdistill.models` -- FedMD's CNN family in flax nnx and optax
  trainers (hard or soft targets, vmapped stacks of same-architecture models).
* :mod:`jaxdistill.representations` -- features fitted on public data only
  (raw, PCA, HOG, HOG-PCA, a contrastive CNN, SCAN clustering) and
  re-embedding with any model.
* :mod:`jaxdistill.simulation` -- one streaming runner for every mechanism.

Modules whose names start with an underscore are private and may change
without notice; import from the subpackages instead.
"""

from jaxdistill import accounting
from jaxdistill import audit
from jaxdistill import connection
from jaxdistill import data
from jaxdistill import fedmd
from jaxdistill import labeling
from jaxdistill import mechanisms
from jaxdistill import models
from jaxdistill import representations
from jaxdistill import simulation

__version__ = "0.1.0"

__all__ = ["accounting", "audit", "connection", "data", "fedmd", "labeling", "mechanisms",
           "models", "representations", "simulation", "__version__"]
