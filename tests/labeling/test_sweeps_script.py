"""scripts/labeling_sweeps.py: the budget sweep on a training-only split, at a tiny setting."""

import csv
import importlib.util
import os
import pathlib

import numpy as np

from jaxdistill import data
from jaxdistill import labeling

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "labeling_sweeps.py"


def load_script():
  spec = importlib.util.spec_from_file_location("labeling_sweeps", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_tuning_split_uses_training_images_only_and_is_disjoint():
  sweeps = load_script()
  cfg = labeling.LabelingConfig(dataset="mnist-embedded", public_size=300, eval_size=200, private_size=1000)
  splits = sweeps.tuning_splits(cfg)
  train, _ = data.load_dataset("mnist-embedded")
  flat = train.images.reshape(len(train), -1)
  index = {row.tobytes(): i for i, row in enumerate(flat)}
  rows = {}
  for name in ("private", "public", "evaluation"):
    part = getattr(splits, name)
    rows[name] = {index[r.tobytes()] for r in part.images.reshape(len(part), -1)}
    assert len(rows[name]) == len(part)
  assert (len(rows["private"]), len(rows["public"]), len(rows["evaluation"])) == (1000, 300, 200)
  assert not (rows["private"] & rows["public"]) and not (rows["private"] & rows["evaluation"])
  assert not (rows["public"] & rows["evaluation"])


def test_budget_sweep_writes_gaps_to_the_ceiling(tmp_path):
  sweeps = load_script()
  argv = ["--dataset", "mnist-embedded", "--sweep", "budget", "--values", "1", "--s-grid", "10,20",
          "--tuning-split", "--ceiling", "--student-epochs", "1", "--student-targets", "soft",
          "--student-refine", "1", "--ceiling-seeds", "3", "--student-seeds", "2",
          "--public-size", "300", "--eval-size", "200",
          "--private-size", "1000", "--tag", "t1",
          "--out", str(tmp_path)]
  assert sweeps.main(argv) == 0
  stem = "mnist-embedded_budget_tuning_t1"   # --tag t1 is appended to the file names
  assert sorted(p.name for p in tmp_path.iterdir()) == [f"{stem}.{e}" for e in ("csv", "md", "png")]
  with open(tmp_path / f"{stem}.csv") as f:
    rows = list(csv.DictReader(f))
  assert [int(r["s"]) for r in rows] == [10, 20]
  assert all(float(r["epsilon"]) == 1.0 for r in rows)
  ceiling = float(rows[0]["ceiling"])
  assert 0.0 < ceiling <= 1.0 and all(float(r["ceiling"]) == ceiling for r in rows)
  md = (tmp_path / f"{stem}.md").read_text()
  assert "--tuning-split" in md and "TRAINING images only" in md
  assert f"({os.cpu_count()} CPUs, 1-minute load average " in md
  assert "The same student with 2 other seeds" in md
  table = [line for line in md.splitlines() if line.startswith("| central s=")]
  assert [line.split("|")[1].strip() for line in table] == ["central s=10", "central s=20"]
  header = next(line for line in md.splitlines() if line.startswith("| mechanism |"))
  columns = [c.strip() for c in header.split("|")[1:-1]]
  assert columns[-4:] == ["Acc_pc − ceiling", "Acc_pc, mean of students", "Acc_pc (no noise), mean",
                          "mean − ceiling mean"]
  assert "trains 2 students" in md and "mean of the 3 ceiling students" in md
  for line, r in zip(table, rows):
    cells = [c.strip() for c in line.split("|")[1:-1]]
    np.testing.assert_allclose(float(cells[columns.index("Acc_pc − ceiling")]),
                               100 * (float(r["acc_pc"]) - ceiling), atol=0.006)
    # Two students: the mean is (first + second) / 2, and the first is acc_pc, so the second student's
    # accuracy 2 * mean - acc_pc must be a whole number of the 200 held-out images.
    assert int(r["student_seeds"]) == 2
    for first, mean in ((r["acc_pc"], r["acc_pc_mean"]), (r["noise_free_acc_pc"], r["noise_free_acc_pc_mean"])):
      second = 2 * float(mean) - float(first)
      assert 0.0 <= second <= 1.0
      np.testing.assert_allclose(second * 200, round(second * 200), atol=1e-6)
    # The ceiling mean is over 3 ceiling students, the first of which is the ceiling.
    ceiling_mean = float(r["ceiling_mean"])
    np.testing.assert_allclose(ceiling_mean * 600, round(ceiling_mean * 600), atol=1e-6)
    np.testing.assert_allclose(float(cells[columns.index("mean − ceiling mean")]),
                               100 * (float(r["acc_pc_mean"]) - ceiling_mean), atol=0.006)
  assert (tmp_path / f"{stem}.png").stat().st_size > 0


def test_encoder_options_reach_the_fit_on_the_paper_split(tmp_path, monkeypatch):
  # The paper split is loaded with representation=raw; the encoder options must not travel there
  # (they are refused with a representation that has no encoder).
  sweeps = load_script()
  seen = []
  fit = labeling.fit_first_representation
  monkeypatch.setattr(labeling, "fit_first_representation",
                      lambda cfg, x, **kw: seen.append(cfg) or fit(cfg, x, **kw))
  argv = ["--dataset", "mnist-embedded", "--sweep", "s", "--values", "10", "--representation", "contrastive",
          "--encoder-width", "4", "--encoder-steps", "3", "--student-epochs", "1", "--private-size", "500",
          "--public-size", "300", "--eval-size", "100", "--out", str(tmp_path)]
  assert sweeps.main(argv) == 0
  assert [(c.representation, c.encoder_width, c.encoder_steps) for c in seen] == [("contrastive", 4, 3)]
  assert "--encoder-width 4 --encoder-steps 3" in (tmp_path / "mnist-embedded_s.md").read_text()
