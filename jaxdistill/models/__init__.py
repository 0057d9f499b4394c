"""Models and training: FedMD's CNN family in flax nnx, optax trainers, vmapped stacks.

* :class:`FedMDCNN` / :class:`CNNSpec` / :data:`FEDMD_SPECS`: the 2- and
  3-layer CNNs of FedMD with a width multiplier (conv widths at most
  :data:`MAX_WIDTH`).
* :func:`create`, :func:`fit`, :func:`fit_stacked`, :func:`predict_logits`,
  :func:`predict_logits_stacked`, :func:`accuracy`: functional training of any
  nnx classifier following the ``model(x, *, train, key, mask)`` protocol, on
  hard or soft targets, one model at a time or several stacked under vmap.
"""

from jaxdistill.models._cnn import CNNSpec
from jaxdistill.models._cnn import MAX_CLASSES
from jaxdistill.models._cnn import MAX_WIDTH
from jaxdistill.models._cnn import FEDMD_SPECS
from jaxdistill.models._cnn import FedMDCNN
from jaxdistill.models._cnn import forward_flops
from jaxdistill.models._cnn import parse_spec
from jaxdistill.models._training import LOSSES
from jaxdistill.models._training import MAX_CHUNK
from jaxdistill.models._training import MAX_EPOCHS
from jaxdistill.models._training import MAX_MSE_TARGET
from jaxdistill.models._training import Classifier
from jaxdistill.models._training import DivergedError
from jaxdistill.models._training import TrainState
from jaxdistill.models._training import accuracy
from jaxdistill.models._training import create
from jaxdistill.models._training import fit
from jaxdistill.models._training import fit_stacked
from jaxdistill.models._training import predict_logits
from jaxdistill.models._training import predict_logits_stacked
from jaxdistill.models._training import predict_proba
from jaxdistill.models._training import stack_states
from jaxdistill.models._training import unstack_state

__all__ = [
    "CNNSpec", "FEDMD_SPECS", "MAX_CLASSES", "MAX_WIDTH", "FedMDCNN", "forward_flops", "parse_spec", "LOSSES",
    "MAX_CHUNK", "MAX_EPOCHS", "MAX_MSE_TARGET", "Classifier", "DivergedError", "TrainState", "accuracy", "create",
    "fit", "fit_stacked", "predict_logits", "predict_logits_stacked", "predict_proba", "stack_states",
    "unstack_state",
]
