"""BSVS mechanisms: central, local and shuffle DP, as pure JAX functions.

Every mechanism is a frozen dataclass following :class:`BsvsMechanism`
(``randomize`` / ``analyze`` / ``estimate`` / ``privacy`` /
``entry_variance``), so :func:`jaxdistill.simulation.simulate` runs any of
them over millions of clients.
"""

from jaxdistill.mechanisms._base import BsvsMechanism
from jaxdistill.mechanisms._bsvs import BsvsInput
from jaxdistill.mechanisms._bsvs import BsvsShape
from jaxdistill.mechanisms._bsvs import SyntheticWorkload
from jaxdistill.mechanisms._bsvs import bsvs_counts
from jaxdistill.mechanisms._bsvs import bsvs_sensitivity
from jaxdistill.mechanisms._bsvs import client_entries
from jaxdistill.mechanisms._bsvs import make_bsvs_input
from jaxdistill.mechanisms._bsvs import synthetic_workload
from jaxdistill.mechanisms._bounds import collision_alpha
from jaxdistill.mechanisms._bounds import collision_beta
from jaxdistill.mechanisms._bounds import collision_labeling_error
from jaxdistill.mechanisms._bounds import discrete_laplace_alpha
from jaxdistill.mechanisms._bounds import discrete_laplace_beta
from jaxdistill.mechanisms._bounds import discrete_laplace_labeling_error
from jaxdistill.mechanisms._bounds import laplace_alpha
from jaxdistill.mechanisms._bounds import laplace_beta
from jaxdistill.mechanisms._bounds import laplace_labeling_error
from jaxdistill.mechanisms._central import CentralDiscreteLaplace
from jaxdistill.mechanisms._central import CentralLaplace
from jaxdistill.mechanisms._collision import Collision
from jaxdistill.mechanisms._collision import CollisionMessage
from jaxdistill.mechanisms._product import Concatenation
from jaxdistill.mechanisms._product import ConcatenationLiteral
from jaxdistill.mechanisms._product import ProductStats
from jaxdistill.mechanisms._product import Separation
from jaxdistill.mechanisms._product import SeparationMessage
from jaxdistill.mechanisms._nb_sampler import sample_negative_binomial
from jaxdistill.mechanisms._randomized_response import RandomizedResponse
from jaxdistill.mechanisms._sampling import MAX_DRAWS
from jaxdistill.mechanisms._sampling import SAMPLER_BITS
from jaxdistill.mechanisms._sampling import bernoulli_dyadic
from jaxdistill.mechanisms._sampling import dyadic_ceil
from jaxdistill.mechanisms._sampling import uniform_below
from jaxdistill.mechanisms._sampling import uniform_index
from jaxdistill.mechanisms._sampling import uniform_words
from jaxdistill.mechanisms._shuffle_multi import MultiMessageTranscript
from jaxdistill.mechanisms._shuffle_multi import ShuffleMultiMessage
from jaxdistill.mechanisms._shuffle_multi import shuffle_multi_message_protocol
from jaxdistill.mechanisms._shuffle_single import ShuffleSingleMessage

__all__ = [
    "BsvsMechanism", "BsvsInput", "BsvsShape", "SyntheticWorkload", "bsvs_counts",
    "bsvs_sensitivity", "client_entries", "make_bsvs_input", "synthetic_workload",
    "RandomizedResponse", "CentralLaplace", "CentralDiscreteLaplace", "Collision",
    "CollisionMessage", "Separation", "SeparationMessage", "Concatenation",
    "ConcatenationLiteral", "ProductStats", "laplace_alpha", "laplace_beta",
    "laplace_labeling_error", "discrete_laplace_alpha", "discrete_laplace_beta",
    "discrete_laplace_labeling_error", "collision_alpha", "collision_beta",
    "collision_labeling_error",
    "ShuffleMultiMessage", "MultiMessageTranscript", "shuffle_multi_message_protocol",
    "sample_negative_binomial", "ShuffleSingleMessage", "bernoulli_dyadic", "dyadic_ceil",
    "uniform_words", "uniform_below", "uniform_index", "MAX_DRAWS", "SAMPLER_BITS",
]
