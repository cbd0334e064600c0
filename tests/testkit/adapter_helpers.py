"""Helpers shared by the adapter tests (imported as a plain module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gelbridge._config import Settings
from gelbridge.lux import LuxRequest, Message, Options, Text

SCRIPTS = Path(__file__).resolve().parents[1] / "adapters" / "scripts"


def settings_for(**providers: dict[str, Any]) -> Settings:
    return Settings.model_validate({"providers": providers})


def ask(text: str = "hello there", *, model: str = "m-1", stream: bool = True, **kw: Any) -> LuxRequest:
    return LuxRequest(model=model, conversation=[Message("user", [Text(text)])], options=Options(stream=stream), **kw)
