"""Servers on 127.0.0.1 that are not a provider's API: a web site (every path answers the
same HTML page, 404 by default: a base_url with the wrong path or host), and a server
that accepts connections and never answers (counting how many it holds at once)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Page(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    status = 404

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = f"<html><body><h1>{self.status}</h1></body></html>".encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer


@contextmanager
def web_site(status: int = 404) -> Iterator[str]:
    """A web site answering every request with an HTML page of ``status``; yields its URL."""
    handler = type("Page", (_Page,), {"status": status})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


class Silent:
    """Accepts connections and never answers; ``most`` is the most it held open at once."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self.most = 0
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(1.0)
            try:
                conn.recv(65536)  # the request (read, so that a close later reads as EOF)
            except OSError:
                pass
            self._open = [c for c in self._open if _alive(c)] + [conn]
            self.most = max(self.most, len(self._open))

    def __enter__(self) -> Silent:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for c in self._open:
            c.close()
        self.sock.close()


def _alive(conn: socket.socket) -> bool:
    """Whether the peer still holds ``conn`` open (a closed one reads as b"")."""
    try:
        conn.setblocking(False)
        return conn.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
