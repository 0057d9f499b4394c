"""Trained representations refuse to return NaN / inf weights: a diverged fit names its step size."""

import copy

import jax
import numpy as np
import pytest

from jaxdistill import representations as R
from jaxdistill.representations import _base

# Tiny images and networks (neighbour_fraction=0: no HOG neighbours, which need 8x8 cells of 4 pixels).
IMAGES = np.random.default_rng(0).random((24, 8, 8, 1), dtype=np.float32)
TINY = R.ContrastiveConfig(width=2, feature_dim=4, projection_dim=4, steps=3, batch_size=8, neighbour_fraction=0.0,
                           weight_decay=0.0)


def past_the_cap(config, **fields):
  """``config`` with ``fields`` set past the constructor's checks (it caps learning_rate at 10 and
  learning_rate * weight_decay below 1): training that diverges must still say which setting to lower."""
  out = copy.copy(config)
  for name, value in fields.items():
    object.__setattr__(out, name, value)
  return out


def test_contrastive_divergence_names_the_learning_rate():
  # Before: loss_history (2.70, nan, 2.71) and NaN weights, returned normally; unit_rows then turned every
  # feature row into zeros, silently.
  with pytest.raises(ValueError, match=r"^Contrastive training diverged \(NaN or inf parameters after 3 steps\); "
                                       r"lower learning_rate \(now 1e\+30\)\.$"):
    R.fit_contrastive(jax.random.key(0), IMAGES, past_the_cap(TINY, learning_rate=1e30))
  assert np.isfinite(R.fit_contrastive(jax.random.key(0), IMAGES, TINY)(IMAGES)).all()  # sane settings pass


def test_scan_divergence_names_the_stage_and_its_learning_rate():
  # Before: head_losses (nan, nan) returned normally; the first call then said only "Representation 'scan'
  # produced NaN or inf features", naming no setting.
  cfg = past_the_cap(R.ScanConfig(num_clusters=3, steps=4, batch_size=8, num_neighbours=3, num_heads=2,
                                  weight_decay=0.0, contrastive=TINY), learning_rate=1e30)
  with pytest.raises(ValueError, match=r"^SCAN training diverged \(NaN or inf parameters after 4 steps\); "
                                       r"lower learning_rate \(now 1e\+30\)\.$"):
    R.fit_scan(jax.random.key(0), IMAGES, cfg)
  # The backbone's stage names its setting inside the ScanConfig (contrastive.learning_rate): checked through
  # check_trained below, since fit_scan re-validates the backbone's config, which now refuses 1e30 up front.


def test_the_divergence_message_names_weight_decay_when_it_alone_can_blow_up_the_weights():
  # AdamW multiplies the weights by 1 - learning_rate * weight_decay every step (weight_decay=1e30 diverged too).
  nan = {"w": np.full(3, np.nan, np.float32)}
  with pytest.raises(ValueError, match=r"^SCAN training diverged \(NaN or inf parameters after 1 step\); lower "
                                       r"learning_rate \(now 0\.001\) or weight_decay \(now 1e\+30\): AdamW scales the "
                                       r"weights by 1 - learning_rate \* weight_decay = -1e\+27 every step\.$"):
    _base.check_trained("SCAN", nan, 1, 1e-3, 1e30)
  with pytest.raises(ValueError, match=r"lower contrastive\.learning_rate \(now 0\.1\)\.$"):
    _base.check_trained("Contrastive", nan, 5, 0.1, 1e-4, prefix="contrastive.")
  with pytest.raises(ValueError, match=r"lower learning_rate \(now 0\.1\)\.$"):
    _base.check_trained("SCAN", {"w": np.ones(3, np.float32)}, 5, 0.1, 1e-4, finite=False)  # a NaN head loss
  _base.check_trained("SCAN", {"w": np.ones(3, np.float32), "step": np.int32(3)}, 5, 0.1, 1e-4)
