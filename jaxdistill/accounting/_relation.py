"""Neighbouring relations and the privacy statement every accountant returns."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Mapping

import dp_accounting

from jaxdistill import _validate

__all__ = ["Relation", "PrivacyWarning", "PrivacyStatement"]


class Relation(str, enum.Enum):
  """Which pairs of datasets count as neighbours.

  * ``ADD_ONE``: D' = D plus one record (the neighbour is one larger).
  * ``REMOVE_ONE``: D' = D minus one record.
  * ``ADD_OR_REMOVE``: the worse of the two (unbounded DP).
  * ``REPLACE_ONE``: D and D' have the same size and differ in one record
    (bounded DP; the relation of the reverse k-NN paper and of shuffling).
  """

  ADD_ONE = "add-one"
  REMOVE_ONE = "remove-one"
  ADD_OR_REMOVE = "add-remove"
  REPLACE_ONE = "replace-one"

  @classmethod
  def parse(cls, value: Any, name: str = "relation") -> "Relation":
    """Accepts a ``Relation``, its string value, or a dp-accounting relation."""
    if isinstance(value, Relation):
      return value
    if isinstance(value, dp_accounting.NeighboringRelation):
      if value == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE:
        return cls.ADD_OR_REMOVE
      if value == dp_accounting.NeighboringRelation.REPLACE_ONE:
        return cls.REPLACE_ONE
    if isinstance(value, str):
      for member in cls:
        if value == member.value or value.upper().replace("-", "_") == member.name:
          return member
    options = ", ".join(m.value for m in cls)
    raise ValueError(f"Expected {name} to be one of {options}; got {value!r}.")

  def to_dp_accounting(self) -> dp_accounting.NeighboringRelation:
    """The matching dp-accounting relation (add-one/remove-one map to add/remove).

    This names the relation only. dp-accounting's accountants read an event's
    sensitivity under ``REPLACE_ONE`` as a clip norm (a Gaussian's shift
    doubles), so :meth:`jaxdistill.accounting.MechanismAccount.dp_event`
    events, whose sensitivity is already the shift, go to ``ADD_OR_REMOVE_ONE``.
    """
    if self is Relation.REPLACE_ONE:
      return dp_accounting.NeighboringRelation.REPLACE_ONE
    return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


@dataclasses.dataclass(frozen=True)
class PrivacyWarning:
  """A machine-readable caveat attached to a privacy statement.

  Attributes:
    code: stable identifier, e.g. ``"delta_at_least_1_over_n"``.
    message: one human-readable sentence.
    details: numbers behind the warning (JSON-serialisable).
  """

  code: str
  message: str
  details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict[str, Any]:
    return {"code": self.code, "message": self.message, "details": dict(self.details)}


def _json_number(x: Any) -> Any:
  if isinstance(x, float) and math.isinf(x):
    return "inf" if x > 0 else "-inf"
  return x


@dataclasses.dataclass(frozen=True)
class PrivacyStatement:
  """An (epsilon, delta) guarantee together with everything needed to read it.

  Attributes:
    mechanism: what was released, e.g. ``"laplace"``.
    relation: the neighbouring relation the guarantee is stated for.
    epsilon: float64 epsilon (``inf`` when no finite epsilon exists).
    delta: float64 delta.
    count: number of self-composed releases covered, an integer >= 1 (a bool,
      a fractional float, 0 or a negative count is refused).
    method: how the number was obtained (``"pld"``, ``"analytic"``,
      ``"exact"``, ``"closed-form"``, ...).
    parameters: the mechanism parameters the statement was built from.
    warnings: caveats a reader must see beside the numbers.
  """

  mechanism: str
  relation: Relation
  epsilon: float
  delta: float
  count: int = 1
  method: str = "exact"
  parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  warnings: tuple[PrivacyWarning, ...] = ()

  def __post_init__(self):
    # epsilon >= 0 (inf: no finite epsilon), delta a probability in [0, 1]; the relation may be given
    # as its string value and is stored as a Relation (``to_dict`` reads ``relation.value``).
    # The checked Python floats are kept (a NumPy or JAX scalar passed the check and stayed as given).
    object.__setattr__(self, "relation", Relation.parse(self.relation))
    object.__setattr__(self, "epsilon", _validate.nonnegative("epsilon", self.epsilon, allow_inf=True))
    object.__setattr__(self, "delta", _validate.probability("delta", self.delta))
    # count=0, -1, 1.5, True, NaN, "2" or None were stored as given (and written to reports).
    object.__setattr__(self, "count", _validate.integer("count", self.count, minimum=1))

  def to_dict(self) -> dict[str, Any]:
    return {
        "mechanism": self.mechanism,
        "relation": self.relation.value,
        "epsilon": _json_number(float(self.epsilon)),
        "delta": _json_number(float(self.delta)),
        "count": self.count,
        "method": self.method,
        "parameters": {k: _json_number(v) for k, v in self.parameters.items()},
        "warnings": [w.to_dict() for w in self.warnings],
    }
