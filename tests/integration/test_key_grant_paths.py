"""Key grants (PROTOCOL.md §6) on every way of running gelbridge, on the real local PDS
(and PostgreSQL), with the local model server and real crypto:

- ``[[accounts]]``: one process, two accounts, one bridge key. A grant in A opens A's
  message; the same keyId and key used in B (no grant there) does not; a grant copied
  verbatim from A's repo into B's (same record key, same bytes) is ignored in B
  (``sealed_key``: the grant's URI is sealed in), and B's counts, metrics and
  ``gelbridge status`` say so while A's do not;
- Jetstream: a worker fed by a Jetstream stand-in (fed from the PDS firehose) asks for
  the keyGrant collection and follows grant creates and deletes;
- poll: a grant and the message sealed with its key, both written between two polls,
  open (the poll hands the grants over first);
- the library: a :class:`~gelbridge.Bridge` fed by a consumer of our own (the SDK's
  firehose client), given the bridge key in its ``environ``, honours the grant records it
  is fed, and forgets a deleted one; a grant fed behind a busy shard is still in force
  for the message fed after it;
- a fleet takeover: worker 1 holds the account and is SIGKILLed after a grant; a message
  sealed with the granted key written while no one holds the account is answered by
  worker 2 (same bridge key, from ``$GELBRIDGE_BRIDGE_KEY``), which lists the grants
  before it answers.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from atproto_firehose import AsyncFirehoseSubscribeReposClient

from gelbridge._bridge import Bridge
from gelbridge._config import load_config
from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds, create_account
from gelbridge._grants import BRIDGE_KEY_ENV, BridgeKey
from gelbridge._ingest import IncomingRecord
from gelbridge._pds import PdsClient
from gelbridge._records import KEY_GRANT_COLLECTION, MESSAGE_COLLECTION, new_tid
from gelbridge._records.codec import to_json_form
from gelbridge._sealing import Keyring
from gelbridge._state import SqliteStore
from gelbridge._worker import Worker
from gelbridge._worker.sources import FirehoseSource
from testkit.frames import jetstream_event
from testkit.jetstream_server import JetstreamServer

from .conftest import App, running_worker, source_of, text_of
from .test_fleet import LEASE, owners, pid_of, wait_for
from .test_key_grants import app_keyring, ask, bridge_settings, seen, write_grant
from .test_observability import samples
from .worker_proc import WorkerProc

pytestmark = [pytest.mark.pds, pytest.mark.timeout(180)]


def new_account(dev_pds: DevPds, prefix: str) -> AccountInfo:
    return create_account(dev_pds.pds_url, f"{prefix}{secrets.token_hex(5)}.test", secrets.token_urlsafe(12))


@asynccontextmanager
async def apps(dev_pds: DevPds, *accounts: AccountInfo) -> AsyncIterator[list[App]]:
    """The chat app of each account (logged in; keyrings empty until a test grants)."""
    async with AsyncExitStack() as stack:
        out = []
        for a in accounts:
            pds = await stack.enter_async_context(PdsClient(dev_pds.pds_url))
            await pds.login(a.handle, a.password)
            out.append(App(pds, Keyring(), "unused"))
        yield out


async def decrypt_failed(app: App, text: str, key_id: str) -> None:
    rec, _ = await ask(app, text, key_id)
    assert rec.status == "error" and rec.error is not None and rec.error.kind == "decrypt_failed", (text, rec)


async def answered(app: App, text: str, key_id: str) -> None:
    rec, content = await ask(app, text, key_id)
    assert rec.status == "complete" and text_of(content) == f"You said: {text}", (text, rec)
    assert rec.content.key_id == key_id  # sealed with the granted key


# --- 1. [[accounts]] ---------------------------------------------------------------------------


def two_account_config(tmp: Path, pds_url: str, model_url: str, accts: dict[str, AccountInfo]) -> Path:
    cfg = tmp / "gelbridge.toml"
    cfg.write_text("\n".join([
        f'[state]\ndir = "{tmp / "state"}"',
        f'[keyring]\nbridge_key = "{tmp / "bridge.json"}"',
        '[observability]\nlisten = "127.0.0.1:0"',
        '[defaults]\nmodel = { provider = "local", id = "echo-1" }',
        f'[providers.local]\nadapter = "openai"\nbase_url = "{model_url}/v1"\nmax_retries = 0',
        "[replies]\nupdate_interval = 0.2",
        "[worker]\nshutdown_grace = 2.0",
        *(f'[[accounts]]\nname = "{n}"\npds = "{pds_url}"\nidentifier = "{a.handle}"\npassword_env = "PW_{n.upper()}"'
          for n, a in accts.items()),
    ]) + "\n")
    return cfg


@asynccontextmanager
async def gelbridge_run(bridge: Bridge) -> AsyncIterator[httpx.AsyncClient]:
    """``gelbridge run`` of ``bridge`` (its runtime) until the block ends; a client of its
    health/metrics server, once /readyz says every source is connected."""
    stop, ready = asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(bridge.run(stop, ready=ready, out=io.StringIO()))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        await wait_for("the metrics server", lambda: getattr(bridge.watched, "http", None) is not None, 30)
        assert bridge.watched is not None and bridge.watched.http is not None
        host, port = bridge.watched.http.sockets[0].getsockname()[:2]
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as http:
            deadline = time.monotonic() + 30
            while (await http.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, "the sources did not connect within 30 s"
                await asyncio.sleep(0.1)
            yield http
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)


async def test_accounts_a_grant_opens_only_its_own_account_and_a_copy_in_another_repo_is_ignored(
        dev_pds: DevPds, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gelbridge._cli import app as cli

    accts = {"a": new_account(dev_pds, "ga"), "b": new_account(dev_pds, "gb")}
    bridge_key = BridgeKey.generate(kid="b-multi")
    bridge_key.save(tmp_path / "bridge.json")
    key = os.urandom(32)
    with ModelServer() as model:
        cfg = two_account_config(tmp_path, dev_pds.pds_url, model.url, accts)
        environ = {f"PW_{n.upper()}": a.app_password for n, a in accts.items()}
        bridge = Bridge(load_config(cfg), environ=environ)
        async with gelbridge_run(bridge) as http, apps(dev_pds, accts["a"], accts["b"]) as (app_a, app_b):
            wa, wb = bridge.accounts[app_a.did].worker, bridge.accounts[app_b.did].worker
            assert wa.grants.enabled and wb.grants.enabled  # one bridge key, every account
            g = await write_grant(app_a, bridge_key, "k-g", key)
            assert (await seen(wa, g)).honoured
            app_a.keyring = app_b.keyring = app_keyring(("k-g", key))
            await answered(app_a, "granted in A", "k-g")
            await decrypt_failed(app_b, "same key in B", "k-g")  # B has no grant: B's worker has no key
            # the grant copied verbatim into B's repo: same record key, same bytes
            got = await app_a.pds.get_record(KEY_GRANT_COLLECTION, g)
            assert got is not None
            await app_b.pds.put_record(KEY_GRANT_COLLECTION, g, to_json_form(got[1]))
            copy = await seen(wb, g)
            assert not copy.honoured and copy.code == "sealed_key"
            await decrypt_failed(app_b, "copied grant in B", "k-g")
            await answered(app_a, "still fine in A", "k-g")
            assert (wa.grants.book.honoured, wa.grants.book.ignored) == (1, 0)
            assert (wb.grants.book.honoured, wb.grants.book.ignored) == (0, 1)
            page = samples((await http.get("/metrics")).text)
    ignored = {k: v for k, v in page.items() if k[0] == "gelbridge_key_grants_ignored_total"}
    assert ignored == {("gelbridge_key_grants_ignored_total", (("account", "b"), ("reason", "sealed_key"))): 1}
    for n, (honoured, ign) in {"a": (1, 0), "b": (0, 1)}.items():
        assert page[("gelbridge_key_grants", (("account", n), ("state", "honoured")))] == honoured
        assert page[("gelbridge_key_grants", (("account", n), ("state", "ignored")))] == ign
    res = await asyncio.to_thread(CliRunner().invoke, cli, ["status", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    by_name = {a["name"]: a for a in json.loads(res.output)["accounts"]}
    assert (by_name["a"]["grants"]["honoured"], by_name["a"]["grants"]["ignored"]) == (1, 0)
    assert (by_name["b"]["grants"]["honoured"], by_name["b"]["grants"]["ignored"]) == (0, 1)


# --- 2. Jetstream ------------------------------------------------------------------------------


class Relay:
    """The PDS firehose, as Jetstream v1 events into the stand-in (``time_us`` rising)."""

    def __init__(self, server: JetstreamServer) -> None:
        self.server, self.last = server, 0

    async def __call__(self, rec: IncomingRecord) -> None:
        self.last = max(self.last + 1, time.time_ns() // 1000)
        self.server.publish(jetstream_event(rec.did, self.last, rec.action, rec.collection, rec.rkey,
                                            dict(rec.record) if rec.record is not None else None, rec.cid))


def wants(collections: list[str], collection: str) -> bool:
    """Would Jetstream send ``collection`` for these ``wantedCollections``? (empty: all)"""
    return not collections or any(collection == c or (c.endswith(".*") and collection.startswith(c[:-1]))
                                  for c in collections)


async def test_jetstream_a_worker_follows_grant_creates_and_deletes(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    bridge = BridgeKey.generate(kid="b-js")
    key = os.urandom(32)
    with SqliteStore.open_dir(tmp_path / "relay") as relay_state:
        async with JetstreamServer() as js:
            relay = FirehoseSource(dev_pds.pds_url, {app.did}, relay_state, Relay(js), key="relay")
            relay_task = asyncio.create_task(relay.run())
            try:
                await wait_for("the relay to follow the PDS", relay.connected.is_set, 30)
                s = bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge,
                                    watch={"source": "jetstream", "url": js.url})
                async with running_worker(s, pds_account, Keyring()) as worker:
                    [asked] = js.requests
                    assert asked["wantedDids"] == [app.did]
                    assert wants(asked.get("wantedCollections", []), KEY_GRANT_COLLECTION), asked
                    g = await write_grant(app, bridge, "k-js", key)
                    assert (await seen(worker, g)).honoured  # only Jetstream carries it here
                    app.keyring = app_keyring(("k-js", key))
                    await answered(app, "via jetstream", "k-js")
                    await app.pds.delete_record(KEY_GRANT_COLLECTION, g)
                    await seen(worker, g, gone=True)
                    await decrypt_failed(app, "revoked on jetstream", "k-js")
                    assert len(js.requests) == 1  # no reconnect: the events came on the one connection
            finally:
                relay_task.cancel()
                await asyncio.gather(relay_task, return_exceptions=True)


# --- 2b. poll: a grant and its message between two polls -------------------------------------


async def test_poll_a_grant_and_the_message_using_it_written_between_two_polls_opens(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    bridge = BridgeKey.generate(kid="b-poll2")
    key = os.urandom(32)
    s = bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge,
                        watch={"source": "poll", "poll_interval": 600})  # the test polls
    async with running_worker(s, pds_account, Keyring()) as worker:
        g = await write_grant(app, bridge, "k-p2", key)
        app.keyring = app_keyring(("k-p2", key))
        k = await app.send("between two polls", conversation=new_tid(), key_id="k-p2")
        assert await source_of(worker).poll_once() == 2  # one poll finds both
        assert (await seen(worker, g)).honoured
        rec, content = await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=30)
        assert rec.status == "complete" and text_of(content) == "You said: between two polls", rec


# --- 3. the library: a Bridge fed by a consumer ----------------------------------------------


async def sdk_firehose(pds_url: str, bridge: Bridge, connected: asyncio.Event) -> None:
    """A consumer of our own: the SDK's async firehose client, feeding every message on."""
    client = AsyncFirehoseSubscribeReposClient(base_uri=pds_url.replace("http://", "ws://").rstrip("/") + "/xrpc")

    async def on_message(message: Any) -> None:
        connected.set()
        bridge.feed_firehose_frame(message)

    task = asyncio.create_task(client.start(on_message))
    try:
        await asyncio.Future()  # until cancelled
    finally:
        await client.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until_connected(app: App, connected: asyncio.Event) -> None:
    for _ in range(100):  # writes to a collection that is not ours until the client sees one
        await app.pds.put_record("app.example.ping", new_tid(), {"$type": "app.example.ping"})
        try:
            await asyncio.wait_for(connected.wait(), 0.3)
            return
        except TimeoutError:
            pass
    raise AssertionError("the SDK firehose client never received a message")


async def test_a_bridge_fed_by_a_consumer_honours_the_grants_it_is_fed(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    bridge_key = BridgeKey.generate(kid="b-lib")
    bridge_key.save(tmp_path / "bridge.json")
    key = os.urandom(32)
    s = bridge_settings(dev_pds, pds_account, tmp_path, model_server)  # no bridge key in the config
    environ = {"GELBRIDGE_TEST_APP_PASSWORD": pds_account.app_password,
               BRIDGE_KEY_ENV: (tmp_path / "bridge.json").read_text()}  # the library's own environ
    connected = asyncio.Event()
    async with Bridge(s, environ=environ, backfill=False) as bridge:
        worker: Worker = bridge.accounts[app.did].worker
        assert worker.grants.enabled and worker.grants.published == "published"
        feeder = asyncio.create_task(sdk_firehose(dev_pds.pds_url, bridge, connected))
        try:
            await until_connected(app, connected)
            g = await write_grant(app, bridge_key, "k-lib", key)
            app.keyring = app_keyring(("k-lib", key))
            # the message follows the grant at once, as an app does: fed in that order, it opens
            await answered(app, "fed to the library", "k-lib")
            assert (await seen(worker, g)).honoured
            assert bridge.stats["handled-key-grant"] == 1
            await app.pds.delete_record(KEY_GRANT_COLLECTION, g)
            await seen(worker, g, gone=True)
            await decrypt_failed(app, "revoked in the library", "k-lib")
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)


async def test_a_bridge_applies_a_grant_before_a_later_message_even_behind_a_backlog(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    """The consumer feeds, in stream order, messages that keep the grant's shard busy, the
    grant, then a message sealed with its key (on another shard): the grant is in force
    before that message is claimed, as in the stream."""
    bridge_key = BridgeKey.generate(kid="b-order")
    key = os.urandom(32)
    s = bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge_key)
    environ = {"GELBRIDGE_TEST_APP_PASSWORD": pds_account.app_password}
    async with Bridge(s, environ=environ, backfill=False, shards=4) as bridge:
        def shard(rkey: str) -> int:
            return hash((app.did, rkey)) % 4

        g = new_tid()
        app.keyring = app_keyring(("k-order", key), ("k-other", os.urandom(32)))
        busy = []
        while len(busy) < 12:  # messages on the grant's shard, fed before it
            rk = new_tid()
            if shard(rk) == shard(g):
                busy.append(await app.send("busy", conversation=new_tid(), key_id="k-other", rkey=rk))
        await write_grant(app, bridge_key, "k-order", key, rkey=g)
        m = new_tid()
        while shard(m) == shard(g):
            m = new_tid()
        await app.send("after the grant", conversation=new_tid(), key_id="k-order", rkey=m)
        for collection, rkey in [*((MESSAGE_COLLECTION, b) for b in busy), (KEY_GRANT_COLLECTION, g),
                                 (MESSAGE_COLLECTION, m)]:
            got = await app.pds.get_record(collection, rkey)
            assert got is not None
            assert bridge.feed_record(app.did, collection, rkey, got[0], got[1]) == 1
        assert await bridge.join(30)
        rec, content = await app.wait_status(f"{m}.r0", {"complete", "error"}, timeout=30)
        assert rec.status == "complete" and text_of(content) == "You said: after the grant", rec


# --- 4. a fleet takeover -----------------------------------------------------------------------


def fleet_config(tmp: Path, pds_url: str, account: AccountInfo, model_url: str, postgres_url: str) -> Path:
    cfg = tmp / "gelbridge.toml"
    cfg.write_text(f"""
[state]
dir = "state"
url = "{postgres_url}"

[fleet]
lease_seconds = {LEASE}

[defaults]
model = {{ provider = "local", id = "echo-1" }}

[providers.local]
adapter = "openai"
base_url = "{model_url}/v1"
max_retries = 0

[replies]
update_interval = 0.2

[worker]
shutdown_grace = 2

[[accounts]]
name = "g"
pds = "{pds_url}"
identifier = "{account.handle}"
password_env = "FLEET_PW"
""")
    return cfg


def log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


@pytest.mark.postgres
async def test_a_fleet_member_taking_over_lists_the_grants_before_answering_what_waited(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, postgres_url: str, app: App) -> None:
    bridge_key = BridgeKey.generate(kid="b-fleet")
    bridge_key.save(tmp_path / "bridge.json")
    key = os.urandom(32)
    env = {"FLEET_PW": pds_account.app_password, BRIDGE_KEY_ENV: (tmp_path / "bridge.json").read_text()}
    procs: list[WorkerProc] = []

    def held_by(w: WorkerProc) -> bool:
        return pid_of(owners(postgres_url).get(pds_account.handle)) == w.pid

    try:
        with ModelServer() as model:
            cfg = fleet_config(tmp_path, dev_pds.pds_url, pds_account, model.url, postgres_url)
            w1 = WorkerProc(cfg, None, tmp_path / "w1.log", env=env)
            procs.append(w1)
            await asyncio.to_thread(w1.start, 90)
            await wait_for("w1 to hold the account", lambda: held_by(w1), 30)
            w2 = WorkerProc(cfg, None, tmp_path / "w2.log", env=env)
            procs.append(w2)
            await asyncio.to_thread(w2.start, 90)
            g = await write_grant(app, bridge_key, "k-fleet", key)
            await wait_for("w1 to honour the grant", lambda: log_has(w1.log_path, f"key grant {g} honoured"), 30)
            assert not held_by(w2)  # w2 has not followed the account: it never saw the grant's event
            w1.kill()
            app.keyring = app_keyring(("k-fleet", key))
            k = await app.send("answered by w2", conversation=new_tid(), key_id="k-fleet")
            assert not held_by(w2)  # written while no one serves the account (w1's lease runs out)
            took = await wait_for("w2 to take the account over", lambda: held_by(w2), LEASE + 10)
            assert took <= LEASE + 1.5
            rec, content = await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=60)
            assert rec.status == "complete" and text_of(content) == "You said: answered by w2", rec
            assert rec.content.key_id == "k-fleet" and rec.is_sealed
            assert await app.replies_of(k) == [f"{k}.r0"]
            log2 = w2.log_path.read_text()
            assert f"key grant {g} honoured" in log2
            assert w2.terminate() == 0
    finally:
        for p in procs:
            p.stop()
