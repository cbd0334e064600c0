"""build_request: records of a thread → Lux IR request."""

from __future__ import annotations

import base64

import orjson
import pytest

from gelbridge._mapping import (
    TurnChoice,
    approval_answers,
    build_request,
    encode_provider_data,
    repeated_call_parts,
    waiting_calls,
)
from gelbridge._records import (
    BlobRef,
    ExtractedText,
    FilePart,
    ImagePart,
    PlainContent,
    ReasoningPart,
    SourcePart,
    UnknownPart,
)
from gelbridge._tools.approval import resolve_approvals
from gelbridge.lux import ConversionStatus, Options, ProviderData, Text, Tool
from testkit.mapping_builders import (
    approve,
    assert_valid_request,
    call,
    check_tool_pairs,
    messages,
    opened,
    reply,
    result,
    text,
    user,
)

CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
CID2 = "bafkreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"


def build(thread, **kw):
    kw.setdefault("provider", "anthropic")
    kw.setdefault("model", "claude")
    conv = build_request(thread, **kw)
    wire = conv.value.to_json()
    assert_valid_request(wire)
    return wire, conv.diagnostics


def roles(wire):
    return [m["role"] for m in messages(wire)]


def test_plain_thread_instructions_tools_and_effort() -> None:
    thread = [opened("a", user(None), text("hi")), opened("a.r0", reply("a"), text("hello")),
              opened("b", user("a.r0"), text("how are you?"))]
    wire, diags = build(
        thread,
        instructions="Operator says.",
        conversation_instructions=PlainContent(parts=[text("Be brief."), ReasoningPart(text="x")]),
        choice=TurnChoice(None, [], "max"),
        tool_specs=[Tool("t1", description="d"), {"name": "t2", "description": "e", "parameters": {"type": "object"}}],
        options=Options(stream=False, max_output_tokens=100),
    )
    assert wire["model"] == "claude"
    assert [c["text"] for c in wire["instructions"]] == ["Operator says.", "Be brief."]
    assert roles(wire) == ["user", "assistant", "user"]
    assert [t["name"] for t in wire["tools"]] == ["t1", "t2"]
    assert wire["reasoning"] == {"enabled": True, "effort": "xhigh"}
    assert wire["options"] == {"stream": False, "max_output_tokens": 100}
    assert [str(d.field) for d in diags] == ["conversation.instructions.parts[1]"]


def test_tool_calls_with_results_and_a_following_step() -> None:
    r = reply("a")
    thread = [
        opened("a", user(None), text("q")),
        opened("a.r0", r, ReasoningPart(text="think"), text("let me"), call("c1"), result("c1", "one"),
               call("c2"), result("c2", "two", True), text("done"), call("c3"), result("c3")),
        opened("b", user("a.r0"), text("thanks")),
    ]
    wire, diags = build(thread)
    assert diags == []
    assert roles(wire) == ["user", "assistant", "tool", "tool", "assistant", "tool", "user"]
    m = messages(wire)
    assert [c["type"] for c in m[1]["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert m[3]["content"][0]["tool_result"] == {"tool_use_id": "c2", "content": [{"type": "text", "text": "two"}],
                                                 "is_error": True}
    check_tool_pairs(wire)


def approval_thread(answer_parts, prefix=None, extra_reply=None):
    waiting = reply("a", status="awaitingApproval")
    r0 = ["a.r0", waiting, text("I will look"), call("ok1", "current_time"), result("ok1", "noon"),
          call("w1", "fetch_url", '{"url":"x"}', "pending", provider_data=encode_provider_data(ProviderData("anthropic", "claude", {"k": 1}))),
          call("w2", "fetch_url", '{"url":"y"}', "pending")]
    thread = [opened("a", user(None), text("q")), opened(*r0), opened("b", user("a.r0"), *answer_parts)]
    if extra_reply is not None:
        thread.append(opened("b.r0", reply("b"), *extra_reply))
        thread.append(opened("c", user("b.r0"), text("next")))
    return thread


def prefix_for(thread, results):
    parent = thread[1].content.parts
    outcome = resolve_approvals(waiting_calls(parent), approval_answers(thread[2].content.parts))
    return outcome, repeated_call_parts(outcome, results, parent_parts=parent)


def test_approved_and_denied_calls_replace_the_waiting_copies_in_place() -> None:
    thread = approval_thread([approve("w1"), approve("w2", False, "no")])
    outcome, prefix = prefix_for(thread, {"w1": result("w1", "page")})
    assert [p.approval for p in prefix if p.type.endswith("toolCallPart")] == ["approved", "denied"]
    assert prefix[0].provider_data is not None  # kept from the waiting copy
    wire, diags = build(thread, reply_prefix=prefix + [text("Here it is")])
    assert diags == []
    # the user message of only approvals adds nothing; the waiting calls keep their turn
    assert roles(wire) == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    m = messages(wire)
    assert [c["tool_use"]["id"] for c in m[1]["content"] if c["type"] == "tool_use"] == ["ok1", "w1", "w2"]
    assert m[1]["content"][2]["provider_data"]["data"] == {"k": 1}
    assert m[3]["content"][0]["tool_result"]["content"][0]["text"] == "page"
    denied = m[4]["content"][0]["tool_result"]
    assert denied["is_error"] and "Reason: no" in denied["content"][0]["text"]
    check_tool_pairs(wire)


def test_unmentioned_call_is_denied_and_ignored_answers_are_not_sent() -> None:
    thread = approval_thread([approve("w1"), approve("nope"), text("go ahead")])
    outcome, prefix = prefix_for(thread, {"w1": result("w1", "page")})
    assert [i.answer.call_id for i in outcome.ignored] == ["nope"]
    wire, _ = build(thread, reply_prefix=prefix)
    m = messages(wire)
    assert roles(wire) == ["user", "assistant", "tool", "tool", "tool", "user"]
    assert "did not approve" in m[4]["content"][0]["tool_result"]["content"][0]["text"]
    assert m[5]["content"] == [{"type": "text", "text": "go ahead"}]
    check_tool_pairs(wire)


def test_history_with_written_repeated_calls_has_one_result_per_call() -> None:
    thread = approval_thread([approve("w1")])
    _, prefix = prefix_for(thread, {"w1": result("w1", "page")})
    thread = approval_thread([approve("w1")], extra_reply=prefix + [text("Here")])
    wire, diags = build(thread)
    assert diags == []
    assert roles(wire) == ["user", "assistant", "tool", "tool", "tool", "assistant", "user"]
    check_tool_pairs(wire)


def test_never_answered_and_crashed_calls_get_synthetic_results() -> None:
    thread = approval_thread([text("forget it, tell me a joke")])
    thread.append(opened("b.r0", reply("b", status="error"), text("Why"), call("x1")))
    thread.append(opened("c", user("b.r0"), text("again")))
    wire, diags = build(thread)
    check_tool_pairs(wire)
    m = messages(wire)
    outs = [x["content"][0]["tool_result"] for x in m if x["role"] == "tool"]
    assert [o["is_error"] for o in outs] == [False, True, True, True]
    assert "never answered" in outs[1]["content"][0]["text"]
    assert "ended before" in outs[3]["content"][0]["text"]
    fields = [d.field for d in diags]
    assert "b.r0" in fields  # partial reply included, reported
    assert "a.r0.parts[3]" in fields and "b.r0.parts[1]" in fields


def test_approved_call_without_result_is_answered_as_not_run() -> None:
    thread = approval_thread([approve("w1"), approve("w2")])
    _, prefix = prefix_for(thread, {})
    wire, diags = build(thread, reply_prefix=prefix)
    check_tool_pairs(wire)
    assert sum("no result" in (d.detail or "") for d in diags) == 2


def test_duplicate_and_empty_call_ids_are_renamed_in_the_request() -> None:
    thread = [
        opened("a", user(None), text("q")),
        opened("a.r0", reply("a"), call("same"), result("same")),
        opened("b", user("a.r0"), text("q2")),
        opened("b.r0", reply("b"), call("same"), result("same", "2"), call(""), result("")),
        opened("c", user("b.r0"), text("q3")),
    ]
    wire, diags = build(thread)
    check_tool_pairs(wire)
    ids = [c["tool_use"]["id"] for m in messages(wire) for c in m["content"] if c["type"] == "tool_use"]
    assert ids[0] == "same" and ids[1] == "same_1" and ids[2] == "call_b_r0_2"
    assert len([d for d in diags if d.field.endswith("callId")]) == 2


def test_orphan_and_second_results_and_misplaced_parts_are_reported() -> None:
    thread = [
        opened("a", user(None), text("q"), call("u"), result("u"), approve("zz")),
        opened("a.r0", reply("a"), call("c"), result("c"), result("c"), result("ghost"), approve("c")),
        opened("b", user("a.r0"), text("x")),
    ]
    wire, diags = build(thread)
    check_tool_pairs(wire)
    details = sorted(d.detail for d in diags)
    assert details == sorted([
        "a tool call or result in a user message; left out", "a tool call or result in a user message; left out",
        "second result for one call; left out", "result without a call in this reply; left out",
        "toolApprovalPart in a reply; left out",
    ])


def test_provider_data_kept_for_same_model_and_stripped_for_another() -> None:
    mine = encode_provider_data(ProviderData("anthropic", "claude", {"signature": "S"}), signature="S")
    theirs = encode_provider_data(ProviderData("google", "gemini", {"thoughtSignature": "G"}))
    redacted = encode_provider_data(ProviderData("google", "gemini", {"redacted_data": "R"}), redacted=True)
    thread = [
        opened("a", user(None), text("q")),
        opened("a.r0", reply("a"), ReasoningPart(text="t1", provider_data=mine),
               ReasoningPart(text="t2", provider_data=theirs), ReasoningPart(provider_data=redacted),
               text("x", provider_data=theirs), call("c", provider_data=theirs), result("c")),
        opened("b", user("a.r0"), text("q")),
    ]
    wire, diags = build(thread)
    content = messages(wire)[1]["content"]
    assert content[0]["thinking"]["signature"] == "S" and content[0]["provider_data"]["model"] == "claude"
    assert content[1] == {"type": "thinking", "thinking": {"text": "t2", "redacted": False}}
    assert [c["type"] for c in content] == ["thinking", "thinking", "text", "tool_use"]  # redacted one dropped
    assert "provider_data" not in content[2] and "provider_data" not in content[3]
    assert len(diags) == 4 and all(d.status == ConversionStatus.DEGRADED for d in diags)
    wire2, diags2 = build(thread, provider="google", model="gemini")
    c2 = messages(wire2)[1]["content"]
    assert c2[2]["thinking"]["redacted"] is True and c2[2]["provider_data"]["data"] == {"redacted_data": "R"}
    assert len(diags2) == 1  # only the anthropic signature


def test_malformed_provider_data_is_reported_and_not_sent() -> None:
    thread = [opened("a", user(None), text("q", provider_data="{not json"),
                     text("r", provider_data='{"provider": 1}'))]
    wire, diags = build(thread)
    assert messages(wire)[0]["content"] == [{"type": "text", "text": "q"}, {"type": "text", "text": "r"}]
    assert [d.status for d in diags] == [ConversionStatus.INVALID] * 2
    assert "{not json" not in str(diags)


def test_images_from_blobs_and_missing_blobs() -> None:
    img = ImagePart(image=BlobRef.of(CID, "image/png", 3), alt="a cat")
    img2 = ImagePart(image=BlobRef.of(CID2, "image/jpeg", 3))
    thread = [opened("a", user(None), text("look"), img, img2)]
    wire, diags = build(thread, blobs={CID: b"PNG"})
    content = messages(wire)[0]["content"]
    assert content[1] == {"type": "image", "image": {"media_type": "image/png",
                                                      "source": {"type": "inline", "data": base64.b64encode(b"PNG").decode()}}}
    assert len(content) == 2
    assert [d.field for d in diags] == ["a.parts[2]"] and diags[0].status == ConversionStatus.UNSUPPORTED
    wire, diags = build(thread, blobs={})
    assert messages(wire)[0]["content"][1] == {"type": "text", "text": "[image: a cat]"}


def test_files_with_and_without_extracted_text() -> None:
    with_text = FilePart(file=BlobRef.of(CID, "application/pdf", 9), name="r.pdf",
                         extracted=ExtractedText(text=BlobRef.of(CID2, "text/plain", 5), method="text"))
    without = FilePart(file=BlobRef.of(CID, "application/zip", 9))
    thread = [opened("a", user(None), with_text, without)]
    wire, diags = build(thread, blobs={CID2: "héllo\xff".encode()})
    assert messages(wire)[0]["content"] == [{"type": "text", "text": "[file: r.pdf]\nhéllo\xff"}]
    assert [d.field for d in diags] == ["a.parts[1]"]
    wire, diags = build(thread, blobs={CID2: b"bad \xff"})
    assert "\ufffd" in messages(wire)[0]["content"][0]["text"]
    assert [d.field for d in diags] == ["a.parts[0].extracted", "a.parts[1]"]
    _, diags = build(thread)
    assert [d.field for d in diags] == ["a.parts[0]", "a.parts[1]"]


def test_a_blob_named_by_many_parts_is_sent_once() -> None:
    """100 file parts naming one 1 MiB text made a ~100 MiB request that took the worker down."""
    big = ("x" * 1023 + "\n").encode() * 1024
    def part(i: int) -> FilePart:
        return FilePart(file=BlobRef.of(CID, "text/plain", 9), name=f"f{i}.txt",
                        extracted=ExtractedText(text=BlobRef.of(CID2, "text/plain", len(big)), method="text"))
    img = ImagePart(image=BlobRef.of(CID, "image/png", 3))
    thread = [opened("a", user(None), *[part(i) for i in range(100)], img, img),
              opened("b", reply("a"), text("seen")),
              opened("c", user("b"), part(100), img)]
    wire, diags = build(thread, blobs={CID2: big, CID: b"PNG"})
    first, _, last = (m["content"] for m in messages(wire))
    assert first[0] == {"type": "text", "text": "[file: f0.txt]\n" + big.decode()}
    assert first[1] == {"type": "text", "text": "[file: f1.txt] (the same content as [file: f0.txt] above)"}
    assert first[100]["type"] == "image"
    assert first[101] == {"type": "text", "text": "[image] (the same content as [image] above)"}
    assert last == [{"type": "text", "text": "[file: f100.txt] (the same content as [file: f0.txt] above)"},
                    {"type": "text", "text": "[image] (the same content as [image] above)"}]
    assert len(orjson.dumps(wire)) < len(big) + 64 * 1024
    assert len(diags) == 99 + 1 + 2 and {d.status for d in diags} == {ConversionStatus.DEGRADED}
    assert all("x" not in d.detail for d in diags)


def test_sources_become_annotations_and_unknown_parts_are_reported() -> None:
    thread = [
        opened("a", user(None), text("q")),
        opened("a.r0", reply("a"), text("see"), SourcePart(url="https://e.org/", title="E"),
               SourcePart(url="https://f.org/"), ReasoningPart(text="r"), SourcePart(url="https://g.org/"),
               UnknownPart.from_value({"$type": "com.example#poll", "q": "?"})),
        opened("b", user("a.r0"), text("q")),
    ]
    wire, diags = build(thread)
    t = messages(wire)[1]["content"][0]
    assert t["annotations"] == [{"kind": "url", "text": "E", "ref": "https://e.org/"},
                                {"kind": "url", "ref": "https://f.org/"}]
    assert [(d.field, d.status) for d in diags] == [
        ("a.r0.parts[4]", ConversionStatus.UNSUPPORTED), ("a.r0.parts[5]", ConversionStatus.UNSUPPORTED)]
    assert "com.example#poll" not in str(diags[1]) and "poll" not in (diags[1].detail or "")  # sealed content
    assert "com.example#poll" in diags[1].describe(show_content=True)


def test_empty_and_error_replies_leave_no_empty_messages() -> None:
    thread = [opened("a", user(None), text("q")), opened("a.r0", reply("a", status="error")),
              opened("b", user("a.r0"), text("again"))]
    wire, diags = build(thread)
    assert roles(wire) == ["user", "user"] and diags == []
    assert all(m["content"] for m in messages(wire))
    assert isinstance(build_request(thread, provider="p", model="m").value.conversation[0].content[0], Text)


def test_opened_messages_are_immutable_values() -> None:
    m = opened("a", user(None), text("hi"))
    with pytest.raises(AttributeError):
        m.rkey = "b"  # type: ignore[misc]
    assert m == opened("a", user(None), text("hi"))
