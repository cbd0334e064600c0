"""A throwaway reference PDS (+ in-memory PLC) on loopback, for development and tests.

``scripts/pds/install.sh`` installs ``@atproto/dev-env`` into a cache directory outside
the repo (once; later calls return at once) and ``scripts/pds/start.js`` runs it. This
module drives both::

    with DevPds() as pds:            # or DevPds().start(port=...)
        acct = create_account(pds.pds_url, "alice.test", "hunter22")
        ...                          # acct.did, acct.app_password

Nothing leaves the machine: no crawlers, no appview, PLC in memory, data in a temp dir
that :meth:`DevPds.stop` deletes.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from gelbridge._errors import GelbridgeError


def _default_scripts_dir() -> Path:
    """``scripts/pds`` of a checkout, or the copy shipped inside the wheel."""
    repo = Path(__file__).resolve().parents[2] / "scripts" / "pds"
    if repo.is_dir():
        return repo
    return Path(__file__).resolve().parents[1] / "_builtin" / "pds"


SCRIPTS_DIR = Path(os.environ.get("GELBRIDGE_PDS_SCRIPTS") or _default_scripts_dir())


class DevPdsError(GelbridgeError):
    """The local development PDS could not be installed, started or used."""

    kind = "server_error"


@dataclass(frozen=True)
class AccountInfo:
    """A dev-PDS account: the owner password and an app password for gelbridge."""

    did: str
    handle: str
    password: str = field(repr=False)
    app_password: str = field(repr=False)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_or_free(port: int | None, error: type[GelbridgeError]) -> int:
    """``port`` if it is free on 127.0.0.1 now, a free one if None; else ``error`` saying
    so (before a server starts and fails on it with a stack trace of its own)."""
    if not port:
        return free_port()
    if not 1 <= port <= 65535:
        raise error(f"--port {port} is out of range: 1-65535 (or leave --port out for a free one)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind it
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise error(f"--port {port} cannot be used on 127.0.0.1 ({e.strerror or type(e).__name__}); "
                        "pick another port, or leave --port out for a free one") from None
    return port


def install(*, progress: IO[str] | None = None, timeout: float | None = None) -> Path:
    """Run ``scripts/pds/install.sh`` (instant when already installed); the install dir.

    The script's progress goes to ``progress`` (stderr by default). The script bounds
    itself (``GELBRIDGE_PDS_INSTALL_TIMEOUT``, and its wait for another install's lock);
    ``timeout`` adds a bound of the caller's own. Stopping it is SIGTERM first, so the
    script stops npm and node-gyp and deletes its temp dir, then SIGKILL.
    """
    script = SCRIPTS_DIR / "install.sh"
    if not script.is_file():
        raise DevPdsError(f"{script} not found: set GELBRIDGE_PDS_SCRIPTS to the repo's scripts/pds")
    out = progress if progress is not None else sys.stderr
    proc = subprocess.Popen(
        ["bash", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    last: list[str] = [""]

    def relay() -> None:  # live progress: a first install takes minutes
        assert proc.stderr is not None
        for line in proc.stderr:
            out.write(line)
            out.flush()
            if line.strip():
                last[0] = line.strip()

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    try:
        proc.wait(timeout=timeout)
    except BaseException as exc:  # the timeout, or Ctrl-C in the caller
        DevPds._signal(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            DevPds._signal(proc, signal.SIGKILL)
            proc.wait(timeout=10)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise DevPdsError(f"installing the dev PDS took over {timeout:.0f} s; run: bash {script}") from None
        raise
    relay_thread.join(timeout=5)
    assert proc.stdout is not None
    lines = proc.stdout.read().strip().splitlines()
    proc.stdout.close()
    if proc.returncode != 0 or not lines:
        said = f": {last[0]}" if last[0].startswith("pds install:") else f"; run: bash {script}"
        raise DevPdsError(f"installing the dev PDS failed (exit {proc.returncode}){said}")
    return Path(lines[-1])


class DevPds:
    """One local PLC + PDS in a Node child process (its own process group)."""

    def __init__(self, *, log_file: str | Path | None = None, progress: IO[str] | None = None) -> None:
        self.pds_url: str = ""
        self.plc_url: str = ""
        self._proc: subprocess.Popen[str] | None = None
        self._tmp: Path | None = None
        self._log_path = Path(log_file) if log_file else None
        self._log: IO[str] | None = None
        self._progress = progress
        self._stderr_tail: deque[str] = deque(maxlen=40)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> DevPds:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, port: int | None = None, timeout: float = 120.0) -> DevPds:
        """Install if needed, start node, wait (bounded) for its ready line."""
        if self._proc is not None:
            raise DevPdsError("this DevPds is already started")
        pds_port = port_or_free(port, DevPdsError)
        install_dir = install(progress=self._progress)
        node = shutil.which("node")
        if node is None:
            raise DevPdsError("node not found on PATH (need Node >= 20)")
        plc_port = free_port()
        while plc_port == pds_port:
            plc_port = free_port()
        self._tmp = Path(tempfile.mkdtemp(prefix="gelbridge-dev-pds-"))
        self._proc = subprocess.Popen(
            [
                node,
                str(SCRIPTS_DIR / "start.js"),
                "--install-dir", str(install_dir),
                "--pds-port", str(pds_port),
                "--plc-port", str(plc_port),
                "--data-dir", str(self._tmp / "data"),
                "--watch-stdin",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "TMPDIR": str(self._tmp)},
        )
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump_stdout, args=(lines,), daemon=True).start()
        threading.Thread(target=self._pump_stderr, daemon=True).start()
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DevPdsError(f"the dev PDS did not get ready within {timeout:.0f} s{self._tail()}")
                try:
                    line = lines.get(timeout=min(left, 1.0))
                except queue.Empty:
                    continue
                if line is None:
                    self._proc.wait(timeout=5)
                    raise DevPdsError(
                        f"the dev PDS exited with code {self._proc.returncode} before it was ready{self._tail()}"
                    )
                try:
                    ready = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ready, dict) and "pds" in ready and "plc" in ready:
                    self.pds_url, self.plc_url = str(ready["pds"]), str(ready["plc"])
                    return self
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, wait (bounded), SIGKILL if needed; delete the data."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                self._signal(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._signal(proc, signal.SIGKILL)
                    proc.wait(timeout=5)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the node process to exit on its own; its exit code (None if not started)."""
        if self._proc is None:
            return None
        return self._proc.wait(timeout=timeout)

    # --- internals ---------------------------------------------------------------------

    @staticmethod
    def _signal(proc: subprocess.Popen[Any], sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the group id is the pid
        except ProcessLookupError:
            pass

    def _pump_stdout(self, lines: queue.Queue[str | None]) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)

    def _pump_stderr(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        if self._log_path is not None:
            self._log = open(self._log_path, "a", encoding="utf-8")
        for line in proc.stderr:
            self._stderr_tail.append(line.rstrip())
            if self._log is not None:
                self._log.write(line)
                self._log.flush()

    def _tail(self) -> str:
        if not self._stderr_tail:
            return ""
        return "; node stderr:\n" + "\n".join(self._stderr_tail)


def create_account(
    pds_url: str,
    handle: str,
    password: str,
    email: str | None = None,
    *,
    app_password_name: str = "gelbridge",
    timeout: float = 30.0,
) -> AccountInfo:
    """Create an account on a dev PDS (invites off) plus an app password for it."""
    email = email or f"{handle.split('.')[0]}@example.com"
    try:
        with httpx.Client(base_url=pds_url.rstrip("/"), timeout=timeout) as http:
            r = http.post(
                "/xrpc/com.atproto.server.createAccount",
                json={"handle": handle, "email": email, "password": password},
            )
            if r.status_code != 200:
                hint = " (a handle must be new and end in .test on the dev PDS)" if r.status_code == 400 else ""
                raise DevPdsError(f"createAccount {handle} failed: HTTP {r.status_code} {_xrpc_error(r)}{hint}")
            acct = r.json()
            r = http.post(
                "/xrpc/com.atproto.server.createAppPassword",
                json={"name": app_password_name},
                headers={"Authorization": f"Bearer {acct['accessJwt']}"},
            )
            if r.status_code != 200:
                raise DevPdsError(f"createAppPassword for {handle} failed: HTTP {r.status_code} {_xrpc_error(r)}")
            return AccountInfo(
                did=acct["did"], handle=acct["handle"], password=password, app_password=r.json()["password"]
            )
    except httpx.HTTPError as e:
        raise DevPdsError(f"cannot reach the PDS at {pds_url} ({type(e).__name__}): is 'gelbridge dev pds' "
                          "running there?") from None


def _xrpc_error(r: httpx.Response) -> str:
    try:
        body = r.json()
        return f"{body.get('error', '')}: {body.get('message', '')}"
    except ValueError:
        return r.text[:200]
