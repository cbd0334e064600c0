"""Firehose decoding against frames from the real local reference PDS."""

from __future__ import annotations

import asyncio
import base64
import secrets
from contextlib import aclosing

import pytest
import websockets

from gelbridge._dev.pds import AccountInfo, DevPds, create_account
from gelbridge._errors import FirehoseError, PdsUnavailable
from gelbridge._firehose import (
    RepoEvent,
    StreamMarker,
    decode_frame,
    subscribe_repos,
    subscribe_url,
)
from gelbridge._pds import PdsClient

pytestmark = [pytest.mark.pds, pytest.mark.timeout(120)]

MSG = "chat.gel.assistant.message"
CIPHERTEXT = b"\x00\xffsealed\x10" * 5


def record(ct: bytes = CIPHERTEXT) -> dict:
    return {
        "$type": MSG,
        "conversation": "3mabcdefghaa2",
        "role": "user",
        "content": {
            "$type": "chat.gel.assistant.defs#encryptedContent",
            "scheme": "xchacha20poly1305-v1",
            "keyId": "k1",
            "nonce": {"$bytes": base64.b64encode(b"\x02" * 24).decode()},
            "ciphertext": {"$bytes": base64.b64encode(ct).decode()},
        },
        "createdAt": "2026-01-01T00:00:00.000Z",
    }


async def collect(
    pds_url: str, did: str, cursor: int | None, n: int, timeout: float = 20.0
) -> list[RepoEvent]:
    """The first ``n`` events for ``did`` (bounded wait)."""
    out: list[RepoEvent] = []

    async def run() -> None:
        async with aclosing(subscribe_repos(pds_url, cursor=cursor, did_filter={did})) as events:
            async for ev in events:
                out.append(ev)
                if len(out) >= n:
                    return

    await asyncio.wait_for(run(), timeout)
    return out


async def test_live_subscription_yields_written_record_with_raw_bytes(
    dev_pds: DevPds, client: PdsClient
) -> None:
    got: asyncio.Queue[RepoEvent] = asyncio.Queue()

    async def consume() -> None:
        async for ev in subscribe_repos(dev_pds.pds_url, cursor=None, did_filter={client.did}):
            await got.put(ev)

    task = asyncio.create_task(consume())
    try:
        # Live mode only sees writes after the socket is open: write until one arrives.
        first: RepoEvent | None = None
        for i in range(40):
            await client.put_record(MSG, f"3mlive{i:07d}", record())
            try:
                first = await asyncio.wait_for(got.get(), 0.5)
                break
            except TimeoutError:
                continue
        assert first is not None, "no firehose event within 20 s"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert first.did == client.did and first.collection == MSG
    assert first.rkey.startswith("3mlive") and first.action == "create"
    assert first.record is not None
    assert first.record["content"]["ciphertext"] == CIPHERTEXT  # raw bytes, not {"$bytes"}
    assert isinstance(first.record["content"]["nonce"], bytes)
    cid, _ = await client.get_record(MSG, first.rkey) or ("", {})
    assert first.cid == cid


async def test_cursor_replays_events_after_it(dev_pds: DevPds, client: PdsClient) -> None:
    keys = ["3mreplay00a02", "3mreplay00b02", "3mreplay00c02.r0"]
    for k in keys:
        await client.put_record(MSG, k, record())
    await client.put_record(MSG, keys[0], record(b"updated"))
    await client.delete_record(MSG, keys[1])

    everything = await collect(dev_pds.pds_url, client.did, cursor=0, n=5)
    assert [(e.rkey, e.action) for e in everything] == [
        (keys[0], "create"), (keys[1], "create"), (keys[2], "create"),
        (keys[0], "update"), (keys[1], "delete"),
    ]
    assert everything[3].record is not None
    assert everything[3].record["content"]["ciphertext"] == b"updated"
    assert everything[4].record is None and everything[4].cid is None
    seqs = [e.seq for e in everything]
    assert seqs == sorted(seqs)

    after_first = await collect(dev_pds.pds_url, client.did, cursor=seqs[0], n=4)
    assert [e.seq for e in after_first] == seqs[1:]


async def test_decode_frame_filters_repos_and_collections(
    dev_pds: DevPds, client: PdsClient, pds_account: AccountInfo
) -> None:
    other_info = create_account(dev_pds.pds_url, f"o{secrets.token_hex(5)}.test", "pw-" + secrets.token_hex(6))
    async with PdsClient(dev_pds.pds_url) as other:
        await other.login(other_info.handle, other_info.app_password)
        await other.put_record("app.example.unrelated", "3motherrepo02", {"$type": "app.example.unrelated", "x": 1})
        await other.put_record(MSG, "3motherrepo02", record())
    await client.put_record("app.example.unrelated", "3mmine0000002", {"$type": "app.example.unrelated", "x": 1})
    await client.put_record(MSG, "3mmine0000002", record())  # last: the reader stops here

    # Raw frames straight from the PDS websocket (whole backfill window).
    frames: list[bytes] = []
    async with websockets.connect(subscribe_url(dev_pds.pds_url, 0), open_timeout=10) as ws:
        seen_mine = seen_other = False
        async with asyncio.timeout(20):
            while not (seen_mine and seen_other):
                frame = await ws.recv()
                assert isinstance(frame, bytes)
                frames.append(frame)
                _, evs = decode_frame(frame, None)
                seen_mine |= any(e.did == client.did and e.rkey == "3mmine0000002" for e in evs)
                seen_other |= any(e.did == other_info.did and e.rkey == "3motherrepo02" for e in evs)

    def events(did_filter: set[str] | None, prefix: str = "chat.gel.assistant.") -> list[RepoEvent]:
        return [e for f in frames for e in decode_frame(f, did_filter, prefix)[1]]

    mine = events({client.did})
    assert [(e.did, e.rkey) for e in mine] == [(client.did, "3mmine0000002")]
    assert {e.did for e in events({other_info.did})} == {other_info.did}
    # The session's PDS replays every earlier test's writes too (cursor 0): any of our
    # collections may appear, never another one.
    assert all(e.collection.startswith("chat.gel.assistant.") for e in events(None))
    assert len(events(None)) >= 2
    unrelated = events({client.did}, prefix="app.example.")
    assert [(e.collection, e.rkey) for e in unrelated] == [("app.example.unrelated", "3mmine0000002")]
    assert all(decode_frame(f, {"did:plc:nobody"})[1] == [] for f in frames)
    # every frame reports its seq, also the skipped ones (so a caller can advance its cursor)
    assert all(decode_frame(f, {"did:plc:nobody"})[0] is not None for f in frames)


async def test_markers_report_account_frames_of_filtered_repos(
    dev_pds: DevPds, pds_account: AccountInfo
) -> None:
    kinds: list[str] = []

    async def run() -> None:
        stream = subscribe_repos(dev_pds.pds_url, cursor=0, did_filter={pds_account.did}, markers=True)
        async with aclosing(stream) as items:
            async for item in items:
                assert isinstance(item, StreamMarker)
                assert (item.kind == "#open") == (not kinds)  # #open first, and only first
                assert item.kind == "#open" or item.did == pds_account.did
                kinds.append(item.kind)
                if "#sync" in kinds or len(kinds) >= 4:
                    return

    await asyncio.wait_for(run(), 20)
    assert "#identity" in kinds and "#account" in kinds


async def test_future_cursor_is_a_firehose_error(dev_pds: DevPds) -> None:
    with pytest.raises(FirehoseError, match="FutureCursor"):
        await collect(dev_pds.pds_url, "did:plc:x", cursor=10**12, n=1, timeout=15)


async def test_closed_port_is_pds_unavailable() -> None:
    from gelbridge._dev.pds import free_port

    with pytest.raises(PdsUnavailable):
        await collect(f"http://127.0.0.1:{free_port()}", "did:plc:x", cursor=None, n=1, timeout=15)
