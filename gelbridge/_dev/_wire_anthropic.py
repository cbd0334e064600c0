"""Anthropic Messages wire format.

Sources: Claude API "Messages" and "Streaming messages"
(https://docs.claude.com/en/docs/build-with-claude/streaming: message_start,
content_block_start/delta/stop, thinking_delta + signature_delta, input_json_delta,
message_delta, message_stop, ping, error events), "Extended thinking" (redacted_thinking),
"Errors" (https://docs.claude.com/en/api/errors: `{"type":"error","error":{...}}`), and
the official `anthropic` Python SDK's MessageStream accumulator.
"""

from __future__ import annotations

import hashlib
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

PROVIDER = "anthropic"
STREAM_CONTENT_TYPE = "text/event-stream; charset=utf-8"

_STOP = {
    FINISH_STOP: "end_turn",
    FINISH_LENGTH: "max_tokens",
    FINISH_TOOL_CALLS: "tool_use",
    FINISH_CONTENT_FILTER: "refusal",
}

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def matches(path: str) -> bool:
    return path.endswith("/v1/messages")


def auth_ok(headers: Mapping[str, str], query: Mapping[str, str], key: str) -> bool:
    return headers.get("x-api-key") == key or headers.get("authorization") == f"Bearer {key}"


def wants_stream(body: Mapping[str, Any]) -> bool:
    return body.get("stream") is True


def error_body(status: int, message: str) -> dict[str, Any]:
    err_type = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": err_type, "message": message}, "request_id": None}


def model_info(model: str) -> dict[str, Any]:
    """``GET /v1/models/{model_id}`` and each entry of ``GET /v1/models`` (Claude API
    "Models": type, id, display_name, created_at, lifecycle)."""
    return {"type": "model", "id": model, "display_name": model, "created_at": "2025-01-01T00:00:00Z",
            "lifecycle": "active"}


def model_list(models: Sequence[str], limit: int = 20) -> dict[str, Any]:
    """One page of ``GET /v1/models?limit=N`` (``has_more``, ``first_id``, ``last_id``)."""
    page = [model_info(m) for m in models[:max(1, min(limit, 1000))]]
    return {"data": page, "has_more": len(models) > len(page),
            "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None}


def model_not_found(model: str) -> dict[str, Any]:
    return error_body(404, f"model: {model}")


def _signature(turn: Turn) -> str:
    """Anthropic thinking blocks are always signed; derive one if the script gave none."""
    if turn.reasoning_signature is not None:
        return turn.reasoning_signature
    return "sig-" + hashlib.sha256(turn.reasoning.encode()).hexdigest()[:24]


def _has_thinking(turn: Turn) -> bool:
    return bool(turn.reasoning) or turn.reasoning_signature is not None


def _usage(turn: Turn, ctx: WireContext, output_tokens: int | None = None) -> dict[str, Any]:
    u = resolve_usage(turn, ctx.prompt_text, ctx.prompt_tokens)
    read = min(ctx.cached_tokens, u.input_tokens)
    written = min(ctx.cache_write_tokens, u.input_tokens - read)
    return {  # input_tokens: what is neither read from nor written to the cache
        "input_tokens": u.input_tokens - read - written,
        "output_tokens": u.output_tokens if output_tokens is None else output_tokens,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def _stop_reason(turn: Turn) -> str:
    finish = resolve_finish(turn)
    return _STOP.get(finish, finish)


def _message(turn: Turn, ctx: WireContext, content: list[dict[str, Any]], stop: str | None,
             usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"msg_{ctx.seq:06d}",
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def _search_blocks(turn: Turn, ctx: WireContext) -> list[dict[str, Any]]:
    """The web search server tool's blocks (Anthropic docs, "Web search tool"): a
    ``server_tool_use`` per query and its ``web_search_tool_result``."""
    out: list[dict[str, Any]] = []
    for i, q in enumerate(turn.searches):
        tid = f"srvtoolu_{ctx.seq:06d}_{i}"
        out.append({"type": "server_tool_use", "id": tid, "name": "web_search", "input": {"query": q}})
        out.append({"type": "web_search_tool_result", "tool_use_id": tid, "content": [
            {"type": "web_search_result", "url": c.url, "title": c.title, "encrypted_content": "RW5jcnlwdGVk",
             "page_age": None} for c in turn.citations]})
    return out


def _citations(turn: Turn) -> list[dict[str, Any]]:
    return [{"type": "web_search_result_location", "url": c.url, "title": c.title, "encrypted_index": "RW5j",
             "cited_text": c.cited_text or c.title} for c in turn.citations]


def render(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    content += _search_blocks(turn, ctx)
    if _has_thinking(turn):
        content.append({"type": "thinking", "thinking": turn.reasoning, "signature": _signature(turn)})
    if turn.redacted_reasoning is not None:
        content.append({"type": "redacted_thinking", "data": turn.redacted_reasoning})
    if turn.text or not (content or turn.tool_calls):
        text: dict[str, Any] = {"type": "text", "text": turn.text}
        if turn.citations:
            text["citations"] = _citations(turn)
        content.append(text)
    for i, c in enumerate(turn.tool_calls):
        content.append({"type": "tool_use", "id": call_id(c, "toolu_", ctx.seq, i), "name": c.name,
                        "input": dict(c.arguments)})
    usage = _usage(turn, ctx)
    if turn.searches:
        usage["server_tool_use"] = {"web_search_requests": len(turn.searches), "web_fetch_requests": 0}
    return _message(turn, ctx, content, _stop_reason(turn), usage)


def _event(name: str, payload: Mapping[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"event: {name}\ndata: {data}\n\n".encode()


def render_stream(turn: Turn, ctx: WireContext) -> list[bytes]:
    size = turn.chunk_size or ctx.chunk_size
    frames = [
        _event("message_start", {"type": "message_start",
                                 "message": _message(turn, ctx, [], None, _usage(turn, ctx, output_tokens=1))}),
        _event("ping", {"type": "ping"}),
    ]
    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        frames.append(_event("content_block_start",
                             {"type": "content_block_start", "index": index, "content_block": start}))
        frames.extend(_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
                      for d in deltas)
        frames.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1

    for b in _search_blocks(turn, ctx):
        if b["type"] == "server_tool_use":
            block({**b, "input": {}}, [{"type": "input_json_delta", "partial_json": json.dumps(b["input"])}])
        else:
            block(b, [])
    if _has_thinking(turn):
        block({"type": "thinking", "thinking": "", "signature": ""},
              [{"type": "thinking_delta", "thinking": p} for p in chunks(turn.reasoning, size)]
              + [{"type": "signature_delta", "signature": _signature(turn)}])
    if turn.redacted_reasoning is not None:
        block({"type": "redacted_thinking", "data": turn.redacted_reasoning}, [])
    if turn.text or not (_has_thinking(turn) or turn.redacted_reasoning is not None or turn.tool_calls):
        block({"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in chunks(turn.text, size)]
              + [{"type": "citations_delta", "citation": c} for c in _citations(turn)])
    for i, c in enumerate(turn.tool_calls):
        args = arguments_json(c)
        pieces = [] if args == "{}" else chunks(args, size)
        block({"type": "tool_use", "id": call_id(c, "toolu_", ctx.seq, i), "name": c.name, "input": {}},
              [{"type": "input_json_delta", "partial_json": p} for p in [""] + pieces])
    u = resolve_usage(turn, ctx.prompt_text)
    frames.append(_event("message_delta", {"type": "message_delta",
                                           "delta": {"stop_reason": _stop_reason(turn), "stop_sequence": None},
                                           "usage": {"output_tokens": u.output_tokens}}))
    frames.append(_event("message_stop", {"type": "message_stop"}))
    return frames


def stream_error_frame(status: int, message: str) -> bytes:
    return _event("error", error_body(status, message))


def malformed_frame(raw: str) -> bytes:
    return f"event: content_block_delta\ndata: {raw}\n\n".encode()
