"""Privacy accounting: exact profiles, dp-accounting wrappers, shuffling, NFDP.

Every privacy number jaxdistill prints comes from this subpackage, in float64
on the host. Modules whose names start with ``_`` are private; use the names
re-exported here.
"""

from jaxdistill.accounting._exact import align_pmfs
from jaxdistill.accounting._exact import epsilon_for_delta
from jaxdistill.accounting._exact import hockey_stick_divergence
from jaxdistill.accounting._exact import privacy_profile
from jaxdistill.accounting._exact import worst_case_profile
from jaxdistill.accounting._mechanisms import MAX_GRID_INTERVAL
from jaxdistill.accounting._mechanisms import FFT_ROUNDOFF_PER_RELEASE
from jaxdistill.accounting._mechanisms import MAX_FFT_POINTS
from jaxdistill.accounting._mechanisms import MAX_GRID_POINTS
from jaxdistill.accounting._mechanisms import MAX_LATTICE_INDEX
from jaxdistill.accounting._mechanisms import MAX_LATTICE_LOSS
from jaxdistill.accounting._mechanisms import MAX_RR_EPSILON0
from jaxdistill.accounting._mechanisms import MechanismAccount
from jaxdistill.accounting._mechanisms import calibrate
from jaxdistill.accounting._mechanisms import discrete_laplace
from jaxdistill.accounting._mechanisms import gaussian
from jaxdistill.accounting._mechanisms import laplace
from jaxdistill.accounting._mechanisms import randomized_response
from jaxdistill.accounting._multi_message import MultiMessageNoise
from jaxdistill.accounting._multi_message import calibrate_multi_message
from jaxdistill.accounting._multi_message import min_calibration_epsilon
from jaxdistill.accounting._multi_message import multi_message_delta
from jaxdistill.accounting._multi_message import multi_message_epsilon
from jaxdistill.accounting._multi_message import multi_message_expected_messages
from jaxdistill.accounting._multi_message import multi_message_pld
from jaxdistill.accounting._nfdp import NfdpPrivacy
from jaxdistill.accounting._nfdp import nfdp_inclusion_probability
from jaxdistill.accounting._nfdp import nfdp_paper_guarantee
from jaxdistill.accounting._nfdp import nfdp_paper_rows
from jaxdistill.accounting._nfdp import nfdp_privacy
from jaxdistill.accounting._relation import PrivacyStatement
from jaxdistill.accounting._relation import PrivacyWarning
from jaxdistill.accounting._relation import Relation
from jaxdistill.accounting._shuffle import MAX_SHUFFLE_RELEASES
from jaxdistill.accounting._shuffle import ShuffleAmplification
from jaxdistill.accounting._shuffle import clone_delta
from jaxdistill.accounting._shuffle import clone_pld
from jaxdistill.accounting._shuffle import fmt_closed_form_epsilon
from jaxdistill.accounting._shuffle import fmt_closed_form_valid
from jaxdistill.accounting._shuffle import shuffle_epsilon
from jaxdistill.accounting._shuffle import shuffle_local_epsilon

__all__ = [
    "align_pmfs", "epsilon_for_delta", "hockey_stick_divergence", "privacy_profile",
    "worst_case_profile", "FFT_ROUNDOFF_PER_RELEASE", "MAX_FFT_POINTS", "MAX_GRID_INTERVAL", "MAX_GRID_POINTS",
    "MAX_LATTICE_INDEX", "MAX_LATTICE_LOSS", "MAX_RR_EPSILON0", "MechanismAccount", "calibrate",
    "discrete_laplace", "gaussian", "laplace", "randomized_response", "NfdpPrivacy",
    "nfdp_inclusion_probability", "nfdp_paper_guarantee", "nfdp_paper_rows", "nfdp_privacy",
    "PrivacyStatement", "PrivacyWarning", "Relation", "MAX_SHUFFLE_RELEASES", "ShuffleAmplification",
    "clone_delta", "clone_pld", "fmt_closed_form_epsilon", "fmt_closed_form_valid", "shuffle_epsilon",
    "shuffle_local_epsilon",
    "MultiMessageNoise", "calibrate_multi_message", "multi_message_delta", "multi_message_epsilon",
    "multi_message_expected_messages", "multi_message_pld", "min_calibration_epsilon",
]
