"""A small LRU of parsed and opened records, keyed by ``(uri, cid)``.

A record's CID names its exact bytes, so an entry can never go stale: an updated
record (a reply in progress) has a new CID. Records listed without a CID are not
cached. The worker keeps one cache per account; it holds plaintext in memory only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from gelbridge._records.models import MessageRecord, PlainContent
from gelbridge._sealing import content_of

Key = tuple[str, str]


class OpenedRecordCache:
    """``(uri, cid) -> (MessageRecord, PlainContent | None)``; least recently used out."""

    __slots__ = ("_items", "max_items", "hits", "misses")

    def __init__(self, max_items: int = 4096) -> None:
        self._items: OrderedDict[Key, tuple[MessageRecord, PlainContent | None]] = OrderedDict()
        self.max_items = max_items
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def _get(self, key: Key) -> tuple[MessageRecord, PlainContent | None] | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            self.hits += 1
        else:
            self.misses += 1
        return item

    def _put(self, key: Key, item: tuple[MessageRecord, PlainContent | None]) -> None:
        self._items[key] = item
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def record(self, uri: str, cid: str | None, value: Mapping[str, Any]) -> MessageRecord:
        """The parsed record (metadata for the thread walk), from the cache if known."""
        if cid is None:
            return MessageRecord.from_value(value, uri=uri)
        item = self._get((uri, cid))
        if item is not None:
            return item[0]
        rec = MessageRecord.from_value(value, uri=uri)
        self._put((uri, cid), (rec, None))
        return rec

    def content(
        self,
        uri: str,
        cid: str | None,
        record: MessageRecord,
        *,
        keyring: Mapping[str, bytes] | None,
        opener: Callable[..., PlainContent] = content_of,
    ) -> PlainContent:
        """The opened content of ``record`` (stored at ``uri`` with ``cid``)."""
        if cid is None:
            return opener(record.content, uri=uri, keyring=keyring)
        item = self._items.get((uri, cid))
        if item is not None and item[1] is not None:
            self._items.move_to_end((uri, cid))
            self.hits += 1
            return item[1]
        self.misses += 1
        content = opener(record.content, uri=uri, keyring=keyring)
        self._put((uri, cid), (record, content))
        return content
