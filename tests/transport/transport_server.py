"""A scripted HTTP/1.1 provider on 127.0.0.1 for transport I/O tests (helpers + fixtures)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

Action = Callable[["Handler"], None]


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int
    at: float
    method: str = "POST"


@dataclass
class Script:
    """Per path, the actions for consecutive requests (the last one repeats)."""

    routes: dict[str, list[Action]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on(self, path: str, *actions: Action) -> None:
        self.routes[path] = list(actions)

    def hits(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body are separate writes: without this, Nagle + delayed ACK
        # add ~40 ms to every response on loopback
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        script = self.server.script
        with script.lock:
            script.seen.append(Seen(self.path.split("?")[0], dict(self.headers), body,
                                    self.client_address[1], time.monotonic(), self.command))
            actions = script.routes.get(self.path.split("?")[0])
            if not actions:
                action: Action = reply_json(404, {"error": "no route"})
            else:
                action = actions.pop(0) if len(actions) > 1 else actions[0]
        action(self)

    do_GET = do_POST  # the same script answers GETs (model listings)

    # helpers for actions
    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def cut(self) -> None:
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    script: Script


def reply_json(status: int, doc: object, headers: dict[str, str] | None = None) -> Action:
    def act(h: Handler) -> None:
        raw = json.dumps(doc).encode()
        reply_raw(status, raw, {"Content-Type": "application/json", **(headers or {})})(h)
    return act


def reply_raw(status: int, raw: bytes, headers: dict[str, str] | None = None) -> Action:
    def act(h: Handler) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)
        h.wfile.flush()
    return act


def reply_stream(pieces: list[bytes], *, content_type: str = "text/event-stream",
                 gap: float = 0.01, cut_after: int | None = None) -> Action:
    """A chunked 200 body, one TCP write per piece; ``cut_after`` drops the connection
    after that many pieces without the terminating chunk."""
    def act(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        for i, piece in enumerate(pieces):
            if cut_after is not None and i == cut_after:
                h.cut()
                return
            h.write_chunk(piece)
            time.sleep(gap)
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
    return act


def stall(seconds: float, *, after_headers: bool = True) -> Action:
    def act(h: Handler) -> None:
        if after_headers:
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            h.write_chunk(b"data: first\n\n")
        time.sleep(seconds)
        h.cut()
    return act


@pytest.fixture
def provider() -> Iterator[tuple[str, Script]]:
    """(base_url, script) of a fresh loopback provider."""
    srv = _Server(("127.0.0.1", 0), Handler)
    srv.script = Script()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv.script
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


@pytest.fixture
def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
