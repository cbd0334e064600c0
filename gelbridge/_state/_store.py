"""``StateStore``: every rule of the worker's durable state, once, over either backend.

The SQL here is the subset SQLite and PostgreSQL share (``?`` placeholders: the
Postgres backend turns them into ``%s``). A backend gives :meth:`StateStore._tx` (one
write transaction) and :meth:`StateStore._read` (one read), and its own schema
migrations; nothing else differs. Each write that reads before it writes is either one
atomic statement (``INSERT ... ON CONFLICT DO NOTHING`` decides who created a row) or
locks the row it reads (``FOR UPDATE`` on Postgres; SQLite's ``BEGIN IMMEDIATE`` locks
the whole file), so many workers sharing one Postgres database get the same answers one
worker gets from its SQLite file: one claim per reply key, one run per tool call.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from gelbridge._errors import StateError, ToolJournalConflict
from gelbridge._records.constants import FINAL_STATUSES, ReplyStatus
from gelbridge._state._rows import (
    CallRef,
    CallState,
    Claim,
    ErrorRow,
    JournalEntry,
    TurnTiming,
    claim_status,
)

#: How many rows the errors ring / turn timings / seen-events set keep.
ERRORS_KEPT = 200
TURNS_KEPT = 50_000  # a day of turns at the reference PDS's daily write budget, for several accounts
SEEN_KEPT = 20000
_SEEN_PRUNE_EVERY = 64  # new seen events between two checks of the set's size

_IDENT_MAX = 64  # error kinds and similar labels: short identifiers, never free text


@dataclass(frozen=True)
class Result:
    """What one statement gave: the rows it returned and the rows it changed."""

    rows: list[tuple[Any, ...]]
    rowcount: int

    def first(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


class Db(Protocol):
    """A backend connection inside one transaction."""

    async def execute(self, sql: str, args: Sequence[Any] = (), /) -> Result: ...


class Fence(Protocol):
    """Who may still write for an account (the fleet's lease, ``gelbridge._fleet``)."""

    def check(self) -> None:
        """Raise :class:`~gelbridge._errors.LeaseLost` unless this worker may write now."""

    async def check_in(self, db: Db) -> None:
        """The same, inside a state write transaction (and holding it against a takeover
        until the transaction ends)."""

    def revoke(self) -> None:
        """Stop every write from now on (the account is being handed over)."""


def check_label(value: str | None, what: str) -> None:
    """Reject anything that looks like free text where only a short identifier belongs."""
    if value is None:
        return
    if not value or len(value) > _IDENT_MAX or not all(c.isalnum() or c in "_-.:" for c in value):
        raise ValueError(f"{what} must be a short identifier (letters, digits, _-.:), got {len(value)} chars")


class StateStore:
    """Typed access to the state database (see ``gelbridge._state`` for the rules).
    Open one with :func:`gelbridge._state.open_state`; the backends are ``SqliteStore``
    and ``PostgresStore``."""

    #: "sqlite" or "postgres"
    backend: str = ""
    #: where the state lives, for start-up lines and ``gelbridge status`` (no password)
    location: str = ""
    #: appended to a SELECT that a write then depends on: locks the row on Postgres
    _for_update: str = ""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = asyncio.Lock()  # one transaction at a time on the store's connection
        self._seen_inserts = 0
        self._fences: dict[str, Fence] = {}

    # --- what a backend provides ----------------------------------------------------------

    def _tx(self) -> AbstractAsyncContextManager[Db]:
        """One write transaction (committed on exit, rolled back on an exception)."""
        raise NotImplementedError

    async def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def schema_version(self) -> int:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> StateStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- fencing -----------------------------------------------------------------------

    def fence(self, accounts: Iterable[str], fence: Fence) -> None:
        """From now on every write for ``accounts`` (DIDs, session keys) first passes
        ``fence.check_in``: claims, the tool journal, sessions, cursors and seen events."""
        for account in accounts:
            self._fences[account] = fence

    def unfence(self, accounts: Iterable[str], fence: Fence) -> None:
        for account in accounts:
            if self._fences.get(account) is fence:
                del self._fences[account]

    async def _fenced(self, db: Db, account: str | None) -> None:
        fence = self._fences.get(account) if account is not None else None
        if fence is not None:
            await fence.check_in(db)

    # --- cursors -----------------------------------------------------------------------

    async def get_cursor(self, source_key: str) -> int | str | None:
        rows = await self._read("SELECT kind, value FROM cursors WHERE source = ?", (source_key,))
        if not rows:
            return None
        kind, value = rows[0]
        return int(value) if kind == "int" else str(value)

    async def set_cursor(self, source_key: str, value: int | str, *, account: str | None = None) -> None:
        """Save a cursor. Call only after the event's effects are committed. ``account``:
        the one account the source carries (the cursor is fenced with it)."""
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TypeError("cursor must be an int or a str")
        kind = "int" if isinstance(value, int) else "str"
        async with self._tx() as db:
            await self._fenced(db, account)
            await db.execute(
                "INSERT INTO cursors (source, kind, value, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (source) DO UPDATE SET kind = excluded.kind, value = excluded.value, "
                "updated_at = excluded.updated_at",
                (source_key, kind, str(value), self._clock()),
            )

    # --- sessions ----------------------------------------------------------------------

    async def load_session(self, account: str) -> dict[str, Any] | None:
        """The saved PDS session (JSON object) for a DID or login identifier."""
        rows = await self._read("SELECT data FROM sessions WHERE account = ?", (account,))
        return json.loads(rows[0][0]) if rows else None

    async def save_session(self, account: str, session: dict[str, Any]) -> None:
        """Store a session (tokens are credentials: see the backend for who can read them)."""
        data = json.dumps(session, separators=(",", ":"), sort_keys=True)
        async with self._tx() as db:
            await self._fenced(db, account)
            await db.execute(
                "INSERT INTO sessions (account, data, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (account) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at",
                (account, data, self._clock()),
            )

    async def update_session(
        self, account: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None],
    ) -> dict[str, Any] | None:
        """Read the session under the row lock, store what ``change`` makes of it (None:
        leave it), in one transaction; returns the session as it now is. ``change`` is
        pure and quick: no I/O while the row is locked (the OAuth refresh marks itself
        here, then asks the server outside the lock)."""
        async with self._tx() as db:
            await self._fenced(db, account)
            row = (await db.execute(f"SELECT data FROM sessions WHERE account = ?{self._for_update}",
                                    (account,))).first()
            current = json.loads(row[0]) if row else None
            new = change(current)
            if new is None:
                return current
            await db.execute(
                "INSERT INTO sessions (account, data, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (account) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at",
                (account, json.dumps(new, separators=(",", ":"), sort_keys=True), self._clock()),
            )
            return new

    async def delete_session(self, account: str) -> None:
        async with self._tx() as db:
            await self._fenced(db, account)
            await db.execute("DELETE FROM sessions WHERE account = ?", (account,))

    # --- claims ------------------------------------------------------------------------

    _CLAIM_COLS = (
        "reply_rkey, account, message_rkey, attempt, conversation, status, error_kind, created_at, updated_at, "
        "calls, waiting_at"
    )
    _CLAIM_WHERE = "account = ? AND reply_rkey = ?"

    @staticmethod
    def _claim(row: tuple[Any, ...]) -> Claim:
        reply_rkey, account, message_rkey, attempt, conversation, status, error_kind, created, updated, calls, \
            waiting_at = row
        return Claim(reply_rkey, account, message_rkey, attempt, conversation, claim_status(status), error_kind,
                     created, updated,
                     frozenset(json.loads(calls)) if calls else frozenset(), waiting_at)

    async def _claim_row(self, db: Db, account: str, reply_rkey: str) -> Claim:
        row = (await db.execute(f"SELECT {self._CLAIM_COLS} FROM claims WHERE {self._CLAIM_WHERE}",
                                (account, reply_rkey))).first()
        assert row is not None
        return self._claim(row)

    async def record_claim(
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
        async with self._tx() as db:
            await self._fenced(db, account)
            await db.execute(
                f"INSERT INTO claims ({self._CLAIM_COLS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, NULL, NULL) "
                "ON CONFLICT (account, reply_rkey) DO NOTHING",
                (reply_rkey, account, message_rkey, attempt, conversation, str(status), now, now),
            )
            return await self._claim_row(db, account, reply_rkey)

    async def update_claim_status(
        self, account: str, reply_rkey: str, status: ReplyStatus, error_kind: str | None = None
    ) -> None:
        status = claim_status(status)
        check_label(error_kind, "error_kind")
        async with self._tx() as db:
            await self._fenced(db, account)
            cur = await db.execute(
                f"UPDATE claims SET status = ?, error_kind = ?, updated_at = ? WHERE {self._CLAIM_WHERE}",
                (str(status), error_kind, self._clock(), account, reply_rkey),
            )
            if cur.rowcount == 0:
                raise StateError(f"no claim for reply {reply_rkey}; call record_claim first")

    async def add_calls(self, account: str, reply_rkey: str, digests: Iterable[str], *, waiting: bool = False) -> Claim:
        """Remember, before the write that puts them into the reply, the tool calls this
        worker writes there (opaque digests, ``tools.approval.call_digest``); with
        ``waiting``, also when it asks the user to approve them (this worker's clock).
        Only calls remembered here ever run on approval, or when a reply is resumed."""
        async with self._tx() as db:
            await self._fenced(db, account)
            row = (await db.execute(f"SELECT calls FROM claims WHERE {self._CLAIM_WHERE}{self._for_update}",
                                    (account, reply_rkey))).first()
            if row is None:
                raise StateError(f"no claim for reply {reply_rkey}; call record_claim first")
            known = set(json.loads(row[0])) if row[0] else set()
            known.update(digests)
            await db.execute(
                "UPDATE claims SET calls = ?, waiting_at = CASE WHEN ? THEN ? ELSE waiting_at END "
                f"WHERE {self._CLAIM_WHERE}",
                (json.dumps(sorted(known)), bool(waiting), self._clock(), account, reply_rkey),
            )
            return await self._claim_row(db, account, reply_rkey)

    async def get_claim(self, account: str, reply_rkey: str) -> Claim | None:
        rows = await self._read(f"SELECT {self._CLAIM_COLS} FROM claims WHERE {self._CLAIM_WHERE}", (account, reply_rkey))
        return self._claim(rows[0]) if rows else None

    async def unfinished_claims(self, account: str) -> list[Claim]:
        """Claims still ``pending``/``streaming``: after a crash these must be finished."""
        rows = await self._read(
            f"SELECT {self._CLAIM_COLS} FROM claims WHERE account = ? AND status IN ('pending', 'streaming') "
            "ORDER BY created_at, reply_rkey",
            (account,),
        )
        return [self._claim(r) for r in rows]

    async def lost_claims(self, account: str, error_kind: str) -> list[Claim]:
        """Claims ``cancelled`` with ``error_kind``: given up as someone else's reply, which
        may still be unfinished (the recovery sweep looks at their replies again)."""
        rows = await self._read(
            f"SELECT {self._CLAIM_COLS} FROM claims WHERE account = ? AND status = 'cancelled' AND error_kind = ? "
            "ORDER BY created_at, reply_rkey",
            (account, error_kind),
        )
        return [self._claim(r) for r in rows]

    async def held_claim(self, account: str, reply_rkey: str) -> Claim | None:
        """The claim on ``reply_rkey``, read after the account's fence (as a write is): in
        a fleet, ``LeaseLost`` unless this worker's lease is current in the database."""
        async with self._tx() as db:
            await self._fenced(db, account)
            row = (await db.execute(f"SELECT {self._CLAIM_COLS} FROM claims WHERE {self._CLAIM_WHERE}",
                                    (account, reply_rkey))).first()
        return self._claim(row) if row is not None else None

    async def is_finished(self, account: str, reply_rkey: str) -> bool:
        claim = await self.get_claim(account, reply_rkey)
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

    async def _entry_row(self, db: Db, call: CallRef) -> tuple[Any, ...] | None:
        return (await db.execute(
            f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE {self._JOURNAL_WHERE}", self._where(call)
        )).first()

    async def begin_tool_call(self, call: CallRef, reply_rkey: str, tool: str, input_digest: str) -> JournalEntry:
        """Record "about to run" durably, before running the tool.

        Returns the entry with ``new=True`` if this call created it (run the tool), or
        the existing entry (``new=False``: reuse its sealed result, or report
        ``interrupted`` if it never finished). The same call id in another conversation
        or account is another call; within one conversation, reusing an id for another
        tool or input raises ``ToolJournalConflict``. The insert decides who created the
        row, so of many workers beginning the same call at once exactly one gets ``new``.
        """
        async with self._tx() as db:
            await self._fenced(db, call.account)
            cur = await db.execute(
                f"INSERT INTO tool_calls ({self._JOURNAL_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?, 'started', NULL, NULL, NULL, ?, NULL) "
                "ON CONFLICT (account, conversation, call_key) DO NOTHING",
                (*self._where(call), reply_rkey, tool, input_digest, self._clock()),
            )
            new = cur.rowcount == 1
            row = await self._entry_row(db, call)
        assert row is not None
        entry = self._entry(row, new=new)
        if not new and (entry.tool, entry.input_digest) != (tool, input_digest):
            raise ToolJournalConflict(
                "this tool call id was already used in this conversation for another tool or input; "
                "not running it"
            )
        return entry

    async def finish_tool_call(self, call: CallRef, sealed_result: bytes, key_id: str, is_error: bool) -> JournalEntry:
        """Store the SEALED result (opaque bytes; never plaintext) of a begun call.

        Finishing an already finished call keeps the first result (at most once) and
        returns it.
        """
        if not isinstance(sealed_result, (bytes, bytearray, memoryview)):
            raise TypeError("sealed_result must be bytes (seal the result before journaling it)")
        async with self._tx() as db:
            await self._fenced(db, call.account)
            await db.execute(
                "UPDATE tool_calls SET state = 'finished', sealed_result = ?, key_id = ?, is_error = ?, "
                f"finished_at = ? WHERE {self._JOURNAL_WHERE} AND state = 'started'",
                (bytes(sealed_result), key_id, int(bool(is_error)), self._clock(), *self._where(call)),
            )
            row = await self._entry_row(db, call)
        if row is None:
            raise StateError("this tool call was never begun; call begin_tool_call first")
        return self._entry(row)

    async def get_tool_call(self, call: CallRef) -> JournalEntry | None:
        rows = await self._read(f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE {self._JOURNAL_WHERE}",
                          self._where(call))
        return self._entry(rows[0]) if rows else None

    async def unfinished_tool_calls(self, account: str) -> list[JournalEntry]:
        """Calls begun and never finished (crash while the tool ran)."""
        rows = await self._read(
            f"SELECT {self._JOURNAL_COLS} FROM tool_calls WHERE account = ? AND state = 'started' "
            "ORDER BY started_at",
            (account,),
        )
        return [self._entry(r) for r in rows]

    # --- errors ring and turn timings ------------------------------------------------------

    async def record_error(
        self,
        kind: str,
        *,
        account: str | None = None,
        record_key: str | None = None,
        where: str | None = None,
    ) -> None:
        """Remember an error by kind and record key only (no message: it could carry content)."""
        check_label(kind, "kind")
        check_label(where, "where")
        async with self._tx() as db:
            await db.execute(
                'INSERT INTO errors (at, kind, account, record_key, "where") VALUES (?, ?, ?, ?, ?)',
                (self._clock(), kind, account, record_key, where),
            )
            await db.execute("DELETE FROM errors WHERE id <= (SELECT MAX(id) FROM errors) - ?", (ERRORS_KEPT,))

    async def recent_errors(self, limit: int = 20) -> list[ErrorRow]:
        rows = await self._read(
            'SELECT at, kind, account, record_key, "where" FROM errors ORDER BY id DESC LIMIT ?', (limit,)
        )
        return [ErrorRow(*r) for r in rows]

    async def record_turn(self, timing: TurnTiming) -> None:
        check_label(timing.status, "status")
        at = timing.at or self._clock()
        async with self._tx() as db:
            await db.execute(
                "INSERT INTO turns (at, account, reply_rkey, status, queue_ms, bridge_ms, model_ms, write_ms, "
                "read_ms, points, input_tokens, cached_tokens, cache_write_tokens) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (at, timing.account, timing.reply_rkey, str(timing.status), timing.queue_ms,
                 timing.bridge_ms, timing.model_ms, timing.write_ms, timing.read_ms, timing.points,
                 timing.input_tokens, timing.cached_tokens, timing.cache_write_tokens),
            )
            await db.execute("DELETE FROM turns WHERE id <= (SELECT MAX(id) FROM turns) - ?", (TURNS_KEPT,))

    async def recent_turns(self, limit: int = 20, *, account: str | None = None) -> list[TurnTiming]:
        """The newest turn timings (of ``account`` only, when given)."""
        where, args = ("WHERE account = ? ", (account,)) if account is not None else ("", ())
        rows = await self._read(
            "SELECT reply_rkey, account, status, queue_ms, bridge_ms, model_ms, write_ms, at, read_ms, points, "
            f"input_tokens, cached_tokens, cache_write_tokens FROM turns {where}ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        return [TurnTiming(*r) for r in rows]

    async def points_since(self, account: str, since: float) -> int:
        """PDS write points the turns of ``account`` recorded since ``since`` (epoch s).
        The store keeps the newest turns only: a lower bound on a busy account."""
        rows = await self._read("SELECT COALESCE(SUM(points), 0) FROM turns WHERE account = ? AND at >= ?",
                          (account, since))
        return int(rows[0][0])

    # --- the PDS write budget ----------------------------------------------------------------

    async def save_write_budget(self, account: str, limit: int | None, remaining: int | None,
                          reset_at: float | None) -> None:
        """The account's write budget as the PDS last stated it (``ratelimit-*`` headers)."""
        async with self._tx() as db:
            await db.execute(
                'INSERT INTO write_budgets (account, "limit", remaining, reset_at, seen_at) VALUES (?, ?, ?, ?, ?) '
                'ON CONFLICT (account) DO UPDATE SET "limit" = excluded."limit", remaining = excluded.remaining, '
                "reset_at = excluded.reset_at, seen_at = excluded.seen_at",
                (account, limit, remaining, reset_at, self._clock()),
            )

    async def load_write_budget(self, account: str) -> dict[str, Any] | None:
        rows = await self._read('SELECT "limit", remaining, reset_at, seen_at FROM write_budgets WHERE account = ?',
                          (account,))
        if not rows:
            return None
        limit, remaining, reset_at, seen_at = rows[0]
        return {"limit": limit, "remaining": remaining, "reset_at": reset_at, "seen_at": seen_at}

    # --- key grants ----------------------------------------------------------------------------

    async def save_grant_counts(self, account: str, honoured: int, ignored: int) -> None:
        """How many of the account's key grants its worker honours and ignores (counts only)."""
        async with self._tx() as db:
            await self._fenced(db, account)
            await db.execute(
                "INSERT INTO key_grants (account, honoured, ignored, at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (account) DO UPDATE SET honoured = excluded.honoured, ignored = excluded.ignored, "
                "at = excluded.at",
                (account, honoured, ignored, self._clock()),
            )

    async def load_grant_counts(self, account: str) -> dict[str, Any] | None:
        rows = await self._read("SELECT honoured, ignored, at FROM key_grants WHERE account = ?", (account,))
        if not rows:
            return None
        honoured, ignored, at = rows[0]
        return {"honoured": int(honoured), "ignored": int(ignored), "at": at}

    # --- seen events -------------------------------------------------------------------------

    async def mark_seen(self, did: str, rkey: str, cid: str) -> bool:
        """Mark an event processed. True if it is new, False if it was seen before.

        Keeps about the newest ``SEEN_KEPT`` events (checked every few dozen new ones);
        older ones are pruned (a replay that old is caught by the claims table instead).
        """
        async with self._tx() as db:
            await self._fenced(db, did)
            cur = await db.execute(
                "INSERT INTO seen_events (did, rkey, cid, at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (did, rkey, cid, self._clock()),
            )
            new = cur.rowcount == 1
            if new:
                self._seen_inserts += 1
                if self._seen_inserts % _SEEN_PRUNE_EVERY == 0:
                    await db.execute(
                        "DELETE FROM seen_events WHERE at < (SELECT at FROM seen_events ORDER BY at DESC "
                        "LIMIT 1 OFFSET ?)",
                        (SEEN_KEPT,),
                    )
        return new

    async def was_seen(self, did: str, rkey: str, cid: str) -> bool:
        return bool(
            await self._read("SELECT 1 FROM seen_events WHERE did = ? AND rkey = ? AND cid = ?", (did, rkey, cid))
        )

    async def prune_seen(self, older_than_seconds: float) -> int:
        """Forget events processed more than ``older_than_seconds`` ago; returns how many."""
        async with self._tx() as db:
            cur = await db.execute("DELETE FROM seen_events WHERE at < ?", (self._clock() - older_than_seconds,))
            return cur.rowcount


def lines(statements: str) -> Iterator[str]:
    """The statements of a migration script (split on ``;``)."""
    for statement in statements.split(";"):
        if statement.strip():
            yield statement
