"""The tool mode of the local model (``gelbridge dev model``): a message that says
"call <tool>" gets that tool call in each provider's real wire format, streamed and
not (parsed by the official SDKs), and the request that carries the result gets an
answer quoting it; other messages are echoed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import ollama
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from gelbridge._dev._tool_mode import RESULT_CHARS, asked_calls, offered_tools, tool_turn, trailing_results
from gelbridge._dev.model_server import Mode, ModelServer, RecordedRequest, ToolCall, Turn, responder

FETCH = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}
TIME = {"type": "object", "properties": {"timezone": {"type": "string"}}}
TOOLS = {"fetch_url": FETCH, "current_time": TIME}
ASK = "Please call fetch_url https://example.com/page."
PAGE = "Example Domain. This domain is for use in examples."


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(responder=responder(Mode.TOOLS), chunk_size=4) as srv:
        yield srv


# --------------------------------------------------------------------------- what a message asks for


@pytest.mark.parametrize(("text", "calls"), [
    ("call current_time", [ToolCall("current_time", {})]),
    ("what time is it? Use the tool current_time.", [ToolCall("current_time", {})]),
    ("CALL current_time timezone=Europe/Berlin", [ToolCall("current_time", {"timezone": "Europe/Berlin"})]),
    ("call fetch_url https://example.com/a?b=1.", [ToolCall("fetch_url", {"url": "https://example.com/a?b=1"})]),
    ('call fetch_url {"url": "https://x.test/", "n": 2} now', [ToolCall("fetch_url", {"url": "https://x.test/",
                                                                                      "n": 2})]),
    ("call fetch_url url=https://e.test n=3 flag=true", [ToolCall("fetch_url", {"url": "https://e.test", "n": 3,
                                                                                "flag": True})]),
    ("call current_time and call fetch_url https://e.test", [ToolCall("current_time", {}),
                                                             ToolCall("fetch_url", {"url": "https://e.test"})]),
    ("call current_time please", [ToolCall("current_time", {})]),  # no required parameter to fill
    ("call fetch_url and then stop", [ToolCall("fetch_url", {})]),  # a filler is no URL
    ("call me later, use python", []),  # names no offered tool
])
def test_a_message_asks_for_the_calls_it_names(text: str, calls: list[ToolCall]) -> None:
    assert asked_calls(text, TOOLS) == (calls, None)


def test_the_tool_it_does_not_offer_is_named_back() -> None:
    assert asked_calls("use the tool send_email", TOOLS) == ([], "send_email")
    turn = tool_turn({"messages": [{"role": "user", "content": "use the tool send_email"}],
                      "tools": [{"type": "function", "function": {"name": "current_time", "parameters": TIME}}]})
    assert turn.tool_calls == () and turn.text == "This request offers no tool named send_email. " \
                                                  "Tools offered: current_time."
    bare = tool_turn({"messages": [{"role": "user", "content": "use the tool current_time"}]})
    assert "Tools offered: none (name some in [defaults] tools)" in bare.text


def test_offered_tools_are_read_in_every_provider_shape() -> None:
    shapes: list[list[dict[str, Any]]] = [
        [{"type": "function", "function": {"name": "fetch_url", "parameters": FETCH}}],  # Chat Completions, Ollama
        [{"type": "function", "name": "fetch_url", "parameters": FETCH}, {"type": "web_search"}],  # Responses
        [{"name": "fetch_url", "input_schema": FETCH}, {"type": "web_search_20250305", "name": "web_search"}],
        [{"functionDeclarations": [{"name": "fetch_url", "parametersJsonSchema": FETCH}]}, {"googleSearch": {}}],
    ]
    for tools in shapes:
        assert offered_tools({"tools": tools})["fetch_url"] == FETCH
    assert offered_tools({"tools": "nonsense"}) == {} and offered_tools(None) == {}


def test_results_count_only_when_the_request_ends_with_them() -> None:
    asked = {"role": "user", "content": ASK}
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": {"name": "fetch_url", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": PAGE}
    [r] = trailing_results({"messages": [asked, call, result]})
    assert (r.name, r.text, r.is_error) == ("fetch_url", PAGE, False)
    later = {"role": "user", "content": "call current_time"}
    assert trailing_results({"messages": [asked, call, result, later]}) == []
    turn = tool_turn({"messages": [asked, call, result, later], "tools": [{"name": "current_time"}]})
    assert [c.name for c in turn.tool_calls] == ["current_time"]


def test_a_long_result_is_cut_and_an_error_says_failed() -> None:
    long = "word " * 1000
    body = {"contents": [
        {"role": "user", "parts": [{"text": ASK}]},
        {"role": "model", "parts": [{"functionCall": {"name": "fetch_url", "args": {}, "id": "f1"}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "fetch_url", "id": "f1", "response": {"output": long}}},
                                   {"functionResponse": {"name": "current_time", "response": {"error": "no zone"}}}]},
    ]}
    text = tool_turn(body).text
    first, second = text.split("\n")
    assert first.startswith("fetch_url returned: word word") and f"… ({len(long)} characters in all)" in first
    assert len(first) < RESULT_CHARS + 60
    assert second == "current_time failed: no zone"


def test_echo_mode_never_calls_a_tool() -> None:
    with ModelServer(responder=responder(Mode.ECHO)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
        r = c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "call current_time"}],
                                      tools=[{"type": "function", "function": {"name": "current_time"}}])
    assert r.choices[0].message.content == "You said: call current_time" and r.choices[0].message.tool_calls is None


def test_plain_messages_are_echoed_and_the_delay_applies() -> None:
    assert tool_turn({"messages": [{"role": "user", "content": "hello"}]}) == Turn(text="You said: hello")
    req = RecordedRequest("openai", "POST", "/v1/chat/completions", {}, {}, {"messages": []})
    item = responder(Mode.TOOLS, 0.25)(req)
    assert isinstance(item, Turn) and item.chunk_delay == 0.25


# --------------------------------------------------------------------------- the official SDKs, both steps

STREAM = [False, True]


@pytest.mark.parametrize("stream", STREAM)
def test_openai_chat_completions_round_trip(server: ModelServer, stream: bool) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": "fetch_url", "parameters": FETCH}}]
    messages: list[Any] = [{"role": "user", "content": ASK}]

    def ask() -> Any:
        if not stream:
            return client.chat.completions.create(model="echo", messages=messages, tools=tools).choices[0]
        with client.chat.completions.stream(model="echo", messages=messages, tools=tools) as s:
            for _ in s:
                pass
            return s.get_final_completion().choices[0]

    first = ask()
    assert first.finish_reason == "tool_calls"
    [call] = first.message.tool_calls
    assert call.function.name == "fetch_url" and json.loads(call.function.arguments) == {"url":
                                                                                         "https://example.com/page"}
    messages += [first.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": PAGE}]
    final = ask()
    assert final.finish_reason == "stop" and final.message.content == f"fetch_url returned: {PAGE}"


@pytest.mark.parametrize("stream", STREAM)
def test_openai_responses_round_trip(server: ModelServer, stream: bool) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    tools: Any = [{"type": "function", "name": "fetch_url", "parameters": FETCH, "strict": False}]
    items: list[Any] = [{"role": "user", "content": ASK}]

    def ask() -> Any:
        if not stream:
            return client.responses.create(model="echo", input=items, tools=tools)
        with client.responses.stream(model="echo", input=items, tools=tools) as s:
            for _ in s:
                pass
            return s.get_final_response()

    first = ask()
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "fetch_url" and json.loads(call.arguments) == {"url": "https://example.com/page"}
    items += [{"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": PAGE}]
    assert ask().output_text == f"fetch_url returned: {PAGE}"


@pytest.mark.parametrize("stream", STREAM)
def test_anthropic_round_trip(server: ModelServer, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    tools: Any = [{"name": "fetch_url", "description": "fetch", "input_schema": FETCH}]
    messages: list[Any] = [{"role": "user", "content": ASK}]

    def ask() -> anthropic.types.Message:
        if not stream:
            return client.messages.create(model="claude", max_tokens=256, messages=messages, tools=tools)
        with client.messages.stream(model="claude", max_tokens=256, messages=messages, tools=tools) as s:
            return s.get_final_message()

    first = ask()
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "fetch_url" and use.input == {"url": "https://example.com/page"}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": [{"type": "text", "text": PAGE}]}]}]
    final = ask()
    assert final.stop_reason == "end_turn"
    assert [b.text for b in final.content if b.type == "text"] == [f"fetch_url returned: {PAGE}"]


@pytest.mark.parametrize("stream", STREAM)
def test_gemini_round_trip(server: ModelServer, stream: bool) -> None:
    client = genai.Client(api_key="k", http_options=genai_types.HttpOptions(base_url=server.url))
    config = genai_types.GenerateContentConfig(tools=[genai_types.Tool(function_declarations=[
        genai_types.FunctionDeclaration(name="fetch_url", parameters_json_schema=FETCH)])])
    contents: list[Any] = [genai_types.Content(role="user", parts=[genai_types.Part(text=ASK)])]

    def ask() -> tuple[list[genai_types.FunctionCall], str]:
        if not stream:
            r = client.models.generate_content(model="gemini-2.5-flash", contents=contents, config=config)
            return list(r.function_calls or []), r.text or ""
        calls, text = [], ""
        for chunk in client.models.generate_content_stream(model="gemini-2.5-flash", contents=contents,
                                                           config=config):
            calls += chunk.function_calls or []
            text += chunk.text or ""
        return calls, text

    [call], _ = ask()
    assert call.name == "fetch_url" and call.args == {"url": "https://example.com/page"}
    contents += [genai_types.Content(role="model", parts=[genai_types.Part(function_call=call)]),
                 genai_types.Content(role="user", parts=[genai_types.Part(function_response=genai_types.FunctionResponse(
                     id=call.id, name=call.name, response={"output": PAGE}))])]
    calls, text = ask()
    assert calls == [] and text == f"fetch_url returned: {PAGE}"


@pytest.mark.parametrize("stream", STREAM)
def test_ollama_round_trip(server: ModelServer, stream: bool) -> None:
    client = ollama.Client(host=server.url)
    tools: Any = [{"type": "function", "function": {"name": "fetch_url", "description": "fetch",
                                                    "parameters": FETCH}}]
    messages: list[Any] = [{"role": "user", "content": ASK}]

    def ask() -> ollama.Message:
        if not stream:
            return client.chat(model="echo", messages=messages, tools=tools, stream=False).message
        content, calls = "", []
        for part in client.chat(model="echo", messages=messages, tools=tools, stream=True):
            content += part.message.content or ""
            calls += part.message.tool_calls or []
        return ollama.Message(role="assistant", content=content, tool_calls=calls or None)

    first = ask()
    [call] = first.tool_calls or []
    assert call.function.name == "fetch_url" and call.function.arguments == {"url": "https://example.com/page"}
    messages += [first, {"role": "tool", "tool_name": "fetch_url", "content": PAGE}]
    final = ask()
    assert not final.tool_calls and final.content == f"fetch_url returned: {PAGE}"
