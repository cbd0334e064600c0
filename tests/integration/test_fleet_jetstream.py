"""A fleet on Jetstream: two `gelbridge run` processes share four accounts of the real
local PDS and PostgreSQL, each with one Jetstream connection whose ``wantedDids`` are
the accounts it serves. The Jetstream stand-in is fed from the PDS's own firehose (as
the real service is fed from the relay). Every message is answered exactly once, and
when one worker is SIGKILLed the other takes its accounts within the lease time,
resubscribes for all four and answers their new messages; no subscription ever asks for
every account (no ``wantedDids``)."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import DevPds
from gelbridge._ingest import IncomingRecord
from gelbridge._records import new_tid
from gelbridge._state import SqliteStore
from gelbridge._worker.sources import FirehoseSource
from testkit.frames import jetstream_event
from testkit.jetstream_server import JetstreamServer

from .conftest import text_of
from .test_fleet import LEASE, Fleet, responder, wait_for

pytestmark = [pytest.mark.pds, pytest.mark.postgres, pytest.mark.timeout(300)]


class Relay:
    """The PDS firehose, as Jetstream v1 events into the stand-in (``time_us`` rising)."""

    def __init__(self, server: JetstreamServer) -> None:
        self.server = server
        self.last = 0

    async def __call__(self, rec: IncomingRecord) -> None:
        self.last = max(self.last + 1, time.time_ns() // 1000)
        self.server.publish(jetstream_event(rec.did, self.last, rec.action, rec.collection, rec.rkey,
                                            dict(rec.record) if rec.record is not None else None, rec.cid))


async def test_two_workers_on_jetstream_follow_their_accounts_and_take_over_a_dead_ones(
    tmp_path: Path, dev_pds: DevPds, postgres_url: str,
) -> None:
    rig = Fleet(tmp_path, dev_pds, postgres_url, 4)
    dids = {a.did for a in rig.accounts}
    try:
        with ModelServer(responder=responder) as model, SqliteStore.open_dir(tmp_path / "relay") as relay_state:
            async with JetstreamServer() as js, AsyncExitStack() as stack:
                relay = FirehoseSource(dev_pds.pds_url, set(dids), relay_state, Relay(js), key="relay")
                relay_task = asyncio.create_task(relay.run())
                stack.callback(relay_task.cancel)
                await wait_for("the relay to follow the PDS", relay.connected.is_set, 30)
                cfg = rig.config(model.url, watch=f'[watch]\nsource = "jetstream"\nurl = "{js.url}"\n')
                await rig.apps_for(stack)
                w1 = await rig.start(cfg, "w1")
                w2 = await rig.start(cfg, "w2")
                await wait_for("an even spread (2 accounts each)",
                               lambda: sorted(len(rig.held_by(w)) for w in (w1, w2)) == [2, 2], 60)

                def asked() -> list[frozenset[str]]:
                    return [frozenset(q.get("wantedDids", [])) for q in js.requests]

                for w in (w1, w2):  # each worker asks for its own accounts
                    mine = frozenset(a.did for a in rig.held_by(w))
                    await wait_for(f"a subscription for {sorted(mine)}", lambda m=mine: m in asked(), 30)

                first = {a.did: await rig.apps[a.did].send(f"hello {a.handle}", conversation=new_tid())
                         for a in rig.accounts}
                for a in rig.accounts:
                    _, c = await rig.apps[a.did].wait_status(f"{first[a.did]}.r0", "complete", timeout=60)
                    assert text_of(c) == f"You said: hello {a.handle}"

                dead = rig.held_by(w1)
                w1.kill()
                took = await wait_for("w2 to hold every account", lambda: len(rig.held_by(w2)) == 4, LEASE + 10)
                assert took <= LEASE + 1.5, f"takeover after {took:.1f} s; the lease is {LEASE:g} s"
                await wait_for("w2's subscription for all four", lambda: frozenset(dids) in asked(), 30)

                again = {a.did: await rig.apps[a.did].send(f"again {a.handle}", conversation=new_tid())
                         for a in dead}
                for did, rkey in again.items():
                    _, c = await rig.apps[did].wait_status(f"{rkey}.r0", "complete", timeout=60)
                    assert text_of(c).startswith("You said: again ")

                for a in rig.accounts:  # exactly once
                    for rkey in (first[a.did], again.get(a.did)):
                        if rkey is not None:
                            assert await rig.apps[a.did].replies_of(rkey) == [f"{rkey}.r0"]
                assert all(q and q <= dids for q in asked())  # never every account, never another's
                assert w2.terminate() == 0
    finally:
        rig.stop()
