"""load_thread rebuilds a long thread from an empty cache in linear work: each record is
fetched once and looked up a bounded number of times (the walk used to start again
after every single fetch: ~N²/2 lookups, minutes for a 10,000-record chain).

Work is counted, not timed (scripts/bench_thread.py has the times): ``getRecord`` calls
and ``OpenedRecordCache.record`` calls, which the walk makes once per record it visits.
"""

from __future__ import annotations

from typing import Any

import pytest

from gelbridge._errors import MissingRecordError, ThreadTooDeepError
from gelbridge._mapping.cache import OpenedRecordCache
from gelbridge._records import MESSAGE_COLLECTION, MessageRecord
from gelbridge._worker.repo import RepoView, load_thread
from testkit.mapping_builders import reply, user

DID = "did:plc:loadthread000000000000000"


def chain(n: int) -> tuple[dict[str, dict[str, Any]], str]:
    """``n`` records: user, reply, user, ... (n odd: the last is a user message)."""
    values: dict[str, dict[str, Any]] = {}
    parent: str | None = None
    for i in range(n):
        if i % 2 == 0:
            rkey = f"3m{i:011d}"
            values[rkey] = user(parent).to_value()
        else:
            rkey = f"{parent}.r0"
            values[rkey] = reply(parent or "").to_value()
        parent = rkey
    assert parent is not None
    return values, parent


class MemoryPds:
    """getRecord from a dict (CIDs given or not), counting calls."""

    def __init__(self, values: dict[str, dict[str, Any]], *, cids: bool) -> None:
        self.values, self.cids, self.gets = values, cids, 0

    async def get_record(self, collection: str, rkey: str, **_: Any) -> tuple[str | None, dict[str, Any]] | None:
        assert collection == MESSAGE_COLLECTION
        self.gets += 1
        v = self.values.get(rkey)
        return None if v is None else (f"bafy{rkey}" if self.cids else None, v)  # type: ignore[return-value]

    async def sync_get_record(self, *a: Any, **k: Any) -> None:
        return None


class CountingCache(OpenedRecordCache):
    """The worker's cache, failing as soon as the walk has looked up ``limit`` records."""

    def __init__(self, limit: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.limit, self.calls = limit, 0

    def record(self, uri: str, cid: str | None, value: Any) -> MessageRecord:
        self.calls += 1
        assert self.calls <= self.limit, f"more than {self.limit} record lookups: the walk is not linear"
        return super().record(uri, cid, value)


@pytest.mark.parametrize("cids", [True, False], ids=["with-cids", "record-file"])
@pytest.mark.parametrize("n", [2_001, 10_001])
async def test_a_long_thread_is_rebuilt_from_an_empty_cache_in_linear_work(n: int, cids: bool) -> None:
    values, last = chain(n)
    pds = MemoryPds(values, cids=cids)
    view = RepoView(pds, DID)  # type: ignore[arg-type]
    cache = CountingCache(limit=3 * n, max_items=4 * n)
    thread, got_cids = await load_thread(view, last, cache, max_depth=30_000)
    assert len(thread) == n and thread.rkeys[0] == "3m00000000000" and thread.message.rkey == last
    assert pds.gets == n  # each record fetched once
    assert (set(got_cids.values()) == {None}) != cids


async def test_a_cached_stretch_in_the_middle_is_used_and_the_rest_fetched() -> None:
    values, last = chain(1_001)
    pds = MemoryPds(values, cids=True)
    view = RepoView(pds, DID)  # type: ignore[arg-type]
    keys = list(values)
    for rkey in keys[300:600]:
        view.put(rkey, f"bafy{rkey}", values[rkey])
    thread, _ = await load_thread(view, last, CountingCache(limit=4 * 1_001), max_depth=2_000)
    assert len(thread) == 1_001 and pds.gets == 1_001 - 300


async def test_the_fetch_ahead_stops_at_max_depth_and_at_a_missing_record() -> None:
    values, last = chain(101)
    pds = MemoryPds(values, cids=True)
    with pytest.raises(ThreadTooDeepError):
        await load_thread(RepoView(pds, DID), last, OpenedRecordCache(), max_depth=50)  # type: ignore[arg-type]
    assert pds.gets <= 52  # never the whole chain
    del values[list(values)[40]]
    pds = MemoryPds(values, cids=True)
    with pytest.raises(MissingRecordError) as e:
        await load_thread(RepoView(pds, DID), last, OpenedRecordCache(), max_depth=500)  # type: ignore[arg-type]
    assert e.value.rkey == list(chain(101)[0])[40] and pds.gets == 101 - 40
