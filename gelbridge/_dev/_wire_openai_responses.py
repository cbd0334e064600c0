"""OpenAI Responses API wire format (``POST /v1/responses``).

Sources: OpenAI API reference "Create a model response", "The response object" and
"Streaming events" (https://platform.openai.com/docs/api-reference/responses), the
reasoning guide (``store: false`` with ``include: ["reasoning.encrypted_content"]``),
and the typed models of the official ``openai`` Python SDK (``openai.types.responses``:
``Response``, ``ResponseStreamEvent``), which the tests validate every answer against.

Output items come in the order the model produced them: a ``reasoning`` item (summary
parts, and ``encrypted_content`` when the request asked for it), a ``message`` item
with ``output_text`` content, then one ``function_call`` item per call. A stream is
typed SSE events (``event: <type>``) with a growing ``sequence_number``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gelbridge._dev import _wire_openai
from gelbridge._dev._wire_common import (
    FINISH_CONTENT_FILTER,
    FINISH_LENGTH,
    Turn,
    WireContext,
    arguments_json,
    call_id,
    chunks,
    resolve_finish,
    resolve_usage,
)

PROVIDER = "openai-responses"
STREAM_CONTENT_TYPE = "text/event-stream; charset=utf-8"
ENCRYPTED_INCLUDE = "reasoning.encrypted_content"

#: neutral finish reason → (status, incomplete_details.reason)
_INCOMPLETE = {FINISH_LENGTH: "max_output_tokens", FINISH_CONTENT_FILTER: "content_filter"}


def matches(path: str) -> bool:
    return path.endswith("/responses")


# the same API as Chat Completions for these: Bearer auth, "stream": true, the error object
auth_ok = _wire_openai.auth_ok
wants_stream = _wire_openai.wants_stream
error_body = _wire_openai.error_body


def encrypted_reasoning(turn: Turn, ctx: WireContext) -> str:
    """The opaque ``encrypted_content`` of the turn's reasoning item: the scripted
    ``reasoning_signature``, else a deterministic stand-in (base64, like the real one)."""
    if turn.reasoning_signature:
        return turn.reasoning_signature
    digest = hashlib.sha256(f"{ctx.seq}:{turn.reasoning}".encode()).digest()
    return "gAAAAA" + base64.b64encode(digest * 2).decode()


def _ids(ctx: WireContext) -> tuple[str, str, str]:
    return f"resp_{ctx.seq:06d}", f"rs_{ctx.seq:06d}", f"msg_{ctx.seq:06d}"


def _usage(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    u = resolve_usage(turn, ctx.prompt_text, ctx.prompt_tokens)
    cached = min(ctx.cached_tokens, u.input_tokens)
    return {
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def _reasoning_item(turn: Turn, ctx: WireContext, *, done: bool) -> dict[str, Any] | None:
    if not turn.reasoning and not turn.reasoning_signature:
        return None
    item: dict[str, Any] = {"id": _ids(ctx)[1], "type": "reasoning", "summary": []}
    if done:
        if turn.reasoning:
            item["summary"] = [{"type": "summary_text", "text": turn.reasoning}]
        if ctx.encrypted_reasoning:
            item["encrypted_content"] = encrypted_reasoning(turn, ctx)
        item["status"] = "completed"
    return item


def _message_item(turn: Turn, ctx: WireContext, *, done: bool) -> dict[str, Any] | None:
    if not turn.text:
        return None
    content = ([{"type": "output_text", "text": turn.text, "annotations": _annotations(turn), "logprobs": []}]
               if done else [])
    return {"id": _ids(ctx)[2], "type": "message", "role": "assistant",
            "status": "completed" if done else "in_progress", "content": content}


def _call_items(turn: Turn, ctx: WireContext, *, done: bool) -> list[dict[str, Any]]:
    return [{"id": f"fc_{ctx.seq:06d}_{i}", "type": "function_call", "call_id": call_id(c, "call_", ctx.seq, i),
             "name": c.name, "arguments": arguments_json(c) if done else "",
             "status": "completed" if done else "in_progress"}
            for i, c in enumerate(turn.tool_calls)]


def _search_items(turn: Turn, ctx: WireContext, *, done: bool) -> list[dict[str, Any]]:
    """``web_search_call`` items, one per query (OpenAI docs, "Web search")."""
    return [{"id": f"ws_{ctx.seq:06d}_{i}", "type": "web_search_call", "status": "completed" if done else "in_progress",
             "action": {"type": "search", "query": q}} for i, q in enumerate(turn.searches)]


def _annotations(turn: Turn) -> list[dict[str, Any]]:
    """``url_citation`` annotations: each cited page spans the whole text here."""
    return [{"type": "url_citation", "url": c.url, "title": c.title, "start_index": 0,
             "end_index": len(turn.text)} for c in turn.citations]


def _output(turn: Turn, ctx: WireContext) -> list[dict[str, Any]]:
    items = [_reasoning_item(turn, ctx, done=True), _message_item(turn, ctx, done=True)]
    return (_search_items(turn, ctx, done=True) + [i for i in items if i is not None]
            + _call_items(turn, ctx, done=True))


def _tools(ctx: WireContext) -> list[dict[str, Any]]:
    """The request's tools as the response object echoes them (function tools typed
    the way the SDK's ``FunctionTool`` requires)."""
    out = []
    for t in ctx.request_tools:
        if isinstance(t, Mapping) and t.get("type") == "function":
            out.append({"type": "function", "name": str(t.get("name", "")), "description": t.get("description"),
                        "parameters": t.get("parameters") or {}, "strict": bool(t.get("strict", False))})
        elif isinstance(t, Mapping):
            out.append(dict(t))
    return out


def _response(turn: Turn | None, ctx: WireContext, *, status: str) -> dict[str, Any]:
    finish = resolve_finish(turn) if turn is not None else None
    incomplete = _INCOMPLETE.get(finish or "")
    if status == "completed" and incomplete:
        status = "incomplete"
    body: dict[str, Any] = {
        "id": _ids(ctx)[0], "object": "response", "created_at": ctx.created, "status": status,
        "model": ctx.model, "output": _output(turn, ctx) if turn is not None and status != "in_progress" else [],
        "error": None, "incomplete_details": {"reason": incomplete} if status == "incomplete" else None,
        "instructions": None, "metadata": {}, "parallel_tool_calls": True, "temperature": None, "top_p": None,
        "tool_choice": "auto", "tools": _tools(ctx), "store": False, "text": {"format": {"type": "text"}},
        "usage": _usage(turn, ctx) if turn is not None and status != "in_progress" else None,
    }
    return body


def render(turn: Turn, ctx: WireContext) -> dict[str, Any]:
    return _response(turn, ctx, status="completed")


class _Events:
    """SSE frames with the event type on the ``event:`` line and a growing sequence number."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def add(self, kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": len(self.frames), **fields}
        data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        self.frames.append(f"event: {kind}\ndata: {data}\n\n".encode())


def render_stream(turn: Turn, ctx: WireContext) -> list[bytes]:
    size = turn.chunk_size or ctx.chunk_size
    ev = _Events()
    ev.add("response.created", response=_response(turn, ctx, status="in_progress"))
    ev.add("response.in_progress", response=_response(turn, ctx, status="in_progress"))
    index = 0
    for added, done in zip(_search_items(turn, ctx, done=False), _search_items(turn, ctx, done=True)):
        ev.add("response.output_item.added", output_index=index, item=added)
        for stage in ("in_progress", "searching", "completed"):
            ev.add(f"response.web_search_call.{stage}", item_id=added["id"], output_index=index)
        ev.add("response.output_item.done", output_index=index, item=done)
        index += 1
    reasoning = _reasoning_item(turn, ctx, done=False)
    if reasoning is not None:
        rid = reasoning["id"]
        ev.add("response.output_item.added", output_index=index, item=reasoning)
        if turn.reasoning:
            part = {"type": "summary_text", "text": ""}
            ev.add("response.reasoning_summary_part.added", item_id=rid, output_index=index, summary_index=0,
                   part=part)
            for piece in chunks(turn.reasoning, size):
                ev.add("response.reasoning_summary_text.delta", item_id=rid, output_index=index, summary_index=0,
                       delta=piece)
            ev.add("response.reasoning_summary_text.done", item_id=rid, output_index=index, summary_index=0,
                   text=turn.reasoning)
            ev.add("response.reasoning_summary_part.done", item_id=rid, output_index=index, summary_index=0,
                   part={"type": "summary_text", "text": turn.reasoning})
        ev.add("response.output_item.done", output_index=index, item=_reasoning_item(turn, ctx, done=True))
        index += 1
    message = _message_item(turn, ctx, done=False)
    if message is not None:
        mid = message["id"]
        ev.add("response.output_item.added", output_index=index, item=message)
        ev.add("response.content_part.added", item_id=mid, output_index=index, content_index=0,
               part={"type": "output_text", "text": "", "annotations": []})
        for piece in chunks(turn.text, size):
            ev.add("response.output_text.delta", item_id=mid, output_index=index, content_index=0, delta=piece,
                   logprobs=[])
        for n, a in enumerate(_annotations(turn)):
            ev.add("response.output_text.annotation.added", item_id=mid, output_index=index, content_index=0,
                   annotation_index=n, annotation=a)
        ev.add("response.output_text.done", item_id=mid, output_index=index, content_index=0, text=turn.text,
               logprobs=[])
        ev.add("response.content_part.done", item_id=mid, output_index=index, content_index=0,
               part={"type": "output_text", "text": turn.text, "annotations": _annotations(turn)})
        ev.add("response.output_item.done", output_index=index, item=_message_item(turn, ctx, done=True))
        index += 1
    for added, done in zip(_call_items(turn, ctx, done=False), _call_items(turn, ctx, done=True)):
        ev.add("response.output_item.added", output_index=index, item=added)
        for piece in chunks(done["arguments"], size):
            ev.add("response.function_call_arguments.delta", item_id=added["id"], output_index=index, delta=piece)
        ev.add("response.function_call_arguments.done", item_id=added["id"], output_index=index,
               name=done["name"], arguments=done["arguments"])
        ev.add("response.output_item.done", output_index=index, item=done)
        index += 1
    final = _response(turn, ctx, status="completed")
    ev.add("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
    return ev.frames


def stream_error_frame(status: int, message: str) -> bytes:
    err = error_body(status, message)["error"]
    payload = {"type": "error", "sequence_number": 0, "code": err["code"] or err["type"], "message": message,
               "param": None}
    return f"event: error\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def malformed_frame(raw: str) -> bytes:
    return f"event: response.output_text.delta\ndata: {raw}\n\n".encode()
