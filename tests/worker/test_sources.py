"""The worker's event sources on loopback, no PDS: FirehoseSource's connection life cycle
(``connected``, the reconnect hook and the backoff follow the websocket actually opening)
and what a source does with a record its handler fails on (transient: retried, the
cursor held; anything else: skipped)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import libipld
import pytest
import websockets

from gelbridge._errors import PdsUnavailable
from gelbridge._firehose import RepoEvent
from gelbridge._records.constants import KEY_GRANT_COLLECTION, MESSAGE_COLLECTION
from gelbridge._state import SqliteStore
from gelbridge._worker import sources
from gelbridge._worker.sources import FirehoseSource, PollSource

DID = "did:plc:aaaa"


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with SqliteStore.open_dir(tmp_path) as s:
        yield s


def refused_url() -> str:
    """A loopback port with nothing listening (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def handler(ev: Any) -> None: ...


def record_backoff(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``failures`` count of every backoff the source asks for (each wait 1 ms)."""
    seen: list[int] = []

    def fake(failures: int, **_: Any) -> float:
        seen.append(failures)
        return 0.001

    monkeypatch.setattr(sources, "backoff_delay", fake)
    return seen


async def run_until(src: FirehoseSource, done: Any, limit: float = 10.0) -> None:
    task = asyncio.create_task(src.run())
    try:
        for _ in range(int(limit / 0.01)):  # bounded
            if done():
                return
            await asyncio.sleep(0.01)
        pytest.fail("the source did not get there in time")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_refused_connections_grow_the_backoff_and_never_count_as_connected(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_backoff(monkeypatch)
    hooks: list[None] = []
    src = FirehoseSource(refused_url(), DID, store, handler, on_reconnect=lambda: hooks.append(None))
    await run_until(src, lambda: len(seen) >= 5)
    assert seen[:5] == [1, 2, 3, 4, 5]  # consecutive failures, not "1" after each attempt
    assert not src.connected.is_set()
    assert hooks == []  # nothing to sweep for: it never got back


async def test_an_open_socket_sets_connected_resets_the_backoff_and_calls_the_hook_on_reconnect(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_backoff(monkeypatch)
    hooks: list[bool] = []
    opened = 0

    async def close_at_once(ws: Any) -> None:
        nonlocal opened
        opened += 1
        await ws.close()

    async with websockets.serve(close_at_once, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        src = FirehoseSource(f"http://127.0.0.1:{port}", DID, store, handler,
                             on_reconnect=lambda: hooks.append(src.connected.is_set()))
        await run_until(src, lambda: len(seen) >= 3)
    assert opened >= 3
    assert seen[:3] == [1, 1, 1]  # each open reset the count
    assert hooks[:2] == [True, True]  # once per re-open (not for the first), after connected was set
    assert len(hooks) in (opened - 1, opened - 2)  # none for the first open (the last may not have run it yet)


def delete_frame(seq: int) -> bytes:
    """A real #commit frame: one delete of ours (needs no blocks)."""
    header = {"op": 1, "t": "#commit"}
    body = {"seq": seq, "repo": DID, "rev": "r", "time": "t", "blocks": b"",
            "ops": [{"action": "delete", "path": f"{MESSAGE_COLLECTION}/k{seq}", "cid": None}]}
    return libipld.encode_dag_cbor(header) + libipld.encode_dag_cbor(body)


@contextlib.asynccontextmanager
async def following(frames: list[bytes], store: Any, handler: Any) -> AsyncIterator[FirehoseSource]:
    """A FirehoseSource running against a loopback websocket that sends ``frames`` and stays
    open; on exit the source is stopped as the intake stops it (cancel, then drain)."""

    async def send(ws: Any) -> None:
        for f in frames:
            await ws.send(f)
        await asyncio.wait_for(ws.wait_closed(), 30)  # stay open until the source or the test closes it

    server = await websockets.serve(send, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        src = FirehoseSource(f"http://127.0.0.1:{port}", DID, store, handler)
        task = asyncio.create_task(src.run())
        try:
            yield src
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await src.drain(timeout=1.0)
    finally:
        server.close()
        await server.wait_closed()


async def eventually(cond: Any, limit: float = 10.0) -> None:
    """Until ``cond()`` (or the coroutine it returns) is true; bounded."""
    for _ in range(int(limit / 0.01)):  # bounded
        got = cond()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        await asyncio.sleep(0.01)


async def test_firehose_retries_a_transient_failure_in_place_and_holds_the_cursor_until_it_goes_through(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_backoff(monkeypatch)
    calls: list[int] = []
    gate = asyncio.Event()

    async def handler(ev: RepoEvent) -> None:
        calls.append(ev.source_cursor)
        if ev.source_cursor == 2 and not gate.is_set():
            raise PdsUnavailable("the PDS is down for the claim")

    async with following([delete_frame(1), delete_frame(2), delete_frame(3)], store, handler) as src:
        await eventually(lambda: calls.count(2) >= 3 and 3 in calls)
        assert calls.count(2) >= 3 and src.retries >= 2  # retried, not skipped
        assert await store.get_cursor(src.key) == 1  # 3 is done, but 2 is not: the cursor waits
        gate.set()
        async def at_3() -> bool:
            return await store.get_cursor(src.key) == 3

        await eventually(at_3)
        assert await store.get_cursor(src.key) == 3
    assert calls.count(1) == 1 and calls.count(3) == 1


async def test_firehose_skips_an_event_that_fails_for_good_and_stopping_keeps_a_retrying_one_replayable(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_backoff(monkeypatch)
    calls: list[int] = []

    async def handler(ev: RepoEvent) -> None:
        calls.append(ev.source_cursor)
        if ev.source_cursor == 1:
            raise ValueError("a record nothing can handle")
        if ev.source_cursor == 3:
            raise PdsUnavailable("down")

    async with following([delete_frame(1), delete_frame(2), delete_frame(3)], store, handler) as src:
        await eventually(lambda: calls.count(3) >= 2)
    # leaving stopped it as the intake does: 3 was still retrying, so it was cancelled
    assert calls.count(1) == 1 and calls.count(2) == 1  # 1 was skipped, not retried
    assert await store.get_cursor(src.key) == 2 and not src._tasks  # 3 stays before the cursor: replayed on restart


class ListingPds:
    """What PollSource reads: ``iter_records`` of the message collection (and of the key
    grants: ``grants``)."""

    def __init__(self, rkeys: list[str], grants: list[str] | None = None) -> None:
        self.rkeys, self.grants = rkeys, grants or []

    async def iter_records(self, collection: str, page_size: int = 100) -> Any:
        for k in (self.grants if collection == KEY_GRANT_COLLECTION else self.rkeys):
            yield type("Rec", (), {"rkey": k, "cid": f"cid-{k}", "value": {"k": k}})()


async def test_a_poll_hands_over_the_key_grants_before_the_messages(store: Any) -> None:
    """A grant and the message sealed with its key, both new since the last poll: the
    grant first, or the message would be answered without its key (``decrypt_failed``)."""
    calls: list[tuple[str, str]] = []

    async def handler(ev: Any) -> None:
        calls.append((ev.collection, ev.rkey))

    pds = ListingPds([], [])
    src = PollSource(pds, DID, store, handler, interval=0.01, follow_grants=True)
    await src.poll_once()  # the first poll hands over the listed grants (none yet)
    pds.rkeys, pds.grants = ["m1"], ["g1"]
    assert await src.poll_once() == 2
    assert calls == [(KEY_GRANT_COLLECTION, "g1"), (MESSAGE_COLLECTION, "m1")]


async def test_poll_retries_a_transient_failure_at_the_next_poll_and_skips_one_that_fails_for_good(
    store: Any,
) -> None:
    calls: list[str] = []

    async def handler(ev: RepoEvent) -> None:
        calls.append(ev.rkey)
        if ev.rkey == "bad":
            raise ValueError("a record nothing can handle")
        if ev.rkey == "later" and calls.count("later") == 1:
            raise PdsUnavailable("down")

    src = PollSource(ListingPds(["ok", "bad", "later"]), DID, store, handler, interval=0.01)
    assert await src.poll_once() == 1
    assert await src.poll_once() == 1  # "later" went through; "bad" is not tried again
    assert await src.poll_once() == 0
    assert calls == ["ok", "bad", "later", "later"]


async def test_a_sweep_loop_asked_to_sweep_at_start_does_not_wait_for_its_interval() -> None:
    """Without a backfill (``Bridge(backfill=False)``) a reply a crash left streaming is
    finished right after start, not after the first 30 s interval."""
    from gelbridge._worker.service import Worker

    class Sweeping:
        def __init__(self) -> None:
            self._sweep_wake = asyncio.Event()
            self.sweeps = 0

        async def recover_claims(self) -> int:
            self.sweeps += 1
            return 0

    for at_start, expected in ((True, 1), (False, 0)):
        w = Sweeping()
        task = asyncio.create_task(Worker.sweep_loop(w, 30.0, at_start=at_start))  # type: ignore[arg-type]
        await asyncio.sleep(0.2)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert w.sweeps == expected


async def test_a_poll_source_is_connected_while_polls_work_and_tells_its_worker_when_they_work_again(
    store: Any,
) -> None:
    """A poll that works again after failing counts as a reconnect (events may have been
    missed while it failed): ``connected`` follows the polls, and the hook is called."""

    class FlakyPds(ListingPds):
        fail = False

        async def iter_records(self, collection: str, page_size: int = 100) -> Any:
            if self.fail:
                raise PdsUnavailable("down")
            async for r in super().iter_records(collection, page_size):
                yield r

    told: list[int] = []
    pds = FlakyPds(["a"])
    src = PollSource(pds, DID, store, handler, interval=0.01, on_reconnect=lambda: told.append(1))
    assert src.dids == {DID} and not src.connected.is_set()
    task = asyncio.create_task(src.run())
    try:
        for _ in range(500):
            if src.connected.is_set():
                break
            await asyncio.sleep(0.01)
        assert src.connected.is_set() and src.last_event_at is not None and told == []
        pds.fail = True
        for _ in range(500):
            if not src.connected.is_set():
                break
            await asyncio.sleep(0.01)
        assert not src.connected.is_set()
        pds.fail = False
        for _ in range(1000):  # the backoff after one failure is 2 x interval
            if src.connected.is_set():
                break
            await asyncio.sleep(0.01)
        assert src.connected.is_set() and src.reconnects == 1 and told == [1]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
