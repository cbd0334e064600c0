"""The worker's view of the account's message records: an LRU of ``rkey -> (cid, value)``.

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

from collections import OrderedDict
from typing import Any, Protocol

from atproto_core.car import CAR

from gelbridge.errors import PdsError, PdsUnavailable
from gelbridge.mapping.cache import OpenedRecordCache
from gelbridge.records.constants import MESSAGE_COLLECTION
from gelbridge.records.keys import AtUri
from gelbridge.records.models import MessageRecord
from gelbridge.thread import DEFAULT_MAX_DEPTH, Thread, walk_thread

Entry = tuple[str | None, dict[str, Any]]


class RecordSource(Protocol):
    async def get_record(self, collection: str, rkey: str, *, repo: str | None = None) -> tuple[str, dict[str, Any]] | None: ...


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
        try:
            got = await self.pds.get_record(MESSAGE_COLLECTION, rkey)
        except PdsUnavailable as e:
            if e.status is None:
                raise
            got = await self._sync_get(rkey)  # see sync_get_record
        if got is None:
            self.drop(rkey)
            return None
        cid, value = got
        self.put(rkey, cid, value)
        return cid, value


    async def _sync_get(self, rkey: str) -> tuple[str, dict[str, Any]] | None:
        import httpx

        url = getattr(self.pds, "pds_url", None)
        if not url:
            return None
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.get(f"{url}/xrpc/com.atproto.sync.getRecord",
                               params={"did": self.did, "collection": MESSAGE_COLLECTION, "rkey": rkey})
        if r.status_code != 200:
            if r.status_code in (400, 404):
                return None
            raise PdsUnavailable(f"PDS failed on sync.getRecord {rkey} (HTTP {r.status_code})", status=r.status_code)
        return record_from_car(r.content, MESSAGE_COLLECTION)


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
    """
    missing: set[str] = set()
    cids: dict[str, str | None] = {}
    budget = max_fetches if max_fetches is not None else max_depth + 2

    def lookup(rkey: str) -> MessageRecord | None:
        entry = view.cached(rkey)
        if entry is None:
            if rkey in missing:
                return None
            raise _Need(rkey)
        cid, value = entry
        cids[rkey] = cid
        return cache.record(view.uri(rkey), cid, value)

    for _ in range(budget + 1):
        try:
            thread = walk_thread(message_rkey, lookup, max_depth=max_depth)
        except _Need as need:
            if await view.get(need.rkey) is None:
                missing.add(need.rkey)
            continue
        return thread, {e.rkey: cids.get(e.rkey) for e in thread.entries}
    raise RuntimeError(f"thread of {message_rkey}: record fetch budget exhausted")  # pragma: no cover
