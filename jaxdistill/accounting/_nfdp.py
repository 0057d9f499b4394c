"""Privacy of FedMD-NFDP's "noise-free" sampling (Sun & Lyu, IJCAI 2021).

A party holding n records draws k of them once -- uniformly without
replacement (WOR) or as k i.i.d. uniform draws with replacement (WR) -- and
everything it ever releases is computed from that sample, public data and
independent randomness.

The paper (arXiv:2009.05537, §4, proofs in the appendix) states:

.. math::

   \\text{Thm 1 (WOR)}:\\ (\\varepsilon, \\delta) =
       \\Big(\\ln\\frac{n+1}{n+1-k},\\ \\frac{k}{n}\\Big), \\qquad
   \\text{Thm 2 (WR)}:\\ (\\varepsilon, \\delta) =
       \\Big(k\\ln\\frac{n+1}{n},\\ 1-\\big(\\tfrac{n-1}{n}\\big)^k\\Big).

What is actually true (spec/NFDP.md §1.1, checked by exact enumeration in
``tests/properties/test_nfdp_enumeration.py``): let x be the differing record
and p the probability that x is in the sample drawn from the dataset that
holds it. Conditioned on "x not sampled" the sample has exactly the law of the
neighbour's sample, so with the sample itself released (the worst case)

.. math::

   \\delta(\\varepsilon) = p \\quad\\text{for every } \\varepsilon \\ge 0,
   \\qquad \\varepsilon(\\delta) = \\infty \\text{ if } \\delta < p,\\ 0 \\text{ otherwise}.

The profile is *flat*: the paper's delta is tight, and its epsilon is
vacuous (the same delta already holds at epsilon = 0). A flat profile at p is
exactly the profile of publishing the sampled records in the clear, so
whenever p >= 1/n the guarantee permits publishing records verbatim; this
module always reports that beside the paper's pair.

No dp-accounting DpEvent expresses "release a function of the sample, no
noise" (``Sampled*DpEvent(NonPrivateDpEvent())`` is unsupported in 0.6.0, and
Renyi DP cannot express it at all: outputs containing x have probability 0
under the neighbour). We therefore use the exact closed form above, and hand
dp-accounting the flat profile as the PLD ``from_privacy_parameters(0, p)``,
which is exact for it, to compose NFDP with other mechanisms.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from jaxdistill import _validate
from jaxdistill.accounting._relation import PrivacyStatement, PrivacyWarning, Relation

__all__ = [
    "nfdp_paper_guarantee",
    "nfdp_inclusion_probability",
    "nfdp_privacy",
    "NfdpPrivacy",
    "MAX_COUNT",
]

#: Largest n, k and rounds taken. They are counts of records and draws; beyond 10^18 k/n and 1/n fall
#: towards float64's underflow (n = 10^400 gave delta = 3/n = 0.0, a false claim of no privacy loss) and
#: Python ints past ~1.8e308 cannot become floats at all.
MAX_COUNT = 10**18


def _check_nk(n: Any, k: Any, with_replacement: Any, relation: Relation) -> tuple[int, int, bool]:
  n = _validate.integer("n", n, minimum=1, maximum=MAX_COUNT)
  k = _validate.integer("k", k, minimum=1, maximum=MAX_COUNT)
  with_replacement = _validate.boolean("with_replacement", with_replacement)
  if not with_replacement and k > n:
    raise ValueError(f"Expected k={k} <= n={n} for sampling without replacement.")
  if relation in (Relation.REMOVE_ONE, Relation.ADD_OR_REMOVE):
    # The neighbour without x holds n - 1 records and must be able to sample.
    if n < 2:
      raise ValueError(f"Expected n={n} >= 2 under relation={relation.value}: the neighbour holds n - 1 records.")
    if not with_replacement and k > n - 1:
      raise ValueError(
          f"Expected k={k} <= n - 1 = {n - 1} for sampling without replacement under "
          f"relation={relation.value}: the neighbour holds only n - 1 records.")
  return n, k, with_replacement


def nfdp_paper_guarantee(n: int, k: int, *, with_replacement: bool = False) -> tuple[float, float]:
  """The paper's (epsilon, delta): Theorem 1 (WOR) or Theorem 2 (WR).

  These are the numbers the paper prints. They are *valid* (never violated,
  see :func:`nfdp_privacy`) but the epsilon is vacuous: the exact profile is
  flat at delta = k/n (WOR) or 1 - (1 - 1/n)^k (WR).

  Args:
    n: number of records the party holds (1 <= n <= ``MAX_COUNT`` = 10^18).
    k: sample size (1 <= k <= ``MAX_COUNT``; <= n without replacement).
    with_replacement: Theorem 2 if True, else Theorem 1.

  Returns:
    ``(epsilon, delta)`` as float64.

  References:
    Sun & Lyu, "Federated Model Distillation with Noise-Free Differential
    Privacy", IJCAI 2021, Theorems 1 and 2. https://arxiv.org/abs/2009.05537

  >>> eps, delta = nfdp_paper_guarantee(300, 3)
  >>> round(eps, 6), delta
  (0.010017, 0.01)
  """
  n, k, with_replacement = _check_nk(n, k, with_replacement, Relation.ADD_ONE)
  if with_replacement:
    eps = k * math.log1p(1.0 / n)
    delta = -math.expm1(k * math.log1p(-1.0 / n)) if n > 1 else 1.0
  else:
    # ln((n+1)/(n+1-k)) = log1p(k/(n+1-k)): the ratio itself rounds to 1.0 for n >~ 1e16 (eps = 0).
    eps = math.log1p(k / (n + 1 - k))
    delta = k / n
  return float(eps), float(delta)


def nfdp_inclusion_probability(n: int, k: int, *, with_replacement: bool = False,
                               relation: Any = Relation.ADD_OR_REMOVE) -> float:
  """p = Pr[the differing record is in the sample], the exact flat delta.

  With m the size of the dataset that holds the differing record:

  ============================  ===========  =====================
  relation                      WOR p        WR p
  ============================  ===========  =====================
  add-one (n vs n + 1)          k/(n+1)      1 - (n/(n+1))^k
  remove-one (n vs n - 1)       k/n          1 - (1 - 1/n)^k
  add-remove (worst of both)    k/n          1 - (1 - 1/n)^k
  replace-one (n vs n)          k/n          1 - (1 - 1/n)^k
  ============================  ===========  =====================

  ``add-one`` takes the party's n records as the smaller dataset: its p is
  the probability that a record the party does *not* hold, added as the
  (n+1)-th, is sampled. It covers that hypothetical record only. For a
  record x the party holds, the add-one pair is (D minus x, D), whose
  larger dataset has n records, so its exact delta is k/n (WOR) or
  1 - (1 - 1/n)^k (WR): the ``remove-one`` / ``add-remove`` figure, which is
  larger than the ``add-one`` one. Report ``add-remove`` (the default) to
  cover the records held.

  Args:
    n: the party's dataset size.
    k: sample size.
    with_replacement: WR if True.
    relation: a :class:`Relation` or its string value.
  """
  rel = Relation.parse(relation)
  n, k, with_replacement = _check_nk(n, k, with_replacement, rel)
  m = n + 1 if rel is Relation.ADD_ONE else n
  if with_replacement:
    return float(-math.expm1(k * math.log1p(-1.0 / m))) if m > 1 else 1.0
  return k / m


@dataclasses.dataclass(frozen=True)
class NfdpPrivacy:
  """The honest privacy report of NFDP sampling for one party.

  Attributes:
    n: the party's dataset size.
    k: sample size.
    with_replacement: WR (Theorem 2) or WOR (Theorem 1).
    relation: neighbouring relation of the exact profile.
    rounds: number of rounds R the released quantities span.
    resample_each_round: False for the paper's algorithm (one sample reused,
      no growth with R); True if a fresh sample is drawn every round.
    paper_epsilon, paper_delta: the paper's pair (always for add/remove with
      the party's n, as printed).
    inclusion_probability: p for one draw under ``relation``.
    flat_delta: the exact delta(eps) for every eps >= 0: p when the sample is
      reused, 1 - (1 - p)^R when resampled every round.
    records_exposed: expected number of the party's records the released
      output may reveal verbatim (distinct records in the sample(s)).
    warnings: machine-readable caveats.
  """

  n: int
  k: int
  with_replacement: bool
  relation: Relation
  rounds: int
  resample_each_round: bool
  paper_epsilon: float
  paper_delta: float
  inclusion_probability: float
  flat_delta: float
  records_exposed: float
  warnings: tuple[PrivacyWarning, ...]

  def __post_init__(self):
    # Built by :func:`nfdp_privacy`; checked here too so that a hand-built report cannot claim delta = 2
    # or a negative epsilon (deltas are probabilities in [0, 1], the paper's epsilon is >= 0).
    object.__setattr__(self, "n", _validate.integer("n", self.n, minimum=1, maximum=MAX_COUNT))
    object.__setattr__(self, "k", _validate.integer("k", self.k, minimum=1, maximum=MAX_COUNT))
    object.__setattr__(self, "with_replacement", _validate.boolean("with_replacement", self.with_replacement))
    object.__setattr__(self, "relation", Relation.parse(self.relation))
    object.__setattr__(self, "rounds", _validate.integer("rounds", self.rounds, minimum=1, maximum=MAX_COUNT))
    object.__setattr__(self, "resample_each_round",
                       _validate.boolean("resample_each_round", self.resample_each_round))
    object.__setattr__(self, "paper_epsilon", _validate.nonnegative("paper_epsilon", self.paper_epsilon))
    for name in ("paper_delta", "inclusion_probability", "flat_delta"):
      object.__setattr__(self, name, _validate.probability(name, getattr(self, name)))
    object.__setattr__(self, "records_exposed", _validate.nonnegative("records_exposed", self.records_exposed))
    object.__setattr__(self, "warnings", tuple(self.warnings))

  @property
  def one_over_n(self) -> float:
    return 1.0 / self.n

  def delta_for_epsilon(self, epsilon: Any) -> float:
    """Exact delta at ``epsilon``: the flat value, whatever epsilon >= 0."""
    _validate.nonnegative("epsilon", epsilon, allow_inf=True)
    return self.flat_delta

  def epsilon_for_delta(self, delta: Any) -> float:
    """Exact epsilon at ``delta``: inf below the flat delta, else 0."""
    d = _validate.probability("delta", delta)
    return math.inf if d < self.flat_delta else 0.0

  def paper_pair_holds(self) -> bool:
    """Whether the paper's (epsilon, delta) is implied by the exact profile."""
    return _covers(self.paper_delta, self.delta_for_epsilon(self.paper_epsilon))

  def statement(self, epsilon: Any = None) -> PrivacyStatement:
    """A :class:`PrivacyStatement` at ``epsilon`` (default: the paper's)."""
    eps = self.paper_epsilon if epsilon is None else _validate.nonnegative("epsilon", epsilon)
    return PrivacyStatement(
        mechanism="nfdp-sampling",
        relation=self.relation,
        epsilon=float(eps),
        delta=self.delta_for_epsilon(eps),
        count=self.rounds,
        method="exact-flat-profile",
        parameters={
            "n": self.n, "k": self.k, "with_replacement": self.with_replacement,
            "rounds": self.rounds, "resample_each_round": self.resample_each_round,
        },
        warnings=self.warnings,
    )

  def to_pld(self, value_discretization_interval: float = 1e-4) -> pld_lib.PrivacyLossDistribution:
    """The exact flat profile as a dp-accounting PLD, to compose with others.

    ``from_privacy_parameters(0, p)`` puts mass p at +inf and 1 - p at loss 0,
    which is exactly the privacy loss distribution of NFDP.

    Args:
      value_discretization_interval: the PLD's grid step, a finite float > 0
        (the flat profile sits on losses 0 and +inf, so any such step is exact).
    """
    vdi = _validate.positive("value_discretization_interval", value_discretization_interval)
    return pld_lib.from_privacy_parameters(
        pld_common.DifferentialPrivacyParameters(epsilon=0.0, delta=self.flat_delta),
        value_discretization_interval=vdi)

  def to_dict(self, epsilon: Any = None) -> dict[str, Any]:
    eps = self.paper_epsilon if epsilon is None else _validate.nonnegative("epsilon", epsilon)
    return {
        "n": self.n,
        "k": self.k,
        "with_replacement": self.with_replacement,
        "relation": self.relation.value,
        "rounds": self.rounds,
        "resample_each_round": self.resample_each_round,
        "paper": {"epsilon": self.paper_epsilon, "delta": self.paper_delta},
        "exact": {
            "epsilon": float(eps),
            "delta": self.delta_for_epsilon(eps),
            "profile": "flat",
            "delta_for_every_epsilon": self.flat_delta,
            "epsilon_below_flat_delta": "inf",
        },
        "one_over_n": self.one_over_n,
        "records_exposed": self.records_exposed,
        "paper_pair_holds": self.paper_pair_holds(),
        "warnings": [w.to_dict() for w in self.warnings],
    }


def _covers(paper_delta: float, delta: float) -> bool:
  """Whether the paper's delta is at least the exact ``delta`` (to 1e-12 relative: float round-off)."""
  return delta <= paper_delta * (1 + 1e-12)


def nfdp_privacy(n: int, k: int, *, with_replacement: bool = False,
                 relation: Any = Relation.ADD_OR_REMOVE, rounds: int = 1,
                 resample_each_round: bool = False) -> NfdpPrivacy:
  """Exact privacy of NFDP sampling, reported beside the paper's pair.

  .. math::

     \\delta(\\varepsilon) = p \\ (\\text{one sample reused for all } R
     \\text{ rounds}),\\qquad
     \\delta(\\varepsilon) = 1 - (1 - p)^R \\ (\\text{fresh sample per round}).

  The resampled case is the R-fold composition of flat (0, p) profiles: the
  record stays hidden only if no round samples it.

  Formal guarantees:
    For every eps >= 0 the mechanism is (eps, flat_delta)-DP under
    ``relation`` and, for every delta < flat_delta, it is not (eps,
    delta)-DP for any finite eps (the profile is tight; see module doc).

  Args:
    n: the party's dataset size (1 <= n <= ``MAX_COUNT`` = 10^18).
    k: sample size (1 <= k <= ``MAX_COUNT``; <= n WOR, <= n - 1 WOR under remove/add-remove).
    with_replacement: WR if True.
    relation: neighbouring relation (default add/remove, the paper's).
      ``add-one`` gives the delta of a record the party does not hold,
      added to its n records (k/(n+1) WOR), not of the records it holds
      (k/n WOR, the ``add-remove`` figure); see
      :func:`nfdp_inclusion_probability`.
    rounds: 1 <= R <= ``MAX_COUNT``.
    resample_each_round: whether a fresh sample is drawn every round.

  Returns:
    An :class:`NfdpPrivacy` report.

  Raises:
    ValueError: on non-integer or out-of-range n, k or rounds, or an unknown
      relation.

  >>> r = nfdp_privacy(2880, 3)
  >>> r.flat_delta == 3 / 2880, r.epsilon_for_delta(1e-5)
  (True, inf)
  """
  rel = Relation.parse(relation)
  n, k, with_replacement = _check_nk(n, k, with_replacement, rel)
  rounds = _validate.integer("rounds", rounds, minimum=1, maximum=MAX_COUNT)
  resample_each_round = _validate.boolean("resample_each_round", resample_each_round)
  paper_eps, paper_delta = nfdp_paper_guarantee(n, k, with_replacement=with_replacement)
  p = nfdp_inclusion_probability(n, k, with_replacement=with_replacement, relation=rel)
  draws = rounds if resample_each_round else 1
  flat = -math.expm1(draws * math.log1p(-p)) if p < 1 else 1.0
  # Expected distinct records of the party that appear in the sample(s).
  per_record = nfdp_inclusion_probability(n, k, with_replacement=with_replacement,
                                          relation=Relation.REPLACE_ONE)
  exposed = n * (-math.expm1(draws * math.log1p(-per_record))) if per_record < 1 else float(n)

  warnings = [
      PrivacyWarning(
          code="paper_epsilon_vacuous",
          message=(f"The paper's epsilon={paper_eps:.4g} adds nothing: the exact profile is flat, "
                   f"delta(eps)={flat:.4g} for every eps >= 0, and no finite epsilon gives a smaller delta."),
          details={"paper_epsilon": paper_eps, "flat_delta": flat}),
  ]
  if flat >= 1.0 / n:
    warnings.append(PrivacyWarning(
        code="delta_at_least_1_over_n",
        message=(f"delta={flat:.4g} >= 1/n={1.0 / n:.4g}: the guarantee permits publishing records "
                 f"verbatim; about {exposed:.4g} of this party's records have no protection."),
        details={"delta": flat, "one_over_n": 1.0 / n, "records_exposed": exposed,
                 "delta_times_n": flat * n}))
  if resample_each_round and rounds > 1:
    warnings.append(PrivacyWarning(
        code="resampled_each_round",
        message=(f"A fresh sample every round composes: delta grows from {p:.4g} to "
                 f"1-(1-p)^{rounds}={flat:.4g}"
                 + (f", so the paper's one-sample pair (eps={paper_eps:.4g}, delta={paper_delta:.4g}) does not "
                    f"hold for these {rounds} rounds." if not _covers(paper_delta, flat) else ".")),
        details={"per_round_delta": p, "rounds": rounds, "delta": flat,
                 "paper_epsilon": paper_eps, "paper_delta": paper_delta}))
  return NfdpPrivacy(
      n=n, k=k, with_replacement=with_replacement, relation=rel, rounds=rounds,
      resample_each_round=resample_each_round, paper_epsilon=paper_eps,
      paper_delta=paper_delta, inclusion_probability=p, flat_delta=float(flat),
      records_exposed=float(exposed), warnings=tuple(warnings))


# FedMD-NFDP's settings (spec/NFDP.md §1.2): total private n split over N parties, and k.
PAPER_SETTINGS = (
    ("FEMNIST", 1, 28_800),
    ("FEMNIST", 10, 28_800),
    ("CIFAR", 1, 3_000),
    ("CIFAR", 10, 3_000),
)
PAPER_KS = (3, 16)


def nfdp_paper_rows() -> list[dict]:
  """:func:`nfdp_privacy` (relation add/remove) at every setting of the FedMD-NFDP paper.

  One row per (data set, N, k, with/without replacement) of ``PAPER_SETTINGS`` x
  ``PAPER_KS``: the paper's (epsilon, delta) (Theorems 1/2), the exact flat
  delta, 1/n, the records exposed and the warning codes. Plain floats, ready
  for JSON.
  """
  rows = []
  for data, parties, total in PAPER_SETTINGS:
    n = total // parties
    for k in PAPER_KS:
      for wr in (False, True):
        rep = nfdp_privacy(n, k, with_replacement=wr)
        rows.append({"dataset": data, "parties": parties, "n": n, "k": k, "with_replacement": wr,
                     "paper_epsilon": rep.paper_epsilon, "paper_delta": rep.paper_delta,
                     "exact_flat_delta": rep.flat_delta, "one_over_n": rep.one_over_n,
                     "records_exposed": rep.records_exposed,
                     "warnings": [w.code for w in rep.warnings]})
  return rows
