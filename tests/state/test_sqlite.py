"""The SQLite backend's own concerns: file permissions, migrations of old files, bad files.
The store's rules on both backends are in test_store.py."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from gelbridge._errors import StateError
from gelbridge._state import (
    DB_FILENAME,
    SCHEMA_VERSION,
    CallRef,
    SqliteStore,
    open_state,
)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / DB_FILENAME


async def test_the_journal_keeps_no_call_id_in_the_clear(db_path: Path) -> None:
    with SqliteStore(db_path) as s:
        ref = CallRef("did:a", "conv", "call-CANARY-7f3e")
        await s.begin_tool_call(ref, "m.r0", "t", "d")
        await s.finish_tool_call(ref, b"sealed", "k", False)
        assert (await s.get_tool_call(ref)).call_key == ref.key  # type: ignore[union-attr]
    for f in db_path.parent.iterdir():
        assert b"CANARY" not in f.read_bytes(), f


async def test_migration_from_v2_keys_claims_by_account_and_the_journal_by_conversation(tmp_path: Path) -> None:
    """A v2 database (claims by reply key, journal by raw call id) opens as v3 with its
    rows kept: a journaled call is found again in its claim's conversation only, and no
    call id stays in the clear."""
    import gelbridge._state._sqlite as state_mod

    p = tmp_path / DB_FILENAME
    raw = sqlite3.connect(p, isolation_level=None)
    for step in state_mod._MIGRATIONS[:2]:
        assert isinstance(step, str)
        for statement in step.split(";"):
            if statement.strip():
                raw.execute(statement)
    raw.execute("PRAGMA user_version = 2")
    raw.execute("INSERT INTO claims VALUES ('m1.r0', 'did:a', 'm1', 0, 'conv', 'complete', NULL, 1, 2)")
    raw.execute("INSERT INTO tool_calls VALUES ('call-OLDID', 'did:a', 'm1.r0', 't', 'dg', 'finished', "
                "X'0102', 'k', 0, 1, 2)")
    raw.close()
    with SqliteStore(p) as s:
        assert await s.schema_version() == SCHEMA_VERSION
        assert (await s.get_claim("did:a", "m1.r0")).status == "complete"  # type: ignore[union-attr]
        kept = await s.get_tool_call(CallRef("did:a", "conv", "call-OLDID"))
        assert kept is not None and kept.sealed_result == b"\x01\x02"
        assert await s.get_tool_call(CallRef("did:a", "other", "call-OLDID")) is None
        await s.record_claim("did:b", "m1", 0, "m1.r0", "conv")  # now a key per account
    raw = sqlite3.connect(p)
    assert raw.execute("SELECT COUNT(*) FROM tool_calls WHERE call_key LIKE '%OLDID%'").fetchone()[0] == 0
    raw.close()


async def test_migration_from_an_empty_file(tmp_path: Path) -> None:
    p = tmp_path / DB_FILENAME
    p.write_bytes(b"")
    with SqliteStore(p) as s:
        assert await s.schema_version() == SCHEMA_VERSION
        await s.set_cursor("x", 1)
    raw = sqlite3.connect(p)
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"cursors", "sessions", "claims", "tool_calls", "errors", "turns", "seen_events"} <= tables
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_database_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    p = tmp_path / DB_FILENAME
    raw = sqlite3.connect(p)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StateError, match="upgrade gelbridge"):
        SqliteStore(p)


def test_garbage_file_gives_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / DB_FILENAME
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateError, match="move it away"):
        SqliteStore(p)


async def test_files_are_owner_only(db_path: Path) -> None:
    with SqliteStore(db_path) as s:
        await s.save_session("did:a", {"accessJwt": "secret-token"})
        for p in [db_path, db_path.with_name(DB_FILENAME + "-wal")]:
            assert p.exists()
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE(db_path.parent.stat().st_mode) & 0o077 == 0


def test_loose_permissions_on_an_existing_file_are_tightened(tmp_path: Path) -> None:
    p = tmp_path / DB_FILENAME
    SqliteStore(p).close()
    os.chmod(p, 0o644)
    SqliteStore(p).close()
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


async def test_open_state_uses_the_configured_dir(tmp_path: Path) -> None:
    from gelbridge._config import load_config

    settings = load_config(env={"GELBRIDGE_STATE_DIR": str(tmp_path / "st")})
    async with await open_state(settings) as s:
        assert s.path == tmp_path / "st" / DB_FILENAME


