"""Real firehose frames and Jetstream events for ingest tests, built in memory.

A commit frame is the DAG-CBOR header ``{op: 1, t: "#commit"}`` followed by the DAG-CBOR
body, whose ``blocks`` is a CARv1 holding the commit block and the record blocks, as a
PDS sends it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import libipld

from gelbridge._records.codec import to_json_form
from gelbridge._records.io import block_cid, encode_car

MSG = "chat.gel.assistant.message"
TIME = "2026-11-30T11:00:00.000Z"


def message_record(conversation: str = "3mconvaaaaaa2", attempt: int | None = 0) -> dict[str, Any]:
    """A user message with sealed content (random bytes: the filter never opens it)."""
    rec: dict[str, Any] = {
        "$type": MSG,
        "conversation": conversation,
        "role": "user",
        "content": {
            "$type": "chat.gel.assistant.defs#encryptedContent",
            "scheme": "xchacha20poly1305-v1",
            "keyId": "k1",
            "nonce": os.urandom(24),
            "ciphertext": os.urandom(64),
        },
        "createdAt": TIME,
    }
    if attempt is not None:
        rec["generation"] = {"attempt": attempt}
    return rec


def commit_frame(
    seq: int,
    repo: str,
    ops: list[tuple[str, str, dict[str, Any] | None]],
    *,
    garbage_blocks: bool = False,
) -> bytes:
    """``ops``: ``(action, path, record)``; deletes carry None."""
    blocks: list[bytes] = []
    body_ops = []
    for action, path, record in ops:
        cid = None
        if record is not None:
            block = libipld.encode_dag_cbor(record)
            blocks.append(block)
            cid = block_cid(block)
        body_ops.append({"action": action, "path": path, "cid": cid, **({"prev": None} if action != "create" else {})})
    commit_block = libipld.encode_dag_cbor(
        {"did": repo, "version": 3, "rev": "3mabcdefghij2", "prev": None, "sig": os.urandom(64),
         "data": block_cid(b"mst")}
    )
    commit_cid = block_cid(commit_block)
    car = b"\xffnot a CAR file at all" if garbage_blocks else encode_car(commit_cid, [commit_block, *blocks])
    body = {
        "seq": seq, "repo": repo, "rev": "3mabcdefghij2", "since": None, "commit": commit_cid,
        "ops": body_ops, "blocks": car, "blobs": [], "rebase": False, "tooBig": False, "time": TIME,
    }
    return libipld.encode_dag_cbor({"op": 1, "t": "#commit"}) + libipld.encode_dag_cbor(body)


def other_frame(t: str, body: dict[str, Any]) -> bytes:
    return libipld.encode_dag_cbor({"op": 1, "t": t}) + libipld.encode_dag_cbor(body)


def jetstream_event(
    did: str, time_us: int, operation: str, collection: str, rkey: str,
    record: dict[str, Any] | None = None, cid: str | None = None,
) -> dict[str, Any]:
    """A Jetstream v1 commit event (records in atproto JSON form, as Jetstream sends them)."""
    commit: dict[str, Any] = {"rev": "3mabcdefghij2", "operation": operation, "collection": collection, "rkey": rkey}
    if operation != "delete":
        commit["record"] = to_json_form(record)
        commit["cid"] = cid
    return {"did": did, "time_us": time_us, "kind": "commit", "commit": commit}


def jetstream_text(*args: Any, **kw: Any) -> str:
    return json.dumps(jetstream_event(*args, **kw), separators=(",", ":"))
