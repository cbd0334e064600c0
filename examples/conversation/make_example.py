"""Regenerate the example conversation: ``python examples/conversation/make_example.py``.

Writes ``records.json`` (listRecords shape) next to this file, sealed with the
throwaway key in ``keyring.json`` (created on first run, reused after). The record
keys and timestamps are fixed; only nonces change from run to run.
Open it with: ``gelbridge open --keyring examples/conversation/keyring.json
examples/conversation/records.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from gelbridge._records import (
    CONVERSATION_COLLECTION,
    MESSAGE_COLLECTION,
    AtUri,
    ConversationRecord,
    GenerationRequest,
    MessageRecord,
    ModelRef,
    PlainContent,
    ReasoningPart,
    TextPart,
    Usage,
    reply_rkey,
    tid_from_parts,
)
from gelbridge._sealing import Keyring, seal_content

HERE = Path(__file__).resolve().parent
DID = "did:plc:examplegelbridgedemo2345"
KEY_ID = "example-key-1"
T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds


def main() -> None:
    ring_path = HERE / "keyring.json"
    if ring_path.exists():
        ring = Keyring.load(ring_path)
    else:
        ring = Keyring()
        ring.add_new(KEY_ID)
        ring.save(ring_path)

    conv_key = tid_from_parts(T0, 7)
    first_key = tid_from_parts(T0 + 1_000_000, 7)
    reply_key = reply_rkey(first_key, 0)
    second_key = tid_from_parts(T0 + 60_000_000, 7)
    model = ModelRef(provider="openai", id="gpt-4o-mini")

    def uri(collection: str, rkey: str) -> AtUri:
        return AtUri(DID, collection, rkey)

    def seal(u: AtUri, *parts: object) -> object:
        return seal_content(PlainContent(parts=list(parts)), uri=u, key_id=KEY_ID, keyring=ring)

    records: list[tuple[AtUri, object]] = []

    u = uri(CONVERSATION_COLLECTION, conv_key)
    records.append((u, ConversationRecord(
        created_at="2026-01-01T00:00:00.000Z",
        instructions=seal(u, TextPart(text="You are a concise assistant. Answer in plain English.")),
        model=model,
    )))

    u = uri(MESSAGE_COLLECTION, first_key)
    records.append((u, MessageRecord(
        conversation=conv_key,
        role="user",
        content=seal(u, TextPart(text="What is the capital of Australia?")),
        generation=GenerationRequest(attempt=0),
        created_at="2026-01-01T00:00:01.000Z",
    )))

    u = uri(MESSAGE_COLLECTION, reply_key)
    records.append((u, MessageRecord(
        conversation=conv_key,
        role="assistant",
        parent=first_key,
        content=seal(
            u,
            ReasoningPart(text="The user asks for Australia's capital. It is Canberra, not Sydney."),
            TextPart(text="Canberra."),
        ),
        model=model,
        usage=Usage(input_tokens=31, output_tokens=24, reasoning_tokens=17),
        status="complete",
        finish_reason="stop",
        created_at="2026-01-01T00:00:02.000Z",
        updated_at="2026-01-01T00:00:04.000Z",
    )))

    u = uri(MESSAGE_COLLECTION, second_key)
    records.append((u, MessageRecord(
        conversation=conv_key,
        role="user",
        parent=reply_key,
        content=seal(u, TextPart(text="And roughly how many people live there?")),
        generation=GenerationRequest(attempt=0, effort="low"),
        created_at="2026-01-01T00:01:00.000Z",
    )))

    doc = {"records": [{"uri": str(u), "value": r.to_value()} for u, r in records]}  # type: ignore[attr-defined]
    (HERE / "records.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {HERE / 'records.json'} ({len(records)} records, key {KEY_ID!r})")


if __name__ == "__main__":
    main()
