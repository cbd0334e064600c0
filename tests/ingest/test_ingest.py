"""gelbridge._ingest: every input form gives the same IncomingRecords as the worker's
firehose decoder, and what is not ours is dropped before any block decoding."""

from __future__ import annotations

import json

import libipld
import pytest
from atproto_client.models.com.atproto.sync.subscribe_repos import Commit
from atproto_firehose import parse_subscribe_repos_message
from atproto_subscription.frames import Frame, MessageFrame

from gelbridge._errors import FirehoseError, RecordError
from gelbridge._firehose import decode_frame_full
from gelbridge._ingest import (
    COMMIT_HEADER,
    IncomingRecord,
    RecordFilter,
    from_firehose,
    from_firehose_frame,
    from_jetstream_event,
    from_record,
)
from gelbridge._records import MessageRecord
from testkit.frames import MSG, commit_frame, jetstream_event, jetstream_text, message_record, other_frame

ME = "did:plc:me"
OTHER = "did:plc:other"
FLT = RecordFilter.for_dids([ME])


def worker_view(frame: bytes, flt: RecordFilter = FLT) -> list[IncomingRecord]:
    """What the worker's firehose source (subscribe_repos → decode_frame_full) yields."""
    _seq, events, _ = decode_frame_full(frame, flt.dids, flt.prefix)
    return [IncomingRecord.from_repo_event(e) for e in events]


def mixed_frame() -> bytes:
    return commit_frame(41, ME, [
        ("create", f"{MSG}/3mkaaaaaaaaa2", message_record()),
        ("update", f"{MSG}/3mkbbbbbbbbb2", message_record(attempt=1)),
        ("delete", f"{MSG}/3mkccccccccc2.r0", None),
        ("create", "app.bsky.feed.post/3mkdddddddd2", {"$type": "app.bsky.feed.post", "text": "hi", "createdAt": "x"}),
        ("create", "chat.gel.assistant.conversation/3mkeeeeeeee2", {"createdAt": "x"}),
    ])


def test_frame_bytes_sdk_message_and_commit_model_agree_with_the_worker_decoder() -> None:
    frame = mixed_frame()
    expected = worker_view(frame)
    assert [(r.collection, r.rkey, r.action, r.source_cursor) for r in expected] == [
        (MSG, "3mkaaaaaaaaa2", "create", 41),
        (MSG, "3mkbbbbbbbbb2", "update", 41),
        (MSG, "3mkccccccccc2.r0", "delete", 41),
        ("chat.gel.assistant.conversation", "3mkeeeeeeee2", "create", 41),
    ]
    assert expected[0].record is not None and expected[0].record["role"] == "user"
    assert expected[2].record is None and expected[2].cid is None and expected[2].deleted
    message = Frame.from_bytes(frame)
    assert isinstance(message, MessageFrame)  # what FirehoseSubscribeReposClient passes to on_message
    model = parse_subscribe_repos_message(message)
    assert isinstance(model, Commit)
    assert from_firehose_frame(frame, FLT) == expected
    assert from_firehose(frame, FLT) == expected
    assert from_firehose(bytearray(frame), FLT) == expected
    assert from_firehose(message, FLT) == expected
    assert from_firehose(model, FLT) == expected


def test_commits_of_other_repos_are_dropped_without_decoding_blocks() -> None:
    # garbage blocks: any attempt to decode them raises, so an empty result proves they were not read
    theirs = commit_frame(5, OTHER, [("create", f"{MSG}/3mkaaaaaaaaa2", message_record())], garbage_blocks=True)
    assert from_firehose(theirs, FLT) == []
    assert from_firehose(Frame.from_bytes(theirs), FLT) == []
    not_our_collection = commit_frame(6, ME, [("create", "app.bsky.feed.like/3mk", {"a": 1})], garbage_blocks=True)
    assert from_firehose(not_our_collection, FLT) == []
    assert from_firehose(Frame.from_bytes(not_our_collection), FLT) == []
    ours = commit_frame(7, ME, [("create", f"{MSG}/3mkaaaaaaaaa2", message_record())], garbage_blocks=True)
    for got in (from_firehose(ours, FLT), from_firehose(Frame.from_bytes(ours), FLT)):  # read from the PDS later
        assert [(r.rkey, r.record) for r in got] == [("3mkaaaaaaaaa2", None)]


def test_a_commit_frame_without_our_prefix_is_not_decoded_at_all() -> None:
    # a commit header followed by bytes that are not CBOR: decoding would raise
    assert from_firehose_frame(COMMIT_HEADER + b"\xff\xfe garbage app.bsky.feed.post", FLT) == []
    with pytest.raises(FirehoseError):
        from_firehose_frame(COMMIT_HEADER + b"\xff\xfe garbage chat.gel.assistant.message", FLT)


def test_deletes_pass_without_blocks_and_other_frame_types_yield_nothing() -> None:
    delete = commit_frame(8, ME, [("delete", f"{MSG}/3mkaaaaaaaaa2", None)], garbage_blocks=True)
    assert from_firehose(delete, FLT) == [IncomingRecord(ME, MSG, "3mkaaaaaaaaa2", None, None, 8, "delete")]
    for t, body in [("#identity", {"seq": 9, "did": ME, "time": "t"}),
                    ("#account", {"seq": 10, "did": ME, "active": True, "time": "t"}),
                    ("#info", {"name": "OutdatedCursor"})]:
        assert from_firehose(other_frame(t, body), FLT) == []
        assert from_firehose(Frame.from_bytes(other_frame(t, body)), FLT) == []
    assert from_firehose(object(), FLT) == []


def test_error_frames_raise_for_bytes_and_sdk_frames() -> None:
    err = libipld.encode_dag_cbor({"op": -1}) + libipld.encode_dag_cbor({"error": "FutureCursor", "message": "m"})
    with pytest.raises(FirehoseError, match="FutureCursor"):
        from_firehose(err, FLT)
    with pytest.raises(FirehoseError, match="FutureCursor"):
        from_firehose(Frame.from_bytes(err), FLT)


def test_no_did_filter_passes_every_repo_but_still_only_our_collections() -> None:
    theirs = commit_frame(5, OTHER, [("create", f"{MSG}/k", message_record()), ("create", "app.bsky.feed.post/p", {})])
    got = from_firehose(theirs, RecordFilter(None))
    assert [(r.did, r.collection) for r in got] == [(OTHER, MSG)]


# --- Jetstream -------------------------------------------------------------------------------


def test_jetstream_events_match_the_firehose_records() -> None:
    frame = mixed_frame()
    fire = [r for r in worker_view(frame) if r.collection == MSG]
    for r in fire:
        ev = jetstream_event(ME, 1_725_911_162_329_308, r.action, r.collection, r.rkey, r.record, r.cid)
        for form in (ev, json.dumps(ev), json.dumps(ev).encode()):
            [got] = from_jetstream_event(form, FLT)
            assert (got.did, got.collection, got.rkey, got.cid, got.action) == (r.did, r.collection, r.rkey, r.cid, r.action)
            assert got.source_cursor == 1_725_911_162_329_308
            if r.record is None:
                assert got.record is None
            else:  # JSON form ($bytes) vs CBOR form (raw bytes): the same record
                assert MessageRecord.from_value(got.record) == MessageRecord.from_value(r.record)


def test_jetstream_drops_other_dids_collections_and_kinds() -> None:
    assert from_jetstream_event(jetstream_event(OTHER, 1, "create", MSG, "k", message_record(), "bafy"), FLT) == []
    assert from_jetstream_event(jetstream_text(ME, 1, "create", "app.bsky.feed.post", "k", {"text": "x"}, "bafy"), FLT) == []
    ident = {"did": ME, "time_us": 2, "kind": "identity", "identity": {"did": ME, "handle": "me.test"}}
    assert from_jetstream_event(ident, FLT) == []
    assert from_jetstream_event(json.dumps(ident), FLT) == []
    bad_op = jetstream_event(ME, 3, "create", MSG, "k", message_record(), "bafy")
    bad_op["commit"]["operation"] = "frobnicate"
    assert from_jetstream_event(bad_op, FLT) == []


def test_jetstream_text_without_our_prefix_is_never_parsed() -> None:
    assert from_jetstream_event('{"not json at all, app.bsky.feed.post', FLT) == []
    with pytest.raises(RecordError):
        from_jetstream_event('{"not json at all, chat.gel.assistant.message', FLT)
    with pytest.raises(RecordError):
        from_jetstream_event('["chat.gel.assistant.message"]', FLT)


def test_jetstream_v2_commit_bodies_use_seq_as_cursor() -> None:
    body = {"did": ME, "seq": 77, "collection": MSG, "rkey": "k", "operation": "create", "cid": "bafyx000",
            "record": {"role": "user"}, "rev": "r", "time": "t"}
    assert from_jetstream_event(body, FLT) == [IncomingRecord(ME, MSG, "k", "bafyx000", {"role": "user"}, 77, "create")]
    v2_frame = libipld.encode_dag_cbor({"op": 1, "t": "#commit"}) + libipld.encode_dag_cbor(body)
    assert from_jetstream_event(Frame.from_bytes(v2_frame), FLT)[0].source_cursor == 77


# --- tuples ----------------------------------------------------------------------------------


def test_plain_records_none_is_a_delete_and_foreign_ones_are_dropped() -> None:
    rec = {"role": "user"}
    assert from_record(ME, MSG, "k", "bafyx000", rec, FLT) == [IncomingRecord(ME, MSG, "k", "bafyx000", rec, None, "create")]
    assert from_record(ME, MSG, "k", None, None, FLT) == [IncomingRecord(ME, MSG, "k", None, None, None, "delete")]
    assert from_record(ME, MSG, "k", None, None, FLT, action="update")[0].action == "update"
    assert from_record(OTHER, MSG, "k", "bafyx000", rec, FLT) == []
    assert from_record(ME, "app.bsky.feed.post", "k", "bafyx000", rec, FLT) == []
    assert from_record(ME, MSG, "", "bafyx000", rec, FLT) == []
    with pytest.raises(ValueError):
        from_record(ME, MSG, "k", None, rec, FLT, action="frob")  # type: ignore[arg-type]
