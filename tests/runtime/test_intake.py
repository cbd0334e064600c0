"""The one intake (gelbridge._runtime.intake), of `gelbridge run`, the fleet and the Bridge:
which sources [watch] gives for the accounts a router serves, and where gaps, reconnects
and records go. Stand-in workers, no network (the sources are built, not run)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gelbridge._config import WatchConfig
from gelbridge._errors import ConfigError
from gelbridge._ingest import IncomingRecord
from gelbridge._records.constants import MESSAGE_COLLECTION
from gelbridge._runtime import Account, Intake, Router
from gelbridge._runtime.intake import backfill_logged, run_until, stop_tasks
from gelbridge._state import SqliteStore
from gelbridge._worker.sources import FirehoseSource, PollSource, firehose_cursor_key

A, B, C = "did:plc:aaaa", "did:plc:bbbb", "did:plc:cccc"


class StandIn:
    started = True

    def __init__(self, did: str, pds_url: str, store: Any = None, fail: bool = False) -> None:
        self.did, self.store, self.fail = did, store, fail
        self.pds = SimpleNamespace(pds_url=pds_url, session=SimpleNamespace(did=did))
        self.grants = SimpleNamespace(enabled=False)  # no bridge key: the poll lists messages only
        self.backfills = 0
        self.reconnects = 0
        self.events: list[tuple[Any, ...]] = []

    async def backfill(self) -> Any:
        self.backfills += 1
        if self.fail:
            raise RuntimeError("boom")
        return SimpleNamespace(owed=1, resumed=0)

    def reconnected(self) -> None:
        self.reconnects += 1

    async def handle_event(self, rec: IncomingRecord, *, received_at: float | None = None) -> str:
        self.events.append((rec.did, rec.collection, rec.rkey, rec.cid, rec.record, rec.action, received_at))
        return "claimed"


def watch_sources(watch: WatchConfig, workers: dict[str, StandIn], store: Any, handler: Any = None, *,
                  firehose_in_flight: int = 64, member: str | None = None) -> list[tuple[str, Any]]:
    """The sources an intake builds for ``workers`` (by label), routed by a router of them."""
    router = Router()
    for label, w in workers.items():
        router.add(Account(label, w.did, None, w))  # type: ignore[arg-type]
    intake = Intake(watch, store, router, member=member, firehose_in_flight=firehose_in_flight)
    if handler is not None:
        router.route = handler  # type: ignore[method-assign]
    for account in router:
        intake.attach(account)
    return list(intake.build().items())


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with SqliteStore.open_dir(tmp_path) as s:
        yield s


def three_accounts() -> dict[str, StandIn]:
    return {"a": StandIn(A, "http://127.0.0.1:1/"), "b": StandIn(B, "http://127.0.0.1:1"),
            "c": StandIn(C, "http://127.0.0.1:2")}


async def test_firehose_one_subscription_per_host_carrying_its_accounts(store: Any) -> None:
    await store.set_cursor(firehose_cursor_key("http://127.0.0.1:2", C), 41)
    got = dict(watch_sources(WatchConfig(), three_accounts(), store, _ignore, firehose_in_flight=1))
    assert set(got) == {"firehose-http://127.0.0.1:1", "firehose-http://127.0.0.1:2"}
    one, two = got["firehose-http://127.0.0.1:1"], got["firehose-http://127.0.0.1:2"]
    assert isinstance(one, FirehoseSource) and isinstance(two, FirehoseSource)
    assert one.dids == {A, B} and two.dids == {C}
    # one DID: the key gelbridge run and gelbridge status use; several: all of them
    assert one.key == f"firehose:http://127.0.0.1:1:{A}+{B}" and two.key == f"firehose:http://127.0.0.1:2:{C}"
    await one.load_cursor()
    await two.load_cursor()  # what run() does first
    assert one.cursor is None and two.cursor == 41  # resumes from the saved low-water mark
    assert one._slots._value == 1  # in seq order, one at a time


async def test_a_gap_backfills_only_the_accounts_it_concerns_and_a_reconnect_tells_them(store: Any) -> None:
    ws = three_accounts()
    src = dict(watch_sources(WatchConfig(), ws, store, _ignore))["firehose-http://127.0.0.1:1"]
    await src._gap(B)  # a #sync of B's repo
    assert [w.backfills for w in ws.values()] == [0, 1, 0]
    await src._gap(None)  # OutdatedCursor / FutureCursor: every account on the subscription
    assert [w.backfills for w in ws.values()] == [1, 2, 0]
    src._reconnected()
    assert [w.reconnects for w in ws.values()] == [1, 1, 0]


async def test_a_failed_gap_backfill_is_logged_not_raised(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="gelbridge.runtime.intake")
    ws = {"a": StandIn(A, "http://h", fail=True), "b": StandIn(B, "http://h")}
    src = dict(watch_sources(WatchConfig(), ws, store, _ignore))["firehose-http://h"]
    await src._gap(None)
    assert ws["a"].backfills == ws["b"].backfills == 1
    assert "account a: gap backfill failed (RuntimeError)" in caplog.text
    await backfill_logged("b", ws["b"])
    assert "account b: start-up backfill found 1 owed" in caplog.text


async def test_firehose_and_poll_records_reach_the_handler_as_incoming_records(store: Any) -> None:
    """One record event type: every source hands the given handler IncomingRecords."""
    ws = {"a": StandIn(A, "http://h", store=store)}
    seen: list[IncomingRecord] = []

    async def handler(rec: IncomingRecord) -> None:
        seen.append(rec)

    [(_n, fire)] = watch_sources(WatchConfig(), ws, store, handler)
    [(_n, src)] = watch_sources(WatchConfig(source="poll", poll_interval=3), ws, store, handler)
    assert fire.handler is handler and src.handler is handler  # no per-source event shape in between
    assert fire.live and not src.live  # the orchestrator starts live sources before the backfill

    async def iter_records(collection: str, page_size: int = 100) -> Any:
        yield SimpleNamespace(rkey="k", cid="bafy", value={"role": "user"})

    ws["a"].pds.iter_records = iter_records
    assert await src.poll_once() == 1
    assert seen == [IncomingRecord(A, MESSAGE_COLLECTION, "k", "bafy", {"role": "user"}, None, "update")]
    assert isinstance(src, PollSource) and src.store is store and src.did == A and src.interval == 3


async def test_the_router_passes_the_record_to_the_worker_of_its_did() -> None:
    w, other = StandIn(A, "http://h"), StandIn(B, "http://h")
    router = Router()
    router.add(Account("a", A, None, w))  # type: ignore[arg-type]
    router.add(Account("b", B, None, other))  # type: ignore[arg-type]
    rec = IncomingRecord(A, MESSAGE_COLLECTION, "k", None, None, 9, "delete")
    assert await router.route(rec, 12.5) == "claimed"
    assert w.events == [(A, MESSAGE_COLLECTION, "k", None, None, "delete", 12.5)] and other.events == []
    assert await router.route(IncomingRecord(C, MESSAGE_COLLECTION, "k", None, None)) == "ignored"
    assert router.stats == {"handled-claimed": 1, "unrouted": 1}


def test_jetstream_is_one_connection_for_all_accounts_and_needs_a_url(store: Any) -> None:
    with pytest.raises(ConfigError, match="needs url"):
        watch_sources(WatchConfig(source="jetstream"), three_accounts(), store, _ignore)
    [(name, src)] = watch_sources(WatchConfig(source="jetstream", url="ws://127.0.0.1:3"), three_accounts(),
                                  store, _ignore)
    assert name == "jetstream" and src.filter.dids == {A, B, C} and src.handler is _ignore


async def test_run_until_returns_on_stop_and_raises_what_ended_a_task() -> None:
    forever = asyncio.create_task(asyncio.Event().wait())
    stop = asyncio.Event()
    stop.set()
    await run_until(stop, [forever])
    assert not forever.done()

    async def broken() -> None:
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError, match="source failed"):
        await asyncio.wait_for(run_until(asyncio.Event(), [forever, asyncio.create_task(broken())]), 5)
    await stop_tasks([forever])
    assert forever.cancelled()


async def test_stopping_lets_records_in_flight_finish_and_saves_their_cursor(store: Any) -> None:
    handled: list[int] = []

    async def slow(rec: IncomingRecord) -> None:
        await asyncio.sleep(0.2)
        handled.append(rec.source_cursor)

    src = FirehoseSource("http://h", A, store, slow)
    for seq in (5, 6):  # what run() does for each event it reads
        await src._slots.acquire()
        src.tracker.begin(seq)
        t = asyncio.create_task(src._handle(seq, IncomingRecord(A, MESSAGE_COLLECTION, f"k{seq}", "c", {}, seq)))
        src._tasks.add(t)
        t.add_done_callback(src._tasks.discard)
    await stop_tasks([], [src])
    assert handled == [5, 6] and await store.get_cursor(src.key) == 6


async def _ignore(rec: IncomingRecord) -> None:
    return None


def member_intake(watch: WatchConfig, store: Any) -> tuple[Intake, Router, dict[str, Account]]:
    router = Router()
    accounts = {label: Account(label, w.did, None, w) for label, w in three_accounts().items()}  # type: ignore[arg-type]
    for a in accounts.values():
        router.add(a)
    return Intake(watch, store, router, member="m1"), router, accounts


async def test_a_fleet_members_subscriptions_follow_the_accounts_as_they_come_and_go(store: Any) -> None:
    """A changing set (a fleet member): one subscription per host, opened for its first
    account, under the member's own cursor key; an account that leaves is carried no more."""
    intake, _, acc = member_intake(WatchConfig(), store)
    for a in acc.values():
        intake.attach(a)
    one, two = intake.sources["firehose-http://127.0.0.1:1"], intake.sources["firehose-http://127.0.0.1:2"]
    assert isinstance(one, FirehoseSource) and one.dids == {A, B} and two.dids == {C}
    assert one.key == "firehose:http://127.0.0.1:1:fleet:m1"
    await intake.detach(acc["b"])
    assert one.dids == {A} and intake.source_of(B) is None and intake.source_of(C) is two
    assert "cursor none" in await intake.describe(acc["a"])


async def test_a_fleet_members_jetstream_connection_asks_for_the_accounts_it_serves(store: Any) -> None:
    intake, _, acc = member_intake(WatchConfig(source="jetstream", url="ws://127.0.0.1:3"), store)
    intake.attach(acc["a"])
    intake.attach(acc["c"])
    [(name, js)] = intake.sources.items()
    assert name == "jetstream" and js.dids == {A, C} and js.key.endswith(":fleet:m1")
    line = await intake.describe(acc["a"])
    assert line.startswith("jetstream ws://127.0.0.1:3 (wantedDids did:plc:aaaa and 1 other account(s)")
    await intake.detach(acc["c"])
    assert js.dids == {A}


async def test_poll_sources_start_only_after_their_accounts_backfill(store: Any) -> None:
    """Poll reads the repo itself: a fixed set's pollers start with the rest after the
    backfill (start(live_only=False)); a changing set's with start_poll, per account."""
    ws = {"a": StandIn(A, "http://h", store=store)}
    router = Router()
    router.add(Account("a", A, None, ws["a"]))  # type: ignore[arg-type]
    intake = Intake(WatchConfig(source="poll", poll_interval=60), store, router)
    intake.attach(router.get(A))  # type: ignore[arg-type]
    intake.start(live_only=True)
    assert set(intake.sources) == {"poll-a"} and intake.tasks == []
    assert await intake.describe(router.get(A)) == "poll every 60 s (listRecords on its PDS)"  # type: ignore[arg-type]
    intake.start(live_only=False)
    assert len(intake.tasks) == 1
    await intake.stop()
    assert intake.tasks == []

    member, _, acc = member_intake(WatchConfig(source="poll"), store)
    member.start(live_only=True)
    member.attach(acc["a"])
    assert "poll-a" in member.sources and member.tasks == []  # not before its backfill
    member.start_poll(acc["a"])
    assert len(member.tasks) == 1
    await member.detach(acc["a"])
    assert member.sources == {} and member.tasks == []


async def test_a_fixed_set_is_complete_once_the_intake_runs(store: Any) -> None:
    _, router, acc = member_intake(WatchConfig(), store)
    fixed = Intake(WatchConfig(), store, router)
    fixed.attach(acc["a"])
    fixed.start(live_only=True)
    try:
        with pytest.raises(RuntimeError, match="complete"):
            fixed.attach(acc["b"])
    finally:
        await fixed.stop()
    with pytest.raises(ConfigError, match="needs url"):
        Intake(WatchConfig(source="jetstream"), store, router)
