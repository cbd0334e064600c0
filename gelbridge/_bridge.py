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
order fed; different messages run concurrently.

**Cursors.** A record's effects are durable (claim written, or nothing to do) when
``Worker.handle_event`` returns; :attr:`pending` counts records fed but not yet there.
Save your stream cursor after ``await bridge.join()`` (or when ``pending == 0``).

**Many accounts.** ``[[accounts]]`` in the config (or the single ``[account]``): each
account gets its own :class:`Worker` with its own PDS session, keyring, state directory
and defaults. A record is routed by its DID to that account's worker only, and the
worker writes only through its own PDS session, whose DID must equal the record's DID
(checked on every record: :class:`AccountMixup`). There is no path from an event of one
DID to another account's keyring or repo.

**The one orchestrator.** :meth:`run` is ``gelbridge run``, for one account or many
(``Worker.run`` is :meth:`run` around that one worker, :meth:`around`): start-up,
backfill, the recovery sweeps, the ``[watch]`` sources
(:func:`gelbridge._worker.watch.watch_sources`), health and metrics, and shutdown grace
are written once, here. Each account's backfill and sweep are its worker's
(``Worker.backfill``, ``Worker.sweep_loop``); a library consumer that feeds records
itself uses :meth:`start` and the ``feed_*`` methods instead of :meth:`run`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gelbridge import _tracing as tracing
from gelbridge._config import Settings, load_config
from gelbridge._errors import ConfigError, GelbridgeError
from gelbridge._ingest import (
    IncomingRecord,
    RecordFilter,
    from_firehose,
    from_jetstream_event,
    from_record,
)
from gelbridge._seams import Printer
from gelbridge._state import StateStore, open_state, state_location
from gelbridge._worker.watch import backfill_logged, deliver, run_until, stop_tasks, watch_sources

log = logging.getLogger("gelbridge.bridge")


class BridgeOverloaded(GelbridgeError):
    """All queue slots stayed taken: the bridge cannot keep up with what is fed."""

    kind = "overloaded"


class BridgeClosed(GelbridgeError):
    """The bridge is not running (not started yet, or closed)."""

    kind = "invalid_request"


class AccountMixup(GelbridgeError):
    """A record was about to be handled by a worker of another account (a bug; never happens)."""

    kind = "invalid_request"


@dataclass(frozen=True)
class AccountContext:
    """One served account: its label, DID, narrowed settings and worker (own keyring,
    PDS session and state). Looked up by the DID of each record."""

    label: str
    did: str
    settings: Settings
    worker: Any  # gelbridge._worker.Worker

    def check(self, did: str) -> None:
        """Refuse to handle a record of ``did`` unless this account *is* ``did``, down to the
        DID of the PDS session its worker writes through."""
        session = getattr(getattr(self.worker, "pds", None), "session", None)
        if not (did == self.did == self.worker.did and session is not None and session.did == did):
            raise AccountMixup(f"record of {did} routed to account {self.label} ({self.did}); not handled")


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
        worker_factory: Callable[..., Any] | None = None,
        sweep_interval: float = 30.0,
        store: StateStore | None = None,
    ) -> None:
        """``keyrings`` (by account label) replace the keyring files; ``environ`` is where
        app passwords are read (default ``os.environ``); ``backfill`` defaults to
        ``[worker] backfill``; ``store``: the state store to use, left open at the end
        (default: opened from ``[state]`` and closed with the bridge)."""
        if queue_size < 1 or shards < 1:
            raise ValueError("queue_size and shards must be at least 1")
        self.settings = settings
        self.queue_size = queue_size
        self.put_timeout = put_timeout
        self.backfill_on_start = settings.worker.backfill if backfill is None else backfill
        self._keyrings = dict(keyrings or {})
        self._environ = environ if environ is not None else os.environ
        self._worker_factory = worker_factory
        self._sweep_interval = sweep_interval
        self._n_shards = shards
        self._entries = settings.accounts_list()  # validates the account list early
        self._by_did: dict[str, AccountContext] = {}
        self._filter: RecordFilter | None = None
        self._store: StateStore | None = None
        self._given_store = store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._shards: list[asyncio.Queue[_Item]] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._slots = threading.Semaphore(queue_size)
        self._room = asyncio.Event()
        self._lock = threading.Lock()
        self._pending = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self.stats: Counter[str] = Counter()
        self.sources: dict[str, Any] = {}  # what serve() follows, by name (after source_coroutines())
        self.jetstream: Any = None  # the JetstreamSource, for source = "jetstream"
        self._serving = False  # serve() follows sources of its own (else records are fed)
        self._adopted: Any = None  # the one started-or-not Worker of Bridge.around()
        self.metrics: Any = None  # gelbridge._observability.Metrics, when [observability] listen is set
        self.watched: Any = None  # gelbridge._observability.Watched, while it serves
        #: seconds running replies get when the bridge stops (None: [worker] shutdown_grace)
        self.shutdown_grace: float | None = None

    @classmethod
    def from_config(cls, path: str | Path | None = None, **kw: Any) -> Bridge:
        """A bridge for the config file ``path`` (or ``$GELBRIDGE_CONFIG``)."""
        return cls(load_config(path), **kw)

    # --- lifecycle -----------------------------------------------------------------------------

    @property
    def accounts(self) -> Mapping[str, AccountContext]:
        """The served accounts by DID (read-only)."""
        return MappingProxyType(self._by_did)

    @property
    def filter(self) -> RecordFilter:
        if self._filter is None:
            raise BridgeClosed("start the bridge first (async with / await bridge.start())")
        return self._filter

    @property
    def store(self) -> StateStore:
        """The state store of the process (shared-source cursors; the single account's state)."""
        if self._store is None:
            raise BridgeClosed("start the bridge first")
        return self._store

    def _new_worker(self, settings: Settings, keyring: Any, store: StateStore | None) -> Any:
        if self._worker_factory is not None:
            return self._worker_factory(settings, keyring=keyring, store=store, environ=self._environ)
        from gelbridge._worker import Worker

        return Worker(settings, keyring=keyring, store=store, environ=self._environ)

    @classmethod
    def around(cls, worker: Any, **kw: Any) -> Bridge:
        """A bridge serving exactly ``worker`` (one account; its own keyring, store, PDS
        client and model): how :meth:`Worker.run` runs, so one account and many go
        through the same orchestrator code."""
        bridge = cls(worker.settings, worker_factory=lambda *a, **k: worker, environ=worker.environ, **kw)
        bridge._adopted = worker
        return bridge

    async def start(self) -> None:
        """Open state, log every account in, start the dispatchers (and the backfill)."""
        await self._start(background_backfill=self.backfill_on_start)

    async def _start(self, *, background_backfill: bool) -> None:
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        tracing.configure(self.settings.observability)
        listen = self.settings.observability.listen
        if listen:
            from gelbridge._observability import HttpLimits, Metrics, Watched

            if self.metrics is None:
                self.metrics = Metrics()  # one registry for every account (labelled by account)
            self.watched = Watched(self.metrics, lambda: [(c.label, c.worker) for c in self._by_did.values()],
                                   lambda: self.sources if self._serving else None)
            # first: a taken port ends the start before any login or write
            await self.watched.bind(listen, HttpLimits.of(self.settings.observability))
        adopted = self._adopted
        started: list[AccountContext] = []
        try:
            if self._given_store is not None:
                self._store = self._given_store
            elif adopted is not None and adopted.given_store is not None:
                self._store = adopted.given_store  # the worker's own (it closes it)
            elif adopted is not None:
                self._store = None  # the worker opens [state] dir itself; shared below
            else:
                self._store = await open_state(self.settings)
            for entry in self._entries:
                acct = self.settings.for_account(entry)
                shared = state_location(acct) == state_location(self.settings)
                worker = self._new_worker(acct, self._keyrings.get(entry.label), self._store if shared else None)
                if self.metrics is not None:
                    worker.metrics, worker.label = self.metrics, entry.label
                try:
                    if not getattr(worker, "started", False):
                        await worker.start()
                except BaseException:
                    await worker.aclose(0)  # what it opened before failing
                    raise
                if self._store is None:
                    self._store = worker.store
                deps = getattr(worker, "deps", None)
                if self.metrics is not None and deps is not None:  # started before: its turns count here too
                    deps.metrics, deps.label = self.metrics, entry.label
                ctx = AccountContext(entry.label, worker.did, acct, worker)
                if ctx.did in self._by_did:
                    await worker.aclose(0)
                    raise ConfigError(f"accounts {self._by_did[ctx.did].label} and {entry.label} are the same "
                                      f"account ({ctx.did}); list each account once")
                ctx.check(ctx.did)
                self._by_did[ctx.did] = ctx
                started.append(ctx)
        except BaseException:
            for ctx in started:
                await ctx.worker.aclose(0)
            self._by_did.clear()
            if self._store is not None and self._adopted is None and self._given_store is None:
                await self._store.aclose()
            self._store = None
            if self.watched is not None:
                self.watched.close()
            raise
        relays: dict[str, Any] = {}  # one relay budget per PDS host: the relay counts the host's events
        for ctx in self._by_did.values():
            pds = getattr(ctx.worker, "pds", None)
            if getattr(pds, "relay", None) is not None:
                pds.relay = relays.setdefault(pds.relay.host, pds.relay)  # type: ignore[union-attr]
        self._filter = RecordFilter.for_dids(self._by_did)
        self._shards = [asyncio.Queue() for _ in range(self._n_shards)]
        self._room = asyncio.Event()
        self._tasks = [asyncio.create_task(self._dispatch(q), name=f"bridge-shard-{i}")
                       for i, q in enumerate(self._shards)]
        for ctx in self._by_did.values():  # the same upkeep as gelbridge run, per account
            self._tasks.append(asyncio.create_task(ctx.worker.sweep_loop(self._sweep_interval,
                                                                         at_start=not self.backfill_on_start),
                                                   name=f"sweep-{ctx.label}"))
            if background_backfill:
                self._tasks.append(asyncio.create_task(backfill_logged(ctx.label, ctx.worker),
                                                       name=f"backfill-{ctx.label}"))
        if listen:
            self._tasks.append(asyncio.create_task(self.watched.serve(listen), name="observability"))
            for ctx in self._by_did.values():
                ctx.worker.watched = self.watched
        self._running = True
        log.info("bridge serving %d account(s)", len(self._by_did))

    async def aclose(self, grace: float | None = None) -> None:
        """Stop taking records; let queued ones finish (bounded); shut the workers down."""
        if not self._running and not self._by_did:
            return
        self._running = False
        if grace is None:
            grace = self.shutdown_grace
        g = self.settings.worker.shutdown_grace if grace is None else grace
        await self.join(timeout=g)
        await stop_tasks(self._tasks)
        self._tasks = []
        ctxs = list(self._by_did.values())  # together: the grace period is one, not one per account
        closed = await asyncio.gather(*(c.worker.aclose(g) for c in ctxs), return_exceptions=True)
        for ctx, res in zip(ctxs, closed):
            if isinstance(res, Exception):
                log.error("closing account %s failed (%s)", ctx.label, type(res).__name__)
        self._by_did.clear()
        if self._store is not None and self._adopted is None and self._given_store is None:
            await self._store.aclose()
        self._store = None

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
        ctx = self._by_did.get(rec.did)
        if ctx is None:
            self.stats["unrouted"] += 1
            return "ignored"
        ctx.check(rec.did)
        result = await deliver(ctx.worker, rec, received_at)
        self.stats[f"handled-{result}"] += 1
        return result

    async def _dispatch(self, queue: asyncio.Queue[_Item]) -> None:
        while True:
            rec, fed_at = await queue.get()
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
        """Follow the configured ``[watch]`` source for every account until ``stop`` is set:
        ``jetstream`` (one connection for all accounts, ``[watch] url``), ``firehose`` (one
        subscription per PDS host, carrying all its accounts) or ``poll`` (per account)."""
        if not self._running:
            await self.start()
        tasks = [asyncio.create_task(c, name=n) for n, c in self.source_coroutines()]
        self._serving = True
        try:
            await run_until(stop, tasks)
        finally:
            await stop_tasks(tasks, self.sources.values())

    def source_coroutines(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        """``(name, coroutine)`` of every event source :meth:`serve` runs: the sources
        ``gelbridge run`` follows, built for every account (:meth:`build_sources`)."""
        return [(name, src.run()) for name, src in self.build_sources().items()]

    def build_sources(self) -> dict[str, Any]:
        """The ``[watch]`` sources for every account (``watch.watch_sources``), kept in
        :attr:`sources`; each worker learns the one that carries its DID."""
        self.sources = dict(watch_sources(self.settings.watch, {c.label: c.worker for c in self._by_did.values()},
                                          self.store, self.process))
        self.jetstream = self.sources.get("jetstream")
        for ctx in self._by_did.values():
            ctx.worker.source = next((s for s in self.sources.values() if ctx.did in s.dids), None)
        return self.sources

    async def run(self, stop: asyncio.Event, *, ready: asyncio.Event | None = None,
                  out: Printer | None = None) -> None:
        """``gelbridge run``, for one account or many: log every account in, print what
        is served, follow the live sources (firehose, Jetstream) at once, backfill what
        is owed while they run (no gap between the two), then poll sources, say
        ``ready``, and serve until ``stop`` is set; then shut down with
        ``[worker] shutdown_grace`` for running replies."""

        def say(line: str) -> None:
            if out is not None:
                print(line, file=out, flush=True)

        tasks: list[asyncio.Task[None]] = []
        try:
            await self._start(background_backfill=False)
            sources = self.build_sources()  # first: each account's start-up lines name its source
            for ctx in self._by_did.values():
                for line in await ctx.worker.startup_lines():
                    say(line)
            self._serving = True
            live = {n: s for n, s in sources.items() if s.live}
            tasks = [asyncio.create_task(s.run(), name=n) for n, s in live.items()]
            if self.backfill_on_start and not await self._backfill_all(stop, say):
                return  # stopped during the backfill
            tasks += [asyncio.create_task(s.run(), name=n) for n, s in sources.items() if n not in live]
            say("ready: answering messages (Ctrl-C to stop)")
            if ready is not None:
                ready.set()
            await run_until(stop, [*tasks, *self._tasks])
        finally:
            await stop_tasks(tasks, self.sources.values())
            await self.aclose()

    async def _backfill_all(self, stop: asyncio.Event, say: Callable[[str], None]) -> bool:
        """Every account's start-up backfill, at once; one that fails is logged and its
        account served anyway (the recovery sweep retries what it owes), as a background
        backfill is. False: ``stop`` was set first (the backfills are cancelled)."""
        ctxs = list(self._by_did.values())
        work = asyncio.ensure_future(asyncio.gather(*(c.worker.backfill() for c in ctxs), return_exceptions=True))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            return False
        for ctx, rep in zip(ctxs, work.result()):
            who = f" ({ctx.label})" if len(ctxs) > 1 else ""
            if isinstance(rep, BaseException):
                log.error("account %s: start-up backfill failed (%s); the recovery sweep retries what it owes",
                          ctx.label, type(rep).__name__)
                say(f"  backfill   failed ({type(rep).__name__}); the recovery sweep retries{who}")
                continue
            say(f"  backfill   {rep.messages} message(s) asking for replies, {rep.owed} owed, "
                f"{rep.resumed} unfinished resumed, {rep.unfinished_claims} claim(s) recovered{who}")
        return True

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
