"""Two accounts on one real local PDS, served by one Bridge fed by the SDK's firehose
client: each account is answered in its own repo, sealed with its own key; a record
claiming one account's DID is never handled with the other account's key."""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from atproto_firehose import AsyncFirehoseSubscribeReposClient
from integration.conftest import App, text_of

from gelbridge._bridge import Bridge
from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds, create_account
from gelbridge._firehose import subscribe_repos
from gelbridge._ingest import IncomingRecord, RecordFilter, from_firehose
from gelbridge._pds import PdsClient
from gelbridge._records import MESSAGE_COLLECTION, new_tid
from gelbridge._sealing import Keyring

pytestmark = [pytest.mark.pds, pytest.mark.timeout(240)]


def new_account(pds: DevPds) -> AccountInfo:
    return create_account(pds.pds_url, f"br{secrets.token_hex(5)}.test", secrets.token_urlsafe(12))


def two_account_settings(pds_url: str, model_url: str, tmp: Path, accts: list[tuple[str, AccountInfo]]) -> Settings:
    return Settings.model_validate({
        "state": {"dir": str(tmp / "state")},
        "accounts": [
            {"name": name, "pds": pds_url, "identifier": a.handle, "password_env": f"PW_{name.upper()}",
             "keyring": str(tmp / f"{name}.keyring.json")}
            for name, a in accts
        ],
        "defaults": {"model": {"provider": "local", "id": "echo-1"}},
        "providers": {"local": {"adapter": "openai", "base_url": model_url + "/v1", "max_retries": 0}},
        "replies": {"update_interval": 0.2},
        "worker": {"shutdown_grace": 2.0},
    })


async def firehose_feeder(pds_url: str, bridge: Bridge, seen: list[Any], connected: asyncio.Event) -> None:
    """A consumer of our own: the SDK's async firehose client, passing every message on."""
    base = pds_url.replace("http://", "ws://").rstrip("/") + "/xrpc"
    client = AsyncFirehoseSubscribeReposClient(base_uri=base)

    async def on_message(message: Any) -> None:
        connected.set()
        seen.append(message)
        bridge.feed_firehose_frame(message)

    task = asyncio.create_task(client.start(on_message))
    try:
        await asyncio.Future()  # until cancelled
    finally:
        await client.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


async def test_two_accounts_one_process_strictly_separated(dev_pds: DevPds, tmp_path: Path) -> None:
    acct_a, acct_b = new_account(dev_pds), new_account(dev_pds)
    kr_a, kr_b = Keyring(), Keyring()
    kid_a, kid_b = kr_a.add_new("k-a"), kr_b.add_new("k-b")
    kr_a.save(tmp_path / "a.keyring.json")
    kr_b.save(tmp_path / "b.keyring.json")
    environ = {"PW_A": acct_a.app_password, "PW_B": acct_b.app_password}
    seen: list[Any] = []
    connected = asyncio.Event()
    with ModelServer() as model:
        settings = two_account_settings(dev_pds.pds_url, model.url, tmp_path, [("a", acct_a), ("b", acct_b)])
        async with PdsClient(dev_pds.pds_url) as pa, PdsClient(dev_pds.pds_url) as pb:
            await pa.login(acct_a.handle, acct_a.password)
            await pb.login(acct_b.handle, acct_b.password)
            app_a, app_b = App(pa, kr_a, kid_a), App(pb, kr_b, kid_b)
            async with Bridge(settings, environ=environ, backfill=False) as bridge:
                assert set(bridge.accounts) == {acct_a.did, acct_b.did}
                assert bridge.accounts[acct_a.did].worker.keyring is not bridge.accounts[acct_b.did].worker.keyring
                feeder = asyncio.create_task(firehose_feeder(dev_pds.pds_url, bridge, seen, connected))
                try:
                    for _ in range(100):  # writes to a collection that is not ours until the client sees one
                        await pa.put_record("app.example.ping", new_tid(), {"$type": "app.example.ping"})
                        try:
                            await asyncio.wait_for(connected.wait(), 0.3)
                            break
                        except TimeoutError:
                            pass
                    assert connected.is_set(), "the SDK firehose client never received a message"
                    ka = await app_a.send("hello from A", conversation=new_tid())
                    kb = await app_b.send("hello from B", conversation=new_tid())
                    rec_a, content_a = await app_a.wait_status(f"{ka}.r0", "complete", timeout=60)
                    rec_b, content_b = await app_b.wait_status(f"{kb}.r0", "complete", timeout=60)
                    assert text_of(content_a) == "You said: hello from A"
                    assert text_of(content_b) == "You said: hello from B"
                    assert rec_a.content.key_id == kid_a and rec_b.content.key_id == kid_b
                    # each reply is only in its own repo
                    assert await app_a.replies_of(kb) == [] and await app_b.replies_of(ka) == []
                    assert await App(pa, kr_b, kid_b).reply(f"{ka}.r0") is not None
                    assert (await App(pa, kr_b, kid_b).reply(f"{ka}.r0"))[1] is None  # B's key cannot open A's reply

                    # forged: A's record (sealed with A's key) presented as B's
                    got = await pa.get_record(MESSAGE_COLLECTION, ka)
                    assert got is not None
                    cid_a, value_a = got
                    value_a = dict(value_a, generation={"attempt": 1})
                    assert bridge.feed_record(acct_b.did, MESSAGE_COLLECTION, ka, cid_a, value_a) == 1
                    assert await bridge.join(30)
                    await bridge.accounts[acct_b.did].worker.wait_idle(30)
                    assert await app_a.replies_of(ka) == [f"{ka}.r0"]  # nothing new in A's repo
                    # B's worker treated it as B's message, opened it with B's keyring only, and
                    # failed: an error reply in B's repo, with no content at all
                    forged, forged_content = await app_b.wait_status(f"{ka}.r1", "error", timeout=30)
                    assert forged.error is not None and forged.error.kind == "decrypt_failed"
                    assert not forged.is_sealed and forged_content is not None and forged_content.parts == []
                    assert bridge.stats["handled-claimed"] >= 3
                finally:
                    feeder.cancel()
                    await asyncio.gather(feeder, return_exceptions=True)

    # what the bridge took from the SDK messages equals the worker's own firehose decoder
    flt = RecordFilter.for_dids([acct_a.did, acct_b.did])
    via_sdk = [r for m in seen for r in from_firehose(m, flt)]
    via_worker: list[IncomingRecord] = []
    async with aclosing(subscribe_repos(dev_pds.pds_url, cursor=min(r.source_cursor for r in via_sdk) - 1,
                                        did_filter={acct_a.did, acct_b.did})) as stream:
        async def collect() -> None:
            async for ev in stream:
                via_worker.append(IncomingRecord.from_repo_event(ev))
                if len(via_worker) >= len(via_sdk):
                    return
        await asyncio.wait_for(collect(), 30)
    assert via_sdk == via_worker
    assert {r.did for r in via_sdk} == {acct_a.did, acct_b.did}


async def relay_to_jetstream(pds_url: str, srv: Any) -> None:
    """A miniature Jetstream: the PDS firehose (all repos) re-published as v1 JSON events."""
    from testkit.frames import jetstream_event

    async with aclosing(subscribe_repos(pds_url, cursor=0, did_filter=None)) as stream:  # no live-start race
        async for ev in stream:
            srv.publish(jetstream_event(ev.did, time.time_ns() // 1000, ev.action, ev.collection, ev.rkey,
                                        ev.record, ev.cid))


async def test_single_account_served_from_jetstream_by_bridge_serve(dev_pds: DevPds, tmp_path: Path) -> None:
    from testkit.jetstream_server import JetstreamServer

    acct, other = new_account(dev_pds), new_account(dev_pds)
    kr = Keyring()
    kid = kr.add_new("k-one")
    with ModelServer() as model:
        async with JetstreamServer() as srv:
            settings = Settings.model_validate({
                "account": {"pds": dev_pds.pds_url, "identifier": acct.handle, "password_env": "PW_ONE"},
                "state": {"dir": str(tmp_path / "state")},
                "watch": {"source": "jetstream", "url": srv.url},
                "defaults": {"model": {"provider": "local", "id": "echo-1"}},
                "providers": {"local": {"adapter": "openai", "base_url": model.url + "/v1", "max_retries": 0}},
                "replies": {"update_interval": 0.2},
                "worker": {"shutdown_grace": 2.0},
            })
            relay = asyncio.create_task(relay_to_jetstream(dev_pds.pds_url, srv))
            stop = asyncio.Event()
            async with PdsClient(dev_pds.pds_url) as pc, PdsClient(dev_pds.pds_url) as po:
                await pc.login(acct.handle, acct.password)
                await po.login(other.handle, other.password)
                app, app_other = App(pc, kr, kid), App(po, kr, kid)
                async with Bridge(settings, keyrings={acct.handle: kr}, environ={"PW_ONE": acct.app_password},
                                  backfill=False) as bridge:
                    assert bridge.accounts[acct.did].worker.store is bridge.store  # `gelbridge run`'s state
                    serving = asyncio.create_task(bridge.serve(stop))
                    try:
                        await asyncio.wait_for(_connected(bridge), 30)
                        await asyncio.sleep(0.3)  # the relay's own subscription is live by now
                        k_other = await app_other.send("not served here", conversation=new_tid())
                        k = await app.send("hello via jetstream", conversation=new_tid())
                        _rec, content = await app.wait_status(f"{k}.r0", "complete", timeout=60)
                        assert text_of(content) == "You said: hello via jetstream"
                        assert await app_other.replies_of(k_other) == []
                        assert srv.requests[0]["wantedDids"] == [acct.did]
                        assert await bridge.store.get_cursor(bridge.jetstream.key) is not None
                    finally:
                        stop.set()
                        await asyncio.wait_for(serving, 10)
                        relay.cancel()
                        await asyncio.gather(relay, return_exceptions=True)


async def _connected(bridge: Bridge) -> None:
    while getattr(bridge, "jetstream", None) is None:
        await asyncio.sleep(0.05)
    await bridge.jetstream.connected.wait()


async def _firehoses_open(bridge: Bridge) -> None:
    while not bridge.sources:
        await asyncio.sleep(0.05)
    for src in bridge.sources.values():
        await src.connected.wait()


async def test_bridge_serve_follows_one_firehose_per_pds_host_for_two_accounts(dev_pds: DevPds, tmp_path: Path) -> None:
    acct_a, acct_b = new_account(dev_pds), new_account(dev_pds)
    kr_a, kr_b = Keyring(), Keyring()
    kid_a, kid_b = kr_a.add_new("k-a"), kr_b.add_new("k-b")
    with ModelServer() as model:
        settings = two_account_settings(dev_pds.pds_url, model.url, tmp_path, [("a", acct_a), ("b", acct_b)])
        assert settings.watch.source == "firehose"
        environ = {"PW_A": acct_a.app_password, "PW_B": acct_b.app_password}
        async with PdsClient(dev_pds.pds_url) as pa, PdsClient(dev_pds.pds_url) as pb:
            await pa.login(acct_a.handle, acct_a.password)
            await pb.login(acct_b.handle, acct_b.password)
            app_a, app_b = App(pa, kr_a, kid_a), App(pb, kr_b, kid_b)
            async with Bridge(settings, keyrings={"a": kr_a, "b": kr_b}, environ=environ, backfill=False) as bridge:
                stop = asyncio.Event()
                serving = asyncio.create_task(bridge.serve(stop))
                try:
                    await asyncio.wait_for(_firehoses_open(bridge), 30)  # no cursor: live from its open
                    ka = await app_a.send("A over the firehose", conversation=new_tid())
                    kb = await app_b.send("B over the firehose", conversation=new_tid())
                    _r, ca = await app_a.wait_status(f"{ka}.r0", "complete", timeout=60)
                    _r, cb = await app_b.wait_status(f"{kb}.r0", "complete", timeout=60)
                    assert text_of(ca) == "You said: A over the firehose"
                    assert text_of(cb) == "You said: B over the firehose"
                    key = f"firehose:{dev_pds.pds_url.rstrip('/')}:" + "+".join(sorted([acct_a.did, acct_b.did]))
                    assert isinstance(await bridge.store.get_cursor(key), int)
                finally:
                    stop.set()
                    await asyncio.wait_for(serving, 10)
