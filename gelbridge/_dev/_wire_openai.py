"""OpenAI Chat Completions wire format (also Groq, DeepSeek, GitHub Models, Mistral...).

Sources: OpenAI API reference "Create chat completion" and "The chat completion chunk
object" (https://platform.openai.com/docs/api-reference/chat), DeepSeek
`reasoning_content` (https://api-docs.deepseek.com/guides/reasoning_model), and the
parsing in the official `openai` Python SDK (ChatCompletionChunk, ChoiceDeltaToolCall).
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
    arguments_json,
    call_id,
    chunks,
    resolve_finish,
    resolve_usage,
)

PROVIDER = "openai"
STREAM_CONTENT_TYPE = "text/event-stream; charset=utf-8"

_FINISH = {
    FINISH_STOP: "stop",
    FINISH_LENGTH: "length",
    FINISH_TOOL_CALLS: "tool_calls",
    FINISH_CONTENT_FILTER: "content_filter",
}

_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def matches(path: str) -> bool:
    return path.endswith("/chat/completions")


def auth_ok(headers: Mapping[str, str], query: Mapping[str, str], key: str) -> bool:
    return headers.get("authorization", "") == f"Bearer {key}"


def wants_stream(body: Mapping[str, Any]) -> bool:
    return body.get("stream") is True


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    err_type, default = _ERROR_TYPES.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return {"error": {"message": message, "type": err_type, "param": None, "code": code or default}}


def model_info(model: str) -> dict[str, Any]:
    """One entry of ``GET /v1/models`` and the answer of ``GET /v1/models/{model}``
    (OpenAI API reference "Models": id, object, created, owned_by)."""
    return {"id": model, "object": "model", "created": 0, "owned_by": "gelbridge"}


def model_list(models: Sequence[str]) -> dict[str, Any]:
    return {"object": "list", "data": [model_info(m) for m in models]}


def model_not_found(model: str) -> dict[str, Any]:
    """The 404 of a model this key cannot use (retrieve, and chat with an unknown model)."""
    return error_body(404, f"The model `{model}` does not exist or you do not have access to it.", "model_not_found")


def _id(ctx: WireContext) -> str:
    return f"chatcmpl-{ctx.seq:06d}"


def _usage(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    u = resolve_usage(turn, ctx.prompt_text, ctx.prompt_tokens)
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": min(ctx.cached_tokens, u.input_tokens), "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": u.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _visible_text(turn: Turn, ctx: WireContext) -> str:
    """Content text; with `think_tags` the reasoning is inlined like local models do."""
    if turn.reasoning and ctx.openai_reasoning_field == "think_tags":
        return f"<think>{turn.reasoning}</think>{turn.text}"
    return turn.text


def _reasoning_field(turn: Turn, ctx: WireContext) -> str | None:
    if not turn.reasoning or ctx.openai_reasoning_field in ("think_tags", "omit"):
        return None
    return ctx.openai_reasoning_field


DETAILS_FORMAT = "anthropic-claude-v1"


def reasoning_details(turn: Turn) -> list[dict[str, Any]]:
    """OpenRouter's ``reasoning_details`` for the turn (OpenRouter docs, "Reasoning
    tokens": reasoning.text with its signature, reasoning.encrypted for redacted blocks)."""
    out: list[dict[str, Any]] = []
    if turn.reasoning or turn.reasoning_signature:
        out.append({"type": "reasoning.text", "text": turn.reasoning, "signature": turn.reasoning_signature,
                    "format": DETAILS_FORMAT, "index": 0})
    if turn.redacted_reasoning:
        out.append({"type": "reasoning.encrypted", "data": turn.redacted_reasoning, "format": DETAILS_FORMAT,
                    "index": len(out)})
    return out


def render(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": _visible_text(turn, ctx) or None, "refusal": None}
    field = _reasoning_field(turn, ctx)
    if field:
        message[field] = turn.reasoning
    if ctx.reasoning_details and reasoning_details(turn):
        message["reasoning_details"] = reasoning_details(turn)
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id(c, "call_", ctx.seq, i),
                "type": "function",
                "function": {"name": c.name, "arguments": arguments_json(c)},
            }
            for i, c in enumerate(turn.tool_calls)
        ]
    finish = resolve_finish(turn)
    return {
        "id": _id(ctx),
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": _FINISH.get(finish, finish)}
        ],
        "usage": _usage(turn, ctx),
        "system_fingerprint": None,
    }


def _frame(payload: Mapping[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def _detail_pieces(turn: Turn, size: int) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """OpenRouter's streamed ``reasoning_details`` as its recorded streams carry them,
    ``(reasoning text, pieces)`` per chunk: a ``reasoning.text`` entry at index 0 opened
    empty (``text`` and ``signature`` ""), its text in pieces beside ``reasoning``, then
    its signature alone, then each ``reasoning.encrypted`` entry whole at its index."""
    details = reasoning_details(turn)
    out: list[tuple[str | None, list[dict[str, Any]]]] = []
    for d in details:
        if d["type"] != "reasoning.text":
            out.append((None, [d]))
            continue
        head = {"type": "reasoning.text", "format": DETAILS_FORMAT, "index": d["index"]}
        out.append((None, [{**head, "text": "", "signature": ""}]))
        out += [(piece, [{**head, "text": piece}]) for piece in chunks(turn.reasoning, size)]
        if d.get("signature"):
            out.append((None, [{**head, "signature": d["signature"]}]))
    return out


def render_stream(turn: Turn, ctx: WireContext) -> list[bytes]:
    size = turn.chunk_size or ctx.chunk_size
    base = {"id": _id(ctx), "object": "chat.completion.chunk", "created": ctx.created, "model": ctx.model,
            "system_fingerprint": None}
    if ctx.include_usage:
        base["usage"] = None
    # OpenRouter names both fields in every text chunk, empty when the chunk has none
    quiet: dict[str, Any] = {"reasoning": None, "reasoning_details": []} if ctx.reasoning_details else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _frame({**base, "choices": [choice]})

    frames = [chunk({"role": "assistant", "content": "", **quiet})]
    field = _reasoning_field(turn, ctx)
    if ctx.reasoning_details and reasoning_details(turn):
        for text, pieces in _detail_pieces(turn, size):
            frames.append(chunk({"role": "assistant", "content": "", field or "reasoning": text,
                                 "reasoning_details": pieces}))
    elif field:
        frames += [chunk({field: piece}) for piece in chunks(turn.reasoning, size)]
    frames += [chunk({"content": piece, **quiet}) for piece in chunks(_visible_text(turn, ctx), size)]
    for i, c in enumerate(turn.tool_calls):
        head = {"index": i, "id": call_id(c, "call_", ctx.seq, i), "type": "function",
                "function": {"name": c.name, "arguments": ""}}
        frames.append(chunk({"tool_calls": [head]}))
        frames += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                   for piece in chunks(arguments_json(c), size)]
    finish = resolve_finish(turn)
    frames.append(chunk({"content": "", **quiet} if quiet else {}, _FINISH.get(finish, finish)))
    if ctx.include_usage:
        frames.append(_frame({**base, "choices": [], "usage": _usage(turn, ctx)}))
    frames.append(_frame("[DONE]"))
    return frames


def stream_error_frame(status: int, message: str) -> bytes:
    return _frame(error_body(status, message))


def malformed_frame(raw: str) -> bytes:
    return f"data: {raw}\n\n".encode()
