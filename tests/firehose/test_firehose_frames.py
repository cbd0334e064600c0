"""decode_frame on hand-built frames: the cheap filters and the error cases (no socket)."""

from __future__ import annotations

import libipld
import pytest

from gelbridge._errors import FirehoseError
from gelbridge._firehose import StreamMarker, decode_frame, decode_frame_full

MSG = "chat.gel.assistant.message"
ME = "did:plc:me"


def frame(t: str | None, body: object, op: int = 1) -> bytes:
    header: dict[str, object] = {"op": op} if t is None else {"op": op, "t": t}
    return libipld.encode_dag_cbor(header) + libipld.encode_dag_cbor(body)


def commit(repo: str, paths: list[str], blocks: bytes = b"not a CAR file", seq: int = 7) -> bytes:
    ops = [{"action": "create", "path": p, "cid": None} for p in paths]
    return frame("#commit", {"seq": seq, "repo": repo, "ops": ops, "blocks": blocks, "rev": "x", "time": "t"})


def test_other_repos_are_skipped_without_decoding_blocks() -> None:
    # the blocks are garbage: decoding them would raise, so skipping proves they were not read
    assert decode_frame(commit("did:plc:other", [f"{MSG}/k"]), {ME}) == (7, [])


def test_other_collections_are_skipped_without_decoding_blocks() -> None:
    assert decode_frame(commit(ME, ["app.bsky.feed.post/k"]), {ME}) == (7, [])


def test_garbage_blocks_of_a_wanted_op_leave_it_without_a_record_to_read_from_the_pds() -> None:
    """An undecodable CAR (garbage, or a record nested too deep for the CBOR decoder)
    never wedges the stream: the op comes through without its record, which the worker
    then reads from the PDS, as for a tooBig commit."""
    seq, events = decode_frame(commit(ME, [f"{MSG}/k"]), {ME})
    assert seq == 7 and [(e.rkey, e.record) for e in events] == [("k", None)]


def test_delete_needs_no_blocks() -> None:
    f = frame("#commit", {"seq": 9, "repo": ME, "ops": [{"action": "delete", "path": f"{MSG}/k.r0", "cid": None}],
                          "blocks": b"garbage"})
    seq, events = decode_frame(f, {ME})
    assert seq == 9 and [(e.rkey, e.action, e.record, e.cid) for e in events] == [("k.r0", "delete", None, None)]


def test_info_and_sync_frames_become_markers() -> None:
    _, events, marker = decode_frame_full(frame("#info", {"name": "OutdatedCursor", "message": "old"}), {ME})
    assert events == [] and marker == StreamMarker(None, "#info", None, "OutdatedCursor", "old")
    _, _, marker = decode_frame_full(frame("#sync", {"seq": 3, "did": ME, "blocks": b"", "rev": "r"}), {ME})
    assert marker == StreamMarker(3, "#sync", ME)
    assert decode_frame_full(frame("#sync", {"seq": 4, "did": "did:plc:o"}), {ME})[2] is None


def test_error_frames_and_garbage_raise_firehose_error() -> None:
    with pytest.raises(FirehoseError, match="FutureCursor"):
        decode_frame(frame(None, {"error": "FutureCursor", "message": "later"}, op=-1), None)
    for bad in (b"", b"garbage", b"\xa1", libipld.encode_dag_cbor({"op": 1, "t": "#commit"}) + libipld.encode_dag_cbor(5)):
        with pytest.raises(FirehoseError):
            decode_frame(bad, None)


def test_a_malformed_op_cid_counts_as_missing_in_frames_and_sdk_bodies_alike() -> None:
    from types import SimpleNamespace

    from gelbridge._ingest import RecordFilter, from_commit_body

    body = {"seq": 9, "repo": ME, "ops": [{"action": "delete", "path": f"{MSG}/k", "cid": b"\x01junk"}],
            "blocks": b""}
    seq, events = decode_frame(frame("#commit", body), {ME})
    assert seq == 9 and [(e.rkey, e.cid) for e in events] == [("k", None)]
    model = SimpleNamespace(seq=9, repo=ME, blocks=b"", ops=[SimpleNamespace(action="delete", path=f"{MSG}/k",
                                                                           cid="not-a-cid")])
    assert [(r.rkey, r.cid, r.source_cursor) for r in from_commit_body(model, RecordFilter.for_dids([ME]))] == [
        ("k", None, 9)]
