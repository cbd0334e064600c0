"""FirehoseSource's connection life cycle on loopback: ``connected``, the reconnect hook
and the backoff follow the websocket actually opening, not the attempt to open it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
import websockets

from gelbridge.state import StateStore
from gelbridge.worker import sources
from gelbridge.worker.sources import FirehoseSource

DID = "did:plc:aaaa"


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with StateStore.open_dir(tmp_path) as s:
        yield s


def refused_url() -> str:
    """A loopback port with nothing listening (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def handler(ev: Any) -> None: ...


def record_backoff(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``failures`` count of every backoff the source asks for (each wait 1 ms)."""
    seen: list[int] = []

    def fake(failures: int, **_: Any) -> float:
        seen.append(failures)
        return 0.001

    monkeypatch.setattr(sources, "backoff_delay", fake)
    return seen


async def run_until(src: FirehoseSource, done: Any, limit: float = 10.0) -> None:
    task = asyncio.create_task(src.run())
    try:
        for _ in range(int(limit / 0.01)):  # bounded
            if done():
                return
            await asyncio.sleep(0.01)
        pytest.fail("the source did not get there in time")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_refused_connections_grow_the_backoff_and_never_count_as_connected(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_backoff(monkeypatch)
    hooks: list[None] = []
    src = FirehoseSource(refused_url(), DID, store, handler, on_reconnect=lambda: hooks.append(None))
    await run_until(src, lambda: len(seen) >= 5)
    assert seen[:5] == [1, 2, 3, 4, 5]  # consecutive failures, not "1" after each attempt
    assert not src.connected.is_set()
    assert hooks == []  # nothing to sweep for: it never got back


async def test_an_open_socket_sets_connected_resets_the_backoff_and_calls_the_hook_on_reconnect(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_backoff(monkeypatch)
    hooks: list[bool] = []
    opened = 0

    async def close_at_once(ws: Any) -> None:
        nonlocal opened
        opened += 1
        await ws.close()

    async with websockets.serve(close_at_once, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        src = FirehoseSource(f"http://127.0.0.1:{port}", DID, store, handler,
                             on_reconnect=lambda: hooks.append(src.connected.is_set()))
        await run_until(src, lambda: len(seen) >= 3)
    assert opened >= 3
    assert seen[:3] == [1, 1, 1]  # each open reset the count
    assert hooks[:2] == [True, True]  # once per re-open (not for the first), after connected was set
    assert len(hooks) in (opened - 1, opened - 2)  # none for the first open (the last may not have run it yet)
