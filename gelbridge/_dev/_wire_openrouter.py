"""OpenRouter's own endpoints beside its OpenAI-format chat (``_wire_openai`` renders that).

Sources: OpenRouter API reference "Get current API key" (``GET /api/v1/key``:
``{"data": {label, limit, usage, is_free_tier, limit_remaining, ...}}``,
https://openrouter.ai/docs/api/api-reference/api-keys/get-current-key) and "Errors"
(``{"error": {"code": <HTTP status>, "message": ...}}``, https://openrouter.ai/docs/errors).
"""

from __future__ import annotations

from typing import Any

from gelbridge._dev import _wire_openai

PROVIDER = "openrouter"
auth_ok = _wire_openai.auth_ok  # a Bearer key, as for its chat


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message}}


def key_info() -> dict[str, Any]:
    """``GET /api/v1/key`` for a valid key: what the key may spend (no limit here)."""
    return {"data": {"label": "gelbridge local key", "limit": None, "limit_remaining": None, "limit_reset": None,
                     "usage": 0, "usage_daily": 0, "usage_weekly": 0, "usage_monthly": 0,
                     "is_free_tier": False, "is_provisioning_key": False, "include_byok_in_limit": False}}
