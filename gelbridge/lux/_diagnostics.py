"""Fidelity diagnostics: what a conversion could not carry over exactly.

No diagnostic means the conversion was exact. A diagnostic names the field by a
dot/index path (``conversation[2].message.content[0].provider_data``) and never
carries user content in ``detail``. What only the opened content could tell (an unknown
part's ``$type``, a mime type, which provider's data was dropped) goes in ``content``,
which is left out of ``str()`` and ``to_json()``: shown only by ``describe(True)``, which
the offline CLI calls for ``--show-content`` (its user holds the key).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ConversionStatus(StrEnum):
    """How faithfully one field was carried over (wire values are lowercase)."""

    EXACT = "exact"
    DEGRADED = "degraded"  # approximated, with partial loss
    UNSUPPORTED = "unsupported"  # the target cannot express it: dropped
    INVALID = "invalid"  # the input was malformed: dropped or repaired


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One fidelity note about one field."""

    field: str
    status: ConversionStatus
    detail: str | None = None
    content: str | None = None  # derived from sealed content: shown only on request

    def __str__(self) -> str:
        return self.describe()

    def describe(self, show_content: bool = False) -> str:
        detail = self.detail
        if show_content and self.content:
            detail = f"{detail}: {self.content}" if detail else self.content
        if detail:
            return f"{self.field}: {self.status.value} ({detail})"
        return f"{self.field}: {self.status.value}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "status": self.status.value}
        if self.detail is not None:
            out["detail"] = self.detail
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Diagnostic:
        return cls(str(obj["field"]), ConversionStatus(obj["status"]), obj.get("detail"))


@dataclass(slots=True)
class Converted(Generic[T]):
    """A conversion result: usable ``value`` plus what was lost on the way."""

    value: T
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.diagnostics

    def to_json(self, value_to_json: Callable[[T], Any] | None = None) -> dict[str, Any]:
        """The ``{"value": ..., "diagnostics": [...]}`` envelope."""
        if value_to_json is not None:
            value: Any = value_to_json(self.value)
        else:
            value = self.value.to_json() if hasattr(self.value, "to_json") else self.value
        return {"value": value, "diagnostics": [d.to_json() for d in self.diagnostics]}
