"""Algorithm 1 end to end on the embedded MNIST digits at tiny settings.

Every run here is deterministic (fixed seeds, integer vote statistics), so
the floors below fail only if the pipeline regresses; each states the margin
it was set with.
"""

import dataclasses
import json
import math
import re

import jax
import numpy as np
import pytest

import jaxdistill
from jaxdistill import _files
from jaxdistill import data as data_lib
from jaxdistill import labeling
from jaxdistill.labeling import _pipeline
from tests.labeling._tiny import release_then_interrupt, tiny


@pytest.fixture(scope="module")
def splits():
  return labeling.load_splits(tiny())


@pytest.fixture(scope="module")
def noise_free(splits):
  return labeling.run_labeling(tiny(mechanism="none", epsilon=math.inf), splits=splits)


def test_noise_free_pipeline_reaches_floor(noise_free):
  it = noise_free.private.final
  # PCA-50 + 20 k-means clusters of 300 digits with 1,500 voters: measured Acc_pl 0.64 at this seed;
  # the floor 0.55 leaves room for BLAS/platform differences in k-means, and chance is 0.1.
  assert it.acc_pl >= 0.55
  # A 5-epoch (8, 16) student on 300 pseudo-labelled digits: measured 0.63; chance is 0.1.
  assert it.acc_pc >= 0.45
  assert it.votes.sum() == 1500  # every private record voted exactly once (k = 1), exact counts
  assert np.array_equal(it.pseudo_labels, it.query_labels[it.assignment])
  assert noise_free.report["privacy"]["statement"]["epsilon"] == "inf"
  codes = [w["code"] for w in noise_free.report["privacy"]["warnings"]]
  assert "no_privacy" in codes


def test_large_noise_destroys_labels(splits, noise_free):
  noisy = labeling.run_labeling(tiny(mechanism="central", epsilon=0.01), splits=splits)
  # eps = 0.01, k = 1: discrete Laplace with a = 0.005 (std ~ 283) on ~75 votes per query, so the
  # argmax is close to uniform: Acc_pl near 0.1. The expected drop from the noise-free 0.64 is ~0.5;
  # we ask for 0.3.
  assert noisy.private.final.acc_pl <= noise_free.private.final.acc_pl - 0.3
  assert noisy.private.final.acc_pl <= 0.35
  st = noisy.report["privacy"]["statement"]
  assert st["epsilon"] == pytest.approx(0.01) and st["delta"] == 0.0 and st["relation"] == "replace-one"
  # Same queries and clusters as the noise-free run (shared first iteration): only the votes differ.
  assert np.array_equal(noisy.private.final.queries, noise_free.private.final.queries)


def test_moderate_noise_keeps_most_labels(splits, noise_free):
  res = labeling.run_labeling(tiny(mechanism="central", epsilon=20.0), splits=splits)
  # eps = 20: noise std ~ 0.14 votes, labels flip only on exact ties: Acc_pl within 0.05 of noise-free.
  assert res.private.final.acc_pl >= noise_free.private.final.acc_pl - 0.05


def test_report_lists_every_setting_and_statement(splits, tmp_path):
  cfg = tiny(mechanism="local-collision", epsilon=4.0, out_dir=str(tmp_path), baselines=True)
  res = labeling.run_labeling(cfg, splits=splits)
  rep = json.loads((tmp_path / "report.json").read_text())
  for key in ("dataset", "mechanism", "epsilon", "delta", "num_queries", "k", "iterations",
              "representation", "seed", "student"):
    assert key in rep["settings"]
  # A local run at T = 1 reads neither the central noise nor the shuffle randomizer nor the student's embedding.
  assert rep["settings"]["central_noise"] is rep["settings"]["shuffle_local"] is None
  assert rep["settings"]["student"]["embedding_dim"] is None and rep["settings"]["pca_dim"] == 50
  for key in ("acc_pl", "acc_pc", "noise_free_acc_pl", "noise_free_acc_pc", "supervised_ceiling_acc_pc"):
    assert isinstance(rep["results"][key], float)
  assert rep["privacy"]["statement"]["relation"] == "replace-one"
  # The caller's splits, not config.dataset (it named the unloaded default, mnist-embedded, for any splits).
  assert rep["data"]["dataset"] == "caller splits"
  codes = {w["code"] for w in rep["privacy"]["warnings"]}
  assert {"baselines_not_private", "noise_from_public_seed"} <= codes
  assert rep["privacy"]["per_iteration"][0]["mechanism"] == "local-collision"
  assert (tmp_path / "accuracy.png").stat().st_size > 1000 and (tmp_path / "labels.png").stat().st_size > 1000
  assert set(rep["timings_s"]) >= {"data", "representation", "private_chain", "ceiling", "total"}
  assert res.ceiling_acc is not None
  results = rep["results"]  # the gaps are what is still missing: reference minus private
  assert results["gap_to_ceiling_pc"] == pytest.approx(results["supervised_ceiling_acc_pc"] - results["acc_pc"])
  assert results["gap_to_noise_free_pc"] == pytest.approx(results["noise_free_acc_pc"] - results["acc_pc"])


def test_ceiling_seeds_keep_the_first_ceiling_and_report_every_draw(splits, tmp_path):
  one = labeling.run_labeling(tiny(mechanism="none", epsilon=math.inf, baselines=True), splits=splits)
  cfg = tiny(mechanism="central", epsilon=2.0, baselines=True, ceiling_seeds=3, out_dir=str(tmp_path))
  three = labeling.run_labeling(cfg, splits=splits)
  assert len(three.ceiling_draws) == 3 and one.ceiling_draws == (one.ceiling_acc,)
  assert three.ceiling_acc == three.ceiling_draws[0] == one.ceiling_acc  # same key for the first draw
  assert len(set(three.ceiling_draws)) > 1  # other seeds give other students
  res = json.loads((tmp_path / "report.json").read_text())["results"]
  assert res["supervised_ceiling_draws"] == list(three.ceiling_draws)
  assert res["supervised_ceiling_mean"] == pytest.approx(np.mean(three.ceiling_draws))
  assert res["gap_to_ceiling_mean_pc"] == pytest.approx(np.mean(three.ceiling_draws) - res["acc_pc"])
  # Not a release setting: a re-run with one ceiling seed reuses the release.
  again = labeling.run_labeling(cfg.replace(ceiling_seeds=1), splits=splits)
  assert again.private.iterations[0].reused
  np.testing.assert_array_equal(again.private.final.votes, three.private.final.votes)


def test_student_seeds_keep_the_first_student_and_report_every_draw(splits, tmp_path):
  cfg = tiny(mechanism="central", epsilon=2.0, iterations=2, baselines=True, ceiling_seeds=3, student_seeds=3,
             out_dir=str(tmp_path))
  three = labeling.run_labeling(cfg, splits=splits)
  final = three.private.final
  assert len(final.acc_pc_draws) == 3 and final.acc_pc_draws[0] == final.acc_pc
  assert len(set(final.acc_pc_draws)) > 1  # other seeds give other students
  assert three.private.iterations[0].acc_pc_draws == (three.private.iterations[0].acc_pc,)  # only the final one
  assert len(three.noise_free.final.acc_pc_draws) == 3
  res = json.loads((tmp_path / "report.json").read_text())["results"]
  assert res["acc_pc_draws"] == list(final.acc_pc_draws)
  assert res["acc_pc_mean"] == pytest.approx(np.mean(final.acc_pc_draws))
  assert res["noise_free_acc_pc_mean"] == pytest.approx(np.mean(three.noise_free.final.acc_pc_draws))
  assert res["gap_of_means_to_ceiling_pc"] == pytest.approx(np.mean(three.ceiling_draws) - res["acc_pc_mean"])
  assert res["gap_of_means_to_noise_free_pc"] == pytest.approx(res["noise_free_acc_pc_mean"] - res["acc_pc_mean"])
  # Post-processing, not a release setting: one seed reuses both releases and gives the first draw again.
  one = labeling.run_labeling(cfg.replace(student_seeds=1, baselines=False, ceiling_seeds=1), splits=splits)
  assert all(it.reused for it in one.private.iterations)
  assert one.private.final.acc_pc_draws == (final.acc_pc,)


def spy_student_keys(monkeypatch, splits) -> list:
  """Records ("ceiling" | "student", key data) for every student the pipeline trains."""
  calls = []
  real = _pipeline.train_student

  def spy(key, config, images, targets, num_classes, **kw):
    is_truth = np.asarray(targets).ndim == 1 and np.array_equal(targets, splits.public.labels)
    calls.append(("ceiling" if is_truth else "student", tuple(np.asarray(jax.random.key_data(key)).tolist())))
    return real(key, config, images, targets, num_classes, **kw)

  monkeypatch.setattr(_pipeline, "train_student", spy)
  return calls


def test_student_draws_are_paired_with_the_ceiling_draws(splits, monkeypatch):
  # At T = 1, private student draw i is initialised and shuffled with the key of ceiling draw i.
  calls = spy_student_keys(monkeypatch, splits)
  cfg = tiny(mechanism="central", epsilon=2.0, baselines=True, ceiling_seeds=3, student_seeds=3)
  labeling.run_labeling(cfg, splits=splits)
  students = [k for who, k in calls if who == "student"]
  ceilings = [k for who, k in calls if who == "ceiling"]
  assert len(students) == 6 and len(ceilings) == 3  # 3 private + 3 noise-free students, 3 ceilings
  assert students[:3] == ceilings and students[3:] == ceilings


def key_tree(data: tuple, depth: int = 3, width: int = 16) -> set:
  """Key data of every key derivable from ``data`` by up to ``depth`` splits or fold_ins with indices < width.

  Covers what train_student and models.fit derive (init and fit keys, epoch keys, their batch and dropout
  keys) without copying their code.
  """
  index = np.arange(width, dtype=np.uint32)
  level, seen = np.asarray([data], np.uint32), set()
  for _ in range(depth):
    keys = jax.random.wrap_key_data(level)
    kids = [jax.vmap(lambda k: jax.random.split(k, 2))(keys), jax.vmap(lambda k: jax.random.split(k, width))(keys),
            jax.vmap(lambda k: jax.vmap(lambda j: jax.random.fold_in(k, j))(index))(keys)]
    level = np.unique(np.concatenate([np.asarray(jax.random.key_data(c)).reshape(-1, 2) for c in kids]), axis=0)
    seen |= set(map(tuple, level.tolist()))
  return seen


def test_no_two_students_of_a_chain_share_a_key(splits, monkeypatch):
  # Draw i once trained from fold_in(student_key, i), the key of draw 0's refinement round i: same
  # initialisation, same batches. Every student of the private chain (3 draws x 3 = first + 2 rounds)
  # now has its own key, and ceiling draw i still shares draw i's first key (the pairing).
  # Refinement round r once trained from fold_in(draw key, r) == split(draw key)[r]: round 1's init and fit
  # keys were keys of round 0's training (key_tree finds that; separate keys are not enough).
  calls = spy_student_keys(monkeypatch, splits)
  student = labeling.StudentConfig(widths=(8, 16), epochs=1, batch_size=64, learning_rate=3e-3, targets="soft",
                                   refine_rounds=2)
  labeling.run_labeling(tiny(mechanism="central", epsilon=2.0, student=student, student_seeds=3, ceiling_seeds=3,
                             baselines=True), splits=splits)
  students = [k for who, k in calls if who == "student"]
  ceilings = [k for who, k in calls if who == "ceiling"]
  private = students[:9]
  assert len(students) == 18 and len(set(private)) == 9
  assert students[9:] == private  # the noise-free chain is paired with the private one
  assert [private[0], private[3], private[6]] == ceilings
  trees = [key_tree(k) | {k} for k in private]
  for a in range(9):
    for b in range(a + 1, 9):
      shared = len(trees[a] & trees[b])
      assert shared == 0, f"students {a} and {b} of the private chain share {shared} derived keys"


def test_student_embedding_key_is_not_one_the_representation_fit_splits_off(splits, monkeypatch):
  # The t >= 2 embedding key was fold_in(rep_key, t); SCAN's fit splits rep_key into three, and
  # split(k, 3)[2] == fold_in(k, 2), so at t = 2 the range finder drew from SCAN's training-step key.
  from jaxdistill.labeling import _student  # pylint: disable=import-outside-toplevel
  seen = []
  real = _student.Student.embedding

  def spy(self, key, public_images):
    seen.append(tuple(np.asarray(jax.random.key_data(key)).tolist()))
    return real(self, key, public_images)

  monkeypatch.setattr(_student.Student, "embedding", spy)
  student = labeling.StudentConfig(widths=(8, 16), epochs=1, batch_size=64, learning_rate=3e-3)
  cfg = tiny(mechanism="central", epsilon=2.0, iterations=3, student=student)
  labeling.run_labeling(cfg, splits=splits)
  rep_key = jax.random.fold_in(jax.random.key(cfg.seed), _pipeline._REP)  # pylint: disable=protected-access
  derived = {tuple(np.asarray(jax.random.key_data(k)).tolist())
             for k in (rep_key, *jax.random.split(rep_key, 8))}
  assert len(seen) == 2 and len(set(seen)) == 2  # t = 2 and t = 3, each its own key
  assert not derived & set(seen)


def test_the_student_embedding_of_d_priv_compiles_once_per_iteration(monkeypatch):
  # Each call of a model embedding compiles afresh (it must: the weights are baked into the trace), and
  # D_priv was embedded in calls of 4,096 images: 15 compilations of the student CNN (1.6 s each here) per
  # iteration on Fashion-MNIST. 4,400 private images (two such calls before) must now take one runner.
  from jaxdistill.labeling import _student  # pylint: disable=import-outside-toplevel
  runners = []
  real = _student.Student.embedding

  def spy(self, key, public_images):
    rep = real(self, key, public_images)
    make = rep._runner  # pylint: disable=protected-access

    def counted():
      runners.append(rep)
      return make()

    object.__setattr__(rep, "_runner", counted)
    return rep

  monkeypatch.setattr(_student.Student, "embedding", spy)
  student = labeling.StudentConfig(widths=(8, 16), epochs=1, batch_size=64, learning_rate=3e-3)
  cfg = tiny(mechanism="none", epsilon=math.inf, iterations=2, private_size=4400, student=student)
  result = labeling.run_labeling(cfg)
  assert len(runners) == 2 and runners[0] is runners[1]  # D_pub once, D_priv once, with the t = 2 embedding
  assert result.private.iterations[1].votes.sum() == 4400  # all of D_priv was embedded and voted


def test_resume_reuses_released_votes_and_never_releases_twice(splits, tmp_path, monkeypatch):
  cfg = tiny(mechanism="central", epsilon=2.0, iterations=2, out_dir=str(tmp_path), noise_seed=11)

  # Run 1 is interrupted while training the first student, i.e. after iteration 1's release.
  release_then_interrupt(cfg, splits, monkeypatch)
  ledger = json.loads((tmp_path / "ledger.json").read_text())
  assert [r["iteration"] for r in ledger["releases"]] == [1]
  with np.load(tmp_path / "release-iter1.npz") as z:
    stored = np.array(z["votes"])

  # Run 2 uses ANOTHER secret noise seed: a fresh draw would differ, the ledger must reuse.
  res = labeling.run_labeling(cfg.replace(noise_seed=12), splits=splits)
  assert res.report["releases"]["reused"] == [1] and res.report["releases"]["released_now"] == [2]
  assert np.array_equal(res.private.iterations[0].votes, stored)
  assert res.private.iterations[0].reused and not res.private.iterations[1].reused
  ledger = json.loads((tmp_path / "ledger.json").read_text())
  assert [r["iteration"] for r in ledger["releases"]] == [1, 2]  # no second release of iteration 1
  assert len(ledger["runs"]) == 2

  # Run 3 reuses both; nothing new is released and the numbers are the same.
  again = labeling.run_labeling(cfg.replace(noise_seed=13), splits=splits)
  assert again.report["releases"]["reused"] == [1, 2] and again.report["releases"]["released_now"] == []
  assert again.private.final.acc_pl == res.private.final.acc_pl
  assert [r["iteration"] for r in json.loads((tmp_path / "ledger.json").read_text())["releases"]] == [1, 2]
  assert (tmp_path / "history" / "report-1.json").exists()  # the earlier report is kept
  assert again.report["releases"]["notes"] == [] and again.private.iterations[1].queries_from_other_student is None
  with np.load(tmp_path / "release-iter2.npz") as z:
    assert json.loads(str(z["record"]))["query_student"] == cfg.student.to_dict() | {"widths": [8, 16]}

  # Run 4 changes the student: both releases are reused as recorded (no budget), but iteration 2's queries were
  # chosen by the earlier student's embedding, which the report used to leave unsaid.
  other = cfg.replace(noise_seed=14, student=dataclasses.replace(cfg.student, epochs=cfg.student.epochs + 1))
  moved = labeling.run_labeling(other, splits=splits)
  assert moved.report["releases"]["reused"] == [1, 2] and moved.report["releases"]["released_now"] == []
  assert moved.private.iterations[0].queries_from_other_student is None  # t = 1: the queries need no student
  assert moved.private.iterations[1].queries_from_other_student["epochs"] == cfg.student.epochs
  [note] = moved.report["releases"]["notes"]
  assert note.startswith("Iteration 2's release was reused as recorded (no new budget)") and "'epochs': 6" in note
  assert moved.report["iterations"][1]["queries_from_other_student"]["epochs"] == cfg.student.epochs

  # Had iteration 1 been released again with seed 12, its votes would have differed.
  fresh = labeling.run_labeling(cfg.replace(noise_seed=12, out_dir=None, iterations=1, epsilon=1.0),
                                splits=splits)
  assert not np.array_equal(fresh.private.iterations[0].votes, stored)

  # Other settings in the same directory: refused before anything is released.
  with pytest.raises(ValueError, match="other settings"):
    labeling.run_labeling(cfg.replace(epsilon=3.0), splits=splits)


def _rewrite_record(path, change):
  """Rewrites the JSON record inside a release file (what another library version could have written)."""
  with np.load(path) as z:
    arrays = {name: z[name] for name in z.files}
  record = json.loads(str(arrays["record"]))
  change(record)
  arrays["record"] = np.asarray(json.dumps(record))
  np.savez(path, **arrays)
  return record


def test_a_release_drawn_under_another_calibration_is_refused_not_restated(splits, tmp_path, monkeypatch):
  # A release stored by a library version that calibrated the same settings differently (here: twice the
  # noise parameter, i.e. epsilon 2 per release) was reused while the report printed this version's analysis.
  cfg = tiny(mechanism="central", epsilon=1.0, iterations=1, out_dir=str(tmp_path))
  first = labeling.run_labeling(cfg, splits=splits)
  path = tmp_path / "release-iter1.npz"
  as_released = json.loads(str(np.load(path)["record"]))

  def older_calibration(record):
    record["privacy"]["epsilon"] *= 2
    record["privacy"]["parameters"]["parameter"] *= 2
    record["budget"]["noise_parameter"] *= 2

  _rewrite_record(path, older_calibration)

  def no_fit(*args, **kwargs):
    raise AssertionError("fitted the representation before comparing the stored privacy")

  with monkeypatch.context() as m:
    m.setattr(_pipeline, "fit_first_representation", no_fit)
    with pytest.raises(ValueError) as err:
      labeling.run_labeling(cfg, splits=splits)
  message = one_line(err)
  for named in ("privacy.epsilon", "privacy.parameters.parameter", "budget.noise_parameter"):
    assert named in message
  assert "Use another --out-dir" in message
  assert [e["iteration"] for e in json.loads((tmp_path / "ledger.json").read_text())["releases"]] == [1]
  # Restored, it is reused, and the re-used iteration states what its record says.
  _rewrite_record(path, lambda record: record.update(as_released))
  again = labeling.run_labeling(cfg, splits=splits)
  assert again.report["releases"]["reused"] == [1]
  assert again.report["iterations"][0]["privacy"] == again.report["releases"]["all"][0]["privacy"]
  assert again.report["iterations"][0]["privacy"] == as_released["privacy"] == first.report["iterations"][0]["privacy"]
  assert as_released["library_version"] == jaxdistill.__version__


def test_balanced_rules_state_no_guarantee_in_every_release_entry(splits, tmp_path):
  # The total statement said epsilon = inf, but each release's entry (ledger record, ledger.json, the report's
  # iterations and per_iteration) stated the finite epsilon the noise was calibrated for.
  cfg = tiny(mechanism="central", epsilon=1.0, iterations=1, connection="balanced-max-min", out_dir=str(tmp_path))
  res = labeling.run_labeling(cfg, splits=splits)
  plan = labeling.plan_budget("central", 1.0, 0.0, 1, k=1)
  with np.load(tmp_path / "release-iter1.npz") as z:
    record = json.loads(str(z["record"]))["privacy"]
  entries = {"record": record,
             "ledger.json": json.loads((tmp_path / "ledger.json").read_text())["releases"][0]["privacy"],
             "iterations": res.report["iterations"][0]["privacy"],
             "per_iteration": res.report["privacy"]["per_iteration"][0]}
  for where, st in entries.items():
    assert (st["epsilon"], st["delta"], st["method"]) == ("inf", 1.0, "no-guarantee"), where
    assert st["parameters"]["nominal_epsilon"] == pytest.approx(plan.epsilon_per_iteration), where
    assert st["parameters"]["nominal_delta"] == 0.0, where
  assert math.isinf(res.private.iterations[0].privacy.epsilon)
  # Nor does any sentence: the composition said "each of T=1 iterations is 1-DP (pure)", and the sampler's
  # warning "each release is (1, 7.8e-13)-DP", beside the no-guarantee headline.
  assert res.report["privacy"]["composition"].startswith("No DP guarantee: connection=balanced-max-min")
  said = [w["message"] for w in res.report["privacy"]["warnings"] + entries["per_iteration"]["warnings"]]
  claims = [m for m in said if re.search(r"\)-DP|-DP \(pure\)", m)]
  assert claims and all(m.startswith("Nominal only (connection=balanced-max-min has no DP guarantee): ")
                        for m in claims), said
  # A release recorded before this (finite epsilon, no nominal_*) was drawn under the same calibration: reused.
  def as_before(rec):
    params = rec["privacy"]["parameters"]
    rec["privacy"].update(epsilon=params.pop("nominal_epsilon"), delta=params.pop("nominal_delta"),
                          method=params.pop("nominal_method"))
  _rewrite_record(tmp_path / "release-iter1.npz", as_before)
  again = labeling.run_labeling(cfg, splits=splits)
  assert again.report["releases"]["reused"] == [1]
  assert again.report["iterations"][0]["privacy"]["epsilon"] == "inf"


def test_a_different_caller_representation_is_refused_on_resume(splits, tmp_path):
  # The caller's representation is not in the release fingerprint: a re-run passing another one reused the
  # stored queries while its noise-free chain clustered with the new embedding.
  proj = np.random.default_rng(0).normal(size=(int(np.prod(splits.public.images.shape[1:])), 16)).astype(np.float32)

  def pixels(images):
    return np.asarray(images, np.float32).reshape(len(images), -1)

  def projected(images):
    return -(pixels(images) @ proj)

  cfg = tiny(mechanism="central", epsilon=1.0, iterations=1, out_dir=str(tmp_path))
  first = labeling.run_labeling(cfg, splits=splits, representation=pixels)
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(cfg, splits=splits, representation=projected)
  assert "other first-iteration queries" in one_line(err) and "another --out-dir" in one_line(err)
  with pytest.raises(ValueError, match="other first-iteration queries"):  # nor the fitted one, which differs too
    labeling.run_labeling(cfg, splits=splits)
  again = labeling.run_labeling(cfg.replace(baselines=True, ceiling_seeds=1), splits=splits, representation=pixels)
  assert again.report["releases"]["reused"] == [1]
  assert np.array_equal(again.private.iterations[0].queries, first.private.iterations[0].queries)
  assert np.array_equal(again.noise_free.iterations[0].queries, first.private.iterations[0].queries)


def test_the_noise_free_chain_resumes_from_the_released_first_queries(splits, tmp_path):
  # On a fresh run both chains share iteration 1's queries; on a resume the noise-free chain recomputed them.
  # The stored queries are relabelled (query j -> s-1-j, same clusters) so a recomputation would show.
  cfg = tiny(mechanism="central", epsilon=1.0, iterations=1, out_dir=str(tmp_path))
  labeling.run_labeling(cfg, splits=splits)
  path = tmp_path / "release-iter1.npz"
  with np.load(path) as z:
    arrays = {name: z[name] for name in z.files}
  s = cfg.num_queries
  arrays["queries"], arrays["assignment"] = arrays["queries"][::-1].copy(), (s - 1) - arrays["assignment"]
  arrays["votes"] = arrays["votes"][::-1].copy()
  np.savez(path, **arrays)
  res = labeling.run_labeling(cfg.replace(baselines=True, ceiling_seeds=1), splits=splits)
  assert res.report["releases"]["reused"] == [1]
  assert np.array_equal(res.private.iterations[0].queries, arrays["queries"])
  assert np.array_equal(res.noise_free.iterations[0].queries, arrays["queries"])
  assert np.array_equal(res.noise_free.iterations[0].assignment, arrays["assignment"])


def test_a_mechanism_bound_is_checked_before_any_fitting(splits, monkeypatch):
  # local-collision's epsilon <= 21.488 was checked by build_mechanism inside the chain, after the fit.
  def no_fit(*args, **kwargs):
    raise AssertionError("fitted the representation before building the mechanism")

  monkeypatch.setattr(_pipeline, "fit_first_representation", no_fit)
  with pytest.raises(ValueError, match=r"epsilon=30.0 <= 21.488"):
    labeling.run_labeling(tiny(mechanism="local-collision", epsilon=30.0), splits=splits)


def test_a_per_iteration_bound_names_the_total_epsilon_and_its_share(splits):
  # With T = 2 the error named only epsilon=5e-201, a value the caller never set.
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(tiny(mechanism="central", epsilon=1e-200, iterations=2), splits=splits)
  message = one_line(err)
  assert message.startswith("Expected epsilon=1e-200 (the total over iterations=2)"), message
  assert "per-iteration share epsilon=5e-201 is refused" in message


# -- bad input: one-line ValueErrors naming the problem ------------------------------
def one_line(err):
  assert "\n" not in str(err.value)
  return str(err.value)


# The sharpened head below puts 90% of D_pub within 1e-6 of another sample, finer than float32 resolves at unit
# norm, so select_queries warns that float32 loses nearest neighbours (true, and harmless here: the cells are the
# argmax clusters, far apart).
@pytest.mark.filterwarnings("ignore:public_features lose nearest neighbours to float32 rounding")
def test_scan_representation_cells_are_its_argmax_clusters(splits, monkeypatch):
  """representation=scan: the pipeline clusters D_pub into s SCAN clusters and uses them as cells."""
  from jaxdistill import representations  # pylint: disable=import-outside-toplevel
  from jaxdistill.labeling import _components  # pylint: disable=import-outside-toplevel
  # The pipeline asks for s = num_queries clusters (captured, not fitted: the default fit takes minutes).
  seen = {}
  monkeypatch.setattr(representations, "fit_representation", lambda key, name, x, **o: seen.update(o, name=name))
  _components.fit_representation(None, "scan", splits.public.images, 50, num_queries=20)
  assert seen == {"name": "scan", "num_clusters": 20}
  monkeypatch.undo()
  # A small clusterer fitted on D_pub, passed in: k-means++ on its probabilities recovers its argmax clusters.
  con = representations.ContrastiveConfig(width=8, feature_dim=64, projection_dim=32, steps=200, batch_size=64)
  scan = representations.fit_scan(jax.random.key(0), splits.public.images,
                                  representations.ScanConfig(num_clusters=10, steps=300, batch_size=128,
                                                             num_neighbours=10, num_heads=1, contrastive=con))
  # Recovery needs a confident head; measured here: mean largest probability 0.77 (0.46 after 100 + 100
  # steps, where only 77% of the samples fall in their argmax cluster's cell).
  images = splits.public.images
  assert scan(images).max(axis=1).mean() >= 0.7
  # At 0.77 the cells were 0.99 pure, but 0.90 with XLA's optimisations off (JAX_DISABLE_MOST_OPTIMIZATIONS=1,
  # whose float rounding trains another head): how confident a head gets is training's business, not the
  # pipeline's. Scaling the head's logits by 20 keeps every argmax and makes it confident by construction.
  params = jax.tree_util.tree_map_with_path(
      lambda path, a: 20.0 * a if any(getattr(k, "key", None) == "head" for k in path) else a, scan.params)
  sharp = dataclasses.replace(scan, params=params)
  argmax = scan.clusters(images)
  assert np.array_equal(sharp.clusters(images), argmax)
  assert sharp(images).max(axis=1).mean() >= 0.95
  res = labeling.run_labeling(tiny(mechanism="none", epsilon=math.inf, num_queries=10, representation="scan"),
                              splits=splits, representation=sharp)
  cells = res.private.final.assignment
  # Same partition up to relabelling: every cell is one argmax cluster. Measured: 1.0 with and without
  # XLA's optimisations.
  purity = sum(np.bincount(argmax[cells == c]).max() for c in np.unique(cells)) / len(cells)
  assert purity >= 0.99 and len(np.unique(cells)) == 10
  assert res.private.final.votes.sum() == 1500
  # The result holds the caller's object (with its .clusters), not the pipeline's checking wrapper around it.
  assert res.representation is sharp


def test_encoder_options_reach_the_contrastive_fit(splits, monkeypatch):
  """encoder_width / encoder_steps change the contrastive encoder (scan: its backbone), nothing else."""
  from jaxdistill import representations  # pylint: disable=import-outside-toplevel
  cfg = tiny(representation="contrastive", encoder_width=4, encoder_steps=3)
  enc = _pipeline.fit_first_representation(cfg, splits.public.images)
  assert (enc.config.width, enc.config.steps) == (4, 3)
  assert dataclasses.replace(enc.config, width=16, steps=2000) == representations.ContrastiveConfig()
  seen = {}
  monkeypatch.setattr(representations, "fit_representation", lambda key, name, x, **o: seen.update(o, name=name))
  _pipeline.fit_first_representation(cfg.replace(representation="scan"), splits.public.images)
  assert seen["num_clusters"] == 20 and seen["contrastive"] == dataclasses.replace(
      representations.ScanConfig().contrastive, width=4, steps=3)
  seen.clear()
  _pipeline.fit_first_representation(tiny(representation="scan"), splits.public.images)
  assert seen == {"name": "scan", "num_clusters": 20}  # unset: the representation's own defaults
  from jaxdistill.labeling import _components  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="learned representations"):  # callers below the config's check
    _components.fit_representation(None, "pca", splits.public.images, 50, encoder={"width": 4})


def test_learned_representations_fit_a_small_public_set(splits, monkeypatch):
  """A D_pub below the contrastive batch (256) or SCAN's 20 neighbours: capped, not refused with a setting the
  pipeline does not expose ("batch_size=256 <= ... m=100")."""
  from jaxdistill import representations  # pylint: disable=import-outside-toplevel
  from jaxdistill.labeling import _components  # pylint: disable=import-outside-toplevel
  images = splits.public.images  # 300
  seen = {}
  monkeypatch.setattr(representations, "fit_representation", lambda key, name, x, **o: seen.update(o, name=name))
  _components.fit_representation(None, "contrastive", images[:100], 50)
  assert seen == {"name": "contrastive", "batch_size": 100}
  seen.clear()
  _components.fit_representation(None, "scan", images[:20], 50, num_queries=5)
  assert seen == {"name": "scan", "num_neighbours": 19, "num_clusters": 5}
  seen.clear()
  _components.fit_representation(None, "contrastive", images, 50)  # 300 >= 256: the defaults, untouched
  assert seen == {"name": "contrastive"}
  monkeypatch.undo()
  enc = _components.fit_representation(jax.random.key(0), "contrastive", images[:100], 50, encoder={"steps": 1})
  assert enc.config.batch_size == 100 and enc(images[:3]).shape[0] == 3


def test_fit_steps_count_every_stage_of_a_learned_fit():
  # The progress bar's total: fit_scan reports the contrastive backbone's steps, then the clustering steps.
  from jaxdistill import representations  # pylint: disable=import-outside-toplevel
  from jaxdistill.labeling import _components  # pylint: disable=import-outside-toplevel
  scan = representations.ScanConfig()
  assert _components.fit_steps("scan") == scan.contrastive.steps + scan.steps
  assert _components.fit_steps("scan", {"steps": 7}) == 7 + scan.steps
  assert _components.fit_steps("contrastive", {"steps": 7}) == 7
  assert _components.fit_steps("contrastive") == representations.ContrastiveConfig().steps
  assert _components.fit_steps("pca") == 0 and _components.fit_steps("hog-pca") == 0


def test_encoder_options_are_release_settings():
  """Unset encoder options stay out of the fingerprint (older ledgers stay valid); set ones are in it."""
  default = tiny(representation="contrastive").release_fingerprint()
  assert not {"encoder_width", "encoder_steps"} & set(default)
  wide = tiny(representation="contrastive", encoder_width=32).release_fingerprint()
  assert wide == {**default, "encoder_width": 32}


@pytest.mark.parametrize("changes,match", [
    ({"encoder_width": 32}, "encoder_width=32 only with a learned representation"),  # representation=pca
    ({"representation": "contrastive", "encoder_steps": 0}, "encoder_steps=0 >= 1"),
    ({"representation": "scan", "encoder_width": 10**6}, "encoder_width=1000000 <= 1024"),
    ({"representation": "contrastive", "encoder_steps": 2.5}, "encoder_steps"),
])
def test_bad_encoder_options(changes, match):
  with pytest.raises(ValueError) as err:
    tiny(**changes)
  assert match in one_line(err)


@pytest.mark.parametrize("changes,match", [
    ({"representation": "hog", "pca_dim": 3}, "pca_dim=3 only with representation pca or hog-pca"),
    ({"mechanism": "local-rr", "central_noise": "laplace"}, "central_noise='laplace' only with mechanism=central"),
    ({"mechanism": "shuffle-multi", "shuffle_local": "rr"}, "shuffle_local='rr' only with mechanism=shuffle-single"),
    ({"mechanism": "none", "epsilon": math.inf, "central_noise": "laplace"}, "got mechanism=none"),
])
def test_settings_a_run_would_ignore_are_refused(changes, match):
  # They were accepted and ignored, yet they are in the release fingerprint: changing one blocked a resume.
  with pytest.raises(ValueError) as err:
    tiny(**changes)
  assert match in one_line(err)
  defaults = {name: getattr(labeling.LabelingConfig, name) for name in ("pca_dim", "central_noise", "shuffle_local")}
  tiny(**{**changes, **defaults})  # the defaults pass anywhere (the CLI always passes them)


@pytest.mark.parametrize("changes,match", [
    ({"epsilon": 2.0}, "got epsilon=2.0"),
    ({"epsilon": math.inf, "delta": 1e-6}, "got delta=1e-06"),
    ({"delta": 0.0}, "got delta=0.0"),
])
def test_mechanism_none_takes_no_privacy_parameter(changes, match):
  # `label --mechanism none --epsilon 2` ran, and the report's settings said epsilon 2.0 beside an (inf, 1)
  # statement: the number meant nothing. The default epsilon now resolves per mechanism.
  with pytest.raises(ValueError, match="no epsilon \\(or inf\\) and no delta with mechanism=none") as err:
    tiny(mechanism="none", **changes)
  assert match in one_line(err)
  assert tiny(mechanism="none").epsilon == math.inf and tiny(mechanism="none", epsilon=math.inf).delta is None
  assert tiny(mechanism="central").epsilon == labeling.DEFAULT_EPSILON == 1.0
  assert tiny(mechanism="central").replace(mechanism="none", epsilon=None).epsilon == math.inf


def test_the_noise_free_chain_runs_beside_a_laplace_release(splits, monkeypatch):
  # The noise-free chain is mechanism "none": it must not keep the central mechanism's own settings.
  chains = []

  class Stop(Exception):
    pass

  def chain(config, *args):
    chains.append(config)
    if len(chains) == 2:
      raise Stop  # the noise-free chain's config was built: nothing more to see
    return None

  monkeypatch.setattr(_pipeline, "_run_chain", chain)
  with pytest.raises(Stop):
    labeling.run_labeling(tiny(mechanism="central", central_noise="laplace", epsilon=1.0, baselines=True),
                          splits=splits)
  assert [(c.mechanism, c.central_noise) for c in chains] == [("central", "laplace"), ("none", "discrete-laplace")]


def test_s_larger_than_public_set():
  with pytest.raises(ValueError) as err:
    labeling.LabelingConfig(public_size=100, num_queries=200)
  assert "num_queries" in one_line(err)
  with pytest.raises(ValueError) as err:  # default embedded D_pub has 1,000 samples
    labeling.run_labeling(labeling.LabelingConfig(num_queries=2000, baselines=False))
  assert "num_queries" in one_line(err) and "1000" in one_line(err)


def test_k_larger_than_s():
  with pytest.raises(ValueError) as err:
    labeling.LabelingConfig(k=5, num_queries=3)
  assert "k=5" in one_line(err)


def test_missing_data_dir(tmp_path):
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(labeling.LabelingConfig(dataset="mnist", data_dir=str(tmp_path / "nope")))
  assert "does not exist" in one_line(err)


@pytest.mark.parametrize("field,label", [("private_size", "private"), ("public_size", "public"),
                                         ("eval_size", "evaluation")])
def test_sizes_that_disagree_with_the_callers_splits_are_refused(splits, field, label, monkeypatch):
  # They were neither checked nor used: the report's settings stated sizes the run never had.
  def no_fit(*args, **kwargs):
    raise AssertionError("fitted the representation before checking the sizes")

  monkeypatch.setattr(_pipeline, "fit_first_representation", no_fit)
  size = len(getattr(splits, label))
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(tiny(**{field: size - 1}), splits=splits)
  assert one_line(err) == (f"Expected {field}={size - 1} to be the size of the caller's {label} split, {size} "
                           f"(leave {field} None when passing splits).")


def test_labels_outside_the_classes(splits):
  bad = data_lib.ImageData(splits.private.images, (splits.private.labels + 3).astype(np.int32), 13)
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(tiny(), splits=data_lib.LabelingSplits(bad, splits.public, splits.evaluation))
  assert "private labels" in one_line(err) and "[0, 10)" in one_line(err)
  with pytest.raises(ValueError) as err:
    data_lib.ImageData(splits.public.images, splits.public.labels + 10, 10)
  assert "labels" in one_line(err)


def test_images_of_the_wrong_shape(splits):
  wide = np.pad(splits.private.images, ((0, 0), (2, 2), (2, 2), (0, 0)))
  bad = data_lib.ImageData(wide, splits.private.labels, 10)
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(tiny(), splits=data_lib.LabelingSplits(bad, splits.public, splits.evaluation))
  assert "private images" in one_line(err) and "(1500, 32, 32, 1)" in one_line(err)
  with pytest.raises(ValueError) as err:
    data_lib.ImageData(splits.public.images[..., 0], splits.public.labels, 10)
  assert "images" in one_line(err)


def test_pixels_on_another_scale(splits):
  with pytest.raises(ValueError, match=r"images in \[0, 1\] \(divide byte pixels by 255\); got range \[0, 255\]"):
    data_lib.ImageData(splits.private.images * 255.0, splits.private.labels, 10)
  # The pipeline checks again what it reads: ImageData's arrays can still be changed in place.
  bytes_scale = data_lib.ImageData(splits.private.images.copy(), splits.private.labels, 10)
  bytes_scale.images[...] *= 255.0
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(tiny(), splits=data_lib.LabelingSplits(bytes_scale, splits.public, splits.evaluation))
  assert "private pixels in [0, 1]" in one_line(err) and "range [0, 255]" in one_line(err)


@pytest.mark.parametrize("field,value,match", [
    ("mechanism", "laplace", "mechanism"), ("epsilon", 0.0, "epsilon"), ("epsilon", math.inf, "epsilon"),
    ("delta", 1.0, "delta"), ("iterations", 0, "iterations"), ("representation", "sift", "representation"),
    ("dataset", "cifar100", "dataset"), ("ceiling_seeds", 0, "ceiling_seeds"),
    ("student_seeds", 0, "student_seeds"),
    ("representation", "scan", "num_queries"),   # with num_queries=1 below
    ("seed", 2**32, "seed=4294967296 <= 4294967295"),  # jax.random.key keeps 32 bits: it would repeat seed 0
    ("noise_seed", 2**64, "noise_seed"), ("noise_seed", -1, "noise_seed"),
    ("iterations", 101, "iterations=101 <= 100"), ("ceiling_seeds", 1001, "ceiling_seeds=1001 <= 1000"),
    ("student_seeds", 1001, "student_seeds=1001 <= 1000"),
    # A bool or a number used to become a folder named "True" or "0".
    ("out_dir", True, "out_dir to be a folder path; got True"), ("out_dir", 0, "out_dir"),
    ("data_dir", False, "data_dir to be a folder path; got False"), ("baselines", "no", "baselines"),
])
def test_bad_settings(field, value, match):
  with pytest.raises(ValueError) as err:
    labeling.LabelingConfig(**{field: value, **({"num_queries": 1, "k": 1} if value == "scan" else {})})
  assert match in one_line(err)


def test_ceiling_seeds_need_the_baselines():
  # Without the baselines no supervised ceiling is trained: ceiling_seeds=3 was accepted and ignored.
  with pytest.raises(ValueError) as err:
    labeling.LabelingConfig(baselines=False, ceiling_seeds=3)
  assert one_line(err) == ("Expected ceiling_seeds=3 only with baselines=True (the supervised ceiling is one of the "
                           "baselines; elsewhere it is ignored); got baselines=False.")
  assert labeling.LabelingConfig(baselines=False).ceiling_seeds == 1
  assert labeling.LabelingConfig(baselines=True, ceiling_seeds=3).ceiling_seeds == 3


def test_a_noise_seed_needs_a_mechanism_that_draws_noise():
  # mechanism none draws no noise: the secret seed was accepted and did nothing.
  with pytest.raises(ValueError) as err:
    labeling.LabelingConfig(mechanism="none", noise_seed=5)
  assert one_line(err) == ("Expected noise_seed=None with mechanism=none: it draws no noise, so a secret seed would "
                           "change nothing.")
  assert labeling.LabelingConfig(mechanism="local-rr", epsilon=1.0, noise_seed=5).noise_seed == 5


def test_the_student_embedding_dim_needs_a_second_iteration():
  # Only iterations t >= 2 embed D_pub with the student: at T = 1 embedding_dim=3 was accepted and ignored.
  student = labeling.StudentConfig(embedding_dim=3)
  with pytest.raises(ValueError) as err:
    labeling.LabelingConfig(student=student)
  assert one_line(err) == ("Expected student.embedding_dim=3 only with iterations >= 2 (the student's embedding "
                           "re-selects the next iteration's queries; elsewhere it is ignored); got iterations=1.")
  assert labeling.LabelingConfig(student=student, iterations=2).student.embedding_dim == 3
  assert labeling.LabelingConfig(student=labeling.StudentConfig(epochs=3)).student.epochs == 3  # the rest: any T


@pytest.mark.parametrize("mechanism,representation,iterations,unread", [
    ("central", "scan", 1, {"shuffle_local", "pca_dim", "student.embedding_dim"}),
    ("shuffle-single", "pca", 2, {"central_noise"}),
    ("local-rr", "hog-pca", 1, {"central_noise", "shuffle_local", "student.embedding_dim"}),
])
def test_the_report_settings_are_null_where_the_run_does_not_read_them(mechanism, representation, iterations, unread):
  # report.json recorded pca_dim 50 for a scan run and shuffle_local collision for a central one: settings the
  # run never read (and that LabelingConfig refuses at other values). Written by hand from the docs: central_noise
  # is read by central, shuffle_local by shuffle-single, pca_dim by pca and hog-pca, the student's
  # embedding_dim from the second iteration on.
  cfg = labeling.LabelingConfig(mechanism=mechanism, representation=representation, iterations=iterations,
                                num_queries=10)
  assert set(cfg.unread_settings()) == unread
  got, full = cfg.report_settings(), cfg.to_dict()
  flat = lambda d: {**{k: v for k, v in d.items() if k != "student"},  # noqa: E731
                    **{f"student.{k}": v for k, v in d["student"].items()}}
  for name, value in flat(full).items():
    assert flat(got)[name] == (None if name in unread else value), name
  assert full["pca_dim"] == 50 and full["student"]["embedding_dim"] == 64  # to_dict (the ledger's) is unchanged


def test_an_empty_data_dir_is_not_given():
  # --data-dir "$UNSET" was refused by label ("a folder path; got ''") while fedmd and load_dataset fell back.
  assert labeling.LabelingConfig(dataset="fashion-mnist", data_dir="").data_dir is None
  with pytest.raises(ValueError, match="'mnist' needs data_dir"):  # as when it is not given
    labeling.run_labeling(labeling.LabelingConfig(dataset="mnist", data_dir=""), progress=False)


def test_an_out_dir_in_use_by_another_run_is_refused_and_freed_after_a_failure(splits, tmp_path):
  # Two runs releasing into one ledger could both find iteration t unreleased and both draw noise for
  # it: the second holder of the folder is refused before any work, and a failed run frees it.
  out = tmp_path / "o"
  cfg = tiny(mechanism="central", epsilon=1.0, out_dir=str(out))
  out.mkdir()
  with _files.claimed_dir("out_dir", out):  # another run, as far as flock is concerned
    with pytest.raises(ValueError, match="used by one run at a time") as err:
      labeling.run_labeling(cfg, splits=splits)
    assert "\n" not in str(err.value)
  assert not list(out.iterdir())  # refused before anything was written

  def broken(images):
    with pytest.raises(ValueError, match="used by one run at a time"):  # held while the run works
      with _files.claimed_dir("out_dir", out):
        pass
    raise RuntimeError("representation failed")

  with pytest.raises(RuntimeError, match="representation failed"):
    labeling.run_labeling(cfg, splits=splits, representation=broken)
  with _files.claimed_dir("out_dir", out):  # the failed run released the lock
    pass


def test_ledger_refuses_when_a_recorded_release_file_is_missing(tmp_path):
  ledger = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  ledger.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {"mechanism": "central"})
  (tmp_path / "release-iter1.npz").unlink()
  again = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  with pytest.raises(ValueError, match="missing"):
    again.lookup(1)
  assert again.lookup(2) is None
  labeling.ReleaseLedger(tmp_path / "x", {"a": 1}, "hash").record(1, np.zeros((2, 3)), np.arange(2),
                                                                   np.zeros(5, np.int64), {})
  with pytest.raises(ValueError, match="other settings"):
    labeling.ReleaseLedger(tmp_path / "x", {"a": 2}, "hash")
  with pytest.raises(ValueError, match="other data"):
    labeling.ReleaseLedger(tmp_path / "x", {"a": 1}, "other-hash")


def test_ledger_refuses_when_the_releases_were_deleted_but_their_traces_remain(tmp_path):
  # `rm out/*` keeps the hidden .ledger-key, and an edited ledger.json may keep its history of runs. Both
  # prove a release was made; a re-run released iteration 1 again (with secret noise: a second independent
  # noisy view of the same votes, i.e. twice the budget).
  ledger = labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "hash")
  ledger.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {})
  ledger.finish()
  for path in (tmp_path / "a").iterdir():  # what `rm out/*` removes: everything but dot files
    if not path.name.startswith("."):
      path.unlink()
  assert [p.name for p in (tmp_path / "a").iterdir()] == [".ledger-key"]
  with pytest.raises(ValueError, match=r"holds \.ledger-key, which is written only with a first release") as err:
    labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "hash").lookup(1)
  assert "\n" not in str(err.value)
  # The file deleted and the ledger's list of releases emptied by hand, its history of runs kept.
  ledger = labeling.ReleaseLedger(tmp_path / "b", {"a": 1}, "hash")
  ledger.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {})
  ledger.finish()
  (tmp_path / "b" / "release-iter1.npz").unlink()
  index = json.loads((tmp_path / "b" / "ledger.json").read_text())
  (tmp_path / "b" / "ledger.json").write_text(json.dumps({**index, "releases": []}))
  again = labeling.ReleaseLedger(tmp_path / "b", {"a": 1}, "hash")
  with pytest.raises(ValueError, match=r"records that an earlier run released iteration 1, but release-iter1\.npz"):
    again.lookup(1)
  with pytest.raises(ValueError, match=r"holds \.ledger-key"):  # no release left at all: none may be made
    again.lookup(2)
  # A fresh directory, and one whose run was refused before releasing, still release.
  fresh = labeling.ReleaseLedger(tmp_path / "c", {"a": 1}, "hash")
  assert fresh.lookup(1) is None
  fresh.finish()
  assert labeling.ReleaseLedger(tmp_path / "c", {"a": 1}, "hash").lookup(1) is None


def test_ledger_refuses_unreadable_or_misplaced_releases(tmp_path):
  # Empty or truncated release files, a ledger.json of the wrong shape, a renamed release and a lost
  # first release beside a second one: one-line ValueErrors, and nothing is released again.
  ledger = labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "hash")
  ledger.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {})
  ledger.record(2, np.ones((2, 3)), np.arange(2), np.zeros(5, np.int64), {})
  good = (tmp_path / "a" / "release-iter1.npz").read_bytes()
  for content in (b"", good[:len(good) // 2]):
    (tmp_path / "a" / "release-iter1.npz").write_bytes(content)
    with pytest.raises(ValueError, match="cannot be read"):
      labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "hash")
  (tmp_path / "a" / "release-iter1.npz").write_bytes(good)
  index = (tmp_path / "a" / "ledger.json").read_text()
  # A hand-edited run entry that is no JSON object used to pass this check and fail in _write_index, after the
  # release was published, with an AttributeError (and again on every re-run).
  edited = json.dumps({**json.loads(index), "runs": ["a note"]})
  for content, match in (("[]", "ledger version"), ('{"version": 1}', "'releases' and 'runs'"),
                         (edited, "'releases' and 'runs'")):
    (tmp_path / "a" / "ledger.json").write_text(content)
    with pytest.raises(ValueError, match=match):
      labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "hash")
  (tmp_path / "a" / "ledger.json").unlink()
  (tmp_path / "a" / "release-iter1.npz").rename(tmp_path / "a" / "release-iter3.npz")
  again = labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "hash")
  with pytest.raises(ValueError, match="release-iter2.npz but not release-iter1.npz"):
    again.lookup(1)
  with pytest.raises(ValueError, match="holds the release of iteration 1, not 3"):
    again.lookup(3)
  assert index  # the original index was readable JSON


@pytest.mark.parametrize("hard_links", [True, False])
def test_two_ledgers_racing_for_one_iteration_release_it_once(tmp_path, monkeypatch, hard_links):
  # Without the out dir's flock (NFS), two ledgers may both find iteration 1 unreleased. record() checked
  # path.exists() and then os.replace()d, so both "released" it and the second file silently replaced the
  # first (and the second key replaced the first, and one ledger.json write dropped the other's). Here B
  # records while A is writing its file: exactly one must win, and nothing may be replaced.
  from jaxdistill.labeling import _ledger
  if not hard_links:  # a file system without hard links: the exclusive-create fallback
    def no_link(src, dst):
      raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(_ledger.os, "link", no_link)
  a = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  b = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  real_savez, outcome = np.savez, {}

  def savez_while_b_records(f, **arrays):
    monkeypatch.setattr(_ledger.np, "savez", real_savez)  # B writes normally
    outcome["B"] = b.record(1, np.full((2, 3), 2.0), np.arange(2), np.zeros(5, np.int64), {"who": "B"})
    real_savez(f, **arrays)

  monkeypatch.setattr(_ledger.np, "savez", savez_while_b_records)
  with pytest.raises(ValueError, match="already exists; refusing to overwrite"):
    a.record(1, np.full((2, 3), 1.0), np.arange(2), np.zeros(5, np.int64), {"who": "A"})
  with np.load(tmp_path / "release-iter1.npz") as z:
    assert np.array_equal(z["votes"], outcome["B"].votes) and json.loads(str(z["record"]))["who"] == "B"
  a.finish()  # A's index, read before B released, is merged with the file on disk, not written over it
  index = json.loads((tmp_path / "ledger.json").read_text())
  assert [e["iteration"] for e in index["releases"]] == [1]
  assert sorted(r["released"] for r in index["runs"]) == [[], [1]]  # both runs kept, only B released
  assert not list(tmp_path.glob(".*.tmp"))
  # One key: B adopted the key A saved first, so the release's keyed data hash checks out for a later run.
  assert labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash").lookup(1).record["who"] == "B"


def test_ledger_stores_a_keyed_hash_of_the_data(tmp_path):
  # A plain sha256 of D_priv in a release file would let anyone holding the file test a candidate data
  # set; the file holds HMAC(key, hash) with a random per-directory key instead.
  ledger = labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "plain-hash")
  stored = ledger.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {})
  assert "plain-hash" not in json.dumps(stored.record) and len(stored.record["data_hash"]) == 64
  other = labeling.ReleaseLedger(tmp_path / "b", {"a": 1}, "plain-hash")
  assert other.data_hash != ledger.data_hash  # another directory, another key
  assert labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "plain-hash").lookup(1) is not None
  (tmp_path / "a" / ".ledger-key").unlink()
  with pytest.raises(ValueError, match="not their key"):
    labeling.ReleaseLedger(tmp_path / "a", {"a": 1}, "plain-hash")


def test_secret_noise_never_reuses_public_seed_votes(splits, tmp_path):
  # The release fingerprint dropped the noise source: a --secret-noise run reused votes whose noise
  # anyone can recompute from the recorded seed, and its report lost the warning.
  cfg = tiny(mechanism="central", epsilon=2.0, out_dir=str(tmp_path))
  labeling.run_labeling(cfg, splits=splits)
  with pytest.raises(ValueError, match="noise_seed"):
    labeling.run_labeling(cfg.replace(noise_seed=123456789), splits=splits)
  from jaxdistill.cli import _label
  assert _label.default_out_dir(cfg.replace(noise_seed=5)) != _label.default_out_dir(cfg)


# -- connection rules: what the statement says ---------------------------------------
def statement_for(**changes):
  cfg = labeling.LabelingConfig(**changes)
  plan = labeling.plan_budget(cfg.mechanism, cfg.epsilon, cfg.resolved_delta(1000), cfg.iterations,
                              k=cfg.num_queries if cfg.connection == "knn-labeling" else cfg.k)
  return labeling.privacy_report(cfg, plan, [None], 1000)


def test_reverse_knn_statement_has_sensitivity_2k():
  rep = statement_for(mechanism="central", epsilon=0.5, k=3, num_queries=20)
  st = rep["statement"]
  assert st["epsilon"] == pytest.approx(0.5) and st["parameters"]["sensitivity_l1"] == 6
  assert rep["connection"]["dp_valid"] and rep["connection"]["per_record"]


def test_knn_labeling_statement_grows_with_s_and_is_central_only():
  rep = statement_for(mechanism="central", epsilon=0.5, k=3, num_queries=20, connection="knn-labeling")
  assert rep["statement"]["parameters"]["sensitivity_l1"] == 40  # 2s, not 2k
  assert "knn_labeling_sensitivity_grows_with_s" in {w["code"] for w in rep["warnings"]}
  with pytest.raises(ValueError, match="knn-labeling"):
    labeling.LabelingConfig(mechanism="local-rr", connection="knn-labeling")


@pytest.mark.parametrize("rule", ["balanced-max-min", "balanced-harmonic"])
@pytest.mark.parametrize("mechanism", ["local-rr", "local-collision", "shuffle-multi", "shuffle-single"])
def test_balanced_rules_are_central_only(rule, mechanism):
  # Like k-NN labeling, a balanced rule routes a record's edges by the other records, so no client can compute
  # them: these configurations ran, with local randomizers fed edges no client could have known.
  with pytest.raises(ValueError, match=f"mechanism=central or none with connection={rule} .*got {mechanism}"):
    labeling.LabelingConfig(mechanism=mechanism, connection=rule, delta=1e-6)
  assert labeling.LabelingConfig(mechanism="central", connection=rule).connection == rule


def test_knn_labeling_k_counts_records_per_query_not_queries():
  # k <= s was applied to every rule, but k-NN labeling's k is records per query (1 <= k <= n).
  cfg = labeling.LabelingConfig(connection="knn-labeling", mechanism="central", num_queries=10, k=50)
  assert cfg.k == 50
  with pytest.raises(ValueError) as err:  # the rules whose k counts queries still refuse it
    labeling.LabelingConfig(connection="reverse-knn", num_queries=10, k=50)
  assert "k=50 <= num_queries (s)=10" in one_line(err)
  with pytest.raises(ValueError) as err:
    labeling.LabelingConfig(connection="knn-labeling", num_queries=10, k=50, private_size=40)
  assert "k=50 <= private_size=40" in one_line(err)


@pytest.mark.parametrize("rule", ["reverse-knn", "balanced-max-min"])
def test_k_equal_to_s_is_refused_where_every_record_would_vote_for_every_query(rule):
  # Accepted: all s vote rows came out equal, every public sample got one label (Acc_pl 0.10), a release spent.
  with pytest.raises(ValueError, match=r"^Expected k=5 < num_queries \(s\)=5: with k = s every record votes for"):
    labeling.LabelingConfig(connection=rule, mechanism="central", num_queries=5, k=5)
  assert labeling.LabelingConfig(connection=rule, mechanism="central", num_queries=5, k=4).k == 4
  assert labeling.LabelingConfig(connection=rule, mechanism="central", num_queries=1, k=1).k == 1  # one cluster
  assert labeling.LabelingConfig(connection="knn-labeling", mechanism="central", num_queries=5, k=5).k == 5


def test_knn_labeling_k_beyond_the_private_records_is_refused_by_name(splits):
  cfg = tiny(connection="knn-labeling", mechanism="central", k=len(splits.private) + 1, private_size=None)
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(cfg, splits=splits)
  assert f"k={len(splits.private) + 1} <= |D_priv|={len(splits.private)}" in one_line(err)


@pytest.mark.parametrize("mechanism,delta,warned", [("central", 0.01, True), ("central", 1e-4, False),
                                                     ("shuffle-multi", 0.01, True), ("local-rr", 0.01, False)])
def test_delta_at_least_1_over_n_is_warned_for_every_mechanism(mechanism, delta, warned):
  # Only shuffle was warned; central with delta >= 1/n said nothing. local-rr composes to delta = 0.
  n = 300
  cfg = labeling.LabelingConfig(mechanism=mechanism, epsilon=1.0, delta=delta)
  plan = labeling.plan_budget(mechanism, 1.0, cfg.resolved_delta(n), 1, k=1)
  rep = labeling.privacy_report(cfg, plan, [None], n)
  codes = {w["code"]: w for w in rep["warnings"]}
  assert ("delta_at_least_1_over_n" in codes) == warned == (plan.composed_delta >= 1 / n)
  if warned:
    assert codes["delta_at_least_1_over_n"]["details"] == {"delta": plan.composed_delta, "one_over_n": 1 / n}


@pytest.mark.parametrize("mechanism,delta", [("central", None), ("local-rr", None), ("local-collision", None),
                                             ("shuffle-single", 1e-6), ("shuffle-multi", 1e-6), ("none", None)])
def test_the_group_privacy_note_inflates_delta_for_approximate_dp(mechanism, delta):
  # The note said "a client holding m records would be m*epsilon-protected" for the shuffle mechanisms too,
  # whose delta grows to m e^((m-1) eps) delta (0.08 at eps = 1, delta = 1e-6, m = 10); and "one message per
  # iteration" for shuffle-multi, which sends several.
  eps = None if mechanism == "none" else 1.0
  rep = statement_for(mechanism=mechanism, epsilon=eps, delta=delta, num_queries=20)
  group = [n for n in rep["notes"] if "group privacy" in n]
  if mechanism == "none":
    assert group == []  # nothing to scale: no guarantee
    return
  [note] = group
  if delta is None:
    assert "(m*epsilon, 0)-DP" in note and "for m = 10, (10, 0)" in note
  else:
    st = rep["statement"]
    assert st["delta"] == pytest.approx(1e-6, rel=1e-12)
    expected = 10 * math.exp(9 * st["epsilon"]) * st["delta"]  # Dwork & Roth's group privacy, k = 10
    assert 0.05 < expected < 0.1 and f"for m = 10, ({10 * st['epsilon']:.6g}, {expected:.3g})" in note
  assert ("several per record" in " ".join(rep["notes"])) == (mechanism == "shuffle-multi")


def test_no_group_privacy_note_without_a_guarantee():
  rep = statement_for(mechanism="central", epsilon=0.5, num_queries=20, connection="balanced-harmonic")
  assert not any("group privacy" in n for n in rep["notes"])


@pytest.mark.parametrize("rule", ["balanced-max-min", "balanced-harmonic"])
def test_balanced_rules_claim_no_guarantee(rule):
  rep = statement_for(mechanism="central", epsilon=0.5, num_queries=20, connection=rule)
  st = rep["statement"]
  assert st["epsilon"] == "inf" and st["method"] == "no-guarantee"
  assert st["parameters"]["nominal_epsilon"] == pytest.approx(0.5)
  # One record can re-route other records' edges: no sensitivity is claimed (not the 2k of reverse k-NN).
  assert st["parameters"]["sensitivity_l1"] is None
  assert "balanced_connection_no_dp" in {w["code"] for w in rep["warnings"]}


def test_report_history_never_overwrites(tmp_path):
  # With only history/report-2.json left (report-1 deleted), numbering by count wrote the old
  # report.json over report-2.json.
  from jaxdistill.labeling._pipeline import _write_report  # pylint: disable=import-outside-toplevel
  (tmp_path / "history").mkdir()
  (tmp_path / "history" / "report-2.json").write_text('{"run": 2}\n')
  (tmp_path / "history" / "report-x.json").write_text('{"run": "x"}\n')
  (tmp_path / "report.json").write_text('{"run": 3}\n')
  _write_report(tmp_path, {"run": 4})
  assert json.loads((tmp_path / "history" / "report-2.json").read_text()) == {"run": 2}
  assert json.loads((tmp_path / "history" / "report-3.json").read_text()) == {"run": 3}
  assert json.loads((tmp_path / "report.json").read_text()) == {"run": 4}


def test_an_interrupted_report_write_leaves_no_partial_report(tmp_path, monkeypatch):
  # report.json was written in place (truncate, then write), after the earlier one had moved to history/: an
  # interrupt mid-write left a truncated report. It is now written to a temporary file, synced, then renamed.
  from jaxdistill.labeling._pipeline import _write_report  # pylint: disable=import-outside-toplevel
  (tmp_path / "report.json").write_text('{"run": 1}\n')

  def interrupted(fd):
    raise KeyboardInterrupt("interrupted before the new report was on disk")

  monkeypatch.setattr(_files.os, "fsync", interrupted)
  with pytest.raises(KeyboardInterrupt):
    _write_report(tmp_path, {"run": 2})
  assert sorted(p.name for p in tmp_path.iterdir()) == ["history"]  # no partial report, no temporary file
  assert json.loads((tmp_path / "history" / "report-1.json").read_text()) == {"run": 1}


def test_an_interrupted_plot_leaves_no_partial_png(tmp_path, monkeypatch):
  # The plots were saved in place too; a PNG cut off mid-write replaced nothing but was left as the plot.
  import matplotlib.figure  # pylint: disable=import-outside-toplevel
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  from jaxdistill.labeling._plots import write_plots  # pylint: disable=import-outside-toplevel

  def half_written(self, target, *args, **kwargs):
    if hasattr(target, "write"):
      target.write(b"\x89PNG partial")
    else:
      with open(target, "wb") as f:
        f.write(b"\x89PNG partial")
    raise KeyboardInterrupt("interrupted mid-write")

  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_written)
  it = SimpleNamespace(iteration=1, acc_pl=0.5, acc_pc=0.5)
  result = SimpleNamespace(config=tiny(), private=SimpleNamespace(iterations=[it]), noise_free=None,
                           ceiling_acc=None, report={"privacy": {"statement": {"epsilon": 1.0}},
                                                     "data": {"dataset": "mnist-embedded"}})
  with pytest.raises(KeyboardInterrupt):
    write_plots(result, tmp_path)
  assert not list(tmp_path.iterdir())


def plot_titles(tmp_path, monkeypatch, result) -> list[str]:
  """The titles of the plots ``write_plots`` saves for ``result`` (nothing is drawn to a file)."""
  import matplotlib.figure  # pylint: disable=import-outside-toplevel
  from jaxdistill.labeling._plots import write_plots  # pylint: disable=import-outside-toplevel
  titles = []

  def record(self, target, *args, **kwargs):
    titles.extend(ax.get_title() for ax in self.axes if ax.get_title())
    target.write(b"png")

  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
  write_plots(result, tmp_path)
  return titles


def test_the_accuracy_plot_states_the_reports_epsilon(splits, tmp_path, monkeypatch):
  # A balanced rule has no guarantee (the report says epsilon = inf), but the title said "eps=1 (total)", the
  # configured epsilon.
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  cfg = tiny(mechanism="central", epsilon=1.0, connection="balanced-max-min")
  votes = np.eye(splits.public.num_classes)[np.arange(cfg.num_queries) % splits.public.num_classes] * 5.0
  assignment = np.arange(len(splits.public)) % cfg.num_queries
  it = SimpleNamespace(iteration=1, acc_pl=0.5, acc_pc=0.5, votes=votes,
                       pseudo_labels=votes.argmax(1)[assignment])
  for epsilon, title in (("inf", "no DP guarantee"), (0.5, "eps=0.5 (total)")):
    report = {"privacy": {"statement": {"epsilon": epsilon}}, "data": {"dataset": "mnist-embedded"}}
    result = SimpleNamespace(config=cfg, private=SimpleNamespace(iterations=[it]), noise_free=None,
                             ceiling_acc=None, report=report, splits=splits)
    assert plot_titles(tmp_path, monkeypatch, result)[0] == f"mnist-embedded: s=20, k=1, {title}"
  # The data set named is the report's, not config.dataset (a caller's splits are not config.dataset).
  result.report["data"]["dataset"] = "caller splits"
  assert plot_titles(tmp_path, monkeypatch, result)[0].startswith("caller splits: ")


def test_a_history_file_in_the_out_dir_is_refused_before_any_work(tmp_path, monkeypatch):
  # A report already in out_dir moves to history/ at the end of the run; a *file* named history used to
  # make that move fail after all the work, losing the new report.
  (tmp_path / "history").write_text("not a folder")
  def no_data(*args, **kwargs):
    raise AssertionError("loaded data before checking out_dir")
  monkeypatch.setattr(_pipeline, "load_splits", no_data)
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(tiny(out_dir=str(tmp_path)))
  assert "no file named 'history'" in one_line(err)


def test_student_settings_are_bounded_and_widths_may_be_an_array():
  with pytest.raises(ValueError, match=r"epochs=1099511627776 <= 1000000"):
    labeling.StudentConfig(epochs=2**40)  # found only after the release, by the training loop
  assert labeling.StudentConfig(widths=np.array([16, 32])).widths == (16, 32)
  assert labeling.LabelingConfig(baselines=np.bool_(False)).baselines is False
  with pytest.raises(ValueError, match="config to be a StudentConfig; got dict"):
    labeling.train_student(jax.random.key(0), {"epochs": 1}, np.zeros((4, 8, 8, 1), np.float32),
                           np.zeros(4, np.int32), 2)


def test_plan_budget_bounds_the_iterations_by_name():
  # shuffle-multi at T = 20000 said "Expected count=20000 <= 10000"; central at T = 10^9 hung.
  for mechanism in ("shuffle-multi", "central"):
    with pytest.raises(ValueError, match="iterations=20000 <= 10000"):
      labeling.plan_budget(mechanism, 1.0, 1e-6, 20000, k=1)
  # A plan for more iterations than a run takes (100) is a question the planner answers (it was refused at 101):
  # T-fold basic composition of eps / T pure-DP steps is eps, and the PLD's optimal composition is not looser.
  for t in (101, 10_000):
    plan = labeling.plan_budget("central", 1.0, 1e-6, t, k=1)
    assert plan.iterations == t and plan.composed_epsilon <= 1.0 + 1e-9


def test_run_labeling_flags_must_be_bools(splits):
  for flag in ("progress", "write_files"):
    with pytest.raises(ValueError, match=f"Expected {flag} to be a bool, got 'no'"):
      labeling.run_labeling(tiny(), splits=splits, **{flag: "no"})


def test_splits_need_image_data_two_classes_and_a_channel(splits):
  with pytest.raises(ValueError, match="evaluation split to be a jaxdistill.data.ImageData; got str"):
    labeling.check_splits(data_lib.LabelingSplits(splits.private, splits.public, "eval"))
  parts = (splits.private, splits.public, splits.evaluation)
  # One class: the release went through, then the plots failed after it, on every re-run.
  one = [data_lib.ImageData(p.images, np.zeros(len(p), np.int32), 1) for p in parts]
  with pytest.raises(ValueError, match="at least 2 classes; the public split has 1"):
    labeling.check_splits(data_lib.LabelingSplits(*one))
  with pytest.raises(ValueError, match=r"H, W, C >= 1; got \(\d+, 28, 28, 0\)"):  # ImageData refuses 0 channels now
    data_lib.ImageData(splits.private.images[..., :0], splits.private.labels, 10)


def test_callers_splits_must_keep_private_records_out_of_d_pub_and_d_eval(splits):
  # Caller-supplied splits were not checked: D_pub (released whole) or D_eval could hold D_priv records.
  priv, pub, ev = splits.private, splits.public, splits.evaluation
  leaky_pub = data_lib.ImageData(np.concatenate([pub.images[:-2], priv.images[5:7]]), pub.labels, pub.num_classes)
  leaky_ev = data_lib.ImageData(np.concatenate([ev.images[:-1], priv.images[:1]]), ev.labels, ev.num_classes)
  for public, evaluation, counts in ((leaky_pub, ev, "2 public and 0 evaluation"),
                                     (pub, leaky_ev, "0 public and 1 evaluation")):
    with pytest.raises(ValueError) as err:
      labeling.run_labeling(tiny(), splits=data_lib.LabelingSplits(priv, public, evaluation))
    assert one_line(err).startswith(f"Expected splits whose public and evaluation images are not private records; "
                                    f"{counts} images are also in the private split")
  # Nor D_pub images in D_eval: the student trains on D_pub (Acc_pc was measured partly on its training images).
  seen_ev = data_lib.ImageData(np.concatenate([ev.images[:-3], pub.images[:3]]), ev.labels, ev.num_classes)
  with pytest.raises(ValueError) as err:
    labeling.check_splits(data_lib.LabelingSplits(priv, pub, seen_ev))
  assert one_line(err) == (f"Expected evaluation images that are not public images; 3 of the {len(ev)} evaluation "
                           "images are also in the public split, on which the student trains.")
  assert labeling.check_splits(splits) == 10


def test_a_callers_representation_output_is_checked_by_name(splits):
  extra_row = lambda x: np.zeros((len(x) + 1, 3), np.float32)  # noqa: E731
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(tiny(mechanism="none", epsilon=math.inf), splits=splits, representation=extra_row)
  assert "representation to return [300, d] features for 300 images; got shape (301, 3)" in one_line(err)
  with pytest.raises(ValueError, match="representation to return a real array"):
    labeling.run_labeling(tiny(mechanism="none", epsilon=math.inf), splits=splits,
                          representation=lambda x: np.full((len(x), 3), "a"))
  # A list of float rows is a real array: it is used (it was a TypeError deep in the query selection).
  flat = lambda x: np.asarray(x, np.float32).reshape(len(x), -1)[:, ::40].tolist()  # noqa: E731
  images = splits.public.images[:7]
  out = _pipeline._checked_embedding(flat)(images)  # pylint: disable=protected-access
  assert out.shape == (7, 20) and np.array_equal(out, np.asarray(flat(images)))


@pytest.mark.parametrize("damage,match", [
    ("assignment=-1", r"assignment outside \[0, 20\) \(range \[-1, -1\]\)"),  # wrapped around: Acc_pl 0.09
    ("assignment=999", r"assignment outside \[0, 20\)"),                        # an IndexError traceback
    ("votes=nan", "NaN or inf votes"),                                             # NaN won argmax silently
    ("queries=3", r"queries \(3,\)"),                                              # accepted
    ("queries=-5", r"queries outside \[0, 300\)"),
])
def test_a_damaged_stored_release_is_refused_and_kept(splits, tmp_path, monkeypatch, damage, match):
  cfg = tiny(mechanism="central", epsilon=2.0, out_dir=str(tmp_path))

  release_then_interrupt(cfg, splits, monkeypatch)  # released, then interrupted: no student needed here
  path = tmp_path / "release-iter1.npz"
  with np.load(path) as z:
    arrays = dict(z)
  name, value = damage.split("=")
  arrays[name] = (np.full_like(arrays[name], float(value)) if value != "3" else arrays[name][:3])
  np.savez(path, **arrays)
  before = path.read_bytes()
  with pytest.raises(ValueError) as err:
    labeling.run_labeling(cfg, splits=splits)
  assert f"Stored release {path}" in one_line(err) and re.search(match, one_line(err)), one_line(err)
  assert path.read_bytes() == before  # it may record budget already spent: never overwritten


def test_ledger_api_refuses_bad_arguments_by_name(tmp_path):
  with pytest.raises(ValueError, match="out_dir to be a folder path; got None"):
    labeling.ReleaseLedger(None, {"a": 1}, "hash")
  with pytest.raises(ValueError, match="fingerprint to hold JSON values only"):
    labeling.ReleaseLedger(tmp_path, {"a": object()}, "hash")
  with pytest.raises(ValueError, match="data_hash to be a non-empty str"):
    labeling.ReleaseLedger(tmp_path, {"a": 1}, None)
  ledger = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  good = (np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {})
  for args, match in [(("3", *good), "iteration to be an int >= 1; got '3'"),
                      ((True, *good), "iteration to be an int >= 1; got True"),
                      ((0, *good), "iteration to be an int >= 1; got 0"),
                      ((1, np.zeros(3), *good[1:]), r"votes to be a finite real \[s, \|Y\|\] array"),
                      ((1, np.full((2, 3), np.nan), *good[1:]), "with NaN or inf"),
                      ((1, good[0], np.arange(2.0), *good[2:]), "queries to be a 1-D integer array"),
                      ((1, *good[:3], None), "record to be a dict; got NoneType"),
                      ((1, *good[:3], {"x": object()}), "record to hold JSON values only")]:
    with pytest.raises(ValueError, match=match):
      ledger.record(*args)
  assert not list(tmp_path.glob("release-iter*")) and not (tmp_path / ".ledger-key").exists()
  with pytest.raises(ValueError, match="iteration to be an int >= 1; got '1'"):
    ledger.lookup("1")


def test_an_rbg_default_prng_still_gives_threefry_keys(splits, monkeypatch):
  # Under JAX_DEFAULT_PRNG_IMPL=rbg the pipeline's root key was an rbg key, and a local mechanism's votes,
  # drawn by simulation.simulate, were refused midway ("Expected key to be a threefry2x32 key") after the
  # representation had been fitted. The roots are now threefry keys whatever the default.
  impls = []

  class Stop(Exception):
    pass

  fit = _pipeline.components.fit_representation
  def spy_fit(key, *args, **kwargs):
    impls.append(("fit", str(jax.random.key_impl(key))))
    return fit(key, *args, **kwargs)

  def spy_simulate(key, *args, **kwargs):
    impls.append(("votes", str(jax.random.key_impl(key))))
    raise Stop

  monkeypatch.setattr(_pipeline.components, "fit_representation", spy_fit)
  monkeypatch.setattr(_pipeline, "simulate", spy_simulate)
  old = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", "rbg")
  try:
    with pytest.raises(Stop):
      labeling.run_labeling(tiny(mechanism="local-rr", epsilon=2.0), splits=splits)
  finally:
    jax.config.update("jax_default_prng_impl", old)
  threefry = str(jax.random.key_impl(jax.random.key(0, impl="threefry2x32")))
  assert impls == [("fit", threefry), ("votes", threefry)]


# -- audit: what the pipeline builds, labels and reports ----------------------------------
def test_each_iteration_mechanism_is_built_with_its_share_of_the_budget():
  # build_mechanism reads plan.epsilon_per_iteration and plan.delta_per_iteration; no pipeline test ran a
  # shuffle mechanism, so its delta (the total, not delta/(2T)) and its n went unchecked, and so did the
  # Laplace plan's epsilon_per_iteration (only its noise_parameter was checked private).
  from jaxdistill import mechanisms  # pylint: disable=import-outside-toplevel
  # eps_t != 1: b = 2k/eps_t is no fixed point of 2k -> 4k^2/b. delta = 0.01: the multi-message plan calibrates
  # in 10 s (20 s at 1e-6), and the shuffle audits plan the same budget.
  eps, delta, t, n, s, k = 1.0, 0.01, 2, 1500, 20, 2
  shape = mechanisms.BsvsShape(s, 10, k)
  for noise in ("discrete-laplace", "laplace"):
    cfg = labeling.LabelingConfig(mechanism="central", central_noise=noise, epsilon=eps, delta=delta, iterations=t,
                                  num_queries=s, k=k)
    plan = labeling.plan_budget("central", eps, delta, t, k=k, central_noise=noise)
    mech = _pipeline.build_mechanism(cfg, plan, shape, n)
    # The noise the plan calibrated (checked private in test_budget): a = eps_t / 2k, b = 2k / eps_t.
    got = mech.parameter if noise == "discrete-laplace" else mech.scale
    assert got == pytest.approx(plan.noise_parameter, rel=1e-9), noise
  for name in ("local-rr", "local-collision"):
    cfg = labeling.LabelingConfig(mechanism=name, epsilon=eps, iterations=t, num_queries=s, k=k)
    mech = _pipeline.build_mechanism(cfg, labeling.plan_budget(name, eps, 0.0, t, k=k), shape, n)
    assert mech.epsilon == pytest.approx(eps / t, rel=1e-12)  # pure epsilons add
  for name, local in (("shuffle-single", "rr"), ("shuffle-multi", None)):
    extra = {"shuffle_local": local} if local else {}
    cfg = labeling.LabelingConfig(mechanism=name, epsilon=eps, delta=delta, iterations=t, num_queries=s, k=k, **extra)
    plan = labeling.plan_budget(name, eps, delta, t, k=k)
    mech = _pipeline.build_mechanism(cfg, plan, shape, n)
    st = mech.privacy()
    # Each release gets delta / (2T) (the plan's split), amplified over every private record (n = |D_priv|).
    assert st.delta <= delta / (2 * t) * (1 + 1e-9) and st.epsilon <= plan.epsilon_per_iteration * (1 + 1e-9)
    assert mech.num_clients == n and mech.shape == shape
    if local:
      assert mech.local == local


def test_a_multi_message_plan_composed_exactly_checks_the_mechanism_it_composed(monkeypatch):
  # A pld-multi-message plan composed the PLD of the noise calibrated at its share and kept delta * 1e-3 for the
  # sampler's total-variation term, which needs n: build_mechanism checks the noise and the term.
  from jaxdistill import accounting, mechanisms  # pylint: disable=import-outside-toplevel
  eps, delta, t, n, k = 1.0, 0.01, 2, 6, 2
  shape = mechanisms.BsvsShape(3, 2, k)
  cfg = labeling.LabelingConfig(mechanism="shuffle-multi", epsilon=eps, delta=delta, iterations=t, num_queries=3, k=k)
  plan = labeling.plan_budget("shuffle-multi", eps, delta, t, k=k)
  assert plan.method == "pld-multi-message"
  mech = _pipeline.build_mechanism(cfg, plan, shape, n)
  assert mech.noise == accounting.calibrate_multi_message(plan.epsilon_per_iteration, delta / 4, k=k)
  room = delta * labeling.MULTI_MESSAGE_TV_RESERVE / (t * (1 + math.exp(plan.composed_epsilon)))
  for factor, fails in ((0.99, False), (1.01, True)):
    monkeypatch.setattr(mechanisms.ShuffleMultiMessage, "sampler_tv_bound", lambda self, tv=factor * room: tv)
    if fails:
      with pytest.raises(ValueError, match=r"total-variation term .* <= delta \* 0.001 = 1e-05, the share the plan "
                                           r"kept for it; with num_clients=6"):
        _pipeline.build_mechanism(cfg, plan, shape, n)
    else:
      assert _pipeline.build_mechanism(cfg, plan, shape, n).noise.rho >= mech.noise.rho
  monkeypatch.undo()
  # Noise other than the one composed (here: a plan whose noise had more DLap noise) is refused.
  less = dataclasses.replace(mech.noise, p=mech.noise.p ** 0.5)
  monkeypatch.setattr(_pipeline, "multi_message_plan_noise", lambda *args: less)
  with pytest.raises(ValueError, match="to be the planned"):
    _pipeline.build_mechanism(cfg, plan, shape, n)


def test_a_clone_plan_is_refused_for_an_n_at_which_its_composition_does_not_hold():
  # A pld-clone plan composed the clone pair at the n it was given; the mechanism calibrates eps0 from the share
  # and its own n. The same n gives the same eps0 (the same calculation), so the plan's epsilon holds.
  from jaxdistill import accounting, mechanisms  # pylint: disable=import-outside-toplevel
  eps, delta, t = 1.0, 1e-6, 2
  shape = mechanisms.BsvsShape(3, 2, 1)
  cfg = labeling.LabelingConfig(mechanism="shuffle-single", epsilon=eps, delta=delta, iterations=t, num_queries=3,
                                k=1)
  plan = labeling.plan_budget("shuffle-single", eps, delta, t, k=1, num_clients=1000)
  assert plan.method == "pld-clone"
  mech = _pipeline.build_mechanism(cfg, plan, shape, 1000)
  assert mech.eps0 == accounting.shuffle_local_epsilon(plan.epsilon_per_iteration, 1000, delta / 4).eps0
  # At n = 500 the share calibrates eps0 = 1.84, whose two releases compose to 1.0002 > the planned 0.9995.
  with pytest.raises(ValueError, match=r"Expected the plan's num_clients to be the mechanism's num_clients=500: at "
                                       r"that n, T=2 releases at eps0=1.84\d* compose to epsilon=1.000\d* > the "
                                       r"planned 0.999"):
    _pipeline.build_mechanism(cfg, plan, shape, 500)


def test_shuffle_single_over_two_iterations_composes_the_clone_pair_at_the_run_s_n(splits):
  # run_labeling gives plan_budget its n (|D_priv|), so shuffle-single over T = 2 composes the clone pair's PLD;
  # the report states the composed total and each release's eps0 at that n.
  from jaxdistill import accounting  # pylint: disable=import-outside-toplevel
  res = labeling.run_labeling(tiny(mechanism="shuffle-single", epsilon=4.0, delta=1e-5, iterations=2),
                              splits=splits)
  privacy = res.report["privacy"]
  budget, n = privacy["budget"], len(splits.private)
  assert budget["method"] == "pld-clone" and "clone reduction's pair PLD" in privacy["composition"]
  assert 4.0 * (1 - 1e-3) <= budget["composed_epsilon"] <= 4.0 and budget["composed_delta"] == 1e-5
  assert (privacy["statement"]["epsilon"], privacy["statement"]["delta"]) == (budget["composed_epsilon"], 1e-5)
  assert budget["epsilon_per_iteration"] > 4.0  # each release alone at delta / 4: 4.08 here (3.79 composed at 4.0)
  eps0 = accounting.shuffle_local_epsilon(budget["epsilon_per_iteration"], n, 1e-5 / 4).eps0
  for per in privacy["per_iteration"]:
    assert per["parameters"]["n"] == n and per["parameters"]["eps0"] == eps0
  composed = accounting.clone_pld(eps0, n).self_compose(2)
  assert composed.get_delta_for_epsilon(budget["composed_epsilon"]) <= 1e-5


def test_query_labels_break_ties_to_the_smallest_label_and_acc_pl_counts_all_of_d_pub(splits, monkeypatch):
  # Every row of the released votes is given a tie for its maximum between a smaller and a larger label:
  # the query's label is the smallest one (module docstring), every public sample inherits the label of its
  # cluster's query, and Acc_pl is the fraction of all of D_pub (not of the queries) labelled correctly.
  real = _pipeline.simulate
  released = []

  def tied(key, mech, inputs):
    votes = np.array(real(key, mech, inputs).estimate, np.float64)
    top = votes.max(axis=1)
    last = votes.shape[1] - 1
    for j in range(votes.shape[0]):
      if votes[j, last] == top[j]:
        votes[j, 0] = top[j]
      else:
        votes[j, last] = top[j]
    released.append(votes)
    return type("Released", (), {"estimate": votes})()

  monkeypatch.setattr(_pipeline, "simulate", tied)
  res = labeling.run_labeling(tiny(mechanism="central", epsilon=2.0), splits=splits)
  it = res.private.final
  [votes] = released
  np.testing.assert_array_equal(it.votes, votes)
  want = np.array([min(y for y in range(votes.shape[1]) if votes[j, y] == votes[j].max())
                   for j in range(votes.shape[0])])
  np.testing.assert_array_equal(it.query_labels, want)
  pseudo = np.array([want[c] for c in it.assignment])
  np.testing.assert_array_equal(it.pseudo_labels, pseudo)
  labels = splits.public.labels
  assert it.acc_pl == sum(int(pseudo[i] == labels[i]) for i in range(len(labels))) / len(labels)
  # The queries alone would give another number on this split (guards the check above).
  assert it.acc_pl != np.mean(want == labels[it.queries])


def test_later_iterations_embed_with_a_d_pub_only_student_and_draw_fresh_noise(splits, monkeypatch):
  # t >= 2: the student's embedding (its PCA) must be fitted on D_pub, never D_priv (Q would then depend on
  # D_priv outside the releases), and each release must draw its own noise: the same noise in two releases
  # is not the composition the plan accounts.
  from jaxdistill import mechanisms  # pylint: disable=import-outside-toplevel
  from jaxdistill.labeling import _student  # pylint: disable=import-outside-toplevel
  fitted_on, noises = [], []
  real_embedding, real_simulate = _student.Student.embedding, _pipeline.simulate

  def spy_embedding(self, key, public_images):
    fitted_on.append(public_images)
    return real_embedding(self, key, public_images)

  def spy_simulate(key, mech, inputs):
    out = real_simulate(key, mech, inputs)
    noises.append(np.asarray(out.estimate) - np.asarray(mechanisms.bsvs_counts(inputs, mech.shape)))
    return out

  monkeypatch.setattr(_student.Student, "embedding", spy_embedding)
  monkeypatch.setattr(_pipeline, "simulate", spy_simulate)
  student = labeling.StudentConfig(widths=(8, 16), epochs=1, batch_size=64, learning_rate=3e-3)
  labeling.run_labeling(tiny(mechanism="central", epsilon=2.0, iterations=3, student=student), splits=splits)
  assert len(fitted_on) == 2 and all(images is splits.public.images for images in fitted_on)
  assert len(noises) == 3 and all(np.any(a != 0) for a in noises)
  for a in range(3):
    for b in range(a + 1, 3):
      assert not np.array_equal(noises[a], noises[b]), (a, b)


def test_a_resume_on_other_private_labels_or_public_images_is_refused(splits, tmp_path):
  # The data hash must cover D_priv's labels (they are what is voted) and D_pub (the stored queries and
  # clusters index it): a resume on other data would reuse votes about other data.
  cfg = tiny(mechanism="central", epsilon=2.0, out_dir=str(tmp_path))
  labeling.run_labeling(cfg, splits=splits)
  priv, pub = splits.private, splits.public
  relabelled = data_lib.ImageData(priv.images, (priv.labels + 1) % priv.num_classes, priv.num_classes)
  repixelled = data_lib.ImageData(pub.images[:, :, ::-1].copy(), pub.labels, pub.num_classes)
  for other in (data_lib.LabelingSplits(relabelled, pub, splits.evaluation),
                data_lib.LabelingSplits(priv, repixelled, splits.evaluation)):
    with pytest.raises(ValueError, match="about other data"):
      labeling.run_labeling(cfg, splits=other)
  assert labeling.run_labeling(cfg, splits=splits).report["releases"]["reused"] == [1]


@pytest.mark.parametrize("changes", [dict(representation="hog-pca"), dict(seed=4), dict(pca_dim=20),
                                     dict(num_queries=30), dict(k=2), dict(iterations=2), dict(epsilon=3.0),
                                     dict(connection="balanced-max-min"), dict(central_noise="laplace"),
                                     dict(noise_seed=7), dict(private_size=1400)])
def test_the_release_fingerprint_holds_every_setting_a_release_depends_on(changes):
  # Queries (representation, pca_dim, seed, s), edges (k, connection), noise (epsilon, noise source) and data
  # all shape the release; a resume that differs in one of them must be refused, not reuse the votes.
  base = tiny(mechanism="central", epsilon=2.0)
  assert base.replace(**changes).release_fingerprint() != base.release_fingerprint()


def test_the_release_fingerprint_ignores_post_processing_settings():
  base = tiny(mechanism="central", epsilon=2.0)
  other = base.replace(out_dir="elsewhere", baselines=True, ceiling_seeds=3, student_seeds=2,
                       student=dataclasses.replace(base.student, epochs=9))
  assert other.release_fingerprint() == base.release_fingerprint()


def test_the_total_statement_is_the_composition_not_one_iteration():
  # The report's headline (epsilon, delta) covers all T releases: for pure central T x eps/T = eps, for
  # shuffle the total delta (not delta/(2T)) and an epsilon near the total.
  cfg = labeling.LabelingConfig(mechanism="central", epsilon=1.0, iterations=4)
  plan = labeling.plan_budget("central", 1.0, 0.0, 4, k=1)
  st = labeling.privacy_report(cfg, plan, [None] * 4, 1000)["statement"]
  assert st["epsilon"] == pytest.approx(1.0, rel=1e-12) and st["delta"] == 0.0 and st["count"] == 4
  assert st["parameters"]["epsilon_per_iteration"] == pytest.approx(0.25, rel=1e-12)
  cfg = labeling.LabelingConfig(mechanism="shuffle-multi", epsilon=1.0, delta=1e-6, iterations=2)
  plan = labeling.plan_budget("shuffle-multi", 1.0, 1e-6, 2, k=1)
  st = labeling.privacy_report(cfg, plan, [None] * 2, 1000)["statement"]
  assert st["delta"] == 1e-6 and 0.99 <= st["epsilon"] <= 1.0
  assert st["parameters"]["delta_per_iteration"] == pytest.approx(1e-6 / 4)


def test_knn_labeling_runs_with_sensitivity_2s_in_every_release(splits):
  # k-NN labeling (each query takes its k nearest private records) was never run end to end: a record can be
  # in all s buckets, so the release's sensitivity is 2s whatever k, and without noise each query has k votes.
  s, k = 20, 5
  res = labeling.run_labeling(tiny(mechanism="central", epsilon=1.0, connection="knn-labeling", k=k), splits=splits)
  [per] = res.report["privacy"]["per_iteration"]
  assert per["parameters"]["sensitivity"] == 2 * s and per["parameters"]["parameter"] == pytest.approx(1.0 / (2 * s))
  exact = labeling.run_labeling(tiny(mechanism="none", epsilon=math.inf, connection="knn-labeling", k=k),
                                splits=splits)
  np.testing.assert_array_equal(exact.private.final.votes.sum(axis=1), np.full(s, k))


@pytest.mark.parametrize("mechanism, released", [("shuffle-multi", "shuffle-multi-message"),
                                                  ("shuffle-single", "shuffle-single-message")])
def test_shuffle_mechanisms_run_end_to_end(splits, noise_free, mechanism, released):
  # The two shuffle mechanisms through the whole pipeline (the tests above build them only). At eps = 4 over
  # |D_priv| = 1,500 messages the votes keep most of the noise-free labels (measured with this seed: Acc_pl
  # 0.56 and 0.527 against 0.553 noise-free); the floor 0.1 below is a wide margin for a fixed seed.
  res = labeling.run_labeling(tiny(mechanism=mechanism, epsilon=4.0, delta=1e-5), splits=splits)
  st = res.report["privacy"]["statement"]
  assert st["mechanism"] == f"reverse-knn-labeling/{mechanism}" and st["relation"] == "replace-one"
  assert (st["epsilon"], st["delta"], st["count"]) == (4.0, 1e-5, 1)
  [per] = res.report["privacy"]["per_iteration"]
  assert per["mechanism"] == released and per["delta"] <= 1e-5 and per["epsilon"] <= 4.0
  final = res.private.final
  assert final.votes.shape == (20, 10) and np.all(np.isfinite(final.votes))
  assert final.acc_pl >= noise_free.private.final.acc_pl - 0.1


def test_ledger_index_records_each_release_and_which_run_released_or_reused_it(tmp_path):
  record = {"mechanism": "central", "seed": 3, "privacy": {"epsilon": 0.5, "delta": 0.0}}
  first = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  first.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), record)
  first.finish()
  second = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  assert second.lookup(1) is not None
  index = json.loads((tmp_path / "ledger.json").read_text())
  [entry] = index["releases"]
  assert isinstance(entry.pop("released_at"), str)
  assert entry == {"iteration": 1, "file": "release-iter1.npz", **record}
  assert [(r["released"], r["reused"]) for r in index["runs"]] == [([1], []), ([], [1])]
  assert "finished" in index["runs"][0] and "finished" not in index["runs"][1]


def test_an_interrupted_ledger_index_write_keeps_the_earlier_index(tmp_path, monkeypatch):
  # ledger.json is written to a synced temporary file and renamed: an interrupt while it is written leaves the
  # earlier index whole (in place, truncate-then-write would leave a partial index that blocks every resume).
  ledger = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  ledger.record(1, np.zeros((2, 3)), np.arange(2), np.zeros(5, np.int64), {"mechanism": "central"})
  ledger.finish()
  before = (tmp_path / "ledger.json").read_bytes()

  def interrupted(fd):
    raise KeyboardInterrupt("interrupted before the new index was on disk")

  again = labeling.ReleaseLedger(tmp_path, {"a": 1}, "hash")
  monkeypatch.setattr(_files.os, "fsync", interrupted)
  with pytest.raises(KeyboardInterrupt):
    again.lookup(1)
  assert (tmp_path / "ledger.json").read_bytes() == before
  assert sorted(p.name for p in tmp_path.iterdir()) == [".ledger-key", "ledger.json", "release-iter1.npz"]


def test_earlier_plots_without_a_report_move_to_history(tmp_path):
  # A folder holding an earlier run's plots but no report.json: the plots move, and nothing else is moved.
  (tmp_path / "accuracy.png").write_bytes(b"old plot")
  assert _files.keep_earlier_report(tmp_path) is None
  assert sorted(p.name for p in tmp_path.iterdir()) == ["history"]
  assert (tmp_path / "history" / "report-1-accuracy.png").read_bytes() == b"old plot"
  (tmp_path / "accuracy.png").write_bytes(b"second plot")
  (tmp_path / "report.json").write_text('{"run": 2}\n')
  assert _files.keep_earlier_report(tmp_path) == tmp_path / "history" / "report-2.json"
  assert (tmp_path / "history" / "report-2-accuracy.png").read_bytes() == b"second plot"
  assert (tmp_path / "history" / "report-1-accuracy.png").read_bytes() == b"old plot"
