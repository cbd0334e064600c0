"""The tools flow on the real PDS: auto-run tools loop, approval pending → approved → the
tool runs exactly once (also across a regeneration) and the model continues."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import TextPart, ToolApprovalPart, ToolCallPart, ToolResultPart, new_tid
from gelbridge._sealing import Keyring, open_blob
from gelbridge._tools import Tool, ToolOutput, ToolRegistry, builtin_tools

from .conftest import App, make_settings, running_worker, text_of
from .test_tools_approval import journal_entry

pytestmark = [pytest.mark.pds, pytest.mark.timeout(180)]


def counting_registry(calls: list[dict[str, Any]]) -> ToolRegistry:
    async def send_note(args: dict[str, Any]) -> ToolOutput:
        calls.append(args)
        return ToolOutput("sent: " + "n" * 300)  # longer than max_output_chars → sealed blob

    note = Tool(
        name="send_note", description="Send a note (side effect).",
        parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        executor=send_note, approval="always",
    )
    return ToolRegistry([*builtin_tools({}), note])


async def test_auto_tool_loop_then_approval_runs_the_approved_call_exactly_once(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(
        dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
        defaults={"model": {"provider": "local", "id": "echo-1"}, "tools": ["current_time", "send_note"]},
        tools={"max_output_chars": 100},
    )
    ran: list[dict[str, Any]] = []
    conv = new_tid()
    async with running_worker(settings, pds_account, keyring[0], registry=counting_registry(ran)) as worker:
        # 1. an auto-run tool: the model calls it, gets the result, answers
        model_server.enqueue(Turn(tool_calls=[ToolCall("current_time", {}, id="t1")]), Turn(text="It is now."))
        k0 = await app.send("what time is it?", conversation=conv)
        r0, c0 = await app.wait_status(f"{k0}.r0", "complete")
        types = [type(p).__name__ for p in c0.parts]
        assert types == ["ToolCallPart", "ToolResultPart", "TextPart"]
        assert c0.parts[1].call_id == "t1" and "utc" in c0.parts[1].output
        assert text_of(c0) == "It is now."
        tool_msgs = [m for m in model_server.requests[1].body["messages"] if m.get("role") == "tool"]
        assert len(tool_msgs) == 1 and tool_msgs[0]["tool_call_id"] == "t1"

        # 2. a call that needs approval (next to an auto-run one): the reply waits
        model_server.enqueue(Turn(tool_calls=[ToolCall("current_time", {}, id="t2"),
                                              ToolCall("send_note", {"text": "hi"}, id="n1")]))
        k1 = await app.send("send a note", conversation=conv, parent=f"{k0}.r0")
        r1, c1 = await app.wait_status(f"{k1}.r0", "awaitingApproval")
        assert [type(p).__name__ for p in c1.parts] == ["ToolCallPart", "ToolResultPart", "ToolCallPart"]
        assert c1.parts[2].call_id == "n1" and c1.parts[2].approval == "pending"
        assert r1.finish_reason == "tool_calls" and ran == []

        # 3. the user approves: the call runs once, its result is repeated, the model continues
        model_server.enqueue(Turn(text="Note sent."))
        k2 = await app.send(None, conversation=conv, parent=f"{k1}.r0",
                            parts=[ToolApprovalPart(call_id="n1", approved=True)])
        r2, c2 = await app.wait_status(f"{k2}.r0", "complete")
        assert ran == [{"text": "hi"}]
        call, result, text = c2.parts
        assert isinstance(call, ToolCallPart) and call.call_id == "n1" and call.approval == "approved"
        assert isinstance(result, ToolResultPart) and result.call_id == "n1" and not result.is_error
        assert len(result.output) <= 200 and result.output_blob is not None
        assert isinstance(text, TextPart) and text.text == "Note sent."
        body = await app.pds.get_blob(app.did, result.output_blob.ref)
        full = open_blob(body, key_id=app.key_id, keyring=app.keyring).decode()
        assert full == "sent: " + "n" * 300
        assert result.output_blob.mime_type == "text/plain" and result.output_blob.size == len(full)
        last = model_server.requests[-1].body["messages"]
        tool_results = [m for m in last if m.get("role") == "tool"]
        assert [m["tool_call_id"] for m in tool_results] == ["t1", "t2", "n1"]  # one result per call

        # 4. regenerating the approval message does not run the tool again
        model_server.enqueue(Turn(text="Note sent (again)."))
        await app.regenerate(k2, 1)
        _, c3 = await app.wait_status(f"{k2}.r1", "complete")
        assert ran == [{"text": "hi"}]
        assert c3.parts[1].call_id == "n1" and c3.parts[1].output == result.output
        await worker.wait_idle(10)
        entry = await journal_entry(worker.store, "n1")
        assert entry is not None and entry.finished


async def test_denied_call_is_answered_with_the_reason_and_never_runs(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(
        dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
        defaults={"model": {"provider": "local", "id": "echo-1"}, "tools": ["send_note"]},
    )
    ran: list[dict[str, Any]] = []
    conv = new_tid()
    async with running_worker(settings, pds_account, keyring[0], registry=counting_registry(ran)):
        model_server.enqueue(Turn(tool_calls=[ToolCall("send_note", {"text": "x"}, id="n9")]))
        k1 = await app.send("send it", conversation=conv)
        await app.wait_status(f"{k1}.r0", "awaitingApproval")
        model_server.enqueue(Turn(text="OK, not sending."))
        k2 = await app.send("no thanks", conversation=conv, parent=f"{k1}.r0",
                            parts=[TextPart(text="no thanks"),
                                   ToolApprovalPart(call_id="n9", approved=False, reason="not now")])
        _, c2 = await app.wait_status(f"{k2}.r0", "complete")
        assert ran == []
        assert c2.parts[0].approval == "denied"
        assert c2.parts[1].is_error and "not now" in c2.parts[1].output
        assert text_of(c2) == "OK, not sending."
        sent = json.dumps(model_server.requests[-1].body)
        assert "not now" in sent


async def test_an_auto_run_tool_not_offered_in_the_turn_waits_for_approval(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    ran: list[dict[str, Any]] = []

    async def sneaky(args: dict[str, Any]) -> ToolOutput:
        ran.append(args)
        return ToolOutput("done")

    registry = ToolRegistry([*builtin_tools({}), Tool(
        name="sneaky", description="Auto-run, but not switched on for this conversation.",
        parameters={"type": "object", "properties": {}}, executor=sneaky, approval="never",
    )])
    settings = make_settings(
        dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
        defaults={"model": {"provider": "local", "id": "echo-1"}, "tools": ["current_time"]},
    )
    async with running_worker(settings, pds_account, keyring[0], registry=registry):
        model_server.enqueue(Turn(tool_calls=[ToolCall("sneaky", {}, id="s1")]))
        k1 = await app.send("hello", conversation=new_tid())
        _, c1 = await app.wait_status(f"{k1}.r0", "awaitingApproval")
        assert ran == []
        assert [(p.call_id, p.approval) for p in c1.parts if isinstance(p, ToolCallPart)] == [("s1", "pending")]
