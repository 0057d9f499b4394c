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
from jaxdistill.mechanisms._randomized_response import RandomizedResponse
from jaxdistill.mechanisms._sampling import bernoulli_dyadic
from jaxdistill.mechanisms._sampling import dyadic_ceil
from jaxdistill.mechanisms._sampling import uniform_words

__all__ = [
    "BsvsMechanism", "BsvsInput", "BsvsShape", "SyntheticWorkload", "bsvs_counts",
    "bsvs_sensitivity", "client_entries", "make_bsvs_input", "synthetic_workload",
    "RandomizedResponse", "bernoulli_dyadic", "dyadic_ceil", "uniform_words",
]
