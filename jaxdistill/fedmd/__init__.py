"""FedMD-NFDP (Sun & Lyu, IJCAI 2021) and its baselines, with honest privacy reports.

* :func:`run_fedmd` / :class:`FedMDConfig` / :class:`FedMDResult`: Algorithm 1
  (NFDP: each party's k-sample, drawn once, is its only private input) and the
  baselines FedMD-NP, FedMD-LDP, local-only (all data or the k-sample) and
  centralized, with per-round checkpoints and ``resume``;
  :func:`check_config` raises ``run_fedmd``'s config, data and
  checkpoint-without-resume errors before any training;
  ``run_fedmd(..., secret_seed=)`` draws the samples and LDP noise from a
  secret seed, which :func:`checkpoint_secret_seed` reads back to resume.
* :func:`nfdp_sample`, :class:`NfdpSampler`, :class:`SampleOracle`: the sampler
  and the access-controlled handle on a party's records.
* :func:`release`, :func:`aggregate`: argmax / softmax / logits releases and
  equal or weighted server aggregation.
* :func:`load_fedmd_data` / :func:`make_fedmd_data`: public MNIST digits +
  6 private Fashion-MNIST classes split IID or non-IID (offline); EMNIST from
  its IDX release (``emnist-<config>``, offline) or tfds, CIFAR through tfds.
* :func:`ldp_sigma_table`, :func:`analytic_gaussian_delta`: FedMD-LDP's noise
  at NFDP's delta for several epsilons.
"""

from jaxdistill.fedmd._aggregation import RELEASE_MODES
from jaxdistill.fedmd._aggregation import aggregate
from jaxdistill.fedmd._aggregation import clip_rows
from jaxdistill.fedmd._aggregation import project_to_simplex
from jaxdistill.fedmd._aggregation import release
from jaxdistill.fedmd._aggregation import release_sensitivity
from jaxdistill.fedmd._config import METHODS
from jaxdistill.fedmd._config import VMAP_MODES
from jaxdistill.fedmd._config import FedMDConfig
from jaxdistill.fedmd._data import PARTITIONS
from jaxdistill.fedmd._data import FedMDData
from jaxdistill.fedmd._data import load_fedmd_data
from jaxdistill.fedmd._data import make_fedmd_data
from jaxdistill.fedmd._plots import plot_accuracy_per_round
from jaxdistill.fedmd._plots import plot_accuracy_vs_k
from jaxdistill.fedmd._privacy import DEFAULT_LDP_EPSILONS
from jaxdistill.fedmd._privacy import MAX_LDP_COUNT
from jaxdistill.fedmd._privacy import MAX_LDP_EPSILON
from jaxdistill.fedmd._privacy import MAX_LDP_TABLE_ROWS
from jaxdistill.fedmd._privacy import analytic_gaussian_delta
from jaxdistill.fedmd._privacy import calibrate_ldp_sigma
from jaxdistill.fedmd._privacy import gaussian_sigma_for_flat_delta
from jaxdistill.fedmd._privacy import ldp_sigma_table
from jaxdistill.fedmd._runner import CHECKPOINT_NAME
from jaxdistill.fedmd._runner import FedMDResult
from jaxdistill.fedmd._runner import check_config
from jaxdistill.fedmd._runner import checkpoint_secret_seed
from jaxdistill.fedmd._runner import run_fedmd
from jaxdistill.fedmd._sampling import MAX_K
from jaxdistill.fedmd._sampling import MAX_WOR_N
from jaxdistill.fedmd._sampling import NfdpSampler
from jaxdistill.fedmd._sampling import SampleOracle
from jaxdistill.fedmd._sampling import nfdp_sample

__all__ = [
    "RELEASE_MODES", "aggregate", "clip_rows", "project_to_simplex", "release", "release_sensitivity",
    "METHODS", "VMAP_MODES", "FedMDConfig", "PARTITIONS", "FedMDData", "load_fedmd_data",
    "make_fedmd_data", "plot_accuracy_per_round", "plot_accuracy_vs_k", "DEFAULT_LDP_EPSILONS", "MAX_LDP_EPSILON",
    "MAX_LDP_COUNT", "MAX_LDP_TABLE_ROWS",
    "analytic_gaussian_delta", "calibrate_ldp_sigma", "gaussian_sigma_for_flat_delta", "ldp_sigma_table",
    "CHECKPOINT_NAME", "FedMDResult", "check_config", "checkpoint_secret_seed", "run_fedmd", "MAX_K", "MAX_WOR_N",
    "NfdpSampler", "SampleOracle", "nfdp_sample",
]
