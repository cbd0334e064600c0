"""Reasoning state across turns: what the second request carries back (server.requests[-1].body)."""

from __future__ import annotations

import json

import pytest

from gelbridge._dev.model_server import ToolCall, Turn
from gelbridge.lux import LuxRequest, Message, Options, Text, Tool, ToolResult, ToolUse
from testkit import builtin_harness as harness

SIG = "c2lnLTE="
MODELS = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-flash",
          "ollama": "llama3.2", "deepseek": "deepseek-reasoner", "openai-responses": "gpt-5",
          "openrouter": "anthropic/claude-sonnet-4.6"}
OTHER_MODEL = {"openai": "gpt-4.1", "anthropic": "claude-opus-4-1", "gemini": "gemini-2.5-pro",
               "ollama": "qwen3", "deepseek": "deepseek-chat", "openai-responses": "gpt-5-mini",
               "openrouter": "openai/gpt-5"}
TOOLS = [Tool("lookup", {"type": "object", "properties": {"q": {"type": "string"}}})]


async def two_turns(name, srv, stream, second_model=None, first=None):
    """Turn 1: reasoning + a tool call; turn 2 sends the result back."""
    srv.enqueue(first or Turn(reasoning="I should look it up", reasoning_signature=SIG,
                              tool_calls=[ToolCall("lookup", {"q": "x"})]))
    user = Message("user", [Text("what is x?")])
    req = LuxRequest(model=MODELS[name], conversation=[user], options=Options(stream=stream), tools=TOOLS)
    r1 = await harness.complete(harness_srv := srv, name, req, stream=stream)
    assistant = r1.response.message
    calls = [b for b in assistant.content if isinstance(b, ToolUse)]
    conv = [user, assistant] + [Message("tool", [ToolResult(c.id, [Text("42")])]) for c in calls]
    srv.enqueue(Turn(text="x is 42"))
    req2 = LuxRequest(model=second_model or MODELS[name], conversation=conv, options=Options(stream=stream),
                      tools=TOOLS)
    r2 = await harness.complete(harness_srv, name, req2, stream=stream)
    assert r2.response.message.content[0].text == "x is 42"
    return calls, srv.requests[-1].body


@pytest.fixture(params=[False, True], ids=["plain", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return request.param


async def test_anthropic_sends_signed_thinking_and_one_user_turn_of_results(server, stream):
    calls, body = await two_turns("anthropic", server, stream)
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"][0] == {"type": "thinking", "thinking": "I should look it up", "signature": SIG}
    assert msgs[1]["content"][1] == {"type": "tool_use", "id": calls[0].id, "name": "lookup", "input": {"q": "x"}}
    assert msgs[2]["content"] == [{"type": "tool_result", "tool_use_id": calls[0].id,
                                   "content": [{"type": "text", "text": "42"}],
                                   "cache_control": {"type": "ephemeral"}}]  # this request's end
    assert msgs[0]["content"][-1]["cache_control"] == {"type": "ephemeral"}  # the previous request's end


async def test_anthropic_drops_thinking_for_another_model(server, stream):
    _, body = await two_turns("anthropic", server, stream, second_model=OTHER_MODEL["anthropic"])
    assert [b["type"] for b in body["messages"][1]["content"]] == ["tool_use"]


async def test_anthropic_redacted_thinking_round_trip(server, stream):
    first = Turn(reasoning="visible", redacted_reasoning="UkVEQUNURUQ=", tool_calls=[ToolCall("lookup", {"q": "x"})])
    _, body = await two_turns("anthropic", server, stream, first=first)
    blocks = body["messages"][1]["content"]
    assert blocks[1] == {"type": "redacted_thinking", "data": "UkVEQUNURUQ="}
    assert blocks[0]["type"] == "thinking" and blocks[0]["signature"]


async def test_gemini_keeps_thought_signature_on_the_function_call_part(server, stream):
    calls, body = await two_turns("gemini", server, stream)
    model_turn, results = body["contents"][1], body["contents"][2]
    assert model_turn["role"] == "model"
    assert model_turn["parts"] == [{"functionCall": {"name": "lookup", "args": {"q": "x"}, "id": calls[0].id},
                                    "thoughtSignature": SIG}]
    assert results == {"role": "user", "parts": [{"functionResponse": {
        "name": "lookup", "id": calls[0].id, "response": {"output": "42"}}}]}


async def test_gemini_signature_on_text_part_round_trip(server, stream):
    first = Turn(text="just text", reasoning_signature=SIG)
    server.enqueue(first)
    user = Message("user", [Text("hi")])
    r1 = await harness.complete(server, "gemini", LuxRequest(model=MODELS["gemini"], conversation=[user],
                                                             options=Options(stream=stream)), stream=stream)
    server.enqueue(Turn(text="ok"))
    conv = [user, r1.response.message, Message("user", [Text("more")])]
    await harness.complete(server, "gemini", LuxRequest(model=MODELS["gemini"], conversation=conv,
                                                        options=Options(stream=stream)), stream=stream)
    parts = server.requests[-1].body["contents"][1]["parts"]
    assert "".join(p["text"] for p in parts) == "just text"
    assert parts[-1]["thoughtSignature"] == SIG and all("thoughtSignature" not in p for p in parts[:-1])


async def test_gemini_signature_not_sent_to_another_model(server, stream):
    _, body = await two_turns("gemini", server, stream, second_model=OTHER_MODEL["gemini"])
    assert "thoughtSignature" not in body["contents"][1]["parts"][0]


async def test_gemini3_marks_calls_without_signature(server):
    _, body = await two_turns("gemini", server, False, second_model="gemini-3-pro-preview")
    assert body["contents"][1]["parts"][0]["thoughtSignature"] == "skip_thought_signature_validator"


async def test_deepseek_sends_reasoning_content_back_to_the_same_model(server, stream):
    calls, body = await two_turns("deepseek", server, stream)
    a = body["messages"][1]
    assert a["role"] == "assistant" and a["reasoning_content"] == "I should look it up"
    assert a["tool_calls"][0]["id"] == calls[0].id
    assert body["messages"][2] == {"role": "tool", "tool_call_id": calls[0].id, "content": "42"}


async def test_deepseek_reasoning_content_not_sent_to_another_model(server, stream):
    _, body = await two_turns("deepseek", server, stream, second_model=OTHER_MODEL["deepseek"])
    assert "reasoning_content" not in body["messages"][1]


async def test_openai_never_sends_reasoning_back(server, stream):
    calls, body = await two_turns("openai", server, stream)
    a = body["messages"][1]
    assert "reasoning_content" not in a and a["tool_calls"] == [
        {"id": calls[0].id, "type": "function", "function": {"name": "lookup", "arguments": '{"q":"x"}'}}]


async def test_ollama_sends_thinking_and_object_arguments(open_server, stream):
    _, body = await two_turns("ollama", open_server, stream)
    a, t = body["messages"][1], body["messages"][2]
    assert a["thinking"] == "I should look it up"
    assert a["tool_calls"] == [{"function": {"name": "lookup", "arguments": {"q": "x"}}}]
    assert t == {"role": "tool", "content": "42", "tool_name": "lookup"}


async def test_openai_responses_sends_encrypted_reasoning_before_its_call(server, stream):
    calls, body = await two_turns("openai-responses", server, stream)
    assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    assert body["input"] == [
        {"role": "user", "content": "what is x?"},
        {"type": "reasoning", "encrypted_content": SIG,
         "summary": [{"type": "summary_text", "text": "I should look it up"}]},
        {"type": "function_call", "call_id": calls[0].id, "name": "lookup", "arguments": '{"q":"x"}'},
        {"type": "function_call_output", "call_id": calls[0].id, "output": "42"},
    ]
    assert body["tools"] == [{"type": "function", "name": "lookup", "strict": False,
                              "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]


async def test_openai_responses_drops_reasoning_for_another_model(server, stream):
    _, body = await two_turns("openai-responses", server, stream, second_model=OTHER_MODEL["openai-responses"])
    assert [i.get("type", "message") for i in body["input"]] == ["message", "function_call", "function_call_output"]
    assert SIG not in str(body)


async def test_openai_responses_request_options(server):
    from gelbridge.lux import Media, MediaSource, ReasoningConfig, ToolChoice

    image = Media("image", "image/png", MediaSource("inline", "iVBORw0KGgo="))
    req = LuxRequest(model="gpt-5", instructions=[Text("Be brief.")],
                     conversation=[Message("user", [Text("look"), image])],
                     options=Options(stream=False, max_output_tokens=500, temperature=0.2, stop=["END"]),
                     tools=TOOLS, tool_choice=ToolChoice.specific("lookup"), reasoning=ReasoningConfig.from_effort("high"))
    await harness.complete(server, "openai-responses", req, stream=False)
    body = server.requests[-1].body
    assert body["instructions"] == "Be brief." and body["max_output_tokens"] == 500 and body["temperature"] == 0.2
    assert body["input"] == [{"role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}]}]
    assert body["tool_choice"] == {"type": "function", "name": "lookup"}
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert "stop" not in body and "stream" not in body


@pytest.fixture
def details_server():
    from gelbridge._dev.model_server import ModelServer

    with ModelServer(api_key=harness.API_KEY, reasoning_details=True, openai_reasoning_field="reasoning") as srv:
        yield srv


async def test_openrouter_passes_reasoning_details_back_unchanged(details_server, stream):
    first = Turn(reasoning="I should look it up", reasoning_signature=SIG, redacted_reasoning="RU5DUllQVEVE",
                 tool_calls=[ToolCall("lookup", {"q": "x"})], chunk_size=4)
    calls, body = await two_turns("openrouter", details_server, stream, first=first)
    assistant = body["messages"][1]
    assert assistant["reasoning_details"] == [
        {"type": "reasoning.text", "text": "I should look it up", "signature": SIG,
         "format": "anthropic-claude-v1", "index": 0},
        {"type": "reasoning.encrypted", "data": "RU5DUllQVEVE", "format": "anthropic-claude-v1", "index": 1},
    ]
    assert assistant["tool_calls"][0]["id"] == calls[0].id
    assert "reasoning_content" not in assistant


@pytest.mark.parametrize("calls", [[ToolCall("lookup", {"q": "x"}, id="call_1")], []], ids=["call", "text"])
async def test_openrouter_stream_and_json_give_the_same_blocks(details_server, calls):
    """The streamed details land on the step's one thinking block, as in the JSON answer:
    no second thinking block after the text or the call, none for a turn without reasoning."""
    turn = Turn(reasoning="I should look it up", reasoning_signature=SIG, redacted_reasoning="RU5DUllQVEVE",
                text="Looking.", tool_calls=calls, chunk_size=4)
    got = {}
    for stream in (False, True):
        for t in (turn, Turn(text="plain", chunk_size=2)):
            details_server.enqueue(t)
            req = LuxRequest(model=MODELS["openrouter"], conversation=[Message("user", [Text("x?")])],
                             options=Options(stream=stream), tools=TOOLS)
            r = await harness.complete(details_server, "openrouter", req, stream=stream)
            got[stream, t.text] = [b.to_json() for b in r.response.message.content]
    assert got[True, "Looking."] == got[False, "Looking."]
    assert [b["type"] for b in got[True, "Looking."]] == ["thinking", "text"] + ["tool_use"] * len(calls)
    assert got[True, "Looking."][0]["provider_data"]["data"]["reasoning_details"][0]["signature"] == SIG
    assert got[True, "plain"] == got[False, "plain"] == [{"type": "text", "text": "plain"}]


async def test_openrouter_keeps_reasoning_details_from_another_model(details_server, stream):
    first = Turn(reasoning="think", reasoning_signature=SIG, tool_calls=[ToolCall("lookup", {"q": "x"})])
    _, body = await two_turns("openrouter", details_server, stream, second_model=OTHER_MODEL["openrouter"],
                              first=first)
    assert "reasoning_details" not in body["messages"][1] and SIG not in str(body)


async def test_openrouter_sends_the_unified_reasoning_parameter(server):
    from gelbridge.lux import ReasoningConfig

    req = LuxRequest(model="openai/gpt-5", conversation=[Message("user", [Text("hi")])],
                     options=Options(stream=False), reasoning=ReasoningConfig.from_effort("high"))
    await harness.complete(server, "openrouter", req, stream=False)
    body = server.requests[-1].body
    assert body["reasoning"] == {"effort": "high"} and "reasoning_effort" not in body


def test_openai_responses_stream_endings():
    """incomplete → length with usage; failed → a Lux error with the provider's code."""
    base = [json.dumps({"type": "response.created", "response": {"id": "resp_1", "model": "gpt-5"}}),
            json.dumps({"type": "response.output_item.added", "output_index": 0,
                        "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}}),
            json.dumps({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "Hel"})]
    incomplete = json.dumps({"type": "response.incomplete", "response": {
        "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
        "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13,
                  "input_tokens_details": {"cached_tokens": 4}, "output_tokens_details": {"reasoning_tokens": 1}}}})
    _, res = harness.chunks("openai-responses", base + [incomplete], model="gpt-5")
    assert res.choices[0].finish_reason == "length" and res.message.content[0].text == "Hel"
    assert (res.usage.prompt_tokens, res.usage.cached_tokens, res.usage.reasoning_tokens) == (10, 4, 1)
    failed = json.dumps({"type": "response.failed", "response": {
        "status": "failed", "error": {"code": "server_error", "message": "the model broke"}}})
    events, res = harness.chunks("openai-responses", base + [failed], model="gpt-5")
    assert events[-1]["event"] == "error" and res.error is not None
    assert res.error.kind == "server_error" and res.error.provider_code == "server_error"


async def test_openai_responses_asks_for_encrypted_reasoning_only_where_there_is_reasoning(server):
    from gelbridge.lux import ReasoningConfig

    def req(model, reasoning=None):
        return LuxRequest(model=model, conversation=[Message("user", [Text("hi")])], options=Options(stream=False),
                          reasoning=reasoning)

    for model, reasoning, asked in [("gpt-5", None, True), ("o4-mini", None, True), ("gpt-4.1", None, False),
                                    ("gpt-5-chat-latest", None, False),
                                    ("gpt-4.1", ReasoningConfig.from_effort("low"), True)]:
        await harness.complete(server, "openai-responses", req(model, reasoning), stream=False)
        body = server.requests[-1].body
        assert ("include" in body) is asked, model
        assert body["store"] is False


async def test_gemini_2_searches_only_without_function_tools(server):
    from gelbridge.lux import Tool as LuxTool

    search = LuxTool("web_search", {"max_uses": 2}, kind="web_search")
    for model, tools, shapes in [
        ("gemini-2.5-flash", [search], [["googleSearch"]]),
        ("gemini-2.5-flash", [search, *TOOLS], [["functionDeclarations"]]),
        ("gemini-3-pro-preview", [search, *TOOLS], [["functionDeclarations"], ["googleSearch"]]),
    ]:
        req = LuxRequest(model=model, conversation=[Message("user", [Text("q")])], options=Options(stream=False),
                         tools=tools)
        await harness.complete(server, "gemini", req, stream=False)
        assert [list(t) for t in server.requests[-1].body["tools"]] == shapes, model


@pytest.mark.parametrize("raw", [
    '{"id":"r","model":"m","status":"completed","output":[3,{"type":"message","content":"text"},'
    '{"type":"reasoning","summary":[1,null]}],"usage":{"input_tokens":"many","output_tokens_details":[]}}',
    '{"id":"r","model":"m","status":"failed","error":true}',
])
def test_openai_responses_survives_hostile_answers(raw):
    out = harness.response("openai-responses", raw)
    assert out["choices"][0]["finish_reason"] in ("stop", "error")


def test_gemini_survives_hostile_grounding():
    raw = json.dumps({"candidates": [{"content": {"parts": [{"text": "t"}], "role": "model"}, "finishReason": "STOP",
                                      "groundingMetadata": {"groundingChunks": [{"web": {"uri": "https://a.example"}}],
                                                            "groundingSupports": [5, {"groundingChunkIndices": [None, "x", 0]}]}}]})
    out = harness.response("gemini", raw)
    assert out["choices"][0]["message"]["content"][0]["annotations"] == [{"kind": "url", "ref": "https://a.example"}]
