"""Settings of a reverse k-NN private labeling run (Algorithm 1), validated once.

A :class:`LabelingConfig` is a frozen, hashable, JSON-serialisable record of
every setting; :func:`run_labeling` takes one and nothing else (plus data
when the caller brings its own). Sizes left as ``None`` take the paper's
protocol for the data set (MNIST protocol: D_priv = the 60k training
images, D_pub = 5k test images, evaluation = the other 5k) or, for the
embedded 5,000 digits, a three-way split (3,000 / 1,000 / 1,000).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jaxdistill import _keys
from jaxdistill import _validate
from jaxdistill import models
from jaxdistill.data import DATASETS
from jaxdistill.labeling import _components
from jaxdistill.models._cnn import check_dropout

__all__ = ["MECHANISMS", "REPRESENTATIONS", "CONNECTIONS", "StudentConfig", "LabelingConfig"]

#: Vote mechanisms: BSVS under central, local or shuffle DP, or no noise.
MECHANISMS = ("central", "local-rr", "local-collision", "shuffle-multi", "shuffle-single", "none")
#: Representations fitted on D_pub alone for the first query selection
#: (:func:`jaxdistill.representations.fit_representation`; ``contrastive`` and ``scan`` are learned).
REPRESENTATIONS = _components.REPRESENTATIONS
#: The total epsilon of a private run when ``LabelingConfig.epsilon`` is not given.
DEFAULT_EPSILON = 1.0
#: Connection rules (:func:`jaxdistill.connection.connect`); only ``reverse-knn`` is the paper's.
CONNECTIONS = _components.RULES
#: Central noise laws (discrete Laplace is the library default for counts).
CENTRAL_NOISES = ("discrete-laplace", "laplace")
#: Local randomizers of the single-message shuffle protocol.
SHUFFLE_LOCALS = ("collision", "rr")
#: Training targets of the student: argmax labels (the paper) or the noisy vote shares.
STUDENT_TARGETS = ("hard", "soft")
#: Most self-training rounds (each trains a fresh student; student draws' keys sit above this range).
MAX_REFINE_ROUNDS = 1000
#: Most iterations T (each re-clusters D_pub, releases votes and trains a student; the budget of
#: 10^7 iterations took minutes to plan, 10^9 hung).
MAX_ITERATIONS = 100
#: Most student (or ceiling) seeds: each trains a student on the same votes.
MAX_STUDENT_SEEDS = 1000
#: Largest student batch_size / embedding_dim: int32, the device's index type (2**63 was accepted).
_MAX_COUNT = 2**31 - 1

_LEARNED = _components.LEARNED  # encoder_width / encoder_steps apply to these only
_PCA = _components.PCA  # pca_dim applies to these only
#: Bounds that keep a typo from starting a days-long fit.
_MAX_ENCODER = {"encoder_width": 1024, "encoder_steps": 1_000_000}
_EMBEDDED_SIZES = (3000, 1000, 1000)  # D_priv, D_pub, D_eval of the 5,000 embedded digits
_TEST_SPLIT_SIZES = (None, 5000, 5000)  # every data set with a test split: D_pub and D_eval from it


@dataclasses.dataclass(frozen=True)
class StudentConfig:
  """The student CNN (a :class:`jaxdistill.models.FedMDCNN`) and its training.

  Attributes:
    widths: conv widths ``(n1, n2)`` or ``(n1, n2, n3)``, each at most
      :data:`jaxdistill.models.MAX_WIDTH`.
    dropout: dropout rate.
    epochs: training epochs on D_pub (at most
      :data:`jaxdistill.models.MAX_EPOCHS`; checked here, before any vote
      is released, not when the student trains).
    batch_size: minibatch size, at most 2**31 - 1.
    learning_rate: Adam step size.
    embedding_dim: PCA dimension of the penultimate features used to
      re-select queries at iterations t >= 2 (fitted on D_pub only), at
      most 2**31 - 1; another value than the default (64) only in a
      :class:`LabelingConfig` with ``iterations >= 2``.
    targets: ``hard`` (argmax labels, the paper) or ``soft`` (each query's
      noisy votes clipped at 0 and normalised; post-processing, no privacy
      cost).
    refine_rounds: self-training rounds after the first student (0: none,
      the paper). Each round relabels D_pub with the product of the
      student's predictions and the cluster's vote shares and trains a
      fresh student on it (:func:`jaxdistill.labeling.refine_targets`);
      it reads only D_pub and the released votes, so it is post-processing
      and the privacy statement is unchanged. At most
      ``MAX_REFINE_ROUNDS`` (1000).
      The supervised ceiling is trained once: with true labels (one-hot
      shares) the refined targets are the labels themselves.
  """

  widths: tuple[int, ...] = (16, 32)
  dropout: float = 0.2
  epochs: int = 20
  batch_size: int = 64
  learning_rate: float = 1e-3
  embedding_dim: int = 64
  targets: str = "hard"
  refine_rounds: int = 0

  def __post_init__(self):
    widths = tuple(self.widths) if isinstance(self.widths, (tuple, list, np.ndarray)) else (self.widths,)
    if len(widths) not in (2, 3) or np.ndim(self.widths) > 1:
      raise ValueError(f"Expected student widths of 2 or 3 conv layers; got {self.widths!r}.")
    object.__setattr__(self, "widths", tuple(_validate.integer("widths", w, minimum=1, maximum=models.MAX_WIDTH)
                                            for w in widths))
    object.__setattr__(self, "dropout", check_dropout(self.dropout))
    object.__setattr__(self, "epochs", _validate.integer("epochs", self.epochs, minimum=1,
                                                         maximum=models.MAX_EPOCHS))
    object.__setattr__(self, "batch_size", _validate.integer("batch_size", self.batch_size, minimum=1,
                                                             maximum=_MAX_COUNT))
    object.__setattr__(self, "learning_rate", _validate.learning_rate(self.learning_rate))
    object.__setattr__(self, "embedding_dim",
                       _validate.integer("embedding_dim", self.embedding_dim, minimum=1, maximum=_MAX_COUNT))
    object.__setattr__(self, "targets", _validate.choice("targets", self.targets, STUDENT_TARGETS))
    object.__setattr__(self, "refine_rounds",
                       _validate.integer("refine_rounds", self.refine_rounds, minimum=0,
                                         maximum=MAX_REFINE_ROUNDS))

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["widths"] = list(self.widths)
    return out


@dataclasses.dataclass(frozen=True)
class LabelingConfig:
  """Every setting of one run of Algorithm 1.

  Attributes:
    dataset: one of :data:`jaxdistill.data.DATASETS`.
    data_dir: folder of IDX files (``mnist``, ``idx``, ``emnist-<config>``;
      optional for ``fashion-mnist``). ``""`` counts as not given.
    mechanism: one of :data:`MECHANISMS`.
    epsilon: the TOTAL epsilon over all T iterations; ``None`` (the
      default) means :data:`DEFAULT_EPSILON` (1.0), and ``inf`` with
      ``mechanism="none"``, which takes no other value (it releases the
      exact votes: a finite epsilon there was recorded but meant nothing).
    delta: the TOTAL delta; ``None`` means 0 for the central and local
      mechanisms (pure DP) and ``min(1e-6, 1/(10 n))`` for shuffle.
      ``mechanism="none"`` takes ``None`` only.
    num_queries: s, the number of queries (k-means clusters of D_pub).
    k: with ``reverse-knn`` and the balanced rules, each private record
      votes for its k nearest queries (``k < s``, or s = k = 1); with ``knn-labeling``,
      each query takes its k nearest private records (``k <= |D_priv|``,
      checked against ``private_size`` here when it is given, otherwise when
      the data are loaded).
    connection: ``reverse-knn`` (the paper's rule, per record: sensitivity
      2k), ``knn-labeling`` (each query takes its k nearest records:
      sensitivity 2s, central model only) or ``balanced-max-min`` /
      ``balanced-harmonic`` (Appendix C: they couple records, so NO DP
      guarantee is claimed; the report says so). Every rule but
      ``reverse-knn`` takes mechanism ``central`` or ``none`` only: a
      record's edges depend on the other records, so no client can compute
      (and randomize) its own.
    iterations: T in [1, ``MAX_ITERATIONS`` (100)]; t >= 2 re-selects
      queries with the student's penultimate-layer embeddings.
    representation: one of :data:`REPRESENTATIONS` (fitted on D_pub only).
      ``scan`` clusters D_pub end to end into s = ``num_queries`` clusters
      (:func:`jaxdistill.representations.fit_scan`); it pays off at small s
      (s = |Y| for the local mechanisms) and needs s >= 2.
    seed: the run's seed in [0, 2**32) (splits, k-means, student; and the noise unless
      ``noise_seed`` is given).
    noise_seed: a SECRET seed for the vote noise, or ``None`` to derive the
      noise from ``seed`` (reproducible, but anyone who knows ``seed`` can
      remove the noise: fine for experiments, not for a real release; the
      report warns). It is never written to the report or the ledger.
      The noise key folds in the release settings and the mechanism's
      input, so one secret seed used for releases that differ in a setting
      (epsilon, say) or in the data draws independent noise for each (they
      compose as separate releases), and the same settings on the same data
      give the same release again. ``mechanism="none"`` draws no noise and
      refuses it.
    private_size, public_size, eval_size: |D_priv|, |D_pub|, |D_eval|
      (``None``: the paper's protocol for the data set). With splits the
      caller passes to :func:`run_labeling`, ``None`` or their sizes.
    student: :class:`StudentConfig`.
    central_noise: ``discrete-laplace`` (default) or ``laplace``; another
      value than the default only with ``mechanism="central"``.
    shuffle_local: local randomizer of ``shuffle-single`` (``collision`` or
      ``rr``); another value than the default only with that mechanism.
    pca_dim: output dimension of the ``pca`` and ``hog-pca`` representations;
      another value than the default (50) only with those. Like the two
      above, it is in the release fingerprint, so a value the run ignores
      is refused rather than kept.
    encoder_width, encoder_steps: width (channels of the first convolution)
      and optimisation steps of the contrastive encoder of the ``contrastive``
      representation (``scan``: of its backbone); ``None`` keeps
      :class:`~jaxdistill.representations.ContrastiveConfig`'s defaults
      (16, 2,000). The encoder sees D_pub only, so these cost no privacy;
      they change the queries, so the ledger keeps them in the release
      fingerprint. Set them only with a learned representation.
    out_dir: where the release ledger, report and plots go (``None``: keep
      nothing on disk; the ledger then cannot protect a re-run).
    baselines: also run the noise-free pipeline and the supervised ceiling.
    ceiling_seeds: how many students (different seeds) the supervised
      ceiling is trained with. The first is the reported ceiling (the same
      key for any value); with more, the report adds every draw and their
      mean, because one student's accuracy moves by about a point with its
      seed. Not a release setting: the ledger ignores it. At most
      ``MAX_STUDENT_SEEDS`` (1000), like ``student_seeds``; more than 1
      only with ``baselines``.
    student_seeds: how many students (different seeds) are trained on the
      final iteration's votes, in the private and the noise-free chain.
      The first is the reported Acc_pc (the same key for any value); with
      more, the report adds every draw, their mean and the gaps between
      the means. At T = 1, student draw i has the key of ceiling draw i,
      so the gaps are paired; no draw shares a key with another draw's
      refinement students. Training more students on released votes is
      post-processing: the privacy statement does not change, and the
      ledger ignores this setting.
  """

  dataset: str = "mnist-embedded"
  data_dir: str | None = None
  mechanism: str = "central"
  epsilon: float | None = None
  delta: float | None = None
  num_queries: int = 40
  k: int = 1
  connection: str = "reverse-knn"
  iterations: int = 1
  representation: str = "hog-pca"
  seed: int = 0
  noise_seed: int | None = dataclasses.field(default=None, repr=False)
  private_size: int | None = None
  public_size: int | None = None
  eval_size: int | None = None
  student: StudentConfig = dataclasses.field(default_factory=StudentConfig)
  central_noise: str = "discrete-laplace"
  shuffle_local: str = "collision"
  pca_dim: int = 50
  encoder_width: int | None = None
  encoder_steps: int | None = None
  out_dir: str | None = None
  baselines: bool = True
  ceiling_seeds: int = 1
  student_seeds: int = 1

  def __post_init__(self):
    if not isinstance(self.dataset, str) or not (self.dataset in DATASETS or self.dataset.startswith("tfds:")):
      raise ValueError(f"Expected dataset to be one of {', '.join(DATASETS)}; got {self.dataset!r}.")
    if isinstance(self.data_dir, str) and not self.data_dir:  # "" is "not given", as in load_dataset and fedmd
      object.__setattr__(self, "data_dir", None)  # (--data-dir "$UNSET" falls back to the Debian folder)
    if self.data_dir is not None:
      object.__setattr__(self, "data_dir", str(_validate.as_path("data_dir", self.data_dir)))
    mech = _validate.choice("mechanism", self.mechanism, MECHANISMS)
    if mech == "none":
      eps = math.inf if self.epsilon is None else _validate.positive("epsilon", self.epsilon, allow_inf=True)
      if not math.isinf(eps) or self.delta is not None:
        what = f"epsilon={eps!r}" if not math.isinf(eps) else f"delta={self.delta!r}"
        raise ValueError(f"Expected no epsilon (or inf) and no delta with mechanism=none: it releases the exact "
                         f"votes, so no privacy parameter applies; got {what}.")
    else:
      eps = _validate.positive("epsilon", DEFAULT_EPSILON if self.epsilon is None else self.epsilon)
    object.__setattr__(self, "epsilon", eps)
    if self.delta is not None:
      delta = _validate.probability("delta", self.delta)
      if delta >= 1:
        raise ValueError(f"Expected delta={delta!r} < 1.")
      if mech.startswith("shuffle") and delta <= 0:
        raise ValueError(f"Expected delta={delta!r} > 0 for mechanism={mech}.")
      object.__setattr__(self, "delta", delta)
    s = _validate.integer("num_queries", self.num_queries, minimum=1)
    k = _validate.integer("k", self.k, minimum=1)
    rule = _validate.choice("connection", self.connection, CONNECTIONS)
    if rule != "knn-labeling" and k > s:  # knn-labeling's k counts records per query: checked against n below
      raise ValueError(f"Expected k={k} <= num_queries (s)={s}: each record connects to k distinct queries.")
    if rule != "knn-labeling" and 1 < s == k:
      # Every record then votes for every query: all s vote rows are equal and every public sample gets one label
      # (Acc_pl 0.10 on ten classes), a release spent for nothing and no warning.
      raise ValueError(f"Expected k={k} < num_queries (s)={s}: with k = s every record votes for every query, so all "
                       "queries get the same votes and one label.")
    object.__setattr__(self, "num_queries", s)
    object.__setattr__(self, "k", k)
    if rule != "reverse-knn" and mech not in ("central", "none"):  # k-NN labeling and Appendix C's balanced rules
      raise ValueError(f"Expected mechanism=central or none with connection={rule} (a record's edges "
                       f"depend on the other records, so clients cannot randomize them); got {mech}.")
    object.__setattr__(self, "iterations", _validate.integer("iterations", self.iterations, minimum=1,
                                                             maximum=MAX_ITERATIONS))
    if _validate.choice("representation", self.representation, REPRESENTATIONS) == "scan" and s < 2:
      raise ValueError(f"Expected num_queries (s)={s} >= 2 with representation=scan (it clusters D_pub into s "
                       "clusters).")
    object.__setattr__(self, "seed", _validate.integer("seed", self.seed, minimum=0, maximum=_validate.MAX_SEED))
    if self.noise_seed is not None:
      # The secret noise key folds in all 64 bits (_keys.secret_key).
      object.__setattr__(self, "noise_seed", _keys.check_secret_seed("noise_seed", self.noise_seed))
      if mech == "none":  # no noise is drawn: the seed did nothing, yet the default folder said secret-noise
        raise ValueError("Expected noise_seed=None with mechanism=none: it draws no noise, so a secret seed would "
                         "change nothing.")
    for name in ("private_size", "public_size", "eval_size"):
      value = getattr(self, name)
      if value is not None:
        object.__setattr__(self, name, _validate.integer(name, value, minimum=1))
    if rule == "knn-labeling" and self.private_size is not None and k > self.private_size:
      raise ValueError(f"Expected k={k} <= private_size={self.private_size} with connection=knn-labeling: each "
                       "query takes its k nearest private records.")
    if self.public_size is not None and s > self.public_size:
      raise ValueError(f"Expected num_queries (s)={s} <= public_size={self.public_size}: queries are "
                       "public samples.")
    if not isinstance(self.student, StudentConfig):
      raise ValueError(f"Expected student to be a StudentConfig; got {type(self.student).__name__}.")
    if self.iterations == 1 and self.student.embedding_dim != StudentConfig.embedding_dim:
      # It shapes the student's embedding of D_pub, which only iterations t >= 2 use (was accepted, ignored).
      raise ValueError(f"Expected student.embedding_dim={self.student.embedding_dim} only with iterations >= 2 (the "
                       "student's embedding re-selects the next iteration's queries; elsewhere it is ignored); got "
                       "iterations=1.")
    _validate.choice("central_noise", self.central_noise, CENTRAL_NOISES)
    _validate.choice("shuffle_local", self.shuffle_local, SHUFFLE_LOCALS)
    object.__setattr__(self, "pca_dim", _validate.integer("pca_dim", self.pca_dim, minimum=1))
    # Settings that only one mechanism or representation reads: another value elsewhere would be ignored
    # silently, yet it is in the release fingerprint (a change would block a resume). Defaults pass (the CLI
    # always passes them).
    for name, applies, where in self._readers():
      value = getattr(self, name)
      if not applies and value != _DEFAULTS[name]:
        got = f"mechanism={mech}" if name != "pca_dim" else f"representation={self.representation}"
        raise ValueError(f"Expected {name}={value!r} only with {where} (elsewhere it is ignored); got {got}.")
    for name in ("encoder_width", "encoder_steps"):
      value = getattr(self, name)
      if value is not None:
        if self.representation not in _LEARNED:
          raise ValueError(f"Expected {name}={value!r} only with a learned representation "
                           f"({', '.join(_LEARNED)}); got representation={self.representation}.")
        object.__setattr__(self, name, _validate.integer(name, value, minimum=1, maximum=_MAX_ENCODER[name]))
    if self.out_dir is not None:
      object.__setattr__(self, "out_dir", str(_validate.as_path("out_dir", self.out_dir)))
    object.__setattr__(self, "baselines", _validate.boolean("baselines", self.baselines))
    for name in ("ceiling_seeds", "student_seeds"):
      object.__setattr__(self, name, _validate.integer(name, getattr(self, name), minimum=1,
                                                       maximum=MAX_STUDENT_SEEDS))
    if not self.baselines and self.ceiling_seeds != 1:  # no ceiling is trained: it was ignored without a word
      raise ValueError(f"Expected ceiling_seeds={self.ceiling_seeds} only with baselines=True (the supervised "
                       "ceiling is one of the baselines; elsewhere it is ignored); got baselines=False.")

  # -- derived settings ------------------------------------------------------------
  def sizes(self, has_test_split: bool) -> tuple[int | None, int, int]:
    """``(private_size, public_size, eval_size)`` with the data set's defaults filled in."""
    default = _TEST_SPLIT_SIZES if has_test_split else _EMBEDDED_SIZES
    priv = self.private_size if self.private_size is not None else default[0]
    pub = self.public_size if self.public_size is not None else default[1]
    ev = self.eval_size if self.eval_size is not None else default[2]
    return priv, pub, ev

  def _readers(self) -> tuple[tuple[str, bool, str], ...]:
    """(setting, whether this run reads it, where it is read) for the settings only some runs read."""
    return (("central_noise", self.mechanism == "central", "mechanism=central"),
            ("shuffle_local", self.mechanism == "shuffle-single", "mechanism=shuffle-single"),
            ("pca_dim", self.representation in _PCA, f"representation {' or '.join(_PCA)}"))

  def unread_settings(self) -> tuple[str, ...]:
    """The settings this run does not read (they hold their defaults): ``student.embedding_dim`` at T = 1 too."""
    unread = tuple(name for name, applies, _ in self._readers() if not applies)
    return unread + (("student.embedding_dim",) if self.iterations == 1 else ())

  def report_settings(self) -> dict[str, Any]:
    """:meth:`to_dict` with null for every setting this run does not read (:meth:`unread_settings`)."""
    out = self.to_dict()
    for name in self.unread_settings():
      *parents, leaf = name.split(".")
      d = out
      for parent in parents:
        d = d[parent]
      d[leaf] = None
    return out

  def resolved_delta(self, num_private: int) -> float:
    """The total delta: given, or 0 (central, local, none), or min(1e-6, 1/(10 n)) (shuffle)."""
    if self.delta is not None:
      return float(self.delta)
    if self.mechanism.startswith("shuffle"):
      return float(min(1e-6, 1.0 / (10.0 * num_private)))
    return 0.0

  def encoder_options(self) -> dict[str, int]:
    """The :class:`~jaxdistill.representations.ContrastiveConfig` fields this run changes (may be empty)."""
    return {name: value for name, value in (("width", self.encoder_width), ("steps", self.encoder_steps))
            if value is not None}

  def replace(self, **changes: Any) -> "LabelingConfig":
    """A copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["student"] = self.student.to_dict()
    out["noise_seed"] = "public (derived from seed)" if self.noise_seed is None else "secret (not recorded)"
    if isinstance(out["epsilon"], float) and math.isinf(out["epsilon"]):
      out["epsilon"] = "inf"
    return out

  def release_fingerprint(self) -> dict[str, Any]:
    """The settings a vote release depends on (the ledger refuses to mix runs that differ).

    Student settings are left out: they only shape the queries of t >= 2,
    which the ledger stores beside each release. The noise source (public
    seed or secret) stays in, the secret itself never: a secret-noise run
    must not reuse votes whose noise anyone can recompute from the seed.
    """
    d = self.to_dict()
    for name in ("out_dir", "baselines", "ceiling_seeds", "student_seeds", "student", "data_dir"):
      d.pop(name)
    # A setting given as its default is stored as left unset (the form older ledgers hold), so that a resume
    # spelling out a default (--delta 0, the embedded set's sizes, the encoder's width) is not refused.
    if d["delta"] == 0.0 and not self.mechanism.startswith("shuffle"):  # resolved_delta's default there
      d["delta"] = None
    # Every data set but the embedded one has a test split (load_dataset reads both), so its defaults are
    # 5,000 + 5,000: only Fashion-MNIST's were normalised, and a resume of mnist, idx, emnist-* or tfds:* that
    # spelled them out was refused.
    defaults = _EMBEDDED_SIZES if self.dataset == "mnist-embedded" else _TEST_SPLIT_SIZES
    for name, default in zip(("private_size", "public_size", "eval_size"), defaults):
      if d[name] == default:
        d[name] = None
    encoder = _components.default_encoder(self.representation)
    for name in ("encoder_width", "encoder_steps"):  # absent when default: older ledgers stay valid
      if d[name] is None or (encoder is not None and d[name] == getattr(encoder, name.split("_")[1])):
        d.pop(name)
    return d


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LabelingConfig)}
