"""The fleet's heartbeat loop on a real Postgres, with the accounts' serving stood in for:
a hand-over's grace period never stalls the heartbeat, so the accounts a worker keeps
(and the one it is handing over, until it releases it) stay validly leased throughout."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gelbridge._config import Settings
from gelbridge._fleet import Fleet, Lease, LeaseBook, _Served, _Stop
from gelbridge._state._postgres import PostgresStore

LEASE = 2.0
GRACE = 3.0  # longer than the lease: a reply finishing while its account is handed over


async def test_a_hand_over_grace_longer_than_the_lease_never_stalls_the_heartbeat(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings.model_validate({
        "state": {"url": postgres_url}, "fleet": {"lease_seconds": LEASE}, "worker": {"shutdown_grace": GRACE},
        "accounts": [{"name": f"a{i}", "pds": "http://127.0.0.1:1", "identifier": f"a{i}.test"} for i in range(2)],
    })
    fleet = Fleet(settings)
    idle: list[asyncio.Task[None]] = []
    stopped: dict[str, float] = {}

    def serve(entry: Any, lease: Lease) -> _Served:  # no PDS here: an account that only waits
        idle.append(asyncio.create_task(asyncio.sleep(3600)))
        return _Served(entry, lease, idle[-1], _Stop())

    async def stop(served: _Served, *, grace: float) -> None:
        await asyncio.sleep(grace)  # its running replies use the whole grace
        stopped[served.lease.key] = time.monotonic()

    monkeypatch.setattr(fleet, "_serve", serve)
    monkeypatch.setattr(fleet, "_stop", stop)
    end, ready = asyncio.Event(), asyncio.Event()
    running = asyncio.create_task(fleet.run(end, ready=ready))
    other = LeaseBook(await PostgresStore(postgres_url).open(), "other", ["a0.test", "a1.test"], LEASE)
    try:
        await asyncio.wait_for(ready.wait(), 10)
        assert sorted(fleet.served) == ["a0.test", "a1.test"]
        await other.beat({})  # a second member: the share drops to one each
        joined = time.monotonic()
        theirs: dict[str, Lease] = {}
        lowest = LEASE
        while time.monotonic() - joined < GRACE + 2 * LEASE:
            for lease in (*[s.lease for s in fleet.served.values()], *[s.lease for s in fleet.leaving.values()]):
                lowest = min(lowest, lease.left())
            theirs = (await other.beat(theirs)).held
            await asyncio.sleep(0.1)
        [kept] = fleet.served
        [handed] = stopped
        assert handed != kept and handed in theirs  # the other member took it, once it was released
        assert stopped[handed] - joined >= GRACE  # after the whole grace ...
        assert lowest > LEASE / 3  # ... during which every lease of this worker stayed valid
    finally:
        end.set()
        await asyncio.wait_for(running, 30)
        for t in idle:
            t.cancel()
        await other.store.aclose()


async def test_a_taken_listen_address_ends_a_fleet_workers_start_before_it_opens_the_state() -> None:
    """The health server is bound first: a taken port is the one error, with its one line,
    before the state database (down here: it would be the error otherwise) is opened."""
    import socket

    from gelbridge._dev.pds import free_port
    from gelbridge._errors import ConfigError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings.model_validate({
            "state": {"url": f"postgresql://gb@127.0.0.1:{free_port()}/gb"},
            "observability": {"listen": f"127.0.0.1:{port}"},
            "accounts": [{"name": "a0", "pds": "http://127.0.0.1:1", "identifier": "a0.test"}],
        })
        fleet = Fleet(settings)
        with pytest.raises(ConfigError) as err:
            await asyncio.wait_for(fleet.run(asyncio.Event()), 30)
    assert str(err.value) == f"[observability] listen: 127.0.0.1:{port} is in use (another gelbridge? pick another port)"
    assert fleet.store is None
