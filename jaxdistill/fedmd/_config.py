"""FedMD-NFDP run configuration (a frozen dataclass; safe to log and hash)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from jaxdistill import _validate
from jaxdistill.accounting import Relation
from jaxdistill.fedmd._aggregation import RELEASE_MODES, check_clip
from jaxdistill.fedmd._privacy import check_ldp_epsilon
from jaxdistill.fedmd._sampling import MAX_K
from jaxdistill.models import FEDMD_SPECS, MAX_EPOCHS, CNNSpec

__all__ = ["FedMDConfig", "METHODS", "VMAP_MODES"]

#: ``nfdp``: Algorithm 1 (k-sample only); ``np``: FedMD without privacy (all
#: local data); ``ldp``: FedMD with Gaussian noise on every release (all local
#: data); ``local``: no collaboration, all local data (lower bound);
#: ``local-sample``: no collaboration, NFDP's k-sample only; ``centralized``:
#: every architecture trained on the pooled private data (upper bound).
METHODS = ("nfdp", "np", "ldp", "local", "local-sample", "centralized")
#: Defaults of the settings that only some methods read (FedMDConfig refuses another value elsewhere).
_DEFAULTS = {"k": 16, "with_replacement": False, "ldp_epsilon": 1.0, "ldp_clip": 10.0, "public_subset": 5000,
             "aggregation": "argmax", "weighting": "equal", "digest_epochs": 2, "relation": "add-remove",
             "revisit_epochs": 1, "eval_every": 1}
#: The settings that shape the public-set releases: only the methods that collaborate read them, in rounds.
_RELEASE_SETTINGS = ("public_subset", "aggregation", "weighting", "digest_epochs")
#: The settings only rounds read: with rounds=0 no public-set predictions are released and no round trains or
#: evaluates (FedMDConfig refuses them).
_ROUND_SETTINGS = (*_RELEASE_SETTINGS, "revisit_epochs", "eval_every", "ldp_clip")
VMAP_MODES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class FedMDConfig:
  """Hyperparameters of one FedMD run (Sun & Lyu 2021, Algorithm 1; FedMD).

  Attributes:
    method: one of :data:`METHODS`.
    num_parties: N >= 1 (must equal the data's number of parties).
    specs: per-party architectures, cycled to N (None: FedMD's ten,
      :data:`jaxdistill.models.FEDMD_SPECS`).
    width_multiplier: scales every conv width (1 = FedMD's sizes).
    k: NFDP sample size per party, 1 <= k <= :data:`~jaxdistill.fedmd.MAX_K`
      (2^31 - 1: the sample's indices are int32). With replacement k may
      exceed a party's n; :func:`~jaxdistill.fedmd.check_config` also
      refuses a k whose samples (k images per party) would not fit in the
      host's memory. Another value than the default (16) only where it is
      read (:attr:`reads_k`): ``nfdp``, ``local-sample``, and ``ldp``
      without ``ldp_delta`` (its default delta is NFDP's p for k).
    with_replacement: WR (Theorem 2) or WOR (Theorem 1) sampling; True only
      where ``k`` is read.
    resample_each_round: draw a fresh sample every round (accounted as R
      compositions) instead of the paper's single reused sample.
    rounds: R collaboration rounds (0: the parties train locally and release
      no predictions; the release settings, ``revisit_epochs``,
      ``eval_every`` and ``ldp_clip`` then keep their defaults, ``nfdp``
      takes no ``ldp_delta`` and nothing resamples).
    public_subset: public images drawn (without replacement) each round.
    aggregation: release mode ``argmax``, ``softmax`` or ``logits``. This,
      ``public_subset``, ``weighting`` and ``digest_epochs`` take another
      value than their defaults (``argmax``, 5000, ``equal``, 2) only with
      the methods that collaborate (:attr:`collaborates`: ``nfdp``, ``np``,
      ``ldp``); the others query no public data and release nothing.
    weighting: ``equal``, ``size`` (proportional to the party's number of
      private records) or a tuple (list, 1-D array) of N finite nonnegative
      public weights, not all zero: real numbers, not bools or text.
      ``size`` is refused for ``nfdp`` and ``ldp`` unless ``relation`` is
      ``replace-one``: otherwise n_i, and with it the consensus, changes with
      the data.
    pretrain_epochs: epochs of transfer learning on the public labels first
      (0: none).
    init_epochs: T1, epochs on the private view before collaborating.
    digest_epochs: T2, epochs on the public consensus per round.
    revisit_epochs: T3, epochs on the private view per round.
    learning_rate: Adam step size.
    private_batch_size: batch size on private data (capped at the data size).
    public_batch_size: batch size on public data.
    ldp_epsilon: FedMD-LDP's target epsilon, at most
      :data:`~jaxdistill.fedmd.MAX_LDP_EPSILON`; another value than the
      default (1) only with ``ldp`` (the sigma table of ``nfdp`` reports
      takes its epsilons from ``run_fedmd``'s ``ldp_table_epsilons``).
    ldp_delta: FedMD-LDP's target delta, the same for every party. None
      means each party's NFDP delta p for the same n_i, k and sampling, and
      is accepted only under ``relation="replace-one"``: under add/remove n_i
      changes with the data, and a sigma calibrated to p(n_i) would make the
      noise scale itself depend on the private data (sigma_i(n) differs from
      sigma_i(n - 1), which many noisy releases reveal). A default p of 0.5
      or more (k close to n_i) is refused by the run: such a delta is no
      guarantee. With ``nfdp`` it
      is the delta of the report's FedMD-LDP sigma table; other methods
      refuse it.
    ldp_clip: L2 clip norm of logits releases under FedMD-LDP (and of the
      ``nfdp`` report's sigma table); another value than the default (10)
      only with ``aggregation="logits"`` and ``nfdp`` or ``ldp``.
    relation: neighbouring relation of the privacy reports (default
      ``add-remove``, the paper's). ``add-one`` reports, for a party
      holding n records, the delta of a record it does *not* hold being
      added (k/(n+1) WOR): it says nothing about the n records the party
      holds, whose delta is that of the pair (D minus x, D), k/n WOR, the
      ``add-remove`` / ``remove-one`` figure. Use ``add-one`` only for that
      hypothetical extra record. Another value than the default only with
      a method that has a privacy statement (``nfdp``, ``local-sample``,
      ``ldp``).
    vmap: ``on`` (same-architecture parties as one vmapped batch), ``off``
      (one party at a time) or ``auto`` (``on`` except on CPU, where XLA's
      grouped convolutions are slower than a loop; see benchmarks). The two
      modes draw the same samples and batches but round differently in
      float32, so their accuracies agree only statistically: set it
      explicitly to compare runs across backends.
    eval_every: evaluate test accuracy every this many rounds (and at the end).
  """

  method: str = "nfdp"
  num_parties: int = 10
  specs: tuple[CNNSpec, ...] | None = None
  width_multiplier: float = 0.125
  k: int = _DEFAULTS["k"]
  with_replacement: bool = _DEFAULTS["with_replacement"]
  resample_each_round: bool = False
  rounds: int = 20
  public_subset: int = _DEFAULTS["public_subset"]
  aggregation: str = _DEFAULTS["aggregation"]
  weighting: Any = _DEFAULTS["weighting"]
  pretrain_epochs: int = 2
  init_epochs: int = 20
  digest_epochs: int = _DEFAULTS["digest_epochs"]
  revisit_epochs: int = _DEFAULTS["revisit_epochs"]
  learning_rate: float = 1e-3
  private_batch_size: int = 5
  public_batch_size: int = 256
  ldp_epsilon: float = _DEFAULTS["ldp_epsilon"]
  ldp_delta: float | None = None
  ldp_clip: float = _DEFAULTS["ldp_clip"]
  relation: str = _DEFAULTS["relation"]
  vmap: str = "auto"
  eval_every: int = _DEFAULTS["eval_every"]

  def __post_init__(self):
    s = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
    _validate.choice("method", self.method, METHODS)
    s("num_parties", _validate.integer("num_parties", self.num_parties, minimum=1))
    if self.specs is not None:
      try:
        specs = tuple(self.specs)
      except TypeError:  # specs=1.5 was "'float' object is not iterable"
        raise ValueError(f"Expected specs to be a non-empty tuple of CNNSpec; got {self.specs!r}.") from None
      if not specs or not all(isinstance(x, CNNSpec) for x in specs):
        raise ValueError(f"Expected specs to be a non-empty tuple of CNNSpec; got {self.specs!r}.")
      s("specs", specs)
    s("width_multiplier", _validate.positive("width_multiplier", self.width_multiplier))
    s("k", _validate.integer("k", self.k, minimum=1, maximum=MAX_K))
    for name in ("with_replacement", "resample_each_round"):
      s(name, _validate.boolean(name, getattr(self, name)))
    if self.resample_each_round and not self.uses_sample:
      raise ValueError(f"Expected resample_each_round=False for method={self.method!r}: only methods that "
                       "sample (nfdp, local-sample) can resample.")
    s("rounds", _validate.integer("rounds", self.rounds, minimum=0))
    if self.resample_each_round and self.rounds == 0:  # one sample is drawn either way: it was ignored
      raise ValueError("Expected resample_each_round=False with rounds=0: a run of no rounds draws one sample.")
    s("public_subset", _validate.integer("public_subset", self.public_subset, minimum=1))
    _validate.choice("aggregation", self.aggregation, RELEASE_MODES)
    if isinstance(self.weighting, str):
      _validate.choice("weighting", self.weighting, ("equal", "size"))
    else:
      # Each weight a real number as given: float() took ("1", "2") and (True, False) as weights.
      if isinstance(self.weighting, np.ndarray) and self.weighting.ndim == 1:
        given = self.weighting.tolist()
      elif isinstance(self.weighting, (list, tuple)):
        given = list(self.weighting)
      else:
        raise ValueError(f"Expected weighting to be 'equal', 'size' or N numbers; got {self.weighting!r}.")
      w = tuple(_validate.finite(f"weighting[{i}]", x) for i, x in enumerate(given))
      if len(w) != self.num_parties or any(not (x >= 0 and x < float("inf")) for x in w) or sum(w) <= 0:
        raise ValueError(f"Expected weighting to be num_parties={self.num_parties} finite nonnegative weights, not "
                         f"all zero; got {w}.")
      s("weighting", w)
    for name in ("pretrain_epochs", "init_epochs", "digest_epochs", "revisit_epochs"):
      # Capped as training caps them: digest_epochs = 10^6 + 1 failed only after round 1's consensus, naming "epochs".
      s(name, _validate.integer(name, getattr(self, name), minimum=0, maximum=MAX_EPOCHS))
    s("learning_rate", _validate.learning_rate(self.learning_rate))
    s("private_batch_size", _validate.integer("private_batch_size", self.private_batch_size, minimum=1))
    s("public_batch_size", _validate.integer("public_batch_size", self.public_batch_size, minimum=1))
    s("ldp_epsilon", check_ldp_epsilon("ldp_epsilon", self.ldp_epsilon))
    if self.ldp_delta is not None:
      s("ldp_delta", _validate.open_unit("ldp_delta", self.ldp_delta))
      if not self.has_ldp_table:  # ran without a word
        raise ValueError(f"Expected ldp_delta=None for method={self.method!r}: only 'ldp' (its noise) and 'nfdp' "
                         f"(its report's FedMD-LDP sigma table) use it; got ldp_delta={self.ldp_delta!r}.")
      if self.method == "nfdp" and self.rounds == 0:  # no rounds, no predictions released, no table
        raise ValueError(f"Expected ldp_delta=None for method='nfdp' with rounds=0: it is the delta of the report's "
                         f"FedMD-LDP sigma table, and a run of no rounds releases no predictions and has no table; "
                         f"got ldp_delta={self.ldp_delta!r}.")
    s("ldp_clip", check_clip("ldp_clip", self.ldp_clip))
    s("relation", Relation.parse(self.relation).value)
    # Settings that only some methods read: another value than the default elsewhere ran without a word
    # (FedMDConfig(method="np", k=50) trained NP on all the data). Defaults pass, so dataclasses.replace of a
    # config and the CLI (which passes them) keep working; the CLI refuses such flags too.
    for name, applies, where in self._readers():
      value = getattr(self, name)
      if not applies and value != _DEFAULTS[name]:
        got = (f"method={self.method!r}" + (f", aggregation={self.aggregation!r}" if name == "ldp_clip" else "")
               + (f", ldp_delta={self.ldp_delta!r}" if self.method == "ldp" and name in ("k", "with_replacement")
                  else "") + (", rounds=0" if self.rounds == 0 and name in _ROUND_SETTINGS else ""))
        raise ValueError(f"Expected {name}={value!r} only with {where}; elsewhere it is ignored. Got {got}.")
    if self.method == "ldp" and self.ldp_delta is None and self.relation != Relation.REPLACE_ONE.value:
      raise ValueError(
          f"Expected a public ldp_delta for method='ldp' under relation={self.relation!r}: the default, NFDP's p "
          "for each party's size n_i, changes when a record is added or removed, so the noise scale itself would "
          "depend on the private data. Pass ldp_delta (CLI: --ldp-delta), e.g. NFDP's p at a public nominal size "
          "(accounting.nfdp_inclusion_probability), or relation='replace-one', under which n_i is fixed.")
    if self.weighting == "size" and self.method in ("nfdp", "ldp") and self.relation != Relation.REPLACE_ONE.value:
      raise ValueError(
          f"Expected weighting='equal' or public weights for method={self.method!r} under relation="
          f"{self.relation!r}: weighting='size' weights the consensus by each party's size n_i, which adding or "
          "removing a record changes, so the broadcast consensus itself would reveal it (delta 1, whatever the "
          "sample). Use relation='replace-one', under which n_i is fixed.")
    _validate.choice("vmap", self.vmap, VMAP_MODES)
    s("eval_every", _validate.integer("eval_every", self.eval_every, minimum=1))

  def _readers(self) -> tuple[tuple[str, bool, str], ...]:
    """(setting, whether this run reads it, where it is read) for the settings only some runs read.

    Those of :data:`_ROUND_SETTINGS` are read only in rounds: with ``rounds=0`` nothing is released.
    """
    rounds = self.rounds > 0
    return (
        ("k", self.reads_k, "method 'nfdp' or 'local-sample' (the sample size), or 'ldp' without ldp_delta "
         "(NFDP's p for k is its default delta)"),
        ("with_replacement", self.reads_k, "method 'nfdp' or 'local-sample', or 'ldp' without ldp_delta"),
        ("ldp_epsilon", self.method == "ldp", "method 'ldp' (its noise)"),
        ("ldp_clip", self.has_ldp_table and self.aggregation == "logits" and rounds,
         "aggregation='logits', method 'nfdp' or 'ldp' and rounds >= 1 (argmax and softmax rows need no clip, and "
         "a run of no rounds releases nothing it would clip)"),
        *((name, self.collaborates and rounds, "a method that collaborates, 'nfdp', 'np' or 'ldp', and rounds >= 1 "
           "(the others, and a run of no rounds, release nothing and query no public data)")
          for name in _RELEASE_SETTINGS),
        *((name, rounds, "rounds >= 1 (a run of no rounds trains and evaluates once, before any round)")
          for name in ("revisit_epochs", "eval_every")),
        ("relation", self.uses_sample or self.method == "ldp",
         "a method with a privacy statement, 'nfdp', 'local-sample' or 'ldp'"))

  def unread_settings(self) -> tuple[str, ...]:
    """The settings this method does not read (they hold their defaults); the run's report shows them as null."""
    return tuple(name for name, applies, _ in self._readers() if not applies)

  @property
  def uses_sample(self) -> bool:
    """Whether private data is accessed only through NFDP's sample."""
    return self.method in ("nfdp", "local-sample")

  @property
  def reads_k(self) -> bool:
    """Whether ``k`` and ``with_replacement`` matter: the methods that sample, and ``ldp`` without ``ldp_delta``."""
    return self.uses_sample or (self.method == "ldp" and self.ldp_delta is None)

  @property
  def has_ldp_table(self) -> bool:
    """Whether the report has the FedMD-LDP sigma table (and so reads ``ldp_delta`` and ``ldp_clip``)."""
    return self.method in ("nfdp", "ldp")

  @property
  def collaborates(self) -> bool:
    return self.method in ("nfdp", "np", "ldp")

  def party_specs(self) -> tuple[CNNSpec, ...]:
    """The N parties' architectures, width multiplier applied."""
    base = self.specs if self.specs is not None else FEDMD_SPECS
    return tuple(base[i % len(base)].scaled(self.width_multiplier) for i in range(self.num_parties))

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["specs"] = None if self.specs is None else [
        {"widths": list(x.widths), "dropout": x.dropout} for x in self.specs]
    d["weighting"] = self.weighting if isinstance(self.weighting, str) else list(self.weighting)
    return d

  def fingerprint(self, extra: Any = None) -> str:
    """SHA-256 of the configuration (and ``extra``), to match checkpoints to runs."""
    blob = json.dumps({"config": self.to_dict(), "extra": extra}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
