"""Streams share Lua runtimes: each keeps its own ``state`` table, a runtime holds at most
``streams_per_runtime`` streams, a sandbox limit one stream hits ends only the streams on
its runtime (each with a clear error), and the runtimes go when the streams do."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gelbridge._adapters.host import Adapter
from gelbridge._errors import AdapterError, SandboxViolation

MakeAdapter = Callable[..., Adapter]  # the conftest's make_adapter fixture

# Each stream counts its chunks and remembers its first chunk: interleaved streams must
# each see only their own state. A chunk "bomb" allocates past the memory limit.
STREAMING = """
function adapter.transform_stream_chunk(data, state)
  if data == "bomb" then
    local t = {}
    for i = 1, 1e9 do t[i] = string.rep("x", 1024) .. i end
  end
  state.n = (state.n or 0) + 1
  state.first = state.first or data
  return state.first .. ":" .. state.n
end
"""


def test_interleaved_streams_keep_their_own_state_and_share_few_runtimes(make_adapter: MakeAdapter) -> None:
    a = make_adapter("return raw", extra=STREAMING, streams_per_runtime=8)
    pool = a._pool
    sessions = [a.stream_session() for _ in range(20)]
    assert pool.stream_runtimes_created == 3  # 8 + 8 + 4
    for rnd in range(1, 4):
        for i, s in enumerate(sessions):
            assert s.chunk(f"s{i}") == f"s{i}:{rnd}"
    for s in sessions:
        s.close()
    assert len(pool._hosts) == 1  # the emptied extra runtimes go; one stays warm
    again = a.stream_session()
    assert again.chunk("new") == "new:1"  # a fresh state table, not a finished stream's
    again.close()
    assert pool.stream_runtimes_created == 3


def test_a_limit_one_stream_hits_ends_the_streams_of_its_runtime_only(make_adapter: MakeAdapter) -> None:
    a = make_adapter("return raw", extra=STREAMING, streams_per_runtime=2, max_memory=16 * 1024 * 1024)
    first, neighbour, elsewhere = (a.stream_session() for _ in range(3))
    assert first._host is neighbour._host and elsewhere._host is not first._host
    with pytest.raises(SandboxViolation, match="memory"):
        first.chunk("bomb")
    with pytest.raises(AdapterError, match="runtime of this stream was reset after a stream on it hit a sandbox"):
        neighbour.chunk("x")
    assert elsewhere.chunk("e") == "e:1"  # another runtime: untouched
    fresh = a.stream_session()
    assert fresh._host is not first._host and fresh.chunk("f") == "f:1"
    for s in (first, neighbour, elsewhere, fresh):
        s.close()
    assert all(not h.rt.broken for h in a._pool._hosts)


def test_one_stream_per_runtime_isolates_every_stream(make_adapter: MakeAdapter) -> None:
    a = make_adapter("return raw", extra=STREAMING, streams_per_runtime=1, max_memory=16 * 1024 * 1024)
    first, second = a.stream_session(), a.stream_session()
    assert first._host is not second._host
    with pytest.raises(SandboxViolation):
        first.chunk("bomb")
    assert second.chunk("ok") == "ok:1"
    first.close()
    second.close()


def test_a_closed_session_refuses_chunks(make_adapter: MakeAdapter) -> None:
    a = make_adapter("return raw", extra=STREAMING)
    s = a.stream_session()
    s.close()
    s.close()  # twice is fine
    with pytest.raises(AdapterError, match="already closed"):
        s.chunk("x")
