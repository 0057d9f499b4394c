"""Secret noise across releases, and the ledger's checks before any work (embedded digits, tiny settings).

Every run is deterministic (fixed seeds and secret seeds); no statistical test here.
"""

import json

import numpy as np
import pytest

from jaxdistill import data as data_lib
from jaxdistill import labeling
from jaxdistill.labeling import _pipeline
from tests.labeling._tiny import release_then_interrupt, tiny


@pytest.fixture(scope="module")
def splits():
  return labeling.load_splits(tiny())


def _first_votes(cfg, splits):
  return labeling.run_labeling(cfg, splits=splits).private.iterations[0].votes


def test_one_secret_seed_at_two_epsilons_does_not_give_back_the_exact_votes(splits):
  # The same secret noise_seed at epsilon 1 and 2 (no out_dir, or two of them) used to add one Laplace draw at
  # two scales: (b1 v2 - b2 v1) / (b1 - b2) then recovered the exact votes to 1e-14. The noise key now folds in
  # the release settings and the mechanism's input, so the two draws are independent.
  cfg = tiny(mechanism="central", central_noise="laplace", noise_seed=123456789)
  r1 = labeling.run_labeling(cfg.replace(epsilon=1.0, baselines=True), splits=splits)
  r2 = labeling.run_labeling(cfg.replace(epsilon=2.0), splits=splits)
  v1, v2 = r1.private.iterations[0].votes, r2.private.iterations[0].votes
  b1, b2 = r1.plan.noise_parameter, r2.plan.noise_parameter
  exact = r1.noise_free.iterations[0].votes
  assert np.array_equal(r1.private.iterations[0].queries, r2.private.iterations[0].queries)  # same input
  recovered = (b1 * v2 - b2 * v1) / (b1 - b2)
  # With independent draws the combination's error has sd b1 b2 sqrt(2 (1 + 1)) / |b1 - b2| = 4 per entry; over
  # 200 entries its largest is below 1 with probability < 1e-100 (a shared draw gives 3e-14).
  assert np.abs(recovered - exact).max() > 1.0


def test_one_secret_seed_on_two_data_sets_draws_independent_noise(splits):
  # Neighbouring data sets under one secret seed: a shared draw would make the releases' difference the
  # exact difference of their votes.
  cfg = tiny(mechanism="central", epsilon=1.0, noise_seed=987654321, baselines=True)
  priv = splits.private
  labels = priv.labels.copy()
  labels[0] = (labels[0] + 1) % priv.num_classes  # replace-one: one record's label
  other = data_lib.LabelingSplits(data_lib.ImageData(priv.images, labels, priv.num_classes), splits.public,
                                  splits.evaluation)
  r1 = labeling.run_labeling(cfg, splits=splits)
  r2 = labeling.run_labeling(cfg, splits=other)
  exact_diff = r2.noise_free.iterations[0].votes - r1.noise_free.iterations[0].votes
  assert np.abs(exact_diff).sum() == 2  # one vote moved from one label to another
  noisy_diff = r2.private.iterations[0].votes - r1.private.iterations[0].votes
  # Discrete Laplace of scale 2k/epsilon = 2 (p = e^-1/2): two independent draws of one entry are equal with
  # probability ((1-p)/(1+p))^2 (1+p^2)/(1-p^2) = 0.13, all 200 with 0.13^200 (a shared draw: always).
  assert not np.array_equal(noisy_diff, exact_diff)


def test_one_secret_seed_with_the_same_settings_and_data_gives_the_same_release(splits, tmp_path):
  # Reproducible: nothing new is revealed by running the same release twice (another out_dir, or none).
  cfg = tiny(mechanism="central", epsilon=1.0, noise_seed=5)
  a = _first_votes(cfg.replace(out_dir=str(tmp_path / "a")), splits)
  b = _first_votes(cfg, splits)
  c = _first_votes(cfg.replace(noise_seed=6), splits)
  assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_a_missing_release_is_refused_before_the_representation_is_fitted(splits, tmp_path, monkeypatch):
  cfg = tiny(mechanism="central", epsilon=1.0, out_dir=str(tmp_path))
  release_then_interrupt(cfg, splits, monkeypatch)
  (tmp_path / "release-iter1.npz").unlink()  # ledger.json still lists it
  fitted = []
  monkeypatch.setattr(_pipeline, "fit_first_representation", lambda *a, **k: fitted.append(1))
  with pytest.raises(ValueError, match="records a release of iteration 1 but release-iter1.npz is missing"):
    labeling.run_labeling(cfg, splits=splits)
  assert fitted == []  # used to be refused only after the fit (minutes for contrastive or scan)


def test_a_damaged_later_release_is_refused_before_any_fit_or_student(splits, tmp_path, monkeypatch):
  cfg = tiny(mechanism="central", epsilon=2.0, iterations=2, out_dir=str(tmp_path))
  labeling.run_labeling(cfg, splits=splits)
  path = tmp_path / "release-iter2.npz"
  with np.load(path) as z:
    arrays = dict(z)
  arrays["votes"] = np.full_like(arrays["votes"], np.nan)
  np.savez(path, **arrays)
  calls = []
  monkeypatch.setattr(_pipeline, "fit_first_representation", lambda *a, **k: calls.append("fit"))
  monkeypatch.setattr(_pipeline, "train_student", lambda *a, **k: calls.append("student"))
  with pytest.raises(ValueError, match=f"Stored release {path} holds NaN or inf votes"):
    labeling.run_labeling(cfg, splits=splits)
  assert calls == []  # t = 2's file used to be read only after t = 1's student


def test_a_refused_reuse_is_not_recorded_as_reused(splits, tmp_path, monkeypatch):
  cfg = tiny(mechanism="central", epsilon=2.0, out_dir=str(tmp_path))
  release_then_interrupt(cfg, splits, monkeypatch)
  path = tmp_path / "release-iter1.npz"
  with np.load(path) as z:
    arrays = dict(z)
  arrays["assignment"] = np.full_like(arrays["assignment"], -1)
  np.savez(path, **arrays)
  with pytest.raises(ValueError, match=r"assignment outside \[0, 20\)"):
    labeling.run_labeling(cfg, splits=splits)
  runs = json.loads((tmp_path / "ledger.json").read_text())["runs"]
  # The refused run leaves no entry; it used to add ([], [1]), a reuse that never happened.
  assert [(r["released"], r["reused"]) for r in runs] == [([1], [])]


@pytest.mark.parametrize("explicit", [dict(delta=0.0), dict(private_size=3000, public_size=1000, eval_size=1000)])
def test_a_resume_that_spells_out_a_default_reuses_the_release(tmp_path, monkeypatch, explicit):
  # --delta 0 on a central resume, or the embedded set's sizes written out, used to be refused as "other
  # settings" although they are the defaults the first run resolved.
  base = labeling.LabelingConfig(mechanism="central", epsilon=2.0, num_queries=20, representation="pca",
                                 student=tiny().student, baselines=False, out_dir=str(tmp_path))
  base_splits = labeling.load_splits(base)
  release_then_interrupt(base, base_splits, monkeypatch)
  release_then_interrupt(base.replace(**explicit), base_splits, monkeypatch)
  runs = json.loads((tmp_path / "ledger.json").read_text())["runs"]
  assert [(r["released"], r["reused"]) for r in runs] == [([1], []), ([], [1])]
  assert base.replace(delta=1e-9).release_fingerprint() != base.release_fingerprint()  # not the default
  assert base.replace(public_size=999).release_fingerprint() != base.release_fingerprint()


@pytest.mark.parametrize("dataset", ["fashion-mnist", "mnist", "idx", "emnist-digits", "tfds:mnist"])
def test_sizes_at_the_papers_protocol_are_the_default_release(dataset):
  # No data is read: the fingerprint is a function of the settings. Only Fashion-MNIST's defaults were
  # normalised: a resume of the other data sets with a test split that spelled them out was refused.
  base = labeling.LabelingConfig(dataset=dataset, mechanism="central", epsilon=0.1, num_queries=200)
  assert base.replace(public_size=5000, eval_size=5000).release_fingerprint() == base.release_fingerprint()
  assert base.replace(public_size=4000).release_fingerprint() != base.release_fingerprint()
  assert base.replace(private_size=60000).release_fingerprint() != base.release_fingerprint()  # None: all records


@pytest.mark.parametrize("representation,field,value", [("contrastive", "encoder_width", 16),
                                                        ("contrastive", "encoder_steps", 2000),
                                                        ("scan", "encoder_width", 16)])
def test_an_encoder_option_at_its_default_is_the_default_release(representation, field, value):
  from jaxdistill import representations  # pylint: disable=import-outside-toplevel
  default = (representations.ContrastiveConfig() if representation == "contrastive"
             else representations.ScanConfig().contrastive)
  assert getattr(default, field.split("_")[1]) == value  # the value this test assumes is the default
  base = tiny(representation=representation)
  assert base.replace(**{field: value}).release_fingerprint() == base.release_fingerprint()
  assert base.replace(**{field: value + 1}).release_fingerprint() != base.release_fingerprint()


def test_a_shuffle_delta_is_kept_even_at_zero_defaults_elsewhere():
  # Shuffle's default delta depends on n, so an explicit one is always a setting of its own.
  base = tiny(mechanism="shuffle-multi", epsilon=1.0)
  assert base.replace(delta=1e-7).release_fingerprint()["delta"] == 1e-7


@pytest.mark.parametrize("value", [None, [1, 2]])
def test_a_release_record_without_a_settings_object_is_refused_by_name(tmp_path, value):
  ledger = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  ledger.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {})
  path = tmp_path / "release-iter1.npz"
  with np.load(path) as z:
    arrays = dict(z)
  record = json.loads(str(arrays["record"]))
  arrays["record"] = np.asarray(json.dumps({**record, "fingerprint": value}))
  np.savez(path, **arrays)
  with pytest.raises(ValueError, match=r"has no settings record \(its 'fingerprint' is (NoneType|list)"):
    labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")  # was a TypeError or AttributeError


def test_a_ledger_index_entry_with_a_bad_iteration_is_refused_by_name(tmp_path):
  ledger = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  ledger.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {})
  index = json.loads((tmp_path / "ledger.json").read_text())
  index["releases"][0]["iteration"] = [1]
  (tmp_path / "ledger.json").write_text(json.dumps(index))
  with pytest.raises(ValueError, match=r"lists a release of iteration \[1\]; expected an int >= 1"):
    labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")  # was TypeError: unhashable type: 'list', after a release


def test_data_fingerprint_refuses_object_arrays():
  # An object array's bytes are pointers: equal data hashed differently, and a resume was refused as other data.
  with pytest.raises(ValueError, match=r"arrays\[1\] to be a numeric array; got dtype object"):
    labeling.data_fingerprint(np.zeros(3), np.array([1, "a"], dtype=object))
  assert labeling.data_fingerprint(np.arange(3)) == labeling.data_fingerprint(np.arange(3))
