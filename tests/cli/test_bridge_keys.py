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
