"""Key grants (PROTOCOL.md §6) on the real local PDS: a bridge with no keyring file at all.

- an app written only from docs/protocol.md, in its own process (tests/integration/
  independent_app.py: httpx, PyNaCl, pyca HPKE; nothing of gelbridge), pins the bridge's
  fingerprint, grants a fresh key and gets a sealed reply; deleting the grant revokes it;
- grants moved to another record key, relabelled for another keyId or recipient,
  tampered, or sealed to another bridge key are not honoured (``decrypt_failed``);
- two grants for one keyId: the smaller record key wins; the keyring wins over both;
- bridge key rotation: grants to the old and the new kid both open; the new record is
  published, the old one stays until retired;
- the poll source follows grants (create and delete) as the firehose does;
- a worker restarted with grants already in the repo honours them before answering the
  message that waited for it (the backfill).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._grants import GRANT_SCHEME, BridgeKey, grant_uri, seal_key
from gelbridge._pds import PdsClient
from gelbridge._records import BRIDGE_COLLECTION, KEY_GRANT_COLLECTION, new_tid, now_datetime
from gelbridge._records.codec import b64encode
from gelbridge._records.models import BridgeRecord
from gelbridge._sealing import Keyring
from gelbridge._worker import Worker

from .conftest import App, make_settings, running_worker, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]

HERE = Path(__file__).parent


def bridge_settings(dev_pds: DevPds, account: AccountInfo, tmp: Path, model: ModelServer, *keys: BridgeKey,
                    **over: Any) -> Settings:
    paths = []
    for i, k in enumerate(keys):
        p = tmp / f"bridge-{i}.json"
        if not p.exists():
            k.save(p)
        paths.append(str(p))
    return make_settings(dev_pds.pds_url, account, tmp / "state", model.url,
                         keyring={"bridge_key": paths}, **over)


async def write_grant(app: App, bridge: BridgeKey, key_id: str, key: bytes, *, rkey: str | None = None,
                      seal_rkey: str | None = None, seal_key_id: str | None = None,
                      recipient: str | None = None, seal_to: bytes | None = None,
                      tamper: int | None = None) -> str:
    """A keyGrant record; the ``seal_*`` / ``recipient`` / ``seal_to`` / ``tamper`` knobs make
    the bad ones (sealed for another place, labelled for another, or damaged)."""
    rkey = rkey or new_tid()
    sealed = seal_key(key, public_key=seal_to or bridge.public_key, uri=grant_uri(app.did, seal_rkey or rkey),
                      key_id=seal_key_id or key_id, recipient=bridge.kid)
    if tamper is not None:
        sealed = sealed[:tamper] + bytes([sealed[tamper] ^ 1]) + sealed[tamper + 1:]
    await app.pds.put_record(KEY_GRANT_COLLECTION, rkey, {
        "$type": KEY_GRANT_COLLECTION, "scheme": GRANT_SCHEME, "recipient": recipient or bridge.kid,
        "keyId": key_id, "sealedKey": {"$bytes": b64encode(sealed)}, "createdAt": now_datetime()})
    return rkey


async def seen(worker: Worker, rkey: str, *, gone: bool = False, timeout: float = 20) -> Any:
    """Wait until the worker's grant book holds (or has forgotten) ``rkey``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = worker.grants.book.verdicts.get(rkey)
        if (v is None) == gone:
            return v
        await asyncio.sleep(0.05)
    raise AssertionError(f"grant {rkey} not {'forgotten' if gone else 'seen'} within {timeout} s")


async def ask(app: App, text: str, key_id: str) -> tuple[Any, Any]:
    k = await app.send(text, conversation=new_tid(), key_id=key_id)
    return await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=30)


def app_keyring(*pairs: tuple[str, bytes]) -> Keyring:
    return Keyring(dict(pairs))


async def test_an_app_of_its_own_pins_the_bridge_grants_a_key_gets_a_sealed_reply_and_revokes_it(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer) -> None:
    bridge = BridgeKey.generate(kid="bridge-1", name="test bridge")
    s = bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge)
    assert s.keyring.path is None  # no hand-made keyring anywhere
    async with running_worker(s, pds_account, Keyring()) as worker:
        async with PdsClient(dev_pds.pds_url) as pds:
            await pds.login(pds_account.handle, pds_account.password)
            got = await pds.get_record(BRIDGE_COLLECTION, "bridge-1")
        assert got is not None and BridgeRecord.from_value(got[1]).public_key == bridge.public_key
        env = {**os.environ, "APP_PASSWORD": pds_account.password}
        run = await asyncio.to_thread(
            subprocess.run, [sys.executable, str(HERE / "independent_app.py"), dev_pds.pds_url, pds_account.handle,
                             bridge.fingerprint, "hello bridge", "--revoke"],
            capture_output=True, text=True, timeout=150, env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        out = json.loads(run.stdout)
        assert out["first"]["status"] == "complete", out
        assert out["first"]["text"] == "You said: hello bridge" and out["first"]["keyId"].startswith("app-")
        assert out["second"] == {"status": "error", "error": "decrypt_failed"}, out
        assert worker.grants.book.verdicts == {}  # forgotten, not ignored
        # a wrong pin: the app refuses before writing anything
        refused = await asyncio.to_thread(
            subprocess.run, [sys.executable, str(HERE / "independent_app.py"), dev_pds.pds_url, pds_account.handle,
                             "0000-0000-0000-0000-0000-0000", "hi"], capture_output=True, text=True, timeout=60, env=env)
        assert refused.returncode == 3 and json.loads(refused.stdout)["refused"] == "fingerprint"


async def test_grants_moved_relabelled_tampered_or_for_another_bridge_are_not_honoured(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer,
        app: App, caplog: pytest.LogCaptureFixture) -> None:
    bridge, stranger = BridgeKey.generate(kid="b-main"), BridgeKey.generate(kid="b-other")
    s = bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge)
    good_key, bad = os.urandom(32), {}
    async with running_worker(s, pds_account, Keyring()) as worker:
        good = await write_grant(app, bridge, "k-good", good_key)
        cases = {
            "moved": dict(seal_rkey=new_tid()),  # sealed for another record key (a copy)
            "keyId": dict(seal_key_id="k-good"),  # relabelled: sealed for k-good, names its own keyId
            "recipient": dict(recipient=stranger.kid),  # names a kid this bridge does not hold
            "another bridge": dict(seal_to=stranger.public_key),
            "tampered enc": dict(tamper=3),
            "tampered ct": dict(tamper=60),
        }
        expected = {"moved": "sealed_key", "keyId": "sealed_key", "recipient": "recipient",
                    "another bridge": "sealed_key", "tampered enc": "sealed_key", "tampered ct": "sealed_key"}
        for i, (name, knobs) in enumerate(cases.items()):
            kid, key = f"k-bad-{i}", os.urandom(32)
            bad[name] = (kid, key, await write_grant(app, bridge, kid, key, **knobs))
        for name, (_kid, _, rkey) in bad.items():
            v = await seen(worker, rkey)
            assert not v.honoured and v.code == expected[name], name
        assert (await seen(worker, good)).honoured
        app.keyring = app_keyring(("k-good", good_key), *((kid, key) for kid, key, _ in bad.values()))
        rec, content = await ask(app, "good", "k-good")
        assert rec.status == "complete" and text_of(content) == "You said: good"
        for name, (kid, _, _) in bad.items():
            rec, _ = await ask(app, name, kid)
            assert rec.status == "error" and rec.error is not None and rec.error.kind == "decrypt_failed", name
        assert worker.grants.book.honoured == 1 and worker.grants.book.ignored == len(bad)
        from gelbridge._runtime.status import status_report

        rep = await status_report(s, worker.store)
        [acct] = rep["accounts"]
        assert (acct["grants"]["honoured"], acct["grants"]["ignored"]) == (1, len(bad))
        assert set(acct["grants"]) == {"honoured", "ignored", "at"}  # counts only
    ignored_lines = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage() and "key grant" in
                     r.getMessage()]
    assert len(ignored_lines) == len(bad)  # one line each


async def test_conflicting_grants_the_smaller_record_key_wins_and_the_keyring_wins_over_both(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    bridge = BridgeKey.generate(kid="b-1")
    s = bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge)
    first, second, operators = os.urandom(32), os.urandom(32), os.urandom(32)
    small, big = new_tid(), new_tid()
    assert small < big
    async with running_worker(s, pds_account, Keyring({"k-op": operators})) as worker:
        await write_grant(app, bridge, "k-x", second, rkey=big)  # the bigger one arrives first
        await seen(worker, big)
        await write_grant(app, bridge, "k-x", first, rkey=small)
        assert (await seen(worker, small)).honoured
        assert worker.grants.book.verdicts[big].code == "conflict"
        op_grant = await write_grant(app, bridge, "k-op", os.urandom(32))
        assert (await seen(worker, op_grant)).code == "keyring"
        app.keyring = app_keyring(("k-x", first))
        rec, content = await ask(app, "winner", "k-x")
        assert rec.status == "complete" and text_of(content) == "You said: winner"
        app.keyring = app_keyring(("k-x", second))
        rec, _ = await ask(app, "loser", "k-x")
        assert rec.status == "error" and rec.error is not None and rec.error.kind == "decrypt_failed"
        # the winner deleted: the other grant is the only one left, so it is honoured now
        await app.pds.delete_record(KEY_GRANT_COLLECTION, small)
        await seen(worker, small, gone=True)
        assert worker.grants.book.verdicts[big].honoured
        rec, content = await ask(app, "promoted", "k-x")
        assert rec.status == "complete" and text_of(content) == "You said: promoted"


async def test_bridge_key_rotation_grants_to_old_and_new_kid_both_open(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    old, new = BridgeKey.generate(kid="b-old"), BridgeKey.generate(kid="b-new")
    k_old, k_new = os.urandom(32), os.urandom(32)
    async with running_worker(bridge_settings(dev_pds, pds_account, tmp_path, model_server, old),
                              pds_account, Keyring()) as worker:
        g_old = await write_grant(app, old, "k-old", k_old)
        await seen(worker, g_old)
    # the operator rotates: the new key first (published), the old one still honoured
    s = bridge_settings(dev_pds, pds_account, tmp_path / "b", model_server, new, old)
    async with running_worker(s, pds_account, Keyring()) as worker:
        assert worker.grants.published == "published"
        assert worker.grants.book.verdicts[g_old].honoured  # listed at start
        g_new = await write_grant(app, new, "k-new", k_new)
        assert (await seen(worker, g_new)).honoured
        app.keyring = app_keyring(("k-old", k_old), ("k-new", k_new))
        for kid in ("k-old", "k-new"):
            rec, content = await ask(app, kid, kid)
            assert rec.status == "complete" and text_of(content) == f"You said: {kid}"
        lines = "\n".join(worker.startup_lines("firehose"))
        assert f"bridge key b-new fingerprint {new.fingerprint}" in lines and "also honours b-old" in lines
    kids = sorted([r.rkey async for r in app.pds.iter_records(BRIDGE_COLLECTION)])
    assert kids == ["b-new", "b-old"]  # the old record stays until `gelbridge keys bridge-retire b-old`


async def test_the_poll_source_follows_grant_creates_and_deletes(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    bridge = BridgeKey.generate(kid="b-poll")
    s = bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge,
                        watch={"source": "poll", "poll_interval": 0.3})
    key = os.urandom(32)
    async with running_worker(s, pds_account, Keyring()) as worker:
        g = await write_grant(app, bridge, "k-p", key)
        assert (await seen(worker, g)).honoured
        app.keyring = app_keyring(("k-p", key), *((f"k-q{i}", key) for i in range(3)))
        rec, content = await ask(app, "polled", "k-p")
        assert rec.status == "complete" and text_of(content) == "You said: polled"
        await app.pds.delete_record(KEY_GRANT_COLLECTION, g)
        await seen(worker, g, gone=True)
        rec, _ = await ask(app, "revoked", "k-p")
        assert rec.error is not None and rec.error.kind == "decrypt_failed"
        # an app writes its grant and at once the message (both land between two polls, mostly):
        # the poll reads grants first, so the message meets its key; likewise a delete
        for i in range(3):
            g = await write_grant(app, bridge, f"k-q{i}", key)
            rec, content = await ask(app, f"at once {i}", f"k-q{i}")
            assert rec.status == "complete" and text_of(content) == f"You said: at once {i}", rec.error
            await app.pds.delete_record(KEY_GRANT_COLLECTION, g)
            rec, _ = await ask(app, f"revoked at once {i}", f"k-q{i}")
            assert rec.error is not None and rec.error.kind == "decrypt_failed"


async def test_a_restarted_worker_honours_grants_before_answering_what_waited(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    bridge = BridgeKey.generate(kid="b-restart")
    s = bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge)
    key = os.urandom(32)
    async with PdsClient(dev_pds.pds_url) as pds:  # the bridge record, as a first run left it
        await pds.login(pds_account.handle, pds_account.password)
        await pds.put_record(BRIDGE_COLLECTION, bridge.kid, bridge.record_value(now_datetime()))
    await write_grant(app, bridge, "k-w", key)
    app.keyring = app_keyring(("k-w", key))
    k = await app.send("waited", conversation=new_tid(), key_id="k-w")  # nobody is running
    async with running_worker(s, pds_account, Keyring()) as worker:
        assert worker.grants.published == "kept"
        rec, content = await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=30)
        assert rec.status == "complete" and text_of(content) == "You said: waited"


async def test_a_blob_sealed_with_a_granted_key_opens_and_not_after_revocation(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    from .test_oversized_request import send_files, upload_text

    bridge = BridgeKey.generate(kid="b-files")
    key = os.urandom(32)
    app.keyring, app.key_id = app_keyring(("k-file", key)), "k-file"
    async with running_worker(bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge),
                              pds_account, Keyring()) as worker:
        g = await write_grant(app, bridge, "k-file", key)
        assert (await seen(worker, g)).honoured
        blob = await upload_text(app, b"the grant opened this file")
        k = await send_files(app, new_tid(), "read it", [(blob, "note.txt")])
        rec, _ = await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=30)
        assert rec.status == "complete", rec.error
        assert "the grant opened this file" in json.dumps(model_server.requests[-1].body)
        await app.pds.delete_record(KEY_GRANT_COLLECTION, g)
        await seen(worker, g, gone=True)
        k = await send_files(app, new_tid(), "again", [(blob, "note.txt")])
        rec, _ = await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=30)
        assert rec.status == "error" and rec.error.kind == "decrypt_failed"
