"""The local model server is honest: each provider's official Python SDK parses every
answer (text, reasoning + signatures, parallel and zero-argument tool calls, usage,
finish reasons) and raises its typed errors for scripted failures."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anthropic
import httpx
import ollama
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from gelbridge._dev.model_server import (
    Citation,
    CutStream,
    Fail,
    MalformedBody,
    MidStreamError,
    ModelServer,
    ToolCall,
    Turn,
)

KEY = "test-key-123"
GEMINI_SIG = "c2lnbmF0dXJlLTE="  # base64, like real Gemini thought signatures

RICH = Turn(
    text="The weather is fine in both cities.",
    reasoning="The user asks about two cities; call the tool twice.",
    reasoning_signature=GEMINI_SIG,
    redacted_reasoning="b3BhcXVlLXJlZGFjdGVk",
    tool_calls=[
        ToolCall("get_weather", {"city": "Paris", "units": {"temp": "C"}}, id="call_a"),
        ToolCall("get_weather", {"city": "Oslo"}, id="call_b"),
        ToolCall("now"),  # zero-argument call
    ],
    usage=(120, 80, 30),
    chunk_size=5,
)


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(api_key=KEY) as srv:
        yield srv


# --------------------------------------------------------------------------- OpenAI


def _openai(server: ModelServer, key: str = KEY, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=retries)


def test_openai_sdk_parses_full_answer(server: ModelServer) -> None:
    server.enqueue(RICH)
    r = _openai(server).chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "weather?"}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == RICH.text
    assert choice.message.model_extra["reasoning_content"] == RICH.reasoning
    calls = choice.message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "get_weather", '{"city":"Paris","units":{"temp":"C"}}'),
        ("call_b", "get_weather", '{"city":"Oslo"}'),
        (calls[2].id, "now", "{}"),
    ]
    assert r.usage.prompt_tokens == 120 and r.usage.completion_tokens == 80 and r.usage.total_tokens == 200
    assert r.usage.completion_tokens_details.reasoning_tokens == 30
    assert r.model == "gpt-x"


def test_openai_sdk_stream_accumulates_parallel_calls_and_usage(server: ModelServer) -> None:
    server.enqueue(RICH)
    client = _openai(server)
    with client.chat.completions.stream(
        model="gpt-x", messages=[{"role": "user", "content": "weather?"}], stream_options={"include_usage": True}
    ) as stream:
        deltas = list(stream)
        final = stream.get_final_completion()
    assert sum(1 for e in deltas if e.type == "content.delta") >= len(RICH.text) // 5
    msg = final.choices[0].message
    assert msg.content == RICH.text
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        ("get_weather", '{"city":"Paris","units":{"temp":"C"}}'),
        ("get_weather", '{"city":"Oslo"}'),
        ("now", "{}"),
    ]
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage is not None and final.usage.completion_tokens_details.reasoning_tokens == 30
    raw = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True))
    assert all(c.usage is None for c in raw)  # no usage chunk unless include_usage


def test_openai_stream_carries_reasoning_content_deltas(server: ModelServer) -> None:
    server.enqueue(Turn(text="4", reasoning="2+2 is four", chunk_size=3))
    chunks = list(_openai(server).chat.completions.create(
        model="deepseek-reasoner", messages=[{"role": "user", "content": "2+2?"}], stream=True))
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert reasoning == "2+2 is four"
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("path", ["/v1", "", "/openai/v1"])
def test_openai_compatible_paths_are_served(server: ModelServer, path: str) -> None:
    client = openai.OpenAI(base_url=server.url + path, api_key=KEY, max_retries=0)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "ping"}])
    assert r.choices[0].message.content == "You said: ping"
    assert server.requests[-1].path == f"{path}/chat/completions"


def test_openai_sdk_typed_errors(server: ModelServer) -> None:
    with pytest.raises(openai.AuthenticationError) as auth:
        _openai(server, key="wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert auth.value.status_code == 401 and auth.value.code == "invalid_api_key"

    server.enqueue(Fail(429, retry_after=7, message="slow down"))
    with pytest.raises(openai.RateLimitError) as rate:
        _openai(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert rate.value.response.headers["retry-after"] == "7"
    assert "slow down" in str(rate.value)

    server.enqueue(Fail(500))
    with pytest.raises(openai.InternalServerError):
        _openai(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_openai_sdk_retries_after_429_and_succeeds(server: ModelServer) -> None:
    server.enqueue(Fail(429, retry_after=0.05), Turn(text="second try"))
    r = _openai(server, retries=1).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].message.content == "second try"
    assert len(server.requests) == 2


def test_openai_sdk_sees_cut_stream_and_malformed_body(server: ModelServer) -> None:
    server.enqueue(CutStream(after_chunks=2, turn=Turn(text="a long answer that never ends", chunk_size=4)))
    with pytest.raises((httpx.RemoteProtocolError, openai.APIError)):
        list(_openai(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                     stream=True))
    server.enqueue(MalformedBody())
    with pytest.raises((ValueError, openai.APIError)):  # the SDK's JSON decoding fails
        _openai(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_openai_sdk_reads_openrouter_reasoning_details() -> None:
    with ModelServer(api_key=KEY, reasoning_details=True, openai_reasoning_field="reasoning") as srv:
        client = openai.OpenAI(base_url=srv.url + "/api/v1", api_key=KEY, max_retries=0)
        srv.enqueue(RICH)
        msg = client.chat.completions.create(model="anthropic/claude-sonnet-4.6",
                                             messages=[{"role": "user", "content": "x"}]).choices[0].message
        details = msg.model_extra["reasoning_details"]
        assert [d["type"] for d in details] == ["reasoning.text", "reasoning.encrypted"]
        assert details[0]["signature"] == GEMINI_SIG and details[1]["data"] == RICH.redacted_reasoning
        srv.enqueue(RICH)
        pieces = [d for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True)
            if c.choices for d in (c.choices[0].delta.model_extra or {}).get("reasoning_details") or []]
        assert "".join(p.get("text") or "" for p in pieces if p["type"] == "reasoning.text") == RICH.reasoning
        assert any(p.get("signature") == GEMINI_SIG for p in pieces)


# ------------------------------------------------------------------ OpenAI Responses

RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "strict": False,
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
                   {"type": "function", "name": "now", "strict": False,
                    "parameters": {"type": "object", "properties": {}}}]


def _responses(server: ModelServer, **kw: object) -> openai.types.responses.Response:
    return _openai(server).responses.create(model="gpt-5", input="weather?", tools=RESPONSES_TOOLS,
                                            include=["reasoning.encrypted_content"], store=False, **kw)


def test_openai_sdk_parses_a_full_response_and_it_validates(server: ModelServer) -> None:
    from openai.types.responses import Response

    server.enqueue(RICH)
    r = _responses(server)
    Response.model_validate(r.model_dump())  # every required field, typed (the SDK itself only constructs)
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call", "function_call", "function_call"]
    reasoning = r.output[0]
    assert reasoning.summary[0].text == RICH.reasoning and reasoning.encrypted_content == GEMINI_SIG
    assert r.output_text == RICH.text and r.status == "completed"
    calls = [(o.call_id, o.name, o.arguments) for o in r.output if o.type == "function_call"]
    assert calls == [("call_a", "get_weather", '{"city":"Paris","units":{"temp":"C"}}'),
                     ("call_b", "get_weather", '{"city":"Oslo"}'), (calls[2][0], "now", "{}")]
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (120, 80, 200)
    assert r.usage.output_tokens_details.reasoning_tokens == 30 and r.usage.input_tokens_details.cached_tokens == 0
    assert [t.name for t in r.tools] == ["get_weather", "now"]


def test_openai_responses_without_include_has_no_encrypted_content(server: ModelServer) -> None:
    server.enqueue(Turn(text="ok", reasoning="brief"))
    r = _openai(server).responses.create(model="gpt-5", input="x")
    assert r.output[0].type == "reasoning" and r.output[0].encrypted_content is None


def test_openai_sdk_stream_events_validate_and_accumulate(server: ModelServer) -> None:
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    events = TypeAdapter(ResponseStreamEvent)
    server.enqueue(RICH)
    with _openai(server).responses.stream(model="gpt-5", input="weather?", tools=RESPONSES_TOOLS,
                                          include=["reasoning.encrypted_content"], store=False) as stream:
        seen = [e for e in stream]
        final = stream.get_final_response()
    for e in seen:
        events.validate_python(e.model_dump(warnings=False))  # the parsed subclasses warn on dump
    kinds = [e.type for e in seen]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    summary = "".join(e.delta for e in seen if e.type == "response.reasoning_summary_text.delta")
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert summary == RICH.reasoning and text == RICH.text
    done = [e.item for e in seen if e.type == "response.output_item.done"]
    assert done[0].type == "reasoning" and done[0].encrypted_content == GEMINI_SIG
    assert final.output_text == RICH.text and final.usage.total_tokens == 200
    assert [o.arguments for o in final.output if o.type == "function_call"] == [
        '{"city":"Paris","units":{"temp":"C"}}', '{"city":"Oslo"}', "{}"]


def test_openai_responses_incomplete_and_typed_errors(server: ModelServer) -> None:
    server.enqueue(Turn(text="cut", finish="length"))
    r = _openai(server).responses.create(model="gpt-5", input="x")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"

    server.enqueue(Fail(400, "could not verify", code="invalid_encrypted_content"))
    with pytest.raises(openai.BadRequestError) as bad:
        _openai(server).responses.create(model="gpt-5", input="x")
    assert bad.value.code == "invalid_encrypted_content"
    with pytest.raises(openai.AuthenticationError):
        _openai(server, key="wrong").responses.create(model="gpt-5", input="x")
    server.enqueue(MidStreamError(after_chunks=3, status=500, message="boom"))
    with _openai(server).responses.create(model="gpt-5", input="x", stream=True) as stream:
        kinds = [e.type for e in stream]
    assert kinds[-1] == "error"


async def test_async_openai_sdk_streams_from_event_loop(server: ModelServer) -> None:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    server.enqueue(Turn(text="async works", chunk_size=2))

    async def one() -> str:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}], stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    answers = await asyncio.gather(one(), one(), one())
    assert sorted(answers) == ["You said: q", "You said: q", "async works"]
    await client.close()


# --------------------------------------------------------------------------- Anthropic


def _anthropic(server: ModelServer, key: str = KEY, retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=retries)


def _check_anthropic_message(m: anthropic.types.Message) -> None:
    kinds = [b.type for b in m.content]
    assert kinds == ["thinking", "redacted_thinking", "text", "tool_use", "tool_use", "tool_use"]
    thinking, redacted, text, *tools = m.content
    assert thinking.thinking == RICH.reasoning and thinking.signature == GEMINI_SIG
    assert redacted.data == RICH.redacted_reasoning
    assert text.text == RICH.text
    assert [(t.id, t.name, t.input) for t in tools] == [
        ("call_a", "get_weather", {"city": "Paris", "units": {"temp": "C"}}),
        ("call_b", "get_weather", {"city": "Oslo"}),
        (tools[2].id, "now", {}),
    ]
    assert tools[2].id.startswith("toolu_")
    assert m.stop_reason == "tool_use"
    assert m.usage.output_tokens == 80


def test_anthropic_sdk_parses_full_answer(server: ModelServer) -> None:
    server.enqueue(RICH)
    m = _anthropic(server).messages.create(model="claude-x", max_tokens=100,
                                           messages=[{"role": "user", "content": "weather?"}])
    _check_anthropic_message(m)
    assert m.usage.input_tokens == 120 and m.model == "claude-x"


def test_anthropic_sdk_stream_accumulates_every_block_kind(server: ModelServer) -> None:
    server.enqueue(RICH)
    with _anthropic(server).messages.stream(model="claude-x", max_tokens=100,
                                            messages=[{"role": "user", "content": "weather?"}]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    _check_anthropic_message(final)
    types = {e.type for e in events}
    assert {"message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop",
            "thinking", "signature", "text", "input_json"} <= types
    assert final.usage.input_tokens == 120


def test_anthropic_empty_signed_thinking_block(server: ModelServer) -> None:
    server.enqueue(Turn(text="ok", reasoning_signature="c2ln"))
    with _anthropic(server).messages.stream(model="c", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == ""
    assert final.content[0].signature == "c2ln" and final.stop_reason == "end_turn"


def test_anthropic_sdk_typed_errors(server: ModelServer) -> None:
    with pytest.raises(anthropic.AuthenticationError) as auth:
        _anthropic(server, key="wrong").messages.create(model="c", max_tokens=5,
                                                       messages=[{"role": "user", "content": "x"}])
    assert auth.value.body["error"]["type"] == "authentication_error"

    server.enqueue(Fail(429, retry_after=3))
    with pytest.raises(anthropic.RateLimitError) as rate:
        _anthropic(server).messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert rate.value.response.headers["retry-after"] == "3"
    assert rate.value.body["error"]["type"] == "rate_limit_error"

    server.enqueue(Fail(529, message="overloaded"))
    with pytest.raises(anthropic.InternalServerError) as over:
        _anthropic(server).messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert over.value.status_code == 529 and over.value.body["error"]["type"] == "overloaded_error"

    server.enqueue(MidStreamError(after_chunks=3, message="overloaded mid-stream"))
    with pytest.raises(anthropic.APIStatusError) as mid:
        with _anthropic(server).messages.stream(model="c", max_tokens=5,
                                                messages=[{"role": "user", "content": "x"}]) as s:
            s.get_final_message()
    assert "overloaded mid-stream" in str(mid.value)


def test_anthropic_requires_version_header(server: ModelServer) -> None:
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY},
                   json={"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


# --------------------------------------------------------------------------- Gemini


_clients: list[genai.Client] = []  # a collected genai.Client closes its HTTP client mid-call


def _gemini(server: ModelServer, key: str = KEY) -> genai.Client:
    client = genai.Client(api_key=key, http_options=genai_types.HttpOptions(base_url=server.url))
    _clients.append(client)
    return client


def test_gemini_sdk_parses_full_answer(server: ModelServer) -> None:
    server.enqueue(RICH)
    r = _gemini(server).models.generate_content(model="gemini-x", contents="weather?")
    parts = r.candidates[0].content.parts
    assert parts[0].thought is True and parts[0].text == RICH.reasoning
    assert parts[1].text == RICH.text and not parts[1].thought
    calls = [p.function_call for p in parts[2:]]
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("call_a", "get_weather", {"city": "Paris", "units": {"temp": "C"}}),
        ("call_b", "get_weather", {"city": "Oslo"}),
        (calls[2].id, "now", {}),
    ]
    # signature on the first functionCall part only (parallel calls)
    assert [p.thought_signature for p in parts] == [None, None, b"signature-1", None, None]
    assert r.candidates[0].finish_reason == genai_types.FinishReason.STOP
    u = r.usage_metadata
    assert (u.prompt_token_count, u.candidates_token_count, u.thoughts_token_count, u.total_token_count) == (
        120, 50, 30, 200)
    assert len(r.function_calls) == 3


def test_gemini_sdk_stream_yields_incremental_chunks(server: ModelServer) -> None:
    server.enqueue(RICH)
    chunks = list(_gemini(server).models.generate_content_stream(model="gemini-x", contents="weather?"))
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    assert "".join(p.text for p in parts if p.thought) == RICH.reasoning
    assert "".join(p.text for p in parts if p.text and not p.thought) == RICH.text
    assert [p.function_call.name for p in parts if p.function_call] == ["get_weather", "get_weather", "now"]
    assert [p.thought_signature for p in parts if p.thought_signature] == [b"signature-1"]
    assert parts[[i for i, p in enumerate(parts) if p.function_call][0]].thought_signature == b"signature-1"
    assert chunks[-1].candidates[0].finish_reason == genai_types.FinishReason.STOP
    assert chunks[-1].usage_metadata.thoughts_token_count == 30
    assert len(chunks) > 10
    assert server.requests[-1].query == {"alt": "sse"}


def test_gemini_text_answer_signature_on_last_part_and_max_tokens(server: ModelServer) -> None:
    server.enqueue(Turn(text="truncated answ", reasoning_signature=GEMINI_SIG, finish="length", chunk_size=4))
    chunks = list(_gemini(server).models.generate_content_stream(model="g", contents="x"))
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    assert parts[-1].thought_signature == b"signature-1"
    assert all(p.thought_signature is None for p in parts[:-1])
    assert chunks[-1].candidates[0].finish_reason == genai_types.FinishReason.MAX_TOKENS


def test_gemini_sdk_typed_errors(server: ModelServer) -> None:
    with pytest.raises(genai_errors.ClientError) as auth:
        _gemini(server, key="wrong").models.generate_content(model="g", contents="x")
    assert auth.value.code == 401 and auth.value.status == "UNAUTHENTICATED"

    server.enqueue(Fail(429, retry_after=2, message="quota"))
    with pytest.raises(genai_errors.ClientError) as rate:
        _gemini(server).models.generate_content(model="g", contents="x")
    assert rate.value.code == 429 and rate.value.status == "RESOURCE_EXHAUSTED" and rate.value.message == "quota"
    assert rate.value.response.headers["retry-after"] == "2"

    server.enqueue(Fail(503))
    with pytest.raises(genai_errors.ServerError) as unavailable:
        list(_gemini(server).models.generate_content_stream(model="g", contents="x"))
    assert unavailable.value.status == "UNAVAILABLE"


async def test_gemini_async_sdk_stream(server: ModelServer) -> None:
    server.enqueue(Turn(text="from the loop", chunk_size=3))
    stream = await _gemini(server).aio.models.generate_content_stream(model="g", contents="x")
    text = "".join([c.text or "" async for c in stream])
    assert text == "from the loop"


# --------------------------------------------------------------------------- Ollama


def _ollama(server: ModelServer, key: str = KEY) -> ollama.Client:
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {key}"})


def test_ollama_sdk_parses_full_answer(server: ModelServer) -> None:
    server.enqueue(RICH)
    r = _ollama(server).chat(model="qwen3", messages=[{"role": "user", "content": "weather?"}], stream=False)
    assert r.message.content == RICH.text and r.message.thinking == RICH.reasoning
    assert [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls] == [
        ("get_weather", {"city": "Paris", "units": {"temp": "C"}}),
        ("get_weather", {"city": "Oslo"}),
        ("now", {}),
    ]
    assert r.done is True and r.done_reason == "stop"
    assert (r.prompt_eval_count, r.eval_count) == (120, 80)


def test_ollama_sdk_stream_ndjson(server: ModelServer) -> None:
    server.enqueue(RICH)
    chunks = list(_ollama(server).chat(model="qwen3", messages=[{"role": "user", "content": "w"}], stream=True))
    assert "".join(c.message.content for c in chunks) == RICH.text
    assert "".join(c.message.thinking or "" for c in chunks) == RICH.reasoning
    calls = [tc for c in chunks for tc in (c.message.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["get_weather", "get_weather", "now"]
    assert all(not c.done for c in chunks[:-1])
    assert chunks[-1].done and chunks[-1].done_reason == "stop" and chunks[-1].eval_count == 80


def test_ollama_streams_by_default_and_reports_length(server: ModelServer) -> None:
    server.enqueue(Turn(text="cut short", finish="length"))
    r = httpx.post(server.url + "/api/chat", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = r.text.strip().split("\n")
    assert len(lines) > 1 and '"done_reason":"length"' in lines[-1]


def test_ollama_sdk_errors_and_discovery(server: ModelServer) -> None:
    with pytest.raises(ollama.ResponseError) as auth:
        _ollama(server, key="wrong").chat(model="m", messages=[{"role": "user", "content": "x"}], stream=False)
    assert auth.value.status_code == 401

    server.enqueue(Fail(429, message="busy"))
    with pytest.raises(ollama.ResponseError) as rate:
        _ollama(server).chat(model="m", messages=[{"role": "user", "content": "x"}], stream=False)
    assert rate.value.status_code == 429 and rate.value.error == "busy"

    assert _ollama(server).list().models[0].model == "echo:latest"
    r = httpx.get(server.url + "/api/version", headers={"Authorization": f"Bearer {KEY}"})
    assert r.json()["version"]

    server.enqueue(MidStreamError(after_chunks=1, message="model crashed", turn=Turn(text="abcdefgh", chunk_size=2)))
    with pytest.raises(ollama.ResponseError) as mid:
        list(_ollama(server).chat(model="m", messages=[{"role": "user", "content": "x"}], stream=True))
    assert mid.value.error == "model crashed"


# ------------------------------------------------------------ provider-native web search

SEARCHED = Turn(text="Paris is the capital.", searches=["capital of france"], chunk_size=5,
                citations=[Citation("https://en.wikipedia.org/wiki/Paris", "Paris - Wikipedia", "the capital")])


def test_the_sdks_parse_native_web_search_answers(server: ModelServer) -> None:
    from anthropic.types import Message as AnthropicMessage
    from openai.types.responses import Response

    a = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    for stream in (False, True):
        server.enqueue(SEARCHED)
        kw = {"model": "claude-sonnet-4-6", "max_tokens": 100, "messages": [{"role": "user", "content": "q"}],
              "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]}
        if stream:
            with a.messages.stream(**kw) as s:
                list(s)
                m = s.get_final_message()
        else:
            m = a.messages.create(**kw)
        AnthropicMessage.model_validate(m.model_dump())
        assert [b.type for b in m.content] == ["server_tool_use", "web_search_tool_result", "text"]
        assert m.content[0].input == {"query": "capital of france"}
        assert [(c.url, c.title) for c in m.content[2].citations] == [
            ("https://en.wikipedia.org/wiki/Paris", "Paris - Wikipedia")]

    o = _openai(server)
    server.enqueue(SEARCHED)
    r = o.responses.create(model="gpt-5", input="q", tools=[{"type": "web_search"}])
    Response.model_validate(r.model_dump())
    assert [i.type for i in r.output] == ["web_search_call", "message"]
    assert r.output[1].content[0].annotations[0].url == "https://en.wikipedia.org/wiki/Paris"
    server.enqueue(SEARCHED)
    with o.responses.stream(model="gpt-5", input="q", tools=[{"type": "web_search"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.web_search_call.completed" in kinds and "response.output_text.annotation.added" in kinds
    assert final.output[1].content[0].annotations[0].title == "Paris - Wikipedia"

    g = genai.Client(api_key=KEY, http_options=genai_types.HttpOptions(base_url=server.url))
    server.enqueue(SEARCHED)
    cfg = genai_types.GenerateContentConfig(tools=[genai_types.Tool(google_search=genai_types.GoogleSearch())])
    gr = g.models.generate_content(model="gemini-2.5-flash", contents="q", config=cfg)
    gm = gr.candidates[0].grounding_metadata
    assert gm.web_search_queries == ["capital of france"]
    assert [(c.web.uri, c.web.title) for c in gm.grounding_chunks] == [
        ("https://en.wikipedia.org/wiki/Paris", "Paris - Wikipedia")]
    assert gm.grounding_supports[0].grounding_chunk_indices == [0]


# ------------------------------------------------------------ model discovery (gelbridge check's probes)

OFFERED = ["model-a", "model-b", "model-c"]


@pytest.fixture
def offering() -> Iterator[ModelServer]:
    with ModelServer(api_key=KEY, models=OFFERED) as srv:
        yield srv


def test_openai_sdk_lists_and_retrieves_models_and_types_the_errors(offering: ModelServer) -> None:
    from openai.types import Model

    client = _openai(offering)
    listed = client.models.list()
    assert [m.id for m in listed] == OFFERED and all(Model.model_validate(m.model_dump()) for m in listed)
    assert client.models.retrieve("model-b").id == "model-b"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("nope")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as chat:  # a chat with a model it does not have: the same 404
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert chat.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError) as auth:
        _openai(offering, key="wrong").models.list()
    assert auth.value.code == "invalid_api_key"
    # DeepSeek (base_url https://api.deepseek.com: GET /models) and OpenRouter (/api/v1/models)
    for prefix in ("", "/api/v1"):
        other = openai.OpenAI(base_url=offering.url + prefix, api_key=KEY, max_retries=0)
        assert [m.id for m in other.models.list()] == OFFERED


def test_anthropic_sdk_lists_and_retrieves_models_and_types_the_errors(offering: ModelServer) -> None:
    from anthropic.types import ModelInfo

    client = _anthropic(offering)
    page = client.models.list(limit=2)
    assert [m.id for m in page.data] == OFFERED[:2] and page.has_more and page.last_id == "model-b"
    assert all(ModelInfo.model_validate(m.model_dump()) for m in page.data)
    assert [m.id for m in client.models.list()] == OFFERED
    assert client.models.retrieve("model-c").id == "model-c"
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.models.retrieve("claude-nope")
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError) as auth:
        _anthropic(offering, key="wrong").models.list()
    assert auth.value.body["error"]["type"] == "authentication_error"


def test_gemini_sdk_lists_and_gets_models_and_types_the_errors(offering: ModelServer) -> None:
    client = _gemini(offering)
    listed = list(client.models.list(config={"page_size": 2}))  # the pager follows nextPageToken
    assert [m.name for m in listed] == [f"models/{m}" for m in OFFERED]
    got = client.models.get(model="model-a")
    assert got.name == "models/model-a" and "generateContent" in (got.supported_actions or [])
    with pytest.raises(genai_errors.ClientError) as missing:
        client.models.get(model="gemini-nope")
    assert missing.value.code == 404 and missing.value.status == "NOT_FOUND"
    with pytest.raises(genai_errors.ClientError) as chat:
        client.models.generate_content(model="gemini-nope", contents="x")
    assert chat.value.code == 404
    with pytest.raises(genai_errors.ClientError) as auth:
        list(_gemini(offering, key="wrong").models.list())
    assert auth.value.code == 401 and auth.value.status == "UNAUTHENTICATED"


def test_ollama_sdk_lists_and_shows_models_and_types_the_errors(offering: ModelServer) -> None:
    client = _ollama(offering)
    assert [m.model for m in client.list().models] == OFFERED
    shown = client.show("model-a")  # model-a is model-a:latest
    assert shown.details is not None and shown.capabilities and shown.modelfile
    with pytest.raises(ollama.ResponseError) as missing:
        client.show("nope")
    assert missing.value.status_code == 404 and missing.value.error == "model 'nope' not found"
    with pytest.raises(ollama.ResponseError) as chat:
        client.chat(model="nope", messages=[{"role": "user", "content": "x"}], stream=False)
    assert chat.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as auth:
        _ollama(offering, key="wrong").show("model-a")
    assert auth.value.status_code == 401


def test_openrouter_key_check_answers_in_openrouters_shape(offering: ModelServer) -> None:
    # OpenRouter API reference, "Get current API key": GET /api/v1/key -> {"data": {...}};
    # "Errors": {"error": {"code": <status>, "message": ...}}
    ok = httpx.get(offering.url + "/api/v1/key", headers={"Authorization": f"Bearer {KEY}"})
    data = ok.json()["data"]
    assert ok.status_code == 200 and {"label", "limit", "usage", "is_free_tier", "limit_remaining"} <= set(data)
    bad = httpx.get(offering.url + "/api/v1/key", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and bad.json() == {"error": {"code": 401, "message": "User not found."}}


def test_without_a_model_list_the_echo_model_answers_every_lookup(server: ModelServer) -> None:
    assert [m.id for m in _openai(server).models.list()] == ["echo"]
    assert _openai(server).models.retrieve("anything-at-all").id == "anything-at-all"
    assert _anthropic(server).models.retrieve("claude-x").id == "claude-x"
    assert _ollama(server).show("qwen3").details is not None
    assert [m.model for m in _ollama(server).list().models] == ["echo:latest"]
