"""Lux IR request → ADAPTER.md CompletionRequest: the mapping table and its diagnostics."""

from __future__ import annotations

from gelbridge._adapters.contract import lux_to_completion_request
from gelbridge._adapters.ids import ToolCallIdMap, ToolCallIdRule
from gelbridge.lux import (
    ConversionStatus,
    LuxRequest,
    Media,
    MediaSource,
    Message,
    Options,
    ProviderData,
    ReasoningConfig,
    StructuredOutput,
    Text,
    Thinking,
    Tool,
    ToolChoice,
    ToolResult,
    ToolUse,
)

P, M = "deep", "deep-r1"


def req(*items: Message, **kw: object) -> LuxRequest:
    kw.setdefault("options", Options(stream=False))
    return LuxRequest(model=M, conversation=list(items), **kw)  # type: ignore[arg-type]


def convert(r: LuxRequest, **kw: object):  # noqa: ANN201
    return lux_to_completion_request(r, provider=P, model=M, **kw)  # type: ignore[arg-type]


def fields(conv) -> dict[str, ConversionStatus]:  # noqa: ANN001
    return {d.field: d.status for d in conv.diagnostics}


def test_full_turn_maps_to_the_documented_shapes() -> None:
    png = Media("image", "image/png", MediaSource("inline", "iVBORw0KGgo="))
    r = req(
        Message("user", [Text("look"), png]),
        Message("assistant", [Thinking("hmm", provider_data=ProviderData(P, M, {})),
                              ToolUse("call_1", "weather", '{"city":"Oslo"}')]),
        Message("tool", [ToolResult("call_1", [Text("sunny")])]),
        Message("assistant", [Text("It is sunny.")]),
        Message("user", [Text("thanks")]),
        instructions=[Text("Be brief."), Text("Be kind.")],
        tools=[Tool("weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": []},
                    "Weather now")],
        tool_choice=ToolChoice.specific("weather"),
        options=Options(stream=True, temperature=0.2, max_output_tokens=300),
    )
    conv = convert(r)
    assert conv.value == {
        "model": M,
        "messages": [
            {"role": "system", "content": "Be brief.\n\nBe kind."},
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
            {"role": "assistant", "content": None, "reasoning_content": "hmm",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "thanks"},
        ],
        "temperature": 0.2,
        "max_tokens": 300,
        "stream": True,
        "tools": [{"type": "function", "function": {
            "name": "weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": []}}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "disable_thinking": False,
    }
    assert conv.diagnostics == []


def test_disable_thinking_is_always_present_and_true_when_reasoning_is_off() -> None:
    assert convert(req(Message("user", [Text("x")]))).value["disable_thinking"] is False
    off = convert(req(Message("user", [Text("x")]), reasoning=ReasoningConfig.from_effort("none")))
    assert off.value["disable_thinking"] is True
    on = convert(req(Message("user", [Text("x")]), reasoning=ReasoningConfig.from_effort("high")))
    assert on.value["disable_thinking"] is False
    assert fields(on) == {"reasoning": ConversionStatus.DEGRADED}


def test_reasoning_content_goes_back_only_to_its_producer() -> None:
    foreign = Thinking("other model's thoughts", provider_data=ProviderData("other", "x", {}))
    untagged = Thinking("no tag")
    conv = convert(req(Message("user", [Text("q")]), Message("assistant", [foreign, untagged, Text("a")])))
    assistant = conv.value["messages"][1]
    assert "reasoning_content" not in assistant and assistant["content"] == "a"
    assert all(d.status is ConversionStatus.DEGRADED for d in conv.diagnostics)
    assert len(conv.diagnostics) >= 2


def test_what_the_format_cannot_carry_is_reported() -> None:
    signed = Thinking("t", signature="sig", provider_data=ProviderData(P, M, {"signature": "sig"}))
    redacted = Thinking("", redacted=True, provider_data=ProviderData(P, M, {"redacted_data": "x"}))
    img = Media("image", "image/png", MediaSource("inline", "AA=="))
    video = Media("video", "video/mp4", MediaSource("url", "https://example.com/v.mp4"))
    pdf = Media("file", "application/pdf", MediaSource("inline", "JVBERi0="))
    gfile = Media("image", "image/png", MediaSource("file_uri", "gs://bucket/x.png"))
    r = req(
        Message("user", [Text("q"), video, pdf, gfile]),
        Message("assistant", [signed, redacted, img, Text("a")]),
        tools=[Tool("search", kind="web_search")],
        options=Options(stream=False, structured_output=StructuredOutput("json_object")),
    )
    f = fields(convert(r))
    assert f["conversation[0].message.content[1]"] is ConversionStatus.UNSUPPORTED  # video
    assert f["conversation[0].message.content[2]"] is ConversionStatus.UNSUPPORTED  # file
    assert f["conversation[0].message.content[3]"] is ConversionStatus.UNSUPPORTED  # file_uri image
    assert f["conversation[1].message.content[0].provider_data"] is ConversionStatus.UNSUPPORTED  # signature
    assert f["conversation[1].message.content[1]"] is ConversionStatus.UNSUPPORTED  # redacted
    assert f["conversation[1].message.content[2]"] is ConversionStatus.UNSUPPORTED  # image in assistant
    assert f["tools[0]"] is ConversionStatus.UNSUPPORTED
    assert f["options.structured_output"] is ConversionStatus.UNSUPPORTED
    # what can be carried still is
    conv = convert(r)
    assert conv.value["messages"][1]["content"] == "a" and conv.value["messages"][1]["reasoning_content"] == "t"
    assert "tools" not in conv.value


def test_no_diagnostic_ever_contains_content() -> None:
    secret = "SECRET-PLAINTEXT-42"
    r = req(Message("user", [Text(secret), Media("video", "video/mp4", MediaSource("inline", secret))]),
            Message("assistant", [Thinking(secret, signature=secret), Media("image", "image/png",
                                                                             MediaSource("inline", secret))]))
    for d in convert(r).diagnostics:
        assert secret not in str(d)


def test_tool_result_errors_and_extras() -> None:
    r = req(Message("assistant", [ToolUse("c1", "f")]), Message("tool", [ToolResult("c1", [Text("boom")], True)]),
            options=Options(stream=False, seed=7, extras={"top_logprobs": 2, "model": "evil"}))
    conv = convert(r)
    assert conv.value["messages"][0] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert conv.value["seed"] == 7 and conv.value["top_logprobs"] == 2 and conv.value["model"] == M
    f = fields(conv)
    assert f["conversation[1].message.content[0].tool_result.is_error"] is ConversionStatus.DEGRADED
    assert f["options.extras.model"] is ConversionStatus.INVALID


def test_call_ids_are_mapped_alike_for_call_and_result() -> None:
    r = req(Message("assistant", [ToolUse("call_3hx.r0_0", "f")]),
            Message("tool", [ToolResult("call_3hx.r0_0", [Text("ok")])]))
    conv = convert(r, id_map=ToolCallIdMap(ToolCallIdRule(pattern="^[a-zA-Z0-9_-]+$")))
    new = conv.value["messages"][0]["tool_calls"][0]["id"]
    assert new != "call_3hx.r0_0" and new.startswith("call_3hx_r0_0_")
    assert conv.value["messages"][1]["tool_call_id"] == new
