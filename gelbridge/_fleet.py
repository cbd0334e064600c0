"""The fleet: any number of ``gelbridge run`` processes with one Postgres ``[state] url``
share the accounts of their config, each account served by one live worker at a time.

**Leases.** One row per account in ``leases`` (key: the account's login identifier,
as in the config): its owner, an ``epoch`` that grows with every takeover,
and ``expires_at`` on the database's clock. Every ``lease_seconds / 4`` a worker beats:
one transaction renews its member row and its leases, forgets members whose row
expired, and takes free or expired leases up to its fair share
(``ceil(accounts / live members)``; ``FOR UPDATE SKIP LOCKED``, so two workers never
take the same one). A worker holding more than its share hands the extras over. A
worker that dies stops beating: its leases expire ``lease_seconds`` after its last
beat, and a live worker, which sleeps until exactly then, takes them over.

**Fencing.** A worker trusts a lease only for ``lease_seconds`` after it *sent* the beat
that renewed it (its own monotonic clock, minus 1 % for drift), and starts a write only
while a third of that is left (:meth:`Lease.check`): PDS writes, logins and session
refreshes (``PdsClient.write_guard``), and every state write for the account, which
also checks the lease row itself inside the same transaction, holding it ``FOR SHARE``
so a takeover waits for the write or the write sees the takeover
(:meth:`Lease.check_in`). A worker cut off from Postgres cannot beat, so it stops
writing a third of a lease before anyone could take the lease over. The PDS claim
(create-only reply record, swap on every update) stays the final guard.

**Intake.** With ``[watch] source = "firehose"`` a worker keeps one subscription per PDS
host for all the accounts it serves there (its own cursor key: a cursor matters only
within one worker's life; an account it takes over is backfilled), and hands each
record to the account's bridge; with ``jetstream`` it keeps one connection whose
``wantedDids`` follow the accounts it serves (a change resubscribes from the cursor);
with ``poll`` each account's bridge polls by itself.

**Hand-over.** When an account leaves a worker (a rebalance, SIGTERM), its source stops,
running replies get ``[worker] shutdown_grace`` to finish, then the lease is revoked
(those replies write nothing more: their claims stay open) and released; the next
holder resumes them from the shared claims, with the tool journal keeping every tool
call at most once. A lease lost to expiry is revoked at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gelbridge._config import AccountEntry, Settings
from gelbridge._errors import ConfigError, GelbridgeError, LeaseLost, StateError
from gelbridge._seams import Printer
from gelbridge._state import StateStore, open_state
from gelbridge._state._store import Db

log = logging.getLogger("gelbridge.fleet")

CLOCK_DRIFT = 0.01  # the share of a lease a worker's clock may run slow against the database's
RETRY_CAP = 300.0  # seconds at most between two tries of one worker at an account it failed to serve


def lease_key(account: Settings) -> str:
    """The lease's key for one account's settings (``Settings.for_account``): its login
    identifier (a handle or DID names one account, whichever URL a worker reaches its PDS
    by), as every worker with the same config computes it."""
    return (account.account.identifier or "").strip().lower()


class Lease:
    """This worker's lease on one account: the fence every write for the account passes."""

    __slots__ = ("key", "owner", "epoch", "seconds", "valid_until", "_revoked")

    def __init__(self, key: str, owner: str, epoch: int, seconds: float, valid_until: float) -> None:
        self.key = key
        self.owner = owner
        self.epoch = epoch
        self.seconds = seconds
        self.valid_until = valid_until  # time.monotonic()
        self._revoked = False

    def left(self) -> float:
        """Seconds this worker may still trust the lease (its own clock)."""
        return -1.0 if self._revoked else self.valid_until - time.monotonic()

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless a write may start now: a third of the lease left."""
        if self.left() < self.seconds / 3:
            raise LeaseLost("this worker no longer holds the account's lease; it writes nothing more for it")

    async def check_in(self, db: Db) -> None:
        self.check()
        row = (await db.execute(
            "SELECT 1 FROM leases WHERE account = ? AND owner = ? AND epoch = ? AND expires_at > now() FOR SHARE",
            (self.key, self.owner, self.epoch),
        )).first()
        if row is None:
            raise LeaseLost("the account's lease was taken over; this worker writes nothing more for it")

    def revoke(self) -> None:
        self._revoked = True

    @property
    def revoked(self) -> bool:
        return self._revoked

    def __repr__(self) -> str:
        return f"Lease({self.key!r}, epoch={self.epoch}, left={self.left():.1f}s)"


@dataclass
class Beat:
    """What one heartbeat found: the leases held now, and what changed."""

    held: dict[str, Lease]
    taken: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    members: int = 1
    share: int = 0
    #: seconds until another member's row or lease on our accounts expires (None: none)
    next_expiry: float | None = None


class LeaseBook:
    """The statements of the lease table, one transaction per heartbeat."""

    def __init__(self, store: StateStore, member: str, keys: list[str], seconds: float) -> None:
        if store.backend != "postgres":
            raise ConfigError("a fleet needs [state] url (PostgreSQL): workers share their state there")
        self.store = store
        self.member = member
        self.keys = sorted(set(keys))
        self.seconds = seconds

    async def register(self) -> None:
        """One lease row per configured account (rows other configs made are left alone)."""
        async with self._tx() as db:
            for key in self.keys:
                await db.execute("INSERT INTO leases (account) VALUES (?) ON CONFLICT DO NOTHING", (key,))

    async def beat(self, held: Mapping[str, Lease], *, take: bool = True, skip: frozenset[str] = frozenset()) -> Beat:
        """Renew the member row and ``held``; take free leases up to the fair share (none
        of ``skip``: accounts this member failed to serve a moment ago)."""
        sent = time.monotonic()
        valid_until = sent + self.seconds * (1 - CLOCK_DRIFT)
        secs = self.seconds
        async with self._tx() as db:
            await db.execute("INSERT INTO fleet_members (member, expires_at) VALUES (?, now() + make_interval(secs => ?)) "
                       "ON CONFLICT (member) DO UPDATE SET expires_at = excluded.expires_at", (self.member, secs))
            await db.execute("DELETE FROM fleet_members WHERE expires_at <= now()")
            members = int((await db.execute("SELECT count(*) FROM fleet_members")).rows[0][0])
            renewed = {
                row[0]: int(row[1]) for row in (await db.execute(
                    "UPDATE leases SET expires_at = now() + make_interval(secs => ?) "
                    "WHERE owner = ? AND account = ANY(?) AND expires_at > now() RETURNING account, epoch",
                    (secs, self.member, [k for k in held if not held[k].revoked]))).rows
            }
            share = math.ceil(len(self.keys) / max(members, 1))
            taken: dict[str, int] = {}
            if take and len(renewed) < share:
                taken = {
                    row[0]: int(row[1]) for row in (await db.execute(
                        "UPDATE leases SET owner = ?, epoch = epoch + 1, expires_at = now() + make_interval(secs => ?) "
                        "WHERE account IN (SELECT account FROM leases WHERE account = ANY(?) "
                        "AND (owner IS NULL OR expires_at <= now()) AND NOT account = ANY(?) ORDER BY account "
                        "LIMIT ? FOR UPDATE SKIP LOCKED) RETURNING account, epoch",
                        (self.member, secs, self.keys, sorted(skip), share - len(renewed)))).rows
                }
            nxt = (await db.execute(
                "SELECT EXTRACT(EPOCH FROM (LEAST("
                "(SELECT min(expires_at) FROM leases WHERE account = ANY(?) AND owner IS NOT NULL AND owner <> ?), "
                "(SELECT min(expires_at) FROM fleet_members WHERE member <> ?)) - now()))",
                (self.keys, self.member, self.member))).rows[0][0]
        now_held: dict[str, Lease] = {}
        for key, epoch in renewed.items():
            lease = held[key]
            if lease.epoch == epoch:
                lease.valid_until = valid_until
                now_held[key] = lease
        for key, epoch in taken.items():
            now_held[key] = Lease(key, self.member, epoch, secs, valid_until)
        lost = [k for k in held if k not in now_held]
        return Beat(now_held, list(taken), lost, members, share, None if nxt is None else float(nxt))

    async def release(self, leases: list[Lease]) -> None:
        """Give leases back (free for the next beat of any member)."""
        if not leases:
            return
        async with self._tx() as db:
            for lease in leases:
                await db.execute("UPDATE leases SET owner = NULL, expires_at = now() WHERE account = ? AND owner = ? "
                           "AND epoch = ?", (lease.key, self.member, lease.epoch))

    async def leave(self) -> None:
        """Leave the fleet: the member row, and the cursors only this member used."""
        async with self._tx() as db:
            await db.execute("DELETE FROM fleet_members WHERE member = ?", (self.member,))
            for source in ("firehose", "jetstream"):
                await db.execute("DELETE FROM cursors WHERE source LIKE ?", (f"{source}:%:fleet:{self.member}",))

    def _tx(self) -> Any:
        return self.store.transaction()  # type: ignore[attr-defined]


async def fleet_view(store: StateStore, keys: list[str]) -> dict[str, Any] | None:
    """The live workers and who holds each of ``keys`` (``gelbridge status``); None when
    the store is not a fleet's (SQLite, or no worker has run on it yet)."""
    if store.backend != "postgres":
        return None
    try:
        async with store.transaction() as db:  # type: ignore[attr-defined]
            members = (await db.execute("SELECT member, EXTRACT(EPOCH FROM expires_at - now()) FROM fleet_members "
                                        "WHERE expires_at > now() ORDER BY member")).rows
            leases = (await db.execute("SELECT account, owner, epoch, EXTRACT(EPOCH FROM expires_at - now()) "
                                       "FROM leases WHERE account = ANY(?)", (keys,))).rows
    except StateError:
        return None
    held = {}
    for key, owner, epoch, left in leases:
        live = owner is not None and float(left) > 0
        held[key] = {"owner": owner if live else None, "epoch": int(epoch),
                     "left": round(float(left), 1) if live else None}
    return {"members": [{"member": m, "left": round(float(left), 1)} for m, left in members], "leases": held}


def new_member_id() -> str:
    """This process in the fleet: host, pid and a random tail (a restarted pid is new)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


JETSTREAM = "jetstream"  # the key of a worker's one Jetstream source among its feeds


class _HostFeed:
    """One firehose subscription for every account this worker serves on one PDS host,
    or the worker's one Jetstream connection."""

    def __init__(self, source: Any, task: asyncio.Task[None]) -> None:
        self.source = source
        self.task = task


class _Served:
    """One account this worker serves: its lease, its bridge and the bridge's task."""

    def __init__(self, entry: AccountEntry, lease: Lease, bridge: Any, task: asyncio.Task[None],
                 stop: asyncio.Event) -> None:
        self.entry = entry
        self.lease = lease
        self.bridge = bridge
        self.task = task
        self.stop = stop


class Fleet:
    """``gelbridge run`` with ``[state] url``: serve the accounts this worker holds leases on.

    Each held account runs as its own :class:`~gelbridge._bridge.Bridge` (start-up,
    backfill, sweeps, its own event source, shutdown), on the fleet's one state store;
    its worker carries the lease as its fence.
    """

    def __init__(self, settings: Settings, *, environ: Mapping[str, str] | None = None,
                 member: str | None = None, store: StateStore | None = None) -> None:
        self.settings = settings
        self.environ = environ if environ is not None else os.environ
        self.member = member or new_member_id()
        self.seconds = settings.fleet.lease_seconds
        self._given_store = store
        self.store: StateStore | None = store
        entries = settings.accounts_list()
        self._entries = {lease_key(settings.for_account(e)): e for e in entries}
        if len(self._entries) != len(entries):
            raise ConfigError("two [[accounts]] entries name the same account (PDS and identifier); list each once")
        if settings.watch.source == "jetstream":
            from gelbridge._jetstream import jetstream_url

            jetstream_url(settings.watch)  # refused at start, not when the first account comes
        self.served: dict[str, _Served] = {}
        #: accounts being handed over: their leases are still renewed (their replies may
        #: write until the grace ends), then released; never served again meanwhile
        self.leaving: dict[str, _Served] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._book: LeaseBook | None = None  # while run() runs
        #: accounts whose bridge failed here (login refused, PDS down): not taken again by
        #: this worker until then (time.monotonic()), doubling up to RETRY_CAP
        self._cooldown: dict[str, tuple[float, float]] = {}
        self._feeds: dict[str, _HostFeed] = {}  # PDS URL (firehose) or JETSTREAM -> its source
        self._routes: dict[str, Any] = {}  # DID -> the bridge serving it here
        self.beats = 0
        self.metrics: Any = None
        self.watched: Any = None

    @property
    def interval(self) -> float:
        return self.seconds / 4

    async def run(self, stop: asyncio.Event, *, ready: asyncio.Event | None = None,
                  out: Printer | None = None) -> None:
        """Beat, serve what this worker holds, hand over what it should not, until ``stop``;
        then hand every account over (``[worker] shutdown_grace`` for running replies)."""

        def say(line: str) -> None:
            if out is not None:
                print(line, file=out, flush=True)

        listen = self.settings.observability.listen
        obs_task: asyncio.Task[None] | None = None
        if listen:
            from gelbridge._observability import HttpLimits, Metrics, Watched

            self.metrics = Metrics()
            self.watched = Watched(self.metrics, self._workers, self._sources)
            # first: a taken port ends the start before anything is opened
            await self.watched.bind(listen, HttpLimits.of(self.settings.observability))
        try:
            if self.store is None:
                self.store = await open_state(self.settings)
            book = self._book = LeaseBook(self.store, self.member, list(self._entries), self.seconds)
        except BaseException:
            if self.watched is not None:
                self.watched.close()
            if self._given_store is None and self.store is not None:
                await self.store.aclose()
                self.store = None
            raise
        if self.watched is not None and listen:
            obs_task = asyncio.create_task(self.watched.serve(listen), name="observability")
        try:
            await book.register()
            say(f"fleet: member {self.member}, {len(self._entries)} account(s) shared through "
                f"{self.store.location}, leases of {self.seconds:g} s")
            said_ready = False
            failing = 0
            while not stop.is_set():
                wait = self.interval
                try:
                    now = time.monotonic()
                    skip = frozenset(k for k, (until, _) in self._cooldown.items() if until > now)
                    beat = await book.beat(self._held(), skip=skip)
                except (StateError, LeaseLost) as e:
                    failing += 1
                    if failing == 1 or failing % 60 == 0:  # once, then about once a minute
                        log.warning("fleet heartbeat failed (%s); leases not renewed (%d in a row)", e, failing)
                    await self._drop_expired()
                else:
                    if failing:
                        log.warning("fleet heartbeat works again after %d failure(s)", failing)
                        failing = 0
                    self.beats += 1
                    await self._apply(beat, book, say)
                    if beat.next_expiry is not None and 0 <= beat.next_expiry < wait:
                        wait = beat.next_expiry + 0.05  # take a dead member's accounts the moment they free up
                if self.beats == 1 and not said_ready:
                    said_ready = True
                    say("ready: serving this worker's share of the accounts (Ctrl-C to stop)")
                    if ready is not None:
                        ready.set()
                try:
                    await asyncio.wait_for(stop.wait(), timeout=max(wait, 0.05))
                except TimeoutError:
                    pass
        finally:
            await self._leave_all(book)
            await self._stop_feeds()
            try:
                await book.leave()
            except GelbridgeError as e:
                log.warning("fleet: leaving failed (%s); the member row expires by itself", e)
            if obs_task is not None:
                obs_task.cancel()
                await asyncio.gather(obs_task, return_exceptions=True)
            if self._given_store is None and self.store is not None:
                await self.store.aclose()
                self.store = None

    # --- what a beat changes -----------------------------------------------------------------

    def _held(self) -> dict[str, Lease]:
        return {k: s.lease for k, s in (*self.served.items(), *self.leaving.items())}

    async def _apply(self, beat: Beat, book: LeaseBook, say: Any) -> None:
        for key in beat.lost:
            served = self.served.pop(key, None) or self.leaving.pop(key, None)
            if served is not None:
                log.warning("fleet: lost the lease on %s; stopping at once", served.entry.label)
                served.lease.revoke()
                self._background(self._stop(served, grace=0.0))
        for key in beat.taken:
            entry = self._entries[key]
            self.served[key] = self._serve(entry, beat.held[key])
            say(f"fleet: serving {entry.label} (lease epoch {beat.held[key].epoch})")
        extra = len(self.served) - beat.share
        if extra > 0 and beat.members > 1:
            give = sorted(self.served)[-extra:]
            log.info("fleet: %d member(s) now; handing over %d account(s)", beat.members, extra)
            self._background(self._hand_over(give, book))

    async def _drop_expired(self) -> None:
        """No beat went through: stop serving every account whose lease ran out locally."""
        for key, served in list(self.served.items()):
            try:
                served.lease.check()
            except LeaseLost:
                log.warning("fleet: the lease on %s ran out without a heartbeat; stopping at once",
                            served.entry.label)
                served.lease.revoke()
                del self.served[key]
                self._background(self._stop(served, grace=0.0))
        for served in list(self.leaving.values()):
            if served.lease.left() < served.lease.seconds / 3:
                served.lease.revoke()  # its hand-over goes on; nothing more is written

    def _serve(self, entry: AccountEntry, lease: Lease) -> _Served:
        from gelbridge._bridge import Bridge
        from gelbridge._worker import Worker

        acct = self.settings.for_account(entry)
        acct = acct.model_copy(update={"observability": acct.observability.model_copy(update={"listen": None})})
        environ = self.environ

        def worker_factory(settings: Settings, **kw: Any) -> Worker:
            return Worker(settings, fence=lease, **kw)

        bridge = Bridge(acct, environ=environ, worker_factory=worker_factory, store=self.store)
        bridge.metrics = self.metrics
        stop = asyncio.Event()
        task = asyncio.create_task(self._run_bridge(entry, bridge, stop), name=f"fleet-{entry.label}")
        return _Served(entry, lease, bridge, task, stop)

    async def _run_bridge(self, entry: AccountEntry, bridge: Any, stop: asyncio.Event) -> None:
        try:
            if self.settings.watch.source in ("firehose", "jetstream"):
                await self._run_fed(bridge, stop)
            else:
                await bridge.run(stop)
        except asyncio.CancelledError:
            raise
        except LeaseLost:
            log.warning("fleet: %s stopped: the lease is gone", entry.label)
        except Exception as e:  # noqa: BLE001 - one account's failure never stops the others
            for key, served in list(self.served.items()):
                if served.bridge is bridge:
                    _, last = self._cooldown.get(key, (0.0, 0.0))
                    wait = min(RETRY_CAP, max(self.seconds, last * 2))
                    self._cooldown[key] = (time.monotonic() + wait, wait)
                    log.error("fleet: serving %s failed (%s); its lease is released, and this worker tries it "
                              "again in %.0f s at the earliest", entry.label, type(e).__name__, wait)
                    served.lease.revoke()
                    del self.served[key]
                    try:
                        if self._book is not None:
                            await self._book.release([served.lease])
                    except GelbridgeError:
                        pass

    async def _run_fed(self, bridge: Any, stop: asyncio.Event) -> None:
        """The account's bridge (workers, backfill, sweeps) fed by this worker's one
        subscription on its PDS (or its one Jetstream connection): registered once logged
        in, so the backfill that ``start`` runs in the background covers what came before."""
        dids: list[str] = []
        try:
            await bridge.start()
            for ctx in bridge.accounts.values():
                self._feed(ctx.worker.pds.pds_url, ctx.did, bridge)
                dids.append(ctx.did)
            await stop.wait()
        finally:
            for did in dids:
                self._unfeed(did)
            await bridge.aclose()

    def _feed(self, pds_url: str, did: str, bridge: Any) -> None:
        from gelbridge._worker.sources import FirehoseSource

        self._routes[did] = bridge
        if self.settings.watch.source == "jetstream":
            self._follow_jetstream(did)
            return
        host = pds_url.rstrip("/")
        feed = self._feeds.get(host)
        if feed is None:
            assert self.store is not None
            source = FirehoseSource(host, set(), self.store, self._route, on_gap=self._gap(host),
                                    on_reconnect=self._reconnected(host),
                                    key=f"firehose:{host}:fleet:{self.member}")
            feed = _HostFeed(source, asyncio.create_task(source.run(), name=f"fleet-firehose-{host}"))
            self._feeds[host] = feed
        feed.source.dids.add(did)

    def _follow_jetstream(self, did: str) -> None:
        from gelbridge._jetstream import JetstreamSource, jetstream_cursor_key

        feed = self._feeds.get(JETSTREAM)
        if feed is None:
            assert self.store is not None
            url = self.settings.watch.url or ""  # checked in __init__
            source = JetstreamSource(url, [], self.store, self._route, on_reconnect=self._reconnected(None),
                                     key=f"{jetstream_cursor_key(url)}:fleet:{self.member}")
            feed = _HostFeed(source, asyncio.create_task(source.run(), name="fleet-jetstream"))
            self._feeds[JETSTREAM] = feed
        feed.source.set_dids(feed.source.dids | {did})

    def _unfeed(self, did: str) -> None:
        self._routes.pop(did, None)
        for key, feed in self._feeds.items():
            if key == JETSTREAM:  # resubscribes without it
                feed.source.set_dids(feed.source.dids - {did})
            else:
                feed.source.dids.discard(did)

    async def _route(self, rec: Any) -> str:
        bridge = self._routes.get(rec.did)
        if bridge is None:
            return "ignored"  # not served here (any more): its lease holder's subscription has it
        result: str = await bridge.process(rec)
        return result

    def _workers_on(self, host: str | None) -> list[Any]:
        """The workers fed from this PDS host (None: from anywhere, as Jetstream is)."""
        return [ctx.worker for b in {id(b): b for b in self._routes.values()}.values()
                for ctx in b.accounts.values() if host is None or ctx.worker.pds.pds_url.rstrip("/") == host]

    def _gap(self, host: str) -> Any:
        from gelbridge._worker.watch import backfill_logged

        async def on_gap(did: str | None) -> None:
            await asyncio.gather(*(backfill_logged(w.label, w, "gap") for w in self._workers_on(host)
                                   if did in (None, w.did)))

        return on_gap

    def _reconnected(self, host: str | None) -> Any:
        def on_reconnect() -> None:
            for w in self._workers_on(host):
                w.reconnected()

        return on_reconnect

    async def _stop_feeds(self) -> None:
        from gelbridge._worker.watch import stop_tasks

        feeds, self._feeds = list(self._feeds.values()), {}
        await stop_tasks([f.task for f in feeds], [f.source for f in feeds])

    async def _stop(self, served: _Served, *, grace: float) -> None:
        served.bridge.shutdown_grace = grace
        served.stop.set()
        bound = grace + 60.0
        try:
            await asyncio.wait_for(asyncio.shield(served.task), timeout=bound)
        except TimeoutError:
            log.error("fleet: %s did not stop within %.0f s; cancelled", served.entry.label, bound)
            served.task.cancel()
            await asyncio.gather(served.task, return_exceptions=True)
        except Exception:  # noqa: BLE001 - logged by _run_bridge
            pass

    def _background(self, work: Any) -> None:
        """A stop or hand-over, off the heartbeat loop (a grace period must not stall beats)."""
        task = asyncio.create_task(work)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _hand_over(self, keys: list[str], book: LeaseBook) -> None:
        """Stop serving ``keys`` gracefully (together), then give their leases back; their
        leases are renewed meanwhile (``leaving``)."""
        leaving = [self.served.pop(k) for k in keys if k in self.served]
        if not leaving:
            return
        for s in leaving:
            self.leaving[s.lease.key] = s
        try:
            grace = self.settings.worker.shutdown_grace
            await asyncio.gather(*(self._stop(s, grace=grace) for s in leaving))
        finally:
            for s in leaving:
                s.lease.revoke()
                self.leaving.pop(s.lease.key, None)
            try:
                await book.release([s.lease for s in leaving])
            except GelbridgeError as e:
                log.warning("fleet: releasing %d lease(s) failed (%s); they expire by themselves", len(leaving), e)
        for s in leaving:
            log.info("fleet: handed %s over", s.entry.label)

    async def _leave_all(self, book: LeaseBook) -> None:
        """Shutdown: hand every account over, beating (without taking) while replies get
        their grace, so the leases stay valid for their last writes."""
        self._background(self._hand_over(list(self.served), book))
        while self._stopping:
            await asyncio.wait(set(self._stopping), timeout=self.interval)
            if self._stopping and self.leaving:
                try:
                    await book.beat(self._held(), take=False)
                except (StateError, LeaseLost) as e:
                    log.warning("fleet: heartbeat during the hand-over failed (%s)", e)
                    await self._drop_expired()

    # --- what the health server looks at ----------------------------------------------------------

    def _workers(self) -> list[tuple[str, Any]]:
        out = []
        for s in self.served.values():
            for ctx in s.bridge.accounts.values() if s.bridge._running else []:
                out.append((s.entry.label, ctx.worker))
        return out

    def _sources(self) -> dict[str, Any]:
        found: dict[str, Any] = {("jetstream" if host == JETSTREAM else f"firehose-{host}"): f.source
                                 for host, f in self._feeds.items()}
        for s in self.served.values():
            for name, src in s.bridge.sources.items():
                found[f"{s.entry.label}:{name}"] = src
        return found
