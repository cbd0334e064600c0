"""Bridge mechanics with stand-in workers (no PDS): routing by DID, the account check,
back-pressure from the loop and from threads, per-message order, thread mode.
The end-to-end behaviour with real workers is in test_bridge_pds.py."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gelbridge._bridge import AccountMixup, Bridge, BridgeClosed, BridgeOverloaded
from gelbridge._config import Settings
from testkit.frames import MSG, commit_frame, jetstream_event, message_record

A, B = "did:plc:aaaa", "did:plc:bbbb"
DIDS = {"a.test": A, "b.test": B}


class StandInWorker:
    """Records what it is asked to handle; ``gate`` holds handle_event until set."""

    started = True

    def __init__(self, settings: Settings, **kw: Any) -> None:
        self.settings = settings
        self.kw = kw
        self.did = DIDS[settings.account.identifier]
        self.pds = SimpleNamespace(session=SimpleNamespace(did=self.did), pds_url=settings.account.pds)
        self.calls: list[tuple[str, str, str, str]] = []
        self.gate: asyncio.Event | None = None
        self.closed = False
        self.backfills = 0
        self.sweep_interval: float | None = None
        self.sweep_at_start: bool | None = None

    async def start(self) -> None: ...

    async def handle_event(self, rec: Any, *, received_at: float | None = None) -> str:
        if self.gate is not None:
            await asyncio.wait_for(self.gate.wait(), 10)
        self.calls.append((rec.did, rec.collection, rec.rkey, rec.action))
        return "claimed"

    async def backfill(self) -> Any:
        self.backfills += 1
        return SimpleNamespace(owed=0, resumed=0)

    async def sweep_loop(self, interval: float, *, at_start: bool = False) -> None:
        self.sweep_interval = interval
        self.sweep_at_start = at_start
        await asyncio.Event().wait()  # until cancelled

    async def aclose(self, grace: float | None = None) -> None:
        self.closed = True


def two_accounts(tmp_path: Path) -> Settings:
    return Settings.model_validate({
        "state": {"dir": str(tmp_path)},
        "accounts": [
            {"pds": "http://127.0.0.1:1", "identifier": "a.test", "keyring": str(tmp_path / "a.json")},
            {"pds": "http://127.0.0.1:1", "identifier": "b.test", "keyring": str(tmp_path / "b.json"),
             "defaults": {"effort": "high"}},
        ],
    })


def bridge(tmp_path: Path, **kw: Any) -> Bridge:
    return Bridge(two_accounts(tmp_path), worker_factory=StandInWorker, backfill=False, **kw)


def worker_of(b: Bridge, did: str) -> StandInWorker:
    return b.accounts[did].worker


async def test_records_reach_only_the_worker_of_their_did(tmp_path: Path) -> None:
    async with bridge(tmp_path) as b:
        assert set(b.accounts) == {A, B}
        wa, wb = worker_of(b, A), worker_of(b, B)
        assert wa.settings.keyring.path == tmp_path / "a.json" and wb.settings.keyring.path == tmp_path / "b.json"
        assert wa.settings.state_dir != wb.settings.state_dir and wb.settings.defaults.effort == "high"
        frame = commit_frame(3, A, [("create", f"{MSG}/ka", message_record())])
        assert b.feed_firehose_frame(frame) == 1
        assert b.feed_jetstream_event(jetstream_event(B, 5, "create", MSG, "kb", message_record(), "bafyb")) == 1
        assert b.feed_record(B, MSG, "kb2", None, None) == 1
        assert b.feed_record("did:plc:stranger", MSG, "kx", "bafy", {"role": "user"}) == 0
        assert b.feed_firehose_frame(commit_frame(4, "did:plc:stranger", [("create", f"{MSG}/kx", {})])) == 0
        assert await b.join(5)
    assert wa.calls == [(A, MSG, "ka", "create")]
    assert sorted(wb.calls) == [(B, MSG, "kb", "create"), (B, MSG, "kb2", "delete")]  # two messages: any order
    assert wa.closed and wb.closed


async def test_every_account_gets_the_upkeep_of_gelbridge_run(tmp_path: Path) -> None:
    """Start-up backfill and recovery sweep are each worker's own (Worker.backfill,
    Worker.sweep_loop), started by the bridge for every account."""
    async with Bridge(two_accounts(tmp_path), worker_factory=StandInWorker, sweep_interval=7.0) as b:
        wa, wb = worker_of(b, A), worker_of(b, B)
        for _ in range(100):
            if wa.backfills and wb.backfills and wa.sweep_interval and wb.sweep_interval:
                break
            await asyncio.sleep(0.01)
        assert (wa.backfills, wb.backfills) == (1, 1)
        assert wa.sweep_interval == wb.sweep_interval == 7.0
        assert wa.sweep_at_start is False  # the backfill ends with a sweep
    async with bridge(tmp_path) as b:  # backfill=False: the first sweep runs at once
        await asyncio.sleep(0.05)
        assert worker_of(b, A).backfills == 0 and worker_of(b, A).sweep_interval == 30.0
        assert worker_of(b, A).sweep_at_start is True


async def test_a_worker_whose_session_is_another_account_is_refused(tmp_path: Path) -> None:
    async with bridge(tmp_path) as b:
        wa = worker_of(b, A)
        wa.pds.session.did = B  # a broken worker: its PDS session is B's
        from gelbridge._ingest import IncomingRecord

        with pytest.raises(AccountMixup):
            await b.process(IncomingRecord(A, MSG, "k", "bafy", {"role": "user"}))
        b.feed_record(A, MSG, "k", "bafy", {"role": "user"})
        assert await b.join(5)
        assert wa.calls == [] and b.stats["failed"] == 1


async def test_full_queue_raises_on_the_loop_and_afeed_waits(tmp_path: Path) -> None:
    async with bridge(tmp_path, queue_size=2, shards=1) as b:
        wa = worker_of(b, A)
        wa.gate = asyncio.Event()
        assert b.feed_record(A, MSG, "k1", "c", {"r": 1}) == 1
        assert b.feed_record(A, MSG, "k2", "c", {"r": 1}) == 1
        with pytest.raises(BridgeOverloaded):
            b.feed_record(A, MSG, "k3", "c", {"r": 1})
        assert b.pending == 2
        from gelbridge._ingest import IncomingRecord

        waiter = asyncio.create_task(b.afeed([IncomingRecord(A, MSG, "k3", "c", {"r": 1})]))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        wa.gate.set()
        assert await asyncio.wait_for(waiter, 5) == 1
        assert await b.join(5)
        assert [c[2] for c in wa.calls] == ["k1", "k2", "k3"]


async def test_feeding_from_another_thread_blocks_then_times_out(tmp_path: Path) -> None:
    async with bridge(tmp_path, queue_size=1, shards=1, put_timeout=0.3) as b:
        wa = worker_of(b, A)
        wa.gate = asyncio.Event()
        results: list[Any] = []

        def producer() -> None:
            for k in ("k1", "k2"):
                t = time.monotonic()
                try:
                    results.append((b.feed_record(A, MSG, k, "c", {"r": 1}), round(time.monotonic() - t, 1)))
                except BridgeOverloaded:
                    results.append(("overloaded", round(time.monotonic() - t, 1)))

        th = threading.Thread(target=producer)
        th.start()
        await asyncio.to_thread(th.join, 5)
        assert results[0][0] == 1 and results[1] == ("overloaded", 0.3)
        wa.gate.set()
        assert await b.join(5)


async def test_events_of_one_message_keep_their_order(tmp_path: Path) -> None:
    async with bridge(tmp_path, shards=4) as b:
        for i in range(30):
            b.feed_record(A, MSG, "3mkmsg", f"c{i}", {"i": i}, action="update")
            b.feed_record(A, MSG, f"3mkmsg.r{i}", f"c{i}", {"i": i}, action="update")
            b.feed_record(A, MSG, f"other{i}", f"c{i}", {"i": i})
        assert await b.join(5)
        calls = worker_of(b, A).calls
    same = [c[2] for c in calls if c[2].startswith("3mkmsg")]
    expected = [k for i in range(30) for k in ("3mkmsg", f"3mkmsg.r{i}")]
    assert same == expected


async def test_feeding_before_start_or_after_close_is_refused(tmp_path: Path) -> None:
    b = bridge(tmp_path)
    with pytest.raises(BridgeClosed):
        b.feed_record(A, MSG, "k", "c", {})
    async with b:
        pass
    with pytest.raises(BridgeClosed):
        b.feed_record(A, MSG, "k", "c", {})


def test_thread_mode_for_synchronous_callbacks(tmp_path: Path) -> None:
    b = bridge(tmp_path).start_in_thread(timeout=10)
    try:
        frame = commit_frame(3, A, [("create", f"{MSG}/ka", message_record())])
        from atproto_subscription.frames import Frame

        assert b.feed_firehose_frame(Frame.from_bytes(frame)) == 1  # what on_message receives
        assert b.join_sync(5)
        assert worker_of(b, A).calls == [(A, MSG, "ka", "create")]
    finally:
        b.close(10)
    assert worker_of_closed(b)


def worker_of_closed(b: Bridge) -> bool:
    return not b.accounts  # aclose drops every account context


def test_duplicate_account_labels_are_a_config_error(tmp_path: Path) -> None:
    from gelbridge._errors import ConfigError

    s = Settings.model_validate({"accounts": [{"pds": "http://x", "identifier": "a"}, {"pds": "http://y", "identifier": "a"}]})
    with pytest.raises(ConfigError, match="unique"):
        Bridge(s, worker_factory=StandInWorker)


async def test_one_accounts_failed_backfill_is_logged_and_the_others_are_served(tmp_path: Path) -> None:
    """``Bridge.run``'s start-up backfill: a failure is one line and that account is still
    served (the sweep retries what it owes); a stop during the backfill cancels it."""
    lines: list[str] = []
    async with bridge(tmp_path) as b:
        boom, ok = worker_of(b, A), worker_of(b, B)

        async def fails() -> Any:
            raise RuntimeError("PDS down")

        boom.backfill = fails  # type: ignore[method-assign]
        ok.backfill = lambda: asyncio.sleep(0, SimpleNamespace(messages=2, owed=1, resumed=0,  # type: ignore[method-assign]
                                                                unfinished_claims=0))
        assert await b.runtime.backfill_all(asyncio.Event(), lines.append) is True
        assert any("backfill   failed (RuntimeError)" in line and "a.test" in line for line in lines)
        assert any("2 message(s) asking for replies, 1 owed" in line and "b.test" in line for line in lines)

        started = asyncio.Event()

        async def slow() -> Any:
            started.set()
            await asyncio.sleep(30)

        ok.backfill = slow  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(b.runtime.backfill_all(stop, lines.append))
        await asyncio.wait_for(started.wait(), 5)
        stop.set()
        assert await asyncio.wait_for(task, 5) is False  # stopped, not waiting 30 s


async def test_a_taken_listen_address_ends_the_start_before_the_state_or_any_login(tmp_path: Path) -> None:
    """A library user who sets ``[observability] listen``: the address is bound first, so
    a taken one is the error (not the PDS that is down here), and nothing was opened."""
    import socket

    from gelbridge._dev.pds import free_port
    from gelbridge._errors import ConfigError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings.model_validate({
            "account": {"pds": f"http://127.0.0.1:{free_port()}", "identifier": "a.test"},
            "state": {"dir": str(tmp_path / "state")},
            "observability": {"listen": f"127.0.0.1:{port}"},
        })
        bridge = Bridge(settings, environ={"GELBRIDGE_APP_PASSWORD": "x"}, keyrings={"a.test": {}})
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port} is in use"):
            await asyncio.wait_for(bridge.start(), 30)
    assert not (tmp_path / "state").exists() and bridge.accounts == {}
