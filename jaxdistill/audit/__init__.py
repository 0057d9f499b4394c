"""Statistical auditing of privacy claims and of estimators' closed forms.

* :func:`audit_privacy` -- from samples of M(x0) and M(x1), a lower
  confidence bound on epsilon (at a delta) and on delta (at an epsilon),
  with a stated false-alarm probability alpha (Clopper-Pearson bounds on
  events chosen on a separate split, Bonferroni over events and directions),
  and an ``alarm`` when the bound exceeds the claim.
* :func:`check_unbiased`, :func:`check_variance` -- z-test of the mean and
  chi-square (or fourth-moment) test of the variance of replicated estimates
  against closed forms, Bonferroni over entries.
* :func:`clopper_pearson_lower`, :func:`clopper_pearson_upper` -- the exact
  one-sided binomial bounds underneath.
* :func:`local_randomizer`, :func:`replicate_estimates` -- adapters from the
  BSVS mechanism contract.

Modules whose names start with ``_`` are private.
"""

from jaxdistill.audit._bounds import clopper_pearson_lower
from jaxdistill.audit._bounds import clopper_pearson_upper
from jaxdistill.audit._estimator import EstimatorCheck
from jaxdistill.audit._estimator import check_unbiased
from jaxdistill.audit._estimator import check_variance
from jaxdistill.audit._helpers import MAX_RUNS
from jaxdistill.audit._helpers import local_randomizer
from jaxdistill.audit._helpers import replicate_estimates
from jaxdistill.audit._privacy import AuditEvent
from jaxdistill.audit._privacy import PrivacyAudit
from jaxdistill.audit._privacy import audit_privacy
from jaxdistill.audit._privacy import sample_statistic

__all__ = [
    "MAX_RUNS", "AuditEvent", "EstimatorCheck", "PrivacyAudit", "audit_privacy", "check_unbiased",
    "check_variance", "clopper_pearson_lower", "clopper_pearson_upper", "local_randomizer",
    "replicate_estimates", "sample_statistic",
]
