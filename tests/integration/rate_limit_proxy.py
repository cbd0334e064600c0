"""A loopback HTTP proxy in front of the real PDS that plays its rate limiter: it sends
``ratelimit-*`` headers on every write and answers chosen writes with the reference PDS's
429 (``RateLimitExceeded`` with ``ratelimit-reset``), as a PDS with rate limits on does
when the account's points are spent. Everything else is forwarded unchanged."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx


class RateLimitProxy:
    def __init__(self, target: str, refuse: Callable[[str, bytes], bool], *, reset_in: float = 3.0,
                 remaining: int = 4000) -> None:
        self.target = target.rstrip("/")
        self.refuse = refuse  # (path, body) -> answer 429?
        self.reset_in = reset_in
        self.remaining = remaining
        self.refused: list[float] = []  # when each 429 was sent
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._http = httpx.AsyncClient(timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> RateLimitProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._http.aclose()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await r.readline()
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await r.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await r.readexactly(int(headers.get("content-length", "0") or 0))
                reset = int(time.time() + self.reset_in)
                limit = {"ratelimit-limit": "5000", "ratelimit-reset": str(reset),
                         "ratelimit-policy": "5000;w=3600"}
                if method == "POST" and self.refuse(path, body):
                    self.refused.append(time.time())
                    payload = json.dumps({"error": "RateLimitExceeded", "message": "Rate Limit Exceeded"}).encode()
                    self._reply(w, 429, {**limit, "ratelimit-remaining": "0", "content-type": "application/json"},
                                payload)
                else:
                    fwd = {k: v for k, v in headers.items() if k not in ("host", "content-length", "connection",
                                                                          "accept-encoding")}
                    resp = await self._http.request(method, self.target + path, headers=fwd, content=body)
                    extra = {"content-type": resp.headers.get("content-type", "application/json")}
                    if method == "POST":
                        extra.update(limit, **{"ratelimit-remaining": str(self.remaining)})
                    self._reply(w, resp.status_code, extra, resp.content)
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            w.close()

    @staticmethod
    def _reply(w: asyncio.StreamWriter, status: int, headers: dict[str, str], body: bytes) -> None:
        head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        w.write((head + f"content-length: {len(body)}\r\n\r\n").encode("latin-1") + body)
