"""A script written strictly to ADAPTER.md for a made-up provider, over real HTTP and real Lua."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from gelbridge._adapters.client import ModelClient
from gelbridge.lux import (
    BlockDelta,
    LuxRequest,
    Media,
    MediaSource,
    Message,
    Options,
    ReasoningConfig,
    StreamEvent,
    Text,
    Tool,
    ToolResult,
    ToolUse,
)
from testkit.adapter_helpers import settings_for
from testkit.parrot_server import ParrotServer


@pytest.fixture
def parrot() -> ParrotServer:
    with ParrotServer() as srv:
        yield srv


@pytest.fixture
async def client(parrot: ParrotServer, make_client: Callable[..., ModelClient]) -> ModelClient:
    c = make_client(settings_for(polly={"adapter": "parrot", "base_url": parrot.url, "api_key_env": "TEST_KEY"}))
    yield c
    await c.aclose()


def history(stream: bool) -> LuxRequest:
    return LuxRequest(
        model="grey-1", instructions=[Text("You are a parrot.")], options=Options(stream=stream, temperature=0.5),
        reasoning=ReasoningConfig.from_effort("none"),
        tools=[Tool("fly", {"type": "object", "properties": {"to": {"type": "string"}}})],
        conversation=[
            Message("user", [Text("hello"), Media("image", "image/png", MediaSource("inline", "iVBORw0KGgo="))]),
            Message("assistant", [ToolUse("t-0", "fly", '{"to":"tree"}')]),
            Message("tool", [ToolResult("t-0", [Text("landed")])]),
            Message("user", [Text("again")]),
        ])


async def test_request_reaches_the_provider_in_its_own_wire_format(client: ModelClient, parrot: ParrotServer) -> None:
    parrot.answers.append({"said": "squawk!"})
    await client.complete(history(False), provider="polly")
    body, headers = parrot.requests[-1], parrot.headers[-1]
    assert body == {
        "bird": "grey-1", "perch": "You are a parrot.", "loud": False, "eager": 0.5, "sleepy": True,
        "squawks": [
            {"who": "human", "say": "hello [picture data:image/png;base64,]"},
            {"who": "parrot", "say": "", "tricks": [{"tag": "t-0", "trick": "fly", "with": '{"to":"tree"}'}]},
            {"who": "keeper", "say": "landed", "tag": "t-0"},
            {"who": "human", "say": "again"},
        ],
        "toys": [{"toy": "fly", "shape": {"type": "object", "properties": {"to": {"type": "string"}}}}],
    }
    assert headers["authorization"] == "Bearer sk-test"  # unknown adapter name: bearer
    assert headers["x-parrot-dialect"] == "polly"


async def test_non_stream_answer_with_tricks_and_usage(client: ModelClient, parrot: ParrotServer) -> None:
    parrot.answers.append({"said": "Going.", "mused": "trees are nice", "why": "tool_use", "beak": (12, 8),
                           "tricks": [("t1", "fly", {"to": "tree"}), ("t2", "sing", {})]})
    res = await client.complete(history(False), provider="polly")
    r = res.response
    th, tx, c1, c2 = r.message.content
    assert th.text == "trees are nice" and tx.text == "Going."
    assert (c1.id, c1.name, json.loads(c1.arguments)) == ("t1", "fly", {"to": "tree"})
    assert (c2.id, c2.name, c2.arguments) == ("t2", "sing", "{}")
    assert r.choices[0].finish_reason == "tool_calls"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (12, 8, 20)
    assert not res.streamed and res.timing.chunks == 0 and res.timing.adapter_ms > 0


@pytest.mark.parametrize("whole", [False, True], ids=["plural-pieces", "singular-tool_call"])
async def test_stream_with_parallel_tricks_and_usage_in_chunks(client: ModelClient, parrot: ParrotServer,
                                                               whole: bool) -> None:
    parrot.answers.append({"said": "Off I go, twice.", "mused": "two trips", "why": "tool_use", "beak": (30, 14),
                           "whole": whole,
                           "tricks": [("t1", "fly", {"to": "the tall tree"}), ("t2", "fly", {"to": "the roof"})]})
    seen: list[StreamEvent] = []
    res = await client.complete(history(True), provider="polly", on_event=seen.append)
    r = res.response
    assert res.streamed and res.timing.chunks > 10
    kinds = [type(b).__name__ for b in r.message.content]
    assert kinds == ["Thinking", "Text", "ToolUse", "ToolUse"]
    assert r.message.content[1].text == "Off I go, twice."
    calls = [(c.id, json.loads(c.arguments)["to"]) for c in r.message.content[2:]]
    assert calls == [("t1", "the tall tree"), ("t2", "the roof")]
    assert r.choices[0].finish_reason == "tool_calls"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (30, 14)
    text = "".join(e.delta.text for e in seen if type(e) is BlockDelta and hasattr(e.delta, "text")
                   and type(e.delta).__name__ == "TextDelta")
    assert text == "Off I go, twice."
    assert res.diagnostics == []


async def test_unknown_finish_reason_from_a_stream_is_reported(client: ModelClient, parrot: ParrotServer) -> None:
    parrot.answers.append({"said": "done", "why": "sleepy"})
    res = await client.complete(history(True), provider="polly")
    assert res.response.choices[0].finish_reason == "sleepy"
    assert any(d.field == "chunk.finish_reason" for d in res.diagnostics)
