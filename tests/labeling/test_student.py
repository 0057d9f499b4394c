"""The student's t >= 2 embedding: penultimate layer, PCA fitted on public images only."""

import jax
import numpy as np
import pytest

from jaxdistill import labeling, representations
from jaxdistill.labeling import _student


def test_randomized_pca_matches_exact_svd():
  rng = np.random.default_rng(0)
  # Low-rank signal (decaying spectrum) plus noise: the top directions are well separated.
  x = rng.normal(size=(400, 8)) @ (rng.normal(size=(8, 300)) * np.linspace(5, 1, 8)[:, None])
  x += 0.01 * rng.normal(size=x.shape)
  x -= x.mean(0)
  got = _student._pca_components(jax.random.key(0), x, 5)
  want = np.linalg.svd(x, full_matrices=False)[2][:5].T
  # Same subspace and directions up to sign: |cos| of matched columns ~ 1.
  cos = np.abs(np.sum(got * want, axis=0)) / (np.linalg.norm(got, axis=0) * np.linalg.norm(want, axis=0))
  np.testing.assert_allclose(cos, 1.0, atol=1e-6)


def test_student_embedding_is_a_public_only_representation():
  train, _ = labeling.load_splits(labeling.LabelingConfig(private_size=200, public_size=100, eval_size=100,
                                                          num_queries=10)), None
  pub = train.public
  cfg = labeling.StudentConfig(widths=(4, 8), epochs=1, embedding_dim=6)
  student = labeling.train_student(jax.random.key(0), cfg, pub.images, pub.labels, 10)
  rep = student.embedding(jax.random.key(1), pub.images)
  assert isinstance(rep, representations.Representation)
  z = rep(train.private.images[:50])
  assert z.shape == (50, 6) and z.dtype == np.float32
  # Centred on D_pub: the public embedding has mean ~0 (PCA fitted on D_pub only).
  np.testing.assert_allclose(rep(pub.images).mean(0), 0.0, atol=1e-3)
  # Embedding is a deterministic function of the images (same batch, same features).
  np.testing.assert_array_equal(rep(pub.images[:7]), rep(pub.images[:7]))


def _tiny_student(embedding_dim=3):
  rng = np.random.default_rng(0)
  images = rng.random((64, 12, 12, 1), dtype=np.float32)
  labels = rng.integers(0, 3, 64).astype(np.int32)
  cfg = labeling.StudentConfig(widths=(2, 4), epochs=1, embedding_dim=embedding_dim)
  return labeling.train_student(jax.random.key(0), cfg, images, labels, 3), images


def test_x64_mode_gives_the_same_student_and_embedding():
  # With x64 on, the student's initialisation seed (randint) and the embedding's PCA sketch (normal) took
  # JAX's 64-bit defaults: another student and another projection for the same key. Both draws are 32-bit
  # now. Adam's bias correction is still float64 under x64 (optax), so the trained logits agree to float32
  # rounding, not bit for bit; the sketch itself is compared exactly.
  student, images = _tiny_student()
  x = np.random.default_rng(1).normal(size=(40, 12))
  want = student.logits(images), _student._pca_components(jax.random.key(5), x, 3)
  with jax.enable_x64(True):
    student64, _ = _tiny_student()
    got = student64.logits(images), _student._pca_components(jax.random.key(5), x, 3)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(got[1], want[1])


def test_student_penultimate_feeds_the_dense_head():
  student, images = _tiny_student()
  feats = student.penultimate(images)
  kernel = np.asarray(student.state.params["head"]["kernel"][...])  # the head has no bias
  assert feats.shape == (64, kernel.shape[0]) and kernel.shape[1] == 3
  np.testing.assert_allclose(student.logits(images), feats @ kernel, rtol=1e-4, atol=1e-5)


def test_student_features_refuse_images_of_another_size_than_it_was_trained_on():
  # The convolutions take any size and the dense head (the only shape check) is removed for the features, so a
  # student trained on 12x12 images gave 10x10 ones 64 features instead of 100, and embedding() fitted its PCA
  # on them and pinned itself to 10x10, to refuse the student's own images later, blaming those.
  student, images = _tiny_student()
  assert student.input_shape == (12, 12, 1)
  other = np.zeros((8, 10, 10, 1), np.float32)
  with pytest.raises(ValueError, match=r"^Expected images of shape \[N, 12, 12, 1\] \(the images the student was "
                                       r"trained on\); got \(8, 10, 10, 1\)\.$"):
    student.penultimate(other)
  with pytest.raises(ValueError, match=r"^Expected public_images of shape \[N, 12, 12, 1\] .*got \(8, 10, 10, 1\)"):
    student.embedding(jax.random.key(1), other)
  assert student.embedding(jax.random.key(1), images).input_shape == (12, 12, 1)


def test_student_embedding_projects_on_the_top_principal_directions():
  # x -> V^T (f(x) - mu): V the top principal directions of the centred penultimate features over D_pub.
  student, images = _tiny_student(embedding_dim=3)
  f = np.asarray(student.penultimate(images), np.float64)
  centred = f - f.mean(0)
  _, sing, vt = np.linalg.svd(centred, full_matrices=False)
  z = np.asarray(student.embedding(jax.random.key(1), images)(images), np.float64)
  want = centred @ vt[:3].T
  # Each column is a principal component up to sign; the components are uncorrelated, variances decreasing.
  np.testing.assert_allclose(np.abs(np.sum(z * want, axis=0)), np.sum(want * want, axis=0), rtol=1e-3)
  np.testing.assert_allclose(z.T @ z, np.diag(sing[:3] ** 2), rtol=1e-3, atol=1e-3 * sing[2] ** 2)


def test_vote_shares_refuse_bad_votes_and_assignments():
  import pytest  # pylint: disable=import-outside-toplevel
  votes = np.array([[3.0, -1.0], [0.0, 0.0]])
  np.testing.assert_allclose(labeling.vote_shares(votes, np.array([0, 1, 0])), [[1, 0], [0.5, 0.5], [1, 0]])
  for bad_votes, assignment, match in ((np.array([[np.nan, 1.0]]), [0], "finite votes"),
                                       (np.array([1.0, 2.0]), [0], r"votes of shape \[s, C\]"),
                                       (votes, [0, 2], r"assignment in \[0, s=2\); found values in \[0, 2\]"),
                                       (votes, [-1], r"found values in \[-1, -1\]"),
                                       (votes, [0.0], "int"),
                                       ([["3", "1"]], [0], "votes")):
    with pytest.raises(ValueError, match=match):
      labeling.vote_shares(bad_votes, np.asarray(assignment))


def test_train_student_names_images_of_the_wrong_rank():
  # It raised FedMDCNN's "Expected input_shape ..." without naming the argument.
  with pytest.raises(ValueError, match=r"images of shape \[n, H, W, C\]; got shape \(4, 28, 28\)"):
    _student.train_student(jax.random.key(0), labeling.StudentConfig(epochs=1), np.zeros((4, 28, 28), np.float32),
                           np.zeros(4, np.int32), 2)


def test_train_student_names_the_learning_rate_when_training_diverges():
  # Adam at 1e30 turns the weights into NaN; before, the first accuracy raised "Expected finite logits" without
  # saying why.
  rng = np.random.default_rng(0)
  images = rng.random((32, 12, 12, 1), dtype=np.float32)
  labels = rng.integers(0, 3, 32).astype(np.int32)
  msg = r"diverged .* after [12] of 2 epochs\); lower learning_rate \(now 1e\+30\)"
  with pytest.raises(ValueError, match=msg) as err:
    diverging = labeling.StudentConfig(widths=(2, 4), epochs=2)
    object.__setattr__(diverging, "learning_rate", 1e30)  # past the constructor's cap (10): the message still names it
    _student.train_student(jax.random.key(0), diverging, images, labels, 3)
  assert "\n" not in str(err.value)
  student = _student.train_student(jax.random.key(0), labeling.StudentConfig(widths=(2, 4), epochs=2), images,
                                   labels, 3)
  assert np.isfinite(student.logits(images)).all()  # the check does not refuse a sane step size


def test_train_student_checks_images_and_labels_in_their_own_dtype():
  # It cast first (float32 pixels, jnp.asarray's int32 labels without x64): int64 label 2**32 + 1 trained as
  # label 1, and complex, bool or text images trained, where models.fit refuses them.
  cfg = labeling.StudentConfig(widths=(2, 2), epochs=1, batch_size=4)
  rng = np.random.default_rng(0)
  images, labels = rng.random((8, 8, 8, 1)), rng.integers(0, 2, 8)
  wrapped = labels.copy()
  wrapped[2] = 2**32 + 1
  with pytest.raises(ValueError, match=r"labels in \[0, 2\) .*found values in \[0, 4294967297\]"):
    _student.train_student(jax.random.key(0), cfg, images, wrapped, 2)
  for bad, dtype in ((images + 1j, "complex128"), (images > 0.5, "bool"), (images.astype(str), "<U")):
    with pytest.raises(ValueError, match=f"images to hold real numbers; got dtype {dtype}"):
      _student.train_student(jax.random.key(0), cfg, bad, labels, 2)
  # Valid inputs train as before: float64 pixels and int64 labels as their float32 / int32 casts, bit for bit.
  wide = _student.train_student(jax.random.key(0), cfg, images, labels, 2)
  cast = _student.train_student(jax.random.key(0), cfg, images.astype(np.float32), labels.astype(np.int32), 2)
  for a, b in zip(jax.tree.leaves(wide.state), jax.tree.leaves(cast.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_train_student_and_refine_targets_name_bad_arguments():
  cfg = labeling.StudentConfig(widths=(2, 2), epochs=1, batch_size=4)
  rng = np.random.default_rng(0)
  images, labels = rng.random((8, 8, 8, 1)), rng.integers(0, 2, 8)
  # np.array(4) raised "unhashable type: 'numpy.ndarray'"; 1e30 and 2**63 failed inside JAX.
  for bad, needle in ((2.5, "num_classes to be an integer"), (0, "num_classes=0 >= 1"), (None, "num_classes"),
                      (1e30, r"num_classes=\d+ <= 2147483647"), (2**63, r"num_classes=\d+ <= 2147483647")):
    with pytest.raises(ValueError, match=needle):
      _student.train_student(jax.random.key(0), cfg, images, labels, bad)
  student = _student.train_student(jax.random.key(0), cfg, images, labels, np.array(2))  # 0-d: its value
  assert student.logits(images).shape == (8, 2)
  shares = np.full((8, 2), 0.5)
  # None raised an AttributeError; text images were parsed and complex ones lost their imaginary part.
  with pytest.raises(ValueError, match=r"student to be a Student \(from train_student\); got NoneType"):
    labeling.refine_targets(None, images, shares)
  for bad in (images.astype(str), images + 3j, None):
    with pytest.raises(ValueError, match="public_images to hold real numbers"):
      labeling.refine_targets(student, bad, shares)


def test_train_student_refuses_a_progress_that_is_not_callable_before_training():
  # It failed with "TypeError: 'int' object is not callable" after the first epoch had trained.
  cfg = labeling.StudentConfig(widths=(2, 2), epochs=1, batch_size=4)
  rng = np.random.default_rng(0)
  images, labels = rng.random((8, 8, 8, 1)), rng.integers(0, 2, 8)
  calls = []
  with pytest.raises(ValueError, match="progress to be None or a callable progress.epochs_done.; got 5"):
    _student.train_student(jax.random.key(0), cfg, images, labels, 2, progress=5)
  _student.train_student(jax.random.key(0), cfg, images, labels, 2, progress=calls.append)
  assert calls == [1]


def test_the_students_weights_depend_on_its_key_not_on_jaxs_default_prng():
  # train_student turned the key into an int seed, which nnx made into a key of JAX's default implementation:
  # under JAX_DEFAULT_PRNG_IMPL=rbg the same threefry key gave other weights, so the same recorded seed gave
  # other queries (and releases) from t = 2 on.
  cfg = labeling.StudentConfig(widths=(2, 2), epochs=1, batch_size=4)
  rng = np.random.default_rng(0)
  images, labels = rng.random((8, 8, 8, 1)).astype(np.float32), rng.integers(0, 2, 8)
  key = jax.random.key(3, impl="threefry2x32")
  want = jax.tree.leaves(_student.train_student(key, cfg, images, labels, 2).state.params)
  old = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", "rbg")
  try:
    got = jax.tree.leaves(_student.train_student(key, cfg, images, labels, 2).state.params)
  finally:
    jax.config.update("jax_default_prng_impl", old)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("field", ["batch_size", "embedding_dim"])
def test_student_config_caps_sizes_at_int32(field):
  with pytest.raises(ValueError, match=f"{field}=9223372036854775808 <= 2147483647"):
    labeling.StudentConfig(**{field: 2**63})
  assert getattr(labeling.StudentConfig(**{field: 2**31 - 1}), field) == 2**31 - 1
