"""Reading record files: listRecords JSON, bare arrays, and repo CAR exports."""

from __future__ import annotations

import json
from pathlib import Path

import libipld
import pytest

from gelbridge._errors import RecordError
from gelbridge._records import MessageRecord, SettingsRecord, parse_record
from gelbridge._records.codec import cid_str, to_json_form
from gelbridge._records.io import block_cid, encode_car, load_records

DID = "did:plc:abc123"
NONCE = bytes(range(24))


def record(i: int) -> dict:
    return {
        "$type": "chat.gel.assistant.message",
        "conversation": "3mconvconvcv2",
        "role": "user",
        "content": {
            "$type": "chat.gel.assistant.defs#encryptedContent",
            "scheme": "xchacha20poly1305-v1",
            "keyId": "k1",
            "nonce": NONCE,
            "ciphertext": bytes([i]) * 40,
        },
        "createdAt": f"2026-01-01T00:00:0{i}.000Z",
    }


def build_repo_car(recs: dict[str, dict]) -> bytes:
    """A getRepo-shaped CAR: commit → 3-node MST (left subtree, root, right subtree)."""
    blocks: list[bytes] = []
    leaf: dict[str, bytes] = {}
    for key, value in recs.items():
        enc = libipld.encode_dag_cbor(value)
        blocks.append(enc)
        leaf[key] = block_cid(enc)
    keys = sorted(recs)
    assert len(keys) == 4

    def node(left: bytes | None, entries: list[tuple[str, bytes | None]]) -> bytes:
        out, prev = [], b""
        for key, right in entries:
            kb = key.encode()
            p = 0
            while p < min(len(prev), len(kb)) and prev[p] == kb[p]:
                p += 1
            out.append({"p": p, "k": kb[p:], "v": leaf[key], "t": right})
            prev = kb
        enc = libipld.encode_dag_cbor({"l": left, "e": out})
        blocks.append(enc)
        return block_cid(enc)

    left = node(None, [(keys[0], None), (keys[1], None)])
    right = node(None, [(keys[3], None)])
    root = node(left, [(keys[2], right)])
    commit = libipld.encode_dag_cbor({"did": DID, "version": 3, "data": root, "rev": "3mabcdefghij2", "prev": None, "sig": b"\x01" * 64})
    blocks.append(commit)
    return encode_car(block_cid(commit), blocks)


RECS = {
    "chat.gel.assistant.message/3mabcdefghij2": record(1),
    "chat.gel.assistant.message/3mabcdefghij2.r0": record(2),
    "chat.gel.assistant.message/3mabcdefghik2": record(3),
    "chat.gel.assistant.settings/self": {"$type": "chat.gel.assistant.settings", "tools": ["web_search"]},
}


def test_car_export_yields_every_record_with_uri_and_cid(tmp_path: Path) -> None:
    path = tmp_path / "repo.car"
    path.write_bytes(build_repo_car(RECS))
    entries = load_records(path)
    assert [f"{e.uri.collection}/{e.uri.rkey}" for e in entries] == sorted(RECS)
    assert all(e.uri.did == DID for e in entries)
    for e in entries:
        assert e.cid == cid_str(block_cid(libipld.encode_dag_cbor(RECS[f"{e.uri.collection}/{e.uri.rkey}"])))
    msgs = [parse_record(e.uri.collection, e.value, uri=str(e.uri)) for e in entries]
    assert isinstance(msgs[0], MessageRecord) and msgs[0].content.nonce == NONCE
    assert isinstance(msgs[3], SettingsRecord) and msgs[3].tools == ["web_search"]


def test_car_and_list_records_json_give_equal_models(tmp_path: Path) -> None:
    car = tmp_path / "repo.car"
    car.write_bytes(build_repo_car(RECS))
    listing = {"records": [{"uri": f"at://{DID}/{k}", "cid": "bafyx", "value": to_json_form(v)} for k, v in RECS.items()]}
    js = tmp_path / "records.json"
    js.write_text(json.dumps(listing))
    arr = tmp_path / "array.json"
    arr.write_text(json.dumps(listing["records"]))
    a, b, c = load_records(car), load_records(js), load_records(arr)
    assert [str(e.uri) for e in a] == [str(e.uri) for e in b] == [str(e.uri) for e in c]
    for x, y in zip(a, b):
        assert parse_record(x.uri.collection, x.value) == parse_record(y.uri.collection, y.value)


def test_example_conversation_loads() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "conversation" / "records.json"
    entries = load_records(path)
    assert len(entries) == 4
    assert all(e.uri.did.startswith("did:plc:example") for e in entries)


@pytest.mark.parametrize(
    "content,match",
    [
        (b'{"foo": 1}', "listRecords"),
        (b'{"records": [{"uri": "nope", "value": {}}]}', "entry 0.*AT-URI"),
        (b'{"records": [{"uri": "at://did:plc:a/b.c.d/k"}]}', 'entry 0 needs "uri" and an object "value"'),
        (b"[1, 2]", "entry 0"),
        (b"{not json", "not valid JSON"),
        (b"\x00\x01garbage", "neither JSON .* nor a CAR"),
    ],
)
def test_bad_record_files_give_clear_errors(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "f"
    p.write_bytes(content)
    with pytest.raises(RecordError, match=match):
        load_records(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="does not exist"):
        load_records(tmp_path / "nope.json")


def test_car_without_record_blocks_is_rejected(tmp_path: Path) -> None:
    car = build_repo_car(RECS)
    # drop one record block, keep the commit and the MST
    from atproto_core.car import CAR

    parsed = CAR.from_bytes(car)
    missing = block_cid(libipld.encode_dag_cbor(RECS["chat.gel.assistant.message/3mabcdefghij2"]))
    blocks = [libipld.encode_dag_cbor(b) for c, b in parsed.blocks.items() if str(c) != cid_str(missing)]
    p = tmp_path / "partial.car"
    p.write_bytes(encode_car(_root_bytes(parsed), blocks))
    with pytest.raises(RecordError, match="missing: not a full repo export"):
        load_records(p)


def test_car_whose_root_is_not_a_commit(tmp_path: Path) -> None:
    block = libipld.encode_dag_cbor({"hello": "world"})
    p = tmp_path / "x.car"
    p.write_bytes(encode_car(block_cid(block), [block]))
    with pytest.raises(RecordError, match="not a repo commit"):
        load_records(p)


def _root_bytes(parsed) -> bytes:
    from atproto_core.cid import CID

    c = CID.decode(str(parsed.root))
    return bytes([c.version, c.codec, c.hash.code, c.hash.size]) + c.hash.digest
