"""The record's ``providerData`` string ⇄ Lux IR ``provider_data`` (plus thinking state).

A part's ``providerData`` is the compact UTF-8 JSON of one object::

    {"provider": "<modelRef.provider>", "model": "<modelRef.id>", "data": {...},
     "signature": "...",   # optional: Lux Thinking.signature (reasoning parts)
     "redacted": true,     # optional: redacted thinking (no readable text)
     "summary": true}      # optional: the part's text is the thinking *summary*

``provider``/``model``/``data`` are exactly Lux ``ProviderData``; the optional keys
carry the rest of the opaque thinking state, which the tag owns (docs/lux-ir.md). A
string that is not this shape is reported and ignored, never sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gelbridge.lux import ProviderData

MAX_PROVIDER_DATA_BYTES = 100_000


@dataclass(frozen=True, slots=True)
class DecodedProviderData:
    provider_data: ProviderData
    signature: str | None = None
    redacted: bool = False
    summary: bool = False


def encode_provider_data(
    pd: ProviderData, *, signature: str | None = None, redacted: bool = False, summary: bool = False
) -> str:
    """The ``providerData`` string for a part (caller checks the 100000-byte limit)."""
    obj: dict[str, Any] = {"provider": pd.provider, "model": pd.model, "data": pd.data}
    if signature is not None:
        obj["signature"] = signature
    if redacted:
        obj["redacted"] = True
    if summary:
        obj["summary"] = True
    return orjson.dumps(obj).decode("utf-8")


def decode_provider_data(text: str) -> DecodedProviderData:
    """Parse a part's ``providerData``; ValueError (no content in the message) if malformed."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError("providerData is not JSON") from None
    if not isinstance(obj, dict):
        raise ValueError("providerData is not a JSON object")
    provider, model, data = obj.get("provider"), obj.get("model"), obj.get("data", {})
    if not isinstance(provider, str) or not isinstance(model, str) or not isinstance(data, dict):
        raise ValueError("providerData needs provider and model strings and a data object")
    sig = obj.get("signature")
    if sig is not None and not isinstance(sig, str):
        raise ValueError("providerData signature is not a string")
    return DecodedProviderData(
        ProviderData(provider, model, data),
        sig,
        obj.get("redacted") is True,
        obj.get("summary") is True,
    )
