"""Ollama native chat API wire format (`/api/chat`, NDJSON streaming).

Sources: Ollama API docs (https://github.com/ollama/ollama/blob/main/docs/api.md
"Generate a chat completion": streamed objects with `done: false`, final object with
`done: true`, `done_reason`, `prompt_eval_count`, `eval_count`, durations in ns;
`message.thinking`; `message.tool_calls[].function.arguments` as an object),
"Streaming responses with tool calling" (https://ollama.com/blog/streaming-tool),
and the official `ollama` Python SDK (`ChatResponse`, `ResponseError`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from gelbridge._dev._wire_common import (
    FINISH_LENGTH,
    Turn,
    WireContext,
    chunks,
    resolve_finish,
    resolve_usage,
)

PROVIDER = "ollama"
STREAM_CONTENT_TYPE = "application/x-ndjson"
VERSION = "0.12.6"


def auth_ok(headers: Mapping[str, str], query: Mapping[str, str], key: str) -> bool:
    # Plain Ollama has no auth; Ollama Cloud / proxies in front use a bearer token.
    return headers.get("authorization", "") == f"Bearer {key}"


def wants_stream(body: Mapping[str, Any]) -> bool:
    return body.get("stream", True) is not False  # Ollama streams unless told not to


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": message}


def _created_at(ctx: WireContext) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ctx.created)) + f".{ctx.seq % 1_000_000:06d}Z"


def _done_reason(turn: Turn) -> str:
    # Ollama reports "stop" for tool-call answers too; only length is distinct.
    finish = resolve_finish(turn)
    return "length" if finish == FINISH_LENGTH else ("stop" if finish in ("stop", "tool_calls", "content_filter") else finish)


def _tool_calls(turn: Turn) -> list[dict[str, Any]]:
    return [{"function": {"index": i, "name": c.name, "arguments": dict(c.arguments)}}
            for i, c in enumerate(turn.tool_calls)]


def _final_stats(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    u = resolve_usage(turn, ctx.prompt_text)
    return {
        "done": True,
        "done_reason": _done_reason(turn),
        "total_duration": 1_000_000 * (u.input_tokens + u.output_tokens),
        "load_duration": 100_000,
        "prompt_eval_count": u.input_tokens,
        "prompt_eval_duration": 500_000 * u.input_tokens,
        "eval_count": u.output_tokens,
        "eval_duration": 1_000_000 * u.output_tokens,
    }


def render(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.reasoning:
        message["thinking"] = turn.reasoning
    if turn.tool_calls:
        message["tool_calls"] = _tool_calls(turn)
    return {"model": ctx.model, "created_at": _created_at(ctx), "message": message, **_final_stats(turn, ctx)}


def _line(payload: Mapping[str, Any]) -> bytes:
    return (json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def render_stream(turn: Turn, ctx: WireContext) -> list[bytes]:
    size = turn.chunk_size or ctx.chunk_size
    head = {"model": ctx.model, "created_at": _created_at(ctx)}

    def line(message: dict[str, Any]) -> bytes:
        return _line({**head, "message": {"role": "assistant", "content": "", **message}, "done": False})

    frames = [line({"thinking": p}) for p in chunks(turn.reasoning, size)]
    frames += [line({"content": p}) for p in chunks(turn.text, size)]
    if turn.tool_calls:
        frames.append(line({"tool_calls": _tool_calls(turn)}))
    frames.append(_line({**head, "message": {"role": "assistant", "content": ""}, **_final_stats(turn, ctx)}))
    return frames


def stream_error_frame(status: int, message: str) -> bytes:
    return _line(error_body(status, message))


def malformed_frame(raw: str) -> bytes:
    return (raw + "\n").encode()


def tags(model: str) -> dict[str, Any]:
    return {"models": [{
        "name": model, "model": model, "modified_at": "2025-01-01T00:00:00Z", "size": 1,
        "digest": "0" * 64,
        "details": {"parent_model": "", "format": "gguf", "family": "echo", "families": ["echo"],
                    "parameter_size": "0B", "quantization_level": "none"},
    }]}
