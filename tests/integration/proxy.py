"""A loopback TCP proxy that can cut every connection and refuse new ones (a PDS outage)."""

from __future__ import annotations

import asyncio
import contextlib
import time


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        #: time.time() of every request line starting "POST /xrpc/" the client sent
        self.posts: list[float] = []
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            w.close()
            return
        self._conns |= {w, uw}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, upstream: bool) -> None:
            try:
                while data := await src.read(65536):
                    if upstream and data.startswith(b"POST /xrpc/"):
                        self.posts.append(time.time())
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(r, uw, True), pipe(ur, w, False))
        self._conns -= {w, uw}

    async def outage(self) -> None:
        """Stop listening and cut every open connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._conns):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._conns.clear()

    async def restore(self) -> None:
        await self.start()

    async def aclose(self) -> None:
        await self.outage()
