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

**Serving.** :class:`Fleet` is an account set of the one runtime
(:class:`gelbridge._runtime.Runtime`): an account whose lease this worker takes is attached
(its worker fenced by the lease), backfilled and swept like any other, and detached when
the lease goes. The runtime's intake follows the changing set: with ``[watch] source =
"firehose"`` one subscription per PDS host for all the accounts served there (the
member's own cursor key: a cursor matters only within one worker's life; an account it
takes over is backfilled); with ``jetstream`` one connection whose ``wantedDids`` follow
the accounts (a change resubscribes from the cursor); with ``poll`` one poller per
account, started after its backfill.

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
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from gelbridge._config import AccountEntry, Settings
from gelbridge._errors import ConfigError, GelbridgeError, LeaseLost, StateError
from gelbridge._runtime import Runtime
from gelbridge._runtime.runtime import Say
from gelbridge._seams import Printer
from gelbridge._state import StateStore
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


@dataclass
class _Stop:
    """How an account's serving task is told to stop, and the grace its replies get."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    grace: float = 0.0


@dataclass
class _Served:
    """One account this worker serves: its lease, and the task serving it until
    ``stop`` (attach, upkeep, then detach with the grace the stop asked for)."""

    entry: AccountEntry
    lease: Lease
    task: asyncio.Task[None]
    stop: _Stop


class Fleet:
    """``gelbridge run`` with ``[state] url``: serve the accounts this worker holds leases on.

    An :class:`~gelbridge._runtime.AccountSet` of the one runtime: every held account is
    attached with its lease as the fence of its worker, and detached when the lease goes
    (handed over with ``[worker] shutdown_grace``, or lost: at once).
    """

    def __init__(self, settings: Settings, *, environ: Mapping[str, str] | None = None,
                 member: str | None = None, store: StateStore | None = None) -> None:
        """``environ`` and ``store`` are the runtime's (:meth:`run`)."""
        self.settings = settings
        self.environ = environ
        self.member = member or new_member_id()
        self.seconds = settings.fleet.lease_seconds
        self._given_store = store
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
        self._book: LeaseBook | None = None  # while serve() runs
        self._runtime: Runtime | None = None  # while serve() runs
        #: accounts whose start failed here (login refused, PDS down): not taken again by
        #: this worker until then (time.monotonic()), doubling up to RETRY_CAP
        self._cooldown: dict[str, tuple[float, float]] = {}
        self.beats = 0

    @property
    def interval(self) -> float:
        return self.seconds / 4

    @property
    def store(self) -> StateStore | None:
        """The fleet's state store, while it runs."""
        return self._runtime.store if self._runtime is not None else None

    async def run(self, stop: asyncio.Event, *, ready: asyncio.Event | None = None,
                  out: Printer | None = None) -> None:
        """The runtime of this member, serving this fleet's share until ``stop``."""
        runtime = Runtime(self.settings, environ=self.environ, store=self._given_store, member=self.member)
        await runtime.run(stop, self, ready=ready, out=out)

    async def serve(self, runtime: Runtime, stop: asyncio.Event, say: Say, ready: Callable[[], None]) -> None:
        """Beat, serve what this worker holds, hand over what it should not, until ``stop``;
        then hand every account over (``[worker] shutdown_grace`` for running replies)."""
        self._runtime = runtime
        store = runtime.store
        book = self._book = LeaseBook(store, self.member, list(self._entries), self.seconds)
        runtime.following = True
        runtime.intake.start(live_only=True)
        try:
            await book.register()
            say(f"fleet: member {self.member}, {len(self._entries)} account(s) shared through "
                f"{store.location}, leases of {self.seconds:g} s")
            await self._beat_until(stop, book, say, ready)
        finally:
            await self._leave_all(book)
            try:
                await book.leave()
            except GelbridgeError as e:
                log.warning("fleet: leaving failed (%s); the member row expires by itself", e)
            self._book = None

    async def _beat_until(self, stop: asyncio.Event, book: LeaseBook, say: Say, ready: Callable[[], None]) -> None:
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
                ready()
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(wait, 0.05))
            except TimeoutError:
                pass

    # --- what a beat changes -----------------------------------------------------------------

    def _held(self) -> dict[str, Lease]:
        return {k: s.lease for k, s in (*self.served.items(), *self.leaving.items())}

    async def _apply(self, beat: Beat, book: LeaseBook, say: Say) -> None:
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
        stop = _Stop()
        task = asyncio.create_task(self._run_account(entry, lease, stop), name=f"fleet-{entry.label}")
        return _Served(entry, lease, task, stop)

    async def _run_account(self, entry: AccountEntry, lease: Lease, stop: _Stop) -> None:
        """Attach the account (its worker fenced by the lease), keep it up until ``stop``,
        detach it with the grace its stop asked for. A start that fails releases the
        lease and keeps this worker off the account for a while (``_cooldown``)."""
        runtime = self._runtime
        assert runtime is not None
        try:
            account = await runtime.attach(entry, fence=lease)
            try:
                runtime.upkeep(account, backfill=self.settings.worker.backfill)
                await stop.event.wait()
            finally:
                await runtime.detach(account, grace=stop.grace)
        except asyncio.CancelledError:
            raise
        except LeaseLost:
            log.warning("fleet: %s stopped: the lease is gone", entry.label)
        except Exception as e:  # noqa: BLE001 - one account's failure never stops the others
            await self._cool_down(entry, lease, e)

    async def _cool_down(self, entry: AccountEntry, lease: Lease, e: Exception) -> None:
        served = self.served.get(lease.key)
        if served is None or served.lease is not lease:
            return
        _, last = self._cooldown.get(lease.key, (0.0, 0.0))
        wait = min(RETRY_CAP, max(self.seconds, last * 2))
        self._cooldown[lease.key] = (time.monotonic() + wait, wait)
        log.error("fleet: serving %s failed (%s); its lease is released, and this worker tries it "
                  "again in %.0f s at the earliest", entry.label, type(e).__name__, wait)
        lease.revoke()
        del self.served[lease.key]
        try:
            if self._book is not None:
                await self._book.release([lease])
        except GelbridgeError:
            pass

    async def _stop(self, served: _Served, *, grace: float) -> None:
        served.stop.grace = grace
        served.stop.event.set()
        bound = grace + 60.0
        try:
            await asyncio.wait_for(asyncio.shield(served.task), timeout=bound)
        except TimeoutError:
            log.error("fleet: %s did not stop within %.0f s; cancelled", served.entry.label, bound)
            served.task.cancel()
            await asyncio.gather(served.task, return_exceptions=True)
        except Exception:  # noqa: BLE001 - logged by _run_account
            pass

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
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
