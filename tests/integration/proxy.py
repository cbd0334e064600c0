"""A loopback TCP proxy that can cut every connection and refuse new ones (a PDS outage),
and hold one request in transit until the test lets it go (a write delayed on the way)."""

from __future__ import annotations

import asyncio
import contextlib
import time


class Hold:
    """One request held in transit (:meth:`TcpProxy.hold_next`): ``held`` is set once it
    arrived at the proxy; it reaches the server only after :meth:`release` (or
    ``timeout`` seconds, so a test that fails never hangs)."""

    def __init__(self, prefix: bytes, timeout: float) -> None:
        self.prefix = prefix
        self.timeout = timeout
        self.held = asyncio.Event()
        self.at: float | None = None  # time.monotonic() when it was held
        self._go = asyncio.Event()

    def release(self) -> None:
        self._go.set()

    async def wait(self) -> None:
        self.at = time.monotonic()
        self.held.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._go.wait(), self.timeout)


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        #: time.time() of every request line starting "POST /xrpc/" the client sent
        self.posts: list[float] = []
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._hold: Hold | None = None
        self._serving: set[asyncio.Task[None]] = set()

    def hold_next(self, prefix: bytes, timeout: float = 60.0) -> Hold:
        """Hold the next request whose first bytes are ``prefix`` (e.g. ``b"POST
        /xrpc/com.atproto.repo.putRecord"``), and what follows it on its connection,
        until the returned hold is released. Other connections flow on."""
        self._hold = Hold(prefix, timeout)
        return self._hold

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
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
                    hold = self._hold
                    if upstream and hold is not None and data.startswith(hold.prefix):
                        self._hold = None
                        await hold.wait()
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
        if self._serving:  # the cut connections' pipes end by themselves: let them
            await asyncio.wait(set(self._serving), timeout=5)
