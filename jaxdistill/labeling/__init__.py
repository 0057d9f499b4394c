"""Reverse k-NN private labeling end to end (Algorithm 1 of arXiv:2207.13253).

* :class:`LabelingConfig` / :class:`StudentConfig`: every setting of a run.
* :func:`run_labeling`: data -> representation on D_pub -> k-means++ queries
  -> reverse k-NN connection -> private votes (central, local, shuffle) ->
  pseudo-labels -> student, for T iterations, with the noise-free pipeline
  and the supervised ceiling beside it; writes a release ledger, a report
  and plots.
* :func:`plan_budget`: how a total (epsilon, delta) is split over T
  iterations and composed exactly.
* :class:`ReleaseLedger`: released votes are saved at once and reused by a
  re-run, never paid for twice.
"""

from jaxdistill.labeling._budget import MAX_EXACT_SHUFFLE_T
from jaxdistill.labeling._budget import MULTI_MESSAGE_TV_RESERVE
from jaxdistill.labeling._budget import BudgetPlan
from jaxdistill.labeling._budget import compose_pairs_epsilon
from jaxdistill.labeling._budget import plan_budget
from jaxdistill.labeling._config import CONNECTIONS
from jaxdistill.labeling._config import DEFAULT_EPSILON
from jaxdistill.labeling._config import MECHANISMS
from jaxdistill.labeling._config import REPRESENTATIONS
from jaxdistill.labeling._config import LabelingConfig
from jaxdistill.labeling._config import StudentConfig
from jaxdistill.labeling._ledger import ReleaseLedger
from jaxdistill.labeling._ledger import StoredRelease
from jaxdistill.labeling._ledger import data_fingerprint
from jaxdistill.labeling._pipeline import ChainResult
from jaxdistill.labeling._pipeline import IterationResult
from jaxdistill.labeling._pipeline import LabelingResult
from jaxdistill.labeling._pipeline import build_mechanism
from jaxdistill.labeling._pipeline import check_splits
from jaxdistill.labeling._pipeline import fit_first_representation
from jaxdistill.labeling._pipeline import load_splits
from jaxdistill.labeling._pipeline import privacy_report
from jaxdistill.labeling._pipeline import run_labeling
from jaxdistill.labeling._student import Student
from jaxdistill.labeling._student import refine_targets
from jaxdistill.labeling._student import train_student
from jaxdistill.labeling._student import vote_shares

__all__ = [
    "BudgetPlan", "compose_pairs_epsilon", "plan_budget", "MAX_EXACT_SHUFFLE_T", "MULTI_MESSAGE_TV_RESERVE",
    "CONNECTIONS", "DEFAULT_EPSILON", "MECHANISMS",
    "REPRESENTATIONS",
    "LabelingConfig", "StudentConfig", "ReleaseLedger", "StoredRelease", "data_fingerprint",
    "ChainResult", "IterationResult", "LabelingResult", "build_mechanism", "check_splits",
    "fit_first_representation", "load_splits",
    "privacy_report", "run_labeling", "Student", "train_student", "vote_shares", "refine_targets",
]
