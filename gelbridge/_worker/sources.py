"""Where events come from: the event-source contract, and the PDS firehose (default) and
periodic listRecords (poll) sources; Jetstream's is :mod:`gelbridge._jetstream`.

**The contract** (:class:`EventSource`): every source hands each record of ours to one
:data:`RecordHandler` as an :class:`~gelbridge._ingest.IncomingRecord` (the one record
event type; the library feed produces it too), and the handler returns once the record's
effects are durable: the claim is written (on the PDS and in the state store) or it
decided there is nothing to do. One cursor rule: a source's cursor passes a record only
then. One failure policy (:func:`hand_over`): a failure that may pass
(:func:`~gelbridge._errors.is_transient`) leaves the record to be tried again, each source
its own way (the firehose in place, poll at the next poll, Jetstream by reconnecting
from its cursor); any other failure is logged and the record skipped. Each source has
``dids``, ``connected``, ``reconnects`` and ``last_event_at`` (for ``/readyz`` and
``/metrics``) and tells ``on_reconnect`` when events may have been missed. The runtime's
intake (:mod:`gelbridge._runtime.intake`) builds the sources ``[watch] source`` names for
the accounts it serves.

**Firehose cursor** (``[watch] source = "firehose"``): events may be handled
concurrently (at most ``max_in_flight``; ``1`` handles them in seq order), so the saved
cursor is a *low-water mark*: the highest ``seq`` such that every event up to it is done
(:class:`CursorTracker`). A crash replays at most the events in flight, and replays are
harmless (claims are create-only, the state store remembers them). Reconnects resume
from the last seq *received* (earlier ones are still being handled in this process) with
bounded exponential backoff, then tell ``on_reconnect`` (events may have been missed
while down). ``FutureCursor`` (the PDS was reset) drops the cursor and, like
``OutdatedCursor`` (events were lost) and ``#sync`` (a repo was reset), calls ``on_gap``
(a backfill of the accounts concerned).

**A handler failure** that may pass (:func:`~gelbridge._errors.is_transient`: the PDS or
the state store unreachable) is retried: in place with backoff on the firehose (the
cursor waits for it; stopping cancels the retry and a restart replays the event), at
the next poll by the poll source. Any other failure is logged and the record skipped.

**Poll** (``[watch] source = "poll"``): every ``poll_interval`` seconds list all message
records and handle those whose ``(rkey, cid)`` was not handled before (state store
``seen_events``). Meant for small repos or PDSes without a reachable firehose.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from collections.abc import Set as AbstractSet
from contextlib import aclosing
from typing import Any, Protocol

from gelbridge._backoff import backoff_delay
from gelbridge._errors import FirehoseError, GelbridgeError, PdsError
from gelbridge._firehose import StreamMarker, subscribe_repos
from gelbridge._ingest import IncomingRecord, hand_over
from gelbridge._records.constants import KEY_GRANT_COLLECTION, MESSAGE_COLLECTION
from gelbridge._seams import Repo
from gelbridge._state import StateStore

log = logging.getLogger("gelbridge.worker.sources")

#: Takes one record of ours; returns once its effects are durable.
RecordHandler = Callable[[IncomingRecord], Awaitable[object]]
Handler = RecordHandler
#: Events of ``did`` (None: of any repo on the subscription) may have been missed.
GapHandler = Callable[[str | None], Awaitable[None]]


class EventSource(Protocol):
    """What every ``[watch]`` source is (see the module docstring)."""

    @property
    def dids(self) -> AbstractSet[str]:
        """The accounts it carries (a fleet's firehose: a set that changes as it runs)."""

    connected: asyncio.Event
    last_event_at: float | None
    #: follows events as they happen (start it before the backfill: no gap); False: it
    #: reads the repo itself (poll), started after the backfill
    live: bool

    @property
    def reconnects(self) -> int:
        """Connections (or polls that worked) after a lost one."""

    async def run(self) -> None:
        """Follow the source until cancelled (reconnecting with backoff); never returns."""

    async def drain(self, timeout: float) -> None:
        """After cancelling :meth:`run`: let records in flight finish (bounded)."""


class CursorTracker:
    """Low-water mark over seqs handled out of order.

    ``begin(seq)`` when an event arrives (in seq order), ``done(seq)`` when its effects are
    durable; :attr:`safe` is the highest seq with nothing at or below it still open.
    """

    def __init__(self, start: int | None) -> None:
        self._open: dict[int, int] = {}
        self.safe: int | None = start
        self.highest: int | None = start

    def begin(self, seq: int) -> None:
        self._open[seq] = self._open.get(seq, 0) + 1
        if self.highest is None or seq > self.highest:
            self.highest = seq

    def done(self, seq: int) -> int | None:
        """Mark one event of ``seq`` done; returns the new safe cursor if it moved."""
        n = self._open.get(seq, 0) - 1
        if n > 0:
            self._open[seq] = n
            return None
        self._open.pop(seq, None)
        new = (min(self._open) - 1) if self._open else self.highest
        if new is not None and (self.safe is None or new > self.safe):
            self.safe = new
            return new
        return None

    @property
    def in_flight(self) -> int:
        return sum(self._open.values())


def firehose_cursor_key(pds_url: str, dids: str | Iterable[str]) -> str:
    """The state-store key of the cursor of one subscription: its PDS and the DIDs it
    carries (one DID: the key ``gelbridge run`` and ``gelbridge status`` use)."""
    names = [dids] if isinstance(dids, str) else sorted(set(dids))
    return f"firehose:{pds_url.rstrip('/')}:" + "+".join(names)


class FirehoseSource:
    """Subscribe (the repos of ``dids``), dispatch, save the cursor, reconnect with
    backoff, until stopped."""

    live = True

    def __init__(
        self,
        pds_url: str,
        dids: str | Iterable[str],
        store: StateStore,
        handler: Handler,
        *,
        on_gap: GapHandler | None = None,
        on_reconnect: Callable[[], None] | None = None,
        max_in_flight: int = 64,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        open_timeout: float = 10.0,
        key: str | None = None,
    ) -> None:
        self.pds_url = pds_url
        # a ``set`` is kept as given: its owner adds and removes DIDs while the source runs
        # (a fleet worker's accounts on this PDS); the cursor key is then ``key``
        self.dids: set[str] | frozenset[str] = dids if isinstance(dids, set) else frozenset(
            {dids} if isinstance(dids, str) else dids)
        if not self.dids and not isinstance(dids, set):
            raise ValueError("a firehose source needs at least one DID")
        if isinstance(dids, set) and key is None:
            raise ValueError("a firehose source over a changing set of DIDs needs its own cursor key")
        self.store = store
        self.handler = handler
        self.on_gap = on_gap
        self.on_reconnect = on_reconnect
        self.key = key or firehose_cursor_key(pds_url, self.dids)
        self._fenced_cursor = key is None
        self.tracker = CursorTracker(None)  # from the saved cursor when run() starts
        self._loaded = False
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.open_timeout = open_timeout
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.last_event_at: float | None = None  # time.monotonic() of the last event
        self.events = 0
        self.retries = 0

    @property
    def cursor(self) -> int | None:
        return self.tracker.safe

    def follow(self, did: str) -> None:
        """Carry ``did`` from now on (a subscription over a changing set of DIDs)."""
        self._changing().add(did)

    def unfollow(self, did: str) -> None:
        """Carry ``did`` no more (a subscription over a changing set of DIDs)."""
        self._changing().discard(did)

    def _changing(self) -> set[str]:
        if not isinstance(self.dids, set):
            raise RuntimeError("this subscription's accounts are fixed (given as a list, not a set)")
        return self.dids

    async def _handle(self, seq: int, rec: IncomingRecord) -> None:
        """Handle one event; the cursor passes it only once that is done.

        A transient failure (:func:`hand_over`: the PDS is down for the claim, say) is
        retried in place with backoff, holding the cursor, until it goes through or the
        source is stopped (then a restart replays it). Any other failure is logged and
        the event skipped: one bad event never stops the stream.
        """
        finished = False
        try:
            for attempt in itertools.count(1):  # ends by success, skip, or cancellation (stop)
                outcome, _ = await hand_over(self.handler, rec)
                if outcome != "later":
                    break
                self.retries += 1
                await asyncio.sleep(backoff_delay(attempt, base=self.backoff_base, cap=self.backoff_cap))
            finished = True
        finally:
            self._slots.release()
            if finished:  # cancelled (stop) while retrying: the cursor stays before it
                await self._moved(self.tracker.done(seq))

    async def load_cursor(self) -> None:
        """Start from the saved cursor (once; ``run`` calls it)."""
        if not self._loaded:
            saved = await self.store.get_cursor(self.key)
            self.tracker = CursorTracker(saved if isinstance(saved, int) else None)
            self._loaded = True

    async def _moved(self, moved: int | None) -> None:
        """Save the cursor if the low-water mark moved."""
        if moved is not None:
            try:
                # one account's subscription: fenced with it (a fleet worker that lost the
                # account's lease never moves the cursor its successor resumes from)
                only = next(iter(self.dids)) if self._fenced_cursor and len(self.dids) == 1 else None
                await self.store.set_cursor(self.key, moved, account=only)
            except GelbridgeError as e:
                log.error("cannot save the firehose cursor (%s)", type(e).__name__)

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self.load_cursor()
            except GelbridgeError as e:  # the state store is down: wait and try again
                failures += 1
                log.warning("firehose: cannot read the saved cursor (%s); retrying", type(e).__name__)
                await asyncio.sleep(backoff_delay(failures, base=self.backoff_base, cap=self.backoff_cap))
                continue
            cursor = self.tracker.highest
            try:
                async with aclosing(
                    subscribe_repos(
                        self.pds_url, cursor=cursor, markers=True,
                        did_filter=self.dids if isinstance(self.dids, set) else set(self.dids),
                        open_timeout=self.open_timeout,
                    )
                ) as stream:
                    async for item in stream:
                        if isinstance(item, StreamMarker):
                            if item.kind == "#open":  # only now: a refused connect must not reset the backoff
                                self.connected.set()
                                if failures:
                                    log.info("firehose reconnected (cursor %s)", cursor)
                                failures = 0
                                if self.reconnects:
                                    self._reconnected()
                            else:
                                await self._marker(item)
                            continue
                        self.events += 1
                        self.last_event_at = time.monotonic()
                        await self._slots.acquire()
                        self.tracker.begin(item.seq)
                        t = asyncio.create_task(self._handle(item.seq, IncomingRecord.from_repo_event(item)))
                        self._tasks.add(t)
                        t.add_done_callback(self._tasks.discard)
            except FirehoseError as e:
                if e.error == "FutureCursor":
                    log.warning("the PDS does not know cursor %s (was it reset?); starting from now", cursor)
                    self.tracker = CursorTracker(None)
                    await self._gap(None)
                else:
                    log.warning("firehose error: %s", e)
            except PdsError as e:
                log.warning("firehose disconnected (%s)", type(e).__name__)
            except Exception as e:  # noqa: BLE001 - a bug in decoding must not end the watch for good
                log.error("firehose stream failed unexpectedly (%s); reconnecting", type(e).__name__)
            self.connected.clear()
            failures += 1
            self.reconnects += 1
            delay = backoff_delay(failures, base=self.backoff_base, cap=self.backoff_cap)
            log.info("firehose: reconnecting in %.1f s", delay)
            await asyncio.sleep(delay)

    async def _marker(self, m: StreamMarker) -> None:
        if m.kind == "#info" and m.name == "OutdatedCursor":
            await self._gap(None)
        elif m.kind == "#sync":
            log.warning("a repo was reset (#sync); running a backfill")
            await self._gap(m.did)

    async def _gap(self, did: str | None) -> None:
        if self.on_gap is not None:
            try:
                await self.on_gap(did)
            except Exception as e:  # noqa: BLE001
                log.error("backfill after a firehose gap failed (%s)", type(e).__name__)

    def _reconnected(self) -> None:
        if self.on_reconnect is not None:
            try:
                self.on_reconnect()
            except Exception as e:  # noqa: BLE001 - never ends the watch
                log.error("reconnect hook failed (%s)", type(e).__name__)

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for events being handled; cancel those still retrying after
        ``timeout`` (their events stay before the saved cursor: a restart replays them)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        left = list(self._tasks)
        for t in left:
            t.cancel()
        if left:
            await asyncio.wait(left, timeout=timeout)


class PollSource:
    """List message records every ``interval`` seconds; handle new or changed ones."""

    live = False

    def __init__(self, pds: Repo, did: str, store: StateStore, handler: Handler, *, interval: float = 5.0,
                 on_reconnect: Callable[[], None] | None = None, follow_grants: bool = False) -> None:
        """``follow_grants``: also list the key grants each poll and hand over what changed,
        deletes included (the worker read them all at start: the first poll only compares)."""
        self.pds = pds
        self.follow_grants = follow_grants
        self._grant_cids: dict[str, str | None] | None = None
        self.did = did
        self.dids = frozenset({did})
        self.store = store
        self.handler = handler
        self.interval = interval
        self.on_reconnect = on_reconnect
        self.polls = 0
        self.connected = asyncio.Event()  # set while polls succeed
        self.reconnects = 0  # polls that succeeded again after failing
        self.last_event_at: float | None = None  # time.monotonic() of the last successful poll

    async def drain(self, timeout: float) -> None:
        """Nothing to wait for: a poll hands its records over one at a time, inside :meth:`run`."""

    async def poll_once(self) -> int:
        # grants first: a message an app wrote right after its grant (or right after
        # deleting one) must meet the keys as they were when it was written
        n = await self._poll_grants() if self.follow_grants else 0
        async for r in self.pds.iter_records(MESSAGE_COLLECTION, page_size=100):
            if await self.store.was_seen(self.did, r.rkey, r.cid):
                continue
            rec = IncomingRecord(self.did, MESSAGE_COLLECTION, r.rkey, r.cid, r.value, action="update")
            outcome, _ = await hand_over(self.handler, rec)
            if outcome == "later":
                continue  # not marked seen: the next poll tries it again
            if outcome == "handled":
                n += 1
            await self.store.mark_seen(self.did, r.rkey, r.cid)
        self.polls += 1
        return n

    async def _poll_grants(self) -> int:
        """Grants created, changed or deleted since the last poll, as record events."""
        listed: dict[str, tuple[str | None, Any]] = {}
        async for r in self.pds.iter_records(KEY_GRANT_COLLECTION, page_size=100):
            listed[r.rkey] = (r.cid, r.value)
        known, first = self._grant_cids or {}, self._grant_cids is None
        events = [IncomingRecord(self.did, KEY_GRANT_COLLECTION, rkey, cid, value, action="update")
                  for rkey, (cid, value) in listed.items() if first or known.get(rkey, "") != cid]
        events += [IncomingRecord(self.did, KEY_GRANT_COLLECTION, rkey, None, None, action="delete")
                   for rkey in known if rkey not in listed]
        for rec in events:
            await hand_over(self.handler, rec)
        self._grant_cids = {rkey: cid for rkey, (cid, _) in listed.items()}
        return len(events)

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self.poll_once()
                self.last_event_at = time.monotonic()
                self.connected.set()
                if failures:
                    self.reconnects += 1
                    log.info("polling works again")
                    if self.on_reconnect is not None:
                        try:
                            self.on_reconnect()
                        except Exception as e:  # noqa: BLE001 - never ends the watch
                            log.error("reconnect hook failed (%s)", type(e).__name__)
                failures = 0
                await asyncio.sleep(self.interval)
            except PdsError as e:
                self.connected.clear()
                failures += 1
                # No jitter: one poller per account, nothing to de-synchronise.
                delay = backoff_delay(failures + 1, base=self.interval, cap=60.0, spread=(1.0, 1.0), max_doublings=4)
                log.warning("poll failed (%s); retry in %.0f s", type(e).__name__, delay)
                await asyncio.sleep(delay)
