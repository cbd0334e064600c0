"""Record models: both wire forms, round trips, clear errors, size limit."""

from __future__ import annotations

import base64

import libipld
import pytest

from gelbridge._errors import RecordError
from gelbridge._records import (
    MAX_RECORD_BYTES,
    BlobRef,
    ConversationRecord,
    EncryptedContent,
    FilePart,
    GenerationRequest,
    ImagePart,
    MessageRecord,
    PlainContent,
    SettingsRecord,
    TextPart,
    ToolCallPart,
    UnknownPart,
    parse_record,
)

CID = "bafyreihltcnuuyqp2jm24aqydpnlj7b6w3ogwrplomrjtg5rifv44mmjey"
NONCE = bytes(range(24))
CT = b"\x00\xff" * 40


def sealed_message_json() -> dict:
    return {
        "$type": "chat.gel.assistant.message",
        "conversation": "3mabcdefghij2",
        "role": "user",
        "content": {
            "$type": "chat.gel.assistant.defs#encryptedContent",
            "scheme": "xchacha20poly1305-v1",
            "keyId": "k1",
            "nonce": {"$bytes": base64.b64encode(NONCE).decode()},
            "ciphertext": {"$bytes": base64.b64encode(CT).decode().rstrip("=")},
            "blobs": [{"$type": "blob", "ref": {"$link": CID}, "mimeType": "application/octet-stream", "size": 10}],
        },
        "generation": {"attempt": 2, "model": {"provider": "openai", "id": "gpt-4o"}, "tools": ["web_search"]},
        "createdAt": "2026-01-01T00:00:00.000Z",
    }


def plain_message_json() -> dict:
    return {
        "$type": "chat.gel.assistant.message",
        "conversation": "c",
        "role": "assistant",
        "parent": "3mabcdefghij2",
        "content": {
            "$type": "chat.gel.assistant.defs#plainContent",
            "parts": [
                {"$type": "chat.gel.assistant.defs#reasoningPart", "text": "hmm", "providerData": "{}"},
                {"$type": "chat.gel.assistant.defs#textPart", "text": "héllo 👍🏽"},
                {
                    "$type": "chat.gel.assistant.defs#imagePart",
                    "image": {"$type": "blob", "ref": {"$link": CID}, "mimeType": "image/png", "size": 3},
                    "alt": "a dot",
                },
                {"$type": "chat.gel.assistant.defs#toolCallPart", "callId": "c1", "tool": "t", "input": "{}", "approval": "pending"},
                {"$type": "com.example.future#part", "x": 1},
            ],
        },
        "model": {"provider": "cocore", "id": "m"},
        "effort": "high",
        "usage": {"inputTokens": 1, "outputTokens": 2, "reasoningTokens": 0},
        "status": "complete",
        "finishReason": "stop",
        "createdAt": "2026-01-01T00:00:00Z",
        "updatedAt": "2026-01-01T00:00:03.5+01:00",
    }


def to_cbor_form(value: dict) -> dict:
    """What a firehose/CAR consumer sees: bytes and CID links as raw bytes."""

    def conv(v):  # JSON form → python values libipld encodes as bytes / links
        if isinstance(v, dict):
            if set(v) == {"$bytes"}:
                return base64.b64decode(v["$bytes"] + "==")
            if set(v) == {"$link"}:
                return libipld.decode_cid(v["$link"]) and _cid_bytes(v["$link"])
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v

    return libipld.decode_dag_cbor(libipld.encode_dag_cbor(conv(value)))


def _cid_bytes(s: str) -> bytes:
    from atproto_core.cid import CID as _CID

    c = _CID.decode(s)
    return bytes([c.version, c.codec, c.hash.code, c.hash.size]) + c.hash.digest


@pytest.mark.parametrize("make", [sealed_message_json, plain_message_json])
def test_json_and_cbor_forms_parse_to_equal_models(make) -> None:
    value = make()
    cbor_value = to_cbor_form(value)
    assert cbor_value != value  # really the other form
    a = MessageRecord.from_value(value)
    b = MessageRecord.from_value(cbor_value)
    assert a == b
    assert a.to_value() == b.to_value()


def test_sealed_message_fields() -> None:
    m = MessageRecord.from_value(sealed_message_json())
    assert m.is_sealed and isinstance(m.content, EncryptedContent)
    assert m.content.nonce == NONCE and m.content.ciphertext == CT and m.content.key_id == "k1"
    assert m.content.blobs == [BlobRef.of(CID, "application/octet-stream", 10)]
    assert m.generation == GenerationRequest.from_value({"attempt": 2, "model": {"provider": "openai", "id": "gpt-4o"}, "tools": ["web_search"]})
    assert m.created_at == "2026-01-01T00:00:00.000Z"


@pytest.mark.parametrize("make", [sealed_message_json, plain_message_json])
def test_to_value_round_trips(make) -> None:
    value = make()
    m = MessageRecord.from_value(value)
    out = m.to_value()
    assert MessageRecord.from_value(out) == m
    # written form: $bytes unpadded standard base64, blobs with $type/ref.$link, nothing None
    if m.is_sealed:
        assert out["content"]["nonce"] == {"$bytes": base64.b64encode(NONCE).decode().rstrip("=")}
        assert out["content"]["blobs"][0] == {"$type": "blob", "ref": {"$link": CID}, "mimeType": "application/octet-stream", "size": 10}
    assert "parent" in out or value.get("parent") is None
    assert "error" not in out and None not in out.values()


def test_plain_parts_are_typed_and_unknown_parts_kept() -> None:
    m = MessageRecord.from_value(plain_message_json())
    parts = m.content.parts
    assert [type(p).__name__ for p in parts] == ["ReasoningPart", "TextPart", "ImagePart", "ToolCallPart", "UnknownPart"]
    assert parts[2].image.ref == CID and parts[3].approval == "pending"
    assert isinstance(parts[4], UnknownPart) and parts[4].type == "com.example.future#part"
    assert m.to_value()["content"]["parts"][4] == {"$type": "com.example.future#part", "x": 1}


def test_defaults_and_construction_in_code() -> None:
    g = GenerationRequest()
    assert g.attempt == 0 and g.to_value() == {"attempt": 0}
    pc = PlainContent(parts=[TextPart(text="hi"), FilePart(file=BlobRef.of(CID, "application/pdf", 9))])
    v = pc.to_value()
    assert v["$type"] == "chat.gel.assistant.defs#plainContent"
    assert [p["$type"] for p in v["parts"]] == ["chat.gel.assistant.defs#textPart", "chat.gel.assistant.defs#filePart"]
    assert PlainContent.from_value(v) == pc


def test_unmodelled_fields_are_kept_in_json_form() -> None:
    value = sealed_message_json()
    value["futureField"] = {"nested": b"\x01\x02"}
    m = MessageRecord.from_value(value)
    assert m.to_value()["futureField"] == {"nested": {"$bytes": "AQI"}}


def test_snake_case_names_are_not_wire_names() -> None:
    value = sealed_message_json()
    del value["createdAt"]
    value["created_at"] = "2026-01-01T00:00:00Z"
    with pytest.raises(RecordError, match="createdAt"):
        MessageRecord.from_value(value)


def test_errors_name_the_record_and_field_without_content() -> None:
    value = plain_message_json()
    secret = "top secret text " * 40000  # > 500000 bytes
    value["content"]["parts"][1]["text"] = secret
    uri = "at://did:plc:abc/chat.gel.assistant.message/3mabcdefghij2.r0"
    with pytest.raises(RecordError) as ei:
        MessageRecord.from_value(value, uri=uri)
    msg = str(ei.value)
    assert uri in msg and "content.parts[1].text" in msg and "500000 UTF-8 bytes" in msg
    assert "secret" not in msg


@pytest.mark.parametrize(
    "mutate,fragment",
    [
        (lambda v: v.pop("content"), "content"),
        (lambda v: v.update(content={"$type": "com.example.other", "x": 1}), "content"),
        (lambda v: v["content"].pop("$type"), "content"),
        (lambda v: v["content"].update(nonce={"$bytes": "not base64!"}), "content.nonce"),
        (lambda v: v["content"].update(nonce="AAAA"), "content.nonce"),
        (lambda v: v["content"]["blobs"][0].update(ref={"$link": "nope"}), "content.blobs[0].ref"),
        (lambda v: v["generation"].update(attempt=1001), "generation.attempt"),
        (lambda v: v["generation"].update(attempt="1"), "generation.attempt"),
        (lambda v: v.update(createdAt="2026-01-01"), "createdAt"),
        (lambda v: v.update(conversation="c" * 513), "conversation"),
        (lambda v: v.update({"$type": "app.bsky.feed.post"}), "$type"),
    ],
)
def test_bad_input_raises_record_error_naming_the_field(mutate, fragment) -> None:
    value = sealed_message_json()
    mutate(value)
    with pytest.raises(RecordError, match=f"(?i){__import__('re').escape(fragment)}"):
        MessageRecord.from_value(value)


@pytest.mark.parametrize("bad", [None, [], "x", 3])
def test_non_objects_are_rejected(bad) -> None:
    with pytest.raises(RecordError, match="expected an object"):
        MessageRecord.from_value(bad)


def test_oversized_records_are_rejected_with_a_clear_error() -> None:
    value = plain_message_json()
    value["content"]["parts"] = [{"$type": "chat.gel.assistant.defs#textPart", "text": "x" * 400_000}] * 3
    with pytest.raises(RecordError, match="too large.*limit 1048576"):
        MessageRecord.from_value(value)
    value["content"]["parts"] = value["content"]["parts"][:2]
    assert MessageRecord.from_value(value)  # 800 KB is fine
    assert MAX_RECORD_BYTES == 1024 * 1024


def test_grapheme_and_byte_limits_use_atproto_units() -> None:
    flag = "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"  # one grapheme, 28 bytes
    ok = ImagePart.from_value({"image": {"$type": "blob", "ref": {"$link": CID}, "mimeType": "image/png", "size": 1}, "alt": flag * 357})
    assert ok.alt == flag * 357  # 357 graphemes, 9996 bytes
    with pytest.raises(RecordError, match="10000 UTF-8 bytes"):
        ImagePart.from_value({"image": {"$type": "blob", "ref": {"$link": CID}, "mimeType": "image/png", "size": 1}, "alt": flag * 358})


def test_parse_record_dispatches_on_collection() -> None:
    assert isinstance(parse_record("chat.gel.assistant.settings", {"$type": "chat.gel.assistant.settings", "tools": ["a"]}), SettingsRecord)
    assert isinstance(parse_record("chat.gel.assistant.conversation", {"createdAt": "2026-01-01T00:00:00Z"}), ConversationRecord)
    with pytest.raises(RecordError, match="not a chat.gel.assistant record"):
        parse_record("app.bsky.feed.post", {})


def test_tool_call_part_requires_its_fields() -> None:
    with pytest.raises(RecordError, match="input"):
        ToolCallPart.from_value({"$type": "chat.gel.assistant.defs#toolCallPart", "callId": "c", "tool": "t"})
