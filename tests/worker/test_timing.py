"""Turn timings: PDS reads (read) apart from our own work (bridge), overlapping reads
counted once, the state-store migration that adds read_ms, and `gelbridge status`."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from gelbridge._cli import app
from gelbridge._config import Settings
from gelbridge._runtime.status import status_report
from gelbridge._state import DB_FILENAME, SCHEMA_VERSION, SqliteStore, TurnTiming
from gelbridge._state._sqlite import _MIGRATIONS
from gelbridge._worker.timing import ReadClock, reading, start_reads, stop_reads


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_overlapping_reads_count_once_and_reads_outside_a_turn_count_nowhere() -> None:
    clock = Clock()
    rc = ReadClock(clock)
    with reading():  # no turn: nothing to attribute to
        clock.t = 5.0
    token = start_reads(rc)
    try:
        a, b = reading(), reading()
        a.__enter__()  # read A: 5.0 .. 5.3
        clock.t = 5.1
        b.__enter__()  # read B: 5.1 .. 5.4, overlapping A
        clock.t = 5.3
        a.__exit__(None, None, None)
        assert rc.ms == 0.0  # B is still open
        clock.t = 5.4
        b.__exit__(None, None, None)
        clock.t = 6.0
        with reading():  # read C: 6.0 .. 6.1
            clock.t = 6.1
    finally:
        stop_reads(token)
    assert abs(rc.ms - 500) < 1e-6 and rc.reads == 3  # 400 (A ∪ B) + 100 (C), not 600
    with reading():  # after the turn: not counted
        clock.t = 9.0
    assert abs(rc.ms - 500) < 1e-6


async def test_tasks_started_by_a_turn_count_for_it_and_other_tasks_do_not() -> None:
    rc = ReadClock()
    other = ReadClock()

    async def read(seconds: float) -> None:
        with reading():
            await asyncio.sleep(seconds)

    async def turn(clock: ReadClock) -> None:
        token = start_reads(clock)
        try:
            await asyncio.gather(read(0.05), read(0.05))  # side records, read together
        finally:
            stop_reads(token)

    await asyncio.gather(turn(rc), turn(other), read(0.2))
    assert 40 <= rc.ms < 150 and rc.reads == 2  # ~50 ms wall, not ~100 (no double count)
    assert other.reads == 2


def v1_database(path: Path) -> None:
    raw = sqlite3.connect(path)
    for statement in _MIGRATIONS[0].split(";"):
        if statement.strip():
            raw.execute(statement)
    raw.execute("PRAGMA user_version = 1")
    raw.execute("INSERT INTO turns (at, account, reply_rkey, status, queue_ms, bridge_ms, model_ms, write_ms) "
                "VALUES (1.0, 'did:plc:a', '3mold.r0', 'complete', 1, 2, 3, 4)")
    raw.commit()
    raw.close()


async def test_migration_adds_read_ms_and_old_rows_read_as_null(tmp_path: Path) -> None:
    p = tmp_path / DB_FILENAME
    v1_database(p)
    with SqliteStore(p) as s:
        assert await s.schema_version() == SCHEMA_VERSION >= 2
        await s.record_turn(TurnTiming("3mnew.r0", "did:plc:a", "complete", 10, 20, 300, 40, read_ms=50))
        new, old = await s.recent_turns(2)
    assert (new.reply_rkey, new.read_ms, new.total_ms) == ("3mnew.r0", 50, 420)
    assert (old.reply_rkey, old.read_ms, old.total_ms) == ("3mold.r0", None, 10)


async def test_status_shows_read_and_a_dash_for_rows_without_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    v1_database(state / DB_FILENAME)
    with SqliteStore.open_dir(state) as s:
        await s.record_turn(TurnTiming("3mnew.r0", "did:plc:a", "complete", 10, 20, 300, 40, read_ms=55))
        settings = Settings.model_validate({"state": {"dir": str(state)}})
        rep = await status_report(settings, s)
    assert [(t["reply"], t["read_ms"], t["bridge_ms"]) for t in rep["accounts"][0]["turns"]] == [
        ("3mnew.r0", 55.0, 20.0), ("3mold.r0", None, 2.0)]
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(f'[state]\ndir = "{state}"\n')
    res = await asyncio.to_thread(CliRunner().invoke, app, ["status", "--config", str(cfg)])  # its own loop
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    title = next(i for i, line in enumerate(lines) if line.strip().startswith("recent turns"))
    assert lines[title + 1].split()[2:7] == ["queue", "read", "bridge", "model", "write"]
    new = next(line for line in lines if "3mnew.r0" in line).split()
    old = next(line for line in lines if "3mold.r0" in line).split()
    assert new[2:8] == ["10", "55", "20", "300", "40", "425"]
    assert old[2:8] == ["1", "-", "2", "3", "4", "10"]
