"""The worker's durable state: one SQLite file ``gelbridge.db`` under ``[state] dir``.

What lives here: firehose/poll cursors, the PDS session, the replies this worker has
claimed, the tool-call journal, a ring of recent errors and recent turn timings, and a
set of already-processed events. What never lives here: plaintext content and key
bytes. Tool results are user content, so the journal stores them *sealed*: the caller
encrypts the result (e.g. with the conversation key) and passes the opaque bytes plus
the ``keyId``; this module only stores and returns those bytes.

Isolation: a claim is identified by ``(account, reply key)`` and a journaled tool call
by ``(account, conversation, call id)`` (:class:`CallRef`): call ids are unique only
within one conversation (providers that give none, or repeat them, make the same id in
many conversations), so the same id in another conversation or account is another call.
Call ids are chosen by the provider and live in sealed parts, so the journal stores only
a digest of them (``call_key``), never the id itself.

Durability: WAL mode with ``synchronous=FULL``, so every committed transaction is on
disk when the call returns. The worker saves a cursor only after the event's effects
(claim, journal entry, reply write) are committed, so a crash replays at most a few
events, and the claim/journal tables make replays harmless.

The PDS session holds access/refresh tokens (credentials): the database file, its
``-wal``/``-shm`` companions (SQLite copies the database's mode to them) and the state
directory are created owner-only (0600 / 0700), and opening an existing file that is
readable by others tightens it to 0600.

Asyncio: every method is one short synchronous transaction (well under a millisecond
without fsync, a few milliseconds with it) guarded by a lock, and the connection is
opened with ``check_same_thread=False``. Call methods directly from the event loop; if
the disk is slow, wrap a call in ``asyncio.to_thread`` - both are safe. Several
processes (``gelbridge status`` next to ``gelbridge run``) may open the same file: WAL
lets readers run beside the writer and ``busy_timeout`` absorbs short write locks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from gelbridge._errors import StateError, ToolJournalConflict
from gelbridge._records.constants import FINAL_STATUSES, ReplyStatus

DB_FILENAME = "gelbridge.db"

#: A claim's status is the status its reply has (or will have once written).
ClaimStatus = ReplyStatus


def claim_status(status: str) -> ReplyStatus:
    """``status`` (a record's or a row's) as a claim status; ValueError for anything else."""
    try:
        return ReplyStatus(status)
    except ValueError:
        raise ValueError(f"unknown claim status {status!r}") from None


#: How many rows the errors ring / turn timings / seen-events set keep.
ERRORS_KEPT = 200
TURNS_KEPT = 50_000  # a day of turns at the reference PDS's daily write budget, for several accounts
SEEN_KEPT = 20000

_IDENT_MAX = 64  # error kinds and similar labels: short identifiers, never free text


# --- rows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A reply record key this worker claimed (create-only write) and must finish."""

    reply_rkey: str
    account: str
    message_rkey: str
    attempt: int
    conversation: str
    status: ReplyStatus
    error_kind: str | None
    created_at: float
    updated_at: float
    calls: frozenset[str] = frozenset()  # digests of the tool calls this worker wrote into the reply
    waiting_at: float | None = None  # this worker's clock when it asked for approval (add_calls)


@dataclass(frozen=True)
class CallRef:
    """Which tool call: the account, the conversation (rkey) and the call id in it."""

    account: str
    conversation: str
    call_id: str

    @property
    def key(self) -> str:
        """The journal's key for the call id (a digest: the id itself is sealed content)."""
        return call_key(self.call_id)


def call_key(call_id: str) -> str:
    return hashlib.sha256(b"gelbridge-call-id\n" + call_id.encode("utf-8", "surrogatepass")).hexdigest()


class CallState(StrEnum):
    """Where a journalled tool call is: begun (the tool may be running, or a crash cut
    it off) or finished (its sealed result is stored)."""

    STARTED = "started"
    FINISHED = "finished"


@dataclass(frozen=True)
class JournalEntry:
    """One tool call in the at-most-once journal.

    ``state`` is ``"started"`` from ``begin_tool_call`` until ``finish_tool_call``
    stores the sealed result, then ``"finished"``. ``new`` is True only on the
    ``begin_tool_call`` that created the entry: that caller (and only it) runs the tool.
    An entry returned with ``new=False`` and ``state="started"`` was begun earlier and
    never finished - the process crashed while the tool ran. The caller must not run it
    again; it reports an ``interrupted`` error result instead (and should finish the
    entry with that sealed result so later readers agree).
    """

    account: str
    conversation: str
    call_key: str
    reply_rkey: str
    tool: str
    input_digest: str
    state: CallState
    sealed_result: bytes | None
    key_id: str | None
    is_error: bool | None
    started_at: float
    finished_at: float | None
    new: bool = False

    @property
    def finished(self) -> bool:
        return self.state is CallState.FINISHED

    @property
    def interrupted(self) -> bool:
        """Begun by an earlier run and never finished."""
        return self.state is CallState.STARTED and not self.new


@dataclass(frozen=True)
class ErrorRow:
    at: float
    kind: str
    account: str | None
    record_key: str | None
    where: str | None


@dataclass(frozen=True)
class TurnTiming:
    """Milliseconds spent in each stage of one turn (for ``gelbridge status``)."""

    reply_rkey: str
    account: str
    status: str
    queue_ms: float
    bridge_ms: float
    model_ms: float
    write_ms: float
    at: float = 0.0  # set by record_turn when 0
    read_ms: float | None = None  # PDS reads inside the turn; None for turns recorded before schema v2
    points: int | None = None  # PDS write points of the reply's writes (claim, progress, final); None before v4
    #: the model's input tokens over the turn's steps, and how many of them the provider's
    #: prompt cache served and took in (None before v5, or when the provider did not say)
    input_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None

    @property
    def total_ms(self) -> float:
        return self.queue_ms + (self.read_ms or 0.0) + self.bridge_ms + self.model_ms + self.write_ms


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
]

SCHEMA_VERSION = len(_MIGRATIONS)


def _check_label(value: str | None, what: str) -> None:
    """Reject anything that looks like free text where only a short identifier belongs."""
    if value is None:
        return
    if not value or len(value) > _IDENT_MAX or not all(c.isalnum() or c in "_-.:" for c in value):
        raise ValueError(f"{what} must be a short identifier (letters, digits, _-.:), got {len(value)} chars")


def _secure_file(path: Path) -> None:
    """Create ``path`` owner-only if missing, and tighten it if others can read it."""
    if not path.exists():
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, 0o600)


class StateStore:
    """Typed access to the state database. See the module docstring for the rules."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
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
    def open_dir(cls, state_dir: str | Path, **kw: Any) -> StateStore:
        """Open (creating if needed) ``<state_dir>/gelbridge.db``."""
        d = Path(state_dir).expanduser()
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return cls(d / DB_FILENAME, **kw)

    # --- plumbing ---------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _migrate(self) -> None:
        with self._tx() as db:
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
                    for statement in step.split(";"):
                        if statement.strip():
                            db.execute(statement)
                db.execute(f"PRAGMA user_version = {i + 1}")

    @property
    def schema_version(self) -> int:
        return int(self._read("PRAGMA user_version")[0][0])

    # --- cursors -----------------------------------------------------------------------

    def get_cursor(self, source_key: str) -> int | str | None:
        rows = self._read("SELECT kind, value FROM cursors WHERE source = ?", (source_key,))
        if not rows:
            return None
        kind, value = rows[0]
        return int(value) if kind == "int" else str(value)

    def set_cursor(self, source_key: str, value: int | str) -> None:
        """Save a cursor. Call only after the event's effects are committed."""
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TypeError("cursor must be an int or a str")
        kind = "int" if isinstance(value, int) else "str"
        with self._tx() as db:
            db.execute(
                "INSERT INTO cursors (source, kind, value, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (source) DO UPDATE SET kind = excluded.kind, value = excluded.value, "
                "updated_at = excluded.updated_at",
                (source_key, kind, str(value), self._clock()),
            )

    # --- sessions ----------------------------------------------------------------------

    def load_session(self, account: str) -> dict[str, Any] | None:
        """The saved PDS session (JSON object) for a DID or login identifier."""
        rows = self._read("SELECT data FROM sessions WHERE account = ?", (account,))
        return json.loads(rows[0][0]) if rows else None

    def save_session(self, account: str, session: dict[str, Any]) -> None:
        """Store a session (tokens are credentials: the file is 0600)."""
        data = json.dumps(session, separators=(",", ":"), sort_keys=True)
        with self._tx() as db:
            db.execute(
                "INSERT INTO sessions (account, data, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (account) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at",
                (account, data, self._clock()),
            )

    def delete_session(self, account: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM sessions WHERE account = ?", (account,))

    # --- claims ------------------------------------------------------------------------

    _CLAIM_COLS = (
        "reply_rkey, account, message_rkey, attempt, conversation, status, error_kind, created_at, updated_at, "
        "calls, waiting_at"
    )

    @staticmethod
    def _claim(row: tuple[Any, ...]) -> Claim:
        reply_rkey, account, message_rkey, attempt, conversation, status, error_kind, created, updated, calls, \
            waiting_at = row
        return Claim(reply_rkey, account, message_rkey, attempt, conversation, claim_status(status), error_kind,
                     created, updated,
                     frozenset(json.loads(calls)) if calls else frozenset(), waiting_at)

    def record_claim(
        self,
        account: str,
        message_rkey: str,
        attempt: int,
        reply_rkey: str,
        conversation: str,
        status: ReplyStatus = ReplyStatus.PENDING,
    ) -> Claim:
        """Remember that this worker claimed ``reply_rkey`` of ``account``. Idempotent: a
        second call for the same key returns the existing claim unchanged.
        ``created_at`` is when this worker first saw the request (its own clock)."""
        status = claim_status(status)
        now = self._clock()
        with self._tx() as db:
            db.execute(
                f"INSERT INTO claims ({self._CLAIM_COLS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, NULL, NULL) "
                "ON CONFLICT (account, reply_rkey) DO NOTHING",
                (reply_rkey, account, message_rkey, attempt, conversation, status, now, now),
            )
            row = db.execute(
                f"SELECT {self._CLAIM_COLS} FROM claims WHERE account = ? AND reply_rkey = ?", (account, reply_rkey)
            ).fetchone()
        return self._claim(row)

    def update_claim_status(
        self, account: str, reply_rkey: str, status: ReplyStatus, error_kind: str | None = None
    ) -> None:
        status = claim_status(status)
        _check_label(error_kind, "error_kind")
        with self._tx() as db:
            cur = db.execute(
                "UPDATE claims SET status = ?, error_kind = ?, updated_at = ? WHERE account = ? AND reply_rkey = ?",
                (status, error_kind, self._clock(), account, reply_rkey),
            )
            if cur.rowcount == 0:
                raise StateError(f"no claim for reply {reply_rkey}; call record_claim first")

    def add_calls(self, account: str, reply_rkey: str, digests: Iterable[str], *, waiting: bool = False) -> Claim:
        """Remember, before the write that puts them into the reply, the tool calls this
        worker writes there (opaque digests, ``tools.approval.call_digest``); with
        ``waiting``, also when it asks the user to approve them (this worker's clock).
        Only calls remembered here ever run on approval, or when a reply is resumed."""
        with self._tx() as db:
            row = db.execute(
                "SELECT calls FROM claims WHERE account = ? AND reply_rkey = ?", (account, reply_rkey)
            ).fetchone()
            if row is None:
                raise StateError(f"no claim for reply {reply_rkey}; call record_claim first")
            known = set(json.loads(row[0])) if row[0] else set()
            known.update(digests)
            db.execute(
                "UPDATE claims SET calls = ?, waiting_at = CASE WHEN ? THEN ? ELSE waiting_at END "
                "WHERE account = ? AND reply_rkey = ?",
                (json.dumps(sorted(known)), int(waiting), self._clock(), account, reply_rkey),
            )
            got = db.execute(
                f"SELECT {self._CLAIM_COLS} FROM claims WHERE account = ? AND reply_rkey = ?", (account, reply_rkey)
            ).fetchone()
        return self._claim(got)

    def get_claim(self, account: str, reply_rkey: str) -> Claim | None:
        rows = self._read(
            f"SELECT {self._CLAIM_COLS} FROM claims WHERE account = ? AND reply_rkey = ?", (account, reply_rkey)
        )
        return self._claim(rows[0]) if rows else None

    def unfinished_claims(self, account: str) -> list[Claim]:
        """Claims still ``pending``/``streaming``: after a crash these must be finished."""
        rows = self._read(
            f"SELECT {self._CLAIM_COLS} FROM claims WHERE account = ? AND status IN ('pending', 'streaming') "
            "ORDER BY created_at, reply_rkey",
            (account,),
        )
        return [self._claim(r) for r in rows]

    def is_finished(self, account: str, reply_rkey: str) -> bool:
        claim = self.get_claim(account, reply_rkey)
        return claim is not None and claim.status in FINAL_STATUSES

    # --- tool journal --------------------------------------------------------------------

    _JOURNAL_COLS = (
        "account, conversation, call_key, reply_rkey, tool, input_digest, state, sealed_result, key_id, is_error, "
        "started_at, finished_at"
    )
    _JOURNAL_WHERE = "account = ? AND conversation = ? AND call_key = ?"

    @staticmethod
    def _entry(row: tuple[Any, ...], *, new: bool = False) -> JournalEntry:
        (account, conversation, key, reply_rkey, tool, digest, state, sealed, key_id, is_error, started,
         finished) = row
        return JournalEntry(
            account=account,
            conversation=conversation,
            call_key=key,
            reply_rkey=reply_rkey,
            tool=tool,
            input_digest=digest,
            state=CallState(state),
            sealed_result=bytes(sealed) if sealed is not None else None,
            key_id=key_id,
            is_error=None if is_error is None else bool(is_error),
            started_at=started,
            finished_at=finished,
            new=new,
        )

    @staticmethod
    def _where(call: CallRef) -> tuple[str, str, str]:
        return (call.account, call.conversation, call.key)

    def begin_tool_call(self, call: CallRef, reply_rkey: str, tool: str, input_digest: str) -> JournalEntry:
        """Record "about to run" durably, before running the tool.

        Returns the entry with ``new=True`` if this call created it (run the tool), or
        the existing entry (``new=False``: reuse its sealed result, or report
        ``interrupted`` if it never finished). The same call id in another conversation
        or account is another call; within one conversation, reusing an id for another
        tool or input raises ``ToolJournalConflict``.
        """
        with self._tx() as db:
            row = db.execute(
                f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE {self._JOURNAL_WHERE}", self._where(call)
            ).fetchone()
            if row is not None:
                entry = self._entry(row)
                if (entry.tool, entry.input_digest) != (tool, input_digest):
                    raise ToolJournalConflict(
                        "this tool call id was already used in this conversation for another tool or input; "
                        "not running it"
                    )
                return entry
            db.execute(
                f"INSERT INTO tool_calls ({self._JOURNAL_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?, 'started', NULL, NULL, NULL, ?, NULL)",
                (*self._where(call), reply_rkey, tool, input_digest, self._clock()),
            )
            row = db.execute(
                f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE {self._JOURNAL_WHERE}", self._where(call)
            ).fetchone()
        return self._entry(row, new=True)

    def finish_tool_call(self, call: CallRef, sealed_result: bytes, key_id: str, is_error: bool) -> JournalEntry:
        """Store the SEALED result (opaque bytes; never plaintext) of a begun call.

        Finishing an already finished call keeps the first result (at most once) and
        returns it.
        """
        if not isinstance(sealed_result, (bytes, bytearray, memoryview)):
            raise TypeError("sealed_result must be bytes (seal the result before journaling it)")
        with self._tx() as db:
            row = db.execute(
                f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE {self._JOURNAL_WHERE}", self._where(call)
            ).fetchone()
            if row is None:
                raise StateError("this tool call was never begun; call begin_tool_call first")
            if row[6] == "started":
                db.execute(
                    "UPDATE tool_calls SET state = 'finished', sealed_result = ?, key_id = ?, is_error = ?, "
                    f"finished_at = ? WHERE {self._JOURNAL_WHERE}",
                    (bytes(sealed_result), key_id, int(bool(is_error)), self._clock(), *self._where(call)),
                )
                row = db.execute(
                    f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE {self._JOURNAL_WHERE}", self._where(call)
                ).fetchone()
        return self._entry(row)

    def get_tool_call(self, call: CallRef) -> JournalEntry | None:
        rows = self._read(f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE {self._JOURNAL_WHERE}",
                          self._where(call))
        return self._entry(rows[0]) if rows else None

    def unfinished_tool_calls(self, account: str) -> list[JournalEntry]:
        """Calls begun and never finished (crash while the tool ran)."""
        rows = self._read(
            f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE account = ? AND state = 'started' "
            "ORDER BY started_at",
            (account,),
        )
        return [self._entry(r) for r in rows]

    # --- errors ring and turn timings ------------------------------------------------------

    def record_error(
        self,
        kind: str,
        *,
        account: str | None = None,
        record_key: str | None = None,
        where: str | None = None,
    ) -> None:
        """Remember an error by kind and record key only (no message: it could carry content)."""
        _check_label(kind, "kind")
        _check_label(where, "where")
        with self._tx() as db:
            db.execute(
                'INSERT INTO errors (at, kind, account, record_key, "where") VALUES (?, ?, ?, ?, ?)',
                (self._clock(), kind, account, record_key, where),
            )
            db.execute(
                "DELETE FROM errors WHERE id <= (SELECT MAX(id) FROM errors) - ?", (ERRORS_KEPT,)
            )

    def recent_errors(self, limit: int = 20) -> list[ErrorRow]:
        rows = self._read(
            'SELECT at, kind, account, record_key, "where" FROM errors ORDER BY id DESC LIMIT ?', (limit,)
        )
        return [ErrorRow(*r) for r in rows]

    def record_turn(self, timing: TurnTiming) -> None:
        _check_label(timing.status, "status")
        at = timing.at or self._clock()
        with self._tx() as db:
            db.execute(
                "INSERT INTO turns (at, account, reply_rkey, status, queue_ms, bridge_ms, model_ms, write_ms, "
                "read_ms, points, input_tokens, cached_tokens, cache_write_tokens) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (at, timing.account, timing.reply_rkey, timing.status, timing.queue_ms,
                 timing.bridge_ms, timing.model_ms, timing.write_ms, timing.read_ms, timing.points,
                 timing.input_tokens, timing.cached_tokens, timing.cache_write_tokens),
            )
            db.execute("DELETE FROM turns WHERE id <= (SELECT MAX(id) FROM turns) - ?", (TURNS_KEPT,))

    def recent_turns(self, limit: int = 20, *, account: str | None = None) -> list[TurnTiming]:
        """The newest turn timings (of ``account`` only, when given)."""
        where, args = ("WHERE account = ? ", (account,)) if account is not None else ("", ())
        rows = self._read(
            "SELECT reply_rkey, account, status, queue_ms, bridge_ms, model_ms, write_ms, at, read_ms, points, "
            f"input_tokens, cached_tokens, cache_write_tokens FROM turns {where}ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        return [TurnTiming(*r) for r in rows]

    def points_since(self, account: str, since: float) -> int:
        """PDS write points the turns of ``account`` recorded since ``since`` (epoch s).
        The store keeps the newest turns only: a lower bound on a busy account."""
        rows = self._read("SELECT COALESCE(SUM(points), 0) FROM turns WHERE account = ? AND at >= ?",
                          (account, since))
        return int(rows[0][0])

    # --- the PDS write budget ----------------------------------------------------------------

    def save_write_budget(self, account: str, limit: int | None, remaining: int | None,
                          reset_at: float | None) -> None:
        """The account's write budget as the PDS last stated it (``ratelimit-*`` headers)."""
        with self._tx() as db:
            db.execute(
                'INSERT INTO write_budgets (account, "limit", remaining, reset_at, seen_at) VALUES (?, ?, ?, ?, ?) '
                'ON CONFLICT (account) DO UPDATE SET "limit" = excluded."limit", remaining = excluded.remaining, '
                "reset_at = excluded.reset_at, seen_at = excluded.seen_at",
                (account, limit, remaining, reset_at, self._clock()),
            )

    def load_write_budget(self, account: str) -> dict[str, Any] | None:
        rows = self._read('SELECT "limit", remaining, reset_at, seen_at FROM write_budgets WHERE account = ?',
                          (account,))
        if not rows:
            return None
        limit, remaining, reset_at, seen_at = rows[0]
        return {"limit": limit, "remaining": remaining, "reset_at": reset_at, "seen_at": seen_at}

    # --- seen events -------------------------------------------------------------------------

    def mark_seen(self, did: str, rkey: str, cid: str) -> bool:
        """Mark an event processed. True if it is new, False if it was seen before.

        Keeps the newest ``SEEN_KEPT`` events; older ones are pruned (a replay that old
        is caught by the claims table instead).
        """
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO seen_events (did, rkey, cid, at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (did, rkey, cid, self._clock()),
            )
            new = cur.rowcount == 1
            if new:
                count = db.execute("SELECT COUNT(*) FROM seen_events").fetchone()[0]
                if count > SEEN_KEPT * 1.1:
                    db.execute(
                        "DELETE FROM seen_events WHERE rowid IN "
                        "(SELECT rowid FROM seen_events ORDER BY at ASC LIMIT ?)",
                        (count - SEEN_KEPT,),
                    )
        return new

    def was_seen(self, did: str, rkey: str, cid: str) -> bool:
        return bool(
            self._read("SELECT 1 FROM seen_events WHERE did = ? AND rkey = ? AND cid = ?", (did, rkey, cid))
        )

    def prune_seen(self, older_than_seconds: float) -> int:
        """Forget events processed more than ``older_than_seconds`` ago; returns how many."""
        with self._tx() as db:
            cur = db.execute("DELETE FROM seen_events WHERE at < ?", (self._clock() - older_than_seconds,))
            return cur.rowcount


def open_state(settings: Any) -> StateStore:
    """Open the state database of a ``gelbridge._config.Settings``."""
    return StateStore.open_dir(settings.state_dir)
