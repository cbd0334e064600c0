"""Request shapes each built-in adapter sends (asserted on what the server received)."""

from __future__ import annotations

import json

import pytest

from gelbridge._dev.model_server import Turn
from gelbridge.lux import (
    LuxRequest,
    Media,
    MediaSource,
    Message,
    Options,
    ReasoningConfig,
    Text,
    Tool,
    ToolChoice,
    ToolResult,
    ToolUse,
)
from gelbridge.lux._models import StructuredOutput
from testkit import builtin_harness as harness

TOOLS = [Tool("a", {"type": "object", "properties": {}}), Tool("b", {"type": "object", "properties": {}})]
PNG = Media("image", "image/png", MediaSource("inline", "iVBORw0KGgo="))


async def sent(srv, name, req, stream=False):
    srv.enqueue(Turn(text="ok"))
    await harness.complete(srv, name, req, stream=stream)
    return srv.requests[-1]


def conv_with_parallel_results():
    return [Message("user", [Text("go")]),
            Message("assistant", [ToolUse("t1", "a", "{}"), ToolUse("t2", "b", '{"x":1}')]),
            Message("tool", [ToolResult("t1", [Text("r1")])]),
            Message("tool", [ToolResult("t2", [Text("r2")], is_error=True)]),
            Message("user", [Text("and now?")])]


async def test_anthropic_merges_results_first_and_sets_budget(server):
    req = LuxRequest(model="claude-x", conversation=conv_with_parallel_results(), options=Options(stream=False),
                     tools=TOOLS, tool_choice=ToolChoice.none(), reasoning=ReasoningConfig(True, budget_tokens=8000))
    r = await sent(server, "anthropic", req)
    body = r.body
    assert r.headers["anthropic-version"] == "2023-06-01" and r.headers["x-api-key"] == "<redacted>"
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert [b["type"] for b in body["messages"][2]["content"]] == ["tool_result", "tool_result", "text"]
    assert body["messages"][2]["content"][1]["is_error"] is True
    assert body["tool_choice"] == {"type": "none"}
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8000}
    assert body["max_tokens"] > 8000


async def test_anthropic_answers_unpaired_tool_use(server):
    conv = [Message("user", [Text("go")]), Message("assistant", [ToolUse("t1", "a", "{}")]),
            Message("user", [Text("never mind")])]
    body = (await sent(server, "anthropic", LuxRequest(model="c", conversation=conv,
                                                       options=Options(stream=False)))).body
    first = body["messages"][2]["content"][0]
    assert (first["type"], first["tool_use_id"], first["is_error"]) == ("tool_result", "t1", True)


async def test_anthropic_specific_tool_and_media(server):
    doc = Media("file", "application/pdf", MediaSource("inline", "JVBERi0="))
    req = LuxRequest(model="c", conversation=[Message("user", [Text("see"), PNG, doc])],
                     options=Options(stream=False, extras={"parallel_tool_calls": False}),
                     tools=TOOLS, tool_choice=ToolChoice.specific("b"))
    body = (await sent(server, "anthropic", req)).body
    assert body["tool_choice"] == {"type": "tool", "name": "b", "disable_parallel_tool_use": True}
    c = body["messages"][0]["content"]
    assert c[1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    assert c[2]["type"] == "document" and c[2]["source"]["media_type"] == "application/pdf"


async def test_gemini_request_shape(server):
    req = LuxRequest(model="gemini-2.5-flash", instructions=[Text("sys")],
                     conversation=conv_with_parallel_results() + [Message("user", [PNG])],
                     options=Options(stream=True, temperature=0.2, max_output_tokens=100, stop=["END"]),
                     tools=TOOLS, tool_choice=ToolChoice.specific("a"), reasoning=ReasoningConfig(True, effort="high"))
    r = await sent(server, "gemini", req, stream=True)
    assert r.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent" and r.query["alt"] == "sse"
    assert r.headers["x-goog-api-key"] == "<redacted>"
    b = r.body
    assert b["systemInstruction"] == {"parts": [{"text": "sys"}]}
    assert b["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["a"]}}
    assert [c["role"] for c in b["contents"]] == ["user", "model", "user"]
    res = b["contents"][2]["parts"]
    assert res[0] == {"functionResponse": {"name": "a", "id": "t1", "response": {"output": "r1"}}}
    assert res[1] == {"functionResponse": {"name": "b", "id": "t2", "response": {"error": "r2"}}}
    assert res[2] == {"text": "and now?"} and res[3] == {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}
    gc = b["generationConfig"]
    assert (gc["temperature"], gc["maxOutputTokens"], gc["stopSequences"]) == (0.2, 100, ["END"])
    assert gc["thinkingConfig"] == {"includeThoughts": True, "thinkingBudget": 24576}


async def test_gemini3_uses_thinking_level(server):
    req = LuxRequest(model="gemini-3-pro-preview", conversation=[Message("user", [Text("x")])],
                     options=Options(stream=False, structured_output=StructuredOutput("json_object")),
                     reasoning=ReasoningConfig(True, effort="low"))
    gc = (await sent(server, "gemini", req)).body["generationConfig"]
    assert gc["thinkingConfig"] == {"includeThoughts": True, "thinkingLevel": "low"}
    assert gc["responseMimeType"] == "application/json"


async def test_openai_request_shape(server):
    req = LuxRequest(model="gpt-5-mini", instructions=[Text("sys")],
                     conversation=conv_with_parallel_results() + [Message("user", [Text("look"), PNG])],
                     options=Options(stream=True, max_output_tokens=50, seed=7), tools=TOOLS,
                     tool_choice=ToolChoice.required(), reasoning=ReasoningConfig(True, effort="low"))
    b = (await sent(server, "openai", req, stream=True)).body
    assert b["stream_options"] == {"include_usage": True}
    assert (b["max_completion_tokens"], b["seed"], b["reasoning_effort"], b["tool_choice"]) == (50, 7, "low", "required")
    roles = [m["role"] for m in b["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user", "user"]
    assert b["messages"][2]["tool_calls"][1]["function"] == {"name": "b", "arguments": '{"x":1}'}
    assert b["messages"][-1]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


async def test_openai_older_models_get_max_tokens(server):
    req = LuxRequest(model="gpt-4o", conversation=[Message("user", [Text("x")])],
                     options=Options(stream=False, max_output_tokens=50), tools=TOOLS, tool_choice=ToolChoice.specific("b"))
    b = (await sent(server, "openai", req)).body
    assert b["max_tokens"] == 50 and "max_completion_tokens" not in b
    assert b["tool_choice"] == {"type": "function", "function": {"name": "b"}}


@pytest.mark.parametrize("enabled,effort,expected", [(True, "medium", ("enabled", "high")),
                                                     (False, None, ("disabled", None))])
async def test_deepseek_thinking_toggle(server, enabled, effort, expected):
    req = LuxRequest(model="deepseek-chat", conversation=[Message("user", [Text("x")])],
                     options=Options(stream=False), reasoning=ReasoningConfig(enabled, effort=effort))
    b = (await sent(server, "deepseek", req)).body
    assert (b["thinking"]["type"], b.get("reasoning_effort")) == expected


async def test_ollama_request_shape(open_server):
    req = LuxRequest(model="llama3.2", instructions=[Text("sys")],
                     conversation=[Message("user", [Text("look"), PNG])],
                     options=Options(stream=False, temperature=0.1, max_output_tokens=20, extras={"num_ctx": 4096}),
                     tools=TOOLS, tool_choice=ToolChoice.specific("b"), reasoning=ReasoningConfig(False))
    b = (await sent(open_server, "ollama", req)).body
    assert b["stream"] is False and b["think"] is False
    assert b["messages"][1] == {"role": "user", "content": "look", "images": ["iVBORw0KGgo="]}
    assert [t["function"]["name"] for t in b["tools"]] == ["b"]
    assert b["options"] == {"temperature": 0.1, "num_predict": 20, "num_ctx": 4096}
    assert "authorization" not in open_server.requests[-1].headers


def test_openai_message_shapes_without_network():
    """Each message form the family writes (single-block forms take a shortcut in luxkit)."""
    from gelbridge._adapters.client import provider_body
    from gelbridge.lux import ProviderData, Thinking

    conv = [
        Message("user", [Text("one")]),
        Message("user", [Text("a"), Text("b")]),
        Message("developer", [Text("dev")]),
        Message("x_native", [Text("n")]),
        Message("assistant", [Text("x"), Text("y")]),
        Message("assistant", [Text("only")]),
        Message("assistant", [Thinking("t"), ToolUse("c1", "f", "")]),
        Message("tool", [ToolResult("c1", [Text("r1"), Text("r2")])]),
        Message("tool", [ToolResult("c1", [Text("r")])]),
        Message("tool", [ToolResult("c1", [])]),
        Message("user", [Thinking("ignored"), Text("after")]),
        Message("user", [ToolResult("c1", [Text("r")]), Text("and")]),
    ]
    req = LuxRequest(model="gpt-4o", conversation=conv, options=Options(stream=False))
    body = json.loads(provider_body(harness.adapter("openai"), req, provider="openai", model="gpt-4o").value)
    assert body["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "a\n\nb"},
        {"role": "developer", "content": "dev"},
        {"role": "user", "content": "n"},
        {"role": "assistant", "content": "xy"},
        {"role": "assistant", "content": "only"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1\nr2"},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "tool", "tool_call_id": "c1", "content": ""},
        {"role": "user", "content": "after"},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "user", "content": "and"},
    ]
    deep = LuxRequest(model="deepseek-chat", options=Options(stream=False), conversation=[
        Message("assistant", [Thinking("r1", provider_data=ProviderData("deepseek", "deepseek-chat", {})),
                              Thinking("r2", provider_data=ProviderData("deepseek", "deepseek-chat", {})),
                              Text("t")])])
    body = json.loads(provider_body(harness.adapter("deepseek"), deep, provider="deepseek",
                                    model="deepseek-chat").value)
    assert body["messages"] == [{"role": "assistant", "content": "t", "reasoning_content": "r1r2"}]
