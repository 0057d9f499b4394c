"""Reverse k-NN private labeling end to end (Algorithm 1 of arXiv:2207.13253).

For t = 1..T (spec/REVERSE_KNN.md §1.2):

1. **Queries.** Embed D_pub (t = 1: a representation fitted on D_pub alone;
   t >= 2: the previous student's penultimate layer, reduced by a PCA fitted
   on D_pub), cluster it into s clusters with k-means++, and take as query
   q_j the public sample nearest centre j.
2. **Connection.** Every private record connects to its k nearest queries
   (reverse k-NN): T_i in {0,1}^s with exactly k ones.
3. **Votes.** A = sum_i T_i y_i^T is released through the chosen BSVS
   mechanism (central, local, shuffle), every private record being its own
   client (n = |D_priv|, spec §5 I11). The release is saved at once to the
   output directory's ledger; a re-run reuses it instead of paying again.
4. **Labels.** Query j gets argmax_y of its noisy votes (ties: the smallest
   label); every public sample inherits the label of its cluster's query.
   Acc_pl = fraction of D_pub labelled correctly.
5. **Student.** A CNN trained on the pseudo-labelled D_pub; Acc_pc on the
   evaluation split. Optionally (``StudentConfig.refine_rounds``) it is
   retrained on its own predictions times the vote shares
   (:func:`jaxdistill.labeling.refine_targets`), public data only.

Beside it, always: the same pipeline without noise (``mechanism="none"``)
and the supervised ceiling (the same student on D_pub's true labels).

Formal guarantees:
  The T releases are (epsilon, delta)-DP under replace-one at record level
  (D_priv and D'_priv of equal size, differing in one record), composed as
  :func:`jaxdistill.labeling.plan_budget` says. Queries, clusters,
  connections' *targets*, labels and students depend on D_priv only through
  earlier releases (post-processing and adaptive composition); the
  reverse k-NN rule is per record, so one record changes only its own k
  edges and the sensitivity of A is 2kr (spec §5 I1; r = 1). The noise-free
  baseline reads the exact votes and is NOT private: it is a reference for
  evaluation, disabled by ``baselines=False``.

References:
  Li, Wang, Wang, Li, Qian, Xin, Yang, "Fine-grained Private Knowledge
  Distillation", arXiv:2207.13253 (https://arxiv.org/abs/2207.13253),
  Algorithm 1, Propositions/Theorems 1-2 and §5 (experiments).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import pathlib
import time
import warnings
from typing import Any, Callable

import jax
import numpy as np

from jaxdistill import _validate
from jaxdistill._files import atomic_write, claimed_dir, keep_earlier_report
from jaxdistill._keys import fold_in_digest, secret_key, seed_key
from jaxdistill import data as data_lib
from jaxdistill.data._overlap import shared_images
from jaxdistill import mechanisms as mech_lib
from jaxdistill.accounting import PrivacyStatement, PrivacyWarning, Relation
from jaxdistill.labeling import _components as components
from jaxdistill.labeling._budget import (MULTI_MESSAGE_TV_RESERVE, BudgetPlan, clone_composed_epsilon,
                                        multi_message_plan_noise, plan_budget)
from jaxdistill.labeling._config import LabelingConfig
from jaxdistill.labeling._ledger import ReleaseLedger, StoredRelease, data_fingerprint
from jaxdistill.labeling._plots import PLOT_FILES
from jaxdistill.labeling._student import Student, refine_targets, train_student, vote_shares
from jaxdistill.simulation import simulate

__all__ = ["IterationResult", "ChainResult", "LabelingResult", "run_labeling", "fit_first_representation",
           "load_splits",
           "check_splits", "build_mechanism", "privacy_report"]

#: What the report and the plots name as the data set when the caller passed ``splits`` (config.dataset unused).
CALLER_SPLITS = "caller splits"

RELATION_TEXT = ("replace-one: D_priv and D'_priv have the same size and differ in one record "
                 "(record-level DP; every private record is its own client, n = |D_priv|)")

# Stream ids of the run's key: fold_in(key, stream) then fold_in(., iteration).
# _EMBED (iterations t >= 2: the student's embedding) has its own stream: under _REP, fold_in(rep_key, 2) is the
# key SCAN's fit splits off for its training steps (split(k, n)[i] == fold_in(k, i) under threefry).
# Stream 5 is unused (it was the supervised ceiling's): the ceiling now trains from the iteration-1 student's key,
# so that the gap between the two is paired; the numbers stay fixed so that no other stream's draws move.
_REP, _KMEANS, _NOISE, _STUDENT, _EMBED = 1, 2, 3, 4, 6
# Keys of the students of one draw. Draw i >= 1 trains from fold_in(base, 2^30 + i), refinement round r of a
# draw from fold_in(draw key, 2^29 + r) (r <= MAX_REFINE_ROUNDS = 1000). Small indices are taken: train_student
# splits its key, and threefry makes split(key, n)[j] == fold_in(key, j), so its init and fit keys are
# fold_in(key, 0) and fold_in(key, 1), and the fit key's epoch keys fold_in(fit key, e). A student keyed
# fold_in(base, j) for a small j would reuse keys of base's own training (as draws once did, and refinement
# rounds until 2026-12-02: round 1's init and fit keys were round 0's epoch keys 0 and 1).
_DRAW_BASE = 1 << 30
_REFINE_BASE = 1 << 29


def _draw_key(base: jax.Array, i: int) -> jax.Array:
  """The key of student (or ceiling) draw i: ``base`` for draw 0, so it does not depend on the draw count."""
  return base if i == 0 else jax.random.fold_in(base, _DRAW_BASE + i)


def _refine_key(draw_key: jax.Array, r: int) -> jax.Array:
  """The key of refinement round r >= 1 of the draw keyed ``draw_key`` (round 0 trains from ``draw_key``)."""
  return jax.random.fold_in(draw_key, _REFINE_BASE + r)


# -- data ----------------------------------------------------------------------------
def check_splits(splits: data_lib.LabelingSplits) -> int:
  """Validates caller-provided splits; returns the number of classes.

  Raises:
    ValueError: naming the problem (a part that is not an ImageData, wrong
      image shapes, fewer than 2 classes, mismatched classes, labels outside
      the classes, non-finite pixels or pixels outside [0, 1], empty splits,
      public or evaluation images that are also private images, evaluation
      images that are also public images).
  """
  if not isinstance(splits, data_lib.LabelingSplits):
    raise ValueError(f"Expected splits to be a jaxdistill.data.LabelingSplits; got {type(splits).__name__}.")
  parts = (("private", splits.private), ("public", splits.public), ("evaluation", splits.evaluation))
  for name, part in parts:
    if not isinstance(part, data_lib.ImageData):
      raise ValueError(f"Expected the {name} split to be a jaxdistill.data.ImageData; got {type(part).__name__}.")
  shape = splits.public.images.shape[1:]
  classes = splits.public.num_classes
  if classes < 2:  # one class leaves nothing to label, and the plots' top-two margin fails after the release
    raise ValueError(f"Expected at least 2 classes; the public split has {classes}.")
  if len(shape) != 3 or shape[0] < 8 or shape[1] < 8 or shape[2] < 1:
    raise ValueError(f"Expected images of at least 8x8 pixels and 1 channel for the student CNN; got {shape}.")
  for name, part in parts:
    img, lab = np.asarray(part.images), np.asarray(part.labels)
    if len(part) < 1:
      raise ValueError(f"Expected a non-empty {name} split.")
    if img.ndim != 4 or img.shape[1:] != shape:
      raise ValueError(f"Expected {name} images of shape [N, {', '.join(map(str, shape))}] like the public "
                       f"split; got {img.shape}.")
    if lab.dtype.kind not in "iu" or lab.min() < 0 or lab.max() >= classes:
      raise ValueError(f"Expected {name} labels to be integers in [0, {classes}) (the public split's "
                       f"classes); got dtype {lab.dtype}, range [{lab.min()}, {lab.max()}].")
    if part.num_classes != classes:
      raise ValueError(f"Expected {name} split to have {classes} classes like the public split; "
                       f"got {part.num_classes}.")
    if not np.isfinite(img).all():
      raise ValueError(f"Expected finite {name} pixels; found NaN or inf.")
    low, high = float(img.min()), float(img.max())
    if low < 0.0 or high > 1.0:  # the augmentations clip to [0, 1]; mixed scales would compare apples to pears
      raise ValueError(f"Expected {name} pixels in [0, 1] (ImageData's scale; divide bytes by 255); found "
                       f"range [{low:g}, {high:g}].")
  # Caller-supplied splits were not checked for D_priv records in D_pub (released whole) or D_eval.
  shared = shared_images(np.concatenate([splits.public.images, splits.evaluation.images]), splits.private.images)
  in_pub, in_eval = int(shared[:len(splits.public)].sum()), int(shared[len(splits.public):].sum())
  if in_pub or in_eval:
    raise ValueError(f"Expected splits whose public and evaluation images are not private records; {in_pub} public "
                     f"and {in_eval} evaluation images are also in the private split (D_pub is released whole, so no "
                     "privacy statement would hold for those records).")
  # Nor D_pub's images in D_eval: the student trains on D_pub, so Acc_pc (and the ceiling) would be measured partly
  # on its own training images.
  seen = int(shared_images(splits.evaluation.images, splits.public.images).sum())
  if seen:
    raise ValueError(f"Expected evaluation images that are not public images; {seen} of the {len(splits.evaluation)} "
                     "evaluation images are also in the public split, on which the student trains.")
  return int(classes)


def _check_caller_sizes(config: LabelingConfig, splits: data_lib.LabelingSplits) -> None:
  """Sizes set in ``config`` must be those of the caller's splits (the report states them, and they are in the
  release fingerprint); ``None``, the default, takes the splits as they are."""
  for name, label, part in (("private_size", "private", splits.private), ("public_size", "public", splits.public),
                            ("eval_size", "evaluation", splits.evaluation)):
    value = getattr(config, name)
    if value is not None and value != len(part):
      raise ValueError(f"Expected {name}={value} to be the size of the caller's {label} split, {len(part)} (leave "
                       f"{name} None when passing splits).")


def load_splits(config: LabelingConfig) -> data_lib.LabelingSplits:
  """Loads ``config.dataset`` and applies the paper's splits with the configured sizes."""
  # Check s against D_pub before loading anything (only the embedded set has no test split).
  _, pub, _ = config.sizes(config.dataset != "mnist-embedded")
  if config.num_queries > pub:
    raise ValueError(f"Expected num_queries (s)={config.num_queries} <= public_size={pub}: queries are "
                     "public samples.")
  train, test = data_lib.load_dataset(config.dataset, config.data_dir)
  priv, pub, ev = config.sizes(test is not None)
  return data_lib.paper_splits(train, test, seed=config.seed, public_size=pub, eval_size=ev,
                               private_size=priv)


# -- mechanisms ----------------------------------------------------------------------
def build_mechanism(config: LabelingConfig, plan: BudgetPlan, shape: mech_lib.BsvsShape,
                    num_private: int) -> mech_lib.BsvsMechanism | None:
  """The BSVS mechanism of one iteration (None for ``none``).

  Raises:
    ValueError: the mechanism refuses the per-iteration budget; with T > 1
      the message names the total epsilon (and delta) the caller set and
      the per-iteration share the plan gave the mechanism. A ``pld-clone``
      plan (shuffle-single over T > 1) made for another ``num_clients``
      whose composition at ``num_private`` exceeds the plan's epsilon is
      refused too.
  """
  if config.mechanism == "none":
    return None
  try:
    mech = _mechanism(config, plan, shape, num_private)
  except ValueError as err:
    if plan.iterations == 1:  # the per-iteration budget is the caller's own
      raise
    total = f"epsilon={config.epsilon!r}"
    share = f"epsilon={plan.epsilon_per_iteration:.6g}"
    if plan.delta_per_iteration:
      total += f", delta={config.resolved_delta(num_private):.6g}"
      share += f", delta={plan.delta_per_iteration:.6g}"
    raise ValueError(f"Expected {total} (the total over iterations={plan.iterations}) to leave each iteration a "
                     f"budget mechanism={config.mechanism} accepts; its per-iteration share {share} is refused: "
                     f"{err}") from None
  if plan.method == "pld-clone":  # the share was accepted; the question is whether the plan was made for this n
    _check_composed_clones(plan, mech)
  return mech


def _mechanism(config: LabelingConfig, plan: BudgetPlan, shape: mech_lib.BsvsShape,
               num_private: int) -> mech_lib.BsvsMechanism:
  eps, delta = plan.epsilon_per_iteration, plan.delta_per_iteration
  m = config.mechanism
  if m == "central":
    if config.central_noise == "discrete-laplace":
      return mech_lib.CentralDiscreteLaplace(shape, eps, Relation.REPLACE_ONE)
    return mech_lib.CentralLaplace(shape, eps, Relation.REPLACE_ONE)
  if m == "local-rr":
    return mech_lib.RandomizedResponse(shape, eps)
  if m == "local-collision":
    return mech_lib.Collision(shape, eps)
  if m == "shuffle-multi":
    mech = mech_lib.ShuffleMultiMessage(shape, eps, delta, num_private)
    if plan.method == "pld-multi-message":
      _check_composed_noise(plan, mech)
    return mech
  return mech_lib.ShuffleSingleMessage(shape, eps, delta, num_private, local=config.shuffle_local)


def _check_composed_clones(plan: BudgetPlan, mech: mech_lib.ShuffleSingleMessage) -> None:
  """A ``pld-clone`` plan composed the clone pair's PLD at the n it was given: the mechanism's eps0 and n must
  compose to the plan's epsilon (the same calculation, cached), else the plan was made for another n."""
  composed = clone_composed_epsilon(mech.eps0, mech.num_clients, plan.iterations, plan.total_delta)
  if not composed <= plan.composed_epsilon:
    raise ValueError(f"Expected the plan's num_clients to be the mechanism's num_clients={mech.num_clients}: at "
                     f"that n, T={plan.iterations} releases at eps0={mech.eps0:.6g} compose to epsilon="
                     f"{composed:.6g} > the planned {plan.composed_epsilon:.6g}.")


def _check_composed_noise(plan: BudgetPlan, mech: mech_lib.ShuffleMultiMessage) -> None:
  """A ``pld-multi-message`` plan composed the PLD of the noise calibrated at its share: the mechanism must carry
  that noise (more flooding, a post-processing, is fine), and its sampler's total-variation term over the T
  releases, (1 + e^eps) T tv, must fit in the share of delta the plan kept for it."""
  planned = multi_message_plan_noise(plan.epsilon_per_iteration, plan.delta_per_iteration, mech.shape.k, mech.shape.r)
  noise = mech.noise
  if (noise.p, noise.p_flood) != (planned.p, planned.p_flood) or noise.rho < planned.rho:
    raise ValueError(f"Expected the mechanism's noise {noise} to be the planned {planned} (or more flooding): the "
                     f"plan composed that noise's PLD.")
  tv = (1.0 + math.exp(plan.composed_epsilon)) * plan.iterations * mech.sampler_tv_bound()
  room = plan.total_delta * MULTI_MESSAGE_TV_RESERVE
  if tv > room:
    raise ValueError(f"Expected the sampler's total-variation term (1 + e^eps) T tv = {tv:.3g} <= delta * "
                     f"{MULTI_MESSAGE_TV_RESERVE:g} = {room:.3g}, the share the plan kept for it; with num_clients="
                     f"{mech.num_clients} use a larger delta or fewer iterations.")


def _release_statement(config: LabelingConfig, mech: mech_lib.BsvsMechanism | None) -> PrivacyStatement | None:
  """The privacy statement of one release (None for ``none``), as the report and the ledger record it.

  It is ``mech.privacy()`` when the connection rule bounds the sensitivity
  of A. Appendix C's balanced rules do not (one record can re-route other
  records' edges), so no finite (epsilon, delta) holds: the statement is
  epsilon = inf, delta = 1, method ``no-guarantee``, and what the noise was
  calibrated for is kept as ``nominal_epsilon``, ``nominal_delta`` and
  ``nominal_method`` in its parameters (as in the total statement).
  """
  if mech is None:
    return None
  statement = mech.privacy()
  if components.connection_privacy(config.connection, config.k, config.num_queries).dp_valid:
    return statement
  return dataclasses.replace(
      statement, epsilon=math.inf, delta=1.0, method="no-guarantee",
      parameters={**statement.parameters, "nominal_epsilon": statement.epsilon, "nominal_delta": statement.delta,
                  "nominal_method": statement.method},
      warnings=_nominal_only(statement.warnings, config.connection))


def _calibration(privacy: Any) -> Any:
  """What a recorded release statement says the noise was drawn under: its numbers, not its words.

  Warnings and the method's name are left out; a ``no-guarantee`` statement
  contributes its nominal epsilon and delta, so a balanced-rule release
  recorded before those were rewritten (finite epsilon) still compares equal.
  """
  if not isinstance(privacy, dict):
    return privacy
  params = dict(privacy.get("parameters") or {})
  nominal = {name: params.pop(f"nominal_{name}") for name in ("epsilon", "delta", "method")
             if f"nominal_{name}" in params}
  return {"mechanism": privacy.get("mechanism"), "relation": privacy.get("relation"),
          "epsilon": nominal.get("epsilon", privacy.get("epsilon")),
          "delta": nominal.get("delta", privacy.get("delta")), "count": privacy.get("count"), "parameters": params}


def _differences(name: str, old: Any, new: Any) -> list[str]:
  """``name.key: old -> new`` for every differing (nested) entry of two JSON values."""
  if isinstance(old, dict) and isinstance(new, dict):
    return [d for key in sorted(set(old) | set(new), key=str)
            for d in _differences(f"{name}.{key}", old.get(key), new.get(key))]
  return [] if old == new else [f"{name}: {old!r} -> {new!r}"]


def _privacy_check(statement: PrivacyStatement | None, plan: BudgetPlan) -> Callable[[dict], str | None]:
  """The ledger's check of a stored release: was it drawn under the calibration this run would use?

  A library version that calibrates the same settings differently (another noise parameter, budget split or
  analysis) would otherwise have its statement printed for votes drawn under the earlier one.
  """
  expected = json.loads(json.dumps({"privacy": _calibration(statement.to_dict() if statement else None),
                                    "budget": plan.to_dict()}))

  def check(record: dict) -> str | None:
    found = {"privacy": _calibration(record.get("privacy")), "budget": record.get("budget")}
    diff = _differences("privacy", found["privacy"], expected["privacy"]) + _differences(
        "budget", found["budget"], expected["budget"])
    if not diff:
      return None
    shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
    return f"recorded privacy calibration -> this run's: {shown}"

  return check


def _warnings(config: LabelingConfig, plan: BudgetPlan, statement: PrivacyStatement | None,
              n: int, rule: Any) -> list[PrivacyWarning]:
  out: list[PrivacyWarning] = list(rule.warnings)
  if config.mechanism == "none":
    out.append(PrivacyWarning("no_privacy", "mechanism=none releases the exact votes: nothing is private."))
  if config.mechanism != "none" and plan.composed_delta >= 1.0 / n:  # the delta the T releases compose to
    out.append(PrivacyWarning(
        "delta_at_least_1_over_n",
        f"delta={plan.composed_delta:.3g} >= 1/n={1.0 / n:.3g}: a mechanism that publishes one random record "
        "verbatim meets such a delta; choose delta well below 1/n.",
        {"delta": plan.composed_delta, "one_over_n": 1.0 / n}))
  if config.mechanism.startswith("local") and config.delta:
    out.append(PrivacyWarning("delta_unused", f"delta={config.delta} is not used: the local mechanisms are "
                              "pure eps-LDP (delta = 0).", {"delta": config.delta}))
  if config.mechanism != "none" and config.noise_seed is None:
    out.append(PrivacyWarning(
        "noise_from_public_seed",
        f"The vote noise is derived from seed={config.seed}, which this report records: results reproduce, "
        "but anyone who knows the seed can subtract the noise. For a real release use a secret noise seed "
        "(CLI: --secret-noise) and keep the ledger's output directory.", {"seed": config.seed}))
  if config.baselines and config.mechanism != "none":
    out.append(PrivacyWarning(
        "baselines_not_private",
        "The noise-free baseline reads the exact votes of D_priv: its numbers are an evaluation reference "
        "NOT covered by this statement (run with baselines off in deployment).", {}))
  if statement is not None:
    out.extend(statement.warnings if rule.dp_valid else _nominal_only(statement.warnings, config.connection))
  return out


def _nominal_only(warnings: Any, connection: str) -> tuple[PrivacyWarning, ...]:
  """A mechanism's caveats ("each release is (0.5, 7.8e-13)-DP") under a rule with no guarantee: nominal only."""
  prefix = f"Nominal only (connection={connection} has no DP guarantee): "
  return tuple(w if w.message.startswith(prefix) else dataclasses.replace(w, message=prefix + w.message)
               for w in warnings)


def group_privacy_note(epsilon: float, delta: float) -> str:
  """What the per-record statement gives a client holding m records: group privacy over m replacements.

  An (eps, delta)-DP mechanism is (m eps, m e^{(m-1) eps} delta)-DP for data sets that differ in m records
  (Dwork & Roth 2014, group privacy; a chain of m neighbours): delta grows by far more than m when
  delta > 0 (spec §5 I11). The note used to say "m*epsilon-protected" for the shuffle mechanisms too.
  """
  if delta == 0:
    return (f"A client holding m records is (m*epsilon, 0)-DP by group privacy: for m = 10, ({10 * epsilon:.6g}, 0).")
  log_delta = math.log(10) + 9 * epsilon + math.log(delta)
  delta_10 = 1.0 if log_delta >= 0 else math.exp(log_delta)
  return ("A client holding m records is (m*epsilon, m*e^((m-1)*epsilon)*delta)-DP by group privacy: for m = 10, "
          f"({10 * epsilon:.6g}, {delta_10:.3g}){' (no guarantee)' if delta_10 >= 1 else ''}.")


def privacy_report(config: LabelingConfig, plan: BudgetPlan, per_iteration: list[PrivacyStatement | None],
                   n: int) -> dict[str, Any]:
  """The report's privacy section: the total statement, how it composes, warnings, notes.

  When the connection rule has no DP guarantee (Appendix C's balanced
  rules) the statement's epsilon is ``inf`` and ``nominal_epsilon`` records
  what the noise was calibrated for.
  """
  rule = components.connection_privacy(config.connection, config.k, config.num_queries)
  first = next((s for s in per_iteration if s is not None), None)
  warnings = _warnings(config, plan, first, n, rule)
  valid = rule.dp_valid or config.mechanism == "none"
  total = PrivacyStatement(
      mechanism=f"{config.connection}-labeling/{config.mechanism}", relation=Relation.REPLACE_ONE,
      epsilon=plan.composed_epsilon if valid else math.inf, delta=plan.composed_delta if valid else 1.0,
      count=plan.iterations, method=plan.method if valid else "no-guarantee",
      parameters={"epsilon_per_iteration": plan.epsilon_per_iteration,
                  "delta_per_iteration": plan.delta_per_iteration, "iterations": plan.iterations,
                  "nominal_epsilon": plan.composed_epsilon, "nominal_delta": plan.composed_delta,
                  "connection": config.connection, "declared_out_degree": rule.shape_k,
                  "k": config.k, "num_queries": config.num_queries, "num_private_records": n,
                  "sensitivity_l1": rule.sensitivity() if config.mechanism == "central" else None,
                  "model": config.mechanism.split("-")[0]},
      warnings=tuple(warnings))
  notes = [
      "Queries, clusters and the first representation are fitted on D_pub only; queries of iterations "
      "t >= 2 use the student trained on earlier releases (post-processing), so Q depends on D_priv only "
      "through DP outputs (spec §5 I1) and the T releases compose adaptively.",
      rule.guarantee,
      "Pseudo-labels, the student (and its self-training rounds on D_pub, if any) and every accuracy are "
      "post-processing of the releases (evaluation uses public labels only), except the noise-free baseline.",
  ]
  if config.mechanism.startswith(("local", "shuffle")):
    messages = ("its shuffle-multi messages (several per record) each iteration" if config.mechanism == "shuffle-multi"
                else "one message per iteration (T in all)")
    notes.append(f"Every record sends {messages}; the guarantee is per record (one record per client, spec §5 I11).")
  if valid and math.isfinite(total.epsilon):
    notes.append(group_privacy_note(total.epsilon, total.delta))
  return {"statement": total.to_dict(), "neighbouring_relation": RELATION_TEXT,
          "connection": rule.to_dict(),
          "composition": plan.describe() if valid else (
              f"No DP guarantee: connection={config.connection} couples the records (balanced_connection_no_dp). "
              f"The noise was calibrated as if: {plan.describe()}"),
          "budget": plan.to_dict(),
          "per_iteration": [s.to_dict() if s is not None else None for s in per_iteration],
          "warnings": [w.to_dict() for w in warnings], "notes": notes}


# -- results -------------------------------------------------------------------------
@dataclasses.dataclass
class IterationResult:
  """One iteration of one chain.

  Attributes:
    iteration: t.
    queries: int64 ``[s]`` query indices into D_pub.
    assignment: int64 ``[|D_pub|]`` cluster of every public sample.
    votes: float64 ``[s, |Y|]`` released (noisy) votes.
    query_labels: int64 ``[s]`` argmax labels.
    pseudo_labels: int64 ``[|D_pub|]`` labels inherited by D_pub.
    acc_pl: fraction of D_pub correctly labelled.
    acc_pc: student accuracy on the evaluation split.
    reused: whether the votes came from the ledger.
    release_file: the ledger file of the release (None without a ledger).
    privacy: the release's statement (None for ``none``; epsilon = inf,
      the calibrated numbers as ``nominal_*`` parameters, under a
      connection rule without a guarantee).
    timings: seconds per stage.
    student: the final student of the iteration.
    refined_acc_pl: fraction of D_pub whose last self-training target
      (``StudentConfig.refine_rounds`` >= 1) has its argmax on the true
      label (None without refinement).
    acc_pc_draws: Acc_pc of every student seed trained on this
      iteration's votes (``LabelingConfig.student_seeds`` at the final
      iteration, else one); the first is ``acc_pc``.
    queries_from_other_student: for a release reused from the ledger at
      t >= 2, the student settings whose embedding chose its queries when
      they differ from this run's (the report's ``releases.notes`` says
      so); else None.
  """

  iteration: int
  queries: np.ndarray
  assignment: np.ndarray
  votes: np.ndarray
  query_labels: np.ndarray
  pseudo_labels: np.ndarray
  acc_pl: float
  acc_pc: float
  reused: bool
  release_file: str | None
  privacy: PrivacyStatement | None
  timings: dict[str, float]
  student: Student | None = dataclasses.field(default=None, repr=False)
  refined_acc_pl: float | None = None
  acc_pc_draws: tuple[float, ...] = ()
  queries_from_other_student: dict | None = None

  def summary(self) -> dict[str, Any]:
    empty = int(np.sum(np.all(self.votes == 0, axis=1)))
    return {"iteration": self.iteration, "acc_pl": self.acc_pl, "acc_pc": self.acc_pc,
            "queries_from_other_student": self.queries_from_other_student,
            "acc_pc_draws": list(self.acc_pc_draws),
            "refined_acc_pl": self.refined_acc_pl,
            "reused_release": self.reused, "release_file": self.release_file,
            "queries_without_votes_in_release": empty,
            "privacy": self.privacy.to_dict() if self.privacy is not None else None,
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()}}


@dataclasses.dataclass
class ChainResult:
  """T iterations of one mechanism."""

  mechanism: str
  iterations: list[IterationResult]

  @property
  def final(self) -> IterationResult:
    return self.iterations[-1]


@dataclasses.dataclass
class LabelingResult:
  """Everything a run produced.

  Attributes:
    config: the settings.
    plan: the budget plan.
    private: the chain with the chosen mechanism.
    noise_free: the same chain without noise (None without baselines).
    ceiling_acc: the supervised ceiling's accuracy (None without baselines);
      the first of ``ceiling_draws``.
    report: the JSON-ready report (also written to ``out_dir/report.json``).
    splits: the data splits used.
    representation: the first iteration's fitted representation
      (``embed(images) -> float32 [N, d]``), reusable via
      ``run_labeling(..., representation=...)``.
    ceiling_draws: the ceiling of each of ``config.ceiling_seeds`` student
      seeds (empty without baselines).
  """

  config: LabelingConfig
  plan: BudgetPlan
  private: ChainResult
  noise_free: ChainResult | None
  ceiling_acc: float | None
  report: dict
  splits: data_lib.LabelingSplits = dataclasses.field(repr=False)
  representation: Callable[[np.ndarray], np.ndarray] | None = dataclasses.field(default=None, repr=False)
  ceiling_draws: tuple[float, ...] = ()


# -- the chain -----------------------------------------------------------------------
class _Timer:

  def __init__(self):
    self.times: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    start = time.perf_counter()
    try:
      yield
    finally:
      self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start


def _bar(total: int, desc: str, enabled: bool):
  if not enabled:
    return contextlib.nullcontext(None)
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)


def _targets(config: LabelingConfig, votes: np.ndarray, assignment: np.ndarray, pseudo: np.ndarray) -> np.ndarray:
  if config.student.targets == "hard":
    return pseudo.astype(np.int32)
  return vote_shares(votes, assignment)


def _run_chain(config: LabelingConfig, plan: BudgetPlan, splits: data_lib.LabelingSplits, num_classes: int,
               embed0: Callable[[np.ndarray], np.ndarray], key: jax.Array, ledger: ReleaseLedger | None,
               progress: bool, cache: dict, mech: mech_lib.BsvsMechanism | None,
               representation_source: str) -> ChainResult:
  """T iterations with ``mech`` (the same mechanism every iteration; None: exact votes).

  ``cache`` shares the first iteration between chains (it is the same for every chain): its embeddings,
  queries, clusters and connections, or the queries and clusters of a stored first release.
  """
  pub, priv, ev = splits.public, splits.private, splits.evaluation
  n, s, k = len(priv), config.num_queries, config.k
  results: list[IterationResult] = []
  student: Student | None = None
  degree = components.connection_privacy(config.connection, k, s).shape_k  # s for k-NN labeling
  shape = mech_lib.BsvsShape(s, num_classes, degree)
  statement = _release_statement(config, mech)
  student_settings = json.loads(json.dumps(config.student.to_dict()))  # as a ledger record reads back
  for t in range(1, config.iterations + 1):
    timer = _Timer()
    stored = ledger.peek(t) if ledger is not None else None
    other_student = None
    if stored is not None:
      queries, assignment, votes = stored.queries, stored.assignment, stored.votes
      _check_stored(stored, s, num_classes, len(pub))
      ledger.mark_reused(stored)  # only once it is known to fit: the history must not record a refused reuse
      recorded = stored.record.get("query_student")
      if recorded is not None and recorded != student_settings:  # None: t = 1, or a release recorded before this
        other_student = recorded
      if t == 1:  # the noise-free chain starts from the released queries, as it does after a fresh release
        cache[(1, "queries")] = (queries, assignment)
    else:
      with timer("embed"):
        embed = embed0 if t == 1 else student.embedding(
            jax.random.fold_in(jax.random.fold_in(key, _EMBED), t), pub.images)
        pub_emb = embed(pub.images) if (t, "pub") not in cache else cache[(t, "pub")]
      with timer("queries"):
        if (t, "queries") in cache:
          queries, assignment = cache[(t, "queries")]
        else:
          queries, assignment = components.select_queries(jax.random.fold_in(jax.random.fold_in(key, _KMEANS), t),
                                                          pub_emb, s)
      with timer("embed"):
        if (t, "priv") in cache:
          priv_emb = cache[(t, "priv")]
        elif t == 1:
          priv_emb = embed(priv.images)
        else:
          with _bar(len(priv), f"student embedding of D_priv t={t}", progress) as bar:
            parts = []
            for part in embed._feature_batches(priv.images):  # one compilation for all the batches
              parts.append(part)
              if bar is not None:
                bar.update(part.shape[0])
            priv_emb = np.concatenate(parts)
      with timer("connection"):
        buckets = (cache[(t, "buckets")] if (t, "buckets") in cache
                   else components.connect(config.connection, priv_emb, pub_emb[queries], k).buckets)
      if t == 1:  # the first iteration is the same for every chain: share it
        cache.update({(1, "pub"): pub_emb, (1, "priv"): priv_emb, (1, "queries"): (queries, assignment),
                      (1, "buckets"): buckets})
      with timer("votes"):
        inputs, _ = mech_lib.make_bsvs_input(buckets, priv.labels[:, None], num_buckets=s,
                                             num_labels=num_classes, k=degree)
        if mech is None:
          votes = np.asarray(mech_lib.bsvs_counts(inputs, shape), np.float64)
        else:
          noise_root = key if config.noise_seed is None else _secret_release_key(config, buckets, priv.labels)
          noise_key = jax.random.fold_in(jax.random.fold_in(noise_root, _NOISE), t)
          votes = simulate(noise_key, mech, inputs).estimate
      if ledger is not None:
        record = {"mechanism": config.mechanism, "bsvs_mechanism": mech.name if mech else "none",
                  "privacy": statement.to_dict() if statement else None, "seed": config.seed,
                  "budget": plan.to_dict(), "num_clients": n, "num_queries": s, "k": k,
                  "representation_source": representation_source, "library_version": _library_version(),
                  # The student whose embedding chose these queries (t >= 2); a re-run with other student
                  # settings reuses the release as it is and says so.
                  "query_student": student_settings if t >= 2 else None}
        stored_file = ledger.record(t, votes, queries, assignment, record).path
    query_labels = np.argmax(votes, axis=1).astype(np.int64)
    pseudo = query_labels[assignment]
    acc_pl = float(np.mean(pseudo == pub.labels, dtype=np.float64))
    with timer("student"):
      student_key = jax.random.fold_in(jax.random.fold_in(key, _STUDENT), t)
      draws = config.student_seeds if t == config.iterations else 1
      epochs = config.student.epochs * (1 + config.student.refine_rounds) * draws
      with _bar(epochs, f"student {config.mechanism} t={t}", progress) as bar:
        update = bar.update if bar is not None else None
        student, refined_acc_pl = _train_student_chain(config, student_key, pub, votes, assignment, pseudo,
                                                       num_classes, update)
        acc_pc = student.accuracy(ev.images, ev.labels)
        acc_pc_draws = [acc_pc]
        for i in range(1, draws):  # more student seeds on the same votes: post-processing
          extra, _ = _train_student_chain(config, _draw_key(student_key, i), pub, votes, assignment,
                                          pseudo, num_classes, update)
          acc_pc_draws.append(extra.accuracy(ev.images, ev.labels))
    release_file = None
    if ledger is not None:
      release_file = pathlib.Path(stored.path if stored is not None else stored_file).name
    results.append(IterationResult(t, np.asarray(queries), np.asarray(assignment), votes, query_labels, pseudo,
                                   acc_pl, acc_pc, stored is not None, release_file,
                                   statement, timer.times, student, refined_acc_pl,
                                   tuple(acc_pc_draws), other_student))
  return ChainResult(config.mechanism, results)


def _library_version() -> str | None:
  import jaxdistill  # pylint: disable=import-outside-toplevel
  return getattr(jaxdistill, "__version__", None)


def _check_first_queries(stored: StoredRelease, embed0: Callable[[np.ndarray], np.ndarray], key: jax.Array,
                         pub: data_lib.ImageData, s: int, source: str, cache: dict) -> None:
  """A stored first release must have the queries and clusters this run's first representation gives.

  The first queries are not in the release fingerprint: a caller's ``representation`` is a function. A re-run
  passing another one would reuse the release (queries of the first) while its noise-free chain used the
  second. Checked when this run or the release used a caller's representation (a fitted one is pinned by the
  fingerprint's settings); the embedding of D_pub is kept in ``cache`` for the noise-free chain.
  """
  if source != "caller" and stored.record.get("representation_source") != "caller":
    return
  pub_emb = embed0(pub.images)
  queries, assignment = components.select_queries(jax.random.fold_in(jax.random.fold_in(key, _KMEANS), 1), pub_emb, s)
  queries, assignment = np.asarray(queries), np.asarray(assignment)
  if queries.shape != stored.queries.shape or assignment.shape != stored.assignment.shape:
    return  # _check_stored names the shapes
  moved = int(np.sum(queries != stored.queries)) + int(np.sum(assignment != stored.assignment))
  if moved:
    was = stored.record.get("representation_source", "not recorded")
    raise ValueError(f"Stored release {stored.path} was made with other first-iteration queries than this run's "
                     f"representation gives ({moved} query or cluster entries differ; representation: {was!r} "
                     f"then, {source!r} now): reusing it would label with another representation's clusters. "
                     "Pass the representation it was made with, or use another --out-dir.")
  cache[(1, "pub")] = pub_emb


def _secret_release_key(config: LabelingConfig, buckets: Any, labels: np.ndarray) -> jax.Array:
  """The secret noise root of one release: ``noise_seed``'s key folded with a digest of what it releases.

  The digest covers the release settings (:meth:`LabelingConfig.release_fingerprint`: epsilon, mechanism,
  s, k, ...) and the mechanism's input (every record's buckets and label). Without it, one secret seed used
  for two releases that differ in a setting or in the data would add the SAME draw twice: at two scales
  (epsilon 1 and 2) the two releases solve for the exact votes, and on two data sets their difference is the
  exact difference of the votes. With it, such releases draw independent noise (each covered by its own
  statement; together they compose), while the same settings on the same data give the same release again,
  which reveals nothing new. The key stays secret: the digest is folded into the secret seed's key.
  """
  h = hashlib.sha256(json.dumps(config.release_fingerprint(), sort_keys=True).encode())
  h.update(data_fingerprint(np.asarray(buckets), np.asarray(labels)).encode())
  return fold_in_digest(secret_key(config.noise_seed), h.digest())


def _check_stored(stored: StoredRelease, s: int, num_classes: int, num_public: int) -> None:
  """A stored release must fit this run: shapes, finite votes, queries and clusters that index D_pub and s.

  A tampered or damaged file (a -1 assignment wraps around, NaN votes win argmax) would otherwise give
  wrong accuracies without an error. The file is left as it is: it may record budget already spent.
  """
  votes, queries, assignment = stored.votes, stored.queries, stored.assignment
  where = f"Stored release {stored.path}"
  if votes.shape != (s, num_classes) or assignment.shape != (num_public,) or queries.shape != (s,):
    raise ValueError(f"{where} has votes {votes.shape}, queries {queries.shape} and assignment {assignment.shape}; "
                     f"expected {(s, num_classes)}, ({s},) and ({num_public},) for this run.")
  if not np.isfinite(votes).all():
    raise ValueError(f"{where} holds NaN or inf votes; it is damaged: inspect or move it (it may record budget "
                     "already spent).")
  for name, values, bound in (("queries", queries, num_public), ("assignment", assignment, s)):
    if values.size and (values.min() < 0 or values.max() >= bound):
      raise ValueError(f"{where} holds {name} outside [0, {bound}) (range [{values.min()}, {values.max()}]); it is "
                       "damaged: inspect or move it (it may record budget already spent).")


def _train_student_chain(config: LabelingConfig, student_key: jax.Array, pub: data_lib.ImageData, votes: np.ndarray,
                         assignment: np.ndarray, pseudo: np.ndarray, num_classes: int,
                         update: Callable[[int], Any] | None) -> tuple[Student, float | None]:
  """The student on the released labels, then ``refine_rounds`` self-training rounds; (student, refined Acc_pl)."""
  student = train_student(student_key, config.student, pub.images, _targets(config, votes, assignment, pseudo),
                          num_classes, progress=update)
  refined_acc_pl = None
  # Self-training on D_pub (post-processing: public images and released votes only).
  for r in range(1, config.student.refine_rounds + 1):
    refined = refine_targets(student, pub.images, vote_shares(votes, assignment))
    refined_acc_pl = float(np.mean(refined.argmax(axis=1) == pub.labels, dtype=np.float64))
    student = train_student(_refine_key(student_key, r), config.student, pub.images, refined, num_classes,
                            progress=update)
  return student, refined_acc_pl


# -- the run -------------------------------------------------------------------------
def fit_first_representation(config: LabelingConfig, public_images: np.ndarray, *,
                             progress: bool = False) -> Callable[[np.ndarray], np.ndarray]:
  """The representation :func:`run_labeling` fits on D_pub for iteration 1 (same key), for reuse.

  Sweeps over epsilon or the mechanism can fit it once and pass it as
  ``run_labeling(..., representation=...)``.
  """
  key = jax.random.fold_in(seed_key(config.seed), _REP)
  images = np.asarray(public_images, np.float32)
  encoder = config.encoder_options()
  steps = components.fit_steps(config.representation, encoder)
  if not steps or not progress:
    return components.fit_representation(key, config.representation, images, config.pca_dim,
                                         num_queries=config.num_queries, encoder=encoder)
  with _bar(steps, f"{config.representation} representation on D_pub", True) as bar:
    def update(steps_done: int, loss: float) -> None:
      bar.update(steps_done - bar.n)
      bar.set_postfix(loss=f"{loss:.3f}")
    return components.fit_representation(key, config.representation, images, config.pca_dim, progress=update,
                                         num_queries=config.num_queries, encoder=encoder)


def run_labeling(config: LabelingConfig, *, splits: data_lib.LabelingSplits | None = None,
                 representation: Callable[[np.ndarray], np.ndarray] | None = None,
                 progress: bool = False, write_files: bool = True) -> LabelingResult:
  """Runs Algorithm 1 and its baselines; writes the ledger, report and plots to ``config.out_dir``.

  Args:
    config: the settings (:class:`LabelingConfig`).
    splits: bring your own D_priv / D_pub / evaluation split (validated);
      default: load ``config.dataset`` with the paper's splits. When they
      are given, ``config.dataset`` is not loaded (the report and the plots
      name the data ``"caller splits"``), and ``private_size``,
      ``public_size`` and ``eval_size`` must be ``None`` or the splits'
      sizes.
    representation: an already fitted ``embed(images) -> float32 [N, d]``
      for the first query selection (it must have been fitted on D_pub
      alone, or on other public data: the privacy statement assumes it);
      default: fit ``config.representation`` on D_pub.
    progress: show tqdm progress bars on stderr.
    write_files: write ``report.json`` and PNG plots when ``out_dir`` is set
      (the ledger is always written when ``out_dir`` is set).

  Returns:
    A :class:`LabelingResult`.

  Raises:
    ValueError: bad settings or data (one line naming the problem), an
      output directory holding releases made with other settings, or one
      that another run is using (locked for the run: two runs releasing
      into one ledger could both draw fresh noise for the same iteration).
  """
  if not isinstance(config, LabelingConfig):
    raise ValueError(f"Expected a LabelingConfig; got {type(config).__name__}.")
  progress = _validate.boolean("progress", progress)
  write_files = _validate.boolean("write_files", write_files)
  if representation is not None and not callable(representation):
    raise ValueError(f"Expected representation to be callable; got {type(representation).__name__}.")
  with contextlib.ExitStack() as held:
    if config.out_dir is not None and (write_files or config.mechanism != "none"):
      # Checked before any work (a bad folder must not lose a run) and held by this run alone (two runs must
      # not release into one ledger); removed again if the run fails before writing anything.
      held.enter_context(claimed_dir("out_dir", config.out_dir, report="report.json", files=PLOT_FILES))
    return _run_labeling(config, splits, representation, progress, write_files)


def _checked_embedding(representation: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
  """The caller's embedding, its output checked: a real ``[len(images), d]`` array, named when it is not."""

  def embed(images: np.ndarray) -> np.ndarray:
    raw = representation(images)
    try:
      out = _validate.real_array("representation(images)", raw)
    except ValueError as err:
      raise ValueError(f"Expected representation to return a real array; {err}") from None
    if out.ndim != 2 or out.shape[0] != len(images) or out.shape[1] < 1:
      raise ValueError(f"Expected representation to return [{len(images)}, d] features for {len(images)} images; "
                       f"got shape {out.shape}.")
    raw = np.asarray(raw)
    return raw if raw.dtype.kind == "f" else out.astype(np.float32)  # float features pass unchanged

  return embed


def _run_labeling(config: LabelingConfig, splits: data_lib.LabelingSplits | None,
                  representation: Callable[[np.ndarray], np.ndarray] | None, progress: bool,
                  write_files: bool) -> LabelingResult:
  start = time.perf_counter()
  timer = _Timer()
  with timer("data"):
    caller = splits is not None
    if not caller:
      splits = load_splits(config)
    num_classes = check_splits(splits)
    if caller:
      _check_caller_sizes(config, splits)
  data_name = CALLER_SPLITS if caller else config.dataset  # config.dataset is not what a caller's splits hold
  priv, pub = splits.private, splits.public
  n = len(priv)
  if config.num_queries > len(pub):
    raise ValueError(f"Expected num_queries (s)={config.num_queries} <= |D_pub|={len(pub)}: queries are "
                     "public samples.")
  if config.connection == "knn-labeling" and config.k > n:
    raise ValueError(f"Expected k={config.k} <= |D_priv|={n} with connection=knn-labeling: each query takes its "
                     "k nearest private records.")
  delta = config.resolved_delta(n)
  degree = components.connection_privacy(config.connection, config.k, config.num_queries).shape_k
  plan = plan_budget(config.mechanism, config.epsilon, delta, config.iterations, k=degree,
                     central_noise=config.central_noise, num_clients=n)
  # Built here, before any fitting: a mechanism's own bounds (local-collision's epsilon, say) fail at once.
  mech = build_mechanism(config, plan, mech_lib.BsvsShape(config.num_queries, num_classes, degree), n)
  source = "caller" if representation is not None else "fitted on D_pub"
  key = seed_key(config.seed)
  ledger = None
  if config.out_dir is not None and config.mechanism != "none":
    with timer("data"):
      digest = data_fingerprint(priv.images, priv.labels, pub.images)
    ledger = ReleaseLedger(config.out_dir, config.release_fingerprint(), digest,
                           check=_privacy_check(_release_statement(config, mech), plan))
    # Every stored release is read and checked now, before minutes of fitting and training: a missing or
    # damaged file (budget already spent) is refused at once, not after the representation is fitted.
    for t in range(1, config.iterations + 1):
      early = ledger.peek(t)
      if early is not None:
        _check_stored(early, config.num_queries, num_classes, len(pub))
  with timer("representation"):
    if representation is not None:
      embed0 = _checked_embedding(representation)
    else:
      embed0 = fit_first_representation(config, pub.images, progress=progress)
  cache: dict = {}
  first = ledger.peek(1) if ledger is not None else None
  if first is not None:
    with timer("queries"):
      _check_first_queries(first, embed0, key, pub, config.num_queries, source, cache)
  with timer("private_chain"):
    chain = _run_chain(config, plan, splits, num_classes, embed0, key, ledger, progress, cache, mech, source)
  noise_free = None
  ceiling_draws: list[float] = []
  if config.baselines:
    with timer("noise_free_chain"):
      if config.mechanism == "none":
        noise_free = chain
      else:
        # The mechanism's own settings go back to their defaults: mechanism "none" refuses others.
        nf_config = config.replace(mechanism="none", epsilon=math.inf, delta=None, noise_seed=None,
                                   central_noise=LabelingConfig.central_noise,
                                   shuffle_local=LabelingConfig.shuffle_local)
        nf_plan = plan_budget("none", math.inf, 0.0, config.iterations, k=degree)
        noise_free = _run_chain(nf_config, nf_plan, splits, num_classes, embed0, key, None, progress, cache, None,
                                source)
    with timer("ceiling"):
      ceiling_key = jax.random.fold_in(jax.random.fold_in(key, _STUDENT), 1)
      with _bar(config.student.epochs * config.ceiling_seeds, "student supervised ceiling", progress) as bar:
        for i in range(config.ceiling_seeds):  # draw 0 keeps the same key for any ceiling_seeds
          ceiling_student = train_student(_draw_key(ceiling_key, i),
                                          config.student, pub.images, pub.labels, num_classes,
                                          progress=bar.update if bar is not None else None)
          ceiling_draws.append(ceiling_student.accuracy(splits.evaluation.images, splits.evaluation.labels))
  timer.times["total"] = time.perf_counter() - start
  privacy = privacy_report(config, plan, [it.privacy for it in chain.iterations], n)
  report = _report(config, plan, splits, num_classes, chain, noise_free, ceiling_draws, privacy, timer.times,
                   ledger, data_name)
  report["settings"]["representation_source"] = source
  result = LabelingResult(config, plan, chain, noise_free, ceiling_draws[0] if ceiling_draws else None, report, splits,
                          # The caller's own object (its attributes, and no second wrapper when it is passed back).
                          representation if representation is not None else embed0, tuple(ceiling_draws))
  if ledger is not None:
    ledger.finish(acc_pl=chain.final.acc_pl, acc_pc=chain.final.acc_pc)
  if write_files and config.out_dir is not None:
    from jaxdistill.labeling._plots import draw_plots  # pylint: disable=import-outside-toplevel
    out = pathlib.Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keep_earlier_report(out)  # an earlier run's report and plots move to history/ before the new plots
    # The report first: a plot that could not be saved (a full disk) raised after the whole run and lost it.
    report["plots"] = []
    _write_report(out, report)
    report["plots"], failed = draw_plots(result, out)
    if failed:
      report["plot_errors"] = failed
      warnings.warn(f"Could not draw {', '.join(f'{k} ({v})' for k, v in failed.items())}; "
                    f"{out / 'report.json'} is written.", RuntimeWarning, stacklevel=2)
    atomic_write(out / "report.json", _report_bytes(report))  # with the plots drawn (the same run: no history)
  return result


def _write_report(out: pathlib.Path, report: dict) -> None:
  keep_earlier_report(out, plots=None)  # nothing already saved is lost
  atomic_write(out / "report.json", _report_bytes(report))


def _report_bytes(report: dict) -> bytes:
  return (json.dumps(_jsonable(report), indent=2) + "\n").encode()


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (np.floating, float)):
    x = float(x)
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf" if x < 0 else "nan")
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.ndarray):
    return _jsonable(x.tolist())
  return x


def _report(config: LabelingConfig, plan: BudgetPlan, splits: data_lib.LabelingSplits, num_classes: int,
            chain: ChainResult, noise_free: ChainResult | None, ceiling_draws: list[float], privacy: dict,
            timings: dict, ledger: ReleaseLedger | None, data_name: str) -> dict:
  final = chain.final
  ceiling = ceiling_draws[0] if ceiling_draws else None
  ceiling_mean = float(np.mean(ceiling_draws)) if ceiling_draws else None
  pc_mean = float(np.mean(final.acc_pc_draws))
  nf_mean = float(np.mean(noise_free.final.acc_pc_draws)) if noise_free else None
  results = {
      "acc_pl": final.acc_pl, "acc_pc": final.acc_pc,
      "noise_free_acc_pl": noise_free.final.acc_pl if noise_free else None,
      "noise_free_acc_pc": noise_free.final.acc_pc if noise_free else None,
      "supervised_ceiling_acc_pc": ceiling,
      "gap_to_noise_free_pc": (noise_free.final.acc_pc - final.acc_pc) if noise_free else None,
      "gap_to_ceiling_pc": (ceiling - final.acc_pc) if ceiling is not None else None,
      "supervised_ceiling_draws": list(ceiling_draws) if ceiling_draws else None,
      "supervised_ceiling_mean": ceiling_mean,
      "gap_to_ceiling_mean_pc": (ceiling_mean - final.acc_pc) if ceiling_mean is not None else None,
      # Over student seeds (student_seeds, ceiling_seeds): every draw, the means and the gaps of the means.
      "acc_pc_draws": list(final.acc_pc_draws),
      "acc_pc_mean": pc_mean,
      "noise_free_acc_pc_draws": list(noise_free.final.acc_pc_draws) if noise_free else None,
      "noise_free_acc_pc_mean": nf_mean,
      "gap_of_means_to_noise_free_pc": (nf_mean - pc_mean) if nf_mean is not None else None,
      "gap_of_means_to_ceiling_pc": (ceiling_mean - pc_mean) if ceiling_mean is not None else None,
  }
  return _jsonable({
      "task": "reverse k-NN private labeling (Algorithm 1, arXiv:2207.13253)",
      # null where the run does not read a setting (a central run recorded shuffle_local: collision).
      "settings": config.report_settings(),
      "data": {"dataset": data_name, "num_classes": num_classes,
               "image_shape": list(splits.public.images.shape[1:]),
               "private_size": len(splits.private), "public_size": len(splits.public),
               "eval_size": len(splits.evaluation)},
      "results": results,
      "privacy": privacy,
      "iterations": [it.summary() for it in chain.iterations],
      "noise_free_iterations": [it.summary() for it in noise_free.iterations] if noise_free else None,
      "releases": {"ledger": str(pathlib.Path(ledger.dir) / "ledger.json") if ledger else None,
                   "released_now": list(ledger.run["released"]) if ledger else [],
                   "reused": list(ledger.run["reused"]) if ledger else [],
                   "notes": [f"Iteration {it.iteration}'s release was reused as recorded (no new budget): its "
                             "queries were chosen by a student trained with other settings, "
                             f"{it.queries_from_other_student}, not this run's {config.student.to_dict()}; its "
                             "Acc_pl reflects those queries. Use a new output directory (a new release) for "
                             "queries chosen by this run's student."
                             for it in chain.iterations if it.queries_from_other_student is not None],
                   "all": ledger.releases() if ledger else []},
      "timings_s": {k: round(v, 3) for k, v in timings.items()},
  })
