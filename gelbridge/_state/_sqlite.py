"""The embedded backend: one SQLite file ``gelbridge.db`` under ``[state] dir``.

Durability: WAL mode with ``synchronous=FULL``, so every committed transaction is on
disk when the call returns. Several processes (``gelbridge status`` next to
``gelbridge run``) may open the same file: WAL lets readers run beside the writer and
``busy_timeout`` absorbs short write locks; a fleet of workers shares a Postgres
database instead (``PostgresStore``).

The PDS session holds access/refresh tokens (credentials): the database file, its
``-wal``/``-shm`` companions (SQLite copies the database's mode to them) and the state
directory are created owner-only (0600 / 0700), and opening an existing file that is
readable by others tightens it to 0600.

Asyncio: the methods are coroutines (the store's interface, shared with Postgres), each
one short transaction under the store's lock; SQLite itself is called directly (a
commit is well under a millisecond without fsync, a few with it).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gelbridge._errors import StateError
from gelbridge._state._rows import call_key
from gelbridge._state._store import Db, Result, StateStore, lines

DB_FILENAME = "gelbridge.db"

# --- schema ------------------------------------------------------------------------------

_CLAIMS_V3 = """
    CREATE TABLE claims_v3 (
        account TEXT NOT NULL,
        reply_rkey TEXT NOT NULL,
        message_rkey TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        conversation TEXT NOT NULL,
        status TEXT NOT NULL,
        error_kind TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        calls TEXT,
        waiting_at REAL,
        PRIMARY KEY (account, reply_rkey)
    )"""
_TOOL_CALLS_V3 = """
    CREATE TABLE tool_calls_v3 (
        account TEXT NOT NULL,
        conversation TEXT NOT NULL,
        call_key TEXT NOT NULL,
        reply_rkey TEXT NOT NULL,
        tool TEXT NOT NULL,
        input_digest TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('started', 'finished')),
        sealed_result BLOB,
        key_id TEXT,
        is_error INTEGER,
        started_at REAL NOT NULL,
        finished_at REAL,
        PRIMARY KEY (account, conversation, call_key)
    )"""


def _v3_isolation(db: sqlite3.Connection) -> None:
    """Claims keyed by (account, reply key), with the tool calls this worker wrote into
    the reply (digests) and when it asked for approval; the
    journal keyed by (account, conversation, digest of the call id). A journal row's
    conversation is its claim's; a row without a claim keeps an empty conversation
    (no later call matches it: its id is never trusted across conversations again)."""
    db.execute(_CLAIMS_V3)
    db.execute(
        "INSERT INTO claims_v3 (account, reply_rkey, message_rkey, attempt, conversation, status, error_kind, "
        "created_at, updated_at) SELECT account, reply_rkey, message_rkey, attempt, conversation, status, "
        "error_kind, created_at, updated_at FROM claims"
    )
    db.execute(_TOOL_CALLS_V3)
    rows = db.execute(
        "SELECT t.call_id, t.account, COALESCE(c.conversation, ''), t.reply_rkey, t.tool, t.input_digest, "
        "t.state, t.sealed_result, t.key_id, t.is_error, t.started_at, t.finished_at FROM tool_calls t "
        "LEFT JOIN claims c ON c.reply_rkey = t.reply_rkey AND c.account = t.account"
    ).fetchall()
    db.executemany(
        "INSERT OR IGNORE INTO tool_calls_v3 (account, conversation, call_key, reply_rkey, tool, input_digest, "
        "state, sealed_result, key_id, is_error, started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(r[1], r[2], call_key(r[0]), *r[3:]) for r in rows],
    )
    for statement in (
        "DROP TABLE claims", "ALTER TABLE claims_v3 RENAME TO claims",
        "CREATE INDEX claims_unfinished ON claims (account, status)",
        "DROP TABLE tool_calls", "ALTER TABLE tool_calls_v3 RENAME TO tool_calls",
        "CREATE INDEX tool_calls_state ON tool_calls (account, state)",
    ):
        db.execute(statement)


_MIGRATIONS: list[str | Callable[[sqlite3.Connection], None]] = [
    # v1
    """
    CREATE TABLE cursors (
        source TEXT PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('int', 'str')),
        value TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE sessions (
        account TEXT PRIMARY KEY,
        data TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE claims (
        reply_rkey TEXT PRIMARY KEY,
        account TEXT NOT NULL,
        message_rkey TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        conversation TEXT NOT NULL,
        status TEXT NOT NULL,
        error_kind TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX claims_unfinished ON claims (account, status);
    CREATE TABLE tool_calls (
        call_id TEXT PRIMARY KEY,
        account TEXT NOT NULL,
        reply_rkey TEXT NOT NULL,
        tool TEXT NOT NULL,
        input_digest TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('started', 'finished')),
        sealed_result BLOB,
        key_id TEXT,
        is_error INTEGER,
        started_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX tool_calls_state ON tool_calls (account, state);
    CREATE TABLE errors (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        account TEXT,
        record_key TEXT,
        "where" TEXT
    );
    CREATE TABLE turns (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        account TEXT NOT NULL,
        reply_rkey TEXT NOT NULL,
        status TEXT NOT NULL,
        queue_ms REAL NOT NULL,
        bridge_ms REAL NOT NULL,
        model_ms REAL NOT NULL,
        write_ms REAL NOT NULL
    );
    CREATE TABLE seen_events (
        did TEXT NOT NULL,
        rkey TEXT NOT NULL,
        cid TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (did, rkey, cid)
    );
    CREATE INDEX seen_events_at ON seen_events (at);
    """,
    # v2: turn timings split PDS reads (read_ms) out of bridge_ms; older rows keep NULL
    """
    ALTER TABLE turns ADD COLUMN read_ms REAL
    """,
    # v3: isolation (see the module docstring); a Python step, it hashes the call ids
    _v3_isolation,
    # v4: the write points of each turn, and the PDS write budget as last seen per account
    """
    ALTER TABLE turns ADD COLUMN points INTEGER;
    CREATE TABLE write_budgets (
        account TEXT PRIMARY KEY,
        "limit" INTEGER,
        remaining INTEGER,
        reset_at REAL,
        seen_at REAL NOT NULL
    );
    CREATE INDEX turns_account_at ON turns (account, at);
    """,
    # v5: prompt caching: input tokens per turn, and the share the provider's cache served
    """
    ALTER TABLE turns ADD COLUMN input_tokens INTEGER;
    ALTER TABLE turns ADD COLUMN cached_tokens INTEGER;
    ALTER TABLE turns ADD COLUMN cache_write_tokens INTEGER;
    """,
    # v6: key grants (PROTOCOL.md §6): how many of an account's grants the worker honours
    # and ignores, for `gelbridge status` (counts only: never a key, keyId or reason text)
    """
    CREATE TABLE key_grants (
        account TEXT PRIMARY KEY,
        honoured INTEGER NOT NULL,
        ignored INTEGER NOT NULL,
        at REAL NOT NULL
    );
    """,
]

SCHEMA_VERSION = len(_MIGRATIONS)

def _secure_file(path: Path) -> None:
    """Create ``path`` owner-only if missing, and tighten it if others can read it."""
    if not path.exists():
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, 0o600)


class _SqliteDb:
    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    async def execute(self, sql: str, args: Sequence[Any] = (), /) -> Result:
        cur = self.conn.execute(sql, args)
        return Result(cur.fetchall(), cur.rowcount)


class SqliteStore(StateStore):
    """The state in one SQLite file (the embedded default)."""

    backend = "sqlite"

    def __init__(self, path: str | Path, *, clock: Callable[[], float] | None = None) -> None:
        super().__init__(**({"clock": clock} if clock is not None else {}))
        self.path = Path(path)
        self.location = str(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _secure_file(self.path)
            for suffix in ("-wal", "-shm"):
                companion = self.path.with_name(self.path.name + suffix)
                if companion.exists():
                    _secure_file(companion)
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
        except (OSError, sqlite3.Error) as e:
            raise StateError(f"cannot open state database {self.path}: {e}; check [state] dir") from None
        try:
            self._db.execute("PRAGMA busy_timeout = 10000")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise StateError(
                f"state database {self.path} is unreadable ({e}); move it away to start fresh"
            ) from None
        except StateError:
            self._db.close()
            raise

    @classmethod
    def open_dir(cls, state_dir: str | Path, **kw: Any) -> SqliteStore:
        """Open (creating if needed) ``<state_dir>/gelbridge.db``."""
        return cls(Path(state_dir).expanduser() / DB_FILENAME, **kw)  # it makes the folder (or says why not)

    async def aclose(self) -> None:
        async with self._lock:
            self._db.close()

    def close(self) -> None:
        """Close from synchronous code (no transaction may be running)."""
        self._db.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SqliteStore:
        return self

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Db]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front."""
        async with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteDb(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    async def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _migrate(self) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"state database {self.path} has schema v{version}, this gelbridge knows "
                    f"v{SCHEMA_VERSION}: upgrade gelbridge or use another [state] dir"
                )
            for i in range(version, SCHEMA_VERSION):
                step = _MIGRATIONS[i]
                if callable(step):
                    step(db)
                else:
                    for statement in lines(step):
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {i + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    async def schema_version(self) -> int:
        return int((await self._read("PRAGMA user_version"))[0][0])
