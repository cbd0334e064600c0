"""The chat app's view of a reply (``gelbridge chat`` / ``send``): its text as the parts
stream in."""

from __future__ import annotations

from gelbridge._chat_client import Reply
from gelbridge._records import PlainContent, TextPart
from gelbridge._records.models import MessageRecord, Part, ToolCallPart, ToolResultPart

RECORD = MessageRecord.from_value({
    "$type": "chat.gel.assistant.message", "conversation": "3mbd36vbls22b", "role": "assistant",
    "status": "complete", "createdAt": "2026-01-01T00:00:00.000Z",
    "content": PlainContent(parts=[TextPart(text="")]).to_value(),
})


def _text(*parts: Part) -> str:
    return Reply("3mbd36vbls22c.r0", RECORD, PlainContent(parts=list(parts))).text


def test_text_after_a_tool_call_starts_on_a_new_line_and_only_grows() -> None:
    call = ToolCallPart(call_id="c1", tool="current_time", input="{}", approval="approved")
    result = ToolResultPart(call_id="c1", output="12:00")
    steps = [
        (TextPart(text="Calling current_time."),),
        (TextPart(text="Calling current_time."), call, result),
        (TextPart(text="Calling current_time."), call, result, TextPart(text="It is noon.")),
    ]
    texts = [_text(*parts) for parts in steps]
    assert texts == ["Calling current_time.", "Calling current_time.", "Calling current_time.\nIt is noon."]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert _text(call, result, TextPart(text="Noon.")) == "Noon."  # no blank first line
    assert _text(TextPart(text="a"), TextPart(text="b")) == "ab"  # adjacent text stays as it was
