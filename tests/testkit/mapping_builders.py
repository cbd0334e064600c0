"""Small builders for message records and opened threads (tests only)."""

from __future__ import annotations

from typing import Any

from gelbridge._mapping import OpenedMessage
from gelbridge._records import (
    GenerationRequest,
    MessageRecord,
    ModelRef,
    PlainContent,
    TextPart,
    ToolApprovalPart,
    ToolCallPart,
    ToolResultPart,
)
from testkit import lux_schema

CONV = "3mconvconvcv2"
T = "2026-01-01T00:00:00.000Z"
PLAIN = {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}


def user(parent: str | None = None, *, conversation: str = CONV, generation: GenerationRequest | None = None,
         **kw: Any) -> MessageRecord:
    return MessageRecord(conversation=conversation, role="user", parent=parent, content=PLAIN,
                         generation=generation or GenerationRequest(), created_at=T, **kw)


def reply(parent: str, *, conversation: str = CONV, model: ModelRef | None = None,
          status: str = "complete", **kw: Any) -> MessageRecord:
    return MessageRecord(conversation=conversation, role="assistant", parent=parent, content=PLAIN,
                         model=model, status=status, created_at=T, **kw)


def opened(rkey: str, record: MessageRecord, *parts: Any) -> OpenedMessage:
    return OpenedMessage(rkey, record, PlainContent(parts=list(parts)))


def text(s: str, **kw: Any) -> TextPart:
    return TextPart(text=s, **kw)


def call(cid: str, tool: str = "t", input: str = "{}", approval: str | None = None, **kw: Any) -> ToolCallPart:
    return ToolCallPart(call_id=cid, tool=tool, input=input, approval=approval, **kw)


def result(cid: str, output: str = "ok", is_error: bool = False) -> ToolResultPart:
    return ToolResultPart(call_id=cid, output=output, is_error=is_error)


def approve(cid: str, ok: bool = True, reason: str | None = None) -> ToolApprovalPart:
    return ToolApprovalPart(call_id=cid, approved=ok, reason=reason)


def assert_valid_request(wire: dict) -> None:
    """The request validates against the patched Lux IR schema (documented deviations)."""
    assert lux_schema.errors(lux_schema.patched("LucentRequest"), wire) == []


def messages(wire: dict) -> list[dict]:
    return [i["message"] for i in wire["conversation"]]


def check_tool_pairs(wire: dict) -> None:
    """Every tool_use has exactly one result, in a tool message right after its turn."""
    msgs = messages(wire)
    seen_calls: set[str] = set()
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        ids = [c["tool_use"]["id"] for c in m["content"] if c["type"] == "tool_use"]
        assert not (set(ids) & seen_calls), "call id repeated in the request"
        assert len(set(ids)) == len(ids)
        seen_calls |= set(ids)
        follow = msgs[i + 1: i + 1 + len(ids)]
        got = [f["content"][0]["tool_result"]["tool_use_id"] for f in follow if f["role"] == "tool"]
        assert got == ids, (ids, got)
    n_results = sum(1 for m in msgs if m["role"] == "tool")
    assert n_results == len(seen_calls)
