"""The worker's view of the account's message records: an LRU of ``rkey -> (cid, value)``
(and :class:`SideRecords`, the conversation and settings records a turn reads).

Fed by every event the worker sees (firehose, poll, backfill, library calls) and by its
own writes, so a thread walk usually needs no PDS read at all; a miss is fetched with
``getRecord`` and remembered. Values are kept as they arrived (atproto JSON or CBOR
form: the record models read both). Plaintext never lives here, only sealed records.

The thread walk (``thread.walk_thread``) wants a synchronous lookup; :func:`load_thread`
runs it against the cache and, when it meets a record the cache lacks, fetches that one
record and walks again (the walk is a few dict lookups per record, so re-walking is far
cheaper than a PDS round trip).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from atproto_core.car import CAR

from gelbridge._errors import GelbridgeError, PdsError, PdsUnavailable
from gelbridge._mapping.cache import OpenedRecordCache
from gelbridge._records.constants import CONVERSATION_COLLECTION, MESSAGE_COLLECTION, SETTINGS_COLLECTION
from gelbridge._records.keys import AtUri, is_valid_rkey
from gelbridge._records.models import ConversationRecord, MessageRecord, SettingsRecord
from gelbridge._thread import DEFAULT_MAX_DEPTH, Thread, walk_thread
from gelbridge._worker.timing import reading

Entry = tuple[str | None, dict[str, Any]]

log = logging.getLogger("gelbridge.worker.repo")

#: The records besides messages a turn reads, and their models.
SIDE_RECORD_TYPES: dict[str, type[ConversationRecord] | type[SettingsRecord]] = {
    CONVERSATION_COLLECTION: ConversationRecord,
    SETTINGS_COLLECTION: SettingsRecord,
}


class RecordSource(Protocol):
    async def get_record(self, collection: str, rkey: str, *,
                         repo: str | None = None) -> tuple[str | None, dict[str, Any]] | None: ...

    async def sync_get_record(self, collection: str, rkey: str, *, repo: str | None = None) -> bytes | None: ...


class RepoView:
    """Message records of one account, newest use last; ``max_items`` bounds memory."""

    def __init__(self, pds: RecordSource, did: str, *, max_items: int = 20000) -> None:
        self.pds = pds
        self.did = did
        self.max_items = max_items
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self.fetches = 0

    def uri(self, rkey: str) -> str:
        return str(AtUri(self.did, MESSAGE_COLLECTION, rkey))

    def put(self, rkey: str, cid: str | None, value: dict[str, Any]) -> None:
        self._items[rkey] = (cid, value)
        self._items.move_to_end(rkey)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def drop(self, rkey: str) -> None:
        self._items.pop(rkey, None)

    def cached(self, rkey: str) -> Entry | None:
        return self._items.get(rkey)

    async def get(self, rkey: str, *, fresh: bool = False) -> Entry | None:
        """The record at ``rkey`` (cached unless ``fresh``), or None if it does not exist."""
        if not fresh:
            hit = self._items.get(rkey)
            if hit is not None:
                self._items.move_to_end(rkey)
                return hit
        self.fetches += 1
        with reading():
            try:
                got = await self.pds.get_record(MESSAGE_COLLECTION, rkey)
            except PdsUnavailable as e:
                if e.status is None:
                    raise
                got = await self._sync_get(rkey)
        if got is None:
            self.drop(rkey)
            return None
        cid, value = got
        self.put(rkey, cid, value)
        return cid, value


    async def _sync_get(self, rkey: str) -> tuple[str, dict[str, Any]] | None:
        """The record through ``sync.getRecord`` (a CAR), on the same PDS client."""
        data = await self.pds.sync_get_record(MESSAGE_COLLECTION, rkey, repo=self.did)
        return None if data is None else record_from_car(data, MESSAGE_COLLECTION)


class SideRecords:
    """Parsed ``chat.gel.assistant.conversation`` / ``settings`` records of one account,
    keyed by ``(collection, rkey)``, least recently used out after ``max_items``.

    A turn reads its conversation and the settings record; without this they are two
    ``getRecord`` calls per turn. Entries are kept up to date by the record events the
    worker sees (firehose, Jetstream, ``handle_event``): :meth:`event` stores the new
    value (or "absent" on delete; a create without a value, a tooBig commit, just drops
    the entry). A missing record is cached as absent too. A fetch that overlaps an event
    does not store its (maybe older) answer. With a source that does not deliver these
    events (``poll`` lists messages only) give ``ttl``: entries older than it are fetched
    again. Malformed records are cached as None (logged once per version).
    """

    def __init__(
        self,
        pds: RecordSource,
        did: str,
        *,
        max_items: int = 1024,
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pds = pds
        self.did = did
        self.max_items = max_items
        self.ttl = ttl
        self._clock = clock
        self._items: OrderedDict[tuple[str, str], tuple[Any, float]] = OrderedDict()
        self._changes = 0  # bumped by every event/clear: a fetch overlapping one is not stored
        self.fetches = 0

    def _parse(self, collection: str, rkey: str, value: Mapping[str, Any] | None) -> Any:
        if value is None:
            return None
        cls = SIDE_RECORD_TYPES[collection]
        try:
            return cls.from_value(value, uri=str(AtUri(self.did, collection, rkey)))
        except GelbridgeError as e:
            log.warning("%s/%s is malformed (%s); ignoring it", collection, rkey, e.kind)
            return None

    def _store(self, key: tuple[str, str], record: Any) -> None:
        self._items[key] = (record, self._clock())
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def event(self, collection: str, rkey: str, value: Mapping[str, Any] | None, *, action: str = "create") -> None:
        """A record event of this account for ``collection`` (conversation or settings)."""
        if collection not in SIDE_RECORD_TYPES:
            return
        self._changes += 1
        key = (collection, rkey)
        if action == "delete":
            self._store(key, None)
        elif value is None:
            self._items.pop(key, None)
        else:
            self._store(key, self._parse(collection, rkey, value))

    def clear(self) -> None:
        """Forget everything (events may have been missed: a firehose gap, a backfill)."""
        self._changes += 1
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def cached(self, collection: str, rkey: str) -> tuple[bool, Any]:
        """``(known, record)`` without reading the PDS (``known`` False: would fetch)."""
        hit = self._items.get((collection, rkey))
        return (False, None) if hit is None else (True, hit[0])

    async def get(self, collection: str, rkey: str) -> Any:
        """The parsed record, or None when it is missing or malformed."""
        key = (collection, rkey)
        hit = self._items.get(key)
        if hit is not None and (self.ttl is None or self._clock() - hit[1] <= self.ttl):
            self._items.move_to_end(key)
            return hit[0]
        before = self._changes
        self.fetches += 1
        with reading():
            got = await self.pds.get_record(collection, rkey)
        record = self._parse(collection, rkey, got[1] if got is not None else None)
        if self._changes == before:
            self._store(key, record)
        return record


def record_from_car(data: bytes, collection: str) -> tuple[str, dict[str, Any]] | None:
    """The record block of a ``com.atproto.sync.getRecord`` CAR (CBOR form), with its CID.

    Used when ``repo.getRecord`` answers 5xx: the reference dev PDS (dev-env 0.3.215)
    fails to serialise records that hold blob refs as JSON, but serves the CAR.
    """
    try:
        car = CAR.from_bytes(data)
    except Exception:  # noqa: BLE001 - libipld raises ValueError
        raise PdsError("sync.getRecord answered something that is not a CAR file") from None
    for cid, block in car.blocks.items():
        if isinstance(block, dict) and block.get("$type") == collection:
            return str(cid), block
    return None


class _Need(Exception):
    def __init__(self, rkey: str) -> None:
        self.rkey = rkey


async def load_thread(
    view: RepoView,
    message_rkey: str,
    cache: OpenedRecordCache,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_fetches: int | None = None,
) -> tuple[Thread, dict[str, str | None]]:
    """Walk the thread of ``message_rkey``, fetching missing records lazily.

    Returns the thread and the CID of every record in it (for opening through the
    ``OpenedRecordCache``). Raises the walk's errors (missing record, cycle, foreign
    conversation, too deep, malformed record).

    Linear in the thread's length: a record the cache lacks is fetched together with the
    uncached records its ``parent`` links lead to (:func:`_fetch_chain`), so the walk is
    run again once per gap in the cache, not once per record; and each record is parsed
    once per call (a record without a CID is not kept in ``cache``).
    """
    missing: set[str] = set()
    cids: dict[str, str | None] = {}
    parsed: dict[str, tuple[dict[str, Any], MessageRecord]] = {}
    budget = [max_fetches if max_fetches is not None else max_depth + 2]

    def lookup(rkey: str) -> MessageRecord | None:
        entry = view.cached(rkey)
        if entry is None:
            if rkey in missing:
                return None
            raise _Need(rkey)
        cid, value = entry
        cids[rkey] = cid
        if cid is not None:
            return cache.record(view.uri(rkey), cid, value)
        hit = parsed.get(rkey)
        if hit is None or hit[0] is not value:
            hit = (value, cache.record(view.uri(rkey), cid, value))
            parsed[rkey] = hit
        return hit[1]

    for _ in range(budget[0] + 1):
        try:
            thread = walk_thread(message_rkey, lookup, max_depth=max_depth)
        except _Need as need:
            await _fetch_chain(view, need.rkey, missing, budget, max_depth)
            continue
        return thread, {e.rkey: cids.get(e.rkey) for e in thread.entries}
    raise RuntimeError(f"thread of {message_rkey}: record fetch budget exhausted")  # pragma: no cover


async def _fetch_chain(view: RepoView, rkey: str, missing: set[str], budget: list[int], max_depth: int) -> None:
    """Fetch ``rkey``, then the records its ``parent`` links lead to while the view lacks
    them (at most ``max_depth`` records, within ``budget``, which counts fetches). Only
    syntax is looked at here: the walk judges the chain."""
    for _ in range(max_depth + 1):
        if budget[0] <= 0:
            return
        budget[0] -= 1
        got = await view.get(rkey)
        if got is None:
            missing.add(rkey)
            return
        parent = got[1].get("parent")
        if not isinstance(parent, str) or not is_valid_rkey(parent) or parent in missing \
                or view.cached(parent) is not None:
            return
        rkey = parent
