"""A throw-away PostgreSQL cluster on loopback, for development and tests.

``scripts/postgres/install.sh`` finds (or apt-installs) the machine's PostgreSQL and
runs ``initdb`` once into a cached template; :class:`DevPostgres` copies that template
into a temp dir and runs ``postgres`` on 127.0.0.1 from it::

    with DevPostgres() as pg:
        url = pg.url                       # postgresql://gelbridge@127.0.0.1:PORT/gelbridge
        other = pg.create_database("t1")   # a fresh, empty database on the same cluster

Trust authentication on loopback only, ``fsync`` off (a dev cluster: the tests kill
workers, never Postgres), all data deleted by :meth:`DevPostgres.stop`. As root the
server runs as the system user the install script made (PostgreSQL refuses root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from gelbridge._dev.pds import port_or_free
from gelbridge._errors import GelbridgeError
from gelbridge._state._postgres import import_psycopg


def _default_scripts_dir() -> Path:
    repo = Path(__file__).resolve().parents[2] / "scripts" / "postgres"
    if repo.is_dir():
        return repo
    return Path(__file__).resolve().parents[1] / "_builtin" / "postgres"


SCRIPTS_DIR = Path(os.environ.get("GELBRIDGE_PG_SCRIPTS") or _default_scripts_dir())
DB_USER = "gelbridge"


class DevPostgresError(GelbridgeError):
    """The local development PostgreSQL could not be installed, started or used."""

    kind = "server_error"


def install(*, progress: IO[str] | None = None, timeout: float = 900.0) -> dict[str, str]:
    """Run ``scripts/postgres/install.sh``; its ``bin``, ``template`` and ``user`` lines."""
    script = SCRIPTS_DIR / "install.sh"
    if not script.is_file():
        raise DevPostgresError(f"{script} not found: set GELBRIDGE_PG_SCRIPTS to the repo's scripts/postgres")
    try:
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DevPostgresError(f"preparing PostgreSQL took over {timeout:.0f} s; run: bash {script}") from None
    (progress or sys.stderr).write(proc.stderr if proc.returncode else "")
    found = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    if proc.returncode != 0 or not {"bin", "template", "user"} <= found.keys():
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise DevPostgresError(f"preparing PostgreSQL failed (exit {proc.returncode}); run: bash {script}\n{tail}")
    return found


class DevPostgres:
    """One local PostgreSQL server in a child process (its own process group)."""

    def __init__(self, *, progress: IO[str] | None = None) -> None:
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None
        self._tmp: Path | None = None
        self._progress = progress
        self._stderr_tail: deque[str] = deque(maxlen=30)
        self._bin = Path()

    @property
    def url(self) -> str:
        """The URL of the ``gelbridge`` database (what ``[state] url`` takes)."""
        return self.url_for(DB_USER)

    def url_for(self, database: str) -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{database}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> DevPostgres:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, port: int | None = None, timeout: float = 60.0) -> DevPostgres:
        """Install if needed, copy the template cluster, start ``postgres``, wait until it answers."""
        if self._proc is not None:
            raise DevPostgresError("this DevPostgres is already started")
        import_psycopg("gelbridge dev postgres")  # before installing anything: it talks to the server with it
        self.port = port_or_free(port, DevPostgresError)
        found = install(progress=self._progress)
        self._bin = Path(found["bin"])
        user = found["user"]
        self._tmp = Path(tempfile.mkdtemp(prefix="gelbridge-dev-pg-"))
        data = self._tmp / "data"
        try:
            shutil.copytree(found["template"], data, symlinks=True)
            self._tmp.chmod(0o755)
            data.chmod(0o700)
            if user:
                uid = pwd.getpwnam(user).pw_uid
                for root, dirs, files in os.walk(data):
                    for name in (root, *(os.path.join(root, n) for n in dirs + files)):
                        os.lchown(name, uid, -1)
            (data / "postmaster.pid").unlink(missing_ok=True)
        except (OSError, KeyError) as e:
            self.stop()
            raise DevPostgresError(f"cannot prepare the dev cluster in {self._tmp}: {e}") from None
        cmd = [str(self._bin / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port),
               "-k", str(data), "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200",
               "-c", "listen_addresses=127.0.0.1", "-c", "logging_collector=off"]
        if user:
            cmd = ["runuser", "-u", user, "--", *cmd]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True)
        threading.Thread(target=self._pump_stderr, daemon=True).start()
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self._proc.poll() is not None:
                    raise DevPostgresError(
                        f"postgres exited with code {self._proc.returncode} before it was ready{self._tail()}")
                if self._ready():
                    break
                if time.monotonic() > deadline:
                    raise DevPostgresError(f"postgres did not get ready within {timeout:.0f} s{self._tail()}")
                time.sleep(0.05)
            self.create_database(DB_USER)
        except BaseException:
            self.stop()
            raise
        return self

    def create_database(self, name: str) -> str:
        """Create an empty database on this cluster (a fresh one per test); its URL."""
        if not name.replace("_", "").isalnum():
            raise ValueError("database names here are letters, digits and _")
        import psycopg

        with psycopg.connect(self.url_for("postgres"), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # identifier checked above
        return self.url_for(name)

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT), SIGKILL if it lingers; delete the data."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                self._signal(proc, signal.SIGINT)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._signal(proc, signal.SIGKILL)
                    proc.wait(timeout=5)
            if proc.stderr is not None:
                try:
                    proc.stderr.close()
                except OSError:
                    pass
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def kill(self) -> None:
        """SIGKILL the server (tests of a Postgres outage); :meth:`stop` still cleans up."""
        if self._proc is not None:
            self._signal(self._proc, signal.SIGKILL)
            self._proc.wait(timeout=10)

    # --- internals ---------------------------------------------------------------------

    def _ready(self) -> bool:
        import psycopg

        try:
            psycopg.connect(self.url_for("postgres"), connect_timeout=1).close()
        except psycopg.Error:
            return False
        return True

    @staticmethod
    def _signal(proc: subprocess.Popen[Any], sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def _pump_stderr(self) -> None:
        proc = self._proc
        if proc is None or proc.stderr is None:
            return
        for line in proc.stderr:
            self._stderr_tail.append(line.rstrip())

    def _tail(self) -> str:
        if not self._stderr_tail:
            return ""
        return "; postgres said:\n" + "\n".join(self._stderr_tail)
