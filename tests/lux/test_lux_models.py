"""Lux IR models: round trips, schema conformance, deviations and tolerant reading."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings

from gelbridge._errors import GelbridgeError
from gelbridge.lux import (
    ConversionStatus,
    Converted,
    Diagnostic,
    FinishReason,
    LuxDecodeError,
    LuxRequest,
    LuxResponse,
    Media,
    MediaSource,
    Message,
    Native,
    Options,
    ProviderData,
    ReasoningConfig,
    ReasoningEffort,
    Role,
    Text,
    Thinking,
    Tool,
    ToolChoice,
    ToolResult,
    ToolUse,
    decode_request,
    decode_response,
)
from testkit import lux_schema
from testkit import lux_strategies as S

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def wire(x):
    """Through real JSON text, as it travels."""
    return json.loads(json.dumps(x.to_json(), allow_nan=False))


# --- round trips ----------------------------------------------------------------------


@SETTINGS
@given(S.requests())
def test_request_round_trips_through_json(req):
    assert LuxRequest.from_json(wire(req)) == req


@SETTINGS
@given(S.responses())
def test_response_round_trips_through_json(resp):
    assert LuxResponse.from_json(wire(resp)) == resp


@SETTINGS
@given(S.requests())
def test_reading_a_produced_request_gives_no_diagnostics(req):
    assert decode_request(wire(req)).diagnostics == []


# --- schema conformance -----------------------------------------------------------------


@SETTINGS
@given(S.requests(strict=True))
def test_requests_in_the_schema_subset_validate_against_the_unpatched_schema(req):
    assert lux_schema.errors(lux_schema.strict("LucentRequest"), wire(req)) == []


@SETTINGS
@given(S.responses(strict=True))
def test_responses_in_the_schema_subset_validate_against_the_unpatched_schema(resp):
    assert lux_schema.errors(lux_schema.strict("LucentResponse"), wire(resp)) == []


@SETTINGS
@given(S.requests())
def test_every_request_validates_against_the_schema_with_documented_deviations(req):
    assert lux_schema.errors(lux_schema.patched("LucentRequest"), wire(req)) == []


@SETTINGS
@given(S.responses())
def test_every_response_validates_against_the_schema_with_documented_deviations(resp):
    assert lux_schema.errors(lux_schema.patched("LucentResponse"), wire(resp)) == []


def test_the_root_schema_ref_resolves_and_rejects_a_request_without_options():
    errs = lux_schema.errors(lux_schema.strict("LucentRequest"),
                             {"schema_version": "v1", "model": "m", "conversation": []})
    assert any("options" in e for e in errs)


# --- documented deviations from the schema -----------------------------------------------


def _req(*content, **kw):
    return LuxRequest("m", [Message("user", list(content))], Options(stream=False), **kw)


def test_media_source_is_an_object_with_type_and_data_which_the_schema_rejects():
    req = _req(Media("image", "image/png", MediaSource("url", "https://example.test/a.png")))
    block = req.to_json()["conversation"][0]["message"]["content"][0]
    assert block == {"type": "image", "image": {"media_type": "image/png",
                                                "source": {"type": "url", "data": "https://example.test/a.png"}}}
    assert lux_schema.errors(lux_schema.strict("LucentRequest"), req.to_json())
    assert not lux_schema.errors(lux_schema.patched("LucentRequest"), req.to_json())


def test_the_schemas_bare_string_media_source_is_refused_because_it_has_no_data():
    bad = _req(Text("x")).to_json()
    bad["conversation"][0]["message"]["content"] = [
        {"type": "image", "image": {"media_type": "image/png", "source": "inline"}}]
    with pytest.raises(LuxDecodeError, match=r"content\[0\]\.image\.source"):
        LuxRequest.from_json(bad)


def test_file_and_native_blocks_use_the_codes_wire_form():
    req = _req(Media("file", "application/pdf", MediaSource("inline", "JVBERi0=")), Native("x_tag", {"a": 1}))
    content = req.to_json()["conversation"][0]["message"]["content"]
    assert content[0]["type"] == "file" and "file" in content[0]
    assert content[1] == {"type": "native", "native_tag": "x_tag", "native_payload": {"a": 1}}
    assert lux_schema.errors(lux_schema.strict("LucentRequest"), req.to_json())


def test_an_unknown_content_type_is_kept_whole_as_a_native_block():
    j = _req(Text("x")).to_json()
    j["conversation"][0]["message"]["content"] = [{"type": "x_server_thing", "v": 1}]
    assert LuxRequest.from_json(j).conversation[0].content == [Native("x_server_thing", {"type": "x_server_thing", "v": 1})]


def test_tool_kind_is_emitted_only_when_not_function_and_stays_schema_valid():
    req = _req(Text("x"), tools=[Tool("f"), Tool("web", {}, kind="web_search")])
    tools = req.to_json()["tools"]
    assert "kind" not in tools[0] and tools[1]["kind"] == "web_search"
    assert not lux_schema.errors(lux_schema.strict("LucentRequest"), req.to_json())


def test_xhigh_effort_is_emitted_although_the_schema_enum_lacks_it():
    req = _req(Text("x"), reasoning=ReasoningConfig(True, effort=ReasoningEffort.XHIGH))
    assert req.to_json()["reasoning"] == {"enabled": True, "effort": "xhigh"}
    assert lux_schema.errors(lux_schema.strict("LucentRequest"), req.to_json())


@pytest.mark.parametrize("effort,expected", [
    ("none", ReasoningConfig(False)), ("max", ReasoningConfig(True, effort="xhigh")),
    ("low", ReasoningConfig(True, effort="low")), ("x_minimal", ReasoningConfig(True, effort="x_minimal")),
])
def test_record_efforts_map_to_reasoning_config_and_none_and_max_are_read_too(effort, expected):
    assert ReasoningConfig.from_effort(effort) == expected
    j = _req(Text("x")).to_json()
    j["reasoning"] = {"enabled": True, "effort": effort}
    assert LuxRequest.from_json(j).reasoning == expected


def test_seed_is_first_class_and_previous_response_id_is_read_into_extras():
    j = _req(Text("x")).to_json()
    j["options"].update(seed=7, previous_response_id="resp_1")
    opts = LuxRequest.from_json(j).options
    assert opts.seed == 7 and opts.extras == {"previous_response_id": "resp_1"}
    assert opts.to_json() == {"stream": False, "seed": 7, "extras": {"previous_response_id": "resp_1"}}


def test_store_extras_and_structured_output_name_are_extension_fields_the_schema_accepts():
    opts = Options(stream=True, store=True, extras={"parallel_tool_calls": False})
    req = _req(Text("x"))
    req.options = opts
    assert not lux_schema.errors(lux_schema.strict("LucentRequest"), req.to_json())


def test_finish_reason_reads_both_malformed_spellings_and_emits_the_schemas():
    for spelling in ("malformed_function_call", "malformed_tool_call"):
        j = {"schema_version": "v1", "id": "r", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": []}, "finish_reason": spelling}]}
        resp = LuxResponse.from_json(j)
        assert resp.choices[0].finish_reason is FinishReason.MALFORMED_TOOL_CALL
        assert resp.to_json()["choices"][0]["finish_reason"] == "malformed_tool_call"


def test_unknown_enum_strings_are_kept_as_native_strings():
    j = {"schema_version": "v1", "id": "r", "model": "m", "choices": [
        {"index": 0, "message": {"role": "x_role", "content": []}, "finish_reason": "pause_turn"}],
        "error": {"kind": "overloaded_error", "message": "busy"}}
    resp = LuxResponse.from_json(j)
    assert resp.choices[0].finish_reason == "pause_turn"
    assert resp.choices[0].message.role == "x_role"
    assert resp.error.kind == "overloaded_error"
    assert resp.to_json() == j


# --- provider_data extension ----------------------------------------------------------------


def test_provider_data_is_a_block_level_field_that_the_unpatched_schema_accepts():
    pd = ProviderData("anthropic", "claude-x", {"signature": "abc"})
    req = LuxRequest("m", [Message("assistant", [
        Thinking("t", signature="abc", provider_data=pd), Text("a", provider_data=pd),
        ToolUse("c", "f", "{}", pd)])], Options(stream=False))
    content = req.to_json()["conversation"][0]["message"]["content"]
    assert all(b["provider_data"] == {"provider": "anthropic", "model": "claude-x",
                                      "data": {"signature": "abc"}} for b in content)
    assert not lux_schema.errors(lux_schema.strict("LucentRequest"), req.to_json())
    assert not lux_schema.errors(lux_schema.patched("LucentRequest"), req.to_json())


def test_provider_data_inside_the_payload_object_is_read_too():
    j = {"type": "thinking", "thinking": {"text": "", "redacted": True,
                                          "provider_data": {"provider": "p", "model": "m", "data": {}}}}
    req = _req(Text("x")).to_json()
    req["conversation"][0]["message"]["content"] = [j]
    assert LuxRequest.from_json(req).conversation[0].content[0].provider_data == ProviderData("p", "m", {})


def test_malformed_provider_data_is_dropped_with_an_invalid_diagnostic():
    req = _req(Text("x")).to_json()
    req["conversation"][0]["message"]["content"][0]["provider_data"] = {"provider": "p"}
    out = decode_request(req)
    assert out.value.conversation[0].content[0].provider_data is None
    assert out.diagnostics == [Diagnostic("conversation[0].message.content[0].provider_data",
                                          ConversionStatus.INVALID, out.diagnostics[0].detail)]


# --- alternative spellings -------------------------------------------------------------------


def _conv(*items):
    return {"schema_version": "v1", "model": "m", "conversation": list(items), "options": {"stream": True}}


def _msg(role, *content, **extra):
    return {"type": "message", "message": {"role": role, "content": list(content), **extra}}


T = lambda s: {"type": "text", "text": s}  # noqa: E731


def test_standalone_tool_call_and_result_items_become_blocks_in_messages():
    j = _conv(_msg("user", T("q")),
              {"type": "reasoning", "reasoning": {"text": "think", "redacted": False}},
              _msg("assistant", T("calling")),
              {"type": "tool_call", "tool_call": {"id": "c1", "name": "f", "arguments": "{}"}},
              {"type": "tool_call", "tool_call": {"id": "c2", "name": "g", "arguments": {"a": 1}}},
              {"type": "tool_result", "tool_result": {"tool_use_id": "c2", "content": [T("r2")], "is_error": False}},
              {"type": "tool_result", "tool_result": {"tool_use_id": "c1", "content": "r1"}})
    conv = LuxRequest.from_json(j).conversation
    assert conv == [
        Message(Role.USER, [Text("q")]),
        Message(Role.ASSISTANT, [Thinking("think"), Text("calling"), ToolUse("c1", "f", "{}"),
                                 ToolUse("c2", "g", '{"a":1}')]),
        Message(Role.TOOL, [ToolResult("c1", [Text("r1")])]),  # call order, not arrival order
        Message(Role.TOOL, [ToolResult("c2", [Text("r2")])]),
    ]


def test_a_loose_tool_call_without_a_preceding_assistant_message_starts_one():
    conv = LuxRequest.from_json(_conv(
        _msg("user", T("q")), {"type": "tool_call", "tool_call": {"id": "c", "name": "f", "arguments": "{}"}}
    )).conversation
    assert conv[1] == Message(Role.ASSISTANT, [ToolUse("c", "f")])


def test_two_real_assistant_messages_are_not_merged():
    conv = LuxRequest.from_json(_conv(_msg("assistant", T("a")), _msg("assistant", T("b")))).conversation
    assert len(conv) == 2


def test_anthropic_style_user_message_with_tool_results_is_split_into_tool_messages():
    conv = LuxRequest.from_json(_conv(
        _msg("assistant", {"type": "tool_use", "tool_use": {"id": "a", "name": "f", "arguments": "{}"}},
             {"type": "tool_use", "tool_use": {"id": "b", "name": "f", "arguments": "{}"}}),
        _msg("user", {"type": "tool_result", "tool_result": {"tool_use_id": "b", "content": [], "is_error": True}},
             {"type": "tool_result", "tool_result": {"tool_use_id": "a", "content": [], "is_error": False}},
             T("and also")),
    )).conversation
    assert [m.role for m in conv] == ["assistant", "tool", "tool", "user"]
    assert [m.content[0].tool_use_id for m in conv[1:3]] == ["a", "b"]
    assert conv[3].content == [Text("and also")]


def test_message_reasoning_becomes_a_leading_thinking_block():
    j = _conv(_msg("assistant", T("answer"), reasoning={"text": "why", "redacted": False, "signature": "s"}))
    assert LuxRequest.from_json(j).conversation[0].content == [Thinking("why", signature="s"), Text("answer")]


def test_message_reasoning_beside_thinking_blocks_is_dropped_with_a_diagnostic():
    j = _conv(_msg("assistant", {"type": "thinking", "thinking": {"text": "a", "redacted": False}},
                   reasoning={"text": "b", "redacted": False}))
    out = decode_request(j)
    assert out.value.conversation[0].content == [Thinking("a")]
    assert [(d.field, d.status) for d in out.diagnostics] == [
        ("conversation[0].message.reasoning", ConversionStatus.DEGRADED)]


def test_message_reasoning_is_read_on_responses_too():
    j = {"schema_version": "v1", "id": "r", "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop",
         "message": {"role": "assistant", "content": [T("x")], "reasoning": {"text": "r", "redacted": False}}}]}
    assert LuxResponse.from_json(j).message.content == [Thinking("r"), Text("x")]


def test_leading_system_messages_are_hoisted_into_instructions():
    j = _conv(_msg("system", T("be nice")), _msg("user", T("hi")), _msg("system", T("later")))
    j["instructions"] = [T("base")]
    req = LuxRequest.from_json(j)
    assert req.instructions == [Text("base"), Text("be nice")]
    assert [m.role for m in req.conversation] == ["user", "system"]


def test_string_tool_parameters_and_arguments_objects_are_read():
    j = _conv(_msg("user", T("q")))
    j["tools"] = [{"name": "f", "parameters": '{"type":"object"}'}]
    assert LuxRequest.from_json(j).tools == [Tool("f", {"type": "object"})]


def test_tool_choice_forms_round_trip():
    for tc in (ToolChoice.auto(), ToolChoice.none(), ToolChoice.required(), ToolChoice.specific("f")):
        req = _req(Text("x"), tool_choice=tc)
        assert LuxRequest.from_json(req.to_json()).tool_choice == tc


# --- required fields and errors -------------------------------------------------------------


@pytest.mark.parametrize("mutate,path", [
    (lambda j: j.pop("model"), "request.model"),
    (lambda j: j.pop("conversation"), "request.conversation"),
    (lambda j: j.pop("options"), "request.options"),
    (lambda j: j["options"].pop("stream"), "options.stream"),
    (lambda j: j.update(schema_version="v2"), "request.schema_version"),
    (lambda j: j["conversation"][0]["message"].pop("role"), "conversation[0].message.role"),
    (lambda j: j["conversation"][0]["message"]["content"][0].pop("type"), "conversation[0].message.content[0].type"),
    (lambda j: j["conversation"][0].update(type="x_item"), "conversation[0].type"),
    (lambda j: j["conversation"][0]["message"]["content"].append(
        {"type": "tool_use", "tool_use": {"name": "f"}}), "conversation[0].message.content[1].tool_use.id"),
])
def test_missing_required_fields_raise_a_decode_error_naming_the_field(mutate, path):
    j = _conv(_msg("user", T("secret user text")))
    mutate(j)
    with pytest.raises(LuxDecodeError) as e:
        LuxRequest.from_json(j)
    assert e.value.path == path
    assert "secret user text" not in str(e.value)
    assert isinstance(e.value, GelbridgeError)


def test_a_response_needs_at_least_one_choice():
    with pytest.raises(LuxDecodeError, match="at least one choice"):
        LuxResponse.from_json({"schema_version": "v1", "id": "r", "model": "m", "choices": []})


def test_unknown_fields_do_not_fail_and_wrong_typed_optionals_are_dropped_with_diagnostics():
    j = _conv(_msg("user", T("x")))
    j["x_future"] = {"a": 1}
    j["options"]["temperature"] = "hot"
    j["metadata"] = {"a": "b", "n": 3}
    out = decode_request(j)
    assert out.value.options.temperature is None
    assert out.value.metadata == {"a": "b"}
    assert {d.field for d in out.diagnostics} == {"options.temperature", "metadata"}
    assert all(d.status is ConversionStatus.INVALID for d in out.diagnostics)


# --- diagnostics -------------------------------------------------------------------------------


def test_diagnostics_are_frozen_json_able_and_readable():
    d = Diagnostic("conversation[1].message.content[0]", ConversionStatus.DEGRADED, "signature removed")
    assert str(d) == "conversation[1].message.content[0]: degraded (signature removed)"
    assert str(Diagnostic("tools.kind", ConversionStatus.UNSUPPORTED)) == "tools.kind: unsupported"
    assert Diagnostic.from_json(json.loads(json.dumps(d.to_json()))) == d
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.field = "x"  # type: ignore[misc]
    env = Converted(_req(Text("x")), [d]).to_json()
    assert env["diagnostics"] == [d.to_json()] and env["value"]["model"] == "m"


def test_provider_error_types_and_http_statuses_map_to_lux_error_kinds():
    from gelbridge.lux import ErrorKind, normalize_error_kind
    assert normalize_error_kind(429) is ErrorKind.RATE_LIMIT
    assert normalize_error_kind("overloaded_error") is ErrorKind.SERVER_ERROR
    assert normalize_error_kind("authentication_error") is ErrorKind.AUTHENTICATION
    assert normalize_error_kind("x_weird") == "x_weird"


def test_a_malformed_response_usage_is_dropped_with_a_diagnostic():
    j = {"schema_version": "v1", "id": "r", "model": "m", "usage": [1, 2], "choices": [
        {"index": 0, "message": {"role": "assistant", "content": []}, "finish_reason": "stop"}]}
    out = decode_response(j)
    assert out.value.usage is None
    assert [(d.field, d.status) for d in out.diagnostics] == [("usage", ConversionStatus.INVALID)]
