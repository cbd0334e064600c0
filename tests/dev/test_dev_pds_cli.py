"""`gelbridge dev pds` as a user runs it: a subprocess, one JSON line with the account it
made (a real app password), the config to paste on stderr (it passes `gelbridge check`),
clean SIGTERM; `gelbridge dev account` makes more accounts on a running one."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import DevPds, create_account, free_port
from gelbridge._dev.snippets import model_toml
from testkit.processes import read_line

pytestmark = [pytest.mark.pds, pytest.mark.timeout(200)]

GELBRIDGE = [sys.executable, "-m", "gelbridge"]


def test_dev_pds_command_prints_ready_line_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*GELBRIDGE, "dev", "pds", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "stderr.txt", "w"),
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        line = read_line(proc, timeout=150)
        assert line, f"no ready line; stderr: {(tmp_path / 'stderr.txt').read_text()[-2000:]}"
        ready = json.loads(line)
        assert ready["pds"] == f"http://localhost:{port}"
        assert ready["plc"].startswith("http://localhost:")
        r = httpx.get(f"http://127.0.0.1:{port}/xrpc/com.atproto.server.describeServer", timeout=10)
        assert r.status_code == 200 and r.json()["inviteCodeRequired"] is False
        acct = create_account(ready["pds"], "cli0test.test", "pw-cli-test")
        assert acct.did.startswith("did:plc:")
        made = ready["account"]
        assert made["handle"] == "alice.test" and made["did"].startswith("did:plc:")
        _assert_app_password(ready["pds"], made)
        err = (tmp_path / "stderr.txt").read_text()
        assert f"export GELBRIDGE_APP_PASSWORD={made['app_password']}" in err
        pasted = err[err.index("for gelbridge.toml:") + len("for gelbridge.toml:"):err.index("and in the shell")]
        _assert_check_passes(tmp_path, pasted, made["app_password"])

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None and proc.stdout.read() == ""  # exactly one line
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/xrpc/_health", timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_dev_pds_stop_ends_node_and_deletes_data() -> None:
    pds = DevPds()
    pds.start(timeout=150)
    try:
        assert pds.running
        tmp = pds._tmp
        assert tmp is not None and tmp.exists()
        pid = pds._proc.pid if pds._proc else -1
    finally:
        pds.stop()
    assert not pds.running
    assert not tmp.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _assert_app_password(pds_url: str, account: dict[str, str]) -> None:
    """The app password logs in, with an app password's scope, and the owner's session
    lists it as "gelbridge"."""
    with httpx.Client(base_url=pds_url, timeout=10) as http:
        r = http.post("/xrpc/com.atproto.server.createSession",
                      json={"identifier": account["handle"], "password": account["app_password"]})
        assert r.status_code == 200 and r.json()["did"] == account["did"]
        claims = json.loads(base64.urlsafe_b64decode(r.json()["accessJwt"].split(".")[1] + "=="))
        assert claims["scope"] == "com.atproto.appPass"
        owner = http.post("/xrpc/com.atproto.server.createSession",
                          json={"identifier": account["handle"], "password": account["password"]}).json()
        names = http.get("/xrpc/com.atproto.server.listAppPasswords",
                         headers={"Authorization": f"Bearer {owner['accessJwt']}"}).json()["passwords"]
        assert [p["name"] for p in names] == ["gelbridge"]


def _assert_check_passes(tmp_path: Path, account_block: str, app_password: str) -> None:
    """The printed account block, with a model block and a keyring made by `keys new`,
    passes `gelbridge check` (the PDS login included)."""
    cfg = tmp_path / "gelbridge.toml"
    with ModelServer() as model:
        cfg.write_text(account_block + "\n" + model_toml(model.url))
        subprocess.run([*GELBRIDGE, "keys", "new", "--keyring", str(tmp_path / "keyring.json")], check=True,
                       capture_output=True, timeout=60)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")},
               "GELBRIDGE_APP_PASSWORD": app_password}
        r = subprocess.run([*GELBRIDGE, "check", "--config", str(cfg)], capture_output=True, text=True, env=env,
                           timeout=90, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and r.stdout.strip().endswith("check: ok"), (r.stdout, r.stderr)
    assert "logged in as alice.test" in r.stdout


def test_dev_account_makes_another_account_with_an_app_password(dev_pds: DevPds) -> None:
    name = f"bob{secrets.token_hex(3)}"
    r = subprocess.run([*GELBRIDGE, "dev", "account", "--pds", dev_pds.pds_url, "--handle", name,
                        "--password-env", "BOB_PW"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    [line] = r.stdout.splitlines()
    out = json.loads(line)
    assert out["pds"] == dev_pds.pds_url and out["account"]["handle"] == f"{name}.test"
    _assert_app_password(dev_pds.pds_url, out["account"])
    assert f'identifier = "{name}.test"' in r.stderr and 'password_env = "BOB_PW"' in r.stderr
    assert f"export BOB_PW={out['account']['app_password']}" in r.stderr

    again = subprocess.run([*GELBRIDGE, "dev", "account", "--pds", dev_pds.pds_url, "--handle", f"{name}.test"],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and again.stdout == ""
    [error] = again.stderr.splitlines()
    assert error.startswith(f"error: createAccount {name}.test failed: HTTP 400 ")
    assert error.endswith("(a handle must be new and end in .test on the dev PDS)")


def test_dev_account_without_a_pds_says_so_in_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run([*GELBRIDGE, "dev", "account", "--pds", url], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f"error: cannot reach the PDS at {url} (ConnectError): is 'gelbridge dev pds' running there?"]
