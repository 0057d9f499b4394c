"""The tiny labeling setting the pipeline tests share (embedded digits, PCA, a small student)."""

import pytest

from jaxdistill import labeling
from jaxdistill.labeling import _pipeline

TINY_STUDENT = labeling.StudentConfig(widths=(8, 16), epochs=5, batch_size=64, learning_rate=3e-3)
TINY = dict(private_size=1500, public_size=300, eval_size=300, num_queries=20, k=1, representation="pca",
            student=TINY_STUDENT, baselines=False, seed=3)


def tiny(**changes) -> labeling.LabelingConfig:
  """The tiny config with ``changes`` applied."""
  return labeling.LabelingConfig(**{**TINY, **changes})


class Interrupt(Exception):
  """What a kill during a run stands for in the tests."""


def release_then_interrupt(cfg: labeling.LabelingConfig, splits, monkeypatch) -> None:
  """Runs ``cfg`` until its first release is saved, then stops it (as a kill while the student trains would)."""
  def boom(*args, **kwargs):
    raise Interrupt()

  with monkeypatch.context() as m:
    m.setattr(_pipeline, "train_student", boom)
    with pytest.raises(Interrupt):
      labeling.run_labeling(cfg, splits=splits)
