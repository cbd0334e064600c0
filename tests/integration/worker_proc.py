"""`gelbridge run` as a real subprocess: the config files it reads and the process
handle the crash/restart tests drive. Shared by the integration tests (one copy)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gelbridge._dev.pds import AccountInfo
from gelbridge._sealing import Keyring

from .conftest import PASSWORD_ENV

COUNTING_SERVER = str(Path(__file__).with_name("mcp_counting_server.py"))


def write_config(tmp: Path, pds_url: str, account: AccountInfo, model_url: str, keyring: Keyring,
                 update_interval: float = 0.2, *, tools: Sequence[str] | None = None, extra: str = "") -> Path:
    """Save ``keyring`` and a `gelbridge.toml` for the echo model under ``tmp``; ``tools``
    become the default tools, ``extra`` (TOML sections) is appended."""
    keyring.save(tmp / "keyring.json")
    tools_line = f"tools = {json.dumps(list(tools))}\n" if tools is not None else ""
    cfg = tmp / "gelbridge.toml"
    cfg.write_text(f"""
[account]
pds = "{pds_url}"
identifier = "{account.handle}"
password_env = "{PASSWORD_ENV}"

[keyring]
path = "keyring.json"

[state]
dir = "state"

[defaults]
model = {{ provider = "local", id = "echo-1" }}
{tools_line}
[providers.local]
adapter = "openai"
base_url = "{model_url}/v1"
max_retries = 0

[replies]
update_interval = {update_interval}

[worker]
shutdown_grace = 2
{extra}""")
    return cfg


def counting_mcp_toml(count_file: Path, gate_file: Path, auto_run: Sequence[str]) -> str:
    """TOML for the counting MCP server ``j`` (mcp_counting_server.py): every tool needs
    approval except those in ``auto_run``."""
    text = f"""
[tools]
call_timeout = 150

[mcp.servers.j]
command = {json.dumps([sys.executable, COUNTING_SERVER])}
env = {{ COUNT_FILE = {json.dumps(str(count_file))}, GATE_FILE = {json.dumps(str(gate_file))} }}
approval = "always"
startup_timeout = 60
"""
    for tool in auto_run:
        text += f"""
[mcp.servers.j.tools.{tool}]
approval = "never"
"""
    return text


class WorkerProc:
    """`python -m gelbridge run` in its own process group; stderr to a log file."""

    def __init__(self, cfg: Path, account: AccountInfo | None, log: Path, *,
                 env: dict[str, str] | None = None) -> None:
        self.cfg, self.account, self.log_path = cfg, account, log
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, **self.extra_env}
        if self.account is not None:
            env[PASSWORD_ENV] = self.account.app_password
        env.pop("GELBRIDGE_CONFIG", None)
        self._log = open(self.log_path, "ab")
        self._out = self.log_path.with_suffix(".out")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gelbridge", "run", "--config", str(self.cfg), "--log-level", "info"],
            stdout=open(self._out, "wb"), stderr=self._log, env=env, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.log_path.read_text()[-3000:]}")
            if b"ready:" in self._out.read_bytes():
                return
            time.sleep(0.1)
        raise AssertionError("worker not ready in time")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    @property
    def stdout(self) -> str:
        return self._out.read_text()


async def start_worker(cfg: Path, account: AccountInfo, log: Path, procs: list[WorkerProc]) -> WorkerProc:
    """Start a worker process (registered in ``procs`` for clean-up) and wait until ready."""
    w = WorkerProc(cfg, account, log)
    procs.append(w)
    await asyncio.to_thread(w.start, 90)
    return w
