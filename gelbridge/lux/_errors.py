"""The one exception the Lux IR layer raises."""

from __future__ import annotations

from gelbridge._errors import GelbridgeError


class LuxDecodeError(GelbridgeError):
    """Lux IR JSON is missing a required field or has one of the wrong type.

    The message names the field path (``conversation[3].message.role``), never the
    value, so it is safe to log. Lux IR JSON mostly comes out of adapter scripts, so
    the error kind is ``adapter_error``.
    """

    kind = "adapter_error"

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(
            f"Lux IR JSON: {path} {problem}. Fix the code or adapter that produced it "
            "(see docs/lux-ir.md)."
        )
        self.path = path
        self.problem = problem
