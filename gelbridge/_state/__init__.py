"""The worker's durable state: one SQLite file ``gelbridge.db`` under ``[state] dir``
(the embedded default, ``SqliteStore``), or a PostgreSQL database shared by a fleet of
workers (``[state] url`` / ``GELBRIDGE_STATE_URL``, ``PostgresStore``). Both hold the
same tables under the same rules, written once in ``StateStore``; :func:`open_state`
picks the backend.

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

Durability: the worker saves a cursor only after the event's effects (claim, journal
entry, reply write) are committed, so a crash replays at most a few events, and the
claim/journal tables make replays harmless. Each backend says how it commits
(``_sqlite``: WAL + fsync; ``_postgres``: the server's commit).

Asyncio: every method is a coroutine, one short transaction under the store's lock (a
SQLite commit, or Postgres round trips awaited without blocking the loop); use a store
on the event loop that opened it.
"""

from __future__ import annotations

from typing import Any

from gelbridge._state._rows import (
    CallRef,
    CallState,
    Claim,
    ClaimStatus,
    ErrorRow,
    JournalEntry,
    TurnTiming,
    call_key,
    claim_status,
)
from gelbridge._state._sqlite import DB_FILENAME, SCHEMA_VERSION, SqliteStore
from gelbridge._state._store import ERRORS_KEPT, SEEN_KEPT, TURNS_KEPT, Fence, StateStore

__all__ = [
    "DB_FILENAME", "ERRORS_KEPT", "SCHEMA_VERSION", "SEEN_KEPT", "TURNS_KEPT",
    "CallRef", "CallState", "Claim", "ClaimStatus", "ErrorRow", "Fence", "JournalEntry", "SqliteStore", "StateStore",
    "TurnTiming", "call_key", "claim_status", "open_state", "state_location",
]


def state_location(settings: Any) -> str:
    """Where ``settings`` keep their state: the ``[state] url``, else the state directory.
    Accounts with the same location share one store."""
    url: str | None = settings.state.url
    return url if url else str(settings.state_dir)


async def open_state(settings: Any) -> StateStore:
    """Open the state store of a ``gelbridge._config.Settings``: Postgres when
    ``[state] url`` is set, else ``<[state] dir>/gelbridge.db``."""
    if settings.state.url:
        from gelbridge._state._postgres import PostgresStore

        return await PostgresStore(settings.state.url, timeout=settings.state.timeout,
                                   connections=settings.state.connections).open()
    return SqliteStore.open_dir(settings.state_dir)
