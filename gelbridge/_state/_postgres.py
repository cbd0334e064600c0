"""The shared backend: a PostgreSQL database (``[state] url``), for a fleet of workers.

The same tables and rules as the SQLite file (``StateStore`` holds the rules), so any
number of ``gelbridge run`` processes on any number of machines share one set of
claims, one tool journal, one cursor per source and one session per account; the
fleet's leases live here too (``gelbridge._fleet``).

Connection: one psycopg 3 connection per store, in autocommit mode, each write in an
explicit transaction; statements that repeat are prepared server-side after a few uses.
Every call is bounded: ``connect_timeout`` and ``statement_timeout`` (seconds, from the
store's ``timeout``), and TCP keepalives, so an unreachable server costs at most a few
seconds and raises :class:`~gelbridge._errors.StateError`; the next call reconnects.
Like the SQLite backend, calls are short and synchronous (a loopback round trip is
~0.1 ms): call them from the event loop.

Credentials: the sessions table holds PDS tokens, so the database is the operator's to
protect (its role should be the fleet's alone); ``location`` never shows a password.
Migrations: versioned in the table ``gelbridge_schema``, applied under an advisory lock
so workers starting together migrate once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gelbridge._errors import StateError
from gelbridge._state._store import Cursor, Db, StateStore, lines

#: the migrations of the Postgres schema; v1 is the SQLite file's v5 (the same tables)
_MIGRATIONS: list[str] = [
    # v1
    """
    CREATE TABLE cursors (
        source TEXT PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('int', 'str')),
        value TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE sessions (
        account TEXT PRIMARY KEY,
        data TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE claims (
        account TEXT NOT NULL,
        reply_rkey TEXT NOT NULL,
        message_rkey TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        conversation TEXT NOT NULL,
        status TEXT NOT NULL,
        error_kind TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        calls TEXT,
        waiting_at DOUBLE PRECISION,
        PRIMARY KEY (account, reply_rkey)
    );
    CREATE INDEX claims_unfinished ON claims (account, status);
    CREATE TABLE tool_calls (
        account TEXT NOT NULL,
        conversation TEXT NOT NULL,
        call_key TEXT NOT NULL,
        reply_rkey TEXT NOT NULL,
        tool TEXT NOT NULL,
        input_digest TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('started', 'finished')),
        sealed_result BYTEA,
        key_id TEXT,
        is_error INTEGER,
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        PRIMARY KEY (account, conversation, call_key)
    );
    CREATE INDEX tool_calls_state ON tool_calls (account, state);
    CREATE TABLE errors (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        account TEXT,
        record_key TEXT,
        "where" TEXT
    );
    CREATE TABLE turns (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at DOUBLE PRECISION NOT NULL,
        account TEXT NOT NULL,
        reply_rkey TEXT NOT NULL,
        status TEXT NOT NULL,
        queue_ms DOUBLE PRECISION NOT NULL,
        bridge_ms DOUBLE PRECISION NOT NULL,
        model_ms DOUBLE PRECISION NOT NULL,
        write_ms DOUBLE PRECISION NOT NULL,
        read_ms DOUBLE PRECISION,
        points INTEGER,
        input_tokens INTEGER,
        cached_tokens INTEGER,
        cache_write_tokens INTEGER
    );
    CREATE INDEX turns_account_at ON turns (account, at);
    CREATE TABLE seen_events (
        did TEXT NOT NULL,
        rkey TEXT NOT NULL,
        cid TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (did, rkey, cid)
    );
    CREATE INDEX seen_events_at ON seen_events (at);
    CREATE TABLE write_budgets (
        account TEXT PRIMARY KEY,
        "limit" INTEGER,
        remaining INTEGER,
        reset_at DOUBLE PRECISION,
        seen_at DOUBLE PRECISION NOT NULL
    )
    """,
    # v2: the fleet's leases, one row per account (gelbridge._fleet)
    """
    CREATE TABLE leases (
        account TEXT PRIMARY KEY,
        owner TEXT,
        epoch BIGINT NOT NULL DEFAULT 0,
        expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch'
    );
    CREATE TABLE fleet_members (
        member TEXT PRIMARY KEY,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        expires_at TIMESTAMPTZ NOT NULL
    )
    """,
]

SCHEMA_VERSION = len(_MIGRATIONS)
_MIGRATION_LOCK = 0x67656C62  # "gelb": the advisory lock id the migrations take


@functools.lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """The shared ``?`` placeholders as psycopg's ``%s`` (no ``%`` or ``?`` is ever literal here)."""
    return sql.replace("?", "%s")


class _PgDb:
    """A psycopg connection seen through the shared SQL's placeholders."""

    __slots__ = ("conn", "store")

    def __init__(self, conn: Any, store: PostgresStore) -> None:
        self.conn = conn
        self.store = store

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Cursor:
        self.store.round_trips += 1
        cur: Cursor = self.conn.execute(_pg(sql), args)
        return cur


def redacted(url: str) -> str:
    """``url`` without its password (for logs, start-up lines and status)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - an unparsable URL: say nothing of it
        return "postgresql://?"
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{info.get('host') or 'localhost'}{port}/{info.get('dbname') or ''}"


def _import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StateError("[state] url needs psycopg: pip install 'gelbridge[postgres]'") from None
    return psycopg


class PostgresStore(StateStore):
    """The state in a PostgreSQL database, shared by every worker given its URL."""

    backend = "postgres"
    _for_update = " FOR UPDATE"

    def __init__(self, url: str, *, timeout: float = 5.0, clock: Callable[[], float] | None = None) -> None:
        super().__init__(**({"clock": clock} if clock is not None else {}))
        self._psycopg = _import_psycopg()
        self.url = url
        self.location = redacted(url)
        self.timeout = timeout
        self._conn: Any = None
        #: statements sent, BEGIN and COMMIT included (what docs/scale.md counts per turn)
        self.round_trips = 0
        with self._lock:
            self._connect()
            self._migrate()

    # --- connection ----------------------------------------------------------------------

    def _connect(self) -> Any:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        ms = int(self.timeout * 1000)
        try:
            self._conn = self._psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self.timeout)),
                application_name="gelbridge", keepalives=1, keepalives_idle=5, keepalives_interval=2,
                keepalives_count=2, tcp_user_timeout=ms,
                options=f"-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms * 6}",
            )
        except self._psycopg.Error as e:
            raise self._error(e) from None
        return self._conn

    def _error(self, e: BaseException) -> StateError:
        """One clear line; never a statement's parameters (the server's DETAIL may hold them)."""
        if isinstance(e, self._psycopg.errors.QueryCanceled):
            return StateError(f"state database {self.location}: a statement took over {self.timeout:g} s "
                              "([state] timeout); the server is overloaded or a lock is held")
        if isinstance(e, self._psycopg.OperationalError):
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return StateError(f"state database {self.location} unreachable ({first[:200]}); "
                              "check [state] url and that PostgreSQL is up")
        code = getattr(e, "sqlstate", None) or "no sqlstate"
        return StateError(f"state database {self.location} refused a statement ({type(e).__name__}, {code})")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> PostgresStore:
        return self

    @contextmanager
    def _tx(self) -> Iterator[Db]:
        with self._lock:
            conn = self._connect()
            self.round_trips += 2  # BEGIN, COMMIT
            try:
                with conn.transaction():
                    yield _PgDb(conn, self)
            except self._psycopg.Error as e:
                if conn.broken:
                    self._conn = None
                raise self._error(e) from None

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            conn = self._connect()
            self.round_trips += 1
            try:
                rows: list[tuple[Any, ...]] = conn.execute(_pg(sql), args).fetchall()
            except self._psycopg.Error as e:
                if conn.broken:
                    self._conn = None
                raise self._error(e) from None
            return rows

    @contextmanager
    def transaction(self) -> Iterator[Db]:
        """A write transaction for the fleet's own statements (leases), with the store's
        placeholders, bounds and errors."""
        with self._tx() as db:
            yield db

    def _migrate(self) -> None:
        with self._tx() as db:
            db.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            db.execute("CREATE TABLE IF NOT EXISTS gelbridge_schema (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM gelbridge_schema").fetchone()
            version = int(row[0]) if row else 0
            if row is None:
                db.execute("INSERT INTO gelbridge_schema (version) VALUES (0)")
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"state database {self.location} has schema v{version}, this gelbridge knows "
                    f"v{SCHEMA_VERSION}: upgrade gelbridge (every worker of the fleet) first"
                )
            for i in range(version, SCHEMA_VERSION):
                for statement in lines(_MIGRATIONS[i]):
                    db.execute(statement)
                db.execute("UPDATE gelbridge_schema SET version = ?", (i + 1,))

    @property
    def schema_version(self) -> int:
        return int(self._read("SELECT version FROM gelbridge_schema")[0][0])


def probe(url: str, timeout: float = 5.0) -> int:
    """Connect once, change nothing: the schema version the database holds (0: none yet).
    Raises :class:`StateError` with what to fix (unreachable, refused, or newer schema)."""
    psycopg = _import_psycopg()
    where = redacted(url)
    try:
        with psycopg.connect(url, connect_timeout=max(1, int(timeout)), application_name="gelbridge-check") as conn:
            exists = conn.execute("SELECT to_regclass('gelbridge_schema') IS NOT NULL").fetchone()[0]
            version = int(conn.execute("SELECT version FROM gelbridge_schema").fetchone()[0]) if exists else 0
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StateError(f"state database {where} unreachable ({first[:200]}); check [state] url and that "
                         "PostgreSQL is up") from None
    if version > SCHEMA_VERSION:
        raise StateError(f"state database {where} has schema v{version}, this gelbridge knows v{SCHEMA_VERSION}: "
                         "upgrade gelbridge (every worker of the fleet) first")
    return version
