"""A tiny Jetstream v1 stand-in on 127.0.0.1 for tests: JSON text frames on ``/subscribe``,
honouring ``wantedDids``, ``wantedCollections`` (exact or ``prefix.*``) and ``cursor``
(events with ``time_us >= cursor``), like the real service."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve


def _wanted(event: dict[str, Any], dids: list[str], collections: list[str]) -> bool:
    if dids and event.get("did") not in dids:
        return False
    if event.get("kind") != "commit" or not collections:
        return True
    col = event["commit"]["collection"]
    return any(col == c or (c.endswith(".*") and col.startswith(c[:-1])) for c in collections)


class JetstreamServer:
    """``events``: appended by the test (sorted by time_us). ``close_after``: drop each
    connection after that many messages (forces reconnects)."""

    def __init__(self, close_after: int | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.close_after = close_after
        self.requests: list[dict[str, list[str]]] = []
        self.sent = 0
        self._new = asyncio.Event()
        self._server: Server | None = None
        self.url = ""

    def publish(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._new.set()

    async def _handler(self, ws: ServerConnection) -> None:
        parts = urlsplit(ws.request.path)
        if parts.path != "/subscribe":
            await ws.close(1008, "not found")
            return
        q = parse_qs(parts.query)
        self.requests.append(q)
        dids, cols = q.get("wantedDids", []), q.get("wantedCollections", [])
        cursor = int(q["cursor"][0]) if "cursor" in q else None
        i = 0 if cursor is not None else len(self.events)  # no cursor: live tail only
        sent_here = 0
        while True:
            while i < len(self.events):
                ev = self.events[i]
                i += 1
                if cursor is not None and ev["time_us"] < cursor:
                    continue
                if not _wanted(ev, dids, cols):
                    continue
                await ws.send(json.dumps(ev))
                self.sent += 1
                sent_here += 1
                if self.close_after is not None and sent_here >= self.close_after:
                    await ws.close()
                    return
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), 0.2)
            except TimeoutError:
                pass
            if ws.state.name == "CLOSED":
                return

    async def __aenter__(self) -> JetstreamServer:
        self._server = await serve(self._handler, "127.0.0.1", 0)
        port = next(iter(self._server.sockets)).getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await asyncio.wait_for(self._server.wait_closed(), 5)
