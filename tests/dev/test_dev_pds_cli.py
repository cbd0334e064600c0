"""`gelbridge dev pds` as a user runs it: a subprocess, one JSON line, clean SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gelbridge._dev.pds import DevPds, create_account, free_port
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
