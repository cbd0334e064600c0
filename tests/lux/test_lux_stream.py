"""StreamAccumulator and stream-event JSON."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gelbridge.lux import (
    Annotation,
    AnnotationsEvent,
    BlockDelta,
    BlockDiscard,
    BlockEnd,
    BlockStart,
    ConversationMeta,
    ConversationStart,
    ConversionStatus,
    DoneEvent,
    ErrorEvent,
    FinishEvent,
    FinishReason,
    ItemEnd,
    ItemStart,
    LuxDecodeError,
    LuxError,
    LuxResponse,
    NativeDelta,
    ProviderData,
    ProviderDataDelta,
    Refusal,
    RefusalDelta,
    SignatureDelta,
    StreamAccumulator,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallStart,
    ToolUse,
    Usage,
    UsageEvent,
    event_from_json,
    strip_foreign_provider_data,
)
from testkit import lux_schema


def run(events, **kw):
    acc = StreamAccumulator(**kw)
    acc.feed_all(events)
    return acc, acc.result()


def test_text_deltas_are_appended_in_order():
    acc, r = run([ConversationStart(ConversationMeta(id="r1", model="m1", created_at=5)),
                  BlockStart(0, "text"), BlockDelta(0, TextDelta("Hel")), BlockDelta(0, TextDelta("lo")),
                  BlockDelta(0, TextDelta(" world")), BlockEnd(0), FinishEvent("stop"), DoneEvent()])
    assert (r.id, r.model, r.created_at) == ("r1", "m1", 5)
    assert r.message.content == [Text("Hello world")]
    assert r.choices[0].finish_reason == FinishReason.STOP
    assert acc.diagnostics == []


def test_text_deltas_without_block_start_still_accumulate():
    _, r = run([BlockDelta(3, TextDelta("a")), BlockDelta(3, TextDelta("b"))])
    assert r.message.content == [Text("ab")]


def test_parallel_tool_calls_with_interleaved_argument_pieces():
    _, r = run([
        BlockStart(0, "text"), BlockDelta(0, TextDelta("Let me check.")), BlockEnd(0),
        BlockStart(1, ToolCallStart("call_a", "weather")),
        BlockStart(2, ToolCallStart("call_b", "time")),
        BlockDelta(1, ToolArgumentsDelta('{"city":')), BlockDelta(2, ToolArgumentsDelta('{"tz":"UT')),
        BlockDelta(1, ToolArgumentsDelta('"Oslo"}')), BlockDelta(2, ToolArgumentsDelta('C"}')),
        BlockEnd(1), BlockEnd(2), FinishEvent("tool_calls"), DoneEvent()])
    assert r.message.content == [Text("Let me check."), ToolUse("call_a", "weather", '{"city":"Oslo"}'),
                                 ToolUse("call_b", "time", '{"tz":"UTC"}')]
    assert r.choices[0].finish_reason == FinishReason.TOOL_CALLS


def test_an_unclosed_zero_argument_tool_call_is_kept_with_empty_object_arguments():
    _, r = run([BlockStart(0, ToolCallStart("call_z", "now")), FinishEvent("tool_calls")])
    assert r.message.content == [ToolUse("call_z", "now", "{}")]


def test_invalid_tool_argument_json_is_kept_and_flagged():
    acc, r = run([BlockStart(0, ToolCallStart("c", "f")), BlockDelta(0, ToolArgumentsDelta('{"a":'))])
    assert r.message.content == [ToolUse("c", "f", '{"a":')]
    assert [(d.field, d.status) for d in acc.diagnostics] == [("block[0].tool_use.arguments", ConversionStatus.INVALID)]


def test_thinking_stays_a_block_in_position_with_signature_tagged_by_provider():
    acc, r = run([
        ConversationStart(ConversationMeta(model="claude-x")),
        BlockStart(0, "thinking"), BlockDelta(0, ThinkingDelta("step 1, ")), BlockDelta(0, ThinkingDelta("step 2")),
        BlockDelta(0, SignatureDelta("sig-")), BlockDelta(0, SignatureDelta("abc")), BlockEnd(0),
        BlockStart(1, "text"), BlockDelta(1, TextDelta("answer")), BlockEnd(1),
        BlockStart(2, "thinking"), BlockDelta(2, ThinkingDelta("more")), BlockEnd(2),
    ], provider="anthropic")
    assert r.message.content == [
        Thinking("step 1, step 2", signature="sig-abc", provider_data=ProviderData("anthropic", "claude-x", {})),
        Text("answer"),
        Thinking("more"),
    ]
    assert acc.diagnostics == []


def test_a_signature_without_a_provider_tag_is_flagged():
    acc, r = run([BlockStart(0, "thinking"), BlockDelta(0, SignatureDelta("s"))])
    assert r.message.content == [Thinking("", signature="s")]
    assert acc.diagnostics[0].status is ConversionStatus.DEGRADED


def test_redacted_thinking_and_gemini_thought_signatures_arrive_as_provider_data_deltas():
    anth = ProviderData("anthropic", "claude-x", {"redacted_data": "opaque"})
    gem1 = ProviderData("gemini", "gemini-x", {"thoughtSignature": "t1"})
    gem2 = ProviderData("gemini", "gemini-x", {"thoughtSignature": "t2", "other": 1})
    _, r = run([
        BlockStart(0, "thinking"), BlockDelta(0, ProviderDataDelta(anth, redacted=True)), BlockEnd(0),
        BlockStart(1, "text"), BlockDelta(1, TextDelta("hi")), BlockDelta(1, ProviderDataDelta(gem1)),
        BlockDelta(1, ProviderDataDelta(gem2)),
        BlockStart(2, ToolCallStart("c", "f")), BlockDelta(2, ProviderDataDelta(gem1)),
    ])
    assert r.message.content == [
        Thinking("", redacted=True, provider_data=anth),
        Text("hi", provider_data=ProviderData("gemini", "gemini-x", {"thoughtSignature": "t2", "other": 1})),
        ToolUse("c", "f", "{}", gem1),
    ]


def test_usage_is_merged_across_events():
    _, r = run([
        ConversationStart(ConversationMeta(usage_input=120)),
        UsageEvent(Usage(prompt_tokens=120, completion_tokens=1, total_tokens=121, cached_tokens=100)),
        UsageEvent(Usage(prompt_tokens=0, completion_tokens=57, total_tokens=57)),
    ])
    assert r.usage == Usage(120, 57, 177, cached_tokens=100)


def test_gemini_style_repeated_cumulative_usage_keeps_the_latest_totals():
    _, r = run([UsageEvent(Usage(10, 5, 20, reasoning_tokens=5)), UsageEvent(Usage(10, 9, 30, reasoning_tokens=11))])
    assert r.usage == Usage(10, 9, 30, reasoning_tokens=11)


def test_an_error_mid_stream_keeps_the_partial_content_and_the_error():
    err = LuxError("rate_limit", "slow down", "429")
    _, r = run([BlockStart(0, "text"), BlockDelta(0, TextDelta("partial")), ErrorEvent(err),
                FinishEvent("stop"), DoneEvent()])
    assert r.choices[0].finish_reason == FinishReason.ERROR
    assert r.error == err
    assert r.message.content == [Text("partial")]
    assert LuxResponse.from_json(r.to_json()) == r


def test_an_error_before_any_content_gives_empty_content_not_an_empty_text():
    _, r = run([ErrorEvent(LuxError("server_error", "boom"))])
    assert r.message.content == []


def test_block_discard_throws_away_what_came_before_and_later_deltas_refill():
    _, r = run([BlockStart(0, "text"), BlockDelta(0, TextDelta("draft")), BlockDiscard(0),
                BlockDelta(0, TextDelta("final")), BlockEnd(0)])
    assert r.message.content == [Text("final")]


def test_a_discarded_tool_call_with_nothing_after_it_disappears():
    _, r = run([BlockStart(0, ToolCallStart("c", "f")), BlockDelta(0, ToolArgumentsDelta("{}")),
                BlockDiscard(0), BlockEnd(0), BlockStart(1, "text"), BlockDelta(1, TextDelta("x"))])
    assert r.message.content == [Text("x")]


def test_annotations_attach_to_their_text_block():
    ann = Annotation("url", ref="https://example.test", start=0, end=4)
    acc, r = run([BlockStart(0, "text"), BlockDelta(0, TextDelta("text")), AnnotationsEvent(0, [ann]),
                  AnnotationsEvent(7, [ann])])
    assert r.message.content == [Text("text", [ann])]
    assert [d.field for d in acc.diagnostics] == ["block[7].annotations"]


def test_refusal_deltas_make_a_refusal_block():
    _, r = run([BlockStart(0, "text"), BlockDelta(0, RefusalDelta("I can't")), BlockDelta(0, RefusalDelta(" help"))])
    assert r.message.content == [Refusal("I can't help")]


def test_mismatched_and_native_deltas_are_reported_not_mixed_in():
    acc, r = run([BlockStart(0, "text"), BlockDelta(0, ThinkingDelta("x")), BlockDelta(0, TextDelta("ok")),
                  BlockDelta(0, NativeDelta("x_tag", {"a": 1})), BlockDelta(0, ThinkingDelta("y"))])
    assert r.message.content == [Text("ok")]
    assert acc.native_events == [(0, NativeDelta("x_tag", {"a": 1}))]
    assert [d.status for d in acc.diagnostics] == [ConversionStatus.INVALID, ConversionStatus.UNSUPPORTED]


def test_agent_action_items_are_kept_aside_and_item_skeletons_add_no_content():
    item = {"type": "agent_action", "agent_action": {"kind": "computer_call", "id": "a1"}}
    acc, r = run([ItemStart(0, {"type": "message", "message": {"role": "assistant", "content": [{"type": "text", "text": ""}]}}),
                  BlockStart(0, "text", item_index=0), BlockDelta(0, TextDelta("x")), ItemEnd(0),
                  ItemStart(1, item), ItemEnd(1)])
    assert r.message.content == [Text("x")]
    assert acc.agent_actions == [item]


def test_a_stream_that_ends_without_finish_is_stop_with_a_diagnostic():
    acc, r = run([BlockDelta(0, TextDelta("x")), DoneEvent()])
    assert r.choices[0].finish_reason == FinishReason.STOP
    assert [d.field for d in acc.diagnostics] == ["finish_reason"]


def test_accumulated_responses_feed_strip_foreign_provider_data():
    _, r = run([ConversationStart(ConversationMeta(model="claude-x")), BlockStart(0, "thinking"),
                BlockDelta(0, ThinkingDelta("t")), BlockDelta(0, SignatureDelta("s"))], provider="anthropic")
    from gelbridge.lux import LuxRequest, Options
    req = LuxRequest("m", [r.message], Options(stream=True))
    same, d1 = strip_foreign_provider_data(req, "anthropic", "claude-x")
    other, d2 = strip_foreign_provider_data(req, "openai", "gpt-x")
    assert same.conversation[0].content[0].signature == "s" and d1 == []
    assert other.conversation[0].content == [Thinking("t")] and len(d2) == 1


# --- event JSON ----------------------------------------------------------------------------

ALL_EVENTS = [
    ConversationStart(ConversationMeta(id="r", model="m", usage_input=3, created_at=1, extra={"a": 1})),
    ItemStart(0, {"type": "message", "message": {"role": "assistant", "content": []}}),
    BlockStart(0, "text", item_index=0), BlockStart(1, ToolCallStart("c", "f")), BlockStart(2, "x_native"),
    BlockDelta(0, TextDelta("t")), BlockDelta(0, ThinkingDelta("t")), BlockDelta(0, SignatureDelta("s")),
    BlockDelta(1, ToolArgumentsDelta("{}")), BlockDelta(0, RefusalDelta("no")),
    BlockDelta(0, NativeDelta("x", {"k": 1})),
    BlockDelta(0, ProviderDataDelta(ProviderData("p", "m", {"k": "v"}), redacted=True)),
    BlockEnd(0), ItemEnd(0), BlockDiscard(0), AnnotationsEvent(0, [Annotation("url", ref="u")]),
    FinishEvent("malformed_tool_call"), UsageEvent(Usage(1, 2, 3)), ErrorEvent(LuxError("rate_limit", "m")),
    DoneEvent(),
]


@pytest.mark.parametrize("ev", ALL_EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_round_trips_through_json(ev):
    assert event_from_json(json.loads(json.dumps(ev.to_json()))) == ev


@pytest.mark.parametrize("ev", ALL_EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_validates_against_the_patched_schema(ev):
    assert lux_schema.errors(lux_schema.patched("LucentStreamEvent"), ev.to_json()) == []


def test_schema_defined_events_validate_against_the_unpatched_schema():
    for ev in ALL_EVENTS:
        j = ev.to_json()
        extension = (j.get("delta", {}).get("type") in ("native", "provider_data")
                     or j.get("block_type") == "x_native")
        if not extension:
            assert lux_schema.errors(lux_schema.strict("LucentStreamEvent"), j) == [], j


def test_malformed_finish_function_call_spelling_is_read_in_events():
    assert event_from_json({"event": "finish", "finish_reason": "malformed_function_call"}) == \
        FinishEvent(FinishReason.MALFORMED_TOOL_CALL)


@pytest.mark.parametrize("bad", [
    {"event": "nope"}, {"event": "block_delta", "index": 0}, {"event": "block_end"},
    {"event": "block_delta", "index": 0, "delta": {"type": "x"}},
    {"event": "block_start", "index": 0, "block_type": {"type": "tool_call", "id": "c"}},
])
def test_malformed_events_raise_decode_errors(bad):
    with pytest.raises(LuxDecodeError):
        event_from_json(bad)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=5), max_size=20), st.integers(1, 4))
def test_text_split_into_any_pieces_accumulates_to_the_whole(pieces, n_blocks):
    events = [BlockStart(i, "text") for i in range(n_blocks)]
    for k, p in enumerate(pieces):
        events.append(BlockDelta(k % n_blocks, TextDelta(p)))
    _, r = run(events)
    expected = ["".join(pieces[i::n_blocks]) for i in range(n_blocks)]
    assert [b.text for b in r.message.content] == [e for e in expected if e]
