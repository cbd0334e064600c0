"""The fleet's leases on a real Postgres: fair shares, takeover only after expiry, never
two owners, epochs that grow, and fencing: a worker whose lease ran out (its own clock)
or was taken over (the database) writes nothing for the account."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gelbridge._errors import ClaimConflict, ConfigError, LeaseLost
from gelbridge._fleet import Lease, LeaseBook
from gelbridge._records.constants import ReplyStatus
from gelbridge._state import CallRef, SqliteStore
from gelbridge._state._postgres import PostgresStore
from gelbridge._worker.repo import RepoView
from gelbridge._worker.turn import mark_lost
from gelbridge._worker.writer import ReplyWriter, claim_authority
from testkit.worker_fakes import DID, FakePds

KEYS = [f"acct{i}.test" for i in range(6)]


async def books(url: str, n: int, seconds: float = 3.0) -> list[LeaseBook]:
    out = []
    for i in range(n):
        b = LeaseBook(await PostgresStore(url).open(), f"member-{i}", KEYS, seconds)
        await b.register()
        out.append(b)
    return out


async def converge(bs: list[LeaseBook], held: list[dict[str, Lease]], rounds: int = 4) -> None:
    """Beat every member a few times, handing extras back as the fleet does."""
    for _ in range(rounds):
        for i, b in enumerate(bs):
            beat = await b.beat(held[i])
            held[i] = beat.held
            extra = len(held[i]) - beat.share
            if extra > 0 and beat.members > 1:
                give = sorted(held[i])[-extra:]
                await b.release([held[i].pop(k) for k in give])


async def test_three_members_split_six_accounts_two_each_and_never_share_one(postgres_url: str) -> None:
    bs = await books(postgres_url, 3)
    held: list[dict[str, Lease]] = [{}, {}, {}]
    first = await bs[0].beat({})  # alone so far: it takes them all
    held[0] = first.held
    assert len(first.held) == 6 and first.members == 1
    for i in (1, 2):
        held[i] = (await bs[i].beat({})).held  # joined: nothing free yet
    await converge(bs, held)
    assert sorted(len(h) for h in held) == [2, 2, 2]
    assert sorted(k for h in held for k in h) == sorted(KEYS)  # each account exactly once


async def test_a_dead_members_accounts_are_taken_only_after_its_lease_expires(postgres_url: str) -> None:
    bs = await books(postgres_url, 2, seconds=2.0)
    held: list[dict[str, Lease]] = [{}, {}]
    await converge(bs, held)
    dead = dict(held[1])  # member-1 stops beating now
    t_dead = time.monotonic()
    beat = await bs[0].beat(held[0])
    assert not beat.taken and beat.next_expiry is not None and 0 < beat.next_expiry <= 2.0
    mine = dict(beat.held)
    while not beat.taken and time.monotonic() - t_dead < 4:  # the survivor beats, as the fleet does
        await asyncio.sleep(min(0.5, beat.next_expiry + 0.05) if beat.next_expiry is not None else 0.5)
        beat = await bs[0].beat(beat.held)
    assert sorted(beat.taken) == sorted(dead) and len(beat.held) == 6  # its member row and leases expired
    assert time.monotonic() - t_dead < 2.0 + 0.3  # within the lease time of the last beat
    assert all(beat.held[k] is mine[k] for k in mine)  # its own were renewed, not re-taken
    for key in dead:
        assert beat.held[key].epoch == dead[key].epoch + 1
    # the dead member's own view: its leases ran out on its clock, and the database says so too
    lease = next(iter(dead.values()))
    with pytest.raises(LeaseLost):
        lease.check()
    store = bs[1].store
    store.fence(["did:plc:x"], lease)
    with pytest.raises(LeaseLost):
        await store.record_claim("did:plc:x", "m", 0, "m.r0", "conv")
    assert await store.get_claim("did:plc:x", "m.r0") is None


async def test_fencing_refuses_state_writes_after_a_takeover_even_with_time_left(postgres_url: str) -> None:
    a, b = await books(postgres_url, 2, seconds=30.0)
    held_a = (await a.beat({})).held
    key = sorted(held_a)[0]
    lease = held_a[key]
    a.store.fence(["did:plc:a"], lease)
    await a.store.record_claim("did:plc:a", "m1", 0, "m1.r0", "conv")  # holds the lease: fine
    async with b.store.transaction() as db:  # type: ignore[attr-defined]  # a forced takeover
        await db.execute("UPDATE leases SET owner = 'member-1', epoch = epoch + 1 WHERE account = ?", (key,))
    assert lease.left() > 20  # the local clock still trusts it: the database does not
    for write in (lambda: a.store.update_claim_status("did:plc:a", "m1.r0", "complete"),
                  lambda: a.store.begin_tool_call(CallRef("did:plc:a", "conv", "c1"), "m1.r0", "t", "d"),
                  lambda: a.store.set_cursor("firehose:x", 5, account="did:plc:a"),
                  lambda: a.store.mark_seen("did:plc:a", "m1", "cid")):
        with pytest.raises(LeaseLost):
            await write()
    assert (await a.store.get_claim("did:plc:a", "m1.r0")).status == "pending"  # type: ignore[union-attr]
    assert await a.store.get_tool_call(CallRef("did:plc:a", "conv", "c1")) is None
    await a.store.record_claim("did:plc:b", "m1", 0, "m1.r0", "conv")  # other accounts: not fenced


async def test_a_takeover_waits_for_a_write_in_flight_and_then_wins(postgres_url: str) -> None:
    a, b = await books(postgres_url, 2, seconds=30.0)
    lease = (await a.beat({})).held[KEYS[0]]

    async def take() -> int:
        async with b.store.transaction() as db2:  # type: ignore[attr-defined]
            return (await db2.execute("UPDATE leases SET owner = 'member-1', epoch = epoch + 1 "
                                      "WHERE account = ?", (KEYS[0],))).rowcount

    async with a.store.transaction() as db:  # type: ignore[attr-defined]  # a write in flight: FOR SHARE
        await lease.check_in(db)
        taker = asyncio.create_task(take())
        await asyncio.sleep(0.5)
        assert not taker.done()  # blocked until the write commits
    assert await asyncio.wait_for(taker, 10) == 1
    with pytest.raises(LeaseLost):
        async with a.store.transaction() as db:  # type: ignore[attr-defined]
            await lease.check_in(db)


async def test_a_revoked_lease_stops_writes_at_once_and_released_leases_are_free(postgres_url: str) -> None:
    a, b = await books(postgres_url, 2, seconds=30.0)
    lease = (await a.beat({})).held[KEYS[0]]
    lease.check()
    lease.revoke()
    with pytest.raises(LeaseLost):
        lease.check()
    await a.release([lease])
    got = await b.beat({})  # free at once: no waiting for expiry
    assert KEYS[0] in got.taken and got.held[KEYS[0]].epoch == lease.epoch + 1


def test_a_fleet_needs_postgres(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "s.db") as store, pytest.raises(ConfigError, match=r"\[state\] url"):
        LeaseBook(store, "m", KEYS, 15.0)


async def test_a_member_skips_the_accounts_it_just_failed_to_serve(postgres_url: str) -> None:
    (a,) = await books(postgres_url, 1, seconds=30.0)
    got = await a.beat({}, skip=frozenset({KEYS[0], KEYS[1]}))
    assert sorted(got.taken) == KEYS[2:]  # the others may take those two meanwhile
    got = await a.beat(got.held)
    assert KEYS[0] in got.taken and KEYS[1] in got.taken  # the moment it no longer skips them


async def test_whether_a_reply_is_still_ours_to_write_is_the_lease_and_the_claims_to_say(postgres_url: str) -> None:
    """The writer's authority after a failed swap (``writer.claim_authority``): the shared
    claim not finished, read through the fence, so a lease taken over says no at once."""
    a, b = await books(postgres_url, 2, seconds=30.0)
    lease = (await a.beat({})).held[KEYS[0]]
    a.store.fence(["did:plc:a"], lease)
    await a.store.record_claim("did:plc:a", "m1", 0, "m1.r0", "conv")
    await a.store.record_claim("did:plc:a", "m2", 0, "m2.r0", "conv")
    await a.store.update_claim_status("did:plc:a", "m2.r0", "complete")
    ours = claim_authority(a.store, "did:plc:a", "m1.r0")
    assert await ours()
    assert not await claim_authority(a.store, "did:plc:a", "m2.r0")()  # finished
    assert not await claim_authority(a.store, "did:plc:a", "m3.r0")()  # never claimed
    assert await claim_authority(b.store, "did:plc:a", "m1.r0")()  # unfenced there (not a fleet's worker)
    async with b.store.transaction() as db:  # type: ignore[attr-defined]  # a takeover
        await db.execute("UPDATE leases SET owner = 'member-1', epoch = epoch + 1 WHERE account = ?", (KEYS[0],))
    assert lease.left() > 20  # its own clock still trusts the lease: the database does not
    with pytest.raises(LeaseLost):
        await ours()


async def test_a_reply_given_up_after_its_lease_was_lost_leaves_the_claim_to_the_lease_holder(
    postgres_url: str,
) -> None:
    a, b = await books(postgres_url, 2, seconds=30.0)
    lease = (await a.beat({})).held[KEYS[0]]
    a.store.fence(["did:plc:a"], lease)
    await a.store.record_claim("did:plc:a", "m1", 0, "m1.r0", "conv")
    pds = FakePds()
    w = ReplyWriter(pds, RepoView(pds, DID), reply_rkey="m1.r0", message_rkey="m1", conversation="conv",
                    key_id=None, keyring={}, authority=claim_authority(a.store, "did:plc:a", "m1.r0"))
    await w.claim()
    cid, value = pds.records["m1.r0"]
    pds.records["m1.r0"] = ("someone-else", {**value, "status": "complete"})  # finished elsewhere
    with pytest.raises(ClaimConflict):
        await w.final([], status=ReplyStatus.COMPLETE)
    async with b.store.transaction() as db:  # type: ignore[attr-defined]  # then the lease is taken over
        await db.execute("UPDATE leases SET owner = 'member-1', epoch = epoch + 1 WHERE account = ?", (KEYS[0],))
    assert await mark_lost(a.store, "did:plc:a", w) == "lease_lost"  # no LeaseLost out of the turn
    claim = await b.store.get_claim("did:plc:a", "m1.r0")
    assert claim is not None and claim.status == "pending"  # the new holder settles it
