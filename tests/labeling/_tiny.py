"""The tiny labeling setting the pipeline tests share (embedded digits, PCA, a small student)."""

from jaxdistill import labeling

TINY_STUDENT = labeling.StudentConfig(widths=(8, 16), epochs=5, batch_size=64, learning_rate=3e-3)
TINY = dict(private_size=1500, public_size=300, eval_size=300, num_queries=20, k=1, representation="pca",
            student=TINY_STUDENT, baselines=False, seed=3)


def tiny(**changes) -> labeling.LabelingConfig:
  """The tiny config with ``changes`` applied."""
  return labeling.LabelingConfig(**{**TINY, **changes})
