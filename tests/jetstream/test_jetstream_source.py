"""JetstreamSource against a local Jetstream stand-in: query params, durable time_us
cursor, rewind on reconnect with de-duplication, reconnect backoff."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gelbridge._ingest import IncomingRecord
from gelbridge._jetstream import JetstreamSource, jetstream_cursor_key, rewound, subscribe_url
from gelbridge._state import SqliteStore, StateStore
from testkit.frames import MSG, jetstream_event, message_record
from testkit.jetstream_server import JetstreamServer

ME, OTHER = "did:plc:me", "did:plc:other"
T0 = 1_764_500_000_000_000


def ev(i: int, did: str = ME, collection: str = MSG, op: str = "create") -> dict:
    return jetstream_event(did, T0 + i * 1_000_000, op, collection, f"3mk{i:09d}2", message_record(), f"bafycid{i}")


@contextlib.asynccontextmanager
async def running(src: JetstreamSource) -> AsyncIterator[asyncio.Task[None]]:
    """``src.run()`` as a task for the ``async with`` block, then cancelled."""
    task = asyncio.create_task(src.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def store(tmp_path: Path):
    with SqliteStore.open_dir(tmp_path) as s:
        yield s


def test_subscribe_url_uses_the_v1_query_params() -> None:
    url = subscribe_url("https://jet.example/", dids=["did:plc:a", "did:plc:b"], cursor=17)
    assert url == ("wss://jet.example/subscribe?wantedCollections=chat.gel.assistant.*"
                   "&wantedDids=did:plc:a&wantedDids=did:plc:b&cursor=17")
    assert subscribe_url("ws://127.0.0.1:1/subscribe").startswith("ws://127.0.0.1:1/subscribe?")
    assert rewound(10_000_000, 5) == 5_000_000 and rewound(None, 5) is None
    with pytest.raises(ValueError):
        subscribe_url("ftp://x")


async def test_records_in_order_cursor_saved_and_replays_after_reconnect_deduplicated(store: StateStore) -> None:
    got: list[IncomingRecord] = []

    async def handler(rec: IncomingRecord) -> None:
        got.append(rec)

    async with JetstreamServer(close_after=4) as srv:
        for i in range(6):
            srv.publish(ev(i))
        srv.publish(ev(6, did=OTHER))                        # the server filters it out (wantedDids)
        srv.publish(ev(7, collection="app.bsky.feed.post"))  # and this (wantedCollections)
        await store.set_cursor(jetstream_cursor_key(srv.url), T0 - 1)  # resume from before event 0
        src = JetstreamSource(srv.url, [ME], store, handler, rewind_seconds=1.5, backoff_base=0.01, backoff_cap=0.05)
        async with running(src):
            await wait_for(lambda: len(got) >= 6 and src.connects >= 3)
    assert [r.rkey for r in got] == [f"3mk{i:09d}2" for i in range(6)]  # each once, in order
    assert src.duplicates > 0  # the rewind replayed events that were already handled
    assert all(r.did == ME and r.collection == MSG for r in got)
    assert await store.get_cursor(src.key) == T0 + 5 * 1_000_000
    first, second = srv.requests[0], srv.requests[1]
    assert first["wantedDids"] == [ME] and first["wantedCollections"] == ["chat.gel.assistant.*"]
    assert int(first["cursor"][0]) == T0 - 1 - 1_500_000
    assert int(second["cursor"][0]) == T0 + 3 * 1_000_000 - 1_500_000  # last handled, rewound


async def test_a_new_source_resumes_from_the_saved_cursor_and_skips_seen_events(store: StateStore) -> None:
    got: list[str] = []

    async def handler(rec: IncomingRecord) -> None:
        got.append(rec.rkey)

    async with JetstreamServer() as srv:
        for i in range(3):
            srv.publish(ev(i))
        await store.set_cursor(jetstream_cursor_key(srv.url), T0 - 1)
        for round_ in range(2):
            src = JetstreamSource(srv.url, [ME], store, handler, rewind_seconds=60)
            async with running(src):
                if round_ == 0:
                    await wait_for(lambda: len(got) == 3)
                else:
                    srv.publish(ev(3))
                    await wait_for(lambda: len(got) == 4)
                    await asyncio.sleep(0.2)
        # the second source rewound 60 s, so the server replayed 0..2: all dropped as seen
        assert src.duplicates == 3
    assert got == [f"3mk{i:09d}2" for i in range(4)]


async def test_a_transient_handler_failure_does_not_advance_past_the_event(store: StateStore) -> None:
    from gelbridge._errors import PdsUnavailable

    calls: list[str] = []

    async def handler(rec: IncomingRecord) -> None:
        calls.append(rec.rkey)
        if len(calls) == 1:
            raise PdsUnavailable("PDS down")

    async with JetstreamServer() as srv:
        srv.publish(ev(0))
        await store.set_cursor(jetstream_cursor_key(srv.url), T0 - 1)
        src = JetstreamSource(srv.url, [ME], store, handler, rewind_seconds=0, backoff_base=0.01, backoff_cap=0.05)
        with pytest.raises(PdsUnavailable):
            await src.handle_message(json.dumps(ev(0)))
        assert await store.get_cursor(src.key) == T0 - 1 and not await store.was_seen(ME, "3mk0000000002", "bafycid0")
        await src.handle_message(json.dumps(ev(0)))
        assert calls == ["3mk0000000002"] * 2 and await store.get_cursor(src.key) == T0


async def test_a_record_the_handler_can_never_take_is_skipped_and_does_not_hold_the_stream(
    store: StateStore,
) -> None:
    got: list[str] = []

    async def handler(rec: IncomingRecord) -> None:
        if rec.rkey == "3mk0000000012":
            raise ValueError("a bug, or a record nothing can handle")
        got.append(rec.rkey)

    async with JetstreamServer() as srv:
        for i in range(3):
            srv.publish(ev(i))
        await store.set_cursor(jetstream_cursor_key(srv.url), T0 - 1)
        src = JetstreamSource(srv.url, [ME], store, handler, backoff_base=0.01, backoff_cap=0.05)
        async with running(src):
            await wait_for(lambda: len(got) == 2)
    assert got == ["3mk0000000002", "3mk0000000022"] and src.skipped == 1 and src.connects == 1
    assert await store.get_cursor(src.key) == T0 + 2_000_000


async def test_a_record_the_handler_cannot_take_yet_is_retried_by_reconnecting_and_the_watch_goes_on(
    store: StateStore,
) -> None:
    from gelbridge._errors import PdsUnavailable

    got: list[str] = []
    failed = 0

    async def handler(rec: IncomingRecord) -> None:
        nonlocal failed
        if rec.rkey == "3mk0000000012" and failed < 3:  # its PDS is down for three tries
            failed += 1
            raise PdsUnavailable("the PDS is down")
        got.append(rec.rkey)

    async with JetstreamServer() as srv:
        for i in range(3):
            srv.publish(ev(i))
        await store.set_cursor(jetstream_cursor_key(srv.url), T0 - 1)
        src = JetstreamSource(srv.url, [ME], store, handler, rewind_seconds=5, backoff_base=0.01, backoff_cap=0.05)
        async with running(src) as task:
            await wait_for(lambda: len(got) == 3)
            srv.publish(ev(3))  # and it keeps watching
            await wait_for(lambda: len(got) == 4)
            assert not task.done()
    assert failed == 3 and src.connects == 4  # one connection per failure, then the one that got through
    assert got == [f"3mk{i:09d}2" for i in range(4)]  # each once, in order: replays were dropped as seen
    assert src.duplicates == 3 and await store.get_cursor(src.key) == T0 + 3_000_000


async def test_reconnects_with_bounded_backoff_when_refused(store: StateStore) -> None:
    async def handler(rec: IncomingRecord) -> None: ...

    src = JetstreamSource("ws://127.0.0.1:9", [ME], store, handler, backoff_base=0.01, backoff_cap=0.02, open_timeout=1)
    task = asyncio.create_task(src.run())
    await asyncio.sleep(0.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert src.connects == 0 and not src.connected.is_set()


async def test_a_reconnect_tells_the_workers_and_counts_and_the_first_connect_does_not(store: StateStore) -> None:
    """Events may be missed while the connection is down: after every connection but the
    first, ``on_reconnect`` runs (the workers drop cached side records and sweep)."""
    told: list[int] = []

    async def handler(rec: IncomingRecord) -> None: ...

    async with JetstreamServer(close_after=2) as srv:
        for i in range(4):
            srv.publish(ev(i))
        await store.set_cursor(jetstream_cursor_key(srv.url), T0 - 1)
        src = JetstreamSource(srv.url, [ME], store, handler, rewind_seconds=0.5, backoff_base=0.01,
                              backoff_cap=0.05, on_reconnect=lambda: told.append(src.connects))
        assert src.dids == {ME} and src.reconnects == 0 and src.last_event_at is None
        async with running(src):
            await wait_for(lambda: src.connects >= 3)
    assert src.reconnects == src.connects - 1 >= 2
    assert told[:2] == [2, 3]  # not at the first connection
    assert src.last_event_at is not None


async def test_with_no_dids_it_waits_and_a_change_of_dids_resubscribes_at_once(store: StateStore) -> None:
    """A fleet member's one source follows the accounts it serves as they come and go:
    never a subscription without wantedDids (Jetstream would send every account's events),
    a new set asked for at once from the cursor, and no reconnect hook (nothing was lost)."""
    got: list[tuple[str, str]] = []
    told: list[int] = []

    async def handler(rec: IncomingRecord) -> None:
        got.append((rec.did, rec.rkey))

    async with JetstreamServer() as srv:
        src = JetstreamSource(srv.url, [], store, handler, rewind_seconds=1, backoff_base=5, key="jetstream:me:fleet:m1",
                              on_reconnect=lambda: told.append(src.connects))
        async with running(src):
            await asyncio.sleep(0.3)
            assert srv.requests == [] and src.connects == 0  # nothing to follow: not connected
            src.set_dids([ME])
            await wait_for(lambda: src.connected.is_set())
            srv.publish(ev(0))
            srv.publish(ev(1, did=OTHER))  # not followed yet: the server filters it out
            await wait_for(lambda: got == [(ME, ev(0)["commit"]["rkey"])])
            src.set_dids([ME, OTHER])  # much sooner than the 5 s backoff: not a lost connection
            await wait_for(lambda: len(srv.requests) == 2 and src.connected.is_set(), timeout=3)
            srv.publish(ev(2, did=OTHER))
            await wait_for(lambda: (OTHER, ev(2)["commit"]["rkey"]) in got)
            src.set_dids([OTHER])
            await wait_for(lambda: len(srv.requests) == 3 and src.connected.is_set(), timeout=3)
            src.set_dids([])
            await wait_for(lambda: not src.connected.is_set(), timeout=3)
            srv.publish(ev(3))
            await asyncio.sleep(0.3)
    assert sorted(srv.requests[1]["wantedDids"]) == sorted([ME, OTHER]) and srv.requests[2]["wantedDids"] == [OTHER]
    assert "cursor" in srv.requests[1]  # from where it was, rewound: the seen events are dropped
    assert len(srv.requests) == 3 and told == []  # no fourth subscription, and no reconnect hook
    assert (ME, ev(3)["commit"]["rkey"]) not in got
    assert await store.get_cursor("jetstream:me:fleet:m1") is not None
    assert await store.get_cursor(jetstream_cursor_key(srv.url)) is None  # its own key, not the URL's
