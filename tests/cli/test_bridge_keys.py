"""CLI: ``gelbridge keys bridge-new``, ``bridge-show`` and ``bridge-retire`` (PROTOCOL.md §6)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._grants import BridgeKey, fingerprint
from gelbridge._pds import PdsClient
from gelbridge._records import BRIDGE_COLLECTION, now_datetime


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "gelbridge", *args], capture_output=True, text=True, timeout=60,
                          env=full, cwd=cwd)


def test_bridge_new_writes_a_0600_key_file_and_prints_kid_and_fingerprint_only(tmp_path: Path) -> None:
    out = tmp_path / "keys" / "bridge.json"
    r = run_cli("keys", "bridge-new", "--out", str(out), "--kid", "bridge-1", "--name", "alice's bot")
    assert r.returncode == 0, r.stderr
    key = BridgeKey.load(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert r.stdout == f"kid          bridge-1\nfingerprint  {key.fingerprint}\n"
    assert key.kid == "bridge-1" and key.name == "alice's bot"
    assert fingerprint(key.public_key) == key.fingerprint
    secret = json.loads(out.read_text())["privateKey"]
    assert secret not in r.stdout + r.stderr
    again = run_cli("keys", "bridge-new", "--out", str(out))
    assert again.returncode == 1 and "never overwritten" in again.stderr and BridgeKey.load(out).kid == "bridge-1"
    bad = run_cli("keys", "bridge-new", "--out", str(tmp_path / "x.json"), "--kid", "no/slash")
    assert bad.returncode == 1 and "must be 1-64 characters" in bad.stderr and not (tmp_path / "x.json").exists()


def test_bridge_show_lists_the_configured_keys_current_first(tmp_path: Path) -> None:
    new, old = BridgeKey.generate(kid="b-new", name="bot"), BridgeKey.generate(kid="b-old")
    new.save(tmp_path / "new.json")
    old.save(tmp_path / "old.json")
    (tmp_path / "gelbridge.toml").write_text('[keyring]\nbridge_key = ["new.json", "old.json"]\n')
    r = run_cli("keys", "bridge-show", "--config", str(tmp_path / "gelbridge.toml"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"b-new  fingerprint {new.fingerprint}  current  name bot",
                                     f"b-old  fingerprint {old.fingerprint}  older (still honoured)"]
    env_only = run_cli("keys", "bridge-show", env={"GELBRIDGE_BRIDGE_KEY": (tmp_path / "old.json").read_text()},
                       cwd=tmp_path / "..")
    assert env_only.stdout.startswith("b-old  fingerprint") and env_only.returncode == 0
    none = run_cli("keys", "bridge-show", cwd=tmp_path.parent)
    assert none.returncode == 1 and "make one with 'gelbridge keys bridge-new --out FILE'" in none.stderr


@pytest.mark.pds
def test_bridge_retire_deletes_that_record_and_refuses_the_current_key(
        tmp_path: Path, dev_pds: DevPds, pds_account: AccountInfo) -> None:
    new, old = BridgeKey.generate(kid="b-new"), BridgeKey.generate(kid="b-old")
    new.save(tmp_path / "new.json")
    (tmp_path / "gelbridge.toml").write_text(f"""
[account]
pds = "{dev_pds.pds_url}"
identifier = "{pds_account.handle}"
password_env = "TEST_PW"

[keyring]
bridge_key = "new.json"
""")

    async def records() -> list[str]:
        async with PdsClient(dev_pds.pds_url) as pds:
            await pds.login(pds_account.handle, pds_account.password)
            return sorted([r.rkey async for r in pds.iter_records(BRIDGE_COLLECTION)])

    async def publish() -> None:
        async with PdsClient(dev_pds.pds_url) as pds:
            await pds.login(pds_account.handle, pds_account.password)
            for k in (new, old):
                await pds.put_record(BRIDGE_COLLECTION, k.kid, k.record_value(now_datetime()))

    import asyncio

    asyncio.run(publish())
    env = {"TEST_PW": pds_account.app_password}
    cfg = str(tmp_path / "gelbridge.toml")
    refused = run_cli("keys", "bridge-retire", "b-new", "--config", cfg, env=env)
    assert refused.returncode == 1 and "b-new is the current bridge key" in refused.stderr
    r = run_cli("keys", "bridge-retire", "b-old", "--config", cfg, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{pds_account.handle}: deleted bridge record b-old\n"
    assert asyncio.run(records()) == ["b-new"]
    r = run_cli("keys", "bridge-retire", "b-old", "--config", cfg, env=env)
    assert r.stdout == f"{pds_account.handle}: had no bridge record b-old\n"


def granted_record_file(tmp_path: Path, bridge: BridgeKey) -> tuple[Path, str, bytes]:
    """A record file as listRecords/getRepo would give: a grant of a fresh key to ``bridge``
    and a user message sealed with that key; no keyring file anywhere."""
    import secrets

    from gelbridge._grants import GRANT_SCHEME, grant_uri, seal_key
    from gelbridge._records import KEY_GRANT_COLLECTION, MESSAGE_COLLECTION, AtUri, PlainContent, TextPart, new_tid
    from gelbridge._records.codec import b64encode
    from gelbridge._sealing import Keyring, seal_content

    did, key = "did:plc:offlinegrants234567abcd", secrets.token_bytes(32)
    g, m = new_tid(), new_tid()
    sealed = seal_key(key, public_key=bridge.public_key, uri=grant_uri(did, g), key_id="k-app", recipient=bridge.kid)
    content = seal_content(PlainContent(parts=[TextPart(text="offline hello")]), uri=AtUri(did, MESSAGE_COLLECTION, m),
                           key_id="k-app", keyring=Keyring({"k-app": key}))
    records = [
        {"uri": grant_uri(did, g), "cid": None, "value": {
            "$type": KEY_GRANT_COLLECTION, "scheme": GRANT_SCHEME, "recipient": bridge.kid, "keyId": "k-app",
            "sealedKey": {"$bytes": b64encode(sealed)}, "createdAt": now_datetime()}},
        {"uri": str(AtUri(did, MESSAGE_COLLECTION, m)), "cid": None, "value": {
            "$type": MESSAGE_COLLECTION, "conversation": new_tid(), "role": "user", "generation": {"attempt": 0},
            "content": content.to_value(), "createdAt": now_datetime()}},
    ]
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records))
    return path, m, key


def test_open_convert_and_reply_open_what_the_files_grants_give_the_bridge_key(tmp_path: Path) -> None:
    from gelbridge._dev.model_server import ModelServer

    bridge, other = BridgeKey.generate(kid="b-off"), BridgeKey.generate(kid="b-off")
    bridge.save(tmp_path / "bridge.json")
    other.save(tmp_path / "other.json")
    records, message, key = granted_record_file(tmp_path, bridge)
    opened = run_cli("open", str(records), "--bridge-key", str(tmp_path / "bridge.json"))
    assert opened.returncode == 0, opened.stderr
    [_, msg] = json.loads(opened.stdout)["records"]
    assert msg["value"]["content"]["parts"][0]["text"] == "offline hello"
    assert "error" not in msg
    via_env = run_cli("open", str(records), env={"GELBRIDGE_BRIDGE_KEY": (tmp_path / "bridge.json").read_text()})
    assert via_env.returncode == 0 and "offline hello" in via_env.stdout
    wrong = run_cli("open", str(records), "--bridge-key", str(tmp_path / "other.json"))
    assert wrong.returncode == 1 and "offline hello" not in wrong.stdout
    assert "k-app" in json.loads(wrong.stdout)["records"][1]["error"]
    none = run_cli("open", str(records))
    assert none.returncode == 1 and "--bridge-key FILE" in none.stderr
    with ModelServer() as srv:
        cfg = tmp_path / "gelbridge.toml"
        cfg.write_text(f"""
[keyring]
bridge_key = "bridge.json"

[defaults]
model = {{ provider = "local", id = "echo-1" }}

[providers.local]
adapter = "openai"
base_url = "{srv.url}/v1"
max_retries = 0
""")
        conv = run_cli("convert", str(records), "--message", message, "--config", str(cfg))
        assert conv.returncode == 0, conv.stderr
        assert "offline hello" in conv.stdout and json.loads(conv.stdout)
        rep = run_cli("reply", str(records), "--message", message, "--config", str(cfg), "--no-stream")
    assert rep.returncode == 0, rep.stderr
    reply = json.loads(rep.stdout)
    assert reply["status"] == "complete" and reply["content"]["keyId"] == "k-app"
    from gelbridge._records import MESSAGE_COLLECTION, AtUri, EncryptedContent
    from gelbridge._sealing import Keyring, open_content

    did = json.loads(records.read_text())[1]["uri"].split("/")[2]
    text = open_content(EncryptedContent.from_value(reply["content"]),
                        uri=AtUri(did, MESSAGE_COLLECTION, f"{message}.r0"), keyring=Keyring({"k-app": key}))
    assert text.parts[0].text == "You said: offline hello"  # type: ignore[union-attr]
    assert json.loads((tmp_path / "bridge.json").read_text())["privateKey"] not in rep.stdout + rep.stderr
