"""A late write after a fleet takeover, on the real local PDS and PostgreSQL (issue 23).

Worker A holds the account's lease and streams a reply; its first progress write is
held in a TCP proxy on the way to the PDS, and meanwhile A's lease runs out (as for a
worker paused past its lease: its own clock stops its writes, the database frees the
lease). Worker B takes the lease over and resumes the reply from the shared claim,
reading the record (CID ``C0``). Then A's held write reaches the PDS and lands (HTTP
200: it swaps on ``C0`` too), so B's next write, swapping on ``C0``, fails
``InvalidSwap``. The reply must still end: B is the lease holder, the reply is its.

:func:`late_write` runs that once. ``release_after=None`` makes the order certain (B's
model call waits until A's write has landed: B has read the record by then); a number
releases A's write that many seconds after B took the reply over, and B's model does not
wait (the attack as it happens, some runs in the window and some not).
Used by tests/integration/test_fleet_late_write.py and scripts/bench_fleet_late_write.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from gelbridge._dev.model_server import ModelServer, RecordedRequest, Turn
from gelbridge._dev.pds import AccountInfo
from gelbridge._fleet import LeaseBook
from gelbridge._ingest import IncomingRecord
from gelbridge._pds import PdsClient
from gelbridge._records import MESSAGE_COLLECTION, new_tid
from gelbridge._records.constants import FINAL_STATUSES
from gelbridge._sealing import Keyring
from gelbridge._state._postgres import PostgresStore
from gelbridge._worker import Worker

from .conftest import PASSWORD_ENV, App, make_settings, text_of
from .proxy import TcpProxy

LEASE = 30.0  # long: nothing here waits for a lease to run out by itself
A_TURN = Turn(text="old " * 100, chunk_size=4, chunk_delay=0.05)  # ~1.25 s: A is mid-stream when held
B_TEXT = "the new holder answered this " * 8
B_TURN = Turn(text=B_TEXT, chunk_size=6, chunk_delay=0.04)  # ~0.3 s: B writes progress, then the final
PUT_RECORD = b"POST /xrpc/com.atproto.repo.putRecord"


@dataclass
class LateWriteRun:
    """What one run left behind."""

    status: str | None  # the reply record's status at the end (None: no record)
    text: str  # its text (B's answer when it ended well)
    claim: tuple[str, str | None] | None  # the shared claim's (status, error_kind)
    replies: int  # reply records of the message (exactly one)
    landed_late: bool  # A's write landed after B read the record (HTTP 200, a new CID)
    seconds: float | None  # from the release of A's write to the reply's final status (None: stuck)
    outcomes: list[str] = field(default_factory=list)  # B's turn outcomes

    @property
    def stuck(self) -> bool:
        return self.status not in FINAL_STATUSES


class _Gate:
    """B's model answers only once the test opens the gate (bounded)."""

    def __init__(self, closed: bool) -> None:
        self.called = threading.Event()
        self.open = threading.Event()
        if not closed:
            self.open.set()

    def __call__(self, req: RecordedRequest) -> Any:
        self.called.set()
        self.open.wait(30)
        return B_TURN


async def _until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.02)


async def late_write(tmp: Path, pds_url: str, postgres_url: str, account: AccountInfo, *,
                     release_after: float | None = None, final_within: float = 20.0) -> LateWriteRun:
    """One run of the late write (see the module docstring); ``final_within`` seconds after
    the release, a reply that is not final counts as stuck."""
    keyring = Keyring()
    kid = keyring.add_new("k-late")
    key = account.handle.lower()  # the lease key: the login identifier
    env = {PASSWORD_ENV: account.app_password}
    host, port = pds_url.removeprefix("http://").rsplit(":", 1)
    proxy = await TcpProxy(host, int(port)).start()
    gate = _Gate(closed=release_after is None)
    stores: list[PostgresStore] = []
    workers: list[Worker] = []
    try:
        with ModelServer(responder=lambda req: A_TURN) as model_a, ModelServer(responder=gate) as model_b:
            for _ in range(2):
                stores.append(await PostgresStore(postgres_url).open())
            book_a, book_b = (LeaseBook(s, m, [key], LEASE) for s, m in zip(stores, ("member-a", "member-b")))
            await book_a.register()
            lease_a = (await book_a.beat({})).held[key]
            a = Worker(make_settings(f"http://localhost:{proxy.port}", account, tmp / "a", model_a.url),
                       keyring=keyring, store=stores[0], environ=env, fence=lease_a)
            workers.append(a)
            await a.start()
            async with PdsClient(pds_url) as app_pds:
                await app_pds.login(account.handle, account.password)
                app = App(app_pds, keyring, kid)
                rkey = await app.send("write while you can", conversation=new_tid())
                reply = f"{rkey}.r0"
                got = await app.get(rkey)
                assert got is not None
                assert await a.handle_event(IncomingRecord(a.did, MESSAGE_COLLECTION, rkey, got[0], got[1])) == "claimed"
                hold = proxy.hold_next(PUT_RECORD)  # A's first progress write (the claim has landed)
                await asyncio.wait_for(hold.held.wait(), 30)

                # A is paused past its lease: its own clock stops its writes; the database frees it
                lease_a.revoke()
                with psycopg.connect(postgres_url) as conn:
                    conn.execute("UPDATE leases SET expires_at = now() WHERE account = %s", (key,))
                lease_b = (await book_b.beat({})).held[key]
                b = Worker(make_settings(pds_url, account, tmp / "b", model_b.url), keyring=keyring,
                           store=stores[1], environ=env, fence=lease_b)
                workers.append(b)
                await b.start()
                read = await app.get(reply)
                assert read is not None and read[1]["status"] == "pending"  # A's write is still on the way
                report = await b.backfill()  # the new holder's start: it reads the reply and resumes it
                assert report.resumed == 1, report

                if release_after is None:
                    assert await asyncio.to_thread(gate.called.wait, 30)  # B's turn is past its read
                else:
                    await asyncio.sleep(release_after)
                hold.release()
                released = time.monotonic()

                async def moved() -> bool:
                    now = await app.get(reply)
                    return now is not None and now[0] != read[0]

                await _until("A's held write or B's first write to land", moved, 30)
                if release_after is None:  # B has not written yet: the write that moved it was A's
                    after = await app.get(reply)
                    assert after is not None and after[1]["status"] == "streaming"
                    gate.open.set()

                async def final() -> bool:
                    now = await app.get(reply)
                    return now is not None and now[1]["status"] in FINAL_STATUSES

                try:
                    await _until("the reply to end", final, final_within)
                    seconds: float | None = time.monotonic() - released
                except AssertionError:
                    seconds = None
                await b.wait_idle(30)
                await a.wait_idle(30)
                rec = await app.reply(reply)
                claim = await stores[1].get_claim(a.did, reply)
                return LateWriteRun(
                    status=rec[0].status if rec is not None else None,
                    text=text_of(rec[1]) if rec is not None and rec[1] is not None else "",
                    claim=(str(claim.status), claim.error_kind) if claim is not None else None,
                    replies=len(await app.replies_of(rkey)),
                    landed_late=any(r.progress_writes for r in a.reports),  # A's only write after the claim
                    seconds=seconds,
                    outcomes=[str(r.status) for r in b.reports],
                )
    finally:
        gate.open.set()
        for w in reversed(workers):
            await w.aclose(grace=5.0)
        for s in stores:
            await s.aclose()
        await proxy.aclose()

