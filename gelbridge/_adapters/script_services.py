"""The Python side of the ``log``, ``print``, ``http_get`` and ``http_post`` globals.

These functions are called from inside a Lua call (lupa re-acquires the GIL), so
they never raise: they return values the Lua wrappers turn into Lua errors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

import httpx

LOG_MESSAGE_LIMIT = 500
LOG_RATE_PER_SECOND = 20.0
LOG_BURST = 50
HTTP_TIMEOUT = 5.0
HTTP_MAX_BODY = 1024 * 1024

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _host_key(host: str) -> str:
    return host.strip().lower().rstrip(".")


class AdapterServices:
    """Logging and (opt-in) HTTP for one adapter.

    ``log``: goes to the logger ``gelbridge._adapters.<name>``, cut to
    ``LOG_MESSAGE_LIMIT`` characters, at most ``LOG_RATE_PER_SECOND`` lines per
    second (burst ``LOG_BURST``); dropped lines are counted and reported with the
    next line that passes. Adapters must not log message content or keys.

    ``http``: refused unless the operator listed the URL's host in ``allow_hosts``
    (``host`` or ``host:port``). Synchronous, no redirects, timeout
    ``min(HTTP_TIMEOUT, time left in the call)``, body capped at ``HTTP_MAX_BODY``.
    """

    def __init__(self, adapter: str, allow_hosts: Iterable[str] = ()) -> None:
        self.rebind(adapter, allow_hosts)
        self._lock = threading.Lock()
        self._tokens = float(LOG_BURST)
        self._stamp = time.monotonic()
        self._dropped = 0

    def rebind(self, adapter: str, allow_hosts: Iterable[str] = ()) -> None:
        """Set the adapter name (known once the script ran) and its allowed hosts."""
        self.adapter = adapter
        self.logger = logging.getLogger(f"gelbridge.adapters.{adapter}")
        self.allow_hosts = frozenset(_host_key(h) for h in allow_hosts if h.strip())

    # -------------------------------------------------------------------- log

    def _take_token(self) -> tuple[bool, int]:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(LOG_BURST, self._tokens + (now - self._stamp) * LOG_RATE_PER_SECOND)
            self._stamp = now
            if self._tokens < 1.0:
                self._dropped += 1
                return False, 0
            self._tokens -= 1.0
            dropped, self._dropped = self._dropped, 0
            return True, dropped

    def log(self, level: bytes, message: bytes) -> None:
        """``log(level, message)`` from Lua."""
        try:
            lvl = _LEVELS.get(level.decode("utf-8", "replace").lower(), logging.INFO)
            if not self.logger.isEnabledFor(lvl):
                return
            ok, dropped = self._take_token()
            if not ok:
                return
            text = message.decode("utf-8", "replace")
            if len(text) > LOG_MESSAGE_LIMIT:
                text = text[:LOG_MESSAGE_LIMIT] + "…"
            if dropped:
                text += f" ({dropped} earlier log lines dropped by the rate limit)"
            self.logger.log(lvl, "%s", text)
        except Exception:  # noqa: BLE001 - a log call must never break a transform
            return

    # ------------------------------------------------------------------- http

    def http(
        self, method: bytes, url: bytes, body: bytes | None, deadline: float
    ) -> tuple[bool, bytes, int | None]:
        """``http_get``/``http_post`` from Lua → (ok, body or error message, status)."""
        name = "http_" + method.decode().lower()
        try:
            target = httpx.URL(url.decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001
            return False, f"{name}: not a valid URL".encode(), None
        if target.scheme not in ("http", "https") or not target.host:
            return False, f"{name}: only http and https URLs are allowed".encode(), None
        host = _host_key(target.host)
        port = target.port or (443 if target.scheme == "https" else 80)
        if not self.allow_hosts:
            return False, (
                f"{name} is disabled for adapter '{self.adapter}'; to enable it, list the hosts it may "
                f"reach in allow_hosts of a [providers.<name>] section that uses this adapter"
            ).encode(), None
        if host not in self.allow_hosts and f"{host}:{port}" not in self.allow_hosts:
            return False, f"{name}: host '{host}' is not in allow_hosts for adapter '{self.adapter}'".encode(), None
        timeout = min(HTTP_TIMEOUT, deadline - time.monotonic())
        if timeout <= 0:
            return False, f"{name}: no time left in this call".encode(), None
        try:
            with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
                headers = {"content-type": "application/json"} if method == b"POST" else None
                with client.stream(method.decode(), target, content=body, headers=headers) as resp:
                    chunks: list[bytes] = []
                    size = 0
                    for chunk in resp.iter_bytes():
                        size += len(chunk)
                        if size > HTTP_MAX_BODY:
                            return False, f"{name}: response larger than {HTTP_MAX_BODY} bytes".encode(), None
                        chunks.append(chunk)
                    return True, b"".join(chunks), resp.status_code
        except httpx.TimeoutException:
            return False, f"{name}: timed out after {timeout:.1f} s".encode(), None
        except Exception as e:  # noqa: BLE001
            return False, f"{name}: request failed ({type(e).__name__})".encode(), None
