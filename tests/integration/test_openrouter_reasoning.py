"""OpenRouter's ``reasoning_details`` on the real PDS: a streamed answer is stored as the
same parts as the same answer read whole (each step's details on that step's reasoning
part, none left over at the end), and the requests built from the stored reply send each
step's details back on that step's assistant message, and only there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._mapping.provider_data import decode_provider_data
from gelbridge._records import ReasoningPart, TextPart, ToolCallPart, ToolResultPart, new_tid
from gelbridge._sealing import Keyring

from .conftest import App, make_settings, running_worker

pytestmark = [pytest.mark.pds, pytest.mark.timeout(180)]

MODEL = "anthropic/claude-sonnet-4.6"
FORMAT = "anthropic-claude-v1"
STEP1 = Turn(reasoning="The user wants the time: call the tool.", reasoning_signature="c2lnLW9uZQ==",
             redacted_reasoning="RU5DUllQVEVELTE=", text="Let me look.",
             tool_calls=[ToolCall("current_time", {}, id="call_t1")], chunk_size=7)
STEP2 = Turn(reasoning="The tool answered; say it.", reasoning_signature="c2lnLXR3bw==", text="It is noon.",
             chunk_size=7)
FOLLOW_UP = Turn(text="You are welcome.", chunk_size=7)  # no reasoning at all


def details(turn: Turn) -> list[dict[str, Any]]:
    out = [{"type": "reasoning.text", "text": turn.reasoning, "signature": turn.reasoning_signature,
            "format": FORMAT, "index": 0}]
    if turn.redacted_reasoning:
        out.append({"type": "reasoning.encrypted", "data": turn.redacted_reasoning, "format": FORMAT, "index": 1})
    return out


def shape(parts: list[Any]) -> list[tuple[str, Any]]:
    """Each part's kind and what matters of it (reasoning: text and its details)."""
    out: list[tuple[str, Any]] = []
    for p in parts:
        if isinstance(p, ReasoningPart):
            pd = decode_provider_data(p.provider_data) if p.provider_data else None
            out.append(("reasoning", (p.text, pd.provider_data.data.get("reasoning_details") if pd else None)))
        elif isinstance(p, TextPart):
            out.append(("text", p.text))
        elif isinstance(p, ToolCallPart):
            out.append(("call", p.call_id))
        elif isinstance(p, ToolResultPart):
            out.append(("result", p.call_id))
        else:
            out.append((type(p).__name__, None))
    return out


def assistant_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "assistant"]


async def two_turns(app: App, server: ModelServer) -> tuple[list[Any], list[Any], list[dict[str, Any]]]:
    """A reply of two steps (reasoning + text + a call; reasoning + text), then a follow-up
    answered with plain text: the parts of both replies and the three request bodies."""
    conv = new_tid()
    first = len(server.requests)
    server.enqueue(STEP1, STEP2)
    k1 = await app.send("what time is it?", conversation=conv)
    _, c1 = await app.wait_status(f"{k1}.r0", "complete")
    server.enqueue(FOLLOW_UP)
    k2 = await app.send("thanks", conversation=conv, parent=f"{k1}.r0")
    _, c2 = await app.wait_status(f"{k2}.r0", "complete")
    assert c1 is not None and c2 is not None
    bodies = [r.body for r in server.requests[first:]]
    assert len(bodies) == 3
    return c1.parts, c2.parts, bodies


async def test_streamed_reasoning_details_stay_on_their_steps_reasoning_part(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App, tmp_path: Path,
) -> None:
    with ModelServer(reasoning_details=True, openai_reasoning_field="reasoning") as server:
        settings = make_settings(
            dev_pds.pds_url, pds_account, tmp_path / "state", server.url,
            defaults={"model": {"provider": "router", "id": MODEL}, "tools": ["current_time"]},
            providers={"router": {"adapter": "openrouter", "base_url": server.url + "/api/v1", "max_retries": 0}},
        )
        runs: dict[bool, tuple[list[Any], list[Any], list[dict[str, Any]]]] = {}
        async with running_worker(settings, pds_account, keyring[0]) as worker:
            for stream in (False, True):
                worker.deps.stream = stream
                runs[stream] = await two_turns(app, server)
            assert [b.get("stream", False) for b in runs[True][2]] == [True] * 3

    whole, streamed = runs[False], runs[True]
    expected = [("reasoning", (STEP1.reasoning, details(STEP1))), ("text", STEP1.text), ("call", "call_t1"),
                ("result", "call_t1"), ("reasoning", (STEP2.reasoning, details(STEP2))), ("text", STEP2.text)]
    assert shape(whole[0]) == expected  # the JSON path, as it always was
    assert shape(streamed[0]) == expected  # the stream: the same parts, nothing trailing
    assert shape(streamed[1]) == shape(whole[1]) == [("text", FOLLOW_UP.text)]  # no empty reasoning part

    for _, _, bodies in (whole, streamed):
        step2, follow_up = bodies[1], bodies[2]
        # the step-2 request: the call's message carries step 1's details; nothing after the result
        assert [m["role"] for m in step2["messages"]] == ["user", "assistant", "tool"]
        call_msg = step2["messages"][1]
        assert call_msg["tool_calls"][0]["id"] == "call_t1" and call_msg["content"] == STEP1.text
        assert call_msg["reasoning_details"] == details(STEP1)
        # the next turn: each step's details on its own message
        assert [m["role"] for m in follow_up["messages"]] == ["user", "assistant", "tool", "assistant", "user"]
        a1, a2 = assistant_messages(follow_up)
        assert a1["reasoning_details"] == details(STEP1) and a1["tool_calls"][0]["id"] == "call_t1"
        assert a2["reasoning_details"] == details(STEP2) and a2["content"] == STEP2.text
        assert json.dumps(a2).count("c2lnLW9uZQ==") == 0  # step 1's signature is not on step 2
