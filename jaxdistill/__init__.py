"""jaxdistill: private federated knowledge distillation in JAX.

Public subpackages:

* :mod:`jaxdistill.accounting` -- exact privacy profiles, dp-accounting
  wrappers, shuffle amplification and the FedMD-NFDP sampling guarantee.

Modules whose names start with an underscore are private and may change
without notice; import from the subpackages instead.
"""

from jaxdistill import accounting

__version__ = "0.1.0"

__all__ = ["accounting", "__version__"]
