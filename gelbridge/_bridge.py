"""``Bridge``: gelbridge as a library inside an event consumer you already run.

A firehose or Jetstream consumer feeds what it receives; the bridge keeps what is ours
(records of the configured accounts in ``chat.gel.assistant.*``), and answers messages
with the worker's turn logic and state (:class:`gelbridge._worker.Worker`, the same code
as ``gelbridge run``)::

    async with Bridge.from_config("gelbridge.toml") as bridge:
        async for frame in my_firehose():        # bytes, SDK MessageFrame, ...
            bridge.feed_firehose_frame(frame)     # filter + enqueue: microseconds
        await bridge.join(timeout=30)             # everything fed so far is claimed

From a synchronous callback (``FirehoseSubscribeReposClient.start(on_message)``)::

    bridge = Bridge.from_config("gelbridge.toml").start_in_thread()
    client.start(lambda message: bridge.feed_firehose_frame(message))
    bridge.close()

**Threading.** The bridge runs on one asyncio loop (yours, or its own thread with
:meth:`start_in_thread`). ``feed_*`` may be called from that loop or from any other
thread: filtering runs in the caller's thread (pure, cheap), and a record that passes
is handed to the loop with ``loop.call_soon_threadsafe``.

**Back-pressure.** At most ``queue_size`` records are queued or being handled (records
that are not ours never take a slot). When all slots are taken, a ``feed_*`` call from
another thread blocks until one frees up, for at most ``put_timeout`` seconds, then
raises :class:`BridgeOverloaded`; a call on the loop itself cannot block and raises
:class:`BridgeOverloaded` at once (await :meth:`wait_for_room` first, or use
:meth:`afeed`). Blocking the consumer's receive thread is the intended back-pressure: the
socket stops being read, and a relay eventually drops a consumer that is too slow
(``ConsumerTooSlow``); reconnect from your saved cursor.

**Order.** Records are spread over ``shards`` queues by (DID, message rkey): the
events of one message (its create, its regenerations, its replies) are handled in the
order fed; different messages run concurrently. A key grant record (PROTOCOL.md §6) is
queued behind no shard: it is in force (or revoked) before any record fed after it is
handled, so the message an app seals with a key it just granted opens.

**Cursors.** A record's effects are durable (claim written, or nothing to do) when
``Worker.handle_event`` returns; :attr:`pending` counts records fed but not yet there.
Save your stream cursor after ``await bridge.join()`` (or when ``pending == 0``).

**Many accounts.** ``[[accounts]]`` in the config (or the single ``[account]``): each
account gets its own :class:`Worker` with its own PDS session, keyring, state directory
and defaults. A record is routed by its DID to that account's worker only, and the
worker writes only through its own PDS session, whose DID must equal the record's DID
(checked on every record: :class:`AccountMixup`). There is no path from an event of one
DID to another account's keyring or repo.

**The one runtime.** The bridge is the library face of :class:`gelbridge._runtime.Runtime`,
which ``gelbridge run`` runs too: the same account start-up (:meth:`Runtime.attach`), the
same router, the same upkeep per account (backfill, recovery sweep). :meth:`serve`
follows the ``[watch]`` sources itself (the runtime's intake); :meth:`run` is
``gelbridge run``, for one account or many.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gelbridge._config import Settings, load_config
from gelbridge._errors import GelbridgeError
from gelbridge._ingest import (
    IncomingRecord,
    RecordFilter,
    from_firehose,
    from_jetstream_event,
    from_record,
)
from gelbridge._observability import Watched
from gelbridge._records import KEY_GRANT_COLLECTION
from gelbridge._runtime import Account, AccountMixup, Runtime, StaticAccounts, WorkerFactory
from gelbridge._runtime.intake import run_until, stop_tasks
from gelbridge._runtime.shared import SharedClients
from gelbridge._seams import Printer
from gelbridge._state import StateStore
from gelbridge._worker.sources import EventSource

log = logging.getLogger("gelbridge.bridge")


class BridgeOverloaded(GelbridgeError):
    """All queue slots stayed taken: the bridge cannot keep up with what is fed."""

    kind = "overloaded"


class BridgeClosed(GelbridgeError):
    """The bridge is not running (not started yet, or closed)."""

    kind = "invalid_request"


#: one served account (kept under its old name: ``bridge.accounts[did]``)
AccountContext = Account

_Item = tuple[IncomingRecord, float]


class Bridge:
    """Feed it firehose frames, Jetstream events or records; it answers our messages.

    See the module docstring for threading, back-pressure, order and cursors.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        queue_size: int = 1000,
        shards: int = 8,
        put_timeout: float = 30.0,
        backfill: bool | None = None,
        keyrings: Mapping[str, Mapping[str, bytes]] | None = None,
        environ: Mapping[str, str] | None = None,
        worker_factory: WorkerFactory | None = None,
        sweep_interval: float = 30.0,
        store: StateStore | None = None,
        shared: SharedClients | None = None,
    ) -> None:
        """``keyrings`` (by account label) replace the keyring files; ``environ`` is where
        app passwords are read (default ``os.environ``); ``backfill`` defaults to
        ``[worker] backfill``; ``store``: the state store to use, left open at the end
        (default: opened from ``[state]`` and closed with the bridge); ``shared``: the
        process's model clients and MCP servers, given to every worker and left open at the
        end (default: the bridge's own, closed last; none with a ``worker_factory``)."""
        if queue_size < 1 or shards < 1:
            raise ValueError("queue_size and shards must be at least 1")
        self.settings = settings
        self.queue_size = queue_size
        self.put_timeout = put_timeout
        self.backfill_on_start = settings.worker.backfill if backfill is None else backfill
        self._n_shards = shards
        settings.accounts_list()  # validates the account list early
        self.stats: Counter[str] = Counter()
        self.runtime = Runtime(settings, environ=environ, store=store, keyrings=keyrings,
                               worker_factory=worker_factory, sweep_interval=sweep_interval, stats=self.stats,
                               shared=shared)
        self._filter: RecordFilter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._shards: list[asyncio.Queue[_Item]] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._grant_tasks: set[asyncio.Task[Any]] = set()
        self._slots = threading.Semaphore(queue_size)
        self._room = asyncio.Event()
        self._lock = threading.Lock()
        self._pending = 0
        self._running = False
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, path: str | Path | None = None, **kw: Any) -> Bridge:
        """A bridge for the config file ``path`` (or ``$GELBRIDGE_CONFIG``)."""
        return cls(load_config(path), **kw)

    # --- lifecycle -----------------------------------------------------------------------------

    @property
    def accounts(self) -> Mapping[str, Account]:
        """The served accounts by DID (read-only)."""
        return self.runtime.accounts

    @property
    def filter(self) -> RecordFilter:
        if self._filter is None:
            raise BridgeClosed("start the bridge first (async with / await bridge.start())")
        return self._filter

    @property
    def store(self) -> StateStore:
        """The state store of the process (shared-source cursors; the single account's state)."""
        try:
            return self.runtime.store
        except RuntimeError:
            raise BridgeClosed("start the bridge first") from None

    @property
    def sources(self) -> Mapping[str, EventSource]:
        """The sources :meth:`serve` or :meth:`run` follows, by name (empty while fed)."""
        return self.runtime.sources

    @property
    def jetstream(self) -> EventSource | None:
        """The Jetstream source, for ``[watch] source = "jetstream"`` (once built)."""
        return self.sources.get("jetstream")

    @property
    def watched(self) -> Watched | None:
        """The health/metrics server's view, when ``[observability] listen`` is set."""
        return self.runtime.watched

    async def start(self) -> None:
        """Open state, log every account in, start the dispatchers, sweeps (and the backfill)."""
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        rt = self.runtime
        await rt.open()
        try:
            for entry in self.settings.accounts_list():
                await rt.attach(entry)
        except BaseException:
            await rt.close(0)
            raise
        self._filter = RecordFilter.for_dids(rt.accounts)
        self._shards = [asyncio.Queue() for _ in range(self._n_shards)]
        self._room = asyncio.Event()
        self._tasks = [asyncio.create_task(self._dispatch(q), name=f"bridge-shard-{i}")
                       for i, q in enumerate(self._shards)]
        for account in rt.router:  # the same upkeep as gelbridge run, per account
            rt.upkeep(account, backfill=self.backfill_on_start)
        self._running = True
        log.info("bridge serving %d account(s)", len(rt.accounts))

    async def aclose(self, grace: float | None = None) -> None:
        """Stop taking records; let queued ones finish (bounded); shut the workers down."""
        if not self._running:
            return
        self._running = False
        g = self.settings.worker.shutdown_grace if grace is None else grace
        await self.join(timeout=g)
        await stop_tasks([*self._tasks, *self._grant_tasks])
        self._tasks = []
        await self.runtime.close(g)

    async def __aenter__(self) -> Bridge:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- feeding ---------------------------------------------------------------------------------

    def feed_firehose_frame(self, frame_or_message: Any) -> int:
        """A firehose frame (``bytes``), SDK ``MessageFrame`` or parsed ``Commit``; returns
        how many records were queued. Raises :class:`~gelbridge._errors.FirehoseError` for
        an error frame or undecodable bytes."""
        return self._enqueue(from_firehose(frame_or_message, self.filter))

    def feed_jetstream_event(self, event: Mapping[str, Any] | str | bytes | Any) -> int:
        """A Jetstream event: v1 JSON (dict, text or bytes) or a v2 SDK message/model."""
        return self._enqueue(from_jetstream_event(event, self.filter))

    def feed_record(
        self,
        did: str,
        collection: str,
        rkey: str,
        cid: str | None,
        record: Mapping[str, Any] | None,
        *,
        action: str | None = None,
    ) -> int:
        """A record you decoded yourself (``record=None``: a delete)."""
        return self._enqueue(from_record(did, collection, rkey, cid, record, self.filter, action=action))  # type: ignore[arg-type]

    async def afeed(self, records: Iterable[IncomingRecord]) -> int:
        """Queue already-normalised records from the loop, waiting for room instead of raising."""
        n = 0
        for rec in records:
            if not self.filter.wants(rec.did, rec.collection):
                continue
            await self.wait_for_room(self.put_timeout)
            n += self._enqueue([rec])
        return n

    async def wait_for_room(self, timeout: float | None = None) -> None:
        """Wait (on the loop) until a queue slot is free; :class:`BridgeOverloaded` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._pending < self.queue_size:
                    return
                self._room.clear()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise BridgeOverloaded(f"the bridge queue stayed full ({self.queue_size} records) for {timeout:g} s")
            try:
                await asyncio.wait_for(self._room.wait(), timeout=min(left, 1.0) if left is not None else 1.0)
            except TimeoutError:
                pass

    def _enqueue(self, records: list[IncomingRecord]) -> int:
        if not records:
            self.stats["dropped"] += 1
            return 0
        loop = self._loop
        if not self._running or loop is None:
            raise BridgeClosed("the bridge is not running; start it before feeding records")
        on_loop = threading.get_ident() == self._loop_thread
        for rec in records:
            if on_loop:
                if not self._slots.acquire(blocking=False):
                    raise BridgeOverloaded(
                        f"the bridge queue is full ({self.queue_size} records); await bridge.wait_for_room() "
                        "or feed from another thread to block instead")
            elif not self._slots.acquire(timeout=self.put_timeout):
                raise BridgeOverloaded(
                    f"the bridge queue stayed full ({self.queue_size} records) for {self.put_timeout:g} s")
            with self._lock:
                self._pending += 1
            item = (rec, time.monotonic())
            if on_loop:
                self._put(item)
            else:
                try:
                    loop.call_soon_threadsafe(self._put, item)
                except RuntimeError:  # the loop is closed
                    self._release()
                    raise BridgeClosed("the bridge loop has stopped; records can no longer be fed") from None
        self.stats["queued"] += len(records)
        return len(records)

    def _put(self, item: _Item) -> None:
        rec = item[0]
        if rec.collection == KEY_GRANT_COLLECTION:
            # at once, not behind a shard's backlog: its task starts before any record fed
            # later is handled, and applies the grant before it first waits
            task = asyncio.create_task(self._handle(item), name="bridge-key-grant")
            self._grant_tasks.add(task)
            task.add_done_callback(self._grant_tasks.discard)
            return
        base = rec.rkey.split(".r", 1)[0]
        self._shards[hash((rec.did, base)) % len(self._shards)].put_nowait(item)

    def _release(self) -> None:
        self._slots.release()
        with self._lock:
            self._pending -= 1
        self._room.set()

    @property
    def pending(self) -> int:
        """Records fed and not yet handled (claim durable or nothing to do)."""
        with self._lock:
            return self._pending

    async def join(self, timeout: float | None = None) -> bool:
        """Wait until every record fed so far is handled; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pending:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    # --- handling --------------------------------------------------------------------------------

    async def process(self, rec: IncomingRecord, received_at: float | None = None) -> str:
        """Handle one record now, with the worker of the account it belongs to; returns the
        worker's decision (``claimed``, ``done``, ``ignored`` ...) once its effects are durable."""
        return await self.runtime.router.route(rec, received_at)

    async def _dispatch(self, queue: asyncio.Queue[_Item]) -> None:
        while True:
            await self._handle(await queue.get())

    async def _handle(self, item: _Item) -> None:
        rec, fed_at = item
        try:
            await self.process(rec, fed_at)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - one bad record never stops the bridge
            self.stats["failed"] += 1
            log.error("record %s/%s of %s failed (%s)", rec.collection, rec.rkey, rec.did, type(e).__name__)
        finally:
            self._release()

    # --- running its own sources -------------------------------------------------------------------

    async def serve(self, stop: asyncio.Event) -> None:
        """Follow the configured ``[watch]`` source for every account until ``stop`` is set
        (the runtime's intake): ``jetstream`` (one connection for all accounts, ``[watch]
        url``), ``firehose`` (one subscription per PDS host, carrying all its accounts) or
        ``poll`` (per account)."""
        if not self._running:
            await self.start()
        intake = self.runtime.intake
        intake.start(live_only=False)
        self.runtime.following = True
        try:
            await run_until(stop, intake.tasks)
        finally:
            self.runtime.following = False
            await intake.stop()

    async def run(self, stop: asyncio.Event, *, ready: asyncio.Event | None = None,
                  out: Printer | None = None) -> None:
        """``gelbridge run``, for one account or many (:meth:`Runtime.run` with the config's
        accounts): log every account in, print what is served, follow the live sources at
        once, backfill what is owed while they run, then poll sources, say ``ready``, and
        serve until ``stop`` is set; then shut down with ``[worker] shutdown_grace``."""
        await self.runtime.run(stop, StaticAccounts(backfill=self.backfill_on_start), ready=ready, out=out)

    # --- synchronous use ---------------------------------------------------------------------------

    def start_in_thread(self, timeout: float = 120.0) -> Bridge:
        """Run the bridge on its own loop in a daemon thread (for synchronous consumers);
        returns once every account is logged in. Stop it with :meth:`close`."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as e:  # noqa: BLE001 - reported to the caller
                failed.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=main, name="gelbridge-bridge", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"the bridge did not start within {timeout:g} s")
        if failed:
            self._thread.join(5)
            raise failed[0]
        return self

    def _call(self, coro: Awaitable[Any], timeout: float) -> Any:
        loop = self._loop
        if loop is None or self._thread is None:
            raise BridgeClosed("not started with start_in_thread()")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)  # type: ignore[arg-type]

    def join_sync(self, timeout: float = 60.0) -> bool:
        """:meth:`join` from another thread (bridge started with :meth:`start_in_thread`)."""
        return bool(self._call(self.join(timeout), timeout + 5))

    def close(self, timeout: float = 60.0) -> None:
        """Stop a bridge started with :meth:`start_in_thread` (bounded by ``timeout``)."""
        if self._thread is None or self._loop is None:
            return
        try:
            self._call(self.aclose(), timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            self._thread = None


__all__ = ["AccountContext", "AccountMixup", "Bridge", "BridgeClosed", "BridgeOverloaded"]
