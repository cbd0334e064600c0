"""The worker's cache of conversation and settings records: read once, kept current by
record events, bounded, and never overwritten by a fetch older than an event."""

from __future__ import annotations

import asyncio
from typing import Any

from gelbridge._records import CONVERSATION_COLLECTION, SETTINGS_COLLECTION, SETTINGS_RKEY
from gelbridge._worker.repo import SideRecords

DID = "did:plc:abcdefghijklmnopqrstuvwx"
NOW = "2025-01-01T00:00:00.000Z"


def conv(model: str) -> dict[str, Any]:
    return {"$type": CONVERSATION_COLLECTION, "createdAt": NOW, "model": {"provider": "p", "id": model}}


class Pds:
    def __init__(self) -> None:
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets: list[tuple[str, str]] = []
        self.gate: asyncio.Event | None = None

    async def get_record(self, collection: str, rkey: str, *, repo: str | None = None) -> Any:
        self.gets.append((collection, rkey))
        value = self.records.get((collection, rkey))
        if self.gate is not None:
            await self.gate.wait()
        return None if value is None else ("cid", value)


async def test_read_once_then_served_from_the_cache_missing_records_too() -> None:
    pds = Pds()
    pds.records[(CONVERSATION_COLLECTION, "3mc")] = conv("m1")
    side = SideRecords(pds, DID)
    for _ in range(3):
        rec = await side.get(CONVERSATION_COLLECTION, "3mc")
        assert rec is not None and rec.model.id == "m1"
        assert await side.get(SETTINGS_COLLECTION, SETTINGS_RKEY) is None  # absent: cached as such
    assert pds.gets == [(CONVERSATION_COLLECTION, "3mc"), (SETTINGS_COLLECTION, SETTINGS_RKEY)]


async def test_events_update_create_and_delete_entries_without_reads() -> None:
    pds = Pds()
    side = SideRecords(pds, DID)
    side.event(CONVERSATION_COLLECTION, "3mc", conv("m2"), action="update")
    assert (await side.get(CONVERSATION_COLLECTION, "3mc")).model.id == "m2"
    side.event(SETTINGS_COLLECTION, SETTINGS_RKEY, {"$type": SETTINGS_COLLECTION, "tools": ["x"]})
    assert (await side.get(SETTINGS_COLLECTION, SETTINGS_RKEY)).tools == ["x"]
    side.event(CONVERSATION_COLLECTION, "3mc", None, action="delete")
    assert await side.get(CONVERSATION_COLLECTION, "3mc") is None
    assert pds.gets == []
    side.event(CONVERSATION_COLLECTION, "3mc", None, action="update")  # tooBig: no value → read it
    pds.records[(CONVERSATION_COLLECTION, "3mc")] = conv("m3")
    assert (await side.get(CONVERSATION_COLLECTION, "3mc")).model.id == "m3"
    assert len(pds.gets) == 1
    side.event("chat.gel.assistant.message", "3mk", {"x": 1})  # not a side record: ignored
    assert side.cached("chat.gel.assistant.message", "3mk") == (False, None)


async def test_a_malformed_record_reads_as_none() -> None:
    pds = Pds()
    side = SideRecords(pds, DID)
    side.event(CONVERSATION_COLLECTION, "3mc", {"$type": CONVERSATION_COLLECTION, "model": "not an object"})
    assert await side.get(CONVERSATION_COLLECTION, "3mc") is None and pds.gets == []


async def test_a_fetch_overlapping_an_event_does_not_store_its_older_answer() -> None:
    pds = Pds()
    pds.records[(CONVERSATION_COLLECTION, "3mc")] = conv("old")
    pds.gate = asyncio.Event()
    side = SideRecords(pds, DID)
    task = asyncio.create_task(side.get(CONVERSATION_COLLECTION, "3mc"))
    await asyncio.sleep(0)
    side.event(CONVERSATION_COLLECTION, "3mc", conv("new"), action="update")
    pds.gate.set()
    assert (await task).model.id == "old"  # that turn had asked before the update
    assert (await side.get(CONVERSATION_COLLECTION, "3mc")).model.id == "new"
    assert len(pds.gets) == 1


async def test_bounded_size_ttl_and_clear() -> None:
    pds = Pds()
    t = [0.0]
    side = SideRecords(pds, DID, max_items=3, ttl=5.0, clock=lambda: t[0])
    for i in range(5):
        side.event(CONVERSATION_COLLECTION, f"3mc{i}", conv(f"m{i}"))
    assert len(side) == 3 and side.cached(CONVERSATION_COLLECTION, "3mc0") == (False, None)
    await side.get(CONVERSATION_COLLECTION, "3mc4")
    assert pds.gets == []
    t[0] = 6.0  # older than the ttl (a source without side-record events): read again
    await side.get(CONVERSATION_COLLECTION, "3mc4")
    assert pds.gets == [(CONVERSATION_COLLECTION, "3mc4")]
    side.clear()
    assert len(side) == 0
