"""The fleet's leases on a real Postgres: fair shares, takeover only after expiry, never
two owners, epochs that grow, and fencing: a worker whose lease ran out (its own clock)
or was taken over (the database) writes nothing for the account."""

from __future__ import annotations

import threading
import time

import pytest

from gelbridge._errors import ConfigError, LeaseLost
from gelbridge._fleet import Lease, LeaseBook
from gelbridge._state import CallRef, SqliteStore
from gelbridge._state._postgres import PostgresStore

KEYS = [f"https://pds.test|acct{i}.test" for i in range(6)]


def books(url: str, n: int, seconds: float = 3.0) -> list[LeaseBook]:
    out = []
    for i in range(n):
        b = LeaseBook(PostgresStore(url), f"member-{i}", KEYS, seconds)
        b.register()
        out.append(b)
    return out


def converge(bs: list[LeaseBook], held: list[dict[str, Lease]], rounds: int = 4) -> None:
    """Beat every member a few times, handing extras back as the fleet does."""
    for _ in range(rounds):
        for i, b in enumerate(bs):
            beat = b.beat(held[i])
            held[i] = beat.held
            extra = len(held[i]) - beat.share
            if extra > 0 and beat.members > 1:
                give = sorted(held[i])[-extra:]
                b.release([held[i].pop(k) for k in give])


def test_three_members_split_six_accounts_two_each_and_never_share_one(postgres_url: str) -> None:
    bs = books(postgres_url, 3)
    held: list[dict[str, Lease]] = [{}, {}, {}]
    first = bs[0].beat({})  # alone so far: it takes them all
    held[0] = first.held
    assert len(first.held) == 6 and first.members == 1
    for i in (1, 2):
        held[i] = bs[i].beat({}).held  # joined: nothing free yet
    converge(bs, held)
    assert sorted(len(h) for h in held) == [2, 2, 2]
    owners = [k for h in held for k in h]
    assert sorted(owners) == sorted(KEYS)  # each account exactly once


def test_a_dead_members_accounts_are_taken_only_after_its_lease_expires(postgres_url: str) -> None:
    bs = books(postgres_url, 2, seconds=2.0)
    held: list[dict[str, Lease]] = [{}, {}]
    converge(bs, held)
    dead = dict(held[1])  # member-1 stops beating now
    t_dead = time.monotonic()
    beat = bs[0].beat(held[0])
    assert not beat.taken and beat.next_expiry is not None and 0 < beat.next_expiry <= 2.0
    mine = dict(beat.held)
    while not beat.taken and time.monotonic() - t_dead < 4:  # the survivor beats, as the fleet does
        time.sleep(min(0.5, beat.next_expiry + 0.05) if beat.next_expiry is not None else 0.5)
        beat = bs[0].beat(beat.held)
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
        store.record_claim("did:plc:x", "m", 0, "m.r0", "conv")
    assert store.get_claim("did:plc:x", "m.r0") is None


def test_fencing_refuses_state_writes_after_a_takeover_even_with_time_left(postgres_url: str) -> None:
    a, b = books(postgres_url, 2, seconds=30.0)
    held_a = a.beat({}).held
    key = sorted(held_a)[0]
    lease = held_a[key]
    a.store.fence(["did:plc:a"], lease)
    a.store.record_claim("did:plc:a", "m1", 0, "m1.r0", "conv")  # holds the lease: fine
    with b.store.transaction() as db:  # someone forces a takeover (an operator, a clock gone wrong)
        db.execute("UPDATE leases SET owner = 'member-1', epoch = epoch + 1 WHERE account = ?", (key,))
    assert lease.left() > 20  # the local clock still trusts it: the database does not
    for write in (lambda: a.store.update_claim_status("did:plc:a", "m1.r0", "complete"),
                  lambda: a.store.begin_tool_call(CallRef("did:plc:a", "conv", "c1"), "m1.r0", "t", "d"),
                  lambda: a.store.set_cursor("firehose:x", 5, account="did:plc:a"),
                  lambda: a.store.mark_seen("did:plc:a", "m1", "cid")):
        with pytest.raises(LeaseLost):
            write()
    assert a.store.get_claim("did:plc:a", "m1.r0").status == "pending"  # type: ignore[union-attr]
    assert a.store.get_tool_call(CallRef("did:plc:a", "conv", "c1")) is None
    a.store.record_claim("did:plc:b", "m1", 0, "m1.r0", "conv")  # other accounts: not fenced


def test_a_takeover_waits_for_a_write_in_flight_and_then_wins(postgres_url: str) -> None:
    a, b = books(postgres_url, 2, seconds=30.0)
    lease = a.beat({}).held[KEYS[0]]
    with a.store.transaction() as db:  # a write in flight holds the lease row FOR SHARE
        lease.check_in(db)
        taken: list[int] = []

        def take() -> None:
            with b.store.transaction() as db2:
                taken.append(db2.execute("UPDATE leases SET owner = 'member-1', epoch = epoch + 1 "
                                         "WHERE account = ?", (KEYS[0],)).rowcount)

        t = threading.Thread(target=take)
        t.start()
        t.join(timeout=0.5)
        assert t.is_alive() and not taken  # blocked until the write commits
    t.join(timeout=10)
    assert taken == [1]
    with pytest.raises(LeaseLost), a.store.transaction() as db:
        lease.check_in(db)


def test_a_revoked_lease_stops_writes_at_once_and_released_leases_are_free(postgres_url: str) -> None:
    a, b = books(postgres_url, 2, seconds=30.0)
    held = a.beat({}).held
    lease = held[KEYS[0]]
    lease.check()
    lease.revoke()
    with pytest.raises(LeaseLost):
        lease.check()
    a.release([lease])
    got = b.beat({})  # free at once: no waiting for expiry
    assert KEYS[0] in got.taken and got.held[KEYS[0]].epoch == lease.epoch + 1


def test_a_fleet_needs_postgres(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with SqliteStore(tmp_path / "s.db") as store, pytest.raises(ConfigError, match=r"\[state\] url"):
        LeaseBook(store, "m", KEYS, 15.0)
