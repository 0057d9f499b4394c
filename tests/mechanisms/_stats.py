"""Statistical helpers shared by the mechanisms' simulation and audit tests."""

import jax.numpy as jnp
import numpy as np
from scipy import stats


def audit_pair(n):
  """A worst neighbouring pair of the shuffle audits, ((buckets [n, 1], labels [n, 1]) of D0, of D1).

  In D0 all n clients hold entry 0; D1 moves client 0 to entry 1.
  """
  buckets, labels = jnp.zeros((n, 1), jnp.int32), jnp.zeros((n, 1), jnp.int32)
  return (buckets, labels), (buckets.at[0, 0].set(1), labels)


def assert_mean_and_variance(runs, mean, var, alpha, label=None):
  """Per-entry two-sided z-test of the mean and chi-square interval on the variance.

  Each of the 2J tests (J entries) rejects with probability ``alpha`` under the null,
  so callers pass alpha = (family-wise rate) / (2J) for a Bonferroni family.

  Args:
    runs: ``[m, ...]`` independent replicates of the estimate.
    mean: the exact expectation per entry.
    var: the closed-form variance of one replicate per entry.
    alpha: per-test false-failure rate.
    label: shown when an assertion fails.

  Returns:
    The per-entry z statistics of the mean.
  """
  m = len(runs)
  z = (runs.mean(0) - mean) / np.sqrt(var / m)
  assert np.all(np.abs(z) < stats.norm.isf(alpha / 2)), label
  chi = (m - 1) * runs.var(0, ddof=1) / var
  lo, hi = stats.chi2.ppf(alpha / 2, m - 1), stats.chi2.isf(alpha / 2, m - 1)
  assert np.all((chi > lo) & (chi < hi)), label
  return z
