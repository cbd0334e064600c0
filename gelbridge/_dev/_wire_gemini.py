"""Gemini API (generativelanguage) generateContent / streamGenerateContent wire format.

Sources: Gemini API reference "models.generateContent" / "models.streamGenerateContent"
(https://ai.google.dev/api/generate-content: GenerateContentResponse, Candidate,
FinishReason, UsageMetadata incl. thoughtsTokenCount), "Thought signatures"
(https://ai.google.dev/gemini-api/docs/thought-signatures: signature on the first
functionCall part of parallel calls, else on the last part), "Thinking" (`thought: true`
parts), Google API error model (https://cloud.google.com/apis/design/errors), and the
official `google-genai` SDK's SSE reader (`_iter_response_stream`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gelbridge._dev._wire_common import (
    FINISH_CONTENT_FILTER,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Turn,
    WireContext,
    call_id,
    chunks,
    resolve_finish,
    resolve_usage,
)

PROVIDER = "gemini"
STREAM_CONTENT_TYPE = "text/event-stream"
ARRAY_CONTENT_TYPE = "application/json; charset=UTF-8"

_FINISH = {
    FINISH_STOP: "STOP",
    FINISH_LENGTH: "MAX_TOKENS",
    FINISH_TOOL_CALLS: "STOP",  # Gemini reports STOP for function-call answers
    FINISH_CONTENT_FILTER: "SAFETY",
}

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def auth_ok(headers: Mapping[str, str], query: Mapping[str, str], key: str) -> bool:
    return (
        headers.get("x-goog-api-key") == key
        or query.get("key") == key
        or headers.get("authorization") == f"Bearer {key}"
    )


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message,
                      "status": _STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")}}


def model_info(model: str) -> dict[str, Any]:
    """``GET /v1beta/models/{model}`` and each entry of ``GET /v1beta/models`` (Gemini API
    reference "Models": the ``Model`` resource, named ``models/<id>``)."""
    return {"name": f"models/{model}", "version": "001", "displayName": model,
            "description": "the local echo model", "inputTokenLimit": 1048576, "outputTokenLimit": 65536,
            "supportedGenerationMethods": ["generateContent", "countTokens"], "temperature": 1.0,
            "topP": 0.95, "topK": 64, "maxTemperature": 2.0, "thinking": True}


def model_list(models: Sequence[str], page_size: int = 50, page_token: str = "") -> dict[str, Any]:
    """One page of ``GET /v1beta/models?pageSize=N&pageToken=T`` (``nextPageToken`` while
    more follow; at most 1000 a page, 50 by default, as the reference says)."""
    size = max(1, min(page_size, 1000))
    start = int(page_token) if page_token.isdigit() else 0
    out: dict[str, Any] = {"models": [model_info(m) for m in models[start:start + size]]}
    if start + size < len(models):
        out["nextPageToken"] = str(start + size)
    return out


def model_not_found(model: str) -> dict[str, Any]:
    return error_body(404, f"models/{model} is not found for API version v1beta, or is not supported for "
                           "generateContent. Call ListModels to see the list of available models and their "
                           "supported methods.")


def _usage(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    u = resolve_usage(turn, ctx.prompt_text, ctx.prompt_tokens)
    usage: dict[str, Any] = {
        "promptTokenCount": u.input_tokens,
        "candidatesTokenCount": max(0, u.output_tokens - u.reasoning_tokens),
        "totalTokenCount": u.total_tokens,
    }
    if u.reasoning_tokens:
        usage["thoughtsTokenCount"] = u.reasoning_tokens
    if ctx.cached_tokens:
        usage["cachedContentTokenCount"] = min(ctx.cached_tokens, u.input_tokens)
    return usage


def _call_part(turn: Turn, ctx: WireContext, i: int) -> dict[str, Any]:
    call = turn.tool_calls[i]
    fc: dict[str, Any] = {"name": call.name, "args": dict(call.arguments)}
    if ctx.gemini_call_ids or call.id:
        fc["id"] = call_id(call, "fc_", ctx.seq, i)
    return {"functionCall": fc}


def _parts(turn: Turn, ctx: WireContext, size: int | None) -> list[dict[str, Any]]:
    """Parts in answer order; with `size`, text is split into one part per fragment.

    The thought signature goes on the first functionCall part when there are calls,
    otherwise on the last part, as the Gemini docs describe."""
    split = (lambda t: chunks(t, size)) if size else (lambda t: [t] if t else [])
    parts: list[dict[str, Any]] = [{"text": p, "thought": True} for p in split(turn.reasoning)]
    parts += [{"text": p} for p in split(turn.text)]
    calls = [_call_part(turn, ctx, i) for i in range(len(turn.tool_calls))]
    if not parts and not calls:
        parts = [{"text": ""}]
    if turn.reasoning_signature is not None:
        target = calls[0] if calls else parts[-1]
        target["thoughtSignature"] = turn.reasoning_signature
    return parts + calls


def _grounding(turn: Turn) -> dict[str, Any] | None:
    """Grounding with Google Search (Gemini docs, "Grounding with Google Search"): the
    queries, the pages (``groundingChunks``) and which part of the text each supports."""
    if not turn.citations and not turn.searches:
        return None
    return {
        "webSearchQueries": list(turn.searches),
        "searchEntryPoint": {"renderedContent": "<div>search suggestions</div>"},
        "groundingChunks": [{"web": {"uri": c.url, "title": c.title}} for c in turn.citations],
        "groundingSupports": [{"segment": {"startIndex": 0, "endIndex": len(turn.text.encode()), "text": turn.text},
                               "groundingChunkIndices": [i]} for i in range(len(turn.citations))],
    }


def _response(ctx: WireContext, parts: list[dict[str, Any]], finish: str | None,
              usage: dict[str, Any] | None, grounding: dict[str, Any] | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    if grounding:
        candidate["groundingMetadata"] = grounding
    out: dict[str, Any] = {"candidates": [candidate]}
    if usage:
        out["usageMetadata"] = usage
    out["modelVersion"] = ctx.model
    out["responseId"] = f"resp-{ctx.seq:06d}"
    return out


def _finish(turn: Turn) -> str:
    finish = resolve_finish(turn)
    return _FINISH.get(finish, finish)


def render(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    return _response(ctx, _parts(turn, ctx, None), _finish(turn), _usage(turn, ctx), _grounding(turn))


def render_stream(turn: Turn, ctx: WireContext, *, sse: bool = True) -> list[bytes]:
    """One chunk per part; the last chunk carries finishReason and usageMetadata.

    `sse=False` gives the JSON-array framing used when `alt=sse` is absent."""
    parts = _parts(turn, ctx, turn.chunk_size or ctx.chunk_size)
    payloads = [
        _response(ctx, [part], _finish(turn) if last else None, _usage(turn, ctx) if last else None,
                  _grounding(turn) if last else None)
        for last, part in ((i == len(parts) - 1, p) for i, p in enumerate(parts))
    ]
    texts = [json.dumps(p, separators=(",", ":"), ensure_ascii=False) for p in payloads]
    if sse:
        return [f"data: {t}\r\n\r\n".encode() for t in texts]
    frames = [("[" if i == 0 else ",\r\n") + t for i, t in enumerate(texts)]
    return [f.encode() for f in frames] + [b"]"]


def stream_error_frame(status: int, message: str) -> bytes:
    return f"data: {json.dumps(error_body(status, message))}\r\n\r\n".encode()


def malformed_frame(raw: str) -> bytes:
    return f"data: {raw}\r\n\r\n".encode()
