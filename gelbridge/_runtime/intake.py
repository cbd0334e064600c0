"""The one intake: the event sources ``[watch]`` asks for, for the accounts a
:class:`~gelbridge._runtime.router.Router` serves, and where their gaps and reconnects go.

- ``firehose``: one :class:`~gelbridge._worker.sources.FirehoseSource` per PDS host,
  carrying every account on it; ``jetstream``: one
  :class:`~gelbridge._jetstream.JetstreamSource` (``wantedDids``: the accounts served);
  ``poll``: one :class:`~gelbridge._worker.sources.PollSource` per account. Each is an
  :class:`~gelbridge._worker.sources.EventSource` and hands every record to
  :meth:`Router.route <gelbridge._runtime.router.Router.route>`.
- A firehose gap (``OutdatedCursor``, a repo's ``#sync``, ``FutureCursor``) backfills the
  accounts it concerns (:func:`backfill_logged`); a reconnect of any source tells the
  workers it carries (:meth:`~gelbridge._worker.Worker.reconnected`: cached side records
  dropped, recovery sweep now). Both look the accounts up in the router when they happen,
  so they concern exactly the accounts served at that moment.

**A fixed or a changing account set.** Without ``member`` the accounts are the config's:
the sources are built once for all of them (:meth:`Intake.attach` before
:meth:`Intake.start`), and the cursors are kept under the keys ``gelbridge status`` reads
(a firehose subscription's names its DIDs). With ``member`` (a fleet worker) accounts come
and go while the sources run: a host's subscription or the Jetstream connection is opened
for its first account and follows the set as it changes, its cursor kept under the
member's own key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gelbridge._config import WatchConfig
from gelbridge._jetstream import JetstreamSource, jetstream_cursor_key, jetstream_url
from gelbridge._runtime.router import Account, Router
from gelbridge._state import StateStore
from gelbridge._worker import Worker
from gelbridge._worker.sources import EventSource, FirehoseSource, GapHandler, PollSource, firehose_cursor_key

log = logging.getLogger("gelbridge.runtime.intake")

JETSTREAM = "jetstream"  # the name of the one Jetstream source


async def backfill_logged(label: str, worker: Worker, why: str = "start-up") -> None:
    """``worker.backfill()`` in the background: its outcome is logged, never raised (the
    live source and the recovery sweeps carry on either way)."""
    try:
        rep = await worker.backfill()
    except Exception as e:  # noqa: BLE001
        log.error("account %s: %s backfill failed (%s)", label, why, type(e).__name__)
        return
    log.info("account %s: %s backfill found %d owed, resumed %d", label, why, rep.owed, rep.resumed)


async def run_until(stop: asyncio.Event, tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Wait until ``stop`` is set or one of ``tasks`` ends; a task that failed has its
    exception raised here (a source or sweep never ends by itself)."""
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    for t in done:
        if t is not stopper and not t.cancelled() and (e := t.exception()) is not None:
            raise e


async def stop_tasks(tasks: Sequence[asyncio.Task[Any]], sources: Iterable[EventSource] = (),
                     timeout: float = 5.0) -> None:
    """Cancel ``tasks`` (sources, sweeps, backfills), then let the records a firehose source
    still has in flight finish, so their claims and its cursor are saved; each step bounded
    by ``timeout`` s."""
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    for src in sources:
        await src.drain(timeout=timeout)


class Intake:
    """The sources of the accounts ``router`` serves (see the module docstring)."""

    def __init__(self, watch: WatchConfig, store: StateStore, router: Router, *, member: str | None = None,
                 firehose_in_flight: int = 64) -> None:
        """``store`` keeps the firehose and Jetstream cursors (a poll source uses its
        account's own store); ``member``: a fleet member's id (a changing account set);
        ``firehose_in_flight`` bounds the records of one subscription handled at once."""
        if watch.source == "jetstream":
            jetstream_url(watch)  # no URL: refused now, not when the first account comes
        self.watch = watch
        self.store = store
        self.router = router
        self.member = member
        self.firehose_in_flight = firehose_in_flight
        #: every source, by name (``firehose-<host>``, ``jetstream``, ``poll-<label>``)
        self.sources: dict[str, EventSource] = {}
        self._firehoses: dict[str, FirehoseSource] = {}  # by PDS host
        self._jetstream: JetstreamSource | None = None
        self._waiting: list[Account] = []  # a fixed set: attached, the sources not built yet
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False

    # --- which accounts ------------------------------------------------------------------------

    def attach(self, account: Account) -> None:
        """Follow ``account`` (it is in the router already). A fixed set's sources are built
        at :meth:`start`; a changing set's at once (and run if the intake runs)."""
        if self.member is None:
            if self._started:
                raise RuntimeError("a fixed account set is complete once the intake has started")
            self._waiting.append(account)
            return
        if self.watch.source == "poll":
            self.sources[self._poll_name(account)] = self._poll(account)
        elif self.watch.source == "jetstream":
            js = self._jetstream
            if js is None:
                url = jetstream_url(self.watch)
                js = self._jetstream = JetstreamSource(url, [], self.store, self.router.route,
                                                       on_reconnect=self._reconnected(None),
                                                       key=f"{jetstream_cursor_key(url)}:fleet:{self.member}")
                self.sources[JETSTREAM] = js
            js.set_dids(js.dids | {account.did})
        else:
            host = account.pds_host
            fh = self._firehoses.get(host)
            if fh is None:
                fh = self._firehoses[host] = self._firehose(host, set(), key=f"firehose:{host}:fleet:{self.member}")
            fh.follow(account.did)
        if self._started and self.watch.source != "poll":
            self._run_new(live_only=True)

    async def detach(self, account: Account) -> None:
        """Stop following ``account`` (a changing set): its poll source stops; a shared
        subscription goes on for the others (Jetstream resubscribes without it)."""
        if self.watch.source == "poll":
            name = self._poll_name(account)
            src = self.sources.pop(name, None)
            task = self._tasks.pop(name, None)
            await stop_tasks([task] if task is not None else [], [src] if src is not None else [])
            return
        if self._jetstream is not None:
            self._jetstream.set_dids(self._jetstream.dids - {account.did})
        for fh in self._firehoses.values():
            fh.unfollow(account.did)

    async def wait_live(self, did: str, timeout: float = 10.0) -> None:
        """Wait (bounded) until the live source carrying ``did`` is subscribed: a backfill's
        listing must not begin before the subscription does, or a record written between
        the two is in neither (a fleet member's new firehose starts from now, not a cursor)."""
        src = self.source_of(did)
        if src is None or not src.live or src.connected.is_set():
            return
        try:
            await asyncio.wait_for(src.connected.wait(), timeout)
        except TimeoutError:
            log.warning("the event source for %s is not connected after %.0f s; backfilling anyway", did, timeout)

    def source_of(self, did: str) -> EventSource | None:
        """The source that carries ``did`` (None: not followed, or fed by a library consumer)."""
        return next((s for s in self.sources.values() if did in s.dids), None)

    async def describe(self, account: Account) -> str:
        """The start-up line's ``source`` for ``account``: which source, and its cursor."""
        w = self.watch
        if w.source == "poll":
            return f"poll every {w.poll_interval:g} s (listRecords on its PDS)"
        if w.source == "jetstream":
            url = jetstream_url(w)
            js = self._jetstream
            key = js.key if js is not None else jetstream_cursor_key(url)
            others = len((js.dids if js is not None else frozenset()) - {account.did})
            wanted = f"wantedDids {account.did}" + (f" and {others} other account(s)" if others else "")
            return f"jetstream {url} ({wanted}; cursor {await self._cursor(key)})"
        fh = self._firehoses.get(account.pds_host)
        key = fh.key if fh is not None else firehose_cursor_key(account.pds_host, account.did)
        return f"firehose (cursor {await self._cursor(key)})"

    # --- running -------------------------------------------------------------------------------

    def build(self) -> dict[str, EventSource]:
        """A fixed set: the sources for every attached account (once), by name."""
        if self.member is None and self._waiting:
            accounts, self._waiting = self._waiting, []
            if self.watch.source == "poll":
                for a in accounts:
                    self.sources[self._poll_name(a)] = self._poll(a)
            elif self.watch.source == "jetstream":
                url = jetstream_url(self.watch)
                self._jetstream = JetstreamSource(url, [a.did for a in accounts], self.store, self.router.route,
                                                  on_reconnect=self._reconnected(None))
                self.sources[JETSTREAM] = self._jetstream
            else:
                hosts: dict[str, list[str]] = {}
                for a in accounts:
                    hosts.setdefault(a.pds_host, []).append(a.did)
                for host, dids in hosts.items():
                    self._firehoses[host] = self._firehose(host, dids)
        return self.sources

    def start(self, *, live_only: bool) -> None:
        """Run the sources not running yet: the live ones (firehose, Jetstream: before a
        backfill, so nothing falls between the two), or all (poll: after it)."""
        self.build()
        self._started = True
        self._run_new(live_only=live_only)

    def start_poll(self, account: Account) -> None:
        """A changing set: run ``account``'s poll source (after its backfill)."""
        name = self._poll_name(account)
        src = self.sources.get(name)
        if src is not None and name not in self._tasks:
            self._tasks[name] = asyncio.create_task(src.run(), name=name)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks.values())

    async def stop(self) -> None:
        """Stop every source; records in flight finish (bounded) and their cursors are saved."""
        tasks, self._tasks = list(self._tasks.values()), {}
        self._started = False
        await stop_tasks(tasks, list(self.sources.values()))

    def _run_new(self, *, live_only: bool) -> None:
        for name, src in self.sources.items():
            if name not in self._tasks and (src.live or not live_only):
                self._tasks[name] = asyncio.create_task(src.run(), name=name)

    # --- the pieces ----------------------------------------------------------------------------

    @staticmethod
    def _poll_name(account: Account) -> str:
        return f"poll-{account.label}"

    def _firehose(self, host: str, dids: list[str] | set[str], *, key: str | None = None) -> FirehoseSource:
        src = FirehoseSource(host, dids, self.store, self.router.route, on_gap=self._gap(host),
                             on_reconnect=self._reconnected(host), max_in_flight=self.firehose_in_flight, key=key)
        self.sources[f"firehose-{host}"] = src
        return src

    def _poll(self, account: Account) -> PollSource:
        w = account.worker
        return PollSource(w.pds, w.did, w.store, self.router.route, interval=self.watch.poll_interval,
                          on_reconnect=self._reconnected_did(account.did), follow_grants=w.grants.enabled)

    async def _cursor(self, key: str) -> str:
        cur = await self.store.get_cursor(key)
        return str(cur) if cur is not None else "none: starting live + backfill"

    def _gap(self, host: str) -> GapHandler:
        """Backfill the accounts on ``host`` a gap concerns (``did``, or all of them for None)."""

        async def on_gap(did: str | None) -> None:
            await asyncio.gather(*(backfill_logged(a.label, a.worker, "gap") for a in self.router.on_host(host)
                                   if did in (None, a.did)))

        return on_gap

    def _reconnected(self, host: str | None) -> Callable[[], None]:
        def on_reconnect() -> None:
            for a in self.router.on_host(host):
                a.worker.reconnected()

        return on_reconnect

    def _reconnected_did(self, did: str) -> Callable[[], None]:
        def on_reconnect() -> None:
            account = self.router.get(did)
            if account is not None:
                account.worker.reconnected()

        return on_reconnect
