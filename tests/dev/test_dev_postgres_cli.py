"""`gelbridge dev postgres` as a user runs it: a subprocess, one JSON line with a URL that
a state store can use, clean SIGTERM, data deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from gelbridge._dev.pds import free_port
from gelbridge._dev.postgres import DevPostgres
from gelbridge._state._postgres import PostgresStore
from testkit.processes import read_line

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(200)]


async def test_dev_postgres_command_prints_its_url_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gelbridge", "dev", "postgres", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "stderr.txt", "w"), stdin=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )
    try:
        line = read_line(proc, timeout=120)
        assert line, f"no ready line; stderr: {(tmp_path / 'stderr.txt').read_text()[-2000:]}"
        url = json.loads(line)["url"]
        assert url == f"postgresql://gelbridge@127.0.0.1:{port}/gelbridge"
        async with PostgresStore(url) as store:
            await store.set_cursor("src", 7)
            assert await store.get_cursor("src") == 7
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None and proc.stdout.read() == ""  # exactly one line
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_dev_postgres_stop_ends_the_server_and_deletes_its_data() -> None:
    pg = DevPostgres().start()
    try:
        tmp = pg._tmp
        assert tmp is not None and (tmp / "data" / "PG_VERSION").exists()
        assert pg.running
        other = pg.create_database("second")
        with psycopg.connect(other) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("second",)
    finally:
        pg.stop()
    assert not pg.running and not tmp.exists()
