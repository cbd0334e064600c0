"""``gelbridge send --grant`` and ``chat --grant`` as an app on another machine (PROTOCOL.md
§6), against the real local PDS and a worker that holds a bridge key and no keyring at
all: the app shares nothing with it but the repo.

- the first use pins the bridge's fingerprint (shown) beside the app's keyring; each new
  conversation gets a fresh key, saved there (0600) and granted; ``--conversation`` goes
  on with its key;
- a bridge record replaced by another key, or a pinned key retired, is refused loudly and
  nothing is written, until ``--repin``; with several bridges and no pin, ``--bridge KID`` or
  the operator's ``--fingerprint``;
- ``/rotate`` in ``chat`` gives the conversation a new key and the history still opens.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._grants import BridgeKey
from gelbridge._pairing import pins_path
from gelbridge._records import BRIDGE_COLLECTION, KEY_GRANT_COLLECTION, MESSAGE_COLLECTION, now_datetime
from gelbridge._sealing import Keyring

from .conftest import PASSWORD_ENV, App, running_worker
from .test_key_grants import bridge_settings, seen

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


def app_config(dir: Path, pds_url: str, account: AccountInfo, extra: str = "") -> Path:
    """The app's own config: the account and a keyring file that does not exist yet."""
    dir.mkdir(parents=True, exist_ok=True)
    cfg = dir / "app.toml"
    cfg.write_text(f'[account]\npds = "{pds_url}"\nidentifier = "{account.handle}"\npassword_env = "{PASSWORD_ENV}"\n'
                   f'[keyring]\npath = "my-keys.json"\n{extra}')
    return cfg


async def gelbridge(cfg: Path, command: str, *args: str, password: str, stdin: str | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    env[PASSWORD_ENV] = password
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gelbridge", command, "--config", str(cfg), "--timeout", "60", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL, env=env)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 150)
    assert "Traceback" not in err.decode(), err.decode()
    return proc.returncode or 0, out.decode(), err.decode()


async def records(app: App, collection: str) -> dict[str, Any]:
    return {r.rkey: r.value async for r in app.pds.iter_records(collection)}


def conversation_of(err: str) -> str:
    return err.split("in conversation ")[1].split(" ")[0].rstrip(";")


async def test_send_pairs_on_first_use_grants_a_key_per_conversation_and_goes_on_with_it(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    bridge = BridgeKey.generate(kid="b-one", name="team bridge")
    cfg = app_config(tmp_path / "phone", dev_pds.pds_url, pds_account)
    ring_path = tmp_path / "phone" / "my-keys.json"
    pw = pds_account.app_password
    async with running_worker(bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge),
                              pds_account, Keyring()) as worker:
        code, out, err = await gelbridge(cfg, "send", "hello bridge", "--grant", password=pw)
        assert code == 0, err
        assert out.strip() == "You said: hello bridge"
        assert f'pinned bridge b-one "team bridge" (fingerprint {bridge.fingerprint})' in err
        ring = Keyring.load(ring_path)
        [key_id] = list(ring)
        assert f"(key {key_id}, granted to bridge b-one)" in err
        for private in (ring_path, pins_path(ring_path)):
            assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
        assert json.loads(pins_path(ring_path).read_text())["pins"][app.did]["fingerprint"] == bridge.fingerprint
        [(g1, grant)] = (await records(app, KEY_GRANT_COLLECTION)).items()
        assert grant["recipient"] == "b-one" and grant["keyId"] == key_id
        assert (await seen(worker, g1)).honoured

        conv = conversation_of(err)
        code, out, err = await gelbridge(cfg, "send", "and again", "--grant", "--conversation", conv, password=pw)
        assert code == 0 and out.strip() == "You said: and again", err
        assert "pinned" not in err and f"(key {key_id}," in err  # the same key, no new grant
        assert len(await records(app, KEY_GRANT_COLLECTION)) == 1
        history = model_server.requests[-1].body["messages"]
        assert any("hello bridge" in json.dumps(m) for m in history)  # the first turn opened too

        code, out, err = await gelbridge(cfg, "send", "a new chat", "--grant", password=pw)
        assert code == 0 and out.strip() == "You said: a new chat", err
        assert conversation_of(err) != conv
        assert len(Keyring.load(ring_path)) == 2 and len(await records(app, KEY_GRANT_COLLECTION)) == 2
        await worker.wait_idle(10)
        assert sorted(worker.grants.book.keys) == sorted(Keyring.load(ring_path))
    keys_used = {v["content"]["keyId"] for v in (await records(app, MESSAGE_COLLECTION)).values()}
    assert keys_used == set(Keyring.load(ring_path))


async def test_a_changed_or_retired_bridge_key_is_refused_until_repinned(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    one, two = BridgeKey.generate(kid="b-one"), BridgeKey.generate(kid="b-two")
    cfg = app_config(tmp_path / "phone", dev_pds.pds_url, pds_account)
    pw = pds_account.app_password
    async with running_worker(bridge_settings(dev_pds, pds_account, tmp_path / "w1", model_server, one),
                              pds_account, Keyring()):
        code, _, err = await gelbridge(cfg, "send", "first", "--grant", password=pw)
        assert code == 0, err
    # someone with write access to the repo swaps the bridge record for a key of their own
    impostor = BridgeKey.generate(kid="b-one")
    await app.pds.put_record(BRIDGE_COLLECTION, "b-one", impostor.record_value(now_datetime()))
    before = (len(await records(app, MESSAGE_COLLECTION)), len(await records(app, KEY_GRANT_COLLECTION)))
    code, _, err = await gelbridge(cfg, "send", "a secret", "--grant", password=pw)
    assert code == 1 and "CHANGED" in err and one.fingerprint in err and impostor.fingerprint in err, err
    assert "Nothing was sent" in err and "--repin" in err
    assert (len(await records(app, MESSAGE_COLLECTION)), len(await records(app, KEY_GRANT_COLLECTION))) == before

    # the operator rotates: b-two is the current key, b-one still honoured (and its record put right)
    async with running_worker(bridge_settings(dev_pds, pds_account, tmp_path / "w2", model_server, two, one),
                              pds_account, Keyring()):
        got = await app.pds.get_record(BRIDGE_COLLECTION, "b-one")
        assert got is not None and one.is_published_by(got[1])  # the impostor's record was put right
        code, out, err = await gelbridge(cfg, "send", "still pinned", "--grant", password=pw)
        assert code == 0 and out.strip() == "You said: still pinned", err
        assert "(key " in err and "granted to bridge b-one)" in err
        other = app_config(tmp_path / "laptop", dev_pds.pds_url, pds_account)  # a second app, no pin yet
        code, _, err = await gelbridge(other, "send", "which one?", "--grant", password=pw)
        assert code == 1 and "2 bridge keys are published" in err and "--bridge KID" in err, err
        code, _, err = await gelbridge(other, "send", "is it you?", "--grant", "--fingerprint",
                                       "0000-0000-0000-0000-0000-0000", password=pw)
        assert code == 1 and "no bridge key with fingerprint 0000" in err, err
        code, out, err = await gelbridge(other, "send", "this one", "--grant", "--fingerprint", two.fingerprint,
                                         password=pw)  # the operator's fingerprint picks b-two of the two
        assert code == 0 and out.strip() == "You said: this one" and "pinned bridge b-two" in err, err
        third = app_config(tmp_path / "tablet", dev_pds.pds_url, pds_account)
        code, out, err = await gelbridge(third, "send", "or by kid", "--grant", "--bridge", "b-two", password=pw)
        assert code == 0 and out.strip() == "You said: or by kid" and "pinned bridge b-two" in err, err
        # ... and retires b-one ('gelbridge keys bridge-retire b-one' deletes its record)
        await app.pds.delete_record(BRIDGE_COLLECTION, "b-one")
        code, _, err = await gelbridge(cfg, "send", "hello?", "--grant", password=pw)
        assert code == 1 and "no longer published" in err and two.fingerprint in err, err
        code, out, err = await gelbridge(cfg, "send", "repinned", "--grant", "--repin", password=pw)
        assert code == 0 and out.strip() == "You said: repinned", err
        assert f"pinned bridge b-two (fingerprint {two.fingerprint})" in err


async def test_chat_rotates_a_conversation_key_and_the_history_still_opens(
        dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer, app: App) -> None:
    bridge = BridgeKey.generate(kid="b-one")
    cfg = app_config(tmp_path / "phone", dev_pds.pds_url, pds_account, "[client]\ngrant = true\n")
    async with running_worker(bridge_settings(dev_pds, pds_account, tmp_path, model_server, bridge),
                              pds_account, Keyring()) as worker:
        code, out, err = await gelbridge(cfg, "chat", password=pds_account.app_password,
                                         stdin="before rotation\n/rotate\nafter rotation\n/quit\n")
        await worker.wait_idle(10)
    assert code == 0, out + err
    assert "bot> You said: before rotation" in out and "bot> You said: after rotation" in out
    ring = Keyring.load(tmp_path / "phone" / "my-keys.json")
    assert len(ring) == 2
    assert any("new key " in line and "granted to bridge b-one" in line for line in out.splitlines())
    msgs = await records(app, MESSAGE_COLLECTION)
    users = sorted((v["createdAt"], v) for v in msgs.values() if v["role"] == "user")
    assert len(users) == 2 and users[0][1]["conversation"] == users[1][1]["conversation"]
    assert {u["content"]["keyId"] for _, u in users} == set(ring)  # one key before /rotate, one after
    assert len(await records(app, KEY_GRANT_COLLECTION)) == 2
    second = model_server.requests[-1].body["messages"]
    assert any("before rotation" in json.dumps(m) for m in second)  # sealed with the older key, still opened
