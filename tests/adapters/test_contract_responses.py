"""CompletionResponse / StreamChunk → Lux IR; lux-ir-v1 request/response; tool-call ids."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gelbridge._adapters import contract
from gelbridge._adapters.contract import (
    CompletionChunkDecoder,
    LuxEventDecoder,
    completion_response_to_lux,
    lux_request_for_adapter,
    lux_response_from_adapter,
)
from gelbridge._adapters.ids import ToolCallIdMap, ToolCallIdRule
from gelbridge._errors import AdapterError
from gelbridge.lux import (
    ConversionStatus,
    LuxRequest,
    Message,
    Options,
    ProviderData,
    StreamAccumulator,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
)

P, M = "prov", "model-a"


def decode(chunks: list[dict]) -> tuple[StreamAccumulator, CompletionChunkDecoder]:
    dec = CompletionChunkDecoder(provider=P, model=M)
    acc = StreamAccumulator(provider=P, model=M)
    for c in chunks:
        acc.feed_all(dec.decode(c))
    acc.feed_all(dec.finish())
    return acc, dec


def test_response_with_reasoning_tools_and_usage() -> None:
    conv = completion_response_to_lux({
        "content": "Let me check.", "reasoning_content": "need weather", "finish_reason": "tool_use",
        "token_usage": {"prompt": 10, "completion": 20, "total": 30, "reasoning_tokens": 5, "cache_read": 4},
        "tool_calls": [{"id": "c1", "type": "function", "name": "weather", "arguments": {"city": "Oslo"}},
                       {"id": "c2", "type": "function", "name": "time", "arguments": '{"tz":"UTC"}'}],
    }, provider=P, model=M)
    r = conv.value
    assert conv.diagnostics == []
    th, tx, c1, c2 = r.message.content
    assert th == Thinking("need weather", provider_data=ProviderData(P, M, {}))
    assert tx == Text("Let me check.")
    assert (c1.id, c1.name, c1.arguments) == ("c1", "weather", '{"city":"Oslo"}')
    assert c2.arguments == '{"tz":"UTC"}'
    assert r.choices[0].finish_reason == "tool_calls"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens,
            r.usage.reasoning_tokens, r.usage.cached_tokens) == (10, 20, 30, 5, 4)
    assert r.model == M


@pytest.mark.parametrize("given,expected", [("end_turn", "stop"), ("STOP", "stop"), ("max_tokens", "length"),
                                            ("length", "length"), ("function_call", "tool_calls"),
                                            ("content_filter", "content_filter"), (None, "stop")])
def test_finish_reasons_from_provider_vocabularies(given: str | None, expected: str) -> None:
    conv = completion_response_to_lux({"content": "x", "finish_reason": given}, provider=P, model=M)
    assert conv.value.choices[0].finish_reason == expected and conv.diagnostics == []


def test_unknown_finish_reason_is_kept_and_reported() -> None:
    conv = completion_response_to_lux({"content": "x", "finish_reason": "bored"}, provider=P, model=M)
    assert conv.value.choices[0].finish_reason == "bored"
    assert conv.diagnostics[0].status is ConversionStatus.DEGRADED


def test_nested_or_nameless_calls_are_never_silently_lost() -> None:
    conv = completion_response_to_lux({"content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "type": "function", "arguments": {}},
        {"id": "c", "name": "g", "arguments": {"raw": "{not json"}},
    ]}, provider=P, model=M)
    calls = conv.value.message.content
    assert [(c.id, c.name, c.arguments) for c in calls] == [("a", "f", "{}"), ("c", "g", "{not json")]
    statuses = {d.field: d.status for d in conv.diagnostics}
    assert statuses["tool_calls[0]"] is ConversionStatus.INVALID
    assert statuses["tool_calls[1]"] is ConversionStatus.INVALID
    assert statuses["tool_calls[2].arguments"] is ConversionStatus.INVALID
    assert conv.value.choices[0].finish_reason == "tool_calls"


def test_response_must_be_an_object() -> None:
    with pytest.raises(AdapterError):
        completion_response_to_lux(["no"], provider=P, model=M)


def test_flat_pieces_bucketed_by_stream_index() -> None:
    acc, dec = decode([
        {"content": "", "done": False, "reasoning_content": "plan"},
        {"content": "Calling.", "done": False},
        {"content": "", "done": False, "tool_calls": [
            {"id": "t0", "type": "function", "name": "a", "raw_arguments": "", "stream_index": 0},
            {"id": "t1", "type": "function", "name": "b", "raw_arguments": '{"x"', "stream_index": 1}]},
        {"content": "", "done": False, "tool_calls": [{"raw_arguments": '{"q":', "stream_index": 0}]},
        {"content": "", "done": False, "tool_calls": [{"raw_arguments": ":2}", "stream_index": 1}]},
        {"content": "", "done": False, "tool_calls": [{"raw_arguments": "1}", "stream_index": 0}]},
        {"content": "", "done": False, "usage": {"prompt": 7, "completion": 0, "total": 7}},
        {"content": "", "done": True, "usage": {"prompt": 7, "completion": 9, "total": 16}},
    ])
    r = acc.result()
    kinds = [type(b).__name__ for b in r.message.content]
    assert kinds == ["Thinking", "Text", "ToolUse", "ToolUse"]
    a, b = r.message.content[2:]
    assert (a.id, a.name, a.arguments) == ("t0", "a", '{"q":1}')
    assert (b.id, b.name, b.arguments) == ("t1", "b", '{"x":2}')
    assert r.choices[0].finish_reason == "tool_calls"  # inferred: no finish_reason came
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (7, 9, 16)
    assert r.message.content[0].provider_data == ProviderData(P, M, {})
    assert dec.diagnostics == [] and acc.diagnostics == []


def test_anthropic_style_indices_and_late_ids() -> None:
    # stream_index is a content-block index (starts at 1); id/name overwrite when non-empty
    acc, _ = decode([
        {"content": "hi", "done": False},
        {"content": "", "done": False, "tool_calls": [{"id": "", "name": "f", "raw_arguments": "", "stream_index": 1}]},
        {"content": "", "done": False, "tool_calls": [{"id": "late", "raw_arguments": "{}", "stream_index": 1}]},
        {"content": "", "done": True, "finish_reason": "tool_use"},
    ])
    call = acc.result().message.content[1]
    assert (call.id, call.name, call.arguments) == ("late", "f", "{}")


def test_index_key_and_nested_function_are_read_with_a_diagnostic() -> None:
    acc, dec = decode([
        {"content": "", "done": False, "tool_calls": [
            {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a"'}}]},
        {"content": "", "done": False, "tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]},
        {"content": "", "done": True},
    ])
    call = acc.result().message.content[0]
    assert (call.id, call.name, call.arguments) == ("c", "f", '{"a":1}')
    fields = {d.field for d in dec.diagnostics}
    assert {"chunk.tool_calls[].index", "chunk.tool_calls[].function"} <= fields


def test_singular_tool_call_as_in_adapter_md() -> None:
    acc, _ = decode([
        {"content": "", "done": True, "tool_call": {"id": "x1", "type": "function", "name": "w",
                                                     "arguments": {"city": "Bei"}}},
        {"content": "", "done": True, "tool_call": {"id": "x2", "type": "function", "name": "v",
                                                     "arguments": '{"a":'}},
        {"content": "", "done": True, "tool_call": {"arguments": "1}"}},
    ])
    w, v = acc.result().message.content
    assert (w.id, w.name, w.arguments) == ("x1", "w", '{"city":"Bei"}')
    assert (v.id, v.name, v.arguments) == ("x2", "v", '{"a":1}')


def test_zero_argument_call_and_empty_leading_piece() -> None:
    acc, _ = decode([
        {"content": "", "done": False, "tool_calls": [{"stream_index": 0, "raw_arguments": ""}]},  # skipped (Go rule)
        {"content": "", "done": False, "tool_calls": [{"id": "z", "name": "now", "stream_index": 0}]},
        {"content": "", "done": True, "finish_reason": "tool_calls"},
    ])
    (call,) = acc.result().message.content
    assert (call.id, call.name, call.arguments) == ("z", "now", "{}")


def test_error_chunk_ends_as_error() -> None:
    acc, _ = decode([{"content": "par", "done": False}, {"error": {"message": "overloaded", "type": "overloaded_error"}}])
    r = acc.result()
    assert r.choices[0].finish_reason == "error" and r.error.kind == "server_error"
    assert r.message.content == [Text("par")]


# ---------------------------------------------------------------- ids


def test_anthropic_rule_keeps_valid_ids_and_cleans_others_deterministically() -> None:
    rule = ToolCallIdRule(pattern="^[a-zA-Z0-9_-]+$", max_length=64)
    m = ToolCallIdMap(rule)
    assert m.map("toolu_01A") == "toolu_01A"
    bad = m.map("call.3hx:r0/0")
    assert bad != "call.3hx:r0/0" and rule.accepts(bad)
    assert ToolCallIdMap(rule).map("call.3hx:r0/0") == bad  # same on every turn
    long = ToolCallIdMap(rule).map("x" * 300)
    assert len(long) <= 64 and rule.accepts(long)


def test_mistral_rule_gives_nine_alphanumerics_and_stays_injective() -> None:
    rule = ToolCallIdRule(exact_length=9)
    m = ToolCallIdMap(rule)
    ids = [m.map(f"call_{i}") for i in range(500)]
    assert all(len(i) == 9 and i.isalnum() for i in ids)
    assert len(set(ids)) == 500
    assert m.map("abcDEF123") == "abcDEF123"


def test_lux_native_request_is_stripped_and_ids_paired() -> None:
    req = LuxRequest(model=M, options=Options(stream=True), conversation=[
        Message("user", [Text("q")]),
        Message("assistant", [Thinking("t", signature="s", provider_data=ProviderData("other", "o", {"signature": "s"})),
                              Thinking("mine", signature="s2", provider_data=ProviderData(P, M, {"signature": "s2"})),
                              ToolUse("call.1", "f")]),
        Message("tool", [ToolResult("call.1", [Text("r")])]),
    ])
    conv = lux_request_for_adapter(req, provider=P, model=M,
                                   id_map=ToolCallIdMap(ToolCallIdRule(pattern="^[a-zA-Z0-9_-]+$")))
    content = conv.value["conversation"][1]["message"]["content"]
    assert "signature" not in content[0]["thinking"] and "provider_data" not in content[0]
    assert content[1]["provider_data"] == {"provider": P, "model": M, "data": {"signature": "s2"}}
    new_id = content[2]["tool_use"]["id"]
    assert new_id != "call.1"
    assert conv.value["conversation"][2]["message"]["content"][0]["tool_result"]["tool_use_id"] == new_id
    assert [d.status for d in conv.diagnostics] == [ConversionStatus.DEGRADED]


def test_lux_native_response_gets_provider_tags_filled() -> None:
    conv = lux_response_from_adapter({"schema_version": "v1", "id": "r1", "model": "",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": [
            {"type": "thinking", "thinking": {"text": "", "redacted": True},
             "provider_data": {"provider": "", "model": "", "data": {"redacted_data": "xx"}}},
            {"type": "thinking", "thinking": {"text": "t", "redacted": False, "signature": "sig"}},
            {"type": "text", "text": "hi"}]}}]}, provider=P, model=M)
    a, b, _ = conv.value.message.content
    assert a.provider_data == ProviderData(P, M, {"redacted_data": "xx"})
    assert b.provider_data == ProviderData(P, M, {})
    assert conv.value.model == M


def test_lux_events_fill_provider_data_and_skip_bad_events_with_a_diagnostic() -> None:
    dec = LuxEventDecoder(provider=P, model=M)
    evs = dec.decode([{"event": "block_start", "index": 0, "block_type": "thinking"},
                      {"event": "block_delta", "index": 0, "delta": {"type": "provider_data",
                                                                     "provider_data": {"data": {"signature": "s"}}}},
                      {"event": "nonsense"}])
    assert len(evs) == 2 and evs[1].delta.provider_data == ProviderData(P, M, {"signature": "s"})
    assert dec.diagnostics and dec.diagnostics[0].status is ConversionStatus.INVALID


_pd = st.none() | st.fixed_dictionaries({}, optional={
    "provider": st.sampled_from(["", "other", None]), "model": st.sampled_from(["", "m2", None]),
    "data": st.none() | st.just({"k": "v"})})


def _with_pd(block: dict, inner: str | None, pd: dict | None) -> dict:
    if pd is not None:
        (block[inner] if inner else block)["provider_data"] = pd
    return block


_blocks = st.one_of(
    st.builds(lambda t, pd: _with_pd({"type": "text", "text": t}, None, pd), st.text(max_size=3), _pd),
    st.builds(lambda t, r, s, pd, inner: _with_pd(
        {"type": "thinking", "thinking": {"text": t, "redacted": r, **({"signature": s} if s else {})}},
        "thinking" if inner else None, pd), st.text(max_size=3), st.booleans(), st.sampled_from(["", "sig"]),
        _pd, st.booleans()),
    st.builds(lambda a, pd: _with_pd({"type": "tool_use", "tool_use": {"id": "c", "name": "f", "arguments": a}},
                                     None, pd), st.sampled_from([None, "{}", {"x": [1, "é"]}]), _pd),
    st.builds(lambda r: {"type": "refusal", "refusal": r}, st.text(max_size=3)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_blocks, max_size=4), st.sampled_from(["", "served-model"]),
       st.none() | st.just({"prompt_tokens": 2, "completion_tokens": 3}))
def test_lux_response_one_pass_equals_fill_then_full_reader(blocks, model, usage) -> None:
    obj = {"schema_version": "v1", "id": "r", "model": model,
           "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": blocks}}]}
    if usage:
        obj["usage"] = usage
    fast = lux_response_from_adapter(copy.deepcopy(obj), provider=P, model=M)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contract, "read_plain_response", lambda *a: None)
        try:
            full = lux_response_from_adapter(copy.deepcopy(obj), provider=P, model=M)
        except AdapterError:
            full = None
    if full is None:
        pytest.fail("the full reader refused what the one-pass reader accepted")
    assert fast == full


_tag = st.none() | st.builds(ProviderData, st.sampled_from([P, "q"]), st.sampled_from([M, "n"]), st.just({"k": 1}))
_text = st.builds(Text, st.text(max_size=3), st.none(), _tag)
_ids = st.sampled_from(["call.1", "c2", "bad id!", "x" * 50])
_req_blocks = st.one_of(
    _text,
    st.builds(Thinking, st.text(max_size=3), st.booleans(), st.none() | st.just("sig"),
              st.none() | st.lists(_text, max_size=1), _tag),
    st.builds(ToolUse, _ids, st.just("f"), st.just("{}"), _tag),
    st.builds(ToolResult, _ids, st.lists(_text, max_size=2)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.builds(Message, st.sampled_from(["user", "assistant", "tool"]), st.lists(_req_blocks, max_size=4)),
                max_size=4),
       st.none() | st.lists(_text, max_size=2),
       st.sampled_from([None, ToolCallIdRule(pattern="^[a-zA-Z0-9_-]+$", max_length=12),
                        ToolCallIdRule(exact_length=9)]))
def test_lux_request_for_adapter_equals_strip_then_map_then_to_json(conv, instructions, rule) -> None:
    from dataclasses import replace

    from gelbridge._adapters.ids import map_tool_call_ids
    from gelbridge.lux import strip_foreign_provider_data

    req = LuxRequest(model="requested", conversation=conv, options=Options(stream=False), instructions=instructions)
    got = lux_request_for_adapter(req, provider=P, model=M, id_map=ToolCallIdMap(rule))
    stripped, diags = strip_foreign_provider_data(req, P, M)
    want = replace(map_tool_call_ids(stripped, ToolCallIdMap(rule)), model=M).to_json()
    assert got.value == want
    assert got.diagnostics == diags
