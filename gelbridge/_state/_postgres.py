"""The shared backend: a PostgreSQL database (``[state] url``), for a fleet of workers.

The same tables and rules as the SQLite file (``StateStore`` holds the rules), so any
number of ``gelbridge run`` processes on any number of machines share one set of
claims, one tool journal, one cursor per source and one session per account; the
fleet's leases live here too (``gelbridge._fleet``).

Connections: up to ``connections`` psycopg 3 ``AsyncConnection`` objects per store (``[state]
connections``, 4), opened as needed, in autocommit mode, each write in an explicit
transaction on one of them; statements that repeat are prepared server-side after a few
uses. Waiting for the database never blocks
the event loop: other turns stream on while a statement is out. Every call is bounded:
``connect_timeout`` and ``statement_timeout`` (seconds, from the store's ``timeout``),
TCP keepalives, and an asyncio deadline around the whole call, so an unreachable server
costs at most that and raises :class:`~gelbridge._errors.StateError`; the next call
reconnects. Open a store with ``await PostgresStore(url).open()``.

Credentials: the sessions table holds PDS tokens, so the database is the operator's to
protect (its role should be the fleet's alone); ``location`` never shows a password.
Migrations: versioned in the table ``gelbridge_schema``, applied under an advisory lock
so workers starting together migrate once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from gelbridge._errors import StateError
from gelbridge._state._store import Db, Result, StateStore, lines

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
    # v3: key grants (PROTOCOL.md §6): counts per account for `gelbridge status` (no keys)
    """
    CREATE TABLE key_grants (
        account TEXT PRIMARY KEY,
        honoured INTEGER NOT NULL,
        ignored INTEGER NOT NULL,
        at DOUBLE PRECISION NOT NULL
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

    async def execute(self, sql: str, args: Sequence[Any] = (), /) -> Result:
        self.store.round_trips += 1
        cur = await self.conn.execute(_pg(sql), args)
        rows = await cur.fetchall() if cur.description is not None else []
        return Result(rows, cur.rowcount)


async def _abandon(conn: Any) -> None:
    """A connection that did not answer in time: closed, never reused (a statement may be
    in flight on it)."""
    try:
        await conn.close()
    except Exception:  # noqa: BLE001 - it is being thrown away
        pass


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


def import_psycopg(needed_by: str = "[state] url") -> Any:
    """The ``psycopg`` module, or :class:`StateError` saying which extra to install."""
    try:
        import psycopg
    except ImportError:
        raise StateError(f"{needed_by} needs psycopg: pip install 'gelbridge[postgres]'") from None
    return psycopg


class PostgresStore(StateStore):
    """The state in a PostgreSQL database, shared by every worker given its URL."""

    backend = "postgres"
    _for_update = " FOR UPDATE"

    def __init__(self, url: str, *, timeout: float = 5.0, connections: int = 4,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(**({"clock": clock} if clock is not None else {}))
        self._psycopg = import_psycopg()
        self.url = url
        self.location = redacted(url)
        self.timeout = timeout
        # the idle connections (None: a slot not connected yet, or whose connection broke)
        self._slots: asyncio.Queue[Any] = asyncio.Queue()
        for _ in range(max(1, connections)):
            self._slots.put_nowait(None)
        self._open: set[Any] = set()
        #: statements sent, BEGIN and COMMIT included (what docs/scale.md counts per turn)
        self.round_trips = 0

    async def open(self) -> PostgresStore:
        """Connect and migrate (once per fleet, under an advisory lock); returns the store."""
        await self._migrate()
        return self

    # --- connections ---------------------------------------------------------------------

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        """An idle connection (connecting a free slot); back to the idle ones after use,
        unless it broke or did not answer in time."""
        conn = await self._slots.get()
        keep = True
        try:
            if conn is None or conn.closed or conn.broken:
                conn = None
                conn = await self._connect()
            yield conn
        except BaseException as e:  # a cancelled statement may leave the connection mid-query
            keep = (not isinstance(e, asyncio.CancelledError) and conn is not None and not conn.closed
                    and not conn.broken)
            raise
        finally:
            if conn is not None and not keep:
                self._open.discard(conn)
                try:
                    await conn.close()
                except Exception:  # noqa: BLE001 - it is being thrown away
                    pass
                conn = None
            self._slots.put_nowait(conn)

    async def _connect(self) -> Any:
        ms = int(self.timeout * 1000)
        try:
            async with asyncio.timeout(self.timeout + 1):
                conn = await self._psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=max(1, int(self.timeout)),
                    application_name="gelbridge", keepalives=1, keepalives_idle=5, keepalives_interval=2,
                    keepalives_count=2, tcp_user_timeout=ms,
                    options=f"-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms * 6}",
                )
        except TimeoutError:
            raise StateError(f"state database {self.location} unreachable (no answer within {self.timeout:g} s); "
                             "check [state] url and that PostgreSQL is up") from None
        except self._psycopg.Error as e:
            raise self._error(e) from None
        self._open.add(conn)
        return conn

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

    async def aclose(self) -> None:
        conns, self._open = list(self._open), set()
        for conn in conns:
            try:
                await conn.close()
            except self._psycopg.Error:
                pass

    async def __aenter__(self) -> PostgresStore:
        if not self._open:
            await self.open()
        return self

    def _too_slow(self) -> StateError:
        return StateError(f"state database {self.location}: no answer within {self.timeout * 2:g} s "
                          "([state] timeout); check that PostgreSQL is up and reachable")

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Db]:
        async with self._connection() as conn:
            self.round_trips += 2  # BEGIN, COMMIT
            try:
                async with asyncio.timeout(self.timeout * 2), conn.transaction():
                    yield _PgDb(conn, self)
            except self._psycopg.Error as e:
                raise self._error(e) from None
            except TimeoutError:
                await _abandon(conn)
                raise self._too_slow() from None

    async def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self._connection() as conn:
            self.round_trips += 1
            try:
                async with asyncio.timeout(self.timeout * 2):
                    cur = await conn.execute(_pg(sql), args)
                    rows: list[tuple[Any, ...]] = await cur.fetchall()
            except self._psycopg.Error as e:
                raise self._error(e) from None
            except TimeoutError:
                await _abandon(conn)
                raise self._too_slow() from None
            return rows

    def transaction(self) -> Any:
        """A write transaction for the fleet's own statements (leases), with the store's
        placeholders, bounds and errors: ``async with store.transaction() as db``."""
        return self._tx()

    async def _migrate(self) -> None:
        async with self._tx() as db:
            await db.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            await db.execute("CREATE TABLE IF NOT EXISTS gelbridge_schema (version INTEGER NOT NULL)")
            row = (await db.execute("SELECT version FROM gelbridge_schema")).first()
            version = int(row[0]) if row else 0
            if row is None:
                await db.execute("INSERT INTO gelbridge_schema (version) VALUES (0)")
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"state database {self.location} has schema v{version}, this gelbridge knows "
                    f"v{SCHEMA_VERSION}: upgrade gelbridge (every worker of the fleet) first"
                )
            for i in range(version, SCHEMA_VERSION):
                for statement in lines(_MIGRATIONS[i]):
                    await db.execute(statement)
                await db.execute("UPDATE gelbridge_schema SET version = ?", (i + 1,))

    async def schema_version(self) -> int:
        return int((await self._read("SELECT version FROM gelbridge_schema"))[0][0])


def probe(url: str, timeout: float = 5.0) -> int:
    """Connect once, change nothing: the schema version the database holds (0: none yet).
    Raises :class:`StateError` with what to fix (unreachable, refused, or newer schema)."""
    psycopg = import_psycopg()
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
