"""The one rule for text that leaves a record (gelbridge._records.text): no lone surrogate
anywhere, no NUL but in the parts of plain content; the record models and the worker's
peek at a malformed message apply it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gelbridge._errors import RecordError
from gelbridge._records import MESSAGE_COLLECTION, ConversationRecord, MessageRecord, SettingsRecord
from gelbridge._records.text import field_problem, is_storable, text_problem
from gelbridge._worker.decide import peek_ask

PLAIN = {"$type": "chat.gel.assistant.defs#plainContent", "parts": [{"$type": "chat.gel.assistant.defs#textPart",
                                                                    "text": "hi"}]}
SEALED = {"$type": "chat.gel.assistant.defs#encryptedContent", "scheme": "xchacha20poly1305-v1", "keyId": "k1",
          "nonce": {"$bytes": "A" * 32}, "ciphertext": {"$bytes": "B" * 24}}


def message(**over: Any) -> dict[str, Any]:
    v: dict[str, Any] = {"$type": MESSAGE_COLLECTION, "conversation": "3mconv", "role": "user",
                         "content": copy.deepcopy(SEALED), "generation": {"attempt": 0},
                         "createdAt": "2026-01-01T00:00:00.000Z"}
    v.update(over)
    return v


def test_text_problem_names_nul_and_lone_surrogates_and_nothing_else() -> None:
    assert text_problem("a\x00b") is not None and "NUL" in (text_problem("\x00") or "")
    assert "surrogate" in (text_problem("a\ud800") or "") and text_problem("\udfff") is not None
    for fine in ("", "plain", "\ufffe\uffff", "\x01\x1b[2J\x7f\x85", "\u2028\u202e", "😀", "\U0010ffff"):
        assert text_problem(fine) is None and is_storable(fine)
    assert not is_storable(None) and not is_storable(3)


BAD = ["3m\x00", "3m\ud800"]


@pytest.mark.parametrize("bad", BAD, ids=["nul", "lone-surrogate"])
@pytest.mark.parametrize("where", [
    lambda v, s: v.update(conversation=s),
    lambda v, s: v.update(parent=s),
    lambda v, s: v.update(role=s),
    lambda v, s: v["generation"].update(model={"provider": "p", "id": s}),
    lambda v, s: v["generation"].update(tools=["ok", s]),
    lambda v, s: v["generation"].update(effort=s),
    lambda v, s: v["content"].update(keyId=s),
    lambda v, s: v.update(extraField={"deep": [s]}),
    lambda v, s: v.update({s: 1}),
], ids=["conversation", "parent", "role", "model-id", "tool", "effort", "keyId", "extra", "field-name"])
def test_a_message_with_such_text_outside_plain_parts_is_one_record_error(bad: str, where: Any) -> None:
    value = message()
    where(value, bad)
    with pytest.raises(RecordError) as e:
        MessageRecord.from_value(value, uri="at://did:plc:x/chat.gel.assistant.message/3mk")
    text = str(e.value)
    assert "\n" not in text and bad not in text and repr(bad)[1:-1] not in text
    assert ("NUL" in text) == ("\x00" in bad)


def test_the_problem_names_the_top_level_field_never_an_odd_name() -> None:
    assert field_problem(message(conversation="\x00")) == ("conversation", text_problem("\x00"))
    assert field_problem(message(generation={"model": {"id": "\x00"}})) == ("generation", text_problem("\x00"))
    assert field_problem(message(**{"bad\x1b[2J": "\x00"}))[0] == "(a field name)"  # type: ignore[index]
    assert field_problem(message(**{"3m\x00": 1}))[0] == "(a field name)"  # type: ignore[index]


def test_nul_in_plain_parts_is_content_and_kept() -> None:
    plain = copy.deepcopy(PLAIN)
    plain["parts"][0]["text"] = "a\x00b"
    rec = MessageRecord.from_value(message(content=plain))
    assert rec.content.parts[0].text == "a\x00b"  # type: ignore[union-attr]
    conv = ConversationRecord.from_value({"$type": "chat.gel.assistant.conversation", "instructions": plain,
                                          "createdAt": "2026-01-01T00:00:00.000Z"})
    assert conv.instructions is not None
    with pytest.raises(RecordError):  # but a lone surrogate is nowhere valid
        plain["parts"][0]["text"] = "a\ud800"
        MessageRecord.from_value(message(content=plain))


def test_every_record_model_applies_it() -> None:
    with pytest.raises(RecordError, match="NUL"):
        ConversationRecord.from_value({"$type": "chat.gel.assistant.conversation", "model": {"provider": "p",
                                       "id": "\x00"}, "createdAt": "2026-01-01T00:00:00.000Z"})
    with pytest.raises(RecordError, match="NUL"):
        SettingsRecord.from_value({"$type": "chat.gel.assistant.settings", "tools": ["\x00"]})


def test_a_malformed_message_is_addressed_only_with_a_conversation_gelbridge_can_keep() -> None:
    assert peek_ask(MESSAGE_COLLECTION, "3mk", message(parent="\x00")) is not None  # answered: bad_record
    assert peek_ask(MESSAGE_COLLECTION, "3mk", message(conversation="\ufffe")) is not None
    for bad in BAD:
        assert peek_ask(MESSAGE_COLLECTION, "3mk", message(conversation=bad)) is None  # logged and skipped
