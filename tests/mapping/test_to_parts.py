"""response_to_parts: a Lux IR response → reply parts (and back into a request)."""

from __future__ import annotations

from gelbridge._mapping import (
    CallIds,
    build_request,
    decode_provider_data,
    response_to_parts,
    split_text,
    with_results,
)
from gelbridge._records import PlainContent, TextPart, ToolCallPart, ToolResultPart
from gelbridge._records import Usage as RUsage
from gelbridge.lux import (
    Annotation,
    Choice,
    ConversionStatus,
    LuxResponse,
    Media,
    MediaSource,
    Message,
    ProviderData,
    Refusal,
    Text,
    Thinking,
    ToolUse,
    Usage,
)
from testkit.mapping_builders import messages, opened, reply, result, text, user


def resp(*content, finish="stop", usage=None) -> LuxResponse:
    return LuxResponse("r1", "claude-x-2025", [Choice(0, Message("assistant", list(content)), finish)], usage=usage)


def convert(r, **kw):
    kw.setdefault("provider", "anthropic")
    kw.setdefault("model", "claude")
    kw.setdefault("needs_approval", lambda name: name == "fetch_url")
    kw.setdefault("reply_rkey", "3mabc.r0")
    return response_to_parts(r, **kw)


def test_text_reasoning_usage_and_finish() -> None:
    d = convert(resp(Thinking("hmm", signature="SIG"), Text("Hi"), finish="stop",
                     usage=Usage(10, 5, 15, reasoning_tokens=3)))
    assert [p.type.rpartition("#")[2] for p in d.parts] == ["reasoningPart", "textPart"]
    pd = decode_provider_data(d.parts[0].provider_data)
    assert (pd.provider_data.provider, pd.provider_data.model, pd.signature) == ("anthropic", "claude", "SIG")
    assert d.parts[1].provider_data is None
    assert d.finish_reason == "stop" and d.usage == RUsage(input_tokens=10, output_tokens=5, reasoning_tokens=3)
    assert not d.awaiting_approval and d.diagnostics == []


def test_redacted_and_signature_only_thinking_are_kept() -> None:
    d = convert(resp(Thinking("", redacted=True, provider_data=ProviderData("anthropic", "claude", {"redacted_data": "X"})),
                     Thinking("", signature="S")))
    assert [p.text for p in d.parts] == [None, None]
    assert decode_provider_data(d.parts[0].provider_data).redacted
    assert decode_provider_data(d.parts[1].provider_data).signature == "S"


def test_provider_tag_uses_the_requested_model_not_the_reported_version() -> None:
    d = convert(resp(Text("x", provider_data=ProviderData("anthropic", "claude-x-2025", {"a": 1}))))
    pd = decode_provider_data(d.parts[0].provider_data).provider_data
    assert (pd.model, pd.data) == ("claude", {"a": 1})


def test_summary_only_thinking_round_trips_as_summary() -> None:
    d = convert(resp(Thinking("", summary=[Text("short")], provider_data=ProviderData("anthropic", "claude", {"e": "enc"}))))
    assert d.parts[0].text == "short"
    req = build_request([opened("a", user(None), text("q")), opened("a.r0", reply("a"), *d.parts),
                         opened("b", user("a.r0"), text("q"))], provider="anthropic", model="claude").value
    th = req.conversation[1].content[0]
    assert th.text == "" and th.summary == [Text("short")] and th.provider_data.data == {"e": "enc"}


def test_sources_follow_their_text_once_per_url() -> None:
    anns = [Annotation("url", "Ex", "https://e.org/a"), Annotation("url", None, "https://e.org/a"),
            Annotation("file_citation", None, "file-1"), Annotation("url", "x" * 4000, "https://f.org/"),
            Annotation("url", None, "not a uri")]
    d = convert(resp(Text("one", anns), Text("two", [Annotation("url", None, "https://e.org/a")])))
    kinds = [(type(p).__name__, getattr(p, "url", None)) for p in d.parts]
    assert kinds == [("TextPart", None), ("SourcePart", "https://e.org/a"), ("SourcePart", "https://f.org/"),
                     ("TextPart", None)]
    assert d.parts[2].title.endswith("…") and len(d.parts[2].title.encode()) <= 3000
    assert [x.status for x in d.diagnostics] == [ConversionStatus.INVALID]


HOSTILE_URLS = ["javascript:alert(1)", "JavaScript:alert(1)", "data:text/html,<script>x</script>", "vbscript:msgbox",
                "file:///etc/passwd", "https://e.org/\x1b]8;;https://evil.example\x07", "https://e.org/\x07ding",
                "https://e.org/a b", "https://e.org/\u202eexe.pdf", "https://trusted.example@evil.example/",
                "https://", "ftp://e.org/", "https://e.org/" + "a" * 2048]


def test_only_safe_http_urls_are_cited_and_titles_are_plain_bounded_text() -> None:
    anns = [Annotation("url", "Bad", u) for u in HOSTILE_URLS]
    anns += [Annotation("url", "Good\x1b[31m red\x07\n\tline \u202etxt.exe", "https://e.org/ok?q=1#f"),
             Annotation("url", "\x1b\x07 \u200b", "HTTPS://E.ORG/@user")]
    d = convert(resp(Text("see", anns)))
    sources = [(p.url, p.title) for p in d.parts[1:]]
    assert sources == [("https://e.org/ok?q=1#f", "Good [31m red line txt.exe"), ("HTTPS://E.ORG/@user", None)]
    (note,) = d.diagnostics
    assert note.status == ConversionStatus.INVALID and note.detail.startswith(f"{len(HOSTILE_URLS)} citation(s) left out")
    assert "e.org" not in str(note) and "javascript" not in str(note)  # counted, never named


def test_a_reply_keeps_at_most_256_sources_across_its_steps_and_counts_the_rest() -> None:
    seen: set[str] = set()
    first = convert(resp(Text("a", [Annotation("url", None, f"https://e.org/{i}") for i in range(200)])),
                    seen_urls=seen)
    second = convert(resp(Text("b", [Annotation("url", "t", f"https://e.org/{i}") for i in range(5000)])),
                     seen_urls=seen)
    assert len(first.parts) == 201 and first.diagnostics == []
    assert [type(p).__name__ for p in second.parts] == ["TextPart"] + ["SourcePart"] * 56  # 200 were cited before
    assert [(x.status, x.detail) for x in second.diagnostics] == [
        (ConversionStatus.UNSUPPORTED, "4744 citation(s) over the 256 of a reply left out")]
    assert len(seen) == 256


def test_tool_calls_pending_runnable_and_generated_ids() -> None:
    d = convert(resp(Text("let me"), ToolUse("", "current_time"), ToolUse("dup", "fetch_url", '{"url":"u"}'),
                     ToolUse("dup", "current_time"), finish="tool_calls"),
                used_call_ids={"call_3mabc_r0_0"}, sources={"fetch_url": "https://mcp"})
    calls = [p for p in d.parts if isinstance(p, ToolCallPart)]
    assert [c.call_id for c in calls] == ["call_3mabc_r0_1", "dup", "call_3mabc_r0_2"]
    assert [c.approval for c in calls] == [None, "pending", None]
    assert calls[1].source == "https://mcp" and calls[0].source == ""
    assert d.awaiting_approval and d.pending_calls == [calls[1]] and d.runnable_calls == [calls[0], calls[2]]
    assert d.finish_reason == "tool_calls"
    assert len([x for x in d.diagnostics if x.field.endswith(".id")]) == 2


HOSTILE_NAME = "fetch_url\x1b]0;fetch_url wants https://ok.example\x07\x1b[2K"


def test_a_call_to_a_name_that_is_not_a_tool_name_is_answered_and_never_waits() -> None:
    names = [HOSTILE_NAME, "fetch url", "fetch_url\u202e", "web.search", "f" * 65, "", "\x9b2J", "é"]
    for name in names:
        d = convert(resp(ToolUse("c1", name, '{"url": "u"}'), finish="tool_calls"), needs_approval=lambda n: True)
        call, res = d.parts
        assert (call.tool, call.input, call.approval, call.call_id) == ("invalid_tool_name", '{"url": "u"}', None, "c1")
        assert res.call_id == "c1" and res.is_error and "not a valid tool name" in res.output
        assert not d.awaiting_approval and d.pending_calls == [] and d.runnable_calls == []
        assert d.answered_calls == [call]
        assert [(x.field, x.status) for x in d.diagnostics] == [("content[0].tool_use.name", ConversionStatus.INVALID)]
        assert d.diagnostics[0].content is None  # a diagnostic never names what the model said
    # the result names the call as the model made it, every control as an escape
    out = convert(resp(ToolUse("c1", HOSTILE_NAME))).parts[1].output
    assert "\x1b" not in out and "\x07" not in out and '"fetch_url\\u001b]0;fetch_url wants' in out
    assert len(convert(resp(ToolUse("c1", "x" * 100_000))).parts[1].output) < 300
    # the longest valid name, and every valid character, are called as before
    for name in ("f" * 64, "mcp_my-server_Tool_9"):
        d = convert(resp(ToolUse("c1", name)), needs_approval=lambda n: True)
        assert d.parts[0].tool == name and d.pending_calls == d.parts and d.answered_calls == []


def test_a_refused_call_goes_back_to_the_model_under_a_valid_name_with_its_result() -> None:
    d = convert(resp(ToolUse("c1", HOSTILE_NAME, "{}"), ToolUse("c2", "current_time", "{}")))
    assert [c.call_id for c in d.runnable_calls] == ["c2"]
    parts = with_results(d.parts, {"c2": result("c2", "noon")})
    req = build_request([opened("a", user(None), text("q")), opened("a.r0", reply("a"), *parts),
                         opened("b", user("a.r0"), text("q"))], provider="anthropic", model="claude")
    calls = [b for b in req.value.conversation[1].content if isinstance(b, ToolUse)]
    assert [(c.id, c.name) for c in calls] == [("c1", "invalid_tool_name"), ("c2", "current_time")]
    assert HOSTILE_NAME not in str(req.value.to_json())


def test_call_ids_shared_across_tool_loop_steps() -> None:
    ids = CallIds("k.r0")
    a = convert(resp(ToolUse("", "t")), call_ids=ids)
    b = convert(resp(ToolUse("", "t")), call_ids=ids)
    assert a.parts[0].call_id != b.parts[0].call_id


def test_oversized_arguments_are_not_run() -> None:
    d = convert(resp(ToolUse("c", "current_time", '{"x":"' + "a" * 200_001 + '"}')))
    assert [type(p) for p in d.parts] == [ToolCallPart, ToolResultPart]
    assert d.parts[1].is_error and not d.runnable_calls and d.parts[0].input == "{}"


def test_long_text_is_split_on_character_boundaries() -> None:
    long = "é" * 300_000  # 600000 bytes
    d = convert(resp(Text(long)))
    assert len(d.parts) == 2 and "".join(p.text for p in d.parts) == long
    assert all(len(p.text.encode()) <= 500_000 for p in d.parts)
    assert split_text("abc", 2) == ["ab", "c"] and split_text("€€", 4) == ["€", "€"]


def test_parts_limit_drops_overflow_and_its_calls() -> None:
    d = convert(resp(*[Text(str(i)) for i in range(5)], ToolUse("z", "current_time")), max_parts=5)
    assert len(d.parts) == 5 and d.runnable_calls == [] and d.diagnostics[-1].field == "parts"


def test_refusal_media_unknown_finish() -> None:
    img = Media("image", "image/png", MediaSource("inline", "AA=="))
    d = convert(resp(Refusal("no"), img, finish="end_turn"))
    assert [p.text for p in d.parts] == ["no"]
    assert [x.status for x in d.diagnostics] == [ConversionStatus.DEGRADED, ConversionStatus.UNSUPPORTED,
                                                 ConversionStatus.DEGRADED]
    assert d.finish_reason == "end_turn"
    assert convert(resp(finish="malformed_function_call")).finish_reason == "malformed_tool_call"
    assert convert(resp(Text(""))).parts == []


def test_with_results_places_each_result_after_its_call() -> None:
    parts = [TextPart(text="a"), ToolCallPart(call_id="1", tool="t", input="{}"),
             ToolCallPart(call_id="2", tool="t", input="{}")]
    out = with_results(parts, {"2": result("2"), "1": result("1"), "9": result("9")})
    assert [getattr(p, "call_id", None) for p in out] == [None, "1", "1", "2", "2"]


def test_response_parts_round_trip_into_the_next_request() -> None:
    blocks = [Thinking("t", signature="S", provider_data=ProviderData("anthropic", "claude", {"signature": "S"})),
              Text("answer", provider_data=ProviderData("anthropic", "claude", {"z": 1})),
              ToolUse("c1", "current_time", "{}", ProviderData("anthropic", "claude", {"y": 2}))]
    d = convert(resp(*blocks))
    parts = with_results(d.parts, {"c1": result("c1", "noon")})
    PlainContent(parts=parts)  # lexicon-valid
    req = build_request([opened("a", user(None), text("q")), opened("a.r0", reply("a"), *parts),
                         opened("b", user("a.r0"), text("q"))], provider="anthropic", model="claude")
    assert req.diagnostics == []
    assert req.value.conversation[1].content == blocks
    assert messages(req.value.to_json())[2]["role"] == "tool"
