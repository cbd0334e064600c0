"""Every built-in adapter end to end (ModelClient → Lua → HTTP → ModelServer), streamed and not."""

from __future__ import annotations

import json

import pytest

from gelbridge._dev.model_server import CutStream, Fail, MalformedBody, MidStreamError, ToolCall, Turn
from gelbridge._errors import ProviderError
from gelbridge.lux import LuxRequest, Message, Options, Text, Thinking, Tool, ToolUse
from testkit import builtin_harness as harness

MODELS = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-flash",
          "ollama": "llama3.2", "deepseek": "deepseek-chat", "openai-responses": "gpt-5",
          "openrouter": "anthropic/claude-sonnet-4.6"}
TOOLS = [Tool("lookup", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
              "Look something up"),
         Tool("now", {"type": "object", "properties": {}}, "The time")]


def request(name: str, text: str = "hi", **kw) -> LuxRequest:
    return LuxRequest(model=MODELS[name], instructions=[Text("Be brief.")],
                      conversation=[Message("user", [Text(text)])], options=Options(stream=False),
                      tools=TOOLS, **kw)


@pytest.fixture(params=[False, True], ids=["plain", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return request.param


async def test_text_answer_with_usage(name, srv, stream):
    srv.enqueue(Turn(text="Hello there, friend.", usage=(11, 7, 0)))
    res = await harness.complete(srv, name, request(name), stream=stream)
    msg = res.response.message
    assert [type(b).__name__ for b in msg.content] == ["Text"]
    assert msg.content[0].text == "Hello there, friend."
    assert res.response.choices[0].finish_reason == "stop"
    u = res.response.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (11, 7, 18)
    assert res.streamed is stream
    body = srv.requests[-1].body
    assert "Be brief." in json.dumps(body)  # the system prompt went out


async def test_parallel_tool_calls(name, srv, stream):
    srv.enqueue(Turn(tool_calls=[ToolCall("lookup", {"q": "alpha beta gamma"}), ToolCall("lookup", {"q": "b"})]))
    res = await harness.complete(srv, name, request(name), stream=stream)
    calls = [b for b in res.response.message.content if isinstance(b, ToolUse)]
    assert [c.name for c in calls] == ["lookup", "lookup"]
    assert [json.loads(c.arguments) for c in calls] == [{"q": "alpha beta gamma"}, {"q": "b"}]
    ids = [c.id for c in calls]
    if name == "ollama":  # Ollama sends no ids: left empty for the host to name after the reply key
        assert ids == ["", ""]
    else:
        assert all(ids) and ids[0] != ids[1]
    assert res.response.choices[0].finish_reason == "tool_calls"


async def test_zero_argument_tool_call(name, srv, stream):
    srv.enqueue(Turn(tool_calls=[ToolCall("now", {})]))
    res = await harness.complete(srv, name, request(name), stream=stream)
    (call,) = [b for b in res.response.message.content if isinstance(b, ToolUse)]
    assert (call.name, call.arguments) == ("now", "{}")


async def test_reasoning_usage(name, srv, stream):
    srv.enqueue(Turn(text="4", reasoning="2 and 2 make 4", reasoning_signature="c2lnLTE=", usage=(20, 9, 5)))
    res = await harness.complete(srv, name, request(name), stream=stream)
    kinds = [type(b).__name__ for b in res.response.message.content]
    assert kinds[-1] == "Text"
    th = [b for b in res.response.message.content if isinstance(b, Thinking)]
    assert th and th[0].text == "2 and 2 make 4"
    u = res.response.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (20, 9, 29)
    if name in ("openai", "deepseek", "gemini"):
        assert u.reasoning_tokens == 5


FINISH = {  # (scripted finish, expected Lux finish) per adapter
    "openai": [("length", "length"), ("content_filter", "content_filter")],
    "deepseek": [("length", "length"), ("content_filter", "content_filter")],
    "anthropic": [("length", "length"), ("content_filter", "content_filter"), ("stop_sequence", "stop")],
    "gemini": [("length", "length"), ("content_filter", "safety"), ("RECITATION", "recitation"),
               ("MALFORMED_FUNCTION_CALL", "malformed_tool_call")],
    "ollama": [("length", "length"), ("stop", "stop")],
    "openai-responses": [("length", "length"), ("content_filter", "content_filter"), ("stop", "stop")],
    "openrouter": [("length", "length"), ("content_filter", "content_filter")],
}


async def test_finish_reasons(name, srv, stream):
    for scripted, expected in FINISH[name]:
        srv.enqueue(Turn(text="cut", finish=scripted))
        res = await harness.complete(srv, name, request(name), stream=stream)
        assert res.response.choices[0].finish_reason == expected, scripted


@pytest.mark.parametrize("status,kind", [(401, "authentication"), (500, "server_error")])
async def test_http_errors(name, srv, stream, status, kind):
    srv.enqueue(Fail(status, "scripted failure"))
    with pytest.raises(ProviderError) as ei:
        await harness.complete(srv, name, request(name), stream=stream)
    assert (ei.value.kind, ei.value.status) == (kind, status)


async def test_rate_limit_with_retry_after(name, srv, stream):
    srv.enqueue(Fail(429, "slow down", retry_after=2.0))
    with pytest.raises(ProviderError) as ei:
        await harness.complete(srv, name, request(name), stream=stream)
    assert (ei.value.kind, ei.value.status, ei.value.retry_after) == ("rate_limit", 429, 2.0)


async def test_malformed_body(name, srv, stream):
    srv.enqueue(MalformedBody())
    with pytest.raises(ProviderError) as ei:
        await harness.complete(srv, name, request(name), stream=stream)
    assert ei.value.kind == "server_error"
    if stream:  # the adapter reported the bad frame as an error event
        assert ei.value.partial.choices[0].finish_reason == "error"


async def test_stream_cut_midway(name, srv, stream):
    srv.enqueue(CutStream(after_chunks=3, turn=Turn(text="a long answer that is cut", chunk_size=3)))
    with pytest.raises(ProviderError) as ei:
        await harness.complete(srv, name, request(name), stream=stream)
    assert ei.value.kind == "server_error"


async def test_mid_stream_error_event(name, srv):
    # the Responses API opens with four events (created, in_progress, item and part added)
    srv.enqueue(MidStreamError(after_chunks=8 if name == "openai-responses" else 4, status=429, message="too many",
                               turn=Turn(text="partial answer text here", chunk_size=3)))
    with pytest.raises(ProviderError) as ei:
        await harness.complete(srv, name, request(name), stream=True)
    err = ei.value
    assert err.kind == ("server_error" if name == "ollama" else "rate_limit")  # Ollama sends only a message
    partial = err.partial
    assert partial.choices[0].finish_reason == "error"
    assert partial.error is not None and "too many" in partial.error.message
    text = "".join(b.text for b in partial.message.content if isinstance(b, Text))
    assert text and "partial answer text here".startswith(text)


async def test_overloaded_mid_stream_is_server_error(name, srv):
    srv.enqueue(MidStreamError(after_chunks=2, status=529, message="overloaded"))
    with pytest.raises(ProviderError) as ei:
        await harness.complete(srv, name, request(name), stream=True)
    assert ei.value.kind == "server_error"
